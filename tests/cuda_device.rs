//! The device layer on a real GPU: the kernels against their CPU reference, and the stream kinds
//! and events doing exactly what CUDA says, no more (no hidden synchronization).
//!
//! Every test that needs a GPU starts with [`device`] (through `streamsan::cuda::gpu_or_skip`),
//! which prints `skipped: <reason>` and passes where there is none, and fails instead under
//! `STREAMSAN_REQUIRE_GPU=1`. The tests hold one lock while they use the device, so that timing
//! assumptions (a 2 ms spin outlasts a small kernel on another stream) are not disturbed by the
//! other tests of this file. Fixtures: none (every input is built in the test).

#![cfg(feature = "cuda")]

use std::sync::{Mutex, MutexGuard};

use streamsan::cuda::{gpu_or_skip, DeviceRegion, Gpu, GpuError, Stream, StreamKind};
use streamsan::kernels::{
    checksum, count_mismatches, hash_region_cpu, memset_word, MAX_READS, POISON,
};

/// How long a stream is kept busy to open a race window.
const SPIN_NS: u64 = 2_000_000;

static DEVICE: Mutex<()> = Mutex::new(());

/// Device 0 and the lock on it, or `None` (after saying so) where there is no GPU; panics there
/// under `STREAMSAN_REQUIRE_GPU=1`.
fn device() -> Option<(MutexGuard<'static, ()>, Gpu)> {
    if !gpu_or_skip() {
        return None;
    }
    let guard = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let gpu = Gpu::open(0).expect("open device 0");
    assert!(
        !gpu.is_event_tracking(),
        "cudarc event tracking must be off"
    );
    Some((guard, gpu))
}

/// A device segment of whole words, unmapped on drop.
struct Segment<'g> {
    gpu: &'g Gpu,
    region: DeviceRegion,
}

impl<'g> Segment<'g> {
    fn new(gpu: &'g Gpu, words: u32) -> Segment<'g> {
        // At least one word: a region of 0 words still needs an address.
        let bytes = (words.max(1) as usize) * 4;
        let ptr = gpu.map_segment(bytes).expect("map segment");
        Segment {
            gpu,
            region: DeviceRegion::new(ptr, words),
        }
    }

    fn with(gpu: &'g Gpu, stream: &Stream, words: &[u32]) -> Segment<'g> {
        let seg = Segment::new(gpu, words.len() as u32);
        seg.write(stream, words);
        seg
    }

    fn write(&self, stream: &Stream, words: &[u32]) {
        assert!(words.len() <= self.region.words as usize);
        // SAFETY: the segment is live device memory of at least `words.len()` words.
        unsafe { stream.write_words(self.region.ptr, words) }.expect("write words");
    }

    fn read(&self, stream: &Stream) -> Vec<u32> {
        // SAFETY: the segment is live device memory.
        unsafe { stream.read_words(self.region) }.expect("read words")
    }
}

impl Drop for Segment<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.unmap_segment(self.region.ptr) {
            eprintln!("unmap_segment failed: {e}");
        }
    }
}

/// splitmix64: small, deterministic test data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n.max(1))) as u32
    }

    fn words(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_u64() as u32).collect()
    }
}

/// What `hash_launch` must leave in a region of `n` words.
fn expected(op_id: u32, j: u32, reads: &[&[u32]], n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    hash_region_cpu(op_id, j, reads, &mut out);
    out
}

fn first_mismatch(got: &[u32], want: &[u32]) -> Option<(usize, u32, u32)> {
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| (i, *g, *w))
}

#[test]
fn available_never_panics_and_open_fails_cleanly_without_a_driver() {
    if gpu_or_skip() {
        let _guard = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
        let count = Gpu::device_count().expect("device count");
        assert!(count > 0);
        assert!(matches!(
            Gpu::open(count),
            Err(GpuError::NoSuchDevice { .. })
        ));
        let gpu = Gpu::open(0).expect("open device 0");
        assert!(!gpu.is_event_tracking());
        println!(
            "device 0: {} (sm_{}{}), {} SMs, driver {}",
            gpu.name().unwrap_or_default(),
            gpu.compute_capability().0,
            gpu.compute_capability().1,
            gpu.multiprocessors(),
            Gpu::driver_version().unwrap_or(0)
        );
    } else {
        match Gpu::device_count() {
            Err(GpuError::NoDriver) | Ok(0) => {}
            other => panic!("unexpected device_count: {other:?}"),
        }
        assert!(matches!(
            Gpu::open(0),
            Err(GpuError::NoDriver | GpuError::NoDevice)
        ));
        // Asking twice is fine too.
        assert!(!Gpu::available());
    }
}

#[test]
fn hash_launch_matches_the_cpu_reference() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let kernels = gpu.kernels().expect("compile kernels");
    assert!(std::ptr::eq(kernels, gpu.kernels().unwrap()), "loaded once");
    println!("kernels from a CUBIN: {}", kernels.is_cubin());
    let stream = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let mut rng = Rng(0x5eed);

    // The largest is more than one grid-stride round on an H200 (132 SMs x 8 blocks x 256).
    let lens = [0u32, 1, 7, 255, 256, 257, 1000, 4097, 65_537, 300_007];
    let mut cases = 0;
    for (c, &n_out) in lens.iter().enumerate() {
        for n_reads in 0..=MAX_READS {
            // Reads shorter than, as long as and longer than the output.
            let read_lens: Vec<u32> = (0..n_reads)
                .map(|k| match (c + k) % 3 {
                    0 => rng.below(n_out + 1),
                    1 => n_out,
                    _ => n_out + 1 + rng.below(64),
                })
                .collect();
            let read_data: Vec<Vec<u32>> =
                read_lens.iter().map(|&l| rng.words(l as usize)).collect();
            let read_segs: Vec<Segment> = read_data
                .iter()
                .map(|d| Segment::with(&gpu, &stream, d))
                .collect();
            let out = Segment::with(&gpu, &stream, &rng.words(n_out as usize));
            let op_id = rng.next_u64() as u32;
            let j = rng.below(4);
            let regions: Vec<DeviceRegion> = read_segs.iter().map(|s| s.region).collect();
            // A spin on some launches: it must not change the result.
            let spin = if c % 4 == 1 { 10_000 } else { 0 };
            // SAFETY: all regions are live segments, disjoint from `out`, until the read below
            // (which synchronizes the stream).
            unsafe { kernels.hash_launch(&stream, op_id, j, out.region, &regions, spin) }.unwrap();
            let got = out.read(&stream);
            let reads: Vec<&[u32]> = read_data.iter().map(|d| d.as_slice()).collect();
            let want = expected(op_id, j, &reads, n_out as usize);
            assert_eq!(
                first_mismatch(&got, &want),
                None,
                "n_out {n_out}, read lengths {read_lens:?}: (index, device, cpu)"
            );
            cases += 1;
        }
    }

    // In place: the output is also read 0, word for word.
    let data = rng.words(5000);
    let seg = Segment::with(&gpu, &stream, &data);
    // SAFETY: one live segment, read and written at the same indices only.
    unsafe { kernels.hash_launch(&stream, 9, 0, seg.region, &[seg.region], 0) }.unwrap();
    assert_eq!(seg.read(&stream), expected(9, 0, &[&data], data.len()));
    println!("{} cases", cases + 1);
}

#[test]
fn hash_launch_rejects_what_the_kernel_cannot_do() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let kernels = gpu.kernels().expect("compile kernels");
    let stream = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let seg = Segment::new(&gpu, 16);
    let five = [seg.region; MAX_READS + 1];
    // SAFETY: rejected before anything is enqueued.
    let too_many = unsafe { kernels.hash_launch(&stream, 1, 0, seg.region, &five, 0) };
    assert!(matches!(too_many, Err(GpuError::InvalidArgument(_))));
    let misaligned = DeviceRegion::new(seg.region.ptr + 2, 4);
    // SAFETY: rejected before anything is enqueued.
    let bad = unsafe { kernels.fill(&stream, misaligned, 0) };
    assert!(matches!(bad, Err(GpuError::InvalidArgument(_))));
    assert!(DeviceRegion::from_bytes(seg.region.ptr, 6).is_err());
}

#[test]
fn fill_copy_memset_checksum_compare_match_the_cpu() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let kernels = gpu.kernels().expect("compile kernels");
    let stream = gpu.new_stream(StreamKind::Blocking).unwrap();
    let mut rng = Rng(42);
    let n = 1_000_003u32;
    let data = rng.words(n as usize);
    let a = Segment::with(&gpu, &stream, &data);
    let b = Segment::new(&gpu, n);
    let scratch = Segment::new(&gpu, 2);
    let scratch64 = DeviceRegion::new(scratch.region.ptr, 2);

    // SAFETY (for every enqueue below): all regions are live segments, and the host reads them
    // only through `read`, which synchronizes the stream they were written on.
    unsafe {
        // fill
        kernels.fill(&stream, b.region, POISON).unwrap();
        assert!(b.read(&stream).iter().all(|&w| w == POISON));

        // memset
        stream.memset_d32(b.region, memset_word(77)).unwrap();
        assert!(b.read(&stream).iter().all(|&w| w == memset_word(77)));

        // copy_words, then a driver copy back into place
        kernels.copy_words(&stream, b.region, a.region.ptr).unwrap();
        assert_eq!(first_mismatch(&b.read(&stream), &data), None);
        stream.memset_d32(b.region, 0).unwrap();
        stream
            .copy_dtod(b.region.ptr, a.region.ptr, a.region.bytes())
            .unwrap();
        assert_eq!(first_mismatch(&b.read(&stream), &data), None);

        // checksum, whole and empty
        for region in [a.region, DeviceRegion::new(a.region.ptr, 0)] {
            stream.memset_d32(scratch64, 0).unwrap();
            kernels
                .checksum(&stream, region, scratch.region.ptr)
                .unwrap();
            let w = scratch.read(&stream);
            let got = u64::from(w[0]) | (u64::from(w[1]) << 32);
            assert_eq!(got, checksum(&data[..region.words as usize]));
        }

        // compare: equal, then with changed words
        let count = DeviceRegion::new(scratch.region.ptr, 1);
        stream.memset_d32(count, 0).unwrap();
        kernels
            .compare(&stream, a.region.ptr, b.region.ptr, n, count.ptr)
            .unwrap();
        assert_eq!(scratch.read(&stream)[0], 0);
        let mut changed = data.clone();
        for _ in 0..1000 {
            let i = rng.below(n) as usize;
            changed[i] ^= 1 << rng.below(32);
        }
        b.write(&stream, &changed);
        stream.memset_d32(count, 0).unwrap();
        kernels
            .compare(&stream, a.region.ptr, b.region.ptr, n, count.ptr)
            .unwrap();
        assert_eq!(
            u64::from(scratch.read(&stream)[0]),
            count_mismatches(&data, &changed)
        );
    }
}

#[test]
fn pinned_buffers_round_trip_asynchronously() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let kernels = gpu.kernels().expect("compile kernels");
    let stream = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let n = 1 << 16;
    let mut rng = Rng(7);
    let data = rng.words(n);
    let mut host = gpu.alloc_pinned(n * 4).unwrap();
    assert!(host.as_words().iter().all(|&w| w == 0), "zeroed");
    host.as_words_mut().copy_from_slice(&data);
    let dev = Segment::new(&gpu, n as u32);
    // SAFETY: `host` and `dev` stay alive and untouched by the host until the stream is
    // synchronized.
    unsafe {
        stream
            .copy_htod(dev.region.ptr, host.as_ptr(), host.bytes())
            .unwrap();
        kernels.fill(&stream, host.device_region(), 0).unwrap();
        stream
            .copy_dtoh(host.as_mut_ptr(), dev.region.ptr, host.bytes())
            .unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(first_mismatch(host.as_words(), &data), None);
    // A kernel writes pinned memory through its device address.
    // SAFETY: as above.
    unsafe { kernels.fill(&stream, host.device_region(), 5).unwrap() };
    stream.synchronize().unwrap();
    assert!(host.as_words().iter().all(|&w| w == 5));
}

/// Stream `late` spins, then writes `x` with `op_late`; stream `early` writes `x` with `op_early`
/// at once. Returns what `x` holds at the end.
fn race(
    gpu: &Gpu,
    early: &Stream,
    late: &Stream,
    x: &Segment,
    reads: &[DeviceRegion],
) -> (Vec<u32>, bool) {
    let kernels = gpu.kernels().unwrap();
    let early_done = gpu.new_event().unwrap();
    kernels.spin(late, SPIN_NS).unwrap();
    // SAFETY: `x` and the reads are live segments until the device is synchronized below.
    unsafe {
        kernels.hash_launch(late, 2, 0, x.region, reads, 0).unwrap();
        kernels
            .hash_launch(early, 1, 0, x.region, reads, 0)
            .unwrap();
    }
    early_done.record(early).unwrap();
    early_done.synchronize().unwrap();
    // The early write is done; is the late stream still busy? (It should be: it spins 2 ms.)
    let late_still_running = !late.query().unwrap();
    gpu.synchronize().unwrap();
    (x.read(late), late_still_running)
}

#[test]
fn unsynchronized_streams_race_and_the_late_writer_wins() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let n = 1 << 16;
    let mut rng = Rng(1);
    let input = rng.words(n);
    let setup = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let r = Segment::with(&gpu, &setup, &input);
    let x = Segment::with(&gpu, &setup, &rng.words(n));
    let a = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let b = gpu.new_stream(StreamKind::NonBlocking).unwrap();

    // A spins 2 ms then writes X (op 2); B writes X (op 1) at once, with nothing between them.
    let (got, a_was_running) = race(&gpu, &b, &a, &x, &[r.region]);
    assert!(
        a_was_running,
        "B finished while A was still spinning: the streams ran concurrently"
    );
    let a_values = expected(2, 0, &[&input], n);
    let b_values = expected(1, 0, &[&input], n);
    assert_eq!(
        first_mismatch(&got, &a_values),
        None,
        "A wrote last, so X must hold A's values; B's would mean hidden synchronization"
    );
    assert_ne!(a_values, b_values);
}

#[test]
fn an_event_wait_orders_the_streams() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let kernels = gpu.kernels().expect("compile kernels");
    let n = 1 << 16;
    let mut rng = Rng(2);
    let setup = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let x = Segment::with(&gpu, &setup, &rng.words(n));
    let a = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let b = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let b_done = gpu.new_event().unwrap();

    // B spins then writes X (op 1) and records; A waits for the record, then writes X (op 2).
    kernels.spin(&b, SPIN_NS).unwrap();
    // SAFETY: `x` is live until the device is synchronized below.
    unsafe { kernels.hash_launch(&b, 1, 0, x.region, &[], 0) }.unwrap();
    b_done.record(&b).unwrap();
    assert!(!b_done.query().unwrap(), "B is still spinning");
    a.wait(&b_done).unwrap();
    // SAFETY: as above.
    unsafe { kernels.hash_launch(&a, 2, 0, x.region, &[], 0) }.unwrap();
    assert!(!a.query().unwrap(), "A waits for B");
    gpu.synchronize().unwrap();
    assert!(b_done.query().unwrap());
    assert_eq!(first_mismatch(&x.read(&a), &expected(2, 0, &[], n)), None);

    // The control: without the wait, A writes first and B, late, wins.
    kernels.spin(&b, SPIN_NS).unwrap();
    // SAFETY: as above.
    unsafe {
        kernels.hash_launch(&b, 3, 0, x.region, &[], 0).unwrap();
        kernels.hash_launch(&a, 4, 0, x.region, &[], 0).unwrap();
    }
    gpu.synchronize().unwrap();
    assert_eq!(first_mismatch(&x.read(&a), &expected(3, 0, &[], n)), None);
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams_only() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let n = 1 << 16;
    let mut rng = Rng(3);
    let setup = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let x = Segment::with(&gpu, &setup, &rng.words(n));
    let legacy = gpu.legacy_stream();
    assert_eq!(legacy.kind(), StreamKind::Legacy);

    // A blocking stream spins then writes (op 2); the legacy stream then writes (op 1). The legacy
    // stream waits for the blocking stream's earlier work, so its write lands last.
    let blocking = gpu.new_stream(StreamKind::Blocking).unwrap();
    let (got, _) = race(&gpu, &legacy, &blocking, &x, &[]);
    assert_eq!(
        first_mismatch(&got, &expected(1, 0, &[], n)),
        None,
        "legacy after blocking: the legacy write is last"
    );

    // The same with a non-blocking stream: no implicit wait, the spinning stream's write is last.
    let non_blocking = gpu.new_stream(StreamKind::NonBlocking).unwrap();
    let (got, running) = race(&gpu, &legacy, &non_blocking, &x, &[]);
    assert!(running);
    assert_eq!(
        first_mismatch(&got, &expected(2, 0, &[], n)),
        None,
        "legacy and non-blocking race: the late non-blocking write is last"
    );
}

#[test]
fn segments_are_returned_to_the_driver() {
    let Some((_guard, gpu)) = device() else {
        return;
    };
    let bytes = 256 << 20;
    gpu.synchronize().unwrap();
    let (free_before, total) = gpu.mem_get_info().unwrap();
    assert!(free_before <= total);
    let ptr = gpu.map_segment(bytes).unwrap();
    let (free_mapped, _) = gpu.mem_get_info().unwrap();
    gpu.unmap_segment(ptr).unwrap();
    let (free_after, _) = gpu.mem_get_info().unwrap();
    assert!(
        free_mapped + bytes / 2 <= free_before,
        "mapping {bytes} bytes lowers free memory"
    );
    assert!(free_after + bytes / 2 > free_before, "unmapping returns it");
    assert!(
        gpu.unmap_segment(ptr).is_err(),
        "a second unmap is an error"
    );
}
