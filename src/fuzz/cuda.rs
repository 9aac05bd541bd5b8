//! The GPU executor of fuzz campaigns and `check --confirm cuda`: the GPU backend plus a
//! scheduler per run. It lives in the execution layer, [`crate::exec::cuda::program`]; this module
//! re-exports it.

pub use crate::exec::cuda::program::{
    provoke_spin_ns, CudaExecutor, FREE_KEY, MAX_PLACED_BYTES, PROVOKE_SPIN_NS, RANDOM_JITTER_NS,
    WRITE_KEY,
};
