//! The harness's own cost per call, on the CPU: the launch-bound loop of `examples/overhead.rs`
//! (4 streams, a tiny kernel, an event record + wait per launch) on the simulator with
//! `sim_execute: false`, so that no device work is done and what remains is the bookkeeping of
//! the session: locks, checks, records.
//!
//! Meant to be run under an instruction counter. `scripts/harness-cost` runs it under callgrind
//! twice, with two iteration counts, counting only inside the loop's function (`*_loop`: not the
//! set-up, and not `finish`, which drops the checker's history), and prints the calling thread's
//! instructions per iteration (the difference divided by the difference of iterations, so that
//! one-time costs cancel out):
//!
//! ```text
//! cargo build --release --example harness_cost
//! scripts/harness-cost
//! ```
//!
//! `--api session` drives `streamsan::Session`, `--api facade` the cudarc-shaped facade
//! (`streamsan::cudarc`); `--unchecked` turns recording off (`SessionConfig::check`).

use std::process::ExitCode;

use streamsan::session::{DeviceBuffer, Event, Session, SessionConfig, Stream};

/// Words per buffer: a tiny kernel.
const WORDS: usize = 256;
/// Streams in the loop.
const STREAMS: usize = 4;

type Error = Box<dyn std::error::Error>;

fn config(check: bool) -> SessionConfig {
    SessionConfig {
        check,
        keep_trace: false,
        sim_execute: false,
        ..SessionConfig::default()
    }
}

/// The loop through `Session`.
fn session(iters: usize, check: bool) -> Result<usize, Error> {
    let s = Session::simulated_with(config(check))?;
    let streams = (0..STREAMS)
        .map(|_| s.stream())
        .collect::<Result<Vec<_>, _>>()?;
    let events = (0..STREAMS)
        .map(|_| s.event())
        .collect::<Result<Vec<_>, _>>()?;
    let mut bufs: Vec<DeviceBuffer<u32>> = Vec::with_capacity(STREAMS);
    for st in &streams {
        bufs.push(s.alloc(st, WORDS)?);
    }
    for (st, b) in streams.iter().zip(&mut bufs) {
        s.launch(st, "warm").write(b).hash()?;
    }
    s.synchronize()?;
    session_loop(&s, &streams, &events, &mut bufs, iters)?;
    s.synchronize()?;
    let report = s.finish()?;
    Ok(report.hazards.len())
}

/// The measured loop (callgrind counts inside this function only).
#[inline(never)]
fn session_loop(
    s: &Session,
    streams: &[Stream],
    events: &[Event],
    bufs: &mut [DeviceBuffer<u32>],
    iters: usize,
) -> Result<(), Error> {
    for i in 0..iters {
        let (k, next) = (i % STREAMS, (i + 1) % STREAMS);
        let (src, dst) = if k < next {
            let (lo, hi) = bufs.split_at_mut(next);
            (&lo[k], &mut hi[0])
        } else {
            let (lo, hi) = bufs.split_at_mut(k);
            (&hi[0], &mut lo[next])
        };
        s.launch(&streams[k], "tiny").read(src).write(dst).hash()?;
        events[k].record(&streams[k])?;
        streams[next].wait(&events[k])?;
    }
    Ok(())
}

/// The tiny kernel of the facade loop (on the simulator it runs as the hash kernel).
const TINY: &str = r#"
extern "C" __global__ void tiny(unsigned int *out, const unsigned int *in, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 2654435761u + 1u;
}
"#;

/// The loop through the cudarc-shaped facade.
fn facade(iters: usize, check: bool) -> Result<usize, Error> {
    use streamsan::cudarc::driver::CudaContext;
    use streamsan::cudarc::nvrtc::compile_ptx;
    let ctx = CudaContext::from_session(Session::simulated_with(config(check))?);
    let tiny = ctx.load_module(compile_ptx(TINY)?)?.load_function("tiny")?;
    let streams = (0..STREAMS)
        .map(|_| ctx.new_stream())
        .collect::<Result<Vec<_>, _>>()?;
    let events = (0..STREAMS)
        .map(|_| ctx.new_event(None))
        .collect::<Result<Vec<_>, _>>()?;
    let mut bufs = Vec::with_capacity(STREAMS);
    for st in &streams {
        bufs.push(st.alloc_zeros::<u32>(WORDS)?);
    }
    ctx.synchronize()?;
    facade_loop(&streams, &events, &mut bufs, &tiny, iters)?;
    ctx.synchronize()?;
    drop(bufs);
    let report = ctx.finish()?;
    Ok(report.hazards.len())
}

/// The measured loop (callgrind counts inside this function only).
#[inline(never)]
fn facade_loop(
    streams: &[std::sync::Arc<streamsan::cudarc::driver::CudaStream>],
    events: &[streamsan::cudarc::driver::CudaEvent],
    bufs: &mut [streamsan::cudarc::driver::CudaSlice<u32>],
    tiny: &streamsan::cudarc::driver::CudaFunction,
    iters: usize,
) -> Result<(), Error> {
    use streamsan::cudarc::driver::{LaunchConfig, PushKernelArg};
    let cfg = LaunchConfig::for_num_elems(WORDS as u32);
    let n = WORDS;
    for i in 0..iters {
        let (k, next) = (i % STREAMS, (i + 1) % STREAMS);
        let (src, dst) = if k < next {
            let (lo, hi) = bufs.split_at_mut(next);
            (&lo[k], &mut hi[0])
        } else {
            let (lo, hi) = bufs.split_at_mut(k);
            (&hi[0], &mut lo[next])
        };
        // SAFETY: `tiny` takes (out, in, n) and touches n words of each.
        unsafe {
            streams[k]
                .launch_builder(tiny)
                .arg(dst)
                .arg(src)
                .arg(&n)
                .launch(cfg)
        }?;
        events[k].record(&streams[k])?;
        streams[next].wait(&events[k])?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut iters = 10_000usize;
    let mut api = String::from("session");
    let mut check = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => iters = n,
                None => {
                    eprintln!("harness_cost: --iters needs a whole number");
                    return ExitCode::from(2);
                }
            },
            "--api" => match args.next() {
                Some(v) => api = v,
                None => {
                    eprintln!("harness_cost: --api needs session or facade");
                    return ExitCode::from(2);
                }
            },
            "--unchecked" => check = false,
            other => {
                eprintln!("harness_cost: unknown argument {other:?}\nusage: harness_cost [--iters N] [--api session|facade] [--unchecked]");
                return ExitCode::from(2);
            }
        }
    }
    let result = match api.as_str() {
        "session" => session(iters, check),
        "facade" => facade(iters, check),
        other => {
            eprintln!("harness_cost: unknown api {other:?}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(0) => {
            println!(
                "{api} {} x{iters}: clean",
                if check { "checked" } else { "unchecked" }
            );
            ExitCode::SUCCESS
        }
        Ok(n) => {
            eprintln!("harness_cost: the loop is synchronized but {n} hazard(s) were reported");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("harness_cost: {e}");
            ExitCode::FAILURE
        }
    }
}
