//! A check from the first op to the report: the plain [`Checker`], or the checker with the
//! synchronization analysis ([`SyncChecker`]), finished with a re-check of the synchronization
//! ops whose what-if the analysis gave up ([`syncs::recheck`](super::syncs::recheck)), which
//! completes their verdicts.
//!
//! [`CheckRun`] takes the ops one at a time; [`CheckRun::finish`] makes the report. Where the
//! analysis gave a what-if up (beyond [`SyncConfig`]'s limits, or where CUDA graphs decide), the
//! ops are read again from a [`Reread`]: the ops kept in memory (`&[TraceOp]`), or a trace file
//! ([`TraceFile`]: the input itself, or a copy of it spooled while it was read).
//!
//! ```
//! use streamsan::analysis::run::{CheckRun, TraceFile};
//! use streamsan::trace::TraceReader;
//!
//! let trace = r#"
//! {"op":"alloc","buffer":"a","bytes":4096,"stream":"s1"}
//! {"op":"launch","stream":"s1","writes":["a"]}
//! {"op":"event_record","event":"e","stream":"s1"}
//! {"op":"event_wait","stream":"s2","event":"e"}
//! {"op":"launch","stream":"s2","reads":["a"]}
//! "#;
//! let mut reader = TraceReader::new(trace.as_bytes(), "example");
//! let mut run = CheckRun::new(true, false);
//! while let Some((op, _)) = reader.next_op().unwrap() {
//!     run.check(&op).unwrap();
//! }
//! // Nothing to read again: the ops were not kept (and no what-if was given up).
//! let report = run.finish(None::<TraceFile>).unwrap();
//! assert!(report.is_clean());
//! let syncs = report.syncs.unwrap();
//! // The wait orders the read after the write.
//! assert!(syncs[0].needed);
//! ```

use std::fs::File;
use std::io::BufReader;
use std::ops::ControlFlow;
use std::path::Path;

use crate::analysis::syncs::{resolve, SyncChecker, SyncConfig, SyncOutcome, Variants};
use crate::checker::{CheckError, Checker};
use crate::report::{Hazard, Report};
use crate::trace::{ParseError, TraceOp, TraceReader};

/// Where a run reads its ops again, from the first, to re-check the synchronization ops whose
/// what-if the analysis gave up.
pub trait Reread {
    /// Why the ops could not be read again.
    type Error;

    /// Hands every op to `each`, from the first, in order, and stops early where `each` breaks.
    /// Called once per walk of the re-check (32 ops are decided per walk).
    fn reread(
        &mut self,
        each: &mut dyn FnMut(&TraceOp) -> ControlFlow<()>,
    ) -> Result<(), Self::Error>;
}

/// The ops kept in memory.
impl Reread for &[TraceOp] {
    type Error = std::convert::Infallible;

    fn reread(
        &mut self,
        each: &mut dyn FnMut(&TraceOp) -> ControlFlow<()>,
    ) -> Result<(), Self::Error> {
        for op in self.iter() {
            if each(op).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// A trace file (JSON Lines), opened and read again for each walk.
#[derive(Clone, Copy, Debug)]
pub struct TraceFile<'a> {
    path: &'a Path,
    name: &'a str,
}

impl<'a> TraceFile<'a> {
    /// The trace at `path`; `name` is how the located messages of bad input name it.
    pub fn new(path: &'a Path, name: &'a str) -> Self {
        TraceFile { path, name }
    }
}

/// Why a [`TraceFile`] could not be read again.
#[derive(Debug, thiserror::Error)]
pub enum RereadError {
    /// The file could not be opened.
    #[error("{}: cannot open: {error}", path.display())]
    Open {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A line is not valid (the file changed since it was checked).
    #[error("{0}")]
    Read(ParseError),
}

impl Reread for TraceFile<'_> {
    type Error = RereadError;

    fn reread(
        &mut self,
        each: &mut dyn FnMut(&TraceOp) -> ControlFlow<()>,
    ) -> Result<(), RereadError> {
        let f = File::open(self.path).map_err(|error| RereadError::Open {
            path: self.path.to_path_buf(),
            error,
        })?;
        let reader = TraceReader::new(BufReader::with_capacity(1 << 16, f), self.name);
        each_op(reader, each).map_err(RereadError::Read)
    }
}

/// Hands every op `reader` reads to `each`, in order, and stops early where `each` breaks.
fn each_op<R: std::io::BufRead>(
    mut reader: TraceReader<R>,
    each: &mut dyn FnMut(&TraceOp) -> ControlFlow<()>,
) -> Result<(), ParseError> {
    while let Some((op, _)) = reader.next_op()? {
        if each(&op).is_break() {
            break;
        }
    }
    Ok(())
}

/// A trace (JSON Lines) held in memory, in parts read one after another (a part may end
/// inside a line: the lines are those of the parts joined), read again for each walk.
#[derive(Clone, Copy, Debug)]
pub struct TraceBytes<'a> {
    parts: &'a [Vec<u8>],
    name: &'a str,
}

impl<'a> TraceBytes<'a> {
    /// The trace held in `parts`; `name` is how the located messages of bad input name it.
    pub fn new(parts: &'a [Vec<u8>], name: &'a str) -> Self {
        TraceBytes { parts, name }
    }

    /// The trace's bytes, the parts joined, as a reader.
    pub fn reader(&self) -> PartsReader<'a> {
        PartsReader {
            parts: self.parts,
            at: 0,
        }
    }
}

/// Reads parts held in memory one after another, without joining them: [`TraceBytes::reader`].
#[derive(Clone, Debug)]
pub struct PartsReader<'a> {
    /// The parts not read to their end yet.
    parts: &'a [Vec<u8>],
    /// How far the first of them is read.
    at: usize,
}

impl std::io::Read for PartsReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let rest = std::io::BufRead::fill_buf(self)?;
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            n
        };
        std::io::BufRead::consume(self, n);
        Ok(n)
    }
}

impl std::io::BufRead for PartsReader<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while let Some((first, rest)) = self.parts.split_first() {
            if self.at < first.len() {
                return Ok(&first[self.at..]);
            }
            self.parts = rest;
            self.at = 0;
        }
        Ok(&[])
    }

    fn consume(&mut self, amount: usize) {
        self.at += amount;
    }
}

impl Reread for TraceBytes<'_> {
    type Error = ParseError;

    fn reread(
        &mut self,
        each: &mut dyn FnMut(&TraceOp) -> ControlFlow<()>,
    ) -> Result<(), ParseError> {
        each_op(TraceReader::new(self.reader(), self.name), each)
    }
}

/// Why a run's report could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum RecheckError<E> {
    /// The analysis gave up the what-ifs of `undecided` synchronization ops, and there is
    /// nothing to read the ops from again.
    #[error("the ops were not kept: {undecided} synchronization ops cannot be re-checked")]
    NotKept {
        /// How many synchronization ops are left undecided.
        undecided: usize,
    },
    /// Reading the ops again failed.
    #[error("{0}")]
    Read(E),
    /// The checker rejected an op read again (the ops are not those that were checked).
    #[error("op {op}: {0}", op = .0.op)]
    Check(CheckError),
}

/// The checker of a run.
#[derive(Clone)]
enum Engine {
    Plain(Box<Checker>),
    Syncs(Box<SyncChecker>),
}

/// A check, op by op: the plain [`Checker`], or the checker with the synchronization analysis.
/// [`finish`](Self::finish) makes the report, with a verdict on every synchronization op when
/// analysed.
#[derive(Clone)]
pub struct CheckRun {
    engine: Engine,
}

impl Default for CheckRun {
    /// A plain run.
    fn default() -> Self {
        Self::plain()
    }
}

impl CheckRun {
    /// A run with the synchronization analysis when `syncs`. `rereadable` says whether its ops
    /// can be read again at the end (a [`Reread`]): without, no what-if is given up for
    /// [`SyncConfig`]'s limits, so only CUDA graphs leave ops to a re-check.
    pub fn new(syncs: bool, rereadable: bool) -> Self {
        if !syncs {
            return Self::plain();
        }
        Self::with_syncs(if rereadable {
            SyncConfig::default()
        } else {
            SyncConfig {
                max_live: usize::MAX,
                max_host: usize::MAX,
            }
        })
    }

    /// A run of the plain checker.
    pub fn plain() -> Self {
        CheckRun {
            engine: Engine::Plain(Box::default()),
        }
    }

    /// A run with the synchronization analysis, under `config`.
    pub fn with_syncs(config: SyncConfig) -> Self {
        CheckRun {
            engine: Engine::Syncs(Box::new(SyncChecker::with_config(Checker::new(), config))),
        }
    }

    /// Checks the next op, as [`Checker::check`] does; returns the hazards it raised.
    pub fn check(&mut self, op: &TraceOp) -> Result<&[Hazard], CheckError> {
        match &mut self.engine {
            Engine::Plain(c) => c.check(op),
            Engine::Syncs(c) => c.check(op),
        }
    }

    /// The checker (with the analysis, the real one): its hazards, counters and state so far.
    pub fn checker(&self) -> &Checker {
        match &self.engine {
            Engine::Plain(c) => c,
            Engine::Syncs(c) => c.checker(),
        }
    }

    /// The number of ops checked so far.
    pub fn ops(&self) -> u64 {
        self.checker().ops()
    }

    /// The analysis, when the run has it: its counters ([`SyncChecker::stats`]) and memory.
    pub fn analysis(&self) -> Option<&SyncChecker> {
        match &self.engine {
            Engine::Plain(_) => None,
            Engine::Syncs(c) => Some(c),
        }
    }

    /// Ends the run without re-checking anything: see [`RunEnd`].
    pub fn end(self) -> RunEnd {
        RunEnd {
            ending: match self.engine {
                Engine::Plain(c) => Ending::Plain(c),
                Engine::Syncs(c) => Ending::Syncs(Box::new(c.finish())),
            },
        }
    }

    /// Ends the run: the report, with a verdict on every synchronization op when analysed. The
    /// ops whose what-if was given up are decided by re-checking the ops read from `again`;
    /// without it, that is an error ([`RecheckError::NotKept`]).
    pub fn finish<A: Reread>(self, again: Option<A>) -> Result<Report, RecheckError<A::Error>> {
        let mut end = self.end();
        end.recheck(again)?;
        Ok(end.into_report())
    }

    /// [`finish`](Self::finish), and the rest of the run (see [`RunRest`]) for the caller to
    /// drop where it likes.
    pub fn finish_apart<A: Reread>(
        self,
        again: Option<A>,
    ) -> Result<(Report, RunRest), RecheckError<A::Error>> {
        let mut end = self.end();
        end.recheck(again)?;
        Ok(end.into_report_apart())
    }
}

/// What is left of a run once its report is made ([`RunEnd::into_report_apart`]): the plain
/// checker's state (every buffer's history, the names, the graveyard), whose drop takes time in
/// proportion to what the run checked: a caller that must return fast (the end of a check
/// around a program) drops it elsewhere, on a thread of its own. Dropping it has no other effect.
pub struct RunRest {
    _checker: Option<Box<Checker>>,
}

/// How a run ended.
enum Ending {
    /// The plain checker, its report not made yet.
    Plain(Box<Checker>),
    /// The analysis's outcome.
    Syncs(Box<SyncOutcome>),
}

/// A run whose ops are all checked, before the re-check that completes the verdicts
/// ([`recheck`](Self::recheck)) and the report ([`into_report`](Self::into_report)).
pub struct RunEnd {
    ending: Ending,
}

impl RunEnd {
    /// With the analysis, its outcome so far: the verdicts of the ops still undecided are
    /// provisional ([`SyncOutcome::syncs`]).
    pub fn analysis(&self) -> Option<&SyncOutcome> {
        match &self.ending {
            Ending::Plain(_) => None,
            Ending::Syncs(o) => Some(o),
        }
    }

    /// How many synchronization ops a re-check has still to decide.
    pub fn undecided(&self) -> usize {
        self.analysis().map_or(0, |o| o.undecided.len())
    }

    /// Decides the undecided synchronization ops by re-checking the ops read from `again`,
    /// 32 per walk. Nothing to decide is no error, with or without `again`. On an error, the
    /// ops decided by the walks before stay decided, the others keep their provisional
    /// verdicts; without `again` (and ops to decide) nothing changes.
    pub fn recheck<A: Reread>(&mut self, again: Option<A>) -> Result<(), RecheckError<A::Error>> {
        let Ending::Syncs(outcome) = &mut self.ending else {
            return Ok(());
        };
        if outcome.undecided.is_empty() {
            return Ok(());
        }
        let Some(mut again) = again else {
            return Err(RecheckError::NotKept {
                undecided: outcome.undecided.len(),
            });
        };
        resolve(outcome, |skipped, real| {
            let mut variants = Variants::new(skipped, real);
            let mut failed = None;
            again
                .reread(&mut |op| match variants.check(op) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                })
                .map_err(RecheckError::Read)?;
            match failed {
                Some(e) => Err(RecheckError::Check(e)),
                None => Ok(variants.found()),
            }
        })
    }

    /// The report, with the verdicts on the synchronization ops when analysed (those still
    /// undecided provisional: `needed` where an error was found already).
    pub fn into_report(self) -> Report {
        match self.ending {
            Ending::Plain(c) => (*c).finish(),
            Ending::Syncs(o) => o.into_report(),
        }
    }

    /// [`into_report`](Self::into_report), without dropping the checker's state: it is in the
    /// [`RunRest`] (the analysis's outcome is dropped here).
    pub fn into_report_apart(self) -> (Report, RunRest) {
        match self.ending {
            Ending::Plain(mut c) => (c.take_report(), RunRest { _checker: Some(c) }),
            Ending::Syncs(o) => (o.into_report(), RunRest { _checker: None }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::syncs::brute_force;

    /// A trace whose second wait's what-if is given up at the second `graph_launch` (the
    /// launch stream's clock differs there): one op left to the re-check.
    const GRAPH: &str = r#"
{"op":"alloc","buffer":"x","bytes":4096,"stream":"s1"}
{"op":"alloc","buffer":"y","bytes":4096,"stream":"s1"}
{"op":"alloc","buffer":"src","bytes":4096,"stream":"s2"}
{"op":"graph_begin","graph":"g","stream":"s1"}
{"op":"launch","stream":"s1","name":"step","reads":["x"],"writes":["y"]}
{"op":"graph_end","graph":"g"}
{"op":"graph_launch","graph":"g","stream":"s1"}
{"op":"event_record","event":"e","stream":"s1"}
{"op":"event_wait","stream":"s2","event":"e"}
{"op":"copy","stream":"s2","src":"src","dst":"x"}
{"op":"event_record","event":"e2","stream":"s2"}
{"op":"event_wait","stream":"s1","event":"e2"}
{"op":"graph_launch","graph":"g","stream":"s1"}
"#;

    fn ops(text: &str) -> Vec<TraceOp> {
        let mut reader = TraceReader::new(text.as_bytes(), "t");
        let mut ops = Vec::new();
        while let Some((op, _)) = reader.next_op().expect("a valid trace") {
            ops.push(op);
        }
        ops
    }

    fn run(ops: &[TraceOp], syncs: bool, rereadable: bool) -> CheckRun {
        let mut run = CheckRun::new(syncs, rereadable);
        for op in ops {
            run.check(op).expect("a valid op");
        }
        run
    }

    #[test]
    fn the_recheck_completes_the_verdicts() {
        let ops = ops(GRAPH);
        let (report, syncs) = brute_force(&ops).expect("a valid trace");
        let end = run(&ops, true, true).end();
        assert_eq!(end.undecided(), 1);
        let plain = run(&ops, false, true)
            .finish(Some(&ops[..]))
            .expect("no re-check");
        assert_eq!(plain.syncs, None);
        assert_eq!(plain.to_json(), report.to_json());
        let analysed = run(&ops, true, true)
            .finish(Some(&ops[..]))
            .expect("re-checked");
        assert_eq!(analysed.syncs.as_ref(), Some(&syncs));
        assert!(analysed.syncs.iter().flatten().all(|s| s.needed));
        // From a file, as from memory.
        let path = std::env::temp_dir().join(format!(
            "streamsan-run-test-{}-{:?}.jsonl",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, GRAPH).expect("a temporary file");
        let from_file = run(&ops, true, true).finish(Some(TraceFile::new(&path, "t")));
        let _ = std::fs::remove_file(&path);
        assert_eq!(from_file.expect("re-checked").syncs.as_ref(), Some(&syncs));
        // From the lines held in memory, in parts that cut lines anywhere.
        let bytes = GRAPH.as_bytes();
        for cut in [1, 7, 64, bytes.len()] {
            let parts: Vec<Vec<u8>> = bytes.chunks(cut).map(<[u8]>::to_vec).collect();
            let from_bytes = run(&ops, true, true).finish(Some(TraceBytes::new(&parts, "t")));
            assert_eq!(from_bytes.expect("re-checked").syncs.as_ref(), Some(&syncs));
        }
        let mut read = String::new();
        let parts = [b"ab".to_vec(), Vec::new(), b"c\nd".to_vec()];
        std::io::Read::read_to_string(&mut TraceBytes::new(&parts, "t").reader(), &mut read)
            .expect("in memory");
        assert_eq!(read, "abc\nd");
        // Lines that are not valid ops are a located error.
        let bad = [b"{\"op\":\"nope\"}\n".to_vec()];
        let e = run(&ops, true, true)
            .finish(Some(TraceBytes::new(&bad, "kept")))
            .expect_err("bad lines");
        assert!(matches!(e, RecheckError::Read(_)));
        assert!(e.to_string().starts_with("kept:1:"), "{e}");
    }

    #[test]
    fn the_report_made_apart_is_the_report() {
        // The GRAPH trace (clean), and the same with its waits cut (racy), plain and analysed.
        let racy: Vec<TraceOp> = ops(GRAPH)
            .into_iter()
            .filter(|op| !matches!(op.op, crate::trace::Op::EventWait { .. }))
            .collect();
        let mut errors = Vec::new();
        for ops in [ops(GRAPH), racy] {
            for syncs in [false, true] {
                let whole = run(&ops, syncs, true)
                    .finish(Some(&ops[..]))
                    .expect("a report");
                let (apart, rest) = run(&ops, syncs, true)
                    .finish_apart(Some(&ops[..]))
                    .expect("a report");
                drop(rest);
                assert_eq!(apart.to_json(), whole.to_json());
                assert_eq!(apart.syncs, whole.syncs);
                errors.push(apart.errors);
            }
        }
        assert_eq!(errors[..2], [0, 0]);
        assert!(errors[2] > 0 && errors[3] > 0, "{errors:?}");
    }

    #[test]
    fn what_cannot_be_rechecked_is_an_error() {
        let ops = ops(GRAPH);
        let e = run(&ops, true, false)
            .finish(None::<&[TraceOp]>)
            .expect_err("nothing to read again");
        assert!(matches!(e, RecheckError::NotKept { undecided: 1 }));
        assert_eq!(
            e.to_string(),
            "the ops were not kept: 1 synchronization ops cannot be re-checked"
        );
        // Nothing left undecided: nothing to read again is no error.
        let clean = ops[..7].to_vec();
        let report = run(&clean, true, false).finish(None::<&[TraceOp]>);
        assert!(report.expect("decided").syncs.is_some_and(|s| s.is_empty()));
        // A file that is gone.
        let path = std::path::Path::new("/nonexistent/streamsan-run-test.jsonl");
        let e = run(&ops, true, true)
            .finish(Some(TraceFile::new(path, "t")))
            .expect_err("no file");
        assert!(matches!(e, RecheckError::Read(RereadError::Open { .. })));
        assert!(e
            .to_string()
            .starts_with(&format!("{}: cannot open: ", path.display())));
        // Ops that are not those checked: the checker rejects them.
        let other = self::ops(r#"{"op":"graph_end","graph":"g"}"#);
        let e = run(&ops, true, true)
            .finish(Some(&other[..]))
            .expect_err("other ops");
        let RecheckError::Check(c) = &e else {
            panic!("expected a check error, not {e}");
        };
        assert_eq!(e.to_string(), format!("op {}: {c}", c.op));
    }

    #[test]
    fn a_failed_recheck_leaves_the_verdicts_provisional() {
        let ops = ops(GRAPH);
        let mut end = run(&ops, true, true).end();
        let provisional = end.analysis().map(|o| o.syncs.clone());
        let other = self::ops(r#"{"op":"graph_end","graph":"g"}"#);
        assert!(end.recheck(Some(&other[..])).is_err());
        assert_eq!(end.undecided(), 0);
        assert_eq!(end.into_report().syncs, provisional);
    }
}
