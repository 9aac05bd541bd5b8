//! Streams and events: cudarc's `CudaStream` and `CudaEvent` over the session's.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use crate::session::{Event, Stream, StreamKind};

use super::context::{CudaContext, DriverError, EventFlags};

/// A stream, as cudarc's `CudaStream`: a queue of device work, like a thread of the CPU.
///
/// Made by [`CudaContext::new_stream`], [`CudaContext::default_stream`] or
/// [`CudaStream::fork`]. Memory is allocated on a stream and copied through it (see
/// [`CudaStream::alloc_zeros`] and the other memory calls), kernels are launched on it
/// ([`CudaStream::launch_builder`]).
pub struct CudaStream {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Stream,
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStream")
            .field("id", self.stream.id())
            .finish_non_exhaustive()
    }
}

impl PartialEq for CudaStream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.stream.inner, &other.stream.inner)
    }
}

impl Eq for CudaStream {}

impl CudaStream {
    /// A new non-blocking stream that waits for the work issued on this one so far (an event
    /// recorded here and waited on there).
    #[track_caller]
    pub fn fork(&self) -> Result<Arc<Self>, DriverError> {
        let site = Location::caller();
        let stream = self.ctx.new_stream_at(site)?;
        stream.join_at(self, site)?;
        Ok(stream)
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The session's stream behind it: its id in reports, and the escape hatch to the session's
    /// own calls (`record_stream`, hand-described launches).
    pub fn session_stream(&self) -> &Stream {
        &self.stream
    }

    /// Blocks the host until all work issued on this stream so far is done: a `stream_sync`.
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), DriverError> {
        Ok(self
            .ctx
            .session
            .core()
            .stream_sync(self.stream.key(), Location::caller())?)
    }

    /// A new event that captures the work issued on this stream so far.
    #[track_caller]
    pub fn record_event(&self, flags: Option<EventFlags>) -> Result<CudaEvent, DriverError> {
        let _ = flags;
        self.record_event_at(Location::caller())
    }

    fn record_event_at(&self, site: &'static Location<'static>) -> Result<CudaEvent, DriverError> {
        let event = self.ctx.new_event_at(site)?;
        event.record_at(self, site)?;
        Ok(event)
    }

    /// Makes later work on this stream wait for what `event` captured when last recorded
    /// (`cuStreamWaitEvent`). Waiting on an event never recorded has no effect, and the report
    /// warns about it.
    #[track_caller]
    pub fn wait(&self, event: &CudaEvent) -> Result<(), DriverError> {
        self.wait_at(event, Location::caller())
    }

    fn wait_at(
        &self,
        event: &CudaEvent,
        site: &'static Location<'static>,
    ) -> Result<(), DriverError> {
        Ok(self
            .ctx
            .session
            .core()
            .event_wait(self.stream.key(), event.event.key(), site)?)
    }

    /// Makes this stream wait for the work issued on `other` so far: `self.wait(&other.record_event(None)?)`.
    #[track_caller]
    pub fn join(&self, other: &CudaStream) -> Result<(), DriverError> {
        self.join_at(other, Location::caller())
    }

    fn join_at(
        &self,
        other: &CudaStream,
        site: &'static Location<'static>,
    ) -> Result<(), DriverError> {
        let event = other.record_event_at(site)?;
        self.wait_at(&event, site)
    }
}

/// An event, as cudarc's `CudaEvent`: a snapshot of a stream's work for another stream or the
/// host to wait on. Dropping it records `event_destroy`.
pub struct CudaEvent {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) event: Event,
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEvent")
            .field("id", self.event.id())
            .finish_non_exhaustive()
    }
}

impl CudaEvent {
    /// The context this event belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The session's event behind it (its id in reports).
    pub fn session_event(&self) -> &Event {
        &self.event
    }

    /// Captures the work issued on `stream` so far (`cuEventRecord`), replacing the earlier
    /// capture; waits issued before keep waiting for the old one.
    #[track_caller]
    pub fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        self.record_at(stream, Location::caller())
    }

    pub(crate) fn record_at(
        &self,
        stream: &CudaStream,
        site: &'static Location<'static>,
    ) -> Result<(), DriverError> {
        Ok(self
            .ctx
            .session
            .core()
            .event_record(self.event.key(), stream.stream.key(), site)?)
    }

    /// Blocks the host until the captured work is done (`cuEventSynchronize`): an `event_sync`.
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), DriverError> {
        Ok(self
            .ctx
            .session
            .core()
            .event_sync(self.event.key(), Location::caller())?)
    }

    /// Whether the captured work is done, without waiting: an `event_query` with the answer (a
    /// `true` orders like [`CudaEvent::synchronize`]). An error counts as `false`; see
    /// [`CudaEvent::try_is_complete`].
    #[track_caller]
    pub fn is_complete(&self) -> bool {
        self.query_at(Location::caller()).unwrap_or(false)
    }

    /// Whether the captured work is done, without waiting: an `event_query` with the answer.
    #[track_caller]
    pub fn try_is_complete(&self) -> Result<bool, DriverError> {
        self.query_at(Location::caller())
    }

    fn query_at(&self, site: &'static Location<'static>) -> Result<bool, DriverError> {
        Ok(self
            .ctx
            .session
            .core()
            .event_query(self.event.key(), site)?)
    }
}

/// The streams and events of a context (cudarc's `CudaContext` methods that make them).
impl CudaContext {
    /// The legacy default stream (cudarc's `default_stream`, the null stream; trace id
    /// `"default"`).
    pub fn default_stream(self: &Arc<Self>) -> Arc<CudaStream> {
        Arc::new(CudaStream {
            ctx: self.clone(),
            stream: self.session.default_stream().clone(),
        })
    }

    /// A new non-blocking stream (`CU_STREAM_NON_BLOCKING`), named `s1`, `s2`, … in reports.
    #[track_caller]
    pub fn new_stream(self: &Arc<Self>) -> Result<Arc<CudaStream>, DriverError> {
        self.new_stream_at(Location::caller())
    }

    pub(crate) fn new_stream_at(
        self: &Arc<Self>,
        site: &'static Location<'static>,
    ) -> Result<Arc<CudaStream>, DriverError> {
        let stream = crate::session::Stream::create(
            self.session.core(),
            None,
            StreamKind::NonBlocking,
            site,
        )?;
        Ok(Arc::new(CudaStream {
            ctx: self.clone(),
            stream,
        }))
    }

    /// A new event with nothing recorded, named `e1`, `e2`, … in reports. The flags do not
    /// matter: the facade's events only order work (no timing).
    #[track_caller]
    pub fn new_event(
        self: &Arc<Self>,
        flags: Option<EventFlags>,
    ) -> Result<CudaEvent, DriverError> {
        let _ = flags;
        self.new_event_at(Location::caller())
    }

    pub(crate) fn new_event_at(
        self: &Arc<Self>,
        site: &'static Location<'static>,
    ) -> Result<CudaEvent, DriverError> {
        let event = crate::session::Event::create(self.session.core(), site)?;
        Ok(CudaEvent {
            ctx: self.clone(),
            event,
        })
    }
}
