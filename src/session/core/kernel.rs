//! Kernel launches as the core takes them: the declaration of a launch and how a user kernel
//! runs.

use std::borrow::Cow;
use std::panic::Location;

use super::region::Regions;

/// How a user kernel runs.
pub(crate) enum KernelExec<'a> {
    /// On a GPU: `cuLaunchKernel` of a function of the session's context.
    #[cfg(feature = "cuda")]
    Cuda {
        /// The function.
        func: cudarc::driver::sys::CUfunction,
        /// Grid dimensions in blocks.
        grid: (u32, u32, u32),
        /// Block dimensions in threads.
        block: (u32, u32, u32),
        /// Dynamic shared memory per block.
        shared_mem_bytes: u32,
        /// One pointer to each parameter's value.
        args: &'a mut [*mut std::ffi::c_void],
    },
    /// The built-in hash kernel over the declared regions (the simulator's stand-in for a user
    /// kernel: its values differ from the real kernel's, its accesses are the same).
    Hash(std::marker::PhantomData<&'a ()>),
}

/// A kernel launch as declared ([`crate::session::Launch`]): what the core runs.
pub(crate) struct LaunchDesc {
    /// The kernel's name for reports.
    pub(crate) name: Cow<'static, str>,
    /// The regions it reads.
    pub(crate) reads: Regions,
    /// The regions it writes.
    pub(crate) writes: Regions,
    /// Nanoseconds the stream spins first.
    pub(crate) spin_ns: u64,
    /// Where it was issued.
    pub(crate) site: &'static Location<'static>,
}
