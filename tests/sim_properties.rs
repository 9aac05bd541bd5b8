//! Properties of the checker against executions on the simulated device, over generated
//! programs (proptest shrinks a failing program to a minimal one):
//!
//! a. no hazard reported ⇒ every schedule's data equal the sequential reference;
//! b. a schedule's data differ from the reference ⇒ a reported hazard names a differing buffer;
//! d. written traces parse back to the same program and give the same report.
//!
//! (c, the clocks against a brute-force happens-before oracle, is `tests/oracle_agreement.rs`.)

use proptest::prelude::*;
use streamsan::exec::sim::{self, RandomScheduler, SimConfig};
use streamsan::fuzz::campaign::{check_program, unexplained};
use streamsan::fuzz::gen::{arb_program, GenConfig};
use streamsan::trace::{TraceOp, TraceReader, TraceWriter};
use streamsan::workload::SplitMix;

fn config() -> GenConfig {
    GenConfig {
        ops: 24,
        missing_sync: 0.25,
        ..GenConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn schedules_agree_with_the_report(program in arb_program(config()), seed in any::<u64>()) {
        let ops = &program.ops;
        let report = check_program(ops).expect("generated programs are valid input");
        let reference = sim::reference(ops).expect("runs on the simulator");
        for k in 0..4u64 {
            let chunk = [1, 4, 16, u32::MAX][k as usize];
            let mut s = RandomScheduler(SplitMix::new(seed ^ k));
            let outcome = sim::run(ops, &mut s, SimConfig { chunk_words: chunk }).expect("runs");
            let differing = outcome.diverging(&reference);
            if report.is_clean() {
                // a.
                prop_assert!(differing.is_empty(), "no hazard reported, yet buffers {differing:?} differ\n{program}");
            }
            // b.
            prop_assert!(
                unexplained(ops, &report, &reference, &outcome).is_none(),
                "buffers {differing:?} differ with no hazard on them\n{program}\nreport:\n{}",
                report.to_json()
            );
        }
    }

    #[test]
    fn written_traces_read_back_to_the_same_program_and_report(program in arb_program(config())) {
        let mut w = TraceWriter::new(Vec::new());
        for op in &program.ops {
            w.write(op).expect("write to memory");
        }
        let bytes = w.finish().expect("flush to memory");
        let mut r = TraceReader::new(&bytes[..], "written");
        let mut back: Vec<TraceOp> = Vec::new();
        while let Some((op, _)) = r.next_op().expect("a written trace parses") {
            back.push(op);
        }
        prop_assert_eq!(&back, &program.ops);
        let a = check_program(&program.ops).expect("valid").to_json();
        let b = check_program(&back).expect("valid").to_json();
        prop_assert_eq!(a, b);
    }
}
