//! Graph memory pools: the arenas that the allocations of a CUDA graph capture come from.
//!
//! The trace format ("CUDA graphs", "Memory of a capture"): an `alloc` on a capturing stream
//! takes memory from the capture's pool, and each pool is an arena of its own with the device
//! allocator's rules. So a pool is a [`DeviceCachingAllocator`] of its own: its blocks are never
//! handed out by another pool or by the plain device allocator. Its segments come from the same
//! device address space as every other device segment ("each new segment of a memory kind is
//! placed above every earlier one"): [`GraphPools::allocate`] maps them from the caller's
//! [`ModelMemory`] of device memory.
//!
//! One rule is the pool's own: a block freed with `record_stream` streams while a capture of its
//! pool is underway is not handed out again within that capture. It is held back and returned
//! to the pool when no capture of the pool is underway any more (PyTorch defers such frees until
//! the capture ends, since it cannot record and query events during a capture).

use std::collections::BTreeMap;

use super::{AllocError, Block, DeviceCachingAllocator, ModelMemory, StreamKey};

/// A pool's index in [`GraphPools`].
pub type PoolIndex = u32;

/// One pool: its arena, the captures of it underway, the blocks held back until they end.
#[derive(Clone, Debug)]
struct Arena {
    alloc: DeviceCachingAllocator<ModelMemory>,
    capturing: u32,
    held: Vec<(u64, StreamKey)>,
}

/// Every graph memory pool of a trace: one device caching allocator each, sharing the device
/// address space.
#[derive(Clone, Debug, Default)]
pub struct GraphPools {
    arenas: Vec<Arena>,
}

impl GraphPools {
    /// No pool yet.
    pub fn new() -> Self {
        GraphPools::default()
    }

    /// A new, empty pool.
    pub fn add(&mut self) -> PoolIndex {
        self.arenas.push(Arena {
            // The arena's own memory is never used: allocations map from the device's.
            alloc: DeviceCachingAllocator::new(ModelMemory::new(0)),
            capturing: 0,
            held: Vec::new(),
        });
        self.arenas.len() as PoolIndex - 1
    }

    /// Number of pools.
    pub fn len(&self) -> usize {
        self.arenas.len()
    }

    /// Whether there is no pool.
    pub fn is_empty(&self) -> bool {
        self.arenas.is_empty()
    }

    /// Allocates `bytes` bytes for `stream` from `pool`, mapping any new segment from `device`
    /// (the device address space, shared with the plain allocator and every other pool).
    /// `Ok(None)` for an empty request. An unknown pool has no block to give: it is an
    /// [`AllocError::InvalidFree`] of address 0.
    pub fn allocate(
        &mut self,
        pool: PoolIndex,
        bytes: u64,
        stream: StreamKey,
        device: &mut ModelMemory,
    ) -> Result<Option<Block>, AllocError<super::AddressSpaceExhausted>> {
        let Some(arena) = self.arenas.get_mut(pool as usize) else {
            return Err(AllocError::InvalidFree { addr: 0 });
        };
        // The arena maps from the device's address space: lend it the device's memory for the
        // call, so that its new segment lies above every earlier device segment.
        std::mem::swap(arena.alloc.memory_mut(), device);
        let block = arena.alloc.allocate(bytes, stream);
        std::mem::swap(arena.alloc.memory_mut(), device);
        block
    }

    /// Returns the block at `addr` to `pool`, as a free block of `stream`. With `hold` (the
    /// buffer had `record_stream` streams) and a capture of the pool underway, the block is held
    /// back until no capture of the pool is underway.
    pub fn free(
        &mut self,
        pool: PoolIndex,
        addr: u64,
        stream: StreamKey,
        hold: bool,
    ) -> Result<(), AllocError<super::AddressSpaceExhausted>> {
        let Some(arena) = self.arenas.get_mut(pool as usize) else {
            return Err(AllocError::InvalidFree { addr });
        };
        if arena.alloc.block(addr).is_none_or(|b| !b.allocated) {
            return Err(AllocError::InvalidFree { addr });
        }
        if hold && arena.capturing > 0 {
            arena.held.push((addr, stream));
            return Ok(());
        }
        arena.alloc.free(addr, stream)
    }

    /// A capture of `pool` begins.
    pub fn begin_capture(&mut self, pool: PoolIndex) {
        if let Some(arena) = self.arenas.get_mut(pool as usize) {
            arena.capturing += 1;
        }
    }

    /// A capture of `pool` ends: when it was the last one underway, the blocks held back are
    /// returned to the pool, in the order they were freed.
    pub fn end_capture(&mut self, pool: PoolIndex) {
        let Some(arena) = self.arenas.get_mut(pool as usize) else {
            return;
        };
        arena.capturing = arena.capturing.saturating_sub(1);
        if arena.capturing == 0 {
            for (addr, stream) in std::mem::take(&mut arena.held) {
                // Held blocks are live blocks of this arena: returning them cannot fail.
                let _ = arena.alloc.free(addr, stream);
            }
        }
    }

    /// The arena of `pool`, to inspect its blocks.
    pub fn allocator(&self, pool: PoolIndex) -> Option<&DeviceCachingAllocator<ModelMemory>> {
        self.arenas.get(pool as usize).map(|a| &a.alloc)
    }
}

/// Recorded addresses (`addr`): the device bytes each graph pool holds, its buffers', freed or
/// not, merged per pool; the pools' ranges are disjoint. A pool keeps its bytes until they go
/// back to the driver: PyTorch frees a pool's segments once no graph uses it (`empty_cache`,
/// which every capture's start calls), and another pool or a plain allocation may then be given
/// them ([`PoolBytes::release`]). The checker and the executor keep one each.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolBytes {
    /// start → (end, pool).
    ranges: BTreeMap<u64, (u64, PoolIndex)>,
}

impl PoolBytes {
    /// A device allocation of `[a, end)` from `pool` (or from none) takes these bytes from every
    /// other pool that held them; returns whether any did. (The ranges are disjoint: walking
    /// down from `end`, the first that ends at or below `a` ends the search.)
    pub(crate) fn release(&mut self, a: u64, end: u64, pool: Option<PoolIndex>) -> bool {
        let taken: Vec<(u64, u64, PoolIndex)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > a)
            .filter(|(_, &(_, p))| Some(p) != pool)
            .map(|(&s, &(e, p))| (s, e, p))
            .collect();
        for &(s, e, p) in &taken {
            self.ranges.remove(&s);
            if s < a {
                self.ranges.insert(s, (a, p));
            }
            if e > end {
                self.ranges.insert(end, (e, p));
            }
        }
        !taken.is_empty()
    }

    /// `pool` holds `[lo, hi)` from now on (taken from any other pool first: [`Self::release`]),
    /// merged with its own touching ranges; another pool's bytes end where these begin, or begin
    /// where they end.
    pub(crate) fn hold(&mut self, mut lo: u64, mut hi: u64, pool: PoolIndex) {
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=hi)
            .rev()
            .take_while(|(_, &(e, _))| e >= lo)
            .filter(|(_, &(_, p))| p == pool)
            .map(|(&s, &(e, _))| (s, e))
            .collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.ranges.insert(lo, (hi, pool));
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Memory;

    #[test]
    fn pools_are_arenas_in_one_address_space() {
        let mut device = DeviceCachingAllocator::new(ModelMemory::new(0x1000_0000));
        let mut pools = GraphPools::new();
        let (p, q) = (pools.add(), pools.add());
        let a = device.allocate(512, 0).unwrap().unwrap();
        let b = pools
            .allocate(p, 512, 0, device.memory_mut())
            .unwrap()
            .unwrap();
        let c = pools
            .allocate(q, 512, 0, device.memory_mut())
            .unwrap()
            .unwrap();
        // Each pool mapped a segment of its own, above the device's first one.
        assert_eq!(a.addr, 0x1000_0000);
        assert_eq!(b.addr, 0x1000_0000 + (2 << 20));
        assert_eq!(c.addr, 0x1000_0000 + (4 << 20));
        assert_eq!(device.memory_mut().map_segment(1), Ok(0x1000_0000 + (6 << 20)));
        // A block freed to a pool is reused by that pool only.
        pools.free(p, b.addr, 0, false).unwrap();
        let d = pools
            .allocate(q, 512, 0, device.memory_mut())
            .unwrap()
            .unwrap();
        assert_eq!(d.addr, c.addr + 512);
        let e = pools
            .allocate(p, 512, 0, device.memory_mut())
            .unwrap()
            .unwrap();
        assert_eq!(e.addr, b.addr);
        // The stream matters inside a pool, as in the device allocator.
        pools.free(p, e.addr, 0, false).unwrap();
        let f = pools
            .allocate(p, 512, 1, device.memory_mut())
            .unwrap()
            .unwrap();
        assert_ne!(f.addr, e.addr);
        assert!(pools.free(p, 0xdead, 0, false).is_err());
        assert!(pools.free(7, e.addr, 0, false).is_err());
    }

    #[test]
    fn record_stream_blocks_wait_for_the_end_of_the_capture() {
        let mut device = ModelMemory::new(0);
        let mut pools = GraphPools::new();
        let p = pools.add();
        pools.begin_capture(p);
        let t = pools.allocate(p, 512, 0, &mut device).unwrap().unwrap();
        pools.free(p, t.addr, 0, true).unwrap();
        let u = pools.allocate(p, 512, 0, &mut device).unwrap().unwrap();
        assert_ne!(u.addr, t.addr, "held back within the capture");
        // Without record_stream streams, the block comes back at once.
        pools.free(p, u.addr, 0, false).unwrap();
        let v = pools.allocate(p, 512, 0, &mut device).unwrap().unwrap();
        assert_eq!(v.addr, u.addr);
        pools.end_capture(p);
        pools.begin_capture(p);
        let w = pools.allocate(p, 512, 0, &mut device).unwrap().unwrap();
        assert_eq!(w.addr, t.addr, "returned at the end of the capture");
        // Outside a capture, nothing is held back.
        pools.end_capture(p);
        pools.free(p, w.addr, 0, true).unwrap();
        assert!(pools.allocator(p).unwrap().block(w.addr).is_some_and(|b| !b.allocated));
    }
}
