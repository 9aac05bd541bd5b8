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

mod graveyard;
mod intervals;

pub use graveyard::{Graveyard, Record, SMALL_PAGES};
pub use intervals::{Intervals, Visit};

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

#[cfg(test)]
mod tests;
