//! Graph programs run and provoked on the simulator, as `tests/device_fuzz.rs` runs them on a GPU
//! (`graph_programs_confirm_on_the_gpu`): the conformance suite's graph cases and the families of
//! `graph_corpus`. Here the figures are the simulator's: every run explained, and the share of
//! graph hazards a steered schedule confirms.

mod common;
#[path = "graph_corpus/mod.rs"]
mod graph_corpus;

use streamsan::exec::sim::SimExecutor;

#[test]
fn graph_programs_are_explained_and_confirmed_on_the_simulator() {
    let mut programs = graph_corpus::conformance(common::CONFORMANCE);
    assert!(
        programs.len() >= 20,
        "the conformance suite's graph cases: {}",
        programs.len()
    );
    programs.extend(graph_corpus::families());
    for (name, why) in graph_corpus::KNOWN_GAPS {
        println!("left out: {name}: {why}");
    }
    let mut exec = SimExecutor::default();
    let st = graph_corpus::campaign(&mut exec, &programs, 20, 10, true);
    graph_corpus::print("sim", &st);
    assert!(
        st.skipped.is_empty(),
        "the simulator runs every graph program"
    );
    assert!(st.unexplained.is_empty(), "divergences no hazard explains");
    assert!(st.hazards > 0);
    assert!(
        st.confirmed_share() >= 0.9,
        "{:.1}% of the graph hazards with a provocation confirmed",
        100.0 * st.confirmed_share()
    );
}

/// The generator's graph programs through the same campaign (the GPU runs them in
/// `tests/device_fuzz.rs`: `generated_graph_programs_confirm_on_the_gpu`).
#[test]
fn generated_graph_programs_are_explained_on_the_simulator() {
    use streamsan::fuzz::gen::{generate, GenConfig};
    use streamsan::workload::SplitMix;
    let gen = GenConfig {
        initialize: true,
        graphs: true,
        ..GenConfig::default()
    };
    let mut seeds = SplitMix::new(13);
    let programs: Vec<(String, Vec<streamsan::trace::TraceOp>)> = (0..60)
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
    let mut exec = SimExecutor::default();
    let st = graph_corpus::campaign(&mut exec, &programs, 5, 5, true);
    graph_corpus::print("sim (generated)", &st);
    assert!(st.skipped.is_empty());
    assert!(st.unexplained.is_empty(), "divergences no hazard explains");
}
