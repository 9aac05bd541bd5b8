//! The GPU executor: runs fuzz programs on a real CUDA device, so that the campaign's verdicts are
//! held against what a GPU actually does.
//!
//! [`CudaExecutor`] implements [`Executor`] over the raw device layer ([`crate::cuda`]): every op
//! of a program becomes the driver call it names, on the stream it names, with no added
//! synchronization except where the run's mode asks for it.
//!
//! # One run
//!
//! Each run of a program starts from nothing and releases everything it made when it ends:
//!
//! - **Streams**: `"default"` is the legacy default stream; `stream_create` makes a blocking or
//!   non-blocking stream as it says; a stream named before any `stream_create` is non-blocking, as
//!   in the simulator. Destroyed at the end of the run.
//! - **Events**: created on first use, never recorded; `event_create` and `event_destroy` make the
//!   name never-recorded again (a fresh event).
//! - **Memory**: buffers come from the same allocator policies as the checker and the simulator
//!   ([`crate::alloc`]): device memory from [`DeviceCachingAllocator`] over segments mapped with
//!   `cuMemAlloc`, pinned memory from [`HostCachingAllocator`] over `cuMemHostAlloc` segments. So
//!   a freed block really is handed out again and really overwritten, and frees never unmap
//!   anything during a run: a late access of freed memory lands in the next owner's data and
//!   never faults. Fresh segments are zeroed (on a private stream, before the allocation returns),
//!   so reads of never-written memory see the same words in every run. All segments are unmapped
//!   once the device is idle at the end of the run; nothing is cached across runs, so device
//!   memory in use ([`CudaExecutor::device_memory_in_use`]) returns to its starting value.
//! - **Placed memory**: allocations with `addr` (the compressed addresses of
//!   [`crate::fuzz::runnable`], which `check --confirm` runs recorded traces through) lie in one
//!   segment per memory kind, mapped and zeroed before the run (managed memory is pinned memory
//!   here); device memory that comes back on another stream than the one its free gave it to
//!   synchronizes the device at its `alloc`, as the trace format says.
//! - **`record_stream`**: as in the simulator, a free records a fence event on every stream
//!   recorded for the buffer; every later access of memory that reuses the freed bytes waits for
//!   those fences first (a stream op with `cuStreamWaitEvent`, a host access with
//!   `cuEventSynchronize`).
//!
//! Kernels are those of [`crate::kernels`]: a launch at op index `i` runs `hash_launch` with
//! `op_id = i` once per write region `j`, reads in order (the first [`MAX_READS`] of them; every
//! read region is observed); a memset writes
//! [`memset_word`]`(i)`; a copy is the `copy_words` kernel; a host write writes
//! [`hash_word`]`(i, 0, k, [])` at word `k`.
//!
//! # What a run observes
//!
//! Kernels do not report what they read, so the run observes memory around each op, on the op's
//! own stream, with the `checksum` kernel into one `u64` slot per observation of a device array
//! zeroed at the start of the run:
//!
//! - each read region `k` of a launch or copy (the copy's source is region 0) is checksummed just
//!   before and just after the op; both go into [`Outcome::reads`] under `(op, k)`, named by the
//!   read buffer — whatever the op read differently, the window around it saw differently too;
//! - each write region `j` of a launch (a copy's or memset's destination is region 0) is
//!   checksummed just after the op, under `(op, WRITE_KEY + j)`, named by the written buffer;
//! - a host read is checksummed on the host, under `(op, 0)`;
//! - at the end, after the device is idle, [`Outcome::live`] holds the checksum of every live
//!   buffer. [`Outcome::written`] stays empty.
//!
//! The observations are enqueued right next to the op on its stream, so whatever a program orders
//! after the op is ordered after them too: they add no race of their own. Runs are only ever
//! compared with other runs on the device, never with the simulator.
//!
//! # Schedules
//!
//! - [`Executor::reference`]: issue order, the device synchronized after every op.
//! - [`Executor::random`]: the program as written. The seed only adds timing noise: before about
//!   one stream op in four, a `spin` kernel of up to 100 µs on the op's stream (a delay, never an
//!   ordering).
//! - [`Executor::provoke`]: every held op of a stream is preceded on its stream by a `spin` kernel
//!   of 1 to 4 ms (chosen by the seed), so that the ops that are not ordered after it run first. A
//!   held host op (host read or write, allocation) cannot be delayed on the device and is not.
//!
//! # Errors
//!
//! Every failure — a driver error, an allocation the device cannot serve, an op this executor does
//! not support, even a panic inside the driver bindings — is a [`SimError::Unsupported`] whose
//! message starts with `CUDA`, never a panic. A kernel fault leaves the CUDA context unusable, and
//! every later run then fails with the driver's error.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator, Memory};
use crate::cuda::{DeviceRegion, Event, Gpu, GpuError, Kernels, PinnedBuffer, Stream, StreamKind};
use crate::fuzz::campaign::Executor;
use crate::fuzz::runnable::BASES;
use crate::kernels::{checksum, hash_word, memset_word, MAX_READS};
use crate::sim::{Outcome, SimError};
use crate::trace::{Id, MemoryKind, Op, Region, TraceOp, DEFAULT_STREAM};
use crate::workload::SplitMix;

/// The second half of an [`Outcome::reads`] key for write region `j` of an op is
/// `WRITE_KEY + j`; read regions use their own index `k < WRITE_KEY`.
pub const WRITE_KEY: usize = 1 << 16;

/// The [`Outcome::reads`] key of a free's view of the freed buffer's final contents.
pub const FREE_KEY: usize = 2 << 16;

/// Shortest delay of a held op under [`Executor::provoke`], in nanoseconds.
pub const PROVOKE_SPIN_NS: u64 = 1_000_000;

/// Longest timing noise before an op under [`Executor::random`], in nanoseconds.
pub const RANDOM_JITTER_NS: u64 = 100_000;

/// Runs fuzz programs on one CUDA device. See the module docs for what a run does.
#[derive(Debug)]
pub struct CudaExecutor {
    gpu: Gpu,
    runs: u64,
}

impl CudaExecutor {
    /// Opens device `ordinal` and compiles the kernels (NVRTC), so that a campaign fails here,
    /// with a clear message, rather than at its first program.
    pub fn new(ordinal: usize) -> Result<Self, String> {
        let gpu = guard(|| Gpu::open(ordinal).map_err(|e| e.to_string()))
            .and_then(|r| r)
            .map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
        guard(|| gpu.kernels().map(|_| ()).map_err(|e| e.to_string()))
            .and_then(|r| r)
            .map_err(|e| format!("CUDA device {ordinal}: cannot load the kernels: {e}"))?;
        Ok(CudaExecutor { gpu, runs: 0 })
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Runs made so far (successful or not).
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Device memory in use, in bytes: total minus free as `cuMemGetInfo` reports them, for the
    /// whole device (other processes included). The executor caches no segments between runs, so
    /// between runs this is what it was before the first (up to the driver's own bookkeeping).
    pub fn try_device_memory_in_use(&self) -> Result<u64, String> {
        let (free, total) = self
            .gpu
            .mem_get_info()
            .map_err(|e| format!("CUDA: cuMemGetInfo: {e}"))?;
        Ok(total.saturating_sub(free) as u64)
    }

    /// [`CudaExecutor::try_device_memory_in_use`], or `u64::MAX` when the driver cannot say.
    pub fn device_memory_in_use(&self) -> u64 {
        self.try_device_memory_in_use().unwrap_or(u64::MAX)
    }

    /// Bytes of device memory this executor keeps cached between runs: always 0.
    pub fn cached_bytes(&self) -> u64 {
        0
    }

    fn execute(&mut self, program: &[TraceOp], mode: Mode) -> Result<Outcome, SimError> {
        self.runs += 1;
        let gpu = &self.gpu;
        guard(|| execute(gpu, program, mode)).unwrap_or_else(|panic| {
            Err(SimError::Unsupported {
                op: 0,
                message: format!("CUDA: the driver bindings panicked: {panic}"),
            })
        })
    }
}

impl Executor for CudaExecutor {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn reference(&mut self, program: &[TraceOp]) -> Result<Outcome, SimError> {
        self.execute(program, Mode::Reference)
    }

    fn random(&mut self, program: &[TraceOp], seed: u64) -> Result<Outcome, SimError> {
        self.execute(program, Mode::Random(SplitMix::new(seed)))
    }

    fn provoke(
        &mut self,
        program: &[TraceOp],
        holds: &[(usize, usize)],
        seed: u64,
    ) -> Result<Outcome, SimError> {
        let held = holds.iter().map(|&(h, _)| h).collect();
        self.execute(
            program,
            Mode::Provoke {
                held,
                spin_ns: provoke_spin_ns(seed),
            },
        )
    }
}

/// The delay of held ops for a provocation with `seed`: 1, 2, 3 or 4 ms.
pub fn provoke_spin_ns(seed: u64) -> u64 {
    PROVOKE_SPIN_NS * (1 + seed % 4)
}

/// Runs `f`, turning a panic into its message.
fn guard<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".to_owned())
    })
}

/// How a run is scheduled.
enum Mode {
    /// Synchronize the device after every op.
    Reference,
    /// The program as written, with seeded timing noise.
    Random(SplitMix),
    /// Delay the held ops by `spin_ns`.
    Provoke { held: BTreeSet<usize>, spin_ns: u64 },
}

fn unsupported(op: usize, message: impl std::fmt::Display) -> SimError {
    SimError::Unsupported {
        op,
        message: format!("CUDA: {message}"),
    }
}

/// A driver error at op `op`, while doing `what`.
fn driver(op: usize, what: &'static str) -> impl FnOnce(GpuError) -> SimError {
    move |e| unsupported(op, format!("{what}: {e}"))
}

/// Runs `program` once and releases everything the run made, on success and on error.
fn execute(gpu: &Gpu, program: &[TraceOp], mode: Mode) -> Result<Outcome, SimError> {
    let kernels = gpu.kernels().map_err(driver(0, "loading the kernels"))?;
    let mut run = Run::new(gpu, kernels, program, mode)?;
    let result = run.play().and_then(|()| run.collect());
    let released = run.release();
    let outcome = result?;
    released?;
    Ok(outcome)
}

/// Device segments of one run, zeroed when mapped, unmapped by [`DeviceSegments::release`].
struct DeviceSegments<'g> {
    gpu: &'g Gpu,
    /// A private non-blocking stream for zeroing fresh segments: it orders nothing of the program.
    zero: Stream,
    mapped: Vec<u64>,
    /// Segments mapped before the run, handed out in order: mapping memory during a run
    /// (`cuMemAlloc`) may synchronize the device, an ordering the program does not have.
    prepared: std::collections::VecDeque<(u64, u64)>,
}

impl<'g> DeviceSegments<'g> {
    fn new(gpu: &'g Gpu) -> Result<Self, GpuError> {
        Ok(DeviceSegments {
            gpu,
            zero: gpu.new_stream(StreamKind::NonBlocking)?,
            mapped: Vec::new(),
            prepared: std::collections::VecDeque::new(),
        })
    }

    /// Maps `bytes` (a positive multiple of 4) and zeroes them before returning.
    fn map_zeroed(&mut self, bytes: u64) -> Result<u64, GpuError> {
        let size = usize::try_from(bytes).map_err(|_| {
            GpuError::InvalidArgument(format!("a segment of {bytes} bytes does not fit usize"))
        })?;
        let base = self.gpu.map_segment(size)?;
        self.mapped.push(base);
        let region = DeviceRegion::from_bytes(base, size)?;
        // SAFETY: the segment was just mapped for this run and nothing else uses it yet; it stays
        // mapped until `release`, which first waits for the device to be idle.
        unsafe { self.zero.memset_d32(region, 0) }?;
        self.zero.synchronize()?;
        Ok(base)
    }

    /// Unmaps every segment. The caller has synchronized the device.
    fn release(&mut self) -> Result<(), GpuError> {
        let mut first = Ok(());
        for base in self.mapped.drain(..) {
            if let Err(e) = self.gpu.unmap_segment(base) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Drop for DeviceSegments<'_> {
    fn drop(&mut self) {
        if !self.mapped.is_empty() {
            // Only after an early exit: wait for the device so nothing in flight uses the memory.
            let _ = self.gpu.synchronize();
            let _ = self.release();
        }
    }
}

/// The next segment mapped before the run, if it has the requested size.
fn take_prepared(prepared: &mut std::collections::VecDeque<(u64, u64)>, bytes: u64) -> Option<u64> {
    match prepared.front() {
        Some(&(size, base)) if size == bytes => {
            prepared.pop_front();
            Some(base)
        }
        _ => None,
    }
}

impl Memory for DeviceSegments<'_> {
    type Error = GpuError;
    fn map_segment(&mut self, bytes: u64) -> Result<u64, GpuError> {
        match take_prepared(&mut self.prepared, bytes) {
            Some(base) => Ok(base),
            None => self.map_zeroed(bytes),
        }
    }
}

/// The sizes of the device and pinned segments the allocator policies will ask for while
/// `program` runs, found by running the policies over a model address space.
fn segments_needed(program: &[TraceOp]) -> (Vec<u64>, Vec<u64>) {
    struct Sizes(crate::alloc::ModelMemory, Vec<u64>);
    impl Memory for Sizes {
        type Error = <crate::alloc::ModelMemory as Memory>::Error;
        fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
            self.1.push(bytes);
            self.0.map_segment(bytes)
        }
    }
    let mut device =
        DeviceCachingAllocator::new(Sizes(crate::alloc::ModelMemory::new(1 << 40), Vec::new()));
    let mut pinned =
        HostCachingAllocator::new(Sizes(crate::alloc::ModelMemory::new(1 << 40), Vec::new()));
    let mut keys: HashMap<Id, u32> = HashMap::new();
    let mut key = |s: Option<&Id>| {
        let name = s.cloned().unwrap_or_else(|| Id::from(DEFAULT_STREAM));
        let n = keys.len() as u32;
        *keys.entry(name).or_insert(n)
    };
    let mut live: HashMap<Id, (MemoryKind, u64)> = HashMap::new();
    for op in program {
        match &op.op {
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                ..
            } => {
                let block = match memory {
                    MemoryKind::Device => {
                        device.allocate(*bytes, key(stream.as_ref())).ok().flatten()
                    }
                    _ => pinned.allocate(*bytes).ok().flatten(),
                };
                if let Some(b) = block {
                    live.insert(buffer.clone(), (*memory, b.addr));
                }
            }
            Op::Free { buffer, stream } => {
                if let Some((memory, addr)) = live.remove(buffer) {
                    let _ = match (memory, stream) {
                        (MemoryKind::Device, Some(s)) => device.free(addr, key(Some(s))),
                        (MemoryKind::Device, None) => device.free_caching(addr),
                        _ => pinned.free(addr),
                    };
                }
            }
            _ => {}
        }
    }
    (device.into_memory().1, pinned.into_memory().1)
}

/// The most bytes of placed memory of one kind a run maps.
pub const MAX_PLACED_BYTES: u64 = 4 << 30;

/// The bytes each memory kind's placed memory spans: the highest end of an allocation with
/// `addr`, from its kind's base ([`BASES`]).
fn placed_extents(program: &[TraceOp]) -> [u64; 3] {
    let mut extent = [0u64; 3];
    for op in program {
        if let Op::Alloc {
            bytes,
            memory,
            addr: Some(a),
            ..
        } = &op.op
        {
            if *bytes > 0 {
                let k = memory.index();
                let end = a.saturating_sub(BASES[k]).saturating_add(*bytes);
                extent[k] = extent[k].max(end.next_multiple_of(4));
            }
        }
    }
    extent
}

/// Pinned segments of one run, by device address (`cuMemHostAlloc` zeroes them).
struct PinnedSegments<'g> {
    gpu: &'g Gpu,
    segments: BTreeMap<u64, PinnedBuffer>,
    /// Segments allocated before the run, handed out in order (see [`DeviceSegments`]).
    prepared: std::collections::VecDeque<(u64, u64)>,
}

impl PinnedSegments<'_> {
    /// The host address of the `words` words at device address `addr`, if a segment holds them.
    fn host_ptr(&mut self, addr: u64, words: u32) -> Option<*mut u32> {
        let (&base, buf) = self.segments.range_mut(..=addr).next_back()?;
        let offset = addr - base;
        let end = offset.checked_add(4 * u64::from(words))?;
        if offset % 4 != 0 || end > buf.bytes() as u64 {
            return None;
        }
        // SAFETY: `offset` lies within the buffer (checked above).
        Some(unsafe { buf.as_mut_ptr().cast::<u32>().add((offset / 4) as usize) })
    }
}

impl PinnedSegments<'_> {
    fn map_fresh(&mut self, bytes: u64) -> Result<u64, GpuError> {
        let size = usize::try_from(bytes).map_err(|_| {
            GpuError::InvalidArgument(format!("a segment of {bytes} bytes does not fit usize"))
        })?;
        let buf = self.gpu.alloc_pinned(size)?;
        let base = buf.device_ptr();
        self.segments.insert(base, buf);
        Ok(base)
    }
}

impl Memory for PinnedSegments<'_> {
    type Error = GpuError;
    fn map_segment(&mut self, bytes: u64) -> Result<u64, GpuError> {
        match take_prepared(&mut self.prepared, bytes) {
            Some(base) => Ok(base),
            None => self.map_fresh(bytes),
        }
    }
}

/// A live buffer.
#[derive(Clone, Debug)]
struct Buffer {
    memory: MemoryKind,
    addr: u64,
    size: u64,
    /// The owning stream (the allocation's).
    owner: usize,
    /// Whether the program placed it (`addr`) rather than the allocator.
    placed: bool,
    /// `record_stream` fences of the freed buffers whose bytes it reuses.
    fences: Vec<Rc<Event>>,
}

/// A freed range and the fences its reuse must wait for.
struct Freed {
    memory: MemoryKind,
    addr: u64,
    size: u64,
    fences: Vec<Rc<Event>>,
}

/// A region resolved to memory.
#[derive(Clone, Debug)]
struct Span {
    buffer: Id,
    memory: MemoryKind,
    region: DeviceRegion,
}

/// One observation of [`Outcome::reads`].
enum Observed {
    /// Checksum slots of the device array, combined.
    Slots(Vec<usize>),
    /// A checksum taken on the host.
    Value(u64),
}

/// One run of a program.
struct Run<'g> {
    gpu: &'g Gpu,
    k: &'g Kernels,
    program: &'g [TraceOp],
    mode: Mode,
    device: DeviceCachingAllocator<DeviceSegments<'g>>,
    pinned: HostCachingAllocator<PinnedSegments<'g>>,
    /// Index 0 is the legacy default stream.
    streams: Vec<Stream>,
    stream_ids: HashMap<Id, usize>,
    /// Streams replaced by a later `stream_create` of the same name: kept until the end.
    retired: Vec<Stream>,
    events: HashMap<Id, Event>,
    buffers: HashMap<Id, Buffer>,
    freed: Vec<Freed>,
    /// Where memory the program places (`addr`) lies, per memory kind: the real base of the
    /// segment that holds it and its size (managed memory is pinned memory here).
    placed: [Option<(u64, u64)>; 3],
    /// Placed device memory freed and not yet allocated again: start → (end, the stream its
    /// free gave it to).
    freed_to: BTreeMap<u64, (u64, usize)>,
    record_streams: HashMap<Id, Vec<usize>>,
    /// The device array of checksum slots (`u64` each) and how many there are.
    slots: u64,
    slot_count: usize,
    next_slot: usize,
    observed: Vec<((usize, usize), Id, Observed)>,
}

/// Checksum slots an op needs: reads before and after, and each write region.
fn slots_of(op: &Op) -> usize {
    match op {
        Op::Launch { reads, writes, .. } => 2 * reads.len() + writes.len(),
        Op::Copy { .. } => 3,
        Op::Memset { .. } | Op::Free { .. } => 1,
        _ => 0,
    }
}

impl<'g> Run<'g> {
    fn new(
        gpu: &'g Gpu,
        k: &'g Kernels,
        program: &'g [TraceOp],
        mode: Mode,
    ) -> Result<Self, SimError> {
        let setup = |e: GpuError| unsupported(0, format!("setting up the run: {e}"));
        let mut segments = DeviceSegments::new(gpu).map_err(setup)?;
        let slot_count = program.iter().map(|o| slots_of(&o.op)).sum::<usize>();
        let slots = segments
            .map_zeroed(8 * slot_count.max(1) as u64)
            .map_err(setup)?;
        let (device_sizes, pinned_sizes) = segments_needed(program);
        for size in device_sizes {
            let base = segments.map_zeroed(size).map_err(setup)?;
            segments.prepared.push_back((size, base));
        }
        let mut pinned = PinnedSegments {
            gpu,
            segments: BTreeMap::new(),
            prepared: std::collections::VecDeque::new(),
        };
        for size in pinned_sizes {
            let base = pinned.map_fresh(size).map_err(setup)?;
            pinned.prepared.push_back((size, base));
        }
        let mut placed = [None; 3];
        for (k, extent) in placed_extents(program).into_iter().enumerate() {
            if extent == 0 {
                continue;
            }
            if extent > MAX_PLACED_BYTES {
                return Err(unsupported(
                    0,
                    format!("the program places {extent} bytes of memory of one kind; at most {MAX_PLACED_BYTES} are run"),
                ));
            }
            let base = if k == MemoryKind::Device.index() {
                segments.map_zeroed(extent).map_err(setup)?
            } else {
                pinned.map_fresh(extent).map_err(setup)?
            };
            placed[k] = Some((base, extent));
        }
        let mut run = Run {
            gpu,
            k,
            program,
            mode,
            device: DeviceCachingAllocator::new(segments),
            pinned: HostCachingAllocator::new(pinned),
            streams: vec![gpu.legacy_stream()],
            stream_ids: HashMap::new(),
            retired: Vec::new(),
            events: HashMap::new(),
            buffers: HashMap::new(),
            freed: Vec::new(),
            placed,
            freed_to: BTreeMap::new(),
            record_streams: HashMap::new(),
            slots,
            slot_count,
            next_slot: 0,
            observed: Vec::new(),
        };
        run.stream_ids.insert(Id::from(DEFAULT_STREAM), 0);
        Ok(run)
    }

    /// Issues every op.
    fn play(&mut self) -> Result<(), SimError> {
        for i in 0..self.program.len() {
            self.issue(i)?;
            if matches!(self.mode, Mode::Reference) {
                self.gpu
                    .synchronize()
                    .map_err(driver(i, "synchronizing after the op"))?;
            }
        }
        Ok(())
    }

    /// After the last op: waits for the device, reads the slots, checksums the live buffers.
    fn collect(&mut self) -> Result<Outcome, SimError> {
        let end = self.program.len();
        self.gpu
            .synchronize()
            .map_err(driver(end, "synchronizing at the end of the run"))?;
        let reader = &self.device.memory().zero;
        let words = u32::try_from(2 * self.slot_count)
            .map_err(|_| unsupported(end, "too many checksum slots"))?;
        // SAFETY: the slot array is mapped until `release`, and the device is idle.
        let raw = unsafe { reader.read_words(DeviceRegion::new(self.slots, words)) }
            .map_err(driver(end, "reading the checksum slots"))?;
        let slot = |s: usize| -> u64 {
            let lo = raw.get(2 * s).copied().unwrap_or(0);
            let hi = raw.get(2 * s + 1).copied().unwrap_or(0);
            u64::from(lo) | (u64::from(hi) << 32)
        };
        let mut outcome = Outcome {
            steps: end,
            ..Outcome::default()
        };
        for (key, buffer, obs) in std::mem::take(&mut self.observed) {
            let value = match obs {
                Observed::Value(v) => v,
                Observed::Slots(s) => s.iter().fold(0u64, |acc, &x| acc.rotate_left(17) ^ slot(x)),
            };
            outcome.reads.insert(key, (buffer, value));
        }
        let mut live: Vec<(Id, Buffer)> = self
            .buffers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        live.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, b) in live {
            let words = u32::try_from(b.size / 4)
                .map_err(|_| unsupported(end, format!("buffer {name} is too large")))?;
            let data = self.read_back(end, b.memory, DeviceRegion::new(b.addr, words))?;
            outcome.live.insert(name, checksum(&data));
        }
        Ok(outcome)
    }

    /// The words of a region, with the device idle.
    fn read_back(
        &mut self,
        op: usize,
        memory: MemoryKind,
        region: DeviceRegion,
    ) -> Result<Vec<u32>, SimError> {
        if region.words == 0 {
            return Ok(Vec::new());
        }
        match memory {
            MemoryKind::Device => {
                let reader = &self.device.memory().zero;
                // SAFETY: the region lies in a segment of this run, mapped until `release`.
                unsafe { reader.read_words(region) }.map_err(driver(op, "reading a buffer back"))
            }
            _ => {
                let p = self.host_ptr(op, region)?;
                Ok(read_host(p, region.words))
            }
        }
    }

    /// Waits for the device and unmaps everything; drops streams and events.
    fn release(&mut self) -> Result<(), SimError> {
        let end = self.program.len();
        let synced = self.gpu.synchronize().map_err(driver(
            end,
            "synchronizing before releasing the run's memory",
        ));
        self.events.clear();
        self.freed.clear();
        self.buffers.clear();
        self.retired.clear();
        self.streams.truncate(1);
        let unmapped = self
            .device
            .memory_mut()
            .release()
            .map_err(driver(end, "unmapping the run's device memory"));
        // Pinned segments go with the allocator's memory when the run is dropped; free them now.
        self.pinned.memory_mut().segments.clear();
        synced.and(unmapped)
    }

    /// The real address of memory the program placed at `addr` (compressed, see
    /// [`crate::fuzz::runnable`]); device memory that comes back on another stream than the one
    /// its free gave it to went back to the driver, which synchronizes the device.
    fn place(
        &mut self,
        i: usize,
        memory: MemoryKind,
        addr: u64,
        bytes: u64,
        owner: usize,
    ) -> Result<u64, SimError> {
        let base = BASES[memory.index()];
        let (real, extent) = self.placed[memory.index()]
            .ok_or_else(|| unsupported(i, "placed memory without its segment"))?;
        let offset = addr
            .checked_sub(base)
            .filter(|o| o.checked_add(bytes).is_some_and(|e| e <= extent))
            .ok_or_else(|| {
                unsupported(
                    i,
                    format!(
                        "{} memory at {addr:#x} is outside the placed memory",
                        memory.as_str()
                    ),
                )
            })?;
        let real = real + offset;
        if memory == MemoryKind::Device && self.reappears(real, real + bytes, owner) {
            self.gpu.synchronize().map_err(driver(
                i,
                "synchronizing the device for memory that came back",
            ))?;
        }
        Ok(real)
    }

    /// Whether placed device memory `[start, end)`, allocated on stream `owner`, was last freed
    /// to another stream.
    fn reappears(&mut self, start: u64, end: u64, owner: usize) -> bool {
        let overlapped: Vec<(u64, u64, usize)> = self
            .freed_to
            .range(..end)
            .filter(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, p))| (s, e, p))
            .collect();
        let mut other = false;
        for (s, e, p) in overlapped {
            other |= p != owner;
            self.freed_to.remove(&s);
            if s < start {
                self.freed_to.insert(s, (start, p));
            }
            if e > end {
                self.freed_to.insert(end, (e, p));
            }
        }
        other
    }

    fn host_ptr(&mut self, op: usize, region: DeviceRegion) -> Result<*mut u32, SimError> {
        self.pinned
            .memory_mut()
            .host_ptr(region.ptr, region.words)
            .ok_or_else(|| unsupported(op, "a host access outside pinned memory"))
    }

    fn stream(&mut self, op: usize, id: &Id) -> Result<usize, SimError> {
        if let Some(&s) = self.stream_ids.get(id) {
            return Ok(s);
        }
        let s = self
            .gpu
            .new_stream(StreamKind::NonBlocking)
            .map_err(driver(op, "creating a stream"))?;
        self.streams.push(s);
        self.stream_ids.insert(id.clone(), self.streams.len() - 1);
        Ok(self.streams.len() - 1)
    }

    fn event(&mut self, op: usize, id: &Id) -> Result<&Event, SimError> {
        if !self.events.contains_key(id) {
            let e = self
                .gpu
                .new_event()
                .map_err(driver(op, "creating an event"))?;
            self.events.insert(id.clone(), e);
        }
        self.events
            .get(id)
            .ok_or_else(|| unsupported(op, "event table"))
    }

    fn span(&self, op: usize, r: &Region) -> Result<Span, SimError> {
        let b = self.buffers.get(&r.buffer).ok_or_else(|| {
            unsupported(
                op,
                format!("buffer {} is not allocated (external or freed)", r.buffer),
            )
        })?;
        let bytes = r.bytes.unwrap_or(b.size.saturating_sub(r.offset));
        let inside = r.offset.checked_add(bytes).is_some_and(|e| e <= b.size);
        if r.offset % 4 != 0 || bytes % 4 != 0 || !inside {
            return Err(unsupported(
                op,
                format!(
                    "region of {} is not whole 4-byte words inside the buffer",
                    r.buffer
                ),
            ));
        }
        let words = u32::try_from(bytes / 4)
            .map_err(|_| unsupported(op, format!("region of {} is too large", r.buffer)))?;
        Ok(Span {
            buffer: r.buffer.clone(),
            memory: b.memory,
            region: DeviceRegion::new(b.addr + r.offset, words),
        })
    }

    /// The fences of the buffers of `regions`.
    fn fences(&self, regions: &[&Region]) -> Vec<Rc<Event>> {
        let mut v: Vec<Rc<Event>> = Vec::new();
        for r in regions {
            if let Some(b) = self.buffers.get(&r.buffer) {
                for f in &b.fences {
                    if !v.iter().any(|x| Rc::ptr_eq(x, f)) {
                        v.push(f.clone());
                    }
                }
            }
        }
        v
    }

    /// Before a stream op: fence waits, then the mode's delay.
    fn prepare(&mut self, i: usize, s: usize, regions: &[&Region]) -> Result<(), SimError> {
        for f in self.fences(regions) {
            self.streams[s]
                .wait(&f)
                .map_err(driver(i, "waiting for a record_stream fence"))?;
        }
        let spin = match &mut self.mode {
            Mode::Reference => 0,
            Mode::Random(rng) => {
                if rng.below(4) == 0 {
                    rng.below(RANDOM_JITTER_NS + 1)
                } else {
                    0
                }
            }
            Mode::Provoke { held, spin_ns } => {
                if held.contains(&i) {
                    *spin_ns
                } else {
                    0
                }
            }
        };
        if spin > 0 {
            self.k
                .spin(&self.streams[s], spin)
                .map_err(driver(i, "delaying the op"))?;
        }
        Ok(())
    }

    /// Enqueues a checksum of `span` on stream `s` into a fresh slot.
    fn checksum_slot(&mut self, i: usize, s: usize, span: &Span) -> Result<usize, SimError> {
        let slot = self.next_slot;
        if slot >= self.slot_count {
            return Err(unsupported(i, "ran out of checksum slots"));
        }
        self.next_slot += 1;
        let out = self.slots + 8 * slot as u64;
        // SAFETY: the span lies in a live buffer of this run and the slot in the slot array; both
        // stay mapped until `release`, which waits for the device first.
        unsafe { self.k.checksum(&self.streams[s], span.region, out) }
            .map_err(driver(i, "enqueuing a checksum"))?;
        Ok(slot)
    }

    fn observe(&mut self, i: usize, k: usize, buffer: &Id, obs: Observed) {
        self.observed.push(((i, k), buffer.clone(), obs));
    }

    /// Waits on the host for the fences of `regions`.
    fn host_fences(&self, i: usize, regions: &[&Region]) -> Result<(), SimError> {
        for f in self.fences(regions) {
            f.synchronize()
                .map_err(driver(i, "waiting for a record_stream fence"))?;
        }
        Ok(())
    }

    /// The host issues op `i`.
    fn issue(&mut self, i: usize) -> Result<(), SimError> {
        let program = self.program;
        match &program[i].op {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                if *device != 0 {
                    return Err(unsupported(
                        i,
                        format!("stream {stream} on device {device}: only device 0 is supported"),
                    ));
                }
                if stream.as_str() == DEFAULT_STREAM {
                    return Ok(());
                }
                let kind = if *blocking {
                    StreamKind::Blocking
                } else {
                    StreamKind::NonBlocking
                };
                if let Some(&s) = self.stream_ids.get(stream) {
                    if self.streams[s].kind() == kind {
                        return Ok(());
                    }
                    let fresh = self
                        .gpu
                        .new_stream(kind)
                        .map_err(driver(i, "creating a stream"))?;
                    let old = std::mem::replace(&mut self.streams[s], fresh);
                    self.retired.push(old);
                } else {
                    let fresh = self
                        .gpu
                        .new_stream(kind)
                        .map_err(driver(i, "creating a stream"))?;
                    self.streams.push(fresh);
                    self.stream_ids
                        .insert(stream.clone(), self.streams.len() - 1);
                }
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
            } => {
                if bytes % 4 != 0 {
                    return Err(unsupported(
                        i,
                        format!("buffer {buffer} of {bytes} bytes is not whole 4-byte words"),
                    ));
                }
                let key = match stream {
                    Some(s) => self.stream(i, s)?,
                    None => 0,
                };
                let owner = key;
                let key = u32::try_from(key).map_err(|_| unsupported(i, "too many streams"))?;
                let placed = addr.is_some() && *bytes > 0;
                let addr = match addr {
                    Some(a) if *bytes > 0 => self.place(i, *memory, *a, *bytes, owner)?,
                    _ => {
                        let block = match memory {
                            MemoryKind::Device => self
                                .device
                                .allocate(*bytes, key)
                                .map_err(|e| unsupported(i, format!("allocating {buffer}: {e}")))?,
                            MemoryKind::Pinned => self
                                .pinned
                                .allocate(*bytes)
                                .map_err(|e| unsupported(i, format!("allocating {buffer}: {e}")))?,
                            MemoryKind::Managed => {
                                return Err(unsupported(
                                    i,
                                    "managed memory is run only where the program places it",
                                ))
                            }
                        };
                        block.map(|b| b.addr).unwrap_or(0)
                    }
                };
                let end = addr + bytes;
                let mut fences: Vec<Rc<Event>> = Vec::new();
                for f in self
                    .freed
                    .iter()
                    .filter(|f| f.memory == *memory && f.addr < end && addr < f.addr + f.size)
                {
                    for e in &f.fences {
                        if !fences.iter().any(|x| Rc::ptr_eq(x, e)) {
                            fences.push(e.clone());
                        }
                    }
                }
                self.buffers.insert(
                    buffer.clone(),
                    Buffer {
                        memory: *memory,
                        addr,
                        size: *bytes,
                        owner,
                        placed,
                        fences,
                    },
                );
                self.record_streams.remove(buffer);
            }
            Op::Free { buffer, stream } => {
                // The buffer's final contents, seen by the freeing participant at the free: what
                // its program left there (a write the free is not ordered after is an unsafe free).
                // Not where the observation itself would need or add ordering: with record_stream
                // (the free is ordered after the recorded streams, the freeing stream is not), with
                // fences of earlier owners, or on the legacy stream (whose implicit edges would
                // order blocking streams that the program leaves unordered).
                let recorded = self
                    .record_streams
                    .get(buffer)
                    .is_some_and(|v| !v.is_empty());
                if let Some(b) = self
                    .buffers
                    .get(buffer)
                    .cloned()
                    .filter(|b| !recorded && b.fences.is_empty())
                {
                    if b.size > 0 && b.size % 4 == 0 {
                        let whole = Region::whole(buffer.clone());
                        let sp = self.span(i, &whole)?;
                        if b.memory == MemoryKind::Device {
                            let s = match stream {
                                Some(s) => self.stream(i, s)?,
                                None => b.owner,
                            };
                            if s != 0 {
                                let out = self.checksum_slot(i, s, &sp)?;
                                self.observe(i, FREE_KEY, &sp.buffer, Observed::Slots(vec![out]));
                            }
                        } else if stream.is_none() {
                            let p = self.host_ptr(i, sp.region)?;
                            let words = read_host(p, sp.region.words);
                            self.observe(
                                i,
                                FREE_KEY,
                                &sp.buffer,
                                Observed::Value(checksum(&words)),
                            );
                        }
                    }
                }
                let Some(b) = self.buffers.remove(buffer) else {
                    return Ok(());
                };
                let recorded = self.record_streams.remove(buffer).unwrap_or_default();
                let mut fences = b.fences.clone();
                for s in recorded {
                    let e = self
                        .gpu
                        .new_event()
                        .map_err(driver(i, "creating a record_stream fence"))?;
                    e.record(&self.streams[s])
                        .map_err(driver(i, "recording a record_stream fence"))?;
                    fences.push(Rc::new(e));
                }
                let free_stream = match stream {
                    Some(s) => Some(self.stream(i, s)?),
                    None => None,
                };
                if b.size > 0 {
                    let to = free_stream.unwrap_or(b.owner);
                    if b.placed {
                        if b.memory == MemoryKind::Device {
                            self.freed_to.insert(b.addr, (b.addr + b.size, to));
                        }
                    } else {
                        let freed = match b.memory {
                            MemoryKind::Device => {
                                let key = u32::try_from(to)
                                    .map_err(|_| unsupported(i, "too many streams"))?;
                                self.device.free(b.addr, key)
                            }
                            _ => self.pinned.free(b.addr),
                        };
                        freed.map_err(|e| unsupported(i, format!("freeing {buffer}: {e}")))?;
                    }
                    self.freed.push(Freed {
                        memory: b.memory,
                        addr: b.addr,
                        size: b.size,
                        fences,
                    });
                }
            }
            Op::RecordStream { buffer, stream } => {
                let s = self.stream(i, stream)?;
                self.record_streams
                    .entry(buffer.clone())
                    .or_default()
                    .push(s);
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                let s = self.stream(i, stream)?;
                let r: Vec<Span> = reads
                    .iter()
                    .map(|x| self.span(i, x))
                    .collect::<Result<_, _>>()?;
                let w: Vec<Span> = writes
                    .iter()
                    .map(|x| self.span(i, x))
                    .collect::<Result<_, _>>()?;
                let all: Vec<&Region> = reads.iter().chain(writes).collect();
                self.prepare(i, s, &all)?;
                let before: Vec<usize> = r
                    .iter()
                    .map(|x| self.checksum_slot(i, s, x))
                    .collect::<Result<_, _>>()?;
                // The kernel hashes at most MAX_READS read regions into its writes; every read
                // region is observed all the same.
                let read_regions: Vec<DeviceRegion> =
                    r.iter().take(MAX_READS).map(|x| x.region).collect();
                let op_id = u32::try_from(i).map_err(|_| unsupported(i, "op index too large"))?;
                for (j, out) in w.iter().enumerate() {
                    // SAFETY: every region lies in a live buffer of this run, mapped until
                    // `release`; the generator's write regions overlap a read region only as the
                    // identical region (word for word).
                    unsafe {
                        self.k.hash_launch(
                            &self.streams[s],
                            op_id,
                            j as u32,
                            out.region,
                            &read_regions,
                            0,
                        )
                    }
                    .map_err(driver(i, "launching hash_launch"))?;
                }
                for (k, (x, pre)) in r.iter().zip(before).enumerate() {
                    let post = self.checksum_slot(i, s, x)?;
                    self.observe(i, k, &x.buffer, Observed::Slots(vec![pre, post]));
                }
                for (j, x) in w.iter().enumerate() {
                    let slot = self.checksum_slot(i, s, x)?;
                    self.observe(i, WRITE_KEY + j, &x.buffer, Observed::Slots(vec![slot]));
                }
            }
            Op::Copy { stream, src, dst } => {
                let s = self.stream(i, stream)?;
                let (a, b) = (self.span(i, src)?, self.span(i, dst)?);
                if a.region.words != b.region.words {
                    return Err(unsupported(i, "copy regions of different lengths"));
                }
                let (a0, a1) = (a.region.ptr, a.region.ptr + 4 * u64::from(a.region.words));
                let (b0, b1) = (b.region.ptr, b.region.ptr + 4 * u64::from(b.region.words));
                if a0 < b1 && b0 < a1 {
                    return Err(unsupported(i, "overlapping copy regions"));
                }
                self.prepare(i, s, &[src, dst])?;
                let pre = self.checksum_slot(i, s, &a)?;
                // SAFETY: both regions lie in live buffers of this run, mapped until `release`,
                // and do not overlap (checked above).
                unsafe { self.k.copy_words(&self.streams[s], b.region, a.region.ptr) }
                    .map_err(driver(i, "enqueuing a copy"))?;
                let post = self.checksum_slot(i, s, &a)?;
                let out = self.checksum_slot(i, s, &b)?;
                self.observe(i, 0, &a.buffer, Observed::Slots(vec![pre, post]));
                self.observe(i, WRITE_KEY, &b.buffer, Observed::Slots(vec![out]));
            }
            Op::Memset { stream, dst } => {
                let s = self.stream(i, stream)?;
                let d = self.span(i, dst)?;
                self.prepare(i, s, &[dst])?;
                let op_id = u32::try_from(i).map_err(|_| unsupported(i, "op index too large"))?;
                // SAFETY: the region lies in a live buffer of this run, mapped until `release`.
                unsafe { self.streams[s].memset_d32(d.region, memset_word(op_id)) }
                    .map_err(driver(i, "enqueuing a memset"))?;
                let out = self.checksum_slot(i, s, &d)?;
                self.observe(i, WRITE_KEY, &d.buffer, Observed::Slots(vec![out]));
            }
            Op::HostRead { buffer } => {
                let sp = self.span(i, buffer)?;
                if sp.memory == MemoryKind::Device {
                    return Err(unsupported(i, "a host read of device memory"));
                }
                self.host_fences(i, &[buffer])?;
                let p = self.host_ptr(i, sp.region)?;
                let words = read_host(p, sp.region.words);
                self.observe(i, 0, &sp.buffer, Observed::Value(checksum(&words)));
            }
            Op::HostWrite { buffer } => {
                let sp = self.span(i, buffer)?;
                if sp.memory == MemoryKind::Device {
                    return Err(unsupported(i, "a host write of device memory"));
                }
                self.host_fences(i, &[buffer])?;
                let p = self.host_ptr(i, sp.region)?;
                let op_id = u32::try_from(i).map_err(|_| unsupported(i, "op index too large"))?;
                for k in 0..sp.region.words {
                    // SAFETY: `p` points to `words` words of a live pinned segment (checked by
                    // `host_ptr`); volatile, because the device may access them concurrently in
                    // a racy program.
                    unsafe { p.add(k as usize).write_volatile(hash_word(op_id, 0, k, [])) };
                }
                // The words are written before any later op is issued to the device.
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.events.remove(event);
            }
            Op::EventRecord { event, stream } => {
                let s = self.stream(i, stream)?;
                self.event(i, event)?;
                let (Some(e), Some(st)) = (self.events.get(event), self.streams.get(s)) else {
                    return Err(unsupported(i, "event table"));
                };
                e.record(st).map_err(driver(i, "recording an event"))?;
            }
            Op::EventWait { stream, event } => {
                let s = self.stream(i, stream)?;
                self.event(i, event)?;
                let (Some(e), Some(st)) = (self.events.get(event), self.streams.get(s)) else {
                    return Err(unsupported(i, "event table"));
                };
                st.wait(e).map_err(driver(i, "waiting on an event"))?;
            }
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                self.event(i, event)?
                    .synchronize()
                    .map_err(driver(i, "synchronizing an event"))?;
            }
            Op::EventQuery {
                complete: false, ..
            }
            | Op::StreamQuery {
                complete: false, ..
            } => {}
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let s = self.stream(i, stream)?;
                self.streams[s]
                    .synchronize()
                    .map_err(driver(i, "synchronizing a stream"))?;
                if s == 0 {
                    // As the trace format and the simulator have it: the legacy stream's sync also
                    // waits for the work issued so far on the blocking streams.
                    for st in self.streams.iter().skip(1) {
                        if st.kind() == StreamKind::Blocking {
                            st.synchronize()
                                .map_err(driver(i, "synchronizing a stream"))?;
                        }
                    }
                }
            }
            Op::DeviceSync { device } => {
                if *device == 0 {
                    self.gpu
                        .synchronize()
                        .map_err(driver(i, "synchronizing the device"))?;
                }
            }
            Op::GraphBegin { .. } | Op::GraphEnd { .. } | Op::GraphLaunch { .. } => {
                return Err(unsupported(
                    i,
                    format!(
                        "{}: CUDA graphs are not supported yet",
                        program[i].op.name()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Reads `words` words at `p` with volatile loads (the device may write them concurrently).
fn read_host(p: *mut u32, words: u32) -> Vec<u32> {
    (0..words as usize)
        // SAFETY: the caller got `p` from `PinnedSegments::host_ptr` for at least `words` words.
        .map(|k| unsafe { p.add(k).read_volatile() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::gen::{generate, GenConfig};

    #[test]
    fn provocation_delays_vary_from_one_to_four_ms() {
        let d: BTreeSet<u64> = (0..8).map(provoke_spin_ns).collect();
        assert_eq!(
            d.into_iter().collect::<Vec<_>>(),
            vec![1_000_000, 2_000_000, 3_000_000, 4_000_000]
        );
    }

    #[test]
    fn slot_counts_cover_every_observation() {
        let p = generate(&GenConfig::default(), &mut SplitMix::new(3)).ops;
        for op in &p {
            let n = slots_of(&op.op);
            match &op.op {
                Op::Launch { reads, writes, .. } => {
                    assert_eq!(n, 2 * reads.len() + writes.len())
                }
                Op::Copy { .. } => assert_eq!(n, 3),
                // A free observes the freed buffer's final contents in one slot.
                Op::Memset { .. } | Op::Free { .. } => assert_eq!(n, 1),
                _ => assert_eq!(n, 0),
            }
        }
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if Gpu::available() {
            return;
        }
        let e = CudaExecutor::new(0).unwrap_err();
        assert!(e.contains("CUDA device 0"), "{e}");
    }
}
