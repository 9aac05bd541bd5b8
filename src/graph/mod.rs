//! The stream-dependency graph: ops as nodes, happens-before edges between them; explanations of
//! hazards, and pictures of them.
//!
//! [`DepGraph`] takes a trace's ops, in order, after a [`Checker`](crate::Checker) found its
//! hazards. Each op becomes a node on its lane (the host, or its stream); edges are the order of
//! the happens-before rules: stream order, host order, the host's issue of stream work (rule 2),
//! event records captured by waits and syncs (rule 3), host syncs (rule 4) and the legacy default
//! stream's implicit edges (rule 5), plus `record_stream`, which orders a free after a stream's
//! work for the allocator.
//!
//! Alongside the graph, each lane keeps its *provenance*: for every other lane, the latest of its
//! ops known to happen before the lane's current point, and the synchronization op through which
//! that became known. When the walk reaches a hazard's op, this says what synchronization each
//! side did have and what edge is missing (the `explain` module).
//!
//! Memory stays bounded on long traces: the graph keeps only the ops of the hazards (their op,
//! their conflicting accesses, the synchronization their explanations name), each lane's latest
//! op, each event's current record, the ops the provenance refers to, and a window of recent
//! ops; every other node is removed as the walk goes on.

use std::collections::BTreeSet;
use std::sync::Arc;

use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::report::{latest_by_participant, AccessKind, Hazard, Report};
use crate::trace::{Id, Op, Region, TraceOp, DEFAULT_STREAM, HOST};

mod draw;
mod explain;
mod know;
pub mod picture;
pub mod render;

pub use picture::{
    Edge, EdgeKind, Lane, Node, Picture, PictureHazard, PictureReplay, PictureSync, ReplayOp, Role,
};
pub use render::{render_dot, render_html};

/// Knobs of the graph.
#[derive(Clone, Debug)]
pub struct GraphConfig {
    /// Recent ops kept besides the ones the hazards need (context for pictures).
    pub window: u64,
    /// Traces of at most this many ops are drawn whole.
    pub draw_whole: u64,
    /// At most this many hazards are drawn (each with its neighbourhood); all are explained.
    pub max_drawn_hazards: usize,
}

impl Default for GraphConfig {
    fn default() -> Self {
        GraphConfig {
            window: 64,
            draw_whole: 400,
            max_drawn_hazards: 100,
        }
    }
}

/// Sizes of the graph, for the memory figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphStats {
    /// Ops taken.
    pub ops: u64,
    /// Nodes kept now.
    pub nodes: usize,
    /// Edges kept now.
    pub edges: usize,
    /// The most nodes kept at once.
    pub peak_nodes: usize,
    /// The most edges kept at once.
    pub peak_edges: usize,
    /// Lanes (the host and the streams).
    pub lanes: usize,
    /// Nodes of the lanes' and events' provenance tries now (each shared node once).
    pub know_nodes: usize,
}

/// One op, as a node.
#[derive(Clone, Debug)]
struct OpNode {
    op: u64,
    lane: usize,
    op_name: &'static str,
    label: Arc<str>,
    accesses: Vec<String>,
    site: Option<String>,
}

/// How a lane came to know of another lane's work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum How {
    /// Its own ops.
    #[default]
    Own,
    /// An `event_wait`, `event_sync` or successful `event_query` of an event's record.
    Event,
    /// A `stream_sync`, `device_sync` or successful `stream_query`.
    HostSync,
    /// An implicit edge of the legacy default stream.
    Legacy,
    /// The device synchronization of an `alloc` whose memory came back from another stream.
    Implicit,
}

/// What a lane knows of another lane: the latest op of it that happens before the lane's current
/// point, and how that became known. It carries its own description, so that explanations do
/// not need the nodes it names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Prov {
    /// The latest known op of the other lane.
    upto: Option<u64>,
    /// The synchronization op that brought it (a wait, a host sync, a legacy-stream op).
    via: Option<u64>,
    /// Where that synchronization took it from (the event's record, the synced stream's op).
    from: Option<u64>,
    /// What kind of synchronization `via` is.
    how: How,
    /// `via`'s label (`wait e`, `stream_sync s1`).
    label: Option<Arc<str>>,
    /// Whether `via` is an op of the host.
    on_host: bool,
}

use know::{ArrivalRec as Arrival, Know};

#[derive(Clone, Debug)]
struct LaneState {
    name: String,
    device: u64,
    blocking: bool,
    last: Option<u64>,
    /// The latest `event_record` on this lane: (op, event).
    last_record: Option<(u64, Id)>,
    /// What this lane knows of every lane, by lane index.
    know: Know,
    /// The host op whose issue edge into this lane was drawn last.
    issued_from: Option<u64>,
    /// Per lane: its op whose legacy edge into this lane was drawn last.
    legacy_from: HashMap<usize, u64>,
}

impl LaneState {
    fn new(name: &str, device: u64, blocking: bool) -> Self {
        LaneState {
            name: name.to_string(),
            device,
            blocking,
            last: None,
            last_record: None,
            know: Know::default(),
            issued_from: None,
            legacy_from: HashMap::default(),
        }
    }
}

#[derive(Clone, Debug)]
struct Capture {
    op: u64,
    know: Know,
}

const HOST_LANE: usize = 0;
const DEFAULT_LANE: usize = 1;

/// The stream-dependency graph of a trace, built op by op. See the [module docs](self).
pub struct DepGraph {
    cfg: GraphConfig,
    g: StableGraph<OpNode, (EdgeKind, Option<Id>)>,
    nodes: HashMap<u64, NodeIndex>,
    lanes: Vec<LaneState>,
    lane_of: HashMap<Id, usize>,
    events: HashMap<Id, Capture>,
    /// Ops kept for the hazards.
    pins: HashSet<u64>,
    /// The hazards, their ops, and what has been explained.
    hazards: Vec<Hazard>,
    next_hazard: usize,
    why: Vec<Vec<String>>,
    /// Ops the explanations name (drawn with the hazards).
    named: Vec<Vec<u64>>,
    prune_at: usize,
    pruned: bool,
    stats: GraphStats,
    /// (op, device) of the implicit device synchronizations, in op order; see
    /// [`Checker::implicit_syncs`](crate::Checker::implicit_syncs).
    implicit: std::collections::VecDeque<(u64, u64)>,
    /// Live allocated buffers with their owner (device memory) and the `record_stream`s named
    /// for them so far.
    recorded: HashMap<Id, Recorded>,
    /// The frees that reuse races name, with the `record_stream`s the freed buffer had.
    reuse_frees: HashMap<u64, Vec<RecordedStream>>,
    /// The lanes capturing a graph now, with the graph.
    capturing: HashMap<usize, Id>,
    /// The events whose latest record was captured, with its graph.
    captured_events: HashMap<Id, Id>,
    /// The `graph_launch`es the hazards name: op → (launch lane, graph).
    launches: HashMap<u64, (usize, Id)>,
    /// The captured ops of each graph whose launches the hazards name (or may: every graph
    /// whose capture is underway), in body order.
    bodies: HashMap<Id, Vec<BodyNode>>,
}

/// A captured op, as a replay's box draws it.
#[derive(Clone, Debug)]
struct BodyNode {
    captured: u64,
    stream: String,
    label: Arc<str>,
    accesses: Vec<String>,
}

/// A live buffer's owning stream (device memory) and its `record_stream`s.
#[derive(Clone, Debug, Default)]
struct Recorded {
    owner: Option<String>,
    streams: Vec<RecordedStream>,
}

/// One `record_stream` of a buffer: its op, the stream, and that stream's latest op then.
#[derive(Clone, Debug)]
pub(crate) struct RecordedStream {
    op: u64,
    stream: String,
    last: Option<u64>,
}

impl DepGraph {
    /// A graph for a trace whose check gave `report`: its hazards are explained as the walk
    /// reaches them, and the ops they need are kept.
    pub fn new(report: &Report, cfg: GraphConfig) -> Self {
        let mut pins = HashSet::default();
        let reuse_frees = report
            .hazards
            .iter()
            .filter(|h| h.kind == crate::report::HazardKind::ReuseRace)
            .filter_map(|h| h.free.as_ref().map(|f| (f.op, Vec::new())))
            .collect();
        for h in report.hazards.iter().take(cfg.max_drawn_hazards) {
            pins.insert(h.op);
            pins.extend(h.conflicts.iter().map(|c| c.op));
            pins.extend(h.free.as_ref().map(|f| f.op));
        }
        let mut lane_of = HashMap::default();
        lane_of.insert(Id::from(HOST), HOST_LANE);
        lane_of.insert(Id::from(DEFAULT_STREAM), DEFAULT_LANE);
        DepGraph {
            cfg,
            g: StableGraph::new(),
            nodes: HashMap::default(),
            lanes: vec![
                LaneState::new(HOST, 0, false),
                LaneState::new(DEFAULT_STREAM, 0, true),
            ],
            lane_of,
            events: HashMap::default(),
            pins,
            why: vec![Vec::new(); report.hazards.len()],
            named: vec![Vec::new(); report.hazards.len()],
            hazards: report.hazards.clone(),
            next_hazard: 0,
            prune_at: 4096,
            pruned: false,
            stats: GraphStats::default(),
            implicit: Default::default(),
            recorded: HashMap::default(),
            reuse_frees,
            capturing: HashMap::default(),
            captured_events: HashMap::default(),
            launches: HashMap::default(),
            bodies: HashMap::default(),
        }
    }

    /// The implicit device synchronizations of the trace (from the checker of the first walk).
    pub fn with_implicit_syncs(mut self, syncs: &[(u64, u64)]) -> Self {
        self.implicit = syncs.iter().copied().collect();
        self
    }

    /// Sizes of the graph.
    pub fn stats(&self) -> GraphStats {
        let mut seen = HashSet::default();
        let know = self.lanes.iter().map(|l| &l.know);
        let know_nodes = know
            .chain(self.events.values().map(|c| &c.know))
            .map(|k| k.nodes(&mut seen))
            .sum();
        GraphStats {
            nodes: self.g.node_count(),
            edges: self.g.edge_count(),
            lanes: self.lanes.len(),
            know_nodes,
            ..self.stats
        }
    }

    fn lane(&mut self, name: &Id) -> usize {
        if let Some(&l) = self.lane_of.get(name) {
            return l;
        }
        let l = self.lanes.len();
        self.lanes.push(LaneState::new(name.as_str(), 0, false));
        self.lane_of.insert(name.clone(), l);
        l
    }

    fn edge(&mut self, from: Option<u64>, to: u64, kind: EdgeKind, label: Option<&Id>) {
        let (Some(from), Some(&b)) = (from, self.nodes.get(&to)) else {
            return;
        };
        if let Some(&a) = self.nodes.get(&from) {
            if a != b {
                self.g.add_edge(a, b, (kind, label.cloned()));
            }
        }
    }

    /// Whether op `op` (on `lane`) is captured: it does not run, and its stream keeps no order
    /// from it (trace format, "CUDA graphs"). Tracks which lanes capture which graph.
    fn capture(&mut self, lane: usize, op: &Op) -> bool {
        match op {
            Op::GraphBegin { graph, stream, .. } => {
                let l = self.lane(stream);
                self.capturing.insert(l, graph.clone());
                false
            }
            Op::GraphEnd { graph } => {
                self.capturing.retain(|_, g| g != graph);
                // Its captured events count as never recorded.
                self.captured_events.retain(|_, g| g != graph);
                false
            }
            Op::Launch { .. } | Op::Copy { .. } | Op::Memset { .. } | Op::EventRecord { .. } => {
                let Some(graph) = self.capturing.get(&lane).cloned() else {
                    if let Op::EventRecord { event, .. } = op {
                        self.captured_events.remove(event);
                    }
                    return false;
                };
                if let Op::EventRecord { event, .. } = op {
                    self.events.remove(event);
                    self.captured_events.insert(event.clone(), graph);
                }
                true
            }
            Op::EventWait { event, .. } => {
                if self.capturing.contains_key(&lane) {
                    return true;
                }
                // A wait on a captured event joins the capture.
                match self.captured_events.get(event).cloned() {
                    Some(graph) => {
                        self.capturing.insert(lane, graph);
                        true
                    }
                    None => false,
                }
            }
            _ => false,
        }
    }

    /// Takes op `index` of the trace.
    pub fn add(&mut self, index: u64, op: &TraceOp) {
        let (lane, label, accesses) = self.describe(op);
        let captured = self.capture(lane, &op.op);
        let label = if captured {
            format!("captured {label}")
        } else {
            label
        };
        let label: Arc<str> = Arc::from(label);
        let node = self.g.add_node(OpNode {
            op: index,
            lane,
            op_name: op.op.name(),
            label: label.clone(),
            accesses,
            site: op.site.as_ref().map(|s| s.to_string()),
        });
        self.nodes.insert(index, node);
        self.track_record_streams(index, &op.op);
        if let Op::GraphLaunch { graph, .. } = &op.op {
            if self.pins.contains(&index) {
                self.launches.insert(index, (lane, graph.clone()));
            }
        }
        if captured {
            // Drawn on its stream's lane, with no edge: it runs only in the graph's replays.
            if let Some(graph) = self.capturing.get(&lane) {
                self.bodies
                    .entry(graph.clone())
                    .or_default()
                    .push(BodyNode {
                        captured: index,
                        stream: self.lanes[lane].name.clone(),
                        label: Arc::from(label.strip_prefix("captured ").unwrap_or(&label)),
                        accesses: self.g[node].accesses.clone(),
                    });
            }
        } else if lane == HOST_LANE {
            self.host_op(index, &op.op, &label);
        } else {
            self.stream_op(index, lane, &op.op, &label);
        }
        self.explain_hazards_at(index, op);
        self.stats.ops = index + 1;
        self.stats.peak_nodes = self.stats.peak_nodes.max(self.g.node_count());
        self.stats.peak_edges = self.stats.peak_edges.max(self.g.edge_count());
        if self.g.node_count() > self.prune_at {
            self.prune(index);
        }
    }

    /// Keeps, for the frees that reuse races name, the `record_stream`s of the freed buffer:
    /// which streams the allocator waited for, up to which op, before handing its memory out
    /// again.
    fn track_record_streams(&mut self, i: u64, op: &Op) {
        match op {
            Op::Alloc {
                buffer,
                stream,
                memory,
                ..
            } => {
                let owner = (*memory == crate::trace::MemoryKind::Device).then(|| {
                    stream
                        .as_ref()
                        .map_or(DEFAULT_STREAM.to_string(), |s| s.to_string())
                });
                self.recorded.insert(
                    buffer.clone(),
                    Recorded {
                        owner,
                        streams: Vec::new(),
                    },
                );
            }
            Op::RecordStream { buffer, stream } => {
                let last = self
                    .lane_index(stream.as_str())
                    .and_then(|l| self.lanes[l].last);
                if let Some(r) = self.recorded.get_mut(buffer) {
                    if r.owner.as_deref() != Some(stream.as_str()) {
                        r.streams.push(RecordedStream {
                            op: i,
                            stream: stream.to_string(),
                            last,
                        });
                    }
                }
            }
            Op::Free { buffer, .. } => {
                let streams = self.recorded.remove(buffer).map(|r| r.streams);
                if let (Some(slot), Some(streams)) = (self.reuse_frees.get_mut(&i), streams) {
                    *slot = streams;
                }
            }
            _ => {}
        }
    }

    /// The `record_stream`s the buffer freed at op `free` had, if a reuse race names that free.
    fn recorded_at_free(&self, free: u64) -> &[RecordedStream] {
        self.reuse_frees.get(&free).map_or(&[], |v| v.as_slice())
    }

    /// The lane, label and access lines of an op.
    fn describe(&mut self, op: &TraceOp) -> (usize, String, Vec<String>) {
        let region = |verb: &str, r: &Region| match r.bytes {
            Some(b) => format!(
                "{verb} {}[{}, {})",
                r.buffer,
                r.offset,
                r.offset.saturating_add(b)
            ),
            None if r.offset == 0 => format!("{verb} {}", r.buffer),
            None => format!("{verb} {}[{}, end)", r.buffer, r.offset),
        };
        match &op.op {
            Op::Launch {
                stream,
                name,
                reads,
                writes,
            } => {
                let mut acc: Vec<String> = writes.iter().map(|r| region("writes", r)).collect();
                acc.extend(reads.iter().map(|r| region("reads", r)));
                let label = match name {
                    Some(n) => format!("launch {n}"),
                    None => "launch".to_string(),
                };
                (self.lane(stream), label, acc)
            }
            Op::Copy { stream, src, dst } => (
                self.lane(stream),
                "copy".into(),
                vec![region("reads", src), region("writes", dst)],
            ),
            Op::Memset { stream, dst } => (
                self.lane(stream),
                "memset".into(),
                vec![region("writes", dst)],
            ),
            Op::EventRecord { event, stream } => {
                (self.lane(stream), format!("record {event}"), vec![])
            }
            Op::EventWait { stream, event } => (self.lane(stream), format!("wait {event}"), vec![]),
            Op::Free {
                buffer,
                stream: Some(s),
            } => (self.lane(s), format!("free {buffer} (async)"), vec![]),
            Op::Free {
                buffer,
                stream: None,
            } => (HOST_LANE, format!("free {buffer}"), vec![]),
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                pool,
                ..
            } => {
                let mut on = match (memory, stream) {
                    (crate::trace::MemoryKind::Device, Some(s)) => format!(" on {s}"),
                    (crate::trace::MemoryKind::Device, None) => " on default".to_string(),
                    (m, _) => format!(" ({})", m.as_str()),
                };
                if let Some(p) = pool {
                    on.push_str(&format!(" from pool {p}"));
                }
                (
                    HOST_LANE,
                    format!("alloc {buffer}{on}"),
                    vec![format!("{bytes} bytes")],
                )
            }
            Op::RecordStream { buffer, stream } => {
                self.lane(stream);
                (
                    HOST_LANE,
                    format!("record_stream({buffer}, {stream})"),
                    vec![],
                )
            }
            Op::HostRead { buffer } => {
                (HOST_LANE, "host_read".into(), vec![region("reads", buffer)])
            }
            Op::HostWrite { buffer } => (
                HOST_LANE,
                "host_write".into(),
                vec![region("writes", buffer)],
            ),
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                let l = self.lane(stream);
                if l != DEFAULT_LANE && self.lanes[l].last.is_none() {
                    self.lanes[l].device = *device;
                    self.lanes[l].blocking = *blocking;
                }
                (HOST_LANE, format!("stream_create {stream}"), vec![])
            }
            Op::EventCreate { event } => (HOST_LANE, format!("event_create {event}"), vec![]),
            Op::EventDestroy { event } => (HOST_LANE, format!("event_destroy {event}"), vec![]),
            Op::EventSync { event } => (HOST_LANE, format!("event_sync {event}"), vec![]),
            Op::EventQuery { event, complete } => (
                HOST_LANE,
                format!(
                    "event_query {event} ({})",
                    if *complete { "complete" } else { "busy" }
                ),
                vec![],
            ),
            Op::StreamSync { stream } => {
                self.lane(stream);
                (HOST_LANE, format!("stream_sync {stream}"), vec![])
            }
            Op::StreamQuery { stream, complete } => {
                self.lane(stream);
                (
                    HOST_LANE,
                    format!(
                        "stream_query {stream} ({})",
                        if *complete { "complete" } else { "busy" }
                    ),
                    vec![],
                )
            }
            Op::DeviceSync { device } => (HOST_LANE, format!("device_sync {device}"), vec![]),
            // Graphs: the launch is an op on its stream, which the replay follows and joins at
            // its end; captured ops are drawn on their streams' lanes, with no edge.
            Op::GraphBegin { graph, stream, .. } => {
                self.lane(stream);
                (
                    HOST_LANE,
                    format!("graph_begin {graph} on {stream}"),
                    vec![],
                )
            }
            Op::GraphEnd { graph } => (HOST_LANE, format!("graph_end {graph}"), vec![]),
            Op::GraphLaunch { graph, stream } => {
                (self.lane(stream), format!("graph_launch {graph}"), vec![])
            }
        }
    }

    fn is_legacy_partner(&self, lane: usize) -> bool {
        lane != HOST_LANE
            && lane != DEFAULT_LANE
            && self.lanes[lane].blocking
            && self.lanes[lane].device == 0
    }

    /// Rules 2, 5 and 3 for an op on a stream lane.
    fn stream_op(&mut self, i: u64, lane: usize, op: &Op, label: &Arc<str>) {
        let prev = self.lanes[lane].last;
        self.edge(prev, i, EdgeKind::Stream, None);
        // Rule 2: the host's work before the issue.
        let host_last = self.lanes[HOST_LANE].last;
        if host_last.is_some() && host_last != self.lanes[lane].issued_from {
            self.edge(host_last, i, EdgeKind::Issue, None);
            self.lanes[lane].issued_from = host_last;
        }
        let host_know = self.lanes[HOST_LANE].know.clone();
        self.lanes[lane].know.join(&host_know, None);
        // Rule 5: the legacy default stream.
        let partners: Vec<usize> = if lane == DEFAULT_LANE {
            (0..self.lanes.len())
                .filter(|&l| self.is_legacy_partner(l))
                .collect()
        } else if self.is_legacy_partner(lane) {
            vec![DEFAULT_LANE]
        } else {
            vec![]
        };
        for p in partners {
            let Some(last) = self.lanes[p].last else {
                continue;
            };
            if self.lanes[lane].legacy_from.get(&p) != Some(&last) {
                self.edge(Some(last), i, EdgeKind::Legacy, None);
                self.lanes[lane].legacy_from.insert(p, last);
            }
            let mut src = self.lanes[p].know.clone();
            src.set_own(p, last);
            let arrival = Arc::new(Arrival {
                via: i,
                from: Some(last),
                how: How::Legacy,
                label: label.clone(),
                on_host: false,
            });
            self.lanes[lane].know.join(&src, Some(&arrival));
        }
        self.set_own(lane, i);
        match op {
            Op::EventRecord { event, .. } => {
                self.lanes[lane].last_record = Some((i, event.clone()));
                let know = self.lanes[lane].know.clone();
                self.events.insert(event.clone(), Capture { op: i, know });
            }
            Op::EventWait { event, .. } => self.wait_event(i, lane, event, label),
            _ => {}
        }
        self.lanes[lane].last = Some(i);
    }

    /// Rules 3 and 4: `lane` (a stream's `event_wait`, or the host's `event_sync` or successful
    /// `event_query`) at op `i` waits for the event's capture, if it was recorded.
    fn wait_event(&mut self, i: u64, lane: usize, event: &Id, label: &Arc<str>) {
        let Some(c) = self.events.get(event) else {
            return;
        };
        let (from, know) = (c.op, c.know.clone());
        self.edge(Some(from), i, EdgeKind::Event, Some(event));
        let arrival = Arc::new(Arrival {
            via: i,
            from: Some(from),
            how: How::Event,
            label: label.clone(),
            on_host: lane == HOST_LANE,
        });
        self.lanes[lane].know.join(&know, Some(&arrival));
    }

    fn set_own(&mut self, lane: usize, i: u64) {
        self.lanes[lane].know.set_own(lane, i);
    }

    /// Rule 4 and host order for an op of the host.
    fn host_op(&mut self, i: u64, op: &Op, label: &Arc<str>) {
        let prev = self.lanes[HOST_LANE].last;
        self.edge(prev, i, EdgeKind::Host, None);
        let mut synced: Vec<usize> = Vec::new();
        match op {
            Op::HostRead { .. } | Op::HostWrite { .. } => self.set_own(HOST_LANE, i),
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => self.wait_event(i, HOST_LANE, event, label),
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let l = self.lane(stream);
                synced.push(l);
                if l == DEFAULT_LANE {
                    synced.extend((0..self.lanes.len()).filter(|&p| self.is_legacy_partner(p)));
                }
            }
            Op::DeviceSync { device } => {
                synced.extend((1..self.lanes.len()).filter(|&l| self.lanes[l].device == *device));
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.events.remove(event);
            }
            Op::RecordStream { stream, .. } => {
                let l = self.lane(stream);
                let last = self.lanes[l].last;
                self.edge(last, i, EdgeKind::RecordStream, None);
            }
            _ => {}
        }
        let mut how = How::HostSync;
        if self.implicit.front().is_some_and(|&(op, _)| op == i) {
            if let Some((_, device)) = self.implicit.pop_front() {
                how = How::Implicit;
                synced.extend((1..self.lanes.len()).filter(|&l| self.lanes[l].device == device));
            }
        }
        for l in synced {
            let Some(last) = self.lanes[l].last else {
                continue;
            };
            self.edge(Some(last), i, EdgeKind::HostSync, None);
            let src = self.lanes[l].know.clone();
            let arrival = Arc::new(Arrival {
                via: i,
                from: Some(last),
                how,
                label: label.clone(),
                on_host: true,
            });
            self.lanes[HOST_LANE].know.join(&src, Some(&arrival));
        }
        self.lanes[HOST_LANE].last = Some(i);
    }

    /// Explains the hazards reported at op `i` (the walk has just taken it).
    fn explain_hazards_at(&mut self, i: u64, op: &TraceOp) {
        while let Some(h) = self.hazards.get(self.next_hazard) {
            if h.op > i {
                break;
            }
            let k = self.next_hazard;
            self.next_hazard += 1;
            if h.op < i {
                continue;
            }
            let (why, named) = explain::explain(self, h, op);
            if k < self.cfg.max_drawn_hazards {
                self.pins.extend(named.iter().copied());
            }
            self.why[k] = why;
            self.named[k] = named;
        }
    }

    /// What `participant` knows, as the hazard's op sees it: its lane's provenance, joined with
    /// the host's (which every op on a stream and every free joins).
    fn knowledge(&self, participant: &str) -> Know {
        let lane = self.lane_index(participant);
        let mut know = lane.map(|l| self.lanes[l].know.clone()).unwrap_or_default();
        if lane != Some(HOST_LANE) {
            know.join(&self.lanes[HOST_LANE].know, None);
        }
        know
    }

    fn lane_index(&self, participant: &str) -> Option<usize> {
        self.lane_of.get(&Id::from(participant)).copied()
    }

    fn node(&self, op: u64) -> Option<&OpNode> {
        self.nodes.get(&op).map(|&n| &self.g[n])
    }

    /// Removes the nodes nothing needs any more.
    fn prune(&mut self, now: u64) {
        let mut keep: HashSet<u64> = HashSet::default();
        let mut seen = HashSet::default();
        for lane in &self.lanes {
            keep.extend(lane.last);
            keep.extend(lane.last_record.as_ref().map(|r| r.0));
            keep.extend(lane.issued_from);
            // The ops the provenance names (each shared node once; what tags override is kept
            // too, which only keeps more).
            lane.know.ops(&mut seen, &mut |op| {
                keep.insert(op);
            });
        }
        let horizon = now.saturating_sub(self.cfg.window);
        let gone: Vec<(u64, NodeIndex)> = self
            .nodes
            .iter()
            .filter(|(op, _)| **op < horizon && !keep.contains(op) && !self.pins.contains(op))
            .map(|(&op, &n)| (op, n))
            .collect();
        if !gone.is_empty() {
            self.pruned = true;
        }
        for (op, n) in gone {
            self.g.remove_node(n);
            self.nodes.remove(&op);
        }
        self.prune_at = (2 * self.g.node_count()).max(4096);
    }

    /// Whether op `a` happens before op `b` through the kept graph: a path of happens-before
    /// edges (all but `record_stream`'s) from one to the other (`None` if either is not kept). Allocations and frees are the host's nodes
    /// here, as the host issues them.
    pub fn reaches(&self, a: u64, b: u64) -> Option<bool> {
        let (&x, &y) = (self.nodes.get(&a)?, self.nodes.get(&b)?);
        // record_stream orders the allocator's reuse, nothing else.
        let hb = petgraph::visit::EdgeFiltered::from_fn(&self.g, |e| {
            e.weight().0 != EdgeKind::RecordStream
        });
        Some(petgraph::algo::has_path_connecting(&hb, x, y, None))
    }

    /// The explanations, one list of lines per hazard of the report, in report order.
    pub fn explanations(&self) -> &[Vec<String>] {
        &self.why
    }

    /// Ends the walk: the report's hazards with their explanations (in `detail.why`), and the
    /// picture of the graph around them.
    pub fn finish(self, report: &mut Report, title: &str) -> Picture {
        for (h, why) in report.hazards.iter_mut().zip(&self.why) {
            h.detail.why = why.clone();
        }
        self.picture(report, title)
    }
}

/// A verb for an access kind, for explanations.
fn did(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Read => "read",
        AccessKind::Write => "wrote",
        AccessKind::Alloc => "was handed",
        AccessKind::Free => "freed",
    }
}

/// Why a trace could not be walked a second time to explain its report.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The trace could not be read again (the first read had accepted it).
    #[error(transparent)]
    Read(#[from] crate::trace::ParseError),
    /// The trace read again is not the trace that was checked.
    #[error("{name}: the trace changed while it was read ({checked} ops checked, then {read})")]
    Changed {
        /// The trace's name.
        name: String,
        /// Ops the check saw.
        checked: u64,
        /// Ops read the second time.
        read: u64,
    },
}

/// The second walk of a check: reads the trace `reader` (named `name`) again through the
/// dependency graph, explains the hazards of `report` (its check) and returns the picture.
/// `implicit` are the checker's [`implicit_syncs`](crate::Checker::implicit_syncs); `progress`
/// gets the ops walked so far, every 65,536 ops. The CLI's `check`, the Python binding and
/// [`explain_program`] all walk through here.
pub fn explain_trace<R: std::io::BufRead>(
    reader: R,
    name: &str,
    report: &mut Report,
    implicit: &[(u64, u64)],
    mut progress: impl FnMut(u64),
) -> Result<Picture, ExplainError> {
    let mut graph = DepGraph::new(report, GraphConfig::default()).with_implicit_syncs(implicit);
    let mut reader = crate::trace::TraceReader::new(reader, name.to_string());
    let mut index = 0u64;
    while let Some((op, _)) = reader.next_op()? {
        graph.add(index, &op);
        index += 1;
        if index % 65_536 == 0 {
            progress(index);
        }
    }
    if index != report.ops {
        return Err(ExplainError::Changed {
            name: name.to_string(),
            checked: report.ops,
            read: index,
        });
    }
    let stats = graph.stats();
    tracing::info!(
        ops = stats.ops,
        peak_nodes = stats.peak_nodes,
        peak_edges = stats.peak_edges,
        nodes = stats.nodes,
        edges = stats.edges,
        lanes = stats.lanes,
        "dependency graph"
    );
    Ok(graph.finish(report, name))
}

/// Builds the graph of a program held in memory, explains its report's hazards and draws it.
/// `implicit` are the checker's [`implicit_syncs`](crate::Checker::implicit_syncs).
pub fn explain_program(
    program: &[TraceOp],
    report: &mut Report,
    implicit: &[(u64, u64)],
    title: &str,
) -> Picture {
    let mut g = DepGraph::new(report, GraphConfig::default()).with_implicit_syncs(implicit);
    for (i, op) in program.iter().enumerate() {
        g.add(i as u64, op);
    }
    g.finish(report, title)
}
