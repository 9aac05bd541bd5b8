//! CUDA graphs in the checker: captures, their bodies, graph memory pools and replays (trace
//! format, "CUDA graphs").
//!
//! # Capture
//!
//! `graph_begin` makes its stream the capture's *origin*; a stream joins the capture when it
//! waits on an event whose latest record was captured in it. The ops on a capturing stream do
//! not run: [`Checker::capture_step`] records them into the graph's body, in trace order, each
//! with its *lane* (the index of its stream among the capture's streams, the origin first).
//! A captured access keeps its regions resolved to buffers (a captured kernel holds pointers,
//! not names); a captured `event_record` fills a *slot*, and a captured `event_wait` names the
//! slot it waits for. At capture, each lane keeps a small vector clock over the capture's lanes
//! (its captured work, and what it waited for through captured events): `graph_end` rejects a
//! capture whose joined streams' work the origin does not wait for, as CUDA does.
//!
//! # Pools
//!
//! Device memory allocated on a capturing stream comes from the capture's pool
//! ([`GraphPools`]). Such a *pool buffer* is a generation that outlives its free: the name is
//! freed (a later op that names it is `use-after-free`), the block goes back to the pool, and the
//! generation stays, since the graph's replays keep accessing its bytes. Every access to a pool
//! buffer is checked against the history of every other buffer of its pool that held any of its
//! bytes, earlier or later (`reuse-race`), except what a `record_stream` excused: the accesses of
//! a buffer freed before the other was allocated that the clocks, at the free, of its
//! `record_stream` streams cover (the trace format's "Reuse with record_stream").
//!
//! # Replay
//!
//! A `graph_launch` of `G` on `S` joins `S`'s clock (with the host's and the legacy default
//! stream's edges: the launch is an op on `S`) into the participant `G/c` of every lane, runs the
//! body in order on those participants — each captured access a new epoch of its lane's
//! participant, checked and recorded as any access; each captured record and wait a clock
//! snapshot and join between the `G/c` — and joins every `G/c` back into `S`. The `G/c` keep their
//! clocks from launch to launch: a lane's accesses in one replay subsume its accesses in the
//! previous one, so histories do not grow with the number of replays.
//!
//! Hazards found in a replay are reported at the launch, one per (kind, buffer): the first
//! captured op in body order that has it gives the access and its conflicts. Accesses carry the
//! captured op's index ([`Access::captured`]) so that reports name it.
//!
//! Guarantee: exact under the trace format's graph rules (checked against the brute-force oracle,
//! which unrolls every replay into explicit nodes, on random programs with captures).

use std::collections::{BTreeMap, VecDeque};

use super::*;
use crate::alloc::{GraphPools, PoolIndex};
use crate::report::{FreeRef, Replay};
use crate::trace::DEFAULT_STREAM;

/// Launches remembered for the wording of fixes (the stream a replay ran on).
const LAUNCH_LOG: usize = 256;

/// The state of every graph of the trace.
#[derive(Clone, Debug, Default)]
pub(super) struct Graphs {
    by_name: HashMap<Id, u32>,
    graphs: Vec<Graph>,
    /// Capturing streams: the graph and the lane.
    capturing: HashMap<Participant, (u32, u32)>,
    /// Captures underway.
    active: u32,
    /// Capturing blocking streams of device 0.
    blocking: u32,
    /// Events whose latest record was captured, while their capture is underway: the graph and
    /// the slot.
    events: HashMap<Id, (u32, u32)>,
    /// Pools by name (a graph's default pool is named after the graph).
    pool_names: HashMap<Id, PoolIndex>,
    /// The pools' arenas.
    pub(super) pools: GraphPools,
    /// Each pool's buffers by address: (start, index in `pool_gens`) → end.
    pool_buffers: Vec<BTreeMap<(u64, u32), u64>>,
    /// The longest buffer of each pool, to bound the search for overlaps.
    pool_longest: Vec<u64>,
    /// What the checker keeps of each pool buffer ([`Generation::pool_index`] indexes it).
    pool_gens: Vec<PoolGen>,
    /// Bumped whenever a pool buffer is added or the participants of a pool buffer's history
    /// change: [`PoolGen::clear_for`] holds until it moves.
    pool_version: u64,
    /// With `addr`: the device bytes each pool holds, merged per pool (start → end, pool).
    pool_bytes: BTreeMap<u64, (u64, PoolIndex)>,
    /// Every captured op of every graph; [`Access::captured`] minus one indexes it.
    captured: Vec<CapturedOp>,
    /// Allocated, non-pool generations that bodies name: (graph, buffer of its body).
    refs: HashMap<GenId, Vec<(u32, u32)>>,
    /// The latest launches, (op, stream), for the wording of fixes.
    launches: VecDeque<(u64, Participant)>,
    /// Event snapshots of the replay running.
    snapshots: Vec<VectorClock>,
}

/// One graph: captured or being captured.
#[derive(Clone, Debug, Default)]
struct Graph {
    name: Id,
    ended: bool,
    pool: PoolIndex,
    /// The capture's streams, the origin first.
    lanes: Vec<Lane>,
    body: Vec<BodyOp>,
    regions: Vec<BodyRegion>,
    bufs: Vec<BodyBuf>,
    /// During the capture: the body's buffers by key.
    buf_index: HashMap<BufKey, u32>,
    /// Captured records.
    slots: u32,
    /// During the capture: each slot's clock over the lanes.
    slot_clocks: Vec<Vec<u32>>,
    /// The replay participants `G/c`, one per lane (made at the first launch).
    participants: Vec<Participant>,
}

/// A capturing stream of a graph.
#[derive(Clone, Debug)]
struct Lane {
    stream: Participant,
    /// During the capture: the captured work of each lane this lane knows of (its own included).
    clock: Vec<u32>,
    /// The op of its latest captured access.
    last_work: Option<u64>,
}

/// One captured op.
#[derive(Clone, Copy, Debug)]
struct BodyOp {
    lane: u32,
    /// [`Access::captured`] of its accesses: its index in [`Graphs::captured`] plus one.
    captured: u32,
    kind: BodyKind,
}

#[derive(Clone, Copy, Debug)]
enum BodyKind {
    /// A launch, copy or memset: regions `from..to` of the graph's regions.
    Access { from: u32, to: u32, label: u32 },
    /// An event record into a slot.
    Record(u32),
    /// An event wait on a slot (`None`: on a never-recorded event, no effect).
    Wait(Option<u32>),
}

/// One region of a captured access, resolved.
#[derive(Clone, Copy, Debug)]
struct BodyRegion {
    buf: u32,
    kind: AccessKind,
    offset: u64,
    end: u64,
}

/// A buffer a body names.
#[derive(Clone, Debug)]
struct BodyBuf {
    name: Id,
    /// Its generation; `None` when it was freed (and not a pool buffer) already at capture.
    gen: Option<GenId>,
    /// Once freed (not a pool buffer): the free's op, participant and site. Its launches use
    /// freed memory.
    freed: Option<(u64, Participant, Option<Arc<Site>>)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum BufKey {
    Gen(GenId),
    Freed(Id),
}

/// A captured op, as reports name it.
#[derive(Clone, Debug)]
pub(super) struct CapturedOp {
    /// Its op index.
    pub(super) op: u64,
    /// Its site.
    pub(super) site: Option<Arc<Site>>,
    graph: Id,
    name: &'static str,
    /// Its stream at capture.
    stream: Id,
}

/// What the checker keeps of a pool buffer.
#[derive(Clone, Debug)]
struct PoolGen {
    gen: GenId,
    pool: PoolIndex,
    /// Absolute bytes (empty for an empty buffer).
    lo: u64,
    hi: u64,
    alloc_op: u64,
    name: Id,
    /// Its free: op and site.
    freed: Option<(u64, Option<Arc<Site>>)>,
    /// At its free, the clocks of its `record_stream` streams, joined.
    excused: Option<VectorClock>,
    /// The other buffers of the pool that share a byte with it (indices in `pool_gens`).
    overlaps: Vec<u32>,
    /// Whose accesses its history has held (since it was last empty: a conservative summary).
    solo: Solo,
    /// A participant whose accesses no overlapping buffer's history can conflict with (each
    /// holds none, or only that participant's), as of a [`Graphs::pool_version`].
    clear_for: Option<(Participant, u64)>,
}

/// Whose accesses a pool buffer's history has held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Solo {
    Empty,
    One(Participant),
    Mixed,
}

impl Graphs {
    /// Whether a capture is underway (the checker's only question on its common path).
    #[inline]
    pub(super) fn capturing(&self) -> bool {
        self.active > 0
    }

    /// The pool of the capture `owner` is capturing in, if it is.
    pub(super) fn capture_pool(&self, owner: Participant) -> Option<PoolIndex> {
        if self.active == 0 {
            return None;
        }
        let &(g, _) = self.capturing.get(&owner)?;
        Some(self.graphs[g as usize].pool)
    }

    /// The captured op of [`Access::captured`] `captured`.
    pub(super) fn captured_op(&self, captured: u32) -> Option<&CapturedOp> {
        captured
            .checked_sub(1)
            .and_then(|k| self.captured.get(k as usize))
    }

    /// The report's note of a replay's captured op.
    pub(super) fn replay_of(&self, captured: u32) -> Option<Replay> {
        self.captured_op(captured).map(|c| Replay {
            graph: c.graph.to_string(),
            captured: c.op,
            captured_name: c.name,
            captured_site: c.site.clone(),
        })
    }

    /// With `addr`: whether a device allocation of `[a, end)` (from `pool`, or not from any)
    /// may take these bytes. A pool keeps the memory of its buffers, freed or not.
    pub(super) fn check_pool_bytes(
        &self,
        a: u64,
        end: u64,
        pool: Option<PoolIndex>,
    ) -> Result<(), String> {
        for (&s, &(e, p)) in self.pool_bytes.range(..end).rev() {
            if e <= a {
                break;
            }
            if Some(p) != pool {
                let pool_name = self
                    .pool_names
                    .iter()
                    .find(|(_, &q)| q == p)
                    .map_or_else(String::new, |(n, _)| n.to_string());
                return Err(format!(
                    "device memory [{a:#x}, {end:#x}) overlaps [{s:#x}, {e:#x}), which graph pool \"{pool_name}\" holds"
                ));
            }
        }
        Ok(())
    }

    /// A pool buffer `g` of `bytes` bytes at `base`, allocated at op `i`: its index in the
    /// table of pool buffers ([`Generation::set_pool`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_pool_buffer(
        &mut self,
        pool: PoolIndex,
        g: GenId,
        name: &Id,
        base: Option<u64>,
        bytes: u64,
        i: u64,
        addr_mode: bool,
    ) -> u32 {
        let me = self.pool_gens.len() as u32;
        let (lo, hi) = match base {
            Some(a) if bytes > 0 => (a, a + bytes),
            _ => (0, 0),
        };
        let mut overlaps = Vec::new();
        if lo < hi {
            let p = pool as usize;
            let from = lo.saturating_sub(self.pool_longest[p]);
            for (&(s, o), &e) in self.pool_buffers[p].range((from, 0)..(hi, 0)) {
                if s < hi && lo < e {
                    overlaps.push(o);
                    self.pool_gens[o as usize].overlaps.push(me);
                }
            }
            self.pool_buffers[p].insert((lo, me), hi);
            self.pool_longest[p] = self.pool_longest[p].max(hi - lo);
            if addr_mode {
                self.hold_pool_bytes(lo, hi, pool);
            }
        }
        self.pool_gens.push(PoolGen {
            gen: g,
            pool,
            lo,
            hi,
            alloc_op: i,
            name: name.clone(),
            freed: None,
            excused: None,
            overlaps,
            solo: Solo::Empty,
            clear_for: None,
        });
        self.pool_version += 1;
        me
    }

    /// Pool buffer `pg` records an access by `p`.
    #[inline]
    pub(super) fn pool_access(&mut self, pg: u32, p: Participant) {
        let solo = &mut self.pool_gens[pg as usize].solo;
        let next = match *solo {
            Solo::Empty => Solo::One(p),
            Solo::One(q) if q == p => return,
            _ => Solo::Mixed,
        };
        if *solo != next {
            *solo = next;
            self.pool_version += 1;
        }
    }

    /// With `addr`: the pool holds `[lo, hi)` from now on (merged with its neighbours).
    fn hold_pool_bytes(&mut self, mut lo: u64, mut hi: u64, pool: PoolIndex) {
        let touching: Vec<(u64, u64)> = self
            .pool_bytes
            .range(..=hi)
            .rev()
            .take_while(|(_, &(e, _))| e >= lo)
            .map(|(&s, &(e, _))| (s, e))
            .collect();
        for (s, e) in touching {
            self.pool_bytes.remove(&s);
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.pool_bytes.insert(lo, (hi, pool));
    }

    /// A non-pool generation that bodies name was freed at op `i` by `by`: their launches use
    /// freed memory from now on.
    pub(super) fn buffer_freed(
        &mut self,
        g: GenId,
        i: u64,
        by: Participant,
        site: &Option<Arc<Site>>,
    ) {
        for (graph, buf) in self.refs.remove(&g).unwrap_or_default() {
            let gr = &mut self.graphs[graph as usize];
            let b = &mut gr.bufs[buf as usize];
            b.freed = Some((i, by, site.clone()));
            if !gr.ended {
                // The generation's slot is free for another buffer now: in this capture, the
                // freed name denotes the same buffer of the body.
                let name = b.name.clone();
                gr.buf_index.remove(&BufKey::Gen(g));
                gr.buf_index.insert(BufKey::Freed(name), buf);
            }
        }
    }

    /// `reuse-race` in a pool: the accesses of the other buffers of pool buffer `pg`'s pool on
    /// the bytes `[lo, hi)` that conflict with the access `probe` (region `at` of the current
    /// op).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pool_reuse(
        &mut self,
        gens: &mut [Option<Generation>],
        history: &mut usize,
        pg: u32,
        lo: u64,
        hi: u64,
        at: usize,
        probe: &Probe<'_>,
        host: &VectorClock,
        found: &mut Vec<Found>,
    ) {
        let me = &self.pool_gens[pg as usize];
        if me.clear_for == Some((probe.participant, self.pool_version)) {
            // As in the previous replay: no overlapping buffer holds another participant's
            // access.
            return;
        }
        let mut clear = true;
        for &o in &me.overlaps {
            let other = &self.pool_gens[o as usize];
            match other.solo {
                Solo::Empty => continue,
                Solo::One(q) if q == probe.participant => continue,
                _ => clear = false,
            }
            let (s, e) = (lo.max(other.lo), hi.min(other.hi));
            if s >= e {
                continue;
            }
            // The free that handed these bytes out again: the earlier buffer's.
            let (first, first_name) = if other.alloc_op < me.alloc_op {
                (other, &other.name)
            } else {
                (me, &me.name)
            };
            let freed = first.freed.as_ref().map(|(op, site)| FreedAt {
                op: *op,
                site: site.clone(),
                name: first_name.clone(),
            });
            // What a record_stream at the other buffer's free, before this one's allocation,
            // ordered before every later use of its bytes.
            let excused = match (&other.freed, &other.excused) {
                (Some((f, _)), Some(c)) if *f < me.alloc_op => Some(c),
                _ => None,
            };
            let Some(gen) = gens[other.gen.0 as usize].as_mut() else {
                continue;
            };
            let rel = Probe {
                offset: s - other.lo,
                end: e - other.lo,
                ..*probe
            };
            let hits = std::cell::Cell::new(0);
            let name = &gen.name;
            let mut hit = |a: &Access| {
                if excused.is_some_and(|c| c.covers(a.epoch())) {
                    return;
                }
                hits.set(hits.get() + 1);
                found.push(Found {
                    at,
                    kind: HazardKind::ReuseRace,
                    access: a.clone(),
                    buffer: name.clone(),
                    freed: freed.clone(),
                });
            };
            let h = &mut gen.history;
            match h.rest.as_deref_mut() {
                None | Some(crate::shadow::Rest { index: None, .. }) => {
                    *history -= scan(&mut h.accesses, None, host, rel, &mut hit);
                    if hits.get() > 0 {
                        if let Some(r) = h.rest.as_deref_mut() {
                            *history -= scan(&mut r.covered, None, host, rel, &mut hit);
                        }
                    }
                }
                Some(crate::shadow::Rest {
                    index: Some(ix), ..
                }) => {
                    let mut last: Option<*const Entry> = None;
                    *history -= ix.visit(rel.offset, rel.end, |e| {
                        let a = &e.access;
                        if host.covers(a.epoch()) {
                            return Visit::Drop;
                        }
                        if rel.conflicts(a) && last != Some(Arc::as_ptr(e)) {
                            last = Some(Arc::as_ptr(e));
                            hit(a);
                        }
                        Visit::Keep
                    });
                }
            }
        }
        if clear {
            self.pool_gens[pg as usize].clear_for = Some((probe.participant, self.pool_version));
        }
    }

    /// `conflicts` with each replay's participant named by its launch stream where the launch
    /// is remembered (the stream a fix records an event on, or names in `record_stream`: the
    /// replay joins into it); `None` when no conflict is a replay's.
    pub(super) fn with_launch_streams(
        &self,
        order: &Order,
        conflicts: &[Conflict],
    ) -> Option<Vec<Conflict>> {
        if conflicts.iter().all(|c| c.captured.is_none()) {
            return None;
        }
        let mut v = conflicts.to_vec();
        for c in v.iter_mut().filter(|c| c.captured.is_some()) {
            let at = self.launches.binary_search_by_key(&c.op, |&(op, _)| op);
            if let Ok(k) = at {
                let stream = self.launches[k].1;
                c.participant = order.name(stream).to_string();
                c.epoch = Some(order.clock(stream).epoch(stream));
            }
        }
        Some(v)
    }
}

impl Checker {
    /// During a capture: what a capture changes about op `i`. `Ok(true)` when the op was
    /// captured (or otherwise handled here), `Ok(false)` when it runs as usual; `Err` for the
    /// programs CUDA rejects during a capture.
    pub(super) fn capture_step(
        &mut self,
        i: u64,
        op: &Op,
        site: &Option<Arc<Site>>,
    ) -> Result<bool, CheckError> {
        if self.graphs.blocking > 0 && op.on_stream().is_some_and(|s| s.as_str() == DEFAULT_STREAM)
        {
            return Err(Self::err(
                i,
                Field::Stream,
                "an op on the legacy default stream while a blocking stream is capturing",
                Some("the op on another stream, or after the capture ends"),
            ));
        }
        match op {
            Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
                let p = self.order.stream(stream);
                if let Some(&(g, lane)) = self.graphs.capturing.get(&p) {
                    self.capture_access(i, op, g, lane, site)?;
                    return Ok(true);
                }
            }
            Op::EventRecord { event, stream } => {
                let p = self.order.stream(stream);
                match self.graphs.capturing.get(&p) {
                    Some(&(g, lane)) => {
                        self.capture_record(i, op, g, lane, event, site);
                        return Ok(true);
                    }
                    None => {
                        self.graphs.events.remove(event);
                    }
                }
            }
            Op::EventWait { stream, event } => {
                let p = self.order.stream(stream);
                let captured = self.graphs.events.get(event).copied();
                match (self.graphs.capturing.get(&p).copied(), captured) {
                    (Some((g, lane)), Some((h, slot))) if g == h => {
                        self.capture_wait(i, op, g, lane, Some(slot), site);
                        return Ok(true);
                    }
                    (Some((g, _)), Some((h, _))) => {
                        let (me, other) = (
                            &self.graphs.graphs[g as usize].name,
                            &self.graphs.graphs[h as usize].name,
                        );
                        return Err(Self::err(
                            i,
                            Field::Event,
                            format!(
                                "stream \"{stream}\" is capturing graph \"{me}\" and waits on event \"{event}\", recorded in the capture of graph \"{other}\""
                            ),
                            Some("an event recorded in the same capture"),
                        ));
                    }
                    (Some((g, lane)), None) => {
                        if self.order.is_recorded(event) {
                            let me = &self.graphs.graphs[g as usize].name;
                            return Err(Self::err(
                                i,
                                Field::Event,
                                format!(
                                    "stream \"{stream}\" is capturing graph \"{me}\" and waits on event \"{event}\", recorded outside the capture"
                                ),
                                Some("an event recorded in the same capture"),
                            ));
                        }
                        self.warn_unrecorded(i, op, stream, event);
                        self.capture_wait(i, op, g, lane, None, site);
                        return Ok(true);
                    }
                    (None, Some((g, slot))) => {
                        if p == Order::DEFAULT {
                            return Err(Self::err(
                                i,
                                Field::Stream,
                                format!(
                                    "the legacy default stream waits on event \"{event}\", captured in graph \"{}\": it cannot join a capture",
                                    self.graphs.graphs[g as usize].name
                                ),
                                Some("a wait on another stream"),
                            ));
                        }
                        let lane = self.join_capture(g, p, slot);
                        self.capture_wait(i, op, g, lane, Some(slot), site);
                        return Ok(true);
                    }
                    (None, None) => {}
                }
            }
            Op::Free {
                stream: Some(stream),
                ..
            } => {
                let p = self.order.stream(stream);
                if let Some(g) = self.capturing_graph(p) {
                    return Err(Self::err(
                        i,
                        Field::Stream,
                        format!(
                            "a stream-ordered free on stream \"{stream}\", which is capturing graph \"{g}\""
                        ),
                        Some("a caching free, or a stream that is not capturing"),
                    ));
                }
            }
            Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => {
                let p = self.order.stream(stream);
                if let Some(g) = self.capturing_graph(p) {
                    return Err(Self::err(
                        i,
                        Field::Stream,
                        format!(
                            "{} of stream \"{stream}\", which is capturing graph \"{g}\"",
                            op.name()
                        ),
                        Some("a stream that is not capturing"),
                    ));
                }
            }
            Op::EventSync { event } | Op::EventQuery { event, .. } => {
                if let Some(&(g, _)) = self.graphs.events.get(event) {
                    return Err(Self::err(
                        i,
                        Field::Event,
                        format!(
                            "{} of event \"{event}\", captured in graph \"{}\" during its capture",
                            op.name(),
                            self.graphs.graphs[g as usize].name
                        ),
                        Some("an event recorded outside a capture"),
                    ));
                }
            }
            Op::DeviceSync { .. } => {
                let g = self.graphs.graphs.iter().find(|g| !g.ended);
                let g = g.map_or_else(String::new, |g| g.name.to_string());
                return Err(Self::err(
                    i,
                    Field::Op,
                    format!("device_sync while graph \"{g}\" is being captured"),
                    Some("the device_sync after graph_end"),
                ));
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.graphs.events.remove(event);
            }
            _ => {}
        }
        Ok(false)
    }

    /// Whether `op`, checked next, would be captured into a graph's body rather than run: a
    /// `launch`, `copy`, `memset` or `event_record` on a capturing stream, or an `event_wait`
    /// on a capturing stream or of a captured event (which makes its stream join the capture).
    /// Captured ops are part of a graph: the synchronization analysis does not judge them.
    /// (For an op the check rejects, the answer does not matter.)
    pub fn captures(&self, op: &Op) -> bool {
        if !self.graphs.capturing() {
            return false;
        }
        let capturing = |s: &Id| {
            self.order
                .find_stream(s)
                .is_some_and(|p| self.graphs.capturing.contains_key(&p))
        };
        match op {
            Op::Launch { stream, .. }
            | Op::Copy { stream, .. }
            | Op::Memset { stream, .. }
            | Op::EventRecord { stream, .. } => capturing(stream),
            Op::EventWait { stream, event } => {
                capturing(stream) || self.graphs.events.contains_key(event)
            }
            _ => false,
        }
    }

    /// The name of the graph stream `p` is capturing, if it is.
    fn capturing_graph(&self, p: Participant) -> Option<Id> {
        let &(g, _) = self.graphs.capturing.get(&p)?;
        Some(self.graphs.graphs[g as usize].name.clone())
    }

    /// Whether `p` is a blocking stream of device 0 (rule 5 of the trace format).
    fn blocking0(&self, p: Participant) -> bool {
        let info = self.order.stream_info(p);
        info.blocking && info.device == 0
    }

    /// Adds captured op `i` of graph `g` to the table of captured ops: its [`Access::captured`].
    fn add_captured(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        kind: BodyKind,
        site: &Option<Arc<Site>>,
    ) {
        let name = self.graphs.graphs[g as usize].name.clone();
        let stream = op.on_stream().cloned().unwrap_or_default();
        self.graphs.captured.push(CapturedOp {
            op: i,
            site: site.clone(),
            graph: name,
            name: op.name(),
            stream,
        });
        let captured = self.graphs.captured.len() as u32;
        self.graphs.graphs[g as usize].body.push(BodyOp {
            lane,
            captured,
            kind,
        });
    }

    /// A captured `launch`, `copy` or `memset` on lane `lane` of graph `g`.
    fn capture_access(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        site: &Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let from = self.graphs.graphs[g as usize].regions.len();
        let resolved = self.capture_regions(i, op, g);
        let regions = &mut self.graphs.graphs[g as usize].regions;
        if let Err(e) = resolved {
            regions.truncate(from);
            return Err(e);
        }
        // Dedup as for a running op: a region read and written counts as written.
        let mut v: Vec<OpAccess> = regions[from..]
            .iter()
            .map(|r| OpAccess {
                gen: GenId(r.buf),
                kind: r.kind,
                offset: r.offset,
                end: r.end,
            })
            .collect();
        dedup_accesses(&mut v);
        regions.truncate(from);
        regions.extend(v.iter().map(|a| BodyRegion {
            buf: a.gen.0,
            kind: a.kind,
            offset: a.offset,
            end: a.end,
        }));
        let to = regions.len();
        let label = match op {
            Op::Launch {
                name: Some(name), ..
            } => self.label(name),
            _ => 0,
        };
        let graph = &mut self.graphs.graphs[g as usize];
        let l = &mut graph.lanes[lane as usize];
        grow(&mut l.clock, lane as usize + 1);
        l.clock[lane as usize] += 1;
        l.last_work = Some(i);
        let kind = BodyKind::Access {
            from: from as u32,
            to: to as u32,
            label,
        };
        self.add_captured(i, op, g, lane, kind, site);
        Ok(())
    }

    /// Resolves the regions of captured access `op` into graph `g`'s regions.
    fn capture_regions(&mut self, i: u64, op: &Op, g: u32) -> Result<(), CheckError> {
        match op {
            Op::Launch { reads, writes, .. } => {
                for (k, r) in writes.iter().enumerate() {
                    self.capture_region(i, g, r, Field::Write(k as u32), AccessKind::Write)?;
                }
                for (k, r) in reads.iter().enumerate() {
                    self.capture_region(i, g, r, Field::Read(k as u32), AccessKind::Read)?;
                }
            }
            Op::Copy { src, dst, .. } => {
                let at = self.graphs.graphs[g as usize].regions.len();
                self.capture_region(i, g, dst, Field::Dst, AccessKind::Write)?;
                self.capture_region(i, g, src, Field::Src, AccessKind::Read)?;
                if let [a, b] = self.graphs.graphs[g as usize].regions[at..] {
                    if a.buf == b.buf && a.offset < b.end && b.offset < a.end {
                        return Err(Self::err(
                            i,
                            Field::Dst,
                            format!(
                                "copy source and destination overlap in buffer \"{}\"",
                                dst.buffer
                            ),
                            Some("disjoint regions"),
                        ));
                    }
                }
            }
            Op::Memset { dst, .. } => {
                self.capture_region(i, g, dst, Field::Dst, AccessKind::Write)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Resolves region `r` of a captured op of graph `g` to a buffer of its body: the buffer its
    /// name denotes now (a freed pool buffer's generation, whose bytes the replays access).
    fn capture_region(
        &mut self,
        i: u64,
        g: u32,
        r: &Region,
        field: Field,
        kind: AccessKind,
    ) -> Result<(), CheckError> {
        let (key, size, freed) = match self.lookup(&r.buffer) {
            Some(Name::Live(gen)) => (BufKey::Gen(gen), self.gen(gen).size(), None),
            Some(Name::External(gen)) => (BufKey::Gen(gen), None, None),
            Some(Name::Freed(f)) => {
                let f = &self.freed[f as usize];
                if f.pool_gen != NO_GEN {
                    (BufKey::Gen(GenId(f.pool_gen)), Some(f.size), None)
                } else {
                    let freed = (f.free_op, f.free_by, f.free_site.clone());
                    (BufKey::Freed(f.name.clone()), Some(f.size), Some(freed))
                }
            }
            None => {
                let gen = self.new_external(&r.buffer);
                self.rebind(&r.buffer, None, Name::External(gen));
                (BufKey::Gen(gen), None, None)
            }
        };
        let end = Self::region_end(i, r, field, size)?;
        let graph = &mut self.graphs.graphs[g as usize];
        let buf = match graph.buf_index.get(&key) {
            Some(&b) => b,
            None => {
                let b = graph.bufs.len() as u32;
                let gen = match key {
                    BufKey::Gen(gen) => Some(gen),
                    BufKey::Freed(_) => None,
                };
                graph.bufs.push(BodyBuf {
                    name: r.buffer.clone(),
                    gen,
                    freed,
                });
                graph.buf_index.insert(key, b);
                if let Some(gen) = gen {
                    let gn = self.gens[gen.0 as usize]
                        .as_mut()
                        .expect("named generation");
                    gn.set_captured();
                    if !gn.is_external() && !gn.is_pool() {
                        self.graphs.refs.entry(gen).or_default().push((g, b));
                    }
                }
                b
            }
        };
        self.graphs.graphs[g as usize].regions.push(BodyRegion {
            buf,
            kind,
            offset: r.offset,
            end,
        });
        Ok(())
    }

    /// A captured `event_record` of `event` on lane `lane` of graph `g`.
    fn capture_record(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        event: &Id,
        site: &Option<Arc<Site>>,
    ) {
        let graph = &mut self.graphs.graphs[g as usize];
        let slot = graph.slots;
        graph.slots += 1;
        let clock = graph.lanes[lane as usize].clock.clone();
        graph.slot_clocks.push(clock);
        self.graphs.events.insert(event.clone(), (g, slot));
        // The capture is no recorded work: outside the capture, the event counts as never
        // recorded (and after the capture ends, until it is recorded again).
        self.order.reset_event(event);
        self.add_captured(i, op, g, lane, BodyKind::Record(slot), site);
    }

    /// A captured `event_wait` on lane `lane` of graph `g`, of `slot` (`None`: the event was
    /// never recorded; the wait has no effect).
    fn capture_wait(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        slot: Option<u32>,
        site: &Option<Arc<Site>>,
    ) {
        if let Some(s) = slot {
            let graph = &mut self.graphs.graphs[g as usize];
            let snap = std::mem::take(&mut graph.slot_clocks[s as usize]);
            let l = &mut graph.lanes[lane as usize];
            grow(&mut l.clock, snap.len());
            for (a, b) in l.clock.iter_mut().zip(&snap) {
                *a = (*a).max(*b);
            }
            graph.slot_clocks[s as usize] = snap;
        }
        self.add_captured(i, op, g, lane, BodyKind::Wait(slot), site);
    }

    /// Stream `p` joins the capture of graph `g` by waiting on `slot`: its new lane.
    fn join_capture(&mut self, g: u32, p: Participant, slot: u32) -> u32 {
        let blocking = self.blocking0(p);
        let graph = &mut self.graphs.graphs[g as usize];
        let lane = graph.lanes.len() as u32;
        graph.lanes.push(Lane {
            stream: p,
            clock: graph.slot_clocks[slot as usize].clone(),
            last_work: None,
        });
        self.graphs.capturing.insert(p, (g, lane));
        if blocking {
            self.graphs.blocking += 1;
        }
        lane
    }

    /// `graph_begin`: the host starts capturing `graph` on `stream`.
    pub(super) fn graph_begin(
        &mut self,
        i: u64,
        graph: &Id,
        stream: &Id,
        pool: Option<&Id>,
    ) -> Result<(), CheckError> {
        if stream.as_str() == DEFAULT_STREAM {
            return Err(Self::err(
                i,
                Field::Stream,
                "graph_begin on the legacy default stream, which cannot be captured",
                Some("another stream"),
            ));
        }
        let p = self.order.stream(stream);
        if let Some(g) = self.capturing_graph(p) {
            return Err(Self::err(
                i,
                Field::Stream,
                format!("stream \"{stream}\" is already capturing graph \"{g}\""),
                Some("a stream that is not capturing"),
            ));
        }
        if self.graphs.by_name.contains_key(graph) {
            return Err(Self::err(
                i,
                Field::Graph,
                format!("graph \"{graph}\" is already captured"),
                Some("a new graph name"),
            ));
        }
        let pool_name = pool.unwrap_or(graph);
        let pool = match self.graphs.pool_names.get(pool_name) {
            Some(&q) => q,
            None => {
                let q = self.graphs.pools.add();
                self.graphs.pool_buffers.push(BTreeMap::new());
                self.graphs.pool_longest.push(0);
                self.graphs.pool_names.insert(pool_name.clone(), q);
                q
            }
        };
        self.graphs.pools.begin_capture(pool);
        let g = self.graphs.graphs.len() as u32;
        self.graphs.graphs.push(Graph {
            name: graph.clone(),
            pool,
            lanes: vec![Lane {
                stream: p,
                clock: vec![0],
                last_work: None,
            }],
            ..Graph::default()
        });
        self.graphs.by_name.insert(graph.clone(), g);
        self.graphs.capturing.insert(p, (g, 0));
        self.graphs.active += 1;
        if self.blocking0(p) {
            self.graphs.blocking += 1;
        }
        Ok(())
    }

    /// `graph_end`: the capture of `graph` ends.
    pub(super) fn graph_end(&mut self, i: u64, graph: &Id) -> Result<(), CheckError> {
        let g = match self.graphs.by_name.get(graph) {
            Some(&g) if !self.graphs.graphs[g as usize].ended => g,
            Some(_) => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" is not being captured: its capture has ended"),
                    Some("a graph_begin of the graph first"),
                ))
            }
            None => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" is not being captured"),
                    Some("a graph_begin of the graph first"),
                ))
            }
        };
        let gr = &self.graphs.graphs[g as usize];
        let origin = &gr.lanes[0];
        for (k, lane) in gr.lanes.iter().enumerate().skip(1) {
            let work = lane.clock.get(k).copied().unwrap_or(0);
            if work > origin.clock.get(k).copied().unwrap_or(0) {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!(
                        "stream \"{}\" joined the capture of graph \"{graph}\", and its captured work (up to op {}) is not joined into the origin \"{}\"",
                        self.order.name(lane.stream),
                        lane.last_work.unwrap_or(0),
                        self.order.name(origin.stream),
                    ),
                    Some("an event recorded on that stream after its work, and waited for by the origin before graph_end"),
                ));
            }
        }
        let streams: Vec<Participant> = gr.lanes.iter().map(|l| l.stream).collect();
        for p in streams {
            self.graphs.capturing.remove(&p);
            if self.blocking0(p) {
                self.graphs.blocking -= 1;
            }
        }
        self.graphs.active -= 1;
        let gr = &mut self.graphs.graphs[g as usize];
        gr.ended = true;
        gr.slot_clocks = Vec::new();
        gr.buf_index = HashMap::default();
        for l in &mut gr.lanes {
            l.clock = Vec::new();
        }
        let pool = gr.pool;
        self.graphs.pools.end_capture(pool);
        // Its captured events count as never recorded (they are reset already).
        self.graphs.events.retain(|_, &mut (h, _)| h != g);
        Ok(())
    }

    /// `graph_launch`: replays `graph` on `stream`.
    pub(super) fn graph_launch(
        &mut self,
        i: u64,
        op: &Op,
        graph: &Id,
        stream: &Id,
        site: Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let s = self.order.stream(stream);
        if self.graphs.capturing() {
            if let Some(g) = self.capturing_graph(s) {
                return Err(Self::err(
                    i,
                    Field::Stream,
                    format!(
                        "graph_launch on stream \"{stream}\", which is capturing graph \"{g}\""
                    ),
                    Some("a stream that is not capturing"),
                ));
            }
        }
        let g = match self.graphs.by_name.get(graph) {
            Some(&g) if self.graphs.graphs[g as usize].ended => g,
            Some(_) => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" has not ended its capture"),
                    Some("a graph_end of the graph first"),
                ))
            }
            None => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" was never captured"),
                    Some("a graph captured with graph_begin and graph_end"),
                ))
            }
        };
        self.replay(i, op, g, s, site);
        Ok(())
    }

    /// Replays graph `g` on stream `s` at op `i` (see the module docs).
    fn replay(&mut self, i: u64, op: &Op, g: u32, s: Participant, site: Option<Arc<Site>>) {
        // Rules 1, 2 and 5: the launch is an op on `s`.
        self.order.begin_stream_op(s);
        let graph = std::mem::take(&mut self.graphs.graphs[g as usize]);
        let mut participants = graph.participants;
        for lane in &graph.lanes[participants.len()..] {
            let name = format!("{}/{}", graph.name, self.order.name(lane.stream));
            let device = self.order.device(lane.stream);
            participants.push(self.order.add_replay_participant(Id::from(name), device));
        }
        let graph = Graph {
            participants,
            ..graph
        };
        // The entry clock, into every lane's participant: launches of one graph are ordered.
        let entry = self.order.clock(s).clone();
        for &p in &graph.participants {
            self.order.join_clock(p, &entry);
        }
        let mut snapshots = std::mem::take(&mut self.graphs.snapshots);
        if snapshots.len() < graph.slots as usize {
            snapshots.resize(graph.slots as usize, VectorClock::new());
        }
        let first = self.hazards.len();
        for b in &graph.body {
            let p = graph.participants[b.lane as usize];
            match b.kind {
                BodyKind::Record(slot) => snapshots[slot as usize].clone_from(self.order.clock(p)),
                BodyKind::Wait(Some(slot)) => self.order.join_clock(p, &snapshots[slot as usize]),
                BodyKind::Wait(None) => {}
                BodyKind::Access { from, to, label } => {
                    self.op_accesses.clear();
                    self.uaf.clear();
                    for r in &graph.regions[from as usize..to as usize] {
                        let buf = &graph.bufs[r.buf as usize];
                        match (buf.gen, &buf.freed) {
                            (Some(gen), None) => self.op_accesses.push(OpAccess {
                                gen,
                                kind: r.kind,
                                offset: r.offset,
                                end: r.end,
                            }),
                            (_, freed) => self.uaf.push(UseAfterFree {
                                name: buf.name.clone(),
                                kind: Some(r.kind),
                                offset: r.offset,
                                end: r.end,
                                freed: freed.clone(),
                            }),
                        }
                    }
                    let time = self.order.tick(p).time;
                    self.found.clear();
                    for at in 0..self.op_accesses.len() {
                        self.check_access(at, p);
                    }
                    let before = self.hazards.len();
                    if !self.found.is_empty() {
                        let label = self.label_of(label);
                        self.report_races(i, op, p, &site, &label, b.captured, s);
                    }
                    if !self.uaf.is_empty() {
                        self.report_use_after_free(i, op, p, &site, b.captured);
                    }
                    if self.hazards.len() > before {
                        // One hazard per launch, kind and buffer: the first captured op's.
                        let (done, new) = self.hazards.split_at(before);
                        let seen = &done[first..];
                        let keep: Vec<bool> = new
                            .iter()
                            .map(|h| {
                                !seen
                                    .iter()
                                    .any(|d| d.kind == h.kind && d.buffer == h.buffer)
                            })
                            .collect();
                        let mut k = 0;
                        self.hazards.retain(|_| {
                            k += 1;
                            k <= before || keep[k - before - 1]
                        });
                    }
                    self.record_accesses(i, p, time, &site, label, b.captured);
                }
            }
        }
        self.graphs.snapshots = snapshots;
        // The exit: work issued on `s` after the launch waits for the whole replay.
        for &p in &graph.participants {
            self.order.join_participant(s, p);
        }
        self.graphs.graphs[g as usize] = graph;
        if self.graphs.launches.len() == LAUNCH_LOG {
            self.graphs.launches.pop_front();
        }
        self.graphs.launches.push_back((i, s));
    }

    /// The fix of a race that the replay at launch `i` on stream `s` found at captured op
    /// `captured`: the conflicts of the same replay are ordered inside the capture (between
    /// captured ops, on the capture's streams), the others around the launch (on the launch
    /// streams, which the replays join into).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replay_fix(
        &self,
        kind: HazardKind,
        i: u64,
        s: Participant,
        captured: u32,
        kept: &[&Found],
        conflicts: &[Conflict],
        free: Option<&FreeRef>,
    ) -> String {
        let Some(me) = self.graphs.captured_op(captured) else {
            return fix_race(&self.order, kind, i, s, conflicts, free);
        };
        let inside: Vec<Conflict> = kept
            .iter()
            .filter(|f| f.access.op == i && f.access.captured != 0)
            .filter_map(|f| {
                let cap = self.graphs.captured_op(f.access.captured)?;
                let mut c = self.conflict(&f.access, &f.buffer);
                c.participant = cap.stream.to_string();
                c.op = cap.op;
                c.captured = None;
                c.epoch = None;
                Some(c)
            })
            .collect();
        let outside: Vec<Conflict> = conflicts
            .iter()
            .filter(|c| !(c.op == i && c.captured.is_some()))
            .cloned()
            .collect();
        let mut parts = Vec::new();
        if !outside.is_empty() {
            let named = self
                .graphs
                .with_launch_streams(&self.order, &outside)
                .unwrap_or(outside);
            // record_stream at a free outside a capture cannot order a later replay.
            let record_stream = named.iter().all(|c| c.captured.is_none());
            parts.push(fix_race_on(
                self.order.name(s),
                kind,
                i,
                &named,
                free,
                record_stream,
            ));
        }
        if !inside.is_empty() {
            // A free between the conflicting captured ops is inside the capture: there,
            // record_stream keeps the pool from handing its block out again.
            let record_stream =
                free.is_some_and(|f| inside.iter().all(|c| c.op < f.op) && f.op < me.op);
            let text = fix_race_on(
                me.stream.as_str(),
                kind,
                me.op,
                &inside,
                free,
                record_stream,
            );
            parts.push(format!("in the capture of graph {}, {text}", me.graph));
        }
        parts.join("; and ")
    }

    /// A caching (or stream-ordered) free of pool buffer `g` at op `i`: its block goes back to
    /// its pool (held back until the pool's captures end if it had `record_stream` streams); it
    /// is not checked for `unsafe-free`; the generation stays for the graph's replays.
    pub(super) fn free_pool_buffer(
        &mut self,
        i: u64,
        g: GenId,
        buffer: &Id,
        named: Option<Participant>,
        site: Option<Arc<Site>>,
    ) {
        let gen = self.gens[g.0 as usize].as_mut().expect("live generation");
        let (owner, size, base) = (gen.owner, gen.size().unwrap_or(0), gen.addr());
        let by = named.unwrap_or(owner);
        let rs = gen.take_record_streams();
        let excused = (!rs.is_empty()).then(|| {
            let mut c = VectorClock::new();
            for &p in &rs {
                c.join(self.order.clock(p));
            }
            c
        });
        let pg = gen.pool_index().map(|k| k as usize);
        if let (Some(a), Some(pg)) = (base, pg) {
            if self.addr_mode == Some(true) {
                self.live[MemoryKind::Device.index()].remove(&a);
            } else {
                let pool = self.graphs.pool_gens[pg].pool;
                // The pool handed this block out, so giving it back cannot fail.
                let _ = self.graphs.pools.free(pool, a, by.0, !rs.is_empty());
            }
        }
        if let Some(pg) = pg {
            let pg = &mut self.graphs.pool_gens[pg];
            pg.freed = Some((i, site.clone()));
            pg.excused = excused;
        }
        let freed = FreedName {
            name: buffer.clone(),
            size,
            memory: MemoryKind::Device,
            owner,
            free_op: i,
            free_by: by,
            free_site: site,
            pool_gen: g.0,
        };
        self.bind_freed(buffer, g, freed);
    }
}

/// Grows `v` to at least `n` entries with zeros.
fn grow(v: &mut Vec<u32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0);
    }
}
