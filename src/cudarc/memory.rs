//! Allocation and copies on a stream, pinned host memory, and the host side of copies.

use std::fmt;
use std::marker::PhantomData;
use std::panic::Location;
use std::sync::Arc;

use crate::session::Region;
use crate::trace::MemoryKind;

use super::context::{CudaContext, DriverError};
use super::slice::{
    as_bytes, fill_from_bytes, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits,
};
use super::stream::CudaStream;

/// Page-locked host memory, as cudarc's `PinnedHostSlice<T>`: from the session's host caching
/// allocator, owned by the host. Copies between it and the device are asynchronous (`copy` ops
/// on their stream), so the host must wait for them before touching it.
///
/// The host touches it through [`PinnedHostSlice::read`] and [`PinnedHostSlice::write`], which
/// copy and are recorded as `host_read` and `host_write` at the call. (cudarc's `as_slice` and
/// `as_mut_slice` hand out references into memory a copy may be writing; the facade does not.)
/// Dropping it frees the block back to the host pool at once.
pub struct PinnedHostSlice<T> {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) region: Region,
    pub(crate) len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for PinnedHostSlice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostSlice")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl CudaContext {
    /// Allocates `len` elements of pinned host memory (an `alloc` of `pinned` memory).
    ///
    /// # Safety
    ///
    /// None beyond cudarc's: the memory holds whatever the block held (unsafe to match
    /// cudarc's signature; reading it is defined here, as elements are plain data).
    #[track_caller]
    pub unsafe fn alloc_pinned<T: DeviceRepr>(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<PinnedHostSlice<T>, DriverError> {
        let bytes = bytes_of::<T>(len)?;
        let (region, _) =
            self.session
                .core()
                .alloc(MemoryKind::Pinned, None, None, bytes, Location::caller())?;
        Ok(PinnedHostSlice {
            ctx: self.clone(),
            region,
            len,
            _elem: PhantomData,
        })
    }
}

impl<T> PinnedHostSlice<T> {
    /// The context this was allocated in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The number of bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The session's region of the whole buffer.
    pub fn region(&self) -> Region {
        self.region
    }
}

impl<T: DeviceRepr> PinnedHostSlice<T> {
    /// The host reads the elements now, without waiting for anything: a `host_read`. Reading
    /// what a copy writes before waiting for it is a data race in the report (and on a GPU
    /// returns whatever the copy had written so far).
    #[track_caller]
    pub fn read(&self) -> Result<Vec<T>, DriverError> {
        let bytes = self
            .ctx
            .session
            .core()
            .host_read_bytes(&self.region, Location::caller())?;
        Ok(vec_from_bytes(&bytes, self.len))
    }

    /// The host writes `data` over the elements now: a `host_write`. `data` must have
    /// [`PinnedHostSlice::len`] elements.
    #[track_caller]
    pub fn write(&mut self, data: &[T]) -> Result<(), DriverError> {
        if data.len() != self.len {
            return Err(DriverError::invalid(format!(
                "writing {} elements into pinned memory of {}",
                data.len(),
                self.len
            )));
        }
        Ok(self.ctx.session.core().host_write_bytes(
            &self.region,
            as_bytes(data),
            Location::caller(),
        )?)
    }
}

impl<T> Drop for PinnedHostSlice<T> {
    fn drop(&mut self) {
        self.ctx.session.core().drop_free(&self.region, None);
    }
}

/// `len` elements of `T` in bytes.
fn bytes_of<T>(len: usize) -> Result<u64, DriverError> {
    len.checked_mul(std::mem::size_of::<T>())
        .map(|b| b as u64)
        .ok_or_else(|| DriverError::invalid(format!("{len} elements overflow usize bytes")))
}

/// A vector of `len` elements from their bytes.
fn vec_from_bytes<T: DeviceRepr>(bytes: &[u8], len: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    let n = bytes.len().min(len * std::mem::size_of::<T>());
    // SAFETY: `v` has room for `len` elements; `n` bytes are copied into it, and every bit
    // pattern is a valid `DeviceRepr` value, so the first `n / size` elements are initialized.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n);
        v.set_len(n / std::mem::size_of::<T>().max(1));
    }
    if std::mem::size_of::<T>() == 0 {
        // SAFETY: zero-sized values need no bytes.
        unsafe { v.set_len(len) };
    }
    v
}

pub(crate) mod sealed {
    use super::*;

    /// Host memory as a copy sees it.
    pub enum HostRef<'a, T> {
        /// Pageable memory: the copy is staged (to the device) or waited for (from it).
        Pageable(&'a [T]),
        /// Pinned memory of the session: the copy is asynchronous.
        Pinned(Region),
    }

    /// Host memory as a copy to the host sees it.
    pub enum HostMut<'a, T> {
        /// Pageable memory.
        Pageable(&'a mut [T]),
        /// Pinned memory of the session.
        Pinned(Region),
    }

    /// The private half of [`HostSlice`](super::HostSlice).
    pub trait HostSliceImpl<T> {
        fn host(&self) -> HostRef<'_, T>;
        fn host_mut(&mut self) -> HostMut<'_, T>;
    }
}

use sealed::{HostMut, HostRef, HostSliceImpl};

/// Host memory a copy can read or write, as cudarc's `HostSlice`: `[T]`, `[T; N]`, `Vec<T>`
/// (pageable) and [`PinnedHostSlice<T>`] (pinned).
pub trait HostSlice<T>: HostSliceImpl<T> {
    /// The number of elements.
    fn len(&self) -> usize;
    /// Whether there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> HostSliceImpl<T> for [T] {
    fn host(&self) -> HostRef<'_, T> {
        HostRef::Pageable(self)
    }
    fn host_mut(&mut self) -> HostMut<'_, T> {
        HostMut::Pageable(self)
    }
}
impl<T> HostSlice<T> for [T] {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
}

impl<T, const N: usize> HostSliceImpl<T> for [T; N] {
    fn host(&self) -> HostRef<'_, T> {
        HostRef::Pageable(self)
    }
    fn host_mut(&mut self) -> HostMut<'_, T> {
        HostMut::Pageable(self)
    }
}
impl<T, const N: usize> HostSlice<T> for [T; N] {
    fn len(&self) -> usize {
        N
    }
}

impl<T> HostSliceImpl<T> for Vec<T> {
    fn host(&self) -> HostRef<'_, T> {
        HostRef::Pageable(self)
    }
    fn host_mut(&mut self) -> HostMut<'_, T> {
        HostMut::Pageable(self)
    }
}
impl<T> HostSlice<T> for Vec<T> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

impl<T> HostSliceImpl<T> for PinnedHostSlice<T> {
    fn host(&self) -> HostRef<'_, T> {
        HostRef::Pinned(self.region)
    }
    fn host_mut(&mut self) -> HostMut<'_, T> {
        HostMut::Pinned(self.region)
    }
}
impl<T> HostSlice<T> for PinnedHostSlice<T> {
    fn len(&self) -> usize {
        self.len
    }
}

/// The first `n` elements of `region` (of `T`s), or an error naming `what`.
fn prefix<T>(region: &Region, n: usize, have: usize, what: &str) -> Result<Region, DriverError> {
    if n > have {
        return Err(DriverError::invalid(format!(
            "{what}: {n} elements do not fit in {have}"
        )));
    }
    let bytes = bytes_of::<T>(n)?;
    region
        .byte_range(0, bytes)
        .ok_or_else(|| DriverError::invalid(format!("{what}: {bytes} bytes out of range")))
}

impl CudaStream {
    /// An empty slice on this stream.
    #[track_caller]
    pub fn null<T>(self: &Arc<Self>) -> Result<CudaSlice<T>, DriverError> {
        self.alloc_at(0, Location::caller())
    }

    /// Allocates `len` elements on this stream from the caching allocator (an `alloc` owned by
    /// this stream: another stream must wait for this one before touching it).
    ///
    /// # Safety
    ///
    /// None beyond cudarc's: the memory holds whatever the block held (unsafe to match cudarc's
    /// signature; reading it is defined here, as elements are plain data).
    #[track_caller]
    pub unsafe fn alloc<T: DeviceRepr>(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<CudaSlice<T>, DriverError> {
        self.alloc_at(len, Location::caller())
    }

    pub(crate) fn alloc_at<T>(
        self: &Arc<Self>,
        len: usize,
        site: &'static Location<'static>,
    ) -> Result<CudaSlice<T>, DriverError> {
        let bytes = bytes_of::<T>(len)?;
        let (region, _) = self.ctx.session.core().alloc(
            MemoryKind::Device,
            Some(self.stream.key()),
            None,
            bytes,
            site,
        )?;
        Ok(CudaSlice {
            region,
            ptr: region.device_ptr(),
            len,
            stream: self.clone(),
            freed: false,
            _elem: PhantomData,
        })
    }

    /// Allocates `len` zeroed elements on this stream: an `alloc`, then a `memset` on this
    /// stream.
    #[track_caller]
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<CudaSlice<T>, DriverError> {
        let site = Location::caller();
        let mut dst = self.alloc_at::<T>(len, site)?;
        self.memset_at(dst.region, site)?;
        dst.ptr = dst.region.device_ptr();
        Ok(dst)
    }

    /// Sets every byte of `dst` to zero on this stream (`cuMemsetD8Async`): a `memset`.
    #[track_caller]
    pub fn memset_zeros<T: DeviceRepr + ValidAsZeroBits, Dst: DevicePtrMut<T>>(
        self: &Arc<Self>,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        self.memset_at(dst.region(), Location::caller())
    }

    fn memset_at(&self, dst: Region, site: &'static Location<'static>) -> Result<(), DriverError> {
        Ok(self.ctx.session.core().memset(
            self.stream.key(),
            dst,
            crate::exec::Fill::Byte(0),
            site,
        )?)
    }

    /// A new slice on this stream with a copy of `src`: an `alloc`, then the copy of
    /// [`CudaStream::memcpy_htod`].
    #[track_caller]
    pub fn clone_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized>(
        self: &Arc<Self>,
        src: &Src,
    ) -> Result<CudaSlice<T>, DriverError> {
        let site = Location::caller();
        let mut dst = self.alloc_at::<T>(src.len(), site)?;
        self.htod_at(src, &mut dst, site)?;
        Ok(dst)
    }

    /// Deprecated in cudarc for [`CudaStream::clone_htod`]; the same.
    #[deprecated = "Use clone_htod"]
    #[track_caller]
    pub fn memcpy_stod<T: DeviceRepr, Src: HostSlice<T> + ?Sized>(
        self: &Arc<Self>,
        src: &Src,
    ) -> Result<CudaSlice<T>, DriverError> {
        let site = Location::caller();
        let mut dst = self.alloc_at::<T>(src.len(), site)?;
        self.htod_at(src, &mut dst, site)?;
        Ok(dst)
    }

    /// Copies `src` into the first `src.len()` elements of `dst` on this stream.
    ///
    /// From pageable memory (`&[T]`, `Vec<T>`) the bytes are staged at the call and written in
    /// stream order (`cuMemcpyHtoDAsync`): recorded as a launch `memcpy_htod` writing them, with
    /// no synchronization. From [`PinnedHostSlice`] it is an asynchronous `copy` on this stream:
    /// the host must not write the pinned memory before the copy is done.
    #[track_caller]
    pub fn memcpy_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized, Dst: DevicePtrMut<T>>(
        self: &Arc<Self>,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        self.htod_at(src, dst, Location::caller())
    }

    fn htod_at<T: DeviceRepr, Src: HostSlice<T> + ?Sized, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
        site: &'static Location<'static>,
    ) -> Result<(), DriverError> {
        let to = prefix::<T>(&dst.region(), src.len(), dst.len(), "memcpy_htod")?;
        let core = self.ctx.session.core();
        match src.host() {
            HostRef::Pageable(data) => {
                core.memcpy_htod(self.stream.key(), as_bytes(data), to, false, site)?
            }
            HostRef::Pinned(from) => core.copy(self.stream.key(), from, to, site)?,
        }
        Ok(())
    }

    /// A new vector with a copy of `src` (see [`CudaStream::memcpy_dtoh`]).
    #[track_caller]
    pub fn clone_dtoh<T: DeviceRepr, Src: DevicePtr<T>>(
        self: &Arc<Self>,
        src: &Src,
    ) -> Result<Vec<T>, DriverError> {
        self.dtov_at(src, Location::caller())
    }

    /// Deprecated in cudarc for [`CudaStream::clone_dtoh`]; the same.
    #[deprecated = "Use clone_dtoh"]
    #[track_caller]
    pub fn memcpy_dtov<T: DeviceRepr, Src: DevicePtr<T>>(
        self: &Arc<Self>,
        src: &Src,
    ) -> Result<Vec<T>, DriverError> {
        self.dtov_at(src, Location::caller())
    }

    fn dtov_at<T: DeviceRepr, Src: DevicePtr<T>>(
        &self,
        src: &Src,
        site: &'static Location<'static>,
    ) -> Result<Vec<T>, DriverError> {
        let bytes = self.ctx.session.core().memcpy_dtoh(
            self.stream.key(),
            src.region(),
            "memcpy_dtoh",
            site,
        )?;
        Ok(vec_from_bytes(&bytes, src.len()))
    }

    /// Copies `src` into the first `src.len()` elements of `dst`.
    ///
    /// To pageable memory the call returns once the copy is done: recorded as a launch
    /// `memcpy_dtoh` reading `src` on this stream, then a `stream_sync` of this stream (so the
    /// host is ordered after this stream's work — not after other streams'). To a
    /// [`PinnedHostSlice`] it is an asynchronous `copy` on this stream: wait for it (an event,
    /// or [`CudaStream::synchronize`]) before reading the pinned memory.
    #[track_caller]
    pub fn memcpy_dtoh<T: DeviceRepr, Src: DevicePtr<T>, Dst: HostSlice<T> + ?Sized>(
        self: &Arc<Self>,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        let site = Location::caller();
        let have = dst.len();
        let core = self.ctx.session.core();
        match dst.host_mut() {
            HostMut::Pageable(out) => {
                if src.len() > have {
                    return Err(DriverError::invalid(format!(
                        "memcpy_dtoh: {} elements do not fit in {have}",
                        src.len()
                    )));
                }
                let bytes =
                    core.memcpy_dtoh(self.stream.key(), src.region(), "memcpy_dtoh", site)?;
                fill_from_bytes(out, &bytes);
            }
            HostMut::Pinned(to) => {
                let to = prefix::<T>(&to, src.len(), have, "memcpy_dtoh")?;
                core.copy(self.stream.key(), src.region(), to, site)?;
            }
        }
        Ok(())
    }

    /// Copies `src` into the first `src.len()` elements of `dst` on this stream: a `copy`.
    #[track_caller]
    pub fn memcpy_dtod<T, Src: DevicePtr<T>, Dst: DevicePtrMut<T>>(
        self: &Arc<Self>,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        self.dtod_at(src, dst, Location::caller())
    }

    fn dtod_at<T, Src: DevicePtr<T>, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
        site: &'static Location<'static>,
    ) -> Result<(), DriverError> {
        let to = prefix::<T>(&dst.region(), src.len(), dst.len(), "memcpy_dtod")?;
        Ok(self
            .ctx
            .session
            .core()
            .copy(self.stream.key(), src.region(), to, site)?)
    }

    /// A new slice on this stream with a copy of `src`: an `alloc`, then a `copy`.
    #[track_caller]
    pub fn clone_dtod<T: DeviceRepr, Src: DevicePtr<T>>(
        self: &Arc<Self>,
        src: &Src,
    ) -> Result<CudaSlice<T>, DriverError> {
        let site = Location::caller();
        let mut dst = self.alloc_at::<T>(src.len(), site)?;
        self.dtod_at(src, &mut dst, site)?;
        Ok(dst)
    }
}
