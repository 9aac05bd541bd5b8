//! CUDA graphs in program runs: the resolver's side of captures, bodies, pools and replays
//! (trace format, "CUDA graphs").
//!
//! The program runners of both backends share this representation:
//!
//! - **Capture state.** `graph_begin` makes its stream the capture's *origin* (lane 0); a stream
//!   joins the capture when it waits on an event whose latest record was captured in it (it gets
//!   the next lane). [`Graphs::capturing`] says whether a stream key is capturing, and in which
//!   graph and lane. After `graph_end` the capture's events count as never recorded.
//! - **Bodies.** A captured op (`launch`, `copy`, `memset`, `event_record`, `event_wait` on a
//!   capturing stream) does not run: it becomes a [`BodyOp`] of the graph, in trace order, with its
//!   lane, its trace op index and its regions resolved to [`Span`]s at capture (a captured kernel
//!   holds pointers, not names: a replay touches those bytes whatever happened to the names).
//!   A captured `event_record` fills a *slot* of the graph; a captured `event_wait` names the slot
//!   it waits for (`None`: an event never recorded, no effect).
//! - **Replays.** Each lane `c` of graph `G` is the participant `G/c`: on the simulator, a stream
//!   of its own ([`Graph::participants`], made at the first launch), kept from launch to launch.
//!   A `graph_launch` of `G` on `S` runs the body in order on those participants: each lane's first
//!   op of the launch follows everything issued on `S` before the launch and the whole previous
//!   launch of `G` (CUDA runs one launch of a graph at a time), captured records and waits order
//!   the lanes among each other, and work issued on `S` after the launch waits for every lane.
//! - **Pools.** Device memory allocated on a capturing stream comes from the capture's pool
//!   ([`crate::alloc::GraphPools`]): an arena of its own with the device allocator's rules, whose
//!   segments lie in the device address space above every earlier segment
//!   ([`Backend::next_device_segment`](super::Backend::next_device_segment)), so two graphs that
//!   share a pool get overlapping temporaries exactly as the checker's model says. A free of a pool
//!   buffer returns its block to the pool (a buffer with `record_stream` streams is held back until
//!   no capture of the pool is underway): nothing is freed on the device, and the graph's replays
//!   keep accessing the bytes. An `alloc` with `pool` outside a capture takes its block from
//!   that pool the same way (and is a pool buffer like the capture's), but it runs.

use std::collections::HashMap;

use super::backend::{EventKey, Fence, Span, StreamKey};
use crate::alloc::{GraphPools, PoolIndex};
use crate::trace::Id;

/// What a captured op does when replayed.
#[derive(Clone, Debug)]
pub(crate) enum BodyKind {
    /// The hash kernel of the captured op over these regions.
    Launch {
        /// The regions it reads.
        reads: Vec<Span>,
        /// The regions it writes.
        writes: Vec<Span>,
        /// `record_stream` fences of the memory it touches (at capture).
        fences: Vec<Fence>,
    },
    /// A copy.
    Copy {
        /// The source.
        src: Span,
        /// The destination.
        dst: Span,
        /// As for a launch.
        fences: Vec<Fence>,
    },
    /// A memset with the captured op's word.
    Memset {
        /// The destination.
        dst: Span,
        /// As for a launch.
        fences: Vec<Fence>,
    },
    /// A captured `event_record`: fills slot `.0` of the graph.
    Record(usize),
    /// A captured `event_wait` on a slot (`None`: on an event never recorded; no effect).
    Wait(Option<usize>),
}

/// One captured op.
#[derive(Clone, Debug)]
pub(crate) struct BodyOp {
    /// Its op index in the trace.
    pub(crate) op: usize,
    /// Its lane: the index of its stream among the capture's streams, the origin first.
    pub(crate) lane: usize,
    /// What it does.
    pub(crate) kind: BodyKind,
}

/// One graph: captured or being captured.
#[derive(Clone, Debug)]
pub(crate) struct Graph {
    /// Its name.
    #[allow(dead_code)] // for the GPU runner's messages
    pub(crate) name: Id,
    /// Its pool.
    pub(crate) pool: PoolIndex,
    /// Whether the capture ended (the graph can be launched).
    pub(crate) ended: bool,
    /// The capture's streams (program stream keys), the origin first.
    pub(crate) lanes: Vec<StreamKey>,
    /// The captured ops, in trace order.
    pub(crate) body: Vec<BodyOp>,
    /// Captured records so far.
    pub(crate) slots: usize,
    /// The replay participants `G/c`, one backend stream per lane (made at the first launch).
    pub(crate) participants: Vec<StreamKey>,
    /// Launches so far.
    pub(crate) launches: u64,
}

/// The graphs of a program run. See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Graphs {
    by_name: HashMap<Id, usize>,
    pub(crate) graphs: Vec<Graph>,
    /// Capturing streams: the graph and the lane.
    capturing: HashMap<StreamKey, (usize, usize)>,
    /// Events whose latest record was captured, while their capture is underway: graph and slot.
    events: HashMap<EventKey, (usize, usize)>,
    /// Pools by name (a graph's default pool is named after the graph).
    pool_names: HashMap<Id, PoolIndex>,
    /// The pools' arenas (model addresses in the device address space).
    pub(crate) pools: GraphPools,
}

/// What a stream op on a capturing stream becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Captured {
    /// The graph.
    pub(crate) graph: usize,
    /// The lane of the op's stream.
    pub(crate) lane: usize,
}

impl Graphs {
    /// Whether any capture is underway.
    pub(crate) fn any_capturing(&self) -> bool {
        !self.capturing.is_empty()
    }

    /// The graph and lane stream `s` is capturing in, if it is.
    pub(crate) fn capturing(&self, s: StreamKey) -> Option<Captured> {
        self.capturing
            .get(&s)
            .map(|&(graph, lane)| Captured { graph, lane })
    }

    /// The pool of the capture stream `s` is capturing in, if it is.
    pub(crate) fn capture_pool(&self, s: StreamKey) -> Option<PoolIndex> {
        self.capturing(s).map(|c| self.graphs[c.graph].pool)
    }

    /// The graph named `name`.
    pub(crate) fn by_name(&self, name: &Id) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// `graph_begin` of `graph` on `origin`, with `pool` (by default named after the graph).
    pub(crate) fn begin(
        &mut self,
        graph: &Id,
        origin: StreamKey,
        pool: Option<&Id>,
    ) -> Result<usize, String> {
        if self.by_name.contains_key(graph) {
            return Err(format!("graph {graph} is captured a second time"));
        }
        if self.capturing.contains_key(&origin) {
            return Err(format!(
                "graph {graph} begins on a stream that is already capturing"
            ));
        }
        let pool = self.pool_or_add(pool.unwrap_or(graph));
        self.pools.begin_capture(pool);
        let g = self.graphs.len();
        self.graphs.push(Graph {
            name: graph.clone(),
            pool,
            ended: false,
            lanes: vec![origin],
            body: Vec::new(),
            slots: 0,
            participants: Vec::new(),
            launches: 0,
        });
        self.by_name.insert(graph.clone(), g);
        self.capturing.insert(origin, (g, 0));
        Ok(g)
    }

    /// `graph_end` of `graph`.
    pub(crate) fn end(&mut self, graph: &Id) -> Result<usize, String> {
        let g = match self.by_name.get(graph) {
            Some(&g) if !self.graphs[g].ended => g,
            _ => return Err(format!("graph {graph} is not being captured")),
        };
        self.graphs[g].ended = true;
        self.capturing.retain(|_, &mut (h, _)| h != g);
        self.events.retain(|_, &mut (h, _)| h != g);
        self.pools.end_capture(self.graphs[g].pool);
        Ok(g)
    }

    /// Adds a captured access to the body of `c.graph`.
    pub(crate) fn capture(&mut self, c: Captured, op: usize, kind: BodyKind) {
        self.graphs[c.graph].body.push(BodyOp {
            op,
            lane: c.lane,
            kind,
        });
    }

    /// An `event_record` of `event` on stream `s`: captured (true) when `s` is capturing, else
    /// the event's latest record is no longer a captured one.
    pub(crate) fn record(&mut self, op: usize, event: EventKey, s: StreamKey) -> bool {
        match self.capturing(s) {
            Some(c) => {
                let graph = &mut self.graphs[c.graph];
                let slot = graph.slots;
                graph.slots += 1;
                self.events.insert(event, (c.graph, slot));
                self.capture(c, op, BodyKind::Record(slot));
                true
            }
            None => {
                self.events.remove(&event);
                false
            }
        }
    }

    /// An `event_wait` of stream `s` on `event`: captured (true) when `s` is capturing, or joins
    /// the capture the event's latest record was captured in.
    pub(crate) fn wait(&mut self, op: usize, s: StreamKey, event: EventKey) -> bool {
        let slot = self.events.get(&event).copied();
        match (self.capturing(s), slot) {
            (Some(c), slot) => {
                let slot = slot.filter(|&(h, _)| h == c.graph).map(|(_, k)| k);
                self.capture(c, op, BodyKind::Wait(slot));
                true
            }
            (None, Some((g, slot))) => {
                let lane = self.graphs[g].lanes.len();
                self.graphs[g].lanes.push(s);
                self.capturing.insert(s, (g, lane));
                self.capture(Captured { graph: g, lane }, op, BodyKind::Wait(Some(slot)));
                true
            }
            (None, None) => false,
        }
    }

    /// The pool named `name`, if a capture or an allocation named it.
    pub(crate) fn pool(&self, name: &Id) -> Option<PoolIndex> {
        self.pool_names.get(name).copied()
    }

    /// The pool named `name`, made now (empty) if nothing named it yet.
    pub(crate) fn pool_or_add(&mut self, name: &Id) -> PoolIndex {
        let pools = &mut self.pools;
        *self
            .pool_names
            .entry(name.clone())
            .or_insert_with(|| pools.add())
    }

    /// The pool an allocation of device memory owned by `owner` comes from: the capture's when
    /// `owner` is capturing (`named`, if given, must be that pool), else the pool `named`, if
    /// given (made now if nothing named it yet). `Ok(None)`: the plain device allocator.
    pub(crate) fn alloc_pool(
        &mut self,
        owner: StreamKey,
        named: Option<&Id>,
    ) -> Result<Option<PoolIndex>, String> {
        match (self.capture_pool(owner), named) {
            (Some(c), Some(name)) if self.pool(name) != Some(c) => Err(format!(
                "an allocation into pool {name} on a stream that captures into another pool"
            )),
            (Some(c), _) => Ok(Some(c)),
            (None, Some(name)) => Ok(Some(self.pool_or_add(name))),
            (None, None) => Ok(None),
        }
    }
}

/// The numbering of replayed ops: a program's replayed body ops are numbered after its own ops,
/// in issue order (the `k`-th replayed op of a run is op `program.len() + k`), so that schedulers
/// and outcomes name every replayed op of every launch apart. `ops[k]` is (launch op, captured
/// op) of replayed op `program.len() + k`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayNumbering {
    /// The program's length: the first replayed op's number.
    pub first: usize,
    /// By replayed op: (the `graph_launch` op, the captured op it replays).
    pub ops: Vec<(usize, usize)>,
}

impl ReplayNumbering {
    /// The number of the replay of captured op `captured` by launch `launch`.
    pub fn id(&self, launch: usize, captured: usize) -> Option<usize> {
        self.ops
            .iter()
            .position(|&x| x == (launch, captured))
            .map(|k| self.first + k)
    }

    /// (launch op, captured op) of op number `id`, if it is a replayed op.
    pub fn of(&self, id: usize) -> Option<(usize, usize)> {
        id.checked_sub(self.first)
            .and_then(|k| self.ops.get(k).copied())
    }

    /// The op a scheduler's op number stands for in the trace: a replayed op's launch, else
    /// itself.
    pub fn trace_op(&self, id: usize) -> usize {
        self.of(id).map_or(id, |(l, _)| l)
    }
}

/// The numbering of `program`'s replayed ops (see [`ReplayNumbering`]), as a run issues them:
/// each `graph_launch` of a captured graph numbers its body's ops in body order.
pub fn replay_numbering<'a>(program: &'a [crate::trace::TraceOp]) -> ReplayNumbering {
    use crate::trace::Op;
    let mut streams: HashMap<&Id, StreamKey> = HashMap::new();
    let mut events: HashMap<&Id, EventKey> = HashMap::new();
    let mut graphs = Graphs::default();
    let mut out = ReplayNumbering {
        first: program.len(),
        ops: Vec::new(),
    };
    let none = Span::default();
    for (i, t) in program.iter().enumerate() {
        let mut key = |id: &'a Id| -> StreamKey {
            let n = streams.len() as StreamKey + 1;
            *streams.entry(id).or_insert(n)
        };
        match &t.op {
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => {
                let s = key(stream);
                let _ = graphs.begin(graph, s, pool.as_ref());
            }
            Op::GraphEnd { graph } => {
                let _ = graphs.end(graph);
            }
            Op::GraphLaunch { graph, .. } => {
                if let Some(g) = graphs.by_name(graph).filter(|&g| graphs.graphs[g].ended) {
                    out.ops
                        .extend(graphs.graphs[g].body.iter().map(|b| (i, b.op)));
                }
            }
            Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
                let s = key(stream);
                if let Some(c) = graphs.capturing(s) {
                    graphs.capture(
                        c,
                        i,
                        BodyKind::Memset {
                            dst: none,
                            fences: Vec::new(),
                        },
                    );
                }
            }
            Op::EventRecord { event, stream } => {
                let s = key(stream);
                let n = events.len() as EventKey;
                let e = *events.entry(event).or_insert(n);
                graphs.record(i, e, s);
            }
            Op::EventWait { stream, event } => {
                let s = key(stream);
                let n = events.len() as EventKey;
                let e = *events.entry(event).or_insert(n);
                graphs.wait(i, s, e);
            }
            _ => {}
        }
    }
    out
}
