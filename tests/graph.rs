//! The stream-dependency graph: its edges against the checker's verdicts, its explanations, and
//! its memory on long traces.
//!
//! Fixtures: the proptest regression seeds of `tests/graph.proptest-regressions`, embedded
//! (`include_str!`, `common::EmbeddedRegressions`), so they are replayed wherever the test runs.

mod common;

use proptest::prelude::*;
use streamsan::fuzz::gen::{arb_program, GenConfig};
use streamsan::graph::{DepGraph, GraphConfig};
use streamsan::report::{AccessKind, HazardKind};
use streamsan::trace::{parse_line, Op, TraceOp, HOST};
use streamsan::workload::Pipeline;
use streamsan::Checker;

fn program(text: &str) -> Vec<TraceOp> {
    text.lines()
        .filter_map(|l| parse_line(l).expect("valid test trace").map(|(op, _)| op))
        .collect()
}

/// The report, and the implicit device synchronizations.
fn check(ops: &[TraceOp]) -> (streamsan::Report, Vec<(u64, u64)>) {
    let mut c = Checker::new();
    for op in ops {
        c.check(op).expect("valid input");
    }
    let implicit = c.implicit_syncs().to_vec();
    (c.finish(), implicit)
}

fn whole(ops: &[TraceOp], (report, implicit): &(streamsan::Report, Vec<(u64, u64)>)) -> DepGraph {
    let cfg = GraphConfig {
        window: u64::MAX,
        ..GraphConfig::default()
    };
    let mut g = DepGraph::new(report, cfg).with_implicit_syncs(implicit);
    for (i, op) in ops.iter().enumerate() {
        g.add(i as u64, op);
    }
    g
}

#[test]
fn explains_a_stale_event_and_a_host_sync() {
    let ops = program(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","name":"a","writes":["x"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s1","name":"b","writes":["x"]}
{"op":"event_record","event":"e2","stream":"s1"}
{"op":"launch","stream":"s2","name":"c","reads":["x"]}
{"op":"stream_sync","stream":"s1"}
{"op":"launch","stream":"s3","name":"d","reads":["x"]}
{"op":"launch","stream":"s1","name":"e","writes":["x"]}
{"op":"launch","stream":"s3","name":"f","reads":["x"]}"#,
    );
    let (mut report, implicit) = check(&ops);
    let picture = streamsan::graph::explain_program(&ops, &mut report, &implicit, "t");
    let why: Vec<&[String]> = report.hazards.iter().map(|h| &h.detail.why[..]).collect();
    assert_eq!(
        why[0],
        [
            "stream s1 wrote x at op 4; s1 recorded event e2 after it, at op 5, but stream s2 did not wait on that record",
            "stream s2's latest synchronization with s1 is `wait e` at op 3 (the event was recorded at op 2): it orders s1's ops up to op 2 before op 6, not op 4",
            "missing edge: s1 op 4 → s2 op 6",
        ]
    );
    assert_eq!(
        why[2],
        [
            "stream s1 wrote x at op 9; s1 recorded no event after it",
            "stream s3's latest synchronization with s1 is the host's `stream_sync s1` at op 7 (which waited for op 5): it orders s1's ops up to op 5 before op 10, not op 9",
            "missing edge: s1 op 9 → s3 op 10",
        ]
    );
    assert_eq!(
        why[1].last().map(String::as_str),
        Some("missing edges: s2 op 6 → s1 op 9, s3 op 8 → s1 op 9")
    );
    // The picture: every op (a short trace is drawn whole), lanes host, s1, s2, s3, and one
    // missing edge per earlier participant of each hazard.
    assert_eq!(picture.nodes.len(), ops.len());
    let lanes: Vec<&str> = picture.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lanes, ["host", "s1", "s2", "s3"]);
    let missing: Vec<(u64, u64)> = picture
        .edges
        .iter()
        .filter(|e| e.kind == streamsan::graph::EdgeKind::Missing)
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(missing, [(4, 6), (6, 9), (8, 9), (9, 10)]);
    let event: Vec<(u64, u64)> = picture
        .edges
        .iter()
        .filter(|e| e.kind == streamsan::graph::EdgeKind::Event)
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(event, [(2, 3)]);
}

#[test]
fn explains_legacy_waits_and_implicit_device_syncs() {
    let legacy = program(
        r#"{"op":"stream_create","stream":"b","blocking":true}
{"op":"launch","stream":"s","writes":["y"]}
{"op":"event_record","event":"e1","stream":"s"}
{"op":"event_wait","stream":"default","event":"e1"}
{"op":"launch","stream":"s","writes":["x"]}
{"op":"event_wait","stream":"b","event":"e2"}
{"op":"launch","stream":"b","reads":["x"]}"#,
    );
    let (mut report, implicit) = check(&legacy);
    streamsan::graph::explain_program(&legacy, &mut report, &implicit, "t");
    let race = report
        .hazards
        .iter()
        .find(|h| h.kind == HazardKind::DataRace)
        .expect("a data race");
    assert_eq!(
        race.detail.why[1],
        "stream b's latest synchronization with s is the legacy default stream's implicit wait at op 5 (for op 3): it orders s's ops up to op 2 before op 6, not op 4"
    );
    // Memory freed on s1 comes back on s2 at op 3: the driver synchronized the device there.
    let reappear = program(
        r#"{"op":"alloc","buffer":"x","bytes":512,"stream":"s1","addr":4096}
{"op":"launch","stream":"s1","writes":["x"]}
{"op":"free","buffer":"x"}
{"op":"alloc","buffer":"y","bytes":512,"stream":"s2","addr":4096}
{"op":"launch","stream":"s1","writes":["z"]}
{"op":"launch","stream":"s2","reads":["z"]}"#,
    );
    let (mut report, implicit) = check(&reappear);
    assert_eq!(implicit, [(3, 0)]);
    streamsan::graph::explain_program(&reappear, &mut report, &implicit, "t");
    assert_eq!(
        report.hazards[0].detail.why[1],
        "stream s2's latest synchronization with s1 is the host's `alloc y on s2` at op 3 (its memory came back from another stream, which synchronized the device): it orders s1's ops up to op 1 before op 5, not op 4"
    );
}

/// The participant (lane) of an op, as the graph places it.
fn lane_of(op: &Op) -> &str {
    op.on_stream().map_or(HOST, |s| s.as_str())
}

/// The numbers after "up to op " and ", not op " in an explanation line.
fn bounds(line: &str) -> Option<(u64, u64)> {
    let upto = line
        .split("up to op ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let a = line.split(", not op ").nth(1)?.parse().ok()?;
    Some((upto, a))
}

fn config() -> GenConfig {
    GenConfig {
        ops: 40,
        missing_sync: 0.3,
        ..GenConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: common::EmbeddedRegressions::boxed(include_str!("graph.proptest-regressions")),
        ..ProptestConfig::default()
    })]

    /// For every race the checker reports: no path in the graph leads from a conflicting access
    /// to the racing op; the explanation's "latest synchronization" names an op of the earlier
    /// participant that does reach it, and no later op of that participant up to the conflict
    /// does. Every race is explained and ends with its missing edges.
    #[test]
    fn explanations_agree_with_the_graph_and_the_checker(program in arb_program(config())) {
        let ops = &program.ops;
        let checked = check(ops);
        let g = whole(ops, &checked);
        let report = &checked.0;
        for (h, why) in report.hazards.iter().zip(g.explanations()) {
            if !matches!(h.kind, HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree) {
                prop_assert!(why.is_empty());
                continue;
            }
            prop_assert!(why.last().is_some_and(|l| l.starts_with("missing edge")), "{:?}", why);
            if h.kind == HazardKind::UnsafeFree {
                continue;
            }
            let b = h.op;
            for c in h.conflicts.iter().filter(|c| c.access != AccessKind::Alloc) {
                prop_assert_eq!(g.reaches(c.op, b), Some(false), "op {} reaches op {}\n{}", c.op, b, program);
            }
            for line in why {
                let Some((upto, a)) = bounds(line) else { continue };
                prop_assert!(upto < a, "{}", line);
                prop_assert_eq!(g.reaches(upto, b), Some(true), "{}\n{}", line, program);
                let p = lane_of(&ops[upto as usize].op);
                for j in upto + 1..=a {
                    if lane_of(&ops[j as usize].op) == p {
                        prop_assert_eq!(g.reaches(j, b), Some(false), "op {} of {} reaches op {}: {}\n{}", j, p, b, line, program);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: common::EmbeddedRegressions::boxed(include_str!("graph.proptest-regressions")),
        ..ProptestConfig::default()
    })]

    /// The graph's happens-before (paths of its edges, all ops kept) is the oracle's — the
    /// brute-force reference written from the trace format alone — for every pair of ops.
    #[test]
    fn paths_of_the_graph_are_the_oracle_s_happens_before(program in arb_program(config())) {
        let ops = &program.ops;
        let checked = check(ops);
        let g = whole(ops, &checked);
        let paths = streamsan::oracle::oracle_paths(ops).expect("generated programs are valid");
        for (x, before) in paths.iter().enumerate() {
            for a in 0..x {
                let oracle = before[a / 64] & (1 << (a % 64)) != 0;
                prop_assert_eq!(
                    g.reaches(a as u64, x as u64),
                    Some(oracle),
                    "op {} → op {}\n{}", a, x, program
                );
            }
        }
    }
}

/// A long pipeline with a wait left out now and then: the graph keeps a bounded neighbourhood,
/// whatever the trace's length.
#[test]
fn memory_stays_bounded_on_long_traces() {
    let peak = |n: u64, fresh: bool| {
        let mut ops = Vec::new();
        let mut waits = 0u64;
        let mut records: std::collections::HashMap<String, u64> = Default::default();
        Pipeline {
            ops: n,
            streams: 8,
            buffers: 1_000,
            seed: 1,
        }
        .generate(|mut op| {
            if fresh {
                match &mut op.op {
                    Op::EventRecord { event, .. } => {
                        let k = records.entry(event.to_string()).or_default();
                        *k += 1;
                        *event = format!("{event}#{k}").as_str().into();
                    }
                    Op::EventWait { event, .. } | Op::EventSync { event } => {
                        let k = records.get(event.as_str()).copied().unwrap_or(0);
                        *event = format!("{event}#{k}").as_str().into();
                    }
                    _ => {}
                }
            }
            if matches!(op.op, Op::EventWait { .. }) {
                waits += 1;
                if waits % 2_000 == 0 {
                    return;
                }
            }
            ops.push(op);
        });
        let (report, _) = check(&ops);
        assert!(report.errors > 0, "the left-out waits make hazards");
        let mut g = DepGraph::new(&report, GraphConfig::default());
        for (i, op) in ops.iter().enumerate() {
            g.add(i as u64, op);
        }
        let stats = g.stats();
        assert_eq!(stats.ops, ops.len() as u64);
        stats.peak_nodes
    };
    let (short, long) = (peak(50_000, false), peak(200_000, false));
    assert!(long < 20_000, "peak {long} nodes for 200,000 ops");
    assert!(
        long <= short * 2,
        "peak grows with the trace: {short} → {long}"
    );
    // Every record under a new event name: the nodes stay bounded all the same.
    let fresh = peak(200_000, true);
    assert!(fresh < 20_000, "peak {fresh} nodes with fresh event names");
}

/// The embedded regression file parses (a line that is not a seed panics) and holds seeds.
#[test]
fn regression_seeds_are_embedded() {
    let seeds = common::EmbeddedRegressions::new(include_str!("graph.proptest-regressions"));
    assert!(
        !seeds.is_empty(),
        "tests/graph.proptest-regressions holds no seed"
    );
}

/// The explanation lines of each hazard of a trace, after the walk.
fn explained(text: &str) -> (Vec<TraceOp>, DepGraph, Vec<Vec<String>>) {
    let ops = program(text);
    let checked = check(&ops);
    let g = whole(&ops, &checked);
    let why = g.explanations().to_vec();
    (ops, g, why)
}

#[test]
fn a_replay_is_explained_from_its_launch_stream() {
    let (_, _, why) = explained(include_str!("conformance/graph-static-input.jsonl"));
    // The copy on s2 at op 7 against the replay launched on s1 at op 6.
    assert_eq!(
        why[0],
        [
            "the replay of g launched on s1 at op 6 read x, captured at op 4: it joins s1 at its end; s1 recorded no event after it",
            "stream s2 has no synchronization with s1 before op 7",
            "missing edge: s1 op 6 → s2 op 7",
        ]
    );
    // The next replay (op 8) against the copy.
    assert_eq!(
        why[1][0],
        "the replay of g launched on s1 at op 8 reads x, captured at op 4: it starts from what s1 knows at op 8"
    );
    assert_eq!(why[1].last().unwrap(), "missing edge: s2 op 7 → s1 op 8");
}

#[test]
fn a_race_inside_a_replay_is_explained_by_the_capture() {
    let (_, _, why) = explained(include_str!("conformance/graph-fork-join.jsonl"));
    assert_eq!(why.len(), 2);
    assert!(
        why[0].iter().any(|l| l.starts_with(
            "in the same replay, captured op 5 on s2 read x and captured op 7 on s1 wrote it; nothing in the capture of g orders them"
        )),
        "{:?}",
        why[0]
    );
    assert_eq!(
        why[0].last().unwrap(),
        "missing edge: captured op 5 (s2) → captured op 7 (s1)"
    );
}

#[test]
fn graphs_sharing_a_pool_are_explained_through_both_launches() {
    let (_, _, why) = explained(include_str!("conformance/graph-shared-pool.jsonl"));
    assert_eq!(
        why[0],
        [
            "the replay of g2 launched on s2 at op 12 writes t2, captured at op 8: it starts from what s2 knows at op 12",
            "the replay of g1 launched on s1 at op 11 read t1, captured at op 3: it joins s1 at its end; s1 recorded no event after it",
            "stream s2 has no synchronization with s1 before op 12",
            "missing edge: s1 op 11 → s2 op 12",
        ]
    );
}

#[test]
fn captured_ops_order_nothing_at_capture() {
    // The captured record and wait between s1 and s2 do not run at capture: the graph has no
    // edge from them, and s2's later launch outside the capture is not ordered after s1's work.
    let (_, g, _) = explained(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","name":"w","writes":["x"]}
{"op":"graph_begin","graph":"g","stream":"s1"}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","name":"k"}
{"op":"event_record","event":"j","stream":"s2"}
{"op":"event_wait","stream":"s1","event":"j"}
{"op":"graph_end","graph":"g"}
{"op":"launch","stream":"s2","name":"r","reads":["x"]}"#,
    );
    assert_eq!(
        g.reaches(1, 9),
        Some(false),
        "a captured wait orders nothing"
    );
    assert_eq!(g.reaches(3, 4), Some(false));
}

#[test]
fn a_replay_is_drawn_as_a_box_of_its_body_lanes() {
    let ops = program(include_str!("conformance/graph-fork-join.jsonl"));
    let (mut report, implicit) = check(&ops);
    let pic = streamsan::graph::explain_program(&ops, &mut report, &implicit, "fork-join");
    assert_eq!(pic.replays.len(), 1);
    let r = &pic.replays[0];
    assert_eq!((r.launch, r.graph.as_str()), (10, "g"));
    assert_eq!(r.lanes, ["g/s1", "g/s2"]);
    let ops_of = |lane: usize| -> Vec<u64> {
        r.ops
            .iter()
            .filter(|o| o.lane == lane)
            .map(|o| o.captured)
            .collect()
    };
    // s1 is the origin (its captured record at op 3 comes first); s2 joined at op 4.
    assert_eq!(ops_of(0), [3, 7, 8]);
    assert_eq!(ops_of(1), [4, 5, 6]);
    let merge = r.ops.iter().find(|o| o.captured == 7).unwrap();
    assert_eq!(merge.hazards, [0, 1], "the replay of op 7 has both hazards");
    let side = r.ops.iter().find(|o| o.captured == 5).unwrap();
    assert_eq!(side.conflicts, [0, 1]);

    let dot = streamsan::graph::render_dot(&pic);
    for line in [
        "subgraph cluster_replay_10 {",
        "label=\"replay of g (graph_launch at op 10)\"",
        "label=\"g/s2\"",
        "op10 -> r10_3 ",
        "op10 -> r10_4 ",
        "r10_5 -> r10_6 ",
    ] {
        assert!(dot.contains(line), "{line} not in\n{dot}");
    }
    let html = streamsan::graph::render_html(&pic);
    assert!(html.contains("<figure class=\"replay\" id=\"replay-10\">"));
    assert!(html.contains("replay of g at <a href=\"#op-10\">op 10</a>: it starts from s1"));
    assert!(html.contains("class=\"replay-box\""));
    assert!(html.contains(">g/s2</text>") && html.contains(">g/s1</text>"));
}

#[test]
fn a_captured_op_is_drawn_with_no_edge_and_its_replay_in_the_box() {
    let ops = program(include_str!("conformance/graph-capture-does-not-run.jsonl"));
    let (mut report, implicit) = check(&ops);
    let pic = streamsan::graph::explain_program(&ops, &mut report, &implicit, "t");
    let captured = pic.nodes.iter().find(|n| n.op == 2).expect("op 2 drawn");
    assert!(
        captured.label.starts_with("captured "),
        "{}",
        captured.label
    );
    assert!(
        pic.edges
            .iter()
            .all(|e| e.kind == streamsan::graph::EdgeKind::Elided || (e.from != 2 && e.to != 2)),
        "{:?}",
        pic.edges
    );
    assert_eq!(pic.replays.len(), 1);
    assert_eq!(pic.replays[0].launch, 5);
    assert_eq!(pic.replays[0].ops[0].captured, 2);
    assert_eq!(pic.replays[0].ops[0].hazards, [0]);
}
