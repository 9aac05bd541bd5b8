//! The what-ifs: for each synchronization op whose removal changes something, the state of
//! happens-before with that op alone removed, held as differences from the real state and
//! advanced op by op beside the real checker (see the parent module's docs for the argument).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::checker::Checker;
use crate::clock::{Epoch, Participant, VectorClock};
use crate::order::Order;
use crate::report::HazardKind;
use crate::shadow::Access;
use crate::trace::{Id, MemoryKind, Op, Site};

use super::{ErrorKey, SyncConfig, SyncStats};

/// What is known of one synchronization op.
#[derive(Clone, Debug)]
pub(super) struct Verdict {
    pub op: u64,
    pub kind: &'static str,
    pub site: Option<Arc<Site>>,
    /// The errors found so far that the trace without this op has and the trace as written
    /// does not (sorted and deduplicated at the end).
    pub prevents: Vec<ErrorKey>,
    /// Whether its what-if was given up (too many live at once): a re-check decides it.
    pub undecided: bool,
}

/// A what-if: the trace with one synchronization op replaced by nothing, as differences from
/// the real state. Everything not listed here is as in the real state.
#[derive(Clone, Debug)]
struct WhatIf {
    verdict: usize,
    born: u64,
    /// Participants whose clock differs, with their clock here.
    clocks: Vec<(Participant, VectorClock)>,
    /// Events whose capture differs, with their capture here (never "unrecorded": whether an
    /// event is recorded does not depend on clocks).
    captures: Vec<(Id, VectorClock)>,
    /// A removed `record_stream`: the live buffer that lacks this stream among its
    /// `record_stream` streams here.
    record_stream: Option<(Id, Participant)>,
    /// Its tombstones: accesses of freed buffers that the real free's `record_stream` excused
    /// and this one does not, by key in [`Tombs`].
    tombs: Vec<(usize, u64, u64)>,
}

impl WhatIf {
    fn clock(&self, p: Participant) -> Option<&VectorClock> {
        self.clocks.iter().find(|(q, _)| *q == p).map(|(_, c)| c)
    }

    fn capture(&self, e: &Id) -> Option<&VectorClock> {
        self.captures.iter().find(|(f, _)| f == e).map(|(_, c)| c)
    }

    fn is_empty(&self) -> bool {
        self.clocks.is_empty()
            && self.captures.is_empty()
            && self.record_stream.is_none()
            && self.tombs.is_empty()
    }
}

/// `p`'s clock in what-if `w`: its own where it differs, else the real one.
fn val<'a>(w: &'a WhatIf, order: &'a Order, p: Participant) -> &'a VectorClock {
    w.clock(p).unwrap_or_else(|| order.clock(p))
}

/// A tombstone of a what-if.
#[derive(Clone, Copy, Debug)]
struct Tomb {
    wid: u32,
    hi: u64,
    epoch: Epoch,
    writes: bool,
}

/// The what-ifs' tombstones, by memory kind and first byte.
#[derive(Clone, Debug, Default)]
struct Tombs {
    kinds: [BTreeMap<(u64, u64), Tomb>; 3],
    /// The longest tombstone of each kind, to find the ones overlapping a range.
    span: [u64; 3],
    seq: u64,
    count: usize,
}

impl Tombs {
    fn insert(&mut self, kind: MemoryKind, lo: u64, tomb: Tomb) -> (usize, u64, u64) {
        let k = kind.index();
        self.seq += 1;
        self.span[k] = self.span[k].max(tomb.hi - lo);
        self.kinds[k].insert((lo, self.seq), tomb);
        self.count += 1;
        (k, lo, self.seq)
    }

    fn remove(&mut self, key: (usize, u64, u64)) {
        if self.kinds[key.0].remove(&(key.1, key.2)).is_some() {
            self.count -= 1;
        }
    }

    fn overlapping(&self, kind: MemoryKind, lo: u64, hi: u64, mut f: impl FnMut(&Tomb)) {
        let k = kind.index();
        if self.kinds[k].is_empty() {
            return;
        }
        let from = lo.saturating_sub(self.span[k]);
        for (_, t) in self.kinds[k].range((from, 0)..(hi, 0)) {
            if t.hi > lo {
                f(t);
            }
        }
    }
}

/// What is read of the real state before an op is checked.
#[derive(Debug, Default)]
pub(super) struct Pre {
    /// The what-ifs this op may change, sorted.
    affected: Vec<u32>,
    /// The real clock of the op's stream before the op.
    op_clock: Option<VectorClock>,
    /// The real host clock before the op.
    host: Option<VectorClock>,
    /// A free of a live buffer: what the what-ifs check.
    free: Option<FreeData>,
    /// A `record_stream`: whether it adds its stream to the buffer's.
    rs_adds: bool,
}

#[derive(Debug)]
struct FreeData {
    entries: Vec<Access>,
    record_streams: Vec<Participant>,
    memory: MemoryKind,
    base: Option<u64>,
    size: u64,
    owner: Participant,
}

/// The what-if engine.
#[derive(Clone, Debug)]
pub(super) struct Engine {
    config: SyncConfig,
    slab: Vec<Option<WhatIf>>,
    free_slots: Vec<u32>,
    by_part: BTreeSet<(u32, u32)>,
    by_event: BTreeSet<(Id, u32)>,
    by_buffer: BTreeSet<(Id, u32)>,
    ages: BTreeSet<(u64, u32)>,
    tombs: Tombs,
    pub verdicts: Vec<Verdict>,
    live: usize,
    /// Whether the checker keeps history for the what-ifs' host clocks.
    retaining: bool,
    retain_stale: bool,
    retain_at: u64,
    sweep_at: u64,
    sweep_version: u64,
    pub stats: SyncStats,
}

/// The ops that may join a clock into the host's.
fn joins_host(op: &Op) -> bool {
    matches!(
        op,
        Op::EventSync { .. }
            | Op::EventQuery { complete: true, .. }
            | Op::StreamSync { .. }
            | Op::StreamQuery { complete: true, .. }
            | Op::DeviceSync { .. }
            | Op::Alloc {
                addr: Some(_),
                memory: MemoryKind::Device,
                ..
            }
    )
}

/// The stream of an op on a stream (rule 1), the event it names, and whether it accesses memory.
fn stream_op(op: &Op) -> Option<(&Id, Option<&Id>, bool)> {
    match op {
        Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
            Some((stream, None, true))
        }
        Op::EventRecord { stream, event } | Op::EventWait { stream, event } => {
            Some((stream, Some(event), false))
        }
        Op::Free {
            stream: Some(stream),
            ..
        } => Some((stream, None, false)),
        _ => None,
    }
}

impl Engine {
    pub fn new(config: SyncConfig) -> Self {
        Engine {
            config,
            slab: Vec::new(),
            free_slots: Vec::new(),
            by_part: BTreeSet::new(),
            by_event: BTreeSet::new(),
            by_buffer: BTreeSet::new(),
            ages: BTreeSet::new(),
            tombs: Tombs::default(),
            verdicts: Vec::new(),
            live: 0,
            retaining: false,
            retain_stale: false,
            retain_at: 0,
            sweep_at: 0,
            sweep_version: 0,
            stats: SyncStats::default(),
        }
    }

    fn w(&self, wid: u32) -> &WhatIf {
        self.slab[wid as usize].as_ref().expect("live what-if")
    }

    fn w_mut(&mut self, wid: u32) -> &mut WhatIf {
        self.slab[wid as usize].as_mut().expect("live what-if")
    }

    fn collect_part(&self, p: Participant, out: &mut Vec<u32>) {
        out.extend(
            self.by_part
                .range((p.0, 0)..=(p.0, u32::MAX))
                .map(|&(_, w)| w),
        );
    }

    fn collect_event(&self, e: &Id, out: &mut Vec<u32>) {
        if self.by_event.is_empty() {
            return;
        }
        out.extend(
            self.by_event
                .range((e.clone(), 0)..=(e.clone(), u32::MAX))
                .map(|(_, w)| *w),
        );
    }

    fn collect_buffer(&self, b: &Id, out: &mut Vec<u32>) {
        if self.by_buffer.is_empty() {
            return;
        }
        out.extend(
            self.by_buffer
                .range((b.clone(), 0)..=(b.clone(), u32::MAX))
                .map(|(_, w)| *w),
        );
    }

    /// The what-ifs whose clock of `p` or of what `p`'s ops join implicitly (the host, the legacy
    /// default stream's edges) differs.
    fn collect_stream(&self, order: &Order, p: Option<Participant>, out: &mut Vec<u32>) {
        self.collect_part(Participant::HOST, out);
        let Some(p) = p else { return };
        self.collect_part(p, out);
        if p == Order::DEFAULT {
            for &b in order.blocking0() {
                self.collect_part(b, out);
            }
        } else if order.is_blocking0(p) {
            self.collect_part(Order::DEFAULT, out);
        }
    }

    /// The what-ifs with a clock that differs on a stream of `device`, or on the host.
    fn collect_device(&self, order: &Order, device: u64, out: &mut Vec<u32>) {
        for &(p, w) in &self.by_part {
            let p = Participant(p);
            if p.is_host() || order.device(p) == device {
                out.push(w);
            }
        }
    }

    /// Reads what the op needs of the real state before it is checked; keeps history for the
    /// what-ifs' host clocks from now on where the op may move the host's clock ahead of theirs.
    pub fn before(&mut self, checker: &mut Checker, op: &Op) -> Pre {
        let order = checker.order();
        let mut pre = Pre::default();
        let any = self.live > 0;
        let sync = super::is_sync(op);
        let mut out = Vec::new();
        if let Some((stream, event, _)) = stream_op(op) {
            let p = order.find_stream(stream);
            if any {
                self.collect_stream(order, p, &mut out);
                if let Some(e) = event {
                    self.collect_event(e, &mut out);
                }
            }
        }
        match op {
            Op::Free { buffer, stream } => {
                if let Some(gen) = checker.live_generation(buffer).filter(|g| !g.is_external()) {
                    let by = match stream {
                        Some(s) => order.find_stream(s),
                        None if gen.memory == MemoryKind::Device => Some(gen.owner),
                        None => Some(Participant::HOST),
                    };
                    if any {
                        if let Some(by) = by {
                            self.collect_part(by, &mut out);
                        }
                        self.collect_part(Participant::HOST, &mut out);
                        for &q in gen.record_streams() {
                            self.collect_part(q, &mut out);
                        }
                        self.collect_buffer(buffer, &mut out);
                    }
                    if !out.is_empty() {
                        pre.free = Some(FreeData {
                            entries: gen.history.all(),
                            record_streams: gen.record_streams().to_vec(),
                            memory: gen.memory,
                            base: gen.addr(),
                            size: gen.size().unwrap_or(0),
                            owner: gen.owner,
                        });
                    }
                }
            }
            Op::HostRead { .. } | Op::HostWrite { .. } => {
                self.collect_part(Participant::HOST, &mut out)
            }
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                self.collect_part(Participant::HOST, &mut out);
                self.collect_event(event, &mut out);
            }
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                self.collect_part(Participant::HOST, &mut out);
                if let Some(p) = order.find_stream(stream) {
                    self.collect_part(p, &mut out);
                    if p == Order::DEFAULT {
                        for &b in order.blocking0() {
                            self.collect_part(b, &mut out);
                        }
                    }
                }
            }
            Op::DeviceSync { device } => self.collect_device(order, *device, &mut out),
            Op::RecordStream { buffer, stream } => {
                let q = order.find_stream(stream);
                pre.rs_adds = checker
                    .live_generation(buffer)
                    .filter(|g| !g.is_external())
                    .is_some_and(|g| {
                        let owner_stream = g.memory == MemoryKind::Device && Some(g.owner) == q;
                        !owner_stream && q.is_none_or(|q| !g.record_streams().contains(&q))
                    });
                self.collect_buffer(buffer, &mut out);
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.collect_event(event, &mut out)
            }
            _ => {}
        }
        out.sort_unstable();
        out.dedup();
        if let Some((stream, _, _)) = stream_op(op) {
            if !out.is_empty() || sync {
                pre.op_clock = Some(
                    order
                        .find_stream(stream)
                        .map(|p| order.clock(p).clone())
                        .unwrap_or_default(),
                );
            }
        }
        let host_sync = joins_host(op);
        if host_sync && (sync || any) {
            pre.host = Some(order.host_clock().clone());
            if !self.retaining {
                // From here on the real host may get ahead of a what-if's: keep what the real
                // host's clock covers and this one does not.
                checker.retain(Some(order.host_clock().clone()));
                self.retaining = true;
            }
        }
        pre.affected = out;
        pre
    }

    fn new_whatif(&mut self, verdict: usize, born: u64) -> u32 {
        let w = WhatIf {
            verdict,
            born,
            clocks: Vec::new(),
            captures: Vec::new(),
            record_stream: None,
            tombs: Vec::new(),
        };
        let wid = match self.free_slots.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(w);
                s
            }
            None => {
                self.slab.push(Some(w));
                self.slab.len() as u32 - 1
            }
        };
        self.ages.insert((born, wid));
        self.live += 1;
        self.stats.whatifs += 1;
        wid
    }

    /// Sets what-if `wid`'s clock of `p` to `c`, or drops it where it equals the real one.
    fn set_clock(&mut self, order: &Order, wid: u32, p: Participant, c: VectorClock) {
        let same = &c == order.clock(p);
        let w = self.slab[wid as usize].as_mut().expect("live what-if");
        let at = w.clocks.iter().position(|(q, _)| *q == p);
        match (at, same) {
            (Some(k), true) => {
                w.clocks.swap_remove(k);
                self.by_part.remove(&(p.0, wid));
                if p.is_host() {
                    self.retain_stale = true;
                }
            }
            (Some(k), false) => w.clocks[k].1 = c,
            (None, true) => {}
            (None, false) => {
                w.clocks.push((p, c));
                self.by_part.insert((p.0, wid));
            }
        }
    }

    /// Sets what-if `wid`'s capture of `e` to `c`, or drops it where it equals the real one.
    fn set_capture(&mut self, order: &Order, wid: u32, e: &Id, c: Option<VectorClock>) {
        let same = match (&c, order.capture(e)) {
            (Some(c), Some(real)) => c == real,
            (None, _) => true,
            (Some(_), None) => true,
        };
        let w = self.slab[wid as usize].as_mut().expect("live what-if");
        let at = w.captures.iter().position(|(f, _)| f == e);
        match (at, same) {
            (Some(k), true) => {
                w.captures.swap_remove(k);
                self.by_event.remove(&(e.clone(), wid));
            }
            (Some(k), false) => w.captures[k].1 = c.expect("a capture"),
            (None, true) => {}
            (None, false) => {
                w.captures.push((e.clone(), c.expect("a capture")));
                self.by_event.insert((e.clone(), wid));
            }
        }
    }

    fn clear_record_stream(&mut self, wid: u32) {
        if let Some((b, _)) = self.w_mut(wid).record_stream.take() {
            self.by_buffer.remove(&(b, wid));
        }
    }

    /// Removes a what-if: its verdict stays as found.
    fn remove(&mut self, wid: u32) {
        let Some(w) = self.slab[wid as usize].take() else {
            return;
        };
        for (p, _) in &w.clocks {
            self.by_part.remove(&(p.0, wid));
            if p.is_host() {
                self.retain_stale = true;
            }
        }
        for (e, _) in &w.captures {
            self.by_event.remove(&(e.clone(), wid));
        }
        if let Some((b, _)) = &w.record_stream {
            self.by_buffer.remove(&(b.clone(), wid));
        }
        for &key in &w.tombs {
            self.tombs.remove(key);
        }
        self.ages.remove(&(w.born, wid));
        self.free_slots.push(wid);
        self.live -= 1;
    }

    fn prevent(&mut self, wid: u32, key: ErrorKey) {
        let v = self.w(wid).verdict;
        let list = &mut self.verdicts[v].prevents;
        if !list.contains(&key) {
            list.push(key);
        }
    }

    /// Advances the what-ifs over op `i`, which the real checker has just checked; `errors` are
    /// the (kind, buffer) of the errors the real checker reported at it.
    pub fn after(
        &mut self,
        checker: &mut Checker,
        i: u64,
        op: &Op,
        site: Option<&Site>,
        pre: Pre,
        errors: &[(HazardKind, Option<String>)],
    ) {
        let sync = super::is_sync(op);
        let verdict = if sync {
            self.verdicts.push(Verdict {
                op: i,
                kind: op.name(),
                site: site.cloned().map(Arc::new),
                prevents: Vec::new(),
                undecided: false,
            });
            Some(self.verdicts.len() - 1)
        } else {
            None
        };
        let Pre {
            affected,
            op_clock,
            host,
            free,
            rs_adds,
        } = pre;
        let mut created = None;
        {
            let order = checker.order();
            if let Some((stream, event, access)) = stream_op(op) {
                let p = order.find_stream(stream).expect("the op's stream exists");
                let pre_clock = op_clock.as_ref();
                for &wid in &affected {
                    let w = self.w(wid);
                    let mut c = match w.clock(p) {
                        Some(c) => c.clone(),
                        None => pre_clock.cloned().unwrap_or_default(),
                    };
                    c.join(val(w, order, Participant::HOST));
                    if p == Order::DEFAULT {
                        for &b in order.blocking0() {
                            c.join(val(w, order, b));
                        }
                    } else if order.is_blocking0(p) {
                        c.join(val(w, order, Order::DEFAULT));
                    }
                    if access {
                        c.tick(p);
                    }
                    match op {
                        Op::EventRecord { event, .. } => {
                            self.set_capture(order, wid, event, Some(c.clone()));
                        }
                        Op::EventWait { event, .. } => {
                            if let Some(real) = order.capture(event) {
                                c.join(self.w(wid).capture(event).unwrap_or(real));
                            }
                        }
                        _ => {}
                    }
                    let _ = event;
                    self.set_clock(order, wid, p, c);
                }
                if let (Op::EventWait { .. }, Some(v)) = (op, verdict) {
                    // The wait replaced by nothing: the stream keeps the clock it had.
                    let c = op_clock.clone().unwrap_or_default();
                    if &c != order.clock(p) {
                        let wid = self.new_whatif(v, i);
                        self.set_clock(order, wid, p, c);
                        created = Some(wid);
                    }
                }
            }
            match op {
                Op::HostRead { .. } | Op::HostWrite { .. } => {
                    for &wid in &affected {
                        let mut c = val(self.w(wid), order, Participant::HOST).clone();
                        c.tick(Participant::HOST);
                        self.set_clock(order, wid, Participant::HOST, c);
                    }
                }
                Op::EventSync { event }
                | Op::EventQuery {
                    event,
                    complete: true,
                } => {
                    let real = order.capture(event);
                    for &wid in &affected {
                        let w = self.w(wid);
                        let mut c = w
                            .clock(Participant::HOST)
                            .or(host.as_ref())
                            .cloned()
                            .unwrap_or_default();
                        if let Some(real) = real {
                            c.join(w.capture(event).unwrap_or(real));
                        }
                        self.set_clock(order, wid, Participant::HOST, c);
                    }
                }
                Op::StreamSync { stream }
                | Op::StreamQuery {
                    stream,
                    complete: true,
                } => {
                    let p = order.find_stream(stream).expect("the synced stream exists");
                    for &wid in &affected {
                        let w = self.w(wid);
                        let mut c = w
                            .clock(Participant::HOST)
                            .or(host.as_ref())
                            .cloned()
                            .unwrap_or_default();
                        c.join(val(w, order, p));
                        if p == Order::DEFAULT {
                            for &b in order.blocking0() {
                                c.join(val(w, order, b));
                            }
                        }
                        self.set_clock(order, wid, Participant::HOST, c);
                    }
                }
                Op::DeviceSync { device } => self.device_sync(order, *device, &affected, &host),
                Op::Alloc { .. } => {
                    if let Some(&(at, device)) = checker.implicit_syncs().last() {
                        if at == i && self.live > 0 {
                            let mut out = Vec::new();
                            self.collect_device(order, device, &mut out);
                            out.sort_unstable();
                            out.dedup();
                            self.device_sync(order, device, &out, &host);
                        }
                    }
                }
                Op::EventCreate { event } | Op::EventDestroy { event } => {
                    for &wid in &affected {
                        self.set_capture(order, wid, event, None);
                    }
                }
                Op::RecordStream { buffer, stream } => {
                    let q = order.find_stream(stream).expect("the stream exists");
                    for &wid in &affected {
                        if self.w(wid).record_stream.as_ref() == Some(&(buffer.clone(), q)) {
                            self.clear_record_stream(wid);
                        }
                    }
                    if let (true, Some(v)) = (rs_adds, verdict) {
                        let wid = self.new_whatif(v, i);
                        self.w_mut(wid).record_stream = Some((buffer.clone(), q));
                        self.by_buffer.insert((buffer.clone(), wid));
                        created = Some(wid);
                    }
                }
                _ => {}
            }
            if matches!(
                op,
                Op::EventSync { .. }
                    | Op::EventQuery { complete: true, .. }
                    | Op::StreamSync { .. }
                    | Op::StreamQuery { complete: true, .. }
                    | Op::DeviceSync { .. }
            ) {
                if let Some(v) = verdict {
                    // The host sync replaced by nothing: the host keeps the clock it had.
                    let c = host.clone().unwrap_or_default();
                    if &c != order.host_clock() {
                        let wid = self.new_whatif(v, i);
                        self.set_clock(order, wid, Participant::HOST, c);
                        created = Some(wid);
                    }
                }
            }
        }
        if let (Op::Free { buffer, stream }, Some(free)) = (op, &free) {
            self.free(checker, i, buffer, stream.as_ref(), free, &affected, errors);
        }
        if let Some(wid) = created {
            self.stats.changed += 1;
            if self.w(wid).is_empty() {
                self.remove(wid);
            }
        } else if sync {
            self.stats.unchanged += 1;
        }
        // Accesses: each what-if whose clock of the accessing participant differs asks the
        // real history and tombstones with its own clock; every what-if with tombstones asks
        // them.
        let access_p = match op {
            Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
                checker.order().find_stream(stream)
            }
            Op::HostRead { .. } | Op::HostWrite { .. } => Some(Participant::HOST),
            _ => None,
        };
        if let Some(p) = access_p {
            self.accesses(checker, i, p, errors);
        }
        for &wid in &affected {
            if self.slab[wid as usize]
                .as_ref()
                .is_some_and(|w| w.is_empty())
            {
                self.remove(wid);
            }
        }
        self.housekeeping(checker, i);
    }

    fn device_sync(
        &mut self,
        order: &Order,
        device: u64,
        affected: &[u32],
        host: &Option<VectorClock>,
    ) {
        let streams: Vec<Participant> = (1..order.participants() as u32)
            .map(Participant)
            .filter(|&p| order.device(p) == device)
            .collect();
        for &wid in affected {
            let w = self.w(wid);
            let mut c = w
                .clock(Participant::HOST)
                .or(host.as_ref())
                .cloned()
                .unwrap_or_default();
            for &s in &streams {
                c.join(val(w, order, s));
            }
            self.set_clock(order, wid, Participant::HOST, c);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn free(
        &mut self,
        checker: &Checker,
        i: u64,
        buffer: &Id,
        stream: Option<&Id>,
        free: &FreeData,
        affected: &[u32],
        errors: &[(HazardKind, Option<String>)],
    ) {
        let order = checker.order();
        let by = match (stream, free.memory) {
            (Some(s), _) => order.find_stream(s).expect("the freeing stream exists"),
            (None, MemoryKind::Device) => free.owner,
            (None, _) => Participant::HOST,
        };
        let reported = errors
            .iter()
            .any(|(k, b)| *k == HazardKind::UnsafeFree && b.as_deref() == Some(buffer.as_str()));
        let mut excused = VectorClock::new();
        for &q in &free.record_streams {
            excused.join(order.clock(q));
        }
        for &wid in affected {
            let w = self.w(wid);
            let removed = match &w.record_stream {
                Some((b, q)) if b == buffer => Some(*q),
                _ => None,
            };
            let rs: Vec<Participant> = free
                .record_streams
                .iter()
                .copied()
                .filter(|&q| Some(q) != removed)
                .collect();
            let host = val(w, order, Participant::HOST);
            let mine = val(w, order, by);
            let mut excused_here = VectorClock::new();
            for &q in &rs {
                excused_here.join(val(w, order, q));
            }
            let unsafe_here = !reported
                && free.entries.iter().any(|a| {
                    let e = a.epoch();
                    a.participant != by
                        && !mine.covers(e)
                        && !host.covers(e)
                        && !excused_here.covers(e)
                });
            let mut new_tombs = Vec::new();
            if let Some(base) = free.base.filter(|_| free.size > 0) {
                if excused_here != excused {
                    for a in &free.entries {
                        let e = a.epoch();
                        if excused.covers(e) && !excused_here.covers(e) && !host.covers(e) {
                            let lo = base + a.offset;
                            let hi = base.saturating_add(a.end).min(base + free.size);
                            if lo < hi {
                                new_tombs.push((lo, hi, e, a.kind.writes()));
                            }
                        }
                    }
                }
            }
            if unsafe_here {
                self.prevent(
                    wid,
                    ErrorKey {
                        kind: HazardKind::UnsafeFree,
                        op: i,
                        buffer: Some(buffer.to_string()),
                    },
                );
            }
            for (lo, hi, epoch, writes) in new_tombs {
                let key = self.tombs.insert(
                    free.memory,
                    lo,
                    Tomb {
                        wid,
                        hi,
                        epoch,
                        writes,
                    },
                );
                self.w_mut(wid).tombs.push(key);
            }
            if removed.is_some() {
                self.clear_record_stream(wid);
            }
        }
    }

    fn accesses(
        &mut self,
        checker: &Checker,
        i: u64,
        p: Participant,
        errors: &[(HazardKind, Option<String>)],
    ) {
        let mut ws = Vec::new();
        self.collect_part(p, &mut ws);
        if ws.is_empty() && self.tombs.count == 0 {
            return;
        }
        let regions = checker.last_regions();
        let order = checker.order();
        let known = |kind: HazardKind, buffer: &Id| {
            errors
                .iter()
                .any(|(k, b)| *k == kind && b.as_deref() == Some(buffer.as_str()))
        };
        let mut found: Vec<(u32, ErrorKey)> = Vec::new();
        let mut probes = 0;
        for &wid in &ws {
            let w = self.w(wid);
            let clock = w.clock(p).expect("a differing clock");
            for r in &regions {
                let race_known = known(HazardKind::DataRace, &r.buffer);
                let reuse_known = known(HazardKind::ReuseRace, &r.buffer);
                if race_known && reuse_known {
                    continue;
                }
                probes += 1;
                let (race, reuse) = checker.probe_region(r.at, p, clock);
                for (hit, kind, known) in [
                    (race, HazardKind::DataRace, race_known),
                    (reuse, HazardKind::ReuseRace, reuse_known),
                ] {
                    if hit && !known {
                        found.push((
                            wid,
                            ErrorKey {
                                kind,
                                op: i,
                                buffer: Some(r.buffer.to_string()),
                            },
                        ));
                    }
                }
            }
        }
        self.stats.probes += probes;
        if self.tombs.count > 0 {
            for r in &regions {
                let Some((lo, hi)) = r.bytes else { continue };
                if known(HazardKind::ReuseRace, &r.buffer) {
                    continue;
                }
                self.tombs.overlapping(r.memory, lo, hi, |t| {
                    let w = self.slab[t.wid as usize].as_ref().expect("live what-if");
                    let clock = val(w, order, p);
                    if t.epoch.participant != p && (r.writes || t.writes) && !clock.covers(t.epoch)
                    {
                        found.push((
                            t.wid,
                            ErrorKey {
                                kind: HazardKind::ReuseRace,
                                op: i,
                                buffer: Some(r.buffer.to_string()),
                            },
                        ));
                    }
                });
            }
        }
        for (wid, key) in found {
            self.prevent(wid, key);
        }
    }

    /// Drops the tombstones the what-ifs' host clocks cover, gives up the oldest what-ifs
    /// beyond the configured limits, and lets the checker forget what no what-if needs.
    fn housekeeping(&mut self, checker: &mut Checker, i: u64) {
        let version = checker.order().host_version();
        if self.tombs.count > 0 && version != self.sweep_version && i >= self.sweep_at {
            self.sweep_version = version;
            self.sweep_at = i + self.tombs.count as u64;
            let order = checker.order();
            let mut emptied = Vec::new();
            for wid in 0..self.slab.len() as u32 {
                let Some(w) = self.slab[wid as usize].as_ref() else {
                    continue;
                };
                if w.tombs.is_empty() {
                    continue;
                }
                let host = val(w, order, Participant::HOST);
                let mut drop = Vec::new();
                for &key in &w.tombs {
                    if let Some(t) = self.tombs.kinds[key.0].get(&(key.1, key.2)) {
                        if host.covers(t.epoch) {
                            drop.push(key);
                        }
                    }
                }
                if drop.is_empty() {
                    continue;
                }
                for &key in &drop {
                    self.tombs.remove(key);
                }
                let w = self.slab[wid as usize].as_mut().expect("live what-if");
                w.tombs.retain(|k| !drop.contains(k));
                if w.is_empty() {
                    emptied.push(wid);
                }
            }
            for wid in emptied {
                self.remove(wid);
            }
        }
        let host_live = self.by_part.range((0, 0)..=(0, u32::MAX)).count();
        while self.live > self.config.max_live
            || (host_live > self.config.max_host && self.live > 0)
        {
            // Give up the oldest what-if (one with a host clock, if there are too many of
            // those): a re-check decides its op.
            let victim = if host_live > self.config.max_host {
                self.by_part
                    .range((0, 0)..=(0, u32::MAX))
                    .map(|&(_, w)| (self.w(w).born, w))
                    .min()
                    .map(|(_, w)| w)
            } else {
                self.ages.iter().next().map(|&(_, w)| w)
            };
            let Some(wid) = victim else { break };
            let v = self.w(wid).verdict;
            self.verdicts[v].undecided = true;
            self.stats.abandoned += 1;
            self.remove(wid);
            if host_live > self.config.max_host {
                break;
            }
        }
        self.stats.peak_live = self.stats.peak_live.max(self.live);
        if self.retaining {
            let host_live = self.by_part.range((0, 0)..=(0, u32::MAX)).next().is_some();
            if !host_live {
                checker.retain(None);
                self.retaining = false;
                self.retain_stale = false;
            } else if self.retain_stale && i >= self.retain_at {
                // Keep only what the what-ifs' host clocks still need.
                let mut keep: Option<VectorClock> = None;
                for &(_, wid) in self.by_part.range((0, 0)..=(0, u32::MAX)) {
                    let c = self.w(wid).clock(Participant::HOST).expect("a host clock");
                    keep = Some(match keep {
                        None => c.clone(),
                        Some(k) => k.meet(c),
                    });
                }
                checker.retain(keep);
                self.retain_stale = false;
                self.retain_at = i + 1024;
            }
        }
    }

    /// The live what-ifs' clocks and captures, for the memory counters.
    pub fn clock_entries(&self) -> usize {
        let mut seen = Default::default();
        let mut n = 0;
        for w in self.slab.iter().flatten() {
            for (_, c) in &w.clocks {
                n += c.stored(&mut seen);
            }
            for (_, c) in &w.captures {
                n += c.stored(&mut seen);
            }
        }
        n
    }

    /// Live what-ifs.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Tombstones of live what-ifs.
    pub fn tombstones(&self) -> usize {
        self.tombs.count
    }
}
