//! What a user kernel run by [`Launch::run`](crate::session::Launch::run) gets: its op index, its
//! declared regions, and the stream (on a GPU) or the simulated memory (on the simulator).

use std::cell::RefCell;
use std::fmt;

use super::error::{LaunchError, SessionError};
use super::region::Region;
use crate::exec::SimMemory;

/// A user kernel as [`Launch::run`](crate::session::Launch::run) passes it on.
pub(crate) type KernelFn<'f> = dyn FnMut(&RawLaunch<'_>) -> Result<(), LaunchError> + 'f;

/// Where a user kernel runs.
pub(crate) enum RawTarget<'a> {
    Sim(RefCell<&'a mut dyn SimMemory>),
    #[cfg(feature = "cuda")]
    Cuda {
        stream: &'a crate::cuda::Stream,
        gpu: &'a crate::cuda::Gpu,
    },
}

/// What a user kernel gets from [`Launch::run`](crate::session::Launch::run): its op index, its
/// declared regions, and the stream (on a GPU) or the simulated memory (on the simulator).
pub struct RawLaunch<'a> {
    pub(crate) op: u64,
    pub(crate) reads: &'a [Region],
    pub(crate) writes: &'a [Region],
    pub(crate) target: RawTarget<'a>,
}

impl fmt::Debug for RawLaunch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawLaunch")
            .field("op", &self.op)
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .field("simulated", &self.is_simulated())
            .finish()
    }
}

fn inside(r: &Region, of: &[Region]) -> bool {
    of.iter().any(|d| {
        d.key == r.key
            && d.memory == r.memory
            && d.device_ptr() <= r.device_ptr()
            && r.device_ptr() + r.bytes <= d.device_ptr() + d.bytes
    })
}

impl RawLaunch<'_> {
    /// The launch's op index.
    pub fn op(&self) -> u64 {
        self.op
    }

    /// The declared read regions, in order (their `device_ptr` is what a kernel takes).
    pub fn reads(&self) -> &[Region] {
        self.reads
    }

    /// The declared write regions, in order.
    pub fn writes(&self) -> &[Region] {
        self.writes
    }

    /// Whether this launch runs on the simulator.
    pub fn is_simulated(&self) -> bool {
        matches!(self.target, RawTarget::Sim(_))
    }

    /// The raw `CUstream` to enqueue the kernel on; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn cu_stream(&self) -> Option<cudarc::driver::sys::CUstream> {
        match &self.target {
            RawTarget::Cuda { stream, .. } => Some(stream.raw()),
            RawTarget::Sim(_) => None,
        }
    }

    /// The device layer's stream, for [`crate::cuda::Kernels`]; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&crate::cuda::Stream> {
        match &self.target {
            RawTarget::Cuda { stream, .. } => Some(stream),
            RawTarget::Sim(_) => None,
        }
    }

    /// The session's device (event tracking off): its [`Kernels`](crate::cuda::Kernels) and its
    /// cudarc context, to launch functions of other modules; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Option<&crate::cuda::Gpu> {
        match &self.target {
            RawTarget::Cuda { gpu, .. } => Some(gpu),
            RawTarget::Sim(_) => None,
        }
    }

    /// On the simulator, the words of `region`, which must lie inside a declared read or write
    /// region. On a GPU, an error: read device memory with a kernel.
    pub fn read_words(&self, region: &Region) -> Result<Vec<u32>, SessionError> {
        match &self.target {
            RawTarget::Sim(b) => {
                if !inside(region, self.reads) && !inside(region, self.writes) {
                    return Err(SessionError::InvalidArgument(format!(
                        "{region:?} is not inside a declared region of the launch"
                    )));
                }
                Ok(b.borrow_mut().read(&region.span())?)
            }
            #[cfg(feature = "cuda")]
            RawTarget::Cuda { .. } => Err(SessionError::InvalidArgument(
                "read_words is for the simulator; on a GPU, enqueue a kernel on cu_stream()".into(),
            )),
        }
    }

    /// On the simulator, writes the words of `region`, which must lie inside a declared write
    /// region. On a GPU, an error: write device memory with a kernel.
    pub fn write_words(&self, region: &Region, words: &[u32]) -> Result<(), SessionError> {
        match &self.target {
            RawTarget::Sim(b) => {
                if !inside(region, self.writes) {
                    return Err(SessionError::InvalidArgument(format!(
                        "{region:?} is not inside a declared write region of the launch"
                    )));
                }
                Ok(b.borrow_mut().write(&region.span(), words)?)
            }
            #[cfg(feature = "cuda")]
            RawTarget::Cuda { .. } => Err(SessionError::InvalidArgument(
                "write_words is for the simulator; on a GPU, enqueue a kernel on cu_stream()"
                    .into(),
            )),
        }
    }
}
