//! Any valid trace made runnable by the executors, for `check --confirm`.
//!
//! Recorded traces (PyTorch programs, the Rust harness) give `addr` on every allocation — real
//! addresses, gigabytes apart, buffers of any size and views at any byte offset — use external
//! buffers, pinned and managed memory, and may hold ops the checker reports but that must not run
//! (an invalid free, a use after free). [`runnable`] turns such a trace into a program the
//! simulator and the GPU executor run with the same reuse of memory as the trace, op for op:
//!
//! - **Addresses are compressed.** Per memory kind, every buffer's and every region's start and
//!   end are boundaries; each piece of memory between two neighbouring boundaries becomes one
//!   4-byte word. Two regions share a byte of the trace exactly when they share a word of the
//!   program, so every overlap, every reuse of freed bytes and every race stays as it was, while
//!   a buffer of a terabyte becomes a few words. Every allocation then carries its compressed
//!   `addr`: without `addr` in the trace, the allocator model places the buffers first (as the
//!   checker does), so the program reuses memory exactly where the model would.
//! - **External buffers** are allocated by ops put before the trace's first op, on the legacy
//!   default stream, in memory of their own above all other device memory, large enough for every
//!   region the trace names of them; an external name that the trace allocates later is renamed
//!   (`NAME@external`), so that both can live at once.
//! - **Ops that must not run are neutralized** without changing any op index or any ordering: an
//!   invalid free becomes a no-op (a failed `stream_query`, or for a stream-ordered free an
//!   `event_record` of a private event on its stream, which orders as the free did); regions that
//!   name a freed buffer are dropped (a copy that loses one becomes a launch on its stream, as does
//!   a copy whose two sides compress to different lengths: the same accesses).
//!
//! Op `i` of the trace is op `i + shift` of the program; [`Runnable::hazard`] moves a hazard
//! there. The checker reports the same hazards on the program as on the trace, moved (less the
//! use-after-frees and invalid frees that were neutralized) — `tests/runnable.rs` holds it to that.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator, ModelMemory, StreamKey};
use crate::report::Hazard;
use crate::trace::{Id, MemoryKind, Op, Region, TraceOp, DEFAULT_STREAM};

/// Where compressed memory of each kind starts (device, pinned, managed): the model's address
/// spaces (`crate::alloc::space`).
pub use crate::alloc::space::BASES;

/// A trace made runnable: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Runnable {
    /// The program the executors run.
    pub program: Vec<TraceOp>,
    /// Ops put before the trace's first op: op `i` of the trace is op `i + shift` here.
    pub shift: u64,
    /// External names the trace allocates later: name → (its name here, the first `alloc` of
    /// the name). Before that op the name means the external buffer.
    renamed: HashMap<Id, (Id, u64)>,
    /// Bytes each memory kind's compressed memory spans (device, pinned, managed).
    pub extent: [u64; 3],
}

impl Runnable {
    /// `h`, a hazard of the trace, as a hazard of the program: op indices moved, external buffers
    /// renamed.
    pub fn hazard(&self, h: &Hazard) -> Hazard {
        let mut h = h.clone();
        let op = h.op;
        h.op += self.shift;
        if let Some(b) = &mut h.buffer {
            *b = self.name_at(b, op);
        }
        if let Some(a) = &mut h.access {
            a.op += self.shift;
            if let Some(m) = &mut a.captured {
                *m += self.shift;
            }
        }
        for c in &mut h.conflicts {
            c.buffer = self.name_at(&c.buffer, c.op);
            c.op += self.shift;
            if let Some(m) = &mut c.captured {
                *m += self.shift;
            }
        }
        if let Some(f) = &mut h.free {
            f.op += self.shift;
        }
        h
    }

    fn name_at(&self, name: &str, op: u64) -> String {
        match self.renamed.get(&Id::from(name)) {
            Some((new, until)) if op < *until => new.to_string(),
            _ => name.to_string(),
        }
    }
}

/// What a name means at a point of the trace.
#[derive(Clone, Copy, Debug)]
enum Name {
    Live(usize),
    External(usize),
    Freed,
}

/// One buffer: an allocation, or the external buffer of a name.
#[derive(Clone, Debug)]
struct Buffer {
    memory: MemoryKind,
    /// Bytes; `None` for an external buffer until its size is decided.
    size: Option<u64>,
    /// Start in its kind's address space (the trace's or the model's); externals get theirs
    /// once every region is known.
    addr: Option<u64>,
    /// For external buffers: the largest end of a bounded region, the largest offset.
    max_end: u64,
    max_offset: u64,
}

/// The buffer each region of an op names, in [`regions`] order; `None`: a freed buffer.
type Resolved = Vec<Option<usize>>;

/// The regions of an op, in a fixed order: a launch's writes then reads, a copy's source then
/// destination, a memset's destination, a host access's region.
fn regions(op: &Op) -> Vec<&Region> {
    match op {
        Op::Launch { reads, writes, .. } => writes.iter().chain(reads).collect(),
        Op::Copy { src, dst, .. } => vec![src, dst],
        Op::Memset { dst, .. } => vec![dst],
        Op::HostRead { buffer } | Op::HostWrite { buffer } => vec![buffer],
        _ => Vec::new(),
    }
}

/// Makes a valid trace runnable; see the [module docs](self). The error is bad input the
/// checker would have rejected, or memory the allocator model cannot serve.
pub fn runnable(trace: &[TraceOp]) -> Result<Runnable, String> {
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut names: HashMap<Id, Name> = HashMap::new();
    let mut externals: Vec<(Id, usize)> = Vec::new();
    let mut resolved: Vec<Resolved> = Vec::with_capacity(trace.len());
    // The op's allocation (alloc) or whether a free is valid.
    let mut alloc_of: HashMap<usize, usize> = HashMap::new();
    let mut invalid_free: HashSet<usize> = HashSet::new();
    let mut first_alloc: HashMap<Id, u64> = HashMap::new();
    let mut events: HashSet<Id> = HashSet::new();
    let mut model = Model::new();
    let addr_mode = trace.iter().any(|o| {
        matches!(
            &o.op,
            Op::Alloc {
                addr: Some(_),
                bytes,
                ..
            } if *bytes > 0
        )
    });

    for (i, op) in trace.iter().enumerate() {
        if let Some(e) = op.op.event() {
            events.insert(e.clone());
        }
        model.graph_op(i, &op.op);
        let mut here: Resolved = Vec::new();
        for r in regions(&op.op) {
            let b = match names.get(&r.buffer).copied() {
                Some(Name::Live(b)) | Some(Name::External(b)) => Some(b),
                Some(Name::Freed) => None,
                None => {
                    buffers.push(Buffer {
                        memory: MemoryKind::Device,
                        size: None,
                        addr: None,
                        max_end: 0,
                        max_offset: 0,
                    });
                    let b = buffers.len() - 1;
                    names.insert(r.buffer.clone(), Name::External(b));
                    externals.push((r.buffer.clone(), b));
                    Some(b)
                }
            };
            if let Some(b) = b {
                let buf = &mut buffers[b];
                if buf.size.is_none() {
                    buf.max_offset = buf.max_offset.max(r.offset);
                    if let Some(n) = r.bytes {
                        buf.max_end = buf.max_end.max(r.offset.saturating_add(n));
                    }
                }
            }
            here.push(b);
        }
        match &op.op {
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
                pool,
            } => {
                if let Some(Name::Live(_)) = names.get(buffer) {
                    return Err(format!("op {i}: buffer {buffer} is already allocated"));
                }
                let owner = stream.clone().unwrap_or_else(|| Id::from(DEFAULT_STREAM));
                let placed = if *bytes == 0 {
                    None
                } else if addr_mode {
                    Some(addr.ok_or_else(|| {
                        format!("op {i}: an allocation without addr in a trace with addr")
                    })?)
                } else {
                    model.allocate(i, *bytes, &owner, *memory, pool.as_ref())?
                };
                buffers.push(Buffer {
                    memory: *memory,
                    size: Some(*bytes),
                    addr: placed,
                    max_end: 0,
                    max_offset: 0,
                });
                let b = buffers.len() - 1;
                names.insert(buffer.clone(), Name::Live(b));
                model.recorded.remove(buffer);
                alloc_of.insert(i, b);
                first_alloc.entry(buffer.clone()).or_insert(i as u64);
                if let Some(a) = placed {
                    model.owners.insert(a, (*memory, owner));
                }
            }
            Op::Free { buffer, stream } => match names.get(buffer).copied() {
                Some(Name::Live(b)) => {
                    names.insert(buffer.clone(), Name::Freed);
                    let hold = model.recorded.remove(buffer);
                    if !addr_mode {
                        if let Some(a) = buffers[b].addr {
                            model.free(i, a, buffers[b].memory, stream.as_ref(), hold)?;
                        }
                    }
                }
                _ => {
                    invalid_free.insert(i);
                }
            },
            Op::RecordStream { buffer, .. } if !names.contains_key(buffer) => {
                // A never-seen name becomes external (no effect).
                buffers.push(Buffer {
                    memory: MemoryKind::Device,
                    size: None,
                    addr: None,
                    max_end: 0,
                    max_offset: 0,
                });
                let b = buffers.len() - 1;
                names.insert(buffer.clone(), Name::External(b));
                externals.push((buffer.clone(), b));
            }
            _ => {}
        }
        resolved.push(here);
    }

    // External buffers: large enough for every region, above all device memory.
    let mut top = BASES[0];
    for b in &buffers {
        if let (Some(a), Some(n)) = (b.addr, b.size) {
            if b.memory == MemoryKind::Device {
                top = top.max(a.saturating_add(n));
            }
        }
    }
    for &(_, b) in &externals {
        let buf = &mut buffers[b];
        let size = buf.max_end.max(buf.max_offset.saturating_add(4)).max(4);
        buf.size = Some(size);
        buf.addr = Some(top);
        top = top
            .checked_add(size)
            .ok_or("the external buffers do not fit in the address space")?;
    }

    // Boundaries of every buffer and region, per memory kind.
    let mut cuts: [BTreeSet<u64>; 3] = Default::default();
    let kind = |m: MemoryKind| m.index();
    for b in &buffers {
        if let (Some(a), Some(n)) = (b.addr, b.size) {
            if n > 0 {
                cuts[kind(b.memory)].insert(a);
                cuts[kind(b.memory)].insert(a + n);
            }
        }
    }
    for (op, res) in trace.iter().zip(&resolved) {
        for (r, b) in regions(&op.op).into_iter().zip(res) {
            let Some(b) = b else { continue };
            let buf = &buffers[*b];
            let (Some(a), Some(n)) = (buf.addr, buf.size) else {
                continue;
            };
            let (lo, hi) = span(r, n);
            cuts[kind(buf.memory)].insert(a + lo);
            cuts[kind(buf.memory)].insert(a + hi);
        }
    }
    let cuts: [Vec<u64>; 3] = cuts.map(|c| c.into_iter().collect());
    let word = |m: MemoryKind, x: u64| -> u64 {
        let c = &cuts[kind(m)];
        c.binary_search(&x).unwrap_or_else(|k| k) as u64
    };
    let place = |b: &Buffer| -> (u64, u64) {
        match (b.addr, b.size) {
            (Some(a), Some(n)) if n > 0 => {
                let w = word(b.memory, a);
                (
                    BASES[kind(b.memory)] + 4 * w,
                    4 * (word(b.memory, a + n) - w),
                )
            }
            _ => (0, 0),
        }
    };
    let extent = [0, 1, 2].map(|k| 4 * (cuts[k].len().saturating_sub(1)) as u64);

    // The names of external buffers here.
    let mut renamed: HashMap<Id, (Id, u64)> = HashMap::new();
    let mut taken: HashSet<Id> = names.keys().cloned().collect();
    let mut ext_name: HashMap<usize, Id> = HashMap::new();
    for (name, b) in &externals {
        let new = match first_alloc.get(name) {
            Some(&until) => {
                let mut n = Id::from(format!("{name}@external").as_str());
                while taken.contains(&n) {
                    n = Id::from(format!("{n}@external").as_str());
                }
                taken.insert(n.clone());
                renamed.insert(name.clone(), (n.clone(), until));
                n
            }
            None => name.clone(),
        };
        ext_name.insert(*b, new);
    }
    let mut neutral = Id::from("streamsan-neutral");
    while events.contains(&neutral) {
        neutral = Id::from(format!("{neutral}-").as_str());
    }

    let mut program: Vec<TraceOp> = Vec::with_capacity(trace.len() + externals.len());
    for (_, b) in &externals {
        let (addr, bytes) = place(&buffers[*b]);
        program.push(TraceOp::from(Op::Alloc {
            buffer: ext_name[b].clone(),
            bytes,
            stream: Some(Id::from(DEFAULT_STREAM)),
            memory: MemoryKind::Device,
            addr: Some(addr),
            pool: None,
        }));
    }
    let shift = program.len() as u64;
    let rewrite = |r: &Region, b: &Option<usize>| -> Option<Region> {
        let b = (*b)?;
        let buf = &buffers[b];
        let buffer = ext_name
            .get(&b)
            .cloned()
            .unwrap_or_else(|| r.buffer.clone());
        let (Some(a), Some(n)) = (buf.addr, buf.size) else {
            return Some(Region {
                buffer,
                offset: 0,
                bytes: Some(0),
            });
        };
        let (lo, hi) = span(r, n);
        let start = word(buf.memory, a);
        let (wlo, whi) = (word(buf.memory, a + lo), word(buf.memory, a + hi));
        Some(Region {
            buffer,
            offset: 4 * (wlo - start),
            bytes: Some(4 * (whi - wlo)),
        })
    };
    let no_op = || Op::StreamQuery {
        stream: Id::from(DEFAULT_STREAM),
        complete: false,
    };
    for (i, (op, res)) in trace.iter().zip(&resolved).enumerate() {
        let new = match &op.op {
            Op::Alloc {
                buffer,
                stream,
                memory,
                pool,
                ..
            } => {
                let b = alloc_of[&i];
                let (addr, bytes) = place(&buffers[b]);
                Op::Alloc {
                    buffer: buffer.clone(),
                    bytes,
                    stream: stream.clone(),
                    memory: *memory,
                    addr: (bytes > 0).then_some(addr),
                    pool: pool.clone(),
                }
            }
            Op::Free { stream, .. } if invalid_free.contains(&i) => match stream {
                // A stream-ordered free is an op on its stream even when it frees nothing.
                Some(s) => Op::EventRecord {
                    event: neutral.clone(),
                    stream: s.clone(),
                },
                None => no_op(),
            },
            Op::Launch { stream, name, .. } => {
                let mut out: Vec<Option<Region>> = regions(&op.op)
                    .into_iter()
                    .zip(res)
                    .map(|(r, b)| rewrite(r, b))
                    .collect();
                let Op::Launch { writes, .. } = &op.op else {
                    unreachable!()
                };
                let reads = out.split_off(writes.len());
                Op::Launch {
                    stream: stream.clone(),
                    name: name.clone(),
                    reads: reads.into_iter().flatten().collect(),
                    writes: out.into_iter().flatten().collect(),
                }
            }
            Op::Copy { stream, src, dst } => {
                match (rewrite(src, &res[0]), rewrite(dst, &res[1])) {
                    // Compression can give the two sides different lengths; the executors copy
                    // word for word, so such a copy runs as a kernel that reads one and writes
                    // the other (the same accesses).
                    (Some(src), Some(dst)) if src.bytes == dst.bytes => Op::Copy {
                        stream: stream.clone(),
                        src,
                        dst,
                    },
                    (src, dst) => Op::Launch {
                        stream: stream.clone(),
                        name: Some("copy".into()),
                        reads: src.into_iter().collect(),
                        writes: dst.into_iter().collect(),
                    },
                }
            }
            Op::Memset { stream, dst } => match rewrite(dst, &res[0]) {
                Some(dst) => Op::Memset {
                    stream: stream.clone(),
                    dst,
                },
                None => Op::Launch {
                    stream: stream.clone(),
                    name: Some("memset".into()),
                    reads: vec![],
                    writes: vec![],
                },
            },
            Op::HostRead { buffer } => match rewrite(buffer, &res[0]) {
                Some(buffer) => Op::HostRead { buffer },
                None => no_op(),
            },
            Op::HostWrite { buffer } => match rewrite(buffer, &res[0]) {
                Some(buffer) => Op::HostWrite { buffer },
                None => no_op(),
            },
            Op::RecordStream { buffer, stream } => Op::RecordStream {
                buffer: match renamed.get(buffer) {
                    Some((new, until)) if (i as u64) < *until => new.clone(),
                    _ => buffer.clone(),
                },
                stream: stream.clone(),
            },
            other => other.clone(),
        };
        program.push(TraceOp {
            op: new,
            site: op.site.clone(),
        });
    }
    Ok(Runnable {
        program,
        shift,
        renamed,
        extent,
    })
}

/// The bytes `[lo, hi)` of a buffer of `size` bytes that region `r` names.
fn span(r: &Region, size: u64) -> (u64, u64) {
    let lo = r.offset.min(size);
    let hi = match r.bytes {
        Some(n) => r.offset.saturating_add(n).min(size),
        None => size,
    };
    (lo, hi.max(lo))
}

/// The allocator model, as the checker runs it, for traces without `addr`.
struct Model {
    device: DeviceCachingAllocator<ModelMemory>,
    pinned: HostCachingAllocator<ModelMemory>,
    managed: HostCachingAllocator<ModelMemory>,
    keys: HashMap<Id, StreamKey>,
    /// Live blocks: start → (memory kind, owning stream).
    owners: HashMap<u64, (MemoryKind, Id)>,
    /// Captures underway and graph pools: allocations on a capturing stream come from the
    /// capture's pool, as in the checker's model.
    graphs: crate::exec::graphs::Graphs,
    events: HashMap<Id, u32>,
    /// Live pool blocks: start → pool.
    pooled: HashMap<u64, crate::alloc::PoolIndex>,
    /// Live buffers named by `record_stream`.
    recorded: HashSet<Id>,
}

impl Model {
    fn new() -> Self {
        Model {
            device: DeviceCachingAllocator::new(ModelMemory::of(MemoryKind::Device)),
            pinned: HostCachingAllocator::new(ModelMemory::of(MemoryKind::Pinned)),
            managed: HostCachingAllocator::new(ModelMemory::of(MemoryKind::Managed)),
            keys: HashMap::new(),
            owners: HashMap::new(),
            graphs: Default::default(),
            events: HashMap::new(),
            pooled: HashMap::new(),
            recorded: HashSet::new(),
        }
    }

    fn event(&mut self, event: &Id) -> u32 {
        let n = self.events.len() as u32;
        *self.events.entry(event.clone()).or_insert(n)
    }

    /// Follows the captures: which streams capture, into which graph (for the pools).
    fn graph_op(&mut self, i: usize, op: &Op) {
        match op {
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => {
                let s = self.key(stream);
                let _ = self.graphs.begin(graph, s, pool.as_ref());
            }
            Op::GraphEnd { graph } => {
                let _ = self.graphs.end(graph);
            }
            Op::EventRecord { event, stream } if self.graphs.any_capturing() => {
                let (s, e) = (self.key(stream), self.event(event));
                self.graphs.record(i, e, s);
            }
            Op::EventWait { stream, event } if self.graphs.any_capturing() => {
                let (s, e) = (self.key(stream), self.event(event));
                self.graphs.wait(i, s, e);
            }
            Op::RecordStream { buffer, .. } => {
                self.recorded.insert(buffer.clone());
            }
            _ => {}
        }
    }

    fn key(&mut self, stream: &Id) -> StreamKey {
        let n = self.keys.len() as StreamKey;
        *self.keys.entry(stream.clone()).or_insert(n)
    }

    fn allocate(
        &mut self,
        i: usize,
        bytes: u64,
        owner: &Id,
        memory: MemoryKind,
        pool: Option<&Id>,
    ) -> Result<Option<u64>, String> {
        let key = self.key(owner);
        let pool = match memory {
            MemoryKind::Device => self
                .graphs
                .alloc_pool(key, pool)
                .map_err(|e| format!("op {i}: {e}"))?,
            _ => None,
        };
        if let Some(p) = pool {
            let block = self
                .graphs
                .pools
                .allocate(p, bytes, key, self.device.memory_mut())
                .map_err(|e| {
                    format!("op {i}: the allocator model cannot serve {bytes} bytes: {e}")
                })?;
            if let Some(b) = &block {
                self.pooled.insert(b.addr, p);
            }
            return Ok(block.map(|b| b.addr));
        }
        let block = match memory {
            MemoryKind::Device => self.device.allocate(bytes, key),
            MemoryKind::Pinned => self.pinned.allocate(bytes),
            MemoryKind::Managed => self.managed.allocate(bytes),
        }
        .map_err(|e| format!("op {i}: the allocator model cannot serve {bytes} bytes: {e}"))?;
        Ok(block.map(|b| b.addr))
    }

    fn free(
        &mut self,
        i: usize,
        addr: u64,
        memory: MemoryKind,
        stream: Option<&Id>,
        hold: bool,
    ) -> Result<(), String> {
        let owner = self.owners.remove(&addr).map(|(_, s)| s);
        if let Some(p) = self.pooled.remove(&addr) {
            // A stream-ordered free gives the block to its stream, as the checker's model does.
            let to = stream.cloned().or(owner);
            let key = self.key(&to.unwrap_or_else(|| Id::from(DEFAULT_STREAM)));
            return self
                .graphs
                .pools
                .free(p, addr, key, hold)
                .map_err(|e| format!("op {i}: {e}"));
        }
        let to = stream
            .cloned()
            .or(owner)
            .unwrap_or_else(|| Id::from(DEFAULT_STREAM));
        let key = self.key(&to);
        match memory {
            MemoryKind::Device => self.device.free(addr, key),
            MemoryKind::Pinned => self.pinned.free(addr),
            MemoryKind::Managed => self.managed.free(addr),
        }
        .map_err(|e| format!("op {i}: {e}"))
    }
}
