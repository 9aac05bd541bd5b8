//! The execution layer: what runs the ops of a program — on the CPU simulator or on a GPU.
//!
//! Every path of streamsan that *executes* ops goes through one [`Backend`] trait, and there are
//! two implementations:
//!
//! | backend | runs ops on | used by |
//! |---|---|---|
//! | [`sim::Device`] | CPU memory, with the allocator policies of `crate::alloc` and the kernels of `crate::kernels` | [`Session::simulated`](crate::session::Session::simulated), the fuzzer and `check --confirm sim`, [`sim::explore`] |
//! | `cuda::CudaDevice` (feature `cuda`) | a CUDA device through cudarc, with event tracking off | [`Session::cuda`](crate::session::Session), `fuzz --backend cuda`, `check --confirm cuda` |
//!
//! A backend takes ops in its own terms ([`Op`]): the ops of the trace format with streams and
//! events as dense keys and buffers resolved to [`Span`]s of memory. A [`Session`](crate::Session)
//! records an op and issues it to its backend; a program runner (the fuzzer's and `--confirm`'s
//! [`Executor`]) is a backend plus a [`Scheduler`]: on the simulator the scheduler picks, at every
//! step, which participant moves; on a GPU, which schedules itself, it holds ops back
//! ([`Hold`]). The same three schedulers serve both: [`Sequential`] (the reference),
//! [`RandomScheduler`] and [`Adversarial`] (the provocation of a hazard), plus [`Replay`] for the
//! simulator's exhaustive exploration.
//!
//! What a run of a program observed is an [`Outcome`]; two runs of one program on one backend agree
//! exactly when no op observed different data.
//!
//! # Layout
//!
//! | file | holds |
//! |---|---|
//! | `backend.rs` | [`Backend`], [`Op`] and what ops carry ([`Span`], [`Fence`], [`Kernel`], [`Fill`]), [`Issued`] |
//! | `any.rs` | [`AnyBackend`]: a session's backend, dispatched without a virtual call on its hot path |
//! | `sched.rs` | [`Scheduler`] and the schedulers |
//! | `outcome.rs` | [`Outcome`], [`Executor`] |
//! | `program.rs` | what the program runners of both backends share: ids to keys, buffers and their generations, `record_stream` fences, placed memory |
//! | `graphs.rs` | the program runners' CUDA graphs: capture state, captured bodies (regions resolved at capture), replay participants `G/c`, graph memory pools, the numbering of replayed ops |
//! | `sim/` | the simulated device (`device.rs`, its memory in `arena.rs`, its ops in `backend.rs`) and program runs on it (`program.rs`) |
//! | `cuda/` | the GPU backend (`mod.rs`, its segments in `segments.rs`) and program runs on it (`program.rs`) |
//!
//! # Errors
//!
//! Every failure of the layer is an [`ExecError`]: an op a backend cannot run
//! ([`ExecError::Unsupported`], with its op index), an argument out of its domain, an allocation
//! that failed, or (feature `cuda`) a driver error.

mod any;
mod backend;
mod error;
pub(crate) mod graphs;
mod outcome;
pub(crate) mod program;
mod sched;
pub mod sim;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use any::AnyBackend;
pub use backend::{
    Backend, EventKey, Fence, Fill, GraphKey, Issued, Kernel, Op, SimMemory, Span, Spans,
    StreamKey, StreamKind,
};
pub use error::ExecError;
pub use graphs::{replay_numbering, ReplayNumbering};
pub use outcome::{Executor, Outcome};
pub use sched::{Actor, Adversarial, Hold, RandomScheduler, Ready, Replay, Scheduler, Sequential};
