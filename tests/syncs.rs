//! The synchronization analysis (`streamsan::analysis::syncs`) against its definition.
//!
//! - The brute force (the definition run as written) on hand-written cases whose answers are
//!   worked out by hand: a needed wait, a wait covered by an earlier one, a redundant host sync,
//!   a needed `record_stream`, a sync needed only through the legacy default stream, and more.
//! - The analysis equals the brute force — `needed` and `prevents` of every synchronization op —
//!   on every conformance trace and on random programs (`fuzz/common.rs`'s decoder, the same
//!   check as the `syncs` fuzz target; and the oracle agreement test's generator, `programs/`,
//!   with and without CUDA graphs).
//!
//! Fixtures: `tests/conformance/*.jsonl`, embedded at build time (`tests/common/mod.rs`).

#[path = "common/child.rs"]
mod child;
#[path = "common/mod.rs"]
mod fixtures;
#[path = "../fuzz/common.rs"]
#[allow(dead_code)]
mod fuzz;
mod programs;

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

/// CUDA graphs: the waits inside the capture (the one that makes `s2` join it included) are part
/// of the graph and not judged; the wait that orders the replay after the write of its input is
/// needed (the replay's race is reported at the launch), a host sync of a stream that only
/// captured work is redundant, and the host sync after the replay is what makes the free safe.
#[test]
fn graph_replays() {
    expect(
        r#"{"op":"alloc","buffer":"in","bytes":4096,"stream":"s0"}
{"op":"launch","stream":"s0","writes":["in"]}
{"op":"event_record","event":"e","stream":"s0"}
{"op":"graph_begin","graph":"g","stream":"s1"}
{"op":"launch","stream":"s1","reads":["in"]}
{"op":"event_record","event":"f","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"f"}
{"op":"launch","stream":"s2","reads":["in"]}
{"op":"event_record","event":"h","stream":"s2"}
{"op":"event_wait","stream":"s1","event":"h"}
{"op":"graph_end","graph":"g"}
{"op":"event_wait","stream":"s1","event":"e"}
{"op":"stream_sync","stream":"s2"}
{"op":"graph_launch","graph":"g","stream":"s1"}
{"op":"stream_sync","stream":"s1"}
{"op":"free","buffer":"in"}"#,
        &[
            (11, &["data-race 13 in"]),
            (12, &[]),
            (14, &["unsafe-free 15 in"]),
        ],
    );
}

/// A training loop around a CUDA graph (a capture with a side stream that joins and is joined
/// back, a pool temporary): each step writes the static input from pinned memory, replays the
/// graph, copies the static output back, synchronizes for the host's read (`.item()`), then
/// adds an "insurance" `device_sync` and `stream_sync`. The `.item()` syncs are needed, the
/// insurance ones redundant, the captured waits not judged — and the analysis decides every one
/// with its what-ifs: the replays' entry clocks are the real ones, nothing is given up.
#[test]
fn a_graph_replay_loop() {
    use streamsan::analysis::syncs::SyncChecker;
    let mut text = String::from(
        r#"{"op":"stream_create","stream":"s"}
{"op":"alloc","buffer":"in_pin","bytes":4096,"memory":"pinned"}
{"op":"alloc","buffer":"out_pin","bytes":4096,"memory":"pinned"}
{"op":"alloc","buffer":"static_in","bytes":4096,"stream":"s"}
{"op":"alloc","buffer":"static_out","bytes":4096,"stream":"s"}
{"op":"alloc","buffer":"w","bytes":4096,"stream":"s"}
{"op":"graph_begin","graph":"g","stream":"s"}
{"op":"alloc","buffer":"tmp","bytes":4096,"stream":"s"}
{"op":"launch","stream":"s","reads":["static_in","w"],"writes":["tmp"]}
{"op":"event_record","event":"f","stream":"s"}
{"op":"event_wait","stream":"side","event":"f"}
{"op":"launch","stream":"side","reads":["tmp"],"writes":["static_out"]}
{"op":"event_record","event":"j","stream":"side"}
{"op":"event_wait","stream":"s","event":"j"}
{"op":"free","buffer":"tmp"}
{"op":"graph_end","graph":"g"}
"#,
    );
    let steps = 40;
    for _ in 0..steps {
        text.push_str(
            r#"{"op":"host_write","buffer":"in_pin"}
{"op":"copy","stream":"s","src":"in_pin","dst":"static_in"}
{"op":"graph_launch","graph":"g","stream":"s"}
{"op":"copy","stream":"s","src":"static_out","dst":"out_pin"}
{"op":"stream_sync","stream":"s"}
{"op":"host_read","buffer":"out_pin"}
{"op":"device_sync"}
{"op":"stream_sync","stream":"s"}
"#,
        );
    }
    let v = verdicts(&text);
    assert_eq!(v.len(), 3 * steps, "the captured waits are not judged");
    for (k, step) in v.chunks(3).enumerate() {
        assert!(step[0].needed, "step {k}: the .item() sync {:?}", step[0]);
        assert!(!step[1].needed && !step[2].needed, "step {k}: {step:?}");
    }
    let mut c = SyncChecker::new();
    for op in &read(&text) {
        c.check(op).expect("accepted");
    }
    assert_eq!(c.stats().abandoned, 0, "{:?}", c.stats());
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
    let (mut syncs, mut needed, mut rejected) = (0, 0, 0);
    for f in &files {
        // Bad input (the `graph-bad-*` traces): both reject it, at the same op.
        let ops = read(f.text());
        if let Err(e) = brute_force(&ops) {
            let e2 = analyze(&ops).expect_err("the analysis accepts bad input");
            assert_eq!((e.op, e.message), (e2.op, e2.message), "{}", f.path);
            rejected += 1;
            continue;
        }
        let v = verdicts(f.text());
        syncs += v.len();
        needed += v.iter().filter(|s| s.needed).count();
    }
    println!(
        "{} traces ({conformance} conformance, {rejected} bad input), {syncs} synchronization ops, {needed} needed",
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

/// The analysis equals the brute force on the oracle agreement test's random programs
/// (`programs/mod.rs`): event re-records, queries, `record_stream`, the legacy default stream
/// and blocking streams, `addr` reuse, and — in half of them — CUDA graphs (captures with forks
/// and joins, captured event waits, shared pools, replays on several streams). [`cases`]
/// programs; the long run is `STREAMSAN_SYNCS_CASES=100000 cargo test --release --test syncs
/// random_programs_with_graphs_agree -- --nocapture`.
#[test]
fn random_programs_with_graphs_agree() {
    use programs::{program, Rng, Shape};
    use streamsan::analysis::syncs::{SyncChecker, SyncConfig};
    use streamsan::trace::Op;
    use streamsan::Checker;
    let cases = cases();
    let mut graph_programs = 0u64;
    let mut launches = 0u64;
    let (mut syncs, mut needed, mut checked) = (0u64, 0u64, 0u64);
    // Synchronization ops of programs with a replay, needed ones, and needed ones that prevent
    // an error of a replay (reported at a `graph_launch`).
    let (mut graph_syncs, mut graph_needed, mut replay_prevented) = (0u64, 0u64, 0u64);
    // Captured event waits (never judged) and ops left to a re-check.
    let (mut captured_waits, mut undecided) = (0u64, 0u64);
    let mut noise_rejected = 0u64;
    let keep_all = SyncConfig {
        max_live: usize::MAX,
        max_host: usize::MAX,
    };
    for case in 0..cases {
        let mut r = Rng(case.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5_1c5);
        let shape = Shape {
            extra_streams: r.below(3) as u8,
            s1_implicit: r.chance(2),
            s2_device1: r.chance(2),
            s2_blocking: r.chance(2),
            names: 2 + r.below(3) as u8,
            fourth_managed: r.chance(2),
            addr_mode: r.chance(4),
            reuse_heavy: r.chance(2),
            graphs: r.chance(2),
        };
        let n = r.below(81);
        let steps: Vec<(u8, u64)> = (0..n).map(|_| (r.next() as u8, r.next())).collect();
        let plain = program(&shape, &steps);
        // With a few synchronizations more at random places (where CUDA accepts them).
        let noisy = with_noise(&plain, &shape, &mut r);
        let (ops, (report, brute)) = match brute_force(&noisy) {
            Ok(v) => (noisy, v),
            Err(_) => {
                noise_rejected += 1;
                let Ok(v) = brute_force(&plain) else {
                    panic!(
                        "the generator made a program the checker rejects:\n{}",
                        fuzz::to_jsonl(&plain)
                    );
                };
                (plain, v)
            }
        };
        checked += 1;
        let launch = ops.iter().any(|o| matches!(o.op, Op::GraphLaunch { .. }));
        if shape.graphs {
            graph_programs += 1;
        }
        let v_needed = brute.iter().filter(|s| s.needed).count() as u64;
        syncs += brute.len() as u64;
        needed += v_needed;
        if launch {
            launches += 1;
            graph_syncs += brute.len() as u64;
            graph_needed += v_needed;
            replay_prevented += brute
                .iter()
                .filter(|s| {
                    s.prevents
                        .iter()
                        .any(|k| matches!(ops[k.op as usize].op, Op::GraphLaunch { .. }))
                })
                .count() as u64;
        }
        let waits = ops
            .iter()
            .filter(|o| matches!(o.op, Op::EventWait { .. }))
            .count() as u64;
        let judged_waits = brute.iter().filter(|s| s.kind == "event_wait").count() as u64;
        captured_waits += waits - judged_waits;
        // The analysis as `streamsan check --syncs` runs it: what-ifs, limits, re-checks.
        let (report2, product) = analyze(&ops).expect("accepted");
        assert_eq!(report, report2);
        assert!(
            brute == product,
            "case {case}\n  brute force {}\n  analysis    {}\nprogram:\n{}",
            fuzz::describe_syncs(&brute),
            fuzz::describe_syncs(&product),
            fuzz::to_jsonl(&ops)
        );
        // Without limits: only graphs and their pools (an allocation into a named pool outside a
        // capture makes a pool buffer) leave ops to a re-check, and what the what-ifs decided is
        // final.
        let mut c = SyncChecker::with_config(Checker::new(), keep_all);
        for op in &ops {
            c.check(op).expect("accepted");
        }
        let outcome = c.finish();
        let pools = |o: &TraceOp| matches!(o.op, Op::Alloc { pool: Some(_), .. });
        assert!(
            ops.iter().any(|o| o.op.is_graph_op() || pools(o)) || outcome.undecided.is_empty(),
            "case {case}: a what-if was given up without a graph or a pool"
        );
        undecided += outcome.undecided.len() as u64;
        for (a, b) in outcome.syncs.iter().zip(&brute) {
            if !outcome.undecided.contains(&a.op) {
                assert_eq!(
                    a,
                    b,
                    "case {case}: a what-if's verdict\n{}",
                    fuzz::to_jsonl(&ops)
                );
            }
        }
    }
    println!(
        "{checked} programs ({graph_programs} with graph steps, {launches} with a replay): \
         {syncs} synchronization ops, {needed} needed; in programs with a replay {graph_syncs}, \
         {graph_needed} needed, {replay_prevented} preventing an error of a replay; \
         {captured_waits} captured event waits not judged; {undecided} ops left to a re-check; \
         {noise_rejected} programs without their extra synchronizations (rejected with them)"
    );
    assert_eq!(checked, cases);
    assert!(
        noise_rejected * 2 < cases,
        "most programs keep their extra synchronizations"
    );
    assert!(needed > 0 && syncs > needed);
    if cases >= 1000 {
        assert!(launches * 5 > cases, "too few programs replay a graph");
        assert!(replay_prevented > 0 && captured_waits > 0);
        assert!(graph_needed > 0 && graph_syncs > graph_needed);
    }
}

/// `plain` with up to six synchronization ops more at random places: event waits (on the
/// generator's events `e0`, `e1`), host syncs and queries, `record_stream` of its names.
fn with_noise(plain: &[TraceOp], shape: &programs::Shape, r: &mut programs::Rng) -> Vec<TraceOp> {
    use streamsan::trace::Op;
    let mut streams = vec!["default", "b"];
    streams.extend(["s1", "s2"].iter().take(shape.extra_streams as usize));
    let names = ["a", "p", "c", "m"];
    let mut ops = plain.to_vec();
    for _ in 0..r.below(7) {
        let stream = *r.pick(&streams);
        let event = if r.chance(2) { "e0" } else { "e1" };
        let op = match r.below(8) {
            0..=2 => Op::EventWait {
                stream: stream.into(),
                event: event.into(),
            },
            3 => Op::StreamSync {
                stream: stream.into(),
            },
            4 => Op::EventSync {
                event: event.into(),
            },
            5 => Op::EventQuery {
                event: event.into(),
                complete: true,
            },
            6 => Op::DeviceSync { device: 0 },
            _ => Op::RecordStream {
                buffer: (*r.pick(&names[..shape.names as usize])).into(),
                stream: stream.into(),
            },
        };
        // After the stream declarations (a stream used before its declaration is bad input).
        let at = (4 + r.below(ops.len() as u64 + 1) as usize).min(ops.len());
        ops.insert(at, TraceOp::from(op));
    }
    ops
}

/// `streamsan fix --remove-redundant` on every example trace: the written trace is the trace as
/// written without the lines of the ops `remove_redundant` names, it is a valid trace, re-checked
/// it has no error the original lacks (its errors, mapped back to the original op indices, are
/// the original's), it has no more ops, and strictly fewer wherever the analysis found a
/// redundant synchronization (the first one alone can always go).
#[test]
fn remove_redundant_on_the_example_traces() {
    use std::collections::BTreeSet;
    use streamsan::analysis::syncs::{error_keys, remove_redundant, ErrorKey};
    use streamsan::Checker;
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_streamsan"));
    let dir = std::env::temp_dir().join(format!("streamsan-syncs-fix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let files = fixtures::fixtures_with_extension(fixtures::EXAMPLE_TRACES, "jsonl");
    assert!(files.len() >= 10, "example traces missing");
    let (mut shrunk, mut with_redundant) = (0, 0);
    for (k, f) in files.iter().enumerate() {
        let ops = read(f.text());
        let (report, verdicts) = analyze(&ops).expect("accepted");
        let redundant = verdicts.iter().filter(|v| !v.needed).count();
        let input = dir.join(format!("in-{k}.jsonl"));
        let output = dir.join(format!("out-{k}.jsonl"));
        std::fs::write(&input, f.text()).expect("written");
        let run = child::output(
            std::process::Command::new(&bin)
                .args(["fix", "--remove-redundant"])
                .arg(&input)
                .arg("-o")
                .arg(&output),
            std::process::Stdio::null(),
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            run.status.code(),
            Some(if report.is_clean() { 0 } else { 1 }),
            "{}: {stderr}",
            f.path
        );
        let written = std::fs::read_to_string(&output).expect("the written trace");
        // The lines of the removed ops are gone, and nothing else changed.
        let removal = remove_redundant(&ops).expect("accepted");
        assert!(
            stderr.contains(&format!(
                "removed {} of {} synchronization ops",
                removal.removed.len(),
                verdicts.len()
            )),
            "{}: {stderr}",
            f.path
        );
        let kept: Vec<u64> = (0..ops.len() as u64)
            .filter(|i| !removal.removed.contains(i))
            .collect();
        let after = read(&written);
        assert_eq!(after.len(), kept.len(), "{}", f.path);
        for (op, &i) in after.iter().zip(&kept) {
            assert_eq!(op.op, ops[i as usize].op, "{}: op {i}", f.path);
        }
        // Re-checked: no error the trace as written does not have.
        let mut c = Checker::new();
        for op in &after {
            c.check(op).expect("the written trace is valid");
        }
        let lean = c.finish();
        let mapped: BTreeSet<ErrorKey> = error_keys(&lean)
            .into_iter()
            .map(|e| ErrorKey {
                op: kept[e.op as usize],
                ..e
            })
            .collect();
        assert_eq!(mapped, error_keys(&report), "{}", f.path);
        assert_eq!(lean.is_clean(), report.is_clean(), "{}", f.path);
        assert!(after.len() <= ops.len());
        if redundant > 0 {
            with_redundant += 1;
            assert!(after.len() < ops.len(), "{}: nothing removed", f.path);
            shrunk += 1;
        } else {
            assert_eq!(after.len(), ops.len(), "{}", f.path);
        }
        println!(
            "{}: {} of {} synchronization ops removed, {} ops left of {}",
            f.path,
            removal.removed.len(),
            verdicts.len(),
            after.len(),
            ops.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        with_redundant >= 2,
        "too few example traces with redundant syncs"
    );
    assert_eq!(shrunk, with_redundant);
}
