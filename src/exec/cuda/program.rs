//! Running trace programs on a GPU, so that the campaign's verdicts are held against what a GPU
//! actually does: [`CudaExecutor`] is the GPU backend ([`CudaDevice`]) plus a scheduler per run.
//!
//! Every op of a program becomes the driver call it names, on the stream it names, with no added
//! synchronization except where the scheduler asks for it.
//!
//! # One run
//!
//! Each run of a program starts from nothing and releases everything it made when it ends:
//!
//! - **Streams**: `"default"` is the legacy default stream; `stream_create` makes a blocking or
//!   non-blocking stream as it says; a stream named before any `stream_create` is non-blocking, as
//!   in the simulator. Destroyed at the end of the run.
//! - **Events**: `event_create` makes a fresh event, never recorded; an event named before any
//!   `event_create` is created on first use; `event_destroy` destroys it.
//! - **Memory**: buffers come from the same allocator policies as the checker and the simulator
//!   (`crate::alloc`): device memory from the device caching allocator over segments mapped with
//!   `cuMemAlloc`, pinned memory from the host caching allocator over `cuMemHostAlloc` segments.
//!   So a freed block really is handed out again and really overwritten, and frees never unmap
//!   anything during a run: a late access of freed memory lands in the next owner's data and
//!   never faults. Every segment the policies will ask for is mapped before the run (found by
//!   running them over a model address space) and fresh device segments are zeroed (on a private
//!   stream, before the run), so reads of never-written memory see the same words in every run.
//!   All segments are unmapped once the device is idle at the end of the run; nothing is cached
//!   across runs, so device memory in use ([`CudaExecutor::device_memory_in_use`]) returns to its
//!   starting value.
//! - **Placed memory**: allocations with `addr` (the compressed addresses of
//!   [`crate::fuzz::runnable`], which `check --confirm` runs recorded traces through) lie in one
//!   segment per memory kind, mapped and zeroed before the run (managed memory is pinned memory
//!   here); device memory that comes back on another stream than the one its free gave it to
//!   synchronizes the device at its `alloc`, as the trace format says. Inside a capture (a pool's
//!   bytes that another pool held, given back to the driver: PyTorch synchronized before the
//!   capture began) the context cannot synchronize: every stream not capturing is waited for.
//! - **`record_stream`**: a free records a fence event on every stream recorded for the buffer;
//!   every later access of memory that reuses the freed bytes waits for those fences first (a
//!   stream op with `cuStreamWaitEvent`, a host access with `cuEventSynchronize`).
//!
//! - **CUDA graphs**: `graph_begin` is `cuStreamBeginCapture` on its stream (relaxed mode);
//!   the program's ops on a capturing stream (and on the streams that join the capture by waiting
//!   on one of its events) are issued as usual and captured by the driver, with their checksums
//!   and a `spin_at` delay each; `graph_end` is `cuStreamEndCapture` and
//!   `cuGraphInstantiate`; `graph_launch` is `cuGraphLaunch` on the launch's stream. Allocations
//!   during a capture, and those that name a `pool` outside one, come from the graph pools of the
//!   resolver ([`crate::exec`]'s `graphs`), laid out in device memory reserved for them before
//!   the run. Events recorded in a capture are
//!   made anew at its end (they count as never recorded afterwards). A `record_stream` fence of
//!   memory a captured op touches is waited for by every launch of the graph (a capturing stream
//!   cannot wait on an event recorded outside its capture).
//!
//! Kernels are those of `crate::kernels`: a launch at op index `i` runs `hash_launch` with
//! `op_id = i` once per write region `j`, reads in order (the first `MAX_READS` of them; every
//! read region is observed); a memset writes `memset_word``(i)`; a copy is the `copy_words`
//! kernel; a host write writes `hash_word``(i, 0, k, [])` at word `k`.
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
//! A captured op's checksums are captured too, into slots of the graph that each replay zeroes
//! and fills; after each `graph_launch`, copies on the launch's stream (ordered after the whole
//! replay) move them into slots of that launch, observed under the replayed op's number
//! ([`crate::exec::ReplayNumbering`]: the `k`-th replayed op of a run is op `program.len() + k`).
//! A launch of a graph on another stream than its previous one also waits for those copies.
//!
//! # Schedules
//!
//! The scheduler holds ops back ([`Scheduler::hold`]):
//!
//! - [`Executor::reference`] ([`Sequential`]): issue order, the device synchronized after every op.
//! - [`Executor::random`] ([`RandomScheduler`]): the program as written. The seed only adds timing
//!   noise: before about one stream op in four, a `spin` kernel of up to 100 µs on the op's stream
//!   (a delay, never an ordering).
//! - [`Executor::provoke`] ([`Adversarial`]): every held op of a stream is preceded on its stream by
//!   a `spin` kernel of 1 to 4 ms (chosen by the seed), so that the ops that are not ordered after
//!   it run first. A held host op (host read or write, allocation) cannot be delayed on the device
//!   and is not.
//!
//! A replay is scheduled op by op like the simulator's: before each `cuGraphLaunch` the scheduler
//! is asked about every replayed op by its number, and the answer sets the captured `spin_at`
//! delay before that op (a `fill` kernel on the launch's stream writes it), so a provocation may
//! hold one op inside a replay. A sequential run captures each op after every earlier captured op
//! of its graph (internal events between the lanes) and synchronizes after the launch; during a
//! capture it synchronizes the streams that are not capturing instead of the device.
//!
//! # Errors
//!
//! Every failure — a driver error, an allocation the device cannot serve, an op this executor does
//! not support, even a panic inside the driver bindings — is an [`ExecError::Unsupported`] whose
//! message starts with `CUDA`, never a panic. A kernel fault leaves the CUDA context unusable, and
//! every later run then fails with the driver's error.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::{CudaDevice, GpuSegments, PinnedSegments};
use crate::alloc::{
    device_segment_size, round_device_size, DeviceCachingAllocator, HostCachingAllocator, Memory,
    ModelMemory,
};
use crate::cuda::{DeviceRegion, Event, Gpu, GpuError};
use crate::exec::backend::{
    Backend, EventKey, Fence, Fill, GraphKey, Issued, Kernel, Op as ExecOp, Span, StreamKey,
};
use crate::exec::error::ExecError;
use crate::exec::graphs::BodyKind;
use crate::exec::outcome::{Executor, Outcome};
use crate::exec::program::Resolver;
use crate::exec::sched::{Adversarial, Hold, RandomScheduler, Scheduler, Sequential};
use crate::kernels::{checksum, hash_word, memset_word, MAX_READS};
use crate::trace::{Id, MemoryKind, Op, Region, TraceOp, DEFAULT_STREAM};
use crate::workload::SplitMix;

pub use crate::exec::sched::{provoke_spin_ns, PROVOKE_SPIN_NS, RANDOM_JITTER_NS};

/// The second half of an [`Outcome::reads`] key for write region `j` of an op is
/// `WRITE_KEY + j`; read regions use their own index `k < WRITE_KEY`.
pub const WRITE_KEY: usize = 1 << 16;

/// The [`Outcome::reads`] key of a free's view of the freed buffer's final contents.
pub const FREE_KEY: usize = 2 << 16;

/// The most bytes of placed memory of one kind a run maps.
pub const MAX_PLACED_BYTES: u64 = 4 << 30;

/// Runs programs on one CUDA device. See the [module docs](self).
#[derive(Debug)]
pub struct CudaExecutor {
    gpu: Arc<Gpu>,
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
        Ok(CudaExecutor {
            gpu: Arc::new(gpu),
            runs: 0,
        })
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

    /// Runs `program` once under `scheduler`.
    pub fn run(
        &mut self,
        program: &[TraceOp],
        scheduler: &mut dyn Scheduler,
    ) -> Result<Outcome, ExecError> {
        self.runs += 1;
        let gpu = &self.gpu;
        guard(|| execute(gpu, program, scheduler)).unwrap_or_else(|panic| {
            Err(ExecError::unsupported(
                0,
                format!("CUDA: the driver bindings panicked: {panic}"),
            ))
        })
    }
}

impl Executor for CudaExecutor {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn holds_replayed_ops(&self) -> bool {
        true
    }

    fn reference(&mut self, program: &[TraceOp]) -> Result<Outcome, ExecError> {
        self.run(program, &mut Sequential)
    }

    fn random(&mut self, program: &[TraceOp], seed: u64) -> Result<Outcome, ExecError> {
        self.run(program, &mut RandomScheduler(SplitMix::new(seed)))
    }

    fn provoke(
        &mut self,
        program: &[TraceOp],
        holds: &[(usize, usize)],
        seed: u64,
    ) -> Result<Outcome, ExecError> {
        self.run(program, &mut Adversarial::new(holds.to_vec(), seed))
    }
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

fn unsupported(op: usize, message: impl std::fmt::Display) -> ExecError {
    ExecError::unsupported(op, format!("CUDA: {message}"))
}

/// A driver error at op `op`, while doing `what`.
fn driver(op: usize, what: &'static str) -> impl FnOnce(GpuError) -> ExecError {
    move |e| unsupported(op, format!("{what}: {e}"))
}

/// Runs `program` once and releases everything the run made, on success and on error.
fn execute(
    gpu: &Arc<Gpu>,
    program: &[TraceOp],
    scheduler: &mut dyn Scheduler,
) -> Result<Outcome, ExecError> {
    gpu.kernels().map_err(driver(0, "loading the kernels"))?;
    let mut run = Run::new(gpu, program)?;
    let result = run.play(scheduler).and_then(|()| run.collect());
    let released = run
        .dev
        .release()
        .map_err(|e| unsupported(program.len(), format!("releasing the run's memory: {e}")));
    let outcome = result?;
    released?;
    Ok(outcome)
}

/// The sizes of the device and pinned segments the allocator policies will ask for while
/// `program` runs, found by running the policies over a model address space.
fn segments_needed(program: &[TraceOp]) -> (Vec<u64>, Vec<u64>) {
    struct Sizes(ModelMemory, Vec<u64>);
    impl Memory for Sizes {
        type Error = <ModelMemory as Memory>::Error;
        fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
            self.1.push(bytes);
            self.0.map_segment(bytes)
        }
    }
    let mut device = DeviceCachingAllocator::new(Sizes(ModelMemory::new(1 << 40), Vec::new()));
    let mut pinned = HostCachingAllocator::new(Sizes(ModelMemory::new(1 << 40), Vec::new()));
    let mut keys: HashMap<Id, u32> = HashMap::new();
    let mut key = |s: Option<&Id>| {
        let name = s.cloned().unwrap_or_else(|| Id::from(DEFAULT_STREAM));
        let n = keys.len() as u32;
        *keys.entry(name).or_insert(n)
    };
    let mut live: HashMap<Id, (MemoryKind, u64)> = HashMap::new();
    // Which streams capture (device memory allocated on them comes from a graph pool) and which
    // events were last recorded by one: graph by name.
    let mut capturing: HashMap<Id, Id> = HashMap::new();
    let mut captured_events: HashMap<Id, Id> = HashMap::new();
    for op in program {
        match &op.op {
            Op::GraphBegin { graph, stream, .. } => {
                capturing.insert(stream.clone(), graph.clone());
            }
            Op::GraphEnd { graph } => {
                capturing.retain(|_, g| g != graph);
                captured_events.retain(|_, g| g != graph);
            }
            Op::EventRecord { event, stream } => match capturing.get(stream) {
                Some(g) => {
                    captured_events.insert(event.clone(), g.clone());
                }
                None => {
                    captured_events.remove(event);
                }
            },
            Op::EventWait { stream, event } => {
                if let Some(g) = captured_events.get(event) {
                    capturing.entry(stream.clone()).or_insert_with(|| g.clone());
                }
            }
            Op::Alloc {
                stream: Some(s),
                memory: MemoryKind::Device,
                ..
            } if capturing.contains_key(s) => {}
            // Memory of a graph pool, named outside a capture.
            Op::Alloc {
                memory: MemoryKind::Device,
                pool: Some(_),
                ..
            } => {}
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

/// The bytes each memory kind's placed memory spans: the highest end of an allocation with
/// `addr`, from its kind's base ([`crate::alloc::space`]).
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
                let end = a
                    .saturating_sub(crate::alloc::space::base(*memory))
                    .saturating_add(*bytes);
                extent[k] = extent[k].max(end.next_multiple_of(4));
            }
        }
    }
    extent
}

/// Device memory a run reserves for graph pools: enough for every device allocation of the
/// program to map a segment of its own (an upper bound of what the pools ask for); 0 without
/// graphs or allocations that name a pool.
fn pool_bytes_needed(program: &[TraceOp]) -> u64 {
    if !program.iter().any(|t| {
        matches!(
            t.op,
            Op::GraphBegin { .. } | Op::Alloc { pool: Some(_), .. }
        )
    }) {
        return 0;
    }
    program
        .iter()
        .filter_map(|t| match &t.op {
            Op::Alloc {
                bytes,
                memory: MemoryKind::Device,
                addr: None,
                ..
            } if *bytes > 0 => round_device_size(*bytes).and_then(device_segment_size),
            _ => None,
        })
        .fold(0u64, u64::saturating_add)
}

/// One observation of [`Outcome::reads`].
enum Observed {
    /// Checksum slots of the device array, combined.
    Slots(Vec<usize>),
    /// A checksum taken on the host.
    Value(u64),
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

/// Words of `bytes` read back from the host (little-endian, as the device stores them).
fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One run of a program.
struct Run<'p> {
    program: &'p [TraceOp],
    dev: CudaDevice,
    names: Resolver,
    /// The device array of checksum slots (`u64` each) and how many there are.
    slots: u64,
    slot_count: usize,
    next_slot: usize,
    observed: Vec<((usize, usize), Id, Observed)>,
    /// The device array of captured delays (`u32` nanoseconds each, one per captured stream
    /// op), how many there are, and the next free one.
    delays: u64,
    delay_count: usize,
    next_delay: usize,
    /// What the run keeps of each graph (by the resolver's index).
    graphs: Vec<GraphRun>,
    /// The number of the next replayed op ([`crate::exec::ReplayNumbering`]).
    next_replayed: usize,
}

/// What a run keeps of a graph beside the resolver: how its replays are observed and delayed.
#[derive(Default)]
struct GraphRun {
    /// Observations of captured ops, made by the captured checksums into *scratch* slots that
    /// every replay overwrites: (captured op, key, buffer, scratch slots). Each launch copies
    /// them into slots of its own.
    obs: Vec<(usize, usize, Id, Vec<usize>)>,
    /// The delay of each captured stream op: (captured op, index in the delay array).
    delays: Vec<(usize, usize)>,
    /// `record_stream` fences of the memory its captured ops touch: every launch waits for them
    /// first (a capturing stream cannot wait on an event recorded outside its capture).
    fences: Vec<Fence>,
    /// Program events recorded during its capture: made anew when it ends (a captured event
    /// counts as never recorded afterwards).
    events: Vec<EventKey>,
    /// Internal events: the serialization of a sequential run's capture, and the end of the
    /// latest launch (with its stream), which a launch on another stream waits for.
    internal: Vec<Event>,
    last: Option<(StreamKey, usize)>,
}

impl<'p> Run<'p> {
    fn new(gpu: &Arc<Gpu>, program: &'p [TraceOp]) -> Result<Self, ExecError> {
        let setup = |e: GpuError| unsupported(0, format!("setting up the run: {e}"));
        let mut segments = GpuSegments::zeroed(gpu.clone()).map_err(setup)?;
        let replayed = crate::exec::replay_numbering(program);
        let slot_count = program.iter().map(|o| slots_of(&o.op)).sum::<usize>()
            + replayed
                .ops
                .iter()
                .map(|&(_, c)| program.get(c).map_or(0, |t| slots_of(&t.op)))
                .sum::<usize>();
        let delay_count = if program.iter().any(|t| t.op.is_graph_op()) {
            program
                .iter()
                .filter(|t| {
                    matches!(
                        t.op,
                        Op::Launch { .. } | Op::Copy { .. } | Op::Memset { .. }
                    )
                })
                .count()
        } else {
            0
        };
        let delays = segments
            .map_now(4 * delay_count.max(1) as u64)
            .map_err(setup)?;
        let slots = segments
            .map_now(8 * slot_count.max(1) as u64)
            .map_err(setup)?;
        let (device_sizes, pinned_sizes) = segments_needed(program);
        for size in device_sizes {
            segments.prepare(size).map_err(setup)?;
        }
        let mut pinned = PinnedSegments::new(gpu.clone());
        for size in pinned_sizes {
            pinned.prepare(size).map_err(setup)?;
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
                segments.map_now(extent).map_err(setup)?
            } else {
                pinned.map_now(extent).map_err(setup)?
            };
            placed[k] = Some((base, extent));
        }
        let pool_bytes = pool_bytes_needed(program);
        if pool_bytes > MAX_PLACED_BYTES {
            return Err(unsupported(
                0,
                format!("the program's graph pools may need {pool_bytes} bytes; at most {MAX_PLACED_BYTES} are run"),
            ));
        }
        let pool_space = match pool_bytes {
            0 => None,
            n => Some((segments.map_now(n).map_err(setup)?, n, 0)),
        };
        let mut dev = CudaDevice::with(gpu.clone(), segments, pinned, placed, true);
        dev.pool_space = pool_space;
        dev.query_fences = false;
        Ok(Run {
            program,
            dev,
            names: Resolver::new(Some("CUDA")),
            slots,
            slot_count,
            next_slot: 0,
            observed: Vec::new(),
            delays,
            delay_count,
            next_delay: 0,
            graphs: Vec::new(),
            next_replayed: program.len(),
        })
    }

    /// Issues every op, each held back as the scheduler says.
    fn play(&mut self, scheduler: &mut dyn Scheduler) -> Result<(), ExecError> {
        for i in 0..self.program.len() {
            let on_stream = matches!(
                self.program[i].op,
                Op::Launch { .. } | Op::Copy { .. } | Op::Memset { .. } | Op::GraphLaunch { .. }
            );
            let hold = scheduler.hold(i, on_stream);
            let sync = match &self.program[i].op {
                Op::GraphLaunch { graph, stream } => {
                    self.launch_graph(i, graph, stream, hold, scheduler)?
                }
                _ => {
                    self.issue(i, hold)?;
                    hold == Hold::SyncAfter
                }
            };
            if sync {
                self.synchronize(i)?;
            }
        }
        Ok(())
    }

    /// A sequential run's synchronization after op `i`: the device, or while a capture is
    /// underway (when CUDA forbids it) every stream that is not capturing (the legacy default
    /// stream's sync would reach the capturing blocking streams: not that one either).
    fn synchronize(&mut self, i: usize) -> Result<(), ExecError> {
        if !self.names.graphs.any_capturing() {
            return self
                .dev
                .gpu
                .synchronize()
                .map_err(driver(i, "synchronizing after the op"));
        }
        for k in 1..self.dev.streams.len() {
            let key = k as StreamKey;
            if self.names.captured(key).is_some() {
                continue;
            }
            if let Some(Some(stream)) = self.dev.streams.get(k) {
                stream
                    .synchronize()
                    .map_err(driver(i, "synchronizing a stream after the op"))?;
            }
        }
        Ok(())
    }

    /// After the last op: waits for the device, reads the slots, checksums the live buffers.
    fn collect(&mut self) -> Result<Outcome, ExecError> {
        let end = self.program.len();
        self.dev.end_open_captures();
        self.dev
            .gpu
            .synchronize()
            .map_err(driver(end, "synchronizing at the end of the run"))?;
        let words = u32::try_from(2 * self.slot_count)
            .map_err(|_| unsupported(end, "too many checksum slots"))?;
        let raw = self.read_back(
            end,
            MemoryKind::Device,
            DeviceRegion::new(self.slots, words),
        )?;
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
        let live: Vec<(Id, MemoryKind, u64, u64)> = self
            .names
            .live()
            .into_iter()
            .map(|(id, b)| (id.clone(), b.memory, b.addr, b.size))
            .collect();
        for (name, memory, addr, size) in live {
            let words = u32::try_from(size / 4)
                .map_err(|_| unsupported(end, format!("buffer {name} is too large")))?;
            let data = self.read_back(end, memory, DeviceRegion::new(addr, words))?;
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
    ) -> Result<Vec<u32>, ExecError> {
        if region.words == 0 {
            return Ok(Vec::new());
        }
        match memory {
            MemoryKind::Device => {
                let reader = self
                    .dev
                    .device
                    .memory()
                    .reader()
                    .ok_or_else(|| unsupported(op, "a run without its private stream"))?;
                // SAFETY: the region lies in a segment of this run, mapped until it is released.
                unsafe { reader.read_words(region) }.map_err(driver(op, "reading a buffer back"))
            }
            _ => {
                let span = Span {
                    memory,
                    addr: region.ptr,
                    bytes: region.bytes() as u64,
                    gen: 0,
                    external: false,
                };
                let bytes = self.dev.host_read(&span).map_err(|e| unsupported(op, e))?;
                Ok(words_of(&bytes))
            }
        }
    }

    /// Before a stream op: fence waits, then the scheduler's delay. On a capturing stream (of
    /// graph `g`): the fences go to the graph's launches, a sequential run orders the op after
    /// every captured op of the graph so far, and the delay is a captured `spin_at` whose
    /// duration each launch sets.
    fn prepare(
        &mut self,
        i: usize,
        s: StreamKey,
        regions: &[&Region],
        hold: Hold,
    ) -> Result<(), ExecError> {
        if let Some(c) = self.names.captured(s) {
            return self.prepare_captured(i, s, c.graph, regions, hold);
        }
        let fences = self.names.fences(regions);
        self.dev
            .wait_fences(s, &fences)
            .map_err(self.names.failed(i, "waiting for a record_stream fence"))?;
        if let Hold::Spin(ns) = hold {
            let kernels = self
                .dev
                .gpu
                .kernels()
                .map_err(driver(i, "delaying the op"))?;
            let stream = self.dev.stream(s).map_err(|e| unsupported(i, e))?;
            kernels
                .spin(stream, ns)
                .map_err(driver(i, "delaying the op"))?;
        }
        Ok(())
    }

    /// Enqueues a checksum of `span` on stream `s` into a fresh slot.
    fn checksum_slot(&mut self, i: usize, s: StreamKey, span: &Span) -> Result<usize, ExecError> {
        let slot = self.next_slot;
        if slot >= self.slot_count {
            return Err(unsupported(i, "ran out of checksum slots"));
        }
        self.next_slot += 1;
        let out = self.slots + 8 * slot as u64;
        let region = DeviceRegion::new(span.addr, (span.bytes / 4) as u32);
        let kernels = self
            .dev
            .gpu
            .kernels()
            .map_err(driver(i, "enqueuing a checksum"))?;
        let capturing = self.names.captured(s).is_some();
        let stream = self.dev.stream(s).map_err(|e| unsupported(i, e))?;
        if capturing {
            // A captured checksum adds into its slot at every replay: the replay zeroes it first.
            // SAFETY: the slot lies in the slot array, mapped until the run is released.
            unsafe { stream.memset_d32(DeviceRegion::new(out, 2), 0) }
                .map_err(driver(i, "enqueuing a checksum"))?;
        }
        // SAFETY: the span lies in a live buffer of this run and the slot in the slot array; both
        // stay mapped until the run is released, which waits for the device first.
        unsafe { kernels.checksum(stream, region, out) }
            .map_err(driver(i, "enqueuing a checksum"))?;
        Ok(slot)
    }

    fn observe(&mut self, i: usize, k: usize, buffer: &Id, obs: Observed) {
        self.observed.push(((i, k), buffer.clone(), obs));
    }
}

mod graphs;
mod issue;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::gen::{generate, GenConfig};

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

    #[test]
    fn placed_extents_reach_the_highest_end() {
        let base = crate::alloc::space::base(MemoryKind::Pinned);
        let p: Vec<TraceOp> = vec![
            Op::Alloc {
                buffer: "a".into(),
                bytes: 6,
                stream: None,
                memory: MemoryKind::Pinned,
                addr: Some(base + 8),
                pool: None,
            }
            .into(),
            Op::Alloc {
                buffer: "b".into(),
                bytes: 4,
                stream: None,
                memory: MemoryKind::Pinned,
                addr: Some(base),
                pool: None,
            }
            .into(),
        ];
        assert_eq!(placed_extents(&p), [0, 16, 0]);
    }
}
