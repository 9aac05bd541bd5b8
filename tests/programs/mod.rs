//! Random well-formed programs for the property tests (the oracle agreement test's generator):
//! allocations, frees and accesses on several streams and memory kinds, event and host
//! synchronization, and CUDA graph captures with forks and joins, shared pools and replays on
//! several streams, and allocations into named graph pools outside captures.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use streamsan::trace::{Id, MemoryKind, Op, Region, TraceOp};

/// A tiny deterministic generator (SplitMix64), seeded per step so that shrinking stays local.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// The shape of a program: its streams, buffer names and whether allocations carry `addr`.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Streams besides `"default"` and the blocking `"b"`: 0 to 2.
    pub extra_streams: u8,
    /// Whether `s1` is used without a `stream_create`.
    pub s1_implicit: bool,
    /// Whether `s2` is on device 1 (never with `addr`).
    pub s2_device1: bool,
    /// Whether `s2` is blocking.
    pub s2_blocking: bool,
    /// Buffer names: 2 to 4.
    pub names: u8,
    /// Whether the fourth name is managed memory (otherwise an external buffer).
    pub fourth_managed: bool,
    /// Whether every non-empty allocation gives `addr`.
    pub addr_mode: bool,
    /// Whether device allocations favour the stream and size of the latest free (more reuse).
    pub reuse_heavy: bool,
    /// Whether the program captures and replays CUDA graphs.
    pub graphs: bool,
}

pub fn shape() -> impl Strategy<Value = Shape> {
    (
        0u8..=2,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        2u8..=4,
        any::<bool>(),
        prop::bool::weighted(0.25),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                extra_streams,
                s1_implicit,
                s2_device1,
                s2_blocking,
                names,
                fourth_managed,
                addr,
                reuse_heavy,
                graphs,
            )| {
                Shape {
                    reuse_heavy,
                    graphs,
                    extra_streams,
                    s1_implicit,
                    s2_device1,
                    s2_blocking,
                    names,
                    fourth_managed,
                    addr_mode: addr,
                }
            },
        )
}

/// What a buffer name is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameKind {
    Memory(MemoryKind),
    External,
}

/// A live allocation in the generator.
#[derive(Clone, Debug)]
pub struct Live {
    memory: MemoryKind,
    owner: Option<Id>,
    slot: Option<usize>,
    /// The class of its slot: device, pinned, managed or graph pool.
    class: usize,
}

/// Device slots for `addr` programs (1 MiB apart; every device allocation there is 4096 bytes, so
/// the generations of a slot cover the same bytes).
pub const DEVICE_SLOTS: [u64; 3] = [0x10_0000, 0x20_0000, 0x30_0000];
/// Pinned and managed slots for `addr` programs (every allocation there is 1024 bytes).
pub const HOST_SLOTS: [u64; 2] = [0x4000_0000, 0x4010_0000];
/// Graph pool slots for `addr` programs (every capture of such a program uses pool `p`, which
/// keeps these bytes: no plain allocation takes them).
pub const POOL_SLOTS: [u64; 2] = [0x50_0000, 0x60_0000];

/// What the generator knows of an event, to keep the program one CUDA accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ev {
    Unrecorded,
    Recorded,
    /// Recorded in the capture of this graph, which is underway.
    Captured(String),
}

/// A capture underway: the graph, its origin and the streams that joined it.
#[derive(Clone, Debug)]
pub struct Cap {
    graph: String,
    streams: Vec<&'static str>,
}

/// The generator's graphs: captures underway, graphs that can be launched, events.
#[derive(Clone, Debug, Default)]
pub struct GraphGen {
    enabled: bool,
    made: u32,
    ended: Vec<String>,
    captures: Vec<Cap>,
    events: HashMap<String, Ev>,
    blocking: HashSet<&'static str>,
}

impl GraphGen {
    fn capture_of(&self, stream: &str) -> Option<usize> {
        self.captures
            .iter()
            .position(|c| c.streams.contains(&stream))
    }

    fn blocking_capturing(&self) -> bool {
        self.captures
            .iter()
            .any(|c| c.streams.iter().any(|s| self.blocking.contains(s)))
    }

    fn event(&self, e: &str) -> Ev {
        self.events.get(e).cloned().unwrap_or(Ev::Unrecorded)
    }

    /// Whether `op` is valid now (not a program CUDA rejects during a capture); if so, updates
    /// what the generator knows (a stream joining a capture, events).
    fn admit(&mut self, op: &Op, streams: &[&'static str]) -> bool {
        if op.on_stream().is_some_and(|s| s.as_str() == "default") && self.blocking_capturing() {
            return false;
        }
        match op {
            Op::EventRecord { event, stream } => {
                let ev = match self.capture_of(stream.as_str()) {
                    Some(c) => Ev::Captured(self.captures[c].graph.clone()),
                    None => Ev::Recorded,
                };
                self.events.insert(event.to_string(), ev);
            }
            Op::EventWait { stream, event } => {
                let ev = self.event(event.as_str());
                match (self.capture_of(stream.as_str()), ev) {
                    (Some(c), Ev::Captured(g)) => return self.captures[c].graph == g,
                    (Some(_), Ev::Recorded) => return false,
                    (Some(_), Ev::Unrecorded) => {}
                    (None, Ev::Captured(g)) => {
                        if stream.as_str() == "default" {
                            return false;
                        }
                        let Some(s) = streams.iter().find(|s| **s == stream.as_str()) else {
                            return false;
                        };
                        if let Some(c) = self.captures.iter_mut().find(|c| c.graph == g) {
                            c.streams.push(s);
                        }
                    }
                    (None, _) => {}
                }
            }
            Op::EventSync { event } | Op::EventQuery { event, .. } => {
                return !matches!(self.event(event.as_str()), Ev::Captured(_))
            }
            Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => {
                return self.capture_of(stream.as_str()).is_none()
            }
            Op::DeviceSync { .. } => return self.captures.is_empty(),
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.events.insert(event.to_string(), Ev::Unrecorded);
            }
            Op::Free {
                stream: Some(s), ..
            }
            | Op::GraphLaunch { stream: s, .. } => return self.capture_of(s.as_str()).is_none(),
            _ => {}
        }
        true
    }
}

pub struct Program {
    rng: Rng,
    addr_mode: bool,
    reuse_heavy: bool,
    /// The stream the latest device free gave its memory to.
    freed_to: Option<Id>,
    streams: Vec<&'static str>,
    devices: Vec<u64>,
    names: Vec<(&'static str, NameKind)>,
    live: HashMap<&'static str, Live>,
    freed: HashSet<&'static str>,
    /// The size of the latest allocation of each name (regions of freed names stay inside it).
    sizes: HashMap<&'static str, u64>,
    /// Occupied slots: device, pinned, managed, graph pool.
    slots: [Vec<bool>; 4],
    ops: Vec<Op>,
    g: GraphGen,
}

fn slot_class(memory: MemoryKind) -> usize {
    match memory {
        MemoryKind::Device => 0,
        MemoryKind::Pinned => 1,
        MemoryKind::Managed => 2,
    }
}

impl Program {
    fn new(shape: &Shape) -> Self {
        let mut p = Program {
            rng: Rng(0),
            addr_mode: shape.addr_mode,
            reuse_heavy: shape.reuse_heavy,
            freed_to: None,
            streams: vec!["default", "b"],
            devices: vec![0],
            names: vec![
                ("a", NameKind::Memory(MemoryKind::Device)),
                ("p", NameKind::Memory(MemoryKind::Pinned)),
                ("c", NameKind::Memory(MemoryKind::Device)),
                if shape.fourth_managed {
                    ("m", NameKind::Memory(MemoryKind::Managed))
                } else {
                    ("x", NameKind::External)
                },
            ],
            live: HashMap::new(),
            freed: HashSet::new(),
            sizes: HashMap::new(),
            slots: [
                vec![false; DEVICE_SLOTS.len()],
                vec![false; HOST_SLOTS.len()],
                vec![false; HOST_SLOTS.len()],
                vec![false; POOL_SLOTS.len()],
            ],
            ops: Vec::new(),
            g: GraphGen {
                enabled: shape.graphs,
                ..GraphGen::default()
            },
        };
        p.g.blocking.insert("b");
        p.names.truncate(shape.names as usize);
        p.ops.push(Op::StreamCreate {
            stream: "b".into(),
            device: 0,
            blocking: true,
        });
        if shape.extra_streams >= 1 {
            p.streams.push("s1");
            if !shape.s1_implicit {
                p.ops.push(Op::StreamCreate {
                    stream: "s1".into(),
                    device: 0,
                    blocking: false,
                });
            }
        }
        if shape.extra_streams >= 2 {
            p.streams.push("s2");
            let device = u64::from(shape.s2_device1 && !shape.addr_mode);
            if device == 1 {
                p.devices.push(1);
            }
            p.ops.push(Op::StreamCreate {
                stream: "s2".into(),
                device,
                blocking: shape.s2_blocking,
            });
            if shape.s2_blocking && device == 0 {
                p.g.blocking.insert("s2");
            }
        }
        p
    }

    /// Appends `op` if it is valid now.
    fn emit(&mut self, op: Op) {
        if self.g.admit(&op, &self.streams) {
            self.ops.push(op);
        }
    }

    /// A graph step: begin or end a capture, fork a stream into one or join it back, launch.
    fn graph_step(&mut self) {
        match self.rng.below(6) {
            0 if self.g.made < 3 && self.g.captures.len() < 2 => {
                let free: Vec<&'static str> = self
                    .streams
                    .iter()
                    .copied()
                    .filter(|s| *s != "default" && self.g.capture_of(s).is_none())
                    .collect();
                if free.is_empty() {
                    return;
                }
                let origin = *self.rng.pick(&free);
                let graph = format!("g{}", self.g.made);
                self.g.made += 1;
                let pool = (self.addr_mode || self.rng.chance(2)).then(|| Id::from("p"));
                self.ops.push(Op::GraphBegin {
                    graph: graph.as_str().into(),
                    stream: origin.into(),
                    pool,
                });
                self.g.captures.push(Cap {
                    graph,
                    streams: vec![origin],
                });
            }
            1 if !self.g.captures.is_empty() => {
                // End a capture, joining every forked stream back into the origin first.
                let c = self.rng.below(self.g.captures.len() as u64) as usize;
                let cap = self.g.captures[c].clone();
                for s in &cap.streams[1..] {
                    self.emit(Op::EventRecord {
                        event: "ej".into(),
                        stream: (*s).into(),
                    });
                    self.emit(Op::EventWait {
                        stream: cap.streams[0].into(),
                        event: "ej".into(),
                    });
                }
                self.ops.push(Op::GraphEnd {
                    graph: cap.graph.as_str().into(),
                });
                self.g.captures.remove(c);
                for ev in self.g.events.values_mut() {
                    if *ev == Ev::Captured(cap.graph.clone()) {
                        *ev = Ev::Unrecorded;
                    }
                }
                self.g.ended.push(cap.graph);
            }
            2 | 3 if !self.g.captures.is_empty() => {
                // Fork: a capturing stream records, another stream waits and joins.
                let c = self.rng.below(self.g.captures.len() as u64) as usize;
                let from = *self.rng.pick(&self.g.captures[c].streams.clone());
                let to = *self.rng.pick(&self.streams);
                let event = self.event();
                self.emit(Op::EventRecord {
                    event: event.clone(),
                    stream: from.into(),
                });
                self.emit(Op::EventWait {
                    stream: to.into(),
                    event,
                });
            }
            _ if !self.g.ended.is_empty() => {
                let graph = self.rng.pick(&self.g.ended).clone();
                let stream = self.stream();
                self.emit(Op::GraphLaunch {
                    graph: graph.as_str().into(),
                    stream,
                });
            }
            _ => {}
        }
    }

    fn stream(&mut self) -> Id {
        let s = *self.rng.pick(&self.streams);
        s.into()
    }

    fn event(&mut self) -> Id {
        if self.rng.chance(2) { "e0" } else { "e1" }.into()
    }

    /// A buffer name for a device-side access: usually live, sometimes external, rarely freed.
    fn access_name(&mut self) -> &'static str {
        for _ in 0..4 {
            let (name, kind) = *self.rng.pick(&self.names);
            if self.live.contains_key(name) || kind == NameKind::External {
                return name;
            }
            if self.freed.contains(name) {
                if self.rng.chance(6) {
                    return name;
                }
            } else if self.rng.chance(6) {
                // Never allocated: used as an external buffer.
                return name;
            }
        }
        "x"
    }

    /// A region of `name` that stays in bounds.
    fn region(&mut self, name: &'static str) -> Region {
        let r = &mut self.rng;
        match self.sizes.get(name) {
            Some(&sz) => match r.below(6) {
                0..=2 => Region::whole(name),
                3 => Region {
                    buffer: name.into(),
                    offset: sz * r.below(5) / 4,
                    bytes: None,
                },
                4 => {
                    let q0 = r.below(4);
                    let q1 = q0 + 1 + r.below(4 - q0);
                    Region::range(name, sz * q0 / 4, sz * q1 / 4 - sz * q0 / 4)
                }
                _ => {
                    let o = r.below(sz + 1);
                    let n = r.below(sz - o + 1);
                    Region::range(name, o, n)
                }
            },
            _ => match r.below(4) {
                0 | 1 => Region::whole(name),
                2 => Region {
                    buffer: name.into(),
                    offset: *r.pick(&[0, 1000, 4096]),
                    bytes: None,
                },
                _ => Region::range(name, *r.pick(&[0, 2048, 4096]), *r.pick(&[4, 4096])),
            },
        }
    }

    fn alloc(&mut self) {
        let (name, kind) = *self.rng.pick(&self.names);
        let NameKind::Memory(memory) = kind else {
            return;
        };
        if self.live.contains_key(name) {
            return;
        }
        let stream = (memory == MemoryKind::Device).then(|| match &self.freed_to {
            Some(s) if self.reuse_heavy && !self.rng.chance(4) => s.clone(),
            _ => self.stream(),
        });
        // Device memory allocated on a capturing stream comes from the capture's pool.
        let captured = stream
            .as_ref()
            .is_some_and(|s| self.g.capture_of(s.as_str()).is_some());
        // Outside a capture, device memory now and then comes from a named graph pool (as in
        // PyTorch's warm-ups): with addr always `p`, whose slots it then takes.
        let named = (self.g.enabled && memory == MemoryKind::Device && !captured)
            .then(|| self.rng.chance(4))
            .filter(|&n| n)
            .map(|_| match self.addr_mode {
                true => Id::from("p"),
                false => Id::from(*self.rng.pick(&["p", "g0", "g1"])),
            });
        let pool = captured || named.is_some();
        let class = if pool { 3 } else { slot_class(memory) };
        let empty = self.rng.chance(16);
        let (bytes, slot) = if self.addr_mode {
            let bytes = match (empty, memory) {
                (true, _) => 0,
                (false, MemoryKind::Device) => 4096,
                (false, _) => 1024,
            };
            let slot = if bytes == 0 {
                None
            } else {
                let free: Vec<usize> = (0..self.slots[class].len())
                    .filter(|&i| !self.slots[class][i])
                    .collect();
                if free.is_empty() {
                    return;
                }
                let s = *self.rng.pick(&free);
                self.slots[class][s] = true;
                Some(s)
            };
            (bytes, slot)
        } else {
            let bytes = if empty {
                0
            } else if memory == MemoryKind::Device && self.reuse_heavy {
                *self.rng.pick(&[4096, 4096, 4096, 2048, 8192])
            } else if memory == MemoryKind::Device {
                *self
                    .rng
                    .pick(&[512, 512, 1000, 1000, 4096, 4096, 4096, 8192, 600, 1_500_000])
            } else {
                *self.rng.pick(&[1000, 1024, 4096])
            };
            (bytes, None)
        };
        let addr = slot.map(|s| match (memory, pool) {
            (MemoryKind::Device, true) => POOL_SLOTS[s],
            (MemoryKind::Device, false) => DEVICE_SLOTS[s],
            _ => HOST_SLOTS[s],
        });
        // The owner of device memory defaults to "default"; spell it out only sometimes.
        let field = match &stream {
            Some(s) if s.as_str() == "default" && self.rng.chance(2) => None,
            other => other.clone(),
        };
        self.ops.push(Op::Alloc {
            buffer: name.into(),
            bytes,
            stream: field,
            memory,
            addr,
            pool: named,
        });
        self.live.insert(
            name,
            Live {
                memory,
                owner: stream.clone(),
                slot,
                class,
            },
        );
        self.freed.remove(name);
        self.sizes.insert(name, bytes);
    }

    fn free(&mut self, stream_ordered: bool) {
        let (name, _) = *self.rng.pick(&self.names);
        // A stream-ordered free on a capturing stream is bad input: a caching free instead.
        let stream = stream_ordered.then(|| self.stream()).filter(|s| {
            self.g.capture_of(s.as_str()).is_none()
                && !(s.as_str() == "default" && self.g.blocking_capturing())
        });
        match self.live.get(name).cloned() {
            Some(l)
                if !(stream_ordered && l.memory != MemoryKind::Device && !self.rng.chance(8)) =>
            {
                if l.memory == MemoryKind::Device {
                    self.freed_to = match &stream {
                        Some(s) => Some(s.clone()),
                        None => l.owner.clone(),
                    };
                }
                if let Some(s) = l.slot {
                    self.slots[l.class][s] = false;
                }
                self.live.remove(name);
                self.freed.insert(name);
            }
            Some(_) => return,
            // An invalid free now and then.
            None if self.rng.chance(6) => {}
            None => return,
        }
        self.ops.push(Op::Free {
            buffer: name.into(),
            stream,
        });
    }

    fn step(&mut self, sel: u8, seed: u64) {
        self.rng = Rng(seed);
        if self.g.enabled && sel >= 160 {
            return self.graph_step();
        }
        let mut sel = sel % 32;
        if self.reuse_heavy && (20..=26).contains(&sel) {
            // Fewer waits and syncs, more churn.
            sel = [4, 0, 8, 6, 1, 9, 7][usize::from(sel - 20)];
        }
        match sel {
            0..=3 | 27..=28 => self.alloc(),
            4..=5 => self.free(false),
            6 => self.free(true),
            7 => {
                let (name, _) = *self.rng.pick(&self.names);
                if self.live.contains_key(name) || self.rng.chance(6) {
                    let stream = self.stream();
                    self.emit(Op::RecordStream {
                        buffer: name.into(),
                        stream,
                    });
                }
            }
            8..=12 | 29..=31 => {
                let stream = self.stream();
                let nr = self.rng.below(3);
                let nw = self.rng.below(3);
                let reads = (0..nr)
                    .map(|_| {
                        let n = self.access_name();
                        self.region(n)
                    })
                    .collect();
                let writes = (0..nw)
                    .map(|_| {
                        let n = self.access_name();
                        self.region(n)
                    })
                    .collect();
                self.emit(Op::Launch {
                    stream,
                    name: None,
                    reads,
                    writes,
                });
            }
            13..=14 => {
                let stream = self.stream();
                let s = self.access_name();
                let d = self.access_name();
                if s != d {
                    let src = self.region(s);
                    let dst = self.region(d);
                    self.emit(Op::Copy { stream, src, dst });
                } else if let Some(&size) = self.sizes.get(s).filter(|&&n| n >= 2) {
                    // Two disjoint halves of one buffer.
                    let half = size / 2;
                    let (lo, hi) = (Region::range(s, 0, half), Region::range(s, half, half));
                    let (src, dst) = if self.rng.chance(2) {
                        (lo, hi)
                    } else {
                        (hi, lo)
                    };
                    self.emit(Op::Copy { stream, src, dst });
                }
            }
            15 => {
                let stream = self.stream();
                let d = self.access_name();
                let dst = self.region(d);
                self.emit(Op::Memset { stream, dst });
            }
            16..=17 => {
                let host: Vec<&'static str> = self
                    .names
                    .iter()
                    .filter(|(n, k)| {
                        matches!(k, NameKind::Memory(m) if m.host_accessible())
                            && (self.live.contains_key(n) || self.freed.contains(n))
                    })
                    .map(|(n, _)| *n)
                    .collect();
                if host.is_empty() {
                    return;
                }
                let name = *self.rng.pick(&host);
                if !self.live.contains_key(name) && !self.rng.chance(4) {
                    return;
                }
                let buffer = self.region(name);
                let op = if self.rng.chance(2) {
                    Op::HostRead { buffer }
                } else {
                    Op::HostWrite { buffer }
                };
                self.emit(op);
            }
            18..=19 => {
                let event = self.event();
                let stream = self.stream();
                self.emit(Op::EventRecord { event, stream });
            }
            20..=21 => {
                let event = self.event();
                let stream = self.stream();
                self.emit(Op::EventWait { stream, event });
            }
            22 => {
                let event = self.event();
                let op = match self.rng.below(3) {
                    0 => Op::EventSync { event },
                    c => Op::EventQuery {
                        event,
                        complete: c == 1,
                    },
                };
                self.emit(op);
            }
            23..=24 => {
                let stream = self.stream();
                let op = match self.rng.below(3) {
                    0 => Op::StreamSync { stream },
                    c => Op::StreamQuery {
                        stream,
                        complete: c == 1,
                    },
                };
                self.emit(op);
            }
            25 => {
                let device = if self.rng.chance(8) {
                    2
                } else {
                    *self.rng.pick(&self.devices)
                };
                self.emit(Op::DeviceSync { device });
            }
            _ if self.rng.chance(4) => {
                // A late declaration: a new blocking stream, or "b" again with its attributes.
                if self.rng.chance(2) && !self.streams.contains(&"s3") {
                    self.streams.push("s3");
                    self.g.blocking.insert("s3");
                    self.emit(Op::StreamCreate {
                        stream: "s3".into(),
                        device: 0,
                        blocking: true,
                    });
                } else {
                    self.emit(Op::StreamCreate {
                        stream: "b".into(),
                        device: 0,
                        blocking: true,
                    });
                }
            }
            _ => {
                let event = self.event();
                let op = if self.rng.chance(2) {
                    Op::EventCreate { event }
                } else {
                    Op::EventDestroy { event }
                };
                self.emit(op);
            }
        }
    }
}

pub fn program(shape: &Shape, steps: &[(u8, u64)]) -> Vec<TraceOp> {
    let mut p = Program::new(shape);
    for &(sel, seed) in steps {
        p.step(sel, seed);
    }
    p.ops.into_iter().map(TraceOp::from).collect()
}
