//! The Graphviz DOT renderer: `streamsan check --format dot trace.jsonl | dot -Tsvg > graph.svg`.
//!
//! Lanes are clusters (`cluster_<lane>`), laid out as rows from the top (the host first) by
//! invisible anchor nodes in one rank; ops are boxes `op<N>`, kept in issue order left to right by
//! invisible edges between consecutive drawn ops, so each op has its own column.

use std::fmt::Write as _;

use super::{edge_style, node_colors, plural, Drawn, EdgeKind, Picture, GREY};

/// Renders `pic` as a Graphviz `digraph` (left to right, one cluster per lane).
///
/// The output is deterministic: the same picture gives the same text.
pub fn render_dot(pic: &Picture) -> String {
    let d = Drawn::new(pic);
    let mut out = String::new();
    let mut header = format!("{}\n{}", pic.title, plural(pic.ops, "op"));
    if pic.elided > 0 {
        header.push_str(&format!(", {} not drawn", plural(pic.elided, "op")));
    }
    let (errors, warnings) = pic
        .hazards
        .iter()
        .fold((0u64, 0u64), |(e, w), h| match h.severity {
            crate::report::Severity::Error => (e + 1, w),
            crate::report::Severity::Warning => (e, w + 1),
        });
    header.push_str(&format!(
        ", {}, {}",
        plural(errors, "error"),
        plural(warnings, "warning")
    ));

    out.push_str("digraph streamsan {\n");
    let _ = writeln!(
        out,
        "  graph [rankdir=LR, newrank=true, labelloc=t, fontname=\"Helvetica\", fontsize=14, \
         nodesep=0.3, ranksep=0.35, label={}];",
        quote(&header)
    );
    out.push_str(
        "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10, \
         margin=\"0.12,0.06\"];\n",
    );
    out.push_str(&format!(
        "  edge [fontname=\"Helvetica\", fontsize=9, color=\"{GREY}\", arrowsize=0.7];\n"
    ));

    // One cluster per lane, with invisible anchors at both ends that keep the rows in order.
    for (i, lane) in pic.lanes.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_{i} {{");
        let _ = writeln!(
            out,
            "    label={}; tooltip={}; labeljust=l; style=\"rounded\"; color=\"#c8c8c8\"; \
             fontsize=12;",
            quote(&lane.name),
            quote(&lane.description)
        );
        for anchor in ["", "_b", "_end", "_end_b"] {
            let _ = writeln!(out, "    lane{i}{anchor} [{INVISIBLE}];");
        }
        for n in d.nodes.iter().filter(|n| n.lane == i) {
            let mut label = format!("op {}\n{}", n.op, n.label);
            for a in &n.accesses {
                label.push('\n');
                label.push_str(a);
            }
            let mut tooltip = format!("op {} on {}", n.op, lane.name);
            if let Some(site) = &n.site {
                tooltip.push_str(&format!("\nsite: {site}"));
            }
            for h in d.reported_at(n) {
                let hz = &pic.hazards[h];
                tooltip.push_str(&format!("\nhazard {h}: {} {}", hz.kind, hz.title));
            }
            let (fill, border) = node_colors(n);
            let pen = if border == super::CONTEXT_FILL.1 {
                "1"
            } else {
                "2"
            };
            let _ = writeln!(
                out,
                "    op{} [label={}, tooltip={}, fillcolor=\"{fill}\", color=\"{border}\", penwidth={pen}];",
                n.op,
                quote(&label),
                quote(&tooltip)
            );
        }
        out.push_str("  }\n");
    }

    scaffold(&mut out, &d);
    replays(&mut out, &d);

    for e in &d.edges {
        let s = edge_style(e.kind);
        let mut attrs = vec![format!("color=\"{}\"", s.color)];
        if s.line != "solid" {
            attrs.push(format!("style={}", s.line));
        }
        if s.width != 1.0 {
            attrs.push(format!("penwidth={}", s.width));
        }
        if let Some(label) = d.edge_label(e) {
            attrs.push(format!("label={}", quote(&label)));
            attrs.push(format!("fontcolor=\"{}\"", s.color));
        }
        match e.kind {
            // In-lane order keeps the rows straight.
            EdgeKind::Stream | EdgeKind::Host => attrs.push("weight=10".to_string()),
            EdgeKind::Missing => attrs.push(format!("tooltip={}", quote(&missing_tooltip(&d, e)))),
            _ => {}
        }
        // The invisible issue-order chain decides the columns; real edges only draw.
        attrs.push("constraint=false".to_string());
        let _ = writeln!(out, "  op{} -> op{} [{}];", e.from, e.to, attrs.join(", "));
    }
    out.push_str("}\n");
    out
}

/// An invisible point.
/// The colour of a replay's box and of its entry and exit edges.
const REPLAY: &str = "#6a4fb3";

/// Each replay as a box (`subgraph cluster`) holding its body's lanes `G/c`, each with its
/// captured ops in body order; an edge from the launch into each lane's first op, and from each
/// lane's last op back to the launch stream's next drawn op (the replay joins its launch stream
/// at its end).
fn replays(out: &mut String, d: &Drawn<'_>) {
    for r in &d.pic.replays {
        let n = r.launch;
        let _ = writeln!(out, "  subgraph cluster_replay_{n} {{");
        let _ = writeln!(
            out,
            "    label={}; labeljust=l; style=\"rounded,dashed\"; color=\"{REPLAY}\"; fontcolor=\"{REPLAY}\"; fontsize=11;",
            quote(&format!("replay of {} (graph_launch at op {n})", r.graph))
        );
        for (j, lane) in r.lanes.iter().enumerate() {
            let _ = writeln!(out, "    subgraph cluster_replay_{n}_{j} {{");
            let _ = writeln!(
                out,
                "      label={}; labeljust=l; style=\"rounded\"; color=\"#d6cdea\"; fontsize=10;",
                quote(lane)
            );
            for op in r.ops.iter().filter(|o| o.lane == j) {
                let mut label = format!("op {}\n{}", op.captured, op.label);
                for a in &op.accesses {
                    label.push('\n');
                    label.push_str(a);
                }
                let (fill, border) = if !op.hazards.is_empty() {
                    super::HAZARD_FILL
                } else if !op.conflicts.is_empty() {
                    super::CONFLICT_FILL
                } else {
                    super::CONTEXT_FILL
                };
                let tooltip = format!(
                    "the replay at op {n} of op {} (captured on {lane})",
                    op.captured
                );
                let _ = writeln!(
                    out,
                    "      r{n}_{} [label={}, tooltip={}, fillcolor=\"{fill}\", color=\"{border}\"];",
                    op.captured,
                    quote(&label),
                    quote(&tooltip)
                );
            }
            out.push_str("    }\n");
        }
        out.push_str("  }\n");
        // Body order within each lane; entry from the launch; exit into the launch stream.
        let launch_lane = d.nodes.iter().find(|x| x.op == n).map(|x| x.lane);
        let next = launch_lane.and_then(|l| d.nodes.iter().find(|x| x.lane == l && x.op > n));
        for j in 0..r.lanes.len() {
            let lane: Vec<u64> = r
                .ops
                .iter()
                .filter(|o| o.lane == j)
                .map(|o| o.captured)
                .collect();
            for w in lane.windows(2) {
                let _ = writeln!(out, "  r{n}_{} -> r{n}_{} [color=\"{GREY}\"];", w[0], w[1]);
            }
            if let (Some(first), Some(last)) = (lane.first(), lane.last()) {
                let _ = writeln!(
                    out,
                    "  op{n} -> r{n}_{first} [color=\"{REPLAY}\", style=dashed, label=\"replay\", fontcolor=\"{REPLAY}\"];"
                );
                if let Some(next) = next {
                    let _ = writeln!(
                        out,
                        "  r{n}_{last} -> op{} [color=\"{REPLAY}\", style=dashed, label=\"joins\", fontcolor=\"{REPLAY}\"];",
                        next.op
                    );
                }
            }
        }
    }
}

const INVISIBLE: &str = "style=invis, shape=point, width=0, height=0, label=\"\"";

/// How many times each rung of the lane ladders is repeated: Graphviz merges parallel edges and
/// adds up their crossing penalties, so a lane order that crosses rungs costs more than the drawn
/// edges can save (more rungs than this make Graphviz space the rows wider).
const RUNGS: usize = 4;

/// The invisible edges that lay the picture out: issue order left to right, and the lanes as
/// rows from the top in their order.
///
/// Graphviz orders clusters only by crossing minimization (flat edges between clusters are
/// ignored), starting from a breadth-first order of the graph. So: a source `lanes_start` reaches
/// the lanes' first anchors in lane order, and a sink `lanes_end` is reached from their last
/// anchors in lane order, which makes both starting orders the lane order; and at each end a
/// ladder of heavy edges from anchor `i` to the next anchor of lane `i + 1` crosses itself in
/// every order but that one (or its mirror image).
fn scaffold(out: &mut String, d: &Drawn<'_>) {
    let lanes = d.pic.lanes.len();
    if lanes > 0 {
        let _ = writeln!(out, "  lanes_start [{INVISIBLE}];");
        let _ = writeln!(out, "  lanes_end [{INVISIBLE}];");
        let all = |suffix: &str| {
            (0..lanes)
                .map(|i| format!("lane{i}{suffix}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let _ = writeln!(out, "  {{ rank=same; {}; }}", all(""));
        let _ = writeln!(out, "  {{ rank=same; {}; }}", all("_b"));
        for i in 0..lanes {
            let _ = writeln!(out, "  lanes_start -> lane{i} -> lane{i}_b [style=invis];");
            match (d.nodes.first(), d.nodes.last()) {
                (Some(first), Some(last)) => {
                    let _ = writeln!(
                        out,
                        "  lane{i}_b -> op{} [style=invis]; op{} -> lane{i}_end [style=invis];",
                        first.op, last.op
                    );
                }
                _ => {
                    let _ = writeln!(out, "  lane{i}_b -> lane{i}_end [style=invis];");
                }
            }
            let _ = writeln!(
                out,
                "  lane{i}_end -> lane{i}_end_b -> lanes_end [style=invis];"
            );
        }
        for i in 1..lanes {
            for _ in 0..RUNGS {
                let _ = writeln!(
                    out,
                    "  lane{} -> lane{i}_b [style=invis]; lane{}_end -> lane{i}_end_b [style=invis];",
                    i - 1,
                    i - 1
                );
            }
        }
    }
    // Issue order: each drawn op in its own column.
    for w in d.nodes.windows(2) {
        let _ = writeln!(
            out,
            "  op{} -> op{} [style=invis, weight=0];",
            w[0].op, w[1].op
        );
    }
}

/// The tooltip of a missing edge: the titles of the hazards it would fix.
fn missing_tooltip(d: &Drawn<'_>, e: &super::Edge) -> String {
    let fixes = d.fixes(e);
    if fixes.is_empty() {
        return "missing synchronization".to_string();
    }
    fixes
        .iter()
        .map(|&h| {
            let hz = &d.pic.hazards[h];
            match &hz.fix {
                Some(fix) => format!("{}: {}", hz.title, fix),
                None => hz.title.clone(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A DOT double-quoted string of `s`: quotes and backslashes escaped, line breaks as `\n`
/// (centred lines), other control characters as spaces.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push_str("\\n");
                }
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    use super::super::tests::{arb_picture, broken, hostile, rounds, rounds_of, small};
    use super::*;

    /// Every line is whole: its quotes are balanced once escaped quotes and backslashes are
    /// taken out, and it ends a statement, opens or closes a block.
    fn assert_well_formed(dot: &str) {
        for line in dot.lines() {
            let quotes = line
                .replace("\\\\", "")
                .replace("\\\"", "")
                .matches('"')
                .count();
            assert_eq!(quotes % 2, 0, "unbalanced quotes in {line}");
            let t = line.trim_end();
            assert!(
                t.ends_with(';') || t.ends_with('{') || t.ends_with('}'),
                "{line}"
            );
        }
        assert_eq!(
            dot.matches("subgraph cluster_").count() + 1,
            dot.lines().filter(|l| l.trim() == "}").count()
        );
    }

    #[test]
    fn quote_escapes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quote("<x>"), "\"<x>\"");
        assert_eq!(
            quote("one\ntwo\r\nthree\rfour\tfive"),
            r#""one\ntwo\nthree\nfour five""#
        );
        assert_eq!(quote("trailing\\"), r#""trailing\\""#);
    }

    /// The lines of `dot` that contain all of `parts`.
    fn lines_with<'a>(dot: &'a str, parts: &[&str]) -> Vec<&'a str> {
        dot.lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .collect()
    }

    #[test]
    fn small_picture() {
        let dot = render_dot(&small());
        assert!(dot.starts_with("digraph streamsan {\n"), "{dot}");
        assert!(dot.ends_with("}\n"));
        assert!(dot.contains("rankdir=LR"));
        // One cluster per lane, in lane order, labelled with the lane's name.
        let clusters: Vec<&str> = dot
            .lines()
            .filter(|l| l.trim_start().starts_with("subgraph cluster_"))
            .collect();
        assert_eq!(
            clusters,
            [
                "  subgraph cluster_0 {",
                "  subgraph cluster_1 {",
                "  subgraph cluster_2 {"
            ]
        );
        assert_eq!(lines_with(&dot, &["label=\"host\";"]).len(), 1);
        assert_eq!(lines_with(&dot, &["label=\"s2\";"]).len(), 1);
        // Every op a box with its id, label and accesses; the hazard red, the conflict orange.
        assert_eq!(
            lines_with(
                &dot,
                &[
                    "op5 [label=\"op 5\\nlaunch sum\\nwrites x[0, 4096)\"",
                    "fillcolor=\"#fbd0d0\""
                ]
            )
            .len(),
            1
        );
        assert_eq!(
            lines_with(
                &dot,
                &["op4 [label=\"op 4\\nlaunch scale", "fillcolor=\"#ffe0b2\""]
            )
            .len(),
            1
        );
        assert_eq!(
            lines_with(
                &dot,
                &["op0 [label=\"op 0\\nalloc x", "fillcolor=\"#ffffff\""]
            )
            .len(),
            1
        );
        // The nodes of a lane are inside its cluster.
        let s1 = dot.find("subgraph cluster_1").unwrap();
        let s2 = dot.find("subgraph cluster_2").unwrap();
        let op4 = dot.find("    op4 [").unwrap();
        assert!(s1 < op4 && op4 < s2);
        // The missing edge: dashed, red, thick, labelled with what it fixes.
        let missing = lines_with(&dot, &["op4 -> op5 [color="]);
        assert_eq!(missing.len(), 1, "{dot}");
        for part in [
            "style=dashed",
            "color=\"#d62728\"",
            "penwidth=2",
            "label=\"missing: fixes data-race at op 5\"",
        ] {
            assert!(missing[0].contains(part), "{part} not in {}", missing[0]);
        }
        // The event edge: blue, labelled with the event; the issue edge dotted; stream order solid.
        let event = lines_with(&dot, &["op2 -> op3 [", "color=\"#1f6fd1\""]);
        assert_eq!(event.len(), 1);
        assert!(event[0].contains("label=\"e1\""));
        assert_eq!(lines_with(&dot, &["op0 -> op1 [", "style=dotted"]).len(), 1);
        let stream = lines_with(&dot, &["op3 -> op5 [", "color=\"#7a7a7a\""]);
        assert_eq!(stream.len(), 1);
        assert!(!stream[0].contains("style="));
        // Issue order left to right: an invisible edge between consecutive ops.
        for (a, b) in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)] {
            assert_eq!(
                lines_with(&dot, &[&format!("  op{a} -> op{b} [style=invis")]).len(),
                1
            );
        }
        assert_eq!(dot, render_dot(&small()), "deterministic");
        if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).is_file() {
            insta::assert_snapshot!("small_dot", dot);
        } else {
            // Away from the source tree (a staged test executable), where insta would look for
            // the snapshot under a directory that is not there: the embedded snapshot file.
            super::super::tests::assert_embedded_snapshot(
                include_str!("snapshots/streamsan__graph__render__dot__tests__small_dot.snap"),
                &dot,
            );
        }
    }

    #[test]
    fn every_edge_kind_has_its_style() {
        let mut pic = small();
        pic.edges.clear();
        let kinds = [
            (EdgeKind::Stream, "color=\"#7a7a7a\""),
            (EdgeKind::Host, "color=\"#7a7a7a\""),
            (EdgeKind::Issue, "style=dotted"),
            (EdgeKind::Event, "color=\"#1f6fd1\""),
            (EdgeKind::HostSync, "color=\"#2e8b3a\""),
            (EdgeKind::Legacy, "color=\"#e07b00\""),
            (EdgeKind::RecordStream, "color=\"#8a3fb5\", style=dashed"),
            (EdgeKind::Elided, "style=dotted, label=\"…\""),
            (
                EdgeKind::Missing,
                "style=dashed, penwidth=2, label=\"missing\"",
            ),
        ];
        // A different pair of ops for each kind.
        let pairs = [
            (0, 5),
            (1, 5),
            (2, 5),
            (3, 5),
            (4, 5),
            (0, 4),
            (1, 4),
            (2, 4),
            (0, 3),
        ];
        for ((kind, _), (from, to)) in kinds.iter().zip(pairs) {
            pic.edges.push(crate::graph::Edge {
                from,
                to,
                kind: *kind,
                label: None,
                hazards: vec![],
            });
        }
        let dot = render_dot(&pic);
        for ((kind, style), (from, to)) in kinds.iter().zip(pairs) {
            let lines = lines_with(&dot, &[&format!("  op{from} -> op{to} [color="), style]);
            assert_eq!(lines.len(), 1, "{kind:?}: {style}\n{dot}");
        }
    }

    #[test]
    fn hostile_names_are_escaped() {
        let dot = render_dot(&hostile());
        assert!(
            dot.contains(r#"label="op 4\nlaunch a\"b\\c\nreads x[0, 4096)""#),
            "{dot}"
        );
        assert!(dot.contains(r#"label="<x>""#));
        assert!(dot.contains(r#"label="<script>alert(1)</script>";"#));
        assert!(dot.contains(r#"site: line one\nline two""#));
        assert!(dot.contains(r#"label="<b>trace</b> \"quoted\".jsonl\n"#));
        // No raw line break inside a quoted string: every line is a whole statement.
        assert_well_formed(&dot);
    }

    #[test]
    fn broken_pictures_render() {
        let dot = render_dot(&broken());
        // The node on lane 7 and the second node of op 3 are left out, with their edges.
        assert!(!dot.contains("op9"));
        assert!(!dot.contains("duplicate"));
        assert!(!dot.contains("op100"));
        assert_eq!(lines_with(&dot, &["    op3 ["]).len(), 1);
        // The missing edge names only the hazard that exists.
        assert!(
            dot.contains("label=\"missing: fixes data-race at op 18446744073709551615\""),
            "{dot}"
        );
        assert!(dot.contains("6 ops, 3 ops not drawn"));
        render_dot(&Picture::default());
        let mut no_lanes = small();
        no_lanes.lanes.clear();
        let dot = render_dot(&no_lanes);
        assert!(!dot.contains("op0"));
    }

    /// Runs Graphviz `dot -Tplain` on `text`; `None` where it is not installed.
    fn graphviz(text: &str) -> Option<String> {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut child = Command::new("dot")
            .arg("-Tplain")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{stderr}\n{text}"
        );
        Some(String::from_utf8(out.stdout).unwrap())
    }

    /// Graphviz, where installed, lays the pictures out: the lanes as rows from the top in their
    /// order, the ops in issue order from the left.
    #[test]
    fn graphviz_lays_out_the_lanes_in_order() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut pictures = vec![small(), hostile(), broken(), rounds(), rounds_of(60)];
        for _ in 0..40 {
            pictures.push(arb_picture().new_tree(&mut runner).unwrap().current());
        }
        for (i, pic) in pictures.iter().enumerate() {
            let Some(plain) = graphviz(&render_dot(pic)) else {
                println!("skipped: Graphviz `dot` is not installed");
                return;
            };
            // `node NAME X Y ...`, y upwards.
            let at = |name: &str, field: usize| -> f64 {
                let line = plain
                    .lines()
                    .find(|l| l.starts_with(&format!("node {name} ")))
                    .unwrap();
                line.split(' ').nth(field).unwrap().parse().unwrap()
            };
            if i >= 5 {
                // Random pictures: Graphviz takes them; the lane order is a heuristic there.
                continue;
            }
            for lane in 1..pic.lanes.len() {
                assert!(
                    at(&format!("lane{}", lane - 1), 3) > at(&format!("lane{lane}"), 3),
                    "{} lane {lane}",
                    pic.title
                );
            }
            let d = Drawn::new(pic);
            for w in d.nodes.windows(2) {
                assert!(
                    at(&format!("op{}", w[0].op), 2) < at(&format!("op{}", w[1].op), 2),
                    "{}",
                    pic.title
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any picture renders to well-formed DOT, the same every time.
        #[test]
        fn any_picture_renders(pic in arb_picture()) {
            let dot = render_dot(&pic);
            assert_well_formed(&dot);
            prop_assert_eq!(&dot, &render_dot(&pic));
        }
    }
}
