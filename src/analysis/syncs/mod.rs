//! The synchronization analysis: which synchronization ops a trace's memory safety needs, what
//! each one prevents, and which are redundant (trace format, "Synchronization analysis").
//!
//! # The definition
//!
//! The synchronization ops are `event_wait`, `event_sync`, `event_query` with `complete: true`,
//! `stream_sync`, `stream_query` with `complete: true`, `device_sync` and `record_stream`
//! ([`is_sync`]). One is **needed** when the trace with that op alone replaced by nothing (every
//! other op keeps its index; the op's implicit effects — the host's clock that a stream op
//! joins, the legacy default stream's edges — go with it) has an error, a (kind, op, buffer)
//! triple, that the trace as written does not have; those errors are what it **prevents**.
//! Otherwise it is **redundant**. [`brute_force`] is the definition run as written: one re-check
//! per synchronization op. It is the oracle the tests hold the analysis against.
//!
//! # How it is computed: what-ifs beside one check
//!
//! [`SyncChecker`] checks the trace once and keeps, beside the real state, a *what-if* for each
//! synchronization op whose removal changes something: the state of happens-before with that op
//! removed, held as differences from the real state — the clocks of the participants and the
//! event captures that differ, a `record_stream` stream a live buffer lacks, and tombstones the
//! real free's `record_stream` excused and this one does not. A what-if applies every later op
//! with the real rules to its own clocks, and is retired as soon as nothing differs: from then
//! on every verdict is the real one.
//!
//! - A sync whose join changes nothing (the clock it joins into already covers what it joins,
//!   an unrecorded event on a non-blocking stream, a `record_stream` of a stream already named,
//!   or of the owning stream) leaves the state exactly as it was: redundant at once.
//! - While a what-if lives, each access by a participant whose clock differs there is checked
//!   against the real history and tombstones with that clock (read only: nothing is pruned or
//!   moved), and so is every free whose clock or `record_stream` streams differ; an error found
//!   that the real check did not report at that op is one the sync prevents.
//!
//! **Why this is exact.** Removing a synchronization only removes happens-before edges, so a
//! what-if's clocks are at most the real ones and its errors include the real ones; an error
//! is new exactly when it is found with the what-if's clocks and not with the real ones. The
//! real checker forgets only three kinds of history: what a later access of the same participant
//! subsumes (the argument in `crate::shadow` holds for any happens-before that contains each
//! participant's own order, so for a what-if too), what the host's clock covers, and what a
//! free's `record_stream` excuses. For the second, the checker is told to keep what a what-if's
//! host clock (behind the real one) does not cover ([`Checker::retain`]); for the third, the
//! what-if keeps, as tombstones of its own, what the real free excused and it does not. Covered
//! entries, which the real check scans only after a conflict, are always scanned by a what-if:
//! the ordering that let the real check skip them may be the one removed.
//!
//! **What falls back.** A what-if lives until its differences are overwritten — typically by the
//! next synchronization of the same kind on the same streams — so few are alive at a time. Beyond
//! [`SyncConfig::max_live`] live what-ifs (or [`SyncConfig::max_host`] with a host clock of their
//! own, which every stream op must consult), the oldest is given up, and its op is decided by a
//! re-check of the trace without it ([`recheck`]; [`analyze`] does it).
//!
//! # CUDA graphs
//!
//! Captured ops are part of a graph, not synchronizations of the trace: a captured
//! `event_wait` (including the one that makes a stream join a capture) orders the replay's
//! lanes, not the trace's streams, and is not judged ([`Checker::captures`] says which ops are
//! captured; [`brute_force`] leaves them out too). `graph_begin`, `graph_end` and
//! `graph_launch` are not synchronization ops. The synchronizations around graphs are judged
//! like any other, the replays' hazards counting as errors at their `graph_launch`:
//!
//! - A captured op changes no clock in any what-if (a captured `event_record` leaves its event
//!   never recorded in every what-if, as in the real state).
//! - At a `graph_launch`, a what-if whose entry clock of the replay is the real one (its host's,
//!   the launch stream's and the legacy default stream's edges into it give the real join) and
//!   that has no tombstones replays exactly as the real state does: it is left as it is. Every
//!   other what-if is given up. So no live what-if ever has a replay participant's clock of its
//!   own.
//! - A pool buffer's accesses are checked against the other buffers of its pool, which the
//!   what-ifs' probes do not ask; its free fixes what its `record_stream` streams excuse; and a
//!   `record_stream` of a pool buffer decides where the pool places later allocations of its
//!   capture. A what-if that differs there is given up.
//!
//! A what-if given up is decided by a re-check of the trace without its op, as beyond the
//! limits, so the verdicts stay exact.

mod whatif;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use crate::checker::{CheckError, Checker};
pub use crate::report::syncs::{render_text, ErrorKey, SyncVerdict};
use crate::report::{Hazard, HazardKind, Report, Severity};
use crate::trace::{Op, TraceOp};

use whatif::{Engine, Verdict};

/// Whether `op` is a synchronization op of the analysis: `event_wait`, `event_sync`,
/// `event_query` with `complete: true`, `stream_sync`, `stream_query` with `complete: true`,
/// `device_sync`, `record_stream`.
pub fn is_sync(op: &Op) -> bool {
    matches!(
        op,
        Op::EventWait { .. }
            | Op::EventSync { .. }
            | Op::EventQuery { complete: true, .. }
            | Op::StreamSync { .. }
            | Op::StreamQuery { complete: true, .. }
            | Op::DeviceSync { .. }
            | Op::RecordStream { .. }
    )
}

/// Where the analysis gives up a what-if and leaves the op to a re-check. Verdicts do not
/// depend on these: they trade the cost of what-ifs kept alive against re-checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncConfig {
    /// Live what-ifs at most.
    pub max_live: usize,
    /// Live what-ifs with a host clock of their own at most (each one is consulted by every op
    /// on a stream).
    pub max_host: usize,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            max_live: 1 << 16,
            max_host: 256,
        }
    }
}

/// Counters of the analysis, for benchmarks and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SyncStats {
    /// Synchronization ops whose removal left the state as it was (redundant at once).
    pub unchanged: u64,
    /// Synchronization ops whose removal changed the state: a what-if was started.
    pub changed: u64,
    /// What-ifs started (the same as `changed`, counted where they start).
    pub whatifs: u64,
    /// The most what-ifs alive at once.
    pub peak_live: usize,
    /// What-ifs given up (their ops are decided by a re-check).
    pub abandoned: u64,
    /// Accesses checked again with a what-if's clock (one per region).
    pub probes: u64,
    /// What-ifs advanced over an op that may change them (one per what-if and op).
    pub updates: u64,
}

/// The checker with the synchronization analysis: checks ops one at a time as [`Checker`] does
/// (the same hazards and report), and says at the end which synchronization ops were needed.
///
/// ```
/// use streamsan::analysis::syncs::SyncChecker;
/// use streamsan::trace::TraceReader;
///
/// let trace = r#"
/// {"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
/// {"op":"launch","stream":"s1","writes":["a"]}
/// {"op":"event_record","event":"e","stream":"s1"}
/// {"op":"event_wait","stream":"s2","event":"e"}
/// {"op":"event_wait","stream":"s2","event":"e"}
/// {"op":"launch","stream":"s2","reads":["a"]}
/// "#;
/// let mut reader = TraceReader::new(trace.as_bytes(), "example");
/// let mut checker = SyncChecker::new();
/// while let Some((op, _)) = reader.next_op().unwrap() {
///     checker.check(&op).unwrap();
/// }
/// let outcome = checker.finish();
/// assert!(outcome.report.is_clean());
/// // Each wait alone is redundant: the other one orders the read after the write.
/// assert!(outcome.syncs.iter().all(|s| !s.needed));
/// ```
#[derive(Clone)]
pub struct SyncChecker {
    checker: Checker,
    engine: Engine,
}

impl Default for SyncChecker {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`SyncChecker::finish`] returns.
#[derive(Clone, Debug)]
pub struct SyncOutcome {
    /// The report, as [`Checker::finish`] gives it (without `syncs`).
    pub report: Report,
    /// One verdict per synchronization op, in op order. Those of `undecided` ops are
    /// provisional: `needed` is true where an error was found already, and their `prevents`
    /// may be incomplete.
    pub syncs: Vec<SyncVerdict>,
    /// The op indices whose what-if was given up: [`recheck`] decides them.
    pub undecided: Vec<u64>,
    /// Counters.
    pub stats: SyncStats,
}

impl SyncChecker {
    /// A checker at the start of a trace, with the default [`SyncConfig`].
    pub fn new() -> Self {
        Self::with_config(Checker::new(), SyncConfig::default())
    }

    /// The analysis over `checker` (at the start of a trace), with `config`.
    pub fn with_config(checker: Checker, config: SyncConfig) -> Self {
        SyncChecker {
            checker,
            engine: Engine::new(config),
        }
    }

    /// The real checker.
    pub fn checker(&self) -> &Checker {
        &self.checker
    }

    /// The number of ops checked so far.
    pub fn ops(&self) -> u64 {
        self.checker.ops()
    }

    /// Counters of the analysis so far.
    pub fn stats(&self) -> SyncStats {
        self.engine.stats
    }

    /// Live what-ifs and their tombstones, and the clock components they store.
    pub fn memory(&self) -> (usize, usize, usize) {
        (
            self.engine.live(),
            self.engine.tombstones(),
            self.engine.clock_entries(),
        )
    }

    /// Checks the next op, as [`Checker::check`] does, and advances the analysis.
    pub fn check(&mut self, op: &TraceOp) -> Result<&[Hazard], CheckError> {
        let i = self.checker.ops();
        let first = self.checker.hazards().len();
        let captured = self.checker.captures(&op.op);
        let pre = self.engine.before(&mut self.checker, &op.op, captured);
        self.checker.check(op)?;
        let errors: Vec<(HazardKind, Option<String>)> = self.checker.hazards()[first..]
            .iter()
            .filter(|h| h.severity == Severity::Error)
            .map(|h| (h.kind, h.buffer.clone()))
            .collect();
        self.engine.after(
            &mut self.checker,
            i,
            &op.op,
            op.site.as_ref(),
            pre,
            &errors,
            captured,
        );
        Ok(&self.checker.hazards()[first..])
    }

    /// Ends the trace: the report and a verdict on every synchronization op.
    pub fn finish(self) -> SyncOutcome {
        let stats = self.engine.stats;
        let mut undecided = Vec::new();
        let syncs = self
            .engine
            .verdicts
            .into_iter()
            .map(|v: Verdict| {
                if v.undecided {
                    undecided.push(v.op);
                }
                let mut prevents = v.prevents;
                prevents.sort();
                prevents.dedup();
                SyncVerdict {
                    op: v.op,
                    kind: v.kind,
                    site: v.site,
                    needed: !prevents.is_empty(),
                    prevents,
                }
            })
            .collect();
        SyncOutcome {
            report: self.checker.finish(),
            syncs,
            undecided,
            stats,
        }
    }
}

/// The error keys of a report.
pub fn error_keys(report: &Report) -> BTreeSet<ErrorKey> {
    report
        .hazards
        .iter()
        .filter(|h| h.is_error())
        .map(ErrorKey::of)
        .collect()
}

/// Checks `ops` once for each op index in `skipped`, with that op replaced by nothing, in one
/// walk (one checker per skipped op); returns, for each, the errors that `real` (the trace's
/// own errors) lacks, sorted.
pub fn recheck<I>(
    ops: I,
    skipped: &[u64],
    real: &BTreeSet<ErrorKey>,
) -> Result<Vec<Vec<ErrorKey>>, CheckError>
where
    I: IntoIterator,
    I::Item: std::borrow::Borrow<TraceOp>,
{
    use std::borrow::Borrow;
    let mut variants = Variants::new(skipped, real);
    for op in ops {
        variants.check(op.borrow())?;
    }
    Ok(variants.found())
}

/// The walk of [`recheck`], op by op: one checker per skipped op.
pub(crate) struct Variants<'a> {
    skipped: &'a [u64],
    real: &'a BTreeSet<ErrorKey>,
    checkers: Vec<Checker>,
    found: Vec<BTreeSet<ErrorKey>>,
    /// The index of the next op.
    next: u64,
}

impl<'a> Variants<'a> {
    /// At the start of the trace.
    pub(crate) fn new(skipped: &'a [u64], real: &'a BTreeSet<ErrorKey>) -> Self {
        Variants {
            skipped,
            real,
            checkers: skipped.iter().map(|_| Checker::new()).collect(),
            found: skipped.iter().map(|_| BTreeSet::new()).collect(),
            next: 0,
        }
    }

    /// Checks the next op in every variant (the one that skips it, skips it).
    pub(crate) fn check(&mut self, op: &TraceOp) -> Result<(), CheckError> {
        let i = self.next;
        self.next += 1;
        for (k, c) in self.checkers.iter_mut().enumerate() {
            if self.skipped[k] == i {
                c.skip();
                continue;
            }
            for h in c.check(op)? {
                if h.is_error() {
                    let key = ErrorKey::of(h);
                    if !self.real.contains(&key) {
                        self.found[k].insert(key);
                    }
                }
            }
            // Keep the checkers small: the hazards were looked at.
            let _ = c.take_hazards();
        }
        Ok(())
    }

    /// For each skipped op, the errors its variant adds, sorted.
    pub(crate) fn found(self) -> Vec<Vec<ErrorKey>> {
        self.found
            .into_iter()
            .map(|s| s.into_iter().collect())
            .collect()
    }
}

/// The definition run as written: for each synchronization op, the trace is checked again with
/// that op replaced by nothing ([`Checker::skip`]), and its errors are compared with the trace's
/// own. One full check per synchronization op: the oracle of [`SyncChecker`], not its method.
pub fn brute_force(ops: &[TraceOp]) -> Result<(Report, Vec<SyncVerdict>), CheckError> {
    let mut checker = Checker::new();
    // The synchronization ops: those not captured into a graph's body.
    let mut judged = Vec::new();
    for op in ops {
        judged.push(is_sync(&op.op) && !checker.captures(&op.op));
        checker.check(op)?;
    }
    let report = checker.finish();
    let real = error_keys(&report);
    let mut syncs = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if !judged[i] {
            continue;
        }
        let mut variant = Checker::new();
        for (j, other) in ops.iter().enumerate() {
            if i == j {
                variant.skip();
            } else {
                variant.check(other)?;
            }
        }
        let prevents: Vec<ErrorKey> = error_keys(&variant.finish())
            .into_iter()
            .filter(|k| !real.contains(k))
            .collect();
        syncs.push(SyncVerdict {
            op: i as u64,
            kind: op.op.name(),
            site: op.site.clone().map(Arc::new),
            needed: !prevents.is_empty(),
            prevents,
        });
    }
    Ok((report, syncs))
}

/// The analysis of a whole trace in memory: [`SyncChecker`] over `ops`, with the ops whose
/// what-if was given up decided by [`recheck`].
pub fn analyze(ops: &[TraceOp]) -> Result<(Report, Vec<SyncVerdict>), CheckError> {
    analyze_with(ops, SyncConfig::default())
}

/// [`analyze`] with another [`SyncConfig`].
pub fn analyze_with(
    ops: &[TraceOp],
    config: SyncConfig,
) -> Result<(Report, Vec<SyncVerdict>), CheckError> {
    let mut checker = SyncChecker::with_config(Checker::new(), config);
    for op in ops {
        checker.check(op)?;
    }
    let mut outcome = checker.finish();
    resolve(&mut outcome, |skipped, real| recheck(ops, skipped, real))?;
    Ok((outcome.report, outcome.syncs))
}

/// Decides the undecided ops of `outcome` with `recheck` (given the ops to skip and the trace's
/// own errors, it returns what each variant adds), at most 32 per walk of the trace.
pub fn resolve<E>(
    outcome: &mut SyncOutcome,
    mut recheck: impl FnMut(&[u64], &BTreeSet<ErrorKey>) -> Result<Vec<Vec<ErrorKey>>, E>,
) -> Result<(), E> {
    if outcome.undecided.is_empty() {
        return Ok(());
    }
    let real = error_keys(&outcome.report);
    let undecided = std::mem::take(&mut outcome.undecided);
    for chunk in undecided.chunks(32) {
        let found = recheck(chunk, &real)?;
        for (&op, prevents) in chunk.iter().zip(found) {
            if let Ok(k) = outcome.syncs.binary_search_by_key(&op, |s| s.op) {
                outcome.syncs[k].needed = !prevents.is_empty();
                outcome.syncs[k].prevents = prevents;
            }
        }
    }
    Ok(())
}

/// The verdicts of one site (or of one op without a site), for the text output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteSummary {
    /// The site as reports print it (a stack joined with `" <- "`), or `None` for an op
    /// without a site.
    pub site: Option<String>,
    /// The op names of its synchronization ops, in order of first appearance.
    pub kinds: Vec<&'static str>,
    /// The op indices of its synchronization ops, in order.
    pub ops: Vec<u64>,
    /// How many were needed.
    pub needed: u64,
    /// What the needed ones prevent, sorted (each error once).
    pub prevents: Vec<ErrorKey>,
}

impl SiteSummary {
    /// How many synchronization ops the site issued.
    pub fn count(&self) -> u64 {
        self.ops.len() as u64
    }

    /// How many were redundant.
    pub fn redundant(&self) -> u64 {
        self.count() - self.needed
    }
}

/// The verdicts grouped by site (ops without a site each alone), redundant sites first (every op
/// redundant), then sites with some redundant ops, then sites whose every op was needed; within
/// each group in order of the site's first op.
pub fn by_site(syncs: &[SyncVerdict]) -> Vec<SiteSummary> {
    let mut sites: Vec<SiteSummary> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for v in syncs {
        let key = v.site.as_ref().map(|s| s.to_string());
        let k = match &key {
            Some(s) => *index.entry(s.clone()).or_insert_with(|| {
                sites.push(SiteSummary {
                    site: key.clone(),
                    kinds: Vec::new(),
                    ops: Vec::new(),
                    needed: 0,
                    prevents: Vec::new(),
                });
                sites.len() - 1
            }),
            None => {
                sites.push(SiteSummary {
                    site: None,
                    kinds: Vec::new(),
                    ops: Vec::new(),
                    needed: 0,
                    prevents: Vec::new(),
                });
                sites.len() - 1
            }
        };
        let s = &mut sites[k];
        if !s.kinds.contains(&v.kind) {
            s.kinds.push(v.kind);
        }
        s.ops.push(v.op);
        if v.needed {
            s.needed += 1;
            s.prevents.extend(v.prevents.iter().cloned());
        }
    }
    for s in &mut sites {
        s.prevents.sort();
        s.prevents.dedup();
    }
    let rank = |s: &SiteSummary| match (s.needed, s.redundant()) {
        (0, _) => 0,
        (_, r) if r > 0 => 1,
        _ => 2,
    };
    sites.sort_unstable_by_key(|s| (rank(s), s.ops[0]));
    sites
}

impl SyncOutcome {
    /// The report with its `syncs` (undecided ops must be resolved first: [`resolve`]).
    pub fn into_report(self) -> Report {
        let mut report = self.report;
        report.syncs = Some(self.syncs);
        report
    }
}

/// What [`remove_redundant`] found.
#[derive(Clone, Debug)]
pub struct Removal {
    /// The op indices of the synchronization ops removed, in order.
    pub removed: Vec<u64>,
    /// The number of synchronization ops of the trace.
    pub syncs: u64,
    /// The report of the trace as written.
    pub before: Report,
    /// The report of the trace without the removed ops (op indices of that trace).
    pub after: Report,
}

/// The trace without the synchronization ops that are redundant together: no error of the
/// trace without them is missing from the trace as written (a clean trace stays clean).
///
/// The analysis names the redundant ops, each alone. Removing them all at once is tried first;
/// where that adds an error, the set is split in halves, each half tried on what is left, down
/// to one op at a time — every removal kept is checked. A needed op stays needed once others are
/// gone (removing ops only removes orderings), so the ops left are all needed or were redundant
/// only in company.
pub fn remove_redundant(ops: &[TraceOp]) -> Result<Removal, CheckError> {
    let (before, verdicts) = analyze(ops)?;
    let real = error_keys(&before);
    let syncs = verdicts.len() as u64;
    let candidates: Vec<u64> = verdicts
        .iter()
        .filter(|v| !v.needed)
        .map(|v| v.op)
        .collect();
    let mut removed: BTreeSet<u64> = BTreeSet::new();
    // Whether the trace without `removed` and `more` adds no error. Hazards are reported at the
    // op being checked, so each is compared at its op's index in the trace as written.
    let safe = |removed: &BTreeSet<u64>, more: &[u64]| -> Result<bool, CheckError> {
        let mut c = Checker::new();
        for (i, op) in ops.iter().enumerate() {
            let i = i as u64;
            if removed.contains(&i) || more.binary_search(&i).is_ok() {
                continue;
            }
            for h in c.check(op)? {
                let key = ErrorKey {
                    op: i,
                    ..ErrorKey::of(h)
                };
                if h.is_error() && !real.contains(&key) {
                    return Ok(false);
                }
            }
            let _ = c.take_hazards();
        }
        Ok(true)
    };
    let mut pending = vec![candidates];
    while let Some(chunk) = pending.pop() {
        if chunk.is_empty() {
            continue;
        }
        if safe(&removed, &chunk)? {
            removed.extend(chunk);
        } else if chunk.len() > 1 {
            let (a, b) = chunk.split_at(chunk.len() / 2);
            // The first half is tried first.
            pending.push(b.to_vec());
            pending.push(a.to_vec());
        }
    }
    let kept: Vec<&TraceOp> = ops
        .iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(&(*i as u64)))
        .map(|(_, op)| op)
        .collect();
    let mut c = Checker::new();
    for op in kept {
        c.check(op)?;
    }
    Ok(Removal {
        removed: removed.into_iter().collect(),
        syncs,
        before,
        after: c.finish(),
    })
}
