//! The what-ifs: for each synchronization op whose removal changes something, the state of
//! happens-before with that op alone removed, held as differences from the real state and
//! advanced op by op beside the real checker (see the parent module's docs for the argument).
//!
//! # Differences
//!
//! A what-if's clock is at most the real one, component by component (it has fewer edges), and
//! each participant's own component is the real one (only its own accesses advance it). A clock
//! of a what-if is kept as a [`Diff`]: the few components where it is below the real clock, with
//! its values there; every other component is the real one. An op changes the clock of its own
//! participant only (or an event's capture, or the host's), so a what-if's new difference is
//! found from the differences of the op's inputs alone, component by component: for each
//! component where an input differs, the what-if's value is the largest of its inputs' values
//! there, the real one the largest of the real inputs', and the component differs if the first is
//! below the second. Nothing is copied but those few components.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::checker::Checker;
use crate::clock::{Epoch, Participant, Time, VectorClock};
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

/// A clock of a what-if, as its differences from the real clock: the components where it is
/// below, with its values there, sorted by participant.
type Diff = Vec<(Participant, Time)>;

fn diff_at(d: &Diff, q: Participant) -> Option<Time> {
    d.iter().find(|(p, _)| *p == q).map(|&(_, t)| t)
}

/// A what-if: the trace with one synchronization op replaced by nothing, as differences from
/// the real state. Everything not listed here is as in the real state.
#[derive(Clone, Debug)]
struct WhatIf {
    verdict: usize,
    born: u64,
    /// Participants whose clock differs.
    clocks: Vec<(Participant, Diff)>,
    /// Events whose capture differs (never "unrecorded": whether an event is recorded does not
    /// depend on clocks).
    captures: Vec<(Id, Diff)>,
    /// A removed `record_stream`: the live buffer that lacks this stream among its
    /// `record_stream` streams here.
    record_stream: Option<(Id, Participant)>,
    /// Its tombstones: accesses of freed buffers that the real free's `record_stream` excused
    /// and this one does not, by key in [`Tombs`].
    tombs: Vec<(usize, u64, u64)>,
}

impl WhatIf {
    fn clock(&self, p: Participant) -> Option<&Diff> {
        self.clocks.iter().find(|(q, _)| *q == p).map(|(_, d)| d)
    }

    fn capture(&self, e: &Id) -> Option<&Diff> {
        self.captures.iter().find(|(f, _)| f == e).map(|(_, d)| d)
    }

    fn is_empty(&self) -> bool {
        self.clocks.is_empty()
            && self.captures.is_empty()
            && self.record_stream.is_none()
            && self.tombs.is_empty()
    }

    /// Whether `p`'s clock here covers the access at `e`.
    fn covers(&self, order: &Order, p: Participant, e: Epoch) -> bool {
        match self.clock(p).and_then(|d| diff_at(d, e.participant)) {
            Some(t) => t >= e.time,
            None => order.clock(p).covers(e),
        }
    }

    /// `p`'s clock here, whole (for the read-only probes of the checker).
    fn full_clock(&self, order: &Order, p: Participant) -> VectorClock {
        let mut c = order.clock(p).clone();
        for &(q, t) in self.clock(p).map_or(&[][..], |d| d) {
            c.lower(q, t);
        }
        c
    }
}

/// Where an op's new clock takes its values from.
#[derive(Clone, Copy, Debug)]
enum Src<'a> {
    /// A participant's clock (as it is before the op, the real one and the what-if's).
    Part(Participant),
    /// An event's capture.
    Event(&'a Id),
    /// The host's clock with the real values of this clock (the host's before an op that has
    /// already changed the real one).
    HostBefore(&'a VectorClock),
}

/// The real clock of a source (`None`: an event never recorded, which joins nothing).
fn real_of<'a>(order: &'a Order, src: Src<'a>) -> Option<&'a VectorClock> {
    match src {
        Src::Part(p) => Some(order.clock(p)),
        Src::Event(e) => order.capture(e),
        Src::HostBefore(c) => Some(c),
    }
}

fn diff_of<'w>(w: &'w WhatIf, src: Src<'_>) -> Option<&'w Diff> {
    match src {
        Src::Part(p) => w.clock(p),
        Src::Event(e) => w.capture(e),
        Src::HostBefore(_) => w.clock(Participant::HOST),
    }
}

/// The sources of an op's new clock, with their real clocks (resolved once per op).
type Sources<'a> = smallvec::SmallVec<[(Src<'a>, &'a VectorClock); 4]>;

fn sources<'a>(order: &'a Order, srcs: &[Src<'a>]) -> Sources<'a> {
    srcs.iter()
        .filter_map(|&s| real_of(order, s).map(|c| (s, c)))
        .collect()
}

/// The difference of the join of `srcs` in what-if `w` (the new clock of `target`, whose own
/// component is never below the real one), written into `out`: a merge of the sources'
/// differences, which are sorted by participant, as the result is.
fn combine_into(w: &WhatIf, srcs: &Sources<'_>, target: Participant, out: &mut Diff) {
    out.clear();
    let diffs: smallvec::SmallVec<[&[(Participant, Time)]; 4]> = srcs
        .iter()
        .map(|&(s, _)| diff_of(w, s).map_or(&[][..], |d| &d[..]))
        .collect();
    let mut nonempty = diffs.iter().enumerate().filter(|(_, d)| !d.is_empty());
    let Some((only, first)) = nonempty.next() else {
        return;
    };
    if nonempty.next().is_none() {
        // The common case: one source differs.
        for &(q, t) in first.iter() {
            if q == target {
                continue;
            }
            let (mut mine, mut real) = (t, 0);
            for (k, &(_, c)) in srcs.iter().enumerate() {
                let r = c.get(q);
                real = real.max(r);
                if k != only {
                    mine = mine.max(r);
                }
            }
            if mine < real {
                out.push((q, mine));
            }
        }
        return;
    }
    let mut at: smallvec::SmallVec<[usize; 4]> = smallvec::smallvec![0; diffs.len()];
    while let Some(q) = diffs
        .iter()
        .zip(&at)
        .filter_map(|(d, &k)| d.get(k).map(|&(q, _)| q))
        .min()
    {
        let (mut mine, mut real) = (0, 0);
        for ((&(_, c), d), k) in srcs.iter().zip(&diffs).zip(at.iter_mut()) {
            let r = c.get(q);
            real = real.max(r);
            match d.get(*k) {
                Some(&(p, t)) if p == q => {
                    *k += 1;
                    mine = mine.max(t);
                }
                _ => mine = mine.max(r),
            }
        }
        if q != target && mine < real {
            out.push((q, mine));
        }
    }
}

/// [`combine_into`] into a new difference.
fn combine(w: &WhatIf, srcs: &Sources<'_>, target: Participant) -> Diff {
    let mut out = Diff::new();
    combine_into(w, srcs, target, &mut out);
    out
}

/// The difference of `base` (a clock an op replaced by nothing leaves as it was) from the join
/// of `base` and `others` (what the op makes of it).
fn raised(base: &VectorClock, others: &[&VectorClock], target: Participant) -> Diff {
    let mut out = Diff::new();
    for o in others {
        o.for_each_above(base, |q, _, b| {
            if q != target {
                out.push((q, b));
            }
        });
    }
    if others.len() > 1 {
        out.sort_unstable_by_key(|&(q, _)| q);
        out.dedup_by_key(|&mut (q, _)| q);
    }
    out
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

/// What an op does to the what-ifs, found before the real checker checks it.
#[derive(Debug, Default)]
pub(super) struct Pre {
    /// The what-ifs this op may change, sorted.
    affected: Vec<u32>,
    /// The op, replaced by nothing: the difference it leaves, and whose clock differs.
    removed: Option<(Participant, Diff)>,
    /// The real host clock before the op (an `alloc` with `addr` may synchronize the device).
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

/// Lists of what-ifs by key.
#[derive(Clone, Debug)]
struct Lists<K: std::hash::Hash + Eq>(rustc_hash::FxHashMap<K, Vec<u32>>);

impl<K: std::hash::Hash + Eq> Default for Lists<K> {
    fn default() -> Self {
        Lists(Default::default())
    }
}

impl<K: std::hash::Hash + Eq + Clone> Lists<K> {
    fn get(&self, k: &K) -> &[u32] {
        if self.0.is_empty() {
            return &[];
        }
        self.0.get(k).map_or(&[], |v| v)
    }

    fn insert(&mut self, k: &K, wid: u32) {
        self.0.entry(k.clone()).or_default().push(wid);
    }

    fn remove(&mut self, k: &K, wid: u32) {
        if let Some(v) = self.0.get_mut(k) {
            if let Some(i) = v.iter().position(|&w| w == wid) {
                v.swap_remove(i);
            }
            if v.is_empty() {
                self.0.remove(k);
            }
        }
    }
}

/// The what-if engine.
#[derive(Clone, Debug)]
pub(super) struct Engine {
    config: SyncConfig,
    slab: Vec<Option<WhatIf>>,
    free_slots: Vec<u32>,
    /// The what-ifs with a clock of their own, by participant.
    by_part: Vec<Vec<u32>>,
    /// The what-ifs with a capture of their own, by event.
    by_event: Lists<Id>,
    /// The what-ifs that lack a `record_stream` stream, by buffer.
    by_buffer: Lists<Id>,
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
    scratch: Vec<u32>,
    scratch_diff: Diff,
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

/// The legacy default stream's edges into an op on `p` (rule 5): the streams whose clocks it
/// joins.
fn legacy(order: &Order, p: Participant) -> &[Participant] {
    if p == Order::DEFAULT {
        order.blocking0()
    } else if order.is_blocking0(p) {
        std::slice::from_ref(&Order::DEFAULT)
    } else {
        &[]
    }
}

/// The streams of `device` (not the graphs' replay participants, which a `device_sync` does
/// not name).
fn streams_of(order: &Order, device: u64) -> Vec<Participant> {
    (1..order.participants() as u32)
        .map(Participant)
        .filter(|&p| order.device(p) == device && !order.stream_info(p).replay)
        .collect()
}

impl Engine {
    pub fn new(config: SyncConfig) -> Self {
        Engine {
            config,
            slab: Vec::new(),
            free_slots: Vec::new(),
            by_part: Vec::new(),
            by_event: Lists::default(),
            by_buffer: Lists::default(),
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
            scratch: Vec::new(),
            scratch_diff: Diff::new(),
        }
    }

    fn w(&self, wid: u32) -> &WhatIf {
        self.slab[wid as usize].as_ref().expect("live what-if")
    }

    fn w_mut(&mut self, wid: u32) -> &mut WhatIf {
        self.slab[wid as usize].as_mut().expect("live what-if")
    }

    fn part(&self, p: Participant) -> &[u32] {
        self.by_part.get(p.index()).map_or(&[], |v| v)
    }

    fn collect_part(&self, p: Participant, out: &mut Vec<u32>) {
        out.extend_from_slice(self.part(p));
    }

    fn index_part(&mut self, p: Participant, wid: u32, add: bool) {
        let i = p.index();
        if self.by_part.len() <= i {
            self.by_part.resize_with(i + 1, Vec::new);
        }
        let v = &mut self.by_part[i];
        if add {
            v.push(wid);
        } else if let Some(k) = v.iter().position(|&w| w == wid) {
            v.swap_remove(k);
        }
    }

    /// The what-ifs with a clock of their own on a stream of `device`, or on the host.
    fn collect_device(&self, order: &Order, device: u64, out: &mut Vec<u32>) {
        for (p, ws) in self.by_part.iter().enumerate() {
            let p = Participant(p as u32);
            if !ws.is_empty() && (p.is_host() || order.device(p) == device) {
                out.extend_from_slice(ws);
            }
        }
    }

    /// Finds what the op does to the what-ifs, before the real checker checks it, and applies
    /// the new clocks and captures (the real checker does not look at them). Keeps history for
    /// the what-ifs' host clocks from now on where the op may move the real host's clock ahead.
    pub fn before(&mut self, checker: &mut Checker, op: &Op, captured: bool) -> Pre {
        let mut pre = Pre::default();
        if captured {
            // A captured op runs nothing and changes no clock; a captured record leaves its
            // event never recorded outside the capture, in every what-if as in the real state.
            if let Op::EventRecord { event, .. } = op {
                let mut out = self.by_event.get(event).to_vec();
                out.sort_unstable();
                for &wid in &out {
                    self.set_capture(wid, event, Diff::new());
                }
                pre.affected = out;
            }
            return pre;
        }
        if let Op::GraphLaunch { stream, .. } = op {
            self.graph_launch(checker, stream);
        }
        let any = self.live > 0;
        let sync = super::is_sync(op);
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let mut updates: Vec<(u32, Participant, Diff, Option<Id>)> = Vec::new();
        {
            let order = checker.order();
            let host = Participant::HOST;
            if let Some((stream, _, _)) = stream_op(op) {
                // Rules 2 and 5, then the op: the new clock of `p` joins its own, the host's,
                // the legacy default stream's edges and, for a wait, the event's capture.
                let found = order.find_stream(stream);
                // A stream used for the first time is created by the op, as the next
                // participant: its clock is what it joins.
                let p = found.unwrap_or(Participant(order.participants() as u32));
                let waited = match op {
                    Op::EventWait { event, .. } => order.capture(event).map(|c| (event, c)),
                    _ => None,
                };
                let mut resolved: Sources<'_> =
                    smallvec::smallvec![(Src::Part(host), order.host_clock())];
                if let Some(q) = found {
                    resolved.push((Src::Part(q), order.clock(q)));
                    resolved.extend(
                        legacy(order, q)
                            .iter()
                            .map(|&b| (Src::Part(b), order.clock(b))),
                    );
                }
                resolved.extend(waited.map(|(e, c)| (Src::Event(e), c)));
                if any {
                    for &(s, _) in &resolved {
                        match s {
                            Src::Part(q) => self.collect_part(q, &mut out),
                            Src::Event(e) => out.extend_from_slice(self.by_event.get(e)),
                            Src::HostBefore(_) => {}
                        }
                    }
                    let recorded = match op {
                        Op::EventRecord { event, .. } => Some(event),
                        _ => None,
                    };
                    if let Some(e) = recorded {
                        // A record replaces the capture: what-ifs with one of their own too.
                        out.extend_from_slice(self.by_event.get(e));
                    }
                    out.sort_unstable();
                    out.dedup();
                    // Where the stream knows the host's clock already (it joined it since the
                    // host's last change), a what-if that differs on the host alone gives it
                    // nothing new: no component of the join can be below the real one.
                    let knows_host = !out.is_empty()
                        && found.is_some_and(|q| order.host_clock().le(order.clock(q)));
                    let mut d = std::mem::take(&mut self.scratch_diff);
                    for &wid in &out {
                        let w = self.w(wid);
                        if knows_host
                            && recorded.is_none()
                            && w.clock(p).is_none()
                            && resolved[1..].iter().all(|&(s, _)| diff_of(w, s).is_none())
                        {
                            continue;
                        }
                        combine_into(w, &resolved, p, &mut d);
                        self.stats.updates += 1;
                        if let Some(e) = recorded {
                            self.set_capture_from(wid, e, &d);
                        }
                        self.set_clock_from(wid, p, &d);
                    }
                    self.scratch_diff = d;
                }
                if matches!(op, Op::EventWait { .. }) {
                    // The wait replaced by nothing: the stream keeps the clock it had.
                    let empty = VectorClock::new();
                    let base = found.map_or(&empty, |q| order.clock(q));
                    let others: smallvec::SmallVec<[&VectorClock; 4]> = resolved
                        .iter()
                        .filter(|&&(s, _)| !matches!(s, Src::Part(q) if Some(q) == found))
                        .map(|&(_, c)| c)
                        .collect();
                    let d = raised(base, &others, p);
                    if !d.is_empty() {
                        pre.removed = Some((p, d));
                    }
                }
            }
            match op {
                Op::Free { buffer, .. }
                    if checker.live_generation(buffer).is_some_and(|g| g.is_pool()) =>
                {
                    // A pool buffer's free is not checked; what its `record_stream` streams
                    // excuse from then on is fixed by their clocks now. A what-if where that
                    // differs is left to a re-check.
                    let gen = checker.live_generation(buffer).expect("a live pool buffer");
                    let mut gone = self.by_buffer.get(buffer).to_vec();
                    for &q in gen.record_streams() {
                        self.collect_part(q, &mut gone);
                    }
                    gone.sort_unstable();
                    gone.dedup();
                    for wid in gone {
                        self.give_up(wid);
                    }
                }
                Op::Free { buffer, stream } => {
                    if let Some(gen) = checker.live_generation(buffer).filter(|g| !g.is_external())
                    {
                        if any {
                            let by = match stream {
                                Some(s) => order.find_stream(s),
                                None if gen.memory == MemoryKind::Device => Some(gen.owner),
                                None => Some(host),
                            };
                            if let Some(by) = by {
                                self.collect_part(by, &mut out);
                            }
                            self.collect_part(host, &mut out);
                            for &q in gen.record_streams() {
                                self.collect_part(q, &mut out);
                            }
                            out.extend_from_slice(self.by_buffer.get(buffer));
                            out.sort_unstable();
                            out.dedup();
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
                    // An access advances the host's own component only: no difference changes.
                    self.collect_part(host, &mut out);
                }
                Op::EventSync { .. }
                | Op::EventQuery { complete: true, .. }
                | Op::StreamSync { .. }
                | Op::StreamQuery { complete: true, .. }
                | Op::DeviceSync { .. } => {
                    // The host joins what it waited for.
                    let mut srcs: Vec<Src<'_>> = vec![Src::Part(host)];
                    match op {
                        Op::EventSync { event } | Op::EventQuery { event, .. }
                            if order.capture(event).is_some() =>
                        {
                            srcs.push(Src::Event(event));
                        }
                        Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => {
                            if let Some(p) = order.find_stream(stream) {
                                srcs.push(Src::Part(p));
                                if p == Order::DEFAULT {
                                    srcs.extend(order.blocking0().iter().map(|&b| Src::Part(b)));
                                }
                            }
                        }
                        Op::DeviceSync { device } => {
                            srcs.extend(streams_of(order, *device).into_iter().map(Src::Part));
                        }
                        _ => {}
                    }
                    if any {
                        match op {
                            Op::DeviceSync { device } => {
                                self.collect_device(order, *device, &mut out)
                            }
                            _ => {
                                for s in &srcs {
                                    match *s {
                                        Src::Part(q) => self.collect_part(q, &mut out),
                                        Src::Event(e) => {
                                            out.extend_from_slice(self.by_event.get(e))
                                        }
                                        Src::HostBefore(_) => {}
                                    }
                                }
                            }
                        }
                        out.sort_unstable();
                        out.dedup();
                        let resolved = sources(order, &srcs);
                        for &wid in &out {
                            let d = combine(self.w(wid), &resolved, host);
                            updates.push((wid, host, d, None));
                        }
                    }
                    // The host sync replaced by nothing: the host keeps the clock it had.
                    let others: Vec<&VectorClock> = srcs[1..]
                        .iter()
                        .filter_map(|s| match *s {
                            Src::Part(q) => Some(order.clock(q)),
                            Src::Event(e) => order.capture(e),
                            Src::HostBefore(_) => None,
                        })
                        .collect();
                    let d = raised(order.host_clock(), &others, host);
                    if !d.is_empty() {
                        pre.removed = Some((host, d));
                    }
                }
                Op::Alloc {
                    addr: Some(_),
                    memory: MemoryKind::Device,
                    ..
                } if any => {
                    // The memory may reappear on another stream: the device synchronizes.
                    pre.host = Some(order.host_clock().clone());
                }
                Op::RecordStream { buffer, stream } => {
                    let q = order.find_stream(stream);
                    pre.rs_adds = checker
                        .live_generation(buffer)
                        .filter(|g| !g.is_external())
                        .is_some_and(|g| {
                            let owner_stream = g.memory == MemoryKind::Device && Some(g.owner) == q;
                            !owner_stream && q.is_none_or(|q| !g.record_streams().contains(&q))
                        });
                    out.extend_from_slice(self.by_buffer.get(buffer));
                }
                Op::EventCreate { event } | Op::EventDestroy { event } => {
                    out.extend_from_slice(self.by_event.get(event));
                }
                _ => {}
            }
            let host_sync = matches!(
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
            );
            if host_sync && (sync || any) && !self.retaining {
                // From here on the real host may get ahead of a what-if's: keep what the real
                // host's clock covers and a what-if's may not.
                let keep = order.host_clock().clone();
                checker.retain(Some(keep));
                self.retaining = true;
            }
        }
        out.sort_unstable();
        out.dedup();
        self.stats.updates += updates.len() as u64;
        for (wid, p, d, recorded) in updates {
            if let Some(e) = recorded {
                self.set_capture(wid, &e, d.clone());
            }
            self.set_clock(wid, p, d);
        }
        if let Op::EventCreate { event } | Op::EventDestroy { event } = op {
            for &wid in &out {
                self.set_capture(wid, event, Diff::new());
            }
        }
        pre.affected = out;
        pre
    }

    /// A `graph_launch` on `stream`: a what-if whose entry clock of the replay differs (its
    /// host's, the stream's or the legacy default stream's edges into it), or with tombstones of
    /// its own (which the replay's accesses would have to be checked against), is given up: a
    /// re-check decides its op. Every other what-if replays exactly as the real state does (the
    /// replay participants' clocks never differ in a live what-if: only a launch changes them,
    /// and a what-if whose entry clock differs does not outlive it), so it is left as it is.
    fn graph_launch(&mut self, checker: &Checker, stream: &Id) {
        if self.live == 0 {
            return;
        }
        let order = checker.order();
        let host = Participant::HOST;
        let found = order.find_stream(stream);
        let target = found.unwrap_or(Participant(order.participants() as u32));
        let mut resolved: Sources<'_> = smallvec::smallvec![(Src::Part(host), order.host_clock())];
        let mut out = Vec::new();
        self.collect_part(host, &mut out);
        if let Some(q) = found {
            resolved.push((Src::Part(q), order.clock(q)));
            self.collect_part(q, &mut out);
            for &b in legacy(order, q) {
                resolved.push((Src::Part(b), order.clock(b)));
                self.collect_part(b, &mut out);
            }
        }
        if self.tombs.count > 0 {
            out.extend((0..self.slab.len() as u32).filter(|&w| {
                self.slab[w as usize]
                    .as_ref()
                    .is_some_and(|w| !w.tombs.is_empty())
            }));
        }
        out.sort_unstable();
        out.dedup();
        let mut d = Diff::new();
        let (gone, same): (Vec<u32>, Vec<u32>) = out.into_iter().partition(|&wid| {
            let w = self.w(wid);
            combine_into(w, &resolved, target, &mut d);
            !d.is_empty() || !w.tombs.is_empty()
        });
        for wid in gone {
            self.give_up(wid);
        }
        // The rest enter the replay with the real entry clock: the stream's clock after it is
        // the real one.
        for wid in same {
            self.set_clock(wid, target, Diff::new());
        }
    }

    /// Gives up what-if `wid`: a re-check decides its op.
    fn give_up(&mut self, wid: u32) {
        if self.slab[wid as usize].is_none() {
            return;
        }
        let v = self.w(wid).verdict;
        self.verdicts[v].undecided = true;
        self.stats.abandoned += 1;
        self.remove(wid);
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

    /// Sets what-if `wid`'s difference of `p`'s clock (empty: none).
    fn set_clock(&mut self, wid: u32, p: Participant, d: Diff) {
        let w = self.slab[wid as usize].as_mut().expect("live what-if");
        let at = w.clocks.iter().position(|(q, _)| *q == p);
        match (at, d.is_empty()) {
            (Some(k), true) => {
                w.clocks.swap_remove(k);
                self.index_part(p, wid, false);
                if p.is_host() {
                    self.retain_stale = true;
                }
            }
            (Some(k), false) => w.clocks[k].1 = d,
            (None, true) => {}
            (None, false) => {
                w.clocks.push((p, d));
                self.index_part(p, wid, true);
            }
        }
    }

    /// [`set_clock`](Self::set_clock) from a difference in scratch space.
    fn set_clock_from(&mut self, wid: u32, p: Participant, d: &Diff) {
        let w = self.slab[wid as usize].as_mut().expect("live what-if");
        match w.clocks.iter_mut().find(|(q, _)| *q == p) {
            Some((_, mine)) if !d.is_empty() => mine.clone_from(d),
            None if d.is_empty() => {}
            _ => self.set_clock(wid, p, d.clone()),
        }
    }

    /// [`set_capture`](Self::set_capture) from a difference in scratch space.
    fn set_capture_from(&mut self, wid: u32, e: &Id, d: &Diff) {
        let w = self.slab[wid as usize].as_mut().expect("live what-if");
        match w.captures.iter_mut().find(|(f, _)| f == e) {
            Some((_, mine)) if !d.is_empty() => mine.clone_from(d),
            None if d.is_empty() => {}
            _ => self.set_capture(wid, e, d.clone()),
        }
    }

    /// Sets what-if `wid`'s difference of `e`'s capture (empty: none).
    fn set_capture(&mut self, wid: u32, e: &Id, d: Diff) {
        let w = self.slab[wid as usize].as_mut().expect("live what-if");
        let at = w.captures.iter().position(|(f, _)| f == e);
        match (at, d.is_empty()) {
            (Some(k), true) => {
                w.captures.swap_remove(k);
                self.by_event.remove(e, wid);
            }
            (Some(k), false) => w.captures[k].1 = d,
            (None, true) => {}
            (None, false) => {
                w.captures.push((e.clone(), d));
                self.by_event.insert(e, wid);
            }
        }
    }

    fn clear_record_stream(&mut self, wid: u32) {
        if let Some((b, _)) = self.w_mut(wid).record_stream.take() {
            self.by_buffer.remove(&b, wid);
        }
    }

    /// Removes a what-if: its verdict stays as found.
    fn remove(&mut self, wid: u32) {
        let Some(w) = self.slab[wid as usize].take() else {
            return;
        };
        for (p, _) in &w.clocks {
            self.index_part(*p, wid, false);
            if p.is_host() {
                self.retain_stale = true;
            }
        }
        for (e, _) in &w.captures {
            self.by_event.remove(e, wid);
        }
        if let Some((b, _)) = &w.record_stream {
            self.by_buffer.remove(b, wid);
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
    #[allow(clippy::too_many_arguments)]
    pub fn after(
        &mut self,
        checker: &mut Checker,
        i: u64,
        op: &Op,
        site: Option<&Site>,
        pre: Pre,
        errors: &[(HazardKind, Option<String>)],
        captured: bool,
    ) {
        // A captured op is part of a graph, not a synchronization of the trace.
        let verdict = (super::is_sync(op) && !captured).then(|| {
            self.verdicts.push(Verdict {
                op: i,
                kind: op.name(),
                site: site.cloned().map(Arc::new),
                prevents: Vec::new(),
                undecided: false,
            });
            self.verdicts.len() - 1
        });
        let Pre {
            affected,
            removed,
            host,
            free,
            rs_adds,
        } = pre;
        let mut created = None;
        let mut pool_rs = false;
        if let (Some(v), Some((p, d))) = (verdict, removed) {
            let wid = self.new_whatif(v, i);
            self.set_clock(wid, p, d);
            created = Some(wid);
        }
        match op {
            Op::Alloc { .. } => {
                if let (Some(&(at, device)), Some(h)) = (checker.implicit_syncs().last(), &host) {
                    if at == i {
                        let order = checker.order();
                        let mut out = Vec::new();
                        self.collect_device(order, device, &mut out);
                        out.sort_unstable();
                        out.dedup();
                        let mut srcs = vec![Src::HostBefore(h)];
                        srcs.extend(streams_of(order, device).into_iter().map(Src::Part));
                        let resolved = sources(order, &srcs);
                        let ds: Vec<(u32, Diff)> = out
                            .iter()
                            .map(|&wid| (wid, combine(self.w(wid), &resolved, Participant::HOST)))
                            .collect();
                        for (wid, d) in ds {
                            self.set_clock(wid, Participant::HOST, d);
                        }
                    }
                }
            }
            Op::RecordStream { buffer, stream } => {
                let q = checker
                    .order()
                    .find_stream(stream)
                    .expect("the stream exists");
                for &wid in &affected {
                    if self.w(wid).record_stream.as_ref() == Some(&(buffer.clone(), q)) {
                        self.clear_record_stream(wid);
                    }
                }
                if let (true, Some(v)) = (rs_adds, verdict) {
                    let wid = self.new_whatif(v, i);
                    self.w_mut(wid).record_stream = Some((buffer.clone(), q));
                    self.by_buffer.insert(buffer, wid);
                    created = Some(wid);
                    // On a pool buffer, it also decides where the pool places later
                    // allocations of the same capture: left to a re-check.
                    pool_rs = checker.live_generation(buffer).is_some_and(|g| g.is_pool());
                }
            }
            Op::Free { buffer, stream } => {
                if let Some(free) = &free {
                    self.free(checker, i, buffer, stream.as_ref(), free, &affected, errors);
                }
            }
            _ => {}
        }
        if let Some(wid) = created {
            self.stats.changed += 1;
            if pool_rs {
                self.give_up(wid);
            } else if self.w(wid).is_empty() {
                self.remove(wid);
            }
        } else if verdict.is_some() {
            self.stats.unchanged += 1;
        }
        // Accesses: each what-if whose clock of the accessing participant differs asks the
        // real history and tombstones with its own clock; every what-if with tombstones asks
        // them.
        let access_p = match op {
            _ if captured => None,
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
        self.recycle(affected);
        self.housekeeping(checker, i);
    }

    /// Takes back the list of a [`Pre`] for reuse.
    fn recycle(&mut self, mut v: Vec<u32>) {
        if v.capacity() > self.scratch.capacity() {
            v.clear();
            self.scratch = v;
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
        let host = Participant::HOST;
        let by = match (stream, free.memory) {
            (Some(s), _) => order.find_stream(s).expect("the freeing stream exists"),
            (None, MemoryKind::Device) => free.owner,
            (None, _) => host,
        };
        let reported = errors
            .iter()
            .any(|(k, b)| *k == HazardKind::UnsafeFree && b.as_deref() == Some(buffer.as_str()));
        let excused = |e: Epoch| {
            free.record_streams
                .iter()
                .any(|&q| order.clock(q).covers(e))
        };
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
            let excused_here = |e: Epoch| rs.iter().any(|&q| w.covers(order, q, e));
            // The free's clock here: the freeing participant's, the host's, and the clocks of
            // the record_stream streams (trace format, "Frees and reuse").
            let unsafe_here = !reported
                && free.entries.iter().any(|a| {
                    let e = a.epoch();
                    a.participant != by
                        && !w.covers(order, by, e)
                        && !w.covers(order, host, e)
                        && !excused_here(e)
                });
            // What the real free's record_stream excused and this one does not stays: the
            // what-if's own tombstones.
            let mut new_tombs = Vec::new();
            let differs = removed.is_some() || rs.iter().any(|&q| w.clock(q).is_some());
            if let (Some(base), true) = (free.base.filter(|_| free.size > 0), differs) {
                for a in &free.entries {
                    let e = a.epoch();
                    if excused(e) && !excused_here(e) && !w.covers(order, host, e) {
                        let lo = base + a.offset;
                        let hi = base.saturating_add(a.end).min(base + free.size);
                        if lo < hi {
                            new_tombs.push((lo, hi, e, a.kind.writes()));
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
        let ws = self.part(p);
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
        // A pool buffer's bytes are checked against every buffer of its pool that held them,
        // which the probes do not ask: a what-if that would have to is left to a re-check.
        let pool: Vec<bool> = regions
            .iter()
            .map(|r| {
                checker
                    .live_generation(&r.buffer)
                    .is_some_and(|g| g.is_pool())
            })
            .collect();
        let mut gone: Vec<u32> = Vec::new();
        if pool.iter().any(|&x| x) {
            gone.extend_from_slice(ws);
        }
        for &wid in ws {
            if !gone.is_empty() {
                break;
            }
            let clock = self.w(wid).full_clock(order, p);
            for r in &regions {
                let race_known = known(HazardKind::DataRace, &r.buffer);
                let reuse_known = known(HazardKind::ReuseRace, &r.buffer);
                if race_known && reuse_known {
                    continue;
                }
                probes += 1;
                let (race, reuse) = checker.probe_region(r.at, p, &clock);
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
            for (r, &pool) in regions.iter().zip(&pool) {
                let Some((lo, hi)) = r.bytes else { continue };
                if pool {
                    self.tombs
                        .overlapping(r.memory, lo, hi, |t| gone.push(t.wid));
                    continue;
                }
                if known(HazardKind::ReuseRace, &r.buffer) {
                    continue;
                }
                self.tombs.overlapping(r.memory, lo, hi, |t| {
                    let w = self.slab[t.wid as usize].as_ref().expect("live what-if");
                    if t.epoch.participant != p
                        && (r.writes || t.writes)
                        && !w.covers(order, p, t.epoch)
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
        gone.sort_unstable();
        gone.dedup();
        for (wid, key) in found {
            if gone.binary_search(&wid).is_err() {
                self.prevent(wid, key);
            }
        }
        for wid in gone {
            self.give_up(wid);
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
                let mut drop = Vec::new();
                for &key in &w.tombs {
                    if let Some(t) = self.tombs.kinds[key.0].get(&(key.1, key.2)) {
                        if w.covers(order, Participant::HOST, t.epoch) {
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
        // Give up the oldest what-ifs beyond the limits (those with a host clock of their own
        // first, if there are too many of them): a re-check decides their ops.
        loop {
            let host_live = self.part(Participant::HOST).len();
            let victim = if host_live > self.config.max_host {
                self.part(Participant::HOST)
                    .iter()
                    .map(|&w| (self.w(w).born, w))
                    .min()
                    .map(|(_, w)| w)
            } else if self.live > self.config.max_live {
                self.ages.iter().next().map(|&(_, w)| w)
            } else {
                None
            };
            let Some(wid) = victim else { break };
            self.give_up(wid);
        }
        self.stats.peak_live = self.stats.peak_live.max(self.live);
        if self.retaining {
            if self.part(Participant::HOST).is_empty() {
                checker.retain(None);
                self.retaining = false;
                self.retain_stale = false;
            } else if self.retain_stale && i >= self.retain_at {
                // Keep only what the what-ifs' host clocks still need.
                let order = checker.order();
                let mut keep: Option<VectorClock> = None;
                for &wid in self.part(Participant::HOST) {
                    let c = self.w(wid).full_clock(order, Participant::HOST);
                    keep = Some(match keep {
                        None => c,
                        Some(k) => k.meet(&c),
                    });
                }
                checker.retain(keep);
                self.retain_stale = false;
                self.retain_at = i + 1024;
            }
        }
    }

    /// The clock components the live what-ifs store (their differences).
    pub fn clock_entries(&self) -> usize {
        self.slab
            .iter()
            .flatten()
            .map(|w| {
                w.clocks.iter().map(|(_, d)| d.len()).sum::<usize>()
                    + w.captures.iter().map(|(_, d)| d.len()).sum::<usize>()
            })
            .sum()
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
