//! The interval index of histories and of large freed generations: disjoint byte pieces, each
//! listing the entries that cover it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;

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
