//! The checker: drives happens-before (`crate::order`), shadow memory (`crate::shadow`) and
//! the allocator model (`crate::alloc`) over a stream of ops and reports every hazard of the
//! trace format.
//!
//! Guarantee: exact under the trace format's rules — every hazard the format defines is reported,
//! and nothing else. Each hazard kind is decided in one place: `data-race` and `reuse-race` in
//! `Checker::check_access`, `unsafe-free` and `invalid-free` in `free`, `use-after-free` in
//! `resolve` (and, for a graph's replay, at its launch), `wait-on-unrecorded-event` in
//! `warn_unrecorded`. CUDA graphs — captures, pools and replays — are the `graphs` module's.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator, ModelMemory};
use crate::clock::{Participant, VectorClock};
use crate::order::{Order, StreamError, Wait};
use crate::report::{
    latest_by_participant, AccessKind, AccessRef, Conflict, Detail, FixPlan, FreeRef, Hazard,
    HazardKind, OpNote, Pattern, Report,
};
use crate::shadow::{
    scan, Access, Entry, Freed, GenId, Generation, Graveyard, History, Probe, Visit, FLAT_MAX,
};
use crate::trace::{Field, Id, MemoryKind, Op, Region, Site, TraceOp};

mod access;
mod fixes;
mod forget;
mod graphs;
mod hazards;
mod memory;
mod names;
#[cfg(test)]
mod tests;

use access::*;
pub(crate) use fixes::fewest_record_streams;
use fixes::*;
use forget::*;
use hazards::*;
use names::*;

/// Bad input found while checking an op: the trace is not a valid program.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", expected.as_ref().map(|e| format!("; expected {e}")).unwrap_or_default())]
pub struct CheckError {
    /// The op index.
    pub op: u64,
    /// The offending field, to locate the error in the trace line.
    pub field: Field,
    /// What was wrong.
    pub message: String,
    /// What was expected.
    pub expected: Option<String>,
}

/// The free behind a use after free, as far as the checker still knows it.
#[derive(Clone, Debug)]
enum FreedBy {
    /// The free's op, participant and site.
    Op(u64, Participant, Option<Arc<Site>>),
    /// A free whose details the checker no longer keeps (see the `names` module).
    Forgotten,
}

/// The free behind a reuse race: its op, its site and the freed buffer.
#[derive(Clone, Debug)]
struct FreedAt {
    op: u64,
    site: Option<Arc<Site>>,
    name: Id,
}

/// One region of the current op, resolved to a generation.
#[derive(Clone, Copy, Debug)]
struct OpAccess {
    gen: GenId,
    kind: AccessKind,
    offset: u64,
    end: u64,
}

/// An earlier access found to conflict with region `at` of the current op.
#[derive(Clone, Debug)]
struct Found {
    at: usize,
    kind: HazardKind,
    access: Access,
    buffer: Id,
    /// For a reuse race: the free that handed the bytes out again.
    freed: Option<FreedAt>,
}

/// A region that names a freed buffer.
#[derive(Clone, Debug)]
struct UseAfterFree {
    name: Id,
    kind: Option<AccessKind>,
    offset: u64,
    end: u64,
    /// The free, when the name's current binding does not tell it (a graph replay's buffer,
    /// whose name may be allocated again since).
    freed: Option<FreedBy>,
}

/// Counters of the checker's state, for benchmarks and memory tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops checked.
    pub ops: u64,
    /// Participants (host and streams).
    pub participants: usize,
    /// Generations in memory (live, external, and freed ones with history).
    pub generations: usize,
    /// Tombstones kept for reuse checks (listings of freed generations' accesses).
    pub graveyard: usize,
    /// Access entries kept by live generations (listings, for an indexed history).
    pub history: usize,
    /// Hazards found.
    pub hazards: usize,
    /// Clock components stored by the happens-before state (every participant's clock and every
    /// event's capture; shared storage counted once).
    pub clock_entries: usize,
    /// Freed names that keep the details of their free (at most
    /// [`Checker::keep_free_details`]'s number, besides the freed pool buffers of CUDA graphs).
    pub freed_names: usize,
    /// Entries that keep the freed names whose details are forgotten: one per run of numbered
    /// names (`b0`, `b1`, … freed alike are one run), one per other name.
    pub forgotten_names: usize,
}

impl Stats {
    /// The component-wise maximum: peaks over a run.
    pub fn max(&self, other: &Stats) -> Stats {
        Stats {
            ops: self.ops.max(other.ops),
            participants: self.participants.max(other.participants),
            generations: self.generations.max(other.generations),
            graveyard: self.graveyard.max(other.graveyard),
            history: self.history.max(other.history),
            hazards: self.hazards.max(other.hazards),
            clock_entries: self.clock_entries.max(other.clock_entries),
            freed_names: self.freed_names.max(other.freed_names),
            forgotten_names: self.forgotten_names.max(other.forgotten_names),
        }
    }
}

/// Where the checker switches between representations of its state. Verdicts and reports do not
/// depend on them (the tests compare extreme values against the defaults and the oracle); they
/// trade time for memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A buffer's history moves from a flat vector into an interval index once it holds more
    /// than this many entries (0: every history is indexed).
    pub history_index_at: usize,
    /// A freed buffer spanning at most this many 64 KiB pages stays one record of the graveyard;
    /// a larger one is buried entry by entry in its interval index (0: every freed buffer).
    pub small_freed_pages: u64,
    /// A sweep drops what the host's clock covers from every history once they hold more than
    /// this many entries in all (and twice as many as after the last sweep); tombstones are swept
    /// likewise from a sixty-fourth of it.
    pub sweep_at: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            history_index_at: FLAT_MAX,
            small_freed_pages: crate::shadow::SMALL_PAGES,
            sweep_at: 4096,
        }
    }
}

/// Checks ops one at a time and collects hazards.
///
/// ```
/// use streamsan::checker::Checker;
/// use streamsan::trace::{Op, Region};
///
/// let mut checker = Checker::new();
/// let ops = [
///     Op::Alloc { buffer: "a".into(), bytes: 4096, stream: Some("s1".into()),
///                 memory: Default::default(), addr: None, pool: None },
///     Op::Launch { stream: "s1".into(), name: None, reads: vec![],
///                  writes: vec![Region::whole("a")] },
///     Op::Launch { stream: "s2".into(), name: None, reads: vec![Region::whole("a")],
///                  writes: vec![] },
/// ];
/// for op in ops {
///     checker.check(&op.into()).unwrap();
/// }
/// let report = checker.finish();
/// assert_eq!(report.errors, 1); // s2 reads what s1 wrote, with no event between them
/// ```
#[derive(Clone)]
pub struct Checker {
    limits: Limits,
    order: Order,
    gens: Vec<Option<Generation>>,
    free_slots: Vec<u32>,
    names: Names,
    graveyard: Graveyard,
    device: DeviceCachingAllocator<ModelMemory>,
    pinned: HostCachingAllocator<ModelMemory>,
    managed: HostCachingAllocator<ModelMemory>,
    /// Whether allocations give `addr` (decided by the first non-empty allocation).
    addr_mode: Option<bool>,
    /// With `addr`: live allocations by memory kind, start → (end, generation).
    live: [BTreeMap<u64, (u64, GenId)>; 3],
    /// With `addr`: device bytes freed and not yet reallocated → the participant that freed them.
    freed_by: BTreeMap<u64, (u64, Participant)>,
    /// History vectors of dropped generations, for reuse.
    spare: Vec<Vec<Access>>,
    /// Kernel names, shared by every launch of the same name.
    labels: HashMap<Box<str>, u32>,
    /// The kernel names by [`Access::label`] (minus one).
    label_names: Vec<Arc<str>>,
    ops: u64,
    hazards: Vec<Hazard>,
    history: usize,
    prune_at: usize,
    host_at_prune: VectorClock,
    graveyard_prune_at: usize,
    host_at_graveyard_prune: VectorClock,
    /// What the checker may forget: history that this clock covers (see [`Checker::retain`]);
    /// `None`: the host's clock.
    forget: Option<VectorClock>,
    /// The clock set by [`Checker::retain`], and the host clock version `forget` was met with.
    retain: Option<(VectorClock, u64)>,
    // Scratch space reused across ops.
    op_accesses: Vec<OpAccess>,
    found: Vec<Found>,
    uaf: Vec<UseAfterFree>,
    /// `alloc`s with `addr` whose memory came back from another stream: (op, device) of the
    /// device synchronization each implies.
    implicit_syncs: Vec<(u64, u64)>,
    /// CUDA graphs: captures, bodies, pools, replays.
    graphs: graphs::Graphs,
    /// The site of the latest op that had one: the next op at the same site shares it (ops come
    /// in runs from one line, a `backward()` or an optimizer's step) rather than copying it.
    last_site: Option<Arc<Site>>,
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

fn bytes_of(offset: u64, end: u64) -> Option<u64> {
    (end != u64::MAX).then(|| end - offset)
}

impl Checker {
    /// A checker at the start of a trace.
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    /// A checker with other [`Limits`]: the same verdicts and reports, with other trade-offs of
    /// time for memory.
    pub fn with_limits(limits: Limits) -> Self {
        Checker {
            limits,
            order: Order::new(),
            gens: Vec::new(),
            free_slots: Vec::new(),
            names: Names::default(),
            graveyard: Graveyard::new(limits.small_freed_pages),
            device: DeviceCachingAllocator::new(ModelMemory::of(MemoryKind::Device)),
            pinned: HostCachingAllocator::new(ModelMemory::of(MemoryKind::Pinned)),
            managed: HostCachingAllocator::new(ModelMemory::of(MemoryKind::Managed)),
            addr_mode: None,
            live: Default::default(),
            freed_by: BTreeMap::new(),
            spare: Vec::new(),
            labels: HashMap::default(),
            label_names: Vec::new(),
            ops: 0,
            hazards: Vec::new(),
            history: 0,
            prune_at: limits.sweep_at,
            host_at_prune: VectorClock::new(),
            graveyard_prune_at: limits.sweep_at / 64,
            host_at_graveyard_prune: VectorClock::new(),
            forget: None,
            retain: None,
            op_accesses: Vec::new(),
            found: Vec::new(),
            uaf: Vec::new(),
            implicit_syncs: Vec::new(),
            graphs: graphs::Graphs::default(),
            last_site: None,
        }
    }

    /// The happens-before state.
    pub fn order(&self) -> &Order {
        &self.order
    }

    /// Counters of the current state.
    pub fn stats(&self) -> Stats {
        let (freed_names, forgotten_names) = self.names.counts();
        Stats {
            ops: self.ops,
            participants: self.order.participants(),
            generations: self.gens.len() - self.free_slots.len(),
            graveyard: self.graveyard.len(),
            history: self.history,
            hazards: self.hazards.len(),
            clock_entries: self.order.clock_entries(),
            freed_names,
            forgotten_names,
        }
    }

    /// All hazards found so far, in the order found (sorted within each op).
    pub fn hazards(&self) -> &[Hazard] {
        &self.hazards
    }

    /// The number of ops checked so far: the index the next op gets.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// The device synchronizations the trace implies without an op of their own: `(op, device)`
    /// of each `alloc` with `addr` whose memory reappears on another stream than the one that
    /// freed it (the memory went back to the driver, which synchronizes the device).
    pub fn implicit_syncs(&self) -> &[(u64, u64)] {
        &self.implicit_syncs
    }

    /// Moves out the hazards found so far: [`finish`](Self::finish) then reports only later
    /// ones. For callers that collect hazards as they go (and keep copies of a checker small).
    pub fn take_hazards(&mut self) -> Vec<Hazard> {
        std::mem::take(&mut self.hazards)
    }

    /// Ends the trace: the report of every hazard found.
    pub fn finish(self) -> Report {
        Report::new(self.ops, self.hazards)
    }

    /// The report [`finish`](Self::finish) would make, its hazards taken out of the checker,
    /// which is left to be dropped by its owner (where dropping a large state costs nothing to
    /// whoever waits for the report). Checking more ops afterwards reports only later hazards.
    pub fn take_report(&mut self) -> Report {
        Report::new(self.ops, std::mem::take(&mut self.hazards))
    }

    /// Checks a whole trace: a new checker, every op of `ops` in order, then the report. The
    /// error is the first op that is bad input, with its op index.
    ///
    /// ```
    /// use streamsan::trace::{Op, Region, TraceOp};
    /// use streamsan::Checker;
    ///
    /// let ops: Vec<TraceOp> = vec![
    ///     Op::Launch { stream: "s1".into(), name: None, reads: vec![],
    ///                  writes: vec![Region::whole("x")] }.into(),
    ///     Op::Launch { stream: "s2".into(), name: None, reads: vec![Region::whole("x")],
    ///                  writes: vec![] }.into(),
    /// ];
    /// let report = Checker::check_all(&ops).unwrap();
    /// assert_eq!(report.errors, 1);
    /// ```
    pub fn check_all<'a>(
        ops: impl IntoIterator<Item = &'a TraceOp>,
    ) -> Result<Report, (u64, CheckError)> {
        let mut checker = Checker::new();
        for op in ops {
            let index = checker.ops;
            checker.check(op).map_err(|e| (index, e))?;
        }
        Ok(checker.finish())
    }

    /// Checks the next op and returns the hazards it raised (sorted by kind, then buffer).
    ///
    /// An `Err` means the op is bad input under the trace format; the op is then not counted.
    pub fn check(&mut self, op: &TraceOp) -> Result<&[Hazard], CheckError> {
        let index = self.ops;
        let first = self.hazards.len();
        self.refresh_forget();
        let site = op.site.as_ref().map(|site| match &self.last_site {
            Some(last) if **last == *site => Arc::clone(last),
            _ => {
                let new = Arc::new(site.clone());
                self.last_site = Some(Arc::clone(&new));
                new
            }
        });
        tracing::trace!(op = index, kind = op.op.name(), "op");
        self.step(index, &op.op, site)?;
        self.ops += 1;
        let new = &mut self.hazards[first..];
        if new.len() > 1 {
            new.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        }
        for h in new.iter() {
            match h.severity {
                crate::report::Severity::Error => tracing::error!(
                    op = h.op,
                    kind = h.kind.as_str(),
                    buffer = h.buffer.as_deref(),
                    conflicts = h.conflicts.len(),
                    "hazard"
                ),
                crate::report::Severity::Warning => {
                    tracing::warn!(op = h.op, kind = h.kind.as_str(), "hazard")
                }
            }
        }
        if self.history > self.prune_at {
            self.refresh_forget();
            self.prune();
        }
        Ok(&self.hazards[first..])
    }

    fn err(
        op: u64,
        field: Field,
        message: impl Into<String>,
        expected: Option<&str>,
    ) -> CheckError {
        CheckError {
            op,
            field,
            message: message.into(),
            expected: expected.map(str::to_owned),
        }
    }

    fn step(&mut self, i: u64, op: &Op, site: Option<Arc<Site>>) -> Result<(), CheckError> {
        if self.graphs.capturing() && self.capture_step(i, op, &site)? {
            return Ok(());
        }
        match op {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                self.order.create_stream(stream, *device, *blocking).map_err(|e| match e {
                    StreamError::LegacyDefault => Self::err(
                        i,
                        Field::Stream,
                        "\"default\" is the legacy default stream of device 0 and always exists",
                        Some("another stream name"),
                    ),
                    StreamError::Redeclared { device, blocking, implicit } => Self::err(
                        i,
                        Field::Op,
                        format!(
                            "stream \"{stream}\" already exists{} with device {device} and blocking {blocking}",
                            if implicit { " (from its first use)" } else { "" }
                        ),
                        Some("the same attributes, or a stream_create before the stream's first use"),
                    ),
                })?;
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
                pool,
            } => self.alloc(
                i,
                buffer,
                *bytes,
                stream.as_ref(),
                *memory,
                *addr,
                pool.as_ref(),
                site,
            )?,
            Op::Free { buffer, stream } => self.free(i, buffer, stream.as_ref(), site)?,
            Op::RecordStream { buffer, stream } => {
                let p = self.order.stream(stream);
                match self.lookup(buffer) {
                    Some(Name::Live(g)) => {
                        let g = self.gens[g.0 as usize].as_mut().expect("live generation");
                        let owner_stream = g.memory == MemoryKind::Device && g.owner == p;
                        if !owner_stream {
                            g.add_record_stream(p);
                        }
                    }
                    Some(Name::External(_)) => {}
                    Some(n @ (Name::Freed(_) | Name::Forgotten)) => {
                        let end = self.freed_size(buffer, n).map_or(0, |(size, _)| size);
                        self.uaf.clear();
                        self.uaf.push(UseAfterFree {
                            name: buffer.clone(),
                            kind: None,
                            offset: 0,
                            end,
                            freed: None,
                        });
                        self.report_use_after_free(i, op, p, &site, 0);
                    }
                    None => {
                        let g = self.new_external(buffer);
                        self.rebind(buffer, None, Name::External(g));
                    }
                }
            }
            Op::Launch {
                stream,
                name,
                reads,
                writes,
            } => {
                let p = self.order.stream(stream);
                self.begin_access_op(i);
                for (k, r) in writes.iter().enumerate() {
                    self.resolve(i, r, Field::Write(k as u32), AccessKind::Write, false)?;
                }
                for (k, r) in reads.iter().enumerate() {
                    self.resolve(i, r, Field::Read(k as u32), AccessKind::Read, false)?;
                }
                self.dedup_regions();
                let label_id = name.as_deref().map_or(0, |n| self.label(n));
                self.run_access_op(i, op, p, site, label_id);
            }
            Op::Copy { stream, src, dst } => {
                let p = self.order.stream(stream);
                self.begin_access_op(i);
                self.resolve(i, dst, Field::Dst, AccessKind::Write, false)?;
                self.resolve(i, src, Field::Src, AccessKind::Read, false)?;
                if let [a, b] = self.op_accesses[..] {
                    if a.gen == b.gen && a.offset < b.end && b.offset < a.end {
                        return Err(Self::err(
                            i,
                            Field::Dst,
                            format!(
                                "copy source and destination overlap in buffer \"{}\"",
                                dst.buffer
                            ),
                            Some("disjoint regions"),
                        ));
                    }
                }
                self.run_access_op(i, op, p, site, 0);
            }
            Op::Memset { stream, dst } => {
                let p = self.order.stream(stream);
                self.begin_access_op(i);
                self.resolve(i, dst, Field::Dst, AccessKind::Write, false)?;
                self.run_access_op(i, op, p, site, 0);
            }
            Op::HostRead { buffer } | Op::HostWrite { buffer } => {
                let kind = if matches!(op, Op::HostRead { .. }) {
                    AccessKind::Read
                } else {
                    AccessKind::Write
                };
                self.begin_access_op(i);
                self.resolve(i, buffer, Field::Buffer, kind, true)?;
                self.run_access_op(i, op, Participant::HOST, site, 0);
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => self.order.reset_event(event),
            Op::EventRecord { event, stream } => {
                let p = self.order.stream(stream);
                self.order.record(event, p);
            }
            Op::EventWait { stream, event } => {
                let p = self.order.stream(stream);
                if self.order.wait(p, event) == Wait::Unrecorded {
                    self.warn_unrecorded(i, op, stream, event);
                }
            }
            Op::EventSync { event } => self.order.event_sync(event),
            Op::EventQuery { event, complete } => {
                if *complete {
                    self.order.event_sync(event)
                }
            }
            Op::StreamSync { stream } => {
                let p = self.order.stream(stream);
                self.order.stream_sync(p);
            }
            Op::StreamQuery { stream, complete } => {
                let p = self.order.stream(stream);
                if *complete {
                    self.order.stream_sync(p);
                }
            }
            Op::DeviceSync { device } => self.order.device_sync(*device),
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => self.graph_begin(i, graph, stream, pool.as_ref())?,
            Op::GraphEnd { graph } => self.graph_end(i, graph)?,
            Op::GraphLaunch { graph, stream } => self.graph_launch(i, op, graph, stream, site)?,
        }
        Ok(())
    }

    /// `wait-on-unrecorded-event`: the wait at op `i` has no effect.
    fn warn_unrecorded(&mut self, i: u64, op: &Op, stream: &Id, event: &Id) {
        let plan = FixPlan::RecordEvent {
            event: event.to_string(),
            waiter: stream.to_string(),
            before: i,
        };
        self.hazards.push(Hazard {
            kind: HazardKind::WaitOnUnrecordedEvent,
            severity: HazardKind::WaitOnUnrecordedEvent.severity(),
            op: i,
            buffer: None,
            pattern: None,
            access: None,
            conflicts: Vec::new(),
            free: None,
            fix: Some(plan.sentence()),
            detail: Detail {
                op_name: op.name(),
                label: None,
                event: Some(event.to_string()),
                participant: stream.to_string(),
                notes: vec![],
                why: Vec::new(),
                replay: None,
                plan: Some(plan),
            },
            confirmation: None,
        });
    }

    /// The kernel name of a label id.
    fn label_of(&self, id: u32) -> Option<Arc<str>> {
        id.checked_sub(1)
            .and_then(|k| self.label_names.get(k as usize).cloned())
    }

    /// The id of a kernel name (see [`Access::label`]).
    fn label(&mut self, name: &str) -> u32 {
        if let Some(&l) = self.labels.get(name) {
            return l;
        }
        self.label_names.push(Arc::from(name));
        let l = self.label_names.len() as u32;
        self.labels.insert(name.into(), l);
        l
    }

    fn new_gen(&mut self, g: Generation) -> GenId {
        match self.free_slots.pop() {
            Some(s) => {
                self.gens[s as usize] = Some(g);
                GenId(s)
            }
            None => {
                self.gens.push(Some(g));
                GenId(self.gens.len() as u32 - 1)
            }
        }
    }

    /// Takes a generation out of the table.
    fn take_gen(&mut self, g: GenId) -> Option<Generation> {
        let gen = self.gens[g.0 as usize].take()?;
        self.history -= gen.history.len();
        self.free_slots.push(g.0);
        Some(gen)
    }

    fn drop_gen(&mut self, g: GenId) {
        if let Some(gen) = self.take_gen(g) {
            self.recycle(gen.history);
        }
    }

    /// Keeps a dropped generation's history vectors for the next generations: most buffers of a
    /// trace are short-lived, and their vectors need not be allocated each time.
    fn recycle(&mut self, history: History) {
        let covered = history.rest.map(|r| r.covered).unwrap_or_default();
        for mut v in [history.accesses, covered] {
            if v.capacity() > 0 && v.capacity() <= 4 * FLAT_MAX && self.spare.len() < 1024 {
                v.clear();
                self.spare.push(v);
            }
        }
    }

    fn spare_vec(&mut self) -> Vec<Access> {
        // Most buffers keep one entry: a vector of exactly one, unless one is at hand.
        self.spare.pop().unwrap_or_else(|| Vec::with_capacity(1))
    }

    fn gen(&self, g: GenId) -> &Generation {
        self.gens[g.0 as usize].as_ref().expect("generation in use")
    }

    fn new_external(&mut self, name: &Id) -> GenId {
        self.new_gen(Generation::external(name.clone()))
    }
}
