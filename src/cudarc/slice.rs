//! Device memory and views: cudarc's `CudaSlice<T>` (`Vec<T>` on the device), `CudaView`
//! (`&[T]`) and `CudaViewMut` (`&mut [T]`), over regions of the session's caching allocator.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::session::Region;

use super::context::{CudaContext, DriverError};
use super::stream::CudaStream;

/// A type that lives in device memory and can be passed to a kernel by value, as cudarc's
/// `DeviceRepr`.
///
/// Implemented for the integers, `f32`, `f64`, `half::f16`, `half::bf16` and arrays of them;
/// implement it for your own `#[repr(C)]` structs.
///
/// # Safety
///
/// The type must be plain data, stricter than cudarc asks: `#[repr(C)]` (or a primitive) with
/// no padding bytes, no pointers or references the host would follow, and every bit pattern of
/// its size a valid value. The facade copies elements as bytes, and on the simulator a kernel
/// writes bits of its own (so `bool` is not `DeviceRepr` here: pass it to kernels by value only).
pub unsafe trait DeviceRepr: Copy + 'static {}

/// A type whose all-zero bit pattern is a valid value, as cudarc's `ValidAsZeroBits`
/// (for [`CudaStream::alloc_zeros`] and [`CudaStream::memset_zeros`]).
///
/// # Safety
///
/// Zeroed memory must be a valid value of the type.
pub unsafe trait ValidAsZeroBits {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive with no padding, valid for every bit pattern.
        unsafe impl DeviceRepr for $t {}
        // SAFETY: zero is a valid value of the primitive.
        unsafe impl ValidAsZeroBits for $t {}
    )*};
}
plain!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize, f32, f64);
plain!(half::f16, half::bf16);
// SAFETY: an array of plain data is plain data.
unsafe impl<T: DeviceRepr, const N: usize> DeviceRepr for [T; N] {}
// SAFETY: an array of zero-valid values is zero-valid.
unsafe impl<T: ValidAsZeroBits, const N: usize> ValidAsZeroBits for [T; N] {}
// SAFETY: `false` is all zeros.
unsafe impl ValidAsZeroBits for bool {}

/// The bytes of `v`.
pub(crate) fn as_bytes<T: DeviceRepr>(v: &[T]) -> &[u8] {
    // SAFETY: `DeviceRepr` types have no padding, so every byte of `v` is initialized.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Writes `bytes` over the elements of `dst` (as many whole bytes as both have).
pub(crate) fn fill_from_bytes<T: DeviceRepr>(dst: &mut [T], bytes: &[u8]) {
    let n = std::mem::size_of_val(dst).min(bytes.len());
    // SAFETY: `dst` has room for `n` bytes; every bit pattern is a valid `DeviceRepr` value.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n) }
}

/// Elements `bounds` of `len` as (first, end), if they fit (cudarc's `to_range`).
fn to_range(bounds: impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match bounds.start_bound() {
        Bound::Included(&n) => n,
        Bound::Excluded(&n) => n.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match bounds.end_bound() {
        Bound::Included(&n) => n.checked_add(1)?,
        Bound::Excluded(&n) => n,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then_some((start, end))
}

/// The byte range of elements `[start, end)` of a region of `T`s.
fn sub_region<T>(region: &Region, start: usize, end: usize) -> Option<Region> {
    let size = std::mem::size_of::<T>() as u64;
    region.byte_range(start as u64 * size, (end - start) as u64 * size)
}

/// `Vec<T>` on the device, as cudarc's `CudaSlice<T>`: a block of the session's caching
/// allocator, owned by the stream it was allocated on.
///
/// Dropping it frees the block in stream order on that stream (`cuMemFreeAsync`, as cudarc
/// does): the allocator hands it to the next allocation on that stream at once, so another
/// stream still using it is a hazard (`unsafe-free`, then `reuse-race` at the new owner's
/// access) unless that stream's work was ordered before the drop.
pub struct CudaSlice<T> {
    pub(crate) region: Region,
    /// The device address of element 0, for kernel arguments (a pointer to it is the argument).
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) freed: bool,
    pub(crate) _elem: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for CudaSlice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaSlice")
            .field("len", &self.len)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish_non_exhaustive()
    }
}

impl<T> CudaSlice<T> {
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

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.stream.ctx.ordinal()
    }

    /// The context this belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.stream.ctx
    }

    /// The stream this was allocated on and is freed on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The session's region of the whole slice: for the session's own calls
    /// (`record_stream`, hand-described launches with [`LaunchArgs::reads`](super::LaunchArgs::reads)).
    pub fn region(&self) -> Region {
        self.region
    }

    /// The device address of element 0 (a simulated address on the simulator). Work through it
    /// is not recorded unless described by hand.
    pub fn device_ptr_raw(&self) -> u64 {
        self.ptr
    }

    /// The whole slice as a view (`&v[..]`).
    pub fn as_view(&self) -> CudaView<'_, T> {
        CudaView {
            region: self.region,
            ptr: self.ptr,
            len: self.len,
            stream: &self.stream,
            _elem: PhantomData,
        }
    }

    /// The whole slice as a mutable view (`&mut v[..]`).
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        CudaViewMut {
            region: self.region,
            ptr: self.ptr,
            len: self.len,
            stream: &self.stream,
            _elem: PhantomData,
        }
    }

    /// Elements `bounds` as a view: a launch or copy that takes it touches only those bytes.
    ///
    /// # Panics
    ///
    /// If `bounds` is out of range, like `&v[a..b]`; [`CudaSlice::try_slice`] does not panic.
    #[track_caller]
    pub fn slice(&self, bounds: impl RangeBounds<usize>) -> CudaView<'_, T> {
        self.as_view().slice(bounds)
    }

    /// Elements `bounds` as a view, or `None` if out of range.
    pub fn try_slice(&self, bounds: impl RangeBounds<usize>) -> Option<CudaView<'_, T>> {
        self.as_view().try_slice(bounds)
    }

    /// Elements `bounds` as a mutable view.
    ///
    /// # Panics
    ///
    /// If `bounds` is out of range; [`CudaSlice::try_slice_mut`] does not panic.
    #[track_caller]
    pub fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        let len = self.len;
        match self.try_slice_mut(bounds) {
            Some(v) => v,
            None => panic!("range out of bounds of a CudaSlice of {len} elements"),
        }
    }

    /// Elements `bounds` as a mutable view, or `None` if out of range.
    pub fn try_slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> Option<CudaViewMut<'_, T>> {
        let (start, end) = to_range(bounds, self.len)?;
        Some(CudaViewMut {
            region: sub_region::<T>(&self.region, start, end)?,
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len: end - start,
            stream: &self.stream,
            _elem: PhantomData,
        })
    }

    /// The two halves at `mid` as views.
    ///
    /// # Panics
    ///
    /// If `mid > len`.
    #[track_caller]
    pub fn split_at(&self, mid: usize) -> (CudaView<'_, T>, CudaView<'_, T>) {
        self.as_view().split_at(mid)
    }

    /// The two halves at `mid` as mutable views, which do not overlap.
    ///
    /// # Panics
    ///
    /// If `mid > len`.
    #[track_caller]
    pub fn split_at_mut(&mut self, mid: usize) -> (CudaViewMut<'_, T>, CudaViewMut<'_, T>) {
        let len = self.len;
        match self.try_split_at_mut(mid) {
            Some(halves) => halves,
            None => panic!("split at {mid} of a CudaSlice of {len} elements"),
        }
    }

    /// The two halves at `mid` as mutable views, or `None` if `mid > len`.
    pub fn try_split_at_mut(
        &mut self,
        mid: usize,
    ) -> Option<(CudaViewMut<'_, T>, CudaViewMut<'_, T>)> {
        if mid > self.len {
            return None;
        }
        let size = std::mem::size_of::<T>();
        let a = CudaViewMut {
            region: sub_region::<T>(&self.region, 0, mid)?,
            ptr: self.ptr,
            len: mid,
            stream: &self.stream,
            _elem: PhantomData,
        };
        let b = CudaViewMut {
            region: sub_region::<T>(&self.region, mid, self.len)?,
            ptr: self.ptr + (mid * size) as u64,
            len: self.len - mid,
            stream: &self.stream,
            _elem: PhantomData,
        };
        Some((a, b))
    }

    /// The memory as `len` elements of another type, if it has room for them.
    ///
    /// # Safety
    ///
    /// The bytes must be valid values of `S`.
    pub unsafe fn transmute<S>(&self, len: usize) -> Option<CudaView<'_, S>> {
        // SAFETY: the caller's contract.
        unsafe { self.as_view().transmute(len) }
    }
}

impl<T> Drop for CudaSlice<T> {
    fn drop(&mut self) {
        if !self.freed {
            self.freed = true;
            self.stream
                .ctx
                .session
                .core()
                .drop_free(&self.region, Some(self.stream.stream.key()));
        }
    }
}

impl<T: DeviceRepr> CudaSlice<T> {
    /// A new slice on the same stream with a copy of this one (a `copy` on that stream).
    #[track_caller]
    pub fn try_clone(&self) -> Result<Self, DriverError> {
        self.stream.clone_dtod(self)
    }
}

impl<T: DeviceRepr> Clone for CudaSlice<T> {
    /// [`CudaSlice::try_clone`].
    ///
    /// # Panics
    ///
    /// If the copy fails (as cudarc's `clone` does).
    #[track_caller]
    fn clone(&self) -> Self {
        match self.try_clone() {
            Ok(s) => s,
            Err(e) => panic!("cloning a CudaSlice failed: {e}"),
        }
    }
}

impl<T: DeviceRepr> TryFrom<CudaSlice<T>> for Vec<T> {
    type Error = DriverError;
    #[track_caller]
    fn try_from(value: CudaSlice<T>) -> Result<Self, Self::Error> {
        value.stream.clone().clone_dtoh(&value)
    }
}

/// `&[T]` on the device, as cudarc's `CudaView`: elements of a [`CudaSlice`] (a byte range of
/// its block). A launch that takes it as an argument reads exactly those bytes.
pub struct CudaView<'a, T> {
    pub(crate) region: Region,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) _elem: PhantomData<&'a [T]>,
}

impl<T> fmt::Debug for CudaView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaView")
            .field("len", &self.len)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl<'a, T> CudaView<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The session's region of the view.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Elements `bounds` of this view.
    ///
    /// # Panics
    ///
    /// If `bounds` is out of range.
    #[track_caller]
    pub fn slice(&self, bounds: impl RangeBounds<usize>) -> Self {
        match self.try_slice(bounds) {
            Some(v) => v,
            None => panic!("range out of bounds of a CudaView of {} elements", self.len),
        }
    }

    /// Elements `bounds` of this view, or `None` if out of range.
    pub fn try_slice(&self, bounds: impl RangeBounds<usize>) -> Option<Self> {
        let (start, end) = to_range(bounds, self.len)?;
        Some(CudaView {
            region: sub_region::<T>(&self.region, start, end)?,
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len: end - start,
            stream: self.stream,
            _elem: PhantomData,
        })
    }

    /// The two halves at `mid`.
    ///
    /// # Panics
    ///
    /// If `mid > len`.
    #[track_caller]
    pub fn split_at(&self, mid: usize) -> (Self, Self) {
        match (self.try_slice(..mid), self.try_slice(mid..)) {
            (Some(a), Some(b)) => (a, b),
            _ => panic!("split at {mid} of a CudaView of {} elements", self.len),
        }
    }

    /// The memory as `len` elements of another type, if it has room for them.
    ///
    /// # Safety
    ///
    /// The bytes must be valid values of `S`.
    pub unsafe fn transmute<S>(&self, len: usize) -> Option<CudaView<'a, S>> {
        let bytes = len.checked_mul(std::mem::size_of::<S>())? as u64;
        Some(CudaView {
            region: self.region.byte_range(0, bytes)?,
            ptr: self.ptr,
            len,
            stream: self.stream,
            _elem: PhantomData,
        })
    }
}

/// `&mut [T]` on the device, as cudarc's `CudaViewMut`. A launch that takes it as a `&mut`
/// argument writes exactly those bytes.
pub struct CudaViewMut<'a, T> {
    pub(crate) region: Region,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) _elem: PhantomData<&'a mut [T]>,
}

impl<T> fmt::Debug for CudaViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaViewMut")
            .field("len", &self.len)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl<'a, T> CudaViewMut<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The session's region of the view.
    pub fn region(&self) -> Region {
        self.region
    }

    /// This view as a shared one.
    pub fn as_view(&self) -> CudaView<'_, T> {
        CudaView {
            region: self.region,
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _elem: PhantomData,
        }
    }

    /// This view as a shared one, for the rest of its lifetime.
    pub fn into_view(self) -> CudaView<'a, T> {
        CudaView {
            region: self.region,
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _elem: PhantomData,
        }
    }

    /// Elements `bounds` of this view, shared.
    ///
    /// # Panics
    ///
    /// If `bounds` is out of range.
    #[track_caller]
    pub fn slice(&self, bounds: impl RangeBounds<usize>) -> CudaView<'_, T> {
        self.as_view().slice(bounds)
    }

    /// Elements `bounds` of this view.
    ///
    /// # Panics
    ///
    /// If `bounds` is out of range.
    #[track_caller]
    pub fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        let len = self.len;
        match self.try_slice_mut(bounds) {
            Some(v) => v,
            None => panic!("range out of bounds of a CudaViewMut of {len} elements"),
        }
    }

    /// Elements `bounds` of this view, or `None` if out of range.
    pub fn try_slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> Option<CudaViewMut<'_, T>> {
        let (start, end) = to_range(bounds, self.len)?;
        Some(CudaViewMut {
            region: sub_region::<T>(&self.region, start, end)?,
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len: end - start,
            stream: self.stream,
            _elem: PhantomData,
        })
    }

    /// The two halves at `mid`, which do not overlap.
    ///
    /// # Panics
    ///
    /// If `mid > len`.
    #[track_caller]
    pub fn split_at_mut(&mut self, mid: usize) -> (CudaViewMut<'_, T>, CudaViewMut<'_, T>) {
        let len = self.len;
        let halves = (mid <= len)
            .then(|| {
                let a = sub_region::<T>(&self.region, 0, mid)?;
                let b = sub_region::<T>(&self.region, mid, len)?;
                Some((a, b))
            })
            .flatten();
        let Some((ra, rb)) = halves else {
            panic!("split at {mid} of a CudaViewMut of {len} elements")
        };
        let size = std::mem::size_of::<T>();
        (
            CudaViewMut {
                region: ra,
                ptr: self.ptr,
                len: mid,
                stream: self.stream,
                _elem: PhantomData,
            },
            CudaViewMut {
                region: rb,
                ptr: self.ptr + (mid * size) as u64,
                len: len - mid,
                stream: self.stream,
                _elem: PhantomData,
            },
        )
    }
}

/// What [`CudaSlice`], [`CudaView`] and [`CudaViewMut`] have in common, as cudarc's
/// `DeviceSlice`.
pub trait DeviceSlice<T> {
    /// The number of elements.
    fn len(&self) -> usize;
    /// The number of bytes.
    fn num_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
    /// Whether there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The stream the memory was allocated on.
    fn stream(&self) -> &Arc<CudaStream>;
    /// The session's region of the memory.
    fn region(&self) -> Region;
}

/// Memory a copy or a kernel may read: [`CudaSlice`] and [`CudaView`] (cudarc's `DevicePtr`).
pub trait DevicePtr<T>: DeviceSlice<T> {}

/// Memory a copy or a kernel may write: [`CudaSlice`] and [`CudaViewMut`] (cudarc's
/// `DevicePtrMut`).
pub trait DevicePtrMut<T>: DeviceSlice<T> {}

impl<T> DeviceSlice<T> for CudaSlice<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    fn region(&self) -> Region {
        self.region
    }
}

impl<T> DeviceSlice<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
    fn region(&self) -> Region {
        self.region
    }
}

impl<T> DeviceSlice<T> for CudaViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
    fn region(&self) -> Region {
        self.region
    }
}

impl<T> DevicePtr<T> for CudaSlice<T> {}
impl<T> DevicePtr<T> for CudaView<'_, T> {}
impl<T> DevicePtrMut<T> for CudaSlice<T> {}
impl<T> DevicePtrMut<T> for CudaViewMut<'_, T> {}
