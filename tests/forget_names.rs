//! Freed buffer names: a loop that allocates, uses and frees a new name each time keeps the
//! checker's state bounded (the details of old frees are forgotten, consecutive numbered names
//! are one run), and a later use or free of a long-forgotten name is still reported — with the
//! same verdicts, only worded with what is still known. Bounds are on the checker's counters
//! (`Checker::stats`), never on wall time or RSS.

mod programs;

use programs::{program, Rng, Shape};
use streamsan::checker::Stats;
use streamsan::oracle::{oracle_hazards, OracleHazard};
use streamsan::trace::{Id, MemoryKind, Op, Region, TraceOp};
use streamsan::{Checker, HazardKind, Report};

fn alloc(buffer: &str, bytes: u64, stream: &str, addr: Option<u64>) -> TraceOp {
    Op::Alloc {
        buffer: buffer.into(),
        bytes,
        stream: Some(stream.into()),
        memory: MemoryKind::Device,
        addr,
        pool: None,
    }
    .into()
}

fn launch(stream: &str, reads: &[&str], writes: &[&str]) -> TraceOp {
    Op::Launch {
        stream: stream.into(),
        name: None,
        reads: reads.iter().map(|&b| Region::whole(b)).collect(),
        writes: writes.iter().map(|&b| Region::whole(b)).collect(),
    }
    .into()
}

fn free(buffer: &str) -> TraceOp {
    Op::Free {
        buffer: buffer.into(),
        stream: None,
    }
    .into()
}

/// How each cycle of the loop uses its new buffer.
#[derive(Clone, Copy, Debug)]
enum Cycle {
    /// alloc on s1, a write by s1, free.
    Plain,
    /// … and a read by s2 after an event wait, with `record_stream(b, s2)` before the free.
    Shared,
    /// alloc with `addr`, always the same address (the memory comes back to the same stream).
    SameAddr,
    /// alloc with `addr`, each cycle the next 4 KiB above the previous one.
    NewAddr,
}

/// The loop's ops for cycle `i` with name `name`.
fn cycle(kind: Cycle, i: u64, name: &str) -> Vec<TraceOp> {
    let addr = match kind {
        Cycle::SameAddr => Some(0x7f00_0000_0000),
        Cycle::NewAddr => Some(0x7f00_0000_0000 + 4096 * i),
        _ => None,
    };
    let mut ops = vec![alloc(name, 4096, "s1", addr), launch("s1", &[], &[name])];
    if let Cycle::Shared = kind {
        ops.push(
            Op::EventRecord {
                event: "e".into(),
                stream: "s1".into(),
            }
            .into(),
        );
        ops.push(
            Op::EventWait {
                stream: "s2".into(),
                event: "e".into(),
            }
            .into(),
        );
        ops.push(launch("s2", &[name], &[]));
        ops.push(
            Op::RecordStream {
                buffer: name.into(),
                stream: "s2".into(),
            }
            .into(),
        );
    }
    ops.push(free(name));
    ops
}

/// Runs `cycles` cycles with names from `name`, and the peak of the checker's counters.
fn run_loop(
    checker: &mut Checker,
    kind: Cycle,
    cycles: u64,
    name: impl Fn(u64) -> String,
) -> Stats {
    let mut peak = checker.stats();
    for i in 0..cycles {
        for op in cycle(kind, i, &name(i)) {
            let hazards = checker.check(&op).expect("a valid op");
            assert!(hazards.is_empty(), "cycle {i}: {hazards:?}");
        }
        if i % 1024 == 0 {
            peak = peak.max(&checker.stats());
        }
    }
    peak.max(&checker.stats())
}

#[test]
fn a_loop_of_new_names_keeps_bounded_state() {
    let cycles = 60_000;
    for kind in [Cycle::Plain, Cycle::Shared, Cycle::SameAddr, Cycle::NewAddr] {
        let mut checker = Checker::new();
        let peak = run_loop(&mut checker, kind, cycles, |i| format!("b{i}"));
        // At most the ring of recent frees keeps details; the forgotten names `b0` … are one run.
        assert!(peak.freed_names <= 1024, "{kind:?}: {peak:?}");
        assert!(peak.forgotten_names <= 1, "{kind:?}: {peak:?}");
        assert!(peak.generations <= 2, "{kind:?}: {peak:?}");
        assert!(peak.history <= 4, "{kind:?}: {peak:?}");
        if !matches!(kind, Cycle::NewAddr) {
            // Ever new addresses keep the tombstones on their bytes (another stream could still
            // reuse them); the same bytes keep the latest one.
            assert!(peak.graveyard <= 2, "{kind:?}: {peak:?}");
        }
        let stats = checker.stats();
        assert_eq!(stats.freed_names, 1024, "{kind:?}: {stats:?}");
        assert_eq!(stats.forgotten_names, 1, "{kind:?}: {stats:?}");
    }
    // Zero-padded names, and names with text after the number, are runs too.
    for name in [
        (|i| format!("t{i:07}")) as fn(u64) -> String,
        |i| format!("layer{i}.weight"),
        |i| format!("{i}"),
    ] {
        let mut checker = Checker::new();
        let peak = run_loop(&mut checker, Cycle::Plain, 5_000, name);
        assert!(peak.forgotten_names <= 1, "{}: {peak:?}", name(0));
    }
}

/// Names without a number are kept one by one: what a freed name decides must be kept, and
/// nothing makes them a run.
#[test]
fn names_without_a_number_are_kept_one_by_one() {
    fn letters(mut i: u64) -> String {
        let mut s = String::from("tmp_");
        loop {
            s.push((b'a' + (i % 26) as u8) as char);
            i /= 26;
            if i == 0 {
                return s;
            }
        }
    }
    let mut checker = Checker::new();
    checker.keep_free_details(16);
    let peak = run_loop(&mut checker, Cycle::Plain, 3_000, letters);
    assert!(peak.freed_names <= 16, "{peak:?}");
    assert_eq!(checker.stats().forgotten_names, 3_000 - 16);
    // Each is still known as freed.
    let hazards = checker.check(&launch("s1", &[&letters(5)], &[])).unwrap();
    assert_eq!(hazards.len(), 1);
    assert_eq!(hazards[0].kind, HazardKind::UseAfterFree);
}

/// Checks `ops` after a loop of `cycles` new names on `checker`: the report.
fn after_loop(mut checker: Checker, cycles: u64, ops: &[TraceOp]) -> Report {
    run_loop(&mut checker, Cycle::Plain, cycles, |i| format!("b{i}"));
    for op in ops {
        checker.check(op).expect("a valid op");
    }
    checker.finish()
}

#[test]
fn a_long_forgotten_name_is_still_reported() {
    let cycles = 20_000;
    let n = 3 * cycles;
    let tail = [
        // A use of b0, freed at op 2 and long forgotten since.
        launch("s1", &[], &["b0"]),
        // record_stream on a forgotten name: a use after free with no access.
        Op::RecordStream {
            buffer: "b1".into(),
            stream: "s2".into(),
        }
        .into(),
        // A second free.
        free("b2"),
        // A name allocated again after it was forgotten names a new buffer: legal.
        alloc("b3", 512, "s1", None),
        launch("s1", &[], &["b3"]),
        free("b3"),
        // … and when that one is freed, a use reports the recent free in full.
        launch("s1", &["b3"], &[]),
        // Never-seen names are external: legal, not uses after free.
        launch("s1", &["b20000", "c0", "b"], &[]),
    ];
    let report = after_loop(Checker::new(), cycles, &tail);
    let got: Vec<(u64, HazardKind, Option<&str>)> = report
        .hazards
        .iter()
        .map(|h| (h.op, h.kind, h.buffer.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (n, HazardKind::UseAfterFree, Some("b0")),
            (n + 1, HazardKind::UseAfterFree, Some("b1")),
            (n + 2, HazardKind::InvalidFree, Some("b2")),
            (n + 6, HazardKind::UseAfterFree, Some("b3")),
        ]
    );
    let h = &report.hazards;
    // What is known is said: the name was freed; its free's op is no longer kept.
    assert_eq!(
        h[0].fix.as_deref(),
        Some(
            "b0 was freed at an op no longer kept: move that free after op 60000, or allocate b0 \
             again before using it"
        )
    );
    assert!(h[0].detail.notes.is_empty(), "{:?}", h[0].detail.notes);
    let access = h[0].access.as_ref().unwrap();
    assert_eq!((access.offset, access.bytes), (0, Some(4096)));
    assert!(h[1].access.is_none());
    assert_eq!(
        h[2].fix.as_deref(),
        Some(
            "remove the free of b2 at op 60002: the buffer was already freed, at an op no longer \
             kept"
        )
    );
    // The size and the owning stream are what the buffer decides, and are kept.
    let access = h[2].access.as_ref().unwrap();
    assert_eq!(
        (access.participant.as_str(), access.bytes),
        ("s1", Some(4096))
    );
    assert_eq!(
        h[3].fix.as_deref(),
        Some(
            "b3 was freed at op 60005: move that free after op 60006, or allocate b3 again \
             before using it"
        )
    );
    assert_eq!(h[3].detail.notes.len(), 1);

    // With every detail kept, the same verdicts, worded with the ops of the frees.
    let mut all = Checker::new();
    all.keep_free_details(usize::MAX);
    let full = after_loop(all, cycles, &tail);
    let keys = |r: &Report| -> Vec<(u64, HazardKind, Option<String>)> {
        r.hazards
            .iter()
            .map(|h| (h.op, h.kind, h.buffer.clone()))
            .collect()
    };
    assert_eq!(keys(&full), keys(&report));
    assert_eq!(
        full.hazards[0].fix.as_deref(),
        Some(
            "b0 was freed at op 2: move that free after op 60000, or allocate b0 again before \
             using it"
        )
    );
}

/// What decides bad input stays: a region past the end of a forgotten buffer, and a host access
/// of its device memory, are rejected as they are while the details are kept.
#[test]
fn a_forgotten_name_still_decides_bad_input() {
    for keep in [0, usize::MAX] {
        let mut checker = Checker::new();
        checker.keep_free_details(keep);
        run_loop(&mut checker, Cycle::Plain, 3_000, |i| format!("b{i}"));
        let past = TraceOp::from(Op::Launch {
            stream: "s1".into(),
            name: None,
            reads: vec![],
            writes: vec![Region::range("b7", 4000, 100)],
        });
        let e = checker.check(&past).expect_err("past the end");
        assert!(e.message.contains("(4096 bytes)"), "{keep}: {e}");
        let host = TraceOp::from(Op::HostRead {
            buffer: Region::whole("b8"),
        });
        let e = checker.check(&host).expect_err("device memory");
        assert!(e.message.contains("device memory"), "{keep}: {e}");
        // Inside the buffer: a use after free.
        let inside = TraceOp::from(Op::Launch {
            stream: "s1".into(),
            name: None,
            reads: vec![Region::range("b7", 4000, 96)],
            writes: vec![],
        });
        let hazards = checker.check(&inside).unwrap();
        assert_eq!(hazards.len(), 1);
        assert_eq!(hazards[0].kind, HazardKind::UseAfterFree);
    }
}

/// Ops with every buffer name mapped by `f`.
fn renamed(ops: &[TraceOp], f: &impl Fn(&Id) -> Id) -> Vec<TraceOp> {
    let r = |x: &Region| Region {
        buffer: f(&x.buffer),
        ..x.clone()
    };
    let rs = |v: &[Region]| v.iter().map(r).collect::<Vec<_>>();
    ops.iter()
        .map(|o| {
            let op = match &o.op {
                Op::Alloc {
                    buffer,
                    bytes,
                    stream,
                    memory,
                    addr,
                    pool,
                } => Op::Alloc {
                    buffer: f(buffer),
                    bytes: *bytes,
                    stream: stream.clone(),
                    memory: *memory,
                    addr: *addr,
                    pool: pool.clone(),
                },
                Op::Free { buffer, stream } => Op::Free {
                    buffer: f(buffer),
                    stream: stream.clone(),
                },
                Op::RecordStream { buffer, stream } => Op::RecordStream {
                    buffer: f(buffer),
                    stream: stream.clone(),
                },
                Op::Launch {
                    stream,
                    name,
                    reads,
                    writes,
                } => Op::Launch {
                    stream: stream.clone(),
                    name: name.clone(),
                    reads: rs(reads),
                    writes: rs(writes),
                },
                Op::Copy { stream, src, dst } => Op::Copy {
                    stream: stream.clone(),
                    src: r(src),
                    dst: r(dst),
                },
                Op::Memset { stream, dst } => Op::Memset {
                    stream: stream.clone(),
                    dst: r(dst),
                },
                Op::HostRead { buffer } => Op::HostRead { buffer: r(buffer) },
                Op::HostWrite { buffer } => Op::HostWrite { buffer: r(buffer) },
                other => other.clone(),
            };
            TraceOp {
                op,
                site: o.site.clone(),
            }
        })
        .collect()
}

type Key = (
    u64,
    HazardKind,
    Option<String>,
    Vec<u64>,
    Option<u64>,
    Vec<(u64, u64)>,
);

fn checker_keys(ops: &[TraceOp], keep: usize) -> Result<(Vec<Key>, Report), String> {
    let mut c = Checker::new();
    c.keep_free_details(keep);
    for (i, op) in ops.iter().enumerate() {
        c.check(op).map_err(|e| format!("op {i}: {e}"))?;
    }
    let report = c.finish();
    let mut keys: Vec<Key> = report
        .hazards
        .iter()
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
            (h.op, h.kind, h.buffer.clone(), c, captured, r)
        })
        .collect();
    keys.sort();
    Ok((keys, report))
}

/// On random programs (the oracle agreement test's generator, with numbered and unnumbered
/// names), forgetting every freed name at once, or all but the latest, changes no verdict: the
/// checker still agrees with the oracle, and its reports differ from the default only in the
/// wording and notes of `use-after-free` and `invalid-free`.
#[test]
fn forgetting_changes_no_verdict() {
    let numbered = |b: &Id| -> Id {
        match b.as_str() {
            "a" => "b1".into(),
            "p" => "b2".into(),
            "c" => "b3".into(),
            "m" => "b4".into(),
            "x" => "b0".into(),
            other => other.into(),
        }
    };
    let mut uses_after_free = 0;
    for case in 0..1500u64 {
        let mut r = Rng(case.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed);
        let shape = Shape {
            extra_streams: r.below(3) as u8,
            s1_implicit: r.chance(2),
            s2_device1: r.chance(2),
            s2_blocking: r.chance(2),
            names: 2 + r.below(3) as u8,
            fourth_managed: r.chance(2),
            addr_mode: r.chance(4),
            reuse_heavy: r.chance(2),
            graphs: r.chance(3),
        };
        let steps: Vec<(u8, u64)> = (0..r.below(40))
            .map(|_| (r.next() as u8, r.next()))
            .collect();
        let plain = program(&shape, &steps);
        for ops in [plain.clone(), renamed(&plain, &numbered)] {
            let oracle: Result<Vec<Key>, String> = oracle_hazards(&ops).map(|hs| {
                hs.into_iter()
                    .map(
                        |OracleHazard {
                             op,
                             kind,
                             buffer,
                             conflicts,
                             captured,
                             replayed,
                         }| {
                            (op, kind, buffer, conflicts, captured, replayed)
                        },
                    )
                    .collect()
            });
            let (default_keys, default_report) = match checker_keys(&ops, 1024) {
                Ok(k) => k,
                Err(e) => {
                    // Bad input: rejected at the same op whatever is kept.
                    for keep in [0, 1] {
                        assert_eq!(
                            checker_keys(&ops, keep).err(),
                            Some(e.clone()),
                            "case {case}"
                        );
                    }
                    continue;
                }
            };
            assert_eq!(Ok(&default_keys), oracle.as_ref(), "case {case}");
            for keep in [0, 1] {
                let (keys, report) = checker_keys(&ops, keep).expect("accepted as by default");
                assert_eq!(keys, default_keys, "case {case}, keep {keep}");
                for (a, b) in report.hazards.iter().zip(&default_report.hazards) {
                    if matches!(a.kind, HazardKind::UseAfterFree | HazardKind::InvalidFree) {
                        uses_after_free += 1;
                        assert_eq!(
                            (&a.access, &a.conflicts, &a.free),
                            (&b.access, &b.conflicts, &b.free),
                            "case {case}, keep {keep}"
                        );
                    } else {
                        assert_eq!(a, b, "case {case}, keep {keep}");
                    }
                }
            }
        }
    }
    assert!(uses_after_free > 100, "{uses_after_free}");
}
