//! Streams and events: the participants of a session and the happens-before edges between them.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use super::core::{Core, EventRef, SessionError, StreamRef};
use crate::trace::Id;

pub use crate::exec::StreamKind;

/// A stream of a session: a queue of device work, like a thread of the CPU. Cheap to clone; the
/// backend forgets the stream when its last clone is dropped (work already issued still runs; a
/// GPU stream is destroyed at the next device synchronization or when the session ends).
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

pub(crate) struct StreamInner {
    pub(crate) core: Arc<Core>,
    /// The session's number (the core's), kept here so a key is one load away.
    pub(crate) session: u64,
    /// Dense index: 0 is the legacy default stream. Also the allocator's stream key.
    pub(crate) key: u32,
    pub(crate) id: Id,
    pub(crate) kind: StreamKind,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        self.core.release_stream(StreamRef {
            session: self.session,
            key: self.key,
        });
    }
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
    /// The legacy default stream of `core`.
    pub(crate) fn legacy(core: &Arc<Core>) -> Stream {
        Stream {
            inner: Arc::new(StreamInner {
                core: core.clone(),
                session: core.session,
                key: core.legacy_stream().key,
                id: Id::from(crate::trace::DEFAULT_STREAM),
                kind: StreamKind::LegacyDefault,
            }),
        }
    }

    pub(crate) fn create(
        core: &Arc<Core>,
        name: Option<&str>,
        kind: StreamKind,
        site: &'static Location<'static>,
    ) -> Result<Stream, SessionError> {
        let (key, id) = core.create_stream(name, kind, site)?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                core: core.clone(),
                session: key.session,
                key: key.key,
                id,
                kind,
            }),
        })
    }

    /// The stream as the session core names it.
    #[inline]
    pub(crate) fn key(&self) -> StreamRef {
        StreamRef {
            session: self.inner.session,
            key: self.inner.key,
        }
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
    #[inline]
    #[track_caller]
    pub fn wait(&self, event: &Event) -> Result<(), SessionError> {
        self.inner
            .core
            .event_wait(self.key(), event.key(), Location::caller())
    }

    /// Blocks the host until all work issued on this stream so far is done
    /// (`cudaStreamSynchronize`; for the legacy default stream, also the earlier work of the
    /// blocking streams).
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), SessionError> {
        self.inner.core.stream_sync(self.key(), Location::caller())
    }

    /// Whether all work issued on this stream so far is done (`cudaStreamQuery`), without
    /// waiting. Recorded with its result: a `true` orders like [`Stream::synchronize`].
    #[track_caller]
    pub fn query(&self) -> Result<bool, SessionError> {
        self.inner.core.stream_query(self.key(), Location::caller())
    }

    /// The raw `CUstream` of a GPU session, for the driver calls the session does not wrap (work
    /// enqueued on it behind the session's back is not recorded); `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn cu_stream(&self) -> Option<cudarc::driver::sys::CUstream> {
        self.inner.core.cu_stream(self.key())
    }
}

/// An event of a session: a snapshot of a stream's work for another stream or the host to wait
/// on. Dropping it records `event_destroy`.
pub struct Event {
    pub(crate) core: Arc<Core>,
    /// The session's number (the core's).
    pub(crate) session: u64,
    pub(crate) key: u32,
    pub(crate) id: Id,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event").field("id", &self.id).finish()
    }
}

impl Event {
    pub(crate) fn create(
        core: &Arc<Core>,
        site: &'static Location<'static>,
    ) -> Result<Event, SessionError> {
        let (key, id) = core.create_event(site)?;
        Ok(Event {
            core: core.clone(),
            session: key.session,
            key: key.key,
            id,
        })
    }

    /// The event as the session core names it.
    #[inline]
    pub(crate) fn key(&self) -> EventRef {
        EventRef {
            session: self.session,
            key: self.key,
        }
    }

    /// The event's id in the trace and in reports.
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// Captures the work issued on `stream` so far (`cudaEventRecord`), replacing the earlier
    /// capture; waits issued before keep waiting for the old one.
    #[inline]
    #[track_caller]
    pub fn record(&self, stream: &Stream) -> Result<(), SessionError> {
        self.core
            .event_record(self.key(), stream.key(), Location::caller())
    }

    /// Blocks the host until the captured work is done (`cudaEventSynchronize`).
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), SessionError> {
        self.core.event_sync(self.key(), Location::caller())
    }

    /// Whether the captured work is done (`cudaEventQuery`), without waiting. Recorded with its
    /// result: a `true` orders like [`Event::synchronize`].
    #[track_caller]
    pub fn query(&self) -> Result<bool, SessionError> {
        self.core.event_query(self.key(), Location::caller())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.core.drop_event(self.key());
    }
}
