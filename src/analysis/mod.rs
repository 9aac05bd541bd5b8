//! What is computed over a checked trace: the synchronization analysis ([`syncs`]), which says
//! of every synchronization op whether the program's memory safety needs it, and what it
//! prevents; and [`run`], a check from the first op to the report, plain or with the analysis,
//! finished with the re-check that completes its verdicts.

pub mod run;
pub mod syncs;
