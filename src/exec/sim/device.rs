//! The simulated device: its memory, streams, events and host, and how issued work runs.

use std::collections::VecDeque;

use smallvec::SmallVec;

use super::arena::Arena;
use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator};
use crate::exec::backend::{Fence, Issued, Span, StreamKey, StreamKind};
use crate::exec::error::ExecError;
use crate::exec::sched::{Actor, Ready};
use crate::kernels::{fmix, hash_word};
use crate::trace::MemoryKind;

/// A point of a stream's order: its work up to sequence number `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mark {
    pub(super) stream: StreamKey,
    pub(super) seq: u64,
}

/// The spans of a launch (four of each inline, as a session keeps them).
pub(super) type SpanList = SmallVec<[Span; 4]>;

/// Work queued on a stream or run by the host.
#[derive(Debug)]
pub(super) enum Work {
    /// The hash kernel: one kernel per write region; `words` is the longest region.
    Launch {
        id: u32,
        reads: SpanList,
        writes: SpanList,
        words: u32,
    },
    Copy {
        src: Span,
        dst: Span,
    },
    Memset {
        dst: Span,
        value: u32,
    },
    /// A copy from pageable host memory, its bytes staged when issued.
    Store {
        dst: Span,
        data: Vec<u8>,
    },
    /// The host reads pinned memory (a program's, observed).
    HostRead {
        src: Span,
    },
    /// The host writes these words into pinned memory (a program's).
    HostWrite {
        dst: Span,
        data: Vec<u32>,
    },
    /// Event records and waits, stream-ordered frees, user kernels run now: nothing to run.
    Marker,
}

impl Work {
    pub(super) fn words(&self) -> u32 {
        let w = |s: &Span| u32::try_from(s.words()).unwrap_or(u32::MAX);
        match self {
            Work::Launch { words, .. } => *words,
            Work::Copy { dst, .. }
            | Work::Memset { dst, .. }
            | Work::Store { dst, .. }
            | Work::HostWrite { dst, .. } => w(dst),
            Work::HostRead { src } => w(src),
            Work::Marker => 0,
        }
    }
}

#[derive(Debug)]
pub(super) struct Pending {
    pub(super) op: usize,
    pub(super) seq: u64,
    pub(super) work: Work,
    pub(super) deps: SmallVec<[Mark; 2]>,
    /// Words done so far.
    pub(super) progress: u32,
}

#[derive(Debug)]
pub(super) struct SimStream {
    pub(super) kind: StreamKind,
    pub(super) device: u64,
    pub(super) queue: VecDeque<Pending>,
    /// Sequence number of the last op issued on the stream.
    pub(super) issued: u64,
    /// Sequence number of the last op done.
    pub(super) done: u64,
}

impl SimStream {
    pub(super) fn new(kind: StreamKind) -> Self {
        SimStream {
            kind,
            device: 0,
            queue: VecDeque::new(),
            issued: 0,
            done: 0,
        }
    }
}

/// How issued work runs: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timing {
    Eager,
    Scheduled,
}

/// What a program run observes: digests of the reads, and the last value each word of every
/// generation received from its own accesses.
#[derive(Debug, Default)]
pub(super) struct Observer {
    /// (op, region) → (generation, digest).
    pub(super) reads: std::collections::BTreeMap<(usize, usize), (u32, u64)>,
    /// By generation: its base address and the last value each word received.
    pub(super) gens: Vec<(u64, Vec<Option<u32>>)>,
}

/// The simulated device. See the [module docs](super).
#[derive(Debug)]
pub struct Device {
    pub(super) timing: Timing,
    pub(super) chunk_words: u32,
    /// Run the work on the simulated memory (`false`: keep the allocators and the streams' order,
    /// but launches, stores, loads, event records and waits do nothing; for measuring a session's
    /// own cost).
    pub(super) execute: bool,
    pub(super) device: DeviceCachingAllocator<Arena>,
    pub(super) pinned: HostCachingAllocator<Arena>,
    pub(super) managed: HostCachingAllocator<Arena>,
    /// By stream key; 0 is the legacy default stream.
    pub(super) streams: Vec<SimStream>,
    /// By event key: the point captured by the last record.
    pub(super) events: Vec<Option<Mark>>,
    /// The host's access in progress (a program's).
    pub(super) host_work: Option<Pending>,
    /// What the host waits for before it issues its next op (a program's).
    pub(super) host_wait: SmallVec<[Mark; 4]>,
    /// A program run's observations (`None` for a session: reads are raw).
    pub(super) observer: Option<Observer>,
}

/// `what`: the region is external memory, which the simulator has none of.
pub(super) fn not_simulated(what: &str) -> ExecError {
    ExecError::InvalidArgument(format!(
        "{what}: the simulator has no memory behind external regions"
    ))
}

impl Device {
    pub(super) fn with(
        timing: Timing,
        chunk_words: u32,
        device_bytes: u64,
        pinned_bytes: u64,
    ) -> Self {
        Device {
            timing,
            chunk_words: chunk_words.max(1),
            execute: true,
            device: DeviceCachingAllocator::new(Arena::new(MemoryKind::Device, device_bytes)),
            pinned: HostCachingAllocator::new(Arena::new(MemoryKind::Pinned, pinned_bytes)),
            managed: HostCachingAllocator::new(Arena::new(MemoryKind::Managed, pinned_bytes)),
            streams: vec![SimStream::new(StreamKind::LegacyDefault)],
            events: Vec::new(),
            host_work: None,
            host_wait: SmallVec::new(),
            observer: None,
        }
    }

    /// A session's device: work runs when issued (but on a lagging stream), reads are raw, and an
    /// allocation whose segment does not fit in `device_bytes` (device memory) or `pinned_bytes`
    /// (host memory) fails. With `execute` off, no work runs at all (see
    /// [`SessionConfig::sim_execute`](crate::session::SessionConfig::sim_execute)).
    pub fn session(device_bytes: u64, pinned_bytes: u64, execute: bool) -> Self {
        let mut d = Device::with(Timing::Eager, u32::MAX, device_bytes, pinned_bytes);
        d.execute = execute;
        d
    }

    /// A program run's device: nothing runs until a scheduler steps it, kernels advance
    /// `chunk_words` words per step, and reads are tagged (on memory that counts its writes) and
    /// observed.
    pub(crate) fn program(chunk_words: u32) -> Self {
        let mut d = Device::with(Timing::Scheduled, chunk_words, u64::MAX, u64::MAX);
        d.observer = Some(Observer::default());
        for memory in [MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Managed] {
            d.arena(memory).count_writes = true;
        }
        d
    }

    pub(super) fn arena(&mut self, memory: MemoryKind) -> &mut Arena {
        match memory {
            MemoryKind::Device => self.device.memory_mut(),
            MemoryKind::Pinned => self.pinned.memory_mut(),
            MemoryKind::Managed => self.managed.memory_mut(),
        }
    }

    pub(super) fn stream_mut(&mut self, s: StreamKey) -> &mut SimStream {
        let k = s as usize;
        while self.streams.len() <= k {
            self.streams.push(SimStream::new(StreamKind::NonBlocking));
        }
        &mut self.streams[k]
    }

    pub(super) fn is_done(&self, m: &Mark) -> bool {
        self.streams
            .get(m.stream as usize)
            .is_none_or(|st| st.done >= m.seq)
    }

    /// The last point issued on stream `s`.
    pub(super) fn last(&self, s: StreamKey) -> Mark {
        Mark {
            stream: s,
            seq: self.streams.get(s as usize).map_or(0, |st| st.issued),
        }
    }

    /// Rule 5: an op on the legacy default stream waits for the blocking streams (of device 0),
    /// and an op on a blocking stream (of device 0) waits for the legacy default stream.
    pub(super) fn legacy_deps(&self, s: StreamKey, out: &mut SmallVec<[Mark; 2]>) {
        let Some(st) = self.streams.get(s as usize) else {
            return;
        };
        match st.kind {
            StreamKind::LegacyDefault => {
                for (k, b) in self.streams.iter().enumerate() {
                    if b.kind == StreamKind::Blocking && b.device == 0 && b.issued > 0 {
                        out.push(self.last(k as StreamKey));
                    }
                }
            }
            StreamKind::Blocking if st.device == 0 && self.streams[0].issued > 0 => {
                out.push(self.last(0))
            }
            _ => {}
        }
    }

    /// The points the host waits for at a sync of stream `s` (for the legacy default stream, also
    /// the blocking streams of device 0).
    pub(super) fn stream_marks(&self, s: StreamKey) -> SmallVec<[Mark; 4]> {
        let mut w: SmallVec<[Mark; 4]> = SmallVec::new();
        w.push(self.last(s));
        if self.streams.get(s as usize).map(|st| st.kind) == Some(StreamKind::LegacyDefault) {
            for (k, b) in self.streams.iter().enumerate() {
                if b.kind == StreamKind::Blocking && b.device == 0 {
                    w.push(self.last(k as StreamKey));
                }
            }
        }
        w
    }

    /// The host waits for `marks`: at once (eagerly), or before its next op (scheduled).
    pub(super) fn wait_host(&mut self, marks: &[Mark]) {
        match self.timing {
            Timing::Eager => {
                for m in marks {
                    self.flush(m.stream, m.seq);
                }
            }
            Timing::Scheduled => {
                self.host_wait.clear();
                self.host_wait.extend_from_slice(marks);
            }
        }
    }

    /// Issues work on stream `s` as op `op`, after `deps` (fences, an event wait): runs it now, or
    /// queues it behind a lag (`lag` starts one) or for a scheduler.
    pub(super) fn submit(
        &mut self,
        s: StreamKey,
        op: usize,
        work: Work,
        mut deps: SmallVec<[Mark; 2]>,
        lag: bool,
    ) -> Issued {
        self.stream_mut(s);
        match self.timing {
            Timing::Eager => {
                for d in &deps {
                    self.flush(d.stream, d.seq);
                }
                deps.clear();
                self.legacy_deps(s, &mut deps);
                for d in &deps {
                    self.flush(d.stream, d.seq);
                }
                let st = &mut self.streams[s as usize];
                st.issued += 1;
                let seq = st.issued;
                let mut p = Pending {
                    op,
                    seq,
                    work,
                    deps: SmallVec::new(),
                    progress: 0,
                };
                if lag || !st.queue.is_empty() {
                    st.queue.push_back(p);
                } else {
                    self.advance(&mut p);
                    self.streams[s as usize].done = seq;
                }
                Issued::Done
            }
            Timing::Scheduled => {
                self.legacy_deps(s, &mut deps);
                deps.retain(|d| !self.is_done(d));
                let st = &mut self.streams[s as usize];
                st.issued += 1;
                let seq = st.issued;
                st.queue.push_back(Pending {
                    op,
                    seq,
                    work,
                    deps,
                    progress: 0,
                });
                Issued::Queued
            }
        }
    }

    /// Runs the queued work of stream `s` up to sequence number `upto` (eagerly driven: its
    /// dependencies were met when it was queued).
    pub(super) fn flush(&mut self, s: StreamKey, upto: u64) {
        loop {
            let Some(stream) = self.streams.get_mut(s as usize) else {
                return;
            };
            match stream.queue.front() {
                Some(p) if p.seq <= upto => {}
                _ => return,
            }
            let Some(mut p) = stream.queue.pop_front() else {
                return;
            };
            while !self.advance(&mut p) {}
            self.streams[s as usize].done = p.seq;
        }
    }

    /// Runs every queued op of every stream.
    pub(super) fn flush_all(&mut self) {
        for k in 0..self.streams.len() {
            self.flush(k as StreamKey, u64::MAX);
        }
    }

    /// Brings stream `s` up to date and counts one op run now on it (a user kernel, a copy from
    /// or to pageable memory).
    pub(super) fn run_now(&mut self, s: StreamKey, op: usize) {
        let mut deps = SmallVec::new();
        self.legacy_deps(s, &mut deps);
        for d in &deps {
            self.flush(d.stream, d.seq);
        }
        self.flush(s, u64::MAX);
        self.submit(s, op, Work::Marker, SmallVec::new(), false);
    }

    /// The fences as points of the streams' orders.
    pub(super) fn marks(fences: &[Fence]) -> SmallVec<[Mark; 2]> {
        fences
            .iter()
            .map(|f| Mark {
                stream: f.stream,
                seq: f.mark,
            })
            .collect()
    }

    /// Checks that a span can be executed on: session memory inside one segment.
    pub(super) fn check(&mut self, s: &Span, what: &str) -> Result<(), ExecError> {
        if s.external {
            return Err(not_simulated(what));
        }
        if self.arena(s.memory).contains(s.addr, s.bytes) {
            Ok(())
        } else {
            Err(ExecError::InvalidArgument(format!(
                "{what}: {} bytes of {} memory at {:#x} are not inside the simulated memory",
                s.bytes,
                s.memory.as_str(),
                s.addr
            )))
        }
    }

    /// The words `[from, to)` of span `s` (cut to its length), raw or as its generation sees them.
    pub(super) fn load(&mut self, s: &Span, from: u32, to: u32) -> Vec<u32> {
        let to = u64::from(to).min(s.words());
        let from = u64::from(from);
        if from >= to {
            return Vec::new();
        }
        let tagged = self.observer.is_some();
        let gen = s.gen;
        let arena = self.arena(s.memory);
        if s.is_aligned() {
            if tagged {
                return (from..to)
                    .map(|i| arena.read_word(s.addr + 4 * i, Some(gen)))
                    .collect();
            }
            return arena
                .read_words(s.addr + 4 * from, to - from)
                .unwrap_or_default();
        }
        let start = 4 * from;
        let bytes = (4 * to).min(s.bytes) - start;
        let bytes = arena.read_bytes(s.addr + start, bytes).unwrap_or_default();
        bytes
            .chunks(4)
            .map(|c| {
                let mut le = [0u8; 4];
                le[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(le)
            })
            .collect()
    }

    /// Writes `values` over the words of span `s` from word `from` (the last word cut to its end),
    /// as its generation's.
    pub(super) fn store(&mut self, s: &Span, from: u32, values: &[u32]) {
        let from = u64::from(from);
        let n = (values.len() as u64).min(s.words().saturating_sub(from));
        if n == 0 {
            return;
        }
        let values = &values[..n as usize];
        let gen = s.gen;
        if s.is_aligned() {
            let addr = s.addr + 4 * from;
            self.arena(s.memory).write_words(addr, values, gen);
            if let Some(obs) = &mut self.observer {
                if let Some((base, words)) = obs.gens.get_mut(gen as usize) {
                    let first = ((addr - *base) / 4) as usize;
                    for (k, &v) in values.iter().enumerate() {
                        if let Some(w) = words.get_mut(first + k) {
                            *w = Some(v);
                        }
                    }
                }
            }
            return;
        }
        let start = 4 * from;
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .take((s.bytes - start) as usize)
            .collect();
        self.arena(s.memory)
            .write_bytes(s.addr + start, &bytes, gen);
    }

    /// Adds the words `values` read from region `k` of op `op`, from word `from`, to its digest.
    pub(super) fn observe(&mut self, op: usize, k: usize, s: &Span, from: u32, values: &[u32]) {
        if let Some(obs) = &mut self.observer {
            let e = obs.reads.entry((op, k)).or_insert((s.gen, 0));
            for (n, &v) in values.iter().enumerate() {
                e.1 = e.1.wrapping_add(u64::from(fmix(v ^ (from + n as u32))));
            }
        }
    }

    /// Runs the next chunk of `p`; returns whether it completed.
    pub(super) fn advance(&mut self, p: &mut Pending) -> bool {
        let total = p.work.words();
        let from = p.progress;
        let to = total.min(from.saturating_add(self.chunk_words));
        p.progress = to;
        if !self.execute {
            return to >= total;
        }
        match &p.work {
            Work::Launch {
                id, reads, writes, ..
            } => {
                if writes.is_empty() {
                    for (k, r) in reads.iter().enumerate() {
                        let v = self.load(r, from, to);
                        self.observe(p.op, k, r, from, &v);
                    }
                }
                // One kernel per write region, each from memory as the previous one left it.
                for (j, w) in writes.iter().enumerate() {
                    let inputs: SmallVec<[Vec<u32>; 4]> =
                        reads.iter().map(|r| self.load(r, from, to)).collect();
                    if j == 0 {
                        for (k, (r, v)) in reads.iter().zip(&inputs).enumerate() {
                            self.observe(p.op, k, r, from, v);
                        }
                    }
                    let end = u64::from(to).min(w.words()) as u32;
                    let out: Vec<u32> = (from..end.max(from))
                        .map(|i| {
                            let at = (i - from) as usize;
                            hash_word(*id, j as u32, i, inputs.iter().map(|r| r.get(at).copied()))
                        })
                        .collect();
                    self.store(w, from, &out);
                }
            }
            Work::Copy { src, dst } => {
                let v = self.load(src, from, to);
                self.observe(p.op, 0, src, from, &v);
                self.store(dst, from, &v);
            }
            Work::Memset { dst, value } => {
                let n = to.saturating_sub(from) as usize;
                self.store(dst, from, &vec![*value; n]);
            }
            Work::Store { dst, data } => {
                if from == 0 {
                    let n = data.len().min(dst.bytes as usize);
                    let gen = dst.gen;
                    self.arena(dst.memory)
                        .write_bytes(dst.addr, &data[..n], gen);
                }
            }
            Work::HostRead { src } => {
                let v = self.load(src, from, to);
                self.observe(p.op, 0, src, from, &v);
            }
            Work::HostWrite { dst, data } => {
                let end = (to as usize).min(data.len());
                let chunk = data.get(from as usize..end).unwrap_or(&[]).to_vec();
                self.store(dst, from, &chunk);
            }
            Work::Marker => {}
        }
        to >= total
    }

    /// The host's access of pinned memory as op `op` (scheduled): its work in progress once its
    /// fences are done.
    pub(super) fn host_work(&mut self, op: usize, work: Work, fences: &[Fence]) -> Issued {
        let deps = Device::marks(fences);
        if deps.iter().all(|d| self.is_done(d)) {
            self.host_work = Some(Pending {
                op,
                seq: 0,
                work,
                deps: SmallVec::new(),
                progress: 0,
            });
            Issued::Queued
        } else {
            // Wait for the fences, then issue again.
            self.host_wait.clear();
            self.host_wait.extend(deps);
            Issued::Retry
        }
    }

    /// The words of a region (a user kernel's on the simulator): raw, and checked to be
    /// simulated memory.
    pub fn read(&mut self, span: &Span) -> Result<Vec<u32>, ExecError> {
        self.check(span, "read")?;
        Ok(self.load(span, 0, u32::try_from(span.words()).unwrap_or(u32::MAX)))
    }

    /// Writes the words of a region (a user kernel's on the simulator), the last word cut to the
    /// region's end.
    pub fn write(&mut self, span: &Span, words: &[u32]) -> Result<(), ExecError> {
        self.check(span, "write")?;
        self.store(span, 0, words);
        Ok(())
    }

    // ---- driven by a scheduler ----------------------------------------------------------------

    /// The streams whose head op can run now, in key order.
    pub(super) fn ready_streams(&self, out: &mut Vec<Ready>) {
        for (k, s) in self.streams.iter().enumerate() {
            if let Some(p) = s.queue.front() {
                if p.deps.iter().all(|d| self.is_done(d)) {
                    out.push(Ready {
                        actor: Actor::Stream(k),
                        op: p.op,
                    });
                }
            }
        }
    }

    /// Runs the next chunk of stream `s`'s head op; returns the op if it completed.
    pub(super) fn step_stream(&mut self, s: usize) -> Option<usize> {
        let mut p = self.streams.get_mut(s)?.queue.pop_front()?;
        if self.advance(&mut p) {
            self.streams[s].done = p.seq;
            Some(p.op)
        } else {
            self.streams[s].queue.push_front(p);
            None
        }
    }

    /// The op of the host's access in progress.
    pub(super) fn host_op(&self) -> Option<usize> {
        self.host_work.as_ref().map(|p| p.op)
    }

    /// Whether everything the host waits for is done.
    pub(super) fn host_free(&self) -> bool {
        self.host_wait.iter().all(|m| self.is_done(m))
    }

    /// Runs the next chunk of the host's access; returns the op if it completed.
    pub(super) fn step_host(&mut self) -> Option<usize> {
        let mut p = self.host_work.take()?;
        if self.advance(&mut p) {
            Some(p.op)
        } else {
            self.host_work = Some(p);
            None
        }
    }

    /// Starts tracking what generation `gen`, `bytes` at `addr`, writes (a program run's).
    pub(super) fn track(&mut self, gen: u32, addr: u64, bytes: u64) {
        if let Some(obs) = &mut self.observer {
            let k = gen as usize;
            if obs.gens.len() <= k {
                obs.gens.resize_with(k + 1, || (0, Vec::new()));
            }
            obs.gens[k] = (addr, vec![None; (bytes / 4) as usize]);
        }
    }
}
