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

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::{Epoch, Participant, VectorClock};
use crate::report::AccessKind;
use crate::trace::{Id, MemoryKind, Site};

/// Extra facts about an op kept with its accesses for reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The op's site.
    pub site: Option<Arc<Site>>,
    /// The kernel name of a launch.
    pub label: Option<Arc<str>>,
}

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
    /// Site and label of the op, shared by its accesses.
    pub info: Option<Arc<OpInfo>>,
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
    /// The history not yet pruned.
    pub accesses: Vec<Access>,
}

impl Generation {
    /// Whether this is an external buffer (used without an `alloc`).
    pub fn is_external(&self) -> bool {
        self.size.is_none()
    }

    /// Drops the entries the host's clock covers; returns how many were dropped.
    pub fn prune(&mut self, host: &VectorClock) -> usize {
        let before = self.accesses.len();
        self.accesses.retain(|a| !host.covers(a.epoch));
        before - self.accesses.len()
    }
}

/// A dense index into the generation table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GenId(pub u32);

/// Freed generations with live history, by memory kind and address range.
#[derive(Clone, Debug, Default)]
pub struct Graveyard {
    kinds: [Space; 3],
}

#[derive(Clone, Debug, Default)]
struct Space {
    /// (start, generation) → end.
    ranges: BTreeMap<(u64, GenId), u64>,
    /// The longest range ever inserted: bounds the backwards search of an overlap query.
    max_len: u64,
}

fn slot(kind: MemoryKind) -> usize {
    match kind {
        MemoryKind::Device => 0,
        MemoryKind::Pinned => 1,
        MemoryKind::Managed => 2,
    }
}

impl Graveyard {
    /// Adds a freed generation occupying `[start, end)`.
    pub fn insert(&mut self, kind: MemoryKind, start: u64, end: u64, g: GenId) {
        let s = &mut self.kinds[slot(kind)];
        s.max_len = s.max_len.max(end - start);
        s.ranges.insert((start, g), end);
    }

    /// Removes a generation.
    pub fn remove(&mut self, kind: MemoryKind, start: u64, g: GenId) {
        self.kinds[slot(kind)].ranges.remove(&(start, g));
    }

    /// Whether no freed generation is kept.
    pub fn is_empty(&self) -> bool {
        self.kinds.iter().all(|s| s.ranges.is_empty())
    }

    /// Calls `f` for each generation overlapping `[start, end)`, with its start.
    pub fn overlapping(
        &self,
        kind: MemoryKind,
        start: u64,
        end: u64,
        mut f: impl FnMut(GenId, u64),
    ) {
        let s = &self.kinds[slot(kind)];
        if s.ranges.is_empty() || start >= end {
            return;
        }
        let lo = start.saturating_sub(s.max_len);
        for (&(gs, g), &ge) in s.ranges.range((lo, GenId(0))..(end, GenId(0))) {
            if ge > start && gs < end {
                f(g, gs);
            }
        }
    }

    /// Every kept generation with its memory kind and start.
    pub fn all(&self) -> impl Iterator<Item = (MemoryKind, u64, GenId)> + '_ {
        [MemoryKind::Device, MemoryKind::Pinned, MemoryKind::Managed]
            .into_iter()
            .flat_map(move |k| {
                self.kinds[slot(k)]
                    .ranges
                    .keys()
                    .map(move |&(s, g)| (k, s, g))
            })
    }

    /// Number of kept generations.
    pub fn len(&self) -> usize {
        self.kinds.iter().map(|s| s.ranges.len()).sum()
    }
}
