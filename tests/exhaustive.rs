//! Exhaustive schedules: the checker's verdict against every schedule the simulator can produce.
//!
//! For small generated programs, `sim::explore` runs every schedule depth first — first with every
//! op atomic (`chunk_words = u32::MAX`), then with kernels split into one-word chunks where the
//! schedule count stays under a limit — and the test holds the checker to two properties:
//!
//! - **(a) no false negatives**: if the checker reports no `data-race`, `reuse-race` or
//!   `unsafe-free`, every schedule observes exactly what the sequential reference observes
//!   (checked only for complete explorations);
//! - **(b) every divergence is explained**: every schedule whose data differ from the reference
//!   differs in some buffer that a reported error names (`campaign::unexplained` is `None`).
//!
//! A seeded sweep prints its totals; a proptest over `arb_program` with tiny configurations
//! checks the same, and shrinks a failure to a minimal program.

use proptest::prelude::*;
use proptest::test_runner::Config;
use streamsan::exec::sim::{explore, reference, Exploration, SimConfig};
use streamsan::fuzz::campaign::{check_program, unexplained};
use streamsan::fuzz::gen::{arb_program, generate, GenConfig};
use streamsan::trace::TraceOp;
use streamsan::workload::SplitMix;
use streamsan::{HazardKind, Report};

/// Schedules explored per program with atomic ops.
const ATOMIC_LIMIT: usize = 20_000;
/// Schedules explored per program with one-word chunks.
const CHUNK_LIMIT: usize = 10_000;

const ATOMIC: SimConfig = SimConfig {
    chunk_words: u32::MAX,
};
const CHUNKED: SimConfig = SimConfig { chunk_words: 1 };

/// Whether the report has a hazard that can make schedules differ.
fn reports_race(report: &Report) -> bool {
    report.hazards.iter().any(|h| {
        matches!(
            h.kind,
            HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree
        )
    })
}

/// Checks properties (a) and (b) of one exploration; `Err` describes a violation.
fn verify(program: &[TraceOp], ex: &Exploration, cfg: SimConfig) -> Result<(), String> {
    let report = check_program(program).ok_or("the checker rejects a generated program")?;
    let reference = reference(program).map_err(|e| e.to_string())?;
    let trace = || {
        program
            .iter()
            .map(|op| {
                let mut s = String::new();
                streamsan::trace::write_op(op, &mut s);
                s
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if ex.complete && !reports_race(&report) && !ex.divergent.is_empty() {
        return Err(format!(
            "(a) chunk_words {}: no race reported, but {} of {} schedules diverge (first: \
             choices {:?}, buffers {:?})\n{}",
            cfg.chunk_words,
            ex.divergent.len(),
            ex.schedules,
            ex.divergent[0].0,
            ex.divergent[0].1.diverging(&reference),
            trace()
        ));
    }
    for (choices, outcome) in &ex.divergent {
        if let Some(buffers) = unexplained(program, &report, &reference, outcome) {
            return Err(format!(
                "(b) chunk_words {}: schedule {choices:?} diverges in {buffers:?}, which no \
                 reported error names\n{}",
                cfg.chunk_words,
                trace()
            ));
        }
    }
    Ok(())
}

/// Totals of a sweep.
#[derive(Default, Debug)]
struct Totals {
    programs: usize,
    with_races: usize,
    complete: usize,
    schedules: usize,
    max_schedules: usize,
    divergent: usize,
    chunked_programs: usize,
    chunked_complete: usize,
    chunked_schedules: usize,
    chunked_max: usize,
    chunked_divergent: usize,
}

/// Explores one program atomically and, when that is small enough, in one-word chunks.
fn explore_program(program: &[TraceOp], t: &mut Totals) -> Result<(), String> {
    t.programs += 1;
    let report = check_program(program).ok_or("the checker rejects a generated program")?;
    t.with_races += usize::from(reports_race(&report));
    let ex = explore(program, ATOMIC, ATOMIC_LIMIT).map_err(|e| e.to_string())?;
    t.complete += usize::from(ex.complete);
    t.schedules += ex.schedules;
    t.max_schedules = t.max_schedules.max(ex.schedules);
    t.divergent += ex.divergent.len();
    verify(program, &ex, ATOMIC)?;
    // Chunks multiply the schedules; only small atomic spaces are worth splitting.
    if ex.complete && ex.schedules <= 120 {
        let ex = explore(program, CHUNKED, CHUNK_LIMIT).map_err(|e| e.to_string())?;
        t.chunked_programs += 1;
        t.chunked_complete += usize::from(ex.complete);
        t.chunked_schedules += ex.schedules;
        t.chunked_max = t.chunked_max.max(ex.schedules);
        t.chunked_divergent += ex.divergent.len();
        verify(program, &ex, CHUNKED)?;
    }
    Ok(())
}

/// The configuration of program `i` of the sweep: 6 to 10 ops over 2 or 3 streams, tiny
/// buffers, from fully synchronized to half the synchronizations left out.
fn sweep_config(i: u64) -> GenConfig {
    let (streams, blocking) = match i % 3 {
        0 => (2, false),
        1 => (3, false),
        _ => (1, true), // s0, the blocking b and the legacy default stream
    };
    GenConfig {
        ops: 6 + (i % 5) as usize,
        streams,
        buffers: 2 + (i % 2) as u32,
        missing_sync: [0.0, 0.3, 0.6, 0.9][(i / 3 % 4) as usize],
        pinned: i % 4 == 0,
        blocking,
        stream_ordered_free: i % 2 == 1,
        use_after_free: false,
        max_words: 4,
        initialize: i % 5 == 0,
        graphs: i % 4 == 1,
    }
}

#[test]
fn every_schedule_of_small_programs_is_explained() {
    let mut t = Totals::default();
    let mut failures = Vec::new();
    for i in 0..200u64 {
        let program = generate(&sweep_config(i), &mut SplitMix::new(0xe4a0_0000 + i));
        if let Err(e) = explore_program(&program.ops, &mut t) {
            failures.push(format!("program {i}: {e}"));
        }
    }
    println!("{t:#?}");
    assert_eq!(t.programs, 200);
    assert!(
        t.complete * 10 >= t.programs * 9,
        "most explorations must be complete: {t:?}"
    );
    assert!(
        t.with_races > 0 && t.divergent > 0,
        "no racy program: {t:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Tiny configurations for the proptest.
fn tiny() -> impl Strategy<Value = GenConfig> {
    (4usize..=8, 1u32..=2, any::<bool>(), 0usize..4).prop_map(
        |(ops, streams, blocking, missing)| GenConfig {
            ops,
            streams,
            buffers: 2,
            missing_sync: [0.0, 0.3, 0.5, 0.8][missing],
            pinned: ops % 2 == 0,
            blocking,
            stream_ordered_free: true,
            use_after_free: false,
            max_words: 4,
            initialize: false,
            graphs: ops % 3 == 0,
        },
    )
}

proptest! {
    #![proptest_config(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn arb_programs_are_explained(program in tiny().prop_flat_map(arb_program)) {
        let mut t = Totals::default();
        if let Err(e) = explore_program(&program.ops, &mut t) {
            prop_assert!(false, "{}", e);
        }
    }
}
