//! The session core: the state every handle of a session shares — the backend, the recorder, the
//! names and the live buffers — and one method per op.
//!
//! The core's methods take keys ([`StreamRef`], [`EventRef`], [`Region`]), never handles: the
//! handles ([`super::Stream`], [`super::Event`], the buffers, [`super::Launch`]) are built on the
//! core and call it, and nothing here knows them.
//!
//! Every op follows one pattern: take the lock (which returns a parked error first), validate,
//! issue it to the backend ([`crate::exec::Backend`]: [`AnyBackend`], the simulator or a GPU),
//! record it. The op is recorded only once
//! the backend accepted it, so the trace holds what the device was asked to do, in the order it
//! was asked.

mod data;
mod error;
mod graph;
mod kernel;
mod names;
mod raw;
mod record;
mod region;

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

use crate::alloc::AllocatorStats;
use crate::exec::{AnyBackend, Backend, Issued, Op, StreamKind};
use crate::report::{Hazard, Report};
use crate::sync::{Mutex, MutexGuard};
use crate::trace::{Id, MemoryKind, TraceOp};

pub use error::{LaunchError, SessionError};
pub use raw::RawLaunch;
pub use region::Region;

pub(crate) use graph::{GraphRef, PoolRef};
pub(crate) use kernel::{KernelExec, LaunchDesc};
use names::Names;
pub(crate) use record::Loc;
use record::{AllocRec, Rec, Recorder};
pub(crate) use region::{Regions, WORD};

/// Knobs of a session. `SessionConfig::default()` is what
/// [`Session::simulated`](super::Session::simulated) and [`Session::cuda`](super::Session) use.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Record and check ops (default `true`). With `false` the session only executes: no trace, no
    /// report (an empty one), for measuring the cost of checking.
    pub check: bool,
    /// Keep the trace ops for [`Session::trace`](super::Session::trace) and
    /// [`Session::write_trace`](super::Session::write_trace) (default `true`). Turn off for long
    /// runs: the checker's memory follows the live working set, the trace's follows the run's
    /// length.
    pub keep_trace: bool,
    /// The simulated device's memory in bytes (default 141 GB, an H200's): an allocation whose
    /// segment does not fit is an error, as on a GPU. Ignored on a GPU.
    pub sim_device_bytes: u64,
    /// The simulated pinned host memory in bytes (default 64 GiB). Ignored on a GPU.
    pub sim_pinned_bytes: u64,
    /// Run the work on the simulated device (default `true`). With `false` the simulator still
    /// allocates, and the session still records and checks every op, but launches, copies from and
    /// to pageable memory, event records and event waits do nothing on the device (memory keeps
    /// its contents, and streams never lag): a backend with no device work, for measuring the
    /// harness's own cost per call. Ignored on a GPU.
    pub sim_execute: bool,
    /// Run the synchronization analysis (default `false`): the report says which of the run's
    /// synchronizations (event waits, host syncs, `record_stream`) its memory safety needed and
    /// which it paid for for nothing, by call site ([`Report::syncs`](crate::Report::syncs);
    /// the text report lists them). It never changes whether a run is clean.
    pub syncs: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            check: true,
            keep_trace: true,
            sim_device_bytes: 141_000_000_000,
            sim_pinned_bytes: 64 << 30,
            sim_execute: true,
            syncs: false,
        }
    }
}

/// Which backend a session runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The CPU simulator.
    Simulated,
    /// A CUDA device, by ordinal.
    Cuda {
        /// The device ordinal.
        ordinal: usize,
    },
}

/// A stream of a session, by key (0: the legacy default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamRef {
    pub(crate) session: u64,
    pub(crate) key: u32,
}

/// An event of a session, by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EventRef {
    pub(crate) session: u64,
    pub(crate) key: u32,
}

thread_local! {
    /// The session whose callback this thread is running (0: none).
    static IN_CALLBACK: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f` as a callback of `session`: calls back into that session fail with
/// [`SessionError::Reentrant`] instead of deadlocking on its lock.
pub(crate) fn guarded_callback<R>(session: u64, f: impl FnOnce() -> R) -> R {
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_CALLBACK.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_CALLBACK.with(|c| c.replace(session)));
    f()
}

fn in_callback(session: u64) -> bool {
    IN_CALLBACK.with(|c| c.get()) == session
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// A live buffer of the session.
struct Live {
    id: Id,
    /// The owning stream of device memory.
    owner: Option<u32>,
    /// Streams named by `record_stream`, other than the owner.
    fences: Vec<u32>,
    /// The graph memory pool it came from (allocated on a capturing stream).
    pool: Option<u32>,
}

/// What the lock protects.
pub(crate) struct State {
    backend: AnyBackend,
    recorder: Option<Recorder>,
    finished: bool,
    parked: Option<SessionError>,
    next_op: u64,
    next_stream: u32,
    next_event: u32,
    next_buffer: u64,
    names: Names,
    live: HashMap<u64, Live>,
    graphs: graph::Graphs,
}

impl State {
    /// Records an op (counting its index even when recording is off, so the hash kernel's ids
    /// do not depend on it).
    #[inline]
    fn record(&mut self, rec: Rec) {
        if rec.is_op() {
            self.next_op += 1;
        }
        if let Some(r) = &mut self.recorder {
            r.push(rec);
        }
    }

    /// Records a launch.
    #[inline]
    fn record_launch<'r>(
        &mut self,
        stream: u32,
        name: std::borrow::Cow<'static, str>,
        reads: impl IntoIterator<Item = &'r Region>,
        writes: impl IntoIterator<Item = &'r Region>,
        site: Loc,
    ) {
        self.next_op += 1;
        if let Some(r) = &mut self.recorder {
            r.push_launch(stream, name, reads, writes, site);
        }
    }

    /// Records a copy.
    #[inline]
    fn record_copy(&mut self, stream: u32, src: &Region, dst: &Region, site: Loc) {
        self.next_op += 1;
        if let Some(r) = &mut self.recorder {
            r.push_copy(stream, src, dst, site);
        }
    }

    fn park(&mut self, e: SessionError) {
        if self.parked.is_none() {
            self.parked = Some(e);
        } else {
            tracing::warn!(error = %e, "a second error while dropping; the first is parked");
        }
    }

    /// Frees a live buffer on the backend and records the free.
    fn free(&mut self, region: &Region, to: Option<u32>, site: Loc) -> Result<(), SessionError> {
        if let Some(t) = to {
            self.graphs.check_stream(t)?;
            if self.is_capturing(t) {
                return Err(SessionError::Capture(
                    "a stream-ordered free on a capturing stream".into(),
                ));
            }
        }
        let Some(mut live) = self.live.remove(&region.key) else {
            return Err(SessionError::InvalidArgument(
                "the buffer is not live in this session".into(),
            ));
        };
        self.names.remove_buffer(&live.id);
        let op = self.next_op;
        let owner = live.owner.unwrap_or(0);
        if let Some(pool) = live.pool {
            // Back to its pool, whose memory stays the graphs'.
            let addr = region.span().addr;
            if region.bytes > 0 {
                self.pool_free(pool, addr, to.unwrap_or(owner), &live.fences)?;
            }
        } else {
            // Captured work runs nothing now: a capturing stream has nothing to wait for.
            live.fences.retain(|&s| self.graphs.capture_of(s).is_none());
            self.backend.issue(
                op,
                Op::Free {
                    span: region.span(),
                    owner,
                    to,
                    record_streams: &live.fences,
                    placed: false,
                },
            )?;
        }
        self.record(Rec::Free {
            key: region.key,
            stream: to,
            site,
        });
        Ok(())
    }
}

/// What every handle of a session shares.
pub(crate) struct Core {
    /// Unique per session in the process: regions and keys carry it.
    pub(crate) session: u64,
    pub(crate) kind: BackendKind,
    state: Mutex<State>,
}

impl Core {
    pub(crate) fn new(
        backend: AnyBackend,
        kind: BackendKind,
        config: &SessionConfig,
    ) -> Result<Core, SessionError> {
        let recorder = if config.check {
            Some(Recorder::spawn(config.keep_trace, config.syncs)?)
        } else {
            None
        };
        let state = State {
            backend,
            recorder,
            finished: false,
            parked: None,
            next_op: 0,
            next_stream: 1,
            next_event: 0,
            next_buffer: 1,
            names: Names::new(),
            live: HashMap::new(),
            graphs: graph::Graphs::default(),
        };
        Ok(Core {
            session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            kind,
            state: Mutex::new(state),
        })
    }

    /// The lock, for a call: fails inside a callback of this session, with a parked error, or
    /// once finished.
    #[inline]
    fn lock(&self) -> Result<MutexGuard<'_, State>, SessionError> {
        if in_callback(self.session) {
            return Err(SessionError::Reentrant);
        }
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = st.parked.take() {
            return Err(e);
        }
        if st.finished {
            return Err(SessionError::Finished);
        }
        Ok(st)
    }

    /// The lock, for a drop: `None` inside a callback of this session.
    fn lock_for_drop(&self) -> Option<MutexGuard<'_, State>> {
        if in_callback(self.session) {
            return None;
        }
        Some(self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether a stream is of this session.
    #[inline]
    fn stream(&self, s: StreamRef) -> Result<u32, SessionError> {
        if s.session == self.session {
            Ok(s.key)
        } else {
            Err(SessionError::WrongSession)
        }
    }

    /// Whether an event is of this session.
    #[inline]
    fn event(&self, e: EventRef) -> Result<u32, SessionError> {
        if e.session == self.session {
            Ok(e.key)
        } else {
            Err(SessionError::WrongSession)
        }
    }

    /// Whether a region is of this session.
    #[inline]
    fn region(&self, r: &Region) -> Result<(), SessionError> {
        if r.session == self.session {
            Ok(())
        } else {
            Err(SessionError::WrongSession)
        }
    }

    /// The legacy default stream.
    pub(crate) fn legacy_stream(&self) -> StreamRef {
        StreamRef {
            session: self.session,
            key: 0,
        }
    }

    /// A new stream of `kind`, named `name` or `s1`, `s2`, …
    pub(crate) fn create_stream(
        &self,
        name: Option<&str>,
        kind: StreamKind,
        site: &'static Location<'static>,
    ) -> Result<(StreamRef, Id), SessionError> {
        let mut st = self.lock()?;
        let id = st.names.stream(name)?;
        let key = st.next_stream;
        let op = st.next_op;
        st.backend.issue(
            op,
            Op::StreamCreate {
                stream: key,
                kind,
                device: 0,
            },
        )?;
        st.next_stream += 1;
        st.graphs.stream_created(key, kind == StreamKind::Blocking);
        st.names.add_stream(&id);
        st.record(Rec::StreamCreate {
            key,
            id: id.clone(),
            blocking: kind == StreamKind::Blocking,
            site: Some(site),
        });
        Ok((
            StreamRef {
                session: self.session,
                key,
            },
            id,
        ))
    }

    /// Forgets a stream whose last handle was dropped (work already issued still runs).
    pub(crate) fn release_stream(&self, s: StreamRef) {
        if let Some(mut st) = self.lock_for_drop() {
            st.backend.release_stream(s.key);
        }
    }

    /// A new event, named `e1`, `e2`, …
    pub(crate) fn create_event(
        &self,
        site: &'static Location<'static>,
    ) -> Result<(EventRef, Id), SessionError> {
        let mut st = self.lock()?;
        let key = st.next_event;
        let op = st.next_op;
        st.backend.issue(op, Op::EventCreate { event: key })?;
        let id = st.names.event();
        st.next_event += 1;
        st.record(Rec::EventCreate {
            key,
            id: id.clone(),
            site: Some(site),
        });
        Ok((
            EventRef {
                session: self.session,
                key,
            },
            id,
        ))
    }

    /// Destroys a dropped event: never panics.
    pub(crate) fn drop_event(&self, e: EventRef) {
        let Some(mut st) = self.lock_for_drop() else {
            return;
        };
        let op = st.next_op;
        if let Err(e) = st.backend.issue(op, Op::EventDestroy { event: e.key }) {
            st.park(e.into());
        }
        st.record(Rec::EventDestroy { key: e.key });
    }

    /// Allocates `bytes` of `memory` (owned by `stream` for device memory), named `name` or
    /// fresh. Returns the whole buffer's region and its name.
    pub(crate) fn alloc(
        &self,
        memory: MemoryKind,
        stream: Option<StreamRef>,
        name: Option<&str>,
        bytes: u64,
        site: &'static Location<'static>,
    ) -> Result<(Region, Id), SessionError> {
        let skey = match stream {
            Some(s) => self.stream(s)?,
            None => 0,
        };
        let mut st = self.lock()?;
        let pool = if memory == MemoryKind::Device {
            st.graphs.check_stream(skey)?;
            st.alloc_pool(skey)
        } else {
            None
        };
        let id = st.names.buffer(name, memory)?;
        let op = st.next_op;
        let addr = match pool {
            Some(p) => st.pool_alloc(p, bytes, skey)?,
            None => match st.backend.issue(
                op,
                Op::Alloc {
                    memory,
                    bytes,
                    stream: skey,
                    at: None,
                },
            )? {
                Issued::Allocated(a) => a,
                _ => None,
            },
        };
        let key = st.next_buffer;
        st.next_buffer += 1;
        let owner = (memory == MemoryKind::Device).then_some(skey);
        st.live.insert(
            key,
            Live {
                id: id.clone(),
                owner,
                fences: Vec::new(),
                pool,
            },
        );
        st.names.add_buffer(&id);
        st.record(Rec::Alloc(Box::new(AllocRec {
            key,
            id: id.clone(),
            bytes,
            stream: owner,
            memory,
            addr,
            site: Some(site),
        })));
        let region = Region {
            session: self.session,
            key,
            memory,
            base: addr.unwrap_or(0),
            offset: 0,
            bytes,
            whole: true,
            external: false,
        };
        Ok((region, id))
    }

    /// A region of memory the session did not allocate (an external buffer).
    pub(crate) fn external(
        &self,
        name: &str,
        device_ptr: u64,
        bytes: u64,
    ) -> Result<Region, SessionError> {
        let mut st = self.lock()?;
        if device_ptr % 4 != 0 || bytes % 4 != 0 || device_ptr.checked_add(bytes).is_none() {
            return Err(SessionError::InvalidArgument(format!(
                "an external region is whole 4-byte words below 2^64, not {bytes} bytes at {device_ptr:#x}"
            )));
        }
        let id = st.names.external(name)?;
        let key = st.next_buffer;
        st.next_buffer += 1;
        st.record(Rec::External { key, id });
        Ok(Region {
            session: self.session,
            key,
            memory: MemoryKind::Device,
            base: device_ptr,
            offset: 0,
            bytes,
            whole: false,
            external: true,
        })
    }

    /// Frees a buffer: a caching free, or stream-ordered on `to`.
    pub(crate) fn free(
        &self,
        region: &Region,
        to: Option<StreamRef>,
        site: Loc,
    ) -> Result<(), SessionError> {
        let to = match to {
            Some(s) => Some(self.stream(s)?),
            None => None,
        };
        let mut st = self.lock()?;
        st.free(region, to, site)
    }

    /// The free of a dropped buffer (a caching free, or stream-ordered on `to`): never panics; an
    /// error is parked.
    pub(crate) fn drop_free(&self, region: &Region, to: Option<StreamRef>) {
        let Some(mut st) = self.lock_for_drop() else {
            tracing::warn!(
                "a buffer dropped inside a callback of its own session is leaked (not freed)"
            );
            return;
        };
        let mut to = to.map(|s| s.key);
        let pooled = st.live.get(&region.key).is_some_and(|l| l.pool.is_some());
        if to.is_some_and(|t| pooled || st.is_capturing(t)) {
            // A pool buffer, or a buffer whose stream is capturing, is dropped by a caching free:
            // a stream-ordered free cannot be captured, and a pool's memory stays with the pool.
            to = None;
        }
        if let Err(e) = st.free(region, to, None) {
            st.park(e);
        }
    }

    /// `record_stream`: the free of `region`'s buffer waits for `stream`'s work up to it.
    pub(crate) fn record_stream(
        &self,
        region: &Region,
        stream: StreamRef,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.region(region)?;
        let key = self.stream(stream)?;
        let mut st = self.lock()?;
        if let Some(live) = st.live.get_mut(&region.key) {
            if live.owner != Some(key) && !live.fences.contains(&key) {
                live.fences.push(key);
            }
        }
        st.record(Rec::RecordStream {
            key: region.key,
            stream: key,
            site: Some(site),
        });
        Ok(())
    }

    /// Issues an op that touches no memory and returns nothing, then records it.
    fn sync_op(
        &self,
        op: impl FnOnce(u32) -> Op<'static>,
        key: u32,
        rec: Rec,
        check: impl FnOnce(&graph::Graphs) -> Result<(), SessionError>,
    ) -> Result<(), SessionError> {
        let mut st = self.lock()?;
        check(&st.graphs)?;
        let index = st.next_op;
        st.backend.issue(index, op(key))?;
        st.record(rec);
        Ok(())
    }

    pub(crate) fn event_record(
        &self,
        event: EventRef,
        stream: StreamRef,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let e = self.event(event)?;
        let s = self.stream(stream)?;
        let mut st = self.lock()?;
        let op = st.next_op;
        if st.backend.runs_work() {
            st.issue_stream_op(
                op,
                s,
                Op::EventRecord {
                    event: e,
                    stream: s,
                },
            )?;
        } else {
            st.graphs.check_stream(s)?;
        }
        st.graphs.event_recorded(e, s);
        st.record(Rec::EventRecord {
            event: e,
            stream: s,
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn event_wait(
        &self,
        stream: StreamRef,
        event: EventRef,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let e = self.event(event)?;
        let s = self.stream(stream)?;
        let mut st = self.lock()?;
        st.graphs.check_stream(s)?;
        let op = st.next_op;
        let captured = st.graphs.event_wait(s, e)?;
        // A captured wait (or one that joins a capture) is the driver's on a GPU, nothing now on
        // the simulator; a capturing stream's wait on an event never recorded has no effect.
        let issue = !captured || (st.backend.captures() && st.graphs.is_captured_event(e));
        if st.backend.runs_work() && issue {
            st.backend.issue(
                op,
                Op::EventWait {
                    stream: s,
                    event: e,
                },
            )?;
        }
        st.record(Rec::EventWait {
            stream: s,
            event: e,
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn event_sync(
        &self,
        event: EventRef,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let e = self.event(event)?;
        self.sync_op(
            |event| Op::EventSync { event },
            e,
            Rec::EventSync {
                event: e,
                site: Some(site),
            },
            |g| g.check_event_sync(e, "an event synchronization"),
        )
    }

    pub(crate) fn event_query(
        &self,
        event: EventRef,
        site: &'static Location<'static>,
    ) -> Result<bool, SessionError> {
        let e = self.event(event)?;
        let mut st = self.lock()?;
        st.graphs.check_event_sync(e, "an event query")?;
        let op = st.next_op;
        let complete = st.backend.issue(op, Op::EventQuery { event: e })? == Issued::Complete(true);
        st.record(Rec::EventQuery {
            event: e,
            complete,
            site: Some(site),
        });
        Ok(complete)
    }

    pub(crate) fn stream_sync(
        &self,
        stream: StreamRef,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let s = self.stream(stream)?;
        self.sync_op(
            |stream| Op::StreamSync { stream },
            s,
            Rec::StreamSync {
                stream: s,
                site: Some(site),
            },
            |g| g.check_stream_sync(s, "a stream synchronization"),
        )
    }

    pub(crate) fn stream_query(
        &self,
        stream: StreamRef,
        site: &'static Location<'static>,
    ) -> Result<bool, SessionError> {
        let s = self.stream(stream)?;
        let mut st = self.lock()?;
        st.graphs.check_stream_sync(s, "a stream query")?;
        let op = st.next_op;
        let complete =
            st.backend.issue(op, Op::StreamQuery { stream: s })? == Issued::Complete(true);
        st.record(Rec::StreamQuery {
            stream: s,
            complete,
            site: Some(site),
        });
        Ok(complete)
    }

    pub(crate) fn device_sync(&self, site: &'static Location<'static>) -> Result<(), SessionError> {
        self.sync_op(
            |_| Op::DeviceSync { device: 0 },
            0,
            Rec::DeviceSync { site: Some(site) },
            |g| g.check_device_sync(),
        )
    }

    /// The number of ops recorded so far.
    pub(crate) fn ops(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_op
    }

    pub(crate) fn device_memory_stats(&self) -> Result<AllocatorStats, SessionError> {
        let st = self.lock()?;
        Ok(st.backend.device_memory_stats())
    }

    /// The cudarc context of a GPU session.
    #[cfg(feature = "cuda")]
    pub(crate) fn context(&self) -> Option<std::sync::Arc<cudarc::driver::CudaContext>> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.backend.context()
    }

    /// The raw `CUstream` of stream `s` of a GPU session.
    #[cfg(feature = "cuda")]
    pub(crate) fn cu_stream(&self, s: StreamRef) -> Option<cudarc::driver::sys::CUstream> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.backend.gpu_stream(s.key).map(|(_, stream)| stream.raw())
    }

    pub(crate) fn hazards(&self) -> Result<Vec<Hazard>, SessionError> {
        let mut st = self.lock()?;
        match &mut st.recorder {
            None => Ok(Vec::new()),
            Some(r) => r.call(|w| w.checker().hazards().to_vec()),
        }
    }

    pub(crate) fn trace(&self) -> Result<Vec<TraceOp>, SessionError> {
        let mut st = self.lock()?;
        match &mut st.recorder {
            None => Ok(Vec::new()),
            Some(r) => r.call(|w| w.trace.clone().unwrap_or_default()),
        }
    }

    pub(crate) fn finish(&self) -> Result<Report, SessionError> {
        let mut st = self.lock()?;
        st.finished = true;
        let ops = st.next_op;
        let recorder = st.recorder.take();
        drop(st);
        let Some(recorder) = recorder else {
            return Ok(Report::new(ops, Vec::new()));
        };
        let mut worker = recorder.finish()?;
        if let Some(e) = worker.error {
            return Err(SessionError::Check(e));
        }
        let implicit = worker.checker().implicit_syncs().to_vec();
        let mut report = worker.finish_report();
        if let Some(trace) = worker.trace.as_deref() {
            if !report.hazards.is_empty() {
                // Explain the hazards (the text report's `why:`) from the recorded trace.
                crate::graph::explain_program(trace, &mut report, &implicit, "session");
            }
        }
        Ok(report)
    }
}
