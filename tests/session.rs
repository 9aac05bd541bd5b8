//! The session harness, on the simulator and on a GPU: the same cases run on both backends.
//!
//! Each case is a function of a [`Session`]; `on_both!(case)` makes `case::simulated` and
//! `case::cuda`. The GPU one prints `skipped: <reason>` and passes where there is no GPU (it fails
//! there instead under `STREAMSAN_REQUIRE_GPU=1`: `streamsan::cuda::gpu_or_skip`), and holds a
//! lock while it uses the device, so that the timing the cases rely on (a 2 ms spin outlasts a
//! small kernel on another stream) is not disturbed by the other tests of this file. Fixtures:
//! none (a case that exports its trace writes it to the temporary directory and reads it back).
//!
//! The harness's overhead on a GPU is a benchmark, not a test: `examples/overhead.rs`.

#[cfg(feature = "cuda")]
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use streamsan::checker::Checker;
use streamsan::kernels::{checksum, count_mismatches, hash_region_cpu};
use streamsan::report::Hazard;
use streamsan::session::{
    AsRegion, BackendKind, DeviceBuffer, LaunchError, RawLaunch, Session, SessionConfig,
    SessionError, StreamKind,
};
use streamsan::trace::{Id, MemoryKind, Op, Region, Site, TraceOp};
use streamsan::{HazardKind, Report};

/// Words per test buffer (16 KiB: the small pool).
const N: usize = 4096;

/// How long a spin keeps a stream busy to open a race window on a GPU.
const SPIN_NS: u64 = 2_000_000;

#[cfg(feature = "cuda")]
static DEVICE: Mutex<()> = Mutex::new(());

/// Device 0 and the lock on it, or `None` (after saying so) where there is no GPU; panics there
/// under `STREAMSAN_REQUIRE_GPU=1`.
#[cfg(feature = "cuda")]
fn gpu() -> Option<(MutexGuard<'static, ()>, Session)> {
    if !streamsan::cuda::gpu_or_skip() {
        return None;
    }
    let guard = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let session = Session::cuda(0).expect("open device 0");
    Some((guard, session))
}

/// Runs a case on the simulator (`case::simulated`) and on GPU 0 (`case::cuda`).
macro_rules! on_both {
    ($case:ident) => {
        mod $case {
            #[test]
            fn simulated() {
                super::$case(streamsan::session::Session::simulated())
                    .expect(concat!(stringify!($case), " on the simulator"));
            }

            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                if let Some((_guard, session)) = super::gpu() {
                    super::$case(session).expect(concat!(stringify!($case), " on the GPU"));
                }
            }
        }
    };
}

type Result<T = ()> = std::result::Result<T, SessionError>;

/// What the hash kernel of launch `op` writes into a region of `len` words (write region `j` = 0).
fn expected(op: u64, reads: &[&[u32]], len: usize) -> Vec<u32> {
    let mut out = vec![0u32; len];
    hash_region_cpu(op as u32, 0, reads, &mut out);
    out
}

fn kinds(report: &Report) -> Vec<HazardKind> {
    report.hazards.iter().map(|h| h.kind).collect()
}

fn site_of(h: &Hazard) -> String {
    h.access
        .as_ref()
        .and_then(|a| a.site.as_ref())
        .and_then(|s| s.innermost().map(str::to_owned))
        .unwrap_or_default()
}

fn is_gpu(s: &Session) -> bool {
    matches!(s.backend(), BackendKind::Cuda { .. })
}

// ---- two streams, one event -------------------------------------------------------------------

fn producer_consumer(s: Session) -> Result {
    let producer = s.stream()?;
    let consumer = s.stream()?;
    let mut a = s.alloc::<u32>(&producer, N)?;
    let mut b = s.alloc::<u32>(&consumer, N)?;
    let p = s.launch(&producer, "produce").write(&mut a).hash()?;
    let ready = s.event()?;
    ready.record(&producer)?;
    consumer.wait(&ready)?;
    let c = s
        .launch(&consumer, "consume")
        .read(&a)
        .write(&mut b)
        .hash()?;
    let got = s.memcpy_dtov::<u32>(&consumer, &b)?;
    let a_words = expected(p, &[], N);
    assert_eq!(got, expected(c, &[&a_words], N));
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(producer_consumer);

fn producer_consumer_without_wait(s: Session) -> Result {
    let producer = s.stream()?;
    let consumer = s.stream()?;
    let mut a = s.alloc::<u32>(&producer, N)?;
    let mut b = s.alloc::<u32>(&consumer, N)?;
    s.launch(&producer, "produce").write(&mut a).hash()?;
    let c = s
        .launch(&consumer, "consume")
        .read(&a)
        .write(&mut b)
        .hash()?;
    s.synchronize()?;
    let report = s.finish()?;
    assert_eq!(
        kinds(&report),
        vec![HazardKind::DataRace],
        "{}",
        report.to_json()
    );
    let h = &report.hazards[0];
    assert_eq!(h.op, c);
    assert_eq!(h.buffer.as_deref(), Some(a.id().as_str()));
    let site = site_of(h);
    assert!(
        site.starts_with("tests/session.rs:"),
        "the site points at the launch in this file, not {site:?}"
    );
    Ok(())
}
on_both!(producer_consumer_without_wait);

// ---- the reuse bug ----------------------------------------------------------------------------

/// Allocates on `compute`, reads on `comm` behind a spin, frees (with `record_stream` when
/// `fixed`), reallocates the same size on `compute` and overwrites it. Returns the report, whether
/// the same address came back, and how many words `comm` computed from corrupted input.
fn reuse(s: Session, fixed: bool) -> Result<(Report, bool, u64)> {
    let compute = s.stream_named("compute")?;
    let comm = s.stream_named("comm")?;
    let mut grads = s.alloc_named::<u32>(&compute, "grads", N)?;
    let mut sums = s.alloc_named::<u32>(&comm, "sums", N)?;
    let fill = s.launch(&compute, "backward").write(&mut grads).hash()?;
    let ready = s.event()?;
    ready.record(&compute)?;
    comm.wait(&ready)?;
    let reduce = s
        .launch(&comm, "all_reduce")
        .read(&grads)
        .write(&mut sums)
        .spin(SPIN_NS)
        .hash()?;
    if fixed {
        s.record_stream(&grads, &comm)?;
    }
    let old = grads.device_ptr();
    grads.free()?;
    let mut acts = s.alloc_named::<u32>(&compute, "activations", N)?;
    let same = acts.device_ptr() == old;
    s.launch(&compute, "forward").write(&mut acts).hash()?;
    s.synchronize()?;
    let got = s.memcpy_dtov::<u32>(&comm, &sums)?;
    let grads_words = expected(fill, &[], N);
    let corrupted = count_mismatches(&got, &expected(reduce, &[&grads_words], N));
    Ok((s.finish()?, same, corrupted))
}

fn reuse_without_record_stream(s: Session) -> Result {
    let gpu = is_gpu(&s);
    let (report, same, corrupted) = reuse(s, false)?;
    assert!(
        same,
        "the freed block is handed to the next allocation on its stream"
    );
    assert_eq!(
        kinds(&report),
        vec![HazardKind::UnsafeFree, HazardKind::ReuseRace],
        "{}",
        report.to_json()
    );
    let reuse = &report.hazards[1];
    assert_eq!(reuse.buffer.as_deref(), Some("activations"));
    assert_eq!(reuse.conflicts[0].buffer, "grads");
    println!("corrupted words: {corrupted} of {N} (gpu: {gpu})");
    assert!(
        corrupted > 0,
        "the overwrite lands before the spun all_reduce reads (on a GPU: unless launches are \
         serialized, e.g. CUDA_LAUNCH_BLOCKING=1)"
    );
    Ok(())
}
on_both!(reuse_without_record_stream);

fn reuse_with_record_stream(s: Session) -> Result {
    let (report, _same, corrupted) = reuse(s, true)?;
    report.assert_clean();
    assert_eq!(
        corrupted, 0,
        "record_stream keeps the block until all_reduce is done"
    );
    Ok(())
}
on_both!(reuse_with_record_stream);

fn stream_ordered_free(s: Session) -> Result {
    let s1 = s.stream()?;
    let s2 = s.stream()?;
    let mut x = s.alloc::<u32>(&s1, N)?;
    let mut y = s.alloc::<u32>(&s2, N)?;
    s.launch(&s1, "produce").write(&mut x).hash()?;
    let e = s.event()?;
    e.record(&s1)?;
    s2.wait(&e)?;
    s.launch(&s2, "consume").read(&x).write(&mut y).hash()?;
    let old = x.device_ptr();
    // Freed in s2's order, after s2's read: s2 now owns the block and reuses it safely.
    x.free_on(&s2)?;
    let mut z = s.alloc::<u32>(&s2, N)?;
    assert_eq!(z.device_ptr(), old);
    s.launch(&s2, "reuse").write(&mut z).hash()?;
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(stream_ordered_free);

// ---- pinned staging ---------------------------------------------------------------------------

/// Host write → copy in → kernel → copy out → host read, with or without a stream sync before
/// the read. The buffers live until the report is taken (freeing pinned memory the stream may
/// still use is itself a hazard).
fn staging(s: Session, sync: bool) -> Result<(Vec<u32>, u64, Report)> {
    let st = s.stream()?;
    let mut stage = s.alloc_pinned::<u32>(N)?;
    let mut dev = s.alloc::<u32>(&st, N)?;
    let mut out = s.alloc::<u32>(&st, N)?;
    stage.write_with(|w| {
        for (i, x) in w.iter_mut().enumerate() {
            *x = i as u32;
        }
    })?;
    s.copy(&st, &stage, &mut dev)?;
    let k = s.launch(&st, "kernel").read(&dev).write(&mut out).hash()?;
    s.copy(&st, &out, &mut stage)?;
    if sync {
        st.synchronize()?;
    }
    let got = stage.read()?;
    Ok((got, k, s.finish()?))
}

fn pinned_staging_with_sync(s: Session) -> Result {
    let (got, k, report) = staging(s, true)?;
    let input: Vec<u32> = (0..N as u32).collect();
    assert_eq!(got, expected(k, &[&input], N));
    report.assert_clean();
    Ok(())
}
on_both!(pinned_staging_with_sync);

fn pinned_staging_without_sync(s: Session) -> Result {
    let (_, _, report) = staging(s, false)?;
    assert_eq!(
        kinds(&report),
        vec![HazardKind::DataRace],
        "{}",
        report.to_json()
    );
    let h = &report.hazards[0];
    let access = h.access.as_ref().expect("the host read");
    assert_eq!(access.participant, "host");
    assert_eq!(h.conflicts[0].access, streamsan::report::AccessKind::Write);
    Ok(())
}
on_both!(pinned_staging_without_sync);

// ---- traces -----------------------------------------------------------------------------------

/// A small parser for the ops a session writes (the crate's trace reader lives elsewhere).
fn parse_region(v: &Value) -> Region {
    match v {
        Value::String(b) => Region::whole(b.as_str()),
        Value::Object(m) => Region {
            buffer: Id::from(m["buffer"].as_str().expect("buffer")),
            offset: m.get("offset").and_then(Value::as_u64).unwrap_or(0),
            bytes: m.get("bytes").and_then(Value::as_u64),
        },
        other => panic!("not a region: {other}"),
    }
}

fn parse_line(line: &str) -> TraceOp {
    let v: Value = serde_json::from_str(line).expect("a JSON line");
    let id = |k: &str| Id::from(v[k].as_str().unwrap_or_else(|| panic!("{k} in {line}")));
    let opt_id = |k: &str| v.get(k).and_then(Value::as_str).map(Id::from);
    let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    let regions = |k: &str| {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(parse_region).collect())
            .unwrap_or_default()
    };
    let op = match v["op"].as_str().expect("op") {
        "stream_create" => Op::StreamCreate {
            stream: id("stream"),
            device: v.get("device").and_then(Value::as_u64).unwrap_or(0),
            blocking: flag("blocking"),
        },
        "alloc" => Op::Alloc {
            buffer: id("buffer"),
            bytes: v["bytes"].as_u64().expect("bytes"),
            stream: opt_id("stream"),
            memory: match v.get("memory").and_then(Value::as_str) {
                None | Some("device") => MemoryKind::Device,
                Some("pinned") => MemoryKind::Pinned,
                Some(_) => MemoryKind::Managed,
            },
            addr: v.get("addr").and_then(Value::as_u64),
            pool: opt_id("pool"),
        },
        "free" => Op::Free {
            buffer: id("buffer"),
            stream: opt_id("stream"),
        },
        "record_stream" => Op::RecordStream {
            buffer: id("buffer"),
            stream: id("stream"),
        },
        "launch" => Op::Launch {
            stream: id("stream"),
            name: v.get("name").and_then(Value::as_str).map(Into::into),
            reads: regions("reads"),
            writes: regions("writes"),
        },
        "copy" => Op::Copy {
            stream: id("stream"),
            src: parse_region(&v["src"]),
            dst: parse_region(&v["dst"]),
        },
        "memset" => Op::Memset {
            stream: id("stream"),
            dst: parse_region(&v["dst"]),
        },
        "host_read" => Op::HostRead {
            buffer: parse_region(&v["buffer"]),
        },
        "host_write" => Op::HostWrite {
            buffer: parse_region(&v["buffer"]),
        },
        "event_create" => Op::EventCreate { event: id("event") },
        "event_destroy" => Op::EventDestroy { event: id("event") },
        "event_record" => Op::EventRecord {
            event: id("event"),
            stream: id("stream"),
        },
        "event_wait" => Op::EventWait {
            stream: id("stream"),
            event: id("event"),
        },
        "event_sync" => Op::EventSync { event: id("event") },
        "event_query" => Op::EventQuery {
            event: id("event"),
            complete: flag("complete"),
        },
        "stream_sync" => Op::StreamSync {
            stream: id("stream"),
        },
        "stream_query" => Op::StreamQuery {
            stream: id("stream"),
            complete: flag("complete"),
        },
        "device_sync" => Op::DeviceSync {
            device: v.get("device").and_then(Value::as_u64).unwrap_or(0),
        },
        other => panic!("unknown op {other}"),
    };
    let site = v
        .get("site")
        .and_then(Value::as_str)
        .map(|s| Site::Label(s.to_owned()));
    TraceOp { op, site }
}

fn recheck(ops: &[TraceOp]) -> Report {
    let mut checker = Checker::new();
    for op in ops {
        checker.check(op).expect("a recorded op is valid");
    }
    checker.finish()
}

fn exported_trace_rechecks(s: Session) -> Result {
    // A program with every kind of op and a few hazards.
    let a_stream = s.stream()?;
    let b_stream = s.blocking_stream()?;
    let mut pinned = s.alloc_pinned::<f32>(N)?;
    let mut x = s.alloc::<f32>(&a_stream, N)?;
    let mut y = s.alloc::<f32>(&b_stream, N)?;
    pinned.write(&vec![1.5; N])?;
    s.copy(&a_stream, &pinned, &mut x)?;
    s.memset(&b_stream, &mut y, 0f32.to_bits())?;
    s.launch(&b_stream, "racy")
        .read(&x)
        .writes(y.slice(..N / 2))
        .hash()?;
    let e = s.event()?;
    e.record(&a_stream)?;
    b_stream.wait(&e)?;
    e.query()?;
    s.launch(s.default_stream(), "legacy").read(&y).hash()?;
    a_stream.query()?;
    x.free()?;
    drop(e);
    s.launch(&b_stream, "after_free")
        .reads(y.slice(N / 2..))
        .hash()?;
    s.synchronize()?;
    drop(pinned);

    let trace = s.trace()?;
    let path = std::env::temp_dir().join(format!(
        "streamsan-session-{}-{}.jsonl",
        std::process::id(),
        if is_gpu(&s) { "cuda" } else { "sim" }
    ));
    s.write_trace(&path)?;
    let report = s.finish()?;
    assert!(report.errors > 0, "the program has hazards");

    let text = std::fs::read_to_string(&path)?;
    let _ = std::fs::remove_file(&path);
    let parsed: Vec<TraceOp> = text.lines().map(parse_line).collect();
    assert_eq!(parsed, trace, "the file holds exactly the recorded ops");
    assert_eq!(recheck(&trace).to_json(), report.to_json());
    assert_eq!(recheck(&parsed).to_json(), report.to_json());
    Ok(())
}
on_both!(exported_trace_rechecks);

// ---- the allocator ----------------------------------------------------------------------------

fn drop_is_a_caching_free(s: Session) -> Result {
    let st = s.stream()?;
    let a = s.alloc::<u32>(&st, 1000)?;
    let (ptr, id) = (a.device_ptr(), a.id().clone());
    assert_eq!(s.device_memory_stats()?.live_blocks, 1);
    drop(a);
    let stats = s.device_memory_stats()?;
    assert_eq!((stats.live_blocks, stats.free_blocks), (0, 1));
    let trace = s.trace()?;
    assert_eq!(
        trace.last().map(|t| &t.op),
        Some(&Op::Free {
            buffer: id,
            stream: None
        })
    );
    let b = s.alloc::<u32>(&st, 1000)?;
    assert_eq!(b.device_ptr(), ptr, "the cached block is reused");
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(drop_is_a_caching_free);

fn too_large_is_an_error(s: Session) -> Result {
    let st = s.stream()?;
    // 1 << 60 bytes: no device has that much memory.
    match s.alloc::<u32>(&st, 1 << 58) {
        Err(SessionError::Alloc { bytes, memory, .. }) => {
            assert_eq!((bytes, memory), (1 << 60, MemoryKind::Device))
        }
        other => panic!("expected an allocation error, got {other:?}"),
    }
    // More elements than 2^64 bytes hold.
    assert!(matches!(
        s.alloc::<u32>(&st, usize::MAX),
        Err(SessionError::Alloc { .. })
    ));
    assert!(matches!(
        s.alloc_pinned::<u32>(1 << 58),
        Err(SessionError::Alloc { .. })
    ));
    // The session goes on.
    let mut a = s.alloc::<u32>(&st, 16)?;
    s.launch(&st, "after").write(&mut a).hash()?;
    assert_eq!(s.ops(), 3, "failed allocations record nothing");
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(too_large_is_an_error);

// ---- streams and events -----------------------------------------------------------------------

fn legacy_default_stream(s: Session) -> Result {
    let d = s.default_stream().clone();
    assert_eq!(
        (d.id().as_str(), d.kind()),
        ("default", StreamKind::LegacyDefault)
    );
    let blocking = s.blocking_stream()?;
    let nonblocking = s.stream()?;
    assert_eq!(blocking.kind(), StreamKind::Blocking);
    let mut a = s.alloc::<u32>(&blocking, N)?;
    let mut b = s.alloc::<u32>(&nonblocking, N)?;
    s.launch(&blocking, "w").write(&mut a).hash()?;
    // Ordered by the legacy default stream's implicit edge: no race.
    let legacy = s.launch(&d, "r").read(&a).hash()?;
    s.launch(&nonblocking, "w2").write(&mut b).hash()?;
    // Not ordered: a non-blocking stream has no implicit edge.
    let racy = s.launch(&d, "r2").read(&b).hash()?;
    let report = s.finish()?;
    assert_eq!(kinds(&report), vec![HazardKind::DataRace]);
    assert_eq!(report.hazards[0].op, racy);
    assert!(legacy < racy);
    // The report explains the race from the recorded trace.
    let why = &report.hazards[0].detail.why;
    assert!(
        why.iter()
            .any(|l| l.contains("has no synchronization with")),
        "{why:?}"
    );
    assert_eq!(
        why.last().map(|l| l.starts_with("missing edge: ")),
        Some(true)
    );
    Ok(())
}
on_both!(legacy_default_stream);

fn queries_record_their_results(s: Session) -> Result {
    let st = s.stream()?;
    let mut a = s.alloc::<u32>(&st, N)?;
    s.launch(&st, "slow").write(&mut a).spin(SPIN_NS).hash()?;
    let e = s.event()?;
    e.record(&st)?;
    let early = e.query()?;
    if s.is_simulated() {
        assert!(!early, "a spun stream lags until something waits for it");
        assert!(!st.query()?);
    }
    e.synchronize()?;
    assert!(e.query()?);
    assert!(st.query()?);
    let queries: Vec<bool> = s
        .trace()?
        .iter()
        .filter_map(|t| match t.op {
            Op::EventQuery { complete, .. } | Op::StreamQuery { complete, .. } => Some(complete),
            _ => None,
        })
        .collect();
    assert_eq!(queries.last(), Some(&true));
    assert_eq!(queries.first(), Some(&early));
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(queries_record_their_results);

fn wait_on_unrecorded_event_warns(s: Session) -> Result {
    let st = s.stream()?;
    let e = s.event()?;
    st.wait(&e)?;
    let report = s.finish()?;
    assert!(report.is_clean());
    assert_eq!(kinds(&report), vec![HazardKind::WaitOnUnrecordedEvent]);
    Ok(())
}
on_both!(wait_on_unrecorded_event_warns);

fn views_memset_and_use_after_free(s: Session) -> Result {
    let st = s.stream()?;
    let mut a = s.alloc::<f32>(&st, N)?;
    s.memset(&st, &mut a, 2.5f32.to_bits())?;
    let mut tail = a.slice(N / 2..);
    s.memset(&st, &mut tail, 0)?;
    let got = s.memcpy_dtov::<f32>(&st, &a)?;
    assert!(got[..N / 2].iter().all(|&x| x == 2.5));
    assert!(got[N / 2..].iter().all(|&x| x == 0.0));
    assert!(s.hazards()?.is_empty());
    // A view outlives its buffer: using it is a use-after-free in the report.
    let view = a.slice(..16);
    a.free()?;
    let late = s.launch(&st, "late").reads(view).hash()?;
    let found = s.hazards()?;
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].kind, found[0].op),
        (HazardKind::UseAfterFree, late)
    );
    assert_eq!(kinds(&s.finish()?), vec![HazardKind::UseAfterFree]);
    Ok(())
}
on_both!(views_memset_and_use_after_free);

// ---- user kernels -----------------------------------------------------------------------------

fn user_kernel(s: Session) -> Result {
    let st = s.stream()?;
    let a = s.alloc::<u32>(&st, N)?;
    let half = a.slice(N / 2..);
    let kernel = |raw: &RawLaunch<'_>| -> std::result::Result<(), LaunchError> {
        let region = raw.writes()[0];
        if raw.is_simulated() {
            raw.write_words(&region, &vec![7; region.words() as usize])?;
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        {
            let gpu = raw.gpu().ok_or("no GPU")?;
            let dst =
                streamsan::cuda::DeviceRegion::new(region.device_ptr(), region.words() as u32);
            let stream = raw.stream().ok_or("no stream")?;
            // SAFETY: `dst` is the declared region, session memory, on the launch's stream.
            unsafe { gpu.kernels()?.fill(stream, dst, 7) }?;
        }
        Ok(())
    };
    // SAFETY: the kernel writes only the declared region, on the launch's stream.
    let op = unsafe { s.launch(&st, "fill_sevens").writes(half).run(kernel) }?;
    s.launch(&st, "fill_rest").writes(a.slice(..N / 2)).hash()?;
    let got = s.memcpy_dtov::<u32>(&st, &a)?;
    assert_eq!(&got[N / 2..], &vec![7; N / 2][..]);
    assert_eq!(s.trace()?[op as usize].op.name(), "launch");
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(user_kernel);

fn user_kernel_error_is_returned(s: Session) -> Result {
    let st = s.stream()?;
    let a = s.alloc::<u32>(&st, 16)?;
    // SAFETY: the closure enqueues nothing.
    let r = unsafe {
        s.launch(&st, "fails")
            .read(&a)
            .run(|_| Err("no such kernel".into()))
    };
    assert!(matches!(r, Err(SessionError::Launch(_))), "{r:?}");
    s.finish()?.assert_clean();
    Ok(())
}
on_both!(user_kernel_error_is_returned);

// ---- simulator only ---------------------------------------------------------------------------

#[test]
fn simulator_matches_the_sequential_reference() {
    let s = Session::simulated();
    let s1 = s.stream().unwrap();
    let s2 = s.blocking_stream().unwrap();
    let mut bufs: Vec<DeviceBuffer<u32>> = Vec::new();
    for k in 0..4 {
        let st = if k % 2 == 0 { &s1 } else { &s2 };
        bufs.push(s.alloc(st, 256 + 64 * k).unwrap());
    }
    // Every word is written before it is read: the reference executor and the simulator read
    // uninitialized memory differently (a GPU returns whatever an earlier owner left there).
    for (k, b) in bufs.iter_mut().enumerate() {
        let st = if k % 2 == 0 { &s1 } else { &s2 };
        s.launch(st, "init").write(b).hash().unwrap();
    }
    s.synchronize().unwrap();
    let e = s.event().unwrap();
    for round in 0..3 {
        let (a, rest) = bufs.split_at_mut(1);
        s.launch(&s1, "mix")
            .read(&rest[0])
            .read(&rest[1])
            .write(&mut a[0])
            .hash()
            .unwrap();
        e.record(&s1).unwrap();
        s2.wait(&e).unwrap();
        let (b, rest) = rest.split_at_mut(1);
        s.launch(&s2, "spread")
            .read(&a[0])
            .write(&mut b[0])
            .writes(rest[1].slice(..64))
            .hash()
            .unwrap();
        let src = b[0].slice(..256);
        let dst = rest[0].slice(..256);
        s.launch(s.default_stream(), "legacy")
            .reads(src)
            .writes(dst)
            .hash()
            .unwrap();
        if round == 1 {
            let tmp = bufs.pop().unwrap();
            tmp.free().unwrap();
            bufs.push(s.alloc(&s1, 448).unwrap());
            s.launch(&s1, "refill").write(&mut bufs[3]).hash().unwrap();
        }
        e.record(s.default_stream()).unwrap();
        s1.wait(&e).unwrap();
    }
    s.synchronize().unwrap();
    // The reference executor takes traces without addresses; the simulator's are the model's.
    let mut trace = s.trace().unwrap();
    for t in &mut trace {
        if let Op::Alloc { addr, .. } = &mut t.op {
            *addr = None;
        }
    }
    let reference = streamsan::exec::sim::reference(&trace).expect("the reference runs the trace");
    for b in &bufs {
        let words = s.memcpy_dtov::<u32>(s.default_stream(), b).unwrap();
        assert_eq!(
            Some(&checksum(&words)),
            reference.live.get(b.id()),
            "{}",
            b.id()
        );
    }
    s.finish().unwrap().assert_clean();
}

#[cfg(feature = "cuda")]
#[test]
fn no_gpu_is_an_error_not_a_panic() {
    if streamsan::cuda::Gpu::available() {
        assert!(Session::cuda(usize::MAX).is_err(), "no such ordinal");
        return;
    }
    match Session::cuda(0) {
        Err(SessionError::NoGpu { reason }) => println!("no GPU: {reason}"),
        other => panic!("expected NoGpu, got {other:?}"),
    }
}

#[test]
fn calling_the_session_from_its_callback_is_an_error() {
    let s = Session::simulated();
    let st = s.stream().unwrap();
    let mut inner = None;
    // SAFETY: the closure enqueues nothing.
    unsafe {
        s.launch(&st, "k")
            .run(|_| {
                inner = Some(s.synchronize());
                Ok(())
            })
            .unwrap();
    }
    assert!(matches!(inner, Some(Err(SessionError::Reentrant))));
    let mut p = s.alloc_pinned::<u32>(4).unwrap();
    let mut inner = None;
    p.write_with(|_| inner = Some(s.stream().map(|_| ())))
        .unwrap();
    assert!(matches!(inner, Some(Err(SessionError::Reentrant))));
    // After the callbacks the session works again.
    s.synchronize().unwrap();
    s.finish().unwrap().assert_clean();
}

#[test]
fn handles_of_another_session_are_refused() {
    let s = Session::simulated();
    let other = Session::simulated();
    let st = s.stream().unwrap();
    let theirs = other.stream().unwrap();
    let mut a = s.alloc::<u32>(&st, 16).unwrap();
    let b = other.alloc::<u32>(&theirs, 16).unwrap();
    assert!(matches!(
        s.launch(&theirs, "k").write(&mut a).hash(),
        Err(SessionError::WrongSession)
    ));
    assert!(matches!(
        s.launch(&st, "k").read(&b).write(&mut a).hash(),
        Err(SessionError::WrongSession)
    ));
    assert!(matches!(
        s.alloc::<u32>(&theirs, 4),
        Err(SessionError::WrongSession)
    ));
    let e = other.event().unwrap();
    assert!(matches!(st.wait(&e), Err(SessionError::WrongSession)));
    s.finish().unwrap().assert_clean();
}

#[test]
fn names_are_checked() {
    let s = Session::simulated();
    let st = s.stream_named("compute").unwrap();
    assert!(s.stream_named("compute").is_err());
    assert!(s.stream_named("default").is_err());
    assert!(s.stream_named("host").is_err());
    assert_eq!(st.id().as_str(), "compute");
    let a = s.alloc_named::<u32>(&st, "grads", 4).unwrap();
    assert!(s.alloc_named::<u32>(&st, "grads", 4).is_err());
    a.free().unwrap();
    // A name may be allocated again after its free.
    let a = s.alloc_named::<u32>(&st, "grads", 4).unwrap();
    // SAFETY: the region is only recorded, never executed on.
    let ext = unsafe { s.external_region("weights", 0x1000, 64) }.unwrap();
    assert!(unsafe { s.external_region("grads", 0x1000, 64) }.is_err());
    assert!(unsafe { s.external_region("odd", 0x1001, 64) }.is_err());
    assert!(s.alloc_named::<u32>(&st, "weights", 4).is_err());
    // The simulator has no memory behind an external region...
    assert!(s.launch(&st, "k").reads(ext).hash().is_err());
    // ...but a user kernel may declare it.
    // SAFETY: the closure enqueues nothing.
    unsafe {
        s.launch(&st, "k")
            .reads(ext)
            .writes(a.region())
            .run(|_| Ok(()))
    }
    .unwrap();
    let trace = s.trace().unwrap();
    assert!(matches!(&trace.last().unwrap().op,
        Op::Launch { reads, .. } if reads[0] == Region::range("weights", 0, 64)));
    s.finish().unwrap().assert_clean();
}

#[test]
fn unchecked_sessions_record_nothing_and_compute_the_same() {
    let run = |check: bool| {
        let s = Session::simulated_with(SessionConfig {
            check,
            ..SessionConfig::default()
        })
        .unwrap();
        let st = s.stream().unwrap();
        let mut a = s.alloc::<u32>(&st, 64).unwrap();
        s.launch(&st, "k").write(&mut a).hash().unwrap();
        let words = s.memcpy_dtov::<u32>(&st, &a).unwrap();
        let trace = s.trace().unwrap();
        (words, trace.len(), s.finish().unwrap().ops)
    };
    let (checked, n, ops) = run(true);
    let (unchecked, m, _) = run(false);
    assert_eq!(checked, unchecked);
    assert_eq!((n, m), (ops as usize, 0));
}

#[test]
fn session_errors_render() {
    let e = SessionError::Alloc {
        bytes: 1 << 60,
        memory: MemoryKind::Device,
        reason: "out of memory".into(),
    };
    assert_eq!(
        e.to_string(),
        "cannot allocate 1152921504606846976 bytes of device memory: out of memory"
    );
}
