//! `record_stream` and reuse: the allocator hands a freed buffer's memory out again only after
//! events recorded, at the free, on every stream named by `record_stream` complete. So an access
//! that happens before the clock, at the free, of such a stream — its own work and everything it
//! had synchronized with — happens before every access to memory that reuses those bytes, and is
//! never a `reuse-race` conflict.
//!
//! The property is checked on random programs built to make such orderings common (chains of
//! event waits that end on the recorded stream, the legacy default stream's implicit edges),
//! with happens-before taken from the brute-force oracle's graph (`oracle_paths`), not from the
//! checker: for every `reuse-race` the checker reports, no conflict may have a path to the latest
//! op, at the free, of a stream that `record_stream` named for the freed buffer. The test also
//! counts how often the random programs gave the checker the chance to get it wrong (a reuse of
//! bytes whose earlier access was ordered only through a recorded stream), and fails if that
//! never happened.

use std::collections::HashMap;

use streamsan::oracle::{oracle_hazards, oracle_paths};
use streamsan::report::AccessKind;
use streamsan::trace::{Id, MemoryKind, Op, Region, TraceOp};
use streamsan::{Checker, HazardKind};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const STREAMS: [&str; 5] = ["default", "b0", "s1", "s2", "s3"];
const NAMES: [&str; 3] = ["x", "y", "z"];

/// A random program of `len` ops: allocations, launches on random streams touching live
/// buffers, event records and waits (so orderings chain across streams), `record_stream`s and
/// caching frees. `b0` is a blocking stream (legacy default stream edges).
fn program(rng: &mut Rng, len: usize) -> Vec<TraceOp> {
    let mut ops: Vec<Op> = vec![Op::StreamCreate {
        stream: "b0".into(),
        device: 0,
        blocking: true,
    }];
    let mut live: Vec<&str> = Vec::new();
    let mut recorded_events = 0u64;
    while ops.len() < len {
        let stream = Id::from(STREAMS[rng.below(STREAMS.len() as u64) as usize]);
        match rng.below(10) {
            0 | 1 => {
                let free: Vec<&str> = NAMES
                    .iter()
                    .copied()
                    .filter(|n| !live.contains(n))
                    .collect();
                if let Some(&name) = free.get(rng.below(free.len().max(1) as u64) as usize) {
                    ops.push(Op::Alloc {
                        buffer: name.into(),
                        bytes: 512 * (1 + rng.below(2)),
                        stream: Some(stream),
                        memory: MemoryKind::Device,
                        addr: None,
                        pool: None,
                    });
                    live.push(name);
                }
            }
            2..=4 => {
                let mut reads = Vec::new();
                let mut writes = Vec::new();
                for &name in &live {
                    match rng.below(3) {
                        0 => reads.push(Region::whole(name)),
                        1 => writes.push(Region::whole(name)),
                        _ => {}
                    }
                }
                ops.push(Op::Launch {
                    stream,
                    name: None,
                    reads,
                    writes,
                });
            }
            5 => {
                recorded_events += 1;
                ops.push(Op::EventRecord {
                    event: Id::from(format!("e{}", recorded_events % 4).as_str()),
                    stream,
                });
            }
            6 | 7 if recorded_events > 0 => ops.push(Op::EventWait {
                stream,
                event: Id::from(format!("e{}", rng.below(recorded_events.min(4))).as_str()),
            }),
            8 if !live.is_empty() => {
                let name = live[rng.below(live.len() as u64) as usize];
                ops.push(Op::RecordStream {
                    buffer: name.into(),
                    stream,
                });
            }
            9 if !live.is_empty() => {
                let k = rng.below(live.len() as u64) as usize;
                let name = live.swap_remove(k);
                ops.push(Op::Free {
                    buffer: name.into(),
                    stream: None,
                });
            }
            _ => {}
        }
    }
    ops.into_iter().map(TraceOp::from).collect()
}

/// For each free op: the latest op, at the free, of every stream `record_stream` named for the
/// freed buffer (the owning stream excepted: the allocator ignores it).
fn recorded_at_free(ops: &[TraceOp]) -> HashMap<usize, Vec<usize>> {
    let mut last_on: HashMap<Id, usize> = HashMap::new();
    let mut owner: HashMap<Id, Id> = HashMap::new();
    let mut recorded: HashMap<Id, Vec<Id>> = HashMap::new();
    let mut out = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        match &op.op {
            Op::Alloc { buffer, stream, .. } => {
                let s = stream.clone().unwrap_or_else(|| Id::from("default"));
                owner.insert(buffer.clone(), s);
                recorded.remove(buffer);
            }
            Op::RecordStream { buffer, stream } if owner.get(buffer) != Some(stream) => {
                recorded
                    .entry(buffer.clone())
                    .or_default()
                    .push(stream.clone());
            }
            Op::Free { buffer, .. } => {
                let lasts = recorded
                    .remove(buffer)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|s| last_on.get(s).copied())
                    .collect();
                out.insert(i, lasts);
            }
            _ => {}
        }
        if let Some(s) = op.op.on_stream() {
            last_on.insert(s.clone(), i);
        }
    }
    out
}

/// The node that orders an earlier access: the op itself, or for an allocation's use the latest
/// launch on its owning stream before it (`None`: before everything).
fn access_node(ops: &[TraceOp], op: usize, kind: AccessKind) -> Option<usize> {
    if kind != AccessKind::Alloc {
        return Some(op);
    }
    let Op::Alloc { stream, .. } = &ops[op].op else {
        return Some(op);
    };
    let owner = stream.clone().unwrap_or_else(|| Id::from("default"));
    (0..op).rev().find(|&k| {
        matches!(&ops[k].op, Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } if *stream == owner)
    })
}

/// The free of the generation of `name` that holds op `at`: the first free of the name after it.
fn free_after(ops: &[TraceOp], name: &str, at: usize) -> Option<usize> {
    (at + 1..ops.len())
        .find(|&k| matches!(&ops[k].op, Op::Free { buffer, .. } if buffer.as_str() == name))
}

fn trace_text(ops: &[TraceOp]) -> String {
    let mut out = String::new();
    for op in ops {
        streamsan::trace::write_op(op, &mut out);
        out.push('\n');
    }
    out
}

fn reaches(paths: &[Vec<u64>], from: usize, to: usize) -> bool {
    from == to || paths[to][from / 64] & (1 << (from % 64)) != 0
}

#[test]
fn no_reuse_race_names_an_access_a_recorded_stream_covered_at_the_free() {
    let mut reuse_races = 0;
    let mut chances = 0;
    for seed in 0..4000u64 {
        let ops = program(&mut Rng(seed), 40);
        let paths = oracle_paths(&ops).expect("well-formed program");
        let recorded = recorded_at_free(&ops);
        let report = Checker::check_all(&ops).expect("well-formed program");
        // The checker and the oracle agree on these programs too.
        let oracle: Vec<(u64, HazardKind, Option<String>)> = oracle_hazards(&ops)
            .expect("well-formed program")
            .into_iter()
            .map(|h| (h.op, h.kind, h.buffer))
            .collect();
        let mut got: Vec<(u64, HazardKind, Option<String>)> = report
            .hazards
            .iter()
            .map(|h| (h.op, h.kind, h.buffer.clone()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            oracle,
            "seed {seed}: checker (left) and oracle (right)\n{}",
            trace_text(&ops)
        );
        for h in report
            .hazards
            .iter()
            .filter(|h| h.kind == HazardKind::ReuseRace)
        {
            reuse_races += 1;
            for c in &h.conflicts {
                let Some(node) = access_node(&ops, c.op as usize, c.access) else {
                    panic!("seed {seed}: conflict {c:?} happens before everything");
                };
                let free = free_after(&ops, &c.buffer, c.op as usize)
                    .unwrap_or_else(|| panic!("seed {seed}: {} is not freed", c.buffer));
                let covered = recorded[&free]
                    .iter()
                    .any(|&last| reaches(&paths, node, last));
                assert!(
                    !covered,
                    "seed {seed}: reuse-race at op {} names op {} of {}, which a stream named by \
                     record_stream had synchronized with by the free at op {free}\n{}",
                    h.op,
                    c.op,
                    c.buffer,
                    trace_text(&ops)
                );
            }
        }
        // Chances to get it wrong: a freed buffer's access by a stream that record_stream did
        // not name, ordered before a recorded stream's latest op at the free.
        for (&free, lasts) in &recorded {
            let Op::Free { buffer, .. } = &ops[free].op else {
                continue;
            };
            let alloc = (0..free)
                .rev()
                .find(|&k| matches!(&ops[k].op, Op::Alloc { buffer: b, .. } if b == buffer));
            let Some(alloc) = alloc else { continue };
            for k in alloc + 1..free {
                let touches = match &ops[k].op {
                    Op::Launch { reads, writes, .. } => {
                        reads.iter().chain(writes).any(|r| r.buffer == *buffer)
                    }
                    _ => false,
                };
                let own = ops[k]
                    .op
                    .on_stream()
                    .is_some_and(|s| lasts.iter().any(|&l| ops[l].op.on_stream() == Some(s)));
                if touches && !own && lasts.iter().any(|&l| reaches(&paths, k, l)) {
                    chances += 1;
                }
            }
        }
    }
    eprintln!(
        "{reuse_races} reuse races checked; {chances} accesses ordered through a recorded stream"
    );
    assert!(
        reuse_races > 100,
        "only {reuse_races} reuse races were found"
    );
    assert!(
        chances > 100,
        "only {chances} accesses were ordered through a recorded stream"
    );
}
