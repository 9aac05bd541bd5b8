//! Graph programs and a confirmation campaign over them, shared by `tests/graph_programs.rs`
//! (the simulator) and `tests/device_fuzz.rs` (a GPU).
//!
//! The programs: every valid `tests/conformance/graph-*.jsonl` (the spec's graph cases, buggy
//! and fixed), and families of the PyTorch graph bugs at several sizes and replay
//! counts (a static input copied during a replay, a static output read before the replay
//! finished, two graphs of one pool replayed on two streams, a temporary freed inside a capture
//! without `record_stream`, a forked stream's output read before the join inside a capture),
//! each buggy and fixed.
//!
//! The campaign, as `streamsan fuzz` runs it per program: the reference run, random schedules
//! (a divergence from the reference that no reported hazard names is *unexplained*), and for
//! each hazard of a provokable kind its provocation (`campaign::provocation`, the holds made
//! backend-specific by `campaign::holds_for`), up to `attempts` runs until the watched buffers
//! diverge from the provocation's reference (*confirmed*).

#![allow(dead_code)]

use streamsan::fuzz::campaign::{check_program, holds_for, provocation, unexplained, Executor};
use streamsan::trace::{TraceOp, TraceReader};
use streamsan::HazardKind;

/// The campaign's figures.
#[derive(Debug, Default)]
pub struct Stats {
    /// Programs run.
    pub programs: usize,
    /// Programs the backend could not run (with why).
    pub skipped: Vec<String>,
    /// Hazards of a provokable kind (data-race, unsafe-free, reuse-race).
    pub hazards: usize,
    /// Those whose provocation corrupted a watched buffer.
    pub confirmed: usize,
    /// Those with no provocation (with why).
    pub unprovokable: Vec<String>,
    /// Provoked and never observed.
    pub unconfirmed: Vec<String>,
    /// Programs with a divergence no hazard names.
    pub unexplained: Vec<String>,
    /// Of the hazards, those of a graph replay (an access or a conflict is a replayed op) with a
    /// provocation, and how many of those were confirmed.
    pub graph_hazards: usize,
    /// Confirmed graph hazards.
    pub graph_confirmed: usize,
    /// The confirmed graph hazards, named (program, kind, op, buffer).
    pub graph_confirmed_names: Vec<String>,
    /// Backend runs.
    pub runs: usize,
}

impl Stats {
    /// Confirmed share of the graph hazards that have a provocation.
    pub fn graph_share(&self) -> f64 {
        if self.graph_hazards == 0 {
            1.0
        } else {
            self.graph_confirmed as f64 / self.graph_hazards as f64
        }
    }

    /// Confirmed share of the hazards that have a provocation.
    pub fn confirmed_share(&self) -> f64 {
        let confirmable = self.hazards - self.unprovokable.len();
        if confirmable == 0 {
            1.0
        } else {
            self.confirmed as f64 / confirmable as f64
        }
    }
}

fn parse(name: &str, text: &str) -> Vec<TraceOp> {
    let mut reader = TraceReader::new(text.as_bytes(), name);
    let mut ops = Vec::new();
    while let Some((op, _)) = reader.next_op().unwrap_or_else(|e| panic!("{name}: {e}")) {
        ops.push(op);
    }
    ops
}

/// The valid graph programs of the conformance suite (the `CONFORMANCE` fixture table).
pub fn conformance(table: &'static [(&'static str, &'static [u8])]) -> Vec<(String, Vec<TraceOp>)> {
    table
        .iter()
        .filter(|(path, _)| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.starts_with("graph-")
                && name.ends_with(".jsonl")
                && !name.starts_with("graph-bad-")
        })
        .filter(|(path, _)| !KNOWN_GAPS.iter().any(|(name, _)| path.ends_with(name)))
        .filter_map(|&(path, bytes)| {
            let text = std::str::from_utf8(bytes).ok()?;
            let ops = parse(path, text);
            let report = check_program(&ops)?;
            // A use-after-free names memory that is gone: no backend runs it.
            let runnable = !report
                .hazards
                .iter()
                .any(|h| h.kind == HazardKind::UseAfterFree);
            runnable.then(|| (path.to_string(), ops))
        })
        .collect()
}

/// Conformance cases left out, and why (none now: every valid graph case without a
/// use-after-free runs on both backends).
pub const KNOWN_GAPS: &[(&str, &str)] = &[];

/// One family member as JSON Lines. Each step computes new values, as the steps of a real loop
/// do: the next input is made from the last one, the model and the forked producer read what they
/// write. (A kernel that writes what it wrote the replay before leaves a racing reader nothing
/// different to see: its race is real but no run can show it.)
fn family(kind: &str, bytes: u64, replays: usize, fixed: bool) -> String {
    let mut t = String::new();
    let mut op = |s: String| {
        t.push_str(&s);
        t.push('\n');
    };
    match kind {
        "static-input" => {
            op(format!(
                r#"{{"op":"alloc","buffer":"static_in","bytes":{bytes},"stream":"main"}}"#
            ));
            op(format!(
                r#"{{"op":"alloc","buffer":"static_out","bytes":{bytes},"stream":"main"}}"#
            ));
            op(r#"{"op":"launch","stream":"main","name":"init","writes":["static_in"]}"#.into());
            op(r#"{"op":"graph_begin","graph":"g","stream":"main"}"#.into());
            op(r#"{"op":"launch","stream":"main","name":"model","reads":["static_in"],"writes":["static_out"]}"#.into());
            op(r#"{"op":"graph_end","graph":"g"}"#.into());
            op(r#"{"op":"event_record","event":"ready","stream":"main"}"#.into());
            op(r#"{"op":"event_wait","stream":"side","event":"ready"}"#.into());
            for _ in 0..replays {
                op(r#"{"op":"graph_launch","graph":"g","stream":"main"}"#.into());
                if fixed {
                    op(r#"{"op":"event_record","event":"done","stream":"main"}"#.into());
                    op(r#"{"op":"event_wait","stream":"side","event":"done"}"#.into());
                }
                op(r#"{"op":"launch","stream":"side","name":"copy_","reads":["static_in"],"writes":["static_in"]}"#.into());
                op(r#"{"op":"event_record","event":"loaded","stream":"side"}"#.into());
                op(r#"{"op":"event_wait","stream":"main","event":"loaded"}"#.into());
            }
        }
        "static-output" => {
            op(format!(
                r#"{{"op":"alloc","buffer":"static_out","bytes":{bytes},"stream":"main"}}"#
            ));
            op(format!(
                r#"{{"op":"alloc","buffer":"result","bytes":{bytes},"stream":"consumer"}}"#
            ));
            op(r#"{"op":"graph_begin","graph":"g","stream":"main"}"#.into());
            op(r#"{"op":"launch","stream":"main","name":"model","reads":["static_out"],"writes":["static_out"]}"#.into());
            op(r#"{"op":"graph_end","graph":"g"}"#.into());
            op(r#"{"op":"event_record","event":"ready","stream":"main"}"#.into());
            op(r#"{"op":"event_wait","stream":"consumer","event":"ready"}"#.into());
            for _ in 0..replays {
                op(r#"{"op":"graph_launch","graph":"g","stream":"main"}"#.into());
                if fixed {
                    op(r#"{"op":"event_record","event":"done","stream":"main"}"#.into());
                    op(r#"{"op":"event_wait","stream":"consumer","event":"done"}"#.into());
                }
                op(r#"{"op":"launch","stream":"consumer","name":"consume","reads":["static_out"],"writes":["result"]}"#.into());
                op(r#"{"op":"event_record","event":"consumed","stream":"consumer"}"#.into());
                op(r#"{"op":"event_wait","stream":"main","event":"consumed"}"#.into());
            }
        }
        "shared-pool" => {
            op(format!(
                r#"{{"op":"alloc","buffer":"out_a","bytes":{bytes},"stream":"cap"}}"#
            ));
            op(format!(
                r#"{{"op":"alloc","buffer":"out_b","bytes":{bytes},"stream":"cap"}}"#
            ));
            for (g, out) in [("ga", "out_a"), ("gb", "out_b")] {
                op(format!(
                    r#"{{"op":"graph_begin","graph":"{g}","stream":"cap","pool":"pool"}}"#
                ));
                op(format!(
                    r#"{{"op":"alloc","buffer":"tmp_{g}","bytes":{bytes},"stream":"cap"}}"#
                ));
                op(format!(
                    r#"{{"op":"launch","stream":"cap","name":"{g}1","writes":["tmp_{g}"]}}"#
                ));
                op(format!(
                    r#"{{"op":"launch","stream":"cap","name":"{g}2","reads":["tmp_{g}"],"writes":["{out}"]}}"#
                ));
                op(format!(r#"{{"op":"free","buffer":"tmp_{g}"}}"#));
                op(format!(r#"{{"op":"graph_end","graph":"{g}"}}"#));
            }
            op(r#"{"op":"event_record","event":"ready","stream":"cap"}"#.into());
            op(r#"{"op":"event_wait","stream":"a","event":"ready"}"#.into());
            op(r#"{"op":"event_wait","stream":"b","event":"ready"}"#.into());
            for _ in 0..replays {
                op(r#"{"op":"graph_launch","graph":"ga","stream":"a"}"#.into());
                if fixed {
                    op(r#"{"op":"event_record","event":"a_done","stream":"a"}"#.into());
                    op(r#"{"op":"event_wait","stream":"b","event":"a_done"}"#.into());
                }
                op(r#"{"op":"graph_launch","graph":"gb","stream":"b"}"#.into());
                op(r#"{"op":"event_record","event":"b_done","stream":"b"}"#.into());
                op(r#"{"op":"event_wait","stream":"a","event":"b_done"}"#.into());
            }
        }
        "temp-freed" => {
            op(format!(
                r#"{{"op":"alloc","buffer":"out","bytes":{bytes},"stream":"main"}}"#
            ));
            op(format!(
                r#"{{"op":"alloc","buffer":"scratch","bytes":{bytes},"stream":"main"}}"#
            ));
            op(r#"{"op":"graph_begin","graph":"g","stream":"main"}"#.into());
            op(format!(
                r#"{{"op":"alloc","buffer":"tmp","bytes":{bytes},"stream":"main"}}"#
            ));
            op(r#"{"op":"launch","stream":"main","name":"produce","writes":["tmp"]}"#.into());
            op(r#"{"op":"event_record","event":"fork","stream":"main"}"#.into());
            op(r#"{"op":"event_wait","stream":"side","event":"fork"}"#.into());
            op(r#"{"op":"launch","stream":"side","name":"consume","reads":["tmp"],"writes":["out"]}"#.into());
            if fixed {
                op(r#"{"op":"record_stream","buffer":"tmp","stream":"side"}"#.into());
            }
            op(r#"{"op":"free","buffer":"tmp"}"#.into());
            op(format!(
                r#"{{"op":"alloc","buffer":"tmp2","bytes":{bytes},"stream":"main"}}"#
            ));
            op(r#"{"op":"launch","stream":"main","name":"overwrite","writes":["tmp2"]}"#.into());
            op(r#"{"op":"launch","stream":"main","name":"use","reads":["tmp2"],"writes":["scratch"]}"#.into());
            op(r#"{"op":"event_record","event":"join","stream":"side"}"#.into());
            op(r#"{"op":"event_wait","stream":"main","event":"join"}"#.into());
            op(r#"{"op":"free","buffer":"tmp2"}"#.into());
            op(r#"{"op":"graph_end","graph":"g"}"#.into());
            for _ in 0..replays {
                op(r#"{"op":"graph_launch","graph":"g","stream":"main"}"#.into());
            }
        }
        "fork-join" => {
            op(format!(
                r#"{{"op":"alloc","buffer":"x","bytes":{bytes},"stream":"main"}}"#
            ));
            op(format!(
                r#"{{"op":"alloc","buffer":"y","bytes":{bytes},"stream":"main"}}"#
            ));
            op(r#"{"op":"graph_begin","graph":"g","stream":"main"}"#.into());
            op(r#"{"op":"event_record","event":"fork","stream":"main"}"#.into());
            op(r#"{"op":"event_wait","stream":"side","event":"fork"}"#.into());
            op(
                r#"{"op":"launch","stream":"side","name":"produce","reads":["x"],"writes":["x"]}"#
                    .into(),
            );
            op(r#"{"op":"event_record","event":"join","stream":"side"}"#.into());
            if fixed {
                op(r#"{"op":"event_wait","stream":"main","event":"join"}"#.into());
            }
            op(
                r#"{"op":"launch","stream":"main","name":"consume","reads":["x"],"writes":["y"]}"#
                    .into(),
            );
            if !fixed {
                op(r#"{"op":"event_wait","stream":"main","event":"join"}"#.into());
            }
            op(r#"{"op":"graph_end","graph":"g"}"#.into());
            for _ in 0..replays {
                op(r#"{"op":"graph_launch","graph":"g","stream":"main"}"#.into());
            }
        }
        _ => unreachable!("{kind}"),
    }
    t
}

/// The families at every size and replay count, buggy and fixed.
pub fn families() -> Vec<(String, Vec<TraceOp>)> {
    let mut out = Vec::new();
    for kind in [
        "static-input",
        "static-output",
        "shared-pool",
        "temp-freed",
        "fork-join",
    ] {
        for (bytes, replays) in [(4096u64, 1usize), (65536, 2), (1 << 20, 3)] {
            for fixed in [false, true] {
                let name = format!(
                    "{kind}-{bytes}-x{replays}{}",
                    if fixed { "-fixed" } else { "" }
                );
                let ops = parse(&name, &family(kind, bytes, replays, fixed));
                let report = check_program(&ops)
                    .unwrap_or_else(|| panic!("{name}: the family member is bad input"));
                assert_eq!(
                    report.is_clean(),
                    fixed,
                    "{name}: buggy members have hazards, fixed ones none: {}",
                    report.to_json()
                );
                out.push((name, ops));
            }
        }
    }
    out
}

/// Runs the campaign over `programs` on `exec`: `schedules` random schedules per program, up to
/// `attempts` provoked runs per hazard. With `raw_holds` the provocations hold replayed ops by
/// their numbers on every backend; without, as `campaign::holds_for` says (a backend that does
/// not schedule replayed ops one by one then holds whole launches).
pub fn campaign(
    exec: &mut dyn Executor,
    programs: &[(String, Vec<TraceOp>)],
    schedules: u32,
    attempts: u32,
    raw_holds: bool,
) -> Stats {
    let mut st = Stats::default();
    for (name, program) in programs {
        let report = check_program(program).unwrap_or_else(|| panic!("{name} is bad input"));
        let reference = match exec.reference(program) {
            Ok(r) => r,
            Err(e) => {
                st.skipped.push(format!("{name}: {e}"));
                continue;
            }
        };
        st.programs += 1;
        st.runs += 1;
        let mut explained = true;
        for k in 0..schedules {
            let o = exec
                .random(program, 1 + u64::from(k))
                .unwrap_or_else(|e| panic!("{name}, schedule {k}: {e}"));
            st.runs += 1;
            if let Some(b) = unexplained(program, &report, &reference, &o) {
                st.unexplained
                    .push(format!("{name}: schedule {k} diverges on {b:?}"));
                explained = false;
                break;
            }
        }
        for h in &report.hazards {
            if !matches!(
                h.kind,
                HazardKind::DataRace | HazardKind::UnsafeFree | HazardKind::ReuseRace
            ) {
                continue;
            }
            st.hazards += 1;
            let what = format!(
                "{name}: {} at op {} on {}",
                h.kind,
                h.op,
                h.buffer.as_deref().unwrap_or("-")
            );
            let p = match provocation(program, h) {
                Ok(p) => p,
                Err(why) => {
                    st.unprovokable.push(format!("{what}: {why}"));
                    continue;
                }
            };
            let in_graph = h.access.as_ref().is_some_and(|a| a.captured.is_some())
                || h.conflicts.iter().any(|c| c.captured.is_some());
            st.graph_hazards += usize::from(in_graph);
            let p_ref = exec
                .reference(&p.program)
                .unwrap_or_else(|e| panic!("{what}: the provocation's reference: {e}"));
            st.runs += 1;
            // The holds as the provocation gives them: both the simulator and the GPU runner
            // schedule a replay's ops one by one (by their replayed numbers).
            let holds = if raw_holds {
                p.holds.clone()
            } else {
                holds_for(exec, &p.program, &p.holds)
            };
            let mut confirmed = false;
            for a in 0..attempts {
                let o = exec
                    .provoke(&p.program, &holds, 100 + u64::from(a))
                    .unwrap_or_else(|e| panic!("{what}, attempt {a}: {e}"));
                st.runs += 1;
                if o.diverging(&p_ref).iter().any(|b| p.watch.contains(b)) {
                    confirmed = true;
                    break;
                }
                if explained && p.program.len() == program.len() {
                    if let Some(b) = unexplained(program, &report, &reference, &o) {
                        st.unexplained
                            .push(format!("{what}: attempt {a} diverges on {b:?}"));
                        explained = false;
                    }
                }
            }
            if confirmed {
                st.confirmed += 1;
                st.graph_confirmed += usize::from(in_graph);
                if in_graph {
                    st.graph_confirmed_names.push(what.clone());
                }
            } else {
                st.unconfirmed.push(format!("{what} (holds {holds:?})"));
            }
        }
    }
    st
}

/// Prints the figures.
pub fn print(backend: &str, st: &Stats) {
    println!(
        "{backend}: {} programs ({} skipped), {} provokable hazards, {} without a provocation, {} confirmed ({:.1}% of those with one; graph replays: {} of {}, {:.1}%), {} unexplained, {} runs",
        st.programs,
        st.skipped.len(),
        st.hazards,
        st.unprovokable.len(),
        st.confirmed,
        100.0 * st.confirmed_share(),
        st.graph_confirmed,
        st.graph_hazards,
        100.0 * st.graph_share(),
        st.unexplained.len(),
        st.runs
    );
    for s in &st.skipped {
        println!("  skipped: {s}");
    }
    for s in &st.unprovokable {
        println!("  no provocation: {s}");
    }
    for s in &st.unconfirmed {
        println!("  unconfirmed: {s}");
    }
    for s in &st.unexplained {
        println!("  unexplained: {s}");
    }
}

/// The share of the graph hazards `reference` (the simulator's campaign on the same programs)
/// confirmed that `st` confirmed too: its confirmable graph hazards, and how many `st` confirmed.
pub fn confirmed_of(st: &Stats, reference: &Stats) -> (usize, usize) {
    let confirmable = reference.graph_confirmed_names.len();
    let both = reference
        .graph_confirmed_names
        .iter()
        .filter(|n| st.graph_confirmed_names.contains(n))
        .count();
    (both, confirmable)
}
