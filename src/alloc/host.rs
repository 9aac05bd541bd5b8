//! The host policy: PyTorch's `CachingHostAllocator`, as the trace format fixes it.

use std::collections::BTreeMap;

use super::{segment_is_usable, AllocError, AllocatorStats, Block, BlockState, Memory, Pool};

/// A host request size rounded up to a power of two; `None` on overflow (above 2^63).
///
/// `round_host_size(0)` is `Some(1)`, but the allocator takes no memory for an empty request.
pub fn round_host_size(bytes: u64) -> Option<u64> {
    bytes.checked_next_power_of_two()
}

#[derive(Clone, Copy, Debug)]
struct HostBlock {
    size: u64,
    allocated: bool,
}

/// PyTorch's host caching allocator (`aten/src/ATen/core/CachingHostAllocator.h`), as the trace
/// format's "Allocator model" fixes it for pinned and managed memory (one allocator, and one
/// address space, per memory kind).
///
/// - A request is rounded up to a power of two.
/// - It is served only from the free blocks of exactly that size, the most recently freed first.
/// - Otherwise a new segment of exactly the rounded size is mapped; it is the block.
/// - Blocks never split or merge and have no stream.
///
/// Segments are never given back. Every operation is O(log n) in the number of blocks.
#[derive(Clone, Debug)]
pub struct HostCachingAllocator<M: Memory> {
    memory: M,
    /// Every block (each is a whole segment), by address.
    blocks: BTreeMap<u64, HostBlock>,
    /// Free blocks by size, most recently freed last.
    free: BTreeMap<u64, Vec<u64>>,
    reserved_bytes: u64,
    allocated_bytes: u64,
    live_blocks: usize,
    free_blocks: usize,
}

impl<M: Memory> HostCachingAllocator<M> {
    /// An allocator with no segments, which maps its segments from `memory`.
    pub fn new(memory: M) -> Self {
        HostCachingAllocator {
            memory,
            blocks: BTreeMap::new(),
            free: BTreeMap::new(),
            reserved_bytes: 0,
            allocated_bytes: 0,
            live_blocks: 0,
            free_blocks: 0,
        }
    }

    /// Allocates `bytes` bytes.
    ///
    /// `Ok(None)` for `bytes == 0`: an empty allocation takes no memory. Errors: the rounded size
    /// overflows ([`AllocError::SizeOverflow`]), the memory cannot map a segment
    /// ([`AllocError::Map`]) or maps an unusable one ([`AllocError::BadSegment`]); the allocator is
    /// then unchanged.
    pub fn allocate(&mut self, bytes: u64) -> Result<Option<Block>, AllocError<M::Error>> {
        if bytes == 0 {
            return Ok(None);
        }
        let size = round_host_size(bytes).ok_or(AllocError::SizeOverflow { bytes })?;
        let reused = match self.free.get_mut(&size) {
            Some(stack) => {
                let addr = stack.pop();
                if stack.is_empty() {
                    self.free.remove(&size);
                }
                addr
            }
            None => None,
        };
        let (addr, fresh_segment) = match reused {
            Some(addr) => {
                self.free_blocks -= 1;
                (addr, false)
            }
            None => {
                let base = self
                    .memory
                    .map_segment(size)
                    .map_err(|source| AllocError::Map {
                        bytes: size,
                        source,
                    })?;
                if !segment_is_usable(&self.blocks, |b| b.size, base, size) {
                    return Err(AllocError::BadSegment { base, bytes: size });
                }
                self.reserved_bytes = self.reserved_bytes.saturating_add(size);
                (base, true)
            }
        };
        self.blocks.insert(
            addr,
            HostBlock {
                size,
                allocated: true,
            },
        );
        self.allocated_bytes += size;
        self.live_blocks += 1;
        Ok(Some(Block {
            addr,
            size,
            pool: Pool::Host,
            fresh_segment,
        }))
    }

    /// Frees the live allocation at `addr`: its block is cached for later requests of its size.
    ///
    /// Error: `addr` is not the start of a live allocation ([`AllocError::InvalidFree`]); the
    /// allocator is then unchanged.
    pub fn free(&mut self, addr: u64) -> Result<(), AllocError<M::Error>> {
        let block = match self.blocks.get_mut(&addr) {
            Some(block) if block.allocated => block,
            _ => return Err(AllocError::InvalidFree { addr }),
        };
        block.allocated = false;
        let size = block.size;
        self.free.entry(size).or_default().push(addr);
        self.allocated_bytes -= size;
        self.live_blocks -= 1;
        self.free_blocks += 1;
        Ok(())
    }

    /// The block that starts at `addr`, live or free.
    pub fn block(&self, addr: u64) -> Option<BlockState> {
        self.blocks.get(&addr).map(|b| state(addr, b))
    }

    /// Every block, live or free, in address order. Each block is a whole segment.
    pub fn blocks(&self) -> impl Iterator<Item = BlockState> + '_ {
        self.blocks.iter().map(|(&addr, b)| state(addr, b))
    }

    /// Every segment as (base address, bytes), in address order.
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks.iter().map(|(&addr, b)| (addr, b.size))
    }

    /// Counters: segments, reserved bytes, allocated bytes, live blocks, free blocks.
    pub fn stats(&self) -> AllocatorStats {
        AllocatorStats {
            segments: self.blocks.len(),
            reserved_bytes: self.reserved_bytes,
            allocated_bytes: self.allocated_bytes,
            live_blocks: self.live_blocks,
            free_blocks: self.free_blocks,
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

fn state(addr: u64, b: &HostBlock) -> BlockState {
    BlockState {
        addr,
        size: b.size,
        segment: addr,
        pool: Pool::Host,
        stream: None,
        allocated: b.allocated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::ModelMemory;

    #[test]
    fn rounding() {
        assert_eq!(round_host_size(1), Some(1));
        assert_eq!(round_host_size(100), Some(128));
        assert_eq!(round_host_size(128), Some(128));
        assert_eq!(round_host_size(129), Some(256));
        assert_eq!(round_host_size(1 << 63), Some(1 << 63));
        assert_eq!(round_host_size((1 << 63) + 1), None);
    }

    #[test]
    fn counters_follow_calls() {
        let mut a = HostCachingAllocator::new(ModelMemory::new(0));
        let x = a.allocate(100).unwrap().unwrap();
        let y = a.allocate(100).unwrap().unwrap();
        a.free(x.addr).unwrap();
        assert_eq!(
            a.stats(),
            AllocatorStats {
                segments: 2,
                reserved_bytes: 256,
                allocated_bytes: 128,
                live_blocks: 1,
                free_blocks: 1,
            }
        );
        a.free(y.addr).unwrap();
        assert!(a.free(y.addr).is_err());
        assert_eq!(a.stats().free_blocks, 2);
        assert_eq!(a.free.get(&128).map(Vec::len), Some(2));
        let z = a.allocate(128).unwrap().unwrap();
        assert_eq!(z.addr, y.addr);
        let _ = a.allocate(1).unwrap().unwrap();
        assert_eq!(a.stats().free_blocks, 1);
    }
}
