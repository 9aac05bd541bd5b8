//! Streams and events: the participants of a session and the happens-before edges between them.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use super::state::{GpuEvent, GpuStream, Shared};
use super::SessionError;
use crate::trace::Id;

/// The synchronization behaviour of a stream, as in the trace format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// The legacy default stream: an op on it waits for the earlier work of every blocking
    /// stream, and later work of those streams waits for it.
    LegacyDefault,
    /// Created with `cudaStreamDefault`: implicitly ordered with the legacy default stream.
    Blocking,
    /// Created with `cudaStreamNonBlocking` (PyTorch's streams): never implicitly ordered.
    NonBlocking,
}

/// A stream of a session: a queue of device work, like a thread of the CPU. Cheap to clone; the
/// stream is destroyed when its last clone is dropped (work already issued still runs).
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

pub(crate) struct StreamInner {
    pub(crate) shared: Arc<Shared>,
    /// Dense index: 0 is the legacy default stream. Also the allocator's stream key.
    pub(crate) key: u32,
    pub(crate) id: Id,
    pub(crate) kind: StreamKind,
    pub(crate) cuda: GpuStream,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.inner.id)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl Stream {
    pub(crate) fn legacy(shared: &Arc<Shared>) -> Stream {
        shared.legacy_stream()
    }

    pub(crate) fn create(
        shared: &Arc<Shared>,
        name: Option<&str>,
        kind: StreamKind,
        site: &'static Location<'static>,
    ) -> Result<Stream, SessionError> {
        shared.create_stream(name, kind, site)
    }

    /// The stream's id in the trace and in reports (`"default"` for the legacy default stream).
    pub fn id(&self) -> &Id {
        &self.inner.id
    }

    /// The stream's kind.
    pub fn kind(&self) -> StreamKind {
        self.inner.kind
    }

    /// Makes later work on this stream wait for what `event` captured when last recorded
    /// (`cudaStreamWaitEvent`). Waiting on an event never recorded has no effect, and the report
    /// warns about it.
    #[track_caller]
    pub fn wait(&self, event: &Event) -> Result<(), SessionError> {
        self.inner
            .shared
            .event_wait(self, event, Location::caller())
    }

    /// Blocks the host until all work issued on this stream so far is done
    /// (`cudaStreamSynchronize`; for the legacy default stream, also the earlier work of the
    /// blocking streams).
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), SessionError> {
        self.inner.shared.stream_sync(self, Location::caller())
    }

    /// Whether all work issued on this stream so far is done (`cudaStreamQuery`), without
    /// waiting. Recorded with its result: a `true` orders like [`Stream::synchronize`].
    #[track_caller]
    pub fn query(&self) -> Result<bool, SessionError> {
        self.inner.shared.stream_query(self, Location::caller())
    }

    /// The raw `CUstream` of a GPU session, for the driver calls the session does not wrap (work
    /// enqueued on it behind the session's back is not recorded); `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn cu_stream(&self) -> Option<cudarc::driver::sys::CUstream> {
        self.inner.cuda.as_ref().map(|s| s.raw())
    }
}

/// An event of a session: a snapshot of a stream's work for another stream or the host to wait
/// on. Dropping it records `event_destroy`.
pub struct Event {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: u32,
    pub(crate) id: Id,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) cuda: GpuEvent,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event").field("id", &self.id).finish()
    }
}

impl Event {
    pub(crate) fn create(
        shared: &Arc<Shared>,
        site: &'static Location<'static>,
    ) -> Result<Event, SessionError> {
        shared.create_event(site)
    }

    /// The event's id in the trace and in reports.
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// Captures the work issued on `stream` so far (`cudaEventRecord`), replacing the earlier
    /// capture; waits issued before keep waiting for the old one.
    #[track_caller]
    pub fn record(&self, stream: &Stream) -> Result<(), SessionError> {
        self.shared.event_record(self, stream, Location::caller())
    }

    /// Blocks the host until the captured work is done (`cudaEventSynchronize`).
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), SessionError> {
        self.shared.event_sync(self, Location::caller())
    }

    /// Whether the captured work is done (`cudaEventQuery`), without waiting. Recorded with its
    /// result: a `true` orders like [`Event::synchronize`].
    #[track_caller]
    pub fn query(&self) -> Result<bool, SessionError> {
        self.shared.event_query(self, Location::caller())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.shared.drop_event(self.key);
    }
}
