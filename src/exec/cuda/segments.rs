//! Where a GPU backend's caching allocators get their segments: device segments from
//! `cuMemAlloc`, pinned host segments from `cuMemHostAlloc`.
//!
//! A session maps segments as its allocators ask and keeps them until it ends. A program run maps
//! every segment its program will need *before* the run (mapping memory during a run may
//! synchronize the device, an ordering the program does not have) and zeroes fresh device segments
//! on a private stream, so reads of never-written memory see the same words in every run; its
//! allocators take the prepared segments in order.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::alloc::Memory;
use crate::cuda::{DeviceRegion, Gpu, GpuError, PinnedBuffer, Stream, StreamKind};

/// The next prepared segment, if it has the requested size.
fn take_prepared(prepared: &mut VecDeque<(u64, u64)>, bytes: u64) -> Option<u64> {
    match prepared.front() {
        Some(&(size, base)) if size == bytes => {
            prepared.pop_front();
            Some(base)
        }
        _ => None,
    }
}

/// Device segments mapped with `cuMemAlloc`: the `Memory` of a GPU backend's device caching
/// allocator.
///
/// Dropping it waits for the device and unmaps every segment (`cuMemFree`), so that no work still
/// in flight uses them.
pub struct GpuSegments {
    gpu: Arc<Gpu>,
    segments: Vec<u64>,
    mapped: u64,
    /// A private non-blocking stream that zeroes fresh segments (a program run's): it orders
    /// nothing of the program.
    zero: Option<Stream>,
    /// Segments mapped before a program run, handed out in order: (size, base).
    prepared: VecDeque<(u64, u64)>,
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
    /// No segments yet; they will be mapped on `gpu` as the allocator asks (a session's).
    pub fn new(gpu: Arc<Gpu>) -> Self {
        GpuSegments {
            gpu,
            segments: Vec::new(),
            mapped: 0,
            zero: None,
            prepared: VecDeque::new(),
        }
    }

    /// No segments yet; fresh ones are zeroed before they are handed out (a program run's).
    pub(crate) fn zeroed(gpu: Arc<Gpu>) -> Result<Self, GpuError> {
        let zero = gpu.new_stream(StreamKind::NonBlocking)?;
        let mut s = GpuSegments::new(gpu);
        s.zero = Some(zero);
        Ok(s)
    }

    /// The bytes mapped so far.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped
    }

    /// The base address of every segment, in mapping order.
    pub fn segments(&self) -> &[u64] {
        &self.segments
    }

    /// Maps `bytes` now (zeroed, if fresh segments are) and returns the base.
    pub(crate) fn map_now(&mut self, bytes: u64) -> Result<u64, GpuError> {
        let size = usize::try_from(bytes).map_err(|_| {
            GpuError::InvalidArgument(format!("a segment of {bytes} bytes exceeds usize"))
        })?;
        let base = self.gpu.map_segment(size)?;
        self.segments.push(base);
        self.mapped = self.mapped.saturating_add(bytes);
        if let Some(zero) = &self.zero {
            let region = DeviceRegion::from_bytes(base, size)?;
            // SAFETY: the segment was just mapped and nothing else uses it yet; it stays mapped
            // until it is released, which first waits for the device to be idle.
            unsafe { zero.memset_d32(region, 0) }?;
            zero.synchronize()?;
        }
        Ok(base)
    }

    /// Maps a segment of `bytes` now, to be handed out by a later [`Memory::map_segment`] of
    /// that size.
    pub(crate) fn prepare(&mut self, bytes: u64) -> Result<(), GpuError> {
        let base = self.map_now(bytes)?;
        self.prepared.push_back((bytes, base));
        Ok(())
    }

    /// The private stream of a program run, for reading memory back once the device is idle.
    pub(crate) fn reader(&self) -> Option<&Stream> {
        self.zero.as_ref()
    }

    /// Unmaps every segment; the first error is returned. The caller has synchronized the device.
    pub(crate) fn release(&mut self) -> Result<(), GpuError> {
        let mut first = Ok(());
        self.prepared.clear();
        for base in self.segments.drain(..) {
            if let Err(e) = self.gpu.unmap_segment(base) {
                tracing::warn!(error = %e, base, "cuMemFree of a segment failed");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        self.mapped = 0;
        first
    }
}

impl Memory for GpuSegments {
    type Error = GpuError;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, GpuError> {
        match take_prepared(&mut self.prepared, bytes) {
            Some(base) => Ok(base),
            None => self.map_now(bytes),
        }
    }
}

impl Drop for GpuSegments {
    fn drop(&mut self) {
        if !self.segments.is_empty() {
            // Never unmap while a kernel may run.
            if let Err(e) = self.gpu.synchronize() {
                tracing::warn!(error = %e, "device synchronization before unmapping failed");
            }
            let _ = self.release();
        }
    }
}

/// Pinned host segments from `cuMemHostAlloc` (mapped into the device address space, zeroed): the
/// `Memory` of a GPU backend's host caching allocator. Addresses are device addresses.
///
/// Dropping it frees every segment (`cuMemFreeHost`); synchronize first.
pub struct PinnedSegments {
    gpu: Arc<Gpu>,
    buffers: BTreeMap<u64, PinnedBuffer>,
    /// Segments allocated before a program run, handed out in order (see [`GpuSegments`]).
    prepared: VecDeque<(u64, u64)>,
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
            prepared: VecDeque::new(),
        }
    }

    /// Allocates `bytes` now (rounded up to whole words) and returns the device address.
    pub(crate) fn map_now(&mut self, bytes: u64) -> Result<u64, GpuError> {
        let n = usize::try_from(bytes.div_ceil(4) * 4).map_err(|_| {
            GpuError::InvalidArgument(format!("a pinned segment of {bytes} bytes exceeds usize"))
        })?;
        let buffer = self.gpu.alloc_pinned(n)?;
        let base = buffer.device_ptr();
        self.buffers.insert(base, buffer);
        Ok(base)
    }

    /// Allocates a segment of `bytes` now, to be handed out by a later [`Memory::map_segment`]
    /// of that size.
    pub(crate) fn prepare(&mut self, bytes: u64) -> Result<(), GpuError> {
        let base = self.map_now(bytes)?;
        self.prepared.push_back((bytes, base));
        Ok(())
    }

    /// The host address of the `bytes` bytes at device address `addr`, if one segment holds
    /// them.
    pub(crate) fn host_ptr(&mut self, addr: u64, bytes: u64) -> Option<*mut u8> {
        let (&base, buffer) = self.buffers.range_mut(..=addr).next_back()?;
        let end = addr.checked_add(bytes)?;
        if end > base + buffer.bytes() as u64 {
            return None;
        }
        // SAFETY: `addr - base` bytes from the start stay inside the allocation (checked above).
        Some(unsafe { buffer.as_mut_ptr().cast::<u8>().add((addr - base) as usize) })
    }

    /// Frees every segment. The caller has synchronized the device.
    pub(crate) fn release(&mut self) {
        self.prepared.clear();
        self.buffers.clear();
    }
}

impl Memory for PinnedSegments {
    type Error = GpuError;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, GpuError> {
        match take_prepared(&mut self.prepared, bytes) {
            Some(base) => Ok(base),
            None => self.map_now(bytes),
        }
    }
}
