//! Allocator policies: PyTorch's device caching allocator and host caching allocator.
//!
//! The trace format's "Allocator model" (normative) fixes where an `alloc` without `addr` lands:
//!
//! - Device memory follows PyTorch's `CUDACachingAllocator`
//!   (`c10/cuda/CUDACachingAllocator.cpp`): see [`DeviceCachingAllocator`].
//! - Pinned and managed memory follow PyTorch's `CachingHostAllocator`
//!   (`aten/src/ATen/core/CachingHostAllocator.h`), one address space per memory kind: see
//!   [`HostCachingAllocator`].
//! - The memory pools of CUDA graph captures are arenas with the device policy, one
//!   [`DeviceCachingAllocator`] each in the device address space: see [`GraphPools`].
//!
//! Each policy is written once, generic over [`Memory`], the source of segments. The checker's
//! model uses [`ModelMemory`] (addresses only, every new segment right above the earlier ones); a
//! CPU simulator backs segments with host buffers; a GPU backend maps them with `cuMemAlloc`. The
//! policy, and so every address it hands out relative to the segments it got, is the same for all.
//!
//! # Guarantee
//!
//! For every sequence of calls, whatever the sizes, streams and addresses:
//!
//! - no call panics, and dropping an allocator never panics; bad input (a size that overflows when
//!   rounded, a free of an address that is not a live allocation, a segment source that fails or
//!   returns an unusable segment) is an [`AllocError`] and leaves the allocator unchanged;
//! - live blocks never overlap, every block lies within one segment, and the free and allocated
//!   blocks of a segment tile it exactly;
//! - each operation takes O(log n) time in the number of blocks (plus one
//!   [`Memory::map_segment`] call when a new segment is needed).

mod device;
mod host;
mod pool;
pub mod space;

pub use device::{
    device_segment_size, round_device_size, DeviceCachingAllocator, LARGE_BUFFER, MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};
pub use host::{round_host_size, HostCachingAllocator};
pub use pool::{GraphPools, PoolIndex};
pub(crate) use pool::PoolBytes;

/// Where segments come from.
///
/// A segment is a contiguous range of addresses that the allocator carves into blocks. An
/// implementation must hand out segments that do not overlap each other and end at or below
/// `u64::MAX`; the allocators check both and return [`AllocError::BadSegment`] otherwise.
pub trait Memory {
    /// Error when a segment cannot be obtained (e.g. out of device memory).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Obtains a new segment of exactly `bytes` bytes (never 0) and returns its base address.
    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error>;
}

impl<M: Memory + ?Sized> Memory for &mut M {
    type Error = M::Error;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
        (**self).map_segment(bytes)
    }
}

impl<M: Memory + ?Sized> Memory for Box<M> {
    type Error = M::Error;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
        (**self).map_segment(bytes)
    }
}

/// The model's address space: each new segment is placed right above every earlier one, starting
/// at `base`.
///
/// This is the trace format's "each new segment of a memory kind is placed above every earlier
/// one"; the checker keeps one per memory kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelMemory {
    base: u64,
    next: u64,
}

impl ModelMemory {
    /// An empty address space whose first segment starts at `base`.
    pub fn new(base: u64) -> Self {
        ModelMemory { base, next: base }
    }

    /// The address of the first segment.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The address the next segment will get: the end of the last one.
    pub fn next_base(&self) -> u64 {
        self.next
    }

    /// The bytes handed out so far.
    pub fn mapped_bytes(&self) -> u64 {
        self.next - self.base
    }
}

/// [`ModelMemory`] ran out of addresses: the segment would end past `u64::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("address space exhausted: a segment of {bytes} bytes at {base:#x} would end past 2^64")]
pub struct AddressSpaceExhausted {
    /// Where the segment would have started.
    pub base: u64,
    /// The size that was asked for.
    pub bytes: u64,
}

impl Memory for ModelMemory {
    type Error = AddressSpaceExhausted;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
        let base = self.next;
        self.next = base
            .checked_add(bytes)
            .ok_or(AddressSpaceExhausted { base, bytes })?;
        Ok(base)
    }
}

/// A dense stream index chosen by the caller (e.g. the order in which a trace names its streams).
pub type StreamKey = u32;

/// The pool a block belongs to. Pools never share blocks or segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// The device small pool: rounded requests up to [`SMALL_SIZE`] (1 MiB), 2 MiB segments.
    Small,
    /// The device large pool: rounded requests above [`SMALL_SIZE`].
    Large,
    /// The host caching allocator (pinned or managed memory): power-of-two blocks, one per segment.
    Host,
}

impl Pool {
    /// A name for reports: `"small"`, `"large"` or `"host"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
            Pool::Host => "host",
        }
    }
}

/// What an allocation got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// The block's first address; the allocation starts here.
    pub addr: u64,
    /// The block's size: at least the rounded request (more when the rest was too small to split).
    pub size: u64,
    /// The pool that served it.
    pub pool: Pool,
    /// Whether a new segment was mapped for this allocation (`false`: cached memory was reused).
    pub fresh_segment: bool,
}

impl Block {
    /// One past the block's last address.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }
}

/// The state of one block, live or free, as [`DeviceCachingAllocator::blocks`] and
/// [`HostCachingAllocator::blocks`] list it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockState {
    /// The block's first address.
    pub addr: u64,
    /// The block's size.
    pub size: u64,
    /// The base address of the segment that holds it.
    pub segment: u64,
    /// Its pool.
    pub pool: Pool,
    /// The owning stream (device blocks); `None` for host blocks.
    pub stream: Option<StreamKey>,
    /// Whether it is allocated (`false`: free, cached for reuse).
    pub allocated: bool,
}

/// Counters of an allocator, in the spirit of PyTorch's `memory_stats()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocatorStats {
    /// Segments obtained from the [`Memory`].
    pub segments: usize,
    /// Bytes of all segments.
    pub reserved_bytes: u64,
    /// Bytes of the live blocks (block sizes, so rounding is included).
    pub allocated_bytes: u64,
    /// Live (allocated) blocks.
    pub live_blocks: usize,
    /// Free (cached) blocks.
    pub free_blocks: usize,
}

/// Why an allocation or a free failed. The allocator is unchanged by a failed call.
#[derive(Debug, thiserror::Error)]
pub enum AllocError<E: std::error::Error + 'static> {
    /// The request does not fit in `u64` once rounded (or its segment size does not).
    #[error("a request of {bytes} bytes overflows 2^64 when rounded")]
    SizeOverflow {
        /// The requested size.
        bytes: u64,
    },
    /// The [`Memory`] could not provide a segment.
    #[error("cannot obtain a segment of {bytes} bytes")]
    Map {
        /// The segment size that was asked for.
        bytes: u64,
        /// The memory's error.
        #[source]
        source: E,
    },
    /// The [`Memory`] returned a segment that ends past `u64::MAX` or overlaps an earlier one.
    #[error("the memory returned an unusable segment of {bytes} bytes at {base:#x}")]
    BadSegment {
        /// The base address it returned.
        base: u64,
        /// The segment size.
        bytes: u64,
    },
    /// The address is not the start of a live allocation of this allocator (never allocated,
    /// inside a block, or already freed).
    #[error("{addr:#x} is not a live allocation")]
    InvalidFree {
        /// The address given to `free`.
        addr: u64,
    },
}

/// `value` rounded up to a multiple of `to` (a power of two), or `None` on overflow.
fn round_up(value: u64, to: u64) -> Option<u64> {
    debug_assert!(to.is_power_of_two());
    Some(value.checked_add(to - 1)? & !(to - 1))
}

/// Whether `[base, base + bytes)` fits below 2^64 and overlaps no segment of `segments`
/// (keyed by base, valued by size).
fn segment_is_usable<V>(
    segments: &std::collections::BTreeMap<u64, V>,
    size_of: impl Fn(&V) -> u64,
    base: u64,
    bytes: u64,
) -> bool {
    let Some(end) = base.checked_add(bytes) else {
        return false;
    };
    if let Some((&b, v)) = segments.range(..=base).next_back() {
        if b.saturating_add(size_of(v)) > base {
            return false;
        }
    }
    if let Some((&b, _)) = segments.range(base..).next() {
        if b < end {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_memory_stacks_segments() {
        let mut m = ModelMemory::new(0x1000);
        assert_eq!(m.map_segment(10), Ok(0x1000));
        assert_eq!(m.map_segment(20), Ok(0x100a));
        assert_eq!(m.next_base(), 0x101e);
        assert_eq!(m.mapped_bytes(), 30);
        assert_eq!(m.base(), 0x1000);
    }

    #[test]
    fn model_memory_exhaustion_is_an_error() {
        let mut m = ModelMemory::new(u64::MAX - 10);
        assert_eq!(m.map_segment(10), Ok(u64::MAX - 10));
        assert_eq!(
            m.map_segment(1),
            Err(AddressSpaceExhausted {
                base: u64::MAX,
                bytes: 1
            })
        );
        // A failed call leaves the space unchanged.
        assert_eq!(m.next_base(), u64::MAX);
        assert_eq!(m.map_segment(0), Ok(u64::MAX));
    }

    #[test]
    fn round_up_overflows_to_none() {
        assert_eq!(round_up(0, 512), Some(0));
        assert_eq!(round_up(1, 512), Some(512));
        assert_eq!(round_up(512, 512), Some(512));
        assert_eq!(round_up(u64::MAX, 512), None);
        assert_eq!(round_up(u64::MAX - 511, 512), Some(u64::MAX - 511));
    }

    #[test]
    fn usable_segment_checks_overlap_and_overflow() {
        let mut segs = std::collections::BTreeMap::new();
        segs.insert(100u64, 50u64);
        let f = |v: &u64| *v;
        assert!(segment_is_usable(&segs, f, 0, 100));
        assert!(segment_is_usable(&segs, f, 150, 10));
        assert!(!segment_is_usable(&segs, f, 0, 101));
        assert!(!segment_is_usable(&segs, f, 149, 1));
        assert!(!segment_is_usable(&segs, f, 100, 1));
        assert!(!segment_is_usable(&segs, f, 120, 100));
        assert!(!segment_is_usable(&segs, f, u64::MAX, 1));
        assert!(segment_is_usable(&segs, f, u64::MAX - 1, 1));
    }
}
