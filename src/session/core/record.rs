//! Recording: the calling thread appends compact records to a batch; a checker thread turns them
//! into trace ops, checks them and keeps the trace.
//!
//! A record names streams, events and buffers by dense keys and its site by a `&'static
//! Location`, so recording an op allocates nothing (but the box of an allocation's record): ids
//! are sent once, with the op that creates the thing they name, and sites are formatted on the
//! checker thread. The regions of a launch or a copy go to a flat side buffer of 32-byte entries
//! and an allocation's record is boxed, so a record fits in a cache line (64 bytes): records
//! cross to the checker thread's core, and their size is most of what recording costs the
//! calling thread. Records go over in batches of [`BATCH`], whose buffers come back to be
//! reused, so the checker works beside the program instead of inside each call. Every record but [`Rec::External`] is
//! exactly one op, in issue order: the op indices of the checker are the session's.

use crate::sync::mpsc;
use crate::sync::thread::{self, JoinHandle};
use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::Location;

use super::error::SessionError;
use super::region::Region;
use crate::analysis::run::CheckRun;
use crate::checker::{CheckError, Checker};
use crate::trace::{self, Id, MemoryKind, Op, Site, TraceOp, DEFAULT_STREAM};

/// Where an op was issued, if known (a drop has no call site).
pub(crate) type Loc = Option<&'static Location<'static>>;

/// Records per batch sent to the checker thread.
const BATCH: usize = 256;

/// A region as the checker thread needs it: the buffer's key and the byte range.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RegionRec {
    key: u64,
    offset: u64,
    bytes: u64,
    whole: bool,
}

impl From<&Region> for RegionRec {
    #[inline]
    fn from(r: &Region) -> Self {
        RegionRec {
            key: r.key,
            offset: r.offset,
            bytes: r.bytes,
            whole: r.whole,
        }
    }
}

/// An allocation as recorded.
#[derive(Debug)]
pub(crate) struct AllocRec {
    pub(crate) key: u64,
    pub(crate) id: Id,
    pub(crate) bytes: u64,
    pub(crate) stream: Option<u32>,
    pub(crate) memory: MemoryKind,
    pub(crate) addr: Option<u64>,
    pub(crate) site: Loc,
}

/// A `graph_begin` as recorded.
#[derive(Debug)]
pub(crate) struct GraphBeginRec {
    pub(crate) key: u32,
    pub(crate) id: Id,
    pub(crate) stream: u32,
    /// The pool, when it is not the graph's own.
    pub(crate) pool: Option<Id>,
    pub(crate) site: Loc,
}

/// One recorded op, with keys instead of ids.
#[derive(Debug)]
pub(crate) enum Rec {
    StreamCreate {
        key: u32,
        id: Id,
        blocking: bool,
        site: Loc,
    },
    EventCreate {
        key: u32,
        id: Id,
        site: Loc,
    },
    EventDestroy {
        key: u32,
    },
    /// Boxed: allocations are rare next to launches, and the largest record sets the size of
    /// every record.
    Alloc(Box<AllocRec>),
    Free {
        key: u64,
        stream: Option<u32>,
        site: Loc,
    },
    RecordStream {
        key: u64,
        stream: u32,
        site: Loc,
    },
    /// The launch's `reads` then `writes` regions are the next entries of the batch's regions.
    Launch {
        stream: u32,
        name: Cow<'static, str>,
        reads: u32,
        writes: u32,
        site: Loc,
    },
    /// The copy's source then destination regions are the next entries of the batch's regions.
    Copy {
        stream: u32,
        site: Loc,
    },
    Memset {
        stream: u32,
        dst: RegionRec,
        site: Loc,
    },
    HostRead {
        region: RegionRec,
        site: Loc,
    },
    HostWrite {
        region: RegionRec,
        site: Loc,
    },
    EventRecord {
        event: u32,
        stream: u32,
        site: Loc,
    },
    EventWait {
        stream: u32,
        event: u32,
        site: Loc,
    },
    EventSync {
        event: u32,
        site: Loc,
    },
    EventQuery {
        event: u32,
        complete: bool,
        site: Loc,
    },
    StreamSync {
        stream: u32,
        site: Loc,
    },
    StreamQuery {
        stream: u32,
        complete: bool,
        site: Loc,
    },
    DeviceSync {
        site: Loc,
    },
    /// Boxed, as an allocation.
    GraphBegin(Box<GraphBeginRec>),
    GraphEnd {
        key: u32,
        site: Loc,
    },
    GraphLaunch {
        key: u32,
        stream: u32,
        site: Loc,
    },
    /// Names an external buffer; not an op.
    External {
        key: u64,
        id: Id,
    },
}

impl Rec {
    /// Whether the record is an op (takes an op index).
    pub(crate) fn is_op(&self) -> bool {
        !matches!(self, Rec::External { .. })
    }
}

type Call = Box<dyn FnOnce(&mut Worker) + Send>;

/// Records and the regions of their launches.
#[derive(Default)]
struct Batch {
    recs: Vec<Rec>,
    regions: Vec<RegionRec>,
}

impl Batch {
    fn new() -> Self {
        Batch {
            recs: Vec::with_capacity(BATCH),
            regions: Vec::with_capacity(2 * BATCH),
        }
    }
}

enum Msg {
    Batch(Batch),
    Call(Call),
}

/// The calling thread's end: the current batch and the channel to the checker thread.
pub(crate) struct Recorder {
    batch: Batch,
    tx: mpsc::Sender<Msg>,
    /// Emptied batches coming back, so that batches are allocated (and paged in) once.
    recycled: mpsc::Receiver<Batch>,
    worker: Option<JoinHandle<Worker>>,
}

fn dead() -> SessionError {
    SessionError::Checker("the checker thread stopped".into())
}

impl Recorder {
    /// Starts the checker thread.
    pub(crate) fn spawn(keep_trace: bool, syncs: bool) -> Result<Recorder, SessionError> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let (recycle, recycled) = mpsc::channel::<Batch>();
        let worker = thread::Builder::new()
            .name("streamsan-checker".into())
            .spawn(move || {
                let mut w = Worker::new(keep_trace, syncs);
                for msg in rx {
                    match msg {
                        Msg::Batch(mut batch) => {
                            let mut regions = batch.regions.drain(..);
                            for rec in batch.recs.drain(..) {
                                w.apply(rec, &mut regions);
                            }
                            drop(regions);
                            // The recorder may be gone already; then the batch is just freed.
                            let _ = recycle.send(batch);
                        }
                        Msg::Call(f) => f(&mut w),
                    }
                }
                w
            })
            .map_err(|e| SessionError::Checker(format!("cannot spawn: {e}")))?;
        Ok(Recorder {
            batch: Batch::new(),
            tx,
            recycled,
            worker: Some(worker),
        })
    }

    /// Appends a record; sends the batch when it is full.
    #[inline]
    pub(crate) fn push(&mut self, rec: Rec) {
        self.batch.recs.push(rec);
        if self.batch.recs.len() >= BATCH {
            self.send_batch();
        }
    }

    /// Appends a launch: its regions, then its record.
    #[inline]
    pub(crate) fn push_launch<'r>(
        &mut self,
        stream: u32,
        name: Cow<'static, str>,
        reads: impl IntoIterator<Item = &'r Region>,
        writes: impl IntoIterator<Item = &'r Region>,
        site: Loc,
    ) {
        let regions = &mut self.batch.regions;
        let start = regions.len();
        regions.extend(reads.into_iter().map(RegionRec::from));
        let middle = regions.len();
        regions.extend(writes.into_iter().map(RegionRec::from));
        let end = regions.len();
        self.push(Rec::Launch {
            stream,
            name,
            reads: (middle - start) as u32,
            writes: (end - middle) as u32,
            site,
        });
    }

    /// Appends a copy: its source and destination regions, then its record.
    #[inline]
    pub(crate) fn push_copy(&mut self, stream: u32, src: &Region, dst: &Region, site: Loc) {
        self.batch.regions.push(src.into());
        self.batch.regions.push(dst.into());
        self.push(Rec::Copy { stream, site });
    }

    fn send_batch(&mut self) {
        if !self.batch.recs.is_empty() {
            let next = self.recycled.try_recv().unwrap_or_else(|_| Batch::new());
            let batch = std::mem::replace(&mut self.batch, next);
            // A send fails only if the thread is gone; `call` and `finish` report that.
            let _ = self.tx.send(Msg::Batch(batch));
        }
    }

    /// Runs `f` on the checker thread once it has checked every record pushed so far.
    pub(crate) fn call<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Worker) -> R + Send + 'static,
    ) -> Result<R, SessionError> {
        self.send_batch();
        let (rtx, rrx) = mpsc::sync_channel(1);
        self.tx
            .send(Msg::Call(Box::new(move |w| {
                let _ = rtx.send(f(w));
            })))
            .map_err(|_| dead())?;
        rrx.recv().map_err(|_| dead())
    }

    /// Stops the checker thread once it has checked everything, and returns its state.
    pub(crate) fn finish(mut self) -> Result<Worker, SessionError> {
        self.send_batch();
        let worker = self.worker.take();
        drop(self);
        let Some(handle) = worker else {
            return Err(dead());
        };
        handle.join().map_err(|payload| {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            SessionError::Checker(format!("the checker panicked: {msg}"))
        })
    }
}

/// The checker thread's state.
pub(crate) struct Worker {
    /// The checker, with the synchronization analysis under
    /// [`SessionConfig::syncs`](super::SessionConfig::syncs).
    run: CheckRun,
    pub(crate) trace: Option<Vec<TraceOp>>,
    /// The first op the checker rejected; checking stops there (later op indices would shift).
    pub(crate) error: Option<CheckError>,
    streams: Vec<Id>,
    events: Vec<Id>,
    buffers: Vec<Id>,
    graphs: Vec<Id>,
    sites: HashMap<usize, Site>,
}

fn set<T: Clone>(v: &mut Vec<T>, index: usize, value: T, fill: T) {
    if v.len() <= index {
        v.resize(index + 1, fill);
    }
    v[index] = value;
}

impl Worker {
    fn new(keep_trace: bool, syncs: bool) -> Worker {
        Worker {
            // Without the trace kept, no what-if may be given up: nothing could re-check.
            run: CheckRun::new(syncs, keep_trace),
            trace: keep_trace.then(Vec::new),
            error: None,
            streams: vec![Id::from(DEFAULT_STREAM)],
            events: Vec::new(),
            buffers: Vec::new(),
            graphs: Vec::new(),
            sites: HashMap::new(),
        }
    }

    /// The checker (the real one, with the analysis).
    pub(crate) fn checker(&self) -> &Checker {
        self.run.checker()
    }

    /// Ends the run: the report, with the verdicts on the synchronizations when analysed (the
    /// few the analysis left to a re-check decided by re-checking the kept trace; without it,
    /// or where the re-check fails, they stay provisional).
    pub(crate) fn finish_report(&mut self) -> crate::Report {
        let mut end = std::mem::take(&mut self.run).end();
        let _ = end.recheck(self.trace.as_deref());
        end.into_report()
    }

    fn site(&mut self, loc: Loc) -> Option<Site> {
        let loc = loc?;
        let key = loc as *const Location<'static> as usize;
        Some(
            self.sites
                .entry(key)
                .or_insert_with(|| {
                    Site::Label(format!("{}:{}:{}", loc.file(), loc.line(), loc.column()))
                })
                .clone(),
        )
    }

    fn id(ids: &[Id], key: usize, prefix: &str) -> Id {
        ids.get(key)
            .cloned()
            .unwrap_or_else(|| Id::from(format!("{prefix}#{key}")))
    }

    fn stream(&self, key: u32) -> Id {
        Self::id(&self.streams, key as usize, "stream")
    }

    fn event(&self, key: u32) -> Id {
        Self::id(&self.events, key as usize, "event")
    }

    fn buffer(&self, key: u64) -> Id {
        Self::id(&self.buffers, key as usize, "buffer")
    }

    fn region(&self, r: &RegionRec) -> trace::Region {
        let id = self.buffer(r.key);
        if r.whole {
            trace::Region::whole(id)
        } else {
            trace::Region::range(id, r.offset, r.bytes)
        }
    }

    fn regions(&self, n: u32, from: &mut impl Iterator<Item = RegionRec>) -> Vec<trace::Region> {
        from.take(n as usize).map(|r| self.region(&r)).collect()
    }

    /// Turns a record into a trace op, checks it, and keeps it. A launch takes its regions from
    /// `regions`.
    fn apply(&mut self, rec: Rec, regions: &mut impl Iterator<Item = RegionRec>) {
        let (op, loc) = match rec {
            Rec::External { key, id } => {
                set(&mut self.buffers, key as usize, id, Id::default());
                return;
            }
            Rec::StreamCreate {
                key,
                id,
                blocking,
                site,
            } => {
                set(&mut self.streams, key as usize, id.clone(), Id::default());
                (
                    Op::StreamCreate {
                        stream: id,
                        device: 0,
                        blocking,
                    },
                    site,
                )
            }
            Rec::EventCreate { key, id, site } => {
                set(&mut self.events, key as usize, id.clone(), Id::default());
                (Op::EventCreate { event: id }, site)
            }
            Rec::EventDestroy { key } => (
                Op::EventDestroy {
                    event: self.event(key),
                },
                None,
            ),
            Rec::Alloc(alloc) => {
                let AllocRec {
                    key,
                    id,
                    bytes,
                    stream,
                    memory,
                    addr,
                    site,
                } = *alloc;
                set(&mut self.buffers, key as usize, id.clone(), Id::default());
                (
                    Op::Alloc {
                        buffer: id,
                        bytes,
                        stream: stream.map(|s| self.stream(s)),
                        memory,
                        addr,
                        pool: None,
                    },
                    site,
                )
            }
            Rec::Free { key, stream, site } => (
                Op::Free {
                    buffer: self.buffer(key),
                    stream: stream.map(|s| self.stream(s)),
                },
                site,
            ),
            Rec::RecordStream { key, stream, site } => (
                Op::RecordStream {
                    buffer: self.buffer(key),
                    stream: self.stream(stream),
                },
                site,
            ),
            Rec::Launch {
                stream,
                name,
                reads,
                writes,
                site,
            } => (
                Op::Launch {
                    stream: self.stream(stream),
                    name: Some(name.into()),
                    reads: self.regions(reads, regions),
                    writes: self.regions(writes, regions),
                },
                site,
            ),
            Rec::Copy { stream, site } => (
                Op::Copy {
                    stream: self.stream(stream),
                    src: self.region(&regions.next().unwrap_or_default()),
                    dst: self.region(&regions.next().unwrap_or_default()),
                },
                site,
            ),
            Rec::Memset { stream, dst, site } => (
                Op::Memset {
                    stream: self.stream(stream),
                    dst: self.region(&dst),
                },
                site,
            ),
            Rec::HostRead { region, site } => (
                Op::HostRead {
                    buffer: self.region(&region),
                },
                site,
            ),
            Rec::HostWrite { region, site } => (
                Op::HostWrite {
                    buffer: self.region(&region),
                },
                site,
            ),
            Rec::EventRecord {
                event,
                stream,
                site,
            } => (
                Op::EventRecord {
                    event: self.event(event),
                    stream: self.stream(stream),
                },
                site,
            ),
            Rec::EventWait {
                stream,
                event,
                site,
            } => (
                Op::EventWait {
                    stream: self.stream(stream),
                    event: self.event(event),
                },
                site,
            ),
            Rec::EventSync { event, site } => (
                Op::EventSync {
                    event: self.event(event),
                },
                site,
            ),
            Rec::EventQuery {
                event,
                complete,
                site,
            } => (
                Op::EventQuery {
                    event: self.event(event),
                    complete,
                },
                site,
            ),
            Rec::StreamSync { stream, site } => (
                Op::StreamSync {
                    stream: self.stream(stream),
                },
                site,
            ),
            Rec::StreamQuery {
                stream,
                complete,
                site,
            } => (
                Op::StreamQuery {
                    stream: self.stream(stream),
                    complete,
                },
                site,
            ),
            Rec::DeviceSync { site } => (Op::DeviceSync { device: 0 }, site),
            Rec::GraphBegin(begin) => {
                let GraphBeginRec {
                    key,
                    id,
                    stream,
                    pool,
                    site,
                } = *begin;
                set(&mut self.graphs, key as usize, id.clone(), Id::default());
                (
                    Op::GraphBegin {
                        graph: id,
                        stream: self.stream(stream),
                        pool,
                    },
                    site,
                )
            }
            Rec::GraphEnd { key, site } => (
                Op::GraphEnd {
                    graph: Self::id(&self.graphs, key as usize, "graph"),
                },
                site,
            ),
            Rec::GraphLaunch { key, stream, site } => (
                Op::GraphLaunch {
                    graph: Self::id(&self.graphs, key as usize, "graph"),
                    stream: self.stream(stream),
                },
                site,
            ),
        };
        let op = TraceOp {
            op,
            site: self.site(loc),
        };
        if self.error.is_none() {
            if let Err(e) = self.run.check(&op).map(|_| ()) {
                tracing::error!(op = e.op, error = %e, "the checker rejected a recorded op");
                self.error = Some(e);
            }
        }
        if let Some(trace) = &mut self.trace {
            trace.push(op);
        }
    }
}

#[cfg(test)]
mod tests {
    /// Records cross to the checker thread by the thousand: keep them within a cache line.
    #[test]
    fn a_record_fits_in_a_cache_line() {
        assert!(std::mem::size_of::<super::Rec>() <= 64);
    }
}
