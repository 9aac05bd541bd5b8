//! A cudarc-shaped harness: cudarc 0.19's safe API — the same paths, types and method names —
//! over a checked [`Session`](crate::session::Session). Porting a cudarc program means changing
//! its `use` lines:
//!
//! ```text
//! use cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};   // before
//! use streamsan::cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};   // after
//! use cudarc::nvrtc::compile_ptx;             →   use streamsan::cudarc::nvrtc::compile_ptx;
//! ```
//!
//! Every call records its op, with the caller's `file:line:col`, into the session, which checks
//! it on its own thread as the program runs. In a test, [`crate::model()`] makes the context,
//! picks the backend and fails the test with the report.
//!
//! # Concepts
//!
//! | CPU | cudarc / here | recorded as |
//! |---|---|---|
//! | a thread | [`CudaStream`] ([`CudaContext::new_stream`], [`CudaStream::fork`]) | `stream_create` (non-blocking) |
//! | the main thread's queue | [`CudaContext::default_stream`] | stream `"default"` (the legacy default stream) |
//! | a message between threads | [`CudaEvent`]: [`CudaEvent::record`], [`CudaStream::wait`], [`CudaStream::join`] | `event_record`, `event_wait` |
//! | joining a thread | [`CudaStream::synchronize`], [`CudaEvent::synchronize`], [`CudaContext::synchronize`] | `stream_sync`, `event_sync`, `device_sync` |
//! | `Vec<T>` | [`CudaSlice<T>`] from [`CudaStream::alloc_zeros`], [`CudaStream::clone_htod`], … | `alloc` on the stream (+ `memset` / copy) |
//! | dropping a `Vec` | dropping a [`CudaSlice`] | `free` on its stream (`cuMemFreeAsync`) |
//! | `&v[a..b]`, `&mut v[a..b]` | [`CudaView`], [`CudaViewMut`] ([`CudaSlice::slice`], [`CudaSlice::slice_mut`]) | regions with `offset` and `bytes` |
//! | calling a function | [`CudaStream::launch_builder`], [`PushKernelArg::arg`], [`LaunchArgs::launch`] | `launch`: `&x` reads `x`, `&mut y` writes `y` |
//! | `memcpy` | [`CudaStream::memcpy_htod`], [`CudaStream::memcpy_dtoh`], [`CudaStream::memcpy_dtod`] | see each call |
//! | page-locked memory | [`PinnedHostSlice`] ([`CudaContext::alloc_pinned`]) | `alloc` of `pinned` memory, `copy`, `host_read`, `host_write` |
//! | recording a macro, playing it back | [`CudaStream::begin_capture`], [`CudaStream::end_capture`] → [`CudaGraph`], [`CudaGraph::launch`], [`CudaGraph::launch_on`] | `graph_begin`, the captured ops, `graph_end`, `graph_launch` |
//!
//! Element types are any [`DeviceRepr`]: the integers, `f32`, `f64`, `half::bf16`, `half::f16`,
//! arrays, and your own `#[repr(C)]` structs. Views record their exact byte ranges, so two
//! streams writing neighbouring `bf16` views do not race, and overlapping ones do.
//!
//! # What each copy orders
//!
//! As in CUDA: a copy from pageable memory (`&[T]`, `Vec<T>`) to the device is staged at the
//! call and written in stream order — no synchronization; a copy from the device to pageable
//! memory returns when done — the host then waits for that stream (a `stream_sync`), not for
//! others; a copy to or from a [`PinnedHostSlice`] is asynchronous, and the host must wait before
//! touching the pinned memory.
//!
//! # Backends
//!
//! On a GPU ([`CudaContext::new`], or [`crate::model()`] with `STREAMSAN_BACKEND=cuda`) every call
//! runs through cudarc's driver calls with its event tracking off: the harness adds no
//! synchronization of its own, so the program's races really can happen. Device memory comes
//! from PyTorch's caching-allocator policy over real device memory, so a freed block really is
//! handed to the next allocation of its size on its stream. Modules are compiled with NVRTC and
//! loaded into the session's context.
//!
//! On the simulator ([`CudaContext::simulated`]) the same calls run on the CPU with the same
//! allocator policy. **A user kernel runs as streamsan's hash kernel over the memory it was
//! given** (the `kernels` module): it writes values of its own into exactly the regions it was
//! given as `&mut`, and reads those given as `&`. The values differ from the GPU's; the accesses,
//! and so the hazards, are the same. Copies and memsets keep their values. Sources are not
//! compiled where there is no NVRTC (see [`nvrtc`]).
//!
//! # Limits
//!
//! - Memory a kernel reaches other than through its arguments (a raw address passed as an
//!   integer, a `__device__` global) is not seen unless declared with [`LaunchArgs::reads`] or
//!   [`LaunchArgs::writes`]; a kernel that writes memory passed as `&` is recorded as reading it.
//! - [`DeviceRepr`] is stricter than cudarc's: no padding, every bit pattern valid (so no
//!   `CudaSlice<bool>`; `bool` is fine as a kernel argument by value).
//! - [`PinnedHostSlice`] is read and written by copy ([`PinnedHostSlice::read`],
//!   [`PinnedHostSlice::write`]), not through `as_slice`/`as_mut_slice` references.
//! - Events do not time (`elapsed_ms` is absent), `launch` returns no timing events, and
//!   cudarc's unified memory, peer copies and multiple devices are not wrapped.
//! - Graphs ([`CudaStream::begin_capture`], [`CudaStream::end_capture`], [`CudaGraph`]) are
//!   cudarc's, plus replay on any stream ([`CudaGraph::launch_on`]) and shared memory pools
//!   ([`CudaContext::graph_pool_handle`], [`CudaStream::begin_capture_in`]); the capture mode and
//!   instantiation flags are accepted and change nothing (see [`CaptureMode`]).
//! - The session's calls that cudarc lacks (`record_stream`, blocking streams, named handles,
//!   external regions) are on [`CudaContext::session`].

mod context;
mod graph;
mod launch;
mod memory;
pub mod nvrtc;
mod slice;
mod stream;

pub use context::{CudaContext, DriverError, EventFlags};
pub use graph::{CaptureMode, CaptureStatus, CudaGraph, GraphInstantiateFlags};
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
    pub use super::graph::{CaptureMode, CaptureStatus, CudaGraph, GraphInstantiateFlags};
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
