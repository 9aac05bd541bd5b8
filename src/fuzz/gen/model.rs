//! The generator's model of a program: the participants and the names it writes, and the
//! trace format's happens-before rules and memory over them — written from the format, not
//! borrowed from the checker, so that the two check each other.

use crate::alloc::{DeviceCachingAllocator, GraphPools, HostCachingAllocator, ModelMemory};
use crate::trace::{Id, MemoryKind, Op, OpParticipant, DEFAULT_STREAM};

/// Participant indices of the model: the host, the legacy default stream, the blocking stream
/// `b`, then `s0`…`s3`, then the replay participants `g0/c`, `g1/c` of the graphs' lanes.
pub(super) const HOST_P: usize = 0;
pub(super) const DEFAULT_P: usize = 1;
pub(super) const BLOCKING_P: usize = 2;
pub(super) const FIRST_S: usize = 3;
pub(super) const MAX_STREAMS: u32 = 4;
/// The first replay participant: graph `g`'s lane `c` is `FIRST_G + LANES * g + c`.
pub(super) const FIRST_G: usize = FIRST_S + MAX_STREAMS as usize;
/// Graphs `g0`, `g1` a program captures at most.
pub(super) const GRAPHS: usize = 2;
/// Lanes of a capture at most: the origin and one stream that joins it.
pub(super) const LANES: usize = 2;
pub(super) const PARTICIPANTS: usize = FIRST_G + GRAPHS * LANES;
/// Number of event names `e0`…
pub(super) const EVENTS: usize = 6;

pub(super) type Clock = [u64; PARTICIPANTS];

pub(super) fn join(into: &mut Clock, other: &Clock) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = (*a).max(*b);
    }
}

pub(super) fn stream_name(p: usize) -> Id {
    match p {
        DEFAULT_P => Id::from(DEFAULT_STREAM),
        BLOCKING_P => Id::from("b"),
        _ => Id::from(format!("s{}", p - FIRST_S)),
    }
}

/// The participant of a stream name the generator wrote.
pub(super) fn stream_index(name: &Id) -> usize {
    match name.as_str() {
        DEFAULT_STREAM => DEFAULT_P,
        "b" => BLOCKING_P,
        s => FIRST_S + s[1..].parse::<usize>().unwrap_or(0),
    }
}

pub(super) fn buffer_name(slot: usize) -> Id {
    Id::from(format!("x{slot}"))
}

pub(super) fn event_name(e: usize) -> Id {
    Id::from(format!("e{e}"))
}

pub(super) fn graph_name(g: usize) -> Id {
    Id::from(format!("g{g}"))
}

/// The replay participant of lane `c` of graph `g`.
pub(super) fn lane_participant(g: usize, c: usize) -> usize {
    FIRST_G + LANES * g + c
}

/// The participant index of an op (rule 1 of the trace format).
pub(super) fn participant(op: &Op) -> usize {
    match op.participant() {
        OpParticipant::Host => HOST_P,
        OpParticipant::Stream(stream) => stream_index(stream),
    }
}

/// The number in a generated name such as `x3` or `e1`.
pub(super) fn name_number(name: &Id) -> usize {
    name.as_str()[1..].parse().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The model

/// One access: who, when (the participant's own component), and which bytes of its buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Access {
    pub(super) p: usize,
    pub(super) t: u64,
    pub(super) write: bool,
    pub(super) lo: u64,
    pub(super) hi: u64,
}

/// One allocation (a generation of a buffer name).
#[derive(Clone, Debug)]
pub(super) struct Buffer {
    pub(super) slot: usize,
    pub(super) memory: MemoryKind,
    /// The owning stream of device memory; the host for pinned memory.
    pub(super) owner: usize,
    pub(super) bytes: u64,
    pub(super) addr: u64,
    pub(super) live: bool,
    pub(super) accesses: Vec<Access>,
    /// Streams named by `record_stream` (not the owning stream of device memory).
    pub(super) record: Vec<usize>,
    /// Once freed: the join of the clocks of the `record` streams at the free. What it covers
    /// happens before every reuse of the buffer's bytes (the allocator waits for events
    /// recorded on those streams at the free).
    pub(super) excused: Clock,
    /// Whether a synchronization its free needed was left out: the bug then carries on into the
    /// reuse of its bytes instead of being repaired there.
    pub(super) sloppy: bool,
    /// The graph pool it came from (allocated on a capturing stream): a pool buffer.
    pub(super) pool: Option<u32>,
    /// Its allocation, in order of allocations (for the pools' `record_stream` rule).
    pub(super) born: usize,
    /// Allocations made before its free (its free's place in that order).
    pub(super) died: Option<usize>,
}

/// One captured op of a graph's body.
#[derive(Clone, Debug)]
pub(super) enum BodyOp {
    /// An access by lane `.0`, its regions resolved at capture.
    Access(usize, Vec<Touch>),
    /// A captured record into a slot by lane `.0`.
    Record(usize, usize),
    /// A captured wait of lane `.0` on a slot (`None`: an event never recorded).
    Wait(usize, Option<usize>),
}

/// A graph: its capture and body.
#[derive(Clone, Debug)]
pub(super) struct Graph {
    pub(super) pool: u32,
    pub(super) ended: bool,
    /// The capture's streams, the origin first.
    pub(super) lanes: Vec<usize>,
    pub(super) body: Vec<BodyOp>,
    pub(super) slots: usize,
    /// The stream of its latest launch.
    pub(super) launched_on: Option<usize>,
}

/// An access of an op: buffer, byte range, whether it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Touch {
    pub(super) buf: usize,
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) write: bool,
}

/// A synchronization an op needs: participant `from`'s access at time `t` must happen before it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Need {
    pub(super) from: usize,
    pub(super) t: u64,
    /// Whether every conflict behind it is with a freed buffer whose free was left unsafe.
    pub(super) sloppy: bool,
}

pub(super) fn add_need(needs: &mut Vec<Need>, from: usize, t: u64, sloppy: bool) {
    match needs.iter_mut().find(|n| n.from == from) {
        Some(n) => {
            n.t = n.t.max(t);
            n.sloppy &= sloppy;
        }
        None => needs.push(Need { from, t, sloppy }),
    }
}

/// The happens-before rules and the memory of the trace format, interpreting generated ops.
#[derive(Clone)]
pub(super) struct Model {
    pub(super) clocks: [Clock; PARTICIPANTS],
    /// Event number → its capture, if recorded.
    pub(super) events: Vec<Option<Clock>>,
    pub(super) bufs: Vec<Buffer>,
    /// Buffer name → its latest allocation.
    pub(super) slots: Vec<Option<usize>>,
    pub(super) device: DeviceCachingAllocator<ModelMemory>,
    pub(super) pinned: HostCachingAllocator<ModelMemory>,
    /// Graphs by number (`g0`, `g1`).
    pub(super) graphs: Vec<Option<Graph>>,
    /// Capturing streams: (graph, lane).
    pub(super) capturing: [Option<(usize, usize)>; PARTICIPANTS],
    /// Events whose latest record was captured, while the capture is underway: (graph, slot).
    pub(super) captured_events: Vec<Option<(usize, usize)>>,
    /// Graph pools by name: `p0` (shared) and one per graph.
    pub(super) pool_names: Vec<(Id, u32)>,
    pub(super) pools: GraphPools,
    /// Allocations so far.
    pub(super) allocations: usize,
}

impl Model {
    pub(super) fn new(names: usize) -> Self {
        Model {
            clocks: [[0; PARTICIPANTS]; PARTICIPANTS],
            events: vec![None; EVENTS],
            bufs: Vec::new(),
            slots: vec![None; names],
            device: DeviceCachingAllocator::new(ModelMemory::new(0x7f00_0000_0000)),
            pinned: HostCachingAllocator::new(ModelMemory::new(0x2000_0000_0000)),
            graphs: vec![None; GRAPHS],
            capturing: [None; PARTICIPANTS],
            captured_events: vec![None; EVENTS],
            pool_names: Vec::new(),
            pools: GraphPools::new(),
            allocations: 0,
        }
    }

    /// The clock an op on `p` runs with: for a stream, joined with the host's (rule 2) and the
    /// legacy default stream's implicit edges (rule 5).
    pub(super) fn issue_clock(&self, p: usize) -> Clock {
        let mut c = self.clocks[p];
        if p != HOST_P {
            join(&mut c, &self.clocks[HOST_P]);
            if p == DEFAULT_P {
                join(&mut c, &self.clocks[BLOCKING_P]);
            } else if p == BLOCKING_P {
                join(&mut c, &self.clocks[DEFAULT_P]);
            }
        }
        c
    }

    pub(super) fn begin(&mut self, p: usize) {
        self.clocks[p] = self.issue_clock(p);
    }

    /// The stream through which participant `p`'s work is waited for: a replay participant's
    /// graph's latest launch stream (it joins the whole replay), else `p` itself.
    pub(super) fn stream_of(&self, p: usize) -> usize {
        if p < FIRST_G {
            return p;
        }
        let g = (p - FIRST_G) / LANES;
        self.graphs
            .get(g)
            .and_then(Option::as_ref)
            .and_then(|graph| graph.launched_on)
            .unwrap_or(p)
    }

    /// The capture of event number `e`, if recorded.
    pub(super) fn event(&self, e: usize) -> Option<Clock> {
        self.events.get(e).copied().flatten()
    }

    pub(super) fn set_event(&mut self, event: &Id, capture: Option<Clock>) {
        let e = name_number(event);
        if self.events.len() <= e {
            self.events.resize(e + 1, None);
        }
        self.events[e] = capture;
    }

    pub(super) fn host_join(&mut self, c: Clock) {
        join(&mut self.clocks[HOST_P], &c);
    }

    /// The live buffer a name denotes.
    pub(super) fn live(&self, name: &Id) -> Option<usize> {
        let b = (*self.slots.get(name_number(name))?)?;
        self.bufs[b].live.then_some(b)
    }

    /// Who frees buffer `b`: the named stream, else the owning stream of device memory, else the
    /// host.
    pub(super) fn freer(&self, b: usize, named: Option<usize>) -> usize {
        let buf = &self.bufs[b];
        named.unwrap_or(if buf.memory == MemoryKind::Device {
            buf.owner
        } else {
            HOST_P
        })
    }

    /// The clock a free of `b` would carry now.
    pub(super) fn free_clock(&self, b: usize, named: Option<usize>) -> Clock {
        let by = self.freer(b, named);
        let mut c = if named.is_some() {
            self.issue_clock(by)
        } else {
            let mut c = self.clocks[HOST_P];
            join(&mut c, &self.clocks[by]);
            c
        };
        for &r in &self.bufs[b].record {
            join(&mut c, &self.clocks[r]);
        }
        c
    }

    /// The live regions an op touches (regions of freed buffers are uses after free, not
    /// accesses). A region both read and written counts as written.
    pub(super) fn touches(&self, op: &Op) -> Vec<Touch> {
        let mut out: Vec<Touch> = Vec::new();
        for access in op.accesses() {
            let (r, write) = (access.region, access.write);
            if let Some(b) = self.live(&r.buffer) {
                let lo = r.offset;
                let hi = r.bytes.map_or(self.bufs[b].bytes, |n| lo + n);
                let dup = out
                    .iter()
                    .any(|t| t.buf == b && t.lo == lo && t.hi == hi && t.write);
                if !dup {
                    out.push(Touch {
                        buf: b,
                        lo,
                        hi,
                        write,
                    });
                }
            }
        }
        out
    }

    /// Calls `f(from, t, reuse, sloppy)` for every earlier access that an access by `p` to
    /// `touches` conflicts with and does not happen after: by another participant, overlapping,
    /// one of the two a write, on the same buffer or (`reuse`) on the same bytes of an earlier,
    /// freed buffer, unless a stream named by `record_stream` for it had synchronized with the
    /// access by the free. `sloppy`: that
    /// buffer's free was left unsafe.
    pub(super) fn conflicts(
        &self,
        p: usize,
        touches: &[Touch],
        mut f: impl FnMut(usize, u64, bool, bool),
    ) {
        let c = self.issue_clock(p);
        for t in touches {
            let buf = &self.bufs[t.buf];
            for a in &buf.accesses {
                if a.p != p && (t.write || a.write) && a.lo < t.hi && t.lo < a.hi && c[a.p] < a.t {
                    f(a.p, a.t, false, false);
                }
            }
            let (lo, hi) = (buf.addr + t.lo, buf.addr + t.hi);
            if let Some(pool) = buf.pool {
                // Every other buffer its pool handed these bytes to, earlier or later, but the
                // accesses a record_stream excused of one freed before this one was allocated.
                for (k, old) in self.bufs.iter().enumerate() {
                    if k == t.buf || old.pool != Some(pool) {
                        continue;
                    }
                    let before = old.died.is_some_and(|d| d <= buf.born);
                    for a in &old.accesses {
                        let (alo, ahi) = (old.addr + a.lo, old.addr + a.hi);
                        if a.p != p
                            && (t.write || a.write)
                            && alo < hi
                            && lo < ahi
                            && c[a.p] < a.t
                            && !(before && old.excused[a.p] >= a.t)
                        {
                            f(a.p, a.t, true, false);
                        }
                    }
                }
                continue;
            }
            for old in &self.bufs {
                if old.live || old.memory != buf.memory || old.pool.is_some() {
                    continue;
                }
                for a in &old.accesses {
                    let (alo, ahi) = (old.addr + a.lo, old.addr + a.hi);
                    if a.p != p
                        && (t.write || a.write)
                        && alo < hi
                        && lo < ahi
                        && c[a.p] < a.t
                        && old.excused[a.p] < a.t
                    {
                        f(a.p, a.t, true, old.sloppy);
                    }
                }
            }
        }
    }

    /// What an access by `p` to `touches` must be ordered after, one need per participant.
    pub(super) fn access_needs(&self, p: usize, touches: &[Touch]) -> Vec<Need> {
        let mut needs = Vec::new();
        self.conflicts(p, touches, |from, t, _, sloppy| {
            add_need(&mut needs, from, t, sloppy)
        });
        needs
    }

    /// What a free of `b` (by `named`, or the default freer) must be ordered after.
    pub(super) fn free_needs(&self, b: usize, named: Option<usize>) -> Vec<Need> {
        let by = self.freer(b, named);
        let c = self.free_clock(b, named);
        let mut needs = Vec::new();
        if self.bufs[b].pool.is_some() {
            // A pool buffer's block stays with the pool: its free is not checked.
            return needs;
        }
        for a in &self.bufs[b].accesses {
            if a.p != by && c[a.p] < a.t {
                add_need(&mut needs, a.p, a.t, false);
            }
        }
        needs
    }

    /// Applies one op.
    pub(super) fn apply(&mut self, op: &Op) {
        match op {
            Op::StreamCreate { .. } => {}
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                ..
            } => {
                let device = *memory == MemoryKind::Device;
                let owner = if device {
                    stream.as_ref().map_or(DEFAULT_P, stream_index)
                } else {
                    HOST_P
                };
                // Device memory allocated on a capturing stream comes from the capture's pool.
                let pool = self.capturing[owner]
                    .filter(|_| device)
                    .and_then(|(g, _)| self.graphs[g].as_ref().map(|g| g.pool));
                let block = match pool {
                    Some(p) => self
                        .pools
                        .allocate(p, *bytes, owner as u32, self.device.memory_mut())
                        .map_err(|_| ()),
                    None if device => self.device.allocate(*bytes, owner as u32).map_err(|_| ()),
                    None => self.pinned.allocate(*bytes).map_err(|_| ()),
                };
                let addr = block.ok().flatten().map_or(0, |b| b.addr);
                // The allocation is a use: a write by the owning stream at its latest access
                // (not a pool buffer's: nothing runs at capture).
                let t = self.clocks[owner][owner];
                let mut accesses = Vec::new();
                if device && t > 0 && pool.is_none() {
                    accesses.push(Access {
                        p: owner,
                        t,
                        write: true,
                        lo: 0,
                        hi: *bytes,
                    });
                }
                let slot = name_number(buffer);
                if self.slots.len() <= slot {
                    self.slots.resize(slot + 1, None);
                }
                self.slots[slot] = Some(self.bufs.len());
                self.bufs.push(Buffer {
                    slot,
                    memory: *memory,
                    owner,
                    bytes: *bytes,
                    addr,
                    live: true,
                    accesses,
                    record: Vec::new(),
                    excused: [0; PARTICIPANTS],
                    sloppy: false,
                    pool,
                    born: self.allocations,
                    died: None,
                });
                self.allocations += 1;
            }
            Op::Free { buffer, stream } => {
                let Some(b) = self.live(buffer) else { return };
                let named = stream.as_ref().map(stream_index);
                let by = self.freer(b, named);
                if named.is_some() {
                    self.begin(by);
                }
                let mut excused = [0; PARTICIPANTS];
                for &r in &self.bufs[b].record {
                    join(&mut excused, &self.clocks[r]);
                }
                let buf = &mut self.bufs[b];
                buf.live = false;
                buf.excused = excused;
                buf.died = Some(self.allocations);
                // The model handed this block out, so giving it back cannot fail.
                let _ = match buf.pool {
                    Some(p) => {
                        let hold = !buf.record.is_empty();
                        self.pools.free(p, buf.addr, buf.owner as u32, hold)
                    }
                    None if buf.memory == MemoryKind::Device => {
                        self.device.free(buf.addr, by as u32)
                    }
                    None => self.pinned.free(buf.addr),
                };
            }
            Op::RecordStream { buffer, stream } => {
                if let Some(b) = self.live(buffer) {
                    let q = stream_index(stream);
                    let buf = &mut self.bufs[b];
                    let owner = buf.memory == MemoryKind::Device && buf.owner == q;
                    if !owner && !buf.record.contains(&q) {
                        buf.record.push(q);
                    }
                }
            }
            Op::Launch { .. } | Op::Copy { .. } | Op::Memset { .. } => {
                let p = participant(op);
                match self.capturing[p] {
                    Some((g, lane)) => {
                        let touches = self.touches(op);
                        if let Some(graph) = self.graphs[g].as_mut() {
                            graph.body.push(BodyOp::Access(lane, touches));
                        }
                    }
                    None => self.access(p, op),
                }
            }
            Op::HostRead { .. } | Op::HostWrite { .. } => self.access(participant(op), op),
            Op::EventCreate { event } | Op::EventDestroy { event } => self.set_event(event, None),
            Op::EventRecord { event, stream } => {
                let p = stream_index(stream);
                let e = name_number(event);
                if self.captured_events.len() <= e {
                    self.captured_events.resize(e + 1, None);
                }
                match self.capturing[p] {
                    Some((g, lane)) => {
                        // Captured: after the capture ends it counts as never recorded.
                        self.set_event(event, None);
                        if let Some(graph) = self.graphs[g].as_mut() {
                            let slot = graph.slots;
                            graph.slots += 1;
                            graph.body.push(BodyOp::Record(lane, slot));
                            self.captured_events[e] = Some((g, slot));
                        }
                    }
                    None => {
                        self.captured_events[e] = None;
                        self.begin(p);
                        self.set_event(event, Some(self.clocks[p]));
                    }
                }
            }
            Op::EventWait { stream, event } => {
                let p = stream_index(stream);
                let e = name_number(event);
                let captured = self.captured_events.get(e).copied().flatten();
                match (self.capturing[p], captured) {
                    (Some((g, lane)), slot) => {
                        let slot = slot.filter(|&(h, _)| h == g).map(|(_, k)| k);
                        if let Some(graph) = self.graphs[g].as_mut() {
                            graph.body.push(BodyOp::Wait(lane, slot));
                        }
                    }
                    (None, Some((g, slot))) => {
                        // The stream joins the capture.
                        if let Some(graph) = self.graphs[g].as_mut() {
                            let lane = graph.lanes.len();
                            graph.lanes.push(p);
                            graph.body.push(BodyOp::Wait(lane, Some(slot)));
                            self.capturing[p] = Some((g, lane));
                        }
                    }
                    (None, None) => {
                        self.begin(p);
                        if let Some(c) = self.event(e) {
                            join(&mut self.clocks[p], &c);
                        }
                    }
                }
            }
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                if let Some(c) = self.event(name_number(event)) {
                    self.host_join(c);
                }
            }
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let p = stream_index(stream);
                self.host_join(self.clocks[p]);
                if p == DEFAULT_P {
                    self.host_join(self.clocks[BLOCKING_P]);
                }
            }
            Op::DeviceSync { .. } => {
                for p in DEFAULT_P..PARTICIPANTS {
                    self.host_join(self.clocks[p]);
                }
            }
            Op::EventQuery { .. } | Op::StreamQuery { .. } => {}
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => {
                let g = name_number(graph);
                let p = stream_index(stream);
                let name = pool.clone().unwrap_or_else(|| graph.clone());
                let pool = match self.pool_names.iter().find(|(n, _)| *n == name) {
                    Some(&(_, k)) => k,
                    None => {
                        let k = self.pools.add();
                        self.pool_names.push((name, k));
                        k
                    }
                };
                self.pools.begin_capture(pool);
                if self.graphs.len() <= g {
                    self.graphs.resize(g + 1, None);
                }
                self.graphs[g] = Some(Graph {
                    pool,
                    ended: false,
                    lanes: vec![p],
                    body: Vec::new(),
                    slots: 0,
                    launched_on: None,
                });
                self.capturing[p] = Some((g, 0));
            }
            Op::GraphEnd { graph } => {
                let g = name_number(graph);
                for c in self.capturing.iter_mut() {
                    if c.is_some_and(|(h, _)| h == g) {
                        *c = None;
                    }
                }
                for e in self.captured_events.iter_mut() {
                    if e.is_some_and(|(h, _)| h == g) {
                        *e = None;
                    }
                }
                if let Some(graph) = self.graphs.get_mut(g).and_then(Option::as_mut) {
                    graph.ended = true;
                    let pool = graph.pool;
                    self.pools.end_capture(pool);
                }
            }
            Op::GraphLaunch { graph, stream } => {
                self.launch(name_number(graph), stream_index(stream), |_, _, _| {});
            }
        }
    }

    /// A `graph_launch` of graph `g` on stream `s`: the entry clock joined into every lane's
    /// participant, the body run on them (`before(model, participant, touches)` is called before
    /// each captured access is applied), every lane joined back into `s`.
    pub(super) fn launch(
        &mut self,
        g: usize,
        s: usize,
        mut before: impl FnMut(&Model, usize, &[Touch]),
    ) {
        let Some(graph) = self.graphs.get_mut(g).and_then(Option::as_mut) else {
            return;
        };
        graph.launched_on = Some(s);
        let graph = graph.clone();
        self.begin(s);
        let entry = self.clocks[s];
        for c in 0..graph.lanes.len() {
            join(&mut self.clocks[lane_participant(g, c)], &entry);
        }
        let mut slots: Vec<Clock> = vec![[0; PARTICIPANTS]; graph.slots];
        for b in &graph.body {
            match b {
                BodyOp::Access(lane, touches) => {
                    let p = lane_participant(g, *lane);
                    // A buffer freed by now that is not a pool buffer is used after its free:
                    // not an access.
                    let touches: Vec<Touch> = touches
                        .iter()
                        .filter(|x| self.bufs[x.buf].live || self.bufs[x.buf].pool.is_some())
                        .copied()
                        .collect();
                    before(self, p, &touches);
                    self.clocks[p][p] += 1;
                    let t = self.clocks[p][p];
                    for x in &touches {
                        self.bufs[x.buf].accesses.push(Access {
                            p,
                            t,
                            write: x.write,
                            lo: x.lo,
                            hi: x.hi,
                        });
                    }
                }
                BodyOp::Record(lane, slot) => {
                    slots[*slot] = self.clocks[lane_participant(g, *lane)];
                }
                BodyOp::Wait(lane, slot) => {
                    if let Some(c) = slot.and_then(|k| slots.get(k).copied()) {
                        join(&mut self.clocks[lane_participant(g, *lane)], &c);
                    }
                }
            }
        }
        for c in 0..graph.lanes.len() {
            let lane = self.clocks[lane_participant(g, c)];
            join(&mut self.clocks[s], &lane);
        }
    }

    pub(super) fn access(&mut self, p: usize, op: &Op) {
        let touches = self.touches(op);
        if p != HOST_P {
            self.begin(p);
        }
        self.clocks[p][p] += 1;
        let t = self.clocks[p][p];
        for x in touches {
            self.bufs[x.buf].accesses.push(Access {
                p,
                t,
                write: x.write,
                lo: x.lo,
                hi: x.hi,
            });
        }
    }
}
