//! 01 — A buffer freed without `record_stream` is reused while another stream still reads it.
//!
//! The bug of data-parallel training loops: a gradient bucket is allocated on the compute stream,
//! all-reduced on a communication stream, and freed when it goes out of scope. The caching
//! allocator hands its block to the next allocation on the compute stream at once, and the new
//! tensor overwrites it while the all-reduce is still reading. Nothing crashes; the sums are wrong.
//!
//! This example runs the program twice — with the bug, then with the fix — on GPU 0 if there is
//! one, else on the simulator (unless `STREAMSAN_REQUIRE_GPU=1` asks for a GPU), and shows for
//! each run the report streamsan gives and the damage actually done:
//!
//! ```text
//! cargo run --example 01-reuse-without-record-stream
//! ```

use std::io::IsTerminal;

use streamsan::kernels::{count_mismatches, hash_region_cpu};
use streamsan::report::{render_text, TextOptions};
use streamsan::session::{Session, SessionError};
use streamsan::Report;

/// The bucket: 4 MiB of gradients (words, as the kernels see them).
const WORDS: usize = 1 << 20;

/// How long the communication stream stays busy before it reads: a slow collective.
const SPIN_NS: u64 = 5_000_000;

/// What one run produced.
struct Run {
    report: Report,
    /// Whether the freed bucket's block came back to the next allocation.
    reused: bool,
    /// Words of the all-reduce's output that differ from the CPU reference.
    corrupted: u64,
}

/// 1. A session on GPU 0 if there is one, else on the simulator (an error instead where
///    `STREAMSAN_REQUIRE_GPU=1` asks for a GPU). Everything issued through it is executed and, at
///    the same time, recorded and checked.
fn session() -> Result<Session, SessionError> {
    #[cfg(feature = "cuda")]
    match streamsan::cuda::gpu_need() {
        streamsan::cuda::GpuNeed::Run => return Session::cuda(0),
        streamsan::cuda::GpuNeed::Fail(reason) => return Err(SessionError::NoGpu { reason }),
        streamsan::cuda::GpuNeed::Skip(_) => {}
    }
    Ok(Session::simulated())
}

fn program(session: Session, fix: bool) -> Result<Run, SessionError> {
    // 2. Two streams, as in data-parallel training: `compute` runs the model, `comm` the
    //    collectives. Both are non-blocking, like PyTorch's: nothing orders them implicitly.
    let compute = session.stream_named("compute")?;
    let comm = session.stream_named("comm")?;

    // 3. The bucket is allocated on `compute` (PyTorch allocates on the current stream) and
    //    filled by `backward`. `hash` runs streamsan's reference kernel: every word it writes is a
    //    hash of the launch, the position and the words it read, so stale input shows.
    let mut bucket = session.alloc_named::<u32>(&compute, "bucket", WORDS)?;
    let backward = session
        .launch(&compute, "backward")
        .write(&mut bucket)
        .hash()?;

    // 4. `comm` must not read the bucket before `backward` is done: an event recorded on
    //    `compute` and waited on by `comm`. This part of the program is right.
    let grads_ready = session.event()?;
    grads_ready.record(&compute)?;
    comm.wait(&grads_ready)?;

    // 5. The all-reduce reads the bucket on `comm`. The spin keeps `comm` busy first, so the read
    //    happens late, as behind a slow collective. The output buffer belongs to `comm`.
    let mut sums = session.alloc_named::<u32>(&comm, "sums", WORDS)?;
    let all_reduce = session
        .launch(&comm, "all_reduce")
        .read(&bucket)
        .write(&mut sums)
        .spin(SPIN_NS)
        .hash()?;

    // 6. The bucket goes out of scope. The caching allocator returns its block to `compute`'s
    //    pool right away: as far as the allocator knows, only `compute` used it. But `comm` has
    //    not read it yet.
    //
    //    The fix is one line, `record_stream`: the block is then not handed out again before the
    //    work issued on `comm` up to this free has finished.
    if fix {
        session.record_stream(&bucket, &comm)?;
    }
    let freed_at = bucket.device_ptr();
    drop(bucket);

    // 7. The next allocation of the same size on `compute` takes the best-fitting free block of
    //    its stream: the bucket's, unless `record_stream` holds it back.
    let mut activations = session.alloc_named::<u32>(&compute, "activations", WORDS)?;
    let reused = activations.device_ptr() == freed_at;

    // 8. `forward` writes the new tensor. Nothing orders it after the all-reduce: with the bug,
    //    it overwrites the bucket before `comm` gets to read it.
    session
        .launch(&compute, "forward")
        .write(&mut activations)
        .hash()?;

    // 9. Wait for everything, and compare what the all-reduce wrote with the CPU reference of
    //    the same kernels: the bucket as `backward` left it, reduced by `all_reduce`.
    session.synchronize()?;
    let got = session.memcpy_dtov::<u32>(&comm, &sums)?;
    let mut bucket_ref = vec![0u32; WORDS];
    hash_region_cpu(backward as u32, 0, &[], &mut bucket_ref);
    let mut sums_ref = vec![0u32; WORDS];
    hash_region_cpu(all_reduce as u32, 0, &[&bucket_ref], &mut sums_ref);
    let corrupted = count_mismatches(&got, &sums_ref);

    // 10. The trace of the run, for `streamsan check`, and the report.
    let trace = std::env::temp_dir().join(format!(
        "streamsan-01-{}.jsonl",
        if fix { "fixed" } else { "bug" }
    ));
    session.write_trace(&trace)?;
    println!("trace: {}", trace.display());
    Ok(Run {
        report: session.finish()?,
        reused,
        corrupted,
    })
}

fn main() -> Result<(), SessionError> {
    let text = TextOptions::for_terminal(std::io::stdout().is_terminal());
    let first = session()?;
    println!("running on {:?}\n", first.backend());

    // 11. The bug. The report comes from the ops alone: it is the same whether or not this run
    //     happened to corrupt anything.
    println!("== without record_stream ==");
    let bug = program(first, false)?;
    print!("{}", render_text(&bug.report, &text));
    println!(
        "the bucket's block was {}handed to `activations`; corrupted words in `sums`: {} of {WORDS}\n",
        if bug.reused { "" } else { "not " },
        bug.corrupted
    );

    // 12. The fix: clean, and nothing corrupted.
    println!("== with record_stream(bucket, comm) ==");
    let fixed = program(session()?, true)?;
    print!("{}", render_text(&fixed.report, &text));
    println!(
        "errors: {}; corrupted words in `sums`: {} of {WORDS}",
        fixed.report.errors, fixed.corrupted
    );
    fixed.report.assert_clean();
    assert_eq!(
        fixed.corrupted, 0,
        "record_stream keeps the block until comm is done"
    );
    Ok(())
}
