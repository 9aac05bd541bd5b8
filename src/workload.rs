//! Synthetic workloads: a clean multi-stream training-style pipeline, for benchmarks and memory
//! measurements (`streamsan bench`).
//!
//! The pipeline is a ring of `streams` stages. Step `k` runs on stream `s = k mod streams`: it
//! waits on the event of the previous stage, allocates a temporary on `s`, runs a kernel that
//! reads two buffers of the previous stage and writes the temporary, a kernel that reads the
//! temporary and writes a buffer of its own stage, frees the temporary allocated four steps
//! earlier on the same stream, and records its event. Every 64 steps the host synchronizes the
//! device, as a training loop does when it reads its loss. The program is free of hazards: every
//! cross-stream use is ordered by the ring of events, temporaries stay on their stream.

use crate::trace::{Id, MemoryKind, Op, Region, TraceOp};

/// The shape of a pipeline workload.
#[derive(Clone, Copy, Debug)]
pub struct Pipeline {
    /// Number of ops to generate (at least the setup's).
    pub ops: u64,
    /// Number of streams (at least 2).
    pub streams: u32,
    /// Number of persistent buffers (at least `streams`).
    pub buffers: u32,
    /// Deterministic seed for sizes and choices.
    pub seed: u64,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline {
            ops: 200_000,
            streams: 8,
            buffers: 1_000,
            seed: 1,
        }
    }
}

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

impl Pipeline {
    /// Calls `emit` with every op of the workload, in order; stops after `self.ops` ops.
    pub fn generate(&self, mut emit: impl FnMut(TraceOp)) {
        let streams = self.streams.max(2);
        let buffers = self.buffers.max(streams);
        let mut rng = SplitMix::new(self.seed);
        let n = std::cell::Cell::new(0u64);
        let limit = self.ops;
        let mut push = |op: Op| {
            if n.get() < limit {
                emit(TraceOp { op, site: None });
                n.set(n.get() + 1);
            }
        };
        let stream = |s: u32| Id::from(format!("s{s}"));
        let buf = |b: u32| Id::from(format!("b{b}"));
        // Buffer b belongs to stage b mod streams.
        let owned = |s: u32, k: u64| buf(s + streams * (k % (buffers / streams) as u64) as u32);
        for s in 0..streams {
            push(Op::StreamCreate {
                stream: stream(s),
                device: 0,
                blocking: false,
            });
        }
        for b in 0..buffers {
            let bytes = 4096 * (1 + rng.below(16));
            push(Op::Alloc {
                buffer: buf(b),
                bytes,
                stream: Some(stream(b % streams)),
                memory: MemoryKind::Device,
                addr: None,
            });
            push(Op::Launch {
                stream: stream(b % streams),
                name: Some("init".into()),
                reads: vec![],
                writes: vec![Region::whole(buf(b))],
            });
        }
        push(Op::DeviceSync { device: 0 });
        for s in 0..streams {
            push(Op::EventRecord {
                event: Id::from(format!("e{s}")),
                stream: stream(s),
            });
        }
        const LIVE: u64 = 4;
        let mut temps: Vec<Option<(Id, u32)>> = vec![None; 2 * LIVE as usize];
        let mut step = 0u64;
        while n.get() < limit {
            let s = (step % streams as u64) as u32;
            let prev = (s + streams - 1) % streams;
            push(Op::EventWait {
                stream: stream(s),
                event: Id::from(format!("e{prev}")),
            });
            let slot = (step % (2 * LIVE)) as usize;
            let tmp = Id::from(format!("t{slot}"));
            let bytes = if rng.below(32) == 0 {
                2 << 20
            } else {
                512 * (1 + rng.below(64))
            };
            push(Op::Alloc {
                buffer: tmp.clone(),
                bytes,
                stream: Some(stream(s)),
                memory: MemoryKind::Device,
                addr: None,
            });
            temps[slot] = Some((tmp.clone(), s));
            let k = rng.next_u64();
            push(Op::Launch {
                stream: stream(s),
                name: Some("stage".into()),
                reads: vec![
                    Region::whole(owned(prev, k)),
                    Region::range(owned(prev, k >> 20), 0, 4096),
                ],
                writes: vec![Region::whole(tmp.clone())],
            });
            push(Op::Launch {
                stream: stream(s),
                name: Some("update".into()),
                reads: vec![Region::whole(tmp)],
                writes: vec![Region::whole(owned(s, step / streams as u64))],
            });
            // Free the temporary of four steps ago (it lives on its own stream only).
            let old = ((step + LIVE) % (2 * LIVE)) as usize;
            if let Some((t, _)) = temps[old].take() {
                push(Op::Free {
                    buffer: t,
                    stream: None,
                });
            }
            push(Op::EventRecord {
                event: Id::from(format!("e{s}")),
                stream: stream(s),
            });
            step += 1;
            if step % 64 == 0 {
                push(Op::DeviceSync { device: 0 });
            }
        }
    }

    /// The workload as a vector of ops.
    pub fn to_vec(&self) -> Vec<TraceOp> {
        let mut v = Vec::with_capacity(self.ops as usize);
        self.generate(|op| v.push(op));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::Checker;

    #[test]
    fn pipeline_is_clean_and_bounded() {
        let mut c = Checker::new();
        let mut max_history = 0;
        Pipeline {
            ops: 30_000,
            ..Default::default()
        }
        .generate(|op| {
            let h = c.check(&op).expect("valid op");
            assert!(h.is_empty(), "unexpected hazard: {h:?}");
            max_history = max_history.max(c.stats().history);
        });
        assert_eq!(c.ops(), 30_000);
        assert!(max_history < 10_000, "history grew to {max_history}");
    }
}
