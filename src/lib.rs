//! streamsan finds the synchronization bugs of multi-stream GPU programs.
#![warn(missing_docs)]

pub mod alloc;
pub mod trace;
