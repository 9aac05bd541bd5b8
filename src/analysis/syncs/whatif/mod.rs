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
}

mod after;
mod before;
