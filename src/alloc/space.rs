//! The model's address spaces: one per memory kind, each starting at its own base.
//!
//! The trace format places every new segment of a memory kind above the earlier ones; where the
//! first one lies is this module's choice, and every part of streamsan that hands out or reads
//! back model addresses asks it: the checker and the oracle (allocations without `addr`), the
//! fuzz generator, [`crate::fuzz::runnable`] (which compresses recorded addresses into these
//! spaces), the simulator (its arenas, and the memory a program places) and the GPU executor
//! (which maps the placed memory of a program to real segments, offset by offset).
//!
//! The bases are far apart (16 TiB at least), so the kinds never overlap, and the device space
//! starts high, as device addresses of a real GPU do.

use super::ModelMemory;
use crate::trace::MemoryKind;

/// Where the model's device memory starts.
pub const DEVICE_BASE: u64 = 0x7f00_0000_0000;
/// Where the model's pinned host memory starts.
pub const PINNED_BASE: u64 = 0x2000_0000_0000;
/// Where the model's managed memory starts.
pub const MANAGED_BASE: u64 = 0x3000_0000_0000;

/// The base of every memory kind, indexed by [`MemoryKind::index`] (device, pinned, managed).
pub const BASES: [u64; 3] = [DEVICE_BASE, PINNED_BASE, MANAGED_BASE];

/// Where the model's address space of `memory` starts.
///
/// ```
/// use streamsan::alloc::space;
/// use streamsan::trace::MemoryKind;
/// assert_eq!(space::base(MemoryKind::Device), space::DEVICE_BASE);
/// assert!(space::base(MemoryKind::Pinned) < space::base(MemoryKind::Managed));
/// ```
pub const fn base(memory: MemoryKind) -> u64 {
    match memory {
        MemoryKind::Device => DEVICE_BASE,
        MemoryKind::Pinned => PINNED_BASE,
        MemoryKind::Managed => MANAGED_BASE,
    }
}

impl ModelMemory {
    /// The model's empty address space of `memory`, from [`base`]`(memory)`.
    pub fn of(memory: MemoryKind) -> Self {
        ModelMemory::new(base(memory))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Memory;

    #[test]
    fn spaces_start_at_their_bases_and_do_not_overlap() {
        for m in [MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Managed] {
            assert_eq!(BASES[m.index()], base(m));
            assert_eq!(ModelMemory::of(m).base(), base(m));
        }
        let mut sorted = BASES;
        sorted.sort_unstable();
        for w in sorted.windows(2) {
            assert!(w[1] - w[0] >= 1 << 44, "at least 16 TiB between two spaces");
        }
        let mut device =
            crate::alloc::DeviceCachingAllocator::new(ModelMemory::of(MemoryKind::Device));
        assert_eq!(device.allocate(100, 0).unwrap().unwrap().addr, DEVICE_BASE);
        assert_eq!(
            ModelMemory::of(MemoryKind::Managed).map_segment(4),
            Ok(MANAGED_BASE)
        );
    }
}
