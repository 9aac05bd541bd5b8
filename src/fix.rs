//! `streamsan fix`: insert the synchronization that removes a trace's races.
//!
//! The fix of each hazard is decided once, by the checker that finds it: a [`FixPlan`]
//! (`Detail::plan`), whose sentence is the report's `fix`. The fixer walks the trace once more
//! and applies those plans, keeping a [`Checker`] over the program it writes (the original ops
//! plus what it inserted). Each plan gives steps, each before one op of the original trace:
//!
//! - a wait: `event_record(E, S)` then `event_wait(Q, E)` for each earlier stream S with an
//!   unordered access, before the op of Q (PyTorch's `Q.wait_stream(S)`); for the host,
//!   `event_record(E, S)` then `event_sync(E)`;
//! - a caching free of device memory still used by other streams: `record_stream(buffer, S)`
//!   for each such stream S (PyTorch's own fix: the allocator waits for S before reusing the
//!   memory);
//! - for a race in a graph's replay, the plan's part around the launch is a wait as above on
//!   the launch stream (a static input's copy waits for the replay; a consumer of a static output
//!   waits for it; the replay waits for the copy), and its part inside the capture is a captured
//!   event record and wait between the capture's streams, before the captured op, or
//!   `record_stream` just before the free of a temporary whose block the capture hands out again.
//!
//! Before an op, the fixer asks which of a step's earlier accesses the op's clock in the
//! written program does not cover yet (insertions only add order, so these are all that can be
//! left), and inserts only for those. (Inside a capture no clock runs: those steps are inserted
//! whole, once per stream.) Each inserted event has a fresh name, recorded just before it is
//! waited on, so it captures the earlier access (it was issued before) and never changes what an
//! existing event means. An op's insertions outside a capture are at most two per hazard there:
//! when the events would take more (a hazard with conflicts on several streams), the host waits
//! instead — one `stream_sync` per stream, or one `device_sync` per device when even that is too
//! many. Only the last can exceed two (a hazard whose unordered accesses are on streams of three
//! or more devices), and events during a capture, where the host may not synchronize. During a
//! capture, no event is recorded on a capturing stream for a waiter outside the capture, nor
//! waited on by a capturing stream. A stream's work from before it joined a capture is waited
//! for through an event recorded on it just before it started capturing (inserted there when a
//! later step needs it); what is still out of reach (the waiting stream itself is capturing) is
//! left as it is, reported by [`Fixer::blocked`] and by the check of the written trace.
//!
//! Insertions only add happens-before edges, which can only remove hazards; the checker over the
//! written program proves the result: [`Fixer::finish`] returns its report.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::checker::{fewest_record_streams, CheckError, Checker};
use crate::clock::VectorClock;
use crate::report::{After, FixPlan, Hazard, HazardKind, Report, Wait};
use crate::trace::{Id, Op, Site, TraceOp, HOST};

/// Whether synchronization can remove hazards of this kind (`fix` inserts it).
pub fn is_fixable(kind: HazardKind) -> bool {
    matches!(
        kind,
        HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree
    )
}

/// One thing a hazard's plan inserts before one op of the original trace.
#[derive(Clone, Debug)]
enum Step {
    /// Order `wait.after` before the op, on `wait.waiter`. Outside a capture, only what the
    /// op's clock in the written program does not cover yet.
    Wait { wait: Wait, capture: bool },
    /// `record_stream(buffer, …)` just before the free: outside a capture, the fewest of
    /// `candidates` that order what is still unordered (else the wait `or`); inside a capture,
    /// every stream of `streams`.
    RecordStream {
        buffer: String,
        candidates: Vec<After>,
        streams: Vec<String>,
        or: Wait,
        capture: bool,
    },
}

/// A step of the plan of one fixable hazard of the original trace.
#[derive(Clone, Debug)]
struct Target {
    kind: HazardKind,
    buffer: String,
    /// The hazard's op (the step may go before another op: inside a capture, or at a free).
    op: u64,
    step: Step,
}

/// The steps of `plan` (of a hazard at op `at`), each with the op it goes before.
fn steps(plan: &FixPlan, at: u64, capture: bool, out: &mut Vec<(u64, Step)>) {
    match plan {
        FixPlan::Wait(w) => out.push((
            w.before,
            Step::Wait {
                wait: w.clone(),
                capture,
            },
        )),
        // record_stream goes just before the free: at the hazard's own op (an unsafe free), or
        // inside a capture (the free of a temporary whose block the same capture reuses).
        FixPlan::RecordStream {
            buffer,
            streams,
            candidates,
            free,
            or,
            ..
        } if *free == at || capture => out.push((
            *free,
            Step::RecordStream {
                buffer: buffer.clone(),
                candidates: candidates.clone(),
                streams: streams.clone(),
                or: or.clone(),
                capture,
            },
        )),
        // A reuse whose free is behind: order the access itself.
        FixPlan::RecordStream { or, .. } => out.push((
            or.before,
            Step::Wait {
                wait: or.clone(),
                capture,
            },
        )),
        FixPlan::Replay {
            launch,
            capture: inside,
            ..
        } => {
            for p in launch {
                steps(p, at, false, out);
            }
            for p in inside {
                steps(p, at, true, out);
            }
        }
        FixPlan::MoveFree { .. }
        | FixPlan::FreeAfterReplays { .. }
        | FixPlan::RemoveFree { .. }
        | FixPlan::RecordEvent { .. } => {}
    }
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
    /// Original op index → the steps of the first check's plans that go before it.
    targets: BTreeMap<u64, Vec<Target>>,
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
    /// The hazards (original op, kind, buffer) that a capture underway kept from being fixed.
    blocked: Vec<(u64, HazardKind, String)>,
    /// Per stream, the latest event recorded on it just before it started capturing (inserted,
    /// and the original op index it preceded): a later op can still wait for its earlier work.
    pre: HashMap<String, (Id, u64)>,
    inserted: u64,
    max_per_hazard: f64,
    /// Original op indices where a reuse race's wait is kept whole: the conflicts the first
    /// check listed are not all there are (see [`Fixer::strict`]).
    strict: HashSet<u64>,
}

impl Fixer {
    /// A fixer for a trace whose first check gave `original`; `events` are every event name the
    /// trace uses (inserted events get other names). It applies each fixable hazard's plan
    /// ([`crate::report::Detail::plan`]).
    pub fn new(original: &Report, events: impl IntoIterator<Item = Id>) -> Self {
        let mut targets: BTreeMap<u64, Vec<Target>> = BTreeMap::new();
        let mut fixable = 0;
        for h in original.hazards.iter().filter(|h| is_fixable(h.kind)) {
            fixable += 1;
            let Some(plan) = &h.detail.plan else {
                continue;
            };
            let mut v = Vec::new();
            steps(plan, h.op, false, &mut v);
            for (before, step) in v {
                targets.entry(before).or_default().push(Target {
                    kind: h.kind,
                    buffer: h.buffer.clone().unwrap_or_default(),
                    op: h.op,
                    step,
                });
            }
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
            blocked: Vec::new(),
            pre: HashMap::default(),
            inserted: 0,
            max_per_hazard: 0.0,
            strict: HashSet::default(),
        }
    }

    /// The same fixer, keeping whole the waits of the reuse races at the original ops `ops`.
    ///
    /// A reuse race's wait is left out where an inserted `record_stream` already orders the
    /// conflicts the first check listed. The first check lists each conflicting access once,
    /// at the first reuse it races with: where a fix orders that reuse, the same access can
    /// still race with a later reuse of the bytes (another generation's, which the inserted
    /// `record_stream` does not order) without being listed there. A walk whose written trace
    /// keeps such a reuse race is walked again with its op here ([`fix_program`] does so).
    pub fn strict(mut self, ops: impl IntoIterator<Item = u64>) -> Self {
        self.strict.extend(ops);
        self
    }

    /// Takes the original op `index`: returns the ops to write before it (empty for most ops),
    /// having checked them and the op itself.
    ///
    /// The error is bad input in the trace (which the first check would have reported).
    pub fn op(&mut self, index: u64, op: &TraceOp) -> Result<Option<&Insertion>, CheckError> {
        if let Op::Alloc { buffer, .. } = &op.op {
            self.allocs.insert(buffer.clone(), index);
        }
        let pre = self.pre_record(index, op);
        for extra in &pre {
            self.feed(extra)?;
        }
        let targets = self.targets.remove(&index).unwrap_or_default();
        // What is left of these steps after the insertions so far: outside a capture, the
        // earlier work that the clock of the op, issued now, does not cover. Insertions only
        // add order, so nothing else can have appeared.
        let left: Vec<Target> = targets
            .into_iter()
            .filter_map(|t| self.left(index, op, t))
            .collect();
        let planned = (!left.is_empty())
            .then(|| self.plan(index, op, &left))
            .filter(|ins| !ins.ops.is_empty());
        if let Some(ins) = &planned {
            for extra in &ins.ops {
                self.feed(extra)?;
            }
            let per = ins.ops.len() as f64 / left.len() as f64;
            self.max_per_hazard = self.max_per_hazard.max(per);
        }
        self.feed(op)?;
        let insertion = match (pre.is_empty(), planned) {
            (true, None) => return Ok(None),
            (true, Some(ins)) => ins,
            (false, planned) => {
                let stream = match &pre[0].op {
                    Op::EventRecord { stream, .. } => stream.to_string(),
                    _ => String::new(),
                };
                let note = format!(
                    "streamsan fix before op {index} of the original trace: an event on {stream} before it joins a capture, for a later op to wait on"
                );
                let mut ins = planned.unwrap_or(Insertion {
                    before: index,
                    hazards: Vec::new(),
                    ops: Vec::new(),
                    comment: String::new(),
                });
                ins.comment = match ins.comment.is_empty() {
                    true => crate::text::escape(&note).into_owned(),
                    false => format!("{}; {}", crate::text::escape(&note), ins.comment),
                };
                let mut ops = pre;
                ops.append(&mut ins.ops);
                ins.ops = ops;
                ins
            }
        };
        self.inserted += insertion.ops.len() as u64;
        self.insertions.push(insertion);
        Ok(self.insertions.last())
    }

    /// Before op `index`, where a stream starts capturing (its `graph_begin`, or its wait on a
    /// captured event): an event recorded on it now, if a later step must order its earlier
    /// work — once it captures, an event recorded there would be captured.
    fn pre_record(&mut self, index: u64, op: &TraceOp) -> Vec<TraceOp> {
        let starts = match &op.op {
            Op::GraphBegin { stream, .. } => stream,
            Op::EventWait { stream, event } if self.checker.event_captured(event) => stream,
            _ => return Vec::new(),
        };
        if self.checker.capture_blocks(starts) || !self.is_stream(starts.as_str()) {
            return Vec::new();
        }
        let s = starts.as_str();
        let names = |after: &[After]| after.iter().any(|a| a.stream == s && a.op < index);
        let needed = self.targets.range(index + 1..).any(|(_, ts)| {
            ts.iter().any(|t| match &t.step {
                Step::Wait {
                    wait,
                    capture: false,
                } => names(&wait.after),
                Step::RecordStream {
                    or, capture: false, ..
                } => names(&or.after),
                _ => false,
            })
        });
        if !needed {
            return Vec::new();
        }
        let event = self.fresh_event();
        self.pre.insert(s.to_string(), (event.clone(), index));
        vec![TraceOp {
            op: Op::EventRecord {
                event,
                stream: starts.clone(),
            },
            site: Some(Site::Label(format!(
                "streamsan fix: an event on {s} before it joins a capture at op {index} of the original trace"
            ))),
        }]
    }

    /// The clock the checker would give op `op` of `waiter` now: for an op on a stream, the
    /// stream's clock joined with the host's (and the legacy default stream's); for a caching
    /// free, the owning stream's joined with the host's; for the host, the host's.
    fn clock_of(&self, waiter: &str, op: &TraceOp) -> VectorClock {
        let order = self.checker.order();
        let stream = (waiter != HOST)
            .then(|| order.find_stream(&Id::from(waiter)))
            .flatten();
        match stream {
            Some(q) if op.op.on_stream().is_some() => order.issue_clock(q),
            Some(q) => {
                let mut c = order.clock(q).clone();
                c.join(order.host_clock());
                c
            }
            None => order.host_clock().clone(),
        }
    }

    /// The step `t` (before op `index`) with only the earlier work still unordered, or `None`
    /// when nothing is left. A reuse race's access is also ordered when the clock, at the free,
    /// of a stream an inserted `record_stream` names for its buffer covers it (the allocator
    /// waits for that stream before reusing the bytes). (A free's `record_stream` streams of
    /// the trace itself are not counted: the fix may then insert more than needed, never less;
    /// the checker over the written trace decides.) Inside a capture no clock runs: the step
    /// is kept whole.
    fn left(&self, index: u64, op: &TraceOp, mut t: Target) -> Option<Target> {
        let reuse = t.kind == HazardKind::ReuseRace && !self.strict.contains(&t.op);
        let needed = |clock: &VectorClock, after: &After| {
            after.accesses.is_empty()
                || after.accesses.iter().any(|a| {
                    let covered = clock.covers(a.epoch)
                        || (reuse
                            && self
                                .record_streams
                                .iter()
                                .any(|(b, recorded, alloc, free)| {
                                    b.as_str() == a.buffer
                                        && recorded.covers(a.epoch)
                                        && *alloc <= a.op
                                        && a.op < *free
                                        && *free < index
                                }));
                    !covered
                })
        };
        let keep = match &mut t.step {
            Step::Wait {
                capture: true,
                wait,
            } => !wait.after.is_empty(),
            Step::RecordStream { capture: true, .. } => true,
            Step::Wait { wait, .. } => {
                let clock = self.clock_of(&wait.waiter, op);
                wait.after.retain(|a| needed(&clock, a));
                !wait.after.is_empty()
            }
            Step::RecordStream { candidates, or, .. } => {
                let clock = self.clock_of(&or.waiter, op);
                or.after.retain(|a| needed(&clock, a));
                candidates.retain(|a| needed(&clock, a));
                !or.after.is_empty()
            }
        };
        keep.then_some(t)
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

    /// Whether `name` is a stream of the written program so far (a fix records events only on
    /// streams: an access it cannot name by its stream is left to the checker's verdict).
    fn is_stream(&self, name: &str) -> bool {
        name != HOST && self.checker.order().find_stream(&Id::from(name)).is_some()
    }

    /// The ops that carry out the steps `left` (what is left of the plans whose steps go before
    /// op `index`).
    fn plan(&mut self, index: u64, op: &TraceOp, left: &[Target]) -> Insertion {
        let hazards: Vec<(HazardKind, String)> =
            left.iter().map(|t| (t.kind, t.buffer.clone())).collect();
        let what = left
            .iter()
            .map(|t| {
                if t.op == index {
                    format!("{} on {}", t.kind, t.buffer)
                } else {
                    format!("{} on {} reported at op {}", t.kind, t.buffer, t.op)
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let site = Some(Site::Label(format!(
            "streamsan fix: {what} at op {index} of the original trace"
        )));
        let with_site = |op: Op| TraceOp {
            op,
            site: site.clone(),
        };
        let mut ops = Vec::new();
        let mut hows = Vec::new();

        // Inside a capture: the captured ops' streams order each other through captured
        // events, and a temporary freed there names its streams by record_stream.
        let mut inside_waits: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut inside_records: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for t in left {
            match &t.step {
                Step::Wait {
                    wait,
                    capture: true,
                } => inside_waits
                    .entry(wait.waiter.as_str())
                    .or_default()
                    .extend(
                        wait.after
                            .iter()
                            .map(|a| a.stream.as_str())
                            .filter(|s| *s != wait.waiter),
                    ),
                Step::RecordStream {
                    buffer,
                    streams,
                    capture: true,
                    ..
                } => inside_records
                    .entry(buffer.as_str())
                    .or_default()
                    .extend(streams.iter().map(String::as_str)),
                _ => {}
            }
        }
        for (buffer, streams) in &inside_records {
            let streams: Vec<&str> = streams
                .iter()
                .copied()
                .filter(|s| self.is_stream(s))
                .collect();
            for s in &streams {
                ops.push(with_site(Op::RecordStream {
                    buffer: Id::from(*buffer),
                    stream: Id::from(*s),
                }));
            }
            if !streams.is_empty() {
                hows.push(format!(
                    "record_stream({buffer}, {}) in the capture",
                    streams.join(", ")
                ));
            }
        }
        for (waiter, streams) in &inside_waits {
            let streams: Vec<&str> = streams
                .iter()
                .copied()
                .filter(|s| self.is_stream(s))
                .collect();
            for s in &streams {
                let event = self.fresh_event();
                ops.push(with_site(Op::EventRecord {
                    event: event.clone(),
                    stream: Id::from(*s),
                }));
                ops.push(with_site(Op::EventWait {
                    stream: Id::from(*waiter),
                    event,
                }));
            }
            if !streams.is_empty() {
                hows.push(format!(
                    "in the capture, {waiter} waits for an event recorded on {}",
                    streams.join(", ")
                ));
            }
        }

        // Outside a capture: the waiter and the earlier streams still unordered.
        let outside: Vec<&Target> = left
            .iter()
            .filter(|t| {
                !matches!(
                    t.step,
                    Step::Wait { capture: true, .. } | Step::RecordStream { capture: true, .. }
                )
            })
            .collect();
        if !outside.is_empty() {
            let (ops_out, how) = self.plan_outside(index, op, &outside, &with_site);
            ops.extend(ops_out);
            hows.push(how);
        }
        Insertion {
            before: index,
            // Control characters (a newline in an id) escaped, to fit on one comment line.
            comment: crate::text::escape(&format!(
                "streamsan fix for op {index} of the original trace ({what}): {}",
                hows.join("; ")
            ))
            .into_owned(),
            hazards,
            ops,
        }
    }

    /// The ops that order the earlier work of the steps `left` (outside a capture) before op
    /// `index`: record_stream at a caching free, else events, else host syncs within the
    /// budget of two ops per hazard.
    fn plan_outside(
        &mut self,
        index: u64,
        op: &TraceOp,
        left: &[&Target],
        with_site: &dyn Fn(Op) -> TraceOp,
    ) -> (Vec<TraceOp>, String) {
        let waiter = match &left[0].step {
            Step::Wait { wait, .. } => wait.waiter.clone(),
            Step::RecordStream { or, .. } => or.waiter.clone(),
        };
        let waits = |t: &&Target| -> Vec<After> {
            match &t.step {
                Step::Wait { wait, .. } => wait.after.clone(),
                Step::RecordStream { or, .. } => or.after.clone(),
            }
        };
        // During a capture, an event recorded on a capturing stream would be captured (and
        // its waiter would join the capture), and a capturing stream cannot wait on an event
        // recorded outside it: such work is left unordered here (the written trace's check
        // reports it).
        let capturing = |s: &str| self.checker.capture_blocks(&Id::from(s));
        let earlier: BTreeSet<String> = left
            .iter()
            .flat_map(waits)
            .map(|a| a.stream)
            .filter(|p| *p != waiter && self.is_stream(p) && !capturing(p))
            .collect();
        let underway = self.checker.capture_underway();
        // A capturing stream's work from before its capture: the event recorded on it just
        // before it started capturing, when that follows the work.
        let pre_event = |a: &After| {
            self.pre
                .get(&a.stream)
                .filter(|(_, at)| a.op < *at)
                .map(|(e, _)| e.clone())
        };
        let mut pre_events: BTreeSet<Id> = BTreeSet::new();
        let mut blocked: Vec<(u64, HazardKind, String)> = Vec::new();
        for t in left {
            let mut stuck = capturing(&waiter);
            for a in waits(t)
                .iter()
                .filter(|a| a.stream != waiter && capturing(&a.stream))
            {
                match pre_event(a) {
                    Some(e) => {
                        pre_events.insert(e);
                    }
                    None => stuck = true,
                }
            }
            if stuck {
                blocked.push((t.op, t.kind, t.buffer.clone()));
            }
        }
        let budget = 2 * left.len();
        let caching_device_free = matches!(&op.op, Op::Free { stream: None, .. }) && waiter != HOST;
        let candidates: Vec<After> = left
            .iter()
            .flat_map(|t| match &t.step {
                Step::RecordStream { candidates, .. } => candidates.clone(),
                Step::Wait { .. } => Vec::new(),
            })
            .filter(|a| self.is_stream(&a.stream))
            .collect();
        let record_stream = match (&op.op, &left[0].step) {
            (Op::Free { buffer, .. }, Step::RecordStream { .. })
                if caching_device_free && !candidates.is_empty() && earlier.len() <= budget =>
            {
                Some(buffer.clone())
            }
            _ => None,
        };
        let list = earlier.iter().cloned().collect::<Vec<_>>().join(", ");
        if record_stream.is_none() {
            self.blocked.extend(blocked);
        }
        if let Some(buffer) = record_stream {
            let alloc = self.allocs.get(&buffer).copied().unwrap_or(0);
            // A caching free of device memory: every conflict is another stream's. A stream
            // whose accesses the other named streams' clocks already cover needs no
            // record_stream of its own.
            let named = fewest_record_streams(self.checker.order(), &candidates);
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
        } else if capturing(&waiter) {
            (Vec::new(), format!("nothing: {waiter} is capturing"))
        } else if 2 * earlier.len() <= budget || underway {
            let mut ops = Vec::new();
            for s in &earlier {
                let event = self.fresh_event();
                ops.push(with_site(Op::EventRecord {
                    event: event.clone(),
                    stream: Id::from(s.as_str()),
                }));
                ops.push(with_site(if waiter == HOST {
                    Op::EventSync { event }
                } else {
                    Op::EventWait {
                        stream: Id::from(waiter.as_str()),
                        event,
                    }
                }));
            }
            for event in pre_events {
                ops.push(with_site(if waiter == HOST {
                    Op::EventSync { event }
                } else {
                    Op::EventWait {
                        stream: Id::from(waiter.as_str()),
                        event,
                    }
                }));
            }
            let how = if waiter == HOST {
                format!("the host waits for an event recorded on {list}")
            } else {
                format!("{waiter} waits for an event recorded on {list}")
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
        }
    }

    /// The op index in the original trace of op `written` of the written trace, or `None` for
    /// an inserted op.
    pub fn original_index(&self, written: u64) -> Option<u64> {
        original_index(&self.insertions, written)
    }

    /// The insertions made so far, in trace order.
    pub fn insertions(&self) -> &[Insertion] {
        &self.insertions
    }

    /// The hazards, as (original op index, kind, buffer), that a capture underway kept from
    /// being fixed: the earlier work is on a stream that was capturing by the time of the
    /// hazard's op (an event recorded there would be captured), or the op's stream was.
    pub fn blocked(&self) -> &[(u64, HazardKind, String)] {
        &self.blocked
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
    /// The hazards a capture kept from being fixed ([`Fixer::blocked`]).
    pub blocked: Vec<(u64, HazardKind, String)>,
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
    let (fixed, _) = settle(
        |strict| fix_walk(program, &before, &events, strict),
        |f: &Fixed| (&f.after, &f.insertions[..]),
    )?;
    Ok(fixed)
}

/// Walks until no reuse race is left that a walk with it [`Fixer::strict`] may fix: `walk`
/// walks the trace with a set of strict ops (none at first) and `written` gives what its walk
/// wrote (the written trace's report, the insertions). Returns the last walk and its set.
pub fn settle<T, E>(
    mut walk: impl FnMut(&BTreeSet<u64>) -> Result<T, E>,
    written: impl Fn(&T) -> (&Report, &[Insertion]),
) -> Result<(T, BTreeSet<u64>), E> {
    let mut strict = BTreeSet::new();
    loop {
        let done = walk(&strict)?;
        let (after, insertions) = written(&done);
        let more = reuse_races_left(after, insertions, &strict);
        if more.is_empty() {
            return Ok((done, strict));
        }
        strict.extend(more);
    }
}

/// The op index in the original trace of op `written` of a trace written with `insertions` (in
/// trace order), or `None` for an inserted op.
pub fn original_index(insertions: &[Insertion], written: u64) -> Option<u64> {
    let mut shift = 0u64;
    for ins in insertions {
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

/// The original ops of the reuse races that a written trace (its report `after`, its
/// `insertions`) still has and that a walk with them [`Fixer::strict`] may fix: those not in
/// `strict` already.
pub fn reuse_races_left(
    after: &Report,
    insertions: &[Insertion],
    strict: &BTreeSet<u64>,
) -> Vec<u64> {
    let mut out: Vec<u64> = after
        .hazards
        .iter()
        .filter(|h| h.kind == HazardKind::ReuseRace)
        .filter_map(|h| original_index(insertions, h.op))
        .filter(|op| !strict.contains(op))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One walk of [`fix_program`]: the fix of `program` (whose first check gave `before`), with
/// the reuse races at `strict` kept whole.
fn fix_walk(
    program: &[TraceOp],
    before: &Report,
    events: &HashSet<Id>,
    strict: &BTreeSet<u64>,
) -> Result<Fixed, CheckError> {
    let mut fixer = Fixer::new(before, events.iter().cloned()).strict(strict.iter().copied());
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
        blocked: fixer.blocked().to_vec(),
        summary,
        before: before.clone(),
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
