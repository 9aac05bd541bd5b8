//! The errors of the execution layer.

use crate::trace::MemoryKind;

/// Why a backend could not run an op.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// Op `op` of a program uses something the backend does not run (or, on a GPU, failed: the
    /// message then starts with `CUDA`). A program runner's error: the program as a whole cannot
    /// be run.
    #[error("op {op}: {message}")]
    Unsupported {
        /// The op index.
        op: usize,
        /// What is not supported, or what failed.
        message: String,
    },
    /// An argument was out of its domain (a region outside the backend's memory, external memory
    /// on the simulator, a kernel with no function for the backend, …).
    #[error("{0}")]
    InvalidArgument(String),
    /// An allocation failed: out of memory, or a size that cannot be rounded.
    #[error("cannot allocate {bytes} bytes of {} memory: {reason}", memory.as_str())]
    Alloc {
        /// The requested size.
        bytes: u64,
        /// The memory kind.
        memory: MemoryKind,
        /// Why, with its causes.
        reason: String,
    },
    /// A CUDA driver or NVRTC call failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Gpu(#[from] crate::cuda::GpuError),
}

impl ExecError {
    /// An [`ExecError::Unsupported`] of op `op`.
    pub fn unsupported(op: usize, message: impl Into<String>) -> Self {
        ExecError::Unsupported {
            op,
            message: message.into(),
        }
    }

    /// An [`ExecError::Alloc`] from an allocator's error, with its chain of causes.
    pub(crate) fn alloc<E: std::error::Error>(
        e: crate::alloc::AllocError<E>,
        bytes: u64,
        memory: MemoryKind,
    ) -> Self {
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            reason.push_str(": ");
            reason.push_str(&s.to_string());
            source = s.source();
        }
        ExecError::Alloc {
            bytes,
            memory,
            reason,
        }
    }
}
