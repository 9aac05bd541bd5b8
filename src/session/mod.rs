//! The test-time harness: run multi-stream GPU code through one API, on a real GPU or on the CPU,
//! and get every synchronization hazard of the run as a [`Report`].
//!
//! # Background
//!
//! Two streams that touch the same bytes with no event between them race. A buffer freed back to a
//! caching allocator while another stream still reads it is handed to the next allocation of the
//! same size on the same stream, and the new owner overwrites it mid-kernel. Neither shows up
//! reliably: the race window is microseconds wide, and tools that watch kernels see nothing wrong
//! inside any one of them. A [`Session`] records every stream, event, allocation, free, launch,
//! copy and host access of a program as the ops of a trace (the trace format, version 1) and checks
//! them as they are issued with [`Checker`](crate::checker::Checker): a hazard is reported whether
//! or not it corrupted anything on this run.
//!
//! # Writing a test
//!
//! ```
//! use streamsan::session::Session;
//!
//! # fn main() -> Result<(), streamsan::session::SessionError> {
//! let session = Session::simulated();
//! let compute = session.stream()?;
//! let comm = session.stream()?;
//! let mut grads = session.alloc::<f32>(&compute, 1024)?;
//! let mut sums = session.alloc::<f32>(&comm, 1024)?;
//! session.launch(&compute, "backward").write(&mut grads).hash()?;
//! let ready = session.event()?;
//! ready.record(&compute)?;
//! comm.wait(&ready)?; // without this wait, `all_reduce` races with `backward`
//! session.launch(&comm, "all_reduce").read(&grads).write(&mut sums).hash()?;
//! session.record_stream(&grads, &comm)?; // without this, the free below is unsafe
//! grads.free()?;
//! session.finish()?.assert_clean();
//! # Ok(())
//! # }
//! ```
//!
//! # Concepts
//!
//! The vocabulary is cudarc's and PyTorch's:
//!
//! | CUDA / PyTorch | here | trace op |
//! |---|---|---|
//! | a `cudaStream_t` created non-blocking (PyTorch's streams) | [`Session::stream`] → [`Stream`] | `stream_create` |
//! | a `cudaStream_t` created with `cudaStreamDefault` | [`Session::blocking_stream`] | `stream_create` (`blocking`) |
//! | the legacy default stream | [`Session::default_stream`] | stream `"default"` |
//! | `cudaEvent_t` | [`Session::event`] → [`Event`] | `event_create`, `event_record`, `event_wait`, … |
//! | `torch.empty(..., device="cuda")` on the current stream | [`Session::alloc`] → [`DeviceBuffer`] | `alloc` |
//! | a tensor's last reference dropped | [`DeviceBuffer::free`], or dropping it | `free` |
//! | `cudaFreeAsync(ptr, stream)` | [`DeviceBuffer::free_on`] | `free` with `stream` |
//! | `Tensor.record_stream(s)` | [`Session::record_stream`] | `record_stream` |
//! | a pinned host tensor | [`Session::alloc_pinned`] → [`PinnedBuffer`] | `alloc` (`pinned`) |
//! | a view at an offset | [`DeviceBuffer::slice`] → [`Region`] | a region with `offset`, `bytes` |
//! | a kernel launch | [`Session::launch`] → [`Launch`] | `launch` |
//! | `cudaMemcpyAsync` | [`Session::copy`] | `copy` |
//! | `cudaMemsetD32Async` | [`Session::memset`] | `memset` |
//! | `cudaMemcpy` to / from pageable memory | [`Session::memcpy_dtov`], [`Session::memcpy_htod`] | `launch` + `stream_sync` |
//! | the host touching pinned memory | [`PinnedBuffer::read`], [`PinnedBuffer::write_with`] | `host_read`, `host_write` |
//! | `cudaStreamSynchronize`, `cudaEventSynchronize`, `cudaDeviceSynchronize` | [`Stream::synchronize`], [`Event::synchronize`], [`Session::synchronize`] | `stream_sync`, `event_sync`, `device_sync` |
//! | `cudaStreamQuery`, `cudaEventQuery` | [`Stream::query`], [`Event::query`] | `stream_query`, `event_query` with the real result |
//! | `torch.cuda.graph` / stream capture | [`Stream::begin_capture`], [`Stream::begin_capture_in`], [`Stream::end_capture`] → [`Graph`] | `graph_begin` (`pool`), the captured ops, `graph_end` |
//! | `CUDAGraph.replay()` | [`Graph::launch`] | `graph_launch` |
//! | `torch.cuda.graph_pool_handle()`, `pool=` | [`Session::graph_pool`], [`Graph::pool`] → [`GraphPool`] | the `pool` of `graph_begin` |
//!
//! # Backends
//!
//! A session records each op and issues it to its backend, one of the two of the execution layer
//! ([`crate::exec`]):
//!
//! - [`Session::cuda`] (feature `cuda`) runs on a real GPU (`exec::cuda::CudaDevice`), with
//!   cudarc's event tracking off: the harness adds no synchronization of its own. Device memory
//!   comes from `DeviceCachingAllocator` over segments
//!   mapped with `cuMemAlloc`, so a freed block really is handed to the next allocation of its size
//!   on its stream, as PyTorch's allocator does. `record_stream` is honoured as PyTorch honours
//!   it: the freed block goes back to its pool only once the recorded streams' work up to the free
//!   has finished (an internal event per stream, polled at the next allocation). A stream whose
//!   last handle is dropped is destroyed at the next device synchronization, or when the session
//!   ends.
//! - [`Session::simulated`] runs the same ops on the CPU ([`crate::exec::sim::Device`]) with the
//!   same allocator policies and the kernel semantics of `crate::kernels`, so a race-free
//!   program computes the same words on both.
//!   Ops run as they are issued, except that [`Launch::spin`] makes its stream lag: the launch and
//!   everything issued after it on that stream run only when CUDA's ordering forces them (a host
//!   sync, an event wait, the legacy default stream, a `record_stream` fence). That is the most
//!   adversarial timing a real spin can produce, so races that a spin provokes on a GPU corrupt
//!   data on the simulator too, deterministically.
//!
//! Both backends give every op the same op index, and the built-in hash kernel mixes that index
//! into what it writes (`crate::kernels::hash_word`): the same program writes the same words on
//! both, and a run on the simulator is the reference for a run on the GPU.
//!
//! # What is recorded
//!
//! Every call that does something records its op with its call site (`"file:line:col"`, from
//! `#[track_caller]`). Streams are named `s1`, `s2`, …, events `e1`, …, device buffers `b1`, …,
//! pinned buffers `p1`, …, unless named with [`Session::stream_named`] or
//! [`Session::alloc_named`]. Allocations record the address they got (`addr`), so the trace is
//! exactly what the program did, and [`Session::write_trace`] writes it as JSON Lines that
//! `streamsan check` reproduces. A trace numbers the session's device 0, whatever its ordinal.
//!
//! # Cost
//!
//! The calling thread executes the op and appends a compact record (keys, not ids; the call
//! site as a `&'static Location`) to a batch; a checker thread per session turns records into
//! trace ops and checks them, so checking runs beside the program, not inside each call. On a GPU
//! a launch allocates nothing in the steady state (up to four read and four write regions are
//! kept inline, and batch buffers are reused), and nothing is synchronized that the caller did not
//! ask for. [`Session::finish`], [`Session::hazards`] and [`Session::trace`] wait for the checker
//! to catch up. [`SessionConfig::check`] turns recording off entirely, for measuring the harness
//! against itself.
//!
//! # Threads
//!
//! A [`Session`] and all its handles are `Send + Sync`. Every call takes the session's lock while
//! it executes its op and records it, so the trace order is the order in which the driver saw the
//! calls. Closures the session calls while it holds the lock ([`Launch::run`],
//! [`PinnedBuffer::write_with`]) must not call back into the same session: that is an error
//! ([`SessionError::Reentrant`]), not a deadlock.
//!
//! # Errors
//!
//! Every fallible call returns [`SessionError`]; nothing panics on bad input except slicing out of
//! bounds ([`DeviceBuffer::slice`], like `&v[a..b]`). `Drop` never panics: an error while dropping
//! a buffer or an event is parked and returned by the next call on the session.

use std::borrow::Cow;
use std::panic::Location;
use std::path::Path;
use std::sync::Arc;

use crate::exec::{AnyBackend, Fill};
use crate::report::{Hazard, Report};
use crate::trace::TraceOp;

mod buffer;
pub(crate) mod core;
mod graph;
mod handle;
mod launch;

pub use self::core::{BackendKind, SessionConfig, SessionError};
pub use crate::exec::sim::SimOutOfMemory;
pub use buffer::{AsRegion, DeviceBuffer, Element, PinnedBuffer, Region};
pub use graph::{Graph, GraphPool};
pub use handle::{Event, Stream, StreamKind};
pub use launch::{Launch, LaunchError, RawLaunch};

pub(crate) use self::core::{Core, KernelExec};

/// Whether a device-layer error means "there is no GPU here".
#[cfg(feature = "cuda")]
fn no_gpu(e: crate::cuda::GpuError) -> SessionError {
    use crate::cuda::GpuError;
    match e {
        GpuError::NoDriver
        | GpuError::NoDevice
        | GpuError::NoSuchDevice { .. }
        | GpuError::DriverUnusable(_) => SessionError::NoGpu {
            reason: e.to_string(),
        },
        e => SessionError::Gpu(e),
    }
}

/// A recorded, checked run of a multi-stream program. See the [module docs](self).
pub struct Session {
    core: Arc<Core>,
    default: Stream,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.core.kind)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session on the CPU simulator, with the default [`SessionConfig`].
    ///
    /// # Panics
    ///
    /// If the checker thread cannot be spawned (the process is out of threads); use
    /// [`Session::simulated_with`] to get that as an error.
    pub fn simulated() -> Session {
        match Session::simulated_with(SessionConfig::default()) {
            Ok(s) => s,
            Err(e) => panic!("cannot start a simulated session: {e}"),
        }
    }

    /// A session on the CPU simulator.
    pub fn simulated_with(config: SessionConfig) -> Result<Session, SessionError> {
        let sim = crate::exec::sim::Device::session(
            config.sim_device_bytes,
            config.sim_pinned_bytes,
            config.sim_execute,
        );
        Session::start(AnyBackend::Sim(sim), BackendKind::Simulated, &config)
    }

    /// A session on CUDA device `ordinal`, with the default [`SessionConfig`].
    ///
    /// Returns [`SessionError::NoGpu`] (never panics) where there is no CUDA driver, no device,
    /// or no device of that ordinal. The kernels are compiled (NVRTC) at the first
    /// [`Launch::hash`] or spin.
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize) -> Result<Session, SessionError> {
        Session::cuda_with(ordinal, SessionConfig::default())
    }

    /// A session on CUDA device `ordinal`.
    #[cfg(feature = "cuda")]
    pub fn cuda_with(ordinal: usize, config: SessionConfig) -> Result<Session, SessionError> {
        let backend = crate::exec::cuda::CudaDevice::open(ordinal).map_err(no_gpu)?;
        Session::start(
            AnyBackend::Cuda(backend),
            BackendKind::Cuda { ordinal },
            &config,
        )
    }

    fn start(
        backend: AnyBackend,
        kind: BackendKind,
        config: &SessionConfig,
    ) -> Result<Session, SessionError> {
        let core = Arc::new(Core::new(backend, kind, config)?);
        let default = Stream::legacy(&core);
        Ok(Session { core, default })
    }

    /// The session core every handle of this session shares (for the facade of
    /// [`crate::cudarc`]).
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The backend this session runs on.
    pub fn backend(&self) -> BackendKind {
        self.core.kind
    }

    /// Whether this session runs on the CPU simulator.
    pub fn is_simulated(&self) -> bool {
        self.core.kind == BackendKind::Simulated
    }

    /// The cudarc context of a GPU session (event tracking off), to load user kernels for
    /// [`Launch::run`]; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn context(&self) -> Option<Arc<cudarc::driver::CudaContext>> {
        self.core.context()
    }

    /// The legacy default stream (trace id `"default"`): implicitly ordered with the blocking
    /// streams, never with the non-blocking ones.
    pub fn default_stream(&self) -> &Stream {
        &self.default
    }

    /// A new non-blocking stream (PyTorch's kind), named `s1`, `s2`, …
    #[track_caller]
    pub fn stream(&self) -> Result<Stream, SessionError> {
        Stream::create(
            &self.core,
            None,
            StreamKind::NonBlocking,
            Location::caller(),
        )
    }

    /// A new non-blocking stream with a name for reports (not `"host"` or `"default"`, not the name
    /// of another stream of this session).
    #[track_caller]
    pub fn stream_named(&self, name: &str) -> Result<Stream, SessionError> {
        Stream::create(
            &self.core,
            Some(name),
            StreamKind::NonBlocking,
            Location::caller(),
        )
    }

    /// A new blocking stream (`cudaStreamDefault`): implicitly ordered with the legacy default
    /// stream.
    #[track_caller]
    pub fn blocking_stream(&self) -> Result<Stream, SessionError> {
        Stream::create(&self.core, None, StreamKind::Blocking, Location::caller())
    }

    /// A new blocking stream with a name for reports.
    #[track_caller]
    pub fn blocking_stream_named(&self, name: &str) -> Result<Stream, SessionError> {
        Stream::create(
            &self.core,
            Some(name),
            StreamKind::Blocking,
            Location::caller(),
        )
    }

    /// A new event, named `e1`, `e2`, …; never recorded yet.
    #[track_caller]
    pub fn event(&self) -> Result<Event, SessionError> {
        Event::create(&self.core, Location::caller())
    }

    /// Allocates `len` elements of device memory owned by `stream`, from the caching allocator.
    ///
    /// The allocation is a use of the memory on `stream`: another stream must wait for `stream`
    /// before touching the buffer. Its contents are whatever the block held (on the simulator, a
    /// pattern of the address for never-written memory). Out of memory is
    /// [`SessionError::Alloc`].
    #[track_caller]
    pub fn alloc<T: Element>(
        &self,
        stream: &Stream,
        len: usize,
    ) -> Result<DeviceBuffer<T>, SessionError> {
        DeviceBuffer::alloc(&self.core, stream, None, len, Location::caller())
    }

    /// [`Session::alloc`] with a name for reports (not the name of a live buffer of this session).
    #[track_caller]
    pub fn alloc_named<T: Element>(
        &self,
        stream: &Stream,
        name: &str,
        len: usize,
    ) -> Result<DeviceBuffer<T>, SessionError> {
        DeviceBuffer::alloc(&self.core, stream, Some(name), len, Location::caller())
    }

    /// Allocates `len` elements of pinned (page-locked) host memory from the host caching
    /// allocator, owned by the host.
    #[track_caller]
    pub fn alloc_pinned<T: Element>(&self, len: usize) -> Result<PinnedBuffer<T>, SessionError> {
        PinnedBuffer::alloc(&self.core, None, len, Location::caller())
    }

    /// [`Session::alloc_pinned`] with a name for reports.
    #[track_caller]
    pub fn alloc_pinned_named<T: Element>(
        &self,
        name: &str,
        len: usize,
    ) -> Result<PinnedBuffer<T>, SessionError> {
        PinnedBuffer::alloc(&self.core, Some(name), len, Location::caller())
    }

    /// A region of memory this session did not allocate (an *external* buffer of the trace format:
    /// it exists from the start, is device memory, and is never reused by the allocator), for
    /// [`Launch::reads`] and [`Launch::writes`] of kernels run with [`Launch::run`].
    ///
    /// `device_ptr` and `bytes` must be whole 4-byte words, and the name must not be the name of a
    /// buffer of this session. The built-in kernels, copies and memsets cannot run on external
    /// memory on the simulator (there is none behind it).
    ///
    /// # Safety
    ///
    /// On a GPU, `[device_ptr, device_ptr + bytes)` must be device-accessible memory that stays
    /// allocated while any work using the region may run, and no Rust reference may point into it
    /// (it must not be host memory the program reads or writes through references): the built-in
    /// kernels, copies and memsets write through it.
    pub unsafe fn external_region(
        &self,
        name: &str,
        device_ptr: u64,
        bytes: u64,
    ) -> Result<Region, SessionError> {
        self.core.external(name, device_ptr, bytes)
    }

    /// Makes the free of `buffer` wait for the work issued on `stream` up to that free, as
    /// PyTorch's `Tensor.record_stream`: the memory is not handed out again before that work has
    /// finished. Has no effect on the owning stream of device memory.
    #[track_caller]
    pub fn record_stream(
        &self,
        buffer: &impl AsRegion,
        stream: &Stream,
    ) -> Result<(), SessionError> {
        self.core
            .record_stream(&buffer.region(), stream.key(), Location::caller())
    }

    /// Starts a kernel launch on `stream`; finish it with [`Launch::hash`] or [`Launch::run`].
    #[track_caller]
    pub fn launch<'a>(
        &'a self,
        stream: &'a Stream,
        name: impl Into<Cow<'static, str>>,
    ) -> Launch<'a> {
        Launch::new(&self.core, stream, name.into(), Location::caller())
    }

    /// Enqueues a copy of `src` into `dst` on `stream` (`cudaMemcpyAsync`). Either may be device or
    /// pinned memory; they must have the same length and must not overlap.
    #[track_caller]
    pub fn copy(
        &self,
        stream: &Stream,
        src: &impl AsRegion,
        dst: &mut impl AsRegion,
    ) -> Result<(), SessionError> {
        self.core
            .copy(stream.key(), src.region(), dst.region(), Location::caller())
    }

    /// Enqueues a memset of every 32-bit word of `dst` to `value` on `stream`
    /// (`cuMemsetD32Async`; for a float, pass `x.to_bits()`).
    #[track_caller]
    pub fn memset(
        &self,
        stream: &Stream,
        dst: &mut impl AsRegion,
        value: u32,
    ) -> Result<(), SessionError> {
        self.core.memset(
            stream.key(),
            dst.region(),
            Fill::Word(value),
            Location::caller(),
        )
    }

    /// Copies `src` from the host's pageable memory into `dst` through `stream` and waits for it
    /// (a `cudaMemcpy`): recorded as a launch `memcpy_htod` writing `dst` on `stream`, then a
    /// `stream_sync` of `stream`.
    #[track_caller]
    pub fn memcpy_htod<T: Element>(
        &self,
        stream: &Stream,
        src: &[T],
        dst: &mut impl AsRegion,
    ) -> Result<(), SessionError> {
        let words: Vec<u32> = src.iter().map(|x| x.to_word()).collect();
        self.core
            .memcpy_htod_words(stream.key(), &words, dst.region(), Location::caller())
    }

    /// Copies `src` into a new vector through `stream` and waits for it (a `cudaMemcpy` to
    /// pageable memory): recorded as a launch `memcpy_dtov` reading `src` on `stream`, then a
    /// `stream_sync` of `stream`. Work of other streams not ordered before it may still be running.
    #[track_caller]
    pub fn memcpy_dtov<T: Element>(
        &self,
        stream: &Stream,
        src: &impl AsRegion,
    ) -> Result<Vec<T>, SessionError> {
        let words = self
            .core
            .memcpy_dtov(stream.key(), src.region(), Location::caller())?;
        Ok(words.into_iter().map(T::from_word).collect())
    }

    /// Blocks the host until all work of the device is done (`cudaDeviceSynchronize`).
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), SessionError> {
        self.core.device_sync(Location::caller())
    }

    /// The number of ops recorded so far: the op index the next op gets.
    pub fn ops(&self) -> u64 {
        self.core.ops()
    }

    /// Every hazard found so far (waits for the checker to catch up).
    pub fn hazards(&self) -> Result<Vec<Hazard>, SessionError> {
        self.core.hazards()
    }

    /// The ops recorded so far, as a trace (waits for the checker to catch up). Empty when
    /// [`SessionConfig::keep_trace`] or [`SessionConfig::check`] is off.
    pub fn trace(&self) -> Result<Vec<TraceOp>, SessionError> {
        self.core.trace()
    }

    /// Writes the ops recorded so far to `path` as JSON Lines (the trace format, version 1), for
    /// `streamsan check`.
    pub fn write_trace(&self, path: impl AsRef<Path>) -> Result<(), SessionError> {
        let ops = self.trace()?;
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut writer = crate::trace::TraceWriter::new(file);
        for op in &ops {
            writer.write(op)?;
        }
        writer.finish()?;
        Ok(())
    }

    /// Counters of the device caching allocator: segments, reserved and allocated bytes, live and
    /// cached blocks.
    pub fn device_memory_stats(&self) -> Result<crate::alloc::AllocatorStats, SessionError> {
        self.core.device_memory_stats()
    }

    /// Ends recording and returns the report of every hazard found.
    ///
    /// Does not synchronize anything. Handles still alive afterwards can no longer record (their
    /// calls return [`SessionError::Finished`]; dropping them frees their memory silently). Device
    /// segments go back to the driver when the session and every handle are gone, after a device
    /// synchronization.
    pub fn finish(self) -> Result<Report, SessionError> {
        self.core.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<Session>();
        assert_send_sync::<Stream>();
        assert_send_sync::<Event>();
        assert_send_sync::<DeviceBuffer<u32>>();
        assert_send_sync::<PinnedBuffer<f32>>();
        assert_send_sync::<Region>();
        assert_send_sync::<SessionError>();
    }
}
