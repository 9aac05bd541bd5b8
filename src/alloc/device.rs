//! The device policy: PyTorch's `CUDACachingAllocator`, as the trace format fixes it.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};

use super::{
    round_up, segment_is_usable, AllocError, AllocatorStats, Block, BlockState, Memory, Pool,
    StreamKey,
};

/// Every device request is rounded up to a multiple of this (PyTorch's `kMinBlockSize`, 512 B).
/// It is also the smallest remainder the small pool splits off.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded requests up to this size use the small pool (PyTorch's `kSmallSize`, 1 MiB). The large
/// pool splits a block only when more than this remains.
pub const SMALL_SIZE: u64 = 1 << 20;
/// The segment size of the small pool (PyTorch's `kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// The segment size of the large pool for rounded requests under [`MIN_LARGE_ALLOC`]
/// (PyTorch's `kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// From this rounded request size on, a large-pool segment is the request rounded up to
/// [`ROUND_LARGE`] (PyTorch's `kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// The granularity of large segments (PyTorch's `kRoundLarge`, 2 MiB).
pub const ROUND_LARGE: u64 = 2 << 20;

/// A device request size rounded up to a multiple of [`MIN_BLOCK_SIZE`]; `None` on overflow.
///
/// `round_device_size(0)` is `Some(0)`, but the allocator takes no memory for an empty request.
pub fn round_device_size(bytes: u64) -> Option<u64> {
    round_up(bytes, MIN_BLOCK_SIZE)
}

/// The pool of a rounded device request: [`Pool::Small`] up to [`SMALL_SIZE`], else
/// [`Pool::Large`].
fn pool_of(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The size of the segment mapped for a rounded device request that no cached block serves
/// (PyTorch's `get_allocation_size`); `None` on overflow.
///
/// [`SMALL_BUFFER`] for the small pool, [`LARGE_BUFFER`] for requests under
/// [`MIN_LARGE_ALLOC`], otherwise the request rounded up to [`ROUND_LARGE`].
pub fn device_segment_size(rounded: u64) -> Option<u64> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        round_up(rounded, ROUND_LARGE)
    }
}

/// Whether a block of `block` bytes serving `rounded` bytes is split (PyTorch's `should_split`).
fn should_split(pool: Pool, block: u64, rounded: u64) -> bool {
    let remaining = block - rounded;
    match pool {
        Pool::Small => remaining >= MIN_BLOCK_SIZE,
        Pool::Large | Pool::Host => remaining > SMALL_SIZE,
    }
}

fn pool_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large | Pool::Host => 1,
    }
}

/// One block, live or free: 24 bytes, since a trace may hold a million live blocks. Its segment
/// is not stored: the block above in the same segment is the one whose `prev` is this block
/// (a block starting a segment has none), and [`DeviceCachingAllocator::segment_of`] finds it.
#[derive(Clone, Copy, Debug)]
struct BlockInfo {
    size: u64,
    /// The block just below in the same segment, or [`NO_PREV`] (the one above starts at
    /// `addr + size`).
    prev: u64,
    stream: StreamKey,
    allocated: bool,
    pool: Pool,
}

/// `BlockInfo::prev` of a block that starts its segment.
const NO_PREV: u64 = u64::MAX;

fn prev_of(info: &BlockInfo) -> Option<u64> {
    (info.prev != NO_PREV).then_some(info.prev)
}

#[derive(Clone, Copy, Debug)]
struct SegmentInfo {
    bytes: u64,
    pool: Pool,
}

/// PyTorch's device caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), as the trace format's
/// "Allocator model" fixes it.
///
/// - A request is rounded up to a multiple of [`MIN_BLOCK_SIZE`] (512 B). Rounded requests up to
///   [`SMALL_SIZE`] (1 MiB) use the small pool, larger ones the large pool; pools never share
///   blocks.
/// - A request takes the best-fitting free block of its pool owned by its stream: the smallest,
///   then the lowest address.
/// - If there is none, a new segment (see [`device_segment_size`]) is mapped; it becomes a free
///   block of the stream and serves the request.
/// - The block is split when the remainder is at least 512 B (small pool) or more than 1 MiB
///   (large pool); the allocation takes the lower addresses and the remainder stays a free block of
///   the same stream and segment. Otherwise the allocation takes the whole block.
/// - A freed block becomes a free block of the stream given to [`free`](Self::free) and merges
///   with the free neighbours of its segment that belong to that stream. Only later allocations on
///   that stream reuse it.
///
/// Segments are never given back. Every operation is O(log n) in the number of blocks.
#[derive(Clone, Debug)]
pub struct DeviceCachingAllocator<M: Memory> {
    memory: M,
    /// Every block, live or free, by address; neighbours are found through `prev` and `size`.
    blocks: FxHashMap<u64, BlockInfo>,
    /// The free blocks of each pool (small, large) as (stream, size, address): best fit is the
    /// first entry at or after (stream, rounded, 0), if it has the same stream.
    free: [BTreeSet<(StreamKey, u64, u64)>; 2],
    /// Every segment, by base address.
    segments: BTreeMap<u64, SegmentInfo>,
    reserved_bytes: u64,
    allocated_bytes: u64,
    live_blocks: usize,
}

impl<M: Memory> DeviceCachingAllocator<M> {
    /// An allocator with no segments, which maps its segments from `memory`.
    pub fn new(memory: M) -> Self {
        DeviceCachingAllocator {
            memory,
            blocks: FxHashMap::default(),
            free: [BTreeSet::new(), BTreeSet::new()],
            segments: BTreeMap::new(),
            reserved_bytes: 0,
            allocated_bytes: 0,
            live_blocks: 0,
        }
    }

    /// Allocates `bytes` bytes for `stream`.
    ///
    /// `Ok(None)` for `bytes == 0`: an empty allocation takes no memory. Errors: the rounded size
    /// or its segment size overflows ([`AllocError::SizeOverflow`]), the memory cannot map a
    /// segment ([`AllocError::Map`]) or maps an unusable one ([`AllocError::BadSegment`]); the
    /// allocator is then unchanged.
    pub fn allocate(
        &mut self,
        bytes: u64,
        stream: StreamKey,
    ) -> Result<Option<Block>, AllocError<M::Error>> {
        if bytes == 0 {
            return Ok(None);
        }
        let rounded = round_device_size(bytes).ok_or(AllocError::SizeOverflow { bytes })?;
        let pool = pool_of(rounded);
        let set = &self.free[pool_index(pool)];
        let found = set
            .range((stream, rounded, 0)..)
            .next()
            .filter(|&&(s, _, _)| s == stream)
            .copied();
        let (addr, fresh_segment) = match found {
            Some(key) => {
                self.free[pool_index(pool)].remove(&key);
                (key.2, false)
            }
            None => (self.map_segment(rounded, pool, stream, bytes)?, true),
        };
        // `addr` is a free block of `stream` in `pool`, now out of the free set.
        let Some(info) = self.blocks.get_mut(&addr) else {
            // Unreachable: the free set and the block map agree.
            return Err(AllocError::InvalidFree { addr });
        };
        let block_size = info.size;
        let mut size = block_size;
        if should_split(pool, block_size, rounded) {
            size = rounded;
            info.size = rounded;
            let rest = BlockInfo {
                size: block_size - rounded,
                prev: addr,
                stream,
                allocated: false,
                pool,
            };
            // `addr + rounded` lies inside the block, so it does not overflow.
            let rest_addr = addr + rounded;
            if let Some(after) = self.blocks.get_mut(&(addr + block_size)) {
                // The block above, if it is of the same segment.
                if after.prev == addr {
                    after.prev = rest_addr;
                }
            }
            self.blocks.insert(rest_addr, rest);
            self.free[pool_index(pool)].insert((stream, rest.size, rest_addr));
        }
        if let Some(info) = self.blocks.get_mut(&addr) {
            info.allocated = true;
        }
        self.allocated_bytes += size;
        self.live_blocks += 1;
        Ok(Some(Block {
            addr,
            size,
            pool,
            fresh_segment,
        }))
    }

    /// Maps a segment for a rounded request and records it as one free block of `stream` that is
    /// NOT in the free set; returns its base.
    fn map_segment(
        &mut self,
        rounded: u64,
        pool: Pool,
        stream: StreamKey,
        bytes: u64,
    ) -> Result<u64, AllocError<M::Error>> {
        let seg_bytes = device_segment_size(rounded).ok_or(AllocError::SizeOverflow { bytes })?;
        let base = self
            .memory
            .map_segment(seg_bytes)
            .map_err(|source| AllocError::Map {
                bytes: seg_bytes,
                source,
            })?;
        if !segment_is_usable(&self.segments, |s| s.bytes, base, seg_bytes) {
            return Err(AllocError::BadSegment {
                base,
                bytes: seg_bytes,
            });
        }
        self.segments.insert(
            base,
            SegmentInfo {
                bytes: seg_bytes,
                pool,
            },
        );
        self.reserved_bytes = self.reserved_bytes.saturating_add(seg_bytes);
        self.blocks.insert(
            base,
            BlockInfo {
                size: seg_bytes,
                prev: NO_PREV,
                stream,
                allocated: false,
                pool,
            },
        );
        Ok(base)
    }

    /// Frees the live allocation at `addr`; its block becomes a free block of `stream`.
    ///
    /// For a caching free, `stream` is the owning stream (see [`free_caching`](Self::free_caching));
    /// for a stream-ordered free (`cudaFreeAsync`), the named stream, which then owns the block.
    /// The block merges with the free neighbours of its segment owned by `stream`.
    ///
    /// Error: `addr` is not the start of a live allocation ([`AllocError::InvalidFree`]); the
    /// allocator is then unchanged.
    pub fn free(&mut self, addr: u64, stream: StreamKey) -> Result<(), AllocError<M::Error>> {
        let info = match self.blocks.get(&addr) {
            Some(info) if info.allocated => *info,
            _ => return Err(AllocError::InvalidFree { addr }),
        };
        let set = &mut self.free[pool_index(info.pool)];
        let mut start = addr;
        let mut size = info.size;
        let mut prev_of_start = info.prev;
        // The free neighbour below, if it is of the same stream (it is of the same segment).
        if let Some(prev_addr) = prev_of(&info) {
            if let Some(prev) = self.blocks.get(&prev_addr).copied() {
                if !prev.allocated && prev.stream == stream {
                    set.remove(&(prev.stream, prev.size, prev_addr));
                    start = prev_addr;
                    size += prev.size;
                    prev_of_start = prev.prev;
                }
            }
        }
        // The free neighbour above, likewise. Blocks tile their segment, so it starts at the end;
        // it is of the same segment when this block is below it.
        let next_addr = addr + info.size;
        let mut below_after = addr;
        if let Some(next) = self.blocks.get(&next_addr).copied() {
            if !next.allocated && next.prev == addr && next.stream == stream {
                set.remove(&(next.stream, next.size, next_addr));
                size += next.size;
                self.blocks.remove(&next_addr);
                below_after = next_addr;
            }
        }
        if start != addr {
            self.blocks.remove(&addr);
        }
        // The block after the merged one, if it is of the same segment, now has it below.
        if let Some(after) = self.blocks.get_mut(&(start + size)) {
            if after.prev == below_after {
                after.prev = start;
            }
        }
        self.blocks.insert(
            start,
            BlockInfo {
                size,
                prev: prev_of_start,
                stream,
                allocated: false,
                pool: info.pool,
            },
        );
        set.insert((stream, size, start));
        self.allocated_bytes -= info.size;
        self.live_blocks -= 1;
        Ok(())
    }

    /// A caching free: frees the live allocation at `addr` back to its owning stream.
    ///
    /// The same as [`free`](Self::free) with the block's stream.
    pub fn free_caching(&mut self, addr: u64) -> Result<(), AllocError<M::Error>> {
        match self.blocks.get(&addr) {
            Some(info) if info.allocated => self.free(addr, info.stream),
            _ => Err(AllocError::InvalidFree { addr }),
        }
    }

    /// The block that starts at `addr`, live or free.
    pub fn block(&self, addr: u64) -> Option<BlockState> {
        self.blocks
            .get(&addr)
            .map(|info| state(addr, self.segment_of(addr), info))
    }

    /// The base of the segment holding `addr` (0 if none does).
    fn segment_of(&self, addr: u64) -> u64 {
        self.segments
            .range(..=addr)
            .next_back()
            .map_or(0, |(&base, _)| base)
    }

    /// Every block, live or free, in address order.
    pub fn blocks(&self) -> impl Iterator<Item = BlockState> + '_ {
        let mut v: Vec<BlockState> = self
            .blocks
            .iter()
            .map(|(&addr, info)| state(addr, self.segment_of(addr), info))
            .collect();
        v.sort_by_key(|b| b.addr);
        v.into_iter()
    }

    /// Every segment as (base address, bytes), in address order.
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments.iter().map(|(&base, s)| (base, s.bytes))
    }

    /// The pool of the segment at `base`, if there is one.
    pub fn segment_pool(&self, base: u64) -> Option<Pool> {
        self.segments.get(&base).map(|s| s.pool)
    }

    /// Counters: segments, reserved bytes, allocated bytes, live blocks, free blocks.
    pub fn stats(&self) -> AllocatorStats {
        AllocatorStats {
            segments: self.segments.len(),
            reserved_bytes: self.reserved_bytes,
            allocated_bytes: self.allocated_bytes,
            live_blocks: self.live_blocks,
            free_blocks: self.free[0].len() + self.free[1].len(),
        }
    }

    /// The segment source.
    pub fn memory(&self) -> &M {
        &self.memory
    }

    /// The segment source, mutably (e.g. to read or write a simulator's bytes).
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }

    /// Gives up the allocator, returning the segment source.
    pub fn into_memory(self) -> M {
        self.memory
    }
}

fn state(addr: u64, segment: u64, info: &BlockInfo) -> BlockState {
    BlockState {
        addr,
        size: info.size,
        segment,
        pool: info.pool,
        stream: Some(info.stream),
        allocated: info.allocated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::ModelMemory;

    const MIB: u64 = 1 << 20;

    impl<M: Memory> DeviceCachingAllocator<M> {
        /// Checks every internal invariant; panics with a description on the first broken one.
        fn check(&self) {
            // Segments and blocks tile exactly; free set = free blocks; counters agree.
            let mut free_keys = [BTreeSet::new(), BTreeSet::new()];
            let mut allocated = 0;
            let mut live = 0;
            let mut reserved = 0;
            let mut sorted: Vec<(&u64, &BlockInfo)> = self.blocks.iter().collect();
            sorted.sort_by_key(|(a, _)| **a);
            let mut blocks = sorted.into_iter().peekable();
            let mut below: Option<u64> = None;
            for (&base, seg) in &self.segments {
                reserved += seg.bytes;
                let mut at = base;
                let mut prev_free_stream: Option<StreamKey> = None;
                while at < base + seg.bytes {
                    let (&a, b) = blocks.next().expect("segment not covered");
                    assert_eq!(a, at, "gap or overlap in segment {base:#x}");
                    assert_eq!(self.segment_of(a), base);
                    assert_eq!(
                        prev_of(b),
                        if a == base { None } else { below },
                        "prev link of {a:#x}"
                    );
                    below = Some(a);
                    assert_eq!(b.pool, seg.pool);
                    assert!(b.size > 0);
                    if b.allocated {
                        allocated += b.size;
                        live += 1;
                        prev_free_stream = None;
                    } else {
                        assert_ne!(prev_free_stream, Some(b.stream), "unmerged neighbours");
                        free_keys[pool_index(b.pool)].insert((b.stream, b.size, a));
                        prev_free_stream = Some(b.stream);
                    }
                    at = a + b.size;
                }
                assert_eq!(at, base + seg.bytes, "block past segment end");
            }
            assert!(blocks.next().is_none(), "block outside every segment");
            assert_eq!(free_keys, self.free);
            assert_eq!(allocated, self.allocated_bytes);
            assert_eq!(live, self.live_blocks);
            assert_eq!(reserved, self.reserved_bytes);
        }
    }

    fn model() -> DeviceCachingAllocator<ModelMemory> {
        DeviceCachingAllocator::new(ModelMemory::new(0))
    }

    #[test]
    fn sizes_and_segments() {
        assert_eq!(round_device_size(1), Some(512));
        assert_eq!(round_device_size(513), Some(1024));
        assert_eq!(round_device_size(u64::MAX), None);
        assert_eq!(pool_of(MIB), Pool::Small);
        assert_eq!(pool_of(MIB + 512), Pool::Large);
        assert_eq!(device_segment_size(512), Some(2 * MIB));
        assert_eq!(device_segment_size(MIB + 512), Some(20 * MIB));
        assert_eq!(device_segment_size(10 * MIB - 512), Some(20 * MIB));
        assert_eq!(device_segment_size(10 * MIB), Some(10 * MIB));
        assert_eq!(device_segment_size(11 * MIB), Some(12 * MIB));
        assert_eq!(device_segment_size(u64::MAX - 511), None);
    }

    #[test]
    fn split_and_merge_keep_invariants() {
        let mut a = model();
        let x = a.allocate(100, 0).unwrap().unwrap();
        let y = a.allocate(100, 0).unwrap().unwrap();
        let z = a.allocate(100, 0).unwrap().unwrap();
        a.check();
        a.free(y.addr, 0).unwrap();
        a.check();
        a.free(x.addr, 0).unwrap();
        a.check();
        a.free(z.addr, 0).unwrap();
        a.check();
        assert_eq!(a.stats().free_blocks, 1);
        assert_eq!(a.blocks().count(), 1);
    }

    #[test]
    fn failed_calls_leave_state_unchanged() {
        let mut a = DeviceCachingAllocator::new(ModelMemory::new(u64::MAX - 3 * MIB));
        let x = a.allocate(1, 0).unwrap().unwrap();
        assert!(matches!(
            a.allocate(u64::MAX, 0),
            Err(AllocError::SizeOverflow { .. })
        ));
        assert!(matches!(
            a.allocate(2 * MIB, 0),
            Err(AllocError::Map { .. })
        ));
        assert!(matches!(
            a.free(x.addr + 512, 0),
            Err(AllocError::InvalidFree { .. })
        ));
        a.check();
        a.free(x.addr, 0).unwrap();
        assert!(matches!(
            a.free(x.addr, 0),
            Err(AllocError::InvalidFree { .. })
        ));
        a.check();
        assert_eq!(a.stats().segments, 1);
    }

    proptest::proptest! {
        /// Random calls keep every internal invariant (free sets, counters, merged neighbours).
        #[test]
        fn random_calls_keep_internal_invariants(
            ops in proptest::collection::vec(
                (0u64..=24 * MIB, 0u32..3, proptest::bool::ANY, 0usize..64), 0..150),
        ) {
            let mut a = model();
            let mut live = Vec::new();
            for (bytes, stream, is_free, pick) in ops {
                if is_free && !live.is_empty() {
                    let addr = live.swap_remove(pick % live.len());
                    a.free(addr, stream).unwrap();
                } else if let Some(b) = a.allocate(bytes, stream).unwrap() {
                    live.push(b.addr);
                }
                a.check();
            }
        }
    }

    #[test]
    fn stream_change_blocks_merging() {
        let mut a = model();
        let x = a.allocate(512, 0).unwrap().unwrap();
        let y = a.allocate(512, 0).unwrap().unwrap();
        a.free(x.addr, 1).unwrap();
        a.check();
        a.free(y.addr, 0).unwrap();
        a.check();
        // x is stream 1's; y merged with the stream-0 remainder above it.
        assert_eq!(a.stats().free_blocks, 2);
        let ys = a.block(y.addr).unwrap();
        assert_eq!(ys.size, 2 * MIB - 512);
        assert_eq!(ys.stream, Some(0));
    }
}
