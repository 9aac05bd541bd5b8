//! CUDA graphs in the session harness, on the simulator and on a GPU: capture, replay on any
//! stream, graph memory pools shared between graphs, and the four graph bugs of PyTorch programs —
//! each buggy (reported, and corrupted where the backend can show it) and fixed (clean, and
//! correct).
//!
//! `on_both!(case)` makes `case::simulated` and `case::cuda`; the GPU one prints
//! `skipped: <reason>` and passes where there is no GPU (it fails there instead under
//! `STREAMSAN_REQUIRE_GPU=1`), and holds a lock while it uses the device so that the 2 ms spins
//! that open the race windows are not disturbed by the other tests of this file.
//!
//! On the simulator a replay runs its body on the launch's stream in body order, and a spin makes
//! that stream lag: a race between a replay and another stream corrupts deterministically, a race
//! between two lanes of one graph does not (the GPU runs lanes concurrently, and shows it).

#[cfg(feature = "cuda")]
use std::sync::{Mutex, MutexGuard};

use streamsan::kernels::{count_mismatches, hash_region_cpu};
use streamsan::session::{BackendKind, Session, SessionError};
use streamsan::{HazardKind, Report};

/// Words per test buffer (16 KiB: the small pool).
const N: usize = 4096;

/// How long a spin keeps a stream busy to open a race window on a GPU.
const SPIN_NS: u64 = 2_000_000;

#[cfg(feature = "cuda")]
static DEVICE: Mutex<()> = Mutex::new(());

#[cfg(feature = "cuda")]
fn gpu() -> Option<(MutexGuard<'static, ()>, Session)> {
    if !streamsan::cuda::gpu_or_skip() {
        return None;
    }
    let guard = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let session = Session::cuda(0).expect("open device 0");
    Some((guard, session))
}

/// Runs a case, buggy and fixed, on the simulator (`case::simulated`) and on GPU 0
/// (`case::cuda`).
macro_rules! on_both {
    ($case:ident) => {
        mod $case {
            #[test]
            fn simulated() {
                for fixed in [false, true] {
                    super::$case(streamsan::session::Session::simulated(), fixed)
                        .expect(concat!(stringify!($case), " on the simulator"));
                }
            }

            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                for fixed in [false, true] {
                    if let Some((_guard, session)) = super::gpu() {
                        super::$case(session, fixed)
                            .expect(concat!(stringify!($case), " on the GPU"));
                    }
                }
            }
        }
    };
}

type Result<T = ()> = std::result::Result<T, SessionError>;

fn is_gpu(s: &Session) -> bool {
    matches!(s.backend(), BackendKind::Cuda { .. })
}

/// What the hash kernel of launch `op` writes into a region of `len` words (write region 0).
fn expected(op: u64, reads: &[&[u32]], len: usize) -> Vec<u32> {
    let mut out = vec![0u32; len];
    hash_region_cpu(op as u32, 0, reads, &mut out);
    out
}

fn kinds(report: &Report) -> Vec<HazardKind> {
    report.hazards.iter().map(|h| h.kind).collect()
}

/// Checks a verdict and the corruption: buggy is reported (and corrupted where `observable`),
/// fixed is clean and correct.
fn verdict(report: &Report, fixed: bool, corrupted: u64, observable: bool, what: &str) {
    println!(
        "{what} ({}): {} hazards, {corrupted} of {N} words corrupted",
        if fixed { "fixed" } else { "buggy" },
        report.hazards.len()
    );
    if fixed {
        assert!(report.hazards.is_empty(), "{}", report.to_json());
        assert_eq!(
            corrupted, 0,
            "{what}: the fixed program computed wrong words"
        );
    } else {
        assert!(!report.hazards.is_empty(), "{what}: not reported");
        if observable {
            assert!(corrupted > 0, "{what}: the race corrupted nothing");
        }
    }
}

/// PyTorch's `static_input.copy_(new)` on a side stream while a replay still reads the static
/// input; fixed: the side stream waits for the replay first.
fn static_input_copy_during_replay(s: Session, fixed: bool) -> Result {
    let main = s.stream_named("main")?;
    let side = s.stream_named("side")?;
    let mut static_in = s.alloc_named::<u32>(&main, "static_in", N)?;
    let mut static_out = s.alloc_named::<u32>(&main, "static_out", N)?;
    let init = s.launch(&main, "init").write(&mut static_in).hash()?;

    main.begin_capture()?;
    let model = s
        .launch(&main, "model")
        .read(&static_in)
        .write(&mut static_out)
        .spin(SPIN_NS)
        .hash()?;
    let graph = main.end_capture()?;
    assert!(!main.is_capturing());

    let ready = s.event()?;
    ready.record(&main)?;
    side.wait(&ready)?;
    let launch_op = s.ops();
    graph.launch(&main)?;
    if fixed {
        let done = s.event()?;
        done.record(&main)?;
        side.wait(&done)?;
    }
    let copy = s.launch(&side, "copy_").write(&mut static_in).hash()?;
    s.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&main, &static_out)?;
    let want = expected(model, &[&expected(init, &[], N)], N);
    let corrupted = count_mismatches(&got, &want);
    let report = s.finish()?;
    verdict(
        &report,
        fixed,
        corrupted,
        true,
        "static input copied during a replay",
    );
    if !fixed {
        assert_eq!(
            kinds(&report),
            vec![HazardKind::DataRace],
            "{}",
            report.to_json()
        );
        let h = &report.hazards[0];
        assert_eq!(h.op, copy, "{}", report.to_json());
        assert_eq!(h.buffer.as_deref(), Some("static_in"));
        let c = &h.conflicts[0];
        assert_eq!(c.op, launch_op, "the conflict is the replay");
        assert_eq!(c.captured, Some(model), "naming the captured op");
    }
    Ok(())
}
on_both!(static_input_copy_during_replay);

/// A consumer on another stream reads the static output before the replay that writes it has
/// finished; fixed: it waits for the replay.
fn static_output_read_before_replay(s: Session, fixed: bool) -> Result {
    let main = s.stream_named("main")?;
    let consumer = s.stream_named("consumer")?;
    let mut static_out = s.alloc_named::<u32>(&main, "static_out", N)?;
    let mut result = s.alloc_named::<u32>(&consumer, "result", N)?;
    main.begin_capture()?;
    let model = s
        .launch(&main, "model")
        .write(&mut static_out)
        .spin(SPIN_NS)
        .hash()?;
    let graph = main.end_capture()?;
    // The static output's allocation is ordered before the consumer; the replay is not.
    let ready = s.event()?;
    ready.record(&main)?;
    consumer.wait(&ready)?;
    let launch_op = s.ops();
    graph.launch(&main)?;
    if fixed {
        let done = s.event()?;
        done.record(&main)?;
        consumer.wait(&done)?;
    }
    let consume = s
        .launch(&consumer, "consume")
        .read(&static_out)
        .write(&mut result)
        .hash()?;
    s.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&consumer, &result)?;
    let want = expected(consume, &[&expected(model, &[], N)], N);
    let corrupted = count_mismatches(&got, &want);
    let report = s.finish()?;
    verdict(
        &report,
        fixed,
        corrupted,
        true,
        "static output read before the replay",
    );
    if !fixed {
        assert_eq!(
            kinds(&report),
            vec![HazardKind::DataRace],
            "{}",
            report.to_json()
        );
        let h = &report.hazards[0];
        assert_eq!(h.op, consume);
        assert_eq!(h.buffer.as_deref(), Some("static_out"));
        assert_eq!(h.conflicts[0].op, launch_op);
        assert_eq!(h.conflicts[0].captured, Some(model));
    }
    Ok(())
}
on_both!(static_output_read_before_replay);

/// Two graphs captured into one pool (PyTorch's `pool=`), the second taking the first's freed
/// temporary block, replayed on two streams at once (pytorch issue 137844); fixed: the second
/// replay waits for the first.
fn shared_pool_replayed_concurrently(s: Session, fixed: bool) -> Result {
    let capture = s.stream_named("capture")?;
    let a = s.stream_named("a")?;
    let b = s.stream_named("b")?;
    let mut out_a = s.alloc_named::<u32>(&capture, "out_a", N)?;
    let mut out_b = s.alloc_named::<u32>(&capture, "out_b", N)?;
    let pool = s.graph_pool()?;

    capture.begin_capture_in(&pool)?;
    let mut tmp = s.alloc_named::<u32>(&capture, "tmp_a", N)?;
    let tmp_a_addr = tmp.device_ptr();
    let a1 = s.launch(&capture, "a1").write(&mut tmp).hash()?;
    let a2 = s
        .launch(&capture, "a2")
        .read(&tmp)
        .write(&mut out_a)
        .spin(SPIN_NS)
        .hash()?;
    tmp.free()?;
    let graph_a = capture.end_capture()?;

    capture.begin_capture_in(&graph_a.pool())?;
    let mut tmp = s.alloc_named::<u32>(&capture, "tmp_b", N)?;
    assert_eq!(
        tmp.device_ptr(),
        tmp_a_addr,
        "the second capture takes the first one's freed block"
    );
    s.launch(&capture, "b1").write(&mut tmp).hash()?;
    s.launch(&capture, "b2")
        .read(&tmp)
        .write(&mut out_b)
        .hash()?;
    tmp.free()?;
    let graph_b = capture.end_capture()?;

    let ready = s.event()?;
    ready.record(&capture)?;
    a.wait(&ready)?;
    b.wait(&ready)?;
    graph_a.launch(&a)?;
    if fixed {
        let done = s.event()?;
        done.record(&a)?;
        b.wait(&done)?;
    }
    let launch_b = s.ops();
    graph_b.launch(&b)?;
    s.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&a, &out_a)?;
    let want = expected(a2, &[&expected(a1, &[], N)], N);
    let corrupted = count_mismatches(&got, &want);
    let report = s.finish()?;
    verdict(
        &report,
        fixed,
        corrupted,
        true,
        "two graphs of one pool replayed at once",
    );
    if !fixed {
        assert!(
            report
                .hazards
                .iter()
                .all(|h| h.kind == HazardKind::ReuseRace && h.op == launch_b),
            "{}",
            report.to_json()
        );
        assert!(report
            .hazards
            .iter()
            .all(|h| h.access.as_ref().is_some_and(|a| a.captured.is_some())));
    }
    Ok(())
}
on_both!(shared_pool_replayed_concurrently);

/// A temporary freed inside a capture while a forked stream of the capture still reads it, without
/// `record_stream`: the same capture hands its block out again, and the replay's two lanes race on
/// it; fixed: `record_stream` holds the block back until the capture ends.
fn temporary_freed_in_capture(s: Session, fixed: bool) -> Result {
    let gpu = is_gpu(&s);
    let main = s.stream_named("main")?;
    let side = s.stream_named("side")?;
    let mut out = s.alloc_named::<u32>(&main, "out", N)?;
    let mut scratch = s.alloc_named::<u32>(&main, "scratch", N)?;

    main.begin_capture()?;
    let mut tmp = s.alloc_named::<u32>(&main, "tmp", N)?;
    let tmp_addr = tmp.device_ptr();
    let produce = s.launch(&main, "produce").write(&mut tmp).hash()?;
    let fork = s.event()?;
    fork.record(&main)?;
    side.wait(&fork)?;
    assert!(side.is_capturing(), "the side stream joined the capture");
    let consume = s
        .launch(&side, "consume")
        .read(&tmp)
        .write(&mut out)
        .spin(SPIN_NS)
        .hash()?;
    if fixed {
        s.record_stream(&tmp, &side)?;
    }
    tmp.free()?;
    let mut tmp2 = s.alloc_named::<u32>(&main, "tmp2", N)?;
    assert_eq!(
        tmp2.device_ptr() == tmp_addr,
        !fixed,
        "without record_stream the capture hands the block out again"
    );
    s.launch(&main, "overwrite").write(&mut tmp2).hash()?;
    s.launch(&main, "use")
        .read(&tmp2)
        .write(&mut scratch)
        .hash()?;
    let join = s.event()?;
    join.record(&side)?;
    main.wait(&join)?;
    tmp2.free()?;
    let graph = main.end_capture()?;
    assert!(!side.is_capturing());

    let launch_op = s.ops();
    graph.launch(&main)?;
    main.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&main, &out)?;
    let want = expected(consume, &[&expected(produce, &[], N)], N);
    let corrupted = count_mismatches(&got, &want);
    let report = s.finish()?;
    // The simulator replays the lanes one after the other: the race shows on a GPU only.
    verdict(
        &report,
        fixed,
        corrupted,
        gpu,
        "a temporary freed in a capture",
    );
    if !fixed {
        assert_eq!(
            kinds(&report),
            vec![HazardKind::ReuseRace],
            "{}",
            report.to_json()
        );
        let h = &report.hazards[0];
        assert_eq!(h.op, launch_op, "reported at the replay");
        assert!(h.access.as_ref().is_some_and(|a| a.captured.is_some()));
        assert!(h.conflicts.iter().all(|c| c.captured.is_some()));
    }
    Ok(())
}
on_both!(temporary_freed_in_capture);

/// A graph replayed on its capture stream and on another stream, many times: launches of one
/// graph are ordered, the replays compute the right words, and the trace's graph ops are in the
/// spec's shape.
fn replays_on_several_streams(s: Session, _fixed: bool) -> Result {
    let main = s.stream_named("main")?;
    let other = s.stream_named("other")?;
    let mut x = s.alloc_named::<u32>(&main, "x", N)?;
    let mut y = s.alloc_named::<u32>(&main, "y", N)?;
    let init = s.launch(&main, "init").write(&mut x).hash()?;
    main.begin_capture()?;
    let step = s.launch(&main, "step").read(&x).write(&mut y).hash()?;
    let graph = main.end_capture()?;
    let ready = s.event()?;
    ready.record(&main)?;
    other.wait(&ready)?;
    for i in 0..6 {
        graph.launch(if i % 2 == 0 { &main } else { &other })?;
    }
    s.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&main, &y)?;
    assert_eq!(
        count_mismatches(&got, &expected(step, &[&expected(init, &[], N)], N)),
        0
    );
    let trace = s.trace()?;
    let report = s.finish()?;
    assert!(report.hazards.is_empty(), "{}", report.to_json());
    use streamsan::trace::Op;
    let graph_ops: Vec<String> = trace
        .iter()
        .filter(|t| t.op.is_graph_op())
        .map(|t| match &t.op {
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => format!("begin {graph} {stream} {pool:?}"),
            Op::GraphEnd { graph } => format!("end {graph}"),
            Op::GraphLaunch { graph, stream } => format!("launch {graph} {stream}"),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        graph_ops,
        [
            "begin g1 main None",
            "end g1",
            "launch g1 main",
            "launch g1 other",
            "launch g1 main",
            "launch g1 other",
            "launch g1 main",
            "launch g1 other"
        ]
    );
    Ok(())
}
on_both!(replays_on_several_streams);

/// What CUDA rejects during a capture is rejected before anything is recorded: the trace stays
/// one the checker accepts.
#[test]
fn bad_input_during_a_capture_is_an_error() -> Result {
    let s = Session::simulated();
    let main = s.stream_named("main")?;
    let side = s.stream_named("side")?;
    let before = s.event()?;
    before.record(&main)?;
    assert!(matches!(
        s.default_stream().begin_capture(),
        Err(SessionError::Capture(_))
    ));
    main.begin_capture()?;
    assert!(matches!(
        main.begin_capture(),
        Err(SessionError::Capture(_))
    ));
    assert!(matches!(main.synchronize(), Err(SessionError::Capture(_))));
    assert!(matches!(main.query(), Err(SessionError::Capture(_))));
    assert!(matches!(s.synchronize(), Err(SessionError::Capture(_))));
    assert!(matches!(main.wait(&before), Err(SessionError::Capture(_))));
    let mut buf = s.alloc::<u32>(&main, 16)?;
    assert!(matches!(
        s.memcpy_dtov::<u32>(&main, &buf),
        Err(SessionError::Capture(_))
    ));
    let e = s.event()?;
    e.record(&main)?;
    assert!(matches!(e.synchronize(), Err(SessionError::Capture(_))));
    assert!(matches!(e.query(), Err(SessionError::Capture(_))));
    assert!(matches!(
        side.end_capture(),
        Err(SessionError::InvalidArgument(_))
    ));
    s.launch(&main, "k").write(&mut buf).hash()?;
    buf.free()?;
    let graph = main.end_capture()?;
    assert!(matches!(graph.launch(&main), Ok(())));
    // After the capture, the stream syncs again.
    main.synchronize()?;
    let report = s.finish()?;
    assert!(report.hazards.is_empty(), "{}", report.to_json());
    Ok(())
}

/// A non-pool buffer freed by its last name before a replay that still names it is a
/// use-after-free at the launch.
#[test]
fn a_buffer_freed_before_a_replay_is_use_after_free() -> Result {
    let s = Session::simulated();
    let main = s.stream_named("main")?;
    let mut input = s.alloc_named::<u32>(&main, "input", N)?;
    let mut out = s.alloc_named::<u32>(&main, "out", N)?;
    s.launch(&main, "init").write(&mut input).hash()?;
    main.begin_capture()?;
    s.launch(&main, "model")
        .read(&input)
        .write(&mut out)
        .hash()?;
    let graph = main.end_capture()?;
    input.free()?;
    let launch = s.ops();
    graph.launch(&main)?;
    main.synchronize()?;
    let report = s.finish()?;
    assert_eq!(
        kinds(&report),
        vec![HazardKind::UseAfterFree],
        "{}",
        report.to_json()
    );
    assert_eq!(report.hazards[0].op, launch);
    Ok(())
}

/// A graph's pool buffer read by another stream after a replay, then freed: without
/// `record_stream` the next capture of the pool takes its block and that graph's replay
/// overwrites it while the reader may still read; with it, the block waits for the reader
/// (PyTorch's deferred free) and the next capture gets another one.
fn pool_buffer_freed_after_a_replay(s: Session, fixed: bool) -> Result {
    let main = s.stream_named("main")?;
    let reader = s.stream_named("reader")?;
    let mut result = s.alloc_named::<u32>(&reader, "result", N)?;
    let pool = s.graph_pool()?;
    main.begin_capture_in(&pool)?;
    let mut out = s.alloc_named::<u32>(&main, "out", N)?;
    let out_addr = out.device_ptr();
    let w = s.launch(&main, "w").write(&mut out).hash()?;
    let g1 = main.end_capture()?;
    g1.launch(&main)?;
    let done = s.event()?;
    done.record(&main)?;
    reader.wait(&done)?;
    let read = s
        .launch(&reader, "read")
        .read(&out)
        .write(&mut result)
        .spin(SPIN_NS)
        .hash()?;
    if fixed {
        s.record_stream(&out, &reader)?;
    }
    out.free()?;
    main.begin_capture_in(&pool)?;
    let mut t = s.alloc_named::<u32>(&main, "t", N)?;
    assert_eq!(
        t.device_ptr() == out_addr,
        !fixed,
        "the block waits for the reader only with record_stream"
    );
    s.launch(&main, "w2").write(&mut t).hash()?;
    let g2 = main.end_capture()?;
    g2.launch(&main)?;
    s.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&reader, &result)?;
    let corrupted = count_mismatches(&got, &expected(read, &[&expected(w, &[], N)], N));
    let report = s.finish()?;
    verdict(
        &report,
        fixed,
        corrupted,
        true,
        "a pool buffer freed after a replay",
    );
    if !fixed {
        assert!(
            kinds(&report).contains(&HazardKind::ReuseRace),
            "{}",
            report.to_json()
        );
    }
    Ok(())
}
on_both!(pool_buffer_freed_after_a_replay);
