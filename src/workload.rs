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
    pub fn generate(&self, emit: impl FnMut(TraceOp)) {
        self.generate_waiting(1, emit)
    }

    /// [`generate`](Self::generate) with each step waiting on the events of `waits` stages (at
    /// most `streams - 1`): the previous stage's, as always, and the events of the stages before
    /// it, in a random order — the "insurance" waits of a pipeline that waits on every stage it
    /// might depend on. Most of them order nothing the ring of events does not order already;
    /// with `waits` 1 the workload is the plain one.
    pub fn generate_waiting(&self, waits: u32, mut emit: impl FnMut(TraceOp)) {
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
                pool: None,
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
            let mut stages: Vec<u32> = (1..=waits.clamp(1, streams - 1))
                .map(|d| (s + streams - d) % streams)
                .collect();
            for k in (1..stages.len()).rev() {
                stages.swap(k, rng.below(k as u64 + 1) as usize);
            }
            for w in stages {
                push(Op::EventWait {
                    stream: stream(s),
                    event: Id::from(format!("e{w}")),
                });
            }
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
                pool: None,
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

/// The hostile and long-running trace shapes of the hardening work: each stresses one part of the
/// checker's memory or time (see `docs/performance.md`, "Bounded memory and time"). `size` is the
/// shape's scale; [`Shape::generate`] calls `emit` with every op, in order, without holding the
/// trace in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `size` cycles of: alloc a 512-byte temporary `t` on stream `s`, a launch on `s` that
    /// writes it, a caching free. Nothing ever synchronizes the host; every cycle reuses the
    /// same bytes. Clean.
    Churn,
    /// One buffer of 2^`size` bytes on stream `s`: alloc, a launch that writes it, free; then a
    /// second buffer of the same size on `s` reuses its bytes and is written by `s` and read by
    /// `t` without an event: a data race (with `s`'s write) and a reuse race (with `s`'s write of
    /// the first buffer).
    Huge,
    /// `size` streams with one launch each; launch `k` writes bytes `[8k, 8k+8)` of the external
    /// buffer `out`. Clean.
    Streams,
    /// `size` streams in a ring: stream `k` waits on the event of stream `k-1`, launches a kernel
    /// that reads slice `k-1` and writes slice `k` of the external buffer `x`, and records its
    /// event; stream 0 then waits on the last event and reads the last slice. Finally stream 1
    /// writes slice 0 without waiting: one race with stream 0's last read.
    Ring,
    /// `size` rounds of: `s` writes `a` and records `e`; `t` waits on `e` and reads `a`. From the
    /// second round on, every write races with `t`'s reads (write-after-read): `size - 1`
    /// hazards.
    LoopRace,
    /// One buffer of `16 * size` bytes, never synchronized: streams `s` and `t` alternately
    /// write `size` distinct 8-byte ranges of it, then stream `u` reads all of it: one race.
    Ranges,
    /// One launch on `s` that writes `size` distinct 8-byte regions of one buffer, then one that
    /// reads them all on `s` and writes the first: clean.
    Regions,
    /// `size` buffers of 512 bytes allocated on `s` and written once by `s`, never freed. Clean.
    Live,
    /// A CUDA graph of 200 captured ops replayed `size` times on stream `s` (an inference
    /// loop): the capture forks stream `side` and joins it back, and every layer takes a new
    /// temporary from the graph's pool and frees the previous one (so the pool hands the same
    /// blocks out again and again). Each step sets the static input on `s`, launches the graph,
    /// copies the static output to pinned memory and has the host wait for it. Clean.
    GraphReplays,
}

impl Shape {
    /// Every shape, in the order they were added.
    pub const ALL: [Shape; 9] = [
        Shape::Churn,
        Shape::Huge,
        Shape::Streams,
        Shape::Ring,
        Shape::LoopRace,
        Shape::Ranges,
        Shape::Regions,
        Shape::Live,
        Shape::GraphReplays,
    ];

    /// The shape's name on the command line (`churn`, `loop-race`, …).
    pub fn name(self) -> &'static str {
        match self {
            Shape::Churn => "churn",
            Shape::Huge => "huge",
            Shape::Streams => "streams",
            Shape::Ring => "ring",
            Shape::LoopRace => "loop-race",
            Shape::Ranges => "ranges",
            Shape::Regions => "regions",
            Shape::Live => "live",
            Shape::GraphReplays => "graph-replays",
        }
    }

    /// The shape named `name`.
    pub fn from_name(name: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The size each shape was designed for.
    pub fn default_size(self) -> u64 {
        match self {
            Shape::Churn => 1_000_000,
            Shape::Huge => 44,
            Shape::Streams => 100_000,
            Shape::Ring => 7_000,
            Shape::LoopRace => 10_000,
            Shape::Ranges => 1_000_000,
            Shape::Regions => 80_000,
            Shape::Live => 1_000_000,
            Shape::GraphReplays => 1_000,
        }
    }

    /// The number of hazards the shape has at `size` (all of them errors).
    pub fn hazards(self, size: u64) -> u64 {
        match self {
            Shape::Churn | Shape::Streams | Shape::Regions | Shape::Live | Shape::GraphReplays => 0,
            Shape::Ring | Shape::Ranges => 1,
            Shape::Huge => 2,
            Shape::LoopRace => size.saturating_sub(1),
        }
    }

    /// Calls `emit` with every op of the shape at `size`, in order.
    pub fn generate(self, size: u64, mut emit: impl FnMut(TraceOp)) {
        let mut push = |op: Op| emit(TraceOp { op, site: None });
        let launch = |stream: &Id, reads: Vec<Region>, writes: Vec<Region>| Op::Launch {
            stream: stream.clone(),
            name: None,
            reads,
            writes,
        };
        let alloc = |buffer: &Id, bytes: u64, stream: &Id| Op::Alloc {
            buffer: buffer.clone(),
            bytes,
            stream: Some(stream.clone()),
            memory: MemoryKind::Device,
            addr: None,
            pool: None,
        };
        let free = |buffer: &Id| Op::Free {
            buffer: buffer.clone(),
            stream: None,
        };
        let (s, t, u) = (Id::from("s"), Id::from("t"), Id::from("u"));
        let stream = |k: u64| Id::from(format!("s{k}"));
        match self {
            Shape::Churn => {
                let tmp = Id::from("t");
                for _ in 0..size {
                    push(alloc(&tmp, 512, &s));
                    push(launch(&s, vec![], vec![Region::whole(tmp.clone())]));
                    push(free(&tmp));
                }
            }
            Shape::Huge => {
                let bytes = 1u64 << size.min(46);
                let (a, b) = (Id::from("a"), Id::from("b"));
                push(alloc(&a, bytes, &s));
                push(launch(&s, vec![], vec![Region::whole(a.clone())]));
                push(free(&a));
                push(alloc(&b, bytes, &s));
                push(launch(&s, vec![], vec![Region::whole(b.clone())]));
                push(launch(&t, vec![Region::whole(b.clone())], vec![]));
            }
            Shape::Streams => {
                let out = Id::from("out");
                for k in 0..size {
                    push(launch(
                        &stream(k),
                        vec![],
                        vec![Region::range(out.clone(), 8 * k, 8)],
                    ));
                }
            }
            Shape::Ring => {
                let x = Id::from("x");
                let event = |k: u64| Id::from(format!("e{k}"));
                let slice = |k: u64| Region::range(x.clone(), 8 * k, 8);
                for k in 0..size {
                    let mut reads = vec![];
                    if k > 0 {
                        push(Op::EventWait {
                            stream: stream(k),
                            event: event(k - 1),
                        });
                        reads.push(slice(k - 1));
                    }
                    push(launch(&stream(k), reads, vec![slice(k)]));
                    push(Op::EventRecord {
                        event: event(k),
                        stream: stream(k),
                    });
                }
                if size > 1 {
                    push(Op::EventWait {
                        stream: stream(0),
                        event: event(size - 1),
                    });
                    push(launch(&stream(0), vec![slice(size - 1), slice(0)], vec![]));
                    push(launch(&stream(1), vec![], vec![slice(0)]));
                }
            }
            Shape::LoopRace => {
                let (a, e) = (Id::from("a"), Id::from("e"));
                for _ in 0..size {
                    push(launch(&s, vec![], vec![Region::whole(a.clone())]));
                    push(Op::EventRecord {
                        event: e.clone(),
                        stream: s.clone(),
                    });
                    push(Op::EventWait {
                        stream: t.clone(),
                        event: e.clone(),
                    });
                    push(launch(&t, vec![Region::whole(a.clone())], vec![]));
                }
            }
            Shape::Ranges => {
                let a = Id::from("a");
                push(alloc(&a, 16 * size.max(1), &s));
                for k in 0..size {
                    let on = if k % 2 == 0 { &s } else { &t };
                    push(launch(
                        on,
                        vec![],
                        vec![Region::range(a.clone(), 16 * k, 8)],
                    ));
                }
                push(launch(&u, vec![Region::whole(a.clone())], vec![]));
            }
            Shape::Regions => {
                let a = Id::from("a");
                push(alloc(&a, 8 * size.max(1), &s));
                let regions: Vec<Region> = (0..size)
                    .map(|k| Region::range(a.clone(), 8 * k, 8))
                    .collect();
                push(launch(&s, vec![], regions.clone()));
                push(launch(&s, regions, vec![Region::range(a.clone(), 0, 8)]));
            }
            Shape::Live => {
                for k in 0..size {
                    let b = Id::from(format!("b{k}"));
                    push(alloc(&b, 512, &s));
                    push(launch(&s, vec![], vec![Region::whole(b)]));
                }
            }
            Shape::GraphReplays => graph_replays(size, &mut push),
        }
    }
}

/// Captured ops of [`Shape::GraphReplays`]'s graph.
pub const GRAPH_BODY: u64 = 200;

/// [`Shape::GraphReplays`]: the capture (200 captured ops), then `replays` steps.
fn graph_replays(replays: u64, push: &mut impl FnMut(Op)) {
    let id = |s: &str| Id::from(s);
    let (s, side, g) = (id("s"), id("side"), id("g"));
    let whole = |b: &Id| Region::whole(b.clone());
    let launch = |stream: &Id, name: &str, reads: Vec<Region>, writes: Vec<Region>| Op::Launch {
        stream: stream.clone(),
        name: Some(name.into()),
        reads,
        writes,
    };
    let alloc = |buffer: &Id, bytes: u64, stream: &Id, memory: MemoryKind| Op::Alloc {
        buffer: buffer.clone(),
        bytes,
        stream: (memory == MemoryKind::Device).then(|| stream.clone()),
        memory,
        addr: None,
        pool: None,
    };
    let free = |buffer: &Id| Op::Free {
        buffer: buffer.clone(),
        stream: None,
    };
    let (x, y, host) = (id("x"), id("y"), id("host_out"));
    let weights: Vec<Id> = (0..8).map(|k| Id::from(format!("w{k}"))).collect();
    push(Op::StreamCreate {
        stream: s.clone(),
        device: 0,
        blocking: false,
    });
    push(alloc(&x, 65536, &s, MemoryKind::Device));
    push(alloc(&host, 65536, &s, MemoryKind::Pinned));
    for w in &weights {
        push(alloc(w, 1 << 20, &s, MemoryKind::Device));
        push(launch(&s, "load", vec![], vec![whole(w)]));
    }
    // The capture: 200 captured ops.
    push(Op::GraphBegin {
        graph: g.clone(),
        stream: s.clone(),
        pool: None,
    });
    push(alloc(&y, 65536, &s, MemoryKind::Device));
    push(Op::EventRecord {
        event: id("fork"),
        stream: s.clone(),
    });
    push(Op::EventWait {
        stream: side.clone(),
        event: id("fork"),
    });
    // The side stream: 48 layers on temporaries of its own, from x.
    let mut prev = x.clone();
    for k in 0..48u64 {
        let t = Id::from(format!("a{}", k % 4));
        push(alloc(&t, 65536, &side, MemoryKind::Device));
        let w = &weights[(k % 8) as usize];
        push(launch(
            &side,
            "side",
            vec![whole(&prev), whole(w)],
            vec![whole(&t)],
        ));
        if prev != x {
            push(free(&prev));
        }
        prev = t;
    }
    push(Op::EventRecord {
        event: id("join"),
        stream: side.clone(),
    });
    // The origin: 147 layers, then waits for the side stream and writes the output.
    let side_out = prev;
    let mut prev = x.clone();
    for k in 0..147u64 {
        let t = Id::from(format!("t{}", k % 4));
        push(alloc(&t, 65536, &s, MemoryKind::Device));
        let w = &weights[(k % 8) as usize];
        push(launch(
            &s,
            "layer",
            vec![whole(&prev), whole(w)],
            vec![whole(&t)],
        ));
        if prev != x {
            push(free(&prev));
        }
        prev = t;
    }
    push(Op::EventWait {
        stream: s.clone(),
        event: id("join"),
    });
    push(launch(
        &s,
        "merge",
        vec![whole(&prev), whole(&side_out)],
        vec![whole(&y)],
    ));
    push(free(&prev));
    push(free(&side_out));
    push(Op::GraphEnd { graph: g.clone() });
    // The loop.
    let done = id("done");
    for _ in 0..replays {
        push(launch(&s, "input", vec![], vec![whole(&x)]));
        push(Op::GraphLaunch {
            graph: g.clone(),
            stream: s.clone(),
        });
        push(Op::Copy {
            stream: s.clone(),
            src: whole(&y),
            dst: whole(&host),
        });
        push(Op::EventRecord {
            event: done.clone(),
            stream: s.clone(),
        });
        push(Op::EventSync {
            event: done.clone(),
        });
        push(Op::HostRead {
            buffer: whole(&host),
        });
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
