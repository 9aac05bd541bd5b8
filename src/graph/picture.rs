//! A drawable view of the stream-dependency graph: lanes (the host and each stream), ops as boxes
//! in issue order, synchronization edges, and the hazards with their accesses and missing edges.
//!
//! [`Picture`] is what the renderers draw (`--format dot`, `--format html`); the graph builder
//! ([`super`]) produces it. It names ops by their op index, which is unique in a trace.

use serde::Serialize;

use crate::report::{HazardKind, Severity};

/// A drawable view of the dependency graph around a trace's hazards.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Picture {
    /// What was checked: the trace's file name.
    pub title: String,
    /// Number of ops in the trace.
    pub ops: u64,
    /// Lanes, top to bottom: the host first, then the legacy default stream (when it has a
    /// drawn op), then the streams in order of first appearance (a stream only with a drawn op).
    pub lanes: Vec<Lane>,
    /// The ops drawn, sorted by op index (issue order). Ops far from every hazard of a long trace
    /// are left out; `elided` counts them.
    pub nodes: Vec<Node>,
    /// Edges between drawn ops (by op index), plus the missing edges of the hazards.
    pub edges: Vec<Edge>,
    /// The hazards, in report order.
    pub hazards: Vec<PictureHazard>,
    /// Number of ops of the trace that are not drawn.
    pub elided: u64,
    /// With the synchronization analysis (`check --syncs`): the verdicts on the drawn
    /// synchronization ops, by op index. Their incoming sync edges are drawn grey when
    /// redundant, and say what they prevent when needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syncs: Vec<PictureSync>,
    /// The replays of CUDA graphs that the hazards name, each drawn as a box on its launch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replays: Vec<PictureReplay>,
}

/// The verdict of the synchronization analysis on one drawn synchronization op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PictureSync {
    /// Its op index.
    pub op: u64,
    /// Whether the program's memory safety needs it.
    pub needed: bool,
    /// What it prevents, one line each (`"data-race on b at op 7"`).
    pub prevents: Vec<String>,
}

/// One lane of the picture: the host or a stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lane {
    /// `"host"` or the stream's name.
    pub name: String,
    /// A short description: `"host"`, `"stream, device 0, non-blocking"`, `"legacy default stream"`.
    pub description: String,
}

/// What role an op plays in the hazards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Context only.
    Context,
    /// The op of at least one hazard (where it is reported).
    Hazard,
    /// An earlier access that conflicts with a hazard's op.
    Conflict,
}

/// One op, drawn as a box on its lane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Node {
    /// The op index.
    pub op: u64,
    /// Index into [`Picture::lanes`].
    pub lane: usize,
    /// The op's name in the trace format (`"launch"`, `"event_record"`, …).
    pub op_name: &'static str,
    /// A short label for the box: `"launch fill"`, `"record e1"`, `"wait e1"`, `"free x"`.
    pub label: String,
    /// The accesses, one short line each: `"writes x[0, 4096)"`, `"reads y"`.
    pub accesses: Vec<String>,
    /// The op's site, as given (a stack is joined with `" <- "`).
    pub site: Option<String>,
    /// The strongest role the op plays.
    pub role: Role,
    /// Indices into [`Picture::hazards`] of the hazards this op is reported at.
    pub hazards: Vec<usize>,
    /// Indices into [`Picture::hazards`] of the hazards this op is a conflicting access of.
    pub conflicts: Vec<usize>,
}

/// The kinds of edge of the dependency graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EdgeKind {
    /// Issue order of the ops of one stream.
    Stream,
    /// Host order: one host op after another.
    Host,
    /// Rule 2: what the host did before issuing an op on a stream happens before it.
    Issue,
    /// An `event_record` captured by an `event_wait` (a stream) or `event_sync` (the host).
    Event,
    /// A host sync (`stream_sync`, `device_sync`, a successful query) waiting for a stream's work.
    HostSync,
    /// An implicit edge of the legacy default stream.
    Legacy,
    /// `record_stream`: the free waits for the named stream's work (allocator order, not a clock
    /// edge for later ops).
    RecordStream,
    /// Order through ops that are not drawn.
    Elided,
    /// The synchronization a hazard lacks: from its latest conflicting op on a participant to
    /// the hazard's op. Drawn dashed.
    Missing,
}

/// One edge, between two drawn ops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Edge {
    /// Op index of the source.
    pub from: u64,
    /// Op index of the target.
    pub to: u64,
    /// What kind of order it is.
    pub kind: EdgeKind,
    /// A label: the event's name for event edges, otherwise `None`.
    pub label: Option<String>,
    /// For missing edges: the indices into [`Picture::hazards`] it would fix.
    pub hazards: Vec<usize>,
}

/// A hazard, as the picture's side list shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PictureHazard {
    /// Its kind.
    pub kind: HazardKind,
    /// Error or warning.
    pub severity: Severity,
    /// The op it is reported at.
    pub op: u64,
    /// The buffer, if any.
    pub buffer: Option<String>,
    /// One line: what happened (the text report's title).
    pub title: String,
    /// Why: the conflicting accesses, the last synchronization each side had, the missing edge.
    pub why: Vec<String>,
    /// The fix, in one sentence.
    pub fix: Option<String>,
    /// Op indices of the conflicting accesses.
    pub conflicts: Vec<u64>,
}

/// A replay of a CUDA graph, drawn as a box on its `graph_launch`: the lanes of its body (the
/// participants `G/c`, one per captured stream) with the captured ops the replay runs, entered
/// from the launch and joining the launch stream at its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PictureReplay {
    /// The `graph_launch` op.
    pub launch: u64,
    /// The graph.
    pub graph: String,
    /// The body's lanes, `G/c`, in the order their streams joined the capture.
    pub lanes: Vec<String>,
    /// The captured ops, in body order.
    pub ops: Vec<ReplayOp>,
}

/// One captured op of a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayOp {
    /// Its lane, an index into [`PictureReplay::lanes`].
    pub lane: usize,
    /// The captured op's index in the trace.
    pub captured: u64,
    /// Its label (`launch k`, `record e`).
    pub label: String,
    /// Its accesses, one line each.
    pub accesses: Vec<String>,
    /// The hazards whose access is this op's replay.
    pub hazards: Vec<usize>,
    /// The hazards with a conflict that is this op's replay.
    pub conflicts: Vec<usize>,
}
