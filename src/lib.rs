//! streamsan finds the synchronization bugs of multi-stream GPU programs before they silently
//! corrupt data.
//!
//! # The problem
//!
//! CUDA streams run concurrently unless an event wait, a host sync or the legacy default stream
//! orders them. Two streams that touch the same bytes without such an edge race: the result
//! depends on timing, and the bug shows up as NaNs under load. Caching allocators (PyTorch's, and
//! this crate's) add a second trap: a buffer freed while another stream still uses it goes back
//! to the allocator at once, and the next allocation on the owning stream gets the same memory
//! mid-kernel — unless `record_stream` told the allocator about the other stream.
//!
//! # The one idea
//!
//! Everything is a use of memory by a participant (the host or a stream) at a point of its order:
//! kernel reads and writes, copies, host accesses of pinned memory — and allocations and frees.
//! Happens-before is vector clocks over participants (the `clock` and `order` modules); a hazard is two
//! conflicting uses that happens-before does not order ([`checker`]). Reuse hazards are not a
//! special case: the new owner's access conflicts with the freed owner's unordered access to the
//! same bytes (the `shadow` and `alloc` modules).
//!
//! # Checking a trace
//!
//! A trace is JSON Lines in the trace format ([`trace`]); [`Checker`] takes its ops one at a time
//! and [`Checker::finish`] returns the [`Report`]:
//!
//! ```
//! use streamsan::trace::TraceReader;
//! use streamsan::Checker;
//!
//! let trace = r#"
//! {"op":"alloc","buffer":"grad","bytes":4096,"stream":"compute"}
//! {"op":"launch","stream":"compute","name":"backward","writes":["grad"]}
//! {"op":"event_record","event":"ready","stream":"compute"}
//! {"op":"event_wait","stream":"comm","event":"ready"}
//! {"op":"launch","stream":"comm","name":"all_reduce","reads":["grad"]}
//! {"op":"free","buffer":"grad"}
//! {"op":"alloc","buffer":"act","bytes":4096,"stream":"compute"}
//! {"op":"launch","stream":"compute","name":"forward","writes":["act"]}
//! "#;
//! let mut reader = TraceReader::new(trace.as_bytes(), "example");
//! let mut checker = Checker::new();
//! while let Some((op, _spans)) = reader.next_op().unwrap() {
//!     checker.check(&op).unwrap();
//! }
//! let report = checker.finish();
//! let kinds: Vec<&str> = report.hazards.iter().map(|h| h.kind.as_str()).collect();
//! // `grad` is freed while `all_reduce` may still read it, and `forward` overwrites its memory.
//! assert_eq!(kinds, ["unsafe-free", "reuse-race"]);
//! ```
//!
//! # Wrapping GPU code
//!
//! [`cudarc`](mod@cudarc) is cudarc 0.19's safe API — `streamsan::cudarc::driver::{CudaContext,
//! CudaStream, CudaSlice, …}`, `streamsan::cudarc::nvrtc::compile_ptx` — over a checked
//! [`Session`]: porting a cudarc program means changing its `use` lines. [`model()`] is the entry
//! point of a test, in the spirit of `loom::model`: it picks the backend (a GPU, or the CPU
//! simulator), runs the closure, and fails the test with the report and a trace that
//! `streamsan check` replays:
//!
//! ```
//! use streamsan::cudarc::driver::{CudaSlice, DriverError};
//!
//! # std::env::set_var("STREAMSAN_BACKEND", "sim");
//! streamsan::model(|cx| -> Result<(), DriverError> {
//!     let ctx = cx.ctx();
//!     let compute = ctx.new_stream()?;
//!     let comm = compute.fork()?;
//!     let grads: CudaSlice<half::bf16> = compute.alloc_zeros(1024)?;
//!     comm.join(&compute)?;
//!     let _copy = comm.clone_dtod(&grads)?;
//!     compute.join(&comm)?; // without it, dropping `grads` frees memory `comm` still reads
//!     Ok(())
//! });
//! ```
//!
//! See `docs/harness.md` and `examples/cudarc_port.rs`. [`Session`] is the API below it
//! ([`Session::cuda`], [`Session::simulated`]), for what cudarc does not have (`record_stream`,
//! blocking streams, named handles).
//!
//! # Evidence
//!
//! [`exec::sim`] runs programs on a simulated device under random, adversarial and exhaustive
//! schedules, [`fuzz`] generates programs and confirms reported hazards by provoking them (on the
//! simulator or a GPU), and an oracle (`oracle`, with the `internals`
//! feature) is a brute-force reference the checker is tested against.
#![warn(missing_docs)]

/// Declares a module of the engine's internals: public with the `internals` feature (the
/// project's tests, fuzz targets and measurements use them), crate-private otherwise.
macro_rules! internal {
    ($(#[$m:meta])* mod $name:ident;) => {
        #[cfg(feature = "internals")]
        $(#[$m])*
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        $(#[$m])*
        #[allow(dead_code, unused_imports)]
        pub(crate) mod $name;
    };
}

internal! { mod alloc; }
pub mod analysis;
pub mod checker;
internal! { mod clock; }
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod cudarc;
pub mod exec;
pub mod fix;
pub mod fuzz;
pub mod graph;
internal! { mod kernels; }
pub mod model;
internal! { mod oracle; }
internal! { mod order; }
pub mod output;
pub mod report;
pub mod session;
internal! { mod shadow; }
mod sync;
pub mod text;
pub mod trace;
pub mod workload;

pub use checker::{CheckError, Checker};
pub use model::model;
pub use report::{Hazard, HazardKind, Report};
pub use session::{Session, SessionError};
