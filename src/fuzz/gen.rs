//! The random program generator: multi-stream programs with the synchronization they need, except
//! where a coin leaves it out.
//!
//! # How a program is built
//!
//! A program is a list of trace-format ops over streams `s0`…`s3` (created with `stream_create`,
//! non-blocking) and, with [`GenConfig::blocking`], the blocking stream `b` and the legacy
//! `"default"` stream; buffers `x0`, `x1`, … (device memory owned by a stream, or pinned host
//! memory); and events `e0`…`e5`. Each step picks one of: an allocation (often followed by a
//! first touch), a kernel launch over whole buffers and sub-regions, a copy (device↔device,
//! pinned↔device), a memset, a host read or write of pinned memory, a free (caching or
//! stream-ordered, often followed by an allocation of the same size on the same stream so that
//! the allocator hands the same block out again), a host sync or query, or — only with
//! [`GenConfig::use_after_free`] and `missing_sync > 0.5` — a use of a freed buffer.
//!
//! Before every access the generator asks its model which earlier accesses by other participants
//! it conflicts with and does not already happen after — on the same buffer, or on the same bytes
//! of an earlier, freed buffer — and before every free which accesses do not happen before the
//! free. For each such participant it inserts one synchronization: an `event_record` (just now,
//! or reusing an event recorded right after the earlier access) with an `event_wait`, a host sync
//! (`stream_sync`, `device_sync`, `event_sync`, a successful query), or for a free a
//! `record_stream` — unless a coin with probability [`GenConfig::missing_sync`] says to leave it
//! out (sometimes waiting on a stale event instead, the "event recorded too early" bug). That is
//! how hazards are planted: data races, unsafe frees, and reuse races when the block of an unsafe
//! free is handed out again.
//!
//! # The model
//!
//! The generator keeps its own small model of the trace format's happens-before rules (vector
//! clocks over the host and the streams, events as snapshots, host syncs, the legacy default
//! stream, allocations and frees as uses) written from the format, not borrowed from the checker,
//! so that the two check each other. Addresses come from the allocator policies of
//! [`crate::alloc`], the same policies the checker, the simulator and the GPU backend use, so the
//! model knows which freed bytes a new buffer reuses.
//!
//! # Guarantee
//!
//! Every program satisfies [`validate`] and is valid input for the checker. With
//! `missing_sync == 0` every program is free of hazards under the trace format. The same
//! configuration and seed (or decision words) give the same program. The id of an op, for the
//! simulator and the GPU kernels, is its index in [`Program::ops`].

use std::collections::{HashMap, HashSet};
use std::fmt;

use proptest::strategy::Strategy;

use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator, ModelMemory};
use crate::checker::{CheckError, Checker};
use crate::report::{HazardKind, Report};
use crate::trace::{
    Id, MemoryKind, Op, OpParticipant, Region, Site, TraceOp, DEFAULT_STREAM, HOST,
};
use crate::workload::SplitMix;

/// Knobs of the generator.
#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    /// Target length in ops: [`generate`] returns exactly this many, [`arb_program`] at most.
    pub ops: usize,
    /// Number of non-default streams `s0`, `s1`, … (1..=4; other values are clamped).
    pub streams: u32,
    /// Number of distinct buffer names `x0`, `x1`, … (1..=6 is typical; at least 1).
    pub buffers: u32,
    /// Probability (0..=1) that a needed synchronization is left out. Once a free is left unsafe,
    /// accesses that reuse its bytes are not repaired either (the bug carries on into the reuse).
    pub missing_sync: f64,
    /// Whether pinned host buffers (host reads and writes, pinned↔device copies) appear.
    pub pinned: bool,
    /// Whether the blocking stream `b` and the legacy `"default"` stream appear.
    pub blocking: bool,
    /// Whether stream-ordered frees (`cudaFreeAsync`) appear besides caching frees.
    pub stream_ordered_free: bool,
    /// Whether uses of freed buffers may appear; they do only when `missing_sync > 0.5`.
    pub use_after_free: bool,
    /// Largest buffer size in 4-byte words (at least 4: every buffer has at least 16 bytes).
    pub max_words: u32,
    /// Write every new buffer whole on its owner right after allocating it, so no program reads
    /// uninitialized memory. A GPU leaves the previous owner's bytes there, whose value depends on
    /// timing even in a program free of hazards; the simulator makes such reads deterministic,
    /// a GPU cannot. A program then may end a few ops short of `ops` rather than between an
    /// allocation and its initializing write.
    pub initialize: bool,
}

impl Default for GenConfig {
    /// 40 ops over 3 streams and 4 buffer names of up to 1 KiB, every feature on except
    /// use-after-free, with 20% of the needed synchronizations left out.
    fn default() -> Self {
        GenConfig {
            ops: 40,
            streams: 3,
            buffers: 4,
            missing_sync: 0.2,
            pinned: true,
            blocking: true,
            stream_ordered_free: true,
            use_after_free: false,
            max_words: 256,
            initialize: false,
        }
    }
}

/// A generated program: the ops in issue order. The id of an op, which the simulator and the GPU
/// kernels use, is its index in `ops` (its op index in reports).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Program {
    /// The ops, numbered from 0.
    pub ops: Vec<TraceOp>,
}

impl Program {
    /// The program as a trace: JSON Lines, one op a line, that `streamsan check` reads.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            out.push_str(&op_line(op));
            out.push('\n');
        }
        out
    }

    /// Runs the checker over the program: its report, or the first op it refused.
    pub fn check(&self) -> Result<Report, CheckError> {
        let mut checker = Checker::new();
        for op in &self.ops {
            checker.check(op)?;
        }
        Ok(checker.finish())
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_jsonl())
    }
}

impl fmt::Debug for Program {
    /// The trace, so that a failing proptest case prints a file `streamsan check` reproduces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Program of {} ops:", self.ops.len())?;
        f.write_str(&self.to_jsonl())
    }
}

/// A program from a seeded generator (for `streamsan fuzz --seed S`).
pub fn generate(cfg: &GenConfig, rng: &mut SplitMix) -> Program {
    Builder::new(cfg, Rng(rng)).run()
}

/// A program from decision words, one vector of words per step of the generator: each word drives
/// one choice of its step, and a missing word (past the end of its step's vector) or a zero word
/// takes the simplest choice. The program ends when the steps do (or at [`GenConfig::ops`]).
/// Fewer steps give a shorter program, fewer or smaller words a simpler one; removing a step
/// leaves the words of the other steps as they were.
pub fn generate_from_words(cfg: &GenConfig, steps: &[Vec<u64>]) -> Program {
    Builder::new(
        cfg,
        Steps {
            steps,
            step: None,
            at: 0,
        },
    )
    .run()
}

/// A proptest strategy for programs that shrinks to minimal programs.
///
/// It draws decision words, one vector per step, and feeds them to [`generate_from_words`];
/// proptest shrinks the vectors (fewer steps, fewer words, words towards 0), which shortens and
/// simplifies the program, and every shrunk program is again a generated one, so it satisfies
/// [`validate`].
pub fn arb_program(cfg: GenConfig) -> impl Strategy<Value = Program> {
    let step = proptest::collection::vec(proptest::arbitrary::any::<u64>(), 0..=WORDS_PER_STEP);
    proptest::collection::vec(step, 0..=cfg.ops.max(1))
        .prop_map(move |steps| generate_from_words(&cfg, &steps))
}

/// The most decision words [`arb_program`] draws for one step (a step with many regions and
/// synchronizations may ask for more; those take the simplest choice).
const WORDS_PER_STEP: usize = 32;

// ---------------------------------------------------------------------------------------------
// Decisions

/// Where the generator's choices come from.
trait Decisions {
    /// Starts the next step; false when no steps are left (the program ends).
    fn next_step(&mut self) -> bool;
    /// The next decision word of the current step.
    fn word(&mut self) -> u64;
}

struct Rng<'a>(&'a mut SplitMix);

impl Decisions for Rng<'_> {
    fn next_step(&mut self) -> bool {
        true
    }

    fn word(&mut self) -> u64 {
        self.0.next_u64()
    }
}

struct Steps<'a> {
    steps: &'a [Vec<u64>],
    step: Option<usize>,
    at: usize,
}

impl Decisions for Steps<'_> {
    fn next_step(&mut self) -> bool {
        let next = self.step.map_or(0, |s| s + 1);
        self.step = Some(next);
        self.at = 0;
        next < self.steps.len()
    }

    fn word(&mut self) -> u64 {
        let words = self.step.and_then(|s| self.steps.get(s));
        let w = words.and_then(|v| v.get(self.at)).copied().unwrap_or(0);
        self.at += 1;
        w
    }
}

// ---------------------------------------------------------------------------------------------
// Participants and names

/// Participant indices of the model: the host, the legacy default stream, the blocking stream
/// `b`, then `s0`…`s3`.
const HOST_P: usize = 0;
const DEFAULT_P: usize = 1;
const BLOCKING_P: usize = 2;
const FIRST_S: usize = 3;
const MAX_STREAMS: u32 = 4;
const PARTICIPANTS: usize = FIRST_S + MAX_STREAMS as usize;
/// Number of event names `e0`…
const EVENTS: usize = 6;

type Clock = [u64; PARTICIPANTS];

fn join(into: &mut Clock, other: &Clock) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = (*a).max(*b);
    }
}

fn stream_name(p: usize) -> Id {
    match p {
        DEFAULT_P => Id::from(DEFAULT_STREAM),
        BLOCKING_P => Id::from("b"),
        _ => Id::from(format!("s{}", p - FIRST_S)),
    }
}

/// The participant of a stream name the generator wrote.
fn stream_index(name: &Id) -> usize {
    match name.as_str() {
        DEFAULT_STREAM => DEFAULT_P,
        "b" => BLOCKING_P,
        s => FIRST_S + s[1..].parse::<usize>().unwrap_or(0),
    }
}

fn buffer_name(slot: usize) -> Id {
    Id::from(format!("x{slot}"))
}

fn event_name(e: usize) -> Id {
    Id::from(format!("e{e}"))
}

/// The number in a generated name such as `x3` or `e1`.
fn name_number(name: &Id) -> usize {
    name.as_str()[1..].parse().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The model

/// One access: who, when (the participant's own component), and which bytes of its buffer.
#[derive(Clone, Copy, Debug)]
struct Access {
    p: usize,
    t: u64,
    write: bool,
    lo: u64,
    hi: u64,
}

/// One allocation (a generation of a buffer name).
#[derive(Clone, Debug)]
struct Buffer {
    slot: usize,
    memory: MemoryKind,
    /// The owning stream of device memory; the host for pinned memory.
    owner: usize,
    bytes: u64,
    addr: u64,
    live: bool,
    accesses: Vec<Access>,
    /// Streams named by `record_stream` (not the owning stream of device memory).
    record: Vec<usize>,
    /// Once freed: the join of the clocks of the `record` streams at the free. What it covers
    /// happens before every reuse of the buffer's bytes (the allocator waits for events
    /// recorded on those streams at the free).
    excused: Clock,
    /// Whether a synchronization its free needed was left out: the bug then carries on into the
    /// reuse of its bytes instead of being repaired there.
    sloppy: bool,
}

/// An access of an op: buffer, byte range, whether it writes.
#[derive(Clone, Copy, Debug)]
struct Touch {
    buf: usize,
    lo: u64,
    hi: u64,
    write: bool,
}

/// A synchronization an op needs: participant `from`'s access at time `t` must happen before it.
#[derive(Clone, Copy, Debug)]
struct Need {
    from: usize,
    t: u64,
    /// Whether every conflict behind it is with a freed buffer whose free was left unsafe.
    sloppy: bool,
}

fn add_need(needs: &mut Vec<Need>, from: usize, t: u64, sloppy: bool) {
    match needs.iter_mut().find(|n| n.from == from) {
        Some(n) => {
            n.t = n.t.max(t);
            n.sloppy &= sloppy;
        }
        None => needs.push(Need { from, t, sloppy }),
    }
}

/// The happens-before rules and the memory of the trace format, interpreting generated ops.
struct Model {
    clocks: [Clock; PARTICIPANTS],
    /// Event number → its capture, if recorded.
    events: Vec<Option<Clock>>,
    bufs: Vec<Buffer>,
    /// Buffer name → its latest allocation.
    slots: Vec<Option<usize>>,
    device: DeviceCachingAllocator<ModelMemory>,
    pinned: HostCachingAllocator<ModelMemory>,
}

impl Model {
    fn new(names: usize) -> Self {
        Model {
            clocks: [[0; PARTICIPANTS]; PARTICIPANTS],
            events: vec![None; EVENTS],
            bufs: Vec::new(),
            slots: vec![None; names],
            device: DeviceCachingAllocator::new(ModelMemory::new(0x7f00_0000_0000)),
            pinned: HostCachingAllocator::new(ModelMemory::new(0x2000_0000_0000)),
        }
    }

    /// The clock an op on `p` runs with: for a stream, joined with the host's (rule 2) and the
    /// legacy default stream's implicit edges (rule 5).
    fn issue_clock(&self, p: usize) -> Clock {
        let mut c = self.clocks[p];
        if p != HOST_P {
            join(&mut c, &self.clocks[HOST_P]);
            if p == DEFAULT_P {
                join(&mut c, &self.clocks[BLOCKING_P]);
            } else if p == BLOCKING_P {
                join(&mut c, &self.clocks[DEFAULT_P]);
            }
        }
        c
    }

    fn begin(&mut self, p: usize) {
        self.clocks[p] = self.issue_clock(p);
    }

    /// The capture of event number `e`, if recorded.
    fn event(&self, e: usize) -> Option<Clock> {
        self.events.get(e).copied().flatten()
    }

    fn set_event(&mut self, event: &Id, capture: Option<Clock>) {
        let e = name_number(event);
        if self.events.len() <= e {
            self.events.resize(e + 1, None);
        }
        self.events[e] = capture;
    }

    fn host_join(&mut self, c: Clock) {
        join(&mut self.clocks[HOST_P], &c);
    }

    /// The live buffer a name denotes.
    fn live(&self, name: &Id) -> Option<usize> {
        let b = (*self.slots.get(name_number(name))?)?;
        self.bufs[b].live.then_some(b)
    }

    /// Who frees buffer `b`: the named stream, else the owning stream of device memory, else the
    /// host.
    fn freer(&self, b: usize, named: Option<usize>) -> usize {
        let buf = &self.bufs[b];
        named.unwrap_or(if buf.memory == MemoryKind::Device {
            buf.owner
        } else {
            HOST_P
        })
    }

    /// The clock a free of `b` would carry now.
    fn free_clock(&self, b: usize, named: Option<usize>) -> Clock {
        let by = self.freer(b, named);
        let mut c = if named.is_some() {
            self.issue_clock(by)
        } else {
            let mut c = self.clocks[HOST_P];
            join(&mut c, &self.clocks[by]);
            c
        };
        for &r in &self.bufs[b].record {
            join(&mut c, &self.clocks[r]);
        }
        c
    }

    /// The live regions an op touches (regions of freed buffers are uses after free, not
    /// accesses). A region both read and written counts as written.
    fn touches(&self, op: &Op) -> Vec<Touch> {
        let mut out: Vec<Touch> = Vec::new();
        for access in op.accesses() {
            let (r, write) = (access.region, access.write);
            if let Some(b) = self.live(&r.buffer) {
                let lo = r.offset;
                let hi = r.bytes.map_or(self.bufs[b].bytes, |n| lo + n);
                let dup = out
                    .iter()
                    .any(|t| t.buf == b && t.lo == lo && t.hi == hi && t.write);
                if !dup {
                    out.push(Touch {
                        buf: b,
                        lo,
                        hi,
                        write,
                    });
                }
            }
        }
        out
    }

    /// Calls `f(from, t, reuse, sloppy)` for every earlier access that an access by `p` to
    /// `touches` conflicts with and does not happen after: by another participant, overlapping,
    /// one of the two a write, on the same buffer or (`reuse`) on the same bytes of an earlier,
    /// freed buffer, unless a stream named by `record_stream` for it had synchronized with the
    /// access by the free. `sloppy`: that
    /// buffer's free was left unsafe.
    fn conflicts(&self, p: usize, touches: &[Touch], mut f: impl FnMut(usize, u64, bool, bool)) {
        let c = self.issue_clock(p);
        for t in touches {
            let buf = &self.bufs[t.buf];
            for a in &buf.accesses {
                if a.p != p && (t.write || a.write) && a.lo < t.hi && t.lo < a.hi && c[a.p] < a.t {
                    f(a.p, a.t, false, false);
                }
            }
            let (lo, hi) = (buf.addr + t.lo, buf.addr + t.hi);
            for old in &self.bufs {
                if old.live || old.memory != buf.memory {
                    continue;
                }
                for a in &old.accesses {
                    let (alo, ahi) = (old.addr + a.lo, old.addr + a.hi);
                    if a.p != p
                        && (t.write || a.write)
                        && alo < hi
                        && lo < ahi
                        && c[a.p] < a.t
                        && old.excused[a.p] < a.t
                    {
                        f(a.p, a.t, true, old.sloppy);
                    }
                }
            }
        }
    }

    /// What an access by `p` to `touches` must be ordered after, one need per participant.
    fn access_needs(&self, p: usize, touches: &[Touch]) -> Vec<Need> {
        let mut needs = Vec::new();
        self.conflicts(p, touches, |from, t, _, sloppy| {
            add_need(&mut needs, from, t, sloppy)
        });
        needs
    }

    /// What a free of `b` (by `named`, or the default freer) must be ordered after.
    fn free_needs(&self, b: usize, named: Option<usize>) -> Vec<Need> {
        let by = self.freer(b, named);
        let c = self.free_clock(b, named);
        let mut needs = Vec::new();
        for a in &self.bufs[b].accesses {
            if a.p != by && c[a.p] < a.t {
                add_need(&mut needs, a.p, a.t, false);
            }
        }
        needs
    }

    /// Applies one op.
    fn apply(&mut self, op: &Op) {
        match op {
            Op::StreamCreate { .. } => {}
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                ..
            } => {
                let device = *memory == MemoryKind::Device;
                let owner = if device {
                    stream.as_ref().map_or(DEFAULT_P, stream_index)
                } else {
                    HOST_P
                };
                let block = if device {
                    self.device.allocate(*bytes, owner as u32)
                } else {
                    self.pinned.allocate(*bytes)
                };
                let addr = block.ok().flatten().map_or(0, |b| b.addr);
                // The allocation is a use: a write by the owning stream at its latest access.
                let t = self.clocks[owner][owner];
                let mut accesses = Vec::new();
                if device && t > 0 {
                    accesses.push(Access {
                        p: owner,
                        t,
                        write: true,
                        lo: 0,
                        hi: *bytes,
                    });
                }
                let slot = name_number(buffer);
                if self.slots.len() <= slot {
                    self.slots.resize(slot + 1, None);
                }
                self.slots[slot] = Some(self.bufs.len());
                self.bufs.push(Buffer {
                    slot,
                    memory: *memory,
                    owner,
                    bytes: *bytes,
                    addr,
                    live: true,
                    accesses,
                    record: Vec::new(),
                    excused: [0; PARTICIPANTS],
                    sloppy: false,
                });
            }
            Op::Free { buffer, stream } => {
                let Some(b) = self.live(buffer) else { return };
                let named = stream.as_ref().map(stream_index);
                let by = self.freer(b, named);
                if named.is_some() {
                    self.begin(by);
                }
                let mut excused = [0; PARTICIPANTS];
                for &r in &self.bufs[b].record {
                    join(&mut excused, &self.clocks[r]);
                }
                let buf = &mut self.bufs[b];
                buf.live = false;
                buf.excused = excused;
                // The model handed this block out, so giving it back cannot fail.
                let _ = if buf.memory == MemoryKind::Device {
                    self.device.free(buf.addr, by as u32)
                } else {
                    self.pinned.free(buf.addr)
                };
            }
            Op::RecordStream { buffer, stream } => {
                if let Some(b) = self.live(buffer) {
                    let q = stream_index(stream);
                    let buf = &mut self.bufs[b];
                    let owner = buf.memory == MemoryKind::Device && buf.owner == q;
                    if !owner && !buf.record.contains(&q) {
                        buf.record.push(q);
                    }
                }
            }
            Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
                let p = stream_index(stream);
                self.access(p, op);
            }
            Op::HostRead { .. } | Op::HostWrite { .. } => self.access(HOST_P, op),
            Op::EventCreate { event } | Op::EventDestroy { event } => self.set_event(event, None),
            Op::EventRecord { event, stream } => {
                let p = stream_index(stream);
                self.begin(p);
                self.set_event(event, Some(self.clocks[p]));
            }
            Op::EventWait { stream, event } => {
                let p = stream_index(stream);
                self.begin(p);
                if let Some(c) = self.event(name_number(event)) {
                    join(&mut self.clocks[p], &c);
                }
            }
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                if let Some(c) = self.event(name_number(event)) {
                    self.host_join(c);
                }
            }
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let p = stream_index(stream);
                self.host_join(self.clocks[p]);
                if p == DEFAULT_P {
                    self.host_join(self.clocks[BLOCKING_P]);
                }
            }
            Op::DeviceSync { .. } => {
                for p in DEFAULT_P..PARTICIPANTS {
                    self.host_join(self.clocks[p]);
                }
            }
            Op::EventQuery { .. } | Op::StreamQuery { .. } => {}
        }
    }

    fn access(&mut self, p: usize, op: &Op) {
        let touches = self.touches(op);
        if p != HOST_P {
            self.begin(p);
        }
        self.clocks[p][p] += 1;
        let t = self.clocks[p][p];
        for x in touches {
            self.bufs[x.buf].accesses.push(Access {
                p,
                t,
                write: x.write,
                lo: x.lo,
                hi: x.hi,
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The builder

/// A region of a live buffer as the generator picks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    buf: usize,
    lo: u64,
    hi: u64,
    whole: bool,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.buf == other.buf && self.lo < other.hi && other.lo < self.hi
    }
}

struct Builder<D> {
    cfg: GenConfig,
    src: D,
    ops: Vec<TraceOp>,
    model: Model,
    /// The streams programs use.
    streams: Vec<usize>,
    created: [bool; PARTICIPANTS],
    /// Event names handed out so far (`e0`…).
    events_used: usize,
}

impl<D: Decisions> Builder<D> {
    fn new(cfg: &GenConfig, src: D) -> Self {
        let mut cfg = cfg.clone();
        cfg.streams = cfg.streams.clamp(1, MAX_STREAMS);
        cfg.buffers = cfg.buffers.max(1);
        cfg.max_words = cfg.max_words.max(4);
        cfg.missing_sync = if cfg.missing_sync.is_nan() {
            0.0
        } else {
            cfg.missing_sync.clamp(0.0, 1.0)
        };
        let mut streams: Vec<usize> = (0..cfg.streams as usize).map(|i| FIRST_S + i).collect();
        if cfg.blocking {
            streams.push(BLOCKING_P);
            streams.push(DEFAULT_P);
        }
        Builder {
            model: Model::new(cfg.buffers as usize),
            cfg,
            src,
            ops: Vec::new(),
            streams,
            created: [false; PARTICIPANTS],
            events_used: 0,
        }
    }

    fn run(mut self) -> Program {
        while self.ops.len() < self.cfg.ops && self.src.next_step() {
            self.step();
        }
        // A prefix of a generated program is one too: it stops between ops.
        self.ops.truncate(self.cfg.ops);
        if self.cfg.initialize {
            // ... but not between an allocation and the write that initializes it.
            while let Some(k) = self
                .ops
                .iter()
                .rposition(|o| matches!(o.op, Op::Alloc { .. }))
            {
                let Op::Alloc { buffer, .. } = &self.ops[k].op else {
                    break;
                };
                let whole = Region::whole(buffer.clone());
                let initialized = self.ops[k + 1..].iter().any(|o| match &o.op {
                    Op::Memset { dst, .. } => *dst == whole,
                    Op::HostWrite { buffer } => *buffer == whole,
                    _ => false,
                });
                if initialized {
                    break;
                }
                self.ops.truncate(k);
            }
        }
        Program { ops: self.ops }
    }

    // --- choices (a zero word always takes the first, simplest option)

    fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            0
        } else {
            self.src.word() % n
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        let u = (self.src.word() >> 11) as f64 / (1u64 << 53) as f64;
        u >= 1.0 - p
    }

    /// An index with probability proportional to its weight (the total must be positive).
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| w as u64).sum();
        let mut x = self.below(total);
        for (i, &w) in weights.iter().enumerate() {
            if x < w as u64 {
                return i;
            }
            x -= w as u64;
        }
        0
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    fn pick_stream(&mut self) -> usize {
        let streams = self.streams.clone();
        self.pick(&streams)
    }

    fn live_bufs(&self, memory: MemoryKind) -> Vec<usize> {
        (0..self.model.slots.len())
            .filter_map(|s| self.model.slots[s])
            .filter(|&b| self.model.bufs[b].live && self.model.bufs[b].memory == memory)
            .collect()
    }

    fn free_slots(&self) -> Vec<usize> {
        (0..self.model.slots.len())
            .filter(|&s| self.model.slots[s].is_none_or(|b| !self.model.bufs[b].live))
            .collect()
    }

    /// Names whose latest buffer is freed.
    fn freed_slots(&self) -> Vec<usize> {
        (0..self.model.slots.len())
            .filter(|&s| self.model.slots[s].is_some_and(|b| !self.model.bufs[b].live))
            .collect()
    }

    // --- emitting

    fn emit(&mut self, op: Op) {
        if let Some(s) = op.stream() {
            let p = stream_index(s);
            if p != DEFAULT_P && !self.created[p] {
                self.created[p] = true;
                self.ops.push(
                    Op::StreamCreate {
                        stream: s.clone(),
                        device: 0,
                        blocking: p == BLOCKING_P,
                    }
                    .into(),
                );
            }
        }
        self.model.apply(&op);
        self.ops.push(op.into());
    }

    fn region(&self, s: Span) -> Region {
        let name = buffer_name(self.model.bufs[s.buf].slot);
        if s.whole {
            Region::whole(name)
        } else {
            Region::range(name, s.lo, s.hi - s.lo)
        }
    }

    /// An event to record: a new name while there are some left, or one in use.
    fn pick_event(&mut self) -> usize {
        if self.events_used < EVENTS && (self.events_used == 0 || self.chance(0.5)) {
            let e = self.events_used;
            self.events_used += 1;
            if self.chance(0.3) {
                self.emit(Op::EventCreate {
                    event: event_name(e),
                });
            }
            e
        } else {
            self.below(self.events_used as u64) as usize
        }
    }

    fn record(&mut self, p: usize) -> usize {
        let e = self.pick_event();
        self.emit(Op::EventRecord {
            event: event_name(e),
            stream: stream_name(p),
        });
        e
    }

    /// Recorded events whose capture covers `from`'s access at `t` (or, with `stale`, does not).
    fn events_covering(&self, from: usize, t: u64, stale: bool) -> Vec<usize> {
        (0..EVENTS)
            .filter(|&e| {
                self.model
                    .event(e)
                    .is_some_and(|c| if stale { c[from] < t } else { c[from] >= t })
            })
            .collect()
    }

    // --- synchronization

    /// Orders `need` before the next op of `target` (a stream, or the host), or — with
    /// probability `missing_sync` — leaves it out; returns whether it was inserted. `free` is the
    /// buffer when the next op is its free (then `record_stream` is a way too).
    fn sync(&mut self, target: usize, need: Need, free: Option<usize>) -> bool {
        debug_assert_ne!(
            need.from, HOST_P,
            "the host's accesses are ordered before everything"
        );
        if need.sloppy || self.chance(self.cfg.missing_sync) {
            // Sometimes the wait is there but on an event recorded too early.
            if target != HOST_P && self.chance(0.3) {
                let stale = self.events_covering(need.from, need.t, true);
                if !stale.is_empty() {
                    let e = self.pick(&stale);
                    self.emit(Op::EventWait {
                        stream: stream_name(target),
                        event: event_name(e),
                    });
                }
            }
            return false;
        }
        let covering = self.events_covering(need.from, need.t, false);
        let record_stream = free.filter(|&b| {
            let buf = &self.model.bufs[b];
            !(buf.memory == MemoryKind::Device && buf.owner == need.from)
        });
        let on_stream = target != HOST_P;
        let how = self.weighted(&[
            if on_stream { 5 } else { 0 },
            if on_stream && !covering.is_empty() {
                4
            } else {
                0
            },
            3,
            if record_stream.is_some() { 5 } else { 0 },
        ]);
        match how {
            0 => {
                let e = self.record(need.from);
                self.emit(Op::EventWait {
                    stream: stream_name(target),
                    event: event_name(e),
                });
            }
            1 => {
                let e = self.pick(&covering);
                self.emit(Op::EventWait {
                    stream: stream_name(target),
                    event: event_name(e),
                });
            }
            2 => self.host_sync(need.from, &covering),
            _ => {
                if let Some(b) = record_stream {
                    self.emit(Op::RecordStream {
                        buffer: buffer_name(self.model.bufs[b].slot),
                        stream: stream_name(need.from),
                    });
                }
            }
        }
        true
    }

    /// Makes the host wait for stream `from`'s work so far (`covering`: events that capture
    /// enough of it).
    fn host_sync(&mut self, from: usize, covering: &[usize]) {
        let stream = stream_name(from);
        match self.weighted(&[4, 2, 2, 3, 1]) {
            0 => self.emit(Op::StreamSync { stream }),
            1 => self.emit(Op::StreamQuery {
                stream,
                complete: true,
            }),
            2 => self.emit(Op::DeviceSync { device: 0 }),
            how => {
                let e = if !covering.is_empty() && self.chance(0.5) {
                    self.pick(covering)
                } else {
                    self.record(from)
                };
                let event = event_name(e);
                self.emit(if how == 3 {
                    Op::EventSync { event }
                } else {
                    Op::EventQuery {
                        event,
                        complete: true,
                    }
                });
            }
        }
    }

    /// Emits an access op of participant `p`, after the synchronization it needs.
    fn access(&mut self, p: usize, op: Op) {
        let touches = self.model.touches(&op);
        for need in self.model.access_needs(p, &touches) {
            self.sync(p, need, None);
        }
        self.emit(op);
        if p != HOST_P {
            // Record an event right after the access, for a later consumer to wait on.
            if self.chance(0.25) {
                self.record(p);
            }
            // PyTorch's idiom: a side stream that used a tensor records itself on it.
            if self.chance(0.1) {
                let other = touches.iter().map(|t| t.buf).find(|&b| {
                    let buf = &self.model.bufs[b];
                    buf.memory == MemoryKind::Device && buf.owner != p
                });
                if let Some(b) = other {
                    self.emit(Op::RecordStream {
                        buffer: buffer_name(self.model.bufs[b].slot),
                        stream: stream_name(p),
                    });
                }
            }
        }
    }

    // --- regions

    fn words_of(&self, b: usize) -> u64 {
        self.model.bufs[b].bytes / 4
    }

    /// A region of buffer `b`: the whole buffer, an aligned half or quarter, or any range.
    fn span(&mut self, b: usize) -> Span {
        let w = self.words_of(b);
        let (lo, len) = match self.weighted(&[4, 3, 3]) {
            0 => {
                return Span {
                    buf: b,
                    lo: 0,
                    hi: w * 4,
                    whole: true,
                }
            }
            1 => {
                let parts = if self.chance(0.5) { 4 } else { 2 };
                let chunk = w / parts;
                (self.below(parts) * chunk, chunk)
            }
            _ => {
                let lo = self.below(w);
                (lo, 1 + self.below(w - lo))
            }
        };
        Span {
            buf: b,
            lo: lo * 4,
            hi: (lo + len) * 4,
            whole: false,
        }
    }

    fn range_span(b: usize, lo_words: u64, len_words: u64) -> Span {
        Span {
            buf: b,
            lo: lo_words * 4,
            hi: (lo_words + len_words) * 4,
            whole: false,
        }
    }

    /// Source and destination of equal length in two different buffers.
    fn copy_pair(&mut self, src: usize, dst: usize) -> (Span, Span) {
        let (ws, wd) = (self.words_of(src), self.words_of(dst));
        if ws == wd && !self.chance(0.5) {
            let whole = |b| Span {
                buf: b,
                lo: 0,
                hi: ws * 4,
                whole: true,
            };
            return (whole(src), whole(dst));
        }
        let len = 1 + self.below(ws.min(wd));
        let so = self.below(ws - len + 1);
        let d_o = self.below(wd - len + 1);
        (
            Self::range_span(src, so, len),
            Self::range_span(dst, d_o, len),
        )
    }

    /// Source and destination of equal length in one buffer, in different halves.
    fn copy_within(&mut self, b: usize) -> (Span, Span) {
        let w = self.words_of(b);
        let h = w / 2;
        let len = 1 + self.below(h);
        let a = self.below(h - len + 1);
        let c = h + self.below(w - h - len + 1);
        let (x, y) = (Self::range_span(b, a, len), Self::range_span(b, c, len));
        if self.chance(0.5) {
            (y, x)
        } else {
            (x, y)
        }
    }

    fn pick_words(&mut self) -> u64 {
        let m = self.cfg.max_words as u64;
        let w = match self.weighted(&[3, 2, 2, 2, 3]) {
            0 => m,
            1 => 4,
            2 => m / 2,
            3 => 16,
            _ => 4 + self.below(m - 3),
        };
        w.clamp(4, m)
    }

    // --- steps

    fn step(&mut self) {
        let dev = !self.live_bufs(MemoryKind::Device).is_empty();
        let pinned = !self.live_bufs(MemoryKind::Pinned).is_empty();
        let live = dev || pinned;
        let uaf = self.cfg.use_after_free
            && self.cfg.missing_sync > 0.5
            && !self.freed_slots().is_empty();
        let weights = [
            if self.free_slots().is_empty() { 0 } else { 12 },
            if dev { 24 } else { 0 },
            if dev { 12 } else { 0 },
            if dev { 5 } else { 0 },
            if pinned { 8 } else { 0 },
            if live { 9 } else { 0 },
            6,
            if uaf { 2 } else { 0 },
        ];
        match self.weighted(&weights) {
            0 => self.step_alloc(),
            1 => self.step_launch(),
            2 => self.step_copy(),
            3 => self.step_memset(),
            4 => self.step_host(),
            5 => self.step_free(),
            6 => self.step_sync(),
            _ => self.step_use_after_free(),
        }
    }

    fn alloc(&mut self, slot: usize, words: u64, memory: MemoryKind, stream: Option<usize>) {
        self.emit(Op::Alloc {
            buffer: buffer_name(slot),
            bytes: words * 4,
            stream: stream.map(stream_name),
            memory,
            addr: None,
        });
        if self.cfg.initialize {
            let whole = Region::whole(buffer_name(slot));
            match stream.filter(|_| memory == MemoryKind::Device) {
                Some(s) => self.access(
                    s,
                    Op::Memset {
                        stream: stream_name(s),
                        dst: whole,
                    },
                ),
                None => self.access(HOST_P, Op::HostWrite { buffer: whole }),
            }
        }
    }

    fn step_alloc(&mut self) {
        let slots = self.free_slots();
        let slot = self.pick(&slots);
        let words = self.pick_words();
        if self.cfg.pinned && self.chance(0.3) {
            self.alloc(slot, words, MemoryKind::Pinned, None);
            if self.cfg.initialize {
                let buffer = Region::whole(buffer_name(slot));
                self.access(HOST_P, Op::HostWrite { buffer });
            }
        } else {
            let s = self.pick_stream();
            self.alloc(slot, words, MemoryKind::Device, Some(s));
            if self.cfg.initialize {
                let dst = Region::whole(buffer_name(slot));
                self.access(
                    s,
                    Op::Memset {
                        stream: stream_name(s),
                        dst,
                    },
                );
            }
        }
        if self.chance(0.5) {
            self.touch_new(slot);
        }
    }

    /// A first access of the buffer just allocated under `slot`: a kernel or memset on its
    /// stream or another for device memory, a host write or a copy into it for pinned memory.
    fn touch_new(&mut self, slot: usize) {
        let Some(b) = self.model.slots[slot] else {
            return;
        };
        let buf = &self.model.bufs[b];
        let (memory, owner) = (buf.memory, buf.owner);
        if memory == MemoryKind::Device {
            let p = if self.chance(0.5) {
                self.pick_stream()
            } else {
                owner
            };
            let dst = self.span(b);
            let op = if self.chance(0.3) {
                Op::Memset {
                    stream: stream_name(p),
                    dst: self.region(dst),
                }
            } else {
                Op::Launch {
                    stream: stream_name(p),
                    name: None,
                    reads: vec![],
                    writes: vec![self.region(dst)],
                }
            };
            self.access(p, op);
        } else {
            let dev = self.live_bufs(MemoryKind::Device);
            if !dev.is_empty() && self.chance(0.4) {
                let src = self.pick(&dev);
                let p = self.pick_stream();
                let (s, d) = self.copy_pair(src, b);
                let op = Op::Copy {
                    stream: stream_name(p),
                    src: self.region(s),
                    dst: self.region(d),
                };
                self.access(p, op);
            } else {
                let s = self.span(b);
                let op = Op::HostWrite {
                    buffer: self.region(s),
                };
                self.access(HOST_P, op);
            }
        }
    }

    fn step_launch(&mut self) {
        let p = self.pick_stream();
        let dev = self.live_bufs(MemoryKind::Device);
        let mut writes: Vec<Span> = Vec::new();
        let n_writes = if self.chance(0.3) { 2 } else { 1 };
        for _ in 0..n_writes {
            for _ in 0..3 {
                let b = self.pick(&dev);
                let s = self.span(b);
                if writes.iter().all(|w| !w.overlaps(&s)) {
                    writes.push(s);
                    break;
                }
            }
        }
        let mut reads: Vec<Span> = Vec::new();
        for _ in 0..self.below(5) {
            let b = self.pick(&dev);
            let s = self.span(b);
            match writes.iter().find(|w| w.overlaps(&s)).copied() {
                None => reads.push(s),
                // Read-modify-write: the identical region, which counts as written.
                Some(w) => {
                    if self.chance(0.5) {
                        reads.push(w);
                    }
                }
            }
        }
        let op = Op::Launch {
            stream: stream_name(p),
            name: None,
            reads: reads.iter().map(|&s| self.region(s)).collect(),
            writes: writes.iter().map(|&s| self.region(s)).collect(),
        };
        self.access(p, op);
    }

    fn step_copy(&mut self) {
        let p = self.pick_stream();
        let dev = self.live_bufs(MemoryKind::Device);
        let pinned = self.live_bufs(MemoryKind::Pinned);
        let w = if pinned.is_empty() { 0 } else { 2 };
        let (src, dst) = match self.weighted(&[3, w, w]) {
            0 => {
                let src = self.pick(&dev);
                let dst = if self.chance(0.25) {
                    src
                } else {
                    self.pick(&dev)
                };
                (src, dst)
            }
            1 => (self.pick(&pinned), self.pick(&dev)),
            _ => (self.pick(&dev), self.pick(&pinned)),
        };
        let (s, d) = if src == dst {
            self.copy_within(src)
        } else {
            self.copy_pair(src, dst)
        };
        let op = Op::Copy {
            stream: stream_name(p),
            src: self.region(s),
            dst: self.region(d),
        };
        self.access(p, op);
    }

    fn step_memset(&mut self) {
        let p = self.pick_stream();
        let dev = self.live_bufs(MemoryKind::Device);
        let b = self.pick(&dev);
        let s = self.span(b);
        let op = Op::Memset {
            stream: stream_name(p),
            dst: self.region(s),
        };
        self.access(p, op);
    }

    fn step_host(&mut self) {
        let pinned = self.live_bufs(MemoryKind::Pinned);
        let b = self.pick(&pinned);
        let s = self.span(b);
        let buffer = self.region(s);
        let op = if self.chance(0.5) {
            Op::HostWrite { buffer }
        } else {
            Op::HostRead { buffer }
        };
        self.access(HOST_P, op);
    }

    fn step_free(&mut self) {
        let mut live = self.live_bufs(MemoryKind::Device);
        live.extend(self.live_bufs(MemoryKind::Pinned));
        let b = self.pick(&live);
        let buf = &self.model.bufs[b];
        let (memory, owner, slot, words) = (buf.memory, buf.owner, buf.slot, buf.bytes / 4);
        let named =
            if memory == MemoryKind::Device && self.cfg.stream_ordered_free && self.chance(0.35) {
                Some(if self.chance(0.3) {
                    self.pick_stream()
                } else {
                    owner
                })
            } else {
                None
            };
        let by = self.model.freer(b, named);
        let mut safe = true;
        for need in self.model.free_needs(b, named) {
            safe &= self.sync(by, need, Some(b));
        }
        self.model.bufs[b].sloppy = !safe;
        self.emit(Op::Free {
            buffer: buffer_name(slot),
            stream: named.map(stream_name),
        });
        // Free, then allocate the same size on the same stream: the allocator hands out the same
        // block, and reuse races become reachable.
        if self.chance(0.65) {
            let slots = self.free_slots();
            let slot = if self.chance(0.4) {
                self.pick(&slots)
            } else {
                slot
            };
            let stream = (memory == MemoryKind::Device).then(|| named.unwrap_or(owner));
            self.alloc(slot, words, memory, stream);
            if self.chance(0.6) {
                self.touch_new(slot);
            }
        }
    }

    fn step_sync(&mut self) {
        let recorded: Vec<usize> = (0..EVENTS)
            .filter(|&e| self.model.event(e).is_some())
            .collect();
        let ev = if recorded.is_empty() { 0 } else { 1 };
        match self.weighted(&[3, 2, 1, 2, ev, ev]) {
            0 => {
                let p = self.pick_stream();
                self.record(p);
            }
            1 => {
                let p = self.pick_stream();
                self.emit(Op::StreamSync {
                    stream: stream_name(p),
                });
            }
            2 => self.emit(Op::DeviceSync { device: 0 }),
            3 => {
                let p = self.pick_stream();
                let complete = self.chance(0.5);
                self.emit(Op::StreamQuery {
                    stream: stream_name(p),
                    complete,
                });
            }
            4 => {
                let e = self.pick(&recorded);
                self.emit(Op::EventSync {
                    event: event_name(e),
                });
            }
            _ => {
                let e = self.pick(&recorded);
                let complete = self.chance(0.5);
                self.emit(Op::EventQuery {
                    event: event_name(e),
                    complete,
                });
            }
        }
    }

    fn step_use_after_free(&mut self) {
        let slots = self.freed_slots();
        let slot = self.pick(&slots);
        let Some(b) = self.model.slots[slot] else {
            return;
        };
        let buffer = Region::whole(buffer_name(slot));
        if self.model.bufs[b].memory == MemoryKind::Device {
            let p = self.pick_stream();
            self.emit(Op::Memset {
                stream: stream_name(p),
                dst: buffer,
            });
        } else {
            self.emit(Op::HostRead { buffer });
        }
    }
}

/// The hazards the generator's own model predicts for a program it generated, as (op index,
/// kind) pairs in op order: `data-race` and `reuse-race` at an access that conflicts with an
/// unordered earlier access (same buffer; same bytes of a freed buffer), `unsafe-free` at a free,
/// `use-after-free` at an op naming a freed buffer.
///
/// The model is written from the trace format independently of the checker, so this is a second
/// opinion: on generated programs the checker should report hazards of these kinds at exactly
/// these ops. It understands the names the generator writes (`s0`, `b`, `default`, `x0`, `e0`,
/// …), not arbitrary traces.
pub fn predicted_hazards(program: &Program) -> Vec<(usize, HazardKind)> {
    let mut model = Model::new(0);
    let mut out = Vec::new();
    for (i, top) in program.ops.iter().enumerate() {
        let op = &top.op;
        let p = op.is_access().then(|| match op.participant() {
            OpParticipant::Host => HOST_P,
            OpParticipant::Stream(stream) => stream_index(stream),
        });
        if let Some(p) = p {
            let (mut race, mut reuse) = (false, false);
            model.conflicts(p, &model.touches(op), |_, _, r, _| {
                if r {
                    reuse = true
                } else {
                    race = true
                }
            });
            let freed = op.accesses().any(|a| {
                let b = model
                    .slots
                    .get(name_number(&a.region.buffer))
                    .copied()
                    .flatten();
                b.is_some_and(|b| !model.bufs[b].live)
            });
            for (hit, kind) in [
                (race, HazardKind::DataRace),
                (reuse, HazardKind::ReuseRace),
                (freed, HazardKind::UseAfterFree),
            ] {
                if hit {
                    out.push((i, kind));
                }
            }
        }
        if let Op::Free { buffer, stream } = op {
            if let Some(b) = model.live(buffer) {
                if !model
                    .free_needs(b, stream.as_ref().map(stream_index))
                    .is_empty()
                {
                    out.push((i, HazardKind::UnsafeFree));
                }
            }
        }
        model.apply(op);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Validation

/// Checks the constraints every generated program satisfies, which the simulator and the GPU
/// kernels rely on; the error names the first offending op.
///
/// - Valid checker input: no host access to device memory, regions within bounds, no allocation
///   of a live name, no stream named `"host"`, no copy whose source and destination overlap in
///   one buffer, no `addr`; every stream but `"default"` created by `stream_create` (device 0)
///   before its use; every event recorded before a wait, sync or query on it.
/// - Memory: only device and pinned allocations, each a multiple of 4 bytes and at least 16; no
///   external buffers (every buffer is allocated before its first use); frees and
///   `record_stream` name live buffers; stream-ordered frees free device memory. A region may
///   name a freed buffer (a use after free), within its old bounds.
/// - Regions: offset and length multiples of 4, non-empty. Kernels and memsets touch device
///   memory; host reads and writes pinned memory; a copy has at least one device side and a
///   source and destination of equal length.
/// - A launch has 0–4 read regions and 1–2 write regions; no read region overlaps a write region
///   unless it is the identical range of the same buffer, and write regions do not overlap each
///   other.
pub fn validate(program: &Program) -> Result<(), String> {
    let mut v = Validator::default();
    for (i, top) in program.ops.iter().enumerate() {
        v.op(&top.op)
            .map_err(|e| format!("op {i} ({}): {e}", top.op.name()))?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct ValidBuf {
    bytes: u64,
    memory: MemoryKind,
    live: bool,
}

/// A region resolved: its buffer, memory, byte range and whether the buffer is live.
struct Resolved<'a> {
    buffer: &'a Id,
    memory: MemoryKind,
    lo: u64,
    hi: u64,
}

impl Resolved<'_> {
    fn overlaps(&self, other: &Resolved<'_>) -> bool {
        self.buffer == other.buffer && self.lo < other.hi && other.lo < self.hi
    }

    fn same(&self, other: &Resolved<'_>) -> bool {
        self.buffer == other.buffer && self.lo == other.lo && self.hi == other.hi
    }
}

#[derive(Default)]
struct Validator {
    bufs: HashMap<Id, ValidBuf>,
    streams: HashMap<Id, bool>,
    recorded: HashSet<Id>,
}

impl Validator {
    fn stream(&self, s: &Id) -> Result<(), String> {
        if s.as_str() == HOST {
            return Err("\"host\" used as a stream".into());
        }
        if s.as_str() != DEFAULT_STREAM && !self.streams.contains_key(s) {
            return Err(format!("stream {s} used before its stream_create"));
        }
        Ok(())
    }

    fn event(&self, e: &Id) -> Result<(), String> {
        if self.recorded.contains(e) {
            Ok(())
        } else {
            Err(format!("event {e} is not recorded"))
        }
    }

    fn live(&self, b: &Id) -> Result<ValidBuf, String> {
        match self.bufs.get(b) {
            Some(buf) if buf.live => Ok(*buf),
            Some(_) => Err(format!("buffer {b} is freed")),
            None => Err(format!("buffer {b} was never allocated")),
        }
    }

    fn region<'a>(&self, r: &'a Region) -> Result<Resolved<'a>, String> {
        let Some(buf) = self.bufs.get(&r.buffer) else {
            return Err(format!(
                "buffer {} was never allocated (external)",
                r.buffer
            ));
        };
        if r.offset % 4 != 0 {
            return Err(format!("offset {} is not a multiple of 4", r.offset));
        }
        let hi = match r.bytes {
            Some(n) if n % 4 != 0 => {
                return Err(format!("length {n} is not a multiple of 4"));
            }
            Some(n) => r.offset.checked_add(n).ok_or("region end overflows")?,
            None => buf.bytes,
        };
        if hi <= r.offset {
            return Err(format!("empty region of {}", r.buffer));
        }
        if hi > buf.bytes {
            return Err(format!(
                "region [{}, {hi}) reaches past the end of {} ({} bytes)",
                r.offset, r.buffer, buf.bytes
            ));
        }
        Ok(Resolved {
            buffer: &r.buffer,
            memory: buf.memory,
            lo: r.offset,
            hi,
        })
    }

    fn device_region<'a>(&self, r: &'a Region) -> Result<Resolved<'a>, String> {
        let x = self.region(r)?;
        if x.memory != MemoryKind::Device {
            return Err(format!("{} is not device memory", r.buffer));
        }
        Ok(x)
    }

    fn op(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                if stream.as_str() == HOST || stream.as_str() == DEFAULT_STREAM {
                    return Err(format!("stream_create of {stream}"));
                }
                if *device != 0 {
                    return Err(format!("device {device}"));
                }
                if self.streams.insert(stream.clone(), *blocking) == Some(!*blocking) {
                    return Err(format!("stream {stream} redeclared"));
                }
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
            } => {
                if addr.is_some() {
                    return Err("addr given".into());
                }
                if self.bufs.get(buffer).is_some_and(|b| b.live) {
                    return Err(format!("buffer {buffer} is live"));
                }
                if bytes % 4 != 0 || *bytes < 16 {
                    return Err(format!("{bytes} bytes: not a multiple of 4 of at least 16"));
                }
                match (memory, stream) {
                    (MemoryKind::Device, Some(s)) => self.stream(s)?,
                    (MemoryKind::Device, None) => {}
                    (MemoryKind::Pinned, None) => {}
                    (MemoryKind::Pinned, Some(_)) => return Err("pinned alloc on a stream".into()),
                    (MemoryKind::Managed, _) => return Err("managed memory".into()),
                }
                self.bufs.insert(
                    buffer.clone(),
                    ValidBuf {
                        bytes: *bytes,
                        memory: *memory,
                        live: true,
                    },
                );
            }
            Op::Free { buffer, stream } => {
                let buf = self.live(buffer)?;
                if let Some(s) = stream {
                    self.stream(s)?;
                    if buf.memory != MemoryKind::Device {
                        return Err("stream-ordered free of host memory".into());
                    }
                }
                if let Some(b) = self.bufs.get_mut(buffer) {
                    b.live = false;
                }
            }
            Op::RecordStream { buffer, stream } => {
                self.stream(stream)?;
                self.live(buffer)?;
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                self.stream(stream)?;
                if reads.len() > 4 || writes.is_empty() || writes.len() > 2 {
                    return Err(format!(
                        "{} reads and {} writes; expected 0-4 and 1-2",
                        reads.len(),
                        writes.len()
                    ));
                }
                let w = writes
                    .iter()
                    .map(|r| self.device_region(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let r = reads
                    .iter()
                    .map(|r| self.device_region(r))
                    .collect::<Result<Vec<_>, _>>()?;
                if w.len() == 2 && w[0].overlaps(&w[1]) {
                    return Err("write regions overlap".into());
                }
                for x in &r {
                    if w.iter().any(|y| x.overlaps(y) && !x.same(y)) {
                        return Err(format!(
                            "read region of {} overlaps a write region",
                            x.buffer
                        ));
                    }
                }
            }
            Op::Copy { stream, src, dst } => {
                self.stream(stream)?;
                let (s, d) = (self.region(src)?, self.region(dst)?);
                if s.hi - s.lo != d.hi - d.lo {
                    return Err("source and destination lengths differ".into());
                }
                if s.overlaps(&d) {
                    return Err("source and destination overlap".into());
                }
                if s.memory != MemoryKind::Device && d.memory != MemoryKind::Device {
                    return Err("a copy between host buffers".into());
                }
            }
            Op::Memset { stream, dst } => {
                self.stream(stream)?;
                self.device_region(dst)?;
            }
            Op::HostRead { buffer } | Op::HostWrite { buffer } => {
                if self.region(buffer)?.memory != MemoryKind::Pinned {
                    return Err(format!("{} is not pinned memory", buffer.buffer));
                }
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.recorded.remove(event);
            }
            Op::EventRecord { event, stream } => {
                self.stream(stream)?;
                self.recorded.insert(event.clone());
            }
            Op::EventWait { stream, event } => {
                self.stream(stream)?;
                self.event(event)?;
            }
            Op::EventSync { event } | Op::EventQuery { event, .. } => self.event(event)?,
            Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => self.stream(stream)?,
            Op::DeviceSync { device } => {
                if *device != 0 {
                    return Err(format!("device {device}"));
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// JSON Lines

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn region_json(r: &Region) -> String {
    if r.is_whole() {
        return js(r.buffer.as_str());
    }
    let mut s = format!(
        "{{\"buffer\":{},\"offset\":{}",
        js(r.buffer.as_str()),
        r.offset
    );
    if let Some(n) = r.bytes {
        s.push_str(&format!(",\"bytes\":{n}"));
    }
    s.push('}');
    s
}

fn regions_json(rs: &[Region]) -> String {
    let parts: Vec<String> = rs.iter().map(region_json).collect();
    format!("[{}]", parts.join(","))
}

/// One op as a trace line.
fn op_line(top: &TraceOp) -> String {
    let id = |i: &Id| js(i.as_str());
    let mut f: Vec<(&str, String)> = Vec::new();
    match &top.op {
        Op::StreamCreate {
            stream,
            device,
            blocking,
        } => {
            f.push(("stream", id(stream)));
            if *device != 0 {
                f.push(("device", device.to_string()));
            }
            f.push(("blocking", blocking.to_string()));
        }
        Op::Alloc {
            buffer,
            bytes,
            stream,
            memory,
            addr,
        } => {
            f.push(("buffer", id(buffer)));
            f.push(("bytes", bytes.to_string()));
            if let Some(s) = stream {
                f.push(("stream", id(s)));
            }
            if *memory != MemoryKind::Device {
                f.push(("memory", js(memory.as_str())));
            }
            if let Some(a) = addr {
                f.push(("addr", a.to_string()));
            }
        }
        Op::Free { buffer, stream } => {
            f.push(("buffer", id(buffer)));
            if let Some(s) = stream {
                f.push(("stream", id(s)));
            }
        }
        Op::RecordStream { buffer, stream } => {
            f.push(("buffer", id(buffer)));
            f.push(("stream", id(stream)));
        }
        Op::Launch {
            stream,
            name,
            reads,
            writes,
        } => {
            f.push(("stream", id(stream)));
            if let Some(n) = name {
                f.push(("name", js(n)));
            }
            f.push(("reads", regions_json(reads)));
            f.push(("writes", regions_json(writes)));
        }
        Op::Copy { stream, src, dst } => {
            f.push(("stream", id(stream)));
            f.push(("src", region_json(src)));
            f.push(("dst", region_json(dst)));
        }
        Op::Memset { stream, dst } => {
            f.push(("stream", id(stream)));
            f.push(("dst", region_json(dst)));
        }
        Op::HostRead { buffer } | Op::HostWrite { buffer } => {
            f.push(("buffer", region_json(buffer)));
        }
        Op::EventCreate { event } | Op::EventDestroy { event } | Op::EventSync { event } => {
            f.push(("event", id(event)));
        }
        Op::EventRecord { event, stream } | Op::EventWait { stream, event } => {
            f.push(("event", id(event)));
            f.push(("stream", id(stream)));
        }
        Op::EventQuery { event, complete } => {
            f.push(("event", id(event)));
            f.push(("complete", complete.to_string()));
        }
        Op::StreamSync { stream } => f.push(("stream", id(stream))),
        Op::StreamQuery { stream, complete } => {
            f.push(("stream", id(stream)));
            f.push(("complete", complete.to_string()));
        }
        Op::DeviceSync { device } => {
            if *device != 0 {
                f.push(("device", device.to_string()));
            }
        }
    }
    match &top.site {
        Some(Site::Label(s)) => f.push(("site", js(s))),
        Some(Site::Stack(v)) => f.push(("site", serde_json::to_string(v).unwrap_or_default())),
        None => {}
    }
    let mut line = format!("{{\"op\":\"{}\"", top.op.name());
    for (k, v) in f {
        line.push_str(&format!(",\"{k}\":{v}"));
    }
    line.push('}');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_words_give_a_small_valid_program() {
        let cfg = GenConfig::default();
        let p = generate_from_words(&cfg, &vec![vec![]; 12]);
        validate(&p).unwrap();
        assert!(!p.ops.is_empty() && p.ops.len() <= cfg.ops);
        assert!(p.check().unwrap().is_clean(), "{p}");
        assert_eq!(generate_from_words(&cfg, &[]).ops.len(), 0);
    }

    #[test]
    fn lines_name_the_op_first() {
        let p = generate(&GenConfig::default(), &mut SplitMix::new(7));
        for line in p.to_jsonl().lines() {
            assert!(line.starts_with("{\"op\":\""), "{line}");
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v.is_object());
        }
    }
}
