//! CUDA graphs: stream capture and replay, the driver calls cudarc's `CudaStream::begin_capture`,
//! `CudaStream::end_capture` and `CudaGraph::launch` make, on this layer's streams.
//!
//! cudarc's own `CudaGraph` launches only on the stream it was captured on; a replay on another
//! stream (a graph captured on one stream and launched on a second, as PyTorch's
//! `CUDAGraph.replay()` on the current stream does) is `cuGraphLaunch` of the executable graph on
//! that stream, which [`Graph::launch`] wraps. Captures here use
//! `CU_STREAM_CAPTURE_MODE_RELAXED`: the harness itself makes calls during a capture that the
//! stricter modes forbid on this thread (allocating pool segments with `cuMemAlloc`, querying the
//! events of earlier frees), none of which touch the captured streams. What the program may do
//! while capturing is the trace format's rule, which the session checks itself.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use super::{GpuError, Stream};

/// An instantiated graph: the work captured on a stream (and the streams that joined it), ready
/// to replay on any stream of its context. Dropping it destroys the executable graph and the
/// graph (`cuGraphExecDestroy`, `cuGraphDestroy`); replays already launched still run.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handles may be used from any thread; every method makes the context current on
// the calling thread first, and `launch` takes `&self` only to enqueue (the driver serializes
// launches of one executable graph).
unsafe impl Send for Graph {}
// SAFETY: as for Send.
unsafe impl Sync for Graph {}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("graph", &self.graph)
            .field("exec", &self.exec)
            .finish()
    }
}

impl Stream {
    /// Starts capturing the work issued on this stream (`cuStreamBeginCapture`, relaxed mode):
    /// from now on it runs nothing until the graph is launched. The legacy default stream cannot
    /// capture.
    pub fn begin_capture(&self) -> Result<(), GpuError> {
        if self.kind() == super::StreamKind::Legacy {
            return Err(GpuError::InvalidArgument(
                "the legacy default stream cannot capture".into(),
            ));
        }
        self.bind()?;
        // SAFETY: `raw` is a stream this value created and has not destroyed; capturing changes
        // what later calls on it do, not the handle.
        unsafe {
            result::stream::begin_capture(
                self.raw(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }?;
        Ok(())
    }

    /// Ends the capture this stream began (`cuStreamEndCapture`) and instantiates the graph
    /// (`cuGraphInstantiateWithFlags`, no flags). `Ok(None)` when nothing was captured.
    pub fn end_capture(&self) -> Result<Option<Graph>, GpuError> {
        self.bind()?;
        // SAFETY: as for `begin_capture`; the driver checks that this stream is the origin of a
        // capture and fails otherwise.
        let graph = unsafe { result::stream::end_capture(self.raw()) }?;
        if graph.is_null() {
            return Ok(None);
        }
        // SAFETY: `graph` is the graph the driver just returned, owned by nobody else.
        let exec =
            match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                Ok(exec) => exec,
                Err(e) => {
                    // SAFETY: as above; destroyed once, here.
                    if let Err(d) = unsafe { result::graph::destroy(graph) } {
                        tracing::warn!(error = %d, "destroying a graph that failed to instantiate");
                    }
                    return Err(e.into());
                }
            };
        Ok(Some(Graph {
            graph,
            exec,
            ctx: self.context().clone(),
        }))
    }
}

impl Graph {
    /// Replays the graph on `stream` (`cuGraphLaunch`): its work runs after the work issued on
    /// `stream` so far, and later work on `stream` waits for all of it. `stream` may be any
    /// stream of the graph's context, not only the one it was captured on.
    pub fn launch(&self, stream: &Stream) -> Result<(), GpuError> {
        if !Arc::ptr_eq(&self.ctx, stream.context()) {
            return Err(GpuError::InvalidArgument(
                "a graph is launched on a stream of its own context".into(),
            ));
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `exec` is a live executable graph of this context (destroyed only by `Drop`,
        // which `&self` excludes), and `stream.raw()` is a live stream of the same context (the
        // `Stream` value owns it, or it is the legacy handle). The memory its nodes touch is the
        // caller's contract, as for any kernel launch: the session keeps every buffer a graph
        // names allocated (pool memory is never returned to the driver before the backend is
        // dropped, after a device synchronization).
        unsafe { result::graph::launch(self.exec, stream.raw()) }?;
        Ok(())
    }

    /// Uploads the graph's resources to the device through `stream` (`cuGraphUpload`), so that
    /// the first launch does not pay for it.
    pub fn upload(&self, stream: &Stream) -> Result<(), GpuError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: as for `launch`.
        unsafe { result::graph::upload(self.exec, stream.raw()) }?;
        Ok(())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = %e, "binding the context to destroy a graph");
            return;
        }
        // SAFETY: both handles are live and owned by this value alone; destroyed once, here.
        // Launches already enqueued keep running (the driver defers the destruction).
        if let Err(e) = unsafe { result::graph::exec_destroy(self.exec) } {
            tracing::warn!(error = %e, "destroying an executable graph");
        }
        // SAFETY: as above.
        if let Err(e) = unsafe { result::graph::destroy(self.graph) } {
            tracing::warn!(error = %e, "destroying a graph");
        }
    }
}
