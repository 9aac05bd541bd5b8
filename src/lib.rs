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
//! Happens-before is vector clocks over participants ([`clock`], [`order`]); a hazard is two
//! conflicting uses that happens-before does not order ([`checker`]). Reuse hazards are not a
//! special case: the new owner's access conflicts with the freed owner's unordered access to the
//! same bytes ([`shadow`], [`alloc`]).
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
//! [`Session`] is a harness over cudarc ([`Session::cuda`]) or a CPU simulation
//! ([`Session::simulated`]): streams, events, buffers from an instrumented caching allocator,
//! launches whose `&buf` is a read and `&mut buf` a write. Every call is recorded with its call
//! site; `session.finish()?.assert_clean()` fails a test with the report. See
//! `examples/01-reuse-without-record-stream.rs`.
//!
//! # Evidence
//!
//! [`sim`] runs programs on a simulated device under random, adversarial and exhaustive
//! schedules, [`fuzz`] generates programs and confirms reported hazards by provoking them (on the
//! simulator or a GPU), and [`oracle`] is a brute-force reference the checker is tested against.
#![warn(missing_docs)]

pub mod alloc;
pub mod checker;
pub mod clock;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod cudarc;
pub mod fix;
pub mod fuzz;
pub mod graph;
pub mod kernels;
pub mod model;
pub mod oracle;
pub mod order;
pub mod report;
pub mod session;
pub mod shadow;
pub mod sim;
mod sync;
pub mod trace;
pub mod workload;

pub use checker::{CheckError, Checker};
pub use report::{Hazard, HazardKind, Report};
pub use model::model;
pub use session::{Session, SessionError};
