//! The cost of checking on a GPU: a launch-bound loop run raw, through an unchecked `Session`,
//! through a checked one, and — the harness against what it wraps — as a cudarc program and as
//! the same program ported to `streamsan::cudarc`.
//!
//! The loop: 4 non-blocking streams, one tiny `hash` kernel per iteration (256 words, reading the
//! buffer of its stream and writing the next stream's), then an event recorded on the stream and
//! waited on by the next one — launch-bound, so the harness's cost per op shows as much as it can.
//! Three variants of the same loop:
//!
//! - **raw**: streamsan's device layer (`streamsan::cuda`), which is cudarc's driver calls
//!   (`cuLaunchKernel`, `cuEventRecord`, `cuStreamWaitEvent`) with cudarc's event tracking off and
//!   nothing added: the floor the session is built on;
//! - **unchecked**: a `Session` with `check: false` (it executes, records nothing);
//! - **checked**: a `Session` that records every op and checks it on its checker thread;
//! - **cudarc**: the same loop written against cudarc 0.19's safe API (`CudaStream::launch_builder`,
//!   `CudaEvent::record`, `CudaStream::wait`) with `disable_event_tracking`, an NVRTC kernel of
//!   the same shape (256 words, one in, one out): what a cudarc user runs today;
//! - **facade**: that cudarc program with its `use` lines changed to `streamsan::cudarc`, checked
//!   (the harness as a user would use it). Its ratio to **cudarc** is the harness's overhead.
//!
//! Each round runs the five once, in an order that rotates from round to round, so that clock and
//! load drift hit all of them alike. The time is from the first issue to a device synchronization
//! after the last (the loop); the time `finish()` then waits for the checker thread is reported
//! apart. The headlines are the medians over rounds of each round's facade / cudarc and checked /
//! raw ratios.
//!
//! ```text
//! cargo build --release --examples
//! target/release/examples/overhead [--iters 10000] [--rounds 7] [--json]
//! ```
//!
//! Without a GPU it prints a `skipped:` notice and exits 0; under `STREAMSAN_REQUIRE_GPU=1` it
//! fails (exit 1) instead. Every checked run must report no hazard.

use std::process::ExitCode;

/// Options of one run.
#[derive(Clone, Copy, Debug)]
struct Options {
    /// Iterations of the loop per variant per round.
    iters: usize,
    /// Interleaved rounds.
    rounds: usize,
    /// Print JSON instead of text.
    json: bool,
}

const USAGE: &str = "usage: overhead [--iters N (10000)] [--rounds R (7)] [--json]";

fn parse_args() -> Result<Options, String> {
    let mut opts = Options {
        iters: 10_000,
        rounds: 7,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "{name}: expected a positive whole number, got {v:?}"
                )),
            }
        };
        match arg.as_str() {
            "--iters" => opts.iters = number("--iters")?,
            "--rounds" => opts.rounds = number("--rounds")?,
            "--json" => opts.json = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(opts)
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("overhead: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    gpu::main(opts)
}

/// Prints the skip notice (text or JSON).
fn skip(opts: Options, reason: &str) -> ExitCode {
    if opts.json {
        println!(
            "{}",
            serde_json::json!({"benchmark": "overhead", "skipped": reason})
        );
    } else {
        println!("skipped: {reason}");
    }
    ExitCode::SUCCESS
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    use super::*;

    pub fn main(opts: Options) -> ExitCode {
        let reason = "built without the `cuda` feature";
        if streamsan_require_gpu() {
            eprintln!("overhead: STREAMSAN_REQUIRE_GPU is set but this build has no GPU backend");
            return ExitCode::FAILURE;
        }
        skip(opts, reason)
    }

    /// `STREAMSAN_REQUIRE_GPU` as `streamsan::cuda::gpu_required` reads it (that module needs the
    /// `cuda` feature).
    fn streamsan_require_gpu() -> bool {
        std::env::var_os("STREAMSAN_REQUIRE_GPU").is_some_and(|v| !v.is_empty() && v != "0")
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::{Duration, Instant};

    use streamsan::cuda::{gpu_need, DeviceRegion, Gpu, GpuNeed, StreamKind};
    use streamsan::session::{DeviceBuffer, Session, SessionConfig};

    use super::*;

    type Error = Box<dyn std::error::Error>;

    /// Words per buffer: a tiny kernel.
    const WORDS: usize = 256;
    /// Streams in the loop.
    const STREAMS: usize = 4;

    /// The variants, in the order of round 0.
    const VARIANTS: [&str; 5] = ["raw", "unchecked", "checked", "cudarc", "facade"];

    /// The kernel of the cudarc and facade variants: one word per thread, read one buffer, write
    /// the next.
    const TINY: &str = r#"
extern "C" __global__ void tiny(unsigned int *out, const unsigned int *in, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 2654435761u + 1u;
}
"#;

    /// The loop on cudarc's safe API, event tracking off: its time.
    fn cudarc_loop(iters: usize) -> Result<Duration, Error> {
        use cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
        let ctx = CudaContext::new(0)?;
        // SAFETY: nothing is allocated yet; every order this loop needs is its own events.
        unsafe { ctx.disable_event_tracking() };
        let f = ctx
            .load_module(cudarc::nvrtc::compile_ptx(TINY)?)?
            .load_function("tiny")?;
        let streams = (0..STREAMS)
            .map(|_| ctx.new_stream())
            .collect::<Result<Vec<_>, _>>()?;
        let events = (0..STREAMS)
            .map(|_| ctx.new_event(None))
            .collect::<Result<Vec<_>, _>>()?;
        let mut bufs: Vec<CudaSlice<u32>> = Vec::with_capacity(STREAMS);
        for st in &streams {
            bufs.push(st.alloc_zeros(WORDS)?);
        }
        let cfg = LaunchConfig::for_num_elems(WORDS as u32);
        let n = WORDS;
        ctx.synchronize()?;
        let t = Instant::now();
        for i in 0..iters {
            let (k, next) = (i % STREAMS, (i + 1) % STREAMS);
            let (src, dst) = pair(&mut bufs, k, next);
            // SAFETY: `tiny` takes (out, in, n) and touches n words of each; each launch is
            // ordered after the previous one by the event wait.
            unsafe {
                streams[k]
                    .launch_builder(&f)
                    .arg(dst)
                    .arg(src)
                    .arg(&n)
                    .launch(cfg)
            }?;
            events[k].record(&streams[k])?;
            streams[next].wait(&events[k])?;
        }
        ctx.synchronize()?;
        Ok(t.elapsed())
    }

    /// The same program through `streamsan::cudarc`, checked: its time and `finish`'s.
    fn facade_loop(iters: usize) -> Result<(Duration, Duration), Error> {
        use streamsan::cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
        let ctx = CudaContext::from_session(Session::cuda_with(
            0,
            SessionConfig {
                keep_trace: false,
                ..SessionConfig::default()
            },
        )?);
        let f = ctx
            .load_module(streamsan::cudarc::nvrtc::compile_ptx(TINY)?)?
            .load_function("tiny")?;
        let streams = (0..STREAMS)
            .map(|_| ctx.new_stream())
            .collect::<Result<Vec<_>, _>>()?;
        let events = (0..STREAMS)
            .map(|_| ctx.new_event(None))
            .collect::<Result<Vec<_>, _>>()?;
        let mut bufs: Vec<CudaSlice<u32>> = Vec::with_capacity(STREAMS);
        for st in &streams {
            bufs.push(st.alloc_zeros(WORDS)?);
        }
        let cfg = LaunchConfig::for_num_elems(WORDS as u32);
        let n = WORDS;
        ctx.synchronize()?;
        let t = Instant::now();
        for i in 0..iters {
            let (k, next) = (i % STREAMS, (i + 1) % STREAMS);
            let (src, dst) = pair(&mut bufs, k, next);
            // SAFETY: as in `cudarc_loop`.
            unsafe {
                streams[k]
                    .launch_builder(&f)
                    .arg(dst)
                    .arg(src)
                    .arg(&n)
                    .launch(cfg)
            }?;
            events[k].record(&streams[k])?;
            streams[next].wait(&events[k])?;
        }
        ctx.synchronize()?;
        let looped = t.elapsed();
        drop(bufs);
        let t = Instant::now();
        let report = ctx.finish()?;
        let finished = t.elapsed();
        if !report.hazards.is_empty() {
            return Err(format!(
                "the loop is synchronized, but the facade reported {} hazard(s): {}",
                report.hazards.len(),
                report.to_json()
            )
            .into());
        }
        Ok((looped, finished))
    }

    /// Buffer `k` to read and buffer `next` to write.
    fn pair<T>(bufs: &mut [T], k: usize, next: usize) -> (&T, &mut T) {
        if k < next {
            let (lo, hi) = bufs.split_at_mut(next);
            (&lo[k], &mut hi[0])
        } else {
            let (lo, hi) = bufs.split_at_mut(k);
            (&hi[0], &mut lo[next])
        }
    }

    pub fn main(opts: Options) -> ExitCode {
        match gpu_need() {
            GpuNeed::Run => {}
            GpuNeed::Skip(reason) => return skip(opts, &reason),
            GpuNeed::Fail(reason) => {
                eprintln!("overhead: {reason}");
                return ExitCode::FAILURE;
            }
        }
        match run(opts) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("overhead: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// The loop on the device layer, with no harness: its time.
    fn raw(iters: usize) -> Result<Duration, Error> {
        let gpu = Gpu::open(0)?;
        let kernels = gpu.kernels()?;
        let streams = (0..STREAMS)
            .map(|_| gpu.new_stream(StreamKind::NonBlocking))
            .collect::<Result<Vec<_>, _>>()?;
        let events = (0..STREAMS)
            .map(|_| gpu.new_event())
            .collect::<Result<Vec<_>, _>>()?;
        let mut bufs = Vec::with_capacity(STREAMS);
        for _ in 0..STREAMS {
            bufs.push(DeviceRegion::new(gpu.map_segment(WORDS * 4)?, WORDS as u32));
        }
        // Warm up as the session variants do: one launch per buffer, then synchronize.
        for (st, b) in streams.iter().zip(&bufs) {
            // SAFETY: the segments stay mapped until after the synchronization below.
            unsafe { kernels.hash_launch(st, 0, 0, *b, &[], 0) }?;
        }
        gpu.synchronize()?;
        let t = Instant::now();
        for i in 0..iters {
            let (k, next) = (i % STREAMS, (i + 1) % STREAMS);
            // SAFETY: the segments stay mapped until after the synchronization below; each
            // launch is ordered after the previous one by the event wait.
            unsafe { kernels.hash_launch(&streams[k], i as u32, 0, bufs[next], &[bufs[k]], 0) }?;
            events[k].record(&streams[k])?;
            streams[next].wait(&events[k])?;
        }
        gpu.synchronize()?;
        let looped = t.elapsed();
        for b in bufs {
            gpu.unmap_segment(b.ptr)?;
        }
        Ok(looped)
    }

    /// The loop through a session, checked or not: its time and the time `finish` then took.
    fn session(iters: usize, check: bool) -> Result<(Duration, Duration), Error> {
        let s = Session::cuda_with(
            0,
            SessionConfig {
                check,
                keep_trace: false,
                ..SessionConfig::default()
            },
        )?;
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
        // Warm up: compile the kernels; order the allocations before the loop.
        for (st, b) in streams.iter().zip(&mut bufs) {
            s.launch(st, "warm").write(b).hash()?;
        }
        s.synchronize()?;
        let t = Instant::now();
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
        s.synchronize()?;
        let looped = t.elapsed();
        let t = Instant::now();
        let report = s.finish()?;
        let finished = t.elapsed();
        if !report.hazards.is_empty() {
            return Err(format!(
                "the loop is synchronized, but the checked session reported {} hazard(s): {}",
                report.hazards.len(),
                report.to_json()
            )
            .into());
        }
        Ok((looped, finished))
    }

    /// The median of `v` (the upper one of an even count).
    fn median(v: &[f64]) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    fn run(opts: Options) -> Result<(), Error> {
        let name = Gpu::open(0)?.name().unwrap_or_default();
        // Warm-up of each variant: kernel compilation, context and allocator start-up.
        raw(opts.iters.min(1000))?;
        session(opts.iters.min(1000), false)?;
        session(opts.iters.min(1000), true)?;
        cudarc_loop(opts.iters.min(1000))?;
        facade_loop(opts.iters.min(1000))?;

        // Seconds per round: raw, unchecked, checked, checked's finish, cudarc, facade, facade's
        // finish.
        let mut rounds: Vec<[f64; 7]> = Vec::with_capacity(opts.rounds);
        for r in 0..opts.rounds {
            let mut t = [0.0; 7];
            for j in 0..VARIANTS.len() {
                match (r + j) % VARIANTS.len() {
                    0 => t[0] = raw(opts.iters)?.as_secs_f64(),
                    1 => t[1] = session(opts.iters, false)?.0.as_secs_f64(),
                    2 => {
                        let (looped, finished) = session(opts.iters, true)?;
                        t[2] = looped.as_secs_f64();
                        t[3] = finished.as_secs_f64();
                    }
                    3 => t[4] = cudarc_loop(opts.iters)?.as_secs_f64(),
                    _ => {
                        let (looped, finished) = facade_loop(opts.iters)?;
                        t[5] = looped.as_secs_f64();
                        t[6] = finished.as_secs_f64();
                    }
                }
            }
            rounds.push(t);
        }
        let column = |i: usize| rounds.iter().map(|t| t[i]).collect::<Vec<_>>();
        let ratio =
            |a: usize, b: usize| median(&rounds.iter().map(|t| t[a] / t[b]).collect::<Vec<_>>());
        let us_per_iter = |s: f64| s * 1e6 / opts.iters as f64;
        let (raw_t, unchecked_t, checked_t, finish_t) = (
            median(&column(0)),
            median(&column(1)),
            median(&column(2)),
            median(&column(3)),
        );
        let (cudarc_t, facade_t) = (median(&column(4)), median(&column(5)));
        let facade_over_cudarc = ratio(5, 4);
        let facade_with_finish = median(
            &rounds
                .iter()
                .map(|t| (t[5] + t[6]) / t[4])
                .collect::<Vec<_>>(),
        );
        let checked_over_raw = ratio(2, 0);
        let unchecked_over_raw = ratio(1, 0);
        let checked_over_unchecked = ratio(2, 1);
        let with_finish = median(
            &rounds
                .iter()
                .map(|t| (t[2] + t[3]) / t[0])
                .collect::<Vec<_>>(),
        );
        if opts.json {
            let per_round: Vec<_> = rounds
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "raw_s": t[0], "unchecked_s": t[1], "checked_s": t[2], "finish_s": t[3],
                        "cudarc_s": t[4], "facade_s": t[5], "facade_finish_s": t[6],
                    })
                })
                .collect();
            let out = serde_json::json!({
                "benchmark": "overhead",
                "device": name,
                "iters": opts.iters,
                "rounds": opts.rounds,
                "streams": STREAMS,
                "words": WORDS,
                "median_us_per_iter": {
                    "raw": us_per_iter(raw_t),
                    "unchecked": us_per_iter(unchecked_t),
                    "checked": us_per_iter(checked_t),
                    "cudarc": us_per_iter(cudarc_t),
                    "facade": us_per_iter(facade_t),
                },
                "median_finish_s": finish_t,
                "median_ratio": {
                    "checked_over_raw": checked_over_raw,
                    "unchecked_over_raw": unchecked_over_raw,
                    "checked_over_unchecked": checked_over_unchecked,
                    "checked_with_finish_over_raw": with_finish,
                    "facade_over_cudarc": facade_over_cudarc,
                    "facade_with_finish_over_cudarc": facade_with_finish,
                },
                "per_round": per_round,
            });
            println!("{out}");
        } else {
            println!(
                "{name}: {} iterations x {} interleaved rounds, {STREAMS} streams, {WORDS}-word kernels",
                opts.iters, opts.rounds
            );
            println!(
                "median us/iter: raw {:.2}, session unchecked {:.2}, checked {:.2}",
                us_per_iter(raw_t),
                us_per_iter(unchecked_t),
                us_per_iter(checked_t)
            );
            println!(
                "median ratio of rounds: checked / raw = {checked_over_raw:.3}, unchecked / raw = \
                 {unchecked_over_raw:.3}, checked / unchecked = {checked_over_unchecked:.3}"
            );
            println!(
                "finish() then waited {:.2} ms (median) for the checker: checked with it / raw = \
                 {with_finish:.3}",
                finish_t * 1e3
            );
            println!(
                "median us/iter: cudarc {:.2}, streamsan::cudarc facade {:.2}; median ratio of \
                 rounds: facade / cudarc = {facade_over_cudarc:.3} (with finish: \
                 {facade_with_finish:.3})",
                us_per_iter(cudarc_t),
                us_per_iter(facade_t)
            );
        }
        Ok(())
    }
}
