//! The synchronization analysis (`streamsan::analysis::syncs`) against its definition.
//!
//! - The brute force (the definition run as written) on hand-written cases whose answers are
//!   worked out by hand: a needed wait, a wait covered by an earlier one, a redundant host sync,
//!   a needed `record_stream`, a sync needed only through the legacy default stream, and more.
//! - The analysis equals the brute force — `needed` and `prevents` of every synchronization op —
//!   on every conformance trace and on random programs (`fuzz/common.rs`'s decoder, the same
//!   check as the `syncs` fuzz target).
//!
//! Fixtures: `tests/conformance/*.jsonl`, embedded at build time (`tests/common/mod.rs`).

#[path = "common/mod.rs"]
mod fixtures;
#[path = "../fuzz/common.rs"]
#[allow(dead_code)]
mod fuzz;

use streamsan::analysis::syncs::{analyze, brute_force, SyncVerdict};
use streamsan::trace::{TraceOp, TraceReader};
use streamsan::workload::SplitMix;

fn read(text: &str) -> Vec<TraceOp> {
    TraceReader::new(text.as_bytes(), "test.jsonl")
        .map(|r| r.map(|(op, _)| op))
        .collect::<Result<_, _>>()
        .expect("a valid trace")
}

/// The brute force and the analysis on a trace; they must agree. Returns the verdicts.
fn verdicts(text: &str) -> Vec<SyncVerdict> {
    let ops = read(text);
    let (report, brute) = brute_force(&ops).expect("accepted");
    let (report2, product) = analyze(&ops).expect("accepted");
    assert_eq!(report, report2);
    assert_eq!(
        brute,
        product,
        "brute force {}\nanalysis {}",
        fuzz::describe_syncs(&brute),
        fuzz::describe_syncs(&product)
    );
    brute
}

/// The verdicts in a compact form: `(op, [prevented errors as "kind op buffer"])`, an empty list
/// for a redundant op.
fn summary(v: &[SyncVerdict]) -> Vec<(u64, Vec<String>)> {
    v.iter()
        .map(|s| {
            assert_eq!(s.needed, !s.prevents.is_empty());
            let p = s
                .prevents
                .iter()
                .map(|k| format!("{} {} {}", k.kind, k.op, k.buffer.as_deref().unwrap_or("-")))
                .collect();
            (s.op, p)
        })
        .collect()
}

fn expect(trace: &str, want: &[(u64, &[&str])]) {
    let got = summary(&verdicts(trace));
    let want: Vec<(u64, Vec<String>)> = want
        .iter()
        .map(|(op, p)| (*op, p.iter().map(|s| s.to_string()).collect()))
        .collect();
    assert_eq!(got, want, "trace:\n{trace}");
}

/// A wait that orders a cross-stream read after the write it reads.
#[test]
fn a_needed_wait() {
    expect(
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","reads":["a"]}"#,
        &[(3, &["data-race 4 a"])],
    );
}

/// The second wait joins what the first one joined already: its removal changes nothing. And the
/// first one is redundant too, alone: the second orders the read. (Together they are not
/// removable: the analysis speaks of each alone.)
#[test]
fn a_wait_covered_by_an_earlier_one() {
    expect(
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","reads":["a"]}"#,
        &[(3, &[]), (4, &[])],
    );
}

/// A host sync after which nothing ran on the stream: redundant. The first one is needed by the
/// host's read of the pinned buffer the stream copied into.
#[test]
fn a_redundant_host_sync() {
    expect(
        r#"{"op":"alloc","buffer":"p","bytes":4096,"memory":"pinned"}
{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"copy","stream":"s1","src":"a","dst":"p"}
{"op":"stream_sync","stream":"s1"}
{"op":"host_read","buffer":"p"}
{"op":"stream_sync","stream":"s1"}
{"op":"device_sync"}
{"op":"host_write","buffer":"p"}"#,
        &[(4, &["data-race 5 p"]), (6, &[]), (7, &[])],
    );
}

/// A host sync whose removal changes the host's clock, though nothing the host does later needs
/// it: a what-if that lives until the next sync and finds nothing.
#[test]
fn a_host_sync_that_changes_the_clock_and_orders_nothing() {
    expect(
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"device_sync"}
{"op":"launch","stream":"s1","reads":["a"]}
{"op":"launch","stream":"s2","writes":["b"]}
{"op":"device_sync"}
{"op":"launch","stream":"s2","reads":["b"]}"#,
        &[(2, &[]), (5, &[])],
    );
}

/// `record_stream` keeps the freed block from the next allocation until the other stream's read
/// ends: without it the free is unsafe and the next buffer on those bytes races with the read.
/// The wait orders the read after the write.
#[test]
fn a_needed_record_stream() {
    expect(
        r#"{"op":"alloc","buffer":"grad","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"compute","writes":["grad"]}
{"op":"event_record","event":"e","stream":"compute"}
{"op":"event_wait","stream":"comm","event":"e"}
{"op":"launch","stream":"comm","reads":["grad"]}
{"op":"record_stream","buffer":"grad","stream":"comm"}
{"op":"free","buffer":"grad"}
{"op":"alloc","buffer":"act","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"compute","writes":["act"]}"#,
        &[
            (3, &["data-race 4 grad"]),
            (5, &["unsafe-free 6 grad", "reuse-race 8 act"]),
        ],
    );
}

/// A `record_stream` of the owning stream has no effect (PyTorch ignores it), nor one of a
/// stream named already.
#[test]
fn record_streams_without_effect() {
    expect(
        r#"{"op":"alloc","buffer":"g","bytes":4096,"stream":"compute"}
{"op":"launch","stream":"comm","writes":["g"]}
{"op":"record_stream","buffer":"g","stream":"compute"}
{"op":"record_stream","buffer":"g","stream":"comm"}
{"op":"record_stream","buffer":"g","stream":"comm"}
{"op":"free","buffer":"g"}"#,
        &[(2, &[]), (3, &[]), (4, &[])],
    );
}

/// The wait on the blocking stream `b` orders nothing on `b` itself: the legacy default stream
/// waits for `b`'s work, so its read is ordered after `s1`'s write through it.
#[test]
fn a_wait_needed_only_through_the_legacy_default_stream() {
    expect(
        r#"{"op":"stream_create","stream":"b","blocking":true}
{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"b","event":"e"}
{"op":"launch","stream":"default","reads":["a"]}"#,
        &[(4, &["data-race 5 a"])],
    );
}

/// Replaced by nothing means the op's implicit effects go too: a wait on a never-recorded event
/// (a warning, no join) is still an op on the blocking stream `b`, which waits for the legacy
/// default stream's work; the host's `stream_sync(b)` then covers the default stream's copy.
#[test]
fn an_unrecorded_wait_needed_for_its_legacy_edge() {
    expect(
        r#"{"op":"stream_create","stream":"b","blocking":true}
{"op":"alloc","buffer":"p","bytes":4096,"memory":"pinned"}
{"op":"copy","stream":"default","src":"x","dst":"p"}
{"op":"event_wait","stream":"b","event":"never"}
{"op":"stream_sync","stream":"b"}
{"op":"host_read","buffer":"p"}"#,
        &[(3, &["data-race 5 p"]), (4, &["data-race 5 p"])],
    );
}

/// A wait on a stale capture: the event was recorded again after the wait's capture, and the
/// second write is ordered by the wait on the new capture only.
#[test]
fn event_re_record() {
    expect(
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","reads":["a"]}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","reads":["a"]}"#,
        &[(3, &["data-race 4 a"]), (7, &["data-race 8 a"])],
    );
}

/// Queries: a successful one is a host sync like `stream_sync`; an unsuccessful one is not a
/// synchronization op at all.
#[test]
fn queries() {
    expect(
        r#"{"op":"alloc","buffer":"p","bytes":4096,"memory":"pinned"}
{"op":"launch","stream":"s1","writes":["p"]}
{"op":"stream_query","stream":"s1","complete":false}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_query","event":"e","complete":false}
{"op":"event_query","event":"e","complete":true}
{"op":"stream_query","stream":"s1","complete":true}
{"op":"host_read","buffer":"p"}"#,
        &[(5, &[]), (6, &[])],
    );
}

/// A stream-ordered free on the stream that read the buffer: the wait before it orders the
/// writer's access before the free.
#[test]
fn a_wait_before_a_stream_ordered_free() {
    expect(
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"free","buffer":"a","stream":"s2"}"#,
        &[(3, &["unsafe-free 4 a"])],
    );
}

/// A sync on a trace that already has the error it would prevent prevents nothing: `s2`'s read
/// races with `s3`'s write anyway, and a hazard is one per (op, buffer, kind).
#[test]
fn an_error_already_there_is_not_prevented() {
    expect(
        r#"{"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["a"]}
{"op":"launch","stream":"s3","writes":["a"]}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"launch","stream":"s2","reads":["a"]}"#,
        &[(4, &[])],
    );
}

/// The number of random programs of each generator: `STREAMSAN_SYNCS_CASES`, default 2,000
/// (`cargo test --release --test syncs` with `STREAMSAN_SYNCS_CASES=100000` is the long run).
fn cases() -> u64 {
    std::env::var("STREAMSAN_SYNCS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// The analysis equals the brute force on programs decoded from random bytes (the `syncs` fuzz
/// target's check: also with interval indexes everywhere and with what-ifs given up early).
#[test]
fn decoded_programs_agree() {
    let mut rng = SplitMix::new(0x5_1c5);
    let (mut syncs, mut needed, mut programs) = (0, 0, 0);
    for _ in 0..cases() {
        let len = 3 + rng.below(160) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        fuzz::check_syncs(&data);
        if let Ok((_, v)) = brute_force(&fuzz::decode_program(&data)) {
            programs += 1;
            syncs += v.len();
            needed += v.iter().filter(|s| s.needed).count();
        }
    }
    println!("{programs} decoded programs, {syncs} synchronization ops, {needed} needed");
    assert!(needed > 0 && syncs > needed);
}

/// A generated program (`streamsan::fuzz::gen`: the synchronization each access needs, some
/// left out) with extra synchronization ops at random places: waits on the program's events,
/// host syncs and queries, `record_stream` of its buffers — a mix of needed and redundant.
fn noisy_program(seed: u64) -> Vec<TraceOp> {
    use streamsan::fuzz::gen::{generate, GenConfig};
    use streamsan::trace::Op;
    let mut rng = SplitMix::new(seed);
    let cfg = GenConfig {
        ops: 8 + rng.below(40) as usize,
        streams: 1 + rng.below(4) as u32,
        buffers: 1 + rng.below(5) as u32,
        missing_sync: [0.0, 0.0, 0.05, 0.2][rng.below(4) as usize],
        pinned: rng.below(2) == 0,
        blocking: rng.below(2) == 0,
        stream_ordered_free: rng.below(2) == 0,
        max_words: [4, 16, 256][rng.below(3) as usize],
        ..GenConfig::default()
    };
    let program = generate(&cfg, &mut rng);
    let mut streams: Vec<&str> = vec!["s0", "s1", "s2", "s3"];
    streams.truncate(cfg.streams as usize);
    if cfg.blocking {
        streams.extend(["b", "default"]);
    }
    let extra = rng.below(8);
    let mut ops = program.ops;
    for _ in 0..extra {
        let stream = streams[rng.below(streams.len() as u64) as usize];
        let event = format!("e{}", rng.below(6));
        let buffer = format!("x{}", rng.below(u64::from(cfg.buffers)));
        let op = match rng.below(7) {
            0 | 1 => Op::EventWait {
                stream: stream.into(),
                event: event.into(),
            },
            2 => Op::StreamSync {
                stream: stream.into(),
            },
            3 => Op::EventSync {
                event: event.into(),
            },
            4 => Op::StreamQuery {
                stream: stream.into(),
                complete: true,
            },
            5 => Op::DeviceSync { device: 0 },
            _ => Op::RecordStream {
                buffer: buffer.into(),
                stream: stream.into(),
            },
        };
        // After the streams are created (a stream used before its blocking declaration is
        // bad input).
        let at = (streams.len() + rng.below(ops.len() as u64 + 1) as usize).min(ops.len());
        ops.insert(at, TraceOp::from(op));
    }
    ops
}

/// The analysis equals the brute force on generated programs with noise ([`cases`] programs).
#[test]
fn generated_programs_agree() {
    let cases = cases();
    let (mut syncs, mut needed, mut checked) = (0, 0, 0);
    for seed in 0..cases {
        let ops = noisy_program(seed);
        let Ok((report, brute)) = brute_force(&ops) else {
            continue;
        };
        checked += 1;
        syncs += brute.len();
        needed += brute.iter().filter(|s| s.needed).count();
        let (report2, product) = analyze(&ops).expect("accepted");
        assert_eq!(report, report2);
        assert!(
            brute == product,
            "seed {seed}\n  brute force {}\n  analysis    {}\nprogram:\n{}",
            fuzz::describe_syncs(&brute),
            fuzz::describe_syncs(&product),
            fuzz::to_jsonl(&ops)
        );
    }
    println!("{checked} programs, {syncs} synchronization ops, {needed} needed");
    assert!(checked * 10 >= cases * 9, "too many programs rejected");
    assert!(needed * 10 > syncs && needed * 10 < syncs * 9);
}

/// The analysis equals the brute force on every conformance trace and every example trace.
#[test]
fn conformance_and_example_traces_agree() {
    let mut files = fixtures::fixtures_with_extension(fixtures::CONFORMANCE, "jsonl");
    let conformance = files.len();
    assert!(conformance >= 40, "conformance traces missing");
    files.extend(fixtures::fixtures_with_extension(
        fixtures::EXAMPLE_TRACES,
        "jsonl",
    ));
    let (mut syncs, mut needed) = (0, 0);
    for f in &files {
        let v = verdicts(f.text());
        syncs += v.len();
        needed += v.iter().filter(|s| s.needed).count();
    }
    println!(
        "{} traces ({conformance} conformance), {syncs} synchronization ops, {needed} needed",
        files.len()
    );
    assert!(needed > 10 && syncs > needed);
}

/// The analysis equals the brute force on a pipeline with "insurance" waits (`streamsan bench
/// --waits`): each step waits on the events of five stages, most of them redundant.
#[test]
fn pipeline_with_insurance_waits_agrees() {
    use streamsan::workload::Pipeline;
    let mut ops = Vec::new();
    Pipeline {
        ops: 1500,
        streams: 6,
        buffers: 24,
        seed: 3,
    }
    .generate_waiting(5, |op| ops.push(op));
    let (report, brute) = brute_force(&ops).expect("accepted");
    let (report2, product) = analyze(&ops).expect("accepted");
    assert!(report.is_clean());
    assert_eq!(report, report2);
    let needed = brute.iter().filter(|s| s.needed).count();
    println!("{} synchronization ops, {needed} needed", brute.len());
    assert!(brute.len() > 600 && needed > 10 && needed < brute.len() / 2);
    assert!(
        brute == product,
        "the analysis and the brute force disagree"
    );
}

/// The harness: `model::Builder::syncs` runs the analysis on a cudarc-shaped program (on the
/// simulator) and the report lists each synchronization by its call site in this file.
#[test]
fn the_harness_reports_syncs_by_call_site() {
    use streamsan::cudarc::driver::{CudaSlice, DriverError};
    use streamsan::model::{Backend, Builder};
    let mut b = Builder::new();
    b.backend = Backend::Sim;
    b.syncs = true;
    let checked = b
        .check(|cx| -> Result<(), DriverError> {
            let ctx = cx.ctx();
            let s1 = ctx.new_stream()?;
            let s2 = s1.fork()?;
            let a: CudaSlice<f32> = s1.clone_htod(&[1.0, 2.0, 3.0])?;
            s2.join(&s1)?; // needed: the copy below reads what s1 uploaded
            let _b = s2.clone_dtod(&a)?;
            s2.join(&s1)?; // redundant: s1 did nothing since, and nothing needs it
            s1.join(&s2)?; // needed: a is freed on s1 while s2 reads it
            Ok(())
        })
        .expect("the model runs")
        .ran()
        .expect("on the simulator");
    assert!(checked.report.is_clean(), "{:?}", checked.report.hazards);
    let syncs = checked.report.syncs.as_ref().expect("analysed");
    let here = |v: &SyncVerdict| {
        v.site
            .as_ref()
            .map(|s| s.to_string())
            .filter(|s| s.contains("tests/syncs.rs"))
    };
    let waits: Vec<(String, bool)> = syncs
        .iter()
        .filter(|v| v.kind == "event_wait")
        .filter_map(|v| here(v).map(|s| (s, v.needed)))
        .collect();
    // fork's wait (redundant: s1 had done nothing), then the three joins' waits, in call order.
    let needed: Vec<bool> = waits.iter().map(|w| w.1).collect();
    assert_eq!(needed, [false, true, false, true], "{waits:?}");
    let text = streamsan::report::render_text(&checked.report, &Default::default());
    assert!(
        text.contains("redundant — removing it keeps the program hazard-free"),
        "{text}"
    );
    assert!(text.contains("tests/syncs.rs"), "{text}");
}
