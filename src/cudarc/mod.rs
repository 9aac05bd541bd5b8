//! A cudarc-shaped harness: the paths and method names of cudarc 0.19's safe API
//! (`streamsan::cudarc::driver::CudaStream` for `cudarc::driver::CudaStream`, …), over a
//! checked [`Session`](crate::session::Session). Porting a cudarc program means changing its
//! `use` lines.
//!
//! (The guide is in the crate docs and `docs/harness.md`.)

mod context;
mod launch;
mod memory;
pub mod nvrtc;
mod slice;
mod stream;

pub use context::{CudaContext, DriverError, EventFlags};
pub use launch::{CudaFunction, CudaModule, LaunchArgs, LaunchConfig, PushKernelArg};
pub use memory::{HostSlice, PinnedHostSlice};
pub use slice::{
    CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
    ValidAsZeroBits,
};
pub use stream::{CudaEvent, CudaStream};

/// The driver API's safe layer, as `cudarc::driver`.
pub mod driver {
    pub use super::context::{CudaContext, DriverError, EventFlags};
    pub use super::launch::{CudaFunction, CudaModule, LaunchArgs, LaunchConfig, PushKernelArg};
    pub use super::memory::{HostSlice, PinnedHostSlice};
    pub use super::slice::{
        CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
        ValidAsZeroBits,
    };
    pub use super::stream::{CudaEvent, CudaStream};
    /// cudarc's raw driver bindings, for the flags cudarc's signatures take
    /// (`sys::CUevent_flags`). Work issued through them is not recorded.
    #[cfg(feature = "cuda")]
    pub use ::cudarc::driver::sys;
}
