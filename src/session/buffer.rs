//! Buffers and regions: device memory from the caching allocator, pinned host memory, and views.
//!
//! | CPU | here |
//! |---|---|
//! | `Vec<T>` | [`DeviceBuffer<T>`], [`PinnedBuffer<T>`] |
//! | `&v[a..b]` | [`Region`] (a byte range of one buffer, untyped, `Copy`) |

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::panic::Location;
use std::sync::Arc;

use super::core::{Core, SessionError, WORD};
use super::handle::Stream;
use crate::trace::{Id, MemoryKind};

pub use super::core::Region;

/// A type the buffers hold: one 32-bit word, as the kernels see memory.
///
/// Implemented for `u32`, `i32` and `f32`. Buffers store each element as the word
/// [`Element::to_word`] gives; every length and offset is counted in elements of 4 bytes.
pub trait Element: Copy + Send + Sync + 'static {
    /// The element's bits as a word.
    fn to_word(self) -> u32;
    /// The element whose bits are `word`.
    fn from_word(word: u32) -> Self;
}

impl Element for u32 {
    fn to_word(self) -> u32 {
        self
    }
    fn from_word(word: u32) -> Self {
        word
    }
}

impl Element for i32 {
    fn to_word(self) -> u32 {
        self as u32
    }
    fn from_word(word: u32) -> Self {
        word as i32
    }
}

impl Element for f32 {
    fn to_word(self) -> u32 {
        self.to_bits()
    }
    fn from_word(word: u32) -> Self {
        f32::from_bits(word)
    }
}

/// Something that names a region: a buffer (the whole of it) or a [`Region`].
pub trait AsRegion {
    /// The region.
    fn region(&self) -> Region;
}

impl AsRegion for Region {
    fn region(&self) -> Region {
        *self
    }
}

impl<R: AsRegion + ?Sized> AsRegion for &R {
    fn region(&self) -> Region {
        (**self).region()
    }
}

impl<R: AsRegion + ?Sized> AsRegion for &mut R {
    fn region(&self) -> Region {
        (**self).region()
    }
}

/// `range` over `len` elements as (first element, element count), if it fits.
fn element_range(range: impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then(|| (start, end - start))
}

fn slice_of(region: &Region, range: impl RangeBounds<usize>, len: usize) -> Option<Region> {
    let (start, n) = element_range(range, len)?;
    region.sub(start as u64 * WORD, n as u64 * WORD)
}

/// Device memory from the session's caching allocator, owned by a stream: the `CudaSlice<T>` of
/// this harness (see [`Session::alloc`](super::Session::alloc)).
///
/// A `&DeviceBuffer` given to a launch is a read, a `&mut DeviceBuffer` a write. Freeing it
/// ([`DeviceBuffer::free`], or dropping it) returns its block to the owning stream's pool at once,
/// as PyTorch does when a tensor's last reference goes: only
/// [`Session::record_stream`](super::Session::record_stream) makes the block wait for other
/// streams.
pub struct DeviceBuffer<T: Element> {
    pub(crate) core: Arc<Core>,
    pub(crate) region: Region,
    pub(crate) id: Id,
    len: usize,
    freed: bool,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Element> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("ptr", &format_args!("{:#x}", self.region.base))
            .finish()
    }
}

impl<T: Element> DeviceBuffer<T> {
    pub(crate) fn alloc(
        core: &Arc<Core>,
        stream: &Stream,
        name: Option<&str>,
        len: usize,
        site: &'static Location<'static>,
    ) -> Result<Self, SessionError> {
        let bytes = bytes_of(len, MemoryKind::Device)?;
        let (region, id) = core.alloc(MemoryKind::Device, Some(stream.key()), name, bytes, site)?;
        Ok(DeviceBuffer {
            core: core.clone(),
            region,
            id,
            len,
            freed: false,
            _elem: PhantomData,
        })
    }

    /// Length in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.region.bytes
    }

    /// The device address of element 0 (0 for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.region.base
    }

    /// The buffer's id in the trace and in reports.
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// The elements `range` as a region (a view at an offset).
    ///
    /// # Panics
    ///
    /// If `range` is out of bounds, like `&v[range]`; [`DeviceBuffer::get`] does not panic.
    #[track_caller]
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Region {
        match slice_of(&self.region, range, self.len) {
            Some(r) => r,
            None => panic!(
                "range out of bounds of buffer {} of {} elements",
                self.id, self.len
            ),
        }
    }

    /// The elements `range` as a region, or `None` if out of bounds.
    pub fn get(&self, range: impl RangeBounds<usize>) -> Option<Region> {
        slice_of(&self.region, range, self.len)
    }

    /// Frees the buffer back to the caching allocator: its block goes to the owning stream's pool
    /// now (a caching free, `free` with no stream).
    #[track_caller]
    pub fn free(mut self) -> Result<(), SessionError> {
        self.freed = true;
        self.core.free(&self.region, None, Some(Location::caller()))
    }

    /// Frees the buffer in stream order on `stream` (`cudaFreeAsync`): its block goes to
    /// `stream`'s pool, for allocations on `stream` that follow in stream order.
    #[track_caller]
    pub fn free_on(mut self, stream: &Stream) -> Result<(), SessionError> {
        self.freed = true;
        self.core
            .free(&self.region, Some(stream.key()), Some(Location::caller()))
    }
}

impl<T: Element> AsRegion for DeviceBuffer<T> {
    fn region(&self) -> Region {
        self.region
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if !self.freed {
            self.core.drop_free(&self.region, None);
        }
    }
}

/// Pinned (page-locked) host memory from the session's host caching allocator, owned by the
/// host: the staging buffer of asynchronous copies.
///
/// The host reads and writes it directly ([`PinnedBuffer::read`], [`PinnedBuffer::write_with`]),
/// with no synchronization: reading what a copy writes before waiting for the copy is a data race
/// in the report, and on a GPU returns whatever the copy had written so far.
pub struct PinnedBuffer<T: Element> {
    pub(crate) core: Arc<Core>,
    pub(crate) region: Region,
    pub(crate) id: Id,
    len: usize,
    freed: bool,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Element> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("ptr", &format_args!("{:#x}", self.region.base))
            .finish()
    }
}

impl<T: Element> PinnedBuffer<T> {
    pub(crate) fn alloc(
        core: &Arc<Core>,
        name: Option<&str>,
        len: usize,
        site: &'static Location<'static>,
    ) -> Result<Self, SessionError> {
        let bytes = bytes_of(len, MemoryKind::Pinned)?;
        let (region, id) = core.alloc(MemoryKind::Pinned, None, name, bytes, site)?;
        Ok(PinnedBuffer {
            core: core.clone(),
            region,
            id,
            len,
            freed: false,
            _elem: PhantomData,
        })
    }

    /// Length in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.region.bytes
    }

    /// The device-mapped address of element 0 (0 for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.region.base
    }

    /// The buffer's id in the trace and in reports.
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// The elements `range` as a region.
    ///
    /// # Panics
    ///
    /// If `range` is out of bounds; [`PinnedBuffer::get`] does not panic.
    #[track_caller]
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Region {
        match slice_of(&self.region, range, self.len) {
            Some(r) => r,
            None => panic!(
                "range out of bounds of buffer {} of {} elements",
                self.id, self.len
            ),
        }
    }

    /// The elements `range` as a region, or `None` if out of bounds.
    pub fn get(&self, range: impl RangeBounds<usize>) -> Option<Region> {
        slice_of(&self.region, range, self.len)
    }

    /// The host reads the whole buffer now (a `host_read`), without waiting for anything.
    #[track_caller]
    pub fn read(&self) -> Result<Vec<T>, SessionError> {
        let words = self.core.host_read(&self.region, Location::caller())?;
        Ok(words.into_iter().map(T::from_word).collect())
    }

    /// The host reads the whole buffer now (a `host_read`) and passes it to `f`.
    ///
    /// `f` sees a copy taken at the call, so a copy still writing the buffer cannot change it under
    /// `f`; it runs after the session's lock is released and may call the session.
    #[track_caller]
    pub fn read_with<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R, SessionError> {
        let words = self.read()?;
        Ok(f(&words))
    }

    /// The host writes the whole buffer now (a `host_write`): `f` fills the elements, which start
    /// as the buffer's current contents, and the result is stored when `f` returns.
    ///
    /// It runs under the session's lock: `f` must not call the session.
    #[track_caller]
    pub fn write_with(&mut self, f: impl FnOnce(&mut [T])) -> Result<(), SessionError> {
        let mut f = Some(f);
        self.core.host_write_with(
            &self.region,
            &mut |words: &mut [u32]| {
                let mut elems: Vec<T> = words.iter().map(|&w| T::from_word(w)).collect();
                if let Some(f) = f.take() {
                    f(&mut elems);
                }
                for (w, e) in words.iter_mut().zip(&elems) {
                    *w = e.to_word();
                }
            },
            Location::caller(),
        )
    }

    /// The host writes `data` into the buffer now (a `host_write`).
    #[track_caller]
    pub fn write(&mut self, data: &[T]) -> Result<(), SessionError> {
        if data.len() != self.len {
            return Err(SessionError::InvalidArgument(format!(
                "writing {} elements into pinned buffer {} of {}",
                data.len(),
                self.id,
                self.len
            )));
        }
        self.core.host_write_with(
            &self.region,
            &mut |words: &mut [u32]| {
                for (w, e) in words.iter_mut().zip(data) {
                    *w = e.to_word();
                }
            },
            Location::caller(),
        )
    }

    /// Frees the buffer back to the host caching allocator (a caching free by the host): its block
    /// can be handed out again at once.
    #[track_caller]
    pub fn free(mut self) -> Result<(), SessionError> {
        self.freed = true;
        self.core.free(&self.region, None, Some(Location::caller()))
    }
}

impl<T: Element> AsRegion for PinnedBuffer<T> {
    fn region(&self) -> Region {
        self.region
    }
}

impl<T: Element> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if !self.freed {
            self.core.drop_free(&self.region, None);
        }
    }
}

fn bytes_of(len: usize, memory: MemoryKind) -> Result<u64, SessionError> {
    (len as u64)
        .checked_mul(WORD)
        .ok_or_else(|| SessionError::Alloc {
            bytes: u64::MAX,
            memory,
            reason: format!("{len} elements of 4 bytes overflow 2^64 bytes"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(bytes: u64) -> Region {
        Region {
            key: 1,
            base: 0x1000,
            bytes,
            whole: true,
            ..Region::default()
        }
    }

    #[test]
    fn element_ranges() {
        assert_eq!(element_range(.., 10), Some((0, 10)));
        assert_eq!(element_range(2..5, 10), Some((2, 3)));
        assert_eq!(element_range(2..=5, 10), Some((2, 4)));
        assert_eq!(element_range(5..5, 10), Some((5, 0)));
        assert_eq!(element_range(5..11, 10), None);
        let (six, five) = (6, 5);
        assert_eq!(element_range(six..five, 10), None);
        assert_eq!(element_range(..=usize::MAX, 10), None);
    }

    #[test]
    fn slices_are_element_ranges() {
        let t = slice_of(&region(64), 1..3, 16).unwrap();
        assert_eq!((t.offset(), t.bytes()), (4, 8));
    }
}
