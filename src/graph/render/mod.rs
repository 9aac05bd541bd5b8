//! Renderers of a [`Picture`]: Graphviz DOT ([`render_dot`]) and one self-contained HTML page
//! ([`render_html`]).
//!
//! Both draw the same thing: one lane per participant (the host first, then the streams), the
//! drawn ops as boxes in issue order, the edges styled by kind, and the hazards highlighted (the
//! hazard's op red, its conflicting accesses orange, its missing edge dashed red). Both are
//! deterministic and accept any [`Picture`]: a node on a lane that does not exist, a second node
//! of the same op, an edge to an op that is not drawn or a hazard index out of range is skipped.

use std::collections::BTreeMap;

use super::picture::{Edge, EdgeKind, Node, Picture, PictureHazard, PictureSync, Role};

mod dot;
mod html;

pub use dot::render_dot;
pub use html::render_html;

/// How one kind of edge is drawn, in both formats.
struct EdgeStyle {
    /// The kind's name: the CSS class of the HTML page (`"host-sync"`).
    name: &'static str,
    /// What the legend says.
    legend: &'static str,
    /// The stroke colour.
    color: &'static str,
    /// The line: `"solid"`, `"dashed"` or `"dotted"` (Graphviz style names).
    line: &'static str,
    /// The stroke width, in Graphviz pen widths (SVG pixels in the page).
    width: f64,
}

/// Every edge kind, in legend order.
const EDGE_KINDS: [EdgeKind; 9] = [
    EdgeKind::Stream,
    EdgeKind::Host,
    EdgeKind::Issue,
    EdgeKind::Event,
    EdgeKind::HostSync,
    EdgeKind::Legacy,
    EdgeKind::RecordStream,
    EdgeKind::Elided,
    EdgeKind::Missing,
];

/// The grey of plain order edges.
const GREY: &str = "#7a7a7a";
/// The red of hazards and missing edges.
const RED: &str = "#d62728";

fn edge_style(kind: EdgeKind) -> EdgeStyle {
    let (name, legend, color, line, width) = match kind {
        EdgeKind::Stream => ("stream", "stream order", GREY, "solid", 1.0),
        EdgeKind::Host => ("host", "host order", GREY, "solid", 1.0),
        EdgeKind::Issue => (
            "issue",
            "issue: host work before a stream op",
            "#a0a0a0",
            "dotted",
            1.0,
        ),
        EdgeKind::Event => (
            "event",
            "event: record → wait / sync",
            "#1f6fd1",
            "solid",
            1.5,
        ),
        EdgeKind::HostSync => ("host-sync", "host sync", "#2e8b3a", "solid", 1.5),
        EdgeKind::Legacy => ("legacy", "legacy default stream", "#e07b00", "solid", 1.5),
        EdgeKind::RecordStream => (
            "record-stream",
            "record_stream: the free waits (allocator order)",
            "#8a3fb5",
            "dashed",
            1.5,
        ),
        EdgeKind::Elided => (
            "elided",
            "order through ops not drawn",
            "#a0a0a0",
            "dotted",
            1.0,
        ),
        EdgeKind::Missing => (
            "missing",
            "missing synchronization (the fix)",
            RED,
            "dashed",
            2.0,
        ),
    };
    EdgeStyle {
        name,
        legend,
        color,
        line,
        width,
    }
}

/// Box colours by role: (fill, border).
const HAZARD_FILL: (&str, &str) = ("#fbd0d0", "#c62828");
const CONFLICT_FILL: (&str, &str) = ("#ffe0b2", "#e07b00");
const CONTEXT_FILL: (&str, &str) = ("#ffffff", "#8c8c8c");

/// What a renderer may draw of a picture: the valid nodes in issue order, their columns, and the
/// edges between them.
struct Drawn<'a> {
    pic: &'a Picture,
    /// The nodes on existing lanes, sorted by op index, one per op.
    nodes: Vec<&'a Node>,
    /// Op index → position in `nodes` (the node's column).
    column: BTreeMap<u64, usize>,
    /// The edges whose ends are both drawn, in the picture's order.
    edges: Vec<&'a Edge>,
    /// Per hazard: the drawn op indices it involves (its op and its conflicting accesses).
    hazard_ops: Vec<Vec<u64>>,
}

impl<'a> Drawn<'a> {
    fn new(pic: &'a Picture) -> Drawn<'a> {
        let mut nodes: Vec<&Node> = pic
            .nodes
            .iter()
            .filter(|n| n.lane < pic.lanes.len())
            .collect();
        nodes.sort_by_key(|n| n.op);
        nodes.dedup_by_key(|n| n.op);
        let column: BTreeMap<u64, usize> =
            nodes.iter().enumerate().map(|(i, n)| (n.op, i)).collect();
        let edges = pic
            .edges
            .iter()
            .filter(|e| column.contains_key(&e.from) && column.contains_key(&e.to))
            .collect();
        let mut hazard_ops: Vec<Vec<u64>> = pic
            .hazards
            .iter()
            .map(|h| {
                std::iter::once(h.op)
                    .chain(h.conflicts.iter().copied())
                    .collect()
            })
            .collect();
        for n in &nodes {
            for &h in n.hazards.iter().chain(&n.conflicts) {
                if let Some(ops) = hazard_ops.get_mut(h) {
                    ops.push(n.op);
                }
            }
        }
        for ops in &mut hazard_ops {
            ops.retain(|op| column.contains_key(op));
            ops.sort_unstable();
            ops.dedup();
        }
        Drawn {
            pic,
            nodes,
            column,
            edges,
            hazard_ops,
        }
    }

    /// The hazards (indices) an op is involved in, ascending.
    fn hazards_of(&self, op: u64) -> Vec<usize> {
        (0..self.hazard_ops.len())
            .filter(|&h| self.hazard_ops[h].binary_search(&op).is_ok())
            .collect()
    }

    /// The hazards (indices) an op is reported at, ascending.
    fn reported_at(&self, node: &Node) -> Vec<usize> {
        (0..self.pic.hazards.len())
            .filter(|&h| self.pic.hazards[h].op == node.op || node.hazards.contains(&h))
            .collect()
    }

    /// The hazards (valid indices) a missing edge would fix.
    fn fixes(&self, edge: &Edge) -> Vec<usize> {
        let mut v: Vec<usize> = edge
            .hazards
            .iter()
            .copied()
            .filter(|&h| h < self.pic.hazards.len())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The text an edge is labelled with, if any.
    /// The analysis's verdict on op `op`, where it is a drawn synchronization op.
    fn sync_of(&self, op: u64) -> Option<&'a PictureSync> {
        self.pic.syncs.iter().find(|s| s.op == op)
    }

    /// The verdict on the synchronization op an edge leads into: event, host-sync and
    /// record_stream edges end at the op that synchronizes.
    fn sync_edge(&self, edge: &Edge) -> Option<&'a PictureSync> {
        match edge.kind {
            EdgeKind::Event | EdgeKind::HostSync | EdgeKind::RecordStream => self.sync_of(edge.to),
            _ => None,
        }
    }

    fn edge_label(&self, edge: &Edge) -> Option<String> {
        match edge.kind {
            EdgeKind::Missing => Some(missing_label(
                self.fixes(edge).into_iter().map(|h| &self.pic.hazards[h]),
            )),
            EdgeKind::Elided => Some("…".to_string()),
            _ => edge.label.clone().filter(|l| !l.is_empty()),
        }
    }
}

/// `"missing: fixes data-race at op 5"` (several hazards joined with `", "`).
fn missing_label<'h>(hazards: impl Iterator<Item = &'h PictureHazard>) -> String {
    let mut fixes: Vec<String> = Vec::new();
    for h in hazards {
        let s = format!("{} at op {}", h.kind, h.op);
        if !fixes.contains(&s) {
            fixes.push(s);
        }
    }
    if fixes.is_empty() {
        "missing".to_string()
    } else {
        format!("missing: fixes {}", fixes.join(", "))
    }
}

/// The colours of a node's box: (fill, border).
fn node_colors(node: &Node) -> (&'static str, &'static str) {
    match node.role {
        Role::Hazard => HAZARD_FILL,
        Role::Conflict => CONFLICT_FILL,
        Role::Context => CONTEXT_FILL,
    }
}

/// `"1 op"`, `"2 ops"`.
fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("{n} {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Pictures built by hand for the renderers' tests.

    use proptest::prelude::*;

    use crate::graph::picture::*;
    use crate::report::{HazardKind, Severity};

    /// Compares `value` with an insta snapshot file's contents (`snap`: the file's text, header
    /// and all), as `insta::assert_snapshot!` does, for test executables that run away from the
    /// source tree.
    pub(crate) fn assert_embedded_snapshot(snap: &str, value: &str) {
        let body = snap
            .strip_prefix("---\n")
            .and_then(|rest| rest.split_once("\n---\n"))
            .map(|(_, body)| body)
            .expect("an insta snapshot file: a --- header, then the contents");
        let normalize = |s: &str| s.replace("\r\n", "\n").trim_end().to_owned();
        assert!(
            normalize(body) == normalize(value),
            "the value differs from the embedded snapshot:\n{value}"
        );
    }

    fn node(op: u64, lane: usize, op_name: &'static str, label: &str, accesses: &[&str]) -> Node {
        Node {
            op,
            lane,
            op_name,
            label: label.to_string(),
            accesses: accesses.iter().map(|s| s.to_string()).collect(),
            site: None,
            role: Role::Context,
            hazards: vec![],
            conflicts: vec![],
        }
    }

    fn edge(from: u64, to: u64, kind: EdgeKind) -> Edge {
        Edge {
            from,
            to,
            kind,
            label: None,
            hazards: vec![],
        }
    }

    /// Host and two streams, six ops: `s1` writes `x`, records `e1`, `s2` waits on `e1` and reads
    /// `x`, then `s2` writes `x` again while `s1` reads it without an event: a data race at op 5
    /// whose missing edge runs from op 4.
    pub(crate) fn small() -> Picture {
        let mut nodes = vec![
            node(0, 0, "alloc", "alloc x", &["alloc x[0, 4096)"]),
            node(1, 1, "launch", "launch fill", &["writes x[0, 4096)"]),
            node(2, 1, "event_record", "record e1", &[]),
            node(3, 2, "event_wait", "wait e1", &[]),
            node(4, 1, "launch", "launch scale", &["reads x[0, 4096)"]),
            node(5, 2, "launch", "launch sum", &["writes x[0, 4096)"]),
        ];
        nodes[1].site = Some("train.py:10".to_string());
        nodes[4].role = Role::Conflict;
        nodes[4].conflicts = vec![0];
        nodes[4].site = Some("train.py:14".to_string());
        nodes[5].role = Role::Hazard;
        nodes[5].hazards = vec![0];
        nodes[5].site = Some("train.py:15 <- main.py:3".to_string());
        let mut event = edge(2, 3, EdgeKind::Event);
        event.label = Some("e1".to_string());
        let mut missing = edge(4, 5, EdgeKind::Missing);
        missing.hazards = vec![0];
        Picture {
            title: "small.jsonl".to_string(),
            ops: 6,
            lanes: vec![
                Lane {
                    name: "host".to_string(),
                    description: "host".to_string(),
                },
                Lane {
                    name: "s1".to_string(),
                    description: "stream, device 0, non-blocking".to_string(),
                },
                Lane {
                    name: "s2".to_string(),
                    description: "stream, device 0, non-blocking".to_string(),
                },
            ],
            nodes,
            edges: vec![
                edge(0, 1, EdgeKind::Issue),
                edge(1, 2, EdgeKind::Stream),
                event,
                edge(2, 4, EdgeKind::Stream),
                edge(3, 5, EdgeKind::Stream),
                missing,
            ],
            hazards: vec![PictureHazard {
                kind: HazardKind::DataRace,
                severity: Severity::Error,
                op: 5,
                buffer: Some("x".to_string()),
                title: "data race on x: write-after-read".to_string(),
                why: vec![
                    "op 4 (s1) reads x[0, 4096)".to_string(),
                    "op 5 (s2) writes x[0, 4096); s2 last synchronized with s1 at op 3 (wait e1)"
                        .to_string(),
                ],
                fix: Some(
                    "record an event on s1 after op 4 and make s2 wait on it before op 5"
                        .to_string(),
                ),
                conflicts: vec![4],
            }],
            elided: 0,
            syncs: vec![],
            replays: vec![],
        }
    }

    /// [`small`] with hostile names: a stream `<script>alert(1)</script>`, a kernel `a"b\c`, an
    /// event `<x>`, a buffer `&amp;` and a site with a newline.
    pub(crate) fn hostile() -> Picture {
        let mut pic = small();
        pic.title = "<b>trace</b> \"quoted\".jsonl".to_string();
        pic.lanes[2].name = "<script>alert(1)</script>".to_string();
        pic.nodes[4].label = "launch a\"b\\c".to_string();
        pic.nodes[1].site = Some("line one\nline two".to_string());
        pic.edges[2].label = Some("<x>".to_string());
        pic.hazards[0].buffer = Some("&amp;".to_string());
        pic.hazards[0]
            .why
            .push("a\"b\\c read <x> & wrote 'y'".to_string());
        pic
    }

    /// A picture that breaks every rule: lanes out of range, duplicate ops, edges to ops that are
    /// not drawn, hazard indices out of range, no lanes at all for some nodes.
    pub(crate) fn broken() -> Picture {
        let mut pic = small();
        pic.nodes.push(node(9, 7, "launch", "nowhere", &[]));
        pic.nodes.push(node(3, 1, "launch", "duplicate", &[]));
        pic.nodes[2].hazards = vec![42];
        pic.nodes[3].conflicts = vec![usize::MAX];
        pic.edges.push(edge(5, 9, EdgeKind::Stream));
        pic.edges.push(edge(100, 1, EdgeKind::Event));
        let mut m = edge(1, 5, EdgeKind::Missing);
        m.hazards = vec![0, 3, usize::MAX];
        pic.edges.push(m);
        pic.edges.push(edge(5, 1, EdgeKind::Legacy));
        pic.edges.push(edge(4, 4, EdgeKind::Stream));
        pic.hazards[0].conflicts.push(1000);
        pic.hazards[0].op = u64::MAX;
        pic.elided = 3;
        pic
    }

    /// A longer picture for looking at the layout: [`rounds_of`] with eight rounds.
    pub(crate) fn rounds() -> Picture {
        rounds_of(8)
    }

    /// Host, the legacy default stream and two streams; `n` rounds of produce (s1) → event →
    /// consume (s2) → free with `record_stream`; round 3 forgets the wait (a data race), round 5
    /// ends with a host sync on the default stream; every round skips two ops that are not drawn.
    pub(crate) fn rounds_of(n: u64) -> Picture {
        let mut pic = Picture {
            title: "rounds.jsonl".to_string(),
            lanes: vec![
                Lane {
                    name: "host".to_string(),
                    description: "host".to_string(),
                },
                Lane {
                    name: "default".to_string(),
                    description: "legacy default stream".to_string(),
                },
                Lane {
                    name: "s1".to_string(),
                    description: "stream, device 0, non-blocking".to_string(),
                },
                Lane {
                    name: "communication_stream".to_string(),
                    description: "stream, device 0, non-blocking".to_string(),
                },
            ],
            ..Picture::default()
        };
        let mut op = 0;
        let mut prev: [Option<u64>; 4] = [None; 4];
        let mut push = |pic: &mut Picture,
                        op: &mut u64,
                        lane: usize,
                        name: &'static str,
                        label: String,
                        acc: Vec<String>| {
            let mut n = node(*op, lane, name, &label, &[]);
            n.accesses = acc;
            n.site = Some(format!("train.py:{}", 10 + *op));
            pic.nodes.push(n);
            if let Some(p) = prev[lane] {
                let kind = if lane == 0 {
                    EdgeKind::Host
                } else {
                    EdgeKind::Stream
                };
                let kind = if *op - p > 3 { EdgeKind::Elided } else { kind };
                pic.edges.push(edge(p, *op, kind));
            }
            prev[lane] = Some(*op);
            *op += 1;
            *op - 1
        };
        for r in 0..n {
            let b = format!("grad{r}");
            let a = push(
                &mut pic,
                &mut op,
                0,
                "alloc",
                format!("alloc {b}"),
                vec![format!("alloc {b}[0, 1048576)")],
            );
            let w = push(
                &mut pic,
                &mut op,
                2,
                "launch",
                format!("launch backward_{r}"),
                vec![
                    format!("writes {b}[0, 1048576)"),
                    "reads act".to_string(),
                    "reads weights".to_string(),
                    "writes scratch".to_string(),
                ],
            );
            pic.edges.push(edge(a, w, EdgeKind::Issue));
            let rec = push(
                &mut pic,
                &mut op,
                2,
                "event_record",
                format!("record ready{r}"),
                vec![],
            );
            let wait = if r != 3 {
                let wait = push(
                    &mut pic,
                    &mut op,
                    3,
                    "event_wait",
                    format!("wait ready{r}"),
                    vec![],
                );
                let mut e = edge(rec, wait, EdgeKind::Event);
                e.label = Some(format!("ready{r}"));
                pic.edges.push(e);
                Some(wait)
            } else {
                None
            };
            let reduce = push(
                &mut pic,
                &mut op,
                3,
                "launch",
                "launch all_reduce".to_string(),
                vec![format!("reads {b}[0, 1048576)")],
            );
            let rs = push(
                &mut pic,
                &mut op,
                0,
                "record_stream",
                format!("record_stream {b}"),
                vec![],
            );
            let free = push(
                &mut pic,
                &mut op,
                0,
                "free",
                format!("free {b}"),
                vec![format!("free {b}")],
            );
            let mut e = edge(reduce, free, EdgeKind::RecordStream);
            e.label = None;
            pic.edges.push(e);
            let _ = rs;
            if r == 3 {
                let h = pic.hazards.len();
                pic.hazards.push(PictureHazard {
                    kind: HazardKind::DataRace,
                    severity: Severity::Error,
                    op: reduce,
                    buffer: Some(b.clone()),
                    title: format!("data race on {b}: read-after-write"),
                    why: vec![
                        format!("op {w} (s1) writes {b}[0, 1048576)"),
                        format!("op {reduce} (communication_stream) reads {b}[0, 1048576) with no event after op {w}"),
                    ],
                    fix: Some(format!("record an event on s1 after op {w} and make communication_stream wait on it before op {reduce}")),
                    conflicts: vec![w],
                });
                let mut m = edge(w, reduce, EdgeKind::Missing);
                m.hazards = vec![h];
                pic.edges.push(m);
                let n = pic.nodes.iter_mut().find(|n| n.op == reduce).unwrap();
                n.role = Role::Hazard;
                n.hazards = vec![h];
                let n = pic.nodes.iter_mut().find(|n| n.op == w).unwrap();
                n.role = Role::Conflict;
                n.conflicts = vec![h];
            }
            if r == 5 {
                let l = push(
                    &mut pic,
                    &mut op,
                    1,
                    "launch",
                    "launch log_metrics".to_string(),
                    vec!["reads loss".to_string()],
                );
                pic.edges.push(edge(free, l, EdgeKind::Issue));
                pic.edges.push(edge(reduce, l, EdgeKind::Legacy));
                let s = push(
                    &mut pic,
                    &mut op,
                    0,
                    "stream_sync",
                    "sync default".to_string(),
                    vec![],
                );
                pic.edges.push(edge(l, s, EdgeKind::HostSync));
            }
            let _ = wait;
            op += 2;
        }
        pic.hazards.push(PictureHazard {
            kind: HazardKind::WaitOnUnrecordedEvent,
            severity: Severity::Warning,
            op: 1000,
            buffer: None,
            title: "wait on event never recorded: late".to_string(),
            why: vec![],
            fix: None,
            conflicts: vec![],
        });
        pic.ops = op + 40;
        pic.elided = op + 40 - pic.nodes.len() as u64;
        pic
    }

    /// Text with the characters that need escaping in DOT and HTML (no `:`, so no addresses).
    fn arb_text() -> impl Strategy<Value = String> {
        "[a-z0-9<>&\"'\\/ \n\r\t\u{0}é…#{}\\[\\];=-]{0,12}"
    }

    /// Any picture: lane indices, ops, edges and hazard indices in and out of range, duplicates,
    /// edges backwards and to themselves.
    pub(crate) fn arb_picture() -> impl Strategy<Value = Picture> {
        let kind = prop::sample::select(super::EDGE_KINDS.to_vec());
        let role = prop::sample::select(vec![Role::Context, Role::Hazard, Role::Conflict]);
        let small = || prop::collection::vec(0usize..6, 0..3);
        let node = (
            0u64..24,
            0usize..6,
            arb_text(),
            prop::collection::vec(arb_text(), 0..5),
            prop::option::of(arb_text()),
            role,
            small(),
            small(),
        )
            .prop_map(
                |(op, lane, label, accesses, site, role, hazards, conflicts)| Node {
                    op,
                    lane,
                    op_name: "launch",
                    label,
                    accesses,
                    site,
                    role,
                    hazards,
                    conflicts,
                },
            );
        let edge = (
            0u64..26,
            0u64..26,
            kind,
            prop::option::of(arb_text()),
            small(),
        )
            .prop_map(|(from, to, kind, label, hazards)| Edge {
                from,
                to,
                kind,
                label,
                hazards,
            });
        let hazard = (
            prop::sample::select(HazardKind::ALL.to_vec()),
            0u64..26,
            prop::option::of(arb_text()),
            arb_text(),
            prop::collection::vec(arb_text(), 0..3),
            prop::option::of(arb_text()),
            prop::collection::vec(0u64..26, 0..3),
        )
            .prop_map(
                |(kind, op, buffer, title, why, fix, conflicts)| PictureHazard {
                    kind,
                    severity: kind.severity(),
                    op,
                    buffer,
                    title,
                    why,
                    fix,
                    conflicts,
                },
            );
        let lane =
            (arb_text(), arb_text()).prop_map(|(name, description)| Lane { name, description });
        (
            arb_text(),
            0u64..40,
            prop::collection::vec(lane, 0..5),
            prop::collection::vec(node, 0..16),
            prop::collection::vec(edge, 0..24),
            prop::collection::vec(hazard, 0..4),
            0u64..30,
        )
            .prop_map(
                |(title, ops, lanes, nodes, edges, hazards, elided)| Picture {
                    title,
                    ops,
                    lanes,
                    nodes,
                    edges,
                    hazards,
                    elided,
                    syncs: vec![],
                    replays: vec![],
                },
            )
    }

    #[test]
    fn embedded_snapshots_compare_the_contents_only() {
        let snap = "---\nsource: src/x.rs\nexpression: v\n---\nline 1\nline 2\n";
        assert_embedded_snapshot(snap, "line 1\nline 2");
        assert_embedded_snapshot(snap, "line 1\r\nline 2\n");
        let differs = std::panic::catch_unwind(|| assert_embedded_snapshot(snap, "line 1\nline 3"));
        assert!(differs.is_err(), "a different value must fail");
    }

    /// Writes the sample pictures as `<name>.dot` and `<name>.html` into the directory
    /// `$STREAMSAN_PICTURE_DIR` when it is set, to look at them with `dot` or a browser.
    #[test]
    fn write_samples() {
        let Some(dir) = std::env::var_os("STREAMSAN_PICTURE_DIR") else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, pic) in [
            ("small", small()),
            ("hostile", hostile()),
            ("broken", broken()),
            ("rounds", rounds()),
            ("many", rounds_of(60)),
        ] {
            std::fs::write(dir.join(format!("{name}.dot")), super::render_dot(&pic)).unwrap();
            std::fs::write(dir.join(format!("{name}.html")), super::render_html(&pic)).unwrap();
        }
    }
}
