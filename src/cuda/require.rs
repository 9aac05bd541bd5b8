//! Whether code that needs a GPU runs, skips or fails on this machine.
//!
//! Tests, examples and benchmarks that need a GPU skip where there is none, so that `cargo test`
//! passes on a machine without CUDA (CI). Where a GPU is expected (the staged run on a GPU
//! machine), `STREAMSAN_REQUIRE_GPU=1` turns every such skip into a failure, so that a test
//! cannot pass without having run. [`gpu_need`] decides; [`gpu_or_skip`] is the one helper every
//! GPU test starts with.

use super::{Gpu, GpuError};

/// The environment variable that makes a missing GPU a failure: set to anything other than empty
/// or `0` (`STREAMSAN_REQUIRE_GPU=1`), tests, examples and benchmarks that need a GPU fail where
/// there is none instead of skipping.
pub const REQUIRE_GPU_ENV: &str = "STREAMSAN_REQUIRE_GPU";

/// What code that needs a GPU does on this machine: see [`gpu_need`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuNeed {
    /// A CUDA driver with at least one device is here: run.
    Run,
    /// There is no GPU and none is required: skip, giving the reason.
    Skip(String),
    /// There is no GPU but [`REQUIRE_GPU_ENV`] requires one: fail, giving the reason.
    Fail(String),
}

/// Whether [`REQUIRE_GPU_ENV`] asks for a GPU: set, and neither empty nor `0`.
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether code that needs GPU 0 should run, skip or fail here: [`Gpu::device_count`] against
/// [`gpu_required`]. Never panics, also on a machine with no CUDA at all.
pub fn gpu_need() -> GpuNeed {
    let reason = match Gpu::device_count() {
        Ok(n) if n > 0 => return GpuNeed::Run,
        Ok(_) => GpuError::NoDevice.to_string(),
        Err(e) => e.to_string(),
    };
    if gpu_required() {
        GpuNeed::Fail(format!(
            "{REQUIRE_GPU_ENV} is set but there is no GPU: {reason}"
        ))
    } else {
        GpuNeed::Skip(reason)
    }
}

/// The start of every test that needs a GPU: `true` where there is one. Where there is none it
/// prints `skipped: <reason>` and returns `false` (the test returns and passes), unless
/// [`REQUIRE_GPU_ENV`] requires a GPU.
///
/// # Panics
///
/// Where there is no GPU and [`REQUIRE_GPU_ENV`] requires one, so that the test fails. Meant for
/// tests only; examples and tools use [`gpu_need`].
pub fn gpu_or_skip() -> bool {
    match gpu_need() {
        GpuNeed::Run => true,
        GpuNeed::Skip(reason) => {
            println!("skipped: {reason} (set {REQUIRE_GPU_ENV}=1 to fail instead)");
            false
        }
        GpuNeed::Fail(reason) => panic!("{reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_matches_availability() {
        match gpu_need() {
            GpuNeed::Run => assert!(Gpu::available()),
            GpuNeed::Skip(reason) => {
                assert!(!Gpu::available());
                assert!(!gpu_required());
                assert!(!reason.is_empty());
            }
            GpuNeed::Fail(reason) => {
                assert!(!Gpu::available());
                assert!(gpu_required());
                assert!(reason.contains(REQUIRE_GPU_ENV), "{reason}");
            }
        }
    }
}
