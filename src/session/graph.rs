//! CUDA graphs of a session: capture on a stream, replay on any stream, graph memory pools.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use super::core::{Core, GraphRef, PoolRef, SessionError};
use super::handle::Stream;
use crate::trace::Id;

/// A graph memory pool (PyTorch's `torch.cuda.graph_pool_handle()`, or a graph's own pool from
/// [`Graph::pool`]): the memory that allocations made during the captures that name it come
/// from. Graphs that share a pool share its memory: a block one capture freed may be handed to
/// the next capture of the pool, so their replays must not overlap. Cheap to clone.
#[derive(Clone)]
pub struct GraphPool {
    pub(crate) key: PoolRef,
    pub(crate) id: Id,
}

impl fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphPool").field("id", &self.id).finish()
    }
}

impl GraphPool {
    /// Its name in traces and reports (the `pool` of `graph_begin`).
    pub fn id(&self) -> &Id {
        &self.id
    }
}

/// A captured graph (a `CUgraphExec`, PyTorch's `CUDAGraph`): the work captured between
/// [`Stream::begin_capture`] and [`Stream::end_capture`], replayed by [`Graph::launch`] on any
/// stream. Dropping it destroys the executable graph; replays already launched still run.
pub struct Graph {
    core: Arc<Core>,
    key: GraphRef,
    id: Id,
    pool: GraphPool,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("id", &self.id)
            .field("pool", &self.pool.id)
            .finish()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        self.core.drop_graph(self.key);
    }
}

impl Graph {
    /// Its name in traces and reports (`g1`, `g2`, …).
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// The memory pool its capture allocated from: pass it to [`Stream::begin_capture_in`] to
    /// make another capture share it (PyTorch's `pool=g.pool()`).
    pub fn pool(&self) -> GraphPool {
        self.pool.clone()
    }

    /// Replays the graph on `stream` (`cuGraphLaunch`, PyTorch's `CUDAGraph.replay()` on the
    /// current stream): the replay runs after the work issued on `stream` so far, and later work
    /// on `stream` waits for all of it. Work on other streams is not ordered with it: a static
    /// input written, or a static output read, on another stream needs an event. Recorded as a
    /// `graph_launch`; the replay's hazards are reported at it.
    #[track_caller]
    pub fn launch(&self, stream: &Stream) -> Result<(), SessionError> {
        self.core
            .graph_launch(self.key, stream.key(), Some(Location::caller()))
    }
}

impl Stream {
    /// Starts capturing a graph on this stream, its origin (`cuStreamBeginCapture`,
    /// `torch.cuda.graph`): until [`Stream::end_capture`], the work issued on this stream — and
    /// on every stream that waits on an event recorded on it meanwhile — is recorded into the
    /// graph and runs nothing. Device memory allocated on those streams comes from the graph's
    /// own pool. Recorded as a `graph_begin`.
    ///
    /// Fails with [`SessionError::Capture`] on the legacy default stream or a stream capturing
    /// already. During a capture, CUDA rejects host syncs of the capturing streams, of events
    /// recorded in the capture and of the device, a capturing stream's wait on an event recorded
    /// outside it, and copies from or to pageable memory on a capturing stream: so does the
    /// session.
    #[track_caller]
    pub fn begin_capture(&self) -> Result<(), SessionError> {
        self.begin_capture_at(None, Location::caller())
    }

    /// [`Stream::begin_capture`] with allocations from `pool` (PyTorch's `pool=`), which other
    /// graphs may share.
    #[track_caller]
    pub fn begin_capture_in(&self, pool: &GraphPool) -> Result<(), SessionError> {
        self.begin_capture_at(Some(pool.key), Location::caller())
    }

    /// [`Stream::begin_capture`] or [`Stream::begin_capture_in`] recorded at `site` (the
    /// facade's).
    pub(crate) fn begin_capture_at_caller(
        &self,
        pool: Option<&GraphPool>,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.begin_capture_at(pool.map(|p| p.key), site)
    }

    fn begin_capture_at(
        &self,
        pool: Option<PoolRef>,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.inner.core.graph_begin(self.key(), pool, Some(site))?;
        Ok(())
    }

    /// Ends the capture begun on this stream (`cuStreamEndCapture`) and returns the graph.
    /// Recorded as a `graph_end`. Fails if this stream is not the origin of a capture, and (on a
    /// GPU) if a stream that joined the capture has work this stream does not wait for.
    #[track_caller]
    pub fn end_capture(&self) -> Result<Graph, SessionError> {
        self.end_capture_at_caller(Location::caller())
    }

    /// [`Stream::end_capture`] recorded at `site` (the facade's).
    pub(crate) fn end_capture_at_caller(
        &self,
        site: &'static Location<'static>,
    ) -> Result<Graph, SessionError> {
        let core = &self.inner.core;
        let (key, id, pool_key, pool_id) = core.graph_end(self.key(), Some(site))?;
        Ok(Graph {
            core: core.clone(),
            key,
            id,
            pool: GraphPool {
                key: pool_key,
                id: pool_id,
            },
        })
    }

    /// Whether this stream is capturing (the origin of a capture, or a stream that joined one).
    pub fn is_capturing(&self) -> bool {
        self.inner.core.is_capturing(self.key())
    }
}

impl super::Session {
    /// A new graph memory pool, `pool1`, `pool2`, … (PyTorch's `torch.cuda.graph_pool_handle()`),
    /// for captures that share memory ([`Stream::begin_capture_in`]).
    pub fn graph_pool(&self) -> Result<GraphPool, SessionError> {
        let (key, id) = self.core().graph_pool()?;
        Ok(GraphPool { key, id })
    }
}
