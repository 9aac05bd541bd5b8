//! The CUDA backend's device layer: a thin layer over cudarc's driver API that adds no
//! synchronization of its own.
//!
//! streamsan executes programs on a real GPU to provoke the races it reports, so this layer must
//! do exactly what it is told and nothing more. cudarc's safe layer orders work between streams by
//! itself (every `CudaSlice` records events on use and waits on them); that would hide the very
//! races streamsan looks for. So this layer:
//!
//! - turns cudarc's event tracking off ([`cudarc::driver::CudaContext::disable_event_tracking`])
//!   as soon as the context exists, before anything is allocated;
//! - never creates a `CudaSlice`: memory is raw device addresses (`u64`, a `CUdeviceptr`) from
//!   `cuMemAlloc`, and copies, memsets and launches go through cudarc's `result`/`sys` layers;
//! - gives every stream kind of the trace format: the legacy default stream, blocking streams and
//!   non-blocking streams ([`StreamKind`]).
//!
//! | concept | CPU | this layer |
//! |---|---|---|
//! | device | — | [`Gpu`] (one context on one device) |
//! | thread of work | [`std::thread::Thread`] | [`Stream`] |
//! | happens-before edge | a message | [`Event`]: recorded on one stream, waited on by another |
//! | heap segment | `mmap` | [`Gpu::map_segment`] / [`Gpu::unmap_segment`] |
//! | page-locked buffer | — | [`PinnedBuffer`] |
//! | a kernel | a function | [`Kernels`] (the `kernels` module says what each computes) |
//!
//! # No driver, no panic
//!
//! cudarc loads `libcuda` at run time and panics when it is missing. [`Gpu::available`],
//! [`Gpu::device_count`] and [`Gpu::open`] first ask cudarc whether the library can be loaded
//! (`cudarc::driver::sys::is_culib_present`) and return [`GpuError::NoDriver`] when it cannot; the
//! first driver calls also run under `catch_unwind`, so a driver too old for the bindings (a
//! missing symbol) is [`GpuError::DriverUnusable`], not a crash. NVRTC is checked the same way when
//! the kernels are first compiled ([`GpuError::NoNvrtc`]).
//!
//! Code that needs a GPU asks [`gpu_need`] whether to run, to skip, or to fail because
//! `STREAMSAN_REQUIRE_GPU=1` requires a GPU; every GPU test starts with [`gpu_or_skip`].
//!
//! # Threads
//!
//! Every type here is `Send + Sync`; each call makes its context current on the calling thread
//! first (cudarc's `bind_to_thread`), which also returns any error parked by an earlier `Drop`.

mod graph;
mod launch;
mod memory;
mod require;
mod stream;

pub use graph::Graph;
pub use launch::{Kernels, BLOCK_THREADS, KERNELS_SOURCE};
pub use memory::PinnedBuffer;
pub use require::{gpu_need, gpu_or_skip, gpu_required, GpuNeed, REQUIRE_GPU_ENV};
pub use stream::{Event, Stream, StreamKind};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext};

/// What can go wrong in the device layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The CUDA driver library (`libcuda`) cannot be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: libcuda could not be loaded")]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error("the CUDA driver reports no device")]
    NoDevice,
    /// The driver has fewer devices than the ordinal asked for.
    #[error("no CUDA device {ordinal}: the driver reports {count}")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// The driver loaded but cannot be used, e.g. it lacks a symbol the bindings need (a driver
    /// older than CUDA 13.0).
    #[error("the CUDA driver is unusable: {0}")]
    DriverUnusable(String),
    /// A driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] DriverError),
    /// The NVRTC library (`libnvrtc`) cannot be loaded, so the kernels cannot be compiled.
    #[error("no NVRTC: libnvrtc could not be loaded")]
    NoNvrtc,
    /// NVRTC supports no architecture this device can run.
    #[error(
        "NVRTC cannot compile for compute capability {major}.{minor} (supported: {supported:?})"
    )]
    UnsupportedArch {
        /// Compute capability, major part.
        major: i32,
        /// Compute capability, minor part.
        minor: i32,
        /// What NVRTC supports, as `10 * major + minor`.
        supported: Vec<i32>,
    },
    /// An NVRTC call failed.
    #[error("NVRTC call failed: {0}")]
    Nvrtc(#[from] cudarc::nvrtc::result::NvrtcError),
    /// The kernel source did not compile.
    #[error("kernels/streamsan.cu did not compile with {options:?}:\n{log}")]
    Compile {
        /// The NVRTC options used.
        options: Vec<String>,
        /// NVRTC's log.
        log: String,
    },
    /// An argument this layer checks was out of its domain (a misaligned address, too many reads).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// A run of whole 32-bit words in device-accessible memory: what a kernel reads or writes.
///
/// `ptr` is a device address (a `CUdeviceptr`: device memory, or the device address of a
/// [`PinnedBuffer`]) and must be 4-byte aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceRegion {
    /// Device address of word 0.
    pub ptr: u64,
    /// Length in words.
    pub words: u32,
}

impl DeviceRegion {
    /// `words` words from `ptr`.
    pub const fn new(ptr: u64, words: u32) -> Self {
        DeviceRegion { ptr, words }
    }

    /// The region of `bytes` bytes at `ptr`: word-aligned, a whole number of words.
    pub fn from_bytes(ptr: u64, bytes: usize) -> Result<Self, GpuError> {
        if bytes % 4 != 0 {
            return Err(GpuError::InvalidArgument(format!(
                "region length {bytes} is not a whole number of words"
            )));
        }
        let words = u32::try_from(bytes / 4).map_err(|_| {
            GpuError::InvalidArgument(format!("region of {bytes} bytes exceeds u32::MAX words"))
        })?;
        let region = DeviceRegion { ptr, words };
        region.check_aligned()?;
        Ok(region)
    }

    /// The length in bytes.
    pub const fn bytes(&self) -> usize {
        self.words as usize * 4
    }

    pub(crate) fn check_aligned(&self) -> Result<(), GpuError> {
        if self.ptr % 4 != 0 {
            return Err(GpuError::InvalidArgument(format!(
                "device address {:#x} is not word-aligned",
                self.ptr
            )));
        }
        Ok(())
    }
}

/// One CUDA device, through its primary context, with cudarc's event tracking off.
///
/// Owns nothing it maps: segments from [`Gpu::map_segment`] are raw addresses that the allocator
/// above unmaps; all of them go when the last handle on the context (this, or a stream, event,
/// pinned buffer or the kernels) is dropped.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    compute_capability: (i32, i32),
    multiprocessors: u32,
    kernels: OnceLock<Kernels>,
}

/// Runs the first driver calls of a process, turning a panic of cudarc's loader (a missing symbol)
/// into [`GpuError::DriverUnusable`].
fn guarded<T>(f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to `dlopen` cudarc's candidate library names and
    // closes what it opened; it touches no other state.
    if !*PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        return Err(GpuError::NoDriver);
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic while loading the driver".to_owned());
        Err(GpuError::DriverUnusable(msg))
    })
}

/// `cuInit`, mapping "no device" to [`GpuError::NoDevice`].
fn init() -> Result<(), GpuError> {
    result::init().map_err(|e| match e.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => GpuError::NoDevice,
        _ => GpuError::Driver(e),
    })
}

impl Gpu {
    /// Whether a CUDA driver with at least one device is present. Never panics, also on a machine
    /// with no CUDA at all; tests that need a GPU start with it.
    pub fn available() -> bool {
        matches!(Gpu::device_count(), Ok(n) if n > 0)
    }

    /// The number of CUDA devices: `Ok(0)` when the driver loads but sees none,
    /// [`GpuError::NoDriver`] when there is no driver.
    pub fn device_count() -> Result<usize, GpuError> {
        guarded(|| match init() {
            Ok(()) => Ok(usize::try_from(result::device::get_count()?).unwrap_or(0)),
            Err(GpuError::NoDevice) => Ok(0),
            Err(e) => Err(e),
        })
    }

    /// The version of the installed driver, as `1000 * major + 10 * minor` (13000 for CUDA 13.0).
    pub fn driver_version() -> Result<i32, GpuError> {
        guarded(|| {
            let mut version = 0;
            // SAFETY: `cuDriverGetVersion` writes one int through a valid pointer; it needs no
            // context and may be called before `cuInit`.
            unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
            Ok(version)
        })
    }

    /// Opens device `ordinal`: retains its primary context and turns cudarc's event tracking off
    /// before anything is allocated. Returns [`GpuError::NoDriver`], [`GpuError::NoDevice`] or
    /// [`GpuError::NoSuchDevice`] (never panics) where there is nothing to open.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        let ctx = guarded(|| {
            init()?;
            let count = usize::try_from(result::device::get_count()?).unwrap_or(0);
            if count == 0 {
                return Err(GpuError::NoDevice);
            }
            if ordinal >= count {
                return Err(GpuError::NoSuchDevice { ordinal, count });
            }
            Ok(CudaContext::new(ordinal)?)
        })?;
        // SAFETY: cudarc's event tracking only concerns `CudaSlice`s created after this call; this
        // layer never creates one (its memory is raw), and nothing has been allocated on the
        // context yet. Ordering between streams is then entirely the caller's, which is the point.
        unsafe { ctx.disable_event_tracking() };
        debug_assert!(!ctx.is_event_tracking());
        let compute_capability = ctx.compute_capability()?;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as u32;
        Ok(Gpu {
            ctx,
            compute_capability,
            multiprocessors,
            kernels: OnceLock::new(),
        })
    }

    /// The cudarc context, for what this layer does not wrap. Its event tracking is off.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device name, e.g. `"NVIDIA H200"`.
    pub fn name(&self) -> Result<String, GpuError> {
        Ok(self.ctx.name()?)
    }

    /// Compute capability as `(major, minor)`: `(9, 0)` on an H200.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Whether cudarc's automatic cross-stream event tracking is on. Always `false` for a
    /// [`Gpu`]; exposed so tests can assert it.
    pub fn is_event_tracking(&self) -> bool {
        self.ctx.is_event_tracking()
    }

    /// Waits until all work on all streams of the context is done (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread()?;
        result::ctx::synchronize()?;
        Ok(())
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`), for leak checks.
    pub fn mem_get_info(&self) -> Result<(usize, usize), GpuError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// The kernels of `kernels/streamsan.cu`, compiled with NVRTC on first use (once per process
    /// and architecture) and loaded once per [`Gpu`].
    pub fn kernels(&self) -> Result<&Kernels, GpuError> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let loaded = Kernels::load(&self.ctx, self.compute_capability, self.multiprocessors)?;
        // Two threads racing here both load; one copy wins and the other is dropped.
        Ok(self.kernels.get_or_init(|| loaded))
    }
}
