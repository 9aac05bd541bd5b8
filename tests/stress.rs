//! Stress: the long and hostile trace shapes of `streamsan bench --shape` at moderate sizes,
//! with deterministic bounds on what the checker keeps — history entries, tombstones, clock
//! storage, the graph's provenance — and on the report's size. Never wall time.
//!
//! Each bound is far below what the shape would cost if the checker kept what cannot decide a
//! verdict (the figures before the hardening are in docs/performance.md): memory must follow the
//! live working set, not the trace length, the size of the buffers or the number of pairs of
//! participants. `streamsan bench --shape NAME --size N` runs the same shapes at full size.

use streamsan::checker::{Limits, Stats};
use streamsan::graph::{DepGraph, GraphConfig};
use streamsan::report::Report;
use streamsan::trace::TraceOp;
use streamsan::workload::Shape;
use streamsan::Checker;

#[path = "../fuzz/common.rs"]
#[allow(dead_code)]
mod common;

/// Checks `shape` at `size` with `limits`; the report and the peak of each counter (sampled
/// every `every` ops and at the end: counting clock storage walks every clock).
fn run_with(shape: Shape, size: u64, every: u64, limits: Limits) -> (Report, Stats) {
    let mut checker = Checker::with_limits(limits);
    let mut peak = checker.stats();
    shape.generate(size, |op| {
        checker.check(&op).expect("a valid op");
        if checker.ops() % every == 0 {
            peak = peak.max(&checker.stats());
        }
    });
    peak = peak.max(&checker.stats());
    (checker.finish(), peak)
}

fn run(shape: Shape, size: u64, every: u64) -> (Report, Stats) {
    run_with(shape, size, every, Limits::default())
}

/// The JSON report's size in bytes.
fn json_len(report: &Report) -> usize {
    report.to_json().len()
}

#[test]
fn churned_temporaries_keep_one_tombstone() {
    let n = 20_000;
    let (report, peak) = run(Shape::Churn, n, 1);
    assert_eq!(report.ops, 3 * n);
    assert!(report.hazards.is_empty());
    // The write of the latest cycle subsumes every earlier one at the same bytes.
    assert!(peak.history <= 2, "{peak:?}");
    assert!(peak.graveyard <= 2, "{peak:?}");
    assert!(peak.generations <= 1, "{peak:?}");
    // Also when every freed buffer goes through the interval index.
    let (again, peak) = run_with(
        Shape::Churn,
        n,
        1,
        Limits {
            history_index_at: 0,
            small_freed_pages: 0,
            sweep_at: 0,
        },
    );
    assert_eq!(again, report);
    assert!(peak.graveyard <= 2 && peak.history <= 2, "{peak:?}");
}

#[test]
fn huge_buffers_cost_what_small_ones_cost() {
    for log2 in [12, 30, 40, 44] {
        let (report, peak) = run(Shape::Huge, log2, 1);
        // The reuse race with the first buffer's write, the data race with the second's.
        let kinds: Vec<&str> = report.hazards.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(kinds, ["data-race", "reuse-race"], "2^{log2} bytes");
        assert!(
            peak.graveyard <= 1 && peak.history <= 2,
            "2^{log2}: {peak:?}"
        );
        assert_eq!(
            report.hazards[1].free.as_ref().map(|f| f.op),
            Some(2),
            "the reuse race names the free"
        );
    }
}

#[test]
fn many_streams_keep_small_clocks() {
    let n = 5_000;
    let (report, peak) = run(Shape::Streams, n, 64);
    assert!(report.hazards.is_empty());
    assert_eq!(peak.participants as u64, n + 2);
    // Each stream's clock holds the path to its own component: a few trie nodes, not a
    // component for every stream (25,000,000 for dense clocks).
    assert!(
        peak.clock_entries < 100 * n as usize,
        "{} clock components for {n} streams",
        peak.clock_entries
    );
}

#[test]
fn a_ring_of_streams_shares_clocks_and_provenance() {
    let n = 2_000;
    let (report, peak) = run(Shape::Ring, n, 64);
    assert_eq!(report.hazards.len(), 1);
    assert!(
        peak.clock_entries < 200 * n as usize,
        "{} clock components for a ring of {n}",
        peak.clock_entries
    );
    // The dependency graph's walk (text, dot, html reports): the provenance of every lane.
    let mut report = report;
    let mut g = DepGraph::new(&report, GraphConfig::default());
    let mut k = 0;
    Shape::Ring.generate(n, |op: TraceOp| {
        g.add(k, &op);
        k += 1;
    });
    let stats = g.stats();
    assert!(
        stats.know_nodes < 40 * n as usize,
        "{} provenance nodes for a ring of {n}",
        stats.know_nodes
    );
    g.finish(&mut report, "ring");
    let why = &report.hazards[0].detail.why;
    assert!(
        why.iter()
            .any(|l| l.contains("latest synchronization with s0")),
        "{why:?}"
    );
}

#[test]
fn a_race_repeated_in_a_loop_reports_its_latest_conflict() {
    let n = 2_000;
    let (report, peak) = run(Shape::LoopRace, n, 1);
    assert_eq!(report.hazards.len() as u64, n - 1);
    for h in &report.hazards {
        assert_eq!(h.conflicts.len(), 1, "{h:?}");
        // The read of the previous round.
        assert_eq!(h.conflicts[0].op + 1, h.op);
    }
    assert!(peak.history <= 2, "{peak:?}");
    let per_hazard = json_len(&report) / report.hazards.len();
    assert!(per_hazard < 1_000, "{per_hazard} bytes of JSON per hazard");
}

#[test]
fn one_buffer_at_many_ranges_lists_each_latest_op() {
    let n = 20_000;
    for limits in [
        Limits::default(),
        Limits {
            history_index_at: 0,
            small_freed_pages: 0,
            sweep_at: 0,
        },
    ] {
        let (report, peak) = run_with(Shape::Ranges, n, 1, limits);
        assert_eq!(report.hazards.len(), 1);
        // s's and t's latest writes: the report stays bounded by the participants.
        let ops: Vec<u64> = report.hazards[0].conflicts.iter().map(|c| c.op).collect();
        assert_eq!(ops, [n - 1, n], "{limits:?}");
        // Every range once, then the final read over all of them and the gaps between them.
        assert!(peak.history as u64 <= 3 * n + 2, "{peak:?}");
        assert!(json_len(&report) < 2_000);
    }
}

#[test]
fn one_launch_with_many_regions() {
    let n = 20_000;
    let (report, peak) = run(Shape::Regions, n, 1);
    assert!(report.hazards.is_empty());
    assert!(peak.history as u64 <= 2 * n + 2, "{peak:?}");
}

#[test]
fn live_buffers_cost_little_each() {
    let n = 20_000;
    let (report, peak) = run(Shape::Live, n, 1);
    assert!(report.hazards.is_empty());
    assert_eq!(peak.generations as u64, n);
    // One entry per buffer: its write subsumes the allocation's use.
    assert_eq!(peak.history as u64, n);
    let gen = std::mem::size_of::<streamsan::shadow::Generation>();
    let access = std::mem::size_of::<streamsan::shadow::Access>();
    assert!(
        gen <= 128 && access <= 72,
        "Generation {gen} bytes, Access {access}"
    );
}

// ---------------------------------------------------------------------------------------------
// The shapes in the fuzz corpus: seeds of `checker_oracle` whose decoded programs have them.

/// Writes the decoder's bytes for small instances of the shapes (see `fuzz/common.rs`,
/// `decode_program`): a header, then one decision per op.
mod seeds {
    /// A header: `extra` (1 to 3) streams besides "default" (implicit), `buffers` names, no
    /// `addr` (the first byte is `extra - 1` modulo 3, and not 0 in bits 2 and 3).
    pub fn header(extra: u8, buffers: u8) -> Vec<u8> {
        let h0 = [6, 4, 5][usize::from(extra - 1)];
        vec![h0, buffers - 1, 0]
    }

    /// A launch on stream `s` (0 is "default") with whole-buffer reads and writes of names.
    pub fn launch(v: &mut Vec<u8>, s: u8, reads: &[u8], writes: &[u8]) {
        v.extend([0, s, 1, reads.len() as u8]);
        for &k in reads {
            v.extend([k, 0]);
        }
        v.push(writes.len() as u8);
        for &k in writes {
            v.extend([k, 0]);
        }
    }

    /// A launch on `s` writing bytes `[off, off + len)` (in 255ths of the buffer) of name `k`.
    pub fn launch_range(v: &mut Vec<u8>, s: u8, k: u8, off: u8, len: u8) {
        v.extend([0, s, 1, 0, 1, k, 2, off, len]);
    }

    /// An alloc of name `k` (not live) of `SIZES[size]` bytes of device memory on stream `s`.
    pub fn alloc(v: &mut Vec<u8>, k: u8, size: u8, s: u8) {
        v.extend([4, k, size, 2, 1, s]);
    }

    /// A caching free of live name `k`.
    pub fn free(v: &mut Vec<u8>, k: u8) {
        v.extend([4, k, 1]);
    }

    pub fn record(v: &mut Vec<u8>, event: u8, s: u8) {
        v.extend([16, event, s]);
    }

    pub fn wait(v: &mut Vec<u8>, s: u8, event: u8) {
        v.extend([18, s, event]);
    }
}

/// The seeds: (file name, bytes, what the decoded program must show).
fn shape_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use seeds::*;
    let mut out = Vec::new();
    // churn: alloc, write, free of one name on s1, 13 times.
    let mut v = header(1, 1);
    for _ in 0..13 {
        alloc(&mut v, 0, 4, 1);
        launch(&mut v, 1, &[], &[0]);
        free(&mut v, 0);
    }
    out.push(("shape-churn", v));
    // loop-race: s1 writes x0 and records e0; s2 waits e0 and reads x0; 10 rounds.
    let mut v = header(2, 1);
    for _ in 0..10 {
        launch(&mut v, 1, &[], &[0]);
        record(&mut v, 0, 1);
        wait(&mut v, 2, 0);
        launch(&mut v, 2, &[0], &[]);
    }
    out.push(("shape-loop-race", v));
    // ranges: one 4096-byte buffer, s1 and s2 write 18 distinct ranges, default reads it all.
    let mut v = header(2, 1);
    alloc(&mut v, 0, 7, 1);
    for k in 0..18u8 {
        launch_range(&mut v, 1 + k % 2, 0, 14 * k, 1);
    }
    launch(&mut v, 0, &[0], &[]);
    out.push(("shape-ranges", v));
    // ring: three streams, each waits on the previous one's event, twice around.
    let mut v = header(3, 1);
    for round in 0..2u8 {
        for s in 1..=3u8 {
            if round > 0 || s > 1 {
                wait(&mut v, s, (s + 2) % 3);
            }
            launch(&mut v, s, &[0], &[0]);
            record(&mut v, s % 3, s);
        }
    }
    launch(&mut v, 2, &[], &[0]);
    out.push(("shape-ring", v));
    // huge (reuse at the same bytes): alloc, write, free on s1; alloc again, write on s1,
    // read on s2 without an event.
    let mut v = header(2, 1);
    for _ in 0..3 {
        alloc(&mut v, 0, 7, 1);
        launch(&mut v, 1, &[], &[0]);
        launch(&mut v, 2, &[0], &[]);
        free(&mut v, 0);
    }
    out.push(("shape-reuse", v));
    // live: four buffers allocated and written, never freed, read by another stream.
    let mut v = header(2, 4);
    for k in 0..4 {
        alloc(&mut v, k, 4, 1);
        launch(&mut v, 1, &[], &[k]);
    }
    launch(&mut v, 2, &[0, 1], &[]);
    out.push(("shape-live", v));
    out
}

#[test]
fn shape_seeds_decode_to_their_shapes_and_agree() {
    use streamsan::trace::Op;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/checker_oracle");
    for (name, bytes) in shape_seeds() {
        let ops = common::decode_program(&bytes);
        let count = |f: &dyn Fn(&Op) -> bool| ops.iter().filter(|o| f(&o.op)).count();
        let (frees, launches, waits) = (
            count(&|o| matches!(o, Op::Free { .. })),
            count(&|o| matches!(o, Op::Launch { .. })),
            count(&|o| matches!(o, Op::EventWait { .. })),
        );
        match name {
            "shape-churn" => assert_eq!((frees, launches), (13, 13), "{name}"),
            "shape-loop-race" => assert_eq!((launches, waits), (20, 10), "{name}"),
            "shape-ranges" => assert_eq!(launches, 19, "{name}"),
            "shape-ring" => assert_eq!((launches, waits), (7, 5), "{name}"),
            "shape-reuse" => assert_eq!((frees, launches), (3, 6), "{name}"),
            _ => assert_eq!(launches, 5, "{name}"),
        }
        common::check_checker_oracle(&bytes);
        let committed = std::fs::read(dir.join(name)).unwrap_or_default();
        assert_eq!(
            committed, bytes,
            "fuzz/corpus/checker_oracle/{name} is stale: run `cargo test --test stress -- --ignored write_shape_seeds`"
        );
    }
    let report = common::checker_report(
        &common::decode_program(&shape_seeds()[1].1),
        Limits::default(),
    )
    .expect("accepted");
    assert_eq!(
        report.hazards.len(),
        9,
        "one race per round after the first"
    );
}

#[test]
#[ignore = "writes fuzz/corpus/checker_oracle/shape-*; run by hand"]
fn write_shape_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/checker_oracle");
    for (name, bytes) in shape_seeds() {
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
}

/// A graph with a forked stream and pool temporaries, then `replays` launches alternating
/// between two streams with no host synchronization at all; `racy` adds a read of the static
/// output on a third stream after every launch, with no event.
fn replay_loop(replays: u64, racy: bool) -> (Report, Stats, Stats) {
    let lines = [
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}"#,
        r#"{"op":"graph_begin","graph":"g","stream":"s1"}"#,
        r#"{"op":"alloc","buffer":"out","bytes":4096,"stream":"s1"}"#,
        r#"{"op":"event_record","event":"fork","stream":"s1"}"#,
        r#"{"op":"event_wait","stream":"side","event":"fork"}"#,
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"side"}"#,
        r#"{"op":"launch","stream":"side","reads":["x"],"writes":["a"]}"#,
        r#"{"op":"event_record","event":"join","stream":"side"}"#,
        r#"{"op":"alloc","buffer":"t","bytes":4096,"stream":"s1"}"#,
        r#"{"op":"launch","stream":"s1","reads":["x"],"writes":["t"]}"#,
        r#"{"op":"alloc","buffer":"u","bytes":4096,"stream":"s1"}"#,
        r#"{"op":"launch","stream":"s1","reads":["t"],"writes":["u"]}"#,
        r#"{"op":"free","buffer":"t"}"#,
        r#"{"op":"event_wait","stream":"s1","event":"join"}"#,
        r#"{"op":"launch","stream":"s1","reads":["u","a"],"writes":["out"]}"#,
        r#"{"op":"free","buffer":"u"}"#,
        r#"{"op":"free","buffer":"a"}"#,
        r#"{"op":"graph_end","graph":"g"}"#,
    ];
    let mut checker = Checker::new();
    for line in lines {
        let (op, _) = streamsan::trace::parse_line(line)
            .expect("a valid line")
            .expect("an op");
        checker.check(&op).expect("a valid op");
    }
    let launch = |s: &str| {
        TraceOp::from(streamsan::trace::Op::GraphLaunch {
            graph: "g".into(),
            stream: s.into(),
        })
    };
    let read = TraceOp::from(streamsan::trace::Op::Launch {
        stream: "s3".into(),
        name: None,
        reads: vec![streamsan::trace::Region::whole("out")],
        writes: vec![],
    });
    let mut early = checker.stats();
    let mut peak = checker.stats();
    for k in 0..replays {
        checker
            .check(&launch(if k % 2 == 0 { "s1" } else { "s2" }))
            .expect("a valid op");
        if racy {
            checker.check(&read).expect("a valid op");
        }
        let stats = checker.stats();
        peak = peak.max(&stats);
        if k < 200 {
            early = early.max(&stats);
        }
    }
    (checker.finish(), early, peak)
}

#[test]
fn graph_replays_keep_flat_memory() {
    // History, generations, tombstones and clock storage over 2,000 replays with no host
    // synchronization peak within the first 200: a replay's accesses subsume the previous
    // replay's on the graph's own participants (the history's flat lists hold covered entries
    // until they move into the interval index, as for any loop of streams).
    let (report, early, peak) = replay_loop(2_000, false);
    report.assert_clean();
    assert_eq!(report.ops, 18 + 2_000);
    let flat = |s: &Stats| {
        (
            s.history,
            s.generations,
            s.graveyard,
            s.clock_entries,
            s.participants,
        )
    };
    assert_eq!(flat(&peak), flat(&early), "early {early:?}\npeak {peak:?}");
    assert!(peak.history <= 128, "{peak:?}");
    // The same with races: the read after every launch, and every launch after the first
    // (its write of `out`, after the previous read): flat state.
    let (report, early, peak) = replay_loop(2_000, true);
    assert_eq!(report.hazards.len(), 2 * 2_000 - 1);
    assert_eq!(flat(&peak), flat(&early), "early {early:?}\npeak {peak:?}");
}

#[test]
fn graph_replays_shape_is_clean_and_flat() {
    let (report, small) = run(Shape::GraphReplays, 20, 64);
    report.assert_clean();
    let (report, large) = run(Shape::GraphReplays, 200, 64);
    report.assert_clean();
    assert_eq!(
        report.ops, large.ops,
        "the shape's op count is the report's"
    );
    let flat = |s: &Stats| {
        (
            s.history,
            s.generations,
            s.graveyard,
            s.clock_entries,
            s.participants,
        )
    };
    assert_eq!(
        flat(&small),
        flat(&large),
        "small {small:?}\nlarge {large:?}"
    );
}
