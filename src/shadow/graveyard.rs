//! The graveyard: what freed generations leave, per memory kind, at absolute addresses (small
//! records listed by page, large generations in an interval index).

use std::sync::Arc;

use super::*;

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

/// A small record's listing on a page, with its bytes: finding what overlaps a range reads the
/// page's list alone, not every record on the page.
#[derive(Clone, Copy, Debug)]
struct Listed {
    slot: u32,
    lo: u64,
    hi: u64,
}

/// The tombstones of one memory kind.
#[derive(Clone, Debug, Default)]
struct Space {
    /// Small records, by slot.
    records: Vec<Option<Arc<Record>>>,
    free_slots: Vec<u32>,
    /// Page → the records touching it (emptied lists stay until a sweep).
    pages: rustc_hash::FxHashMap<u64, Vec<Listed>>,
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
                if let Some(k) = v.iter().position(|l| l.slot == slot) {
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
        // A record is listed once per page: only a range over several pages meets it twice.
        let single = first == last;
        for p in first..=last {
            let Some(v) = self.pages.get(&p) else {
                continue;
            };
            for l in v {
                debug_assert!(self.records[l.slot as usize]
                    .as_ref()
                    .is_none_or(|r| (r.lo, r.hi) == (l.lo, l.hi)));
                if l.lo < hi
                    && lo < l.hi
                    && self.records[l.slot as usize].is_some()
                    && (single || !into.contains(&l.slot))
                {
                    into.push(l.slot);
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
        let listed = Listed { slot, lo: base, hi };
        for p in first..=last {
            space.pages.entry(p).or_default().push(listed);
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
