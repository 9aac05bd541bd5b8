//! The cudarc-shaped facade and `streamsan::model`: the ported example reports exactly its
//! hazards (and its trace replays them), element types of any size keep their values, views
//! record their byte ranges, copies order as cudarc's do, and the same closure runs under
//! proptest.
//!
//! Tests that use `Builder::new()` run on a GPU where there is one (and `STREAMSAN_BACKEND` does
//! not say otherwise), else on the simulator: the hazards are the same on both.

use std::sync::Arc;

use half::bf16;
use proptest::prelude::*;
use streamsan::cudarc::driver::{
    CudaContext, CudaSlice, DeviceRepr, DriverError, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use streamsan::cudarc::nvrtc::{compile_ptx, Ptx};
use streamsan::model::{Backend, Builder, Checked, Outcome};
use streamsan::trace::{Op, TraceReader};
use streamsan::Checker;

#[allow(dead_code)]
#[path = "../examples/cudarc_port.rs"]
mod port;

#[allow(dead_code)]
#[path = "../examples/cudarc_graphs.rs"]
mod graphs;

/// (kind, op, buffer) of every hazard.
fn hazards(run: &Checked) -> Vec<(String, u64, String)> {
    run.report
        .hazards
        .iter()
        .map(|h| {
            (
                h.kind.as_str().to_owned(),
                h.op,
                h.buffer.as_ref().map(|b| b.to_string()).unwrap_or_default(),
            )
        })
        .collect()
}

fn triples(v: &[(&str, u64, &str)]) -> Vec<(String, u64, String)> {
    v.iter()
        .map(|(k, o, b)| (k.to_string(), *o, b.to_string()))
        .collect()
}

fn sim() -> Builder {
    let mut b = Builder::new();
    b.backend = Backend::Sim;
    b
}

/// Runs `f` with `b` and returns the checked run (`None` if skipped: no GPU for a GPU backend).
fn run_with<F>(b: &Builder, f: F) -> Option<Checked>
where
    F: FnOnce(&Arc<CudaContext>) -> Result<(), Box<dyn std::error::Error>>,
{
    match b.check(|cx| f(cx.ctx()).map_err(|e| e.to_string())) {
        Ok(Outcome::Ran(c)) => Some(c),
        Ok(Outcome::Skipped(reason)) => {
            println!("skipped: {reason}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn replay(path: &std::path::Path) -> Vec<(String, u64, String)> {
    let text = std::fs::read_to_string(path).expect("the trace was written");
    let mut reader = TraceReader::new(text.as_bytes(), "replay");
    let mut checker = Checker::new();
    while let Some((op, _)) = reader.next_op().expect("the trace reads back") {
        checker.check(&op).expect("the trace checks");
    }
    checker
        .finish()
        .hazards
        .iter()
        .map(|h| {
            (
                h.kind.as_str().to_owned(),
                h.op,
                h.buffer.as_ref().map(|b| b.to_string()).unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn the_port_reports_its_reuse_bug_and_its_trace_replays_it() {
    let Some(run) = run_with(&Builder::new(), |ctx| port::program(ctx, false).map(|_| ())) else {
        return;
    };
    // op 17: `reduce_bf16` reads `packed` (b2) on comm (s2); op 18: `packed` is freed on compute
    // (s1) with no wait for comm; op 19 hands its block to `activations` (b4), written by the
    // memset of alloc_zeros (op 20) and by `forward` (op 21) while comm may still read it.
    let expect = triples(&[
        ("unsafe-free", 18, "b2"),
        ("reuse-race", 20, "b4"),
        ("reuse-race", 21, "b4"),
    ]);
    assert_eq!(hazards(&run), expect, "{:#?}", run.report.hazards);
    let trace = run.trace.expect("a run with a hazard writes its trace");
    assert_eq!(
        replay(&trace),
        expect,
        "streamsan check reproduces the report"
    );
    // The sites are the program's lines.
    let site = run.report.hazards[0].conflicts[0]
        .site
        .as_ref()
        .map(|s| s.to_string());
    assert!(
        site.as_deref()
            .is_some_and(|s| s.contains("cudarc_port.rs")),
        "{site:?}"
    );
}

#[test]
fn the_fixed_port_is_clean_and_model_does_not_panic() {
    let Some(run) = run_with(&Builder::new(), |ctx| {
        let sums = port::program(ctx, true)?;
        assert_eq!(sums.len(), port::N);
        if !ctx.is_simulated() {
            // On a GPU the kernels are the real ones: 2 x the bf16 of i / 2, which the packing
            // kernel truncates to its upper 16 bits (no rounding).
            for (i, s) in sums.iter().enumerate() {
                let truncated = f32::from_bits(((i as f32 * 0.5).to_bits() >> 16) << 16);
                let want = 2.0 * truncated;
                assert_eq!(*s, want, "element {i}");
            }
        }
        Ok(())
    }) else {
        return;
    };
    assert!(run.report.is_clean(), "{:#?}", run.report.hazards);
    assert!(run.trace.is_none(), "a clean run writes no trace");
    streamsan::model(|cx| port::program(cx.ctx(), true).map(|_| ()));
}

#[test]
#[should_panic(expected = "replay: streamsan check")]
fn model_panics_with_the_report_and_the_replay_line() {
    let mut b = sim();
    b.trace_dir = std::env::temp_dir().join("streamsan-facade-test");
    b.run(|cx| port::program(cx.ctx(), false).map(|_| ()));
}

/// A `#[repr(C)]` struct as a kernel argument and an element type.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pair {
    key: i64,
    weight: f64,
}
// SAFETY: two 8-byte fields, no padding, every bit pattern valid.
unsafe impl DeviceRepr for Pair {}
// SAFETY: zeros are a valid `Pair`.
unsafe impl ValidAsZeroBits for Pair {}

fn round_trip<T: DeviceRepr + PartialEq + std::fmt::Debug>(
    ctx: &Arc<CudaContext>,
    host: &[T],
) -> Result<(), DriverError> {
    let s = ctx.new_stream()?;
    let dev = s.clone_htod(host)?;
    let copy = s.clone_dtod(&dev)?;
    let back = s.clone_dtoh(&copy)?;
    assert_eq!(back, host);
    let mut part = vec![host[0]; 3];
    s.memcpy_dtoh(&dev.slice(1..4), &mut part)?;
    assert_eq!(part, &host[1..4]);
    Ok(())
}

#[test]
fn elements_of_any_size_keep_their_values() {
    let run = run_with(&Builder::new(), |ctx| {
        round_trip(ctx, &[1.5f32, -2.0, 3.25, 4.0, 5.0])?;
        round_trip(ctx, &[i64::MIN, -1, 0, 1, i64::MAX])?;
        round_trip(ctx, &[1u8, 2, 3, 4, 5, 6, 7])?;
        let bf: Vec<bf16> = (0..9).map(|i| bf16::from_f32(i as f32 - 4.5)).collect();
        round_trip(ctx, &bf)?;
        let pairs: Vec<Pair> = (0..5)
            .map(|i| Pair {
                key: -i,
                weight: i as f64 / 3.0,
            })
            .collect();
        round_trip(ctx, &pairs)?;
        // Zeroed memory of every type reads back as zeros.
        let s = ctx.new_stream()?;
        let z: CudaSlice<Pair> = s.alloc_zeros(4)?;
        assert_eq!(
            s.clone_dtoh(&z)?,
            vec![
                Pair {
                    key: 0,
                    weight: 0.0
                };
                4
            ]
        );
        let z: CudaSlice<bf16> = s.alloc_zeros(7)?;
        assert_eq!(s.clone_dtoh(&z)?, vec![bf16::ZERO; 7]);
        Ok(())
    });
    if let Some(run) = run {
        assert!(run.report.is_clean(), "{:#?}", run.report.hazards);
    }
}

const TOUCH: &str = r#"
extern "C" __global__ void touch(unsigned short *out, const unsigned short *in, size_t n) {
    size_t i = threadIdx.x;
    if (i < n) out[i] = in[i] + 1;
}
"#;

/// Stream 1 writes bf16 elements `[0, a)` of a buffer, stream 2 then writes `[b, 12)` of it with
/// no ordering unless `join`: a data race exactly when the views overlap and the streams are not
/// joined.
fn halves(
    ctx: &Arc<CudaContext>,
    a: usize,
    b: usize,
    join: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let f = ctx
        .load_module(compile_ptx(TOUCH)?)?
        .load_function("touch")?;
    let s1 = ctx.new_stream()?;
    let s2 = s1.fork()?;
    let src: CudaSlice<bf16> = s1.alloc_zeros(12)?;
    let mut buf: CudaSlice<bf16> = s1.alloc_zeros(12)?;
    s2.join(&s1)?;
    let cfg = LaunchConfig::for_num_elems(12);
    let (na, nb) = (a, 12 - b);
    unsafe {
        s1.launch_builder(&f)
            .arg(&mut buf.slice_mut(0..a))
            .arg(&src)
            .arg(&na)
            .launch(cfg)
    }?;
    if join {
        s2.join(&s1)?;
    }
    unsafe {
        s2.launch_builder(&f)
            .arg(&mut buf.slice_mut(b..))
            .arg(&src)
            .arg(&nb)
            .launch(cfg)
    }?;
    s1.join(&s2)?;
    Ok(())
}

#[test]
fn views_record_their_byte_ranges() {
    let Some(run) = run_with(&sim(), |ctx| halves(ctx, 5, 3, false)) else {
        return;
    };
    let h = &run.report.hazards;
    // Ops 0-5 fork s2 (its join's event destroyed at 5), 6-9 allocate and zero `src` and `buf`,
    // 10-13 join, 14 and 15 are the launches.
    assert_eq!(hazards(&run), triples(&[("data-race", 15, "b2")]), "{h:#?}");
    // bf16 elements 3.. and ..5: bytes [6, 24) against [0, 10).
    let access = h[0].access.as_ref().expect("a race has its access");
    assert_eq!((access.offset, access.bytes), (6, Some(18)));
    assert_eq!(
        (h[0].conflicts[0].offset, h[0].conflicts[0].bytes),
        (0, Some(10))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The same closure under proptest: a race is reported exactly when the two views share a
    /// byte and the streams were not joined between the launches.
    #[test]
    fn disjoint_views_never_race_overlapping_ones_do(a in 1usize..12, b in 0usize..12, join: bool) {
        let run = run_with(&sim(), |ctx| halves(ctx, a, b, join)).expect("the simulator runs");
        let races = run.report.hazards.iter().filter(|h| h.kind.as_str() == "data-race").count();
        let overlap = b < a;
        prop_assert_eq!(races, usize::from(overlap && !join), "{:#?}", run.report.hazards);
        prop_assert_eq!(run.report.hazards.len(), races);
    }
}

#[test]
fn a_pageable_upload_is_asynchronous_and_a_download_waits_for_its_stream() {
    let Some(run) = run_with(&sim(), |ctx| {
        let s1 = ctx.new_stream()?;
        let s2 = s1.fork()?;
        let mut x: CudaSlice<i64> = s1.alloc_zeros(8)?;
        s2.join(&s1)?;
        // The host may reuse `host` at once, but the write of `x` is s1's, in stream order.
        let host = [7i64; 8];
        s1.memcpy_htod(&host, &mut x)?;
        // s2 reads x with no wait for s1: a race with the upload.
        let _y = s2.clone_dtod(&x)?;
        // A download on s1 waits for s1 only: the host may then read s1's results, and s2's
        // copy is still unordered with the host... which touches nothing of it.
        assert_eq!(s1.clone_dtoh(&x)?, vec![7i64; 8]);
        s1.join(&s2)?;
        Ok(())
    }) else {
        return;
    };
    let races: Vec<_> = hazards(&run)
        .into_iter()
        .filter(|(k, _, _)| k == "data-race")
        .collect();
    assert_eq!(races.len(), 1, "{:#?}", run.report.hazards);
    assert_eq!(run.report.hazards.len(), 1, "{:#?}", run.report.hazards);
}

#[test]
fn pinned_memory_is_written_asynchronously_by_a_copy() {
    for sync in [false, true] {
        let Some(run) = run_with(&sim(), |ctx| {
            let s = ctx.new_stream()?;
            let dev = s.clone_htod(&[1u32, 2, 3, 4])?;
            let mut pinned = unsafe { ctx.alloc_pinned::<u32>(4) }?;
            s.memcpy_dtoh(&dev, &mut pinned)?;
            if sync {
                s.synchronize()?;
            }
            let got = pinned.read()?;
            if sync {
                assert_eq!(got, vec![1, 2, 3, 4]);
            }
            pinned.write(&[9, 9, 9, 9])?;
            let again = s.clone_htod(&pinned)?;
            assert_eq!(s.clone_dtoh(&again)?, vec![9, 9, 9, 9]);
            Ok(())
        }) else {
            return;
        };
        let kinds: Vec<String> = hazards(&run).into_iter().map(|(k, _, _)| k).collect();
        if sync {
            assert!(kinds.is_empty(), "{:#?}", run.report.hazards);
        } else {
            // The host reads and then writes the pinned buffer the copy is still writing.
            assert_eq!(
                kinds,
                ["data-race", "data-race"],
                "{:#?}",
                run.report.hazards
            );
        }
    }
}

#[test]
fn a_kernel_missing_from_its_module_is_an_error() {
    let run = run_with(&sim(), |ctx| {
        let m = ctx.load_module(compile_ptx(TOUCH)?)?;
        assert!(m.load_function("touch").is_ok());
        assert!(m.load_function("tou").is_err());
        assert!(m.load_function("missing").is_err());
        let from_ptx = ctx.load_module(Ptx::from_src(".visible .entry k1(\n)"))?;
        assert!(from_ptx.load_function("k1").is_ok());
        Ok(())
    });
    assert!(run.is_some());
}

#[test]
fn a_gpu_backend_skips_or_fails_where_there_is_no_gpu() {
    let mut b = Builder::new();
    b.backend = Backend::Cuda;
    b.require_gpu = false;
    let gpu = streamsan::cuda::Gpu::available();
    match b.check(|_| ()) {
        Ok(Outcome::Ran(run)) => {
            assert!(gpu && !matches!(run.backend, streamsan::session::BackendKind::Simulated))
        }
        Ok(Outcome::Skipped(reason)) => assert!(!gpu && !reason.is_empty()),
        Err(e) => panic!("{e}"),
    }
    b.require_gpu = true;
    match b.check(|_| ()) {
        Ok(Outcome::Ran(_)) => assert!(gpu),
        Ok(Outcome::Skipped(_)) => panic!("a required GPU never skips"),
        Err(e) => {
            assert!(!gpu);
            assert!(e.to_string().contains("STREAMSAN_REQUIRE_GPU"), "{e}");
        }
    }
}

#[test]
fn the_recorded_trace_holds_the_facade_ops() {
    let mut b = sim();
    b.name = Some("facade-ops".into());
    let Some(run) = run_with(&b, |ctx| port::program(ctx, false).map(|_| ())) else {
        return;
    };
    let text = std::fs::read_to_string(run.trace.expect("written")).expect("readable");
    let mut reader = TraceReader::new(text.as_bytes(), "t");
    let mut names = Vec::new();
    while let Some((op, _)) = reader.next_op().expect("reads") {
        if let Op::Launch { name: Some(n), .. } = &op.op {
            names.push(n.to_string());
        }
    }
    assert_eq!(
        names,
        [
            "memcpy_htod",
            "pack_bf16",
            "reduce_bf16",
            "forward",
            "memcpy_dtoh"
        ]
    );
}

// ---- CUDA graphs ------------------------------------------------------------------------------

#[test]
fn a_static_input_copied_during_a_replay_is_reported_at_the_copy_naming_the_captured_kernel() {
    let mut wrong = None;
    let Some(run) = run_with(&Builder::new(), |ctx| {
        let out = graphs::program(ctx, false)?;
        if !ctx.is_simulated() {
            wrong = Some(
                out.iter()
                    .enumerate()
                    .filter(|&(i, &x)| x != 2.0 * i as f32)
                    .count(),
            );
        }
        Ok(())
    }) else {
        return;
    };
    // op 11: the captured `step` reads `static_in` (b1); op 19: the replay on s1; op 20: the
    // loader's copy into b1 on s2, ordered after nothing of the replay.
    assert_eq!(
        hazards(&run),
        triples(&[("data-race", 20, "b1")]),
        "{:#?}",
        run.report.hazards
    );
    let conflict = &run.report.hazards[0].conflicts[0];
    assert_eq!((conflict.op, conflict.captured), (19, Some(11)));
    assert_eq!(conflict.participant, "g1/s1");
    let trace = run
        .trace
        .as_ref()
        .expect("a run with a hazard writes its trace");
    assert_eq!(
        replay(trace),
        hazards(&run),
        "streamsan check reproduces it"
    );
    if let Some(wrong) = wrong {
        // On a GPU the copy lands during the step's spin: the output shows the second batch.
        println!(
            "outputs computed from the wrong batch: {wrong} of {}",
            graphs::N
        );
        assert!(wrong > 0, "the race corrupted nothing on the GPU");
    }
}

#[test]
fn the_fixed_graph_program_is_clean_and_computes_the_first_batch() {
    let Some(run) = run_with(&Builder::new(), |ctx| {
        let out = graphs::program(ctx, true)?;
        assert_eq!(out.len(), graphs::N);
        if !ctx.is_simulated() {
            for (i, x) in out.iter().enumerate() {
                assert_eq!(*x, 2.0 * i as f32, "element {i}");
            }
        }
        Ok(())
    }) else {
        return;
    };
    assert!(run.report.is_clean(), "{:#?}", run.report.hazards);
}

/// Two graphs captured into one pool on one stream, the second taking the first's freed
/// temporary, replayed on two streams (`launch_on`): a reuse race at the second launch unless it
/// waits for the first; the trace's graph ops carry the shared pool.
#[test]
fn graphs_sharing_a_pool_replayed_on_two_streams_race_unless_ordered() {
    use streamsan::cudarc::driver::sys::{CUgraphInstantiate_flags_enum, CUstreamCaptureMode};
    const MODE: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    const SRC: &str = r#"
extern "C" __global__ void fill(float *out, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)i;
}
extern "C" __global__ void twice(float *out, const float *in, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * in[i];
}
"#;
    for fixed in [false, true] {
        let Some(run) = run_with(&sim(), |ctx| {
            let module = ctx.load_module(compile_ptx(SRC)?)?;
            let (fill, twice) = (
                module.load_function("fill")?,
                module.load_function("twice")?,
            );
            let cfg = LaunchConfig::for_num_elems(1024);
            let n = 1024usize;
            let capture = ctx.new_stream()?;
            let mut out_a: CudaSlice<f32> = capture.alloc_zeros(n)?;
            let mut out_b: CudaSlice<f32> = capture.alloc_zeros(n)?;
            let pool = ctx.graph_pool_handle()?;
            let mut graphs = Vec::new();
            for out in [&mut out_a, &mut out_b] {
                capture.begin_capture_in(MODE, &pool)?;
                let mut tmp: CudaSlice<f32> = capture.alloc_zeros(n)?;
                unsafe {
                    capture
                        .launch_builder(&fill)
                        .arg(&mut tmp)
                        .arg(&n)
                        .launch(cfg)
                }?;
                unsafe {
                    capture
                        .launch_builder(&twice)
                        .arg(out)
                        .arg(&tmp)
                        .arg(&n)
                        .launch(cfg)
                }?;
                drop(tmp);
                let graph = capture
                    .end_capture(CUgraphInstantiate_flags_enum(0))?
                    .ok_or("empty")?;
                assert_eq!(graph.pool().id(), pool.id());
                graphs.push(graph);
            }
            let a = capture.fork()?;
            let b = capture.fork()?;
            graphs[0].launch_on(&a)?;
            if fixed {
                b.join(&a)?;
            }
            graphs[1].launch_on(&b)?;
            ctx.synchronize()?;
            Ok(())
        }) else {
            return;
        };
        let kinds: Vec<&str> = run.report.hazards.iter().map(|h| h.kind.as_str()).collect();
        if fixed {
            assert!(run.report.is_clean(), "{:#?}", run.report.hazards);
        } else {
            assert!(
                !kinds.is_empty() && kinds.iter().all(|k| *k == "reuse-race"),
                "{:#?}",
                run.report.hazards
            );
        }
    }
}

#[test]
fn captures_record_graph_ops_in_the_trace_and_pool_ids_name_the_pool() {
    use streamsan::cudarc::driver::sys::{CUgraphInstantiate_flags_enum, CUstreamCaptureMode};
    let ctx = CudaContext::simulated().expect("a simulated context");
    let s = ctx.new_stream().expect("a stream");
    let pool = ctx.graph_pool_handle().expect("a pool");
    s.begin_capture_in(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED, &pool)
        .expect("begin");
    assert_eq!(
        s.capture_status().expect("status"),
        streamsan::cudarc::driver::CaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    let mut x: CudaSlice<u32> = s.alloc_zeros(16).expect("alloc in the capture");
    s.memset_zeros(&mut x).expect("a memset");
    drop(x);
    let g = s
        .end_capture(CUgraphInstantiate_flags_enum(0))
        .expect("end")
        .expect("a graph");
    g.upload().expect("upload");
    g.launch().expect("launch");
    let trace = ctx.session().trace().expect("the trace");
    let ops: Vec<&Op> = trace
        .iter()
        .map(|t| &t.op)
        .filter(|o| o.is_graph_op())
        .collect();
    assert_eq!(ops.len(), 3);
    assert!(
        matches!(ops[0], Op::GraphBegin { graph, pool: Some(p), .. } if graph.as_str() == "g1" && p.as_str() == "pool1"),
        "{ops:?}"
    );
    assert!(matches!(ops[2], Op::GraphLaunch { graph, .. } if graph.as_str() == "g1"));
    // The free of the pool buffer is a caching free (no stream), not a captured one.
    assert!(trace
        .iter()
        .any(|t| matches!(&t.op, Op::Free { stream: None, .. })));
    assert!(ctx.finish().expect("the report").is_clean());
}
