//! The checker against the brute-force oracle (`streamsan::oracle`): on the conformance traces, on
//! hand-made regressions, and on random well-formed programs.
//!
//! Both sides are reduced to what the happens-before semantics decide: for every hazard its op
//! index, kind, buffer, and the sorted, deduplicated op indices of its conflicts. The oracle
//! shares the allocator policies (`streamsan::alloc`) with the checker, so agreement here says
//! nothing about where allocations land: `tests/alloc.rs` checks the allocator on its own.
//!
//! Fixtures: `tests/conformance/*.jsonl` and `tests/oracle-regressions/*.jsonl`, embedded at build
//! time (`tests/common/mod.rs`), so the tests run wherever their executable is.

mod common;
mod programs;

use std::collections::{HashMap, HashSet};

use common::Fixture;
use programs::{program, shape, Rng, Shape};

use proptest::prelude::*;
use proptest::test_runner::Config;
use streamsan::oracle::{oracle_hazards, OracleHazard};
use streamsan::trace::{Id, MemoryKind, Op, Region, TraceOp};
use streamsan::{Checker, HazardKind};

/// A hazard reduced to the parts both sides decide: op, kind, buffer, the conflicting ops, the
/// captured op of a replay's hazard, and the conflicts that are replays as (launch, captured).
type Key = (
    u64,
    HazardKind,
    Option<String>,
    Vec<u64>,
    Option<u64>,
    Vec<(u64, u64)>,
);

fn oracle_keys(ops: &[TraceOp]) -> Result<Vec<Key>, String> {
    Ok(oracle_hazards(ops)?
        .into_iter()
        .map(
            |OracleHazard {
                 op,
                 kind,
                 buffer,
                 conflicts,
                 captured,
                 replayed,
             }| (op, kind, buffer, conflicts, captured, replayed),
        )
        .collect())
}

fn checker_keys(ops: &[TraceOp]) -> Result<Vec<Key>, String> {
    let mut keys: Vec<Key> = Checker::check_all(ops)
        .map_err(|(i, e)| format!("op {i}: {e:?}"))?
        .hazards
        .into_iter()
        .map(|h| {
            let mut c: Vec<u64> = h.conflicts.iter().map(|c| c.op).collect();
            c.sort_unstable();
            c.dedup();
            let mut r: Vec<(u64, u64)> = h
                .conflicts
                .iter()
                .filter_map(|c| c.captured.map(|m| (c.op, m)))
                .collect();
            r.sort_unstable();
            r.dedup();
            let captured = h.access.as_ref().and_then(|a| a.captured);
            (h.op, h.kind, h.buffer, c, captured, r)
        })
        .collect();
    keys.sort();
    Ok(keys)
}

/// Both sides on one program: `Ok(None)` when they agree, `Ok(Some(..))` with both answers when
/// they do not, `Err` when either side rejects the program.
#[allow(clippy::type_complexity)]
fn compare(ops: &[TraceOp]) -> Result<Option<(Vec<Key>, Vec<Key>)>, String> {
    let o = oracle_keys(ops).map_err(|e| format!("oracle rejects: {e}"))?;
    let c = checker_keys(ops).map_err(|e| format!("checker rejects: {e}"))?;
    Ok((o != c).then_some((o, c)))
}

// ---------------------------------------------------------------------------------------------
// A minimal JSON Lines reader for the conformance traces (the test's own, independent of the
// crate's reader).

fn id(v: &serde_json::Value) -> Id {
    match v {
        serde_json::Value::String(s) => Id::from(s.clone()),
        serde_json::Value::Number(n) => Id::from(n.to_string()),
        other => panic!("not an id: {other}"),
    }
}

fn region(v: &serde_json::Value) -> Region {
    match v {
        serde_json::Value::Object(o) => Region {
            buffer: id(&o["buffer"]),
            offset: o.get("offset").and_then(|v| v.as_u64()).unwrap_or(0),
            bytes: o.get("bytes").and_then(|v| v.as_u64()),
        },
        other => Region::whole(id(other)),
    }
}

fn regions(v: Option<&serde_json::Value>) -> Vec<Region> {
    v.and_then(|v| v.as_array())
        .map(|a| a.iter().map(region).collect())
        .unwrap_or_default()
}

fn parse_op(line: &str) -> Op {
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
    let s = |k: &str| id(&v[k]);
    let opt = |k: &str| v.get(k).map(id);
    let b = |k: &str| v[k].as_bool().expect("bool");
    match v["op"].as_str().expect("op") {
        "stream_create" => Op::StreamCreate {
            stream: s("stream"),
            device: v.get("device").and_then(|d| d.as_u64()).unwrap_or(0),
            blocking: v.get("blocking").and_then(|d| d.as_bool()).unwrap_or(false),
        },
        "alloc" => Op::Alloc {
            buffer: s("buffer"),
            bytes: v["bytes"].as_u64().expect("bytes"),
            stream: opt("stream"),
            memory: match v.get("memory").and_then(|m| m.as_str()) {
                None | Some("device") => MemoryKind::Device,
                Some("pinned") => MemoryKind::Pinned,
                Some("managed") => MemoryKind::Managed,
                Some(m) => panic!("memory {m}"),
            },
            addr: v.get("addr").and_then(|a| a.as_u64()),
            pool: opt("pool"),
        },
        "free" => Op::Free {
            buffer: s("buffer"),
            stream: opt("stream"),
        },
        "record_stream" => Op::RecordStream {
            buffer: s("buffer"),
            stream: s("stream"),
        },
        "launch" => Op::Launch {
            stream: s("stream"),
            name: v.get("name").and_then(|n| n.as_str()).map(Into::into),
            reads: regions(v.get("reads")),
            writes: regions(v.get("writes")),
        },
        "copy" => Op::Copy {
            stream: s("stream"),
            src: region(&v["src"]),
            dst: region(&v["dst"]),
        },
        "memset" => Op::Memset {
            stream: s("stream"),
            dst: region(&v["dst"]),
        },
        "host_read" => Op::HostRead {
            buffer: region(&v["buffer"]),
        },
        "host_write" => Op::HostWrite {
            buffer: region(&v["buffer"]),
        },
        "event_create" => Op::EventCreate { event: s("event") },
        "event_destroy" => Op::EventDestroy { event: s("event") },
        "event_record" => Op::EventRecord {
            event: s("event"),
            stream: s("stream"),
        },
        "event_wait" => Op::EventWait {
            stream: s("stream"),
            event: s("event"),
        },
        "event_sync" => Op::EventSync { event: s("event") },
        "event_query" => Op::EventQuery {
            event: s("event"),
            complete: b("complete"),
        },
        "stream_sync" => Op::StreamSync {
            stream: s("stream"),
        },
        "stream_query" => Op::StreamQuery {
            stream: s("stream"),
            complete: b("complete"),
        },
        "device_sync" => Op::DeviceSync {
            device: v.get("device").and_then(|d| d.as_u64()).unwrap_or(0),
        },
        "graph_begin" => Op::GraphBegin {
            graph: s("graph"),
            stream: s("stream"),
            pool: opt("pool"),
        },
        "graph_end" => Op::GraphEnd { graph: s("graph") },
        "graph_launch" => Op::GraphLaunch {
            graph: s("graph"),
            stream: s("stream"),
        },
        other => panic!("unknown op {other}"),
    }
}

/// `N` or `N@M` (op N, the replay of captured op M).
fn op_at(word: &str) -> (u64, Option<u64>) {
    match word.split_once('@') {
        Some((n, m)) => (
            n.parse().expect("op index"),
            Some(m.parse().expect("captured op index")),
        ),
        None => (word.parse().expect("op index"), None),
    }
}

/// A trace's `# expect-error: OP FIELD` line: the op the checker rejects.
fn expected_error(file: &Fixture) -> Option<u64> {
    file.text().lines().find_map(|l| {
        let e = l.trim().strip_prefix("# expect-error:")?;
        Some(e.split_whitespace().next()?.parse().expect("op index"))
    })
}

/// The ops of a trace file and its `# expect:` lines as keys.
fn read_trace(file: &Fixture) -> (Vec<TraceOp>, Vec<Key>) {
    let text = file.text();
    let mut ops = Vec::new();
    let mut expect = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(e) = line.strip_prefix("# expect:") {
            let e = e.trim();
            if e == "clean" {
                continue;
            }
            let mut words = e.split_whitespace();
            let (op, captured) = op_at(words.next().expect("op"));
            let kind = words.next().expect("kind");
            let kind = *HazardKind::ALL
                .iter()
                .find(|k| k.as_str() == kind)
                .expect("known kind");
            let mut buffer = None;
            let mut conflicts = Vec::new();
            let mut replayed = Vec::new();
            for w in words {
                if let Some(list) = w.strip_prefix('[') {
                    let list = list.trim_end_matches(']');
                    for c in list.split(',').filter(|s| !s.is_empty()) {
                        let (n, m) = op_at(c);
                        conflicts.push(n);
                        replayed.extend(m.map(|m| (n, m)));
                    }
                } else {
                    buffer = Some(w.to_owned());
                }
            }
            conflicts.sort_unstable();
            conflicts.dedup();
            replayed.sort_unstable();
            expect.push((op, kind, buffer, conflicts, captured, replayed));
        } else if !line.is_empty() && !line.starts_with('#') {
            ops.push(TraceOp::from(parse_op(line)));
        }
    }
    expect.sort();
    (ops, expect)
}

fn conformance_traces() -> Vec<Fixture> {
    common::fixtures_with_extension(common::CONFORMANCE, "jsonl")
}

#[test]
fn oracle_meets_every_conformance_expectation() {
    let files = conformance_traces();
    assert!(files.len() >= 40, "conformance traces missing");
    let mut failures = Vec::new();
    for path in &files {
        let (ops, expect) = read_trace(path);
        if let Some(at) = expected_error(path) {
            // Bad input: the oracle rejects it at that op too.
            match oracle_keys(&ops) {
                Err(e) if e.starts_with(&format!("op {at} ")) => {}
                other => failures.push(format!(
                    "{}: expected bad input at op {at}, oracle {other:?}",
                    path.path
                )),
            }
            continue;
        }
        let got = oracle_keys(&ops).expect("valid conformance trace");
        if got != expect {
            failures.push(format!(
                "{}:\n  expected {expect:?}\n  oracle   {got:?}",
                path.path
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn checker_agrees_with_oracle_on_conformance_traces() {
    let files = conformance_traces();
    assert!(files.len() >= 40, "conformance traces missing");
    let mut failures = Vec::new();
    for path in files {
        let (ops, _) = read_trace(&path);
        if expected_error(&path).is_some() {
            continue;
        }
        if let Some((o, c)) = compare(&ops).expect("valid conformance trace") {
            failures.push(format!("{}:\n  oracle  {o:?}\n  checker {c:?}", path.path));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn checker_agrees_with_oracle_on_regressions() {
    let files = common::fixtures_with_extension(common::ORACLE_REGRESSIONS, "jsonl");
    assert!(!files.is_empty(), "tests/oracle-regressions has no trace");
    let mut failures = Vec::new();
    for path in &files {
        let (ops, expect) = read_trace(path);
        // The expectations follow the trace format; the oracle must meet them.
        let o = oracle_keys(&ops).expect("valid regression trace");
        assert_eq!(o, expect, "oracle on {}", path.path);
        match checker_keys(&ops) {
            Ok(c) if c == o => {}
            Ok(c) => failures.push(format!(
                "{}:\n  expected {o:?}\n  checker  {c:?}",
                path.path
            )),
            Err(e) => failures.push(format!("{}: checker rejects: {e}", path.path)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Random well-formed programs: `programs/mod.rs`.

/// Every smaller variant of `ops`: one op removed, or one region of a launch removed.
fn smaller(ops: &[TraceOp]) -> Vec<Vec<TraceOp>> {
    let mut out = Vec::new();
    for i in 0..ops.len() {
        let mut v = ops.to_vec();
        v.remove(i);
        out.push(v);
    }
    for (i, op) in ops.iter().enumerate() {
        if let Op::Launch { reads, writes, .. } = &op.op {
            for (r, w) in (0..reads.len())
                .map(|r| (Some(r), None))
                .chain((0..writes.len()).map(|w| (None, Some(w))))
            {
                let mut v = ops.to_vec();
                if let Op::Launch { reads, writes, .. } = &mut v[i].op {
                    match (r, w) {
                        (Some(r), _) => drop(reads.remove(r)),
                        (_, Some(w)) => drop(writes.remove(w)),
                        _ => {}
                    }
                }
                out.push(v);
            }
        }
    }
    out
}

/// Shrinks `ops` while `keep` holds.
fn minimise_by(mut ops: Vec<TraceOp>, keep: impl Fn(&[TraceOp]) -> bool) -> Vec<TraceOp> {
    'outer: loop {
        for v in smaller(&ops) {
            if keep(&v) {
                ops = v;
                continue 'outer;
            }
        }
        return ops;
    }
}

/// Shrinks `ops` while both sides accept it and still disagree.
fn minimise(ops: Vec<TraceOp>) -> Vec<TraceOp> {
    minimise_by(ops, |ops| matches!(compare(ops), Ok(Some(_))))
}

fn describe(ops: &[TraceOp]) -> String {
    let mut s = String::new();
    for (i, op) in ops.iter().enumerate() {
        s.push_str(&format!("  {i}: {:?}\n", op.op));
    }
    if let Ok(Some((o, c))) = compare(ops) {
        s.push_str(&format!("  oracle  {o:?}\n  checker {c:?}\n"));
    }
    s
}

fn steps() -> impl Strategy<Value = Vec<(u8, u64)>> {
    prop::collection::vec((any::<u8>(), any::<u64>()), 0..40)
}

proptest! {
    #![proptest_config(Config {
        cases: 10_000,
        failure_persistence: None,
        ..Config::default()
    })]

    /// The checker and the oracle find the same hazards on random well-formed programs.
    #[test]
    fn checker_agrees_with_oracle(shape in shape(), steps in steps()) {
        let ops = program(&shape, &steps);
        match compare(&ops) {
            Ok(None) => {}
            Ok(Some(_)) => {
                let small = minimise(ops.clone());
                prop_assert!(false, "disagreement; minimised:\n{}", describe(&small));
            }
            Err(e) => prop_assert!(false, "{e}\n{}", describe(&ops)),
        }
    }
}

/// A long search (`cargo test --release --test oracle_agreement -- --ignored --nocapture`): runs
/// `ORACLE_CASES` programs (default 200,000), prints every distinct minimised disagreement and the
/// first rejected programs, counts the programs with each hazard kind, and fails unless both sides
/// accepted every program and agreed on all of them. `ORACLE_GRAPHS=all` gives every program
/// CUDA graph steps (captures with forks and joins, shared pools, replays on several streams),
/// `none` none; by default half of them. `ORACLE_SEED` offsets the cases (another search).
#[test]
#[ignore = "long: cargo test --release --test oracle_agreement -- --ignored"]
fn long_search_for_disagreements() {
    let cases: u64 = std::env::var("ORACLE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let graphs = std::env::var("ORACLE_GRAPHS").unwrap_or_default();
    let seed: u64 = std::env::var("ORACLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut with_launches = 0u64;
    let mut replay_hazards = 0u64;
    // Programs with an allocation into a named pool outside a capture, and those of them with a
    // reuse race.
    let (mut named_pools, mut named_pool_reuse) = (0u64, 0u64);
    let mut seen = HashSet::new();
    let mut rejected = 0;
    let mut disagreements = 0;
    let mut by_kind = HashMap::new();
    for case in seed..seed + cases {
        let mut r = Rng(case.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let shape = Shape {
            extra_streams: r.below(3) as u8,
            s1_implicit: r.chance(2),
            s2_device1: r.chance(2),
            s2_blocking: r.chance(2),
            names: 2 + r.below(3) as u8,
            fourth_managed: r.chance(2),
            addr_mode: r.chance(4),
            reuse_heavy: r.chance(2),
            graphs: match graphs.as_str() {
                "all" => true,
                "none" => false,
                _ => r.chance(2),
            },
        };
        let n = r.below(41);
        let steps: Vec<(u8, u64)> = (0..n).map(|_| (r.next() as u8, r.next())).collect();
        let ops = program(&shape, &steps);
        if ops.iter().any(|o| matches!(o.op, Op::GraphLaunch { .. })) {
            with_launches += 1;
        }
        let named = ops
            .iter()
            .any(|o| matches!(o.op, Op::Alloc { pool: Some(_), .. }));
        named_pools += u64::from(named);
        if let Ok(hs) = oracle_keys(&ops) {
            if hs.iter().any(|h| h.4.is_some() || !h.5.is_empty()) {
                replay_hazards += 1;
            }
            if named && hs.iter().any(|h| h.1 == HazardKind::ReuseRace) {
                named_pool_reuse += 1;
            }
            let kinds: HashSet<HazardKind> = hs.iter().map(|h| h.1).collect();
            for k in kinds {
                *by_kind.entry(k).or_insert(0u64) += 1;
            }
        }
        match compare(&ops) {
            Ok(None) => {}
            Ok(Some(_)) => {
                disagreements += 1;
                let text = describe(&minimise(ops));
                if seen.insert(text.clone()) {
                    println!("case {case}:\n{text}");
                }
            }
            Err(e) => {
                rejected += 1;
                if rejected <= 5 {
                    println!("case {case}: {e}\n{}", describe(&ops));
                }
            }
        }
    }
    let mut by_kind: Vec<_> = by_kind.into_iter().collect();
    by_kind.sort();
    println!("programs with each hazard kind: {by_kind:?}");
    println!(
        "programs with a graph_launch: {with_launches}; with a hazard of a replay: {replay_hazards}"
    );
    println!(
        "programs with an allocation into a named pool: {named_pools}; with a reuse race: {named_pool_reuse}"
    );
    println!(
        "{cases} cases, {disagreements} disagreements ({} distinct minimised), {rejected} rejected",
        seen.len()
    );
    if cases >= 10_000 {
        // A search that never meets a hazard kind cannot find disagreements about it.
        assert_eq!(
            by_kind.len(),
            HazardKind::ALL.len(),
            "the programs reach too few hazard kinds: {by_kind:?}"
        );
    }
    assert_eq!(
        (disagreements, rejected),
        (0, 0),
        "the checker and the oracle must accept and agree on every program (printed above)"
    );
}
