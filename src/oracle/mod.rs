//! A brute-force reference for the hazards of a trace, written from the trace format alone.
//!
//! [`oracle_hazards`] builds the happens-before relation of a whole trace as an explicit graph
//! (one node per op, one edge per rule of the trace format's "Happens-before" section), takes its
//! transitive closure, records every access with the node that orders it, and then compares every
//! pair of accesses. It is quadratic and cubic where the checker is incremental: it exists so that
//! the two can be compared on random programs, and it is only meant for small traces (hundreds of
//! ops).
//!
//! What it shares with the checker: the allocator policies. Where an `alloc` without `addr` lands
//! comes from [`crate::alloc`] ([`DeviceCachingAllocator`], [`HostCachingAllocator`] over
//! [`ModelMemory`]), the same code the checker uses, so agreement between the two says nothing
//! about the allocator: a block handed out too early or too late would be wrong on both sides
//! alike. The allocator's independent check is `tests/alloc.rs`, which compares it with a naive
//! reference written from the trace format's "Allocator model" on random sequences.
//!
//! The model, rule by rule:
//!
//! - Nodes are op indices. An op on a stream (`launch`, `copy`, `memset`, `event_record`,
//!   `event_wait`, a stream-ordered `free`) has an edge from the previous op on its stream (rule 1),
//!   from the previous host op (rule 2) and, for the legacy default stream and the blocking streams
//!   of device 0, from the previous op of the other side (rule 5). Every other op is the host's and
//!   has an edge from the previous host op.
//! - `event_record` → `event_wait` / `event_sync` / successful `event_query` of its capture
//!   (rule 3, 4); previous op of the stream(s) → `stream_sync`, successful `stream_query`,
//!   `device_sync` (rule 4, 5); with `addr`, device memory reappearing on a stream other than the
//!   one that last freed it is a `device_sync` of that stream's device at the `alloc`.
//! - An access at node `a` happens before op `x` when `a == x` or a path leads from `a` to `x`.
//!   The allocation of device memory is an access by its owning stream placed at the latest
//!   `launch`, `copy` or `memset` of that stream (before everything when there is none); pinned and
//!   managed allocations are host accesses at the `alloc` itself.
//! - A free is checked against the set of nodes its clock joins: the owning stream's latest op and
//!   the free itself (caching free of device memory), the free itself (stream-ordered free, pinned
//!   or managed caching free), and the latest op of every stream named by `record_stream`.
//! - Reuse: an access of a freed buffer that has a path to the latest op, at the free, of a
//!   stream named by `record_stream` happens before every access to memory that reuses the
//!   buffer's bytes (the allocator waits for an event recorded there); no other access does.
//! - Conflicts: every pair of accesses is compared; a hazard then keeps, of each participant's
//!   conflicting accesses, only the latest op (the report's rule), with no notion of one access
//!   subsuming another.
//! - CUDA graphs (the `graphs` module): captured ops add no node of their own; each
//!   `graph_launch` is unrolled into explicit nodes (an entry, one node per captured op, an
//!   exit), with edges from the launch to the entry, from the previous launch's exit of the same
//!   graph to the entry, from the entry to every captured op, along each captured stream,
//!   from a captured record to its waits, and from every captured op to the exit, which the
//!   launch stream's next op follows. Nodes are ordered by creation, not by op index. An `alloc`
//!   that names a `pool` outside a capture takes its block from that pool and makes a pool buffer
//!   like a capture's, but its allocation is a use as for a plain buffer.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;

use crate::alloc::{
    AddressSpaceExhausted, DeviceCachingAllocator, HostCachingAllocator, Memory, ModelMemory,
    StreamKey,
};
use crate::report::HazardKind;
use crate::trace::{Id, MemoryKind, Op, Region, TraceOp, DEFAULT_STREAM, HOST};

/// One hazard as the oracle finds it: the parts of a [`Hazard`](crate::Hazard) that the
/// happens-before semantics decide.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OracleHazard {
    /// The op index where the hazard is reported.
    pub op: u64,
    /// What went wrong.
    pub kind: HazardKind,
    /// The buffer (`None` for warnings).
    pub buffer: Option<String>,
    /// The op indices of the earlier conflicting accesses — for each participant, only its
    /// latest conflicting op (trace format, "Report") — sorted and deduplicated (empty for
    /// `use-after-free`, `invalid-free` and warnings).
    pub conflicts: Vec<u64>,
    /// For a hazard of a graph replay (reported at the `graph_launch`): the captured op whose
    /// replay has it (the report's `access.captured`).
    pub captured: Option<u64>,
    /// The conflicts that are accesses of a replay, as (`graph_launch` op, captured op), sorted
    /// and deduplicated (the report's `conflicts[].captured`).
    pub replayed: Vec<(u64, u64)>,
}

/// The hazards of `ops`, sorted by op index, kind and buffer.
///
/// Errors: input that the trace format calls bad and that the oracle needs to reject to stay
/// meaningful (a region past the end of its buffer, a host access to device memory, allocating a
/// live name, `"host"` as a stream, a `copy` whose source and destination overlap, an `addr` that
/// overlaps a live allocation, mixing allocations with and without `addr`, conflicting stream
/// attributes). Other bad input may go unnoticed.
pub fn oracle_hazards(ops: &[TraceOp]) -> Result<Vec<OracleHazard>, String> {
    let mut b = Builder::new(ops.len());
    for (i, op) in ops.iter().enumerate() {
        b.op(i, &op.op)
            .map_err(|e| format!("op {i} ({}): {e}", op.op.name()))?;
    }
    Ok(b.hazards())
}

/// The oracle's happens-before between ops: `paths[x]` is the bit set (bit `a % 64` of word
/// `a / 64`) of the ops from which a path of the happens-before graph leads to op `x`.
/// `record_stream` adds no edge here (it orders the allocator's reuse only). A path may run
/// through the nodes of a graph's replay; only ops are listed. Errors as [`oracle_hazards`].
pub fn oracle_paths(ops: &[TraceOp]) -> Result<Vec<Vec<u64>>, String> {
    let n = ops.len();
    let mut b = Builder::new(n);
    for (i, op) in ops.iter().enumerate() {
        b.op(i, &op.op)
            .map_err(|e| format!("op {i} ({}): {e}", op.op.name()))?;
    }
    let words = n.div_ceil(64);
    Ok(b
        .ancestors()
        .into_iter()
        .take(n)
        .map(|mut bits| {
            bits.truncate(words);
            if n % 64 != 0 {
                if let Some(last) = bits.last_mut() {
                    *last &= (1u64 << (n % 64)) - 1;
                }
            }
            bits
        })
        .collect())
}

/// One device address space shared by several allocators: the plain device allocator and every
/// graph pool map their segments from it, each new one above every earlier one.
#[derive(Clone, Debug)]
struct SharedSpace(std::rc::Rc<std::cell::Cell<u64>>);

impl Memory for SharedSpace {
    type Error = AddressSpaceExhausted;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
        let base = self.0.get();
        let next = base
            .checked_add(bytes)
            .ok_or(AddressSpaceExhausted { base, bytes })?;
        self.0.set(next);
        Ok(base)
    }
}

/// What a participant's state is during the single pass.
#[derive(Debug)]
struct Stream {
    device: u64,
    blocking: bool,
    key: StreamKey,
    /// The latest op on the stream.
    last_op: Option<usize>,
    /// The latest `launch`, `copy` or `memset` on the stream.
    last_work: Option<usize>,
}

/// One buffer: one allocation of a name, or the external buffer of a name.
#[derive(Debug)]
struct Buffer {
    name: String,
    memory: MemoryKind,
    /// `None` for an external buffer (unknown size).
    size: Option<u64>,
    /// Absolute start; `None` for external buffers and empty allocations.
    addr: Option<u64>,
    /// The owning stream of allocated device memory.
    owner: Option<String>,
    /// The op index of the `alloc` (0 for external buffers, which exist from the start).
    alloc_op: usize,
    /// The op index of the free, once freed.
    free_op: Option<usize>,
    /// The stream whose pool the memory went back to (device memory).
    freed_to: Option<String>,
    /// Streams named by `record_stream` with an effect (not the owner of device memory).
    recorded: BTreeSet<String>,
    /// At the free: the latest op of each stream in `recorded`. The allocator reuses the memory
    /// only after an event recorded there completes, so every access with a path to one of
    /// these ops happens before every access to memory that reuses the buffer's bytes.
    recorded_at_free: Vec<usize>,
    /// The graph pool of a pool buffer: allocated on a capturing stream, or into a named pool.
    pool: Option<String>,
    /// A pool buffer's bytes that went back to the driver since (another pool or a plain
    /// allocation took them): the pool holds them no more.
    released: Vec<(u64, u64)>,
}

/// What a name denotes now.
#[derive(Clone, Copy, Debug)]
enum Name {
    Live(usize),
    Freed(usize),
    External(usize),
}

/// One access of a buffer.
#[derive(Clone, Debug)]
struct Access {
    /// The op index (a replay's accesses: the `graph_launch`).
    op: usize,
    /// For a replay's access: the captured op it replays.
    captured: Option<u64>,
    buffer: usize,
    participant: String,
    writes: bool,
    /// An allocation's use (never checked as the later access).
    alloc: bool,
    /// First byte, relative to the buffer.
    start: u64,
    /// One past the last byte, relative to the buffer; `None`: unbounded (external buffers).
    end: Option<u64>,
    /// The node whose reachability decides happens-before; `None`: before everything.
    at: Option<usize>,
}

/// A free, to be checked once the graph is complete.
#[derive(Debug)]
struct FreeCheck {
    op: usize,
    buffer: usize,
    freer: String,
    points: Vec<usize>,
}

type HazardKey = (u64, HazardKind, Option<String>);

/// A conflicting access as a hazard lists it: participant, op, captured op.
type ConflictKey = (String, u64, Option<u64>);

struct Builder {
    graph: DiGraph<usize, ()>,
    /// Nodes by id: ids `0..n` are the ops, later ids the nodes of replays.
    nodes: Vec<NodeIndex>,
    /// The creation order of each node (ops are created when the pass reaches them): edges go
    /// from earlier nodes to later ones.
    rank: Vec<usize>,
    next_rank: usize,
    streams: BTreeMap<String, Stream>,
    host_last: Option<usize>,
    events: HashMap<String, Option<usize>>,
    buffers: Vec<Buffer>,
    names: HashMap<String, Name>,
    accesses: Vec<Access>,
    frees: Vec<FreeCheck>,
    /// Every hazard, with its conflicting accesses, by the captured op whose replay found it
    /// (`None` outside replays): a launch reports the first captured op's.
    found: BTreeMap<HazardKey, BTreeMap<Option<u64>, BTreeSet<ConflictKey>>>,
    device: DeviceCachingAllocator<SharedSpace>,
    /// The device address space, shared with the graph pools.
    space: SharedSpace,
    /// CUDA graphs.
    g: graphs::State,
    pinned: HostCachingAllocator<ModelMemory>,
    managed: HostCachingAllocator<ModelMemory>,
    /// Whether allocations carry `addr` (decided by the first non-empty allocation).
    addr_mode: Option<bool>,
}

impl Builder {
    fn new(n: usize) -> Self {
        let mut graph = DiGraph::with_capacity(n, 4 * n);
        let nodes = (0..n).map(|i| graph.add_node(i)).collect();
        let space = SharedSpace(std::rc::Rc::new(std::cell::Cell::new(
            crate::alloc::space::DEVICE_BASE,
        )));
        let mut streams = BTreeMap::new();
        streams.insert(
            DEFAULT_STREAM.to_owned(),
            Stream {
                device: 0,
                blocking: false,
                key: 0,
                last_op: None,
                last_work: None,
            },
        );
        Builder {
            graph,
            nodes,
            rank: vec![usize::MAX; n],
            next_rank: 0,
            streams,
            host_last: None,
            events: HashMap::new(),
            buffers: Vec::new(),
            names: HashMap::new(),
            accesses: Vec::new(),
            frees: Vec::new(),
            found: BTreeMap::new(),
            device: DeviceCachingAllocator::new(space.clone()),
            space,
            g: graphs::State::default(),
            pinned: HostCachingAllocator::new(ModelMemory::of(MemoryKind::Pinned)),
            managed: HostCachingAllocator::new(ModelMemory::of(MemoryKind::Managed)),
            addr_mode: None,
        }
    }

    fn edge(&mut self, from: usize, to: usize) {
        debug_assert!(
            self.rank[from] < self.rank[to],
            "edges go forward in creation order"
        );
        self.graph.update_edge(self.nodes[from], self.nodes[to], ());
    }

    /// A new node of a replay, created now.
    fn new_node(&mut self) -> usize {
        let id = self.nodes.len();
        self.nodes.push(self.graph.add_node(id));
        self.rank.push(self.next_rank);
        self.next_rank += 1;
        id
    }

    fn edge_from(&mut self, from: Option<usize>, to: usize) {
        if let Some(f) = from {
            self.edge(f, to);
        }
    }

    fn report(&mut self, op: usize, kind: HazardKind, buffer: Option<&str>) {
        self.report_at(op, kind, buffer, None);
    }

    /// A hazard without conflicts at op `op`, found by captured op `captured` of a replay.
    fn report_at(
        &mut self,
        op: usize,
        kind: HazardKind,
        buffer: Option<&str>,
        captured: Option<u64>,
    ) {
        self.found
            .entry((op as u64, kind, buffer.map(str::to_owned)))
            .or_default()
            .entry(captured)
            .or_default();
    }

    /// The stream named `id`, created (non-blocking, device 0) on first use.
    fn stream(&mut self, id: &Id) -> Result<&mut Stream, String> {
        let name = id.as_str();
        if name == HOST {
            return Err("\"host\" is not a stream".into());
        }
        let key = self.streams.len() as StreamKey;
        Ok(self.streams.entry(name.to_owned()).or_insert(Stream {
            device: 0,
            blocking: false,
            key,
            last_op: None,
            last_work: None,
        }))
    }

    /// The blocking streams of device 0 (never the legacy default stream).
    fn blocking_streams(&self) -> Vec<String> {
        self.streams
            .iter()
            .filter(|(n, s)| n.as_str() != DEFAULT_STREAM && s.device == 0 && s.blocking)
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn last_op(&self, stream: &str) -> Option<usize> {
        self.streams.get(stream).and_then(|s| s.last_op)
    }

    /// A host op: ordered after the previous host op.
    fn host_op(&mut self, i: usize) {
        self.edge_from(self.host_last, i);
        self.host_last = Some(i);
    }

    /// An op on stream `id`: rules 1, 2 and 5.
    fn stream_op(&mut self, i: usize, id: &Id) -> Result<(), String> {
        let s = self.stream(id)?;
        let prev = s.last_op;
        let (device, blocking) = (s.device, s.blocking);
        self.edge_from(prev, i);
        self.edge_from(self.host_last, i);
        let name = id.as_str();
        if name == DEFAULT_STREAM {
            for b in self.blocking_streams() {
                self.edge_from(self.last_op(&b), i);
            }
        } else if device == 0 && blocking {
            self.edge_from(self.last_op(DEFAULT_STREAM), i);
        }
        if let Some(s) = self.streams.get_mut(name) {
            s.last_op = Some(i);
        }
        Ok(())
    }

    /// The host waits for everything issued so far on `stream` (and, for the legacy default
    /// stream, on the blocking streams of device 0).
    fn sync_stream(&mut self, i: usize, id: &Id) -> Result<(), String> {
        self.stream(id)?;
        self.edge_from(self.last_op(id.as_str()), i);
        if id.as_str() == DEFAULT_STREAM {
            for b in self.blocking_streams() {
                self.edge_from(self.last_op(&b), i);
            }
        }
        Ok(())
    }

    /// The host waits for everything issued so far on every stream of `device`.
    fn sync_device(&mut self, i: usize, device: u64) {
        let lasts: Vec<usize> = self
            .streams
            .values()
            .filter(|s| s.device == device)
            .filter_map(|s| s.last_op)
            .collect();
        for l in lasts {
            self.edge(l, i);
        }
    }

    /// The capture of `event`, if it holds one.
    fn capture(&self, event: &Id) -> Option<usize> {
        self.events.get(event.as_str()).copied().flatten()
    }

    /// Resolves a region at op `i`: the buffer and relative byte range, or `None` after reporting
    /// a use after free. A region is checked against the size of the buffer its name denotes,
    /// freed or not.
    fn resolve(
        &mut self,
        i: usize,
        r: &Region,
    ) -> Result<Option<(usize, u64, Option<u64>)>, String> {
        let name = r.buffer.as_str();
        let buffer = match self.names.get(name).copied() {
            Some(Name::Live(b)) | Some(Name::External(b)) | Some(Name::Freed(b)) => b,
            None => self.external(name),
        };
        let start = r.offset;
        let end = match (self.buffers[buffer].size, r.bytes) {
            (_, Some(n)) => Some(
                start
                    .checked_add(n)
                    .ok_or_else(|| format!("region of {name} overflows"))?,
            ),
            (Some(size), None) => Some(size),
            (None, None) => None,
        };
        if let Some(size) = self.buffers[buffer].size {
            if start > size || end.is_some_and(|e| e > size) {
                return Err(format!("region of {name} reaches past its end"));
            }
        }
        if let Some(Name::Freed(_)) = self.names.get(name) {
            // A use after free: reported, not recorded.
            self.report(i, HazardKind::UseAfterFree, Some(name));
            return Ok(None);
        }
        Ok(Some((buffer, start, end)))
    }

    /// Starts the external buffer of `name`.
    fn external(&mut self, name: &str) -> usize {
        let b = self.buffers.len();
        self.buffers.push(Buffer {
            name: name.to_owned(),
            memory: MemoryKind::Device,
            size: None,
            addr: None,
            owner: None,
            alloc_op: 0,
            free_op: None,
            freed_to: None,
            recorded: BTreeSet::new(),
            recorded_at_free: Vec::new(),
            released: Vec::new(),
            pool: None,
        });
        self.names.insert(name.to_owned(), Name::External(b));
        b
    }

    /// Records an access of region `r` at op `i` by `participant` (ordered at node `i`).
    fn access(
        &mut self,
        i: usize,
        r: &Region,
        participant: &str,
        writes: bool,
    ) -> Result<(), String> {
        let Some((buffer, start, end)) = self.resolve(i, r)? else {
            return Ok(());
        };
        if participant == HOST && !self.buffers[buffer].memory.host_accessible() {
            return Err(format!("host access to device memory {}", r.buffer));
        }
        if end == Some(start) {
            // An empty region touches no byte.
            return Ok(());
        }
        self.accesses.push(Access {
            op: i,
            captured: None,
            buffer,
            participant: participant.to_owned(),
            writes,
            alloc: false,
            start,
            end,
            at: Some(i),
        });
        Ok(())
    }

    fn op(&mut self, i: usize, op: &Op) -> Result<(), String> {
        self.rank[i] = self.next_rank;
        self.next_rank += 1;
        if self.capture_op(i, op)? {
            return Ok(());
        }
        match op {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                self.host_op(i);
                if stream.as_str() == DEFAULT_STREAM {
                    return if *device == 0 {
                        Ok(())
                    } else {
                        Err("the legacy default stream is on device 0".into())
                    };
                }
                let fresh = !self.streams.contains_key(stream.as_str());
                let s = self.stream(stream)?;
                if fresh {
                    s.device = *device;
                    s.blocking = *blocking;
                } else if s.device != *device || s.blocking != *blocking {
                    return Err(format!("stream {stream} exists with other attributes"));
                }
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
                pool,
            } => self.alloc(i, buffer, *bytes, stream.as_ref(), *memory, *addr, pool.as_ref())?,
            Op::Free { buffer, stream } => self.free(i, buffer, stream.as_ref())?,
            Op::RecordStream { buffer, stream } => {
                self.host_op(i);
                self.stream(stream)?;
                match self.names.get(buffer.as_str()).copied() {
                    Some(Name::Live(b)) => {
                        let buf = &mut self.buffers[b];
                        let owner_ignores = buf.memory == MemoryKind::Device
                            && buf.owner.as_deref() == Some(stream.as_str());
                        if !owner_ignores {
                            buf.recorded.insert(stream.as_str().to_owned());
                        }
                    }
                    Some(Name::Freed(_)) => {
                        self.report(i, HazardKind::UseAfterFree, Some(buffer.as_str()))
                    }
                    Some(Name::External(_)) => {}
                    None => {
                        self.external(buffer.as_str());
                    }
                }
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                self.work(i, stream)?;
                for r in reads {
                    self.access(i, r, stream.as_str(), false)?;
                }
                for r in writes {
                    self.access(i, r, stream.as_str(), true)?;
                }
            }
            Op::Copy { stream, src, dst } => {
                self.work(i, stream)?;
                if src.buffer == dst.buffer {
                    let s = self.resolve(i, src)?;
                    let d = self.resolve(i, dst)?;
                    if let (Some((_, s0, s1)), Some((_, d0, d1))) = (s, d) {
                        if overlaps(s0, s1, d0, d1) {
                            return Err("copy source and destination overlap".into());
                        }
                    }
                }
                self.access(i, src, stream.as_str(), false)?;
                self.access(i, dst, stream.as_str(), true)?;
            }
            Op::Memset { stream, dst } => {
                self.work(i, stream)?;
                self.access(i, dst, stream.as_str(), true)?;
            }
            Op::HostRead { buffer } => {
                self.host_op(i);
                self.access(i, buffer, HOST, false)?;
            }
            Op::HostWrite { buffer } => {
                self.host_op(i);
                self.access(i, buffer, HOST, true)?;
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.host_op(i);
                self.events.insert(event.as_str().to_owned(), None);
            }
            Op::EventRecord { event, stream } => {
                self.stream_op(i, stream)?;
                self.events.insert(event.as_str().to_owned(), Some(i));
            }
            Op::EventWait { stream, event } => {
                self.stream_op(i, stream)?;
                match self.capture(event) {
                    Some(r) => self.edge(r, i),
                    None => self.report(i, HazardKind::WaitOnUnrecordedEvent, None),
                }
            }
            Op::EventSync { event } => {
                self.host_op(i);
                self.edge_from(self.capture(event), i);
            }
            Op::EventQuery { event, complete } => {
                self.host_op(i);
                if *complete {
                    self.edge_from(self.capture(event), i);
                }
            }
            Op::StreamSync { stream } => {
                self.host_op(i);
                self.sync_stream(i, stream)?;
            }
            Op::StreamQuery { stream, complete } => {
                self.host_op(i);
                if *complete {
                    self.sync_stream(i, stream)?;
                } else {
                    self.stream(stream)?;
                }
            }
            Op::DeviceSync { device } => {
                self.host_op(i);
                self.sync_device(i, *device);
            }
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => self.graph_begin(i, graph, stream, pool.as_ref())?,
            Op::GraphEnd { graph } => self.graph_end(i, graph)?,
            Op::GraphLaunch { graph, stream } => self.graph_launch(i, graph, stream)?,
        }
        Ok(())
    }

    /// A `launch`, `copy` or `memset` on `stream`: an op on the stream that creates an epoch.
    fn work(&mut self, i: usize, stream: &Id) -> Result<(), String> {
        self.stream_op(i, stream)?;
        if let Some(s) = self.streams.get_mut(stream.as_str()) {
            s.last_work = Some(i);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &mut self,
        i: usize,
        buffer: &Id,
        bytes: u64,
        stream: Option<&Id>,
        memory: MemoryKind,
        addr: Option<u64>,
        named_pool: Option<&Id>,
    ) -> Result<(), String> {
        self.host_op(i);
        let name = buffer.as_str();
        if let Some(Name::Live(_)) = self.names.get(name) {
            return Err(format!("{name} is live"));
        }
        let owner_id = stream.cloned().unwrap_or_else(|| Id::from(DEFAULT_STREAM));
        let key = self.stream(&owner_id)?.key;
        let owner = owner_id.as_str().to_owned();
        // Device memory allocated on a capturing stream comes from the capture's pool; outside
        // a capture, from the pool the alloc names (device memory only).
        let capture = match memory {
            MemoryKind::Device => self.capture_pool(&owner),
            _ => None,
        };
        let pool = match (capture.clone(), named_pool) {
            (_, Some(_)) if memory != MemoryKind::Device => {
                return Err("a pool for memory other than device memory".into())
            }
            (Some(c), Some(p)) if c != p.as_str() => {
                return Err("a pool other than the capture's on a capturing stream".into())
            }
            (Some(c), _) => Some(c),
            (None, Some(p)) => {
                self.named_pool(p.as_str());
                Some(p.as_str().to_owned())
            }
            (None, None) => None,
        };
        let base = if bytes == 0 {
            None
        } else {
            match self.addr_mode {
                None => self.addr_mode = Some(addr.is_some()),
                Some(mode) if mode != addr.is_some() => {
                    return Err("addr given on some allocations only".into())
                }
                Some(_) => {}
            }
            match addr {
                Some(a) => {
                    let end = a
                        .checked_add(bytes)
                        .ok_or_else(|| "addr + bytes overflows".to_owned())?;
                    let live_overlap = self.names.values().any(|n| match *n {
                        Name::Live(b) => {
                            let buf = &self.buffers[b];
                            buf.memory == memory
                                && buf.addr.is_some_and(|s| {
                                    overlaps(s, Some(s + buf.size.unwrap_or(0)), a, Some(end))
                                })
                        }
                        _ => false,
                    });
                    if live_overlap {
                        return Err("addr overlaps a live allocation".into());
                    }
                    // Bytes another graph pool held went back to the driver, which synchronized
                    // the device.
                    let released = memory == MemoryKind::Device
                        && self.release_pool_bytes(a, end, pool.as_deref());
                    if memory == MemoryKind::Device
                        && (released || self.reappears_elsewhere(a, end, &owner))
                    {
                        let device = self.streams[&owner].device;
                        self.sync_device(i, device);
                    }
                    Some(a)
                }
                None => {
                    let block = match (memory, &pool) {
                        (MemoryKind::Device, Some(p)) => self.pool_allocate(p, bytes, key)?,
                        (MemoryKind::Device, None) => {
                            self.device.allocate(bytes, key).map_err(|e| e.to_string())?
                        }
                        (MemoryKind::Pinned, _) => {
                            self.pinned.allocate(bytes).map_err(|e| e.to_string())?
                        }
                        (MemoryKind::Managed, _) => {
                            self.managed.allocate(bytes).map_err(|e| e.to_string())?
                        }
                    };
                    block.map(|b| b.addr)
                }
            }
        };
        let b = self.buffers.len();
        let device = memory == MemoryKind::Device;
        self.buffers.push(Buffer {
            name: name.to_owned(),
            memory,
            size: Some(bytes),
            addr: base,
            owner: device.then(|| owner.clone()),
            alloc_op: i,
            free_op: None,
            freed_to: None,
            recorded: BTreeSet::new(),
            recorded_at_free: Vec::new(),
            released: Vec::new(),
            pool: pool.clone(),
        });
        self.names.insert(name.to_owned(), Name::Live(b));
        // A capture's allocation is not a use: nothing runs at capture.
        if bytes > 0 && capture.is_none() {
            let (participant, at) = if device {
                (owner.clone(), self.streams[&owner].last_work)
            } else {
                (HOST.to_owned(), Some(i))
            };
            self.accesses.push(Access {
                op: i,
                captured: None,
                buffer: b,
                participant,
                writes: true,
                alloc: true,
                start: 0,
                end: Some(bytes),
                at,
            });
        }
        Ok(())
    }

    /// Whether some byte of device memory `[a, end)` was last freed to a stream other than
    /// `stream`.
    fn reappears_elsewhere(&self, a: u64, end: u64, stream: &str) -> bool {
        let mut freed: Vec<&Buffer> = self
            .buffers
            .iter()
            .filter(|b| b.memory == MemoryKind::Device && b.free_op.is_some())
            .filter(|b| {
                b.addr
                    .is_some_and(|s| overlaps(s, Some(s + b.size.unwrap_or(0)), a, Some(end)))
            })
            .collect();
        // Most recent free first: it decides the bytes it covers.
        freed.sort_by_key(|b| std::cmp::Reverse(b.free_op));
        let mut uncovered = vec![(a, end)];
        for b in freed {
            let (s, e) = (
                b.addr.unwrap_or(0),
                b.addr.unwrap_or(0) + b.size.unwrap_or(0),
            );
            let mut rest = Vec::new();
            for &(u0, u1) in &uncovered {
                let (c0, c1) = (u0.max(s), u1.min(e));
                if c0 < c1 {
                    // Memory a graph pool freed stays with the pool: it does not come back
                    // from the driver.
                    if b.pool.is_none() && b.freed_to.as_deref() != Some(stream) {
                        return true;
                    }
                    if u0 < c0 {
                        rest.push((u0, c0));
                    }
                    if c1 < u1 {
                        rest.push((c1, u1));
                    }
                } else {
                    rest.push((u0, u1));
                }
            }
            uncovered = rest;
        }
        false
    }

    fn free(&mut self, i: usize, buffer: &Id, stream: Option<&Id>) -> Result<(), String> {
        match stream {
            Some(s) => self.stream_op(i, s)?,
            None => self.host_op(i),
        }
        let name = buffer.as_str();
        let b = match self.names.get(name).copied() {
            Some(Name::Live(b)) => b,
            _ => {
                self.report(i, HazardKind::InvalidFree, Some(name));
                return Ok(());
            }
        };
        let memory = self.buffers[b].memory;
        let owner = self.buffers[b].owner.clone();
        let pool = self.buffers[b].pool.clone();
        let (freer, mut points) = match (stream, memory) {
            (Some(s), _) => (s.as_str().to_owned(), vec![i]),
            (None, MemoryKind::Device) => {
                let o = owner.clone().unwrap_or_else(|| DEFAULT_STREAM.to_owned());
                let mut p = vec![i];
                p.extend(self.last_op(&o));
                (o, p)
            }
            (None, _) => (HOST.to_owned(), vec![i]),
        };
        let recorded_at_free: Vec<usize> = self.buffers[b]
            .recorded
            .iter()
            .filter_map(|t| self.last_op(t))
            .collect();
        points.extend(&recorded_at_free);
        let held = !self.buffers[b].recorded.is_empty();
        self.buffers[b].recorded_at_free = recorded_at_free;
        // A pool buffer's free is not checked: its memory stays with the pool.
        if pool.is_none() {
            self.frees.push(FreeCheck {
                op: i,
                buffer: b,
                freer: freer.clone(),
                points,
            });
        }
        let buf = &mut self.buffers[b];
        buf.free_op = Some(i);
        if memory == MemoryKind::Device {
            buf.freed_to = Some(freer.clone());
        }
        self.names.insert(name.to_owned(), Name::Freed(b));
        if self.addr_mode != Some(true) {
            if let (Some(addr), Some(p)) = (self.buffers[b].addr, &pool) {
                let key = self.stream(&Id::from(freer.as_str()))?.key;
                return self.pool_free(p, addr, key, held);
            }
            if let Some(addr) = self.buffers[b].addr {
                match memory {
                    MemoryKind::Device => match stream {
                        Some(s) => {
                            let key = self.stream(s)?.key;
                            self.device.free(addr, key)
                        }
                        None => self.device.free_caching(addr),
                    },
                    MemoryKind::Pinned => self.pinned.free(addr),
                    MemoryKind::Managed => self.managed.free(addr),
                }
                .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// Whether `[a0, a1)` and `[b0, b1)` share a byte (`None`: unbounded).
fn overlaps(a0: u64, a1: Option<u64>, b0: u64, b1: Option<u64>) -> bool {
    a1.is_none_or(|a1| b0 < a1) && b1.is_none_or(|b1| a0 < b1) && a1 != Some(a0) && b1 != Some(b0)
}

mod graphs;
mod verdicts;
#[cfg(test)]
mod tests;
