//! Loom models of what a session shares between host threads: its lock, the recorder's batch and
//! channels, and the checker thread.
//!
//! These run the real session code (`Session::simulated`): under `--cfg loom` the session's
//! `Mutex`, channels and checker thread come from loom (`src/sync.rs`), so loom explores the
//! interleavings of host threads issuing ops, the checker thread draining batches, `hazards()`
//! round trips and `finish()`. Run them with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --test loom_recorder --release -- --nocapture
//! ```
//!
//! Each test prints how many interleavings loom explored. The preemption bound is 3 unless
//! `LOOM_MAX_PREEMPTIONS` says otherwise. In a normal `cargo test` this file is empty.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;
use streamsan::session::{Session, SessionError};
use streamsan::trace::{Op, TraceOp};
use streamsan::{Checker, HazardKind, Report};

/// Runs `f` under loom; returns and prints the number of interleavings explored.
fn explore(name: &str, f: impl Fn() + Sync + Send + 'static) -> usize {
    let iterations = Arc::new(AtomicUsize::new(0));
    let counter = iterations.clone();
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let n = iterations.load(Ordering::Relaxed);
    println!("{name}: {n} interleavings");
    assert!(n > 1, "{name}: loom explored a single interleaving");
    n
}

/// The report a fresh checker gives for `trace`, unexplained: what the session's `hazards()`
/// must give.
fn offline_unexplained(trace: &[TraceOp]) -> Report {
    let mut checker = Checker::new();
    for op in trace {
        checker.check(op).expect("the session records valid ops");
    }
    checker.finish()
}

/// The report a fresh checker gives for `trace`, with its hazards explained from the trace as
/// the session's `finish()` explains them: what `finish()` must give.
fn offline(trace: &[TraceOp]) -> Report {
    let mut checker = Checker::new();
    for op in trace {
        checker.check(op).expect("the session records valid ops");
    }
    let implicit = checker.implicit_syncs().to_vec();
    let mut report = checker.finish();
    if !report.hazards.is_empty() {
        streamsan::graph::explain_program(trace, &mut report, &implicit, "offline");
    }
    report
}

/// The launches of a trace, by kernel name, with their op indices.
fn launches(trace: &[TraceOp]) -> Vec<(usize, String)> {
    trace
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match &op.op {
            Op::Launch { name, .. } => Some((i, name.as_deref().unwrap_or_default().to_owned())),
            _ => None,
        })
        .collect()
}

fn unwrap_session(session: Arc<Session>) -> Session {
    Arc::try_unwrap(session).unwrap_or_else(|_| panic!("a thread still holds the session"))
}

/// Two host threads, each launching on its own stream into its own buffer and freeing it: every
/// op is recorded exactly once, each thread's ops in its program order, and the checker thread's
/// report equals a fresh check of the recorded trace (no hazard: nothing is shared).
/// How many interleavings recorded `t1` first, and `t2` first.
static ORDERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

#[test]
fn concurrent_threads_are_recorded_once_in_lock_order() {
    explore("concurrent_threads", || {
        let session = Arc::new(Session::simulated());
        let s1 = session.stream().unwrap();
        let s2 = session.stream().unwrap();
        let a = session.alloc::<u32>(&s1, 4).unwrap();
        let b = session.alloc::<u32>(&s2, 4).unwrap();
        let before = session.ops();
        let workers: Vec<_> = [(s1, a, "t1"), (s2, b, "t2")]
            .into_iter()
            .map(|(stream, mut buf, name)| {
                let session = session.clone();
                thread::spawn(move || {
                    session
                        .launch(&stream, name)
                        .write(&mut buf)
                        .hash()
                        .unwrap();
                    buf.free().unwrap();
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(session.ops(), before + 4);
        let trace = session.trace().unwrap();
        assert_eq!(trace.len() as u64, before + 4);
        let names: Vec<String> = launches(&trace).into_iter().map(|(_, n)| n).collect();
        assert!(names == ["t1", "t2"] || names == ["t2", "t1"], "{names:?}");
        ORDERS[usize::from(names[0] == "t2")].fetch_add(1, Ordering::Relaxed);
        for (i, name) in launches(&trace) {
            // The thread's free follows its launch.
            let freed = trace[i + 1..]
                .iter()
                .any(|op| matches!(&op.op, Op::Free { .. }));
            assert!(freed, "{name}'s free is missing after its launch");
        }
        let report = unwrap_session(session).finish().unwrap();
        assert_eq!(report.ops, before + 4);
        assert_eq!(report, offline(&trace));
        assert!(report.hazards.is_empty(), "{:?}", report.hazards);
    });
    let orders = ORDERS.each_ref().map(|n| n.load(Ordering::Relaxed));
    println!(
        "concurrent_threads: t1 first in {}, t2 first in {}",
        orders[0], orders[1]
    );
    assert!(orders[0] > 0 && orders[1] > 0, "loom must try both orders");
}

/// Two host threads race on one buffer from two streams: whatever order the lock gives them,
/// the checker thread reports what a fresh check of that order reports, and a data race on the
/// buffer at the later launch.
#[test]
fn racing_threads_get_the_report_of_their_order() {
    explore("racing_threads", || {
        let session = Arc::new(Session::simulated());
        let s1 = session.stream().unwrap();
        let s2 = session.stream().unwrap();
        let x = session.alloc_named::<u32>(&s1, "x", 4).unwrap();
        let region = x.slice(..);
        let reader = {
            let session = session.clone();
            thread::spawn(move || {
                session.launch(&s2, "read").reads(region).hash().unwrap();
            })
        };
        let writer = {
            let session = session.clone();
            thread::spawn(move || {
                session.launch(&s1, "write").writes(region).hash().unwrap();
            })
        };
        reader.join().unwrap();
        writer.join().unwrap();
        drop(x);
        let trace = session.trace().unwrap();
        let later = launches(&trace).last().expect("two launches").0 as u64;
        let report = unwrap_session(session).finish().unwrap();
        assert_eq!(report, offline(&trace));
        assert!(
            report.hazards.iter().any(|h| h.kind == HazardKind::DataRace
                && h.op == later
                && h.buffer.as_deref() == Some("x")),
            "no data race at op {later}: {:?}",
            report.hazards
        );
    });
}

/// A thread asks for the hazards (a call round trip to the checker thread, under the session's
/// lock) while another records a racy launch: what it sees is a prefix of the final report, and
/// the final report is the offline check of the trace.
#[test]
fn hazards_while_recording_see_a_prefix() {
    explore("hazards_while_recording", || {
        let session = Arc::new(Session::simulated());
        let s1 = session.stream().unwrap();
        let s2 = session.stream().unwrap();
        let mut x = session.alloc::<u32>(&s1, 4).unwrap();
        session.launch(&s1, "first").write(&mut x).hash().unwrap();
        let region = x.slice(..);
        let racer = {
            let session = session.clone();
            thread::spawn(move || {
                session.launch(&s2, "racer").writes(region).hash().unwrap();
            })
        };
        let asker = {
            let session = session.clone();
            thread::spawn(move || session.hazards().unwrap())
        };
        racer.join().unwrap();
        let seen = asker.join().unwrap();
        let trace = session.trace().unwrap();
        let final_hazards = session.hazards().unwrap();
        assert!(
            final_hazards.starts_with(&seen),
            "seen {seen:?}\nfinal {final_hazards:?}"
        );
        assert!(seen.is_empty() || seen == final_hazards);
        assert_eq!(final_hazards, offline_unexplained(&trace).hazards);
        assert!(!final_hazards.is_empty(), "the racy launch is reported");
        x.free().unwrap();
        let report = unwrap_session(session).finish().unwrap();
        assert_eq!(report.ops as usize, trace.len() + 1);
    });
}

/// `finish` races with a thread that records through stream and event handles: every call
/// either is recorded (and counted by the report) or fails with `Finished`; none is lost, none
/// hangs.
#[test]
fn finish_races_with_recording_handles() {
    explore("finish_races", || {
        let session = Session::simulated();
        let s1 = session.stream().unwrap();
        let s2 = session.stream().unwrap();
        let e = session.event().unwrap();
        let before = session.ops();
        let worker = thread::spawn(move || {
            let results = [e.record(&s1), s2.wait(&e), s1.synchronize()];
            let recorded = results
                .into_iter()
                .map(|r| match r {
                    Ok(()) => 1u64,
                    Err(SessionError::Finished) => 0,
                    Err(other) => panic!("unexpected error: {other}"),
                })
                .sum::<u64>();
            // The handles go back to the main thread: dropping the event here could record an
            // `event_destroy` that `recorded` does not count.
            (recorded, e, s1, s2)
        });
        let report = session.finish().unwrap();
        let (recorded, e, s1, s2) = worker.join().unwrap();
        assert_eq!(report.ops, before + recorded);
        // Handles outliving the session record nothing and do not panic.
        drop((e, s1, s2));
    });
}
