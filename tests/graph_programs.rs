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
