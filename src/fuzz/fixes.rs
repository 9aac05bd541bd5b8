//! Fix campaigns: generate racy programs, fix them ([`crate::fix`]), and run the fixed programs
//! where the originals went wrong.
//!
//! For every program the campaign checks that the fixed program has no data-race, reuse-race or
//! unsafe-free, keeps every original op in order, and inserts at most two ops per hazard fixed.
//! Then it runs the fixed program: the sequential reference, random schedules, and — for each
//! hazard of the original — that hazard's provocation, the schedule steered to make it manifest,
//! applied to the fixed program. A fixed program with no other error (no use-after-free or
//! invalid-free) must give its reference in every run; a run that does not is a `diverged`
//! program, written as a counterexample trace.

use std::path::Path;

use serde::Serialize;

use crate::exec::ExecError;
use crate::fix::{fix_program, is_fixable, Fixed};
use crate::fuzz::campaign::{check_program, provocation, write_trace, CampaignConfig, Executor};
use crate::fuzz::gen::generate;
use crate::report::Hazard;
use crate::trace::TraceOp;
use crate::workload::SplitMix;

/// The counts of a fix campaign.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FixCampaign {
    /// Programs generated.
    pub programs: u64,
    /// Programs with at least one data-race, reuse-race or unsafe-free.
    pub with_hazards: u64,
    /// Data-race, reuse-race and unsafe-free hazards in the original programs.
    pub hazards: u64,
    /// Of those, how many the fixed programs no longer have.
    pub fixed: u64,
    /// Ops inserted in all.
    pub inserted: u64,
    /// Inserted ops per hazard fixed, over the whole campaign.
    pub per_hazard: f64,
    /// The most ops inserted before one op, per hazard fixed there.
    pub max_per_hazard: f64,
    /// Fixed programs that still have a data-race, reuse-race or unsafe-free (must be 0).
    pub not_fixed: u64,
    /// Fixed programs whose original ops are not all there, in order (must be 0).
    pub reordered: u64,
    /// Fixed programs with more than two inserted ops per hazard at some op (must be 0: the
    /// generator's streams are all on one device).
    pub over_budget: u64,
    /// Fixed programs with no error left, which were run.
    pub run: u64,
    /// Runs of fixed programs (references, random schedules, provocations).
    pub runs: u64,
    /// Of them, provocations of an original hazard on its fixed program.
    pub provocations: u64,
    /// Provocations not run: their extension of the fixed program (memory allocated again and
    /// overwritten) has hazards of its own.
    pub extended_unclean: u64,
    /// Fixed programs whose data differed from their reference in some run (must be 0).
    pub diverged: u64,
    /// Trace files of failing programs (the originals, with what failed in a comment).
    pub counterexamples: Vec<String>,
}

/// Original op index → written op index.
fn index_map(f: &Fixed) -> Vec<u64> {
    let mut map = Vec::with_capacity(f.ops.len() - f.inserted_at.len());
    let mut inserted = f.inserted_at.iter().peekable();
    for i in 0..f.ops.len() {
        if inserted.peek() == Some(&&i) {
            inserted.next();
        } else {
            map.push(i as u64);
        }
    }
    map
}

/// The hazard with its op indices moved to the written program's.
fn moved(h: &Hazard, map: &[u64]) -> Hazard {
    let at = |op: u64| map.get(op as usize).copied().unwrap_or(op);
    let mut h = h.clone();
    h.op = at(h.op);
    if let Some(a) = h.access.as_mut() {
        a.op = at(a.op);
    }
    for c in &mut h.conflicts {
        c.op = at(c.op);
    }
    if let Some(f) = h.free.as_mut() {
        f.op = at(f.op);
    }
    h
}

fn keeps_original(original: &[TraceOp], f: &Fixed, map: &[u64]) -> bool {
    map.len() == original.len()
        && map
            .iter()
            .zip(original)
            .all(|(&i, op)| f.ops.get(i as usize) == Some(op))
}

/// Runs a fix campaign with the program generator and schedules of `cfg` on `exec`.
/// `progress` is called after each program.
pub fn run_fix_campaign(
    cfg: &CampaignConfig,
    exec: &mut dyn Executor,
    mut progress: impl FnMut(u64, &FixCampaign),
) -> Result<FixCampaign, String> {
    let mut res = FixCampaign::default();
    let mut seeds = SplitMix::new(cfg.seed);
    let mut max_ratio: f64 = 0.0;
    for case in 0..cfg.cases {
        let case_seed = seeds.next_u64();
        let program = generate(&cfg.gen, &mut SplitMix::new(case_seed)).ops;
        let f = fix_program(&program)
            .map_err(|e| format!("case {case}: the generator made bad input: {e}"))?;
        res.programs += 1;
        if f.summary.fixable > 0 {
            res.with_hazards += 1;
        }
        res.hazards += f.summary.fixable;
        res.fixed += f.summary.fixed;
        res.inserted += f.summary.inserted;
        max_ratio = max_ratio.max(f.summary.max_per_hazard);
        let map = index_map(&f);
        let mut failure = None;
        if f.after.hazards.iter().any(|h| is_fixable(h.kind)) {
            res.not_fixed += 1;
            failure = Some("the fixed program still has a data-race, reuse-race or unsafe-free");
        } else if !keeps_original(&program, &f, &map) {
            res.reordered += 1;
            failure = Some("the fixed program does not keep the original ops in order");
        } else if f.summary.max_per_hazard > 2.0 {
            res.over_budget += 1;
            failure = Some("more than two ops were inserted per hazard at one op");
        } else if f.after.is_clean() {
            res.run += 1;
            let sim_err = |e: ExecError| format!("case {case} (seed {case_seed}): {e}");
            let reference = exec.reference(&f.ops).map_err(sim_err)?;
            res.runs += 1;
            let mut diverged = false;
            for k in 0..cfg.random_schedules {
                let o = exec
                    .random(&f.ops, case_seed ^ u64::from(k + 1))
                    .map_err(sim_err)?;
                res.runs += 1;
                diverged |= !o.diverging(&reference).is_empty();
            }
            for h in f.before.hazards.iter().filter(|h| is_fixable(h.kind)) {
                let Ok(p) = provocation(&f.ops, &moved(h, &map)) else {
                    continue;
                };
                // A provocation of an unsafe free extends the program (allocates the memory again
                // and overwrites it); the extension must be clean itself for the run to count.
                let extended = p.program.len() != f.ops.len();
                if extended && !check_program(&p.program).is_some_and(|r| r.is_clean()) {
                    res.extended_unclean += 1;
                    continue;
                }
                let p_ref = if extended {
                    exec.reference(&p.program).map_err(sim_err)?
                } else {
                    reference.clone()
                };
                for a in 0..cfg.attempts {
                    let o = exec
                        .provoke(&p.program, &p.holds, case_seed.wrapping_add(u64::from(a)))
                        .map_err(sim_err)?;
                    res.runs += 1;
                    res.provocations += 1;
                    diverged |= !o.diverging(&p_ref).is_empty();
                }
            }
            if diverged {
                res.diverged += 1;
                failure = Some("a run of the fixed program differed from its reference");
            }
        }
        if let Some(why) = failure {
            let path = write_failure(&cfg.out_dir, case, &program, why)?;
            res.counterexamples.push(path);
        }
        progress(case + 1, &res);
    }
    res.per_hazard = if res.fixed == 0 {
        0.0
    } else {
        res.inserted as f64 / res.fixed as f64
    };
    res.max_per_hazard = max_ratio;
    Ok(res)
}

fn write_failure(dir: &Path, case: u64, program: &[TraceOp], why: &str) -> Result<String, String> {
    let header = format!("streamsan fuzz --fix counterexample: {why} (run `streamsan fix` on it)");
    let path = write_trace(dir, &format!("fix-{case}.jsonl"), program, &header)?;
    Ok(path.display().to_string())
}
