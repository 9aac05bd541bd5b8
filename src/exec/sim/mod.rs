//! The simulated device: runs ops on CPU memory, so that races tear data exactly as they would on
//! a GPU.
//!
//! Memory comes from the allocator policies of the checker's model (`crate::alloc`) over
//! simulated arenas at the model's addresses, so a buffer freed while in use is handed out again
//! and overwritten, exactly as on a GPU. Kernels compute `crate::kernels::hash_word`: each written
//! word depends on the op, its index and every word read at that index, so any reordering changes
//! the result. A launch runs one kernel per write region, in order, each reading its inputs as
//! memory then is (a GPU's `hash_launch`).
//!
//! Each stream is a FIFO queue of work, and only real CUDA ordering constrains when work runs —
//! stream order, event waits, host syncs, the legacy default stream and the allocator's
//! `record_stream` fence — so every schedule the simulator produces is one a GPU could produce.
//! *When* queued work runs depends on how the device is driven:
//!
//! - **By a scheduler** (a program run: [`run`], [`reference()`], [`explore`]): nothing runs when it
//!   is issued; at every step a [`Scheduler`] picks which ready participant moves —
//!   the host issues its next op (or a chunk of a host access), or a stream runs the next chunk of
//!   its head op. Kernels are not atomic: they read and write in chunks of
//!   [`SimConfig::chunk_words`] words that interleave with other participants' chunks.
//! - **Eagerly** ([`Device::session`], a [`Session`](crate::Session)'s backend): work runs when it
//!   is issued, except on a *lagging* stream: a launch with a spin starts a lag, and the stream's
//!   work from there on waits in its queue until CUDA's ordering forces it — a host sync of the
//!   stream, the device or an event it recorded; an event wait by another stream; the legacy default
//!   stream's implicit edges; a `record_stream` fence at a free. Every queued op had its
//!   cross-stream dependencies met when it was queued (they are forced at issue), so every schedule
//!   produced is one a GPU could produce, with the spun stream as late as possible.
//!
//! Reads by a program run are *tagged*: a buffer reads only what it wrote itself, and elsewhere a
//! pattern of its generation and of how many writes those bytes had received (see the arena), so
//! that what a program observes does not depend on whatever earlier owners left in memory — only
//! on races, a read racing the writes of another buffer to those bytes included. A session's
//! reads are raw, as a GPU's.

mod arena;
mod backend;
mod device;
mod program;

pub use super::outcome::{Executor, Outcome};
pub use super::sched::{
    Actor, Adversarial, Hold, RandomScheduler, Ready, Replay, Scheduler, Sequential,
};
pub use arena::SimOutOfMemory;
pub use device::Device;
pub use program::{explore, reference, run, Exploration, SimConfig, SimExecutor, MAX_WORDS};

#[cfg(test)]
mod tests;
