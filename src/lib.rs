//! streamsan finds the synchronization bugs of multi-stream GPU programs.
#![warn(missing_docs)]

pub mod alloc;
pub mod checker;
pub mod clock;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fuzz;
pub mod kernels;
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
pub use session::{Session, SessionError};
