//! The session's shared state: the backend, the recorder, names, and one method per op.
//!
//! Every op follows one pattern: take the lock (which returns a parked error first), validate,
//! execute on the backend, record. The op is recorded only once the backend accepted it, so the
//! trace holds what the device was asked to do, in the order it was asked.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use super::buffer::Region;
use super::handle::{Event, Stream, StreamInner, StreamKind};
use super::launch::{KernelFn, Launch, RawLaunch, RawTarget};
use super::record::{AllocRec, Loc, Rec, Recorder};
use super::sim::SimBackend;
use super::{BackendKind, SessionConfig, SessionError};
use crate::alloc::{AllocError, AllocatorStats, Block};
use crate::kernels::MAX_READS;
use crate::report::{Hazard, Report};
use crate::sync::{Mutex, MutexGuard};
use crate::trace::{Id, MemoryKind, TraceOp, DEFAULT_STREAM, HOST};

/// The GPU stream of a handle (`None` on the simulator).
#[cfg(feature = "cuda")]
pub(crate) type GpuStream = Option<Arc<crate::cuda::Stream>>;
/// Nothing: the handles' GPU parts without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Debug, Default)]
pub(crate) struct NoGpu;
/// The GPU stream of a handle (nothing without the `cuda` feature).
#[cfg(not(feature = "cuda"))]
pub(crate) type GpuStream = NoGpu;
/// The GPU event of a handle (`None` on the simulator).
#[cfg(feature = "cuda")]
pub(crate) type GpuEvent = Option<crate::cuda::Event>;
/// The GPU event of a handle (nothing without the `cuda` feature).
#[cfg(not(feature = "cuda"))]
pub(crate) type GpuEvent = NoGpu;

/// The backend that executes ops.
pub(crate) enum Backend {
    Sim(SimBackend),
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::CudaBackend),
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

/// A stream named by `record_stream` for a buffer.
#[derive(Clone)]
struct Fence {
    key: u32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    gpu: GpuStream,
}

/// A live buffer of the session.
struct Live {
    id: Id,
    /// The owning stream of device memory.
    owner: Option<u32>,
    /// Streams named by `record_stream`, other than the owner.
    fences: Vec<Fence>,
}

/// What the lock protects.
pub(crate) struct State {
    pub(super) backend: Backend,
    recorder: Option<Recorder>,
    finished: bool,
    parked: Option<SessionError>,
    pub(super) next_op: u64,
    next_stream: u32,
    next_event: u32,
    next_buffer: u64,
    counters: [u64; 4],
    stream_names: HashSet<Id>,
    live: HashMap<u64, Live>,
    live_names: HashSet<Id>,
    used_names: HashSet<Id>,
    external_names: HashSet<Id>,
}

const STREAMS: usize = 0;
const EVENTS: usize = 1;
const DEVICE: usize = 2;
const PINNED: usize = 3;

impl State {
    /// Records an op (counting its index even when recording is off, so the hash kernel's ids
    /// do not depend on it).
    #[inline]
    pub(super) fn record(&mut self, rec: Rec) {
        if rec.is_op() {
            self.next_op += 1;
        }
        if let Some(r) = &mut self.recorder {
            r.push(rec);
        }
    }

    /// Records a launch.
    #[inline]
    pub(super) fn record_launch<'r>(
        &mut self,
        stream: u32,
        name: Cow<'static, str>,
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
    pub(super) fn record_copy(&mut self, stream: u32, src: &Region, dst: &Region, site: Loc) {
        self.next_op += 1;
        if let Some(r) = &mut self.recorder {
            r.push_copy(stream, src, dst, site);
        }
    }

    pub(super) fn park(&mut self, e: SessionError) {
        if self.parked.is_none() {
            self.parked = Some(e);
        } else {
            tracing::warn!(error = %e, "a second error while dropping; the first is parked");
        }
    }

    fn fresh_name(&mut self, which: usize, prefix: &str) -> Id {
        loop {
            self.counters[which] += 1;
            let id = Id::from(format!("{prefix}{}", self.counters[which]));
            let taken = match which {
                STREAMS => self.stream_names.contains(&id),
                EVENTS => false,
                _ => self.used_names.contains(&id),
            };
            if !taken {
                return id;
            }
        }
    }

    fn stream_name(&mut self, name: Option<&str>) -> Result<Id, SessionError> {
        match name {
            None => Ok(self.fresh_name(STREAMS, "s")),
            Some(n) => {
                if n.is_empty() || n == HOST || n == DEFAULT_STREAM {
                    return Err(SessionError::InvalidArgument(format!(
                        "{n:?} cannot name a stream (empty, or reserved)"
                    )));
                }
                let id = Id::from(n);
                if self.stream_names.contains(&id) {
                    return Err(SessionError::InvalidArgument(format!(
                        "this session already has a stream named {n:?}"
                    )));
                }
                Ok(id)
            }
        }
    }

    fn buffer_name(&mut self, name: Option<&str>, memory: MemoryKind) -> Result<Id, SessionError> {
        match name {
            None if memory == MemoryKind::Device => Ok(self.fresh_name(DEVICE, "b")),
            None => Ok(self.fresh_name(PINNED, "p")),
            Some(n) => {
                let id = Id::from(n);
                if n.is_empty()
                    || self.live_names.contains(&id)
                    || self.external_names.contains(&id)
                {
                    return Err(SessionError::InvalidArgument(format!(
                        "{n:?} cannot name a buffer: empty, or the name of a live or external buffer"
                    )));
                }
                Ok(id)
            }
        }
    }

    /// Frees a live buffer on the backend and records the free.
    pub(super) fn free(
        &mut self,
        region: &Region,
        to: Option<&StreamInner>,
        site: Loc,
    ) -> Result<(), SessionError> {
        let Some(live) = self.live.remove(&region.key) else {
            return Err(SessionError::InvalidArgument(
                "the buffer is not live in this session".into(),
            ));
        };
        self.live_names.remove(&live.id);
        let to_key = to.map(|s| s.key);
        match &mut self.backend {
            Backend::Sim(b) => {
                let keys: Vec<u32> = live.fences.iter().map(|f| f.key).collect();
                b.free(region, to_key, &keys)
                    .map_err(SessionError::InvalidArgument)?;
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => {
                let streams: Vec<Arc<crate::cuda::Stream>> =
                    live.fences.iter().filter_map(|f| f.gpu.clone()).collect();
                b.free(region, to_key, &streams)?;
            }
        }
        self.record(Rec::Free {
            key: region.key,
            stream: to_key,
            site,
        });
        Ok(())
    }
}

/// What every handle of a session shares.
pub(crate) struct Shared {
    /// Unique per session in the process: regions and handles carry it.
    pub(crate) session: u64,
    pub(crate) kind: BackendKind,
    #[cfg(feature = "cuda")]
    pub(crate) context: Option<Arc<cudarc::driver::CudaContext>>,
    state: Mutex<State>,
}

fn alloc_error<E: std::error::Error>(
    e: AllocError<E>,
    bytes: u64,
    memory: MemoryKind,
) -> SessionError {
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        reason.push_str(": ");
        reason.push_str(&s.to_string());
        source = s.source();
    }
    SessionError::Alloc {
        bytes,
        memory,
        reason,
    }
}

#[cfg(feature = "cuda")]
pub(super) fn gpu_stream(s: &StreamInner) -> Result<&crate::cuda::Stream, SessionError> {
    s.cuda.as_deref().ok_or(SessionError::WrongSession)
}

#[cfg(feature = "cuda")]
fn gpu_event(e: &Event) -> Result<&crate::cuda::Event, SessionError> {
    e.cuda.as_ref().ok_or(SessionError::WrongSession)
}

impl Shared {
    pub(crate) fn new(
        backend: Backend,
        kind: BackendKind,
        config: &SessionConfig,
    ) -> Result<Arc<Shared>, SessionError> {
        let recorder = if config.check {
            Some(Recorder::spawn(config.keep_trace, config.syncs)?)
        } else {
            None
        };
        #[cfg(feature = "cuda")]
        let context = match &backend {
            Backend::Cuda(b) => Some(b.context()),
            Backend::Sim(_) => None,
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
            counters: [0; 4],
            stream_names: HashSet::from([Id::from(DEFAULT_STREAM), Id::from(HOST)]),
            live: HashMap::new(),
            live_names: HashSet::new(),
            used_names: HashSet::new(),
            external_names: HashSet::new(),
        };
        Ok(Arc::new(Shared {
            session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            kind,
            #[cfg(feature = "cuda")]
            context,
            state: Mutex::new(state),
        }))
    }

    /// The lock, for a call: fails inside a callback of this session, with a parked error, or
    /// once finished.
    #[inline]
    pub(super) fn lock(&self) -> Result<MutexGuard<'_, State>, SessionError> {
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
    pub(super) fn lock_for_drop(&self) -> Option<MutexGuard<'_, State>> {
        if in_callback(self.session) {
            return None;
        }
        Some(self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    #[inline]
    pub(super) fn same(&self, other: &Arc<Shared>) -> Result<(), SessionError> {
        if other.session == self.session {
            Ok(())
        } else {
            Err(SessionError::WrongSession)
        }
    }

    #[inline]
    pub(super) fn same_region(&self, r: &Region) -> Result<(), SessionError> {
        if r.session == self.session {
            Ok(())
        } else {
            Err(SessionError::WrongSession)
        }
    }

    pub(crate) fn legacy_stream(self: &Arc<Self>) -> Stream {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let gpu: GpuStream = match &st.backend {
            Backend::Sim(_) => Default::default(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => Some(b.legacy_stream()),
        };
        Stream {
            inner: Arc::new(StreamInner {
                shared: self.clone(),
                key: 0,
                id: Id::from(DEFAULT_STREAM),
                kind: StreamKind::LegacyDefault,
                cuda: gpu,
            }),
        }
    }

    pub(crate) fn create_stream(
        self: &Arc<Self>,
        name: Option<&str>,
        kind: StreamKind,
        site: &'static Location<'static>,
    ) -> Result<Stream, SessionError> {
        let mut st = self.lock()?;
        let id = st.stream_name(name)?;
        let key = st.next_stream;
        let blocking = kind == StreamKind::Blocking;
        let gpu: GpuStream = match &mut st.backend {
            Backend::Sim(b) => {
                b.create_stream(key, kind);
                Default::default()
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => Some(b.new_stream(blocking)?),
        };
        st.next_stream += 1;
        st.stream_names.insert(id.clone());
        st.record(Rec::StreamCreate {
            key,
            id: id.clone(),
            blocking,
            site: Some(site),
        });
        Ok(Stream {
            inner: Arc::new(StreamInner {
                shared: self.clone(),
                key,
                id,
                kind,
                cuda: gpu,
            }),
        })
    }

    pub(crate) fn create_event(
        self: &Arc<Self>,
        site: &'static Location<'static>,
    ) -> Result<Event, SessionError> {
        let mut st = self.lock()?;
        let key = st.next_event;
        let gpu: GpuEvent = match &mut st.backend {
            Backend::Sim(b) => {
                b.create_event(key);
                Default::default()
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => Some(b.new_event()?),
        };
        let id = st.fresh_name(EVENTS, "e");
        st.next_event += 1;
        st.record(Rec::EventCreate {
            key,
            id: id.clone(),
            site: Some(site),
        });
        Ok(Event {
            shared: self.clone(),
            key,
            id,
            cuda: gpu,
        })
    }

    pub(crate) fn drop_event(&self, key: u32) {
        let Some(mut st) = self.lock_for_drop() else {
            return;
        };
        match &mut st.backend {
            Backend::Sim(b) => b.destroy_event(key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => {}
        }
        st.record(Rec::EventDestroy { key });
    }

    pub(crate) fn alloc(
        &self,
        memory: MemoryKind,
        stream: Option<&Stream>,
        name: Option<&str>,
        bytes: u64,
        site: &'static Location<'static>,
    ) -> Result<(Region, Id), SessionError> {
        if let Some(s) = stream {
            self.same(&s.inner.shared)?;
        }
        let mut st = self.lock()?;
        let id = st.buffer_name(name, memory)?;
        let skey = stream.map_or(0, |s| s.inner.key);
        let block: Option<Block> = match &mut st.backend {
            Backend::Sim(b) => match memory {
                MemoryKind::Device => b.alloc_device(bytes, skey),
                _ => b.alloc_pinned(bytes),
            }
            .map_err(|e| alloc_error(e, bytes, memory))?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => match memory {
                MemoryKind::Device => b.alloc_device(bytes, skey)?,
                _ => b.alloc_pinned(bytes)?,
            }
            .map_err(|e| alloc_error(e, bytes, memory))?,
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
            },
        );
        st.live_names.insert(id.clone());
        st.used_names.insert(id.clone());
        let addr = block.map(|b| b.addr);
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

    pub(crate) fn external(
        &self,
        name: &str,
        device_ptr: u64,
        bytes: u64,
    ) -> Result<Region, SessionError> {
        let mut st = self.lock()?;
        let id = Id::from(name);
        if name.is_empty() || st.used_names.contains(&id) {
            return Err(SessionError::InvalidArgument(format!(
                "{name:?} cannot name an external buffer: empty, or already a buffer's name"
            )));
        }
        if device_ptr % 4 != 0 || bytes % 4 != 0 || device_ptr.checked_add(bytes).is_none() {
            return Err(SessionError::InvalidArgument(format!(
                "an external region is whole 4-byte words below 2^64, not {bytes} bytes at {device_ptr:#x}"
            )));
        }
        let key = st.next_buffer;
        st.next_buffer += 1;
        st.used_names.insert(id.clone());
        st.external_names.insert(id.clone());
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

    pub(crate) fn free(
        &self,
        region: &Region,
        to: Option<&Stream>,
        site: Loc,
    ) -> Result<(), SessionError> {
        if let Some(s) = to {
            self.same(&s.inner.shared)?;
        }
        let mut st = self.lock()?;
        st.free(region, to.map(|s| &*s.inner), site)
    }

    /// The caching free of a dropped buffer: never panics; an error is parked.
    pub(crate) fn drop_free(&self, region: &Region) {
        let Some(mut st) = self.lock_for_drop() else {
            tracing::warn!(
                "a buffer dropped inside a callback of its own session is leaked (not freed)"
            );
            return;
        };
        if let Err(e) = st.free(region, None, None) {
            st.park(e);
        }
    }

    pub(crate) fn record_stream(
        &self,
        region: &Region,
        stream: &Stream,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same_region(region)?;
        self.same(&stream.inner.shared)?;
        let mut st = self.lock()?;
        let key = stream.inner.key;
        if let Some(live) = st.live.get_mut(&region.key) {
            if live.owner != Some(key) && !live.fences.iter().any(|f| f.key == key) {
                live.fences.push(Fence {
                    key,
                    gpu: stream.inner.cuda.clone(),
                });
            }
        }
        st.record(Rec::RecordStream {
            key: region.key,
            stream: key,
            site: Some(site),
        });
        Ok(())
    }

    fn check_launch(&self, l: &Launch<'_>) -> Result<(), SessionError> {
        self.same(&l.stream.inner.shared)?;
        for r in l.reads.iter().chain(l.writes.iter()) {
            self.same_region(r)?;
        }
        Ok(())
    }

    pub(crate) fn launch_hash(&self, l: Launch<'_>) -> Result<u64, SessionError> {
        self.check_launch(&l)?;
        if l.reads.len() > MAX_READS {
            return Err(SessionError::InvalidArgument(format!(
                "the hash kernel reads at most {MAX_READS} regions, not {} (launch {:?})",
                l.reads.len(),
                l.name
            )));
        }
        let mut st = self.lock()?;
        let op = st.next_op;
        let s = &*l.stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.hash(s.key, op as u32, &l.reads, &l.writes, l.spin_ns > 0)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => {
                b.hash(gpu_stream(s)?, op as u32, &l.reads, &l.writes, l.spin_ns)?
            }
        }
        st.record_launch(s.key, l.name, l.reads.iter(), l.writes.iter(), Some(l.site));
        Ok(op)
    }

    pub(crate) fn launch_run(
        &self,
        l: Launch<'_>,
        f: &mut KernelFn<'_>,
    ) -> Result<u64, SessionError> {
        self.check_launch(&l)?;
        let mut st = self.lock()?;
        let op = st.next_op;
        let s = &*l.stream.inner;
        let reads = l.reads.to_vec();
        let writes = l.writes.to_vec();
        let result = match &mut st.backend {
            Backend::Sim(b) => {
                b.run_now(s.key);
                let raw = RawLaunch {
                    op,
                    reads: &reads,
                    writes: &writes,
                    target: RawTarget::Sim(RefCell::new(b)),
                };
                guarded_callback(self.session, || f(&raw))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => {
                let stream = gpu_stream(s)?;
                b.spin(stream, l.spin_ns)?;
                let raw = RawLaunch {
                    op,
                    reads: &reads,
                    writes: &writes,
                    target: RawTarget::Cuda {
                        stream,
                        gpu: b.gpu(),
                    },
                };
                guarded_callback(self.session, || f(&raw))
            }
        };
        // Recorded even if the closure failed: it may have enqueued work before failing.
        st.record_launch(s.key, l.name, l.reads.iter(), l.writes.iter(), Some(l.site));
        result.map_err(SessionError::Launch)?;
        Ok(op)
    }

    pub(crate) fn copy(
        &self,
        stream: &Stream,
        src: Region,
        dst: Region,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&src)?;
        self.same_region(&dst)?;
        if src.bytes != dst.bytes {
            return Err(SessionError::InvalidArgument(format!(
                "copy of {} bytes into {} bytes",
                src.bytes, dst.bytes
            )));
        }
        if src.overlaps(&dst) {
            return Err(SessionError::InvalidArgument(
                "copy source and destination overlap".into(),
            ));
        }
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.copy(s.key, &src, &dst)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.copy(gpu_stream(s)?, &src, &dst)?,
        }
        st.record_copy(s.key, &src, &dst, Some(site));
        Ok(())
    }

    pub(crate) fn memset(
        &self,
        stream: &Stream,
        dst: Region,
        value: u32,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&dst)?;
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.memset(s.key, &dst, value)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.memset(gpu_stream(s)?, &dst, value)?,
        }
        st.record(Rec::Memset {
            stream: s.key,
            dst: (&dst).into(),
            site: Some(site),
        });
        Ok(())
    }

    /// Records a pageable copy as a launch on `stream` followed by a stream sync.
    fn record_pageable_copy(
        st: &mut State,
        stream: u32,
        name: &'static str,
        region: Region,
        write: bool,
        site: &'static Location<'static>,
    ) {
        let one = [region];
        let (reads, writes): (&[Region], &[Region]) = if write { (&[], &one) } else { (&one, &[]) };
        st.record_launch(stream, name.into(), reads, writes, Some(site));
        st.record(Rec::StreamSync {
            stream,
            site: Some(site),
        });
    }

    pub(crate) fn memcpy_htod(
        &self,
        stream: &Stream,
        words: &[u32],
        dst: Region,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&dst)?;
        if words.len() as u64 != dst.words() {
            return Err(SessionError::InvalidArgument(format!(
                "copying {} elements into a region of {}",
                words.len(),
                dst.words()
            )));
        }
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => {
                b.check(&dst, "memcpy_htod")?;
                b.run_now(s.key);
                b.write(&dst, words)?;
                b.stream_sync(s.key);
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.write_through(gpu_stream(s)?, &dst, words)?,
        }
        Self::record_pageable_copy(&mut st, s.key, "memcpy_htod", dst, true, site);
        Ok(())
    }

    pub(crate) fn memcpy_dtov(
        &self,
        stream: &Stream,
        src: Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u32>, SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&src)?;
        let mut st = self.lock()?;
        let s = &*stream.inner;
        let words = match &mut st.backend {
            Backend::Sim(b) => {
                b.check(&src, "memcpy_dtov")?;
                b.run_now(s.key);
                let words = b.read(&src)?;
                b.stream_sync(s.key);
                words
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.read_through(gpu_stream(s)?, &src)?,
        };
        Self::record_pageable_copy(&mut st, s.key, "memcpy_dtov", src, false, site);
        Ok(words)
    }

    fn check_host(r: &Region) -> Result<(), SessionError> {
        if r.memory == MemoryKind::Device || r.external {
            return Err(SessionError::InvalidArgument(
                "the host can only touch pinned memory".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn host_read(
        &self,
        region: &Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u32>, SessionError> {
        self.same_region(region)?;
        Self::check_host(region)?;
        let mut st = self.lock()?;
        let words = match &mut st.backend {
            Backend::Sim(b) => b.read(region)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.host_read(region)?,
        };
        st.record(Rec::HostRead {
            region: region.into(),
            site: Some(site),
        });
        Ok(words)
    }

    pub(crate) fn host_write_with(
        &self,
        region: &Region,
        f: &mut dyn FnMut(&mut [u32]),
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same_region(region)?;
        Self::check_host(region)?;
        let mut st = self.lock()?;
        match &mut st.backend {
            Backend::Sim(b) => {
                let mut words = b.read(region)?;
                guarded_callback(self.session, || f(&mut words));
                b.write(region, &words)?;
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => {
                let mut words = b.host_read(region)?;
                guarded_callback(self.session, || f(&mut words));
                b.host_write(region, &words)?;
            }
        }
        st.record(Rec::HostWrite {
            region: region.into(),
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn event_record(
        &self,
        event: &Event,
        stream: &Stream,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&stream.inner.shared)?;
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.event_record(event.key, s.key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => gpu_event(event)?.record(gpu_stream(s)?)?,
        }
        st.record(Rec::EventRecord {
            event: event.key,
            stream: s.key,
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn event_wait(
        &self,
        stream: &Stream,
        event: &Event,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&event.shared)?;
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.event_wait(s.key, event.key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => gpu_stream(s)?.wait(gpu_event(event)?)?,
        }
        st.record(Rec::EventWait {
            stream: s.key,
            event: event.key,
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn event_sync(
        &self,
        event: &Event,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let mut st = self.lock()?;
        match &mut st.backend {
            Backend::Sim(b) => b.event_sync(event.key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => gpu_event(event)?.synchronize()?,
        }
        st.record(Rec::EventSync {
            event: event.key,
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn event_query(
        &self,
        event: &Event,
        site: &'static Location<'static>,
    ) -> Result<bool, SessionError> {
        let mut st = self.lock()?;
        let complete = match &mut st.backend {
            Backend::Sim(b) => b.event_query(event.key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => gpu_event(event)?.query()?,
        };
        st.record(Rec::EventQuery {
            event: event.key,
            complete,
            site: Some(site),
        });
        Ok(complete)
    }

    pub(crate) fn stream_sync(
        &self,
        stream: &Stream,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.stream_sync(s.key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => gpu_stream(s)?.synchronize()?,
        }
        st.record(Rec::StreamSync {
            stream: s.key,
            site: Some(site),
        });
        Ok(())
    }

    pub(crate) fn stream_query(
        &self,
        stream: &Stream,
        site: &'static Location<'static>,
    ) -> Result<bool, SessionError> {
        let mut st = self.lock()?;
        let s = &*stream.inner;
        let complete = match &mut st.backend {
            Backend::Sim(b) => b.stream_query(s.key),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => gpu_stream(s)?.query()?,
        };
        st.record(Rec::StreamQuery {
            stream: s.key,
            complete,
            site: Some(site),
        });
        Ok(complete)
    }

    pub(crate) fn device_sync(&self, site: &'static Location<'static>) -> Result<(), SessionError> {
        let mut st = self.lock()?;
        match &mut st.backend {
            Backend::Sim(b) => b.device_sync(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.device_sync()?,
        }
        st.record(Rec::DeviceSync { site: Some(site) });
        Ok(())
    }

    pub(crate) fn ops(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_op
    }

    pub(crate) fn device_memory_stats(&self) -> Result<AllocatorStats, SessionError> {
        let st = self.lock()?;
        Ok(match &st.backend {
            Backend::Sim(b) => b.stats(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.stats(),
        })
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
