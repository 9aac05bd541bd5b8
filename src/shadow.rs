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
//! 2. **A later access by the same participant** (the FastTrack insight, here across
//!    generations). Entry `X` by `p` is *subsumed* by the entry `Y` of a later op of `p` on the
//!    bytes they share when `Y` writes or `X` only reads; `X` is then dropped on those bytes.
//! 3. **Covered entries.** An entry that happens before a later access by another participant
//!    covering its bytes (a write covers anything, a read covers reads) is moved to the
//!    generation's `covered` list, scanned only once a conflict is found.
//!
//! Small histories are flat vectors scanned in full (the common case: a few entries). A history
//! that grows past [`FLAT_MAX`] entries moves into an [`Intervals`] index: disjoint byte pieces,
//! each listing the entries that cover it, so an access visits only the pieces of its own range,
//! and rule 2 trims an entry on exactly the bytes a later one subsumes (a trimmed entry keeps its
//! own region for reports).
//!
//! **Freed generations.** A free first checks the generation's history (`unsafe-free`), then
//! drops what `record_stream` excuses, and buries the rest in the [`Graveyard`], per memory kind,
//! at absolute addresses. A freed generation spanning at most [`SMALL_PAGES`] pages of 64 KiB is
//! one [`Record`] listed by each page it touches: burying and finding it cost a hash lookup per
//! page, which matters since most buffers are freed. A larger one is buried entry by entry in an
//! [`Intervals`] index, whose cost does not depend on the size in bytes. (Records trim whole
//! entries only, those inside a later entry's bytes: keeping more never changes a verdict or a
//! report.) A tombstone carries the
//! freed buffer's name and free, for reuse-race reports. A new generation takes, at its
//! allocation, the records on its bytes ([`Generation::reuse`]): no buffer is freed on the bytes
//! of a live one, so none can appear there while it lives.
//!
//! # Why forgetting is exact
//!
//! Reports list, per participant, only its latest conflicting op, with every conflicting region
//! of that op (trace format, "Report"). Rule 2 keeps every verdict and every such list:
//!
//! - **`data-race`.** Let `Z` by `q ≠ p` access the generation later and conflict with `X` on
//!   bytes that `Y` subsumes. `Z`'s clock does not cover `X`, so it does not cover `Y`: `Y` is
//!   later in `p`'s order. `Z` or `X` writes, so `Z` or `Y` writes. So `Z` conflicts with `Y`,
//!   an op of `p` later than `X`'s: `X` is never `p`'s latest conflicting op, and `Y` carries
//!   the verdict.
//! - **`reuse-race`.** The same argument, for tombstones: `Y` of a generation freed after `X`'s
//!   trims `X` when it is buried, and an access `Z` of a later buffer on those bytes conflicts
//!   with `Y` wherever it conflicts with `X`. The report's `free` (the most recent free among the
//!   conflicts listed) is unchanged: a participant's latest op lies in the latest generation
//!   among its conflicts. *Live accesses never trim tombstones*: for the buffer that now holds
//!   the bytes, a tombstone decides `reuse-race` and its own history `data-race`, two hazards.
//!   And what `record_stream` excuses at a free is dropped before burying, so an excused entry
//!   trims nothing.
//! - **`unsafe-free`.** A free checks every access of the generation by another participant,
//!   whatever its bytes. If `X` is not ordered before the free's clock, neither is the later
//!   `Y` of the same participant, which is still in the history: `X` is not listed.
//!
//! Covered entries (rule 3) cannot be dropped: a covered entry of `q` may be `q`'s latest
//! conflicting op. They decide no verdict alone: whenever one conflicts with an access, so does
//! its coverer — or, if rule 2 dropped the coverer, the later access of the coverer's participant
//! that did (it happens after the coverer, hence after the covered entry) — so the covered list
//! is scanned only once the uncovered list found a conflict.
//!
//! Two choices keep rule 2 sound. The allocation's use has the epoch of its owner's latest access
//! but the op index of the `alloc`: a participant's op order never disagrees with its epochs. And
//! entries of the *same* op never subsume one another: a report lists every conflicting region
//! of an op.
//!
//! # Guarantee
//!
//! Exact: every hazard the trace format defines is found, nothing else, and every participant's
//! latest conflicting op is listed with all its conflicting regions (checked against the
//! brute-force oracle, with both representations of histories and tombstones, by the tests and
//! the fuzzers). Memory follows what can still decide a verdict: per byte range and participant,
//! its latest write and the latest read after it (plus covered entries), among the accesses the
//! host has not synchronized with — not the trace length, and not the size in bytes of the
//! buffers.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::{Epoch, Participant, Time, VectorClock};
use crate::report::AccessKind;
use crate::trace::{Id, MemoryKind, Site};

/// One recorded access: an op's use of one region of one generation. Kept small: a trace may
/// hold millions.
#[derive(Clone, Debug)]
pub struct Access {
    /// The op index.
    pub op: u64,
    /// The accessing participant's own clock component at the access (see [`Access::epoch`]).
    pub time: Time,
    /// First byte, relative to the buffer.
    pub offset: u64,
    /// One past the last byte; `u64::MAX` for "to the end" of an external buffer.
    pub end: u64,
    /// The op's site, shared by its accesses.
    pub site: Option<Arc<Site>>,
    /// Who accessed.
    pub participant: Participant,
    /// The kernel name of a launch, as an index into the checker's table of names plus one
    /// (0: none).
    pub label: u32,
    /// For an access of a graph replay (whose `op` is the `graph_launch`): the captured op it
    /// replays, as an index into the checker's table of captured ops plus one (0: not a
    /// replay). Indices grow in trace order, so a participant's accesses are ordered by
    /// `(op, captured)`.
    pub captured: u32,
    /// Read, write or alloc.
    pub kind: AccessKind,
}

impl Access {
    /// Who and when.
    #[inline]
    pub fn epoch(&self) -> Epoch {
        Epoch {
            participant: self.participant,
            time: self.time,
        }
    }

    /// The access's place in its participant's order, for "each participant's latest op": the
    /// op, then (within one replay) the captured op.
    #[inline]
    pub fn order_key(&self) -> (u64, u32) {
        (self.op, self.captured)
    }

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
    /// Scratch space for piece starts.
    scratch: Vec<u64>,
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
        let mut emptied = std::mem::take(&mut self.scratch);
        emptied.clear();
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
        for s in &emptied {
            self.map.remove(s);
        }
        self.scratch = emptied;
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
        drop: impl FnMut(&Arc<Entry>) -> bool,
    ) -> usize {
        self.insert_many(lo, hi, std::slice::from_ref(&entry), drop)
    }

    /// Adds `entries` over `[lo, hi)`, as [`insert`](Self::insert) does one.
    pub fn insert_many(
        &mut self,
        lo: u64,
        hi: u64,
        entries: &[Arc<Entry>],
        mut drop: impl FnMut(&Arc<Entry>) -> bool,
    ) -> usize {
        if lo >= hi || entries.is_empty() {
            return 0;
        }
        self.split_at(lo);
        self.split_at(hi);
        let mut starts = std::mem::take(&mut self.scratch);
        self.starts(lo, hi, &mut starts);
        let mut dropped = 0;
        let mut added = 0;
        let mut cursor = lo;
        let fresh = |entries: &[Arc<Entry>]| match entries {
            [one] => Slots::One(one.clone()),
            many => Slots::Many(many.to_vec()),
        };
        // Gaps between the pieces get pieces of their own (inserted after the walk).
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        for &s in &starts {
            if s > cursor {
                gaps.push((cursor, s));
            }
            let piece = self.map.get_mut(&s).expect("piece");
            let (d, left) = piece.slots.retain(|e| !drop(e));
            dropped += d;
            if left {
                for e in entries {
                    piece.slots.push(e.clone());
                }
            } else {
                piece.slots = fresh(entries);
            }
            added += entries.len();
            cursor = piece.end;
        }
        if cursor < hi {
            gaps.push((cursor, hi));
        }
        for (s, e) in gaps {
            added += entries.len();
            self.map.insert(
                s,
                Piece {
                    end: e,
                    slots: fresh(entries),
                },
            );
        }
        self.scratch = starts;
        self.slots = self.slots + added - dropped;
        self.coalesce(lo, hi);
        dropped
    }

    /// Merges adjacent pieces around and within `[lo, hi)` whose lists are the same.
    fn coalesce(&mut self, lo: u64, hi: u64) {
        let mut starts = std::mem::take(&mut self.scratch);
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
        self.scratch = starts;
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

    /// Calls `f` for every entry of every piece overlapping `[lo, hi)` (an entry spanning several
    /// pieces once per piece), changing nothing.
    pub fn for_each(&self, lo: u64, hi: u64, mut f: impl FnMut(&Arc<Entry>)) {
        if lo >= hi {
            return;
        }
        for (_, piece) in self.map.range(..hi).rev() {
            if piece.end <= lo {
                break;
            }
            piece.slots.as_slice().iter().for_each(&mut f);
        }
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
    /// What most histories never need: covered entries, or the indexed form.
    pub rest: Option<Box<Rest>>,
}

/// The less common parts of a [`History`].
#[derive(Clone, Debug, Default)]
pub struct Rest {
    /// Flat form: the covered entries (see the module docs), scanned once a conflict is found.
    pub covered: Vec<Access>,
    /// Indexed form (then `accesses` and `covered` are empty): every entry, by byte interval.
    pub index: Option<Intervals>,
}

impl History {
    /// A flat history of these entries.
    pub fn flat(accesses: Vec<Access>) -> Self {
        History {
            accesses,
            rest: None,
        }
    }

    /// The entries kept beside the flat list that later entries of their participant cover (the
    /// flat form only).
    pub fn covered(&self) -> &[Access] {
        self.rest.as_ref().map_or(&[], |r| &r.covered)
    }

    /// The index, in the indexed form.
    pub fn index_mut(&mut self) -> Option<&mut Intervals> {
        self.rest.as_mut().and_then(|r| r.index.as_mut())
    }

    /// Number of history entries kept (listings, for an index).
    pub fn len(&self) -> usize {
        match &self.rest {
            Some(r) => match &r.index {
                Some(ix) => ix.slots(),
                None => self.accesses.len() + r.covered.len(),
            },
            None => self.accesses.len(),
        }
    }

    /// Whether no history is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the entries the host's clock covers; returns how many were dropped. An index of at
    /// most half `flat_max` entries goes back to the flat form. `exact` says that `host` is the
    /// host's clock itself: a covered entry then goes with the entries covering it. Below the
    /// host's clock (a clock that keeps history for what-if analyses) each entry is judged alone.
    pub fn prune(&mut self, host: &VectorClock, flat_max: usize, exact: bool) -> usize {
        let before = self.len();
        if let Some(ix) = self.index_mut() {
            ix.sweep(|e| !host.covers(e.access.epoch()));
            if ix.slots() <= flat_max / 2 {
                let entries = ix.entries();
                self.rest = None;
                self.accesses = entries.iter().map(|e| e.access.clone()).collect();
            }
            return before - self.len();
        }
        self.accesses.retain(|a| !host.covers(a.epoch()));
        if let Some(r) = &mut self.rest {
            if self.accesses.is_empty() && exact {
                // Every covered entry happens before an entry that the host's clock covers.
                self.rest = None;
            } else {
                r.covered.retain(|a| !host.covers(a.epoch()));
            }
        }
        before - self.len()
    }

    /// Every entry, flat or indexed, moved out.
    pub fn into_all(self) -> Vec<Access> {
        let mut v = self.accesses;
        if let Some(r) = self.rest {
            match r.index {
                Some(ix) => v.extend(ix.entries().iter().map(|e| e.access.clone())),
                None => v.extend(r.covered),
            }
        }
        v
    }

    /// Every entry kept, in op order (a copy).
    pub fn all(&self) -> Vec<Access> {
        self.clone().into_all()
    }

    /// Moves a flat history into an index, in op order, trimming what rule 2 subsumes.
    pub fn index_now(&mut self) {
        if self.index_mut().is_some() {
            return;
        }
        let mut all: Vec<Access> = std::mem::take(&mut self.accesses);
        if let Some(r) = self.rest.take() {
            all.extend(r.covered);
        }
        all.sort_by_key(|a| a.order_key());
        let mut ix = Intervals::new();
        for a in all {
            let (lo, hi, p, key, writes) = (
                a.offset,
                a.end,
                a.participant,
                a.order_key(),
                a.kind.writes(),
            );
            let e = Arc::new(Entry {
                access: a,
                freed: None,
            });
            ix.insert(lo, hi, e, |x| {
                x.access.participant == p
                    && x.access.order_key() < key
                    && Access::dominates(writes, &x.access)
            });
        }
        self.rest = Some(Box::new(Rest {
            covered: Vec::new(),
            index: Some(ix),
        }));
    }
}

/// The state of one live (or external) buffer generation. Kept small: a trace may hold a
/// million live buffers.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The buffer's name.
    pub name: Id,
    /// The history every access scans.
    pub history: History,
    /// The `alloc` op's site.
    pub alloc_site: Option<Arc<Site>>,
    /// What most buffers do not need: tombstones to check, `record_stream` streams.
    extra: Option<Box<Extra>>,
    size: u64,
    addr: u64,
    alloc_op: u64,
    /// The owning participant (a stream for device memory, the host otherwise).
    pub owner: Participant,
    /// Its memory kind.
    pub memory: MemoryKind,
    flags: u8,
}

/// The less common parts of a [`Generation`].
#[derive(Clone, Debug, Default)]
struct Extra {
    reuse: Vec<Arc<Record>>,
    record_streams: Vec<Participant>,
    /// A pool buffer's index in the checker's table of pool buffers.
    pool: u32,
}

const EXTERNAL: u8 = 1;
const HAS_ADDR: u8 = 2;
const REUSE_LARGE: u8 = 4;
const POOL: u8 = 8;
const CAPTURED: u8 = 16;

impl Generation {
    /// An external buffer: device memory of unknown size, used without an `alloc`.
    pub fn external(name: Id) -> Self {
        Generation {
            name,
            history: History::default(),
            alloc_site: None,
            extra: None,
            size: 0,
            addr: 0,
            alloc_op: 0,
            owner: Participant::HOST,
            memory: MemoryKind::Device,
            flags: EXTERNAL,
        }
    }

    /// A buffer allocated at op `alloc_op`.
    #[allow(clippy::too_many_arguments)]
    pub fn allocated(
        name: Id,
        memory: MemoryKind,
        owner: Participant,
        size: u64,
        addr: Option<u64>,
        alloc_op: u64,
        alloc_site: Option<Arc<Site>>,
        history: History,
    ) -> Self {
        Generation {
            name,
            history,
            alloc_site,
            extra: None,
            size,
            addr: addr.unwrap_or(0),
            alloc_op,
            owner,
            memory,
            flags: if addr.is_some() { HAS_ADDR } else { 0 },
        }
    }

    /// Whether this is an external buffer (used without an `alloc`).
    pub fn is_external(&self) -> bool {
        self.flags & EXTERNAL != 0
    }

    /// Size in bytes; `None` for an external buffer.
    pub fn size(&self) -> Option<u64> {
        (!self.is_external()).then_some(self.size)
    }

    /// Base address in its memory kind's address space, if it takes memory.
    pub fn addr(&self) -> Option<u64> {
        (self.flags & HAS_ADDR != 0).then_some(self.addr)
    }

    /// The `alloc` op, if allocated.
    pub fn alloc_op(&self) -> Option<u64> {
        (!self.is_external()).then_some(self.alloc_op)
    }

    /// Whether this is a pool buffer: allocated on a capturing stream from a graph memory pool.
    /// Its generation outlives its free (the graph's replays keep accessing its bytes).
    pub fn is_pool(&self) -> bool {
        self.flags & POOL != 0
    }

    /// Marks this generation a pool buffer, whose index in the checker's table of pool
    /// buffers is `index`.
    pub fn set_pool(&mut self, index: u32) {
        self.flags |= POOL;
        self.extra.get_or_insert_with(Default::default).pool = index;
    }

    /// A pool buffer's index in the checker's table of pool buffers.
    #[inline]
    pub fn pool_index(&self) -> Option<u32> {
        if self.flags & POOL == 0 {
            return None;
        }
        self.extra.as_ref().map(|x| x.pool)
    }

    /// Whether a captured op of some graph names this generation: the graph's replays access
    /// it, so it is not dropped while its name moves on.
    pub fn is_captured(&self) -> bool {
        self.flags & CAPTURED != 0
    }

    /// Marks this generation named by a captured op.
    pub fn set_captured(&mut self) {
        self.flags |= CAPTURED;
    }

    /// Whether the index of large freed buffers held tombstones on its bytes at its allocation.
    pub fn reuse_large(&self) -> bool {
        self.flags & REUSE_LARGE != 0
    }

    /// Sets the tombstones its accesses are checked against.
    pub fn set_reuse(&mut self, records: Vec<Arc<Record>>, large: bool) {
        self.flags = (self.flags & !REUSE_LARGE) | if large { REUSE_LARGE } else { 0 };
        match &mut self.extra {
            Some(x) => x.reuse = records,
            None if records.is_empty() => {}
            None => {
                self.extra = Some(Box::new(Extra {
                    reuse: records,
                    ..Extra::default()
                }))
            }
        }
    }

    /// The records of small freed buffers on its bytes when it was allocated: only those can
    /// race with its accesses as reuse (snapshots: entries the host's clock covers since are
    /// skipped as they are met). Whether the index of large freed buffers held tombstones on its
    /// bytes then is [`Generation::reuse_large`].
    pub fn reuse(&self) -> &[Arc<Record>] {
        self.extra.as_ref().map_or(&[], |x| &x.reuse)
    }

    /// The streams named by `record_stream` (other than the owner of device memory).
    pub fn record_streams(&self) -> &[Participant] {
        self.extra.as_ref().map_or(&[], |x| &x.record_streams)
    }

    /// Adds a stream named by `record_stream`.
    pub fn add_record_stream(&mut self, p: Participant) {
        let x = self.extra.get_or_insert_with(Default::default);
        if !x.record_streams.contains(&p) {
            x.record_streams.push(p);
        }
    }

    /// Takes out the streams named by `record_stream`.
    pub fn take_record_streams(&mut self) -> Vec<Participant> {
        self.extra
            .as_mut()
            .map(|x| std::mem::take(&mut x.record_streams))
            .unwrap_or_default()
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
        a.participant != self.participant
            && (self.writes || a.kind.writes())
            && !self.clock.covers(a.epoch())
    }
}

/// Scans a flat history list for an access: drops the entries the host's clock covers, calls
/// `hit` for every entry that conflicts with the access (overlapping bytes, another participant,
/// a write on either side, not ordered before it), and, with `cover`, drops the entries of the
/// same participant that the access subsumes and moves to `cover`'s covered list those of others
/// that it covers (see the module docs). Returns the number of entries dropped.
pub fn scan(
    list: &mut Vec<Access>,
    mut cover: Option<&mut Option<Box<Rest>>>,
    host: &VectorClock,
    probe: Probe<'_>,
    mut hit: impl FnMut(&Access),
) -> usize {
    let mut dropped = 0;
    let mut k = 0;
    while k < list.len() {
        let a = &list[k];
        if host.covers(a.epoch()) {
            list.swap_remove(k);
            dropped += 1;
            continue;
        }
        let ordered = probe.clock.covers(a.epoch());
        if !ordered
            && a.participant != probe.participant
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
                if a.participant == probe.participant {
                    // Subsumed by this later access of its own participant.
                    list.swap_remove(k);
                    dropped += 1;
                } else {
                    let moved = list.swap_remove(k);
                    c.get_or_insert_with(Default::default).covered.push(moved);
                }
                continue;
            }
        }
        k += 1;
    }
    dropped
}

/// What a small freed generation leaves: its unexcused accesses, its bytes and its free.
#[derive(Clone, Debug)]
pub struct Record {
    /// First byte (absolute).
    pub lo: u64,
    /// One past the last byte (absolute).
    pub hi: u64,
    /// The buffer's name and free.
    pub freed: Freed,
    /// The accesses, with offsets relative to `lo`.
    pub entries: Vec<Access>,
}

impl Record {
    /// The absolute byte range of one of its entries.
    #[inline]
    pub fn range(&self, a: &Access) -> (u64, u64) {
        (
            self.lo + a.offset,
            self.lo.saturating_add(a.end).min(self.hi),
        )
    }
}

/// The page size of the small-record table.
const PAGE_BITS: u32 = 16;
/// Freed generations spanning at most this many pages are small records; larger ones go, entry
/// by entry, into the interval index.
pub const SMALL_PAGES: u64 = 64;

fn page_span(lo: u64, hi: u64) -> (u64, u64) {
    (lo >> PAGE_BITS, (hi - 1) >> PAGE_BITS)
}

/// The tombstones of one memory kind.
#[derive(Clone, Debug, Default)]
struct Space {
    /// Small records, by slot.
    records: Vec<Option<Arc<Record>>>,
    free_slots: Vec<u32>,
    /// Page → the slots of the records touching it (emptied lists stay until a sweep).
    pages: rustc_hash::FxHashMap<u64, Vec<u32>>,
    /// Small records kept.
    count: usize,
    /// Records no longer listed, for reuse (each uniquely owned, its entries empty).
    spare: Vec<Arc<Record>>,
    /// Entries of the small records.
    entries: usize,
    /// Large freed buffers, entry by entry.
    large: Intervals,
}

impl Space {
    fn remove(&mut self, slot: u32) {
        let Some(mut rec) = self.records[slot as usize].take() else {
            return;
        };
        self.entries -= rec.entries.len();
        // Keep the allocation for the next record (most frees bury one and trim one).
        if let Some(r) = Arc::get_mut(&mut rec) {
            if self.spare.len() < 64 {
                r.entries.clear();
                let (lo, hi) = (r.lo, r.hi);
                self.spare.push(rec);
                return self.unlist(slot, lo, hi);
            }
        }
        self.unlist(slot, rec.lo, rec.hi);
    }

    fn unlist(&mut self, slot: u32, lo: u64, hi: u64) {
        self.count -= 1;
        let (first, last) = page_span(lo, hi);
        for p in first..=last {
            if let Some(v) = self.pages.get_mut(&p) {
                if let Some(k) = v.iter().position(|&s| s == slot) {
                    v.swap_remove(k);
                }
            }
        }
        self.free_slots.push(slot);
    }

    /// The slots of the small records overlapping `[lo, hi)`, each once: through the pages of
    /// a range of at most [`SMALL_PAGES`] pages, through every record for a larger one.
    fn overlapping(&self, lo: u64, hi: u64, into: &mut Vec<u32>) {
        into.clear();
        if self.count == 0 {
            return;
        }
        let (first, last) = page_span(lo, hi);
        let overlaps = |s: u32| {
            self.records[s as usize]
                .as_ref()
                .is_some_and(|r| r.lo < hi && lo < r.hi)
        };
        if last - first >= SMALL_PAGES {
            into.extend((0..self.records.len() as u32).filter(|&s| overlaps(s)));
            return;
        }
        for p in first..=last {
            let Some(v) = self.pages.get(&p) else {
                continue;
            };
            for &s in v {
                if overlaps(s) && !into.contains(&s) {
                    into.push(s);
                }
            }
        }
    }
}

/// Tombstones of freed generations, by memory kind and absolute address (see the module docs).
///
/// A freed generation that spans at most [`SMALL_PAGES`] pages of 64 KiB is one [`Record`],
/// listed by every page it touches: burying and finding it cost a lookup per page. A larger one
/// is buried entry by entry in an [`Intervals`] index, whose cost does not depend on its size.
#[derive(Clone, Debug)]
pub struct Graveyard {
    kinds: [Space; 3],
    scratch: Vec<u32>,
    small_pages: u64,
}

impl Default for Graveyard {
    fn default() -> Self {
        Self::new(SMALL_PAGES)
    }
}

impl Graveyard {
    /// A graveyard whose small records span at most `small_pages` pages of 64 KiB (0: every
    /// freed buffer goes into the interval index).
    pub fn new(small_pages: u64) -> Self {
        Graveyard {
            kinds: Default::default(),
            scratch: Vec::new(),
            small_pages,
        }
    }

    /// Buries the accesses of a freed generation occupying `[base, base + size)`. Each trims the
    /// tombstones of its participant that it subsumes (rule 2; for small records, whole entries
    /// inside its bytes), and tombstones the host's clock covers are dropped on the way.
    ///
    /// Returns an empty vector (with its capacity) for the caller to reuse, when one is freed.
    pub fn bury(
        &mut self,
        kind: MemoryKind,
        base: u64,
        size: u64,
        mut entries: Vec<Access>,
        freed: Freed,
        host: &VectorClock,
    ) -> Option<Vec<Access>> {
        if entries.is_empty() || size == 0 {
            return Some(entries);
        }
        let hi = base.saturating_add(size);
        let space = &mut self.kinds[kind.index()];
        let (first, last) = page_span(base, hi);
        if last - first >= self.small_pages {
            let ix = &mut space.large;
            let freed = Arc::new(freed);
            entries.sort_by_key(|a| a.order_key());
            for a in entries {
                let (lo, end) = (base + a.offset, base.saturating_add(a.end).min(hi));
                let (p, key, writes) = (a.participant, a.order_key(), a.kind.writes());
                let entry = Arc::new(Entry {
                    access: a,
                    freed: Some(freed.clone()),
                });
                ix.insert(lo, end, entry, |w| {
                    let w = &w.access;
                    host.covers(w.epoch())
                        || (w.participant == p
                            && w.order_key() < key
                            && Access::dominates(writes, w))
                });
            }
            return None;
        }
        let mut rec = Record {
            lo: base,
            hi,
            freed,
            entries,
        };
        // Trim the small records on these bytes: entries the host's clock covers, and entries
        // inside the bytes of a later entry of the same participant that dominates them.
        let mut slots = std::mem::take(&mut self.scratch);
        space.overlapping(base, hi, &mut slots);
        for &slot in &slots {
            let Some(old) = space.records[slot as usize].as_mut() else {
                continue;
            };
            let subsumed = |w: &Access| {
                if host.covers(w.epoch()) {
                    return true;
                }
                let (wl, wh) = old.range(w);
                rec.entries.iter().any(|y| {
                    let (yl, yh) = rec.range(y);
                    y.participant == w.participant
                        && w.order_key() < y.order_key()
                        && Access::dominates(y.kind.writes(), w)
                        && yl <= wl
                        && wh <= yh
                })
            };
            if !old.entries.iter().any(subsumed) {
                continue;
            }
            let old = Arc::make_mut(old);
            let before = old.entries.len();
            let range = |a: &Access| (old.lo + a.offset, old.lo.saturating_add(a.end).min(old.hi));
            old.entries.retain(|w| {
                if host.covers(w.epoch()) {
                    return false;
                }
                let (wl, wh) = range(w);
                !rec.entries.iter().any(|y| {
                    let (yl, yh) = rec.range(y);
                    y.participant == w.participant
                        && w.order_key() < y.order_key()
                        && Access::dominates(y.kind.writes(), w)
                        && yl <= wl
                        && wh <= yh
                })
            });
            space.entries -= before - old.entries.len();
            if old.entries.is_empty() {
                space.remove(slot);
            }
        }
        self.scratch = slots;
        space.entries += rec.entries.len();
        space.count += 1;
        let mut returned = None;
        let arc = match space.spare.pop() {
            Some(mut a) => {
                let r = Arc::get_mut(&mut a).expect("spare records are unshared");
                std::mem::swap(&mut r.entries, &mut rec.entries);
                r.lo = rec.lo;
                r.hi = rec.hi;
                r.freed = rec.freed;
                returned = Some(rec.entries);
                a
            }
            None => Arc::new(rec),
        };
        let slot = match space.free_slots.pop() {
            Some(s) => {
                space.records[s as usize] = Some(arc);
                s
            }
            None => {
                space.records.push(Some(arc));
                space.records.len() as u32 - 1
            }
        };
        for p in first..=last {
            space.pages.entry(p).or_default().push(slot);
        }
        returned
    }

    /// The tombstones on `[lo, hi)` of `kind`: the small records there, and whether the index of
    /// large ones has some.
    pub fn reuse(&mut self, kind: MemoryKind, lo: u64, hi: u64) -> (Vec<Arc<Record>>, bool) {
        let space = &self.kinds[kind.index()];
        if lo >= hi || (space.count == 0 && space.large.is_empty()) {
            return (Vec::new(), false);
        }
        let mut slots = std::mem::take(&mut self.scratch);
        space.overlapping(lo, hi, &mut slots);
        let mut records: Vec<Arc<Record>> = Vec::with_capacity(slots.len());
        records.extend(
            slots
                .iter()
                .filter_map(|&s| space.records[s as usize].clone()),
        );
        self.scratch = slots;
        (records, space.large.overlaps(lo, hi))
    }

    /// The index of large freed buffers of one memory kind.
    pub fn large(&mut self, kind: MemoryKind) -> &mut Intervals {
        &mut self.kinds[kind.index()].large
    }

    /// The index of large freed buffers of one memory kind, to read.
    pub fn large_ref(&self, kind: MemoryKind) -> &Intervals {
        &self.kinds[kind.index()].large
    }

    /// Drops the tombstones the host's clock covers; returns how many were dropped.
    pub fn prune(&mut self, host: &VectorClock) -> usize {
        let mut dropped = 0;
        for space in &mut self.kinds {
            dropped += space.large.sweep(|e| !host.covers(e.access.epoch()));
            for slot in 0..space.records.len() as u32 {
                let Some(rec) = space.records[slot as usize].as_mut() else {
                    continue;
                };
                if !rec.entries.iter().any(|a| host.covers(a.epoch())) {
                    continue;
                }
                let rec = Arc::make_mut(rec);
                let before = rec.entries.len();
                rec.entries.retain(|a| !host.covers(a.epoch()));
                let d = before - rec.entries.len();
                space.entries -= d;
                dropped += d;
                if rec.entries.is_empty() {
                    space.remove(slot);
                }
            }
            space.pages.retain(|_, v| !v.is_empty());
        }
        dropped
    }

    /// Whether no tombstone is kept.
    pub fn is_empty(&self) -> bool {
        self.kinds
            .iter()
            .all(|s| s.count == 0 && s.large.is_empty())
    }

    /// Tombstones kept: entries of small records, and listings of the index of large ones.
    pub fn len(&self) -> usize {
        self.kinds.iter().map(|s| s.entries + s.large.slots()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(op: u64, p: u32, time: u64, kind: AccessKind, offset: u64, end: u64) -> Arc<Entry> {
        Arc::new(Entry {
            access: Access {
                op,
                time,
                participant: Participant(p),
                kind,
                offset,
                end,
                site: None,
                label: 0,
                captured: 0,
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
            e.access.participant == Participant(1)
        });
        assert_eq!(dropped, 3, "listings of op 1 in [30,40), [40,60), [60,70)");
        assert_eq!(listing(&mut ix, 35, 36), vec![3]);
        assert_eq!(listing(&mut ix, 50, 51), vec![2, 3]);
        assert_eq!(listing(&mut ix, 0, 100), vec![1, 2, 3]);
        assert_eq!(listing(&mut ix, 75, 76), vec![1]);
        // Dropping participant 2 everywhere leaves [0,30) 1, [30,70) 3, [70,100) 1.
        ix.sweep(|e| e.access.participant != Participant(2));
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
