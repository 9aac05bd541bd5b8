//! Fuzz campaigns on a real GPU through the CUDA executor.
//!
//! Every test skips (and passes) on a machine with no GPU, and fails there instead under
//! `STREAMSAN_REQUIRE_GPU=1` (`streamsan::cuda::gpu_or_skip`). On a GPU the tests take the device
//! one at a time: the memory check reads device-wide counters. Fixtures: none (the programs are
//! generated; counterexamples go to the temporary directory; the graph programs are the
//! conformance suite's and `graph_corpus`'s).

#![cfg(feature = "cuda")]

mod common;
#[path = "graph_corpus/mod.rs"]
mod graph_corpus;

use std::sync::Mutex;

use streamsan::cuda::gpu_or_skip;
use streamsan::fuzz::campaign::{check_program, run_campaign, CampaignConfig, Executor};
use streamsan::fuzz::cuda::CudaExecutor;
use streamsan::fuzz::gen::{generate, GenConfig};
use streamsan::trace::TraceOp;
use streamsan::workload::SplitMix;

/// One test on the device at a time.
static DEVICE: Mutex<()> = Mutex::new(());

/// The device lock, or `None` (after saying so) when there is no GPU; panics there under
/// `STREAMSAN_REQUIRE_GPU=1`.
fn device() -> Option<std::sync::MutexGuard<'static, ()>> {
    if !gpu_or_skip() {
        return None;
    }
    Some(
        DEVICE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
}

fn executor() -> CudaExecutor {
    match CudaExecutor::new(0) {
        Ok(e) => e,
        Err(e) => panic!("the CUDA executor did not start: {e}"),
    }
}

fn campaign(cases: u64, seed: u64, dir: &str) -> CampaignConfig {
    CampaignConfig {
        cases,
        seed,
        gen: GenConfig {
            initialize: true,
            ..GenConfig::default()
        },
        out_dir: std::env::temp_dir().join(dir),
        ..CampaignConfig::default()
    }
}

#[test]
fn campaign_of_50_programs_has_no_unexplained_divergence() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    let cfg = campaign(50, 7, "streamsan-device-fuzz");
    let res = run_campaign(&cfg, &mut exec, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let s = &res.summary;
    println!(
        "summary: {}",
        serde_json::to_string(s).unwrap_or_else(|e| format!("<{e}>"))
    );
    let share = if s.hazards == 0 {
        0.0
    } else {
        s.confirmed as f64 / s.hazards as f64
    };
    println!(
        "confirmed: {} of {} hazards ({:.1}%) in {} device runs; by kind (data-race, unsafe-free, reuse-race): {:?}",
        s.confirmed,
        s.hazards,
        100.0 * share,
        res.runs,
        res.by_kind
    );
    assert_eq!(s.programs, 50);
    assert_eq!(
        s.unexplained, 0,
        "divergences no hazard explains; counterexamples: {:?}",
        s.counterexamples
    );
}

#[test]
fn campaign_returns_device_memory() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    // Warm up: the driver sets up lazily what the first launches need.
    run_campaign(
        &campaign(2, 1, "streamsan-device-fuzz-mem"),
        &mut exec,
        |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let before = exec
        .try_device_memory_in_use()
        .unwrap_or_else(|e| panic!("{e}"));
    // 1,000 programs (STREAMSAN_DEVICE_PROGRAMS overrides).
    let programs = std::env::var("STREAMSAN_DEVICE_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000);
    let res = run_campaign(
        &campaign(programs, 7, "streamsan-device-fuzz-mem"),
        &mut exec,
        |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let after = exec
        .try_device_memory_in_use()
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "device memory in use: {before} bytes before, {after} after {} programs ({} runs); cached by the executor: {}",
        res.summary.programs,
        res.runs,
        exec.cached_bytes()
    );
    assert_eq!(exec.cached_bytes(), 0);
    // Every run maps at least one 2 MiB segment and the slot array; a leak of either would grow
    // memory by megabytes per run. A little slack allows for the driver's own bookkeeping.
    const SLACK: u64 = 4 << 20;
    assert!(
        after <= before + SLACK,
        "device memory grew from {before} to {after} bytes over {} runs",
        res.runs
    );
}

#[test]
fn clean_program_runs_like_the_reference() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    let gen = GenConfig {
        missing_sync: 0.0,
        initialize: true,
        ..GenConfig::default()
    };
    for seed in [11u64, 12, 13] {
        let program = generate(&gen, &mut SplitMix::new(seed)).ops;
        let report = check_program(&program).expect("a generated program is valid input");
        assert!(report.is_clean(), "missing_sync 0 gives a clean program");
        let reference = exec
            .reference(&program)
            .unwrap_or_else(|e| panic!("reference of program {seed}: {e}"));
        assert!(
            !reference.reads.is_empty(),
            "the run observes what the ops produce"
        );
        for k in 0..20u64 {
            let o = exec
                .random(&program, seed * 1000 + k)
                .unwrap_or_else(|e| panic!("program {seed}, schedule {k}: {e}"));
            assert_eq!(
                o.diverging(&reference),
                Vec::<streamsan::trace::Id>::new(),
                "program {seed}, schedule {k} differs from the reference"
            );
            assert_eq!(o.reads, reference.reads);
            assert_eq!(o.live, reference.live);
        }
    }
}

/// CUDA graphs on the GPU: the graph programs of `graph_corpus` (the conformance suite's graph
/// cases and the families of the PyTorch graph bugs, buggy and fixed), captured with
/// `cuStreamBeginCapture` and replayed with `cuGraphLaunch`: every divergence explained by a
/// hazard, and at least 90% of the graph hazards confirmed by real corruption under a steered
/// schedule (replayed ops held by captured delays), two graphs of one pool replayed at once
/// included.
#[test]
fn graph_programs_confirm_on_the_gpu() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    let mut programs = graph_corpus::conformance(common::CONFORMANCE);
    programs.extend(graph_corpus::families());
    let st = graph_corpus::campaign(&mut exec, &programs, 10, 5, true);
    graph_corpus::print("cuda", &st);
    assert!(st.skipped.is_empty(), "the GPU runs every graph program");
    assert!(st.unexplained.is_empty(), "divergences no hazard explains");
    let pool = st
        .unconfirmed
        .iter()
        .filter(|u| u.starts_with("shared-pool"))
        .count();
    assert_eq!(
        pool, 0,
        "graphs sharing a pool replayed at once are confirmed"
    );
    assert!(
        st.graph_share() >= 0.9,
        "{:.1}% of the graph hazards with a provocation confirmed on the GPU",
        100.0 * st.graph_share()
    );
}

/// The same graph programs with their holds as `streamsan fuzz --backend cuda` and `check
/// --confirm cuda` pass them (`campaign::holds_for`: replayed ops held one by one, as the GPU
/// runner schedules them): the figures, and no unexplained divergence.
#[test]
fn graph_programs_through_holds_for_are_explained_on_the_gpu() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    let mut programs = graph_corpus::conformance(common::CONFORMANCE);
    programs.extend(graph_corpus::families());
    let st = graph_corpus::campaign(&mut exec, &programs, 5, 5, false);
    graph_corpus::print("cuda (holds_for)", &st);
    assert!(st.skipped.is_empty(), "the GPU runs every graph program");
    assert!(st.unexplained.is_empty(), "divergences no hazard explains");
}

/// The generator's graph programs (`GenConfig::graphs`: captures with forks and joins, private
/// and shared pools, temporaries freed inside captures with and without `record_stream`,
/// launches on several streams) on the GPU, with replayed ops held one by one: 0 unexplained, and
/// at least 90% of the confirmable graph hazards (those the same provocation confirms on the
/// simulator) confirmed by real corruption.
#[test]
fn generated_graph_programs_confirm_on_the_gpu() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    let gen = GenConfig {
        initialize: true,
        graphs: true,
        ..GenConfig::default()
    };
    let mut seeds = SplitMix::new(13);
    let programs: Vec<(String, Vec<TraceOp>)> = (0..60)
        .map(|k| {
            let seed = seeds.next_u64();
            (
                format!("generated {k} (seed {seed})"),
                generate(&gen, &mut SplitMix::new(seed)).ops,
            )
        })
        .filter(|(_, p)| p.iter().any(|t| t.op.is_graph_op()))
        .collect();
    assert!(programs.len() >= 30, "the generator makes graph programs");
    // Confirmable: what the same provocations confirm on the simulator.
    let sim = graph_corpus::campaign(
        &mut streamsan::exec::sim::SimExecutor::default(),
        &programs,
        5,
        5,
        true,
    );
    graph_corpus::print("sim (generated)", &sim);
    let st = graph_corpus::campaign(&mut exec, &programs, 5, 5, true);
    graph_corpus::print("cuda (generated)", &st);
    assert!(
        st.skipped.is_empty(),
        "the GPU runs every generated graph program"
    );
    assert!(st.unexplained.is_empty(), "divergences no hazard explains");
    let (both, confirmable) = graph_corpus::confirmed_of(&st, &sim);
    println!("cuda confirms {both} of the {confirmable} graph hazards the simulator confirms");
    assert!(
        both as f64 >= 0.9 * confirmable as f64,
        "{both} of {confirmable} confirmable graph hazards confirmed on the GPU"
    );
}

/// The same through `run_campaign`, as `streamsan fuzz --backend cuda --graphs` runs it (its
/// provocations go through `campaign::holds_for`): no unexplained divergence; the figures, graph
/// hazards apart.
#[test]
fn campaign_of_graph_programs_has_no_unexplained_divergence() {
    let Some(_gpu) = device() else { return };
    let mut exec = executor();
    let mut cfg = campaign(50, 21, "streamsan-device-fuzz-graphs");
    cfg.gen.graphs = true;
    let res = run_campaign(&cfg, &mut exec, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let s = &res.summary;
    println!(
        "graphs: confirmed {} of {} hazards; in graph replays {} of {}; {} unexplained; {} runs",
        s.confirmed,
        s.hazards,
        res.in_graphs.confirmed,
        res.in_graphs.hazards,
        s.unexplained,
        res.runs
    );
    assert_eq!(
        s.unexplained, 0,
        "divergences no hazard explains; counterexamples: {:?}",
        s.counterexamples
    );
}
