//! Raw memory: device segments, pinned host buffers, and the copies and memsets between them.
//!
//! Device memory is a raw address (`u64`, a `CUdeviceptr`). Segments come from `cuMemAlloc`, the
//! synchronous allocator, never from a stream-ordered pool: the caching allocators above
//! (`crate::alloc`) carve blocks out of segments and decide reuse themselves, as PyTorch's do.
//!
//! Copies and memsets are asynchronous on a [`Stream`]: they take raw addresses and are `unsafe`,
//! because the driver writes through them after the call returns.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use super::{DeviceRegion, Gpu, GpuError, Stream};

impl Gpu {
    /// Maps a device segment of `bytes` bytes with `cuMemAlloc` and returns its device address
    /// (256-byte aligned). Its contents are undefined.
    pub fn map_segment(&self, bytes: usize) -> Result<u64, GpuError> {
        if bytes == 0 {
            return Err(GpuError::InvalidArgument("a segment of 0 bytes".into()));
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `cuMemAlloc` only returns a fresh allocation; its undefined contents are only
        // ever read as plain words.
        Ok(unsafe { result::malloc_sync(bytes) }?)
    }

    /// Unmaps a segment from [`Gpu::map_segment`] (`cuMemFree`).
    ///
    /// This is safe for the host: device memory is not host memory. Work still in flight that uses
    /// the segment, or enqueued later with its address, touches freed device memory: the hazard
    /// streamsan looks for, and the caller's to avoid (the `unsafe` launches and copies say so).
    /// An address that is not a live segment is an error from the driver.
    pub fn unmap_segment(&self, ptr: u64) -> Result<(), GpuError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: `cuMemFree` validates the address and fails on anything but the base of a live
        // `cuMemAlloc` allocation; freeing device memory cannot invalidate host memory.
        unsafe { result::free_sync(ptr) }?;
        Ok(())
    }

    /// Allocates `bytes` bytes (a whole number of words, more than 0) of page-locked host memory
    /// with `cuMemHostAlloc`, mapped into the device address space and zeroed.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer, GpuError> {
        if bytes == 0 || bytes % 4 != 0 {
            return Err(GpuError::InvalidArgument(format!(
                "a pinned buffer is a positive whole number of words, not {bytes} bytes"
            )));
        }
        self.ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a fresh allocation; it is zeroed below before any read.
        let host = unsafe { result::malloc_host(bytes, flags) }?;
        let Some(host) = NonNull::new(host.cast::<u32>()) else {
            return Err(GpuError::InvalidArgument(
                "cuMemHostAlloc returned null".into(),
            ));
        };
        // Owned from here: dropping `buffer` frees the allocation on every path below.
        let mut buffer = PinnedBuffer {
            host,
            device: 0,
            words: bytes / 4,
            ctx: self.ctx.clone(),
        };
        // SAFETY: `host` points to `bytes` writable bytes that nothing else references yet; page
        // alignment makes it aligned for u32.
        unsafe { std::ptr::write_bytes(buffer.host.as_ptr(), 0, buffer.words) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` comes from `cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`; the call
        // writes one address through a valid pointer.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, buffer.host.as_ptr().cast(), 0) }
            .result()?;
        buffer.device = device;
        Ok(buffer)
    }
}

/// Page-locked host memory, viewed as words: the source or target of truly asynchronous copies.
/// Dropping it frees it (`cuMemFreeHost`).
pub struct PinnedBuffer {
    host: NonNull<u32>,
    device: u64,
    words: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer owns its allocation like a `Box<[u32]>`; access goes through `&`/`&mut`.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for PinnedBuffer {}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("host", &self.host)
            .field("device", &format_args!("{:#x}", self.device))
            .field("words", &self.words)
            .finish()
    }
}

impl PinnedBuffer {
    /// Length in words.
    pub fn len(&self) -> usize {
        self.words
    }

    /// Whether the buffer has no words (never: a buffer has at least one).
    pub fn is_empty(&self) -> bool {
        self.words == 0
    }

    /// Length in bytes.
    pub fn bytes(&self) -> usize {
        self.words * 4
    }

    /// Host address, for the copies of [`Stream`].
    pub fn as_ptr(&self) -> *const c_void {
        self.host.as_ptr().cast()
    }

    /// Host address, for the copies of [`Stream`].
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        self.host.as_ptr().cast()
    }

    /// The device address of the same memory, for kernels that touch pinned memory directly.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The whole buffer as a device region.
    pub fn device_region(&self) -> DeviceRegion {
        DeviceRegion::new(self.device, u32::try_from(self.words).unwrap_or(u32::MAX))
    }

    /// The words. Only meaningful once the copies and kernels that write the buffer are done (the
    /// `unsafe` calls that enqueued them require that the host not read it before).
    pub fn as_words(&self) -> &[u32] {
        // SAFETY: `host` points to `words` initialized (zeroed at allocation) u32s owned by self.
        unsafe { std::slice::from_raw_parts(self.host.as_ptr(), self.words) }
    }

    /// The words, mutably. Only while no enqueued copy or kernel uses the buffer.
    pub fn as_words_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `as_words`, and `&mut self` makes this the only host reference.
        unsafe { std::slice::from_raw_parts_mut(self.host.as_ptr(), self.words) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `host` came from `cuMemHostAlloc` and is freed once, here.
        let freed = unsafe { result::free_host(self.host.as_ptr().cast()) };
        if let Err(e) = freed {
            tracing::warn!(error = %e, "cuMemFreeHost failed");
        }
        self.ctx.record_err(freed);
    }
}

impl Stream {
    /// Enqueues a copy of `bytes` bytes from device address `src` to device address `dst`
    /// (`cuMemcpyDtoDAsync`).
    ///
    /// # Safety
    ///
    /// Both ranges must be device-accessible memory that stays allocated until the copy is done,
    /// and `dst` must not be memory the host holds a Rust reference to (a [`PinnedBuffer`]'s words)
    /// until then.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges per this function's contract.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.raw()) }?;
        Ok(())
    }

    /// Enqueues a copy of `bytes` bytes from host address `src` to device address `dst`
    /// (`cuMemcpyHtoDAsync`). Asynchronous with respect to the host only when `src` is pinned.
    ///
    /// # Safety
    ///
    /// `src` must be valid for `bytes` reads and not written by the host until the copy is done;
    /// `dst` as for [`Stream::copy_dtod`].
    pub unsafe fn copy_htod(
        &self,
        dst: u64,
        src: *const c_void,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges per this function's contract.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, self.raw()) }.result()?;
        Ok(())
    }

    /// Enqueues a copy of `bytes` bytes from device address `src` to host address `dst`
    /// (`cuMemcpyDtoHAsync`). Asynchronous with respect to the host only when `dst` is pinned.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for `bytes` writes and neither read nor written by the host until the
    /// copy is done; `src` as for [`Stream::copy_dtod`].
    pub unsafe fn copy_dtoh(
        &self,
        dst: *mut c_void,
        src: u64,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges per this function's contract.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, self.raw()) }.result()?;
        Ok(())
    }

    /// Enqueues a memset of `region` to `value` in every word (`cuMemsetD32Async`).
    ///
    /// # Safety
    ///
    /// As for the destination of [`Stream::copy_dtod`].
    pub unsafe fn memset_d32(&self, region: DeviceRegion, value: u32) -> Result<(), GpuError> {
        region.check_aligned()?;
        self.bind()?;
        // SAFETY: the caller guarantees the region per this function's contract.
        unsafe { sys::cuMemsetD32Async(region.ptr, value, region.words as usize, self.raw()) }
            .result()?;
        Ok(())
    }

    /// Writes `words` at device address `dst` through this stream and waits for it: a copy from
    /// pageable memory enqueued on this stream, then [`Stream::synchronize`]. For setting up and
    /// checking buffers; it orders like any op of this stream.
    ///
    /// # Safety
    ///
    /// As for the destination of [`Stream::copy_dtod`].
    pub unsafe fn write_words(&self, dst: u64, words: &[u32]) -> Result<(), GpuError> {
        if words.is_empty() {
            return self.synchronize();
        }
        // SAFETY: a copy from pageable memory stages `words` before the call returns, so the borrow
        // may end any time after; the caller guarantees `dst`.
        unsafe { self.copy_htod(dst, words.as_ptr().cast(), std::mem::size_of_val(words)) }?;
        self.synchronize()
    }

    /// Reads `region` through this stream and waits for it: a copy to pageable memory enqueued on
    /// this stream, then [`Stream::synchronize`]. It orders like any op of this stream: work of
    /// other streams that it is not ordered after may still be running.
    ///
    /// # Safety
    ///
    /// As for the source of [`Stream::copy_dtod`].
    pub unsafe fn read_words(&self, region: DeviceRegion) -> Result<Vec<u32>, GpuError> {
        let mut out = vec![0u32; region.words as usize];
        if out.is_empty() {
            self.synchronize()?;
            return Ok(out);
        }
        // SAFETY: a copy to pageable memory returns only once it is done, so `out` is written
        // before the call returns; the caller guarantees the source.
        unsafe { self.copy_dtoh(out.as_mut_ptr().cast(), region.ptr, region.bytes()) }?;
        self.synchronize()?;
        Ok(out)
    }
}
