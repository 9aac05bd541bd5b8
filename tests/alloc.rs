//! The allocator policies against the trace format's "Allocator model": scripted sequences with
//! exact addresses, error cases, and random sequences checked for invariants and against a naive
//! reference of the same rules.
//!
//! This file is the independent check of `streamsan::alloc`. The checker and the oracle
//! (`streamsan::oracle`) both place allocations with it, so their agreement
//! (`tests/oracle_agreement.rs`) cannot catch a wrong address: a block reused too early or too
//! late would be wrong on both sides alike. The references below ([`RefDevice`], [`RefHost`]) are
//! written from the spec's "Allocator model" alone, rule by rule, as linear scans over plain
//! vectors, sharing no code with `streamsan::alloc` (only its result types, to compare), and the
//! random sequences compare them with the allocators after every call: every result and error,
//! every block (address, size, pool, stream, live or free), every segment.
//!
//! Fixtures: none (every input is built in the test).

use std::convert::Infallible;

use proptest::prelude::*;
use streamsan::alloc::{
    AllocError, AllocatorStats, Block, BlockState, DeviceCachingAllocator, HostCachingAllocator,
    Memory, ModelMemory, Pool, StreamKey,
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn device() -> DeviceCachingAllocator<ModelMemory> {
    DeviceCachingAllocator::new(ModelMemory::new(BASE))
}

fn host() -> HostCachingAllocator<ModelMemory> {
    HostCachingAllocator::new(ModelMemory::new(BASE))
}

fn alloc(a: &mut DeviceCachingAllocator<ModelMemory>, bytes: u64, stream: StreamKey) -> Block {
    a.allocate(bytes, stream)
        .expect("allocation failed")
        .expect("empty allocation")
}

fn block(addr: u64, size: u64, pool: Pool, fresh_segment: bool) -> Block {
    Block {
        addr,
        size,
        pool,
        fresh_segment,
    }
}

/// The free blocks as (addr, size, stream), in address order.
fn free_blocks(a: &DeviceCachingAllocator<ModelMemory>) -> Vec<(u64, u64, StreamKey)> {
    a.blocks()
        .filter(|b| !b.allocated)
        .map(|b| (b.addr, b.size, b.stream.unwrap()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Device: scripted sequences

#[test]
fn small_requests_round_to_512_and_split_from_a_2_mib_segment() {
    let mut a = device();
    assert_eq!(alloc(&mut a, 100, 0), block(BASE, 512, Pool::Small, true));
    assert_eq!(
        alloc(&mut a, 100, 0),
        block(BASE + 512, 512, Pool::Small, false)
    );
    assert_eq!(a.segments().collect::<Vec<_>>(), vec![(BASE, 2 * MIB)]);
    assert_eq!(
        a.stats(),
        AllocatorStats {
            segments: 1,
            reserved_bytes: 2 * MIB,
            allocated_bytes: 1024,
            live_blocks: 2,
            free_blocks: 1,
        }
    );
    assert_eq!(free_blocks(&a), vec![(BASE + 1024, 2 * MIB - 1024, 0)]);
}

#[test]
fn a_freed_block_is_reused_by_its_stream_only() {
    let mut a = device();
    let first = alloc(&mut a, 100, 0);
    let _second = alloc(&mut a, 100, 0);
    a.free(first.addr, 0).unwrap();
    // Same stream: the freed block is the best fit.
    assert_eq!(alloc(&mut a, 512, 0), block(BASE, 512, Pool::Small, false));
    a.free(BASE, 0).unwrap();
    // Another stream: a new segment above the first.
    assert_eq!(
        alloc(&mut a, 512, 1),
        block(BASE + 2 * MIB, 512, Pool::Small, true)
    );
    assert_eq!(
        a.segments().collect::<Vec<_>>(),
        vec![(BASE, 2 * MIB), (BASE + 2 * MIB, 2 * MIB)]
    );
}

#[test]
fn small_pool_splits_any_remainder_of_512_bytes_or_more() {
    let mut a = device();
    // 2 MiB - 512 B: the remainder is exactly 512 B, which is split off.
    let x = alloc(&mut a, MIB, 0);
    let y = alloc(&mut a, MIB - 512, 0);
    assert_eq!((x.addr, x.size), (BASE, MIB));
    assert_eq!((y.addr, y.size), (BASE + MIB, MIB - 512));
    assert_eq!(
        alloc(&mut a, 1, 0),
        block(BASE + 2 * MIB - 512, 512, Pool::Small, false)
    );
    // The segment is full: the next request maps a new one.
    assert_eq!(
        alloc(&mut a, 1, 0),
        block(BASE + 2 * MIB, 512, Pool::Small, true)
    );
}

#[test]
fn large_requests_under_10_mib_map_20_mib_and_split_only_above_1_mib() {
    let mut a = device();
    // 2 MiB -> large pool, 20 MiB segment; 18 MiB remain and are split off.
    assert_eq!(
        alloc(&mut a, 2 * MIB, 0),
        block(BASE, 2 * MIB, Pool::Large, true)
    );
    assert_eq!(a.segments().collect::<Vec<_>>(), vec![(BASE, 20 * MIB)]);
    assert_eq!(free_blocks(&a), vec![(BASE + 2 * MIB, 18 * MIB, 0)]);
    // 17 MiB from the 18 MiB block leaves exactly 1 MiB: not split, the whole block is taken.
    assert_eq!(
        alloc(&mut a, 17 * MIB, 0),
        block(BASE + 2 * MIB, 18 * MIB, Pool::Large, false)
    );
    assert_eq!(free_blocks(&a), vec![]);
    assert_eq!(a.stats().allocated_bytes, 20 * MIB);

    // 1 MiB + 512 B remaining is more than 1 MiB: split.
    let mut b = device();
    let big = alloc(&mut b, 19 * MIB - 512, 0);
    assert_eq!(big, block(BASE, 19 * MIB - 512, Pool::Large, true));
    assert_eq!(free_blocks(&b), vec![(BASE + 19 * MIB - 512, MIB + 512, 0)]);
    // That remainder is large-pool memory: a small request does not take it.
    assert_eq!(
        alloc(&mut b, MIB, 0),
        block(BASE + 20 * MIB, MIB, Pool::Small, true)
    );
    // A large one does.
    assert_eq!(
        alloc(&mut b, MIB + 1, 0),
        block(BASE + 19 * MIB - 512, MIB + 512, Pool::Large, false)
    );
}

#[test]
fn requests_of_10_mib_and_more_map_their_size_rounded_to_2_mib() {
    let mut a = device();
    assert_eq!(
        alloc(&mut a, 12 * MIB, 0),
        block(BASE, 12 * MIB, Pool::Large, true)
    );
    // 11 MiB + 1 B rounds to 11 MiB + 512 B; its segment is 12 MiB and the rest (< 1 MiB) stays.
    assert_eq!(
        alloc(&mut a, 11 * MIB + 1, 0),
        block(BASE + 12 * MIB, 12 * MIB, Pool::Large, true)
    );
    // Exactly 10 MiB: a 10 MiB segment.
    assert_eq!(
        alloc(&mut a, 10 * MIB, 0),
        block(BASE + 24 * MIB, 10 * MIB, Pool::Large, true)
    );
    // Just under 10 MiB: a 20 MiB segment, split (10 MiB + 512 B remain).
    assert_eq!(
        alloc(&mut a, 10 * MIB - 512, 0),
        block(BASE + 34 * MIB, 10 * MIB - 512, Pool::Large, true)
    );
    assert_eq!(
        a.segments().collect::<Vec<_>>(),
        vec![
            (BASE, 12 * MIB),
            (BASE + 12 * MIB, 12 * MIB),
            (BASE + 24 * MIB, 10 * MIB),
            (BASE + 34 * MIB, 20 * MIB),
        ]
    );
    assert_eq!(a.stats().reserved_bytes, 54 * MIB);
}

#[test]
fn pools_never_share_blocks() {
    let mut a = device();
    let small = alloc(&mut a, 4 * KIB, 0);
    a.free(small.addr, 0).unwrap();
    // A whole free 2 MiB small segment does not serve a 1.5 MiB (large) request.
    assert_eq!(
        alloc(&mut a, 3 * MIB / 2, 0),
        block(BASE + 2 * MIB, 3 * MIB / 2, Pool::Large, true)
    );
    assert_eq!(a.segment_pool(BASE), Some(Pool::Small));
    assert_eq!(a.segment_pool(BASE + 2 * MIB), Some(Pool::Large));
}

#[test]
fn a_stream_ordered_free_hands_the_block_to_the_named_stream() {
    let mut a = device();
    let x = alloc(&mut a, 4 * KIB, 0);
    let _fence = alloc(&mut a, 512, 0);
    a.free(x.addr, 1).unwrap();
    assert_eq!(a.block(x.addr).unwrap().stream, Some(1));
    // Stream 0 no longer owns it: it gets the rest of its segment instead.
    assert_eq!(
        alloc(&mut a, 4 * KIB, 0),
        block(BASE + 4 * KIB + 512, 4 * KIB, Pool::Small, false)
    );
    // Stream 1 reuses it.
    assert_eq!(
        alloc(&mut a, 4 * KIB, 1),
        block(BASE, 4 * KIB, Pool::Small, false)
    );
    // Once allocated by stream 1 it is stream 1's: a caching free returns it to stream 1.
    a.free_caching(BASE).unwrap();
    assert_eq!(a.block(BASE).unwrap().stream, Some(1));
}

#[test]
fn frees_merge_only_with_free_neighbours_of_the_same_stream() {
    let mut a = device();
    let x = alloc(&mut a, 512, 0);
    let y = alloc(&mut a, 512, 0);
    let z = alloc(&mut a, 512, 0);
    // x goes to stream 1: no merge (its neighbour y is live).
    a.free(x.addr, 1).unwrap();
    // z merges with the free remainder above it (stream 0).
    a.free(z.addr, 0).unwrap();
    assert_eq!(
        free_blocks(&a),
        vec![(BASE, 512, 1), (BASE + 1024, 2 * MIB - 1024, 0)]
    );
    // y merges with z+rest above (stream 0) but not with x below (stream 1).
    a.free(y.addr, 0).unwrap();
    assert_eq!(
        free_blocks(&a),
        vec![(BASE, 512, 1), (BASE + 512, 2 * MIB - 512, 0)]
    );
    // Allocating on stream 1 again and freeing to stream 0 merges both sides into one block.
    let again = alloc(&mut a, 512, 1);
    assert_eq!(again.addr, BASE);
    a.free(BASE, 0).unwrap();
    assert_eq!(free_blocks(&a), vec![(BASE, 2 * MIB, 0)]);
    assert_eq!(a.stats().free_blocks, 1);
}

#[test]
fn frees_merge_on_both_sides() {
    let mut a = device();
    let x = alloc(&mut a, 512, 0);
    let y = alloc(&mut a, 1024, 0);
    let z = alloc(&mut a, 512, 0);
    let _fence = alloc(&mut a, 512, 0);
    a.free(x.addr, 0).unwrap();
    a.free(z.addr, 0).unwrap();
    assert_eq!(
        free_blocks(&a),
        vec![
            (BASE, 512, 0),
            (BASE + 1536, 512, 0),
            (BASE + 2560, 2 * MIB - 2560, 0)
        ]
    );
    a.free(y.addr, 0).unwrap();
    assert_eq!(
        free_blocks(&a),
        vec![(BASE, 2048, 0), (BASE + 2560, 2 * MIB - 2560, 0)]
    );
}

#[test]
fn best_fit_is_the_smallest_block_then_the_lowest_address() {
    let mut a = device();
    // Free blocks of 1024 @ BASE, 512 @ +1536, 1024 @ +2560, separated by live 512 B fences.
    let p = alloc(&mut a, 1024, 0);
    let _f1 = alloc(&mut a, 512, 0);
    let q = alloc(&mut a, 512, 0);
    let _f2 = alloc(&mut a, 512, 0);
    let r = alloc(&mut a, 1024, 0);
    let _f3 = alloc(&mut a, 512, 0);
    assert_eq!((p.addr, q.addr, r.addr), (BASE, BASE + 1536, BASE + 2560));
    a.free(r.addr, 0).unwrap();
    a.free(q.addr, 0).unwrap();
    a.free(p.addr, 0).unwrap();
    // 512: the smallest fitting block, although it is not the lowest.
    assert_eq!(alloc(&mut a, 1, 0).addr, BASE + 1536);
    // 1024: two equal blocks, the lower one wins.
    assert_eq!(alloc(&mut a, 1024, 0).addr, BASE);
    // 512 again: the remaining 1024 block is the smallest fit; it is split.
    assert_eq!(
        alloc(&mut a, 512, 0),
        block(BASE + 2560, 512, Pool::Small, false)
    );
    assert_eq!(
        alloc(&mut a, 512, 0),
        block(BASE + 3072, 512, Pool::Small, false)
    );
}

#[test]
fn best_fit_looks_only_at_the_requesting_stream() {
    let mut a = device();
    let x = alloc(&mut a, 512, 0);
    let _fence = alloc(&mut a, 512, 0);
    a.free(x.addr, 1).unwrap();
    // Stream 2 owns nothing: a new segment, even though streams 0 and 1 have fitting blocks.
    assert_eq!(
        alloc(&mut a, 512, 2),
        block(BASE + 2 * MIB, 512, Pool::Small, true)
    );
    // Stream 1's smallest fit is x; stream 0's is its remainder.
    assert_eq!(alloc(&mut a, 512, 1).addr, BASE);
    assert_eq!(alloc(&mut a, 512, 0).addr, BASE + 1024);
}

#[test]
fn empty_device_allocations_take_no_memory() {
    let mut a = device();
    assert_eq!(a.allocate(0, 0).unwrap(), None);
    assert_eq!(a.stats(), AllocatorStats::default());
    assert_eq!(a.memory().next_base(), BASE);
}

#[test]
fn device_errors_never_change_state() {
    let mut a = device();
    let x = alloc(&mut a, 100, 0);
    let before: Vec<BlockState> = a.blocks().collect();
    assert!(matches!(
        a.allocate(u64::MAX, 0),
        Err(AllocError::SizeOverflow { bytes: u64::MAX })
    ));
    // Rounds to 512 B multiples fine, but its 2 MiB segment size overflows.
    assert!(matches!(
        a.allocate(u64::MAX - 600_000, 0),
        Err(AllocError::SizeOverflow { .. })
    ));
    // Fits, but the address space does not have room.
    match a.allocate(u64::MAX - 4 * MIB, 0) {
        Err(AllocError::Map { bytes, source }) => {
            assert_eq!(bytes, u64::MAX - 4 * MIB + 1);
            assert_eq!(source.base, BASE + 2 * MIB);
        }
        other => panic!("expected a map error, got {other:?}"),
    }
    for bad in [x.addr + 1, x.addr + 512, 0, u64::MAX, BASE + 2 * MIB] {
        assert!(matches!(
            a.free(bad, 0),
            Err(AllocError::InvalidFree { addr }) if addr == bad
        ));
        assert!(a.free_caching(bad).is_err());
    }
    assert_eq!(a.blocks().collect::<Vec<_>>(), before);
    a.free(x.addr, 3).unwrap();
    assert!(matches!(
        a.free(x.addr, 3),
        Err(AllocError::InvalidFree { .. })
    ));
    assert!(a.free_caching(x.addr).is_err());
    assert_eq!(a.stats().live_blocks, 0);
}

#[test]
fn error_messages_name_the_problem() {
    let mut a = device();
    let e = a.free(0x1234, 0).unwrap_err();
    assert_eq!(e.to_string(), "0x1234 is not a live allocation");
    let mut m = DeviceCachingAllocator::new(ModelMemory::new(u64::MAX - MIB));
    let e = m.allocate(1, 0).unwrap_err();
    assert_eq!(e.to_string(), "cannot obtain a segment of 2097152 bytes");
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.contains("address space exhausted"), "{source}");
}

/// A segment source that misbehaves: every segment at the same address.
struct SameBase(u64);

impl Memory for SameBase {
    type Error = Infallible;
    fn map_segment(&mut self, _bytes: u64) -> Result<u64, Infallible> {
        Ok(self.0)
    }
}

/// A segment source that always fails.
#[derive(Debug)]
struct OutOfMemory;

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("out of memory")
    }
}

impl std::error::Error for OutOfMemory {}

impl Memory for OutOfMemory {
    type Error = OutOfMemory;
    fn map_segment(&mut self, _bytes: u64) -> Result<u64, OutOfMemory> {
        Err(OutOfMemory)
    }
}

#[test]
fn unusable_segments_are_errors() {
    let mut a = DeviceCachingAllocator::new(SameBase(4096));
    assert_eq!(a.allocate(1, 0).unwrap().unwrap().addr, 4096);
    // The second segment overlaps the first.
    assert!(matches!(
        a.allocate(2 * MIB, 0),
        Err(AllocError::BadSegment { base: 4096, bytes }) if bytes == 20 * MIB
    ));
    // A segment that would end past 2^64.
    a.memory_mut().0 = u64::MAX - MIB;
    assert!(matches!(
        a.allocate(2 * MIB, 0),
        Err(AllocError::BadSegment { .. })
    ));
    assert_eq!(a.stats().segments, 1);

    let mut h = HostCachingAllocator::new(SameBase(0));
    assert_eq!(h.allocate(8).unwrap().unwrap().addr, 0);
    assert!(matches!(
        h.allocate(16),
        Err(AllocError::BadSegment { base: 0, bytes: 16 })
    ));
    assert_eq!(h.stats().segments, 1);

    let mut o = DeviceCachingAllocator::new(OutOfMemory);
    assert!(matches!(
        o.allocate(1, 0),
        Err(AllocError::Map {
            source: OutOfMemory,
            ..
        })
    ));
    let mut o = HostCachingAllocator::new(OutOfMemory);
    assert!(matches!(o.allocate(1), Err(AllocError::Map { .. })));
}

#[test]
fn allocators_work_through_borrowed_and_boxed_memory() {
    let mut m = ModelMemory::new(BASE);
    {
        let mut a = DeviceCachingAllocator::new(&mut m);
        assert_eq!(a.allocate(1, 0).unwrap().unwrap().addr, BASE);
    }
    let mut h = HostCachingAllocator::new(Box::new(m));
    assert_eq!(h.allocate(1).unwrap().unwrap().addr, BASE + 2 * MIB);
    assert_eq!(h.into_memory().next_base(), BASE + 2 * MIB + 1);
}

#[test]
fn dropping_with_live_blocks_is_fine() {
    let mut a = device();
    let mut h = host();
    for i in 0..100 {
        alloc(&mut a, i * 4099 + 1, (i % 3) as StreamKey);
        h.allocate(i * 4099 + 1).unwrap();
    }
    drop(a);
    drop(h);
}

// ---------------------------------------------------------------------------------------------
// Host: scripted sequences

fn halloc(h: &mut HostCachingAllocator<ModelMemory>, bytes: u64) -> Block {
    h.allocate(bytes)
        .expect("allocation failed")
        .expect("empty allocation")
}

#[test]
fn host_sizes_round_to_powers_of_two_and_segments_stack() {
    let mut h = host();
    assert_eq!(halloc(&mut h, 100), block(BASE, 128, Pool::Host, true));
    assert_eq!(
        halloc(&mut h, 129),
        block(BASE + 128, 256, Pool::Host, true)
    );
    assert_eq!(halloc(&mut h, 1), block(BASE + 384, 1, Pool::Host, true));
    assert_eq!(halloc(&mut h, 3), block(BASE + 385, 4, Pool::Host, true));
    assert_eq!(
        h.segments().collect::<Vec<_>>(),
        vec![
            (BASE, 128),
            (BASE + 128, 256),
            (BASE + 384, 1),
            (BASE + 385, 4)
        ]
    );
    assert_eq!(h.allocate(0).unwrap(), None);
    assert!(matches!(
        h.allocate((1 << 63) + 1),
        Err(AllocError::SizeOverflow { .. })
    ));
}

#[test]
fn host_reuses_only_the_same_size_most_recently_freed_first() {
    let mut h = host();
    let a = halloc(&mut h, 100);
    let b = halloc(&mut h, 128);
    let c = halloc(&mut h, 256);
    h.free(a.addr).unwrap();
    h.free(b.addr).unwrap();
    h.free(c.addr).unwrap();
    // 100 -> 128: the most recently freed 128 B block first.
    assert_eq!(halloc(&mut h, 100), block(b.addr, 128, Pool::Host, false));
    assert_eq!(halloc(&mut h, 65), block(a.addr, 128, Pool::Host, false));
    // No free 128 B block left: a new segment, although a 256 B block is free (no splitting).
    assert_eq!(
        halloc(&mut h, 128),
        block(BASE + 512, 128, Pool::Host, true)
    );
    // And a 64 B request does not take a larger block either.
    assert_eq!(halloc(&mut h, 64), block(BASE + 640, 64, Pool::Host, true));
    assert_eq!(halloc(&mut h, 200), block(c.addr, 256, Pool::Host, false));
    assert_eq!(
        h.stats(),
        AllocatorStats {
            segments: 5,
            reserved_bytes: 128 + 128 + 256 + 128 + 64,
            allocated_bytes: 128 + 128 + 256 + 128 + 64,
            live_blocks: 5,
            free_blocks: 0,
        }
    );
}

#[test]
fn host_free_errors() {
    let mut h = host();
    let a = halloc(&mut h, 100);
    assert!(matches!(
        h.free(a.addr + 1),
        Err(AllocError::InvalidFree { .. })
    ));
    h.free(a.addr).unwrap();
    assert!(matches!(
        h.free(a.addr),
        Err(AllocError::InvalidFree { .. })
    ));
    let state = h.block(a.addr).unwrap();
    assert_eq!(
        state,
        BlockState {
            addr: a.addr,
            size: 128,
            segment: a.addr,
            pool: Pool::Host,
            stream: None,
            allocated: false,
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Random sequences: invariants and a naive reference of the same rules

/// The spec's device rules ("Allocator model", device memory), written as plainly as possible
/// (linear scans), from the spec and not from `streamsan::alloc`. Segments come from `next`
/// upwards, each right above the earlier ones, as `ModelMemory` places them.
#[derive(Default)]
struct RefDevice {
    next: u64,
    /// (base, bytes, pool)
    segments: Vec<(u64, u64, Pool)>,
    /// Sorted by address.
    blocks: Vec<BlockState>,
}

impl RefDevice {
    /// `Some(Some(block))`, `Some(None)` for an empty request (no memory), `None` where the
    /// allocator must fail (a size or address that does not fit in 64 bits).
    fn allocate(&mut self, bytes: u64, stream: StreamKey) -> Option<Option<Block>> {
        if bytes == 0 {
            return Some(None);
        }
        // "Sizes round up to a multiple of 512 bytes. Requests up to 1 MiB use the small pool,
        // larger ones the large pool."
        let rounded = bytes.checked_next_multiple_of(512)?;
        let pool = if rounded <= MIB {
            Pool::Small
        } else {
            Pool::Large
        };
        // "A request takes the best-fitting free block of its pool owned by its stream:
        // smallest, then lowest address."
        let best = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                !b.allocated && b.pool == pool && b.stream == Some(stream) && b.size >= rounded
            })
            .min_by_key(|(_, b)| (b.size, b.addr))
            .map(|(i, _)| i);
        let (i, fresh) = match best {
            Some(i) => (i, false),
            None => {
                // "A new segment is 2 MiB for the small pool, 20 MiB for requests under 10 MiB,
                // and otherwise the request rounded up to 2 MiB", above every earlier one.
                let seg = if pool == Pool::Small {
                    2 * MIB
                } else if rounded < 10 * MIB {
                    20 * MIB
                } else {
                    rounded.checked_next_multiple_of(2 * MIB)?
                };
                let base = self.next;
                self.next = base.checked_add(seg)?;
                self.segments.push((base, seg, pool));
                self.blocks.push(BlockState {
                    addr: base,
                    size: seg,
                    segment: base,
                    pool,
                    stream: Some(stream),
                    allocated: false,
                });
                (self.blocks.len() - 1, true)
            }
        };
        // "A block is split when what remains is at least 512 bytes (small pool) or more than
        // 1 MiB (large pool); the allocation takes the lower addresses."
        let remaining = self.blocks[i].size - rounded;
        let split = match pool {
            Pool::Small => remaining >= 512,
            _ => remaining > MIB,
        };
        if split {
            let rest = BlockState {
                addr: self.blocks[i].addr + rounded,
                size: remaining,
                ..self.blocks[i]
            };
            self.blocks[i].size = rounded;
            self.blocks.insert(i + 1, rest);
        }
        self.blocks[i].allocated = true;
        let b = self.blocks[i];
        Some(Some(Block {
            addr: b.addr,
            size: b.size,
            pool,
            fresh_segment: fresh,
        }))
    }

    /// The stream that allocated the live block at `addr`: the owner a caching free returns it to.
    fn owner(&self, addr: u64) -> Option<StreamKey> {
        self.blocks
            .iter()
            .find(|b| b.addr == addr && b.allocated)
            .and_then(|b| b.stream)
    }

    /// A caching free: the block goes back to the stream that owns it. `false` where `addr` is
    /// not the start of a live block.
    fn free_caching(&mut self, addr: u64) -> bool {
        match self.owner(addr) {
            Some(owner) => self.free(addr, owner),
            None => false,
        }
    }

    /// A stream-ordered free: the block goes to `stream`, "reused only by later allocations on
    /// its stream". `false` where `addr` is not the start of a live block.
    fn free(&mut self, addr: u64, stream: StreamKey) -> bool {
        let Some(mut i) = self
            .blocks
            .iter()
            .position(|b| b.addr == addr && b.allocated)
        else {
            return false;
        };
        self.blocks[i].allocated = false;
        self.blocks[i].stream = Some(stream);
        // "A freed block merges with free neighbours of its segment that belong to the same
        // stream."
        let mergeable = |a: &BlockState, b: &BlockState| {
            !a.allocated && !b.allocated && a.segment == b.segment && a.stream == b.stream
        };
        if i > 0 && mergeable(&self.blocks[i - 1], &self.blocks[i]) {
            self.blocks[i - 1].size += self.blocks[i].size;
            self.blocks.remove(i);
            i -= 1;
        }
        if i + 1 < self.blocks.len() && mergeable(&self.blocks[i], &self.blocks[i + 1]) {
            self.blocks[i].size += self.blocks[i + 1].size;
            self.blocks.remove(i + 1);
        }
        true
    }
}

/// The spec's pinned and managed rules ("Allocator model", `CachingHostAllocator`), as plainly as
/// possible: "sizes round up to a power of two; a request is served only from the free blocks of
/// exactly that size, the most recently freed first; blocks never split or merge and have no
/// stream". Each new block is a segment of its own, right above the earlier ones.
#[derive(Default)]
struct RefHost {
    next: u64,
    /// (addr, size, allocated), in address order.
    blocks: Vec<(u64, u64, bool)>,
    /// The addresses of free blocks, most recently freed last.
    freed: Vec<u64>,
}

impl RefHost {
    /// As [`RefDevice::allocate`].
    fn allocate(&mut self, bytes: u64) -> Option<Option<Block>> {
        if bytes == 0 {
            return Some(None);
        }
        let size = bytes.checked_next_power_of_two()?;
        let size_of = |addr: u64, blocks: &[(u64, u64, bool)]| {
            blocks.iter().find(|b| b.0 == addr).map(|b| b.1)
        };
        if let Some(k) = self
            .freed
            .iter()
            .rposition(|&a| size_of(a, &self.blocks) == Some(size))
        {
            let addr = self.freed.remove(k);
            let b = self.blocks.iter_mut().find(|b| b.0 == addr)?;
            b.2 = true;
            return Some(Some(block(addr, size, Pool::Host, false)));
        }
        let addr = self.next;
        self.next = addr.checked_add(size)?;
        self.blocks.push((addr, size, true));
        Some(Some(block(addr, size, Pool::Host, true)))
    }

    /// `false` where `addr` is not the start of a live block.
    fn free(&mut self, addr: u64) -> bool {
        match self.blocks.iter_mut().find(|b| b.0 == addr && b.2) {
            Some(b) => {
                b.2 = false;
                self.freed.push(addr);
                true
            }
            None => false,
        }
    }

    /// The blocks as the allocator lists them.
    fn states(&self) -> Vec<BlockState> {
        self.blocks
            .iter()
            .map(|&(addr, size, allocated)| BlockState {
                addr,
                size,
                segment: addr,
                pool: Pool::Host,
                stream: None,
                allocated,
            })
            .collect()
    }
}

/// The invariants every allocator state keeps, checked through the public API.
fn check_tiling(
    segments: &[(u64, u64)],
    blocks: &[BlockState],
    stats: AllocatorStats,
) -> Result<(), TestCaseError> {
    let mut it = blocks.iter();
    let mut reserved = 0u64;
    let mut prev_end = 0u64;
    for &(base, bytes) in segments {
        prop_assert!(base >= prev_end, "segments overlap or are out of order");
        let end = base.checked_add(bytes);
        prop_assert!(end.is_some(), "segment ends past 2^64");
        let end = end.unwrap();
        prev_end = end;
        reserved += bytes;
        let mut at = base;
        while at < end {
            let b = it.next();
            prop_assert!(b.is_some(), "segment {:#x} not covered", base);
            let b = b.unwrap();
            prop_assert_eq!(b.addr, at, "gap or overlap");
            prop_assert_eq!(b.segment, base);
            prop_assert!(b.size > 0);
            at = b.addr + b.size;
        }
        prop_assert_eq!(at, end, "a block reaches past its segment");
    }
    prop_assert!(it.next().is_none(), "a block lies outside every segment");
    let live: Vec<_> = blocks.iter().filter(|b| b.allocated).collect();
    prop_assert_eq!(stats.segments, segments.len());
    prop_assert_eq!(stats.reserved_bytes, reserved);
    prop_assert_eq!(stats.live_blocks, live.len());
    prop_assert_eq!(
        stats.allocated_bytes,
        live.iter().map(|b| b.size).sum::<u64>()
    );
    prop_assert_eq!(stats.free_blocks, blocks.len() - live.len());
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        bytes: u64,
        stream: StreamKey,
    },
    /// Free the `pick`-th live block (modulo their number) on `stream`, or its owner.
    Free {
        pick: usize,
        stream: Option<StreamKey>,
    },
    /// Free an arbitrary address (usually invalid).
    FreeAt {
        addr: u64,
        stream: StreamKey,
    },
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=4 * KIB,
        4 => 0..=MIB + KIB,
        3 => 0..=64 * MIB,
        // Whole multiples hit the boundaries: exact fits, 1 MiB remainders, 10 MiB.
        3 => (1..=96u64).prop_map(|k| k * 256 * KIB),
        1 => Just(u64::MAX),
        1 => (u64::MAX - 64 * MIB)..=u64::MAX,
        1 => (1u64 << 62)..=(1u64 << 63) + 1,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0..4u32).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        4 => (any::<usize>(), proptest::option::of(0..4u32))
            .prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => (any::<u64>(), 0..4u32).prop_map(|(addr, stream)| Op::FreeAt { addr, stream }),
    ]
}

fn base() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        3 => Just(BASE),
        2 => (u64::MAX - 200 * MIB)..=u64::MAX,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn device_random_sequences(base in base(), ops in prop::collection::vec(op(), 0..120)) {
        let mut a = DeviceCachingAllocator::new(ModelMemory::new(base));
        let mut r = RefDevice { next: base, ..RefDevice::default() };
        let mut live: Vec<Block> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { bytes, stream } => {
                    let got = a.allocate(bytes, stream);
                    let want = r.allocate(bytes, stream);
                    match (&got, want) {
                        (Ok(g), Some(w)) => prop_assert_eq!(*g, w),
                        (Err(_), None) => {}
                        _ => prop_assert!(false, "{:?} vs reference {:?}", got, want),
                    }
                    if let Ok(Some(b)) = got {
                        prop_assert!(b.size >= bytes);
                        prop_assert!(live.iter().all(|l| l.end() <= b.addr || b.end() <= l.addr),
                            "live blocks overlap");
                        live.push(b);
                    }
                }
                Op::Free { pick, stream } => {
                    if live.is_empty() {
                        continue;
                    }
                    let b = live.swap_remove(pick % live.len());
                    match stream {
                        Some(s) => {
                            a.free(b.addr, s).unwrap();
                            prop_assert!(r.free(b.addr, s));
                        }
                        None => {
                            a.free_caching(b.addr).unwrap();
                            prop_assert!(r.free_caching(b.addr));
                        }
                    }
                }
                Op::FreeAt { addr, stream } => {
                    let valid = live.iter().position(|l| l.addr == addr);
                    let got = a.free(addr, stream);
                    prop_assert_eq!(got.is_ok(), valid.is_some());
                    prop_assert_eq!(r.free(addr, stream), valid.is_some());
                    if let Some(i) = valid {
                        live.swap_remove(i);
                    }
                }
            }
            let blocks: Vec<BlockState> = a.blocks().collect();
            let segments: Vec<(u64, u64)> = a.segments().collect();
            check_tiling(&segments, &blocks, a.stats())?;
            prop_assert_eq!(&blocks, &r.blocks);
            prop_assert_eq!(
                segments,
                r.segments.iter().map(|&(b, n, _)| (b, n)).collect::<Vec<_>>()
            );
            for &(b, _, pool) in &r.segments {
                prop_assert_eq!(a.segment_pool(b), Some(pool));
            }
            prop_assert_eq!(blocks.iter().filter(|b| b.allocated).count(), live.len());
        }
    }

    #[test]
    fn host_random_sequences(base in base(), ops in prop::collection::vec(op(), 0..120)) {
        let mut h = HostCachingAllocator::new(ModelMemory::new(base));
        let mut r = RefHost { next: base, ..RefHost::default() };
        let mut live: Vec<Block> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { bytes, .. } => {
                    let got = h.allocate(bytes);
                    let want = r.allocate(bytes);
                    match (&got, want) {
                        (Ok(g), Some(w)) => prop_assert_eq!(*g, w),
                        (Err(_), None) => {}
                        _ => prop_assert!(false, "{:?} vs reference {:?}", got, want),
                    }
                    if let Ok(Some(b)) = got {
                        prop_assert!(b.size >= bytes);
                        prop_assert!(live.iter().all(|l| l.end() <= b.addr || b.end() <= l.addr),
                            "live blocks overlap");
                        live.push(b);
                    }
                }
                Op::Free { pick, .. } => {
                    if live.is_empty() {
                        continue;
                    }
                    let b = live.swap_remove(pick % live.len());
                    h.free(b.addr).unwrap();
                    prop_assert!(r.free(b.addr));
                }
                Op::FreeAt { addr, .. } => {
                    let valid = live.iter().position(|l| l.addr == addr);
                    prop_assert_eq!(h.free(addr).is_ok(), valid.is_some());
                    prop_assert_eq!(r.free(addr), valid.is_some());
                    if let Some(i) = valid {
                        live.swap_remove(i);
                    }
                }
            }
            let blocks: Vec<BlockState> = h.blocks().collect();
            let segments: Vec<(u64, u64)> = h.segments().collect();
            check_tiling(&segments, &blocks, h.stats())?;
            prop_assert_eq!(&blocks, &r.states());
            prop_assert_eq!(
                segments,
                r.blocks.iter().map(|&(a, n, _)| (a, n)).collect::<Vec<_>>()
            );
            prop_assert_eq!(blocks.iter().filter(|b| b.allocated).count(), live.len());
        }
    }
}
