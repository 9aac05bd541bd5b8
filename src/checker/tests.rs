use super::*;
use crate::workload::SplitMix;

thread_local! {
    pub(super) static WEAK_NAME_HASH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A random program over names of one length: allocations, frees, accesses, uses after
/// free, external buffers.
fn program(seed: u64) -> Vec<TraceOp> {
    let mut rng = SplitMix::new(seed);
    let mut live = [false; 6];
    let mut ops = Vec::new();
    for _ in 0..300 {
        let k = rng.below(6) as usize;
        let name = Id::from(format!("b{k}"));
        let stream = Id::from(format!("s{}", rng.below(3)));
        let op = match rng.below(7) {
            4 => Op::EventRecord {
                event: Id::from(format!("e{}", rng.below(2))),
                stream,
            },
            5 => Op::EventWait {
                stream,
                event: Id::from(format!("e{}", rng.below(2))),
            },
            6 if rng.below(8) == 0 => Op::StreamSync { stream },
            0 if !live[k] && k < 4 => {
                live[k] = true;
                Op::Alloc {
                    buffer: name,
                    bytes: 512,
                    stream: Some(stream),
                    memory: MemoryKind::Device,
                    addr: None,
                    pool: None,
                }
            }
            1 => {
                live[k] = false;
                Op::Free {
                    buffer: name,
                    stream: None,
                }
            }
            _ => {
                let offset = 8 * rng.below(60);
                Op::Launch {
                    stream,
                    name: None,
                    reads: vec![Region::whole(name.clone())],
                    writes: if rng.below(2) == 0 {
                        vec![Region::range(name, offset, 8 * rng.below(8))]
                    } else {
                        vec![]
                    },
                }
            }
        };
        ops.push(TraceOp::from(op));
    }
    ops
}

fn report(ops: &[TraceOp]) -> String {
    report_with(ops, Limits::default())
}

fn report_with(ops: &[TraceOp], limits: Limits) -> String {
    let mut c = Checker::with_limits(limits);
    for op in ops {
        if c.check(op).is_err() {
            break;
        }
    }
    c.finish().to_json()
}

/// Names whose hashes clash resolve exactly as names whose hashes do not.
#[test]
fn clashing_name_hashes() {
    let mut all = String::new();
    for seed in 0..40 {
        let ops = program(seed);
        let plain = report(&ops);
        WEAK_NAME_HASH.with(|w| w.set(true));
        let weak = report(&ops);
        WEAK_NAME_HASH.with(|w| w.set(false));
        assert_eq!(plain, weak, "seed {seed}");
        all.push_str(&plain);
    }
    for kind in ["data-race", "reuse-race", "use-after-free", "invalid-free"] {
        assert!(all.contains(kind), "no {kind} in the programs");
    }
}

/// Every representation of histories and tombstones gives the same reports, with sweeps after
/// every op or after a few, so that histories move into the index and back.
#[test]
fn limits_change_no_report() {
    for seed in 0..60 {
        let ops = program(1000 + seed);
        let plain = report(&ops);
        for limits in [
            Limits {
                history_index_at: 0,
                small_freed_pages: 0,
                sweep_at: 0,
            },
            Limits {
                history_index_at: 3,
                small_freed_pages: 64,
                sweep_at: 8,
            },
        ] {
            assert_eq!(plain, report_with(&ops, limits), "seed {seed}, {limits:?}");
        }
    }
}

fn report_keeping(ops: &[TraceOp], keep: usize) -> String {
    let mut c = Checker::new();
    c.keep_free_details(keep);
    for op in ops {
        if c.check(op).is_err() {
            break;
        }
    }
    c.finish().to_json()
}

/// Forgetting freed names takes them out of the table: names whose hashes clash with them move
/// into their place and resolve as before.
#[test]
fn clashing_name_hashes_when_forgetting() {
    for seed in 0..40 {
        let ops = program(seed);
        for keep in [0, 1, 3] {
            let plain = report_keeping(&ops, keep);
            WEAK_NAME_HASH.with(|w| w.set(true));
            let weak = report_keeping(&ops, keep);
            WEAK_NAME_HASH.with(|w| w.set(false));
            assert_eq!(plain, weak, "seed {seed}, keep {keep}");
        }
    }
}
