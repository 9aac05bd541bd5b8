//! Regions: byte ranges of a session's buffers, the values every op of the session core takes.

use std::fmt;

use crate::exec::{Span, Spans};
use crate::trace::MemoryKind;

/// The bytes of one word, as the kernels see memory.
pub(crate) const WORD: u64 = 4;

/// A byte range of one buffer: what a kernel, copy or memset reads or writes.
///
/// Regions are plain values (`Copy`), like raw pointers: one may outlive its buffer, and using it
/// after the buffer's free is a `use-after-free` in the report (the memory itself stays mapped
/// until the session ends, so nothing crashes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The session that made it.
    pub(crate) session: u64,
    /// The buffer's key in its session (0 for none).
    pub(crate) key: u64,
    pub(crate) memory: MemoryKind,
    /// Address of the buffer's first byte.
    pub(crate) base: u64,
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    /// The whole buffer (recorded as the bare buffer id).
    pub(crate) whole: bool,
    /// Memory the session did not allocate.
    pub(crate) external: bool,
}

impl Default for Region {
    fn default() -> Self {
        Region {
            session: 0,
            key: 0,
            memory: MemoryKind::Device,
            base: 0,
            offset: 0,
            bytes: 0,
            whole: false,
            external: false,
        }
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("memory", &self.memory)
            .field("ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("offset", &self.offset)
            .field("bytes", &self.bytes)
            .field("external", &self.external)
            .finish()
    }
}

impl Region {
    /// The device address of the region's first byte (for pinned memory, its device-mapped
    /// address; on the simulator, a simulated address).
    pub fn device_ptr(&self) -> u64 {
        self.base + self.offset
    }

    /// First byte, relative to the buffer's start.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Length in 32-bit words.
    pub fn words(&self) -> u64 {
        self.bytes / WORD
    }

    /// The memory kind of the buffer.
    pub fn memory(&self) -> MemoryKind {
        self.memory
    }

    /// Whether the region is of memory the session did not allocate.
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// The sub-region of `bytes` bytes at `offset` bytes into this region, if it fits and is whole
    /// words.
    pub fn sub(&self, offset: u64, bytes: u64) -> Option<Region> {
        let end = offset.checked_add(bytes)?;
        if end > self.bytes || offset % WORD != 0 || bytes % WORD != 0 {
            return None;
        }
        Some(Region {
            offset: self.offset + offset,
            bytes,
            whole: self.whole && offset == 0 && bytes == self.bytes,
            ..*self
        })
    }

    /// The sub-region of `bytes` bytes at `offset` bytes into this region, if it fits, at any
    /// byte offset (the views of typed buffers whose elements are not words).
    pub(crate) fn byte_range(&self, offset: u64, bytes: u64) -> Option<Region> {
        let end = offset.checked_add(bytes)?;
        if end > self.bytes {
            return None;
        }
        Some(Region {
            offset: self.offset + offset,
            bytes,
            whole: self.whole && offset == 0 && bytes == self.bytes,
            ..*self
        })
    }

    /// Whether the two regions share a byte of memory.
    pub(crate) fn overlaps(&self, other: &Region) -> bool {
        let (a, b) = (self.device_ptr(), other.device_ptr());
        self.memory == other.memory
            && a < b.saturating_add(other.bytes)
            && b < a.saturating_add(self.bytes)
            && self.bytes > 0
            && other.bytes > 0
    }
}

impl Region {
    /// The region as the execution layer takes it.
    #[inline]
    pub(crate) fn span(&self) -> Span {
        Span {
            memory: self.memory,
            addr: self.base + self.offset,
            bytes: self.bytes,
            gen: 0,
            external: self.external,
        }
    }
}

/// Up to `N` regions inline, the rest on the heap: the read and write lists of a launch, which
/// rarely name more than a few buffers.
#[derive(Clone)]
pub(crate) struct Regions<const N: usize = 4> {
    len: usize,
    inline: [Region; N],
    spill: Vec<Region>,
}

impl<const N: usize> Default for Regions<N> {
    fn default() -> Self {
        Regions {
            len: 0,
            inline: [Region::default(); N],
            spill: Vec::new(),
        }
    }
}

impl<const N: usize> Regions<N> {
    pub(crate) fn push(&mut self, r: Region) {
        if self.len < N {
            self.inline[self.len] = r;
        } else {
            self.spill.push(r);
        }
        self.len += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Region> + '_ {
        self.inline[..self.len.min(N)].iter().chain(&self.spill)
    }

    pub(crate) fn to_vec(&self) -> Vec<Region> {
        self.iter().copied().collect()
    }
}

impl<const N: usize> fmt::Debug for Regions<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<const N: usize> Regions<N> {
    /// Region `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Region {
        if i < N {
            self.inline[i]
        } else {
            self.spill[i - N]
        }
    }
}

impl<const N: usize> Spans for Regions<N> {
    fn count(&self) -> usize {
        self.len
    }
    fn span(&self, i: usize) -> Span {
        self.get(i).span()
    }
}

/// A slice of regions as the execution layer takes it.
pub(crate) struct RegionSlice<'a>(pub(crate) &'a [Region]);

impl Spans for RegionSlice<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn span(&self, i: usize) -> Span {
        self.0[i].span()
    }
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
    fn sub_regions_are_whole_words_inside() {
        let r = region(64);
        let s = r.sub(8, 16).unwrap();
        assert_eq!((s.offset(), s.bytes(), s.device_ptr()), (8, 16, 0x1008));
        assert!(!s.whole);
        assert!(r.sub(0, 64).unwrap().whole);
        assert!(r.sub(60, 8).is_none());
        assert!(r.sub(2, 4).is_none());
        assert!(r.sub(u64::MAX, 4).is_none());
    }

    #[test]
    fn overlap_needs_a_shared_byte() {
        let r = region(64);
        assert!(r.overlaps(&r.sub(60, 4).unwrap()));
        assert!(!r.sub(0, 32).unwrap().overlaps(&r.sub(32, 32).unwrap()));
        assert!(!r.overlaps(&r.sub(0, 0).unwrap()));
        let pinned = Region {
            memory: MemoryKind::Pinned,
            ..r
        };
        assert!(!r.overlaps(&pinned));
    }

    #[test]
    fn regions_spill_past_inline() {
        let mut v: Regions<2> = Regions::default();
        for k in 0..5 {
            v.push(Region {
                key: k,
                ..Region::default()
            });
        }
        assert_eq!(v.len(), 5);
        let keys: Vec<u64> = v.iter().map(|r| r.key).collect();
        assert_eq!(keys, vec![0, 1, 2, 3, 4]);
        assert_eq!(v.get(3).key, 3);
        assert_eq!(v.count(), 5);
    }

    #[test]
    fn spans_carry_the_address() {
        let r = region(64).sub(8, 16).unwrap();
        let s = r.span();
        assert_eq!((s.addr, s.bytes, s.external), (0x1008, 16, false));
    }
}
