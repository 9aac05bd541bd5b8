//! Every backend as one type.

use super::backend::{Backend, Fence, GraphKey, Issued, Op, SimMemory, StreamKey};
#[cfg(feature = "cuda")]
use super::cuda;
use super::error::ExecError;
use super::sim;

/// Every backend as one type, which a [`Session`](crate::Session) holds: calls go to the backend
/// it is by a `match` the compiler sees through (a session's hot path — a launch, an event record,
/// an event wait — is a handful of instructions on top of the backend's own work).
// One per session, inside its state: never moved on a hot path, and unboxed so that a call reaches
// the backend without another pointer.
#[allow(clippy::large_enum_variant)]
pub enum AnyBackend {
    /// The simulator.
    Sim(sim::Device),
    /// A GPU.
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaDevice),
}

impl Backend for AnyBackend {
    #[inline]
    fn issue(&mut self, index: u64, op: Op<'_>) -> Result<Issued, ExecError> {
        match self {
            AnyBackend::Sim(d) => d.issue(index, op),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.issue(index, op),
        }
    }

    fn fence(&mut self, stream: StreamKey) -> Result<Option<Fence>, ExecError> {
        match self {
            AnyBackend::Sim(d) => d.fence(stream),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.fence(stream),
        }
    }

    fn fence_done(&self, fence: Fence) -> bool {
        match self {
            AnyBackend::Sim(d) => d.fence_done(fence),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.fence_done(fence),
        }
    }

    fn release_stream(&mut self, stream: StreamKey) {
        match self {
            AnyBackend::Sim(d) => d.release_stream(stream),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.release_stream(stream),
        }
    }

    fn device_memory_stats(&self) -> crate::alloc::AllocatorStats {
        match self {
            AnyBackend::Sim(d) => d.device_memory_stats(),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.device_memory_stats(),
        }
    }

    #[inline]
    fn runs_work(&self) -> bool {
        match self {
            AnyBackend::Sim(d) => d.runs_work(),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(_) => true,
        }
    }

    fn sim(&mut self) -> Option<&mut dyn SimMemory> {
        match self {
            AnyBackend::Sim(d) => Some(d),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(_) => None,
        }
    }

    #[cfg(feature = "cuda")]
    fn gpu_stream(&self, stream: StreamKey) -> Option<(&crate::cuda::Gpu, &crate::cuda::Stream)> {
        match self {
            AnyBackend::Sim(_) => None,
            AnyBackend::Cuda(d) => d.gpu_stream(stream),
        }
    }

    #[cfg(feature = "cuda")]
    fn context(&self) -> Option<std::sync::Arc<cudarc::driver::CudaContext>> {
        match self {
            AnyBackend::Sim(_) => None,
            AnyBackend::Cuda(d) => d.context(),
        }
    }

    fn captures(&self) -> bool {
        match self {
            AnyBackend::Sim(_) => false,
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.captures(),
        }
    }

    fn graph_begin(&mut self, stream: StreamKey) -> Result<(), ExecError> {
        match self {
            AnyBackend::Sim(d) => d.graph_begin(stream),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.graph_begin(stream),
        }
    }

    fn graph_end(&mut self, graph: GraphKey, stream: StreamKey) -> Result<(), ExecError> {
        match self {
            AnyBackend::Sim(d) => d.graph_end(graph, stream),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.graph_end(graph, stream),
        }
    }

    fn graph_launch(&mut self, graph: GraphKey, stream: StreamKey) -> Result<(), ExecError> {
        match self {
            AnyBackend::Sim(d) => d.graph_launch(graph, stream),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.graph_launch(graph, stream),
        }
    }

    fn graph_destroy(&mut self, graph: GraphKey) {
        match self {
            AnyBackend::Sim(d) => d.graph_destroy(graph),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.graph_destroy(graph),
        }
    }

    fn next_device_segment(&self) -> Option<u64> {
        match self {
            AnyBackend::Sim(d) => d.next_device_segment(),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.next_device_segment(),
        }
    }

    fn map_device_segment(&mut self, bytes: u64) -> Result<u64, ExecError> {
        match self {
            AnyBackend::Sim(d) => d.map_device_segment(bytes),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(d) => d.map_device_segment(bytes),
        }
    }
}
