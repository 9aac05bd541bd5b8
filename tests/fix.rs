//! `streamsan fix`: the inserted synchronization removes every data-race, reuse-race and
//! unsafe-free, keeps the original ops in order, inserts at most two ops per hazard fixed, and
//! makes every schedule on the simulator give the sequential reference.
//!
//! Graph programs: every conformance and example trace with a fixable hazard (the graph ones
//! named), and random programs with captures, forks and joins, shared pools and replays on
//! several streams (the oracle agreement test's generator, `tests/programs`).
//!
//! Fixtures: the proptest regression seeds of `tests/fix.proptest-regressions`, embedded
//! (`include_str!`, `common::EmbeddedRegressions`), so they are replayed wherever the test runs.

mod common;
mod programs;

use proptest::prelude::*;
use streamsan::exec::sim::{self, RandomScheduler, SimConfig};
use streamsan::fix::{fix_program, is_fixable, Fixed};
use streamsan::fuzz::gen::{arb_program, GenConfig};
use streamsan::report::HazardKind;
use streamsan::trace::{parse_line, Op, TraceOp};
use streamsan::workload::SplitMix;
use streamsan::Checker;

fn program(text: &str) -> Vec<TraceOp> {
    text.lines()
        .filter_map(|l| parse_line(l).expect("valid test trace").map(|(op, _)| op))
        .collect()
}

fn inserted(f: &Fixed) -> Vec<String> {
    f.inserted_at
        .iter()
        .map(|&i| {
            let op = &f.ops[i].op;
            match op {
                Op::EventRecord { event, stream } => format!("record {event} on {stream}"),
                Op::EventWait { stream, event } => format!("{stream} waits {event}"),
                Op::EventSync { event } => format!("host syncs {event}"),
                Op::RecordStream { buffer, stream } => format!("record_stream({buffer}, {stream})"),
                Op::StreamSync { stream } => format!("host syncs {stream}"),
                Op::DeviceSync { device } => format!("device_sync {device}"),
                other => format!("{other:?}"),
            }
        })
        .collect()
}

/// The original ops are the written ops less the inserted ones, in order.
fn keeps_original(original: &[TraceOp], f: &Fixed) -> bool {
    let kept: Vec<&TraceOp> = f
        .ops
        .iter()
        .enumerate()
        .filter(|(i, _)| !f.inserted_at.contains(i))
        .map(|(_, op)| op)
        .collect();
    kept.len() == original.len() && kept.iter().zip(original).all(|(a, b)| *a == b)
}

fn fixable_left(f: &Fixed) -> Vec<(u64, HazardKind)> {
    f.after
        .hazards
        .iter()
        .filter(|h| is_fixable(h.kind))
        .map(|h| (h.op, h.kind))
        .collect()
}

#[test]
fn a_cross_stream_race_gets_an_event() {
    let p = program(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","name":"fill","writes":["x"]}
{"op":"launch","stream":"s2","name":"scale","reads":["x"]}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(f.before.errors, 1);
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on s1", "s2 waits streamsan-fix-1"]
    );
    assert_eq!(
        f.inserted_at,
        [2, 3],
        "inserted just before the racing launch"
    );
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
    assert!(keeps_original(&p, &f));
    assert_eq!(
        (f.summary.fixable, f.summary.fixed, f.summary.inserted),
        (1, 1, 2)
    );
}

#[test]
fn one_record_stream_fixes_the_free_and_the_reuse() {
    let p = program(
        r#"{"op":"alloc","buffer":"grad","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"compute","writes":["grad"]}
{"op":"event_record","event":"ready","stream":"compute"}
{"op":"event_wait","stream":"comm","event":"ready"}
{"op":"launch","stream":"comm","reads":["grad"]}
{"op":"free","buffer":"grad"}
{"op":"alloc","buffer":"act","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"compute","writes":["act"]}"#,
    );
    let f = fix_program(&p).unwrap();
    let kinds: Vec<HazardKind> = f.before.hazards.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HazardKind::UnsafeFree, HazardKind::ReuseRace]);
    assert_eq!(inserted(&f), ["record_stream(grad, comm)"]);
    assert_eq!(f.inserted_at, [5]);
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
    assert_eq!((f.summary.fixed, f.summary.inserted), (2, 1));
}

#[test]
fn record_stream_names_only_the_streams_it_needs() {
    // s1 waited for s2's write before reading: record_stream(b, s1) orders both before the reuse
    // (the allocator's event on s1 follows s2's write too), so s2 needs none of its own.
    let p = program(
        r#"{"op":"alloc","buffer":"b","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"compute","writes":["b"]}
{"op":"event_record","event":"e0","stream":"compute"}
{"op":"event_wait","stream":"s2","event":"e0"}
{"op":"launch","stream":"s2","writes":["b"]}
{"op":"event_record","event":"e1","stream":"s2"}
{"op":"event_wait","stream":"s1","event":"e1"}
{"op":"launch","stream":"s1","reads":["b"]}
{"op":"free","buffer":"b"}
{"op":"alloc","buffer":"c","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"compute","writes":["c"]}"#,
    );
    let f = fix_program(&p).unwrap();
    let kinds: Vec<HazardKind> = f.before.hazards.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HazardKind::UnsafeFree, HazardKind::ReuseRace]);
    assert_eq!(inserted(&f), ["record_stream(b, s1)"]);
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
    assert_eq!((f.summary.fixed, f.summary.inserted), (2, 1));
}

#[test]
fn one_wait_fixes_every_later_read_of_the_same_write() {
    let p = program(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["x"]}
{"op":"launch","stream":"s2","reads":["x"]}
{"op":"launch","stream":"s2","reads":["x"]}
{"op":"launch","stream":"s2","reads":["x"]}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(f.before.errors, 3);
    assert_eq!(f.summary.inserted, 2);
    assert_eq!(f.summary.fixed, 3);
    assert!(f.after.hazards.is_empty());
}

#[test]
fn a_host_read_gets_an_event_sync() {
    let p = program(
        r#"{"op":"alloc","buffer":"h","bytes":64,"memory":"pinned"}
{"op":"alloc","buffer":"d","bytes":64,"stream":"s1"}
{"op":"copy","stream":"s1","src":"d","dst":"h"}
{"op":"host_read","buffer":"h"}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on s1", "host syncs streamsan-fix-1"]
    );
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn conflicts_on_three_streams_make_the_host_wait() {
    // One hazard, three unordered writers: events would take six ops; the host waits instead.
    let p = program(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"memory":"pinned"}
{"op":"launch","stream":"s1","reads":["x"]}
{"op":"launch","stream":"s2","reads":["x"]}
{"op":"launch","stream":"s3","reads":["x"]}
{"op":"host_write","buffer":"x"}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(f.before.errors, 1);
    assert_eq!(inserted(&f), ["device_sync 0"]);
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn a_stream_ordered_free_waits_on_its_stream() {
    let p = program(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s2","reads":["x"]}
{"op":"free","buffer":"x","stream":"s1"}"#,
    );
    let f = fix_program(&p).unwrap();
    let kinds: Vec<HazardKind> = f.before.hazards.iter().map(|h| h.kind).collect();
    assert!(kinds.contains(&HazardKind::UnsafeFree), "{kinds:?}");
    // No record_stream for a stream-ordered free: s1 itself waits for s2's read.
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on s2", "s1 waits streamsan-fix-1"]
    );
    assert!(fixable_left(&f).is_empty(), "{}", f.after.to_json());
}

#[test]
fn readers_on_three_devices_take_one_device_sync_each() {
    // The one case where an op gets more than two inserted ops per hazard: nothing narrower
    // than a host wait per device orders three devices' streams before the write.
    let p = program(
        r#"{"op":"stream_create","stream":"a","device":0}
{"op":"stream_create","stream":"b","device":1}
{"op":"stream_create","stream":"c","device":2}
{"op":"launch","stream":"a","reads":["x"]}
{"op":"launch","stream":"b","reads":["x"]}
{"op":"launch","stream":"c","reads":["x"]}
{"op":"launch","stream":"d","writes":["x"]}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(f.before.errors, 1);
    assert_eq!(
        inserted(&f),
        ["device_sync 0", "device_sync 1", "device_sync 2"]
    );
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
    assert_eq!(f.summary.max_per_hazard, 3.0);
}

#[test]
fn comments_stay_on_one_line_whatever_the_ids() {
    let p = program(
        r#"{"op":"launch","stream":"s1","writes":["x\ny"]}
{"op":"launch","stream":"s2\nz","reads":["x\ny"]}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(f.insertions.len(), 1);
    let comment = &f.insertions[0].comment;
    assert!(!comment.contains('\n'), "{comment}");
    assert!(comment.contains(r"x\ny"), "{comment}");
}

#[test]
fn inserted_events_avoid_the_trace_s_names() {
    let p = program(
        r#"{"op":"event_create","event":"streamsan-fix-1"}
{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["x"]}
{"op":"launch","stream":"s2","reads":["x"]}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-2 on s1", "s2 waits streamsan-fix-2"]
    );
}

#[test]
fn other_hazards_are_left_as_they_are() {
    let p = program(
        r#"{"op":"alloc","buffer":"x","bytes":64,"stream":"s1"}
{"op":"free","buffer":"x"}
{"op":"free","buffer":"x"}"#,
    );
    let f = fix_program(&p).unwrap();
    assert_eq!(f.summary.inserted, 0);
    assert_eq!(f.after.hazards.len(), 1);
    assert_eq!(f.after.hazards[0].kind, HazardKind::InvalidFree);
}

/// A conflict the first check lists only at the first reuse it races with: once the fix orders
/// that reuse, the same access (of the first generation of `x0`) races with a later reuse of its
/// bytes, after the second generation's free got a `record_stream` — which orders only that
/// generation's accesses. The wait of that later reuse is kept whole on a second walk.
#[test]
fn a_conflict_listed_at_an_earlier_reuse_is_still_ordered_at_a_later_one() {
    let p = program(
        r#"{"op":"stream_create","stream":"s0"}
{"op":"alloc","buffer":"x0","bytes":1024,"stream":"s0"}
{"op":"launch","stream":"s0","writes":["x0"]}
{"op":"stream_sync","stream":"s0"}
{"op":"stream_create","stream":"b","blocking":true}
{"op":"launch","stream":"b","writes":["x0"]}
{"op":"stream_create","stream":"s1"}
{"op":"copy","stream":"s1","src":{"buffer":"x0","bytes":8},"dst":{"buffer":"x0","offset":808,"bytes":8}}
{"op":"event_record","event":"e0","stream":"s1"}
{"op":"record_stream","buffer":"x0","stream":"b"}
{"op":"free","buffer":"x0","stream":"s0"}
{"op":"alloc","buffer":"x0","bytes":1024,"stream":"s0"}
{"op":"stream_create","stream":"s2"}
{"op":"launch","stream":"s2","writes":["x0"]}
{"op":"event_record","event":"e0","stream":"s2"}
{"op":"event_wait","stream":"s1","event":"e0"}
{"op":"launch","stream":"s1","writes":[{"buffer":"x0","bytes":512}]}
{"op":"record_stream","buffer":"x0","stream":"s2"}
{"op":"free","buffer":"x0"}
{"op":"alloc","buffer":"x0","bytes":1024,"stream":"s0"}
{"op":"launch","stream":"b","writes":["x0"]}"#,
    );
    let f = fix_program(&p).unwrap();
    assert!(f.after.is_clean(), "{:?}", f.after.hazards);
    assert_eq!(f.summary.fixed, f.summary.fixable);
    assert_eq!(f.summary.fixable, 5);
    assert!(f.summary.inserted <= 2 * f.summary.fixed);
    // The reuse at original op 20 got its own wait: b waits for an event on s1.
    let last = f.insertions.last().expect("insertions");
    assert_eq!(last.before, 20);
    assert!(last
        .hazards
        .contains(&(HazardKind::ReuseRace, "x0".to_string())));
}

fn config() -> GenConfig {
    GenConfig {
        ops: 32,
        missing_sync: 0.4,
        ..GenConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: common::EmbeddedRegressions::boxed(include_str!("fix.proptest-regressions")),
        ..ProptestConfig::default()
    })]

    /// For generated racy programs: the fixed program has no data-race, reuse-race or
    /// unsafe-free, keeps every op in order, inserts at most two ops per hazard fixed, and
    /// (when it has no other error) every simulated schedule gives the sequential reference.
    /// (The values a simulated op writes derive from its op index, which insertions shift, so
    /// the original's reference is not compared.)
    #[test]
    fn fixed_programs_are_clean_and_run_as_the_reference(program in arb_program(config()), seed in any::<u64>()) {
        let ops = &program.ops;
        let f = fix_program(ops).expect("generated programs are valid input");
        prop_assert!(fixable_left(&f).is_empty(), "left: {:?}\n{}", fixable_left(&f), program);
        prop_assert!(keeps_original(ops, &f));
        prop_assert_eq!(f.summary.fixed, f.summary.fixable);
        prop_assert!(f.summary.inserted <= 2 * f.summary.fixed);
        prop_assert!(f.summary.max_per_hazard <= 2.0);
        if f.after.is_clean() {
            let reference = sim::reference(&f.ops).expect("runs on the simulator");
            for (k, chunk) in [1u32, 4, 16, u32::MAX].into_iter().enumerate() {
                let mut s = RandomScheduler(SplitMix::new(seed ^ k as u64));
                let outcome = sim::run(&f.ops, &mut s, SimConfig { chunk_words: chunk }).expect("runs");
                let differing = outcome.diverging(&reference);
                prop_assert!(differing.is_empty(), "fixed program diverges on {:?}\n{}", differing, program);
            }
        }
    }
}

/// The embedded regression file parses (a line that is not a seed panics) and holds seeds.
#[test]
fn regression_seeds_are_embedded() {
    let seeds = common::EmbeddedRegressions::new(include_str!("fix.proptest-regressions"));
    assert!(
        !seeds.is_empty(),
        "tests/fix.proptest-regressions holds no seed"
    );
}

/// The trace's ops, or `None` when the checker rejects it (bad input).
fn accepted(text: &str) -> Option<Vec<TraceOp>> {
    let mut ops = Vec::new();
    for line in text.lines() {
        match parse_line(line) {
            Ok(Some((op, _))) => ops.push(op),
            Ok(None) => {}
            Err(_) => return None,
        }
    }
    let mut checker = Checker::new();
    ops.iter()
        .all(|op| checker.check(op).is_ok())
        .then_some(ops)
}

/// What no synchronization fixes (use-after-free, invalid-free, warnings): (op, kind, buffer)
/// in the written trace (`after`), or in the original with its ops moved to the written trace's
/// indices.
fn unfixable(f: &Fixed, after: bool) -> Vec<(u64, HazardKind, Option<String>)> {
    // Original op index -> written op index.
    let map: Vec<u64> = (0..f.ops.len())
        .filter(|i| !f.inserted_at.contains(i))
        .map(|i| i as u64)
        .collect();
    let r = if after { &f.after } else { &f.before };
    let mut v: Vec<_> = r
        .hazards
        .iter()
        .filter(|h| !is_fixable(h.kind))
        .map(|h| {
            let op = if after { h.op } else { map[h.op as usize] };
            (op, h.kind, h.buffer.clone())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_conformance_and_example_trace_is_fixed() {
    let traces = common::fixtures_with_extension(common::CONFORMANCE, "jsonl")
        .into_iter()
        .chain(common::fixtures_with_extension(
            common::EXAMPLE_TRACES,
            "jsonl",
        ));
    let mut fixed_graphs = Vec::new();
    let mut fixed = 0;
    for t in traces {
        let Some(p) = accepted(t.text()) else {
            continue;
        };
        let f = fix_program(&p).unwrap();
        assert!(keeps_original(&p, &f), "{}", t.path);
        assert_eq!(
            fixable_left(&f),
            [],
            "{}: the fixed trace still has races\n{}",
            t.path,
            f.after.to_json()
        );
        assert_eq!(
            unfixable(&f, true),
            unfixable(&f, false),
            "{}: what no synchronization fixes changed",
            t.path
        );
        if f.summary.fixable > 0 {
            assert_eq!(f.summary.fixed, f.summary.fixable, "{}", t.path);
            fixed += 1;
            if p.iter().any(|op| matches!(op.op, Op::GraphLaunch { .. })) {
                fixed_graphs.push(t.name().to_string());
            }
        }
    }
    fixed_graphs.sort();
    fixed_graphs.dedup();
    assert!(fixed > 20, "only {fixed} traces with races");
    // Each graph trace with a race, fixed (the conformance and example copies share names).
    for name in [
        "graph-blocking-capture.jsonl",
        "graph-capture-does-not-run.jsonl",
        "graph-captured-event-after-end.jsonl",
        "graph-entry.jsonl",
        "graph-fork-join.jsonl",
        "graph-free-after-replay.jsonl",
        "graph-legacy-default.jsonl",
        "graph-pool-record-stream.jsonl",
        "graph-shared-pool.jsonl",
        "graph-static-input.jsonl",
        "graph-static-output.jsonl",
        "graph-temp-freed-in-capture.jsonl",
        "graph-two-graphs-two-streams.jsonl",
    ] {
        assert!(
            fixed_graphs.iter().any(|g| g == name),
            "{name} has no race fixed: {fixed_graphs:?}"
        );
    }
}

fn graph(text: &str) -> Fixed {
    fix_program(&program(text)).unwrap()
}

#[test]
fn a_static_input_copy_waits_for_the_replay_and_the_next_replay_for_the_copy() {
    let f = graph(include_str!("conformance/graph-static-input.jsonl"));
    assert_eq!(
        inserted(&f),
        [
            "record streamsan-fix-1 on s1",
            "s2 waits streamsan-fix-1",
            "record streamsan-fix-2 on s2",
            "s1 waits streamsan-fix-2"
        ]
    );
    // Before the copy (original op 7) and before the second launch (original op 8).
    assert_eq!(f.inserted_at, [7, 8, 10, 11]);
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn a_static_output_consumer_waits_for_the_replay() {
    let f = graph(include_str!("conformance/graph-static-output.jsonl"));
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on s1", "s2 waits streamsan-fix-1"]
    );
    assert_eq!(f.inserted_at, [6, 7]);
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn a_race_inside_the_body_is_fixed_inside_the_capture() {
    // The replay races between its own participants: the fix is a captured event, before the
    // captured op (original op 7), not at the launch.
    let f = graph(include_str!("conformance/graph-fork-join.jsonl"));
    assert_eq!(f.before.errors, 2);
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on s2", "s1 waits streamsan-fix-1"]
    );
    assert_eq!(f.inserted_at, [7, 8]);
    assert_eq!(f.insertions[0].before, 7);
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn a_temporary_freed_in_a_capture_gets_record_stream_there() {
    let f = graph(include_str!(
        "conformance/graph-temp-freed-in-capture.jsonl"
    ));
    assert_eq!(inserted(&f), ["record_stream(t1, s2)"]);
    assert_eq!(
        f.inserted_at,
        [8],
        "just before the free, inside the capture"
    );
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn graphs_sharing_a_pool_replayed_on_two_streams_are_ordered() {
    let f = graph(include_str!("conformance/graph-shared-pool.jsonl"));
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on s1", "s2 waits streamsan-fix-1"]
    );
    assert_eq!(f.inserted_at, [12, 13], "before the second launch");
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}

#[test]
fn the_fix_sentence_and_the_fix_are_one_plan() {
    // The report's sentence names what the fixer inserts: the same streams, ops and buffer.
    for (text, words) in [
        (
            include_str!("conformance/graph-fork-join.jsonl"),
            "in the capture of graph g, record an event on s2 after op 5 and make s1 wait on it before op 7",
        ),
        (
            include_str!("conformance/graph-static-output.jsonl"),
            "record an event on s1 after op 5 and make s2 wait on it before op 6",
        ),
        (
            include_str!("conformance/graph-temp-freed-in-capture.jsonl"),
            "in the capture of graph g, call record_stream(t1, s2) before its free at op 8",
        ),
        (
            // The conflict is a replay launched after the free: record_stream at the free
            // cannot order it (nor can the owner's record_stream), a wait can.
            include_str!("conformance/graph-pool-warmup-after-replay.jsonl"),
            "record an event on s1 after op 5 and make s2 wait on it before op 7",
        ),
    ] {
        let f = graph(text);
        let h = &f.before.hazards[0];
        let plan = h.detail.plan.as_ref().expect("a race has a plan");
        assert_eq!(h.fix.as_deref(), Some(plan.sentence().as_str()));
        assert!(
            plan.sentence().starts_with(words),
            "{} does not start with {words}",
            plan.sentence()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random programs with graphs: the fix keeps the original ops, removes every race and
    /// leaves what no synchronization fixes as it was.
    #[test]
    fn fixed_graph_programs_are_clean(
        shape in programs::shape(),
        steps in prop::collection::vec((any::<u8>(), any::<u64>()), 0..40),
    ) {
        let mut shape = shape;
        shape.graphs = true;
        let p = programs::program(&shape, &steps);
        let f = fix_program(&p).unwrap();
        prop_assert!(keeps_original(&p, &f));
        // A race is left only where a capture underway kept it from being fixed.
        let map: Vec<usize> = (0..f.ops.len()).filter(|i| !f.inserted_at.contains(i)).collect();
        let left: Vec<(u64, HazardKind)> = fixable_left(&f)
            .into_iter()
            .map(|(op, kind)| (map.iter().position(|&w| w as u64 == op).unwrap_or(usize::MAX) as u64, kind))
            .filter(|&(op, kind)| !f.blocked.iter().any(|b| b.0 == op && b.1 == kind))
            .collect();
        prop_assert_eq!(
            left,
            vec![],
            "the fixed program still has races\n{}\n{}",
            f.after.to_json(),
            {
                let mut text = String::new();
                for op in &p {
                    streamsan::trace::write_op(op, &mut text);
                }
                text
            }
        );
        prop_assert_eq!(unfixable(&f, true), unfixable(&f, false));
    }
}

#[test]
fn work_from_before_a_capture_is_waited_for_through_an_event_recorded_before_it() {
    // b's launch (op 2) races with the host's write (op 4), by which time b is capturing: an
    // event recorded on b then would be captured, and the host may not synchronize with a
    // capturing stream. The fix records an event on b just before its capture begins.
    let f = graph(
        r#"{"op":"stream_create","stream":"b","blocking":true}
{"op":"alloc","buffer":"p","bytes":1000,"memory":"pinned"}
{"op":"launch","stream":"b","reads":["p"],"writes":["p"]}
{"op":"graph_begin","graph":"g0","stream":"b"}
{"op":"host_write","buffer":"p"}
{"op":"graph_end","graph":"g0"}"#,
    );
    assert_eq!(f.before.errors, 1);
    assert_eq!(
        inserted(&f),
        ["record streamsan-fix-1 on b", "host syncs streamsan-fix-1"]
    );
    assert_eq!(
        f.inserted_at,
        [3, 5],
        "before graph_begin, and before the write"
    );
    assert!(f.blocked.is_empty());
    assert!(f.after.hazards.is_empty(), "{}", f.after.to_json());
}
