//! The oracle against hand-made traces of every rule.

use super::*;

fn alloc(buffer: &str, bytes: u64, stream: &str) -> Op {
    Op::Alloc {
        buffer: buffer.into(),
        bytes,
        stream: Some(stream.into()),
        memory: MemoryKind::Device,
        addr: None,
        pool: None,
    }
}

fn alloc_at(buffer: &str, bytes: u64, stream: &str, addr: u64) -> Op {
    Op::Alloc {
        buffer: buffer.into(),
        bytes,
        stream: Some(stream.into()),
        memory: MemoryKind::Device,
        addr: Some(addr),
        pool: None,
    }
}

fn pinned(buffer: &str, bytes: u64) -> Op {
    Op::Alloc {
        buffer: buffer.into(),
        bytes,
        stream: None,
        memory: MemoryKind::Pinned,
        addr: None,
        pool: None,
    }
}

fn launch(stream: &str, reads: &[&str], writes: &[&str]) -> Op {
    Op::Launch {
        stream: stream.into(),
        name: None,
        reads: reads.iter().map(|b| Region::whole(*b)).collect(),
        writes: writes.iter().map(|b| Region::whole(*b)).collect(),
    }
}

fn copy(stream: &str, src: &str, dst: &str) -> Op {
    Op::Copy {
        stream: stream.into(),
        src: Region::whole(src),
        dst: Region::whole(dst),
    }
}

fn record(event: &str, stream: &str) -> Op {
    Op::EventRecord {
        event: event.into(),
        stream: stream.into(),
    }
}

fn wait(stream: &str, event: &str) -> Op {
    Op::EventWait {
        stream: stream.into(),
        event: event.into(),
    }
}

fn free(buffer: &str) -> Op {
    Op::Free {
        buffer: buffer.into(),
        stream: None,
    }
}

fn free_on(buffer: &str, stream: &str) -> Op {
    Op::Free {
        buffer: buffer.into(),
        stream: Some(stream.into()),
    }
}

fn run(ops: Vec<Op>) -> Vec<(u64, HazardKind, Option<String>, Vec<u64>)> {
    let ops: Vec<TraceOp> = ops.into_iter().map(TraceOp::from).collect();
    oracle_hazards(&ops)
        .expect("valid trace")
        .into_iter()
        .map(|h| (h.op, h.kind, h.buffer, h.conflicts))
        .collect()
}

fn h(
    op: u64,
    kind: HazardKind,
    buffer: &str,
    conflicts: &[u64],
) -> (u64, HazardKind, Option<String>, Vec<u64>) {
    (op, kind, Some(buffer.to_owned()), conflicts.to_vec())
}

use HazardKind::{DataRace, ReuseRace, UnsafeFree};

#[test]
fn raw_cross_stream() {
    let ops = vec![
        alloc("a", 4096, "s1"),
        launch("s1", &[], &["a"]),
        launch("s2", &["a"], &[]),
    ];
    assert_eq!(run(ops), vec![h(2, DataRace, "a", &[1])]);
}

#[test]
fn raw_cross_stream_fixed() {
    let ops = vec![
        alloc("a", 4096, "s1"),
        launch("s1", &[], &["a"]),
        record("e", "s1"),
        wait("s2", "e"),
        launch("s2", &["a"], &[]),
    ];
    assert_eq!(run(ops), vec![]);
}

#[test]
fn reuse_race() {
    let ops = vec![
        alloc("a", 4096, "s1"),
        launch("s1", &[], &["a"]),
        record("e", "s1"),
        wait("s2", "e"),
        launch("s2", &["a"], &[]),
        free("a"),
        alloc("b", 4096, "s1"),
        launch("s1", &[], &["b"]),
    ];
    assert_eq!(
        run(ops),
        vec![h(5, UnsafeFree, "a", &[4]), h(7, ReuseRace, "b", &[4])]
    );
}

#[test]
fn stream_ordered_free() {
    let ops = vec![
        alloc("a", 4096, "s1"),
        launch("s1", &[], &["a"]),
        free_on("a", "s2"),
        alloc("b", 4096, "s2"),
        launch("s2", &[], &["b"]),
    ];
    assert_eq!(
        run(ops),
        vec![h(2, UnsafeFree, "a", &[1]), h(4, ReuseRace, "b", &[1])]
    );
}

#[test]
fn legacy_default_nonblocking_and_blocking() {
    for (blocking, expect) in [
        (
            false,
            vec![h(3, DataRace, "a", &[2]), h(4, DataRace, "a", &[3])],
        ),
        (true, vec![]),
    ] {
        let ops = vec![
            Op::StreamCreate {
                stream: "n".into(),
                device: 0,
                blocking,
            },
            alloc("a", 4096, "n"),
            launch("n", &[], &["a"]),
            launch("default", &["a"], &["a"]),
            launch("n", &["a"], &[]),
        ];
        assert_eq!(run(ops), expect, "blocking: {blocking}");
    }
}

#[test]
fn event_snapshot() {
    let ops = vec![
        alloc("a", 4096, "s1"),
        launch("s1", &[], &["a"]),
        record("e", "s1"),
        launch("s1", &[], &["a"]),
        wait("s2", "e"),
        launch("s2", &["a"], &[]),
    ];
    assert_eq!(run(ops), vec![h(5, DataRace, "a", &[3])]);
}

#[test]
fn unsafe_free_record_stream() {
    let ops = vec![
        alloc("a", 4096, "s1"),
        launch("s1", &[], &["a"]),
        record("e", "s1"),
        wait("s2", "e"),
        launch("s2", &["a"], &[]),
        Op::RecordStream {
            buffer: "a".into(),
            stream: "s2".into(),
        },
        free("a"),
        alloc("b", 4096, "s1"),
        launch("s1", &[], &["b"]),
    ];
    assert_eq!(run(ops), vec![]);
}

#[test]
fn pinned_reuse() {
    let ops = vec![
        pinned("p", 1000),
        alloc("d", 1000, "s1"),
        copy("s1", "p", "d"),
        free("p"),
        pinned("q", 1000),
        Op::HostWrite {
            buffer: Region::whole("q"),
        },
    ];
    assert_eq!(
        run(ops),
        vec![h(3, UnsafeFree, "p", &[2]), h(5, ReuseRace, "q", &[2])]
    );
}

#[test]
fn addr_reappear() {
    let a = 1 << 20;
    let ops = vec![
        alloc_at("a", 4096, "s1", a),
        launch("s1", &[], &["a"]),
        record("e", "s1"),
        wait("s2", "e"),
        launch("s2", &["a"], &[]),
        free("a"),
        alloc_at("b", 4096, "s3", a),
        launch("s3", &[], &["b"]),
        record("f", "s3"),
        wait("s4", "f"),
        launch("s4", &["b"], &[]),
        free("b"),
        alloc_at("c", 4096, "s3", a),
        launch("s3", &[], &["c"]),
    ];
    assert_eq!(
        run(ops),
        vec![
            h(5, UnsafeFree, "a", &[4]),
            h(11, UnsafeFree, "b", &[10]),
            h(13, ReuseRace, "c", &[10]),
        ]
    );
}

#[test]
fn bad_input_is_an_error() {
    let bad = [
        vec![alloc("a", 10, "s1"), alloc("a", 10, "s1")],
        vec![alloc("a", 10, "host")],
        vec![
            alloc("a", 10, "s1"),
            Op::Memset {
                stream: "s1".into(),
                dst: Region::range("a", 8, 4),
            },
        ],
        vec![
            alloc("a", 10, "s1"),
            Op::HostRead {
                buffer: Region::whole("a"),
            },
        ],
    ];
    for ops in bad {
        let ops: Vec<TraceOp> = ops.into_iter().map(TraceOp::from).collect();
        assert!(oracle_hazards(&ops).is_err(), "{ops:?}");
    }
}
