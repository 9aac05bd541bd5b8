//! The simulated device: runs trace ops on CPU memory under a chosen schedule, so that races tear
//! data exactly as they would on a GPU.
//!
//! Each stream is a FIFO queue; the host issues ops in trace order and blocks on syncs. A
//! [`Scheduler`] picks, at every step, which runnable participant moves: the host issues its next
//! op (or a chunk of a host access), or a stream runs the next chunk of its head op. Only real
//! CUDA ordering constrains the choice — stream order, event waits, host syncs, the legacy default
//! stream, and the allocator's `record_stream` fence — so every schedule the simulator produces is
//! one a GPU could produce. Kernels are not atomic: a launch reads and writes in chunks of
//! [`SimConfig::chunk_words`] words that interleave with other participants' chunks.
//!
//! Memory comes from the same allocator policies as the checker's model ([`crate::alloc`]) over a
//! simulated arena — or, for allocations with `addr` (recorded traces made runnable by
//! [`crate::fuzz::runnable`]), from where the program places it, with the device synchronization
//! the trace format implies when device memory comes back on another stream — so a buffer freed while in use is handed out again and overwritten, exactly as
//! on a GPU. Kernels compute [`crate::kernels::hash_word`]: each written word depends on the op,
//! its index and every word read at that index, so any reordering changes the result.
//!
//! What a run produces is an [`Outcome`]: a digest of every region each op read, and a checksum of
//! every buffer live at the end. Two runs of one program agree exactly when no op observed
//! different data.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator, Memory, ModelMemory};
use crate::kernels::{fmix, hash_word, memset_word};
use crate::trace::{Id, MemoryKind, Op, Region, TraceOp, DEFAULT_STREAM};
use crate::workload::SplitMix;

/// Why a program cannot run on the simulator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The op uses something the simulator does not model.
    #[error("op {op}: {message}")]
    Unsupported {
        /// The op index.
        op: usize,
        /// What is not supported.
        message: String,
    },
}

/// Knobs of a simulated run.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Words a kernel processes per scheduling step (`u32::MAX`: every op is atomic).
    pub chunk_words: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { chunk_words: 16 }
    }
}

/// A participant that can move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Actor {
    /// The host.
    Host,
    /// The stream with this dense index.
    Stream(usize),
}

/// A participant that can move now, and the op it would advance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runnable {
    /// Who moves.
    pub actor: Actor,
    /// The op index it advances (for the host: the op it issues or continues).
    pub op: usize,
}

/// Chooses which runnable participant moves next.
pub trait Scheduler {
    /// Returns an index into `runnable`, which is never empty.
    fn pick(&mut self, runnable: &[Runnable], done: &[bool]) -> usize;
}

/// Runs every op to completion in issue order: the sequential reference.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequential;

impl Scheduler for Sequential {
    fn pick(&mut self, runnable: &[Runnable], _: &[bool]) -> usize {
        // The earliest op first; the stream finishes an issued op before the host issues more.
        let mut best = 0;
        for (k, r) in runnable.iter().enumerate() {
            let (b, c) = (&runnable[best], r);
            if (c.op, c.actor == Actor::Host) < (b.op, b.actor == Actor::Host) {
                best = k;
            }
        }
        best
    }
}

/// Picks uniformly at random (seeded).
#[derive(Clone, Debug)]
pub struct RandomScheduler(pub SplitMix);

impl Scheduler for RandomScheduler {
    fn pick(&mut self, runnable: &[Runnable], _: &[bool]) -> usize {
        self.0.below(runnable.len() as u64) as usize
    }
}

/// Steers a schedule to make hazards manifest: each `(held, until)` pair keeps op `held` from
/// starting until op `until` has completed; otherwise picks at random.
#[derive(Clone, Debug)]
pub struct Adversarial {
    /// `(held, until)` pairs of op indices.
    pub holds: Vec<(usize, usize)>,
    /// Random choices among the rest.
    pub rng: SplitMix,
    /// Keep held ops back even after their `until` op completed, as long as anything else can
    /// run: the late access lands as late as possible, where more later work can observe it.
    pub starve: bool,
}

impl Scheduler for Adversarial {
    fn pick(&mut self, runnable: &[Runnable], done: &[bool]) -> usize {
        let starve = self.starve;
        let allowed: Vec<usize> = (0..runnable.len())
            .filter(|&k| {
                let op = runnable[k].op;
                !self
                    .holds
                    .iter()
                    .any(|&(h, u)| h == op && (starve || !done.get(u).copied().unwrap_or(true)))
            })
            .collect();
        if allowed.is_empty() {
            // Every runnable op is held: release (the hold cannot be honoured).
            return self.rng.below(runnable.len() as u64) as usize;
        }
        // Prefer moving the ops that release holds, so held ones wait as little as possible.
        let releasing: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|&k| self.holds.iter().any(|&(_, u)| u == runnable[k].op))
            .collect();
        let pool = if releasing.is_empty() {
            &allowed
        } else {
            &releasing
        };
        pool[self.rng.below(pool.len() as u64) as usize]
    }
}

/// Replays a fixed list of choices, then picks the first runnable; records the choices made and
/// how many were available, for exhaustive exploration.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    /// Choices to replay (indices into the runnable list).
    pub prefix: Vec<usize>,
    /// Every choice made: (chosen, available).
    pub trail: Vec<(usize, usize)>,
}

impl Scheduler for Replay {
    fn pick(&mut self, runnable: &[Runnable], _: &[bool]) -> usize {
        let k = self.trail.len();
        let c = self
            .prefix
            .get(k)
            .copied()
            .unwrap_or(0)
            .min(runnable.len() - 1);
        self.trail.push((c, runnable.len()));
        c
    }
}

/// What a run observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// For each op and each region it read: (buffer, digest of the words read).
    pub reads: BTreeMap<(usize, usize), (Id, u64)>,
    /// Checksum of every buffer live at the end.
    pub live: BTreeMap<Id, u64>,
    /// For every buffer generation (by its alloc op): checksum of the last value each of its
    /// words received from an access of that buffer — its result, even if freed and reused since.
    pub written: BTreeMap<usize, (Id, u64)>,
    /// Scheduling steps taken.
    pub steps: usize,
    /// Words read (by an op, or at the end as part of a live buffer) that the reading buffer had
    /// not written: reads of uninitialized memory. In the sequential reference these are the
    /// program's own; a GPU returns the previous owner's bytes for them.
    pub uninitialized: u64,
}

impl Outcome {
    /// The buffers whose observed contents differ between two runs of one program.
    pub fn diverging(&self, other: &Outcome) -> Vec<Id> {
        let mut out: HashSet<Id> = HashSet::new();
        for (k, (b, d)) in &self.reads {
            if other.reads.get(k).map(|x| x.1) != Some(*d) {
                out.insert(b.clone());
            }
        }
        for (k, (b, _)) in &other.reads {
            if !self.reads.contains_key(k) {
                out.insert(b.clone());
            }
        }
        for (b, c) in &self.live {
            if other.live.get(b) != Some(c) {
                out.insert(b.clone());
            }
        }
        for (g, (b, c)) in &self.written {
            if other.written.get(g).map(|x| x.1) != Some(*c) {
                out.insert(b.clone());
            }
        }
        let mut v: Vec<Id> = out.into_iter().collect();
        v.sort();
        v
    }

    /// The ops whose reads differ between two runs.
    pub fn diverging_ops(&self, other: &Outcome) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .reads
            .iter()
            .filter(|(k, (_, d))| other.reads.get(k).map(|x| x.1) != Some(*d))
            .map(|(k, _)| k.0)
            .collect();
        v.dedup();
        v
    }
}

/// A segment store: the allocator's segments, backed by word vectors grown on demand.
#[derive(Debug)]
struct Arena {
    model: ModelMemory,
    /// Per word: its value and the buffer generation whose access last wrote it.
    segments: BTreeMap<u64, Vec<(u32, u32)>>,
    /// Reads of words the reading generation had not written.
    uninitialized: u64,
}

/// The tag of memory no buffer has written.
const UNWRITTEN: u32 = u32::MAX;

impl Memory for Arena {
    type Error = <ModelMemory as Memory>::Error;
    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
        let base = self.model.map_segment(bytes)?;
        self.segments.insert(base, Vec::new());
        Ok(base)
    }
}

impl Arena {
    fn new(base: u64) -> Self {
        Arena {
            model: ModelMemory::new(base),
            segments: BTreeMap::new(),
            uninitialized: 0,
        }
    }

    fn word_mut(&mut self, addr: u64) -> &mut (u32, u32) {
        let (&base, seg) = self
            .segments
            .range_mut(..=addr)
            .next_back()
            .expect("address inside a segment");
        let i = ((addr - base) / 4) as usize;
        if seg.len() <= i {
            let start = seg.len();
            seg.resize(start.max(i + 1), (0, UNWRITTEN));
        }
        &mut seg[i]
    }

    /// Reads a word as buffer generation `gen` sees it. Words `gen` has not written are
    /// uninitialized: they read as a pattern of the generation and the address, whatever an
    /// earlier owner of the memory left there, so a program's reads of uninitialized memory are
    /// deterministic. A write by an earlier owner that lands after `gen` wrote (a reuse race)
    /// still clobbers `gen`'s data.
    fn read(&mut self, addr: u64, gen: u32) -> u32 {
        let (v, tag) = *self.word_mut(addr);
        if tag == gen {
            v
        } else {
            self.uninitialized += 1;
            fmix(gen.wrapping_mul(0x9e37_79b9) ^ (addr >> 2) as u32)
        }
    }

    fn write(&mut self, addr: u64, v: u32, gen: u32) {
        *self.word_mut(addr) = (v, gen);
    }
}

/// A region resolved to memory.
#[derive(Clone, Debug)]
struct Span {
    memory: MemoryKind,
    gen: u32,
    addr: u64,
    words: u32,
    buffer: Id,
}

#[derive(Clone, Debug)]
struct Buffer {
    memory: MemoryKind,
    gen: u32,
    addr: u64,
    size: u64,
    /// The owning stream (device memory).
    owner: usize,
    /// Whether the program placed it (`addr`) rather than the allocator.
    placed: bool,
    /// Ops that must complete before this buffer's memory may be used (record_stream fences of
    /// the freed buffers whose blocks it reuses).
    fences: Vec<usize>,
}

#[derive(Clone, Debug)]
struct Freed {
    memory: MemoryKind,
    addr: u64,
    size: u64,
    fences: Vec<usize>,
}

#[derive(Clone, Debug)]
enum Work {
    /// A kernel: reads, writes, the launch id; `words` = longest write region.
    Launch {
        reads: Vec<Span>,
        writes: Vec<Span>,
        words: u32,
    },
    Copy {
        src: Span,
        dst: Span,
    },
    Memset {
        dst: Span,
    },
    HostRead {
        src: Span,
    },
    HostWrite {
        dst: Span,
    },
    /// Event records, waits, stream-ordered frees: complete in one step.
    Marker,
}

impl Work {
    fn words(&self) -> u32 {
        match self {
            Work::Launch { words, .. } => *words,
            Work::Copy { dst, .. } | Work::Memset { dst } | Work::HostWrite { dst } => dst.words,
            Work::HostRead { src } => src.words,
            Work::Marker => 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Pending {
    op: usize,
    work: Work,
    deps: Vec<usize>,
    /// Words done so far.
    progress: u32,
}

#[derive(Clone, Debug)]
struct Stream {
    device: u64,
    blocking: bool,
    queue: VecDeque<Pending>,
    last: Option<usize>,
}

/// One run of a program.
struct Run<'p> {
    program: &'p [TraceOp],
    cfg: SimConfig,
    device: DeviceCachingAllocator<Arena>,
    pinned: HostCachingAllocator<Arena>,
    managed: HostCachingAllocator<Arena>,
    streams: Vec<Stream>,
    stream_ids: HashMap<Id, usize>,
    buffers: HashMap<Id, Buffer>,
    /// Per generation (indexed by `Buffer::gen`): its alloc op, name, base, and the last value
    /// each word received from its own accesses.
    gens: Vec<(usize, Id, u64, Vec<Option<u32>>)>,
    freed: Vec<Freed>,
    /// Placed device memory freed and not yet allocated again: start → (end, the stream its
    /// free gave it to). Memory that comes back on another stream went back to the driver,
    /// which synchronized the device.
    freed_to: BTreeMap<u64, (u64, usize)>,
    record_streams: HashMap<Id, Vec<usize>>,
    events: HashMap<Id, Option<usize>>,
    done: Vec<bool>,
    /// The host: next op to issue, the access in progress, the ops it waits for.
    next: usize,
    host_work: Option<Pending>,
    host_wait: Vec<usize>,
    outcome: Outcome,
}

const DEVICE_BASE: u64 = 0x7f00_0000_0000;
const PINNED_BASE: u64 = 0x2000_0000_0000;
const MANAGED_BASE: u64 = 0x3000_0000_0000;

/// Where memory placed by the program (`addr`) may lie: from the base of its kind's compressed
/// space ([`crate::fuzz::runnable::BASES`]), at most [`MAX_WORDS`] words up.
const PLACED_BASES: [u64; 3] = crate::fuzz::runnable::BASES;

/// The most words the simulator gives one buffer, or placed memory of one kind: larger programs
/// are not simulated (an `Unsupported` error says so).
pub const MAX_WORDS: u64 = 1 << 24;

fn addr_given(op: &Op) -> bool {
    matches!(op, Op::Alloc { addr: Some(_), bytes, .. } if *bytes > 0)
}

/// Runs `program` under `scheduler`.
pub fn run(
    program: &[TraceOp],
    scheduler: &mut dyn Scheduler,
    cfg: SimConfig,
) -> Result<Outcome, SimError> {
    let mut r = Run {
        program,
        cfg,
        device: DeviceCachingAllocator::new(Arena::new(DEVICE_BASE)),
        pinned: HostCachingAllocator::new(Arena::new(PINNED_BASE)),
        managed: HostCachingAllocator::new(Arena::new(MANAGED_BASE)),
        streams: Vec::new(),
        stream_ids: HashMap::new(),
        buffers: HashMap::new(),
        gens: Vec::new(),
        freed: Vec::new(),
        freed_to: BTreeMap::new(),
        record_streams: HashMap::new(),
        events: HashMap::new(),
        done: vec![false; program.len()],
        next: 0,
        host_work: None,
        host_wait: Vec::new(),
        outcome: Outcome::default(),
    };
    r.stream(&Id::from(DEFAULT_STREAM));
    let mut runnable = Vec::new();
    loop {
        runnable.clear();
        r.runnable(&mut runnable);
        if runnable.is_empty() {
            break;
        }
        let k = scheduler.pick(&runnable, &r.done);
        let pick = runnable[k.min(runnable.len() - 1)];
        r.step(pick.actor)?;
        r.outcome.steps += 1;
    }
    // Every buffer live at the end: its checksum.
    let mut live: Vec<(Id, Buffer)> = r
        .buffers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    live.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, b) in live {
        let mut sum = 0u64;
        for i in 0..(b.size / 4) {
            let w = r.arena(b.memory).read(b.addr + 4 * i, b.gen);
            sum = sum.wrapping_add(u64::from(fmix(w ^ i as u32)));
        }
        r.outcome.live.insert(name, sum);
    }
    r.outcome.uninitialized = r.device.memory().uninitialized
        + r.pinned.memory().uninitialized
        + r.managed.memory().uninitialized;
    for (op, name, _, words) in &r.gens {
        let sum = words.iter().enumerate().fold(0u64, |acc, (k, w)| {
            acc.wrapping_add(w.map_or(0x5a5a, |v| u64::from(fmix(v ^ k as u32))))
        });
        r.outcome.written.insert(*op, (name.clone(), sum));
    }
    Ok(r.outcome)
}

/// Runs `program` in issue order: the sequential reference.
pub fn reference(program: &[TraceOp]) -> Result<Outcome, SimError> {
    run(
        program,
        &mut Sequential,
        SimConfig {
            chunk_words: u32::MAX,
        },
    )
}

impl Run<'_> {
    fn arena(&mut self, memory: MemoryKind) -> &mut Arena {
        match memory {
            MemoryKind::Device => self.device.memory_mut(),
            MemoryKind::Pinned => self.pinned.memory_mut(),
            MemoryKind::Managed => self.managed.memory_mut(),
        }
    }

    fn stream(&mut self, id: &Id) -> usize {
        if let Some(&s) = self.stream_ids.get(id) {
            return s;
        }
        self.streams.push(Stream {
            device: 0,
            blocking: false,
            queue: VecDeque::new(),
            last: None,
        });
        self.stream_ids.insert(id.clone(), self.streams.len() - 1);
        self.streams.len() - 1
    }

    fn is_done(&self, ops: &[usize]) -> bool {
        ops.iter().all(|&o| self.done[o])
    }

    fn runnable(&self, out: &mut Vec<Runnable>) {
        if let Some(w) = &self.host_work {
            out.push(Runnable {
                actor: Actor::Host,
                op: w.op,
            });
        } else if self.next < self.program.len() && self.is_done(&self.host_wait) {
            out.push(Runnable {
                actor: Actor::Host,
                op: self.next,
            });
        }
        for (k, s) in self.streams.iter().enumerate() {
            if let Some(p) = s.queue.front() {
                if self.is_done(&p.deps) {
                    out.push(Runnable {
                        actor: Actor::Stream(k),
                        op: p.op,
                    });
                }
            }
        }
    }

    fn unsupported(op: usize, message: impl Into<String>) -> SimError {
        SimError::Unsupported {
            op,
            message: message.into(),
        }
    }

    fn span(&self, op: usize, r: &Region) -> Result<Span, SimError> {
        let b = self.buffers.get(&r.buffer).ok_or_else(|| {
            Self::unsupported(
                op,
                format!("buffer {} is not allocated (external or freed)", r.buffer),
            )
        })?;
        let bytes = r.bytes.unwrap_or(b.size.saturating_sub(r.offset));
        if r.offset % 4 != 0 || bytes % 4 != 0 || r.offset + bytes > b.size {
            return Err(Self::unsupported(
                op,
                format!(
                    "region of {} is not whole 4-byte words inside the buffer",
                    r.buffer
                ),
            ));
        }
        Ok(Span {
            memory: b.memory,
            gen: b.gen,
            addr: b.addr + r.offset,
            words: (bytes / 4) as u32,
            buffer: r.buffer.clone(),
        })
    }

    fn fences(&self, regions: &[&Region]) -> Vec<usize> {
        let mut v = Vec::new();
        for r in regions {
            if let Some(b) = self.buffers.get(&r.buffer) {
                v.extend(&b.fences);
            }
        }
        v
    }

    /// Rule 5 dependencies of an op issued on stream `s`.
    fn legacy_deps(&self, s: usize, deps: &mut Vec<usize>) {
        let st = &self.streams[s];
        if s == 0 {
            for b in self.streams.iter().filter(|b| b.blocking && b.device == 0) {
                deps.extend(b.last);
            }
        } else if st.blocking && st.device == 0 {
            deps.extend(self.streams[0].last);
        }
    }

    fn enqueue(&mut self, s: usize, op: usize, work: Work, mut deps: Vec<usize>) {
        self.legacy_deps(s, &mut deps);
        deps.retain(|&d| !self.done[d]);
        self.streams[s].queue.push_back(Pending {
            op,
            work,
            deps,
            progress: 0,
        });
        self.streams[s].last = Some(op);
    }

    fn step(&mut self, actor: Actor) -> Result<(), SimError> {
        match actor {
            Actor::Stream(s) => {
                let mut p = self.streams[s]
                    .queue
                    .pop_front()
                    .expect("runnable stream has work");
                if self.advance(&mut p) {
                    self.done[p.op] = true;
                } else {
                    self.streams[s].queue.push_front(p);
                }
                Ok(())
            }
            Actor::Host => {
                if let Some(mut p) = self.host_work.take() {
                    if self.advance(&mut p) {
                        self.done[p.op] = true;
                    } else {
                        self.host_work = Some(p);
                    }
                    return Ok(());
                }
                self.host_wait.clear();
                let i = self.next;
                self.next += 1;
                self.issue(i)
            }
        }
    }

    /// Runs the next chunk of `p`; returns whether it completed.
    fn advance(&mut self, p: &mut Pending) -> bool {
        let total = p.work.words();
        let from = p.progress;
        let to = total.min(from.saturating_add(self.cfg.chunk_words));
        let id = p.op as u32;
        match &p.work {
            Work::Launch { reads, writes, .. } => {
                for i in from..to {
                    let vals: Vec<Option<u32>> = reads
                        .iter()
                        .map(|r| {
                            (i < r.words).then(|| {
                                self.arena(r.memory).read(r.addr + 4 * u64::from(i), r.gen)
                            })
                        })
                        .collect();
                    for (k, (r, v)) in reads.iter().zip(&vals).enumerate() {
                        if let Some(v) = v {
                            self.observe(p.op, k, &r.buffer, i, *v);
                        }
                    }
                    for (j, w) in writes.iter().enumerate() {
                        if i < w.words {
                            let v = hash_word(id, j as u32, i, vals.iter().copied());
                            self.put(w, i, v);
                        }
                    }
                }
            }
            Work::Copy { src, dst } => {
                for i in from..to {
                    let v = self
                        .arena(src.memory)
                        .read(src.addr + 4 * u64::from(i), src.gen);
                    self.observe(p.op, 0, &src.buffer, i, v);
                    self.put(dst, i, v);
                }
            }
            Work::Memset { dst } => {
                for i in from..to {
                    self.put(dst, i, memset_word(id));
                }
            }
            Work::HostRead { src } => {
                for i in from..to {
                    let v = self
                        .arena(src.memory)
                        .read(src.addr + 4 * u64::from(i), src.gen);
                    self.observe(p.op, 0, &src.buffer, i, v);
                }
            }
            Work::HostWrite { dst } => {
                for i in from..to {
                    self.put(dst, i, hash_word(id, 0, i, []));
                }
            }
            Work::Marker => {}
        }
        p.progress = to;
        to >= total
    }

    /// Writes a word of a span and remembers it as that generation's latest value there.
    fn put(&mut self, span: &Span, i: u32, v: u32) {
        let addr = span.addr + 4 * u64::from(i);
        self.arena(span.memory).write(addr, v, span.gen);
        let g = &mut self.gens[span.gen as usize];
        if let Some(w) = g.3.get_mut(((addr - g.2) / 4) as usize) {
            *w = Some(v);
        }
    }

    fn observe(&mut self, op: usize, k: usize, buffer: &Id, i: u32, v: u32) {
        let e = self
            .outcome
            .reads
            .entry((op, k))
            .or_insert_with(|| (buffer.clone(), 0));
        e.1 = e.1.wrapping_add(u64::from(fmix(v ^ i)));
    }

    /// The host issues op `i`.
    fn issue(&mut self, i: usize) -> Result<(), SimError> {
        let op = &self.program[i].op;
        match op {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                let s = self.stream(stream);
                self.streams[s].device = *device;
                self.streams[s].blocking = *blocking;
                self.done[i] = true;
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
            } => {
                if *bytes / 4 > MAX_WORDS {
                    return Err(Self::unsupported(
                        i,
                        format!(
                            "buffer {buffer} of {bytes} bytes is too large to simulate (at most {} bytes)",
                            4 * MAX_WORDS
                        ),
                    ));
                }
                let key = stream.as_ref().map(|s| self.stream(s)).unwrap_or(0);
                let addr = match addr {
                    Some(a) if *bytes > 0 => {
                        self.place(i, *memory, *a, *bytes)?;
                        if *memory == MemoryKind::Device && self.reappears(*a, a + bytes, key) {
                            // The memory went back to the driver and came back: the device
                            // was synchronized.
                            let device = self.streams[key].device;
                            self.host_wait = self
                                .streams
                                .iter()
                                .filter(|s| s.device == device)
                                .filter_map(|s| s.last)
                                .collect();
                        }
                        *a
                    }
                    _ => {
                        let block = match memory {
                            MemoryKind::Device => self.device.allocate(*bytes, key as u32),
                            MemoryKind::Pinned => self.pinned.allocate(*bytes),
                            MemoryKind::Managed => self.managed.allocate(*bytes),
                        }
                        .map_err(|e| Self::unsupported(i, e.to_string()))?;
                        block.map(|b| b.addr).unwrap_or(0)
                    }
                };
                // The block reuses memory of earlier buffers freed with record_stream: fence.
                let end = addr + bytes;
                self.gens
                    .push((i, buffer.clone(), addr, vec![None; (*bytes / 4) as usize]));
                let mut fences: Vec<usize> = Vec::new();
                let done = &self.done;
                self.freed.retain(|f| {
                    let overlaps = f.memory == *memory && f.addr < end && addr < f.addr + f.size;
                    if overlaps {
                        for &x in &f.fences {
                            if !done[x] && !fences.contains(&x) {
                                fences.push(x);
                            }
                        }
                    }
                    // A freed range the new buffer covers whole hands its fences on to it.
                    let covered = overlaps && addr <= f.addr && f.addr + f.size <= end;
                    !covered && f.fences.iter().any(|&x| !done[x])
                });
                self.buffers.insert(
                    buffer.clone(),
                    Buffer {
                        memory: *memory,
                        gen: self.gens.len() as u32 - 1,
                        addr,
                        size: *bytes,
                        owner: key,
                        placed: addr_given(op),
                        fences,
                    },
                );
                self.record_streams.remove(buffer);
                self.done[i] = true;
            }
            Op::Free { buffer, stream } => {
                let Some(b) = self.buffers.remove(buffer) else {
                    self.done[i] = true;
                    return Ok(());
                };
                let rs = self.record_streams.remove(buffer).unwrap_or_default();
                let mut fences: Vec<usize> = Vec::new();
                for f in rs
                    .iter()
                    .filter_map(|&s| self.streams[s].last)
                    .chain(b.fences)
                {
                    if !self.done[f] && !fences.contains(&f) {
                        fences.push(f);
                    }
                }
                let to = match stream {
                    Some(s) => self.stream(s),
                    None => b.owner,
                };
                if b.size > 0 {
                    if b.placed {
                        if b.memory == MemoryKind::Device {
                            self.freed_to.insert(b.addr, (b.addr + b.size, to));
                        }
                    } else {
                        let res = match b.memory {
                            MemoryKind::Device => self.device.free(b.addr, to as u32),
                            MemoryKind::Pinned => self.pinned.free(b.addr),
                            MemoryKind::Managed => self.managed.free(b.addr),
                        };
                        res.map_err(|e| Self::unsupported(i, e.to_string()))?;
                    }
                    if !fences.is_empty() {
                        self.freed.push(Freed {
                            memory: b.memory,
                            addr: b.addr,
                            size: b.size,
                            fences,
                        });
                    }
                }
                match stream {
                    Some(s) => {
                        let s = self.stream(s);
                        self.enqueue(s, i, Work::Marker, Vec::new());
                    }
                    None => self.done[i] = true,
                }
            }
            Op::RecordStream { buffer, stream } => {
                let s = self.stream(stream);
                self.record_streams
                    .entry(buffer.clone())
                    .or_default()
                    .push(s);
                self.done[i] = true;
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                let s = self.stream(stream);
                let r: Vec<Span> = reads
                    .iter()
                    .map(|x| self.span(i, x))
                    .collect::<Result<_, _>>()?;
                let w: Vec<Span> = writes
                    .iter()
                    .map(|x| self.span(i, x))
                    .collect::<Result<_, _>>()?;
                // Every region is read (and observed) in full, also past the longest write region.
                let words = w.iter().chain(&r).map(|x| x.words).max().unwrap_or(0);
                let all: Vec<&Region> = reads.iter().chain(writes).collect();
                let deps = self.fences(&all);
                self.enqueue(
                    s,
                    i,
                    Work::Launch {
                        reads: r,
                        writes: w,
                        words,
                    },
                    deps,
                );
            }
            Op::Copy { stream, src, dst } => {
                let s = self.stream(stream);
                let (a, b) = (self.span(i, src)?, self.span(i, dst)?);
                if a.words != b.words {
                    return Err(Self::unsupported(i, "copy regions of different lengths"));
                }
                let deps = self.fences(&[src, dst]);
                self.enqueue(s, i, Work::Copy { src: a, dst: b }, deps);
            }
            Op::Memset { stream, dst } => {
                let s = self.stream(stream);
                let d = self.span(i, dst)?;
                let deps = self.fences(&[dst]);
                self.enqueue(s, i, Work::Memset { dst: d }, deps);
            }
            Op::HostRead { buffer } | Op::HostWrite { buffer } => {
                let sp = self.span(i, buffer)?;
                let work = if matches!(op, Op::HostRead { .. }) {
                    Work::HostRead { src: sp }
                } else {
                    Work::HostWrite { dst: sp }
                };
                let deps = self.fences(&[buffer]);
                if self.is_done(&deps) {
                    self.host_work = Some(Pending {
                        op: i,
                        work,
                        deps: Vec::new(),
                        progress: 0,
                    });
                } else {
                    // Wait for the fences, then run: re-issue after the wait.
                    self.host_wait = deps;
                    self.next = i;
                }
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.events.insert(event.clone(), None);
                self.done[i] = true;
            }
            Op::EventRecord { event, stream } => {
                let s = self.stream(stream);
                self.events.insert(event.clone(), Some(i));
                self.enqueue(s, i, Work::Marker, Vec::new());
            }
            Op::EventWait { stream, event } => {
                let s = self.stream(stream);
                let deps: Vec<usize> = self
                    .events
                    .get(event)
                    .copied()
                    .flatten()
                    .into_iter()
                    .collect();
                self.enqueue(s, i, Work::Marker, deps);
            }
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                self.host_wait = self
                    .events
                    .get(event)
                    .copied()
                    .flatten()
                    .into_iter()
                    .collect();
                self.done[i] = true;
            }
            Op::EventQuery {
                complete: false, ..
            }
            | Op::StreamQuery {
                complete: false, ..
            } => self.done[i] = true,
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let s = self.stream(stream);
                let mut w: Vec<usize> = self.streams[s].last.into_iter().collect();
                if s == 0 {
                    for b in self.streams.iter().filter(|b| b.blocking && b.device == 0) {
                        w.extend(b.last);
                    }
                }
                self.host_wait = w;
                self.done[i] = true;
            }
            Op::DeviceSync { device } => {
                self.host_wait = self
                    .streams
                    .iter()
                    .filter(|s| s.device == *device)
                    .filter_map(|s| s.last)
                    .collect();
                self.done[i] = true;
            }
            Op::GraphBegin { .. } | Op::GraphEnd { .. } | Op::GraphLaunch { .. } => {
                return Err(Self::unsupported(
                    i,
                    format!("{}: the simulator does not run CUDA graphs yet", op.name()),
                ));
            }
        }
        Ok(())
    }

    /// Makes the program's placement of `[addr, addr + bytes)` usable: one segment per memory
    /// kind from its base up (see [`crate::fuzz::runnable`], which places memory compactly).
    fn place(
        &mut self,
        i: usize,
        memory: MemoryKind,
        addr: u64,
        bytes: u64,
    ) -> Result<(), SimError> {
        let base = PLACED_BASES[memory.index()];
        let inside = addr >= base
            && addr
                .checked_add(bytes)
                .is_some_and(|e| (e - base) / 4 <= MAX_WORDS);
        if !inside {
            return Err(Self::unsupported(
                i,
                format!(
                    "{} memory at {addr:#x} is outside what the simulator can place ({} bytes from {base:#x})",
                    memory.as_str(),
                    4 * MAX_WORDS
                ),
            ));
        }
        self.arena(memory).segments.entry(base).or_default();
        Ok(())
    }

    /// Whether placed device memory `[start, end)`, allocated on stream `owner`, was last freed
    /// to another stream (it went back to the driver).
    fn reappears(&mut self, start: u64, end: u64, owner: usize) -> bool {
        let mut other = false;
        let overlapped: Vec<(u64, u64, usize)> = self
            .freed_to
            .range(..end)
            .filter(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, p))| (s, e, p))
            .collect();
        for (s, e, p) in overlapped {
            other |= p != owner;
            self.freed_to.remove(&s);
            if s < start {
                self.freed_to.insert(s, (start, p));
            }
            if e > end {
                self.freed_to.insert(end, (e, p));
            }
        }
        other
    }
}

/// What an exhaustive exploration saw.
#[derive(Clone, Debug, Default)]
pub struct Exploration {
    /// Complete schedules run.
    pub schedules: usize,
    /// Whether every schedule was explored (false when `limit` cut the search).
    pub complete: bool,
    /// Outcomes that differ from the first schedule's, with the choices that produced them.
    pub divergent: Vec<(Vec<usize>, Outcome)>,
}

/// Runs every schedule of `program` (depth first, up to `limit` schedules) and collects the
/// outcomes that differ from the sequential reference.
pub fn explore(program: &[TraceOp], cfg: SimConfig, limit: usize) -> Result<Exploration, SimError> {
    let reference = reference(program)?;
    let mut ex = Exploration::default();
    let mut prefix: Vec<usize> = Vec::new();
    loop {
        let mut replay = Replay {
            prefix: prefix.clone(),
            trail: Vec::new(),
        };
        let outcome = run(program, &mut replay, cfg)?;
        ex.schedules += 1;
        if outcome.reads != reference.reads || outcome.live != reference.live {
            ex.divergent
                .push((replay.trail.iter().map(|t| t.0).collect(), outcome));
        }
        // Next schedule: bump the deepest choice that has an untried alternative.
        let mut trail = replay.trail;
        while let Some(&(c, n)) = trail.last() {
            if c + 1 < n {
                break;
            }
            trail.pop();
        }
        match trail.last_mut() {
            None => {
                ex.complete = true;
                return Ok(ex);
            }
            Some(last) => last.0 += 1,
        }
        prefix = trail.iter().map(|t| t.0).collect();
        if ex.schedules >= limit {
            return Ok(ex);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{MemoryKind, Op, Region};

    fn ops(v: Vec<Op>) -> Vec<TraceOp> {
        v.into_iter().map(TraceOp::from).collect()
    }

    fn alloc(b: &str, words: u64, s: &str) -> Op {
        Op::Alloc {
            buffer: b.into(),
            bytes: 4 * words,
            stream: Some(s.into()),
            memory: MemoryKind::Device,
            addr: None,
        }
    }

    fn launch(s: &str, reads: &[&str], writes: &[&str]) -> Op {
        Op::Launch {
            stream: s.into(),
            name: None,
            reads: reads.iter().map(|b| Region::whole(*b)).collect(),
            writes: writes.iter().map(|b| Region::whole(*b)).collect(),
        }
    }

    #[test]
    fn ordered_program_has_one_outcome() {
        let p = ops(vec![
            alloc("a", 64, "s1"),
            alloc("b", 64, "s1"),
            launch("s1", &[], &["a"]),
            Op::EventRecord {
                event: "e".into(),
                stream: "s1".into(),
            },
            Op::EventWait {
                stream: "s2".into(),
                event: "e".into(),
            },
            launch("s2", &["a"], &["b"]),
        ]);
        let ex = explore(&p, SimConfig { chunk_words: 32 }, 10_000).unwrap();
        assert!(ex.complete);
        assert!(ex.schedules > 1);
        assert!(ex.divergent.is_empty());
    }

    #[test]
    fn racy_program_tears() {
        let p = ops(vec![
            alloc("a", 64, "s0"),
            alloc("b", 64, "s0"),
            launch("s1", &[], &["a"]),
            launch("s2", &["a"], &["b"]),
        ]);
        let ex = explore(&p, SimConfig { chunk_words: 32 }, 10_000).unwrap();
        assert!(ex.complete);
        assert!(
            !ex.divergent.is_empty(),
            "a read racing a write must tear in some schedule"
        );
    }

    #[test]
    fn reuse_without_record_stream_corrupts_under_adversarial_schedule() {
        let p = ops(vec![
            alloc("a", 64, "s1"),
            alloc("out", 64, "s2"),
            launch("s1", &[], &["a"]),
            Op::EventRecord {
                event: "e".into(),
                stream: "s1".into(),
            },
            Op::EventWait {
                stream: "s2".into(),
                event: "e".into(),
            },
            launch("s2", &["a"], &["out"]),
            Op::Free {
                buffer: "a".into(),
                stream: None,
            },
            alloc("b", 64, "s1"),
            launch("s1", &[], &["b"]),
        ]);
        let r = reference(&p).unwrap();
        let mut adv = Adversarial {
            holds: vec![(5, 8)],
            rng: SplitMix::new(1),
            starve: false,
        };
        let o = run(&p, &mut adv, SimConfig::default()).unwrap();
        assert_eq!(o.diverging(&r), vec![Id::from("a"), Id::from("out")]);
        let mut fixed = p.clone();
        fixed.insert(
            6,
            TraceOp::from(Op::RecordStream {
                buffer: "a".into(),
                stream: "s2".into(),
            }),
        );
        let r = reference(&fixed).unwrap();
        let mut adv = Adversarial {
            holds: vec![(5, 9)],
            rng: SplitMix::new(1),
            starve: false,
        };
        let o = run(&fixed, &mut adv, SimConfig::default()).unwrap();
        assert!(o.diverging(&r).is_empty(), "record_stream fences the reuse");
    }
}
