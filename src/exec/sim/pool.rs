//! Graph memory pools on the simulated device: fresh segments of device memory that a caller's
//! pool allocator hands out (a [`Session`](crate::Session) keeps one per graph memory pool).

use super::device::Device;
use crate::alloc::Memory;
use crate::exec::error::ExecError;
use crate::trace::MemoryKind;

impl Device {
    /// Maps a fresh segment of `bytes` bytes of simulated device memory, above every earlier
    /// segment, that the device's own allocator never hands out. Returns its base.
    pub(crate) fn map_device_segment(&mut self, bytes: u64) -> Result<u64, ExecError> {
        self.device
            .memory_mut()
            .map_segment(bytes)
            .map_err(|e| ExecError::Alloc {
                bytes,
                memory: MemoryKind::Device,
                reason: e.to_string(),
            })
    }
}
