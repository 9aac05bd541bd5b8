//! Shadow memory: the access history of every buffer generation, and of freed generations whose
//! bytes a later allocation may reuse.
//!
//! Each allocation is a *generation* (a name allocated again is a new generation). Its history is
//! the list of accesses not yet known to happen before every future access: one entry per op and
//! region, with the epoch of the access, so a conflict check is one clock lookup per entry and a
//! report can list every earlier unordered access exactly. An entry is pruned once the host's
//! clock covers it: every future op of every participant joins the host's clock first (rule 2),
//! so such an entry can never conflict again. Freed generations with live history stay in the
//! [`Graveyard`], indexed by address, until their history is pruned: that is what finds reuse
//! races. Memory thus follows the accesses issued since the host last synchronized with them, not
//! the trace length.

use rustc_hash::FxHashMap;
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
}

/// The state of one buffer generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// A number no other generation of the trace has (slots of the table are reused).
    pub serial: u64,
    /// The freed generations whose bytes this one's memory reuses, found at its allocation:
    /// (slot, serial, start). Only those can race with its accesses as reuse, since memory
    /// freed later was live alongside it and cannot overlap it.
    pub reuses: Vec<(GenId, u64, u64)>,
    /// The buffer's name.
    pub name: Id,
    /// Its memory kind.
    pub memory: MemoryKind,
    /// The owning participant (a stream for device memory, the host otherwise).
    pub owner: Participant,
    /// Size in bytes; `None` for an external buffer.
    pub size: Option<u64>,
    /// Base address in its memory kind's address space, if it takes memory.
    pub addr: Option<u64>,
    /// The block the allocator handed out (`size` rounded up), if any.
    pub block_size: u64,
    /// The `alloc` op, if allocated.
    pub alloc_op: Option<u64>,
    /// The `alloc` op's site.
    pub alloc_site: Option<Arc<Site>>,
    /// The free, once freed: op index, participant, site.
    pub free: Option<(u64, Participant, Option<Arc<Site>>)>,
    /// Streams named by `record_stream` (other than the owner of device memory).
    pub record_streams: Vec<Participant>,
    /// The history not yet pruned that every access scans.
    pub accesses: Vec<Access>,
    /// History made redundant for detection by a later access that covers its bytes and that it
    /// happens before (a write covers anything, a read covers reads): whenever such an entry
    /// conflicts with an access, so does the covering one — or the one covering that. So an
    /// access scans this list only once it has found a conflict, to list every conflicting
    /// access exactly; the common, ordered access never does.
    pub covered: Vec<Access>,
}

impl Generation {
    /// Whether this is an external buffer (used without an `alloc`).
    pub fn is_external(&self) -> bool {
        self.size.is_none()
    }

    /// Drops the entries the host's clock covers; returns how many were dropped.
    pub fn prune(&mut self, host: &VectorClock) -> usize {
        let before = self.history_len();
        self.accesses.retain(|a| !host.covers(a.epoch));
        if self.accesses.is_empty() {
            // Every covered entry happens before an entry that the host's clock covers.
            self.covered.clear();
        } else {
            self.covered.retain(|a| !host.covers(a.epoch));
        }
        before - self.history_len()
    }

    /// Number of history entries kept.
    pub fn history_len(&self) -> usize {
        self.accesses.len() + self.covered.len()
    }

    /// Whether no history is kept.
    pub fn history_is_empty(&self) -> bool {
        self.accesses.is_empty() && self.covered.is_empty()
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

/// Scans one history list for an access: drops the entries the host's clock covers, calls `hit`
/// for every entry that conflicts with the access (overlapping bytes, another participant, a
/// write on either side, not ordered before it), and, with `cover`, moves there the entries the
/// access covers (see [`Generation::covered`]). Returns the number of entries dropped.
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
                && (probe.writes || !a.kind.writes())
            {
                c.push(list.swap_remove(k));
                continue;
            }
        }
        k += 1;
    }
    dropped
}

/// A dense index into the generation table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GenId(pub u32);

/// Freed generations with live history, by memory kind and address range.
///
/// Each memory kind's address space is cut into pages of `PAGE` bytes; a page lists the kept
/// generations that touch it. An overlap query looks only at the pages of its own range.
#[derive(Clone, Debug, Default)]
pub struct Graveyard {
    kinds: [Space; 3],
}

#[derive(Clone, Debug, Default)]
struct Space {
    ranges: FxHashMap<GenId, (u64, u64)>,
    /// Page → the kept generations touching it, with their ranges. Emptied pages keep their
    /// (empty) list, so the address space's pages are allocated once.
    pages: FxHashMap<u64, Vec<(GenId, u64, u64)>>,
}

/// The page size of the graveyard's index.
const PAGE: u64 = 1 << 16;

fn pages(start: u64, end: u64) -> std::ops::RangeInclusive<u64> {
    (start / PAGE)..=((end - 1) / PAGE)
}

impl Graveyard {
    /// Adds a freed generation occupying `[start, end)` (not empty).
    pub fn insert(&mut self, kind: MemoryKind, start: u64, end: u64, g: GenId) {
        let s = &mut self.kinds[kind.index()];
        s.ranges.insert(g, (start, end));
        for p in pages(start, end) {
            s.pages.entry(p).or_default().push((g, start, end));
        }
    }

    /// Removes a generation.
    pub fn remove(&mut self, kind: MemoryKind, g: GenId) {
        let s = &mut self.kinds[kind.index()];
        let Some((start, end)) = s.ranges.remove(&g) else {
            return;
        };
        for p in pages(start, end) {
            if let Some(v) = s.pages.get_mut(&p) {
                if let Some(k) = v.iter().position(|x| x.0 == g) {
                    v.swap_remove(k);
                }
            }
        }
    }

    /// Whether no freed generation is kept.
    pub fn is_empty(&self) -> bool {
        self.kinds.iter().all(|s| s.ranges.is_empty())
    }

    /// Calls `f` once for each generation overlapping `[start, end)`, with its start.
    pub fn overlapping(
        &self,
        kind: MemoryKind,
        start: u64,
        end: u64,
        mut f: impl FnMut(GenId, u64),
    ) {
        let s = &self.kinds[kind.index()];
        if s.ranges.is_empty() || start >= end {
            return;
        }
        let first = start / PAGE;
        for p in pages(start, end) {
            let Some(v) = s.pages.get(&p) else { continue };
            for &(g, gs, ge) in v {
                // Report each generation at the first page both ranges share.
                if gs < end && start < ge && (gs / PAGE).max(first) == p {
                    f(g, gs);
                }
            }
        }
    }

    /// Every kept generation with its memory kind.
    pub fn all(&self) -> impl Iterator<Item = (MemoryKind, GenId)> + '_ {
        [MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Managed]
            .into_iter()
            .flat_map(move |k| self.kinds[k.index()].ranges.keys().map(move |&g| (k, g)))
    }

    /// Number of kept generations.
    pub fn len(&self) -> usize {
        self.kinds.iter().map(|s| s.ranges.len()).sum()
    }
}
