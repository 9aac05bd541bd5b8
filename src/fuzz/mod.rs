//! Fuzzing: random multi-stream programs for the checker, the simulator and the GPU.
//!
//! [`gen`] writes programs in the trace format's ops: allocations, kernels, copies, memsets, host
//! accesses of pinned memory, events, host syncs and frees over a few streams, with the
//! synchronization a correct program needs — except where a coin leaves it out, which is how the
//! generator plants hazards. The same generator runs from a seed ([`gen::generate`]) or from a
//! vector of decision words that proptest shrinks (`gen::arb_program`). [`campaign`] runs
//! generated programs on an executor (the simulator or a GPU) and holds the checker's verdicts
//! against what the executions did.

pub mod campaign;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fixes;
pub mod gen;
pub mod runnable;
