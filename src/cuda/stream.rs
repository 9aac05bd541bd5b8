//! Streams and events: the participants and the happens-before edges between them.
//!
//! Three stream kinds, as in the trace format:
//! - the **legacy default stream** (`CU_STREAM_LEGACY`): an op on it waits for all earlier work of
//!   the blocking streams of the context, and later work of those streams waits for it;
//! - **blocking streams** (`CU_STREAM_DEFAULT`): synchronize implicitly with the legacy stream;
//! - **non-blocking streams** (`CU_STREAM_NON_BLOCKING`): no implicit synchronization at all.
//!
//! Events are created with `CU_EVENT_DISABLE_TIMING`: they only order, which makes record and wait
//! cheap.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext};

use super::{Gpu, GpuError};

/// `CU_STREAM_LEGACY` of `cuda.h` (`((CUstream)0x1)`), which bindgen does not carry over: the
/// legacy default stream, whatever the per-thread default stream setting.
const CU_STREAM_LEGACY: sys::CUstream = std::ptr::without_provenance_mut(0x1);

/// The synchronization behaviour of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// The legacy default stream (`CU_STREAM_LEGACY`), implicitly ordered with blocking streams.
    Legacy,
    /// A stream created with `CU_STREAM_DEFAULT`: implicitly ordered with the legacy stream.
    Blocking,
    /// A stream created with `CU_STREAM_NON_BLOCKING`: never implicitly ordered with anything.
    NonBlocking,
}

/// A CUDA stream of one context. Dropping a created stream destroys it; work already enqueued
/// still runs (`cuStreamDestroy` does not wait).
pub struct Stream {
    raw: sys::CUstream,
    kind: StreamKind,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUstream handle may be used from any thread; every method makes the context current
// on the calling thread before using it.
unsafe impl Send for Stream {}
// SAFETY: as for Send; the driver serializes concurrent calls on one stream.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("kind", &self.kind)
            .field("raw", &self.raw)
            .finish()
    }
}

impl Gpu {
    /// The legacy default stream of this context.
    pub fn legacy_stream(&self) -> Stream {
        Stream {
            raw: CU_STREAM_LEGACY,
            kind: StreamKind::Legacy,
            ctx: self.ctx.clone(),
        }
    }

    /// A new stream of the given kind ([`StreamKind::Legacy`] gives the legacy default stream).
    pub fn new_stream(&self, kind: StreamKind) -> Result<Stream, GpuError> {
        let stream_kind = match kind {
            StreamKind::Legacy => return Ok(self.legacy_stream()),
            StreamKind::Blocking => result::stream::StreamKind::Default,
            StreamKind::NonBlocking => result::stream::StreamKind::NonBlocking,
        };
        self.ctx.bind_to_thread()?;
        let raw = result::stream::create(stream_kind)?;
        Ok(Stream {
            raw,
            kind,
            ctx: self.ctx.clone(),
        })
    }

    /// A new event, created with `CU_EVENT_DISABLE_TIMING`.
    pub fn new_event(&self) -> Result<Event, GpuError> {
        self.ctx.bind_to_thread()?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
        Ok(Event {
            raw,
            ctx: self.ctx.clone(),
        })
    }
}

impl Stream {
    /// The kind this stream was created as.
    pub fn kind(&self) -> StreamKind {
        self.kind
    }

    /// The raw handle, for the driver calls this layer does not wrap. Do not destroy it.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Blocks the host until all work enqueued on this stream so far is done.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `raw` is the legacy handle or a stream this value created and has not destroyed.
        unsafe { result::stream::synchronize(self.raw) }?;
        Ok(())
    }

    /// Whether all work enqueued on this stream so far is done (`cuStreamQuery`), without waiting.
    pub fn query(&self) -> Result<bool, GpuError> {
        self.bind()?;
        // SAFETY: `raw` is the legacy handle or a stream this value created and has not destroyed.
        not_ready_is_false(unsafe { sys::cuStreamQuery(self.raw) }.result())
    }

    /// Makes all later work on this stream wait for the work `event` captured when it was last
    /// recorded (`cuStreamWaitEvent`). Recording `event` again later does not change this wait.
    pub fn wait(&self, event: &Event) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: both handles are live: each value owns its handle until dropped.
        unsafe {
            result::stream::wait_event(
                self.raw,
                event.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }?;
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.kind == StreamKind::Legacy {
            return;
        }
        // Errors are parked in the context (returned by its next call), never raised here.
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: this value created the stream and is its only owner; it is destroyed once.
        let destroyed = unsafe { result::stream::destroy(self.raw) };
        if let Err(e) = destroyed {
            tracing::warn!(error = %e, "cuStreamDestroy failed");
        }
        self.ctx.record_err(destroyed);
    }
}

/// A CUDA event: a snapshot of a stream's work, for another stream or the host to wait on.
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent handle may be used from any thread; every method makes the context current on
// the calling thread before using it.
unsafe impl Send for Event {}
// SAFETY: as for Send; the driver serializes concurrent calls on one event.
unsafe impl Sync for Event {}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event").field("raw", &self.raw).finish()
    }
}

impl Event {
    /// The raw handle, for the driver calls this layer does not wrap. Do not destroy it.
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Captures the work enqueued on `stream` so far (`cuEventRecord`), replacing what the event
    /// held; waits issued earlier keep waiting for the old snapshot.
    pub fn record(&self, stream: &Stream) -> Result<(), GpuError> {
        stream.bind()?;
        // SAFETY: both handles are live: each value owns its handle until dropped.
        unsafe { result::event::record(self.raw, stream.raw) }?;
        Ok(())
    }

    /// Blocks the host until the captured work is done. An event never recorded is done.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the event is live: this value owns it until dropped.
        unsafe { result::event::synchronize(self.raw) }?;
        Ok(())
    }

    /// Whether the captured work is done (`cuEventQuery`), without waiting.
    pub fn query(&self) -> Result<bool, GpuError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the event is live: this value owns it until dropped.
        not_ready_is_false(unsafe { result::event::query(self.raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: this value created the event and is its only owner; it is destroyed once. The
        // driver releases an event still pending once its work completes.
        let destroyed = unsafe { result::event::destroy(self.raw) };
        if let Err(e) = destroyed {
            tracing::warn!(error = %e, "cuEventDestroy failed");
        }
        self.ctx.record_err(destroyed);
    }
}

/// `Ok` → done, `CUDA_ERROR_NOT_READY` → not done, anything else is an error.
fn not_ready_is_false(r: Result<(), DriverError>) -> Result<bool, GpuError> {
    match r {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
