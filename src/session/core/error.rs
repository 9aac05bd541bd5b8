//! What can go wrong in a session.

use crate::checker::CheckError;
use crate::exec::ExecError;
use crate::trace::MemoryKind;

/// The error a user kernel of [`Launch::run`](crate::session::Launch::run) returns.
pub type LaunchError = Box<dyn std::error::Error + Send + Sync>;

/// What can go wrong in a session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// There is no GPU to run on: no CUDA driver, no device, or no device of that ordinal.
    #[error("no GPU: {reason}")]
    NoGpu {
        /// What is missing, in the driver's words.
        reason: String,
    },
    /// A CUDA driver or NVRTC call failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Gpu(#[from] crate::cuda::GpuError),
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
    /// An argument was out of its domain (a region that is not whole words, copy regions of
    /// different lengths, a bad name, too many reads for the hash kernel, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call that CUDA rejects during a stream capture (the trace format's bad input of CUDA
    /// graphs): a host sync of a capturing stream or of a captured event, a device sync while a
    /// capture is underway, a capturing stream waiting on an event recorded outside its capture,
    /// a stream-ordered free on a capturing stream, a copy from or to pageable memory on a
    /// capturing stream, a capture begun on the legacy default stream or on a stream already
    /// capturing, a capture ended on a stream that is not its origin, a launch on a capturing
    /// stream, …
    #[error("not allowed during a capture: {0}")]
    Capture(String),
    /// A handle or region of another session was passed.
    #[error("a stream, event, buffer or region of another session was passed")]
    WrongSession,
    /// The session was finished ([`Session::finish`](crate::Session::finish)); its handles can
    /// no longer record.
    #[error("the session is finished")]
    Finished,
    /// The session was called from inside a closure it was running
    /// ([`Launch::run`](crate::session::Launch::run),
    /// [`PinnedBuffer::write_with`](crate::session::PinnedBuffer::write_with)).
    #[error("the session was called from inside one of its own callbacks")]
    Reentrant,
    /// The checker rejected an op as bad input: a bug of the harness, or a name clash the harness
    /// could not see (e.g. an external region named like a live buffer).
    #[error("the checker rejected op {op}: {0}", op = .0.op)]
    Check(CheckError),
    /// The closure of [`Launch::run`](crate::session::Launch::run) failed.
    #[error("the launch closure failed: {0}")]
    Launch(LaunchError),
    /// Writing the trace failed.
    #[error("cannot write the trace: {0}")]
    Io(#[from] std::io::Error),
    /// The checker thread could not be started or stopped working.
    #[error("the checker thread failed: {0}")]
    Checker(String),
}

impl From<ExecError> for SessionError {
    fn from(e: ExecError) -> Self {
        match e {
            ExecError::InvalidArgument(message) => SessionError::InvalidArgument(message),
            ExecError::Alloc {
                bytes,
                memory,
                reason,
            } => SessionError::Alloc {
                bytes,
                memory,
                reason,
            },
            #[cfg(feature = "cuda")]
            ExecError::Gpu(e) => SessionError::Gpu(e),
            e @ ExecError::Unsupported { .. } => SessionError::InvalidArgument(e.to_string()),
        }
    }
}
