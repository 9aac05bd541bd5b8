//! `check --confirm` on any trace: [`runnable`] makes a trace runnable by the executors (addresses
//! compressed, external buffers allocated, ops that must not run neutralized), and the checker
//! must find the same hazards in the runnable program as in the trace — same kinds, ops, buffers
//! and conflicting ops, moved by the ops put in front — less the use-after-frees and invalid
//! frees that were neutralized. Then every hazard of a recorded-style trace is provoked on the
//! simulator, and the reuse it reports really corrupts data there.
//!
//! Fixtures are embedded with `include_str!`, so the test executable runs anywhere.

use streamsan::fuzz::campaign::{confirm_report, SimExecutor};
use streamsan::fuzz::gen::{generate, GenConfig};
use streamsan::fuzz::runnable::{runnable, Runnable};
use streamsan::report::{Confirmation, HazardKind, Report};
use streamsan::trace::{parse_line, Id, MemoryKind, Op, Region, TraceOp};
use streamsan::workload::SplitMix;
use streamsan::Checker;

const RECORDED: &str = include_str!("../examples/traces/recorded/side-stream-reuse.jsonl");

fn parse(text: &str) -> Vec<TraceOp> {
    text.lines()
        .filter_map(|l| parse_line(l).expect("valid trace").map(|(op, _)| op))
        .collect()
}

fn check(ops: &[TraceOp]) -> Option<Report> {
    Checker::check_all(ops).ok()
}

/// (op, kind, buffer, conflicting ops) of each hazard the runnable program keeps.
type Key = (u64, HazardKind, Option<String>, Vec<u64>);

fn keys(report: &Report) -> Vec<Key> {
    report
        .hazards
        .iter()
        .filter(|h| !matches!(h.kind, HazardKind::UseAfterFree | HazardKind::InvalidFree))
        .map(|h| {
            (
                h.op,
                h.kind,
                h.buffer.clone(),
                h.conflicts.iter().map(|c| c.op).collect(),
            )
        })
        .collect()
}

/// Checks that the runnable form of `ops` has the hazards of `ops`, moved; returns it.
fn same_hazards(ops: &[TraceOp], what: &str) -> Runnable {
    let original = check(ops).unwrap_or_else(|| panic!("{what}: bad input"));
    let r = runnable(ops).unwrap_or_else(|e| panic!("{what}: {e}"));
    let again = check(&r.program).unwrap_or_else(|| {
        panic!(
            "{what}: the runnable program is bad input\n{:#?}",
            r.program
        )
    });
    let moved = Report::new(
        original.ops,
        original.hazards.iter().map(|h| r.hazard(h)).collect(),
    );
    assert_eq!(
        keys(&again),
        keys(&moved),
        "{what}: runnable (left) and trace (right) disagree\n{}",
        again.to_json()
    );
    r
}

struct Rng(SplitMix);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }
}

/// A random trace as recorders write them: `addr` on every allocation (from a few slots, so that
/// freed memory comes back, on the same stream or another), views at 2-byte offsets, external
/// buffers, pinned and managed memory with host accesses, copies, events and queries, and the
/// ops the checker reports but that must not run (uses after free, invalid frees).
fn recorded_like(seed: u64, len: usize) -> Vec<TraceOp> {
    let mut rng = Rng(SplitMix::new(seed));
    let streams = ["default", "s1", "s2"];
    let names = ["a", "b", "c", "ext", "p", "m"];
    let mut ops: Vec<Op> = Vec::new();
    let mut live: Vec<(&str, u64)> = Vec::new();
    let mut freed: Vec<&str> = Vec::new();
    let mut events = 0;
    while ops.len() < len {
        let stream = Id::from(streams[rng.below(3) as usize]);
        let region = |rng: &mut Rng, name: &str, size: u64| -> Region {
            if rng.below(3) == 0 {
                Region::whole(name)
            } else {
                let offset = 2 * rng.below(size / 2);
                Region {
                    buffer: name.into(),
                    offset,
                    bytes: Some(2 * rng.below((size - offset) / 2 + 1)),
                }
            }
        };
        match rng.below(12) {
            0 | 1 => {
                let name = names[rng.below(6) as usize];
                if live.iter().any(|(n, _)| *n == name) || name == "ext" {
                    continue;
                }
                let memory = match name {
                    "p" => MemoryKind::Pinned,
                    "m" => MemoryKind::Managed,
                    _ => MemoryKind::Device,
                };
                let size = 512 * (1 + rng.below(3));
                let slot = rng.below(3);
                ops.push(Op::Alloc {
                    buffer: name.into(),
                    bytes: size,
                    stream: Some(stream),
                    memory,
                    addr: Some(0x7f3a_0000_0000 + slot * 1024),
                    pool: None,
                });
                live.push((name, size));
                freed.retain(|n| *n != name);
            }
            2..=4 => {
                let mut reads = Vec::new();
                let mut writes = Vec::new();
                for &(name, size) in &live {
                    if matches!(name, "p" | "m") {
                        continue;
                    }
                    match rng.below(3) {
                        0 => reads.push(region(&mut rng, name, size)),
                        1 => writes.push(region(&mut rng, name, size)),
                        _ => {}
                    }
                }
                match rng.below(4) {
                    0 => reads.push(Region::whole("ext")),
                    1 => writes.push(Region {
                        buffer: "ext".into(),
                        offset: 2 * rng.below(600),
                        bytes: Some(2 * rng.below(300)),
                    }),
                    _ => {}
                }
                if let Some(&n) = freed.first() {
                    if rng.below(6) == 0 {
                        reads.push(Region::whole(n));
                    }
                }
                ops.push(Op::Launch {
                    stream,
                    name: None,
                    reads,
                    writes,
                });
            }
            5 if !live.is_empty() => {
                let (a, sa) = live[rng.below(live.len() as u64) as usize];
                let (b, sb) = live[rng.below(live.len() as u64) as usize];
                if a != b {
                    ops.push(Op::Copy {
                        stream,
                        src: region(&mut rng, a, sa),
                        dst: region(&mut rng, b, sb),
                    });
                }
            }
            6 => {
                events += 1;
                ops.push(Op::EventRecord {
                    event: format!("e{}", events % 3).as_str().into(),
                    stream,
                });
            }
            7 if events > 0 => ops.push(Op::EventWait {
                stream,
                event: format!("e{}", rng.below(3)).as_str().into(),
            }),
            8 if events > 0 => ops.push(Op::EventQuery {
                event: format!("e{}", rng.below(3)).as_str().into(),
                complete: rng.below(2) == 0,
            }),
            9 => {
                if let Some(&(name, size)) = live.iter().find(|(n, _)| matches!(*n, "p" | "m")) {
                    let r = region(&mut rng, name, size);
                    ops.push(if rng.below(2) == 0 {
                        Op::HostRead { buffer: r }
                    } else {
                        Op::HostWrite { buffer: r }
                    });
                } else {
                    ops.push(Op::StreamSync { stream });
                }
            }
            10 if !live.is_empty() => {
                let k = rng.below(live.len() as u64) as usize;
                let (name, _) = live.swap_remove(k);
                if rng.below(3) == 0 {
                    ops.push(Op::RecordStream {
                        buffer: name.into(),
                        stream: stream.clone(),
                    });
                }
                let device = !matches!(name, "p" | "m");
                ops.push(Op::Free {
                    buffer: name.into(),
                    stream: (device && rng.below(4) == 0).then_some(stream),
                });
                freed.push(name);
            }
            11 => {
                // An invalid free: of the external buffer, or of a freed one.
                let name = freed.first().copied().unwrap_or("ext");
                ops.push(Op::Free {
                    buffer: name.into(),
                    stream: (rng.below(2) == 0).then_some(stream),
                });
            }
            _ => {}
        }
    }
    ops.into_iter().map(TraceOp::from).collect()
}

#[test]
fn runnable_programs_have_the_trace_s_hazards() {
    let mut checked = 0;
    let mut with_hazards = 0;
    for seed in 0..3000 {
        let ops = recorded_like(seed, 30);
        // Random addresses may overlap a live allocation: bad input, skipped.
        let Some(report) = check(&ops) else { continue };
        checked += 1;
        with_hazards += usize::from(!report.hazards.is_empty());
        same_hazards(&ops, &format!("recorded-like seed {seed}"));
    }
    eprintln!("{checked} valid random traces, {with_hazards} with hazards");
    assert!(checked > 1000, "only {checked} valid random traces");
    assert!(
        with_hazards > 500,
        "only {with_hazards} traces with hazards"
    );
    for (name, cfg) in [
        ("default", GenConfig::default()),
        (
            "racy",
            GenConfig {
                missing_sync: 0.6,
                use_after_free: true,
                ..GenConfig::default()
            },
        ),
    ] {
        for seed in 0..500 {
            let p = generate(&cfg, &mut SplitMix::new(seed));
            same_hazards(&p.ops, &format!("{name} seed {seed}"));
        }
    }
    let r = same_hazards(&parse(RECORDED), "side-stream-reuse");
    assert_eq!(r.shift, 1, "the external weight is allocated in front");
}

#[test]
fn huge_buffers_compress_to_a_few_words() {
    let ops = parse(
        r#"{"op":"alloc","buffer":"big","bytes":1099511627776,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["big"]}
{"op":"launch","stream":"s2","reads":[{"buffer":"big","offset":1024,"bytes":7}]}
{"op":"free","buffer":"big"}"#,
    );
    let r = same_hazards(&ops, "a terabyte");
    assert!(r.extent[0] <= 16, "{:?}", r.extent);
    let mut report = check(&ops).unwrap();
    confirm_report(&ops, &mut report, &mut SimExecutor::default(), 3, |_, _| {});
    assert!(
        report.hazards.iter().all(|h| h
            .confirmation
            .as_ref()
            .is_some_and(Confirmation::is_confirmed)),
        "{}",
        report.to_json()
    );
}

#[test]
fn every_hazard_of_a_recorded_trace_is_confirmed_or_says_why_not() {
    let ops = parse(RECORDED);
    let mut report = check(&ops).unwrap();
    let kinds: Vec<HazardKind> = report.hazards.iter().map(|h| h.kind).collect();
    assert_eq!(
        kinds,
        [
            HazardKind::UnsafeFree,
            HazardKind::ReuseRace,
            HazardKind::DataRace
        ]
    );
    confirm_report(&ops, &mut report, &mut SimExecutor::default(), 5, |_, _| {});
    for h in &report.hazards {
        assert_eq!(
            h.confirmation,
            Some(Confirmation::Ran {
                backend: "sim",
                observed: 5,
                attempts: 5
            }),
            "{}",
            report.to_json()
        );
    }
    // The JSON report carries it.
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(
        json["hazards"][1]["confirmation"],
        serde_json::json!({"backend": "sim", "observed": 5, "attempts": 5})
    );
}

#[test]
fn hazards_that_are_not_races_say_why_they_were_not_provoked() {
    let ops = parse(
        r#"{"op":"alloc","buffer":"a","bytes":512,"stream":"s1","addr":4096}
{"op":"free","buffer":"a"}
{"op":"launch","stream":"s1","reads":["a"]}
{"op":"free","buffer":"a"}
{"op":"event_wait","stream":"s1","event":"never"}"#,
    );
    let mut report = check(&ops).unwrap();
    confirm_report(&ops, &mut report, &mut SimExecutor::default(), 2, |_, _| {});
    assert_eq!(report.hazards.len(), 3);
    for h in &report.hazards {
        match &h.confirmation {
            Some(Confirmation::Skipped { backend, skipped }) => {
                assert_eq!(*backend, "sim");
                assert!(skipped.contains("provoke"), "{skipped}");
            }
            other => panic!("{:?}: {other:?}", h.kind),
        }
    }
}
