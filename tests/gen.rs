//! The random program generator: every program satisfies the constraints the simulator and the GPU
//! kernels rely on and is valid checker input; generation is deterministic; with no
//! synchronization left out the checker finds nothing; with some left out it finds data races,
//! unsafe frees and reuse races, at exactly the ops the generator's own model predicts; and
//! proptest shrinks a failing program to a minimal one.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};
use streamsan::fuzz::gen::{
    arb_program, generate, generate_from_words, predicted_hazards, validate, GenConfig, Program,
};
use streamsan::workload::SplitMix;
use streamsan::{Checker, HazardKind, Report};

/// A spread of configurations: defaults, clean, racy, tiny, wide, and use-after-free.
fn configs() -> Vec<(&'static str, GenConfig)> {
    vec![
        ("default", GenConfig::default()),
        (
            "clean",
            GenConfig {
                missing_sync: 0.0,
                ..GenConfig::default()
            },
        ),
        (
            "racy",
            GenConfig {
                missing_sync: 0.3,
                ..GenConfig::default()
            },
        ),
        (
            "tiny",
            GenConfig {
                ops: 20,
                streams: 1,
                buffers: 1,
                missing_sync: 0.5,
                pinned: false,
                blocking: false,
                stream_ordered_free: false,
                use_after_free: false,
                max_words: 4,
                initialize: true,
                graphs: false,
            },
        ),
        (
            "wide",
            GenConfig {
                ops: 80,
                streams: 4,
                buffers: 6,
                missing_sync: 0.1,
                max_words: 64,
                ..GenConfig::default()
            },
        ),
        (
            "use-after-free",
            GenConfig {
                missing_sync: 0.7,
                use_after_free: true,
                ..GenConfig::default()
            },
        ),
    ]
}

/// Runs the checker over every op; panics with the program if it refuses one.
fn check(p: &Program) -> Report {
    Checker::check_all(&p.ops)
        .unwrap_or_else(|(i, e)| panic!("the checker refused op {i}: {e:?}\n{p}"))
}

fn has(report: &Report, kind: HazardKind) -> bool {
    report.hazards.iter().any(|h| h.kind == kind)
}

#[test]
fn programs_are_valid_deterministic_and_accepted() {
    for (name, cfg) in configs() {
        for seed in 0..1000 {
            let p = generate(&cfg, &mut SplitMix::new(seed));
            if let Err(e) = validate(&p) {
                panic!("{name}, seed {seed}: {e}\n{p}");
            }
            if cfg.initialize {
                // It may end early rather than between an allocation and its initialization.
                assert!(p.ops.len() <= cfg.ops, "{name}, seed {seed}");
            } else {
                assert_eq!(p.ops.len(), cfg.ops, "{name}, seed {seed}");
            }
            assert!(
                p == generate(&cfg, &mut SplitMix::new(seed)),
                "{name}, seed {seed}: not deterministic"
            );
            let report = check(&p);
            assert!(
                !has(&report, HazardKind::InvalidFree)
                    && !has(&report, HazardKind::WaitOnUnrecordedEvent),
                "{name}, seed {seed}: {}\n{p}",
                report.to_json()
            );
            let uaf_allowed = cfg.use_after_free && cfg.missing_sync > 0.5;
            assert!(
                uaf_allowed || !has(&report, HazardKind::UseAfterFree),
                "{name}, seed {seed}: use after free\n{p}"
            );
        }
    }
}

#[test]
fn use_after_free_is_rare_but_reachable() {
    let (_, cfg) = configs().pop().expect("the use-after-free config");
    let with = (0..1000)
        .filter(|&seed| {
            has(
                &check(&generate(&cfg, &mut SplitMix::new(seed))),
                HazardKind::UseAfterFree,
            )
        })
        .count();
    println!("use-after-free in {with} of 1000 programs");
    assert!(with > 0 && with < 500, "{with} of 1000");
}

/// The ops of `p` the report flags, with the first hazard, for a failure message.
fn describe(p: &Program, report: &Report) -> String {
    let h = &report.hazards[0];
    format!(
        "{} hazards, first: {} at op {} on {:?}\n{}",
        report.errors,
        h.kind,
        h.op,
        h.buffer,
        p.to_jsonl()
    )
}

#[test]
fn without_missing_syncs_programs_are_clean() {
    let shapes = [
        GenConfig::default(),
        GenConfig {
            ops: 80,
            streams: 4,
            buffers: 6,
            max_words: 16,
            ..GenConfig::default()
        },
        GenConfig {
            streams: 1,
            buffers: 2,
            ..GenConfig::default()
        },
    ];
    for shape in shapes {
        let cfg = GenConfig {
            missing_sync: 0.0,
            ..shape
        };
        let mut flagged: Option<(Program, Report)> = None;
        let mut clean = 0;
        for seed in 0..500 {
            let p = generate(&cfg, &mut SplitMix::new(seed));
            let report = check(&p);
            if report.is_clean() {
                clean += 1;
            } else if flagged
                .as_ref()
                .is_none_or(|(q, _)| p.ops.len() < q.ops.len())
            {
                flagged = Some((p, report));
            }
        }
        println!(
            "missing_sync 0, {} ops, {} streams, {} buffers: {clean} of 500 clean ({:.1}%)",
            cfg.ops,
            cfg.streams,
            cfg.buffers,
            clean as f64 / 5.0
        );
        if let Some((p, report)) = flagged {
            panic!(
                "{} of 500 programs flagged; one of them: {}",
                500 - clean,
                describe(&p, &report)
            );
        }
    }
}

#[test]
fn missing_syncs_plant_every_kind_of_hazard() {
    let cfg = GenConfig {
        missing_sync: 0.3,
        ..GenConfig::default()
    };
    let kinds = [
        HazardKind::DataRace,
        HazardKind::ReuseRace,
        HazardKind::UnsafeFree,
    ];
    let mut programs: BTreeMap<HazardKind, usize> = BTreeMap::new();
    let mut hazards: BTreeMap<HazardKind, usize> = BTreeMap::new();
    let mut any = 0;
    for seed in 0..1000 {
        let report = check(&generate(&cfg, &mut SplitMix::new(seed)));
        let mut hit = false;
        for kind in kinds {
            let n = report.hazards.iter().filter(|h| h.kind == kind).count();
            *hazards.entry(kind).or_default() += n;
            if n > 0 {
                *programs.entry(kind).or_default() += 1;
                hit = true;
            }
        }
        any += hit as usize;
    }
    println!(
        "missing_sync 0.3: {any} of 1000 programs have a data race, reuse race or unsafe free"
    );
    for kind in kinds {
        println!(
            "  {kind}: {} hazards in {} programs",
            hazards.get(&kind).copied().unwrap_or(0),
            programs.get(&kind).copied().unwrap_or(0)
        );
    }
    assert!(any >= 300, "only {any} of 1000 programs have a hazard");
    for kind in kinds {
        assert!(programs.get(&kind).copied().unwrap_or(0) > 0, "no {kind}");
    }
}

#[test]
fn decision_words_are_deterministic_and_end_the_program() {
    let cfg = GenConfig::default();
    let mut rng = SplitMix::new(3);
    let steps: Vec<Vec<u64>> = (0..40)
        .map(|k| (0..k % 9).map(|_| rng.next_u64()).collect())
        .collect();
    let p = generate_from_words(&cfg, &steps);
    assert_eq!(p, generate_from_words(&cfg, &steps));
    assert!(generate_from_words(&cfg, &[]).ops.is_empty());
    for n in [1, 5, 20] {
        let q = generate_from_words(&cfg, &steps[..n]);
        validate(&q).unwrap();
        assert!(
            q.ops.len() <= p.ops.len(),
            "a prefix of the steps is a prefix"
        );
        assert_eq!(q.ops[..], p.ops[..q.ops.len()]);
        check(&q);
    }
}

/// The generator's model, written from the trace format apart from the checker, predicts the
/// same hazards at the same ops as the checker reports.
#[test]
fn the_checker_agrees_with_the_generators_model() {
    let kinds = [
        HazardKind::DataRace,
        HazardKind::ReuseRace,
        HazardKind::UnsafeFree,
        HazardKind::UseAfterFree,
    ];
    for (name, cfg) in configs() {
        for seed in 0..1000 {
            let p = generate(&cfg, &mut SplitMix::new(seed));
            let predicted: BTreeSet<(usize, HazardKind)> =
                predicted_hazards(&p).into_iter().collect();
            let reported: BTreeSet<(usize, HazardKind)> = check(&p)
                .hazards
                .iter()
                .filter(|h| kinds.contains(&h.kind))
                .map(|h| (h.op as usize, h.kind))
                .collect();
            assert_eq!(
                predicted, reported,
                "{name}, seed {seed}: model (left) and checker (right) disagree\n{p}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn strategy_programs_are_valid(p in arb_program(GenConfig { missing_sync: 0.4, use_after_free: true, ..GenConfig::default() })) {
        prop_assert!(validate(&p).is_ok(), "{:?}", validate(&p));
        check(&p);
    }

    #[test]
    fn strategy_programs_without_missing_syncs_are_clean(p in arb_program(GenConfig { missing_sync: 0.0, ..GenConfig::default() })) {
        let report = check(&p);
        prop_assert!(report.is_clean(), "{}", describe(&p, &report));
    }
}

/// A failing property shrinks to a minimal program that still satisfies every constraint.
#[test]
fn failing_programs_shrink_to_minimal_ones() {
    let cfg = GenConfig {
        missing_sync: 0.5,
        ..GenConfig::default()
    };
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 512,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let result = runner.run(&arb_program(cfg), |p| {
        prop_assert!(!has(&check(&p), HazardKind::DataRace));
        Ok(())
    });
    let Err(TestError::Fail(_, minimal)) = result else {
        panic!("no program with a data race: {result:?}");
    };
    println!("minimal program with a data race:\n{minimal}");
    validate(&minimal).unwrap();
    assert!(has(&check(&minimal), HazardKind::DataRace));
    assert!(
        minimal.ops.len() <= 8,
        "shrunk to {} ops:\n{minimal}",
        minimal.ops.len()
    );
}

/// With `initialize`, no program reads memory it has not written (in issue order).
#[test]
fn initialized_programs_read_no_uninitialized_memory() {
    let cfg = GenConfig {
        initialize: true,
        missing_sync: 0.3,
        ..GenConfig::default()
    };
    let mut worst = 0;
    for seed in 0..300u64 {
        let p = generate(&cfg, &mut SplitMix::new(seed));
        let o = streamsan::exec::sim::reference(&p.ops).expect("runs on the simulator");
        if o.uninitialized > 0 && worst == 0 {
            worst = seed + 1;
        }
    }
    assert_eq!(
        worst,
        0,
        "seed {} reads uninitialized memory",
        worst.saturating_sub(1)
    );
}
