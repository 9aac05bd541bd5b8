//! Shadow memory: the access history of every live buffer generation, and the *graveyard* of
//! what freed generations leave to the memory that reuses their bytes.
//!
//! # Algorithm
//!
//! Each allocation is a *generation* (a name allocated again is a new generation). Its history
//! holds accesses (op, region, [`Epoch`]), so a conflict check is one clock lookup per entry and
//! a report names the conflicting ops exactly. This is FastTrack (Flanagan & Freund, PLDI 2009)
//! over byte ranges, with three ways of forgetting:
//!
//! 1. **The host's clock.** Every future op joins the host's clock first (rule 2 of the trace
//!    format), so an entry the host's clock covers can never conflict again: it is dropped,
//!    inline while scanning and in sweeps.
//! 2. **A later access by the same participant** (the FastTrack insight). Entry `X` by `p` is
//!    *subsumed* by a later op's entry `Y` by `p` on the bytes they share when `Y` writes or `X`
//!    only reads: any later access `Z` by another participant that conflicts with `X` there
//!    conflicts with `Y` too (`Z`'s clock does not cover `X`, so it does not cover the later
//!    `Y`; `Z` or `X` writes, so `Z` or `Y` writes), and `Y` is the later op of `p`. Reports list,
//!    per participant, only its latest conflicting op (trace format, "Report"), so `X` can
//!    decide no verdict and appear in no report: it is dropped on those bytes. Entries of the
//!    *same* op never subsume each other (a report lists every conflicting region of the op).
//! 3. **Covered entries.** An entry that happens before a later access by another participant
//!    covering its bytes (a write covers anything, a read covers reads) is moved to the
//!    generation's `covered` list: whenever it conflicts with an access, so does its coverer (or
//!    the one covering that), so it is scanned only once a conflict is found — it may still be
//!    its participant's latest conflicting op.
//!
//! Small histories are flat vectors scanned in full (the common case: a few entries). A history
//! that grows past [`FLAT_MAX`] entries moves into an [`Intervals`] index: disjoint byte pieces,
//! each listing the entries that cover it, so an access visits only the pieces of its own range,
//! and rule 2 trims an entry on exactly the bytes a later one subsumes (a trimmed entry keeps its
//! own region for reports).
//!
//! **Freed generations.** At a free, the unsafe-free check reads the generation's history; then
//! its entries that `record_stream` does not excuse become *tombstones* in the [`Graveyard`]:
//! one [`Intervals`] index per memory kind over absolute addresses. A tombstone carries the
//! freed buffer's name and free, for reuse-race reports. Rule 2 applies across generations:
//! a tombstone of `p` is trimmed where a later generation's tombstone of `p` subsumes it (both
//! are reuse candidates of every later buffer on those bytes, and the later one is `p`'s latest
//! op). Live accesses never trim tombstones: for the buffer that now holds the bytes, a tombstone
//! decides `reuse-race` while its own history decides `data-race`, two different hazards.
//!
//! # Guarantee
//!
//! Exact: every hazard the trace format defines is found, nothing else, and every participant's
//! latest conflicting op is listed with all its conflicting regions. Memory follows what can
//! still decide a verdict: per byte range, per participant, its latest write and its latest read
//! after it (plus covered entries), for accesses the host has not synchronized with — not the
//! trace length, and not the size in bytes of the buffers (pieces are byte intervals).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::{Epoch, Participant, VectorClock};
use crate::report::AccessKind;
use crate::trace::{Id, MemoryKind, Site};

/// One recorded access: an op's use of one region of one generation.
#[derive(Clone, Debug)]
pub struct Access {
    /// The op index.
    pub op: u64,
    /// Who and when.
    pub epoch: Epoch,
    /// Read, write or alloc.
    pub kind: AccessKind,
    /// First byte, relative to the buffer.
    pub offset: u64,
    /// One past the last byte; `u64::MAX` for "to the end" of an external buffer.
    pub end: u64,
    /// The op's site, shared by its accesses.
    pub site: Option<Arc<Site>>,
    /// The kernel name of a launch, shared by every launch of that name.
    pub label: Option<Arc<str>>,
}

impl Access {
    /// Whether the two byte ranges share at least one byte.
    #[inline]
    pub fn overlaps(&self, offset: u64, end: u64) -> bool {
        self.offset < end && offset < self.end && self.offset < self.end && offset < end
    }

    /// Whether an access of this kind by the same participant, in a later op, subsumes `earlier`
    /// on the bytes they share (rule 2 of the module docs): it writes, or `earlier` only reads.
    #[inline]
    pub fn dominates(writes: bool, earlier: &Access) -> bool {
        writes || !earlier.kind.writes()
    }
}

/// What a freed generation leaves to its tombstones: the buffer's name and its free.
#[derive(Clone, Debug)]
pub struct Freed {
    /// The freed buffer's name.
    pub name: Id,
    /// The free's op index.
    pub op: u64,
    /// The free's site.
    pub site: Option<Arc<Site>>,
}

/// An access kept in an [`Intervals`] index; for a tombstone, with the free of its generation.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The access, with its own region (relative to its buffer) for reports.
    pub access: Access,
    /// The free of the access's generation, for a tombstone.
    pub freed: Option<Arc<Freed>>,
}

/// The entries listed by one piece: mostly one.
#[derive(Clone, Debug)]
enum Slots {
    One(Arc<Entry>),
    Many(Vec<Arc<Entry>>),
}

impl Slots {
    fn as_slice(&self) -> &[Arc<Entry>] {
        match self {
            Slots::One(e) => std::slice::from_ref(e),
            Slots::Many(v) => v,
        }
    }

    fn push(&mut self, e: Arc<Entry>) {
        match self {
            Slots::One(first) => *self = Slots::Many(vec![first.clone(), e]),
            Slots::Many(v) => v.push(e),
        }
    }

    fn same(&self, other: &Slots) -> bool {
        let (a, b) = (self.as_slice(), other.as_slice());
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
    }

    /// Keeps the entries `keep` accepts; returns how many were dropped, and whether any is left.
    fn retain(&mut self, mut keep: impl FnMut(&Arc<Entry>) -> bool) -> (usize, bool) {
        match self {
            Slots::One(e) => {
                if keep(e) {
                    (0, true)
                } else {
                    (1, false)
                }
            }
            Slots::Many(v) => {
                let before = v.len();
                v.retain(|e| keep(e));
                let dropped = before - v.len();
                let left = !v.is_empty();
                if v.len() == 1 {
                    let e = v.pop().expect("one entry");
                    *self = Slots::One(e);
                }
                (dropped, left)
            }
        }
    }
}

/// A piece of an [`Intervals`] index: its end, and the entries covering it.
#[derive(Clone, Debug)]
struct Piece {
    end: u64,
    slots: Slots,
}

/// An index of accesses by byte interval: disjoint pieces (start → end and the entries that
/// cover every byte of the piece). An entry spanning several pieces is listed by each (shared).
///
/// Visiting `[lo, hi)` costs one tree lookup plus the pieces it overlaps; inserting an entry
/// splits at most two pieces and merges neighbours whose lists become identical, so the number
/// of pieces follows the boundaries of the entries kept, never the bytes they span.
#[derive(Clone, Debug, Default)]
pub struct Intervals {
    map: BTreeMap<u64, Piece>,
    slots: usize,
}

/// What a visit does with an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    /// Keep it in this piece.
    Keep,
    /// Drop it from this piece.
    Drop,
}

impl Intervals {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entry listings kept (an entry spanning several pieces counts once per piece).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of pieces.
    pub fn pieces(&self) -> usize {
        self.map.len()
    }

    /// Whether some piece overlaps `[lo, hi)`.
    pub fn overlaps(&self, lo: u64, hi: u64) -> bool {
        lo < hi
            && self
                .map
                .range(..hi)
                .next_back()
                .is_some_and(|(_, p)| p.end > lo)
    }

    /// Splits the piece containing `at` (strictly inside it) in two; returns nothing, and
    /// changes no verdict: both halves list the same entries.
    pub fn split_at(&mut self, at: u64) {
        let Some((&start, piece)) = self.map.range_mut(..at).next_back() else {
            return;
        };
        if piece.end <= at {
            return;
        }
        let right = Piece {
            end: piece.end,
            slots: piece.slots.clone(),
        };
        piece.end = at;
        self.slots += right.slots.as_slice().len();
        debug_assert!(start < at);
        self.map.insert(at, right);
    }

    /// The starts of the pieces overlapping `[lo, hi)`, in order.
    fn starts(&self, lo: u64, hi: u64, into: &mut Vec<u64>) {
        into.clear();
        if let Some((&s, p)) = self.map.range(..lo).next_back() {
            if p.end > lo {
                into.push(s);
            }
        }
        into.extend(self.map.range(lo..hi).map(|(&s, _)| s));
    }

    /// Calls `f` for every entry of every piece overlapping `[lo, hi)` (an entry spanning several
    /// pieces once per piece, consecutively) and drops it from that piece where `f` says so.
    /// Returns the number of listings dropped.
    pub fn visit(&mut self, lo: u64, hi: u64, mut f: impl FnMut(&Arc<Entry>) -> Visit) -> usize {
        if lo >= hi || self.map.is_empty() {
            return 0;
        }
        let mut dropped = 0;
        let mut emptied: Vec<u64> = Vec::new();
        // Pieces are disjoint and sorted: walk back from the last one starting before `hi`.
        for (&start, piece) in self.map.range_mut(..hi).rev() {
            if piece.end <= lo {
                break;
            }
            let (d, left) = piece.slots.retain(|e| f(e) == Visit::Keep);
            dropped += d;
            if !left {
                emptied.push(start);
            }
        }
        for s in emptied {
            self.map.remove(&s);
        }
        self.slots -= dropped;
        dropped
    }

    /// Adds `entry` over `[lo, hi)`. First, on exactly those bytes, drops the listings `drop`
    /// accepts (trimming an entry that reaches beyond them). Returns the number dropped.
    pub fn insert(
        &mut self,
        lo: u64,
        hi: u64,
        entry: Arc<Entry>,
        mut drop: impl FnMut(&Arc<Entry>) -> bool,
    ) -> usize {
        if lo >= hi {
            return 0;
        }
        self.split_at(lo);
        self.split_at(hi);
        let mut starts = Vec::new();
        self.starts(lo, hi, &mut starts);
        let mut dropped = 0;
        let mut cursor = lo;
        let mut fresh: Vec<(u64, u64)> = Vec::new();
        for &s in &starts {
            if s > cursor {
                fresh.push((cursor, s));
            }
            let piece = self.map.get_mut(&s).expect("piece");
            let (d, left) = piece.slots.retain(|e| !drop(e));
            dropped += d;
            if left {
                piece.slots.push(entry.clone());
            } else {
                piece.slots = Slots::One(entry.clone());
            }
            cursor = piece.end;
        }
        if cursor < hi {
            fresh.push((cursor, hi));
        }
        let added = starts.len() + fresh.len();
        for (s, e) in fresh {
            self.map.insert(
                s,
                Piece {
                    end: e,
                    slots: Slots::One(entry.clone()),
                },
            );
        }
        self.slots = self.slots + added - dropped;
        self.coalesce(lo, hi);
        dropped
    }

    /// Merges adjacent pieces around and within `[lo, hi)` whose lists are the same.
    fn coalesce(&mut self, lo: u64, hi: u64) {
        let mut starts = Vec::new();
        self.starts(lo.saturating_sub(1), hi.saturating_add(1), &mut starts);
        let mut k = 0;
        while k + 1 < starts.len() {
            let (a, b) = (starts[k], starts[k + 1]);
            let pa = &self.map[&a];
            let pb = &self.map[&b];
            if pa.end == b && pa.slots.same(&pb.slots) {
                let end = pb.end;
                let n = pb.slots.as_slice().len();
                self.map.remove(&b);
                self.map.get_mut(&a).expect("piece").end = end;
                self.slots -= n;
                starts.remove(k + 1);
            } else {
                k += 1;
            }
        }
    }

    /// Drops, everywhere, the listings `keep` rejects, and merges the pieces left alike.
    /// Returns the number of listings dropped.
    pub fn sweep(&mut self, mut keep: impl FnMut(&Entry) -> bool) -> usize {
        let before = self.slots;
        let old = std::mem::take(&mut self.map);
        let mut last: Option<(u64, Piece)> = None;
        let mut slots = 0;
        for (start, mut piece) in old {
            let (_, left) = piece.slots.retain(|e| keep(e));
            if !left {
                continue;
            }
            match &mut last {
                Some((_, p)) if p.end == start && p.slots.same(&piece.slots) => p.end = piece.end,
                _ => {
                    if let Some((s, p)) = last.take() {
                        slots += p.slots.as_slice().len();
                        self.map.insert(s, p);
                    }
                    last = Some((start, piece));
                }
            }
        }
        if let Some((s, p)) = last {
            slots += p.slots.as_slice().len();
            self.map.insert(s, p);
        }
        self.slots = slots;
        before - slots
    }

    /// Every entry kept, once each, in order of first appearance.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        let mut seen = rustc_hash::FxHashSet::default();
        let mut out = Vec::new();
        for piece in self.map.values() {
            for e in piece.slots.as_slice() {
                if seen.insert(Arc::as_ptr(e)) {
                    out.push(e.clone());
                }
            }
        }
        out
    }
}

/// A dense index into the generation table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GenId(pub u32);

/// Histories of at most this many entries are flat vectors; larger ones move into an index.
pub const FLAT_MAX: usize = 48;

/// The access history of one generation.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Flat form: the entries not covered, scanned by every access.
    pub accesses: Vec<Access>,
    /// Flat form: the covered entries (see the module docs), scanned once a conflict is found.
    pub covered: Vec<Access>,
    /// Indexed form (then both vectors are empty): every entry, by byte interval.
    pub index: Option<Box<Intervals>>,
}

impl History {
    /// Number of history entries kept (listings, for an index).
    pub fn len(&self) -> usize {
        match &self.index {
            Some(ix) => ix.slots(),
            None => self.accesses.len() + self.covered.len(),
        }
    }

    /// Whether no history is kept.
    pub fn is_empty(&self) -> bool {
        match &self.index {
            Some(ix) => ix.is_empty(),
            None => self.accesses.is_empty() && self.covered.is_empty(),
        }
    }

    /// Drops the entries the host's clock covers; returns how many were dropped. An index small
    /// enough again goes back to the flat form.
    pub fn prune(&mut self, host: &VectorClock) -> usize {
        let before = self.len();
        if let Some(ix) = &mut self.index {
            ix.sweep(|e| !host.covers(e.access.epoch));
            if ix.slots() <= FLAT_MAX / 2 {
                let entries = ix.entries();
                self.index = None;
                self.accesses = entries.iter().map(|e| e.access.clone()).collect();
            }
            return before - self.len();
        }
        self.accesses.retain(|a| !host.covers(a.epoch));
        if self.accesses.is_empty() {
            // Every covered entry happens before an entry that the host's clock covers.
            self.covered.clear();
        } else {
            self.covered.retain(|a| !host.covers(a.epoch));
        }
        before - self.len()
    }

    /// Every entry, flat or indexed.
    pub fn all(&self) -> Vec<Access> {
        match &self.index {
            Some(ix) => ix.entries().iter().map(|e| e.access.clone()).collect(),
            None => self.accesses.iter().chain(&self.covered).cloned().collect(),
        }
    }

    /// Moves a flat history into an index, in op order, trimming what rule 2 subsumes.
    pub fn index_now(&mut self) {
        if self.index.is_some() {
            return;
        }
        let mut all: Vec<Access> = std::mem::take(&mut self.accesses);
        all.append(&mut self.covered);
        all.sort_by_key(|a| a.op);
        let mut ix = Intervals::new();
        for a in all {
            let (lo, hi, p, op, writes) =
                (a.offset, a.end, a.epoch.participant, a.op, a.kind.writes());
            let e = Arc::new(Entry {
                access: a,
                freed: None,
            });
            ix.insert(lo, hi, e, |x| {
                x.access.epoch.participant == p
                    && x.access.op < op
                    && Access::dominates(writes, &x.access)
            });
        }
        self.index = Some(Box::new(ix));
    }
}

/// The state of one live (or external) buffer generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The buffer's name.
    pub name: Id,
    /// Its memory kind.
    pub memory: MemoryKind,
    /// Whether the graveyard held tombstones on its bytes when it was allocated: only then can
    /// its accesses race with freed buffers (the bytes of a live buffer get no new tombstones).
    pub reuse: bool,
    /// The owning participant (a stream for device memory, the host otherwise).
    pub owner: Participant,
    /// Size in bytes; `None` for an external buffer.
    pub size: Option<u64>,
    /// Base address in its memory kind's address space, if it takes memory.
    pub addr: Option<u64>,
    /// The `alloc` op, if allocated.
    pub alloc_op: Option<u64>,
    /// The `alloc` op's site.
    pub alloc_site: Option<Arc<Site>>,
    /// Streams named by `record_stream` (other than the owner of device memory).
    pub record_streams: Vec<Participant>,
    /// The history every access scans.
    pub history: History,
}

impl Generation {
    /// Whether this is an external buffer (used without an `alloc`).
    pub fn is_external(&self) -> bool {
        self.size.is_none()
    }
}

/// What one access does, for [`scan`].
#[derive(Clone, Copy, Debug)]
pub struct Probe<'c> {
    /// The accessing participant.
    pub participant: Participant,
    /// Its clock at the access.
    pub clock: &'c VectorClock,
    /// Whether it writes.
    pub writes: bool,
    /// Its byte range, in the scanned generation's offsets.
    pub offset: u64,
    /// One past its last byte.
    pub end: u64,
}

impl Probe<'_> {
    /// Whether the earlier access `a` conflicts with this one without happens-before.
    #[inline]
    pub fn conflicts(&self, a: &Access) -> bool {
        a.epoch.participant != self.participant
            && (self.writes || a.kind.writes())
            && !self.clock.covers(a.epoch)
    }
}

/// Scans a flat history list for an access: drops the entries the host's clock covers, calls
/// `hit` for every entry that conflicts with the access (overlapping bytes, another participant,
/// a write on either side, not ordered before it), and, with `cover`, drops the entries of the
/// same participant that the access subsumes and moves to `cover` those of others that it
/// covers (see the module docs). Returns the number of entries dropped.
pub fn scan(
    list: &mut Vec<Access>,
    mut cover: Option<&mut Vec<Access>>,
    host: &VectorClock,
    probe: Probe<'_>,
    mut hit: impl FnMut(&Access),
) -> usize {
    let mut dropped = 0;
    let mut k = 0;
    while k < list.len() {
        let a = &list[k];
        if host.covers(a.epoch) {
            list.swap_remove(k);
            dropped += 1;
            continue;
        }
        let ordered = probe.clock.covers(a.epoch);
        if !ordered
            && a.epoch.participant != probe.participant
            && (probe.writes || a.kind.writes())
            && a.overlaps(probe.offset, probe.end)
        {
            hit(a);
        }
        if let Some(c) = cover.as_deref_mut() {
            if ordered
                && probe.offset <= a.offset
                && a.end <= probe.end
                && Access::dominates(probe.writes, a)
            {
                if a.epoch.participant == probe.participant {
                    // Subsumed by this later access of its own participant.
                    list.swap_remove(k);
                    dropped += 1;
                } else {
                    c.push(list.swap_remove(k));
                }
                continue;
            }
        }
        k += 1;
    }
    dropped
}

/// Tombstones of freed generations, by memory kind and absolute address (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Graveyard {
    kinds: [Intervals; 3],
}

impl Graveyard {
    /// The index of one memory kind.
    pub fn of(&mut self, kind: MemoryKind) -> &mut Intervals {
        &mut self.kinds[kind.index()]
    }

    /// Whether some tombstone of `kind` lies in `[lo, hi)`.
    pub fn overlaps(&self, kind: MemoryKind, lo: u64, hi: u64) -> bool {
        self.kinds[kind.index()].overlaps(lo, hi)
    }

    /// Buries one access of a freed generation whose bytes start at `base`, trimming the
    /// tombstones of the same participant it subsumes and those the host's clock covers.
    /// Returns the change in listings.
    pub fn bury(
        &mut self,
        kind: MemoryKind,
        base: u64,
        access: Access,
        freed: &Arc<Freed>,
        host: &VectorClock,
    ) -> isize {
        let (lo, hi) = (base + access.offset, base.saturating_add(access.end));
        let (p, op, writes) = (access.epoch.participant, access.op, access.kind.writes());
        let ix = &mut self.kinds[kind.index()];
        let before = ix.slots() as isize;
        let entry = Arc::new(Entry {
            access,
            freed: Some(freed.clone()),
        });
        ix.insert(lo, hi, entry, |w| {
            let w = &w.access;
            host.covers(w.epoch)
                || (w.epoch.participant == p && w.op < op && Access::dominates(writes, w))
        });
        ix.slots() as isize - before
    }

    /// Drops the tombstones the host's clock covers; returns how many listings were dropped.
    pub fn prune(&mut self, host: &VectorClock) -> usize {
        self.kinds
            .iter_mut()
            .map(|ix| ix.sweep(|e| !host.covers(e.access.epoch)))
            .sum()
    }

    /// Whether no tombstone is kept.
    pub fn is_empty(&self) -> bool {
        self.kinds.iter().all(Intervals::is_empty)
    }

    /// Tombstone listings kept.
    pub fn len(&self) -> usize {
        self.kinds.iter().map(Intervals::slots).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(op: u64, p: u32, time: u64, kind: AccessKind, offset: u64, end: u64) -> Arc<Entry> {
        Arc::new(Entry {
            access: Access {
                op,
                epoch: Epoch {
                    participant: Participant(p),
                    time,
                },
                kind,
                offset,
                end,
                site: None,
                label: None,
            },
            freed: None,
        })
    }

    fn listing(ix: &mut Intervals, lo: u64, hi: u64) -> Vec<u64> {
        let mut v = Vec::new();
        ix.visit(lo, hi, |e| {
            v.push(e.access.op);
            Visit::Keep
        });
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn pieces_split_trim_and_merge() {
        let mut ix = Intervals::new();
        ix.insert(0, 100, access(1, 1, 1, AccessKind::Write, 0, 100), |_| {
            false
        });
        ix.insert(40, 60, access(2, 2, 1, AccessKind::Read, 40, 60), |_| false);
        assert_eq!(ix.pieces(), 3);
        assert_eq!(listing(&mut ix, 50, 51), vec![1, 2]);
        assert_eq!(listing(&mut ix, 0, 10), vec![1]);
        // Participant 1 writes [30, 70) again: its earlier write is trimmed there only.
        let dropped = ix.insert(30, 70, access(3, 1, 2, AccessKind::Write, 30, 70), |e| {
            e.access.epoch.participant == Participant(1)
        });
        assert_eq!(dropped, 3, "listings of op 1 in [30,40), [40,60), [60,70)");
        assert_eq!(listing(&mut ix, 35, 36), vec![3]);
        assert_eq!(listing(&mut ix, 50, 51), vec![2, 3]);
        assert_eq!(listing(&mut ix, 0, 100), vec![1, 2, 3]);
        assert_eq!(listing(&mut ix, 75, 76), vec![1]);
        // Dropping participant 2 everywhere leaves [0,30) 1, [30,70) 3, [70,100) 1.
        ix.sweep(|e| e.access.epoch.participant != Participant(2));
        assert_eq!(ix.pieces(), 3);
        assert_eq!(ix.slots(), 3);
        ix.insert(0, 100, access(4, 1, 3, AccessKind::Write, 0, 100), |_| true);
        assert_eq!((ix.pieces(), ix.slots()), (1, 1));
        assert!(ix.overlaps(99, 1000) && !ix.overlaps(100, 1000));
    }

    #[test]
    fn huge_ranges_cost_no_more_than_small_ones() {
        let mut ix = Intervals::new();
        let base = 1u64 << 47;
        for k in 0..1000u64 {
            ix.insert(
                base,
                base + (1 << 44),
                access(k, 1, k + 1, AccessKind::Write, 0, 1 << 44),
                |e| e.access.op < k,
            );
        }
        assert_eq!((ix.pieces(), ix.slots()), (1, 1));
    }
}
