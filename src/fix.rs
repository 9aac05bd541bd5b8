//! `streamsan fix`: insert the synchronization that removes a trace's races.
//!
//! The fixer walks the trace once more after a first check found its hazards, and keeps a
//! [`Checker`] over the program it writes (the original ops plus what it inserted). Before each
//! op that had a `data-race`, `reuse-race` or `unsafe-free` in the original trace, it asks which
//! of that hazard's conflicting accesses the op's clock in the written program does not cover
//! yet (insertions only add order, so these are all that can be left), and inserts, just before
//! the op:
//!
//! - a caching free of device memory still used by other streams: `record_stream(buffer, S)` for
//!   each such stream S (PyTorch's own fix: the allocator waits for S before reusing the memory);
//! - a later op on a stream Q: `event_record(E, S)` then `event_wait(Q, E)` for each earlier
//!   stream S with an unordered access (PyTorch's `Q.wait_stream(S)`);
//! - a later op of the host: `event_record(E, S)` then `event_sync(E)`.
//!
//! Each inserted event has a fresh name, recorded just before it is waited on, so it captures
//! the earlier access (it was issued before) and never changes what an existing event means.
//! An op's insertions are at most two per hazard at that op: when the events would take more
//! (a hazard with conflicts on several streams), the host waits instead — one `stream_sync` per
//! stream, or one `device_sync` per device when even that is too many. Only the last can exceed
//! two: a hazard whose unordered accesses are on streams of three or more devices.
//!
//! Insertions only add happens-before edges, which can only remove hazards; the checker over the
//! written program proves the result: [`Fixer::finish`] returns its report.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::checker::{fewest_record_streams, CheckError, Checker};
use crate::clock::VectorClock;
use crate::report::{Conflict, Hazard, HazardKind, Report};
use crate::trace::{Id, Op, Site, TraceOp, HOST};

/// Whether synchronization can remove hazards of this kind (`fix` inserts it).
pub fn is_fixable(kind: HazardKind) -> bool {
    matches!(
        kind,
        HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree
    )
}

/// The participant of the hazards at one op: the op's (for a free, the freeing participant's).
/// Every hazard at one op has the same.
fn later_participant(hazards: &[Hazard]) -> String {
    hazards
        .iter()
        .find_map(|h| h.access.as_ref().map(|a| a.participant.clone()))
        .unwrap_or_else(|| HOST.to_string())
}

/// What was inserted before one op of the original trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insertion {
    /// The op index, in the original trace, of the op the insertion precedes.
    pub before: u64,
    /// The hazards at that op that the insertion removes: (kind, buffer).
    pub hazards: Vec<(HazardKind, String)>,
    /// The inserted ops, in order.
    pub ops: Vec<TraceOp>,
    /// One line for the reader of the fixed trace (written as a comment above the ops).
    pub comment: String,
}

/// The counts of a fix.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FixSummary {
    /// Fixable hazards (data-race, reuse-race, unsafe-free) in the original trace.
    pub fixable: u64,
    /// Of those, how many the written trace no longer has.
    pub fixed: u64,
    /// Ops inserted in all.
    pub inserted: u64,
    /// The most ops inserted before one op, per hazard fixed there (0 if none).
    pub max_per_hazard: f64,
}

/// Walks a trace a second time and inserts synchronization before the ops whose hazards the
/// first check found. See the [module docs](self).
pub struct Fixer {
    checker: Checker,
    /// Original op index → the fixable hazards the first check found there.
    targets: BTreeMap<u64, Vec<Hazard>>,
    /// The latest `alloc` of each buffer name (original op index).
    allocs: HashMap<Id, u64>,
    /// The inserted `record_stream`s of each free: (buffer, the join of the named streams'
    /// clocks at the free, its alloc, its free), original indices.
    record_streams: Vec<(Id, VectorClock, u64, u64)>,
    fixable: u64,
    /// Event names the trace uses: inserted events avoid them.
    taken: HashSet<Id>,
    next_event: u64,
    /// The written program's hazards, collected as they are found.
    found: Vec<Hazard>,
    insertions: Vec<Insertion>,
    inserted: u64,
    max_per_hazard: f64,
}

impl Fixer {
    /// A fixer for a trace whose first check gave `original`; `events` are every event name the
    /// trace uses (inserted events get other names).
    pub fn new(original: &Report, events: impl IntoIterator<Item = Id>) -> Self {
        let mut targets = BTreeMap::new();
        let mut fixable = 0;
        for h in original.hazards.iter().filter(|h| is_fixable(h.kind)) {
            targets.entry(h.op).or_insert_with(Vec::new).push(h.clone());
            fixable += 1;
        }
        Fixer {
            checker: Checker::new(),
            targets,
            allocs: HashMap::default(),
            record_streams: Vec::new(),
            fixable,
            taken: events.into_iter().collect(),
            next_event: 0,
            found: Vec::new(),
            insertions: Vec::new(),
            inserted: 0,
            max_per_hazard: 0.0,
        }
    }

    /// Takes the original op `index`: returns the ops to write before it (empty for most ops),
    /// having checked them and the op itself.
    ///
    /// The error is bad input in the trace (which the first check would have reported).
    pub fn op(&mut self, index: u64, op: &TraceOp) -> Result<Option<&Insertion>, CheckError> {
        if let Op::Alloc { buffer, .. } = &op.op {
            self.allocs.insert(buffer.clone(), index);
        }
        let Some(original) = self.targets.remove(&index) else {
            self.feed(op)?;
            return Ok(None);
        };
        // What is left of this op's hazards after the insertions so far: the conflicts that the
        // clock of the op, issued now, does not cover. Insertions only add order, so no other
        // conflict can have appeared.
        let left = self.left(index, op, original);
        if left.is_empty() {
            self.feed(op)?;
            return Ok(None);
        }
        let insertion = self.plan(index, op, &left);
        for extra in &insertion.ops {
            self.feed(extra)?;
        }
        self.feed(op)?;
        self.inserted += insertion.ops.len() as u64;
        let per = insertion.ops.len() as f64 / left.len() as f64;
        self.max_per_hazard = self.max_per_hazard.max(per);
        self.insertions.push(insertion);
        Ok(self.insertions.last())
    }

    /// The hazards of `original` (at op `index`) that still have conflicts the op's clock does
    /// not cover, with only those conflicts.
    ///
    /// The clock is the one the checker would give the op: for an op on a stream, the stream's
    /// clock joined with the host's (and the legacy default stream's); for a caching free, the
    /// owning stream's joined with the host's; for the host, the host's. A reuse race is also
    /// covered when the clock, at the free, of a stream an inserted `record_stream` names for its
    /// buffer covers the earlier access (the allocator waits for that stream before reusing the
    /// bytes). (A free's `record_stream` streams of the trace itself are not counted: the fix may
    /// then insert more than needed, never less; the checker over the written trace decides.)
    fn left(&self, index: u64, op: &TraceOp, original: Vec<Hazard>) -> Vec<Hazard> {
        let order = self.checker.order();
        let later = later_participant(&original);
        let stream = (later != HOST)
            .then(|| order.find_stream(&Id::from(later.as_str())))
            .flatten();
        let clock = match stream {
            Some(q) if op.op.on_stream().is_some() => order.issue_clock(q),
            Some(q) => {
                let mut c = order.clock(q).clone();
                c.join(order.host_clock());
                c
            }
            None => order.host_clock().clone(),
        };
        original
            .into_iter()
            .filter_map(|mut h| {
                let reuse = h.kind == HazardKind::ReuseRace;
                h.conflicts.retain(|c| {
                    let covered = c.epoch.is_some_and(|e| clock.covers(e))
                        || (reuse
                            && self
                                .record_streams
                                .iter()
                                .any(|(b, recorded, alloc, free)| {
                                    b.as_str() == c.buffer
                                        && c.epoch.is_some_and(|e| recorded.covers(e))
                                        && *alloc <= c.op
                                        && c.op < *free
                                        && *free < index
                                }));
                    !covered
                });
                (!h.conflicts.is_empty()).then_some(h)
            })
            .collect()
    }

    fn feed(&mut self, op: &TraceOp) -> Result<(), CheckError> {
        self.checker.check(op)?;
        self.collect();
        Ok(())
    }

    fn collect(&mut self) {
        self.found.extend(self.checker.take_hazards());
    }

    fn fresh_event(&mut self) -> Id {
        loop {
            self.next_event += 1;
            let id = Id::from(format!("streamsan-fix-{}", self.next_event).as_str());
            if !self.taken.contains(&id) {
                return id;
            }
        }
    }

    /// The ops that order every conflict of `left` (the hazards still at op `index`) before it.
    fn plan(&mut self, index: u64, op: &TraceOp, left: &[Hazard]) -> Insertion {
        let later = later_participant(left);
        let earlier: BTreeSet<String> = left
            .iter()
            .flat_map(|h| h.conflicts.iter().map(|c| c.participant.clone()))
            .filter(|p| *p != later && p != HOST)
            .collect();
        let hazards: Vec<(HazardKind, String)> = left
            .iter()
            .map(|h| (h.kind, h.buffer.clone().unwrap_or_default()))
            .collect();
        let budget = 2 * left.len();
        let what = hazards
            .iter()
            .map(|(k, b)| format!("{k} on {b}"))
            .collect::<Vec<_>>()
            .join(", ");
        let site = Some(Site::Label(format!(
            "streamsan fix: {what} at op {index} of the original trace"
        )));
        let with_site = |op: Op| TraceOp {
            op,
            site: site.clone(),
        };
        let caching_device_free = matches!(&op.op, Op::Free { stream: None, .. }) && later != HOST;
        let buffer_of_free = match &op.op {
            Op::Free { buffer, .. } => Some(buffer.clone()),
            _ => None,
        };
        let list = earlier.iter().cloned().collect::<Vec<_>>().join(", ");
        let record_stream =
            buffer_of_free.filter(|_| caching_device_free && earlier.len() <= budget);
        let (ops, how) = if let Some(buffer) = record_stream {
            let alloc = self.allocs.get(&buffer).copied().unwrap_or(0);
            // A caching free of device memory: every conflict is another stream's. A stream
            // whose accesses the other named streams' clocks already cover needs no
            // record_stream of its own.
            let earlier: Vec<String> = earlier.iter().cloned().collect();
            let conflicts: Vec<Conflict> = left.iter().flat_map(|h| h.conflicts.clone()).collect();
            let named = fewest_record_streams(self.checker.order(), &earlier, &conflicts);
            let list = named.join(", ");
            let order = self.checker.order();
            let mut recorded = VectorClock::new();
            for p in &named {
                if let Some(q) = order.find_stream(&Id::from(p.as_str())) {
                    recorded.join(order.clock(q));
                }
            }
            self.record_streams
                .push((buffer.clone(), recorded, alloc, index));
            let ops = named
                .iter()
                .map(|s| {
                    with_site(Op::RecordStream {
                        buffer: buffer.clone(),
                        stream: Id::from(s.as_str()),
                    })
                })
                .collect::<Vec<_>>();
            (ops, format!("record_stream({buffer}, {list})"))
        } else if 2 * earlier.len() <= budget {
            let mut ops = Vec::new();
            for s in &earlier {
                let event = self.fresh_event();
                ops.push(with_site(Op::EventRecord {
                    event: event.clone(),
                    stream: Id::from(s.as_str()),
                }));
                ops.push(with_site(if later == HOST {
                    Op::EventSync { event }
                } else {
                    Op::EventWait {
                        stream: Id::from(later.as_str()),
                        event,
                    }
                }));
            }
            let how = if later == HOST {
                format!("the host waits for an event recorded on {list}")
            } else {
                format!("{later} waits for an event recorded on {list}")
            };
            (ops, how)
        } else if earlier.len() <= budget {
            let ops = earlier
                .iter()
                .map(|s| {
                    with_site(Op::StreamSync {
                        stream: Id::from(s.as_str()),
                    })
                })
                .collect();
            (ops, format!("the host waits for {list}"))
        } else {
            let order = self.checker.order();
            let devices: BTreeSet<u64> = earlier
                .iter()
                .filter_map(|s| order.find_stream(&Id::from(s.as_str())))
                .map(|p| order.device(p))
                .collect();
            let ops = devices
                .iter()
                .map(|&device| with_site(Op::DeviceSync { device }))
                .collect();
            let list: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
            let how = if list.len() == 1 {
                format!("the host waits for device {}", list[0])
            } else {
                format!("the host waits for devices {}", list.join(", "))
            };
            (ops, how)
        };
        Insertion {
            before: index,
            // Control characters (a newline in an id) escaped, to fit on one comment line.
            comment: crate::text::escape(&format!(
                "streamsan fix for op {index} of the original trace ({what}): {how}"
            ))
            .into_owned(),
            hazards,
            ops,
        }
    }

    /// The op index in the original trace of op `written` of the written trace, or `None` for
    /// an inserted op.
    pub fn original_index(&self, written: u64) -> Option<u64> {
        let mut shift = 0u64;
        for ins in &self.insertions {
            let n = ins.ops.len() as u64;
            let first = ins.before + shift;
            if written < first {
                break;
            }
            if written < first + n {
                return None;
            }
            shift += n;
        }
        Some(written - shift)
    }

    /// The insertions made so far, in trace order.
    pub fn insertions(&self) -> &[Insertion] {
        &self.insertions
    }

    /// Ends the walk: the counts, and the report of the written program (whose op indices are
    /// the written trace's; see [`Fixer::original_index`]).
    pub fn finish(&mut self) -> (FixSummary, Report) {
        self.collect();
        let ops = self.checker.ops();
        let after = Report::new(ops, std::mem::take(&mut self.found));
        let left = after.hazards.iter().filter(|h| is_fixable(h.kind)).count() as u64;
        let summary = FixSummary {
            fixable: self.fixable,
            fixed: self.fixable.saturating_sub(left),
            inserted: self.inserted,
            max_per_hazard: self.max_per_hazard,
        };
        (summary, after)
    }
}

/// A program with its fix: the written ops, where the insertions went, and both reports.
#[derive(Clone, Debug)]
pub struct Fixed {
    /// The written program: the original ops in order, with the insertions before them.
    pub ops: Vec<TraceOp>,
    /// Indices into `ops` of the inserted ops.
    pub inserted_at: Vec<usize>,
    /// The insertions.
    pub insertions: Vec<Insertion>,
    /// The counts.
    pub summary: FixSummary,
    /// The original program's report.
    pub before: Report,
    /// The written program's report.
    pub after: Report,
}

/// Fixes a program held in memory (both walks of [`Fixer`] over `program`).
pub fn fix_program(program: &[TraceOp]) -> Result<Fixed, CheckError> {
    let mut checker = Checker::new();
    let mut events: HashSet<Id> = HashSet::default();
    for op in program {
        checker.check(op)?;
        if let Some(e) = op.op.event() {
            events.insert(e.clone());
        }
    }
    let before = checker.finish();
    let mut fixer = Fixer::new(&before, events);
    let mut ops = Vec::with_capacity(program.len());
    let mut inserted_at = Vec::new();
    for (i, op) in program.iter().enumerate() {
        if let Some(ins) = fixer.op(i as u64, op)? {
            for extra in &ins.ops {
                inserted_at.push(ops.len());
                ops.push(extra.clone());
            }
        }
        ops.push(op.clone());
    }
    let (summary, after) = fixer.finish();
    let insertions = fixer.insertions().to_vec();
    Ok(Fixed {
        ops,
        inserted_at,
        insertions,
        summary,
        before,
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse_line;

    #[test]
    fn original_indices_skip_the_inserted_ops() {
        let program: Vec<TraceOp> = r#"{"op":"alloc","buffer":"x","bytes":64,"stream":"s1"}
{"op":"launch","stream":"s1","writes":["x"]}
{"op":"launch","stream":"s2","reads":["x"]}
{"op":"launch","stream":"s1","writes":["x"]}"#
            .lines()
            .filter_map(|l| parse_line(l).ok().flatten().map(|(op, _)| op))
            .collect();
        let f = fix_program(&program).unwrap();
        let mut fixer = Fixer::new(&f.before, []);
        for (i, op) in program.iter().enumerate() {
            fixer.op(i as u64, op).unwrap();
        }
        // Written: 0 1 [r w] 2 [r w] 3
        assert_eq!(f.inserted_at, [2, 3, 5, 6]);
        let back: Vec<Option<u64>> = (0..8).map(|w| fixer.original_index(w)).collect();
        assert_eq!(
            back,
            [Some(0), Some(1), None, None, Some(2), None, None, Some(3)]
        );
    }
}
