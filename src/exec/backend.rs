//! The [`Backend`] trait and the ops it issues: the ops of the trace format in a backend's terms.

use crate::trace::MemoryKind;

use super::error::ExecError;

/// A stream of a backend: a dense key, 0 for the legacy default stream.
pub type StreamKey = crate::alloc::StreamKey;

/// An event of a backend: a dense key.
pub type EventKey = u32;

/// A captured graph of a backend that captures ([`Backend::captures`]): a dense key.
pub type GraphKey = u32;

/// The synchronization behaviour of a stream, as in the trace format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// The legacy default stream: an op on it waits for the earlier work of every blocking
    /// stream, and later work of those streams waits for it.
    LegacyDefault,
    /// Created with `cudaStreamDefault`: implicitly ordered with the legacy default stream.
    Blocking,
    /// Created with `cudaStreamNonBlocking` (PyTorch's streams): never implicitly ordered.
    NonBlocking,
}

/// A byte range of memory an op touches: a region of a buffer, resolved to its address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// The memory kind.
    pub memory: MemoryKind,
    /// The address of the first byte (for pinned memory, its device-mapped address).
    pub addr: u64,
    /// Length in bytes.
    pub bytes: u64,
    /// The generation of the buffer it belongs to: a number per allocation, which a simulator
    /// that tells apart the data of successive owners of memory uses (0 where unused).
    pub gen: u32,
    /// Memory that was not allocated through the backend (an external buffer).
    pub external: bool,
}

impl Span {
    /// The 32-bit words the span covers, counting a partial last word.
    pub fn words(&self) -> u64 {
        self.bytes.div_ceil(4)
    }

    /// Whether the span is whole words at a word-aligned address.
    pub fn is_aligned(&self) -> bool {
        self.addr % 4 == 0 && self.bytes % 4 == 0
    }

    /// One past the last byte (saturating).
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.bytes)
    }
}

/// A list of spans, read where a backend needs them: the regions of a launch, which a session
/// keeps inline in its own type and a backend may not look at (no device work to do).
pub trait Spans {
    /// How many spans.
    fn count(&self) -> usize;
    /// Span `i` (`i < count()`).
    fn span(&self, i: usize) -> Span;
}

impl Spans for &[Span] {
    fn count(&self) -> usize {
        self.len()
    }
    fn span(&self, i: usize) -> Span {
        self[i]
    }
}

impl<const N: usize> Spans for [Span; N] {
    fn count(&self) -> usize {
        N
    }
    fn span(&self, i: usize) -> Span {
        self[i]
    }
}

impl Spans for Vec<Span> {
    fn count(&self) -> usize {
        self.len()
    }
    fn span(&self, i: usize) -> Span {
        self[i]
    }
}

/// The work issued on a stream up to a point, as a backend keeps it (taken by
/// [`Backend::fence`]): what the free of a buffer named by `record_stream` makes the reuse of its
/// memory wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The stream.
    pub(crate) stream: StreamKey,
    /// The backend's mark: a sequence number of the stream (simulator), an index of the fence's
    /// event (GPU).
    pub(crate) mark: u64,
}

/// What a kernel launch runs.
pub enum Kernel<'a> {
    /// The built-in hash kernel (`crate::kernels::hash_word`) with this op id, one kernel per
    /// write region; `spin_ns` keeps the stream busy first, to widen race windows (a spin kernel on
    /// a GPU; a lagging stream on the simulator).
    Hash {
        /// The op id mixed into every written word.
        id: u32,
        /// Nanoseconds of spinning first (0: none).
        spin_ns: u64,
    },
    /// A user kernel of the session's context (`cuLaunchKernel`); a simulator runs the hash
    /// kernel with `id` in its place.
    #[cfg(feature = "cuda")]
    User {
        /// The op id of the hash kernel a simulator runs instead.
        id: u32,
        /// The function.
        func: cudarc::driver::sys::CUfunction,
        /// Grid dimensions in blocks.
        grid: (u32, u32, u32),
        /// Block dimensions in threads.
        block: (u32, u32, u32),
        /// Dynamic shared memory per block.
        shared_mem_bytes: u32,
        /// One pointer to each parameter's value.
        args: &'a mut [*mut std::ffi::c_void],
    },
    /// A user kernel with no function for this backend: the simulator's stand-in (the hash
    /// kernel with `id`), an error on a GPU.
    Standin {
        /// The op id.
        id: u32,
        /// The kernel's name, for the error.
        name: &'a str,
    },
}

/// What a memset writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// This word in every 32-bit word (`cuMemsetD32Async`).
    Word(u32),
    /// This byte in every byte (`cuMemsetD8Async`).
    Byte(u8),
}

/// An op as a backend runs it: an op of the trace format with streams and events as keys and
/// buffers resolved to spans, plus the forms a harness needs to move data (copies from and to
/// pageable host memory, host accesses with their data).
///
/// Stream ops (`Launch`, `Copy`, `Memset`, `Store`) may name `fences`: the reuse of memory freed
/// with `record_stream`, which must wait for them first.
pub enum Op<'a> {
    /// A stream is created (or, for a key already in use, made of this kind).
    StreamCreate {
        /// Its key.
        stream: StreamKey,
        /// Its kind.
        kind: StreamKind,
        /// Its device (a trace's numbering; a session's device is 0).
        device: u64,
    },
    /// An event is created, never recorded yet.
    EventCreate {
        /// Its key.
        event: EventKey,
    },
    /// An event is destroyed; its key may be created again.
    EventDestroy {
        /// Its key.
        event: EventKey,
    },
    /// An allocation: `bytes` of `memory` from the caching allocators, owned by `stream` (device
    /// memory), or at `at` where the program places it. Returns [`Issued::Allocated`].
    Alloc {
        /// The memory kind.
        memory: MemoryKind,
        /// The size in bytes.
        bytes: u64,
        /// The owning stream (device memory).
        stream: StreamKey,
        /// Where the program places it (a model address), if it does.
        at: Option<u64>,
    },
    /// A free of the buffer at `span` (its whole block), owned by `owner`: a caching free, or a
    /// stream-ordered one on `to`. The block is not handed out again before the work issued so far
    /// on `record_streams` has completed.
    Free {
        /// The whole buffer.
        span: Span,
        /// Its owning stream.
        owner: StreamKey,
        /// The stream of a stream-ordered free.
        to: Option<StreamKey>,
        /// Streams named by `record_stream`, other than the owner.
        record_streams: &'a [StreamKey],
        /// Whether the program placed the buffer (it goes back to no allocator).
        placed: bool,
    },
    /// A kernel launch on `stream`.
    Launch {
        /// The stream.
        stream: StreamKey,
        /// What runs.
        kernel: Kernel<'a>,
        /// The regions it reads.
        reads: &'a dyn Spans,
        /// The regions it writes.
        writes: &'a dyn Spans,
        /// Fences to wait for first.
        fences: &'a [Fence],
    },
    /// A copy of `src` into `dst` on `stream` (same length, no overlap).
    Copy {
        /// The stream.
        stream: StreamKey,
        /// The source.
        src: Span,
        /// The destination.
        dst: Span,
        /// Fences to wait for first.
        fences: &'a [Fence],
    },
    /// A memset of `dst` on `stream`.
    Memset {
        /// The stream.
        stream: StreamKey,
        /// The destination.
        dst: Span,
        /// What it writes.
        fill: Fill,
        /// Fences to wait for first.
        fences: &'a [Fence],
    },
    /// A copy from pageable host memory into `dst` on `stream`: `data` is staged now and written
    /// in stream order.
    Store {
        /// The stream.
        stream: StreamKey,
        /// The destination.
        dst: Span,
        /// The bytes (at most `dst.bytes` are written).
        data: &'a [u8],
    },
    /// A copy of `src` to pageable host memory through `stream`, waited for (the stream's work up
    /// to it is done when it returns). Returns [`Issued::Bytes`].
    Load {
        /// The stream.
        stream: StreamKey,
        /// The source.
        src: Span,
    },
    /// Brings `stream` up to date and counts one op run now on it: the start of a user kernel
    /// whose work the caller enqueues itself ([`crate::session::Launch::run`]), after `spin_ns`.
    RunNow {
        /// The stream.
        stream: StreamKey,
        /// Nanoseconds of spinning first.
        spin_ns: u64,
    },
    /// The host reads pinned memory now. Returns [`Issued::Bytes`].
    HostRead {
        /// The region.
        span: Span,
        /// Fences to wait for first.
        fences: &'a [Fence],
    },
    /// The host writes pinned memory now.
    HostWrite {
        /// The region.
        span: Span,
        /// The bytes (at most `span.bytes` are written).
        data: &'a [u8],
        /// Fences to wait for first.
        fences: &'a [Fence],
    },
    /// An event captures the work issued on `stream` so far.
    EventRecord {
        /// The event.
        event: EventKey,
        /// The stream.
        stream: StreamKey,
    },
    /// Later work on `stream` waits for what `event` captured.
    EventWait {
        /// The stream.
        stream: StreamKey,
        /// The event.
        event: EventKey,
    },
    /// The host waits for what `event` captured.
    EventSync {
        /// The event.
        event: EventKey,
    },
    /// Whether what `event` captured is done. Returns [`Issued::Complete`].
    EventQuery {
        /// The event.
        event: EventKey,
    },
    /// The host waits for the work issued on `stream` (for the legacy default stream, also the
    /// blocking streams').
    StreamSync {
        /// The stream.
        stream: StreamKey,
    },
    /// Whether the work issued on `stream` is done. Returns [`Issued::Complete`].
    StreamQuery {
        /// The stream.
        stream: StreamKey,
    },
    /// The host waits for all work of device `device` (a trace's numbering; a session's device is
    /// 0). Issued while a stream captures only for memory that came back from the driver inside
    /// the capture (a trace's own `device_sync` there is refused before it is issued): then the
    /// host waits for the work not captured.
    DeviceSync {
        /// The device.
        device: u64,
    },
}

/// What issuing an op returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Issued {
    /// The op was issued (its device work may still be running).
    Done,
    /// A simulator that waits for a scheduler queued the op: it completes in a later step.
    Queued,
    /// A simulator that waits for a scheduler must let the host wait first: issue the op again
    /// once the host can move.
    Retry,
    /// The address an allocation got (`None` for an empty one).
    Allocated(Option<u64>),
    /// The result of a query.
    Complete(bool),
    /// The bytes read.
    Bytes(Vec<u8>),
}

/// Memory the host reads and writes directly: the simulator's, which a user kernel's closure
/// works on in place of a GPU kernel ([`crate::session::RawLaunch::read_words`]).
pub trait SimMemory {
    /// The words of `span`, which must be simulated memory (the last word padded with zeros).
    fn read(&mut self, span: &Span) -> Result<Vec<u32>, ExecError>;
    /// Writes `words` over `span`, which must be simulated memory (the last word cut to its end).
    fn write(&mut self, span: &Span, words: &[u32]) -> Result<(), ExecError>;
}

/// Something that executes ops: the CPU simulator or a GPU. See the [execution layer](crate::exec).
pub trait Backend: Send {
    /// Issues op `index` (the op index of the program or session, which the hash kernel mixes
    /// into what it writes).
    fn issue(&mut self, index: u64, op: Op<'_>) -> Result<Issued, ExecError>;

    /// Takes a fence: the work issued on `stream` so far (`None`: nothing to wait for).
    fn fence(&mut self, stream: StreamKey) -> Result<Option<Fence>, ExecError>;

    /// Whether what `fence` waits for is known to be done (`false` where the backend cannot tell
    /// cheaply; the fence is then kept).
    fn fence_done(&self, fence: Fence) -> bool;

    /// Forgets `stream` (its handle was dropped): work already issued still runs.
    fn release_stream(&mut self, stream: StreamKey);

    /// Counters of the device caching allocator.
    fn device_memory_stats(&self) -> crate::alloc::AllocatorStats;

    /// The address the device's next segment gets in the model's device address space, where a
    /// graph memory pool maps its segments ([`crate::exec`]'s program runs: memory allocated
    /// during a capture); `None` where the backend cannot place pool memory.
    fn next_device_segment(&self) -> Option<u64> {
        None
    }

    /// Maps a segment of `bytes` of device memory at [`Backend::next_device_segment`] for a graph
    /// memory pool and returns its base.
    fn map_device_segment(&mut self, bytes: u64) -> Result<u64, ExecError> {
        Err(ExecError::InvalidArgument(format!(
            "this backend cannot map {bytes} bytes of graph pool memory"
        )))
    }

    /// Whether the backend runs device work. A simulator that measures a harness's own cost runs
    /// none ([`SessionConfig::sim_execute`](crate::session::SessionConfig::sim_execute)): its
    /// launches, event records and event waits do nothing, and a caller may leave them unissued.
    fn runs_work(&self) -> bool {
        true
    }

    /// The simulator's memory, for the closure of a user kernel run with [`Op::RunNow`]; `None`
    /// on a GPU.
    fn sim(&mut self) -> Option<&mut dyn SimMemory> {
        None
    }

    /// The GPU device and the raw stream of `stream`, for the closure of a user kernel run with
    /// [`Op::RunNow`]; `None` on the simulator.
    #[cfg(feature = "cuda")]
    fn gpu_stream(&self, stream: StreamKey) -> Option<(&crate::cuda::Gpu, &crate::cuda::Stream)> {
        let _ = stream;
        None
    }

    /// The cudarc context of a GPU backend; `None` on the simulator.
    #[cfg(feature = "cuda")]
    fn context(&self) -> Option<std::sync::Arc<cudarc::driver::CudaContext>> {
        None
    }

    /// Whether the backend captures graphs itself (a GPU: stream capture). A backend that does
    /// not runs every op at once, and its caller keeps a graph's body and replays it op by op
    /// (as a [`Session`](crate::Session) does on the simulator).
    fn captures(&self) -> bool {
        false
    }

    /// Starts capturing the work issued on `stream` (with [`Backend::captures`]): the stream ops
    /// issued on it, and on the streams that join it by waiting on an event recorded in the
    /// capture, are recorded instead of run.
    fn graph_begin(&mut self, stream: StreamKey) -> Result<(), ExecError> {
        let _ = stream;
        Err(ExecError::InvalidArgument(
            "this backend does not capture graphs".into(),
        ))
    }

    /// Ends the capture begun on `stream` and keeps its graph as `graph` (replacing any graph of
    /// that key).
    fn graph_end(&mut self, graph: GraphKey, stream: StreamKey) -> Result<(), ExecError> {
        let _ = (graph, stream);
        Err(ExecError::InvalidArgument(
            "this backend does not capture graphs".into(),
        ))
    }

    /// Replays `graph` on `stream`: after the work issued on `stream` so far, and before any work
    /// issued on it later.
    fn graph_launch(&mut self, graph: GraphKey, stream: StreamKey) -> Result<(), ExecError> {
        let _ = (graph, stream);
        Err(ExecError::InvalidArgument(
            "this backend does not capture graphs".into(),
        ))
    }

    /// Forgets `graph` (its handle was dropped): replays already launched still run.
    fn graph_destroy(&mut self, graph: GraphKey) {
        let _ = graph;
    }
}
