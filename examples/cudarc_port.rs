//! 02 — A cudarc program, ported by changing its `use` lines, with a reuse bug.
//!
//! `program` below is written against cudarc 0.19's safe API: two streams, a bf16 buffer, three
//! NVRTC kernels. Only its `use` lines differ from the cudarc original —
//! `use cudarc::driver::…` became `use streamsan::cudarc::driver::…` — and it runs under
//! `streamsan::model`, which records and checks every call.
//!
//! The bug: `packed` (bf16) is read by a kernel on the `comm` stream, then dropped. cudarc frees
//! a slice on the stream it was allocated on (`cuMemFreeAsync` on `compute`), and nothing makes
//! `compute` wait for `comm` first, so the block goes back to `compute`'s pool while `comm` may
//! still be reading it; the next allocation of the same size on `compute` (`activations`) gets
//! that block and writes it. streamsan reports the free (`unsafe-free`) and each write of the
//! reused block (`reuse-race`), whether or not the bytes were corrupted in this run. The fix is
//! one line: `compute.join(&comm)` before the drop.
//!
//! On the simulator the kernels run as streamsan's hash kernel over the memory they are given,
//! so the values differ from a GPU's; the accesses, and so the hazards, are the same.
//!
//! ```text
//! cargo run --example cudarc_port                        # a GPU if there is one, else the simulator
//! STREAMSAN_BACKEND=sim cargo run --example cudarc_port  # the simulator
//! ```

use std::sync::Arc;

use half::bf16;
use streamsan::cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
use streamsan::cudarc::nvrtc::compile_ptx;

/// Elements per buffer.
pub const N: usize = 4096;

/// The kernels: bf16 has no arithmetic in C without headers, so it travels as its 16 bits.
pub const KERNELS: &str = r#"
extern "C" __global__ void pack_bf16(unsigned short *out, const float *in, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = (unsigned short)(__float_as_uint(in[i]) >> 16);
}
extern "C" __global__ void reduce_bf16(float *out, const unsigned short *in, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * __uint_as_float(((unsigned int)in[i]) << 16);
}
extern "C" __global__ void forward(unsigned short *out, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = (unsigned short)(i & 0x7fff);
}
"#;

/// The cudarc program. With `fixed`, `compute` waits for `comm` before `packed` is dropped.
/// Returns the sums `comm` computed.
pub fn program(
    ctx: &Arc<CudaContext>,
    fixed: bool,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let module = ctx.load_module(compile_ptx(KERNELS)?)?;
    let pack = module.load_function("pack_bf16")?;
    let reduce = module.load_function("reduce_bf16")?;
    let forward = module.load_function("forward")?;
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let n = N;

    // Two streams: `compute` runs the model, `comm` the collective.
    let compute = ctx.new_stream()?;
    let comm = compute.fork()?;

    // Gradients in f32, packed into a bf16 bucket on `compute`.
    let host: Vec<f32> = (0..N).map(|i| i as f32 * 0.5).collect();
    let grads: CudaSlice<f32> = compute.clone_htod(&host)?;
    let mut packed: CudaSlice<bf16> = compute.alloc_zeros(N)?;
    unsafe {
        compute
            .launch_builder(&pack)
            .arg(&mut packed)
            .arg(&grads)
            .arg(&n)
            .launch(cfg)
    }?;

    // `comm` waits for the packing, then reduces the bucket.
    comm.join(&compute)?;
    let mut sums: CudaSlice<f32> = comm.alloc_zeros(N)?;
    unsafe {
        comm.launch_builder(&reduce)
            .arg(&mut sums)
            .arg(&packed)
            .arg(&n)
            .launch(cfg)
    }?;

    // The bucket goes out of scope: freed on `compute`, its block back in `compute`'s pool.
    if fixed {
        compute.join(&comm)?;
    }
    drop(packed);

    // The next bf16 buffer of that size on `compute` gets the same block and writes it.
    let mut activations: CudaSlice<bf16> = compute.alloc_zeros(N)?;
    unsafe {
        compute
            .launch_builder(&forward)
            .arg(&mut activations)
            .arg(&n)
            .launch(cfg)
    }?;

    let out = comm.clone_dtoh(&sums)?;
    compute.synchronize()?;
    Ok(out)
}

fn main() {
    // The bug, checked without panicking, to show the report.
    let bug = streamsan::model::Builder::new().check(|cx| program(cx.ctx(), false).map(|_| ()));
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
            eprintln!("cudarc_port: {e}");
            std::process::exit(1);
        }
    }

    // The fix: `streamsan::model` panics on any hazard, so this returns only if it is clean.
    println!("\n== with compute.join(&comm) before the drop ==");
    streamsan::model(|cx| program(cx.ctx(), true).map(|_| ()));
    println!("clean");
}
