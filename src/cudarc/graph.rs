//! CUDA graphs, as cudarc's: `CudaStream::begin_capture`, `CudaStream::end_capture`,
//! `CudaGraph::launch` and `CudaGraph::upload`, over the session's captures
//! ([`crate::session::Graph`]).
//!
//! Two streamsan extensions, which cudarc 0.19 has no call for: [`CudaGraph::launch_on`] replays
//! a graph on another stream than the one it was captured on (`cuGraphLaunch` on that stream, as
//! PyTorch's `CUDAGraph.replay()` does on the current stream), and graph memory pools
//! ([`CudaContext::graph_pool_handle`], [`CudaGraph::pool`], [`CudaStream::begin_capture_in`]:
//! PyTorch's `graph_pool_handle()` and `pool=`), which make graphs share the memory their
//! captures allocate.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use super::context::{CudaContext, DriverError};
use super::stream::CudaStream;
use crate::session::{Graph, GraphPool};

/// The capture mode cudarc's `begin_capture` takes (`sys::CUstreamCaptureMode`).
///
/// The session checks the trace format's rules of what a program may do during a capture
/// whatever the mode (they are CUDA's for a capture in global mode, the default of PyTorch), and
/// captures on a GPU in relaxed mode, so that the harness's own driver calls during a capture
/// (mapping pool memory) are allowed: every mode gives the same capture.
#[cfg(feature = "cuda")]
pub type CaptureMode = ::cudarc::driver::sys::CUstreamCaptureMode;

/// The capture mode cudarc's `begin_capture` takes (`sys::CUstreamCaptureMode`); see the
/// `cuda` feature's documentation of this type: every mode gives the same capture.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
    CU_STREAM_CAPTURE_MODE_GLOBAL,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`.
    CU_STREAM_CAPTURE_MODE_RELAXED,
}

/// The instantiation flags cudarc's `end_capture` takes (`sys::CUgraphInstantiate_flags`): the
/// graph is instantiated with none (they change nothing of what a replay accesses).
#[cfg(feature = "cuda")]
pub type GraphInstantiateFlags = ::cudarc::driver::sys::CUgraphInstantiate_flags;

/// The instantiation flags cudarc's `end_capture` takes (`sys::CUgraphInstantiate_flags`): the
/// graph is instantiated with none.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphInstantiateFlags(pub u32);

/// The capture status cudarc's `capture_status` returns (`sys::CUstreamCaptureStatus`).
#[cfg(feature = "cuda")]
pub type CaptureStatus = ::cudarc::driver::sys::CUstreamCaptureStatus;

/// The capture status cudarc's `capture_status` returns (`sys::CUstreamCaptureStatus`).
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum CaptureStatus {
    /// `CU_STREAM_CAPTURE_STATUS_NONE`: not capturing.
    CU_STREAM_CAPTURE_STATUS_NONE,
    /// `CU_STREAM_CAPTURE_STATUS_ACTIVE`: capturing.
    CU_STREAM_CAPTURE_STATUS_ACTIVE,
    /// `CU_STREAM_CAPTURE_STATUS_INVALIDATED` (never returned here: a call CUDA would invalidate
    /// the capture for is an error instead).
    CU_STREAM_CAPTURE_STATUS_INVALIDATED,
}

/// A captured graph, as cudarc's `CudaGraph`: made by [`CudaStream::end_capture`], replayed by
/// [`CudaGraph::launch`] on its capture stream (or [`CudaGraph::launch_on`] any stream). Each
/// replay is recorded as a `graph_launch`, where its hazards are reported, naming the captured
/// op (`"captured"`). Dropping it destroys the executable graph.
pub struct CudaGraph {
    graph: Graph,
    stream: Arc<CudaStream>,
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaGraph")
            .field("id", self.graph.id())
            .finish_non_exhaustive()
    }
}

impl CudaGraph {
    /// Replays the graph on the stream it was captured on (`cuGraphLaunch`).
    #[track_caller]
    pub fn launch(&self) -> Result<(), DriverError> {
        self.launch_on(&self.stream)
    }

    /// Replays the graph on `stream` (`cuGraphLaunch` on that stream; a streamsan extension): it
    /// runs after the work issued on `stream` so far, and later work there waits for it; other
    /// streams are not ordered with it.
    #[track_caller]
    pub fn launch_on(&self, stream: &CudaStream) -> Result<(), DriverError> {
        if !Arc::ptr_eq(&self.stream.ctx, &stream.ctx) {
            return Err(DriverError::invalid(
                "a graph is launched on a stream of its own context",
            ));
        }
        Ok(self.graph.launch(stream.session_stream())?)
    }

    /// Uploads the graph to the device so that the first launch is faster (`cuGraphUpload`):
    /// no work, nothing recorded. On a GPU the driver uploads at the first launch instead.
    pub fn upload(&self) -> Result<(), DriverError> {
        Ok(())
    }

    /// The memory pool its capture allocated from, for another capture to share
    /// ([`CudaStream::begin_capture_in`]; PyTorch's `pool=g.pool()`).
    pub fn pool(&self) -> GraphPool {
        self.graph.pool()
    }

    /// The stream it was captured on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The session's graph behind it (its id in reports).
    pub fn session_graph(&self) -> &Graph {
        &self.graph
    }
}

impl CudaStream {
    /// Starts capturing the work issued on this stream (`cuStreamBeginCapture`) into a graph
    /// with a pool of its own: until [`CudaStream::end_capture`], work issued here — and on
    /// streams that wait on an event recorded here meanwhile — runs nothing. Recorded as a
    /// `graph_begin`. See [`CaptureMode`] for `mode`.
    #[track_caller]
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<(), DriverError> {
        let _ = mode;
        Ok(self
            .stream
            .begin_capture_at_caller(None, Location::caller())?)
    }

    /// [`CudaStream::begin_capture`] with the capture's allocations from `pool`, shared with the
    /// other captures that name it (a streamsan extension: PyTorch's `pool=`).
    #[track_caller]
    pub fn begin_capture_in(&self, mode: CaptureMode, pool: &GraphPool) -> Result<(), DriverError> {
        let _ = mode;
        Ok(self
            .stream
            .begin_capture_at_caller(Some(pool), Location::caller())?)
    }

    /// Ends the capture begun on this stream (`cuStreamEndCapture`) and instantiates its graph.
    /// Recorded as a `graph_end`. Always `Some` (an empty capture is an empty graph). See
    /// [`GraphInstantiateFlags`] for `flags`.
    #[track_caller]
    pub fn end_capture(
        self: &Arc<Self>,
        flags: GraphInstantiateFlags,
    ) -> Result<Option<CudaGraph>, DriverError> {
        let _ = flags;
        let graph = self.stream.end_capture_at_caller(Location::caller())?;
        Ok(Some(CudaGraph {
            graph,
            stream: self.clone(),
        }))
    }

    /// Whether this stream is capturing (`cuStreamIsCapturing`): the origin of a capture, or a
    /// stream that joined one.
    pub fn capture_status(&self) -> Result<CaptureStatus, DriverError> {
        Ok(if self.stream.is_capturing() {
            CaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        } else {
            CaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        })
    }
}

impl CudaContext {
    /// A new graph memory pool (a streamsan extension: PyTorch's
    /// `torch.cuda.graph_pool_handle()`), for captures that share memory
    /// ([`CudaStream::begin_capture_in`]).
    pub fn graph_pool_handle(&self) -> Result<GraphPool, DriverError> {
        Ok(self.session.graph_pool()?)
    }
}
