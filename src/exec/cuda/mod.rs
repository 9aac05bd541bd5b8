//! The GPU backend: ops on a CUDA device through the device layer ([`crate::cuda`]), with
//! cudarc's event tracking off — the backend adds no synchronization of its own.
//!
//! Device memory is PyTorch's caching allocator policy (`DeviceCachingAllocator`) over segments
//! from `cuMemAlloc` ([`GpuSegments`]); pinned memory is the host caching allocator over
//! `cuMemHostAlloc` buffers ([`PinnedSegments`]). So a freed block really is handed to the next
//! allocation of its size on its stream, and really overwritten. Streams and events are the
//! backend's, by key: `0` is the legacy default stream.
//!
//! `record_stream` is honoured in one of two ways, chosen by the caller:
//!
//! - as PyTorch honours it (a session's [`Op::Free`] with `record_streams`): an event is recorded
//!   on each named stream at the free, and the block waits outside its pool until they have all
//!   completed (polled with `cuEventQuery` at each allocation). These internal events order
//!   nothing but the reuse, which is exactly what the trace's `record_stream` says.
//! - as the trace format's allocator model has it (a program run: [`Backend::fence`]): the block
//!   is reusable at once, and every later op that touches the reused memory waits for the fences
//!   first (a stream op with `cuStreamWaitEvent`, a host access with `cuEventSynchronize`).
//!
//! A session keeps its segments until it ends; they go back to the driver when the backend is
//! dropped, after a device synchronization: never while a kernel may still use them. A program
//! run maps what its program needs before it starts and releases everything at its end
//! ([`program`]).

pub mod program;
mod segments;

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::backend::{
    Backend, EventKey, Fence, Fill, GraphKey, Issued, Kernel, Op, Span, Spans, StreamKey,
    StreamKind,
};
use super::error::ExecError;
use crate::alloc::{AllocatorStats, DeviceCachingAllocator, HostCachingAllocator};
use crate::cuda::{self as device_layer, DeviceRegion, Event, Gpu, GpuError, Stream};
use crate::kernels::MAX_READS;
use crate::trace::MemoryKind;

pub use program::CudaExecutor;
pub use segments::{GpuSegments, PinnedSegments};

/// A freed block waiting for the streams named by `record_stream`.
struct PendingFree {
    memory: MemoryKind,
    addr: u64,
    to: StreamKey,
    events: Vec<Event>,
}

/// How copies run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Copies {
    /// `cuMemcpyAsync` (a session's).
    Driver,
    /// The `copy_words` kernel (a program run's: a copy is a kernel, as on the simulator).
    Kernel,
}

/// The GPU backend. See the [module docs](self).
pub struct CudaDevice {
    gpu: Arc<Gpu>,
    device: DeviceCachingAllocator<GpuSegments>,
    pinned: HostCachingAllocator<PinnedSegments>,
    /// By stream key; 0 is the legacy default stream. `None`: released.
    streams: Vec<Option<Stream>>,
    /// Streams replaced by a later `stream_create` of their key, or released while a
    /// `record_stream` may still name them: destroyed at the next device synchronization.
    retired: Vec<(StreamKey, Stream)>,
    /// By event key.
    events: Vec<Option<Event>>,
    /// The events of the fences taken, by [`Fence::mark`].
    fences: Vec<Event>,
    pending: Vec<PendingFree>,
    /// Where a program's placed memory lies, per memory kind: the base of its segment and its
    /// size (managed memory is pinned memory here).
    placed: [Option<(u64, u64)>; 3],
    copies: Copies,
    /// Captured graphs, by key (`None`: destroyed).
    graphs: Vec<Option<device_layer::Graph>>,
    /// Segments of graph memory pools: fresh `cuMemAlloc` memory that `device` never hands out.
    pool_segments: GpuSegments,
    /// The streams capturing now (origins of a capture).
    capturing: Vec<StreamKey>,
    /// A program run's memory for graph pools: (base, extent, bytes handed out so far). Pool
    /// segments are placed contiguously from `base`, as the model's device address space places
    /// segments; `None` for a session (each pool segment is then mapped when asked for).
    pub(crate) pool_space: Option<(u64, u64, u64)>,
    /// Whether [`Backend::fence_done`] asks the driver. A session issues every op as it comes,
    /// so a fence's event covers all the work before it. A program run's scheduler holds ops
    /// back: work that comes before a fence in the program may not be issued yet when its event
    /// completes, so there a fence is never done (the run orders the reuse after it).
    pub(crate) query_fences: bool,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("gpu", &self.gpu.ordinal())
            .field("streams", &self.streams.len())
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

/// A region as the device layer takes it: whole words at a word-aligned address.
fn device_region(s: &Span) -> Result<DeviceRegion, ExecError> {
    let bytes = usize::try_from(s.bytes).map_err(|_| {
        ExecError::InvalidArgument(format!("a region of {} bytes exceeds usize", s.bytes))
    })?;
    Ok(DeviceRegion::from_bytes(s.addr, bytes)?)
}

/// `bytes` as a `usize`, or an error naming `what`.
fn size(bytes: u64, what: &str) -> Result<usize, ExecError> {
    usize::try_from(bytes)
        .map_err(|_| ExecError::InvalidArgument(format!("{what} of {bytes} bytes exceeds usize")))
}

impl CudaDevice {
    /// A session's backend on device `ordinal` (the device layer's errors as they are: the caller
    /// tells "no GPU" apart).
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        let gpu = Arc::new(Gpu::open(ordinal)?);
        let device = GpuSegments::new(gpu.clone());
        let pinned = PinnedSegments::new(gpu.clone());
        Ok(CudaDevice::with(gpu, device, pinned, [None; 3], false))
    }

    fn with(
        gpu: Arc<Gpu>,
        device: GpuSegments,
        pinned: PinnedSegments,
        placed: [Option<(u64, u64)>; 3],
        kernel_copies: bool,
    ) -> Self {
        CudaDevice {
            pool_segments: GpuSegments::new(gpu.clone()),
            graphs: Vec::new(),
            capturing: Vec::new(),
            pool_space: None,
            query_fences: true,
            streams: vec![Some(gpu.legacy_stream())],
            device: DeviceCachingAllocator::new(device),
            pinned: HostCachingAllocator::new(pinned),
            gpu,
            retired: Vec::new(),
            events: Vec::new(),
            fences: Vec::new(),
            pending: Vec::new(),
            placed,
            copies: if kernel_copies {
                Copies::Kernel
            } else {
                Copies::Driver
            },
        }
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The stream of key `s`.
    fn stream(&self, s: StreamKey) -> Result<&Stream, ExecError> {
        self.streams
            .get(s as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| ExecError::InvalidArgument(format!("no stream of key {s}")))
    }

    /// The event of key `e`, created (never recorded) if it has none.
    fn event(&mut self, e: EventKey) -> Result<&Event, ExecError> {
        let k = e as usize;
        if self.events.len() <= k {
            self.events.resize_with(k + 1, || None);
        }
        if self.events[k].is_none() {
            self.events[k] = Some(self.gpu.new_event()?);
        }
        self.events[k]
            .as_ref()
            .ok_or_else(|| ExecError::InvalidArgument(format!("no event of key {e}")))
    }

    /// Stream `s` waits for `fences` (`cuStreamWaitEvent`).
    pub(crate) fn wait_fences(&self, s: StreamKey, fences: &[Fence]) -> Result<(), ExecError> {
        let stream = self.stream(s)?;
        for f in fences {
            if let Some(e) = self.fences.get(f.mark as usize) {
                stream.wait(e)?;
            }
        }
        Ok(())
    }

    /// The host waits for `fences` (`cuEventSynchronize`).
    pub(crate) fn sync_fences(&self, fences: &[Fence]) -> Result<(), ExecError> {
        for f in fences {
            if let Some(e) = self.fences.get(f.mark as usize) {
                e.synchronize()?;
            }
        }
        Ok(())
    }

    /// Returns to their pools the pending blocks whose recorded streams have finished.
    fn process_pending(&mut self) -> Result<(), ExecError> {
        let mut k = 0;
        while k < self.pending.len() {
            let mut done = true;
            for e in &self.pending[k].events {
                if !e.query()? {
                    done = false;
                    break;
                }
            }
            if done {
                let p = self.pending.swap_remove(k);
                self.free_now(p.memory, p.addr, p.to)?;
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    fn free_now(&mut self, memory: MemoryKind, addr: u64, to: StreamKey) -> Result<(), ExecError> {
        let r = match memory {
            MemoryKind::Device => self.device.free(addr, to),
            _ => self.pinned.free(addr),
        };
        r.map_err(|e| ExecError::InvalidArgument(e.to_string()))
    }

    /// The real address of memory a program placed at model address `at`.
    fn place(&self, memory: MemoryKind, at: u64, bytes: u64) -> Result<u64, ExecError> {
        let base = crate::alloc::space::base(memory);
        let (real, extent) = self.placed[memory.index()].ok_or_else(|| {
            ExecError::InvalidArgument("placed memory without its segment".into())
        })?;
        let offset = at
            .checked_sub(base)
            .filter(|o| o.checked_add(bytes).is_some_and(|e| e <= extent))
            .ok_or_else(|| {
                ExecError::InvalidArgument(format!(
                    "{} memory at {at:#x} is outside the placed memory",
                    memory.as_str()
                ))
            })?;
        Ok(real + offset)
    }

    /// The host address of pinned memory `s`.
    fn host_ptr(&mut self, s: &Span) -> Result<*mut u8, ExecError> {
        if s.memory == MemoryKind::Device || s.external {
            return Err(ExecError::InvalidArgument(
                "the host can only touch pinned memory of the session".into(),
            ));
        }
        if s.bytes == 0 {
            return Ok(std::ptr::NonNull::dangling().as_ptr());
        }
        self.pinned
            .memory_mut()
            .host_ptr(s.addr, s.bytes)
            .ok_or_else(|| {
                ExecError::InvalidArgument(format!(
                    "{} bytes at {:#x} are not inside pinned memory",
                    s.bytes, s.addr
                ))
            })
    }

    /// The host reads pinned memory now: word by word when aligned, else byte by byte (volatile:
    /// a copy may be writing it).
    fn host_read(&mut self, s: &Span) -> Result<Vec<u8>, ExecError> {
        let p = self.host_ptr(s)?;
        if s.is_aligned() {
            let p = p.cast::<u32>();
            Ok((0..s.words() as usize)
                // SAFETY: `p` points to `words` words of a live pinned segment (`host_ptr`); no
                // Rust reference to them exists; volatile because a device copy may write them.
                .flat_map(|i| unsafe { p.add(i).read_volatile() }.to_le_bytes())
                .collect())
        } else {
            Ok((0..s.bytes as usize)
                // SAFETY: as above, byte by byte.
                .map(|i| unsafe { p.add(i).read_volatile() })
                .collect())
        }
    }

    /// The host writes pinned memory now, as [`CudaDevice::host_read`] reads it.
    fn host_write(&mut self, s: &Span, data: &[u8]) -> Result<(), ExecError> {
        let p = self.host_ptr(s)?;
        let n = data.len().min(s.bytes as usize);
        if s.is_aligned() && n % 4 == 0 {
            let p = p.cast::<u32>();
            for (i, w) in data[..n].chunks_exact(4).enumerate() {
                let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                // SAFETY: as in `host_read`.
                unsafe { p.add(i).write_volatile(w) };
            }
        } else {
            for (i, &b) in data[..n].iter().enumerate() {
                // SAFETY: as in `host_read`.
                unsafe { p.add(i).write_volatile(b) };
            }
        }
        // The words are written before any later op is issued to the device.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The legacy default stream's sync also waits for the work issued so far on the blocking
    /// streams, as the trace format has it.
    fn blocking_streams(&self) -> impl Iterator<Item = &Stream> {
        self.streams
            .iter()
            .skip(1)
            .flatten()
            .filter(|s| s.kind() == device_layer::StreamKind::Blocking)
    }

    fn launch(
        &mut self,
        s: StreamKey,
        kernel: Kernel<'_>,
        reads: &dyn Spans,
        writes: &dyn Spans,
    ) -> Result<(), ExecError> {
        match kernel {
            Kernel::Hash { id, spin_ns } => {
                // The kernel hashes at most MAX_READS read regions into its writes.
                let n = reads.count().min(MAX_READS);
                let mut inputs = [DeviceRegion::new(0, 0); MAX_READS];
                for (k, slot) in inputs.iter_mut().enumerate().take(n) {
                    *slot = device_region(&reads.span(k))?;
                }
                let inputs = &inputs[..n];
                // Check every write region before launching any, so a bad one launches nothing.
                for j in 0..writes.count() {
                    device_region(&writes.span(j))?;
                }
                let kernels = self.gpu.kernels()?;
                let stream = self.stream(s)?;
                if spin_ns > 0 {
                    kernels.spin(stream, spin_ns)?;
                }
                for j in 0..writes.count() {
                    let out = device_region(&writes.span(j))?;
                    // SAFETY: every region is memory of this backend (mapped until it is
                    // dropped or released, and never referenced by the host: host accesses copy
                    // through raw pointers) or external memory the caller vouched for; aliasing
                    // between regions is the kernel's documented word-for-word rule, and a race is
                    // exactly what is being checked.
                    unsafe { kernels.hash_launch(stream, id, j as u32, out, inputs, 0) }?;
                }
                Ok(())
            }
            Kernel::User {
                func,
                grid,
                block,
                shared_mem_bytes,
                args,
                ..
            } => {
                let stream = self.stream(s)?;
                stream.bind()?;
                // SAFETY: the caller's contract (see `crate::session`): `func` is a live function
                // of this context and `args` point to one value of each parameter's type.
                unsafe {
                    cudarc::driver::result::launch_kernel(
                        func,
                        grid,
                        block,
                        shared_mem_bytes,
                        stream.raw(),
                        args,
                    )
                }
                .map_err(GpuError::from)?;
                Ok(())
            }
            Kernel::Standin { name, .. } => Err(ExecError::InvalidArgument(format!(
                "kernel {name:?} has no GPU function: it was loaded for the simulator"
            ))),
        }
    }

    fn copy(&mut self, s: StreamKey, src: &Span, dst: &Span) -> Result<(), ExecError> {
        let bytes = size(dst.bytes, "a copy")?;
        if bytes == 0 {
            return Ok(());
        }
        let stream = self.stream(s)?;
        match self.copies {
            Copies::Driver => {
                stream.bind()?;
                // SAFETY: both ranges are memory of this backend (mapped until it is dropped) or
                // external memory the caller vouched for; device-mapped pinned memory is never
                // referenced by the host. With unified addressing the driver infers the direction
                // from the addresses.
                unsafe { sys::cuMemcpyAsync(dst.addr, src.addr, bytes, stream.raw()) }
                    .result()
                    .map_err(GpuError::from)?;
            }
            Copies::Kernel => {
                let out = device_region(dst)?;
                // SAFETY: both regions lie in live buffers of the run, mapped until it is
                // released, and do not overlap (the runner checks).
                unsafe { self.gpu.kernels()?.copy_words(stream, out, src.addr) }?;
            }
        }
        Ok(())
    }

    fn memset(&mut self, s: StreamKey, dst: &Span, fill: Fill) -> Result<(), ExecError> {
        if dst.bytes == 0 {
            return Ok(());
        }
        let stream = self.stream(s)?;
        match fill {
            Fill::Word(value) => {
                let region = device_region(dst)?;
                match dst.memory {
                    // SAFETY: as for `copy`.
                    MemoryKind::Device => unsafe { stream.memset_d32(region, value) }?,
                    // SAFETY: as for `copy`; pinned memory is written through its device mapping.
                    _ => unsafe { self.gpu.kernels()?.fill(stream, region, value) }?,
                }
            }
            Fill::Byte(byte) => {
                let n = size(dst.bytes, "a memset")?;
                stream.bind()?;
                // SAFETY: as for `copy`.
                unsafe { cudarc::driver::result::memset_d8_async(dst.addr, byte, n, stream.raw()) }
                    .map_err(GpuError::from)?;
            }
        }
        Ok(())
    }

    /// Whether `stream` is capturing (the origin of a capture or a stream that joined one), as
    /// the driver says (`cuStreamIsCapturing`).
    fn is_capturing(&self, stream: StreamKey) -> Result<bool, ExecError> {
        let s = self.stream(stream)?;
        s.bind()?;
        // SAFETY: `raw` is a live stream of this backend (or the legacy handle).
        let status = unsafe { cudarc::driver::result::stream::is_capturing(s.raw()) }
            .map_err(GpuError::from)?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// A device synchronization while a stream captures (memory that came back from the driver
    /// inside a capture, where PyTorch synchronized before the capture began): the context
    /// cannot synchronize now, so every stream that is not capturing is waited for (captured work
    /// runs nothing now). The legacy stream while a blocking stream captures cannot be asked
    /// without joining the capture (`cuStreamIsCapturing` answers
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`): the blocking streams not capturing are waited for,
    /// not it.
    fn sync_outside_captures(&self) -> Result<(), ExecError> {
        for key in 0..self.streams.len() {
            let Some(stream) = self.streams[key].as_ref() else {
                continue;
            };
            match self.is_capturing(key as StreamKey) {
                Ok(false) => stream.synchronize()?,
                Ok(true) => {}
                Err(_) if key == 0 => {}
                Err(e) => return Err(e),
            }
        }
        for (_, stream) in &self.retired {
            stream.synchronize()?;
        }
        Ok(())
    }

    /// Ends every capture still open and drops its graph: a program may end while a stream
    /// captures (its captured work never runs), and the device cannot synchronize until then.
    pub(crate) fn end_open_captures(&mut self) {
        for s in std::mem::take(&mut self.capturing) {
            if let Some(Some(stream)) = self.streams.get(s as usize) {
                let _ = stream.end_capture();
            }
        }
    }

    /// Waits for the device and releases everything a program run made: streams, events,
    /// segments. Returns the first error.
    pub(crate) fn release(&mut self) -> Result<(), ExecError> {
        // A capture left open by a failed run is ended and its graph dropped.
        self.end_open_captures();
        let synced = self.gpu.synchronize();
        self.graphs.clear();
        self.events.clear();
        self.fences.clear();
        self.pending.clear();
        self.retired.clear();
        self.streams.truncate(1);
        let unmapped = self.device.memory_mut().release();
        let pools = self.pool_segments.release();
        self.pinned.memory_mut().release();
        let unmapped = unmapped.and(pools);
        synced.and(unmapped).map_err(ExecError::from)
    }
}

impl Backend for CudaDevice {
    fn issue(&mut self, _index: u64, op: Op<'_>) -> Result<Issued, ExecError> {
        match op {
            Op::StreamCreate {
                stream,
                kind,
                device,
            } => {
                if device != 0 {
                    return Err(ExecError::InvalidArgument(format!(
                        "a stream on device {device}: only device 0 is supported"
                    )));
                }
                if stream == 0 {
                    return Ok(Issued::Done);
                }
                let kind = match kind {
                    StreamKind::Blocking => device_layer::StreamKind::Blocking,
                    _ => device_layer::StreamKind::NonBlocking,
                };
                let k = stream as usize;
                if self.streams.len() <= k {
                    self.streams.resize_with(k + 1, || None);
                }
                if self.streams[k].as_ref().is_some_and(|s| s.kind() == kind) {
                    return Ok(Issued::Done);
                }
                let fresh = self.gpu.new_stream(kind)?;
                if let Some(old) = self.streams[k].replace(fresh) {
                    self.retired.push((stream, old));
                }
                Ok(Issued::Done)
            }
            Op::EventCreate { event } => {
                let k = event as usize;
                if self.events.len() <= k {
                    self.events.resize_with(k + 1, || None);
                }
                self.events[k] = Some(self.gpu.new_event()?);
                Ok(Issued::Done)
            }
            Op::EventDestroy { event } => {
                if let Some(e) = self.events.get_mut(event as usize) {
                    *e = None;
                }
                Ok(Issued::Done)
            }
            Op::Alloc {
                memory,
                bytes,
                stream,
                at,
            } => {
                if let Some(a) = at.filter(|_| bytes > 0) {
                    return Ok(Issued::Allocated(Some(self.place(memory, a, bytes)?)));
                }
                self.process_pending()?;
                let block = match memory {
                    MemoryKind::Device => self.device.allocate(bytes, stream),
                    MemoryKind::Pinned => self.pinned.allocate(bytes),
                    MemoryKind::Managed => {
                        return Err(ExecError::InvalidArgument(
                            "managed memory is run only where the program places it".into(),
                        ))
                    }
                }
                .map_err(|e| ExecError::alloc(e, bytes, memory))?;
                Ok(Issued::Allocated(block.map(|b| b.addr)))
            }
            Op::Free {
                span,
                owner,
                to,
                record_streams,
                placed,
            } => {
                if span.bytes == 0 || placed {
                    return Ok(Issued::Done);
                }
                let to = to.unwrap_or(owner);
                if record_streams.is_empty() {
                    self.free_now(span.memory, span.addr, to)?;
                    return Ok(Issued::Done);
                }
                let mut events = Vec::with_capacity(record_streams.len());
                for &s in record_streams {
                    let stream = match self.stream(s) {
                        Ok(st) => Some(st),
                        Err(_) => self.retired.iter().find(|r| r.0 == s).map(|r| &r.1),
                    };
                    // A stream gone since a device synchronization has nothing left to wait for.
                    if let Some(stream) = stream {
                        let e = self.gpu.new_event()?;
                        e.record(stream)?;
                        events.push(e);
                    }
                }
                self.pending.push(PendingFree {
                    memory: span.memory,
                    addr: span.addr,
                    to,
                    events,
                });
                Ok(Issued::Done)
            }
            Op::Launch {
                stream,
                kernel,
                reads,
                writes,
                fences,
            } => {
                self.wait_fences(stream, fences)?;
                self.launch(stream, kernel, reads, writes)?;
                Ok(Issued::Done)
            }
            Op::Copy {
                stream,
                src,
                dst,
                fences,
            } => {
                self.wait_fences(stream, fences)?;
                self.copy(stream, &src, &dst)?;
                Ok(Issued::Done)
            }
            Op::Memset {
                stream,
                dst,
                fill,
                fences,
            } => {
                self.wait_fences(stream, fences)?;
                self.memset(stream, &dst, fill)?;
                Ok(Issued::Done)
            }
            Op::Store { stream, dst, data } => {
                if data.is_empty() {
                    return Ok(Issued::Done);
                }
                let n = data
                    .len()
                    .min(usize::try_from(dst.bytes).unwrap_or(usize::MAX));
                // SAFETY: `dst` is memory of this backend (mapped until it is dropped) or external
                // memory the caller vouched for; a copy from pageable memory stages its source
                // before returning.
                unsafe {
                    self.stream(stream)?
                        .copy_htod(dst.addr, data.as_ptr().cast(), n)
                }?;
                Ok(Issued::Done)
            }
            Op::Load { stream, src } => {
                let n = size(src.bytes, "a copy")?;
                let mut out = vec![0u8; n];
                let stream = self.stream(stream)?;
                if n > 0 {
                    // SAFETY: as for `Store`; `out` has room for `n` bytes and a copy to pageable
                    // memory returns only once it is done.
                    unsafe { stream.copy_dtoh(out.as_mut_ptr().cast(), src.addr, n) }?;
                }
                stream.synchronize()?;
                Ok(Issued::Bytes(out))
            }
            Op::RunNow { stream, spin_ns } => {
                if spin_ns > 0 {
                    let kernels = self.gpu.kernels()?;
                    kernels.spin(self.stream(stream)?, spin_ns)?;
                }
                Ok(Issued::Done)
            }
            Op::HostRead { span, fences } => {
                self.sync_fences(fences)?;
                Ok(Issued::Bytes(self.host_read(&span)?))
            }
            Op::HostWrite { span, data, fences } => {
                self.sync_fences(fences)?;
                self.host_write(&span, data)?;
                Ok(Issued::Done)
            }
            Op::EventRecord { event, stream } => {
                self.event(event)?;
                let (Some(Some(e)), Ok(s)) = (self.events.get(event as usize), self.stream(stream))
                else {
                    return Err(ExecError::InvalidArgument("event table".into()));
                };
                e.record(s)?;
                Ok(Issued::Done)
            }
            Op::EventWait { stream, event } => {
                self.event(event)?;
                let (Some(Some(e)), Ok(s)) = (self.events.get(event as usize), self.stream(stream))
                else {
                    return Err(ExecError::InvalidArgument("event table".into()));
                };
                s.wait(e)?;
                Ok(Issued::Done)
            }
            Op::EventSync { event } => {
                self.event(event)?.synchronize()?;
                Ok(Issued::Done)
            }
            Op::EventQuery { event } => Ok(Issued::Complete(self.event(event)?.query()?)),
            Op::StreamSync { stream } => {
                self.stream(stream)?.synchronize()?;
                if stream == 0 {
                    for s in self.blocking_streams() {
                        s.synchronize()?;
                    }
                }
                Ok(Issued::Done)
            }
            Op::StreamQuery { stream } => {
                let mut complete = self.stream(stream)?.query()?;
                if stream == 0 {
                    for s in self.blocking_streams() {
                        complete &= s.query()?;
                    }
                }
                Ok(Issued::Complete(complete))
            }
            Op::DeviceSync { device } => {
                if device == 0 {
                    if self.capturing.is_empty() {
                        self.gpu.synchronize()?;
                        // Every retired stream's work is done, and none can be issued any more.
                        self.retired.clear();
                    } else {
                        self.sync_outside_captures()?;
                    }
                }
                Ok(Issued::Done)
            }
        }
    }

    fn fence(&mut self, stream: StreamKey) -> Result<Option<Fence>, ExecError> {
        if !self.capturing.is_empty() && self.is_capturing(stream)? {
            // Captured work runs nothing now: there is nothing to wait for (and an event recorded
            // in a capture cannot be waited on outside it).
            return Ok(None);
        }
        let e = self.gpu.new_event()?;
        e.record(self.stream(stream)?)?;
        self.fences.push(e);
        Ok(Some(Fence {
            stream,
            mark: (self.fences.len() - 1) as u64,
        }))
    }

    fn fence_done(&self, fence: Fence) -> bool {
        // An error counts as not done: the fence is kept.
        self.query_fences
            && self
                .fences
                .get(fence.mark as usize)
                .is_some_and(|e| e.query().unwrap_or(false))
    }

    fn release_stream(&mut self, stream: StreamKey) {
        if stream == 0 {
            return;
        }
        if let Some(s) = self.streams.get_mut(stream as usize).and_then(Option::take) {
            // A `record_stream` may still name it: kept until the next device synchronization.
            self.retired.push((stream, s));
        }
    }

    fn device_memory_stats(&self) -> AllocatorStats {
        self.device.stats()
    }

    fn gpu_stream(&self, stream: StreamKey) -> Option<(&Gpu, &Stream)> {
        Some((&self.gpu, self.stream(stream).ok()?))
    }

    fn context(&self) -> Option<Arc<CudaContext>> {
        Some(self.gpu.context().clone())
    }

    fn captures(&self) -> bool {
        true
    }

    fn graph_begin(&mut self, stream: StreamKey) -> Result<(), ExecError> {
        // The kernels are compiled and loaded before the capture: module loading is no work to
        // capture.
        self.gpu.kernels()?;
        self.stream(stream)?.begin_capture()?;
        self.capturing.push(stream);
        Ok(())
    }

    fn graph_end(&mut self, graph: GraphKey, stream: StreamKey) -> Result<(), ExecError> {
        self.capturing.retain(|&s| s != stream);
        let g = self.stream(stream)?.end_capture()?;
        let k = graph as usize;
        if self.graphs.len() <= k {
            self.graphs.resize_with(k + 1, || None);
        }
        // An empty capture has no graph: its launches run nothing.
        self.graphs[k] = g;
        Ok(())
    }

    fn graph_launch(&mut self, graph: GraphKey, stream: StreamKey) -> Result<(), ExecError> {
        let s = self.stream(stream)?;
        match self.graphs.get(graph as usize) {
            Some(Some(g)) => Ok(g.launch(s)?),
            Some(None) => Ok(()),
            None => Err(ExecError::InvalidArgument(format!(
                "no graph of key {graph}"
            ))),
        }
    }

    fn graph_destroy(&mut self, graph: GraphKey) {
        if let Some(g) = self.graphs.get_mut(graph as usize) {
            *g = None;
        }
    }

    fn next_device_segment(&self) -> Option<u64> {
        self.pool_space.map(|(base, _, used)| base + used)
    }

    fn map_device_segment(&mut self, bytes: u64) -> Result<u64, ExecError> {
        match &mut self.pool_space {
            // A program run's: the next bytes of the memory reserved for its pools, zeroed.
            Some((base, extent, used)) => {
                let at = *base + *used;
                let end = used
                    .checked_add(bytes)
                    .filter(|&e| e <= *extent)
                    .ok_or_else(|| {
                        ExecError::InvalidArgument(format!(
                            "graph pools need more than the {extent} bytes reserved for them"
                        ))
                    })?;
                *used = end;
                Ok(at)
            }
            // A session's: fresh `cuMemAlloc` memory, kept until the backend is dropped.
            None => Ok(self.pool_segments.map_now(bytes)?),
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Never unmap while a kernel may run: wait for the device, then the fields unmap.
        if let Err(e) = self.gpu.synchronize() {
            tracing::warn!(error = %e, "device synchronization before unmapping failed");
        }
    }
}
