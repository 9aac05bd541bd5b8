//! The GPU backend: the session's ops on a CUDA device through [`crate::cuda`], with cudarc's
//! event tracking off.
//!
//! Device memory is PyTorch's caching allocator policy ([`DeviceCachingAllocator`]) over segments
//! from `cuMemAlloc` ([`GpuSegments`]); pinned memory is the host caching allocator over
//! `cuMemHostAlloc` buffers ([`PinnedSegments`]). A free returns its block to the pool at once,
//! unless `record_stream` named other streams: then, as in PyTorch, an event is recorded on each
//! of them at the free and the block waits outside the pool until they have all completed
//! (polled with `cuEventQuery` at each allocation). These internal events order nothing but the
//! reuse, which is exactly what the trace's `record_stream` says, so they are not recorded.
//!
//! Segments go back to the driver only when the backend is dropped, after a device
//! synchronization: never while a kernel may still use them.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::buffer::{Region, Regions, WORD};
use super::SessionError;
use crate::alloc::{AllocError, Block, DeviceCachingAllocator, HostCachingAllocator, Memory};
use crate::cuda::{DeviceRegion, Event, Gpu, GpuError, PinnedBuffer, Stream, StreamKind};
use crate::kernels::MAX_READS;
use crate::trace::MemoryKind;

/// Device segments mapped with `cuMemAlloc`: the [`Memory`] of the session's device caching
/// allocator on a GPU.
///
/// Dropping it unmaps every segment (`cuMemFree`); work still using them then touches freed device
/// memory, so synchronize the device first (the session does).
pub struct GpuSegments {
    gpu: Arc<Gpu>,
    segments: Vec<u64>,
    mapped: u64,
}

impl std::fmt::Debug for GpuSegments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSegments")
            .field("segments", &self.segments.len())
            .field("mapped", &self.mapped)
            .finish()
    }
}

impl GpuSegments {
    /// No segments yet; they will be mapped on `gpu`.
    pub fn new(gpu: Arc<Gpu>) -> Self {
        GpuSegments {
            gpu,
            segments: Vec::new(),
            mapped: 0,
        }
    }

    /// The bytes mapped so far.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped
    }

    /// The base address of every segment, in mapping order.
    pub fn segments(&self) -> &[u64] {
        &self.segments
    }
}

impl Memory for GpuSegments {
    type Error = GpuError;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, GpuError> {
        let n = usize::try_from(bytes).map_err(|_| {
            GpuError::InvalidArgument(format!("a segment of {bytes} bytes exceeds usize"))
        })?;
        let base = self.gpu.map_segment(n)?;
        self.segments.push(base);
        self.mapped = self.mapped.saturating_add(bytes);
        Ok(base)
    }
}

impl Drop for GpuSegments {
    fn drop(&mut self) {
        for &base in &self.segments {
            if let Err(e) = self.gpu.unmap_segment(base) {
                tracing::warn!(error = %e, base, "cuMemFree of a segment failed");
            }
        }
    }
}

/// Pinned host segments from `cuMemHostAlloc` (mapped into the device address space): the
/// [`Memory`] of the session's host caching allocator on a GPU. Addresses are device addresses.
///
/// Dropping it frees every segment (`cuMemFreeHost`); synchronize first.
pub struct PinnedSegments {
    gpu: Arc<Gpu>,
    buffers: BTreeMap<u64, PinnedBuffer>,
}

impl std::fmt::Debug for PinnedSegments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSegments")
            .field("segments", &self.buffers.len())
            .finish()
    }
}

impl PinnedSegments {
    /// No segments yet; they will be allocated on `gpu`'s context.
    pub fn new(gpu: Arc<Gpu>) -> Self {
        PinnedSegments {
            gpu,
            buffers: BTreeMap::new(),
        }
    }

    /// The host address of `words` words at device address `addr`, if they lie in one segment.
    fn host_ptr(&mut self, addr: u64, words: u64) -> Option<*mut u32> {
        let (&base, buffer) = self.buffers.range_mut(..=addr).next_back()?;
        let end = addr.checked_add(words.checked_mul(WORD)?)?;
        if end > base + buffer.bytes() as u64 || addr % WORD != 0 {
            return None;
        }
        let words_in = ((addr - base) / WORD) as usize;
        // SAFETY: `words_in` words from the start stay inside the allocation (checked above).
        Some(unsafe { buffer.as_mut_ptr().cast::<u32>().add(words_in) })
    }
}

impl PinnedSegments {
    /// The host address of `bytes` bytes at device address `addr`, if they lie in one segment.
    fn host_byte_ptr(&mut self, addr: u64, bytes: u64) -> Option<*mut u8> {
        let (&base, buffer) = self.buffers.range_mut(..=addr).next_back()?;
        let end = addr.checked_add(bytes)?;
        if end > base + buffer.bytes() as u64 {
            return None;
        }
        // SAFETY: `addr - base` bytes from the start stay inside the allocation (checked above).
        Some(unsafe { buffer.as_mut_ptr().cast::<u8>().add((addr - base) as usize) })
    }
}

impl Memory for PinnedSegments {
    type Error = GpuError;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, GpuError> {
        let n = usize::try_from(bytes.div_ceil(WORD) * WORD).map_err(|_| {
            GpuError::InvalidArgument(format!("a pinned segment of {bytes} bytes exceeds usize"))
        })?;
        let buffer = self.gpu.alloc_pinned(n)?;
        let base = buffer.device_ptr();
        self.buffers.insert(base, buffer);
        Ok(base)
    }
}

/// A freed block waiting for the streams named by `record_stream`.
struct PendingFree {
    memory: MemoryKind,
    addr: u64,
    to: Option<u32>,
    events: Vec<Event>,
}

/// The GPU backend of a session.
pub(crate) struct CudaBackend {
    gpu: Arc<Gpu>,
    device: DeviceCachingAllocator<GpuSegments>,
    pinned: HostCachingAllocator<PinnedSegments>,
    pending: Vec<PendingFree>,
}

/// Whether a device-layer error means "there is no GPU here".
fn no_gpu(e: GpuError) -> SessionError {
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

fn device_region(r: &Region) -> Result<DeviceRegion, SessionError> {
    let bytes = usize::try_from(r.bytes).map_err(|_| {
        SessionError::InvalidArgument(format!("a region of {} bytes exceeds usize", r.bytes))
    })?;
    Ok(DeviceRegion::from_bytes(r.device_ptr(), bytes)?)
}

impl CudaBackend {
    pub(crate) fn open(ordinal: usize) -> Result<Self, SessionError> {
        let gpu = Arc::new(Gpu::open(ordinal).map_err(no_gpu)?);
        Ok(CudaBackend {
            device: DeviceCachingAllocator::new(GpuSegments::new(gpu.clone())),
            pinned: HostCachingAllocator::new(PinnedSegments::new(gpu.clone())),
            gpu,
            pending: Vec::new(),
        })
    }

    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub(crate) fn context(&self) -> Arc<CudaContext> {
        self.gpu.context().clone()
    }

    pub(crate) fn legacy_stream(&self) -> Arc<Stream> {
        Arc::new(self.gpu.legacy_stream())
    }

    pub(crate) fn new_stream(&self, blocking: bool) -> Result<Arc<Stream>, SessionError> {
        let kind = if blocking {
            StreamKind::Blocking
        } else {
            StreamKind::NonBlocking
        };
        Ok(Arc::new(self.gpu.new_stream(kind)?))
    }

    pub(crate) fn new_event(&self) -> Result<Event, SessionError> {
        Ok(self.gpu.new_event()?)
    }

    /// Returns to their pools the pending blocks whose recorded streams have finished.
    fn process_pending(&mut self) -> Result<(), SessionError> {
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
                self.free_now(p.memory, p.addr, p.to)
                    .map_err(SessionError::InvalidArgument)?;
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    pub(crate) fn alloc_device(
        &mut self,
        bytes: u64,
        stream: u32,
    ) -> Result<Result<Option<Block>, AllocError<GpuError>>, SessionError> {
        self.process_pending()?;
        Ok(self.device.allocate(bytes, stream))
    }

    pub(crate) fn alloc_pinned(
        &mut self,
        bytes: u64,
    ) -> Result<Result<Option<Block>, AllocError<GpuError>>, SessionError> {
        self.process_pending()?;
        Ok(self.pinned.allocate(bytes))
    }

    fn free_now(&mut self, memory: MemoryKind, addr: u64, to: Option<u32>) -> Result<(), String> {
        let r = match (memory, to) {
            (MemoryKind::Device, Some(s)) => self.device.free(addr, s),
            (MemoryKind::Device, None) => self.device.free_caching(addr),
            (_, _) => self.pinned.free(addr),
        };
        r.map_err(|e| e.to_string())
    }

    /// Frees a block now, or once the work issued so far on `fences` has finished.
    pub(crate) fn free(
        &mut self,
        region: &Region,
        to: Option<u32>,
        fences: &[Arc<Stream>],
    ) -> Result<(), SessionError> {
        if region.bytes == 0 {
            return Ok(());
        }
        if fences.is_empty() {
            return self
                .free_now(region.memory, region.base, to)
                .map_err(SessionError::InvalidArgument);
        }
        let mut events = Vec::with_capacity(fences.len());
        for s in fences {
            let e = self.gpu.new_event()?;
            e.record(s)?;
            events.push(e);
        }
        self.pending.push(PendingFree {
            memory: region.memory,
            addr: region.base,
            to,
            events,
        });
        Ok(())
    }

    pub(crate) fn stats(&self) -> crate::alloc::AllocatorStats {
        self.device.stats()
    }

    pub(crate) fn hash(
        &mut self,
        stream: &Stream,
        op: u32,
        reads: &Regions,
        writes: &Regions,
        spin_ns: u64,
    ) -> Result<(), SessionError> {
        if reads.len() > MAX_READS {
            return Err(SessionError::InvalidArgument(format!(
                "the hash kernel reads at most {MAX_READS} regions, not {}",
                reads.len()
            )));
        }
        let mut inputs = [DeviceRegion::new(0, 0); MAX_READS];
        for (slot, r) in inputs.iter_mut().zip(reads.iter()) {
            *slot = device_region(r)?;
        }
        let inputs = &inputs[..reads.len()];
        // Check every write region before launching any, so a bad one launches nothing.
        for w in writes.iter() {
            device_region(w)?;
        }
        let kernels = self.gpu.kernels()?;
        if spin_ns > 0 {
            kernels.spin(stream, spin_ns)?;
        }
        for (j, w) in writes.iter().enumerate() {
            let out = device_region(w)?;
            // SAFETY: every region is session memory (mapped until the session ends, and never
            // referenced by the host: host accesses copy through raw pointers) or external memory
            // the caller vouched for when creating the region; aliasing between regions is the
            // kernel's documented word-for-word rule, and a race is exactly what is being checked.
            unsafe { kernels.hash_launch(stream, op, j as u32, out, inputs, 0) }?;
        }
        Ok(())
    }

    pub(crate) fn spin(&mut self, stream: &Stream, ns: u64) -> Result<(), SessionError> {
        if ns > 0 {
            self.gpu.kernels()?.spin(stream, ns)?;
        }
        Ok(())
    }

    pub(crate) fn copy(
        &mut self,
        stream: &Stream,
        src: &Region,
        dst: &Region,
    ) -> Result<(), SessionError> {
        let bytes = usize::try_from(dst.bytes).map_err(|_| {
            SessionError::InvalidArgument(format!("a copy of {} bytes exceeds usize", dst.bytes))
        })?;
        if bytes == 0 {
            return Ok(());
        }
        stream.bind()?;
        // SAFETY: both ranges are session memory (mapped until the session ends) or external
        // memory the caller vouched for; device-mapped pinned memory is never referenced by the
        // host. With unified addressing the driver infers the direction from the addresses.
        unsafe { sys::cuMemcpyAsync(dst.device_ptr(), src.device_ptr(), bytes, stream.raw()) }
            .result()
            .map_err(GpuError::from)?;
        Ok(())
    }

    pub(crate) fn memset(
        &mut self,
        stream: &Stream,
        dst: &Region,
        value: u32,
    ) -> Result<(), SessionError> {
        if dst.bytes == 0 {
            return Ok(());
        }
        let region = device_region(dst)?;
        match dst.memory {
            // SAFETY: as for `copy`.
            MemoryKind::Device => unsafe { stream.memset_d32(region, value) }?,
            // SAFETY: as for `copy`; pinned memory is written through its device mapping.
            _ => unsafe { self.gpu.kernels()?.fill(stream, region, value) }?,
        }
        Ok(())
    }

    fn pinned_ptr(&mut self, r: &Region) -> Result<*mut u32, SessionError> {
        if r.memory == MemoryKind::Device || r.external {
            return Err(SessionError::InvalidArgument(
                "the host can only touch pinned memory of the session".into(),
            ));
        }
        self.pinned
            .memory_mut()
            .host_ptr(r.device_ptr(), r.words())
            .ok_or_else(|| {
                SessionError::InvalidArgument(format!("{r:?} is not inside pinned memory"))
            })
    }

    /// The host reads pinned memory now, word by word (volatile: a copy may be writing it).
    pub(crate) fn host_read(&mut self, r: &Region) -> Result<Vec<u32>, SessionError> {
        if r.bytes == 0 {
            return Ok(Vec::new());
        }
        let p = self.pinned_ptr(r)?;
        Ok((0..r.words() as usize)
            // SAFETY: `p` points to `words` words of a live pinned segment (`pinned_ptr`); no Rust
            // reference to them exists; volatile because a device copy may write them meanwhile.
            .map(|i| unsafe { p.add(i).read_volatile() })
            .collect())
    }

    /// The host writes pinned memory now, word by word.
    pub(crate) fn host_write(&mut self, r: &Region, words: &[u32]) -> Result<(), SessionError> {
        if r.bytes == 0 {
            return Ok(());
        }
        let p = self.pinned_ptr(r)?;
        for (i, &w) in words.iter().take(r.words() as usize).enumerate() {
            // SAFETY: as in `host_read`.
            unsafe { p.add(i).write_volatile(w) };
        }
        Ok(())
    }

    /// A copy to pageable memory through `stream`, then a stream sync.
    pub(crate) fn read_through(
        &mut self,
        stream: &Stream,
        r: &Region,
    ) -> Result<Vec<u32>, SessionError> {
        // SAFETY: as for `copy`; `read_words` waits for the copy before returning.
        Ok(unsafe { stream.read_words(device_region(r)?) }?)
    }

    /// A copy from pageable memory through `stream`, then a stream sync.
    pub(crate) fn write_through(
        &mut self,
        stream: &Stream,
        r: &Region,
        words: &[u32],
    ) -> Result<(), SessionError> {
        let n = (r.words() as usize).min(words.len());
        // SAFETY: as for `copy`; `write_words` stages the words before returning.
        Ok(unsafe { stream.write_words(r.device_ptr(), &words[..n]) }?)
    }

    /// Launches a user kernel on `stream` (`cuLaunchKernel`).
    ///
    /// # Safety
    ///
    /// `func` must be a live function of this context, and `args` must point to one value of the
    /// type of each of its parameters, live until the call returns; the kernel must touch only
    /// memory that stays valid until it completes.
    pub(crate) unsafe fn launch_user(
        &mut self,
        stream: &Stream,
        func: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<(), SessionError> {
        stream.bind()?;
        // SAFETY: the caller's contract.
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

    /// A copy from pageable host memory on `stream` (`cuMemcpyHtoDAsync`): the driver stages
    /// `data` before returning, and writes `dst` in stream order.
    pub(crate) fn store(
        &mut self,
        stream: &Stream,
        dst: &Region,
        data: &[u8],
    ) -> Result<(), SessionError> {
        if data.is_empty() {
            return Ok(());
        }
        let n = data
            .len()
            .min(usize::try_from(dst.bytes).unwrap_or(usize::MAX));
        // SAFETY: `dst` is session memory (mapped until the session ends) or external memory
        // the caller vouched for; a copy from pageable memory stages its source before returning.
        unsafe { stream.copy_htod(dst.device_ptr(), data.as_ptr().cast(), n) }?;
        Ok(())
    }

    /// A copy to pageable host memory on `stream`, waited for (`cuMemcpyDtoHAsync`, then
    /// `cuStreamSynchronize`).
    pub(crate) fn load(&mut self, stream: &Stream, src: &Region) -> Result<Vec<u8>, SessionError> {
        let n = usize::try_from(src.bytes).map_err(|_| {
            SessionError::InvalidArgument(format!("a copy of {} bytes exceeds usize", src.bytes))
        })?;
        let mut out = vec![0u8; n];
        if n > 0 {
            // SAFETY: as for `store`; `out` has room for `n` bytes and a copy to pageable memory
            // returns only once it is done.
            unsafe { stream.copy_dtoh(out.as_mut_ptr().cast(), src.device_ptr(), n) }?;
        }
        stream.synchronize()?;
        Ok(out)
    }

    /// Sets every byte of `dst` to `byte` on `stream` (`cuMemsetD8Async`).
    pub(crate) fn memset_byte(
        &mut self,
        stream: &Stream,
        dst: &Region,
        byte: u8,
    ) -> Result<(), SessionError> {
        let n = usize::try_from(dst.bytes).map_err(|_| {
            SessionError::InvalidArgument(format!("a memset of {} bytes exceeds usize", dst.bytes))
        })?;
        if n == 0 {
            return Ok(());
        }
        stream.bind()?;
        // SAFETY: as for `store`.
        unsafe { cudarc::driver::result::memset_d8_async(dst.device_ptr(), byte, n, stream.raw()) }
            .map_err(GpuError::from)?;
        Ok(())
    }

    /// The host reads pinned memory now, byte by byte (volatile: a copy may be writing it).
    pub(crate) fn host_read_bytes(&mut self, r: &Region) -> Result<Vec<u8>, SessionError> {
        let p = self.pinned_byte_ptr(r)?;
        Ok((0..r.bytes as usize)
            // SAFETY: `p` points to `r.bytes` bytes of a live pinned segment; no Rust reference
            // to them exists; volatile because a device copy may write them meanwhile.
            .map(|i| unsafe { p.add(i).read_volatile() })
            .collect())
    }

    /// The host writes pinned memory now, byte by byte.
    pub(crate) fn host_write_bytes(&mut self, r: &Region, data: &[u8]) -> Result<(), SessionError> {
        let p = self.pinned_byte_ptr(r)?;
        for (i, &b) in data.iter().take(r.bytes as usize).enumerate() {
            // SAFETY: as in `host_read_bytes`.
            unsafe { p.add(i).write_volatile(b) };
        }
        Ok(())
    }

    fn pinned_byte_ptr(&mut self, r: &Region) -> Result<*mut u8, SessionError> {
        if r.memory == MemoryKind::Device || r.external {
            return Err(SessionError::InvalidArgument(
                "the host can only touch pinned memory of the session".into(),
            ));
        }
        if r.bytes == 0 {
            return Ok(std::ptr::NonNull::dangling().as_ptr());
        }
        self.pinned
            .memory_mut()
            .host_byte_ptr(r.device_ptr(), r.bytes)
            .ok_or_else(|| {
                SessionError::InvalidArgument(format!("{r:?} is not inside pinned memory"))
            })
    }

    pub(crate) fn device_sync(&self) -> Result<(), SessionError> {
        Ok(self.gpu.synchronize()?)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Never unmap while a kernel may run: wait for the device, then the fields unmap.
        if let Err(e) = self.gpu.synchronize() {
            tracing::warn!(error = %e, "device synchronization before unmapping failed");
        }
    }
}
