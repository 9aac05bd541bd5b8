//! Schedulers: what decides the order in which the participants of a program move.
//!
//! On the simulator a scheduler picks, at every step, which participant moves ([`Scheduler::pick`])
//! and learns which ops completed ([`Scheduler::completed`]); on a GPU, which schedules its streams
//! itself, it holds ops back ([`Scheduler::hold`]). Only real CUDA ordering constrains either, so
//! every schedule is one a GPU could produce; the schedulers differ in which they seek:
//!
//! | scheduler | simulator | GPU |
//! |---|---|---|
//! | [`Sequential`] | every op to completion in issue order: the reference | the device synchronized after every op |
//! | [`RandomScheduler`] | uniformly at random | timing noise: a short spin before one stream op in four |
//! | [`Adversarial`] | held ops wait for the ops they are held for | held stream ops start behind a spin of milliseconds |
//! | [`Replay`] | a recorded list of choices (exhaustive exploration) | nothing held |

use crate::workload::SplitMix;

/// A participant that can move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Actor {
    /// The host.
    Host,
    /// The stream with this key.
    Stream(usize),
}

/// A participant that can move now, and the op it would advance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// Who moves.
    pub actor: Actor,
    /// The op index it advances (for the host: the op it issues or continues).
    pub op: usize,
}

/// How a GPU run holds an op back before issuing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Issue it as the program does.
    None,
    /// Keep its stream busy for this many nanoseconds before it (a `spin` kernel: a delay, never an
    /// ordering).
    Spin(u64),
    /// Issue it, then synchronize the device before the next op.
    SyncAfter,
}

/// Chooses the order in which the participants of a program move.
///
/// A simulator calls [`pick`](Scheduler::pick) before every step and
/// [`completed`](Scheduler::completed) for every op that completes; a GPU run calls
/// [`hold`](Scheduler::hold) once per op, in issue order, before issuing it.
pub trait Scheduler {
    /// Returns an index into `ready`, which is never empty and lists the host first (when it can
    /// move), then the streams in key order. An index out of range counts as the last.
    fn pick(&mut self, ready: &[Ready]) -> usize;

    /// Op `op` has completed: all its effects happened. Called once per op, in completion order;
    /// schedulers that do not wait for particular ops ignore it.
    fn completed(&mut self, op: usize) {
        let _ = op;
    }

    /// How to hold op `op` back on a GPU; `on_stream` says whether it is a stream op that a spin
    /// can delay (a launch, copy or memset). The default holds nothing.
    fn hold(&mut self, op: usize, on_stream: bool) -> Hold {
        let _ = (op, on_stream);
        Hold::None
    }
}

/// Runs every op to completion in issue order: the sequential reference.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequential;

impl Scheduler for Sequential {
    fn pick(&mut self, ready: &[Ready]) -> usize {
        // The earliest op first; the stream finishes an issued op before the host issues more.
        let mut best = 0;
        for (k, r) in ready.iter().enumerate() {
            let (b, c) = (&ready[best], r);
            if (c.op, c.actor == Actor::Host) < (b.op, b.actor == Actor::Host) {
                best = k;
            }
        }
        best
    }

    fn hold(&mut self, _: usize, _: bool) -> Hold {
        Hold::SyncAfter
    }
}

/// Longest timing noise [`RandomScheduler`] puts before a stream op on a GPU, in nanoseconds.
pub const RANDOM_JITTER_NS: u64 = 100_000;

/// Picks uniformly at random (seeded); on a GPU, adds timing noise: before about one stream op in
/// four, a spin of up to [`RANDOM_JITTER_NS`].
#[derive(Clone, Debug)]
pub struct RandomScheduler(pub SplitMix);

impl Scheduler for RandomScheduler {
    fn pick(&mut self, ready: &[Ready]) -> usize {
        self.0.below(ready.len() as u64) as usize
    }

    fn hold(&mut self, _: usize, on_stream: bool) -> Hold {
        if on_stream && self.0.below(4) == 0 {
            match self.0.below(RANDOM_JITTER_NS + 1) {
                0 => Hold::None,
                ns => Hold::Spin(ns),
            }
        } else {
            Hold::None
        }
    }
}

/// Shortest delay of a held op on a GPU, in nanoseconds.
pub const PROVOKE_SPIN_NS: u64 = 1_000_000;

/// The delay of held ops on a GPU for a provocation with `seed`: 1, 2, 3 or 4 ms.
pub fn provoke_spin_ns(seed: u64) -> u64 {
    PROVOKE_SPIN_NS * (1 + seed % 4)
}

/// Steers a schedule to make hazards manifest: each `(held, until)` pair keeps op `held` from
/// starting until op `until` has completed; otherwise picks at random. On a GPU, every held stream
/// op starts behind a spin of [`provoke_spin_ns`]`(seed)`, so that the ops not ordered after it run
/// first (a held host op cannot be delayed on the device and is not).
#[derive(Clone, Debug)]
pub struct Adversarial {
    /// `(held, until)` pairs of op indices.
    pub holds: Vec<(usize, usize)>,
    /// Random choices among the rest.
    pub rng: SplitMix,
    /// Keep held ops back even after their `until` op completed, as long as anything else can
    /// run: the late access lands as late as possible, where more later work can observe it.
    pub starve: bool,
    /// The delay of a held stream op on a GPU, in nanoseconds.
    pub spin_ns: u64,
    /// Ops completed so far, by index.
    done: Vec<bool>,
}

impl Adversarial {
    /// The provocation with `holds` and `seed`: random choices from `seed`; odd seeds starve the
    /// held accesses (keep them back for as long as anything else can run); on a GPU, held ops
    /// wait behind a spin of [`provoke_spin_ns`]`(seed)`.
    pub fn new(holds: Vec<(usize, usize)>, seed: u64) -> Self {
        Adversarial {
            holds,
            rng: SplitMix::new(seed),
            starve: seed % 2 == 1,
            spin_ns: provoke_spin_ns(seed),
            done: Vec::new(),
        }
    }

    fn is_done(&self, op: usize) -> bool {
        self.done.get(op).copied().unwrap_or(false)
    }
}

impl Scheduler for Adversarial {
    fn pick(&mut self, ready: &[Ready]) -> usize {
        let starve = self.starve;
        let allowed: Vec<usize> = (0..ready.len())
            .filter(|&k| {
                let op = ready[k].op;
                !self
                    .holds
                    .iter()
                    .any(|&(h, u)| h == op && (starve || !self.is_done(u)))
            })
            .collect();
        if allowed.is_empty() {
            // Every runnable op is held: release (the hold cannot be honoured).
            return self.rng.below(ready.len() as u64) as usize;
        }
        // Prefer moving the ops that release holds, so held ones wait as little as possible.
        let releasing: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|&k| self.holds.iter().any(|&(_, u)| u == ready[k].op))
            .collect();
        let pool = if releasing.is_empty() {
            &allowed
        } else {
            &releasing
        };
        pool[self.rng.below(pool.len() as u64) as usize]
    }

    fn completed(&mut self, op: usize) {
        if self.done.len() <= op {
            self.done.resize(op + 1, false);
        }
        self.done[op] = true;
    }

    fn hold(&mut self, op: usize, on_stream: bool) -> Hold {
        if on_stream && self.holds.iter().any(|&(h, _)| h == op) {
            Hold::Spin(self.spin_ns)
        } else {
            Hold::None
        }
    }
}

/// Replays a fixed list of choices, then picks the first ready participant; records the choices
/// made and how many were available, for exhaustive exploration.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    /// Choices to replay (indices into the ready list).
    pub prefix: Vec<usize>,
    /// Every choice made: (chosen, available).
    pub trail: Vec<(usize, usize)>,
}

impl Scheduler for Replay {
    fn pick(&mut self, ready: &[Ready]) -> usize {
        let k = self.trail.len();
        let c = self
            .prefix
            .get(k)
            .copied()
            .unwrap_or(0)
            .min(ready.len() - 1);
        self.trail.push((c, ready.len()));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provocation_delays_vary_from_one_to_four_ms() {
        let d: std::collections::BTreeSet<u64> = (0..8).map(provoke_spin_ns).collect();
        assert_eq!(
            d.into_iter().collect::<Vec<_>>(),
            vec![1_000_000, 2_000_000, 3_000_000, 4_000_000]
        );
    }

    #[test]
    fn adversarial_waits_for_the_op_it_holds_for() {
        let ready = [
            Ready {
                actor: Actor::Stream(1),
                op: 3,
            },
            Ready {
                actor: Actor::Stream(2),
                op: 5,
            },
        ];
        let mut a = Adversarial::new(vec![(3, 5)], 2);
        assert!(!a.starve);
        for _ in 0..8 {
            assert_eq!(a.pick(&ready), 1, "op 3 is held until op 5 completes");
        }
        a.completed(5);
        let ready = [
            ready[0],
            Ready {
                actor: Actor::Stream(3),
                op: 7,
            },
        ];
        let picks: std::collections::BTreeSet<usize> = (0..32).map(|_| a.pick(&ready)).collect();
        assert!(picks.contains(&0), "released once op 5 completed");
        assert_eq!(a.hold(3, true), Hold::Spin(3_000_000));
        assert_eq!(a.hold(3, false), Hold::None);
        assert_eq!(a.hold(4, true), Hold::None);
    }

    #[test]
    fn random_noise_draws_only_for_stream_ops() {
        let mut a = RandomScheduler(SplitMix::new(7));
        let mut b = RandomScheduler(SplitMix::new(7));
        for op in 0..64 {
            assert_eq!(a.hold(op, false), Hold::None);
        }
        let holds: Vec<Hold> = (0..64).map(|op| a.hold(op, true)).collect();
        let again: Vec<Hold> = (0..64).map(|op| b.hold(op, true)).collect();
        assert_eq!(holds, again, "host ops draw nothing");
        assert!(holds
            .iter()
            .any(|h| matches!(h, Hold::Spin(ns) if *ns <= RANDOM_JITTER_NS)));
        assert!(holds.contains(&Hold::None));
    }
}
