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
//! ([`GraphPools`]), and so does device memory whose `alloc` names a pool outside a capture (its
//! allocation is a use, as for a plain buffer, and its accesses are ordinary ones). Such a *pool
//! buffer* is a generation that outlives its free: the name is
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
use crate::alloc::{GraphPools, PoolBytes, PoolIndex};
use crate::report::{FreeRef, Replay};
use crate::trace::DEFAULT_STREAM;

mod capture;
mod replay;

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
    /// With `addr`: the device bytes each pool holds.
    pub(super) pool_bytes: PoolBytes,
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
    freed: Option<FreedBy>,
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

    /// The name of the graph `p` is capturing, if it is.
    pub(super) fn capture_graph_name(&self, p: Participant) -> Option<&Id> {
        let &(g, _) = self.capturing.get(&p)?;
        Some(&self.graphs[g as usize].name)
    }

    /// The name of pool `p`.
    pub(super) fn pool_name(&self, p: PoolIndex) -> Option<&Id> {
        self.pool_names
            .iter()
            .find(|(_, &q)| q == p)
            .map(|(n, _)| n)
    }

    /// The pool named `name` (a graph's default pool is named after the graph), if it exists.
    pub(super) fn pool_named(&self, name: &Id) -> Option<PoolIndex> {
        self.pool_names.get(name).copied()
    }

    /// The pool named `name`, made now (empty) if no graph or allocation has named it yet.
    pub(super) fn pool_or_add(&mut self, name: &Id) -> PoolIndex {
        if let Some(&q) = self.pool_names.get(name) {
            return q;
        }
        let q = self.pools.add();
        self.pool_buffers.push(BTreeMap::new());
        self.pool_longest.push(0);
        self.pool_names.insert(name.clone(), q);
        q
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
                self.pool_bytes.hold(lo, hi, pool);
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
            b.freed = Some(FreedBy::Op(i, by, site.clone()));
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
    /// replay joins into it), each keeping its epoch; `None` when no conflict is a replay's.
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
                // The epoch stays the replay's: what waits for the launch stream's work after
                // the launch follows it (the replay joins into its launch stream at its end).
                let stream = self.launches[k].1;
                c.participant = order.name(stream).to_string();
            }
        }
        Some(v)
    }
}

/// Grows `v` to at least `n` entries with zeros.
fn grow(v: &mut Vec<u32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0);
    }
}
