use super::*;
use crate::exec::{Backend, Fill, Issued, Kernel, Op, Span, StreamKey, StreamKind};
use crate::trace::{Id, MemoryKind, Op as TOp, Region, TraceOp};

// ---- a session's device: eager, with lagging streams ----------------------------------------

fn device() -> Device {
    Device::session(1 << 30, 1 << 30, true)
}

fn alloc(d: &mut Device, bytes: u64, stream: StreamKey) -> Span {
    let Issued::Allocated(Some(addr)) = d
        .issue(
            0,
            Op::Alloc {
                memory: MemoryKind::Device,
                bytes,
                stream,
                at: None,
            },
        )
        .unwrap()
    else {
        panic!("an address")
    };
    Span {
        memory: MemoryKind::Device,
        addr,
        bytes,
        gen: 0,
        external: false,
    }
}

fn stream(d: &mut Device, key: StreamKey, kind: StreamKind) {
    d.issue(
        0,
        Op::StreamCreate {
            stream: key,
            kind,
            device: 0,
        },
    )
    .unwrap();
}

fn hash(d: &mut Device, s: StreamKey, id: u32, reads: &[Span], writes: &[Span], spin: bool) {
    d.issue(
        u64::from(id),
        Op::Launch {
            stream: s,
            kernel: Kernel::Hash {
                id,
                spin_ns: u64::from(spin),
            },
            reads: &reads,
            writes: &writes,
            fences: &[],
        },
    )
    .unwrap();
}

fn complete(i: Issued) -> bool {
    i == Issued::Complete(true)
}

#[test]
fn a_spin_delays_its_stream_until_a_sync() {
    let mut b = device();
    stream(&mut b, 1, StreamKind::NonBlocking);
    stream(&mut b, 2, StreamKind::NonBlocking);
    let x = alloc(&mut b, 64, 1);
    let y = alloc(&mut b, 64, 2);
    hash(&mut b, 1, 0, &[], &[x], false);
    let first = b.read(&x).unwrap();
    // Stream 2 reads x after a spin: queued.
    hash(&mut b, 2, 1, &[x], &[y], true);
    assert!(!complete(
        b.issue(0, Op::StreamQuery { stream: 2 }).unwrap()
    ));
    let before = b.read(&y).unwrap();
    // Stream 1 overwrites x meanwhile; stream 2 then reads the new contents.
    hash(&mut b, 1, 2, &[], &[x], false);
    b.issue(0, Op::DeviceSync { device: 0 }).unwrap();
    assert!(complete(b.issue(0, Op::StreamQuery { stream: 2 }).unwrap()));
    let after = b.read(&y).unwrap();
    assert_ne!(before, after);
    let mut expect = vec![0u32; 16];
    let second = b.read(&x).unwrap();
    crate::kernels::hash_region_cpu(1, 0, &[&second], &mut expect);
    assert_eq!(after, expect);
    assert_ne!(first, second);
}

#[test]
fn an_event_wait_forces_the_recorded_work() {
    let mut b = device();
    stream(&mut b, 1, StreamKind::NonBlocking);
    stream(&mut b, 2, StreamKind::NonBlocking);
    b.issue(0, Op::EventCreate { event: 0 }).unwrap();
    let x = alloc(&mut b, 64, 1);
    hash(&mut b, 1, 5, &[], &[x], true);
    b.issue(
        0,
        Op::EventRecord {
            event: 0,
            stream: 1,
        },
    )
    .unwrap();
    assert!(!complete(b.issue(0, Op::EventQuery { event: 0 }).unwrap()));
    b.issue(
        0,
        Op::EventWait {
            stream: 2,
            event: 0,
        },
    )
    .unwrap();
    assert!(complete(b.issue(0, Op::EventQuery { event: 0 }).unwrap()));
    let mut expect = vec![0u32; 16];
    crate::kernels::hash_region_cpu(5, 0, &[], &mut expect);
    assert_eq!(b.read(&x).unwrap(), expect);
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams() {
    let mut b = device();
    stream(&mut b, 1, StreamKind::Blocking);
    let x = alloc(&mut b, 64, 1);
    hash(&mut b, 1, 5, &[], &[x], true);
    assert!(
        !complete(b.issue(0, Op::StreamQuery { stream: 0 }).unwrap()),
        "default's query covers blocking streams"
    );
    b.issue(
        0,
        Op::Memset {
            stream: 0,
            dst: x,
            fill: Fill::Word(7),
            fences: &[],
        },
    )
    .unwrap();
    assert!(complete(b.issue(0, Op::StreamQuery { stream: 1 }).unwrap()));
    assert_eq!(b.read(&x).unwrap(), vec![7; 16]);
}

#[test]
fn a_free_with_record_stream_runs_the_recorded_work_first() {
    let mut b = device();
    stream(&mut b, 1, StreamKind::NonBlocking);
    stream(&mut b, 2, StreamKind::NonBlocking);
    let x = alloc(&mut b, 64, 1);
    let y = alloc(&mut b, 64, 2);
    hash(&mut b, 1, 1, &[], &[x], false);
    let input = b.read(&x).unwrap();
    hash(&mut b, 2, 2, &[x], &[y], true);
    b.issue(
        3,
        Op::Free {
            span: x,
            owner: 1,
            to: None,
            record_streams: &[2],
            placed: false,
        },
    )
    .unwrap();
    let z = alloc(&mut b, 64, 1);
    assert_eq!(z.addr, x.addr, "the block is reused");
    hash(&mut b, 1, 4, &[], &[z], false);
    let mut expect = vec![0u32; 16];
    crate::kernels::hash_region_cpu(2, 0, &[&input], &mut expect);
    assert_eq!(b.read(&y).unwrap(), expect, "the read ran before the reuse");
}

#[test]
fn unaligned_spans_change_only_their_bytes() {
    let mut b = device();
    let x = alloc(&mut b, 16, 0);
    b.issue(
        0,
        Op::Memset {
            stream: 0,
            dst: x,
            fill: Fill::Byte(0),
            fences: &[],
        },
    )
    .unwrap();
    let mid = Span {
        addr: x.addr + 3,
        bytes: 6,
        ..x
    };
    b.issue(
        0,
        Op::Store {
            stream: 0,
            dst: mid,
            data: &[1, 2, 3, 4, 5, 6],
        },
    )
    .unwrap();
    let Issued::Bytes(all) = b.issue(0, Op::Load { stream: 0, src: x }).unwrap() else {
        panic!("bytes")
    };
    assert_eq!(all, [0, 0, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0]);
    let Issued::Bytes(part) = b
        .issue(
            0,
            Op::Load {
                stream: 0,
                src: mid,
            },
        )
        .unwrap()
    else {
        panic!("bytes")
    };
    assert_eq!(part, [1, 2, 3, 4, 5, 6]);
}

#[test]
fn external_memory_is_not_simulated() {
    let mut b = device();
    let ext = Span {
        memory: MemoryKind::Device,
        addr: 0x1000,
        bytes: 64,
        gen: 0,
        external: true,
    };
    let e = b
        .issue(
            0,
            Op::Launch {
                stream: 0,
                kernel: Kernel::Hash { id: 0, spin_ns: 0 },
                reads: &[ext],
                writes: &[] as &[Span; 0],
                fences: &[],
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("external"), "{e}");
}

// ---- a program's device: scheduled -----------------------------------------------------------

fn ops(v: Vec<TOp>) -> Vec<TraceOp> {
    v.into_iter().map(TraceOp::from).collect()
}

fn talloc(b: &str, words: u64, s: &str) -> TOp {
    TOp::Alloc {
        buffer: b.into(),
        bytes: 4 * words,
        stream: Some(s.into()),
        memory: MemoryKind::Device,
        addr: None,
        pool: None,
    }
}

fn launch(s: &str, reads: &[&str], writes: &[&str]) -> TOp {
    TOp::Launch {
        stream: s.into(),
        name: None,
        reads: reads.iter().map(|b| Region::whole(*b)).collect(),
        writes: writes.iter().map(|b| Region::whole(*b)).collect(),
    }
}

#[test]
fn ordered_program_has_one_outcome() {
    let p = ops(vec![
        talloc("a", 64, "s1"),
        talloc("b", 64, "s1"),
        launch("s1", &[], &["a"]),
        TOp::EventRecord {
            event: "e".into(),
            stream: "s1".into(),
        },
        TOp::EventWait {
            stream: "s2".into(),
            event: "e".into(),
        },
        launch("s2", &["a"], &["b"]),
    ]);
    let ex = explore(&p, SimConfig { chunk_words: 32 }, 10_000).unwrap();
    assert!(ex.complete);
    assert!(ex.schedules > 1);
    assert!(ex.divergent.is_empty());
}

#[test]
fn racy_program_tears() {
    let p = ops(vec![
        talloc("a", 64, "s0"),
        talloc("b", 64, "s0"),
        launch("s1", &[], &["a"]),
        launch("s2", &["a"], &["b"]),
    ]);
    let ex = explore(&p, SimConfig { chunk_words: 32 }, 10_000).unwrap();
    assert!(ex.complete);
    assert!(
        !ex.divergent.is_empty(),
        "a read racing a write must tear in some schedule"
    );
}

#[test]
fn reuse_without_record_stream_corrupts_under_adversarial_schedule() {
    let p = ops(vec![
        talloc("a", 64, "s1"),
        talloc("out", 64, "s2"),
        launch("s1", &[], &["a"]),
        TOp::EventRecord {
            event: "e".into(),
            stream: "s1".into(),
        },
        TOp::EventWait {
            stream: "s2".into(),
            event: "e".into(),
        },
        launch("s2", &["a"], &["out"]),
        TOp::Free {
            buffer: "a".into(),
            stream: None,
        },
        talloc("b", 64, "s1"),
        launch("s1", &[], &["b"]),
    ]);
    let r = reference(&p).unwrap();
    let mut adv = Adversarial::new(vec![(5, 8)], 1);
    adv.starve = false;
    let o = run(&p, &mut adv, SimConfig::default()).unwrap();
    assert_eq!(o.diverging(&r), vec![Id::from("a"), Id::from("out")]);
    let mut fixed = p.clone();
    fixed.insert(
        6,
        TraceOp::from(TOp::RecordStream {
            buffer: "a".into(),
            stream: "s2".into(),
        }),
    );
    let r = reference(&fixed).unwrap();
    let mut adv = Adversarial::new(vec![(5, 9)], 1);
    adv.starve = false;
    let o = run(&fixed, &mut adv, SimConfig::default()).unwrap();
    assert!(o.diverging(&r).is_empty(), "record_stream fences the reuse");
}

#[test]
fn the_reference_reads_what_the_program_wrote() {
    let p = ops(vec![
        talloc("a", 8, "s1"),
        talloc("b", 8, "s1"),
        launch("s1", &[], &["a"]),
        launch("s1", &["a"], &["b"]),
    ]);
    let o = reference(&p).unwrap();
    assert_eq!(o.uninitialized, 0);
    assert_eq!(o.live.len(), 2);
    assert_eq!(o.written.len(), 2);
    let mut a = vec![0u32; 8];
    crate::kernels::hash_region_cpu(2, 0, &[], &mut a);
    assert_eq!(o.reads[&(3, 0)].1, crate::kernels::checksum(&a));
}

#[test]
fn a_read_of_memory_its_buffer_never_wrote_sees_where_other_writes_fell() {
    // `a` is written on s1 and freed; `d` takes its block on s1; s2 reads `d` (never written by
    // `d`) with no wait: it may run before `a`'s write lands (a read racing the allocation).
    let racy = |wait: bool| {
        let mut v = vec![
            talloc("a", 64, "s1"),
            launch("s1", &[], &["a"]),
            TOp::Free {
                buffer: "a".into(),
                stream: None,
            },
            talloc("d", 64, "s1"),
            TOp::EventRecord {
                event: "e".into(),
                stream: "s1".into(),
            },
        ];
        if wait {
            v.push(TOp::EventWait {
                stream: "s2".into(),
                event: "e".into(),
            });
        }
        v.push(launch("s2", &["d"], &[]));
        ops(v)
    };
    let p = racy(false);
    let r = reference(&p).unwrap();
    // The read, and the checksum of `d` at the end: memory `d` never wrote.
    assert_eq!(r.uninitialized, 2 * 64);
    // `a`'s write held until the read is done: the read lands before it, not after.
    let read = p.len() - 1;
    let o = run(
        &p,
        &mut Adversarial::new(vec![(1, read)], 0),
        SimConfig::default(),
    )
    .unwrap();
    assert_eq!(o.diverging(&r), vec![Id::from("d")]);
    // Ordered after the allocation: every schedule reads the same.
    let ex = explore(&racy(true), SimConfig { chunk_words: 16 }, 100_000).unwrap();
    assert!(ex.complete && ex.schedules > 1);
    assert!(ex.divergent.is_empty());
}

/// A program as trace lines.
fn parse(lines: &str) -> Vec<TraceOp> {
    crate::trace::TraceReader::new(lines.as_bytes(), "test")
        .map(|r| r.unwrap().0)
        .collect()
}

/// Each hazard of `p`'s check as (kind, op, runs that observed corruption of 5) on the
/// simulator, provoked as `check --confirm sim` does.
fn confirmations(p: &[TraceOp]) -> Vec<(String, u64, u32)> {
    let report = crate::fuzz::campaign::check_program(p).unwrap();
    report
        .hazards
        .iter()
        .map(|h| {
            let (observed, _) =
                crate::fuzz::campaign::confirm(p, h, &mut SimExecutor::default(), 5, h.op)
                    .unwrap()
                    .unwrap();
            (h.kind.to_string(), h.op, observed)
        })
        .collect()
}

#[test]
fn races_whose_victim_reads_memory_never_written_are_confirmed() {
    let pinned = r#"
{"op":"alloc","buffer":"h","bytes":4096,"memory":"pinned"}
{"op":"host_write","buffer":"h"}
{"op":"alloc","buffer":"d","bytes":4096,"stream":"s1"}
"#;
    // A copy from host-written pinned memory into fresh device memory, read by another stream
    // with no wait: the read lands before the copy.
    let copy_then_read = format!(
        "{pinned}{}\n{}\n",
        r#"{"op":"copy","stream":"s1","src":"h","dst":"d"}"#,
        r#"{"op":"launch","stream":"s2","name":"consume","reads":["d"]}"#
    );
    assert_eq!(
        confirmations(&parse(&copy_then_read)),
        vec![("data-race".into(), 4, 5)]
    );
    // The reader issued before the copy, its stream not ordered after the allocation (s1 had
    // work before it): the read racing the allocation lands before the previous owner's write.
    let read_then_copy = format!(
        "{}\n{}\n{pinned}{}\n{}\n",
        r#"{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}"#,
        r#"{"op":"launch","stream":"s1","name":"produce","writes":["x"]}"#,
        r#"{"op":"launch","stream":"s2","name":"consume","reads":["d"]}"#,
        r#"{"op":"copy","stream":"s1","src":"h","dst":"d"}"#
    );
    assert_eq!(
        confirmations(&parse(&read_then_copy)),
        vec![("data-race".into(), 5, 5), ("data-race".into(), 6, 5)]
    );
    // A copy reads pinned memory it never wrote while the host frees it and writes the block's
    // next owner.
    assert_eq!(
        confirmations(&parse(include_str!(
            "../../../tests/conformance/pinned-reuse.jsonl"
        ))),
        vec![("unsafe-free".into(), 3, 5), ("reuse-race".into(), 5, 5)]
    );
    // A graph replay reads its input, never written, while the input is freed and its block
    // written again (the replayed read held by its number in the provoked program).
    assert_eq!(
        confirmations(&parse(include_str!(
            "../../../tests/conformance/graph-free-after-replay.jsonl"
        ))),
        vec![("unsafe-free".into(), 5, 5)]
    );
}
