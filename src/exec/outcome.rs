//! What a run of a program observed, and the program runners of the fuzzer.

use std::collections::{BTreeMap, HashSet};

use super::error::ExecError;
use crate::trace::{Id, TraceOp};

/// What a run observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// For each op and each region it read: (buffer, digest of the words read).
    pub reads: BTreeMap<(usize, usize), (Id, u64)>,
    /// Checksum of every buffer live at the end.
    pub live: BTreeMap<Id, u64>,
    /// For every buffer generation (by its alloc op): checksum of the last value each of its
    /// words received from an access of that buffer — its result, even if freed and reused since.
    pub written: BTreeMap<usize, (Id, u64)>,
    /// Scheduling steps taken.
    pub steps: usize,
    /// Words read (by an op, or at the end as part of a live buffer) that the reading buffer had
    /// not written: reads of uninitialized memory. In the sequential reference these are the
    /// program's own; a GPU returns the previous owner's bytes for them.
    pub uninitialized: u64,
}

impl Outcome {
    /// The buffers whose observed contents differ between two runs of one program.
    pub fn diverging(&self, other: &Outcome) -> Vec<Id> {
        let mut out: HashSet<Id> = HashSet::new();
        for (k, (b, d)) in &self.reads {
            if other.reads.get(k).map(|x| x.1) != Some(*d) {
                out.insert(b.clone());
            }
        }
        for (k, (b, _)) in &other.reads {
            if !self.reads.contains_key(k) {
                out.insert(b.clone());
            }
        }
        for (b, c) in &self.live {
            if other.live.get(b) != Some(c) {
                out.insert(b.clone());
            }
        }
        for (g, (b, c)) in &self.written {
            if other.written.get(g).map(|x| x.1) != Some(*c) {
                out.insert(b.clone());
            }
        }
        let mut v: Vec<Id> = out.into_iter().collect();
        v.sort();
        v
    }

    /// The ops whose reads differ between two runs.
    pub fn diverging_ops(&self, other: &Outcome) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .reads
            .iter()
            .filter(|(k, (_, d))| other.reads.get(k).map(|x| x.1) != Some(*d))
            .map(|(k, _)| k.0)
            .collect();
        v.dedup();
        v
    }
}

/// Runs programs for the fuzzer and `check --confirm`: a backend plus a scheduler per run — the
/// simulator ([`SimExecutor`](super::sim::SimExecutor)) or a GPU (`cuda::CudaExecutor`).
pub trait Executor {
    /// A short name for reports (`"sim"`, `"cuda"`).
    fn name(&self) -> &'static str;
    /// Whether a hold may name an op of a graph replay by its replayed op number
    /// ([`replay_numbering`](super::replay_numbering)): the backend schedules replayed ops one by
    /// one. Otherwise [`holds_for`](crate::fuzz::campaign::holds_for) holds the launch instead.
    fn holds_replayed_ops(&self) -> bool {
        false
    }
    /// The sequential, issue-order result ([`Sequential`](super::Sequential)).
    fn reference(&mut self, program: &[TraceOp]) -> Result<Outcome, ExecError>;
    /// A run under an unconstrained schedule chosen by `seed`
    /// ([`RandomScheduler`](super::RandomScheduler)).
    fn random(&mut self, program: &[TraceOp], seed: u64) -> Result<Outcome, ExecError>;
    /// A run steered so that each `(held, until)` op waits for `until` to complete first
    /// ([`Adversarial`](super::Adversarial)).
    fn provoke(
        &mut self,
        program: &[TraceOp],
        holds: &[(usize, usize)],
        seed: u64,
    ) -> Result<Outcome, ExecError>;
}
