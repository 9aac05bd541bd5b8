//! CUDA graphs in the session core: captures, graph memory pools and replays (the trace format's
//! "CUDA graphs").
//!
//! # Capture
//!
//! [`Core::graph_begin`] makes a stream the *origin* of a capture; a stream *joins* it when it
//! waits on an event whose latest record was captured in it. Stream ops issued on a capturing
//! stream (launches, copies, memsets, event records and waits) are recorded as usual — the
//! checker sees that their stream is capturing and makes them the graph's body — and run
//! nothing now:
//!
//! - on a GPU ([`Backend::captures`]) they go to the backend, whose stream is capturing
//!   (`cuStreamBeginCapture`): CUDA records them;
//! - on the simulator they are not issued: the core keeps them as the graph's body, with their
//!   memory resolved to spans, and a replay issues them again (see Replay).
//!
//! The calls CUDA rejects during a capture (the trace format's bad input) fail with
//! [`SessionError::Capture`] before anything is issued or recorded, so the trace stays one the
//! checker accepts. One rule is left to the driver and the checker: ending a capture while a
//! joined stream has work the origin does not wait for (on a GPU `cuStreamEndCapture` fails; on
//! the simulator the checker rejects the op, and [`Session::finish`](crate::Session::finish)
//! returns that error).
//!
//! # Pools
//!
//! Device memory allocated on a capturing stream comes from the capture's pool: a
//! [`DeviceCachingAllocator`] of its own per pool, whose segments are fresh device memory the
//! backend's own allocator never hands out ([`Backend::map_device_segment`]). Graphs that name the
//! same pool share its memory; a freed pool buffer's block goes back to its pool only, and a
//! block freed with `record_stream` streams while a capture of its pool is underway is held back
//! until the capture ends (as PyTorch defers such frees). Pool memory stays mapped until the
//! session ends: a replay may touch it at any time.
//!
//! # Replay
//!
//! [`Core::graph_launch`] records a `graph_launch`. On a GPU it is `cuGraphLaunch` of the
//! executable graph on the launch's stream, whichever stream captured it. On the simulator the
//! body is issued again on the launch's stream, in body order, each op with the hash-kernel id of
//! its capture (so a replay writes the same words on both backends): one schedule CUDA may
//! produce, with the replay as a unit on that stream. A launch of the graph on another stream
//! than its previous launch first waits for that launch (an internal event, not recorded):
//! launches of one graph are ordered, as in CUDA.

use std::collections::{HashMap, HashSet};

use smallvec::SmallVec;

use super::error::SessionError;
use super::record::{GraphBeginRec, Loc, Rec};
use super::{Core, State, StreamRef};
use crate::alloc::{DeviceCachingAllocator, Memory};
use crate::exec::{Backend, Fence, Fill, Kernel, Op, Span};
use crate::trace::Id;

/// A graph of a session, by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GraphRef {
    pub(crate) session: u64,
    pub(crate) key: u32,
}

/// A graph memory pool of a session, by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolRef {
    pub(crate) session: u64,
    pub(crate) key: u32,
}

/// A captured op the simulator replays: its hash-kernel id (the op index of its capture) and
/// its memory.
#[derive(Debug)]
enum BodyOp {
    Launch {
        index: u64,
        spin_ns: u64,
        reads: SmallVec<[Span; 4]>,
        writes: SmallVec<[Span; 4]>,
    },
    Copy {
        index: u64,
        src: Span,
        dst: Span,
    },
    Memset {
        index: u64,
        dst: Span,
        fill: Fill,
    },
}

/// A graph of the session.
#[derive(Debug)]
struct GraphState {
    id: Id,
    origin: u32,
    pool: u32,
    /// Whether its capture ended.
    ended: bool,
    /// The body, on a backend that does not capture.
    body: Vec<BodyOp>,
    /// Its latest launch on a backend that does not capture: the stream and the internal event
    /// recorded after it.
    last: Option<(u32, u32)>,
    /// The internal event of its launches, once made.
    event: Option<u32>,
}

/// A segment the pool allocator asks for, which the core maps from the backend and hands over.
#[derive(Debug, thiserror::Error)]
#[error("a graph pool segment of {0} bytes is needed")]
struct NeedSegment(u64);

/// The memory of a pool: the segment mapped for the allocator's next request.
#[derive(Debug, Default)]
struct PoolSegments {
    ready: Option<(u64, u64)>,
}

impl Memory for PoolSegments {
    type Error = NeedSegment;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, NeedSegment> {
        match self.ready.take() {
            Some((n, base)) if n == bytes => Ok(base),
            ready => {
                self.ready = ready;
                Err(NeedSegment(bytes))
            }
        }
    }
}

/// A graph memory pool.
#[derive(Debug)]
struct PoolArena {
    id: Id,
    alloc: DeviceCachingAllocator<PoolSegments>,
    /// Captures of the pool underway.
    capturing: u32,
    /// Blocks freed with `record_stream` streams during a capture: (address, stream).
    held: Vec<(u64, u32)>,
    /// Blocks freed with `record_stream` streams outside a capture, back in the pool once the
    /// work of those streams up to the free is done: (address, stream, fences).
    pending: Vec<(u64, u32, Vec<Fence>)>,
}

/// What the core keeps of graphs: see the [module docs](self).
#[derive(Debug, Default)]
pub(super) struct Graphs {
    graphs: Vec<GraphState>,
    pools: Vec<PoolArena>,
    /// Capturing streams: stream → graph.
    capturing: HashMap<u32, u32>,
    /// Events whose latest record was captured in a capture underway: event → graph.
    captured_events: HashMap<u32, u32>,
    /// Events whose latest record ran (outside any capture).
    recorded: HashSet<u32>,
    /// The blocking streams.
    blocking: HashSet<u32>,
}

impl Graphs {
    /// The capture `stream` is in.
    pub(super) fn capture_of(&self, stream: u32) -> Option<u32> {
        self.capturing.get(&stream).copied()
    }

    /// Whether the latest record of `event` was captured in a capture underway.
    pub(super) fn is_captured_event(&self, event: u32) -> bool {
        self.captured_events.contains_key(&event)
    }

    /// Whether any capture is underway.
    pub(super) fn any_capture(&self) -> bool {
        !self.capturing.is_empty()
    }

    /// A stream is created (`blocking`: of kind blocking).
    pub(super) fn stream_created(&mut self, stream: u32, blocking: bool) {
        if blocking {
            self.blocking.insert(stream);
        }
    }

    /// An op on `stream` (the legacy default stream is not allowed while a blocking stream
    /// captures).
    pub(super) fn check_stream(&self, stream: u32) -> Result<(), SessionError> {
        if stream == 0 && self.capturing.keys().any(|s| self.blocking.contains(s)) {
            return Err(SessionError::Capture(
                "an op on the legacy default stream while a blocking stream is capturing".into(),
            ));
        }
        Ok(())
    }

    /// The capture `stream` is in, for a host sync or query of it (rejected).
    pub(super) fn check_stream_sync(&self, stream: u32, what: &str) -> Result<(), SessionError> {
        if self.capturing.contains_key(&stream) {
            return Err(SessionError::Capture(format!(
                "{what} of a capturing stream"
            )));
        }
        if stream == 0 && self.any_capture() {
            // A sync of the legacy default stream waits for the blocking streams too.
            self.check_stream(0)?;
        }
        Ok(())
    }

    /// A host sync or query of `event` (rejected for a captured event).
    pub(super) fn check_event_sync(&self, event: u32, what: &str) -> Result<(), SessionError> {
        if self.captured_events.contains_key(&event) {
            return Err(SessionError::Capture(format!(
                "{what} of an event recorded in a capture"
            )));
        }
        Ok(())
    }

    /// A `device_sync` (rejected during a capture).
    pub(super) fn check_device_sync(&self) -> Result<(), SessionError> {
        if self.any_capture() {
            return Err(SessionError::Capture(
                "a device synchronization while a capture is underway".into(),
            ));
        }
        Ok(())
    }

    /// An `event_record` of `event` on `stream`, before it is issued: nothing to reject.
    pub(super) fn event_recorded(&mut self, event: u32, stream: u32) {
        match self.capture_of(stream) {
            Some(g) => {
                self.captured_events.insert(event, g);
                self.recorded.remove(&event);
            }
            None => {
                self.captured_events.remove(&event);
                self.recorded.insert(event);
            }
        }
    }

    /// What an `event_wait` of `stream` on `event` is: `Ok(true)` when it is captured (or joins
    /// `stream` to a capture), `Ok(false)` when it runs.
    pub(super) fn event_wait(&mut self, stream: u32, event: u32) -> Result<bool, SessionError> {
        let of_event = self.captured_events.get(&event).copied();
        match (self.capture_of(stream), of_event) {
            (Some(g), Some(h)) if g == h => Ok(true),
            (Some(_), Some(_)) => Err(SessionError::Capture(
                "a capturing stream waits on an event recorded in another capture".into(),
            )),
            (Some(_), None) if self.recorded.contains(&event) => Err(SessionError::Capture(
                "a capturing stream waits on an event recorded outside the capture".into(),
            )),
            // An event never recorded: the wait has no effect.
            (Some(_), None) => Ok(true),
            (None, Some(_)) if stream == 0 => Err(SessionError::Capture(
                "the legacy default stream cannot join a capture".into(),
            )),
            (None, Some(g)) => {
                self.capturing.insert(stream, g);
                Ok(true)
            }
            (None, None) => Ok(false),
        }
    }
}

impl State {
    /// Issues a stream op, or keeps it as a captured op: on a capturing stream of a backend that
    /// does not capture, the op joins its graph's body and runs nothing now. `stream` is the op's
    /// stream.
    pub(super) fn issue_stream_op(
        &mut self,
        index: u64,
        stream: u32,
        op: Op<'_>,
    ) -> Result<(), SessionError> {
        self.graphs.check_stream(stream)?;
        let Some(g) = self.graphs.capture_of(stream) else {
            self.backend.issue(index, op)?;
            return Ok(());
        };
        if self.backend.captures() {
            self.backend.issue(index, op)?;
            return Ok(());
        }
        let body = match op {
            Op::Launch {
                kernel,
                reads,
                writes,
                ..
            } => {
                let spin_ns = match kernel {
                    Kernel::Hash { spin_ns, .. } => spin_ns,
                    Kernel::Standin { .. } => 0,
                    #[cfg(feature = "cuda")]
                    Kernel::User { .. } => {
                        return Err(SessionError::InvalidArgument(
                            "a GPU kernel on the simulator".into(),
                        ))
                    }
                };
                BodyOp::Launch {
                    index,
                    spin_ns,
                    reads: (0..reads.count()).map(|i| reads.span(i)).collect(),
                    writes: (0..writes.count()).map(|i| writes.span(i)).collect(),
                }
            }
            Op::Copy { src, dst, .. } => BodyOp::Copy { index, src, dst },
            Op::Memset { dst, fill, .. } => BodyOp::Memset { index, dst, fill },
            // Event records and waits of a body order nothing in a replay on one stream.
            _ => return Ok(()),
        };
        self.graphs.graphs[g as usize].body.push(body);
        Ok(())
    }

    /// Whether an allocation owned by `stream` comes from a graph pool: its pool.
    pub(super) fn alloc_pool(&self, stream: u32) -> Option<u32> {
        let g = self.graphs.capture_of(stream)?;
        Some(self.graphs.graphs[g as usize].pool)
    }

    /// Allocates `bytes` for `stream` from pool `pool`, mapping segments from the backend.
    pub(super) fn pool_alloc(
        &mut self,
        pool: u32,
        bytes: u64,
        stream: u32,
    ) -> Result<Option<u64>, SessionError> {
        let arena = &mut self.graphs.pools[pool as usize];
        // Blocks whose record_stream work is done are free again.
        let backend = &self.backend;
        let mut k = 0;
        while k < arena.pending.len() {
            if arena.pending[k].2.iter().all(|&f| backend.fence_done(f)) {
                let (addr, s, _) = arena.pending.swap_remove(k);
                // A pending block is a live block of this pool: returning it cannot fail.
                let _ = arena.alloc.free(addr, s);
            } else {
                k += 1;
            }
        }
        loop {
            match arena.alloc.allocate(bytes, stream) {
                Ok(block) => return Ok(block.map(|b| b.addr)),
                Err(crate::alloc::AllocError::Map {
                    source: NeedSegment(n),
                    ..
                }) => {
                    let base = self.backend.map_device_segment(n)?;
                    arena.alloc.memory_mut().ready = Some((n, base));
                }
                Err(e) => {
                    return Err(crate::exec::ExecError::alloc(
                        e,
                        bytes,
                        crate::trace::MemoryKind::Device,
                    )
                    .into())
                }
            }
        }
    }

    /// Returns the block at `addr` to pool `pool` as a free block of `stream`. With
    /// `record_streams`: during a capture of the pool, once no capture of it is underway (the
    /// block is not handed out again within the capture); otherwise once those streams' work up
    /// to now is done (as PyTorch defers such frees with events).
    pub(super) fn pool_free(
        &mut self,
        pool: u32,
        addr: u64,
        stream: u32,
        record_streams: &[u32],
    ) -> Result<(), SessionError> {
        let arena = &self.graphs.pools[pool as usize];
        if !record_streams.is_empty() && arena.capturing > 0 {
            self.graphs.pools[pool as usize].held.push((addr, stream));
            return Ok(());
        }
        let mut fences = Vec::new();
        for &s in record_streams {
            // Captured work runs nothing now: a capturing stream has nothing to wait for.
            if self.graphs.capture_of(s).is_none() {
                if let Some(f) = self.backend.fence(s)? {
                    fences.push(f);
                }
            }
        }
        let arena = &mut self.graphs.pools[pool as usize];
        if arena.alloc.block(addr).is_none_or(|b| !b.allocated) {
            return Err(SessionError::InvalidArgument(
                "freeing a pool buffer that is not live".into(),
            ));
        }
        if !fences.is_empty() {
            arena.pending.push((addr, stream, fences));
            return Ok(());
        }
        arena
            .alloc
            .free(addr, stream)
            .map_err(|e| SessionError::InvalidArgument(format!("freeing a pool buffer: {e}")))
    }

    /// Whether `stream` is capturing.
    pub(super) fn is_capturing(&self, stream: u32) -> bool {
        self.graphs.capture_of(stream).is_some()
    }

    fn new_pool(&mut self, id: Id) -> u32 {
        self.graphs.pools.push(PoolArena {
            id,
            alloc: DeviceCachingAllocator::new(PoolSegments::default()),
            capturing: 0,
            held: Vec::new(),
            pending: Vec::new(),
        });
        self.graphs.pools.len() as u32 - 1
    }
}

impl Core {
    /// Whether a graph is of this session.
    fn graph(&self, g: GraphRef) -> Result<u32, SessionError> {
        if g.session == self.session {
            Ok(g.key)
        } else {
            Err(SessionError::WrongSession)
        }
    }

    /// A new graph memory pool, named `pool1`, `pool2`, … (PyTorch's `graph_pool_handle()`).
    pub(crate) fn graph_pool(&self) -> Result<(PoolRef, Id), SessionError> {
        let mut st = self.lock()?;
        let n = st
            .graphs
            .pools
            .iter()
            .filter(|p| p.id.as_str().starts_with("pool"))
            .count();
        let mut k = n + 1;
        let id = loop {
            let id = Id::from(format!("pool{k}"));
            if !st.graphs.pools.iter().any(|p| p.id == id)
                && !st.graphs.graphs.iter().any(|g| g.id == id)
            {
                break id;
            }
            k += 1;
        };
        let key = st.new_pool(id.clone());
        Ok((
            PoolRef {
                session: self.session,
                key,
            },
            id,
        ))
    }

    /// Starts capturing graph `g1`, `g2`, … on `stream`, its origin; its allocations come from
    /// `pool`, or from a private pool named after the graph. Returns the graph's key, its name
    /// and its pool's key and name.
    pub(crate) fn graph_begin(
        &self,
        stream: StreamRef,
        pool: Option<PoolRef>,
        site: Loc,
    ) -> Result<(GraphRef, Id, PoolRef, Id), SessionError> {
        let s = self.stream(stream)?;
        if let Some(p) = pool {
            if p.session != self.session {
                return Err(SessionError::WrongSession);
            }
        }
        let mut st = self.lock()?;
        if s == 0 {
            return Err(SessionError::Capture(
                "the legacy default stream cannot capture".into(),
            ));
        }
        if st.is_capturing(s) {
            return Err(SessionError::Capture(
                "the stream is capturing already".into(),
            ));
        }
        let key = st.graphs.graphs.len() as u32;
        let mut k = key + 1;
        let id = loop {
            let id = Id::from(format!("g{k}"));
            if !st.graphs.pools.iter().any(|p| p.id == id) {
                break id;
            }
            k += 1;
        };
        if st.backend.captures() {
            st.backend.graph_begin(s)?;
        }
        let (pool_key, pool_field) = match pool {
            Some(p) => (p.key, Some(st.graphs.pools[p.key as usize].id.clone())),
            None => (st.new_pool(id.clone()), None),
        };
        let pool_id = st.graphs.pools[pool_key as usize].id.clone();
        st.graphs.pools[pool_key as usize].capturing += 1;
        st.graphs.graphs.push(GraphState {
            id: id.clone(),
            origin: s,
            pool: pool_key,
            ended: false,
            body: Vec::new(),
            last: None,
            event: None,
        });
        st.graphs.capturing.insert(s, key);
        st.record(Rec::GraphBegin(Box::new(GraphBeginRec {
            key,
            id: id.clone(),
            stream: s,
            pool: pool_field,
            site,
        })));
        Ok((
            GraphRef {
                session: self.session,
                key,
            },
            id,
            PoolRef {
                session: self.session,
                key: pool_key,
            },
            pool_id,
        ))
    }

    /// Ends the capture whose origin is `stream`. Returns its graph, its name and its pool's
    /// key and name.
    pub(crate) fn graph_end(
        &self,
        stream: StreamRef,
        site: Loc,
    ) -> Result<(GraphRef, Id, PoolRef, Id), SessionError> {
        let s = self.stream(stream)?;
        let mut st = self.lock()?;
        let g = match st.graphs.capture_of(s) {
            Some(g) if st.graphs.graphs[g as usize].origin == s => g,
            Some(_) => {
                return Err(SessionError::Capture(
                    "a capture is ended on its origin, not on a stream that joined it".into(),
                ))
            }
            None => {
                return Err(SessionError::InvalidArgument(
                    "the stream is not capturing".into(),
                ))
            }
        };
        // The capture ends whatever the driver says: CUDA invalidates a capture it rejects.
        let ended = if st.backend.captures() {
            st.backend.graph_end(g, s)
        } else {
            Ok(())
        };
        st.graphs.capturing.retain(|_, h| *h != g);
        st.graphs.captured_events.retain(|_, h| *h != g);
        let pool = st.graphs.graphs[g as usize].pool as usize;
        let arena = &mut st.graphs.pools[pool];
        arena.capturing = arena.capturing.saturating_sub(1);
        if arena.capturing == 0 {
            for (addr, stream) in std::mem::take(&mut arena.held) {
                // Held blocks are live blocks of this pool: returning them cannot fail.
                let _ = arena.alloc.free(addr, stream);
            }
        }
        ended?;
        st.graphs.graphs[g as usize].ended = true;
        st.record(Rec::GraphEnd { key: g, site });
        let id = st.graphs.graphs[g as usize].id.clone();
        let pool_id = st.graphs.pools[pool].id.clone();
        Ok((
            GraphRef {
                session: self.session,
                key: g,
            },
            id,
            PoolRef {
                session: self.session,
                key: pool as u32,
            },
            pool_id,
        ))
    }

    /// Replays `graph` on `stream`.
    pub(crate) fn graph_launch(
        &self,
        graph: GraphRef,
        stream: StreamRef,
        site: Loc,
    ) -> Result<(), SessionError> {
        let g = self.graph(graph)?;
        let s = self.stream(stream)?;
        let mut st = self.lock()?;
        st.graphs.check_stream(s)?;
        if st.is_capturing(s) {
            return Err(SessionError::Capture(
                "a graph is launched on a capturing stream".into(),
            ));
        }
        if !st.graphs.graphs[g as usize].ended {
            return Err(SessionError::InvalidArgument(
                "the graph's capture has not ended".into(),
            ));
        }
        if st.backend.captures() {
            st.backend.graph_launch(g, s)?;
        } else if st.backend.runs_work() {
            st.replay(g, s)?;
        }
        st.record(Rec::GraphLaunch {
            key: g,
            stream: s,
            site,
        });
        Ok(())
    }

    /// Forgets a dropped graph: never panics.
    pub(crate) fn drop_graph(&self, graph: GraphRef) {
        if let Some(mut st) = self.lock_for_drop() {
            st.backend.graph_destroy(graph.key);
            if let Some(g) = st.graphs.graphs.get_mut(graph.key as usize) {
                g.body = Vec::new();
            }
        }
    }

    /// Whether `stream` is capturing.
    pub(crate) fn is_capturing(&self, stream: StreamRef) -> bool {
        let st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.is_capturing(stream.key)
    }
}

impl State {
    /// Replays graph `g`'s body on stream `s` (a backend that does not capture).
    fn replay(&mut self, g: u32, s: u32) -> Result<(), SessionError> {
        let graph = &self.graphs.graphs[g as usize];
        let last = graph.last;
        let event = match graph.event {
            Some(e) => e,
            None => {
                let e = self.next_event;
                self.next_event += 1;
                let op = self.next_op;
                self.backend.issue(op, Op::EventCreate { event: e })?;
                self.graphs.graphs[g as usize].event = Some(e);
                e
            }
        };
        let op = self.next_op;
        if let Some((prev, e)) = last {
            if prev != s {
                // Launches of one graph are ordered, on whichever streams.
                self.backend.issue(
                    op,
                    Op::EventWait {
                        stream: s,
                        event: e,
                    },
                )?;
            }
        }
        let body = std::mem::take(&mut self.graphs.graphs[g as usize].body);
        let mut result: Result<(), SessionError> = Ok(());
        for b in &body {
            let issued = match b {
                BodyOp::Launch {
                    index,
                    spin_ns,
                    reads,
                    writes,
                } => self.backend.issue(
                    *index,
                    Op::Launch {
                        stream: s,
                        kernel: Kernel::Hash {
                            id: *index as u32,
                            spin_ns: *spin_ns,
                        },
                        reads: &reads.as_slice(),
                        writes: &writes.as_slice(),
                        fences: &[],
                    },
                ),
                BodyOp::Copy { index, src, dst } => self.backend.issue(
                    *index,
                    Op::Copy {
                        stream: s,
                        src: *src,
                        dst: *dst,
                        fences: &[],
                    },
                ),
                BodyOp::Memset { index, dst, fill } => self.backend.issue(
                    *index,
                    Op::Memset {
                        stream: s,
                        dst: *dst,
                        fill: *fill,
                        fences: &[],
                    },
                ),
            };
            if let Err(e) = issued {
                result = Err(e.into());
                break;
            }
        }
        self.graphs.graphs[g as usize].body = body;
        result?;
        self.backend
            .issue(op, Op::EventRecord { event, stream: s })?;
        self.graphs.graphs[g as usize].last = Some((s, event));
        Ok(())
    }
}
