//! CUDA graphs on the simulator: every graph hazard of the conformance and example traces is
//! confirmed by a steered schedule (or says why it is not run), the fixed variants run like their
//! reference under every schedule tried, and replays use the pool memory the allocator model
//! gives them: two graphs that share a pool overlap their temporaries, a `record_stream`'d
//! temporary freed inside a capture is not handed out again in it.

use std::path::Path;

use streamsan::exec::{sim, Executor};
use streamsan::fuzz::campaign::{confirm_report, SimExecutor};
use streamsan::report::Confirmation;
use streamsan::trace::{TraceOp, TraceReader};
use streamsan::{Checker, HazardKind};

fn parse(text: &str) -> Vec<TraceOp> {
    TraceReader::new(text.as_bytes(), "t.jsonl")
        .map(|r| r.map(|(op, _)| op))
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The accepted graph traces of the conformance suite and the examples.
fn graph_traces() -> Vec<(String, Vec<TraceOp>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["tests/conformance", "examples/traces/hazards"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                name.starts_with("graph-") && name.ends_with(".jsonl") && !name.contains("-bad-")
            })
            .collect();
        files.sort();
        for f in files {
            let ops = parse(&std::fs::read_to_string(&f).unwrap());
            out.push((f.display().to_string(), ops));
        }
    }
    assert!(out.len() > 20, "{}", out.len());
    out
}

/// Traces whose race no run can show. None: a replay that reads memory its buffer never wrote
/// (`graph-free-after-replay.jsonl`) sees whether the block's next owner wrote it first (the
/// simulator's tagged reads of such memory depend on the writes that fell before them).
const NOT_OBSERVABLE: &[&str] = &[];

#[test]
fn every_graph_hazard_is_confirmed_or_says_why_not() {
    let mut confirmed = 0;
    for (name, ops) in graph_traces() {
        let mut report =
            Checker::check_all(&ops).unwrap_or_else(|(i, e)| panic!("{name}: op {i}: {e:?}"));
        confirm_report(&ops, &mut report, &mut SimExecutor::default(), 5, |_, _| {});
        for h in &report.hazards {
            let race = matches!(
                h.kind,
                HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree
            );
            match &h.confirmation {
                Some(Confirmation::Ran { observed, .. }) if race => {
                    if *observed > 0 {
                        confirmed += 1;
                    } else {
                        assert!(
                            NOT_OBSERVABLE.iter().any(|n| name.ends_with(n)),
                            "{name}: {} at op {} not confirmed\n{}",
                            h.kind,
                            h.op,
                            report.to_json()
                        );
                    }
                }
                Some(Confirmation::Skipped { skipped, .. }) => {
                    assert!(
                        !race,
                        "{name}: {} at op {} skipped: {skipped}",
                        h.kind, h.op
                    );
                    assert!(!skipped.is_empty());
                }
                other => panic!("{name}: {} at op {}: {other:?}", h.kind, h.op),
            }
        }
    }
    println!("{confirmed} graph hazards confirmed");
    assert!(confirmed >= 15, "{confirmed}");
}

#[test]
fn traces_without_hazards_run_like_their_reference() {
    let mut clean = 0;
    for (name, ops) in graph_traces() {
        let report = Checker::check_all(&ops).unwrap();
        if report.errors > 0 {
            continue;
        }
        clean += 1;
        let reference = sim::reference(&ops).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut exec = SimExecutor::default();
        for seed in 0..32 {
            let o = exec.random(&ops, seed).unwrap();
            assert!(
                o.diverging(&reference).is_empty(),
                "{name}, seed {seed}: {:?}",
                o.diverging(&reference)
            );
        }
    }
    assert!(clean >= 10, "{clean}");
}

/// Two graphs captured on `s1`: each a temporary `t1`/`t2` of its pool, written then read (the
/// pool gives a freed block to the same stream again); the second graph is launched on `s2`
/// without waiting for the first (or, with `wait`, after it).
fn two_graphs(pool2: &str, wait: bool) -> String {
    let mut t = String::from(
        r#"{"op":"graph_begin","graph":"g1","stream":"s1","pool":"p"}
{"op":"alloc","buffer":"t1","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["t1"]}
{"op":"alloc","buffer":"o1","bytes":4096,"stream":"s1"}
"#,
    );
    t.push_str(
        r#"{"op":"launch","stream":"s1","reads":["t1"],"writes":["o1"]}
{"op":"free","buffer":"t1"}
{"op":"graph_end","graph":"g1"}
"#,
    );
    t.push_str(&format!(
        r#"{{"op":"graph_begin","graph":"g2","stream":"s1","pool":"{pool2}"}}
{{"op":"alloc","buffer":"t2","bytes":4096,"stream":"s1"}}
{{"op":"launch","stream":"s1","writes":["t2"]}}
{{"op":"alloc","buffer":"o2","bytes":4096,"stream":"s1"}}
{{"op":"launch","stream":"s1","reads":["t2"],"writes":["o2"]}}
{{"op":"free","buffer":"t2"}}
{{"op":"graph_end","graph":"g2"}}
{{"op":"graph_launch","graph":"g1","stream":"s1"}}
"#
    ));
    if wait {
        t.push_str(
            r#"{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
"#,
        );
    }
    t.push_str(
        r#"{"op":"graph_launch","graph":"g2","stream":"s2"}
{"op":"stream_sync","stream":"s1"}
{"op":"stream_sync","stream":"s2"}
"#,
    );
    t
}

#[test]
fn graphs_sharing_a_pool_overlap_their_temporaries() {
    let divergent = |text: &str| {
        let ops = parse(text);
        let reference = sim::reference(&ops).unwrap();
        let mut exec = SimExecutor::default();
        (0..64)
            .filter(|&seed| {
                !exec
                    .random(&ops, seed)
                    .unwrap()
                    .diverging(&reference)
                    .is_empty()
            })
            .count()
    };
    let shared = Checker::check_all(&parse(&two_graphs("p", false))).unwrap();
    assert!(
        shared
            .hazards
            .iter()
            .any(|h| h.kind == HazardKind::ReuseRace),
        "{}",
        shared.to_json()
    );
    assert!(
        divergent(&two_graphs("p", false)) > 0,
        "shared pool, concurrent replays"
    );
    assert_eq!(
        divergent(&two_graphs("p", true)),
        0,
        "shared pool, ordered replays"
    );
    assert_eq!(divergent(&two_graphs("q", false)), 0, "private pools");
    assert!(Checker::check_all(&parse(&two_graphs("q", false)))
        .unwrap()
        .is_clean());
}

/// A temporary used by a forked stream and freed inside the capture; a second temporary of the
/// same size is then written by the origin before the join.
fn freed_in_capture(record_stream: bool) -> String {
    let mut t = String::from(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["x"]}
{"op":"stream_sync","stream":"s1"}
{"op":"graph_begin","graph":"g","stream":"s1"}
{"op":"alloc","buffer":"t1","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","reads":["x"],"writes":["t1"]}
{"op":"event_record","event":"f","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"f"}
{"op":"alloc","buffer":"y","bytes":4096,"stream":"s2"}
{"op":"launch","stream":"s2","reads":["t1"],"writes":["y"]}
"#,
    );
    if record_stream {
        t.push_str("{\"op\":\"record_stream\",\"buffer\":\"t1\",\"stream\":\"s2\"}\n");
    }
    t.push_str(
        r#"{"op":"free","buffer":"t1"}
{"op":"alloc","buffer":"t2","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","reads":["x"],"writes":["t2"]}
{"op":"event_record","event":"j","stream":"s2"}
{"op":"event_wait","stream":"s1","event":"j"}
{"op":"graph_end","graph":"g"}
{"op":"graph_launch","graph":"g","stream":"s1"}
{"op":"stream_sync","stream":"s1"}
"#,
    );
    t
}

#[test]
fn a_temporary_freed_in_a_capture_is_reused_only_without_record_stream() {
    for (rs, racy) in [(false, true), (true, false)] {
        let ops = parse(&freed_in_capture(rs));
        let report = Checker::check_all(&ops).unwrap();
        assert_eq!(
            report
                .hazards
                .iter()
                .any(|h| h.kind == HazardKind::ReuseRace),
            racy,
            "record_stream {rs}: {}",
            report.to_json()
        );
        let reference = sim::reference(&ops).unwrap();
        let mut exec = SimExecutor::default();
        let divergent = (0..64)
            .filter(|&seed| {
                !exec
                    .random(&ops, seed)
                    .unwrap()
                    .diverging(&reference)
                    .is_empty()
            })
            .count();
        assert_eq!(
            divergent > 0,
            racy,
            "record_stream {rs}: {divergent} of 64 diverged"
        );
    }
}

#[test]
fn launches_of_one_graph_on_two_streams_are_ordered() {
    let ops = parse(
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"graph_begin","graph":"g","stream":"s1"}
{"op":"launch","stream":"s1","reads":["x"],"writes":["x"]}
{"op":"graph_end","graph":"g"}
{"op":"graph_launch","graph":"g","stream":"s1"}
{"op":"graph_launch","graph":"g","stream":"s2"}
{"op":"stream_sync","stream":"s1"}
{"op":"stream_sync","stream":"s2"}
"#,
    );
    let reference = sim::reference(&ops).unwrap();
    let mut exec = SimExecutor::default();
    for seed in 0..64 {
        assert!(exec
            .random(&ops, seed)
            .unwrap()
            .diverging(&reference)
            .is_empty());
    }
    let x = sim::explore(&ops, sim::SimConfig { chunk_words: 256 }, 100_000).unwrap();
    assert!(
        x.complete && x.divergent.is_empty(),
        "{} schedules",
        x.schedules
    );
}
