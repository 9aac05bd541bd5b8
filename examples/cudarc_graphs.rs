//! 03 — A cudarc program with a CUDA graph: a static input updated while a replay still reads it.
//!
//! `program` is written against cudarc 0.19's safe API — `begin_capture`, `end_capture`,
//! `CudaGraph::launch` — as a `torch.cuda.graph` user writes it: the model step is captured once
//! on `stream`, reading a static input and writing a static output, then replayed; each new batch
//! is copied into the static input on a `loader` stream. Only its `use` lines differ from the
//! cudarc original, and it runs under `streamsan::model`, which records and checks every call.
//!
//! The bug: the loader copies the next batch into the static input right after the replay is
//! launched, waiting only for what `stream` had done before the replay. The replay is one unit on
//! `stream`: nothing orders the loader's copy after the replay's read, so the copy may overwrite
//! the input while the captured kernel still reads it. streamsan reports a `data-race` at the
//! copy, naming the replay's `graph_launch` and the captured kernel (`captured`), whether or not
//! the bytes were corrupted in this run. The fix is one line: the loader waits for `stream` after
//! the launch (`loader.join(&stream)`).
//!
//! On a GPU the captured kernel spins a little before it reads (as a long model step does), and the
//! buggy program's output shows the new batch where the old one belonged. On the simulator the
//! kernels run as streamsan's hash kernel, so the values differ; the accesses, and so the hazards,
//! are the same.
//!
//! ```text
//! cargo run --example cudarc_graphs                        # a GPU if there is one, else the simulator
//! STREAMSAN_BACKEND=sim cargo run --example cudarc_graphs  # the simulator
//! ```

use std::sync::Arc;

use streamsan::cudarc::driver::sys::{CUgraphInstantiate_flags_enum, CUstreamCaptureMode};
use streamsan::cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
use streamsan::cudarc::nvrtc::compile_ptx;

/// Elements per buffer.
pub const N: usize = 4096;

/// Clock cycles the model step spins before it reads its input (about a millisecond).
pub const SPIN_CYCLES: i64 = 2_000_000;

/// The model step: `out = 2 * in`, after a spin.
pub const KERNELS: &str = r#"
extern "C" __global__ void step(float *out, const float *in, size_t n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * in[i];
}
"#;

/// The program. With `fixed`, the loader waits for the replay before it copies the next batch.
/// Returns the first replay's output, which must be twice the first batch.
pub fn program(
    ctx: &Arc<CudaContext>,
    fixed: bool,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let module = ctx.load_module(compile_ptx(KERNELS)?)?;
    let step = module.load_function("step")?;
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let (n, cycles) = (N, SPIN_CYCLES);

    let stream = ctx.new_stream()?;
    let loader = stream.fork()?;

    // The static input holds the first batch; the static output is the graph's.
    let first: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut static_in: CudaSlice<f32> = stream.clone_htod(&first)?;
    let mut static_out: CudaSlice<f32> = stream.alloc_zeros(N)?;

    // Capture the model step once.
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    unsafe {
        stream
            .launch_builder(&step)
            .arg(&mut static_out)
            .arg(&static_in)
            .arg(&n)
            .arg(&cycles)
            .launch(cfg)
    }?;
    let graph = stream
        .end_capture(CUgraphInstantiate_flags_enum(0))?
        .ok_or("an empty capture")?;

    // The loader stages the next batch on its own stream.
    let second: Vec<f32> = (0..N).map(|i| -(i as f32)).collect();
    loader.join(&stream)?;
    let batch: CudaSlice<f32> = loader.clone_htod(&second)?;

    // Replay the step for the first batch, then load the second into the static input.
    graph.launch()?;
    if fixed {
        loader.join(&stream)?;
    }
    loader.memcpy_dtod(&batch, &mut static_in)?;

    let out = stream.clone_dtoh(&static_out)?;
    loader.synchronize()?;
    Ok(out)
}

fn main() {
    let bug = streamsan::model::Builder::new().check(|cx| {
        let out = program(cx.ctx(), false)?;
        let wrong = out
            .iter()
            .enumerate()
            .filter(|&(i, &x)| x != 2.0 * i as f32)
            .count();
        if !cx.ctx().is_simulated() {
            println!("outputs computed from the wrong batch: {wrong} of {N}");
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    });
    match bug {
        Ok(streamsan::model::Outcome::Ran(run)) => {
            println!("== the program as written ({:?}) ==", run.backend);
            print!(
                "{}",
                streamsan::report::render_text(
                    &run.report,
                    &streamsan::report::TextOptions::plain()
                )
            );
            if let Some(path) = &run.trace {
                println!("replay: streamsan check {}", path.display());
            }
        }
        Ok(streamsan::model::Outcome::Skipped(reason)) => {
            println!("skipped: {reason}");
            return;
        }
        Err(e) => {
            eprintln!("cudarc_graphs: {e}");
            std::process::exit(1);
        }
    }

    println!("\n== with loader.join(&stream) after the launch ==");
    streamsan::model(|cx| program(cx.ctx(), true).map(|_| ()));
    println!("clean");
}
