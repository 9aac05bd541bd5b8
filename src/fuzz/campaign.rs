//! Fuzz campaigns: generate programs, check them, execute them under random and adversarial
//! schedules, and hold the checker's verdicts against what the executions did.
//!
//! For every program the campaign runs the checker, the sequential reference, a few random
//! schedules and, for every reported `data-race`, `reuse-race` and `unsafe-free`, a provocation:
//! a schedule steered so that the hazard's earlier accesses land after its later one (for an
//! unsafe free, the freed memory is first allocated again and overwritten on the freeing stream).
//! A hazard is *confirmed* when the provoked run observes different data in one of the hazard's
//! buffers. A program is *unexplained* when some run's data differ from the reference and no
//! reported hazard names a buffer whose data differ — a hazard the checker missed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::checker::Checker;
use crate::exec::{sim, ExecError, Outcome};
use crate::fuzz::gen::{generate, GenConfig};
use crate::report::{AccessKind, Confirmation, Hazard, HazardKind, Report};
use crate::trace::{Id, MemoryKind, Op, Region, TraceOp, TraceWriter, DEFAULT_STREAM};
use crate::workload::SplitMix;

/// The simulated device as an executor.
pub use crate::exec::sim::SimExecutor;
/// Executes programs: the simulator, or a GPU (the execution layer's program runners).
pub use crate::exec::Executor;

/// Knobs of a campaign.
#[derive(Clone, Debug)]
pub struct CampaignConfig {
    /// Number of programs.
    pub cases: u64,
    /// Seed of the whole campaign.
    pub seed: u64,
    /// The program generator's knobs.
    pub gen: GenConfig,
    /// Random schedules per program.
    pub random_schedules: u32,
    /// Provocation attempts per hazard (stops at the first that observes corruption).
    pub attempts: u32,
    /// Where counterexamples are written.
    pub out_dir: PathBuf,
    /// Also write up to this many programs with a hazard that no provocation confirmed.
    pub keep_unconfirmed: usize,
}

impl Default for CampaignConfig {
    fn default() -> Self {
        CampaignConfig {
            cases: 100,
            seed: 0,
            gen: GenConfig::default(),
            random_schedules: 3,
            attempts: 3,
            out_dir: PathBuf::from("streamsan-counterexamples"),
            keep_unconfirmed: 0,
        }
    }
}

/// The summary `streamsan fuzz --json` prints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Programs run.
    pub programs: u64,
    /// Programs with at least one hazard of severity error.
    pub with_hazards: u64,
    /// Reported data-race, reuse-race and unsafe-free hazards.
    pub hazards: u64,
    /// Of those, the ones whose provocation observed corruption.
    pub confirmed: u64,
    /// Programs whose data differed from the reference with no hazard on a differing buffer.
    pub unexplained: u64,
    /// Trace files of the unexplained programs, shrunk.
    pub counterexamples: Vec<String>,
}

/// Per-kind confirmation counts, for the text summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindCounts {
    /// Hazards of this kind.
    pub hazards: u64,
    /// Confirmed ones.
    pub confirmed: u64,
}

/// A campaign's full result.
#[derive(Clone, Debug, Default)]
pub struct CampaignResult {
    /// The summary.
    pub summary: Summary,
    /// data-race, unsafe-free, reuse-race counts.
    pub by_kind: [KindCounts; 3],
    /// Of those, the hazards of graph replays: an access or a conflict of a replayed op.
    pub in_graphs: KindCounts,
    /// Simulated or device runs made.
    pub runs: u64,
    /// Trace files of programs with unconfirmed hazards (see `keep_unconfirmed`).
    pub unconfirmed: Vec<String>,
}

fn provokable(kind: HazardKind) -> Option<usize> {
    match kind {
        HazardKind::DataRace => Some(0),
        HazardKind::UnsafeFree => Some(1),
        HazardKind::ReuseRace => Some(2),
        _ => None,
    }
}

/// Whether a hazard involves a graph replay: its access or a conflict is a replayed op.
pub fn in_graph(h: &Hazard) -> bool {
    h.access.as_ref().is_some_and(|a| a.captured.is_some())
        || h.conflicts.iter().any(|c| c.captured.is_some())
}

/// The buffers a hazard speaks of: its own, its conflicts', its free's.
pub fn hazard_buffers(h: &Hazard) -> BTreeSet<Id> {
    let mut s: BTreeSet<Id> = h
        .conflicts
        .iter()
        .map(|c| Id::from(c.buffer.clone()))
        .collect();
    s.extend(h.buffer.iter().map(|b| Id::from(b.clone())));
    s.extend(h.free.iter().map(|f| Id::from(f.buffer.clone())));
    s
}

/// Checks a program; `None` if the checker rejects it as bad input.
pub fn check_program(program: &[TraceOp]) -> Option<Report> {
    let mut c = Checker::new();
    for op in program {
        c.check(op).ok()?;
    }
    Some(c.finish())
}

/// The op that carries the epoch of an `alloc` conflict: the latest launch, copy or memset on
/// the owning stream before the allocation.
fn alloc_epoch_op(program: &[TraceOp], alloc: usize, stream: &str) -> Option<usize> {
    (0..alloc).rev().find(|&k| {
        let op = &program[k].op;
        op.is_access() && op.on_stream().is_some_and(|s| s.as_str() == stream)
    })
}

/// The op number a schedule knows an access by: the op itself, or for the replay of captured op
/// `captured` by the `graph_launch` at `op`, that replayed op's number
/// ([`crate::exec::ReplayNumbering`]).
fn schedule_op(
    numbering: &Option<crate::exec::ReplayNumbering>,
    op: usize,
    captured: Option<usize>,
) -> usize {
    match (numbering, captured) {
        (Some(n), Some(m)) => n.id(op, m).unwrap_or(op),
        _ => op,
    }
}

/// The replay numbering of `program`, if it has graph ops.
fn numbering_of(program: &[TraceOp]) -> Option<crate::exec::ReplayNumbering> {
    program
        .iter()
        .any(|t| t.op.is_graph_op())
        .then(|| crate::exec::replay_numbering(program))
}

/// The holds of a provocation as `exec` takes them: a backend that does not schedule replayed
/// ops one by one ([`Executor::holds_replayed_ops`]) holds the launch instead.
pub fn holds_for(
    exec: &dyn Executor,
    program: &[TraceOp],
    holds: &[(usize, usize)],
) -> Vec<(usize, usize)> {
    if exec.holds_replayed_ops() {
        return holds.to_vec();
    }
    match numbering_of(program) {
        Some(n) => holds
            .iter()
            .map(|&(a, b)| (n.trace_op(a), n.trace_op(b)))
            .filter(|(a, b)| a != b)
            .collect(),
        None => holds.to_vec(),
    }
}

/// How to make a hazard manifest.
#[derive(Clone, Debug)]
pub struct Provocation {
    /// The program to run: the original, or one extended to reuse freed memory.
    pub program: Vec<TraceOp>,
    /// `(held, until)` pairs of op numbers that steer the schedule: op indices, and for an access
    /// of a graph replay, its replayed op's number on the simulator ([`holds_for`] makes them
    /// launches for a backend that runs a replay as a whole).
    pub holds: Vec<(usize, usize)>,
    /// The buffers whose data show the corruption: the hazard's, and any the provocation added.
    pub watch: BTreeSet<Id>,
}

/// How to provoke a hazard.
pub fn provocation(program: &[TraceOp], h: &Hazard) -> Result<Provocation, String> {
    let at = h.op as usize;
    let held = |c: &crate::report::Conflict| -> Option<usize> {
        if c.access == AccessKind::Alloc {
            alloc_epoch_op(program, c.op as usize, &c.participant)
        } else {
            Some(c.op as usize)
        }
    };
    match h.kind {
        HazardKind::DataRace | HazardKind::ReuseRace => {
            // A conflict with an allocation manifests only if the memory was in use just
            // before: make it so. Before the allocation, a temporary of the same size on the
            // owning stream is written and freed, so the allocation reuses its block; that write
            // is held until the hazard's access is done, and lands in the new buffer.
            let mut p = program.to_vec();
            let mut holds = Vec::new();
            let mut inserted: Vec<usize> = Vec::new();
            let mut allocs: Vec<&crate::report::Conflict> = h
                .conflicts
                .iter()
                .filter(|c| c.access == AccessKind::Alloc)
                .collect();
            allocs.sort_by_key(|c| std::cmp::Reverse(c.op));
            allocs.dedup_by_key(|c| c.op);
            for c in &allocs {
                let a = c.op as usize;
                let Op::Alloc {
                    buffer,
                    bytes,
                    stream,
                    memory,
                    addr,
                    pool,
                } = &program[a].op
                else {
                    continue;
                };
                let tmp = Id::from(format!("{buffer}.previous"));
                // With addresses given, the temporary takes the allocation's own bytes (they are
                // free just before it); from the same pool, when the allocation names one.
                let ops = [
                    Op::Alloc {
                        buffer: tmp.clone(),
                        bytes: *bytes,
                        stream: stream.clone(),
                        memory: *memory,
                        addr: *addr,
                        pool: pool.clone(),
                    },
                    Op::Launch {
                        stream: Id::from(c.participant.clone()),
                        name: Some("previous-user".into()),
                        reads: vec![],
                        writes: vec![Region::whole(tmp.clone())],
                    },
                    Op::Free {
                        buffer: tmp,
                        stream: None,
                    },
                ];
                for (k, op) in ops.into_iter().enumerate() {
                    p.insert(a + k, op.into());
                }
                inserted.push(a);
            }
            // Op indices after an insertion point shift by 3 per insertion before them.
            let shift = |i: usize| i + 3 * inserted.iter().filter(|&&a| a <= i).count();
            let numbering = numbering_of(&p);
            let point = |op: u64, captured: Option<u64>| {
                schedule_op(
                    &numbering,
                    shift(op as usize),
                    captured.map(|m| shift(m as usize)),
                )
            };
            let at2 = point(h.op, h.access.as_ref().and_then(|a| a.captured));
            for &a in &inserted {
                holds.push((shift(a) - 3 + 1, at2));
            }
            for c in h.conflicts.iter().filter(|c| c.access != AccessKind::Alloc) {
                holds.push((point(c.op, c.captured), at2));
            }
            if holds.is_empty() {
                return Err(NOTHING_TO_HOLD.into());
            }
            Ok(Provocation {
                program: p,
                holds,
                watch: hazard_buffers(h),
            })
        }
        HazardKind::UnsafeFree => {
            // Allocate the same size right after the free, on the stream the block goes back to,
            // and overwrite it; hold the unordered accesses until that write is done. (They come
            // before the free: inserting after it moves none of them.)
            let numbering = numbering_of(program);
            let outer_held = held;
            let held = |c: &crate::report::Conflict| -> Option<usize> {
                outer_held(c).map(|op| schedule_op(&numbering, op, c.captured.map(|m| m as usize)))
            };
            let unknown = || "the freed buffer's allocation is not in the trace".to_string();
            let name = h.buffer.as_ref().ok_or_else(unknown)?;
            let (bytes, memory, addr) = program[..at]
                .iter()
                .rev()
                .find_map(|op| match &op.op {
                    Op::Alloc {
                        buffer,
                        bytes,
                        memory,
                        addr,
                        ..
                    } if buffer.as_str() == name => Some((*bytes, *memory, *addr)),
                    _ => None,
                })
                .ok_or_else(unknown)?;
            let by = h.access.as_ref().ok_or_else(unknown)?.participant.clone();
            if let Some(a) = addr.filter(|_| bytes > 0) {
                // The program places its memory: a buffer of its own may take these bytes later,
                // and one put here would share them with it. When the program writes such a
                // buffer, that write is the reuse to corrupt.
                if let Some((reuser, until)) =
                    reuse_in_program(program, at, memory, a, a + bytes, &by)?
                {
                    let holds: Vec<(usize, usize)> = h
                        .conflicts
                        .iter()
                        .filter_map(held)
                        .map(|y| (y, until))
                        .collect();
                    let mut watch = hazard_buffers(h);
                    watch.insert(reuser);
                    if holds.is_empty() {
                        return Err(NOTHING_TO_HOLD.into());
                    }
                    return Ok(Provocation {
                        program: program.to_vec(),
                        holds,
                        watch,
                    });
                }
            }
            let fresh = Id::from(format!("{name}.reused"));
            let mut p = program.to_vec();
            let (alloc, write) = if memory == MemoryKind::Device {
                (
                    Op::Alloc {
                        buffer: fresh.clone(),
                        bytes,
                        stream: Some(Id::from(by.clone())),
                        memory,
                        addr,
                        pool: None,
                    },
                    Op::Launch {
                        stream: Id::from(by),
                        name: Some("provoke".into()),
                        reads: vec![],
                        writes: vec![Region::whole(fresh)],
                    },
                )
            } else {
                (
                    Op::Alloc {
                        buffer: fresh.clone(),
                        bytes,
                        stream: None,
                        memory,
                        addr,
                        pool: None,
                    },
                    Op::HostWrite {
                        buffer: Region::whole(fresh),
                    },
                )
            };
            p.insert(at + 1, alloc.into());
            p.insert(at + 2, write.into());
            // Replayed ops are numbered after the program's ops: after the two inserted here.
            let numbering = numbering_of(&p);
            let holds: Vec<(usize, usize)> = h
                .conflicts
                .iter()
                .filter_map(|c| {
                    outer_held(c)
                        .map(|op| schedule_op(&numbering, op, c.captured.map(|m| m as usize)))
                })
                .map(|y| (y, at + 2))
                .collect();
            let mut watch = hazard_buffers(h);
            watch.insert(Id::from(format!("{name}.reused")));
            if holds.is_empty() {
                return Err(NOTHING_TO_HOLD.into());
            }
            Ok(Provocation {
                program: p,
                holds,
                watch,
            })
        }
        kind => Err(format!("{kind} is not a race between two accesses")),
    }
}

/// What a provocation holds its accesses back for when there is none.
const NOTHING_TO_HOLD: &str =
    "no unordered access to hold back (its conflicts happen before everything the provocation can delay)";

/// With placed memory: the first buffer allocated after op `at` on bytes `[start, end)` of
/// `memory` (freed by `by`) and its first write; `None` when no later buffer takes those bytes.
/// An error says why the program's own reuse cannot show the corruption: device memory that
/// comes back on another stream than `by` went back to the driver, which synchronized the
/// device first, or the buffer is never written.
fn reuse_in_program(
    program: &[TraceOp],
    at: usize,
    memory: MemoryKind,
    start: u64,
    end: u64,
    by: &str,
) -> Result<Option<(Id, usize)>, String> {
    let found = program
        .iter()
        .enumerate()
        .skip(at + 1)
        .find_map(|(k, op)| match &op.op {
            Op::Alloc {
                buffer,
                bytes,
                memory: m,
                addr: Some(a),
                stream,
                ..
            } if *m == memory && *a < end && start < a.saturating_add(*bytes) => {
                Some((k, buffer.clone(), stream.clone()))
            }
            _ => None,
        });
    let Some((k, name, stream)) = found else {
        return Ok(None);
    };
    let owner = stream.as_ref().map_or(DEFAULT_STREAM, |s| s.as_str());
    if memory == MemoryKind::Device && owner != by {
        return Err(format!(
            "the trace hands these bytes out again only to {name} on stream {owner} (op {k}), after the device synchronization that memory coming back from another stream implies: this run cannot corrupt them"
        ));
    }
    let writes = |op: &Op| op.accesses().any(|a| a.write && a.region.buffer == name);
    let until = program
        .iter()
        .enumerate()
        .skip(k + 1)
        .take_while(|(_, op)| !matches!(&op.op, Op::Free { buffer, .. } if *buffer == name))
        .find(|(_, op)| writes(&op.op))
        .ok_or_else(|| {
            format!("the trace's next buffer at these bytes, {name} (op {k}), is never written")
        })?
        .0;
    Ok(Some((name, until)))
}

/// The buffers whose corruption a hazard explains in `program`: those it names and, for each
/// conflict with an allocation, the buffers freed before that allocation that its stream had
/// accessed. An allocation's use carries the epoch of its stream's latest work (spec: "The
/// allocation is a use"), so a report naming the allocation as the latest conflicting op stands
/// for that work too, on whatever earlier buffer held the memory the allocation handed out.
fn explained_by(program: &[TraceOp], h: &Hazard) -> BTreeSet<Id> {
    let mut s = hazard_buffers(h);
    for c in h.conflicts.iter().filter(|c| c.access == AccessKind::Alloc) {
        let Ok(at) = usize::try_from(c.op) else {
            continue;
        };
        let before = &program[..at.min(program.len())];
        let freed: BTreeSet<&Id> = before
            .iter()
            .filter_map(|op| match &op.op {
                Op::Free { buffer, .. } => Some(buffer),
                _ => None,
            })
            .collect();
        for op in before {
            if op
                .op
                .on_stream()
                .is_none_or(|s| s.as_str() != c.participant)
            {
                continue;
            }
            for a in op.op.accesses() {
                if freed.contains(&a.region.buffer) {
                    s.insert(a.region.buffer.clone());
                }
            }
        }
    }
    s
}

/// Whether a program's runs are explained by its report: every divergent run touches a buffer
/// some hazard names (or, through an allocation's use, stands for; see `explained_by`). Returns
/// the buffers of an unexplained divergence.
pub fn unexplained(
    program: &[TraceOp],
    report: &Report,
    reference: &Outcome,
    outcome: &Outcome,
) -> Option<Vec<Id>> {
    let diverging = outcome.diverging(reference);
    if diverging.is_empty() {
        return None;
    }
    let named: BTreeSet<Id> = report
        .hazards
        .iter()
        .filter(|h| h.is_error())
        .flat_map(|h| explained_by(program, h))
        .collect();
    if diverging.iter().any(|b| named.contains(b)) {
        None
    } else {
        Some(diverging)
    }
}

/// Runs a campaign; `progress` is called after each program.
pub fn run_campaign(
    cfg: &CampaignConfig,
    exec: &mut dyn Executor,
    mut progress: impl FnMut(u64, &Summary),
) -> Result<CampaignResult, String> {
    let mut res = CampaignResult::default();
    let mut seeds = SplitMix::new(cfg.seed);
    for case in 0..cfg.cases {
        let case_seed = seeds.next_u64();
        let program = generate(&cfg.gen, &mut SplitMix::new(case_seed)).ops;
        let report = check_program(&program)
            .ok_or_else(|| format!("case {case}: the generator made bad input"))?;
        let sim_err = |e: ExecError| format!("case {case} (seed {case_seed}): {e}");
        let reference = exec.reference(&program).map_err(sim_err)?;
        res.runs += 1;
        res.summary.programs += 1;
        if !report.is_clean() {
            res.summary.with_hazards += 1;
        }
        let mut bad = None;
        for k in 0..cfg.random_schedules {
            let o = exec
                .random(&program, case_seed ^ u64::from(k + 1))
                .map_err(sim_err)?;
            res.runs += 1;
            if let Some(b) = unexplained(&program, &report, &reference, &o) {
                bad = Some((b, u64::from(k + 1)));
                break;
            }
        }
        for h in &report.hazards {
            let Some(slot) = provokable(h.kind) else {
                continue;
            };
            res.summary.hazards += 1;
            res.by_kind[slot].hazards += 1;
            let graph = in_graph(h);
            res.in_graphs.hazards += u64::from(graph);
            let Some(Provocation {
                program: p,
                holds,
                watch: buffers,
            }) = provocation(&program, h).ok()
            else {
                continue;
            };
            let p_ref = if p.len() == program.len() {
                reference.clone()
            } else {
                exec.reference(&p).map_err(sim_err)?
            };
            let holds = holds_for(exec, &p, &holds);
            let mut confirmed = false;
            for a in 0..cfg.attempts {
                let o = exec
                    .provoke(&p, &holds, case_seed.wrapping_add(u64::from(a)))
                    .map_err(sim_err)?;
                res.runs += 1;
                if o.diverging(&p_ref).iter().any(|b| buffers.contains(b)) {
                    res.summary.confirmed += 1;
                    res.by_kind[slot].confirmed += 1;
                    res.in_graphs.confirmed += u64::from(graph);
                    confirmed = true;
                    break;
                }
                if p.len() == program.len() && bad.is_none() {
                    if let Some(b) = unexplained(&program, &report, &reference, &o) {
                        bad = Some((b, 0));
                    }
                }
            }
            if !confirmed && res.unconfirmed.len() < cfg.keep_unconfirmed {
                let why = format!(
                    "unconfirmed: {} at op {} on {} (conflicts at ops {:?}); provoked with holds {:?}\n",
                    h.kind,
                    h.op,
                    h.buffer.as_deref().unwrap_or("-"),
                    h.conflicts.iter().map(|c| c.op).collect::<Vec<_>>(),
                    holds
                );
                let path = write_trace(
                    &cfg.out_dir,
                    &format!("unconfirmed-{case}-op{}-{}.jsonl", h.op, h.kind),
                    &p,
                    &why,
                )?;
                res.unconfirmed.push(path.display().to_string());
            }
        }
        if let Some((buffers, _)) = bad {
            res.summary.unexplained += 1;
            let shrunk = shrink(
                &program,
                exec,
                case_seed,
                cfg.random_schedules,
                cfg.gen.initialize,
            );
            write_trace(
                &cfg.out_dir,
                &format!("unexplained-{case}.original.jsonl"),
                &program,
                "streamsan fuzz counterexample, as generated (before shrinking)",
            )?;
            let path = write_counterexample(&cfg.out_dir, case, &shrunk, &buffers)?;
            res.summary.counterexamples.push(path.display().to_string());
        }
        progress(case + 1, &res.summary);
    }
    Ok(res)
}

/// Whether some random schedule of `program` diverges with no hazard on a diverging buffer.
fn still_unexplained(
    program: &[TraceOp],
    exec: &mut dyn Executor,
    seed: u64,
    schedules: u32,
) -> bool {
    let Some(report) = check_program(program) else {
        return false;
    };
    let Ok(reference) = exec.reference(program) else {
        return false;
    };
    (0..schedules.max(1) * 4).any(|k| {
        exec.random(program, seed ^ u64::from(k + 1))
            .is_ok_and(|o| unexplained(program, &report, &reference, &o).is_some())
    })
}

/// Greedy shrinking: drop ops one at a time while the program stays valid and unexplained (and,
/// with `initialized`, reads no memory it has not written, as the simulator's reference shows).
pub fn shrink(
    program: &[TraceOp],
    exec: &mut dyn Executor,
    seed: u64,
    schedules: u32,
    initialized: bool,
) -> Vec<TraceOp> {
    let mut p = program.to_vec();
    let mut k = p.len();
    while k > 0 {
        k -= 1;
        let mut q = p.clone();
        q.remove(k);
        let reads_uninitialized =
            initialized && sim::reference(&q).map_or(true, |o| o.uninitialized > 0);
        if !reads_uninitialized && still_unexplained(&q, exec, seed, schedules) {
            p = q;
        }
    }
    p
}

fn write_counterexample(
    dir: &Path,
    case: u64,
    program: &[TraceOp],
    buffers: &[Id],
) -> Result<PathBuf, String> {
    let names: Vec<&str> = buffers.iter().map(Id::as_str).collect();
    let header = format!(
        "streamsan fuzz counterexample: data differed from the sequential reference in buffers {} with no hazard reported on them",
        names.join(", ")
    );
    write_trace(dir, &format!("unexplained-{case}.jsonl"), program, &header)
}

/// Writes `program` to `dir/name` as a trace, `header` as its first (comment) line.
pub(crate) fn write_trace(
    dir: &Path,
    name: &str,
    program: &[TraceOp],
    header: &str,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    let failed = |e: std::io::Error| format!("{}: cannot write: {e}", path.display());
    let file = crate::output::OutputFile::create(&path).map_err(failed)?;
    let mut w = TraceWriter::new(file);
    w.comment(header).map_err(failed)?;
    for op in program {
        w.write(op).map_err(failed)?;
    }
    w.finish().and_then(|f| f.commit()).map_err(failed)?;
    Ok(path)
}

/// Provokes every hazard of `report`, the check of `trace`, on `exec` (`attempts` runs each) and
/// records in each hazard what was seen ([`Confirmation`]): corruption observed in k of n
/// attempts, or why the provocation did not run. The trace is first made runnable
/// ([`runnable`](crate::fuzz::runnable::runnable)): recorded traces with real addresses,
/// external buffers, pinned and managed memory run as well as generated programs. `progress` is
/// called after each hazard with (done, total).
pub fn confirm_report(
    trace: &[TraceOp],
    report: &mut Report,
    exec: &mut dyn Executor,
    attempts: u32,
    mut progress: impl FnMut(usize, usize),
) {
    let backend = exec.name();
    let skipped = |why: String| Confirmation::Skipped {
        backend,
        skipped: why,
    };
    let runnable = crate::fuzz::runnable::runnable(trace);
    let total = report.hazards.len();
    for (k, h) in report.hazards.iter_mut().enumerate() {
        let c = match (provokable(h.kind), &runnable) {
            (None, _) => skipped(not_provoked(h.kind).to_string()),
            (Some(_), Err(e)) => skipped(format!("the trace cannot be run: {e}")),
            (Some(_), Ok(r)) => {
                let moved = r.hazard(h);
                match confirm(&r.program, &moved, exec, attempts, h.op) {
                    Ok(Ok((observed, attempts))) => Confirmation::Ran {
                        backend,
                        observed,
                        attempts,
                    },
                    Ok(Err(why)) => skipped(why),
                    Err(ExecError::Unsupported { message, .. }) => skipped(message),
                    Err(e) => skipped(e.to_string()),
                }
            }
        };
        h.confirmation = Some(c);
        progress(k + 1, total);
    }
}

/// Why a hazard of a kind that is not a race is not provoked.
fn not_provoked(kind: HazardKind) -> &'static str {
    match kind {
        HazardKind::UseAfterFree => {
            "a use after free is found in the trace itself: the op names a freed buffer, there is no race to provoke"
        }
        HazardKind::InvalidFree => "an invalid free frees nothing: there is no race to provoke",
        _ => "a warning, not a race: there is nothing to provoke",
    }
}

/// Tries to make a reported hazard manifest: runs its provocation `attempts` times and counts
/// the runs whose data in the hazard's buffers differ from the sequential reference. Returns
/// `(observed, attempts)`, or why the hazard cannot be provoked.
pub fn confirm(
    program: &[TraceOp],
    hazard: &Hazard,
    exec: &mut dyn Executor,
    attempts: u32,
    seed: u64,
) -> Result<Result<(u32, u32), String>, ExecError> {
    let p = match provocation(program, hazard) {
        Ok(p) => p,
        Err(why) => return Ok(Err(why)),
    };
    let reference = exec.reference(&p.program)?;
    let mut observed = 0;
    for a in 0..attempts {
        let holds = holds_for(exec, &p.program, &p.holds);
        let o = exec.provoke(&p.program, &holds, seed.wrapping_add(u64::from(a)))?;
        if o.diverging(&reference).iter().any(|b| p.watch.contains(b)) {
            observed += 1;
        }
    }
    Ok(Ok((observed, attempts)))
}
