//! The builder: the generator's steps, each emitting ops — allocations, kernels, copies,
//! memsets, host accesses, frees, syncs — after the synchronization the model says they need,
//! unless a coin leaves it out.

use super::model::{
    buffer_name, event_name, stream_index, stream_name, Model, Need, BLOCKING_P, DEFAULT_P, EVENTS,
    FIRST_S, HOST_P, MAX_STREAMS, PARTICIPANTS,
};
use super::{Decisions, GenConfig, Program};
use crate::trace::{MemoryKind, Op, Region, TraceOp};

/// A region of a live buffer as the generator picks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
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

pub(super) struct Builder<D> {
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
    pub(super) fn new(cfg: &GenConfig, src: D) -> Self {
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

    pub(super) fn run(mut self) -> Program {
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
        // A replay's access is waited for through the stream its graph was last launched on.
        let rec = self.model.stream_of(need.from);
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
            !(buf.memory == MemoryKind::Device && buf.owner == rec)
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
                let e = self.record(rec);
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
            2 => self.host_sync(rec, &covering),
            _ => {
                if let Some(b) = record_stream {
                    self.emit(Op::RecordStream {
                        buffer: buffer_name(self.model.bufs[b].slot),
                        stream: stream_name(rec),
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
            if self.cfg.graphs && dev { 16 } else { 0 },
        ];
        match self.weighted(&weights) {
            0 => self.step_alloc(),
            1 => self.step_launch(),
            2 => self.step_copy(),
            3 => self.step_memset(),
            4 => self.step_host(),
            5 => self.step_free(),
            6 => self.step_sync(),
            7 => self.step_use_after_free(),
            _ => self.step_graph(),
        }
    }

    fn alloc(&mut self, slot: usize, words: u64, memory: MemoryKind, stream: Option<usize>) {
        self.emit(Op::Alloc {
            buffer: buffer_name(slot),
            bytes: words * 4,
            stream: stream.map(stream_name),
            memory,
            addr: None,
            pool: None,
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
        let pooled = self.model.bufs[b].pool.is_some();
        let named = if memory == MemoryKind::Device
            && !pooled
            && self.cfg.stream_ordered_free
            && self.chance(0.35)
        {
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

    // --- CUDA graphs

    /// Emits `stream_create` for stream `p` if it has not been created yet.
    fn create(&mut self, p: usize) {
        if p != DEFAULT_P && !self.created[p] {
            self.created[p] = true;
            self.ops.push(
                Op::StreamCreate {
                    stream: stream_name(p),
                    device: 0,
                    blocking: p == BLOCKING_P,
                }
                .into(),
            );
        }
    }
}

mod graphs;
