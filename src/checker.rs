//! The checker: drives happens-before ([`crate::order`]), shadow memory ([`crate::shadow`]) and
//! the allocator model ([`crate::alloc`]) over a stream of ops and reports every hazard of the
//! trace format.
//!
//! Guarantee: exact under the trace format's rules — every hazard the format defines is reported,
//! and nothing else. Each hazard kind is decided in one place: `data-race` and `reuse-race` in
//! `Checker::check_access`, `unsafe-free` and `invalid-free` in `free`, `use-after-free` in
//! `resolve` (and, for a graph's replay, at its launch), `wait-on-unrecorded-event` in
//! `warn_unrecorded`. CUDA graphs — captures, pools and replays — are the [`graphs`] module's.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use crate::alloc::{DeviceCachingAllocator, HostCachingAllocator, ModelMemory};
use crate::clock::{Participant, VectorClock};
use crate::order::{Order, StreamError, Wait};
use crate::report::{
    latest_by_participant, AccessKind, AccessRef, Conflict, Detail, FreeRef, Hazard, HazardKind,
    OpNote, Pattern, Report,
};
use crate::shadow::{
    scan, Access, Entry, Freed, GenId, Generation, Graveyard, History, Probe, Visit, FLAT_MAX,
};
use crate::trace::{Field, Id, MemoryKind, Op, Region, Site, TraceOp};

mod graphs;

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

/// What a buffer name refers to now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    Live(GenId),
    External(GenId),
    /// Freed: the slot of what remains of it in [`Checker::freed`]'s table.
    Freed(u32),
}

/// Buffer names and what they refer to. A name is stored once, by the generation or the freed
/// record it refers to: the table keys it by its hash, and a name whose hash another name took
/// first goes to `clash` (a million live buffers would otherwise pay for each name twice).
#[derive(Clone, Debug, Default)]
struct Names {
    by_hash: HashMap<u64, Name>,
    clash: HashMap<Id, Name>,
}

fn name_hash(name: &Id) -> u64 {
    use std::hash::BuildHasher;
    #[cfg(test)]
    if tests::WEAK_NAME_HASH.with(|w| w.get()) {
        // Every name of one length clashes: the tests' way to reach `Names::clash`.
        return name.as_str().len() as u64;
    }
    rustc_hash::FxBuildHasher.hash_one(name)
}

/// What remains of a freed name: enough to report use-after-free and invalid-free.
#[derive(Clone, Debug)]
struct FreedName {
    name: Id,
    size: u64,
    memory: MemoryKind,
    owner: Participant,
    free_op: u64,
    free_by: Participant,
    free_site: Option<Arc<Site>>,
    /// A pool buffer's generation, which outlives its free ([`NO_GEN`] for other buffers).
    pool_gen: u32,
}

/// [`FreedName::pool_gen`] of a buffer that is not a pool buffer.
const NO_GEN: u32 = u32::MAX;

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
    /// The free (op, participant, site), when the name's current binding does not tell it (a
    /// graph replay's buffer, whose name may be allocated again since).
    freed: Option<(u64, Participant, Option<Arc<Site>>)>,
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
///                 memory: Default::default(), addr: None },
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
    /// What remains of freed names, by slot (see [`Name::Freed`]), and the slots free for reuse.
    freed: Vec<FreedName>,
    freed_slots: Vec<u32>,
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
            freed: Vec::new(),
            freed_slots: Vec::new(),
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
        }
    }

    /// The happens-before state.
    pub fn order(&self) -> &Order {
        &self.order
    }

    /// Counters of the current state.
    pub fn stats(&self) -> Stats {
        Stats {
            ops: self.ops,
            participants: self.order.participants(),
            generations: self.gens.len() - self.free_slots.len(),
            graveyard: self.graveyard.len(),
            history: self.history,
            hazards: self.hazards.len(),
            clock_entries: self.order.clock_entries(),
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
        let site = op.site.clone().map(Arc::new);
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
            } => self.alloc(i, buffer, *bytes, stream.as_ref(), *memory, *addr, site)?,
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
                    Some(Name::Freed(f)) => {
                        let end = self.freed[f as usize].size;
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
        self.hazards.push(Hazard {
            kind: HazardKind::WaitOnUnrecordedEvent,
            severity: HazardKind::WaitOnUnrecordedEvent.severity(),
            op: i,
            buffer: None,
            pattern: None,
            access: None,
            conflicts: Vec::new(),
            free: None,
            fix: Some(format!(
                "record event {event} on the stream whose work {stream} must wait for before op {i}; this wait has no effect"
            )),
            detail: Detail {
                op_name: op.name(),
                label: None,
                event: Some(event.to_string()),
                participant: stream.to_string(),
                notes: vec![],
                why: Vec::new(),
                replay: None,
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

    /// The name a binding refers to.
    fn name_of(&self, n: Name) -> Option<&Id> {
        match n {
            Name::Live(g) | Name::External(g) => {
                self.gens[g.0 as usize].as_ref().map(|gen| &gen.name)
            }
            Name::Freed(f) => self.freed.get(f as usize).map(|f| &f.name),
        }
    }

    /// What `name` refers to now.
    fn lookup(&self, name: &Id) -> Option<Name> {
        match self.names.by_hash.get(&name_hash(name)) {
            None => None,
            Some(&n) if self.name_of(n) == Some(name) => Some(n),
            Some(_) => self.names.clash.get(name).copied(),
        }
    }

    /// Binds `name`, which refers to `cur` now, to `new`.
    fn rebind(&mut self, name: &Id, cur: Option<Name>, new: Name) {
        use std::collections::hash_map::Entry;
        match self.names.by_hash.entry(name_hash(name)) {
            Entry::Vacant(v) => {
                v.insert(new);
            }
            Entry::Occupied(mut o) if cur == Some(*o.get()) => {
                o.insert(new);
            }
            Entry::Occupied(_) => {
                self.names.clash.insert(name.clone(), new);
            }
        }
    }

    fn new_external(&mut self, name: &Id) -> GenId {
        self.new_gen(Generation::external(name.clone()))
    }

    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &mut self,
        i: u64,
        buffer: &Id,
        bytes: u64,
        stream: Option<&Id>,
        memory: MemoryKind,
        addr: Option<u64>,
        site: Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let cur = self.lookup(buffer);
        if let Some(Name::Live(_)) = cur {
            return Err(Self::err(
                i,
                Field::Buffer,
                format!("buffer \"{buffer}\" is already allocated and not yet freed"),
                Some("a new name, or a free of the buffer first"),
            ));
        }
        let stream_p = stream.map(|s| self.order.stream(s));
        let owner = match memory {
            MemoryKind::Device => stream_p.unwrap_or(Order::DEFAULT),
            _ => Participant::HOST,
        };
        // Device memory allocated on a capturing stream comes from the capture's pool.
        let pool = match memory {
            MemoryKind::Device => self.graphs.capture_pool(owner),
            _ => None,
        };
        let mut base = None;
        if bytes > 0 {
            let with_addr = addr.is_some();
            match self.addr_mode {
                None => self.addr_mode = Some(with_addr),
                Some(mode) if mode != with_addr => {
                    return Err(Self::err(
                        i,
                        if with_addr { Field::Addr } else { Field::Op },
                        if with_addr {
                            "this allocation gives \"addr\" but earlier allocations did not"
                        } else {
                            "this allocation has no \"addr\" but earlier allocations gave one"
                        },
                        Some("\"addr\" on every non-empty allocation or on none"),
                    ))
                }
                _ => {}
            }
            match addr {
                Some(a) => {
                    let end = a.checked_add(bytes).ok_or_else(|| {
                        Self::err(
                            i,
                            Field::Addr,
                            "addr + bytes overflows",
                            Some("a range below 2^64"),
                        )
                    })?;
                    if memory == MemoryKind::Device {
                        self.graphs
                            .check_pool_bytes(a, end, pool)
                            .map_err(|message| {
                                Self::err(
                                    i,
                                    Field::Addr,
                                    message,
                                    Some("an address range that no other pool holds"),
                                )
                            })?;
                    }
                    if let Some((&s, &(e, g))) = self.live[memory.index()].range(..end).next_back()
                    {
                        if e > a {
                            return Err(Self::err(
                                i,
                                Field::Addr,
                                format!(
                                    "{} memory [{a:#x}, {end:#x}) overlaps the live buffer \"{}\" at [{s:#x}, {e:#x})",
                                    memory.as_str(),
                                    self.gen(g).name
                                ),
                                Some("an address range that no live allocation of the same memory kind uses"),
                            ));
                        }
                    }
                    if memory == MemoryKind::Device {
                        self.reappear(i, a, end, owner);
                    }
                    base = Some(a);
                }
                None => {
                    let block = match (memory, pool) {
                        (MemoryKind::Device, Some(p)) => {
                            self.graphs
                                .pools
                                .allocate(p, bytes, owner.0, self.device.memory_mut())
                        }
                        (MemoryKind::Device, None) => self.device.allocate(bytes, owner.0),
                        (MemoryKind::Pinned, _) => self.pinned.allocate(bytes),
                        (MemoryKind::Managed, _) => self.managed.allocate(bytes),
                    }
                    .map_err(|e| {
                        Self::err(
                            i,
                            Field::Bytes,
                            format!("the allocator model cannot serve {bytes} bytes: {e}"),
                            Some("a size the address space can hold"),
                        )
                    })?;
                    if let Some(b) = block {
                        base = Some(b.addr);
                    }
                }
            }
        }
        // The allocation is a use: a write of the whole buffer by the owner, at the epoch of
        // the owner's latest access (time 0, before everything, if it has none). A pool
        // buffer's is not (nothing runs at capture).
        let epoch = self.order.clock(owner).epoch(owner);
        let mut accesses = self.spare_vec();
        if bytes > 0 && memory == MemoryKind::Device && epoch.time > 0 && pool.is_none() {
            accesses.push(Access {
                op: i,
                time: epoch.time,
                participant: owner,
                kind: AccessKind::Alloc,
                offset: 0,
                end: bytes,
                site: site.clone(),
                label: 0,
                captured: 0,
            });
        }
        self.history += accesses.len();
        // Only the bytes that hold tombstones now can race with freed buffers: while this buffer
        // lives, no other buffer is freed on its bytes.
        let (reuse, reuse_large) = match base {
            Some(a) => self.graveyard.reuse(memory, a, a + bytes),
            None => (Vec::new(), false),
        };
        let mut gen = Generation::allocated(
            buffer.clone(),
            memory,
            owner,
            bytes,
            base,
            i,
            site,
            History::flat(accesses),
        );
        if reuse_large || !reuse.is_empty() {
            gen.set_reuse(reuse, reuse_large);
        }
        let g = self.new_gen(gen);
        if let Some(p) = pool {
            let addr_mode = self.addr_mode == Some(true);
            let pg = self
                .graphs
                .add_pool_buffer(p, g, buffer, base, bytes, i, addr_mode);
            if let Some(gen) = self.gens[g.0 as usize].as_mut() {
                gen.set_pool(pg);
            }
        }
        // Recorded addresses are checked for overlaps; the model's never overlap.
        if let (Some(a), Some(true)) = (base, self.addr_mode) {
            self.live[memory.index()].insert(a, (a + bytes, g));
        }
        // A name used so far as external starts a new, unrelated buffer.
        self.rebind(buffer, cur, Name::Live(g));
        match cur {
            // An external buffer that a graph's body names stays with the graph.
            Some(Name::External(old)) if !self.gen(old).is_captured() => self.drop_gen(old),
            // The name is allocated again: what remained of the freed one is no longer needed.
            Some(Name::Freed(f)) => self.freed_slots.push(f),
            _ => {}
        }
        Ok(())
    }

    /// With `addr`: device memory that reappears on another stream than the one that last freed
    /// it went back to the driver and was allocated again, which synchronizes the device.
    fn reappear(&mut self, i: u64, start: u64, end: u64, owner: Participant) {
        let mut sync = false;
        let mut overlapped = Vec::new();
        for (&s, &(e, p)) in self.freed_by.range(..end) {
            if e > start {
                sync |= p != owner;
                overlapped.push((s, e, p));
            }
        }
        for (s, e, p) in overlapped {
            self.freed_by.remove(&s);
            if s < start {
                self.freed_by.insert(s, (start, p));
            }
            if e > end {
                self.freed_by.insert(end, (e, p));
            }
        }
        if sync {
            let device = self.order.device(owner);
            self.order.device_sync(device);
            self.implicit_syncs.push((i, device));
        }
    }

    fn free(
        &mut self,
        i: u64,
        buffer: &Id,
        stream: Option<&Id>,
        site: Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let named = stream.map(|s| self.order.stream(s));
        if let Some(p) = named {
            // A stream-ordered free is an op on its stream (rules 2 and 5 apply).
            self.order.begin_stream_op(p);
        }
        let g = match self.lookup(buffer) {
            Some(Name::Live(g)) => g,
            other => {
                let (why, by, bytes, notes) = match other {
                    None => (
                        "was never allocated".to_string(),
                        named.unwrap_or(Participant::HOST),
                        None,
                        vec![],
                    ),
                    Some(Name::External(_)) => (
                        "is external: it was used without an alloc, so this trace does not own it"
                            .to_string(),
                        named.unwrap_or(Participant::HOST),
                        None,
                        vec![],
                    ),
                    Some(Name::Freed(f)) => {
                        let f = &self.freed[f as usize];
                        (
                            format!("was already freed at op {}", f.free_op),
                            named.unwrap_or(if f.memory == MemoryKind::Device {
                                f.owner
                            } else {
                                Participant::HOST
                            }),
                            Some(f.size),
                            vec![OpNote {
                                what: "first freed here".into(),
                                op: f.free_op,
                                site: f.free_site.clone(),
                            }],
                        )
                    }
                    Some(Name::Live(_)) => unreachable!(),
                };
                let participant = self.order.name(by).to_string();
                self.hazards.push(Hazard {
                    kind: HazardKind::InvalidFree,
                    severity: HazardKind::InvalidFree.severity(),
                    op: i,
                    buffer: Some(buffer.to_string()),
                    pattern: None,
                    access: Some(AccessRef {
                        op: i,
                        participant: participant.clone(),
                        access: AccessKind::Free,
                        offset: 0,
                        bytes,
                        site,
                        captured: None,
                    }),
                    conflicts: vec![],
                    free: None,
                    fix: Some(format!(
                        "remove the free of {buffer} at op {i}: the buffer {why}"
                    )),
                    detail: Detail {
                        op_name: "free",
                        label: None,
                        event: None,
                        participant,
                        notes,
                        why: Vec::new(),
                        replay: None,
                    },
                    confirmation: None,
                });
                return Ok(());
            }
        };
        if self.gen(g).is_pool() {
            self.free_pool_buffer(i, g, buffer, named, site);
            return Ok(());
        }
        let (memory, owner, size, base) = {
            let gen = self.gen(g);
            (gen.memory, gen.owner, gen.size().unwrap_or(0), gen.addr())
        };
        let by = named.unwrap_or(if memory == MemoryKind::Device {
            owner
        } else {
            Participant::HOST
        });
        // The free's clock: the freeing participant's (joined with the host's), joined with the
        // clock of every stream named by record_stream. An access happens before it when one of
        // those clocks covers it.
        let mut gen = self.take_gen(g).expect("live generation");
        if gen.is_captured() {
            // The graphs whose bodies name it: their launches now use freed memory.
            self.graphs.buffer_freed(g, i, by, &site);
        }
        let alloc_op = gen.alloc_op();
        let rs = gen.take_record_streams();
        let Generation {
            name,
            alloc_site,
            history,
            ..
        } = gen;
        let order = &self.order;
        let before_free = |e: crate::clock::Epoch| {
            order.clock(by).covers(e)
                || order.host_clock().covers(e)
                || rs.iter().any(|&p| order.clock(p).covers(e))
        };
        let mut entries = history.into_all();
        let unordered: Vec<&Access> = entries
            .iter()
            .filter(|a| a.participant != by && !before_free(a.epoch()))
            .collect();
        // Each participant's latest conflicting op, with all its regions.
        let latest = latest_ops(unordered.iter().copied());
        let mut conflicts: Vec<Conflict> = unordered
            .iter()
            .filter(|a| is_latest(&latest, a))
            .map(|a| conflict_of(order, &self.label_names, &self.graphs, a, &name))
            .collect();
        let alloc_op = alloc_op.unwrap_or(0);
        if !rs.is_empty() {
            // The allocator hands these bytes out again only after the events it records now on
            // the record_stream streams complete: whatever those streams' clocks cover happens
            // before every access to memory that reuses them, so it can never be a reuse race.
            let mut excused = VectorClock::new();
            for &p in &rs {
                excused.join(order.clock(p));
            }
            entries.retain(|a| !excused.covers(a.epoch()));
        }
        if !conflicts.is_empty() {
            conflicts.sort_by(conflict_order);
            conflicts.dedup();
            let participant = self.order.name(by).to_string();
            let launch_named = self.graphs.with_launch_streams(&self.order, &conflicts);
            let fix = fix_unsafe_free(
                &self.order,
                buffer,
                i,
                by,
                named.is_some(),
                memory,
                owner,
                launch_named.as_deref().unwrap_or(&conflicts),
            );
            self.hazards.push(Hazard {
                kind: HazardKind::UnsafeFree,
                severity: HazardKind::UnsafeFree.severity(),
                op: i,
                buffer: Some(buffer.to_string()),
                pattern: None,
                access: Some(AccessRef {
                    op: i,
                    participant: participant.clone(),
                    access: AccessKind::Free,
                    offset: 0,
                    bytes: Some(size),
                    site: site.clone(),
                    captured: None,
                }),
                conflicts,
                free: None,
                fix: Some(fix),
                detail: Detail {
                    op_name: "free",
                    label: None,
                    event: None,
                    participant,
                    notes: vec![OpNote {
                        what: format!("allocated on {}", self.order.name(owner)),
                        op: alloc_op,
                        site: alloc_site,
                    }],
                    why: Vec::new(),
                    replay: None,
                },
                confirmation: None,
            });
        }
        // Hand the memory back to the allocator model.
        if let Some(a) = base {
            if self.addr_mode == Some(true) {
                self.live[memory.index()].remove(&a);
                if memory == MemoryKind::Device {
                    self.freed_by.insert(a, (a + size, by));
                }
            } else {
                // The model handed this block out, so giving it back cannot fail.
                let _ = match memory {
                    MemoryKind::Device => self.device.free(a, by.0),
                    MemoryKind::Pinned => self.pinned.free(a),
                    MemoryKind::Managed => self.managed.free(a),
                };
            }
        }
        // What the accesses left unexcused still decides reuse races: bury them, in op order,
        // so that each trims the earlier tombstones of its participant it subsumes.
        if let Some(a) = base.filter(|_| size > 0) {
            let forget = forget_clock(&self.forget, &self.order);
            entries.retain(|e| !forget.covers(e.epoch()));
            if !entries.is_empty() {
                if self.graveyard.len() >= self.graveyard_prune_at {
                    self.prune_graveyard();
                }
                let freed = Freed {
                    name: buffer.clone(),
                    op: i,
                    site: site.clone(),
                };
                let forget = forget_clock(&self.forget, &self.order);
                if let Some(mut v) = self.graveyard.bury(memory, a, size, entries, freed, forget) {
                    if v.capacity() > 0 && v.capacity() <= 4 * FLAT_MAX && self.spare.len() < 1024 {
                        v.clear();
                        self.spare.push(v);
                    }
                }
            }
        }
        let freed = FreedName {
            name: buffer.clone(),
            size,
            memory,
            owner,
            free_op: i,
            free_by: by,
            free_site: site,
            pool_gen: NO_GEN,
        };
        self.bind_freed(buffer, g, freed);
        Ok(())
    }

    /// Binds the name of generation `g`, freed now, to what remains of it.
    fn bind_freed(&mut self, buffer: &Id, g: GenId, freed: FreedName) {
        let slot = match self.freed_slots.pop() {
            Some(s) => {
                self.freed[s as usize] = freed;
                s
            }
            None => {
                self.freed.push(freed);
                self.freed.len() as u32 - 1
            }
        };
        // The name is live here, so it is in the table: replace it in place.
        self.rebind(buffer, Some(Name::Live(g)), Name::Freed(slot));
    }

    fn begin_access_op(&mut self, _i: u64) {
        self.op_accesses.clear();
        self.uaf.clear();
    }

    /// Resolves a region of the current op to a generation and byte range, or notes a use after
    /// free. Bad input: a region past the end of its buffer, a host access to device memory.
    fn resolve(
        &mut self,
        i: u64,
        r: &Region,
        field: Field,
        kind: AccessKind,
        host: bool,
    ) -> Result<(), CheckError> {
        let bound = self.lookup(&r.buffer);
        let (g, size, memory) = match bound {
            Some(Name::Live(g)) => {
                let gen = self.gen(g);
                (Some(g), gen.size(), gen.memory)
            }
            Some(Name::External(g)) => (Some(g), None, MemoryKind::Device),
            Some(Name::Freed(f)) => {
                let f = &self.freed[f as usize];
                (None, Some(f.size), f.memory)
            }
            None => (None, None, MemoryKind::Device),
        };
        if host && !memory.host_accessible() {
            return Err(Self::err(
                i,
                field,
                format!(
                    "the host cannot access buffer \"{}\": it is {}device memory",
                    r.buffer,
                    if size.is_none() {
                        "external, hence "
                    } else {
                        ""
                    }
                ),
                Some("a pinned or managed buffer"),
            ));
        }
        let end = Self::region_end(i, r, field, size)?;
        let g = match (g, g.is_none() && bound.is_some()) {
            (Some(g), _) => g,
            (None, false) => {
                let g = self.new_external(&r.buffer);
                self.rebind(&r.buffer, None, Name::External(g));
                g
            }
            (None, true) => {
                self.uaf.push(UseAfterFree {
                    name: r.buffer.clone(),
                    kind: Some(kind),
                    offset: r.offset,
                    end,
                    freed: None,
                });
                return Ok(());
            }
        };
        self.op_accesses.push(OpAccess {
            gen: g,
            kind,
            offset: r.offset,
            end,
        });
        Ok(())
    }

    /// One past the last byte of region `r` of a buffer of `size` bytes (`None`: external,
    /// `u64::MAX` for "to the end"). Bad input: a region past the end of the buffer.
    #[inline(always)]
    fn region_end(i: u64, r: &Region, field: Field, size: Option<u64>) -> Result<u64, CheckError> {
        Ok(match (size, r.bytes) {
            (Some(size), bytes) => {
                let end = match bytes {
                    Some(b) => r.offset.saturating_add(b),
                    None => r.offset.max(size),
                };
                if end > size || r.offset > size {
                    return Err(Self::past_the_end(i, r, field, size, end));
                }
                end
            }
            (None, Some(b)) => r.offset.saturating_add(b),
            (None, None) => u64::MAX,
        })
    }

    /// The bad-input error of a region past the end of its buffer (off the hot path).
    #[cold]
    #[inline(never)]
    fn past_the_end(i: u64, r: &Region, field: Field, size: u64, end: u64) -> CheckError {
        Self::err(
            i,
            field,
            format!(
                "region [{}, {}) reaches past the end of buffer \"{}\" ({size} bytes)",
                r.offset,
                if end == u64::MAX {
                    "end".to_string()
                } else {
                    end.to_string()
                },
                r.buffer
            ),
            Some("a region inside the buffer"),
        )
    }

    /// A region both read and written counts as written; the same region twice counts once.
    fn dedup_regions(&mut self) {
        dedup_accesses(&mut self.op_accesses);
    }

    /// Runs the accesses of the current op: checks each region, then records them.
    fn run_access_op(
        &mut self,
        i: u64,
        op: &Op,
        p: Participant,
        site: Option<Arc<Site>>,
        label_id: u32,
    ) {
        if p.is_host() {
            self.order.tick(p);
        } else {
            self.order.begin_stream_op(p);
            self.order.tick(p);
        }
        let epoch = self.order.clock(p).epoch(p);
        self.found.clear();
        for at in 0..self.op_accesses.len() {
            self.check_access(at, p);
        }
        if !self.found.is_empty() {
            let label = self.label_of(label_id);
            self.report_races(i, op, p, &site, &label, 0, p);
        }
        if !self.uaf.is_empty() {
            self.report_use_after_free(i, op, p, &site, 0);
        }
        self.record_accesses(i, p, epoch.time, &site, label_id, 0);
    }

    /// Records the accesses of the current op (`op_accesses`), by `p` at `time`; `captured` is
    /// [`Access::captured`].
    #[inline(always)]
    fn record_accesses(
        &mut self,
        i: u64,
        p: Participant,
        time: crate::clock::Time,
        site: &Option<Arc<Site>>,
        label_id: u32,
        captured: u32,
    ) {
        let Checker {
            op_accesses,
            gens,
            history,
            order,
            limits,
            forget,
            graphs,
            ..
        } = self;
        let flat_max = limits.history_index_at;
        for a in op_accesses.iter() {
            if a.offset >= a.end {
                // An access of no bytes uses no memory: it can never conflict.
                continue;
            }
            let gen = gens[a.gen.0 as usize]
                .as_mut()
                .expect("accessed generation");
            if let Some(pg) = gen.pool_index() {
                graphs.pool_access(pg, p);
            }
            let access = Access {
                op: i,
                time,
                participant: p,
                kind: a.kind,
                offset: a.offset,
                end: a.end,
                site: site.clone(),
                label: label_id,
                captured,
            };
            let h = &mut gen.history;
            match h.index_mut() {
                None => {
                    *history += 1;
                    h.accesses.push(access);
                    if h.accesses.len() > flat_max || h.len() > flat_max {
                        let before = h.len();
                        h.index_now();
                        *history = *history + h.len() - before;
                    }
                }
                Some(ix) => {
                    // The check has already trimmed what this access subsumes on its bytes.
                    let before = ix.slots();
                    let entry = Arc::new(Entry {
                        access,
                        freed: None,
                    });
                    let forget = forget_clock(forget, order);
                    ix.insert(a.offset, a.end, entry, |e| forget.covers(e.access.epoch()));
                    *history = *history + ix.slots() - before;
                }
            }
        }
    }

    /// `data-race` and `reuse-race`: the earlier accesses that conflict with region `at` of the
    /// current op and do not happen before it.
    fn check_access(&mut self, at: usize, p: Participant) {
        let OpAccess {
            gen: g,
            kind,
            offset,
            end,
        } = self.op_accesses[at];
        let Checker {
            order,
            gens,
            found,
            graveyard,
            history,
            forget,
            graphs,
            ..
        } = self;
        let clock = order.clock(p);
        // Entries this clock covers can never conflict again (see `Checker::retain`).
        let host = forget_clock(forget, order);
        let gen = gens[g.0 as usize].as_mut().expect("accessed generation");
        let probe = Probe {
            participant: p,
            clock,
            writes: kind.writes(),
            offset,
            end,
        };
        let hits = std::cell::Cell::new(0);
        let name = &gen.name;
        let mut hit = |a: &Access| {
            hits.set(hits.get() + 1);
            found.push(Found {
                at,
                kind: HazardKind::DataRace,
                access: a.clone(),
                buffer: name.clone(),
                freed: None,
            });
        };
        let h = &mut gen.history;
        match h.rest.as_deref_mut() {
            None | Some(crate::shadow::Rest { index: None, .. }) => {
                // An empty access covers nothing and conflicts with nothing.
                let cover = (offset < end).then_some(&mut h.rest);
                *history -= scan(&mut h.accesses, cover, host, probe, &mut hit);
                if hits.get() > 0 {
                    if let Some(r) = h.rest.as_deref_mut() {
                        *history -= scan(&mut r.covered, None, host, probe, &mut hit);
                    }
                }
            }
            Some(crate::shadow::Rest {
                index: Some(ix), ..
            }) if offset < end => {
                // Pieces split at the access's bounds lie inside it: an entry of this
                // participant that the access dominates is trimmed from them (rule 2).
                let before = ix.slots();
                ix.split_at(offset);
                ix.split_at(end);
                let grown = ix.slots() - before;
                let mut last: Option<*const Entry> = None;
                let dropped = ix.visit(offset, end, |e| {
                    let a = &e.access;
                    if host.covers(a.epoch()) {
                        return Visit::Drop;
                    }
                    if probe.conflicts(a) && last != Some(Arc::as_ptr(e)) {
                        last = Some(Arc::as_ptr(e));
                        hit(a);
                    }
                    if a.participant == p && Access::dominates(probe.writes, a) {
                        Visit::Drop
                    } else {
                        Visit::Keep
                    }
                });
                *history = *history + grown - dropped;
            }
            Some(_) => {}
        }

        // Reuse: tombstones of freed buffers on the bytes this region occupies.
        let (Some(base), memory) = (gen.addr(), gen.memory) else {
            return;
        };
        if offset >= end {
            return;
        }
        let gen = match gen.pool_index() {
            Some(pg) => {
                // The other buffers of its pool that held these bytes, earlier or later.
                let (lo, hi) = (base + offset, base + end.min(gen.size().unwrap_or(0)));
                graphs.pool_reuse(gens, history, pg, lo, hi, at, &probe, host, found);
                gens[g.0 as usize].as_mut().expect("accessed generation")
            }
            None => gen,
        };
        let (lo, hi) = (base + offset, base + end.min(gen.size().unwrap_or(0)));
        if gen.reuse().is_empty() && !gen.reuse_large() {
            return;
        }
        let mut alive = false;
        for rec in gen.reuse() {
            for a in &rec.entries {
                if host.covers(a.epoch()) {
                    continue;
                }
                alive = true;
                let (s, e) = rec.range(a);
                if s < hi && lo < e && probe.conflicts(a) {
                    found.push(Found {
                        at,
                        kind: HazardKind::ReuseRace,
                        access: a.clone(),
                        buffer: rec.freed.name.clone(),
                        freed: Some(FreedAt {
                            op: rec.freed.op,
                            site: rec.freed.site.clone(),
                            name: rec.freed.name.clone(),
                        }),
                    });
                }
            }
        }
        if gen.reuse_large() {
            let mut last: Option<*const Entry> = None;
            graveyard.large(memory).visit(lo, hi, |e| {
                if host.covers(e.access.epoch()) {
                    return Visit::Drop;
                }
                alive = true;
                let a = &e.access;
                if probe.conflicts(a) && last != Some(Arc::as_ptr(e)) {
                    last = Some(Arc::as_ptr(e));
                    found.push(Found {
                        at,
                        kind: HazardKind::ReuseRace,
                        access: a.clone(),
                        buffer: e
                            .freed
                            .as_ref()
                            .map_or_else(Id::default, |f| f.name.clone()),
                        freed: e.freed.as_ref().map(|f| FreedAt {
                            op: f.op,
                            site: f.site.clone(),
                            name: f.name.clone(),
                        }),
                    });
                }
                Visit::Keep
            });
        }
        if !alive && offset == 0 && end >= gen.size().unwrap_or(0) {
            // Every tombstone on its bytes is covered by the host's clock now.
            gen.set_reuse(Vec::new(), false);
        }
    }

    /// Reports the races found for the current op by `p`. For a graph replay, `captured` is the
    /// captured op's [`Access::captured`] and `fix_p` the launch stream, which the fix orders
    /// (the replay's participants follow it); otherwise `captured` is 0 and `fix_p` is `p`.
    #[allow(clippy::too_many_arguments)]
    fn report_races(
        &mut self,
        i: u64,
        op: &Op,
        p: Participant,
        site: &Option<Arc<Site>>,
        label: &Option<Arc<str>>,
        captured: u32,
        fix_p: Participant,
    ) {
        let mut found = std::mem::take(&mut self.found);
        // Group by (kind, accessed generation), in the op's region order.
        found.sort_by_key(|f| (f.kind, self.op_accesses[f.at].gen, f.at));
        let participant = self.order.name(p).to_string();
        let mut start = 0;
        while start < found.len() {
            let key = (found[start].kind, self.op_accesses[found[start].at].gen);
            let mut stop = start;
            while stop < found.len()
                && (found[stop].kind, self.op_accesses[found[stop].at].gen) == key
            {
                stop += 1;
            }
            let group = &found[start..stop];
            let (kind, g) = key;
            let (mut lo, mut hi, mut writes) = (u64::MAX, 0, false);
            for f in group {
                let a = self.op_accesses[f.at];
                lo = lo.min(a.offset);
                hi = hi.max(a.end);
                writes |= a.kind.writes();
            }
            let my_kind = if writes {
                AccessKind::Write
            } else {
                AccessKind::Read
            };
            // Each participant's latest conflicting op, with all its conflicting regions.
            let latest = latest_ops(group.iter().map(|f| &f.access));
            let kept: Vec<&Found> = group
                .iter()
                .filter(|f| is_latest(&latest, &f.access))
                .collect();
            let mut conflicts: Vec<Conflict> = kept
                .iter()
                .map(|f| self.conflict(&f.access, &f.buffer))
                .collect();
            conflicts.sort_by(conflict_order);
            conflicts.dedup();
            let pattern = Pattern::of(my_kind, conflicts.iter().map(|c| c.access));
            // The most recent free among the conflicts listed.
            let freed = kept
                .iter()
                .filter_map(|f| f.freed.as_ref())
                .max_by_key(|f| f.op);
            let free = freed.map(|f| FreeRef {
                op: f.op,
                buffer: f.name.to_string(),
            });
            let gen = self.gen(g);
            let mut notes = Vec::new();
            if let Some(a) = gen.alloc_op() {
                notes.push(OpNote {
                    what: format!("{} allocated on {}", gen.name, self.order.name(gen.owner)),
                    op: a,
                    site: gen.alloc_site.clone(),
                });
            }
            if let Some(f) = freed {
                notes.push(OpNote {
                    what: format!("{} freed here; its memory was handed out again", f.name),
                    op: f.op,
                    site: f.site.clone(),
                });
            }
            let replay = self.graphs.replay_of(captured);
            let fix = if captured == 0 {
                let named = self.graphs.with_launch_streams(&self.order, &conflicts);
                fix_race(
                    &self.order,
                    kind,
                    i,
                    fix_p,
                    named.as_deref().unwrap_or(&conflicts),
                    free.as_ref(),
                )
            } else {
                self.replay_fix(kind, i, fix_p, captured, &kept, &conflicts, free.as_ref())
            };
            self.hazards.push(Hazard {
                kind,
                severity: kind.severity(),
                op: i,
                buffer: Some(gen.name.to_string()),
                pattern: Some(pattern),
                access: Some(AccessRef {
                    op: i,
                    participant: participant.clone(),
                    access: my_kind,
                    offset: lo,
                    bytes: bytes_of(lo, hi),
                    site: site.clone(),
                    captured: replay.as_ref().map(|r| r.captured),
                }),
                conflicts,
                free,
                fix: Some(fix),
                detail: Detail {
                    op_name: op.name(),
                    label: label.clone(),
                    event: None,
                    participant: participant.clone(),
                    notes,
                    why: Vec::new(),
                    replay,
                },
                confirmation: None,
            });
            start = stop;
        }
        found.clear();
        self.found = found;
    }

    /// The report's entry for an earlier conflicting access of `buffer`.
    fn conflict(&self, a: &Access, buffer: &Id) -> Conflict {
        conflict_of(&self.order, &self.label_names, &self.graphs, a, buffer)
    }

    /// Reports the uses after free of the current op by `p` (for a graph replay, `captured` is
    /// the captured op's [`Access::captured`]; else 0).
    fn report_use_after_free(
        &mut self,
        i: u64,
        op: &Op,
        p: Participant,
        site: &Option<Arc<Site>>,
        captured: u32,
    ) {
        let mut uaf = std::mem::take(&mut self.uaf);
        uaf.sort_by(|a, b| a.name.cmp(&b.name));
        let participant = self.order.name(p).to_string();
        let replay = self.graphs.replay_of(captured);
        let mut start = 0;
        while start < uaf.len() {
            let mut stop = start;
            while stop < uaf.len() && uaf[stop].name == uaf[start].name {
                stop += 1;
            }
            let group = &uaf[start..stop];
            let name = &group[0].name;
            let access = group[0].kind.map(|_| {
                let lo = group.iter().map(|u| u.offset).min().unwrap_or(0);
                let hi = group.iter().map(|u| u.end).max().unwrap_or(0);
                let writes = group.iter().any(|u| u.kind.is_some_and(AccessKind::writes));
                AccessRef {
                    op: i,
                    participant: participant.clone(),
                    access: if writes {
                        AccessKind::Write
                    } else {
                        AccessKind::Read
                    },
                    offset: lo,
                    bytes: bytes_of(lo, hi),
                    site: site.clone(),
                    captured: replay.as_ref().map(|r| r.captured),
                }
            });
            let freed = match (&group[0].freed, self.lookup(name)) {
                (Some((op, by, site)), _) => Some((*op, *by, site.clone())),
                (None, Some(Name::Freed(f))) => {
                    let f = &self.freed[f as usize];
                    Some((f.free_op, f.free_by, f.free_site.clone()))
                }
                _ => None,
            };
            let (free_op, notes) = match freed {
                Some((op, by, site)) => (
                    op,
                    vec![OpNote {
                        what: format!("{name} freed here by {}", self.order.name(by)),
                        op,
                        site,
                    }],
                ),
                None => (0, vec![]),
            };
            let fix = match &replay {
                Some(r) => format!(
                    "{name} was freed at op {free_op} while graph {} still uses it (captured at op {}): free it only after the graph's last launch, or capture the graph again",
                    r.graph, r.captured
                ),
                None => format!(
                    "{name} was freed at op {free_op}: move that free after op {i}, or allocate {name} again before using it"
                ),
            };
            self.hazards.push(Hazard {
                kind: HazardKind::UseAfterFree,
                severity: HazardKind::UseAfterFree.severity(),
                op: i,
                buffer: Some(name.to_string()),
                pattern: None,
                access,
                conflicts: vec![],
                free: None,
                fix: Some(fix),
                detail: Detail {
                    op_name: op.name(),
                    label: None,
                    event: None,
                    participant: participant.clone(),
                    notes,
                    why: Vec::new(),
                    replay: replay.clone(),
                },
                confirmation: None,
            });
            start = stop;
        }
        uaf.clear();
        self.uaf = uaf;
    }

    /// Drops the tombstones the host's clock covers: keeps reuse lookups short between the
    /// sweeps of [`Self::prune`]. Runs when the graveyard has doubled since the last pass.
    fn prune_graveyard(&mut self) {
        let forget = forget_clock(&self.forget, &self.order);
        if forget != &self.host_at_graveyard_prune {
            self.graveyard.prune(forget);
            self.host_at_graveyard_prune = forget.clone();
        }
        self.graveyard_prune_at = (2 * self.graveyard.len()).max(self.limits.sweep_at / 64);
    }

    /// Drops every history entry and tombstone that the host's clock covers. Runs when the
    /// history has doubled since the last pass.
    fn prune(&mut self) {
        if forget_clock(&self.forget, &self.order) != &self.host_at_prune {
            let Checker {
                gens,
                order,
                history,
                limits,
                forget,
                ..
            } = self;
            // Below the host's clock, a covered entry may outlive the entries covering it.
            let exact = forget.is_none();
            let host = forget_clock(forget, order);
            for gen in gens.iter_mut().flatten() {
                *history -= gen.history.prune(host, limits.history_index_at, exact);
            }
            self.prune_graveyard();
            self.host_at_prune = forget_clock(&self.forget, &self.order).clone();
        }
        self.prune_at = (2 * self.history).max(self.limits.sweep_at);
    }
}

/// What the checker may forget now: history that this clock covers (the host's clock, or its
/// meet with the clock [`Checker::retain`] keeps history for).
fn forget_clock<'a>(forget: &'a Option<VectorClock>, order: &'a Order) -> &'a VectorClock {
    forget.as_ref().unwrap_or_else(|| order.host_clock())
}

/// One region of the access op just checked, as the synchronization analysis sees it.
#[derive(Clone, Debug)]
pub(crate) struct RegionView {
    /// Its position among the op's regions (for [`Checker::probe_region`]).
    pub at: usize,
    /// The accessed buffer's name.
    pub buffer: Id,
    /// Whether the region is written.
    pub writes: bool,
    /// The buffer's memory kind.
    pub memory: MemoryKind,
    /// The region's absolute bytes, where the buffer takes memory (and the region is not empty).
    pub bytes: Option<(u64, u64)>,
}

impl Checker {
    /// Counts an op that has no effect at all: the op index advances and nothing else changes.
    /// The synchronization analysis checks a trace with one op replaced by nothing this way
    /// (every later op keeps its index).
    pub fn skip(&mut self) {
        self.ops += 1;
    }

    /// Keeps the history that `clock` does not cover even where the host's clock covers it
    /// (`None`: forget, as usual, whatever the host's clock covers). Verdicts and reports do not
    /// change, only what is kept: the synchronization analysis asks what-if questions with host
    /// clocks behind the real one, which may still conflict with that history.
    pub fn retain(&mut self, clock: Option<VectorClock>) {
        self.retain = clock.map(|c| (c, 0));
        self.forget = None;
        self.refresh_forget();
    }

    /// Recomputes what may be forgotten after the host's clock changed (with [`Checker::retain`]).
    fn refresh_forget(&mut self) {
        if let Some((keep, version)) = &mut self.retain {
            let now = self.order.host_version();
            if self.forget.is_none() || *version != now {
                self.forget = Some(self.order.host_clock().meet(keep));
                *version = now;
            }
        }
    }

    /// The live (or external) generation `name` refers to now.
    pub(crate) fn live_generation(&self, name: &Id) -> Option<&Generation> {
        match self.lookup(name)? {
            Name::Live(g) | Name::External(g) => self.gens[g.0 as usize].as_ref(),
            Name::Freed(_) => None,
        }
    }

    /// The regions of the access op just checked (`launch`, `copy`, `memset`, `host_read`,
    /// `host_write`), each resolved to its buffer; uses after free are left out.
    pub(crate) fn last_regions(&self) -> Vec<RegionView> {
        self.op_accesses
            .iter()
            .enumerate()
            .filter_map(|(at, a)| {
                let gen = self.gens[a.gen.0 as usize].as_ref()?;
                let bytes = match (gen.addr(), gen.size()) {
                    (Some(base), Some(size)) if a.offset < a.end && a.offset < size => {
                        Some((base + a.offset, base + a.end.min(size)))
                    }
                    _ => None,
                };
                Some(RegionView {
                    at,
                    buffer: gen.name.clone(),
                    writes: a.kind.writes(),
                    memory: gen.memory,
                    bytes,
                })
            })
            .collect()
    }

    /// Whether region `at` of the access op just checked, issued by `p` with `clock` instead of
    /// the clock it had, conflicts with an earlier access of its buffer (`data-race`) and with a
    /// tombstone on its bytes (`reuse-race`). Reads only: every entry is looked at, covered ones
    /// included (the ordering that lets the checker skip them may be missing from `clock`).
    pub(crate) fn probe_region(
        &self,
        at: usize,
        p: Participant,
        clock: &VectorClock,
    ) -> (bool, bool) {
        let Some(&OpAccess {
            gen: g,
            kind,
            offset,
            end,
        }) = self.op_accesses.get(at)
        else {
            return (false, false);
        };
        let Some(gen) = self.gens[g.0 as usize].as_ref() else {
            return (false, false);
        };
        if offset >= end {
            return (false, false);
        }
        let probe = Probe {
            participant: p,
            clock,
            writes: kind.writes(),
            offset,
            end,
        };
        let hits = |a: &Access| probe.conflicts(a) && a.overlaps(offset, end);
        let h = &gen.history;
        let race = match h.rest.as_deref() {
            Some(crate::shadow::Rest {
                index: Some(ix), ..
            }) => {
                let mut found = false;
                ix.for_each(offset, end, |e| found = found || hits(&e.access));
                found
            }
            _ => h.accesses.iter().any(hits) || h.covered().iter().any(hits),
        };
        let Some(base) = gen.addr() else {
            return (race, false);
        };
        let (lo, hi) = (base + offset, base + end.min(gen.size().unwrap_or(0)));
        if lo >= hi {
            return (race, false);
        }
        let mut reuse = gen.reuse().iter().any(|rec| {
            rec.entries.iter().any(|a| {
                let (s, e) = rec.range(a);
                s < hi && lo < e && probe.conflicts(a)
            })
        });
        if !reuse && gen.reuse_large() {
            self.graveyard
                .large_ref(gen.memory)
                .for_each(lo, hi, |e| reuse = reuse || probe.conflicts(&e.access));
        }
        (race, reuse)
    }
}

/// A region both read and written counts as written; the same region twice counts once.
fn dedup_accesses(v: &mut Vec<OpAccess>) {
    if v.len() < 2 {
        return;
    }
    if v.len() <= 16 {
        let mut k = 0;
        while k < v.len() {
            let a = v[k];
            let dup = v[..k].iter().any(|b| {
                b.gen == a.gen
                    && b.offset == a.offset
                    && b.end == a.end
                    && (b.kind == a.kind || b.kind.writes())
            });
            if dup {
                v.remove(k);
            } else {
                k += 1;
            }
        }
        return;
    }
    // Many regions: the kinds seen so far per region (bit 0 read, bit 1 write).
    let mut seen: HashMap<(GenId, u64, u64), u8> = HashMap::default();
    v.retain(|a| {
        let bit = if a.kind.writes() { 2 } else { 1 };
        let kinds = seen.entry((a.gen, a.offset, a.end)).or_insert(0);
        let dup = *kinds & bit != 0 || *kinds & 2 != 0;
        *kinds |= bit;
        !dup
    });
}

fn conflict_of(
    order: &Order,
    labels: &[Arc<str>],
    graphs: &graphs::Graphs,
    a: &Access,
    buffer: &Id,
) -> Conflict {
    let captured = graphs.captured_op(a.captured);
    Conflict {
        op: a.op,
        participant: order.name(a.participant).to_string(),
        access: a.kind,
        buffer: buffer.to_string(),
        offset: a.offset,
        bytes: bytes_of(a.offset, a.end),
        site: a.site.clone(),
        captured: captured.map(|c| c.op),
        captured_site: captured.and_then(|c| c.site.clone()),
        label: a
            .label
            .checked_sub(1)
            .and_then(|k| labels.get(k as usize).cloned()),
        epoch: Some(a.epoch()),
    }
}

/// The latest op of each participant among `accesses` (for a replay's participant, the latest
/// captured op of its latest launch: [`Access::order_key`]).
fn latest_ops<'a>(accesses: impl Iterator<Item = &'a Access>) -> Vec<(Participant, (u64, u32))> {
    let mut v: Vec<(Participant, (u64, u32))> = Vec::new();
    for a in accesses {
        let p = a.participant;
        match v.iter_mut().find(|(q, _)| *q == p) {
            Some(e) => e.1 = e.1.max(a.order_key()),
            None => v.push((p, a.order_key())),
        }
    }
    v
}

/// Whether `a` is an access of its participant's latest op in `latest`.
fn is_latest(latest: &[(Participant, (u64, u32))], a: &Access) -> bool {
    latest
        .iter()
        .any(|&(p, key)| p == a.participant && key == a.order_key())
}

fn conflict_order(a: &Conflict, b: &Conflict) -> std::cmp::Ordering {
    (a.op, a.captured, &a.buffer, a.offset, a.bytes, a.access)
        .cmp(&(b.op, b.captured, &b.buffer, b.offset, b.bytes, b.access))
}

fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [a] => a.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// The minimal synchronization that orders every earlier access before op `i` on `p`.
fn fix_wait(order: &Order, i: u64, p: Participant, conflicts: &[Conflict]) -> String {
    fix_wait_on(order.name(p), i, conflicts)
}

/// The minimal synchronization that orders every earlier access before op `i` on the
/// participant named `later`.
fn fix_wait_on(later: &str, i: u64, conflicts: &[Conflict]) -> String {
    let latest = latest_by_participant(conflicts);
    if later == crate::trace::HOST {
        let parts: Vec<String> = latest
            .iter()
            .map(|(q, op)| format!("{q} after op {op}"))
            .collect();
        return format!(
            "make the host wait for {} before op {i}: record an event there and event_sync it, or stream_sync the stream",
            list(&parts)
        );
    }
    let parts: Vec<String> = latest
        .iter()
        .map(|(q, op)| format!("on {q} after op {op}"))
        .collect();
    let them = if latest.len() == 1 { "it" } else { "them" };
    let event = if latest.len() == 1 {
        "an event"
    } else {
        "events"
    };
    format!(
        "record {event} {} and make {later} wait on {them} before op {i}",
        list(&parts)
    )
}

fn fix_race(
    order: &Order,
    kind: HazardKind,
    i: u64,
    p: Participant,
    conflicts: &[Conflict],
    free: Option<&FreeRef>,
) -> String {
    fix_race_on(order.name(p), kind, i, conflicts, free, true)
}

/// [`fix_race`] for the participant named `later`; `record_stream` is suggested only with
/// `record_stream`.
fn fix_race_on(
    later: &str,
    kind: HazardKind,
    i: u64,
    conflicts: &[Conflict],
    free: Option<&FreeRef>,
    record_stream: bool,
) -> String {
    if kind == HazardKind::ReuseRace && record_stream {
        if let Some(f) = free {
            // record_stream is the allocator's own fix when every earlier access is by a stream
            // other than the old buffer's owner; otherwise order the access directly.
            let streams: Vec<String> = latest_by_participant(conflicts)
                .iter()
                .filter(|(q, _)| *q != crate::trace::HOST)
                .map(|(q, _)| q.to_string())
                .collect();
            let recordable = conflicts
                .iter()
                .all(|c| c.participant != crate::trace::HOST && c.access != AccessKind::Alloc);
            if recordable && conflicts.iter().all(|c| c.buffer == f.buffer) {
                return format!(
                    "call record_stream({}, {}) before its free at op {} so its memory is not reused while that work runs, or {}",
                    f.buffer,
                    list(&streams),
                    f.op,
                    fix_wait_on(later, i, conflicts)
                );
            }
        }
    }
    fix_wait_on(later, i, conflicts)
}

/// Of `streams`, the ones to name by `record_stream` at a free, now, so that every conflict is
/// ordered before the reuse of the memory: a stream is left out when the clocks of the others
/// kept cover all of its conflicts (`record_stream` orders what the named stream had
/// synchronized with by the free, not only its own work). Each stream kept is needed given the
/// others; with none left out, `streams` in order.
pub(crate) fn fewest_record_streams(
    order: &Order,
    streams: &[String],
    conflicts: &[Conflict],
) -> Vec<String> {
    let clock_of = |p: &str| {
        order
            .find_stream(&Id::from(p))
            .map(|q| order.clock(q).clone())
            .unwrap_or_default()
    };
    let mut kept = streams.to_vec();
    let mut k = 0;
    while k < kept.len() {
        let mut others = VectorClock::new();
        for (j, q) in kept.iter().enumerate() {
            if j != k {
                others.join(&clock_of(q));
            }
        }
        let covered = conflicts
            .iter()
            .filter(|c| c.participant == kept[k])
            .all(|c| c.epoch.is_some_and(|e| others.covers(e)));
        if covered {
            kept.remove(k);
        } else {
            k += 1;
        }
    }
    kept
}

#[allow(clippy::too_many_arguments)]
fn fix_unsafe_free(
    order: &Order,
    buffer: &Id,
    i: u64,
    by: Participant,
    stream_ordered: bool,
    memory: MemoryKind,
    owner: Participant,
    conflicts: &[Conflict],
) -> String {
    let streams: Vec<String> = latest_by_participant(conflicts)
        .iter()
        .filter(|(q, _)| {
            *q != crate::trace::HOST && (memory != MemoryKind::Device || *q != order.name(owner))
        })
        .map(|(q, _)| q.to_string())
        .collect();
    let all_recordable = !stream_ordered
        && conflicts.iter().all(|c| {
            c.participant != crate::trace::HOST
                && (memory != MemoryKind::Device || c.participant != order.name(owner))
        });
    if all_recordable && !streams.is_empty() {
        let streams = fewest_record_streams(order, &streams, conflicts);
        format!(
            "call record_stream({buffer}, {}) before the free at op {i}, or {}",
            list(&streams),
            fix_wait(order, i, by, conflicts)
        )
    } else {
        fix_wait(order, i, by, conflicts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::SplitMix;

    thread_local! {
        pub(super) static WEAK_NAME_HASH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A random program over names of one length: allocations, frees, accesses, uses after
    /// free, external buffers.
    fn program(seed: u64) -> Vec<TraceOp> {
        let mut rng = SplitMix::new(seed);
        let mut live = [false; 6];
        let mut ops = Vec::new();
        for _ in 0..300 {
            let k = rng.below(6) as usize;
            let name = Id::from(format!("b{k}"));
            let stream = Id::from(format!("s{}", rng.below(3)));
            let op = match rng.below(7) {
                4 => Op::EventRecord {
                    event: Id::from(format!("e{}", rng.below(2))),
                    stream,
                },
                5 => Op::EventWait {
                    stream,
                    event: Id::from(format!("e{}", rng.below(2))),
                },
                6 if rng.below(8) == 0 => Op::StreamSync { stream },
                0 if !live[k] && k < 4 => {
                    live[k] = true;
                    Op::Alloc {
                        buffer: name,
                        bytes: 512,
                        stream: Some(stream),
                        memory: MemoryKind::Device,
                        addr: None,
                    }
                }
                1 => {
                    live[k] = false;
                    Op::Free {
                        buffer: name,
                        stream: None,
                    }
                }
                _ => {
                    let offset = 8 * rng.below(60);
                    Op::Launch {
                        stream,
                        name: None,
                        reads: vec![Region::whole(name.clone())],
                        writes: if rng.below(2) == 0 {
                            vec![Region::range(name, offset, 8 * rng.below(8))]
                        } else {
                            vec![]
                        },
                    }
                }
            };
            ops.push(TraceOp::from(op));
        }
        ops
    }

    fn report(ops: &[TraceOp]) -> String {
        report_with(ops, Limits::default())
    }

    fn report_with(ops: &[TraceOp], limits: Limits) -> String {
        let mut c = Checker::with_limits(limits);
        for op in ops {
            if c.check(op).is_err() {
                break;
            }
        }
        c.finish().to_json()
    }

    /// Names whose hashes clash resolve exactly as names whose hashes do not.
    #[test]
    fn clashing_name_hashes() {
        let mut all = String::new();
        for seed in 0..40 {
            let ops = program(seed);
            let plain = report(&ops);
            WEAK_NAME_HASH.with(|w| w.set(true));
            let weak = report(&ops);
            WEAK_NAME_HASH.with(|w| w.set(false));
            assert_eq!(plain, weak, "seed {seed}");
            all.push_str(&plain);
        }
        for kind in ["data-race", "reuse-race", "use-after-free", "invalid-free"] {
            assert!(all.contains(kind), "no {kind} in the programs");
        }
    }

    /// Every representation of histories and tombstones gives the same reports, with sweeps after
    /// every op or after a few, so that histories move into the index and back.
    #[test]
    fn limits_change_no_report() {
        for seed in 0..60 {
            let ops = program(1000 + seed);
            let plain = report(&ops);
            for limits in [
                Limits {
                    history_index_at: 0,
                    small_freed_pages: 0,
                    sweep_at: 0,
                },
                Limits {
                    history_index_at: 3,
                    small_freed_pages: 64,
                    sweep_at: 8,
                },
            ] {
                assert_eq!(plain, report_with(&ops, limits), "seed {seed}, {limits:?}");
            }
        }
    }
}
