//! `streamsan._streamsan`: the checker of streamsan inside a Python process, and the `streamsan`
//! command of the wheel.
//!
//! The Python package (`python/streamsan/`) re-exports what is here; this module is private.
//! Ops go in as the trace format has them (a dict, or JSON Lines text), hazards come out as the
//! JSON report has them (dicts), and bad input raises `streamsan.TraceError` with the located
//! message the command line prints. Nothing here panics across the boundary: every error a user
//! can cause is a Python exception.

use std::borrow::Cow;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyCapsule, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use streamsan::analysis::run::{CheckRun, RecheckError, TraceBytes, TraceFile};
use streamsan::graph::Picture;
use streamsan::report::{render_sarif, render_text, SarifOptions, TextOptions};
use streamsan::trace::{ParseError, TraceReader};

mod worker;
use worker::{lock, Core, LineError, OpsCopy, Options, Refused, Shared};

/// The command line, compiled from the same source as the `streamsan` binary.
#[allow(dead_code)]
#[path = "../../../src/bin/streamsan/main.rs"]
mod cli;

pyo3::create_exception!(
    streamsan,
    TraceError,
    PyValueError,
    "Bad input: an op that is not valid under the trace format. The message is located \
     (`NAME:LINE:COLUMN: what was wrong; expected …`), as `streamsan check` prints it."
);

/// Checks of at least this many ops leave their checker's state to be dropped on another thread
/// (about 0.2 ms of a CPU's time for 12,000 ops): a smaller one is dropped sooner than another
/// thread could be woken for it.
const DISPOSE_FROM_OPS: u64 = 2048;

/// The ops a check keeps to explain its report stay in memory up to this many bytes (about
/// 25,000 ops of a PyTorch program), and go to a temporary file past it: a short check, which
/// a program may enter at every step, makes and removes no file.
const MEMORY_BYTES: usize = 4 << 20;

/// Ends a check: the report, with the verdicts on the synchronization ops when analysed (the
/// ops the analysis left to a re-check are re-checked from `kept`); the checker's state of a
/// large run is dropped on another thread ([`worker::dispose`]).
fn finish_run(
    run: CheckRun,
    kept: Option<&Source>,
    name: &str,
) -> Result<streamsan::Report, String> {
    let large = run.ops() >= DISPOSE_FROM_OPS;
    let finished = match kept {
        Some(Source::Memory(parts)) => run
            .finish_apart(Some(TraceBytes::new(parts, name)))
            .map_err(|e| recheck_message(e, name)),
        Some(Source::File(f)) => run
            .finish_apart(Some(TraceFile::new(&f.path, name)))
            .map_err(|e| recheck_message(e, name)),
        None => run
            .finish_apart(None::<TraceFile<'_>>)
            .map_err(|e| recheck_message(e, name)),
    };
    finished.map(|(report, rest)| {
        if large {
            worker::dispose(rest);
        }
        report
    })
}

/// Why the ops left to a re-check could not be re-checked.
fn recheck_message<E: std::fmt::Display>(e: RecheckError<E>, name: &str) -> String {
    match e {
        RecheckError::NotKept { undecided } => format!(
            "{name}: the ops were not kept: {undecided} synchronization ops cannot be re-checked"
        ),
        RecheckError::Read(e) => e.to_string(),
        RecheckError::Check(e) => format!("{name}: op {}: {e}", e.op),
    }
}

/// Where the ops of a check are kept, to explain its hazards and draw it afterwards.
enum Kept {
    /// Nowhere: the report has no `why:` lines and cannot be drawn.
    Nothing,
    /// A file: the trace the caller asked for, or a temporary spool of this process.
    File {
        path: PathBuf,
        /// Removed when the last holder goes away.
        temporary: bool,
    },
}

/// Where a report reads the ops it explains: the lines kept in memory (a short check), or a
/// file.
enum Source {
    Memory(Vec<Vec<u8>>),
    File(KeptFile),
}

/// A kept file; a temporary one is removed when dropped.
struct KeptFile {
    path: PathBuf,
    temporary: bool,
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        if self.temporary {
            remove_spool(&self.path);
        }
    }
}

/// The temporary copies of the ops this process made and has not removed yet, each with the
/// process that made it (a child forked with them removes none: they are its parent's). What
/// is left of them when the interpreter exits normally (a check still running then, a report
/// still held) goes with it: `_remove_spools`, which the package registers with `atexit` (a
/// process ended by `os._exit` or a signal runs no `atexit` handler: its copies stay).
static SPOOLS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// Where `path` is among this process's registered copies.
fn registered(spools: &[(u32, PathBuf)], path: &Path) -> Option<usize> {
    let me = std::process::id();
    spools.iter().position(|(pid, p)| *pid == me && p == path)
}

/// Removes a temporary copy of the ops this process made (and forgets it).
fn remove_spool(path: &Path) {
    let mut spools = lock(&SPOOLS);
    if let Some(i) = registered(&spools, path) {
        spools.swap_remove(i);
        drop(spools);
        let _ = std::fs::remove_file(path);
    }
}

/// Forgets a temporary copy's path that no file was made at (the ops stayed in memory).
fn forget_spool(path: &Path) {
    let mut spools = lock(&SPOOLS);
    if let Some(i) = registered(&spools, path) {
        spools.swap_remove(i);
    }
}

/// How long a checker's thread whose check is over waits for the next check before it ends, in
/// seconds (10 unless set; for tests).
#[pyfunction]
fn _set_checker_thread_idle(seconds: f64) -> PyResult<()> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(PyValueError::new_err("seconds: a number, 0 or more"));
    }
    worker::set_thread_idle(Duration::from_secs_f64(seconds.min(86_400.0)));
    Ok(())
}

/// Removes the temporary copies of the ops this process still has (at the interpreter's exit:
/// a report read after it cannot explain its hazards any more). Returns how many there were.
#[pyfunction]
fn _remove_spools() -> usize {
    let me = std::process::id();
    let mine: Vec<PathBuf> = {
        let mut spools = lock(&SPOOLS);
        let (mine, theirs) = std::mem::take(&mut *spools)
            .into_iter()
            .partition(|(pid, _)| *pid == me);
        *spools = theirs;
        mine.into_iter().map(|(_, p)| p).collect()
    };
    for p in &mine {
        let _ = std::fs::remove_file(p);
    }
    mine.len()
}

/// A path for a new temporary spool file, registered for removal (`_remove_spools`, or the
/// report's end); the file is made by [`create_spool`] when the first line is kept, by whoever
/// checks it (the checker's thread, off the program's).
fn spool_path() -> PathBuf {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = SPOOL_COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut rng = streamsan::workload::SplitMix::new(seed ^ u64::from(std::process::id()) ^ n);
    let path = std::env::temp_dir().join(format!("streamsan-ops-{:016x}.jsonl", rng.next_u64()));
    lock(&SPOOLS).push((std::process::id(), path.clone()));
    path
}

/// Spool paths handed out by this process (each a different seed).
static SPOOL_COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the spool file at `path` (from [`spool_path`]), readable by its owner only; not when
/// it was removed already (the interpreter is exiting: `_remove_spools` ran), which would
/// leave it behind.
///
/// The list's lock is not held across the file's creation (a process forked meanwhile would find
/// it held for good): the file is made, then removed again if `_remove_spools` took the path in
/// between.
pub(crate) fn create_spool(path: &Path) -> Result<File, String> {
    let gone = || Err(format!("{}: removed before it was made", path.display()));
    if registered(&lock(&SPOOLS), path).is_none() {
        return gone();
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options
        .open(path)
        .map_err(|e| format!("{}: cannot create: {e}", path.display()))?;
    if registered(&lock(&SPOOLS), path).is_none() {
        drop(file);
        let _ = std::fs::remove_file(path);
        return gone();
    }
    Ok(file)
}

/// Converts a JSON value to Python objects.
fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// The hazards as the JSON report has them, one dict each.
fn hazards_to_py<'py>(
    py: Python<'py>,
    hazards: &[streamsan::Hazard],
) -> PyResult<Bound<'py, PyList>> {
    let items = hazards
        .iter()
        .map(|h| {
            let v = serde_json::to_value(h).map_err(|e| PyValueError::new_err(e.to_string()))?;
            to_py(py, &v)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// Writes a Python value (dict, list, str, int, float, bool, None) as JSON.
fn write_json(v: &Bound<'_, PyAny>, out: &mut String, depth: u32) -> PyResult<()> {
    if depth > 64 {
        return Err(PyValueError::new_err(
            "an op nested more than 64 levels deep",
        ));
    }
    if v.is_none() {
        out.push_str("null");
    } else if let Ok(b) = v.cast::<PyBool>() {
        out.push_str(if b.is_true() { "true" } else { "false" });
    } else if v.is_instance_of::<PyInt>() {
        // Python integers of any size: their decimal text is the JSON number.
        out.push_str(&v.str()?.to_cow()?);
    } else if let Ok(f) = v.cast::<PyFloat>() {
        let x = f.value();
        if !x.is_finite() {
            return Err(PyValueError::new_err(format!(
                "{x} in an op: JSON has no such number"
            )));
        }
        out.push_str(
            &serde_json::Number::from_f64(x).map_or("null".to_string(), |n| n.to_string()),
        );
    } else if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_cow()?;
        out.push_str(&serde_json::Value::String(s.into_owned()).to_string());
    } else if let Ok(d) = v.cast::<PyDict>() {
        out.push('{');
        for (i, (k, x)) in d.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let Ok(k) = k.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "an op's keys are strings, not {}",
                    k.get_type().name()?
                )));
            };
            out.push_str(&serde_json::Value::String(k.to_cow()?.into_owned()).to_string());
            out.push(':');
            write_json(&x, out, depth + 1)?;
        }
        out.push('}');
    } else if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        out.push('[');
        for (i, x) in v.try_iter()?.enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_json(&x?, out, depth + 1)?;
        }
        out.push(']');
    } else {
        return Err(PyTypeError::new_err(format!(
            "{} in an op: expected a dict, list, str, int, float, bool or None",
            v.get_type().name()?
        )));
    }
    Ok(())
}

/// What a `Checker._raw_sink()` capsule holds: the C entry points native code calls with a batch
/// of JSON Lines (`push(ctx, data, len)`: 0 when queued, 1 when the check is over or belongs to
/// the process this one was forked from, 2 when the hand-over failed; `push_now`, since version
/// 2: the same, the checker's thread woken to check it at once), and the queue they push to,
/// kept alive as long as the capsule is. The C++ recorder declares the same first four fields
/// (`RawSink` in csrc/recorder.cpp).
#[repr(C)]
struct RawSink {
    version: u32,
    ctx: usize,
    push: unsafe extern "C" fn(usize, *const u8, usize) -> i32,
    push_now: unsafe extern "C" fn(usize, *const u8, usize) -> i32,
    _shared: Arc<Shared>,
}

impl Drop for RawSink {
    fn drop(&mut self) {
        if self._shared.forked() {
            // A forked child's copy: the check is the parent's (see `Checker`'s drop).
            std::mem::forget(Arc::clone(&self._shared));
        }
    }
}

/// `RawSink::push`: copies the batch into the queue of the [`Shared`] at `ctx`, waiting only
/// while the queue is full.
///
/// # Safety
/// `ctx` is the `ctx` of a live `RawSink` capsule and `data` points to `len` readable bytes.
unsafe extern "C" fn raw_push(ctx: usize, data: *const u8, len: usize) -> i32 {
    // SAFETY: as this function's.
    unsafe { raw_push_with(ctx, data, len, false) }
}

/// `RawSink::push_now`: [`raw_push`], and the checker's thread woken for the batch.
///
/// # Safety
/// As [`raw_push`]'s.
unsafe extern "C" fn raw_push_now(ctx: usize, data: *const u8, len: usize) -> i32 {
    // SAFETY: as this function's.
    unsafe { raw_push_with(ctx, data, len, true) }
}

/// The two entry points of a `RawSink`.
///
/// # Safety
/// As [`raw_push`]'s.
unsafe fn raw_push_with(ctx: usize, data: *const u8, len: usize, now: bool) -> i32 {
    let pushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the capsule holding `ctx` keeps its `Shared` alive while its holder calls.
        let shared = unsafe { &*(ctx as *const Shared) };
        if shared.forked() {
            return false; // a forked child: the check is the parent's
        }
        let batch = if len == 0 || data.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller passes `len` readable bytes at `data`.
            unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
        };
        shared.push_raw(batch, now).is_ok()
    }));
    match pushed {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(_) => 2,
    }
}

/// Checks ops as they come: the trace format's checker, in process.
///
/// `push(op)` checks one op (a dict, or one JSON line) and returns the hazards it raised;
/// `push_lines(text)` checks many JSON lines at once; `finish()` returns the `Report`.
///
/// `trace`: also write every op to this file (trace format, version 1), for `streamsan check`,
/// `fix` and `--format html`. `explain`: keep the ops (in `trace`, or else in a temporary file
/// removed with the report) so that the report explains its hazards (`why:`) and can be drawn.
/// `name`: how bad-input messages and the text report name the ops' source. `syncs`: also run
/// the synchronization analysis (`streamsan check --syncs`): the report then says which
/// synchronization ops were needed, what each prevents, and which were redundant.
///
/// `threaded`: check on a thread of the checker's own, beside the caller. `push_lines` then only
/// copies its text into a queue of at most `queue_bytes` bytes (64 MiB; a larger text is taken
/// alone) and returns at once; it waits, with the GIL released, only while the queue is full.
/// The thread checks the lines in the order they were pushed, through the same code, so the
/// report is the synchronous one. What changes is when things come back:
///
/// - `push_lines` returns the hazards the thread has found since the previous call (possibly
///   none yet: they come with a later call); `drain()` waits for the thread to catch up and
///   returns the rest. Every hazard is returned once, in the order found.
/// - bad input (`TraceError`, the same message) is raised by the next `push_lines`, `push`,
///   `drain` or `finish` after the thread met it, not by the call that pushed it; the ops
///   before the bad line stay checked, the rest of its text is dropped, and later texts are
///   checked. A `finish` that raises it leaves the Checker open: `finish` again for the report.
/// - `push` waits for its op to be checked: it returns the hazards not returned yet, its own
///   among them, and raises its own bad input.
/// - `ops`, `hazards` and `stats()` answer from the thread's latest state: what it has checked
///   so far (`drain()` first for everything pushed); `stats()` also has `queue_bytes` (bytes
///   pushed and not checked yet), `queue_peak_bytes`, `checker_busy_seconds` (time spent
///   parsing and checking: the thread's, and that of callers that checked the last batches
///   themselves while catching up) and `queue_waited_seconds` (callers' time waiting for room).
/// - if the checker panics, the next call raises `RuntimeError` and the check ends.
///
/// A Checker that goes away unfinished drops what is left in its queue; its thread ends.
///
/// In a process forked from the one that made it, every call that reaches the check raises
/// `RuntimeError` (a `_raw_sink` capsule's pushes are refused): the check and its thread are the
/// parent's (the copy's queue would wait for a thread the child does not have, and its locks
/// may be held for good). The copy is left alone when it goes.
#[pyclass(module = "streamsan._streamsan", frozen)]
struct Checker {
    /// The queue, the thread's findings and the checker itself.
    shared: Arc<Shared>,
    /// Where the ops are kept; taken by `finish`.
    kept: Mutex<Kept>,
    name: String,
}

/// The error of a refused batch.
fn refused(r: Refused) -> PyErr {
    match r {
        Refused::Finished => finished(),
        Refused::Dead(why) => PyRuntimeError::new_err(why),
    }
}

fn finished() -> PyErr {
    PyValueError::new_err("this Checker has finished")
}

impl Checker {
    /// Raises in a process forked from the one that made the Checker (see `Shared::pid`): what
    /// the copy holds is the parent's, its locks and queue may wait for a thread the child does
    /// not have. Every method that touches them asks first.
    fn owned(&self) -> PyResult<()> {
        if !self.shared.forked() {
            return Ok(());
        }
        Err(PyRuntimeError::new_err(format!(
            "this Checker belongs to process {}: process {}, forked from it, cannot use it \
             (the check and its thread are the parent's)",
            self.shared.pid,
            std::process::id()
        )))
    }

    /// Whether a thread checks the pushed lines; raises if no more may be pushed.
    fn open(&self) -> PyResult<bool> {
        self.owned()?;
        let s = lock(&self.shared.state);
        if let Some(why) = &s.dead {
            return Err(PyRuntimeError::new_err(why.clone()));
        }
        if s.closed || s.finished {
            return Err(finished());
        }
        Ok(s.threaded)
    }

    /// Checks `text` on this thread (a synchronous Checker), with the GIL held as the ops are
    /// checked in the order the callers come; what it found joins what is to be handed out.
    fn check_here(&self, text: &[u8]) -> PyResult<()> {
        let (found, r) = {
            let mut core = lock(&self.shared.core);
            core.check_batch(text, &|| false)
        };
        let mut s = lock(&self.shared.state);
        s.found.extend(found);
        match r {
            Ok(()) => Ok(()),
            Err(LineError::Bad(message)) => {
                s.errors.push_back(message);
                Ok(())
            }
            Err(LineError::Finished) => Err(finished()),
        }
    }

    /// Hands over what was found: raises the first error not raised yet (the hazards stay for
    /// the next call), else returns the hazards not returned yet.
    fn handed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let found = {
            let mut s = lock(&self.shared.state);
            if let Some(message) = s.errors.pop_front() {
                return Err(TraceError::new_err(message));
            }
            std::mem::take(&mut s.found)
        };
        hazards_to_py(py, &found)
    }

    /// Checks `text` (one op or many lines), or queues a copy of it for the checker's thread
    /// (`wait`: and waits until the thread has checked it).
    fn take(&self, py: Python<'_>, text: &[u8], wait: bool) -> PyResult<()> {
        if self.open()? {
            self.shared.push(py, text.to_vec()).map_err(refused)?;
            if wait {
                self.shared.catch_up(py)?;
            }
            Ok(())
        } else {
            self.check_here(text)
        }
    }

    /// Reads the core with the GIL released (the checker's thread may be in a batch).
    fn read<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&Core) -> R + Send) -> R {
        py.detach(|| f(&lock(&self.shared.core)))
    }

    /// Stops and joins the checker's thread once the queue is closed: what it queued is
    /// checked first.
    fn join(&self, py: Python<'_>) {
        if self.shared.take_thread() {
            py.detach(|| {
                self.shared.wait_exit(None);
            });
        }
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        if self.shared.forked() {
            // A forked child's copy: its thread and its temporary copy of the ops are the
            // parent's, and its locks may be held for good. Nothing of it is touched or
            // dropped here (the child's memory goes with the child).
            std::mem::forget(Arc::clone(&self.shared));
            return;
        }
        worker::stop(&self.shared);
        // A temporary copy of the ops that no report took goes with the Checker.
        if let Kept::File {
            path,
            temporary: true,
        } = &*lock(&self.kept)
        {
            remove_spool(path);
        }
    }
}

#[pymethods]
impl Checker {
    #[new]
    #[pyo3(signature = (
        trace = None,
        explain = true,
        name = None,
        syncs = false,
        threaded = false,
        queue_bytes = 64 << 20,
        _delay = 0.0,
        _panic_at = None,
        _memory_bytes = MEMORY_BYTES,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        trace: Option<PathBuf>,
        explain: bool,
        name: Option<String>,
        syncs: bool,
        threaded: bool,
        queue_bytes: usize,
        _delay: f64,
        _panic_at: Option<u64>,
        _memory_bytes: usize,
    ) -> PyResult<Self> {
        if !(_delay.is_finite() && _delay >= 0.0) {
            return Err(PyValueError::new_err(
                "_delay: a number of seconds, 0 or more",
            ));
        }
        let (kept, out) = match trace {
            Some(path) => {
                let f = File::create(&path).map_err(|e| {
                    PyOSError::new_err(format!("{}: cannot create: {e}", path.display()))
                })?;
                let out = BufWriter::with_capacity(1 << 16, f);
                (
                    Kept::File {
                        path,
                        temporary: false,
                    },
                    OpsCopy::File(out),
                )
            }
            None if explain => {
                // Kept in memory up to `_memory_bytes`, then in a file made when they pass it
                // (with none, at the first line kept); where it cannot be made, the report says
                // so and does not explain its hazards (checking does not need the copy).
                let path = spool_path();
                let out = if _memory_bytes > 0 {
                    OpsCopy::Memory {
                        parts: Vec::new(),
                        held: 0,
                        limit: _memory_bytes,
                        path: path.clone(),
                    }
                } else {
                    OpsCopy::Spool(path.clone())
                };
                (
                    Kept::File {
                        path,
                        temporary: true,
                    },
                    out,
                )
            }
            None => (Kept::Nothing, OpsCopy::Nothing),
        };
        let name = name.unwrap_or_else(|| match &kept {
            Kept::File {
                path,
                temporary: false,
            } => path.display().to_string(),
            _ => "<ops>".to_string(),
        });
        let core = Core {
            run: Some(CheckRun::new(syncs, matches!(kept, Kept::File { .. }))),
            lines: 0,
            name: name.clone(),
            out,
            write_error: None,
        };
        let options = threaded.then(|| Options {
            bound: queue_bytes,
            delay: Duration::from_secs_f64(_delay),
            panic_at: _panic_at,
        });
        let shared = Shared::start(core, options);
        Ok(Checker {
            shared,
            kept: Mutex::new(kept),
            name,
        })
    }

    /// Checks one op — a dict as the trace format has it, or one JSON line (str or bytes) — and
    /// returns the hazards it raised (and those found before it not returned yet, on a threaded
    /// Checker), as dicts of the JSON report. Raises `TraceError` on bad input (the op is then
    /// not checked).
    fn push<'py>(&self, py: Python<'py>, op: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let line: Cow<'_, [u8]> = if let Ok(b) = op.cast::<PyBytes>() {
            let bytes = b.as_bytes();
            let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
            let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
            if bytes.contains(&b'\n') {
                return Err(PyValueError::new_err(
                    "push takes one op; use push_lines for several lines",
                ));
            }
            bytes.into()
        } else if let Ok(s) = op.cast::<PyString>() {
            let s = s.to_cow()?;
            let line = s.strip_suffix('\n').unwrap_or(&s);
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.contains('\n') {
                return Err(PyValueError::new_err(
                    "push takes one op; use push_lines for several lines",
                ));
            }
            line.as_bytes().to_vec().into()
        } else if op.is_instance_of::<PyDict>() {
            let mut line = String::new();
            write_json(op, &mut line, 0)?;
            line.into_bytes().into()
        } else {
            return Err(PyTypeError::new_err(format!(
                "push takes an op as a dict or a JSON line (str or bytes), not {}",
                op.get_type().name()?
            )));
        };
        self.take(py, &line, true)?;
        self.handed(py)
    }

    /// Checks JSON Lines (str or bytes; blank and `#` lines are skipped) and returns the hazards
    /// they raised. On bad input, the ops before the bad line stay checked, the rest is dropped,
    /// and `TraceError` is raised. Threaded: queues the lines and returns the hazards found
    /// since the previous call; bad input is raised by a later call (see the class).
    fn push_lines<'py>(
        &self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let owned;
        let bytes: &[u8] = if let Ok(b) = text.cast::<PyBytes>() {
            b.as_bytes()
        } else if let Ok(s) = text.cast::<PyString>() {
            owned = s.to_cow()?;
            owned.as_bytes()
        } else {
            return Err(PyTypeError::new_err(format!(
                "push_lines takes str or bytes, not {}",
                text.get_type().name()?
            )));
        };
        self.take(py, bytes, false)?;
        self.handed(py)
    }

    /// A capsule (`streamsan._streamsan.RawSink`) through which native code hands JSON Lines
    /// straight to this Checker's queue, as `push_lines` does but without Python or the GIL:
    /// the C++ recorder of `streamsan.torch` uses it. None for a Checker that checks on the
    /// caller's thread. What the lines raise comes back as it does for `push_lines` batches: the
    /// hazards by the next `push_lines` or `drain()`, bad input by the next call.
    fn _raw_sink<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyCapsule>>> {
        self.owned()?;
        if !lock(&self.shared.state).threaded {
            return Ok(None);
        }
        let sink = RawSink {
            version: 2,
            ctx: Arc::as_ptr(&self.shared) as usize,
            push: raw_push,
            push_now: raw_push_now,
            _shared: Arc::clone(&self.shared),
        };
        PyCapsule::new_with_value(py, sink, c"streamsan._streamsan.RawSink").map(Some)
    }

    /// Waits until every op pushed so far is checked and returns the hazards not returned yet
    /// (none on a synchronous Checker, unless bad input cut a call short); raises the first
    /// error not raised yet.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.owned()?;
        if let Some(why) = lock(&self.shared.state).dead.clone() {
            return Err(PyRuntimeError::new_err(why));
        }
        self.shared.catch_up(py)?;
        if let Some(why) = lock(&self.shared.state).dead.clone() {
            return Err(PyRuntimeError::new_err(why));
        }
        self.handed(py)
    }

    /// Whether a thread of the checker's own checks the ops (see the class).
    #[getter]
    fn threaded(&self) -> PyResult<bool> {
        self.owned()?;
        Ok(lock(&self.shared.state).threaded)
    }

    /// The number of ops checked so far.
    #[getter]
    fn ops(&self, py: Python<'_>) -> PyResult<u64> {
        self.owned()?;
        Ok(self.read(py, |c| c.run.as_ref().map_or(0, |r| r.ops())))
    }

    /// Every hazard found so far, as dicts of the JSON report.
    #[getter]
    fn hazards<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.owned()?;
        let all = self.read(py, |c| c.hazards_from(0));
        hazards_to_py(py, &all)
    }

    /// Counters of the checker's state (what it keeps in memory): `ops`, `participants`,
    /// `generations`, `graveyard`, `history` (access entries kept) and `hazards`; threaded,
    /// also `queue_bytes` and `queue_peak_bytes`. Empty once finished. For memory measurements
    /// of long runs.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.owned()?;
        let d = PyDict::new(py);
        let counters = self.read(py, |c| {
            c.run.as_ref().map(|r| {
                let s = r.checker().stats();
                let syncs = r.analysis().map(|a| {
                    let (live, tombstones, _) = a.memory();
                    (live, tombstones)
                });
                (s, syncs)
            })
        });
        let Some((s, syncs)) = counters else {
            return Ok(d);
        };
        d.set_item("ops", s.ops)?;
        d.set_item("participants", s.participants)?;
        d.set_item("generations", s.generations)?;
        d.set_item("graveyard", s.graveyard)?;
        d.set_item("history", s.history)?;
        d.set_item("hazards", s.hazards)?;
        if let Some((live, tombstones)) = syncs {
            d.set_item("syncs_live_whatifs", live)?;
            d.set_item("syncs_tombstones", tombstones)?;
        }
        let queue = {
            let s = lock(&self.shared.state);
            s.threaded.then_some((
                s.bytes,
                s.peak,
                s.busy.as_secs_f64(),
                s.waited.as_secs_f64(),
            ))
        };
        if let Some((bytes, peak, busy, waited)) = queue {
            d.set_item("queue_bytes", bytes)?;
            d.set_item("queue_peak_bytes", peak)?;
            d.set_item("checker_busy_seconds", busy)?;
            d.set_item("queue_waited_seconds", waited)?;
        }
        Ok(d)
    }

    /// Whether `finish` was called.
    #[getter]
    fn finished(&self) -> PyResult<bool> {
        self.owned()?;
        Ok(lock(&self.shared.state).finished)
    }

    /// Ends the check and returns the `Report` (its hazards explained, when the ops were kept,
    /// the first time its text is asked for: `to_text()`, `str()`). The Checker takes no ops
    /// afterwards. Threaded: waits for the thread to check every op pushed; raises the first
    /// error not raised yet instead (see the class).
    fn finish(&self, py: Python<'_>) -> PyResult<Report> {
        self.owned()?;
        let threaded = {
            let s = lock(&self.shared.state);
            s.threaded && s.dead.is_none() && !s.closed && !s.finished
        };
        if threaded {
            self.shared.catch_up(py)?;
        }
        {
            let mut s = lock(&self.shared.state);
            if let Some(why) = s.dead.clone() {
                s.closed = true;
                s.finished = true;
                drop(s);
                self.join(py);
                return Err(PyRuntimeError::new_err(why));
            }
            if s.closed || s.finished {
                return Err(finished());
            }
            if let Some(message) = s.errors.pop_front() {
                return Err(TraceError::new_err(message));
            }
            s.closed = true;
        }
        self.shared.close();
        // Ops pushed by other threads since the wait above are checked (here, or by the thread),
        // which then checks nothing more: it ends by itself, not waited for (unless the check
        // goes on synchronously, below).
        if threaded {
            py.detach(|| self.shared.settle());
        } else {
            self.join(py);
        }
        {
            // What the thread met after the wait above (ops pushed meanwhile by other threads).
            let mut s = lock(&self.shared.state);
            if let Some(why) = s.dead.clone() {
                s.finished = true;
                return Err(PyRuntimeError::new_err(why));
            }
            if let Some(message) = s.errors.pop_front() {
                // The Checker goes on synchronously, once the thread has ended (the recorder's
                // hand-overs are then refused, as for an ended thread).
                drop(s);
                self.join(py);
                let mut s = lock(&self.shared.state);
                s.exited = true;
                s.closed = false;
                s.threaded = false;
                return Err(TraceError::new_err(message));
            }
            s.finished = true;
        }
        self.shared.take_thread(); // done with the check by itself: not waited for
        let (checker, mut out, mut write_error) = py.detach(|| {
            let mut core = lock(&self.shared.core);
            (
                core.run.take(),
                std::mem::replace(&mut core.out, OpsCopy::Nothing),
                core.write_error.take(),
            )
        });
        let Some(checker) = checker else {
            return Err(finished());
        };
        let kept = std::mem::replace(&mut *lock(&self.kept), Kept::Nothing);
        // The lines kept in memory are the report's source: no file was made.
        let mut in_memory = None;
        if let OpsCopy::Memory { parts, path, .. } = out {
            forget_spool(&path);
            in_memory = Some(parts);
            out = OpsCopy::Nothing;
        }
        // A temporary copy no line was kept in is made now, empty: the report can be drawn.
        if let Err(e) = out.open() {
            write_error.get_or_insert(e);
        }
        if let OpsCopy::File(out) = out {
            if let Err(e) = out
                .into_inner()
                .map_err(|e| e.into_error())
                .and_then(|mut f| f.flush())
            {
                write_error.get_or_insert(e.to_string());
            }
        }
        let source = match kept {
            Kept::File { .. } if in_memory.is_some() => in_memory.map(Source::Memory),
            Kept::File { path, temporary } => {
                let file = KeptFile { path, temporary };
                match &write_error {
                    None => Some(Source::File(file)),
                    Some(e) => {
                        let what = if temporary {
                            "a copy of the ops"
                        } else {
                            "the trace"
                        };
                        eprintln!(
                            "streamsan: cannot write {what} to {}: {e}; the report will not \
                             explain its hazards",
                            file.path.display()
                        );
                        None
                    }
                }
            }
            Kept::Nothing => None,
        };
        let implicit = checker.checker().implicit_syncs().to_vec();
        let name = self.name.clone();
        let report = py
            .detach(|| finish_run(checker, source.as_ref(), &name))
            .map_err(PyValueError::new_err)?;
        // The hazards are explained when the text report is first asked for (`to_text`, `str`),
        // not here: a check whose report is only counted or read as data (`hazards`, `to_json`)
        // does not read its ops again. Unless the ops are in the caller's trace file, which a
        // later check may write over: then now, while it holds the ops checked.
        let explain_now = matches!(&source, Some(Source::File(f)) if !f.temporary);
        let mut r = Report {
            report,
            name: self.name.clone(),
            source,
            implicit,
            picture: None,
            walked: false,
        };
        if explain_now && !r.report.hazards.is_empty() {
            py.detach(|| r.walk());
        }
        Ok(r)
    }
}

/// What a check found: the hazards, their counts, and every rendering of them.
///
/// `errors` and `warnings` count the hazards of each severity; `hazards` lists them as dicts of
/// the JSON report (`streamsan check --format json`). `to_text()` is the command line's text
/// report, with `why:` and `help:`; `to_json()`, `to_sarif()`, `to_html()` and `to_dot()` are its
/// other formats; `clean` says whether there is no error.
#[pyclass(module = "streamsan._streamsan")]
struct Report {
    report: streamsan::Report,
    name: String,
    source: Option<Source>,
    implicit: Vec<(u64, u64)>,
    picture: Option<Picture>,
    /// Whether the kept ops were walked (explained and drawn, or found unreadable) already.
    walked: bool,
}

impl Report {
    /// Walks the kept ops through the dependency graph: explains the hazards, draws the picture.
    fn walk(&mut self) {
        if std::mem::replace(&mut self.walked, true) {
            return;
        }
        let Some(source) = &self.source else { return };
        match walk(source, &self.name, &mut self.report, &self.implicit) {
            Ok(p) => self.picture = Some(p),
            Err(e) => eprintln!("streamsan: {e}; the report will not explain its hazards"),
        }
    }
}

/// Explains `report`'s hazards from the ops `source` holds; the picture of the run.
fn walk(
    source: &Source,
    name: &str,
    report: &mut streamsan::Report,
    implicit: &[(u64, u64)],
) -> Result<Picture, String> {
    let reader: Box<dyn std::io::BufRead + '_> = match source {
        Source::Memory(parts) => Box::new(TraceBytes::new(parts, name).reader()),
        Source::File(f) => {
            let file = File::open(&f.path)
                .map_err(|e| format!("{}: cannot open: {e}", f.path.display()))?;
            Box::new(BufReader::with_capacity(1 << 16, file))
        }
    };
    streamsan::graph::explain_trace(reader, name, report, implicit, |_| {})
        .map_err(|e| e.to_string())
}

#[pymethods]
impl Report {
    /// Number of ops checked.
    #[getter]
    fn ops(&self) -> u64 {
        self.report.ops
    }

    /// Number of hazards of severity error.
    #[getter]
    fn errors(&self) -> u64 {
        self.report.errors
    }

    /// Number of hazards of severity warning.
    #[getter]
    fn warnings(&self) -> u64 {
        self.report.warnings
    }

    /// Whether no hazard of severity error was found.
    #[getter]
    fn clean(&self) -> bool {
        self.report.is_clean()
    }

    /// The hazards, as dicts of the JSON report, sorted by op, kind and buffer.
    #[getter]
    fn hazards<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        hazards_to_py(py, &self.report.hazards)
    }

    /// With the synchronization analysis (`syncs=True`): one dict per synchronization op, in
    /// op order, as the JSON report's `syncs` array has them (`op`, `kind`, `site`, `needed`,
    /// `prevents`); `None` without it.
    #[getter]
    fn syncs<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(syncs) = &self.report.syncs else {
            return Ok(None);
        };
        let v = serde_json::to_value(syncs).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Some(to_py(py, &v)?.cast_into::<PyList>()?))
    }

    /// With the synchronization analysis: the verdicts by site (ops without a site each
    /// alone), redundant sites first: dicts with `site` (str or None), `kinds` (op names),
    /// `ops` (op indices), `count`, `needed`, `redundant` and `prevents` (dicts as in
    /// `syncs`). `None` without the analysis.
    fn syncs_by_site<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(syncs) = &self.report.syncs else {
            return Ok(None);
        };
        let mut items = Vec::new();
        for s in streamsan::analysis::syncs::by_site(syncs) {
            let d = PyDict::new(py);
            d.set_item("site", s.site.clone())?;
            d.set_item("kinds", s.kinds.clone())?;
            d.set_item("ops", s.ops.clone())?;
            d.set_item("count", s.count())?;
            d.set_item("needed", s.needed)?;
            d.set_item("redundant", s.redundant())?;
            let v = serde_json::to_value(&s.prevents)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            d.set_item("prevents", to_py(py, &v)?)?;
            items.push(d);
        }
        Ok(Some(PyList::new(py, items)?))
    }

    /// The text report of `streamsan check`: each hazard with its accesses, `why:` and `help:`,
    /// the synchronization analysis by site (with `syncs=True`), then a summary line. `color`:
    /// with ANSI colours.
    #[pyo3(signature = (color = false))]
    #[allow(clippy::wrong_self_convention)] // Python's name for a rendering
    fn to_text(&mut self, color: bool) -> String {
        // With the GIL held: no other thread touches this report while it is explained.
        if !self.report.hazards.is_empty() {
            self.walk();
        }
        render_text(
            &self.report,
            &TextOptions {
                color,
                file: Some(self.name.clone()),
            },
        )
    }

    /// The JSON report of the trace format (`streamsan check --format json`).
    fn to_json(&self) -> String {
        self.report.to_json()
    }

    /// SARIF 2.1.0, for code-scanning tools (`--format sarif`). `trace`: the trace file's path,
    /// recorded as the analysis target.
    #[pyo3(signature = (trace = None))]
    fn to_sarif(&self, trace: Option<String>) -> String {
        render_sarif(&self.report, &SarifOptions { trace })
    }

    /// One self-contained HTML page: streams as lanes, synchronization edges, each hazard's
    /// missing edge (`--format html`). Needs the ops kept (`explain=True` or `trace=`).
    #[allow(clippy::wrong_self_convention)] // Python's name for a rendering
    fn to_html(&mut self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.walk());
        match &self.picture {
            Some(p) => Ok(streamsan::graph::render_html(p)),
            None => Err(PyValueError::new_err(
                "the ops were not kept (explain=False and no trace): nothing to draw",
            )),
        }
    }

    /// Graphviz DOT of the stream-dependency graph (`--format dot`). Needs the ops kept.
    #[allow(clippy::wrong_self_convention)]
    fn to_dot(&mut self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.walk());
        match &self.picture {
            Some(p) => Ok(streamsan::graph::render_dot(p)),
            None => Err(PyValueError::new_err(
                "the ops were not kept (explain=False and no trace): nothing to draw",
            )),
        }
    }

    fn __str__(&mut self) -> String {
        self.to_text(false)
    }

    fn __repr__(&self) -> String {
        let plural = |n: u64, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
        let mut s = format!(
            "<streamsan.Report {}, {} in {}",
            plural(self.report.errors, "error"),
            plural(self.report.warnings, "warning"),
            plural(self.report.ops, "op")
        );
        for (i, h) in self.report.hazards.iter().enumerate() {
            if i == 3 {
                s.push_str(&format!(", … {} more", self.report.hazards.len() - 3));
                break;
            }
            s.push_str(if i == 0 { ": " } else { ", " });
            s.push_str(h.kind.as_str());
            if let Some(b) = &h.buffer {
                s.push_str(&format!(" on {b}"));
            }
            s.push_str(&format!(" at op {}", h.op));
            if let Some(site) = h.access.as_ref().and_then(|a| a.site.as_ref()) {
                if let Some(f) = site.innermost() {
                    s.push_str(&format!(" ({f})"));
                }
            }
        }
        s.push('>');
        s
    }
}

/// Checks a trace file (JSON Lines, trace format v1) and returns its `Report`, its hazards
/// explained. Raises `TraceError` on bad input, `OSError` when the file cannot be read.
/// `syncs`: also run the synchronization analysis (`streamsan check --syncs`).
#[pyfunction]
#[pyo3(signature = (path, explain = true, syncs = false))]
fn check_trace(py: Python<'_>, path: PathBuf, explain: bool, syncs: bool) -> PyResult<Report> {
    let name = path.display().to_string();
    let result: Result<Report, (bool, String)> = py.detach(|| {
        let f = File::open(&path).map_err(|e| (true, format!("{name}: cannot open: {e}")))?;
        let mut reader = TraceReader::new(BufReader::with_capacity(1 << 16, f), name.clone());
        // The file can be read again: a re-check can decide what the analysis gives up.
        let mut checker = CheckRun::new(syncs, true);
        loop {
            let (op, spans) = match reader.next_op() {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => return Err((false, e.to_string())),
            };
            if let Err(e) = checker.check(&op).map(|_| ()) {
                let at = spans.locate(e.field);
                let err = ParseError::at(name.clone(), at, e.message, e.expected.as_deref());
                return Err((false, err.to_string()));
            }
        }
        let implicit = checker.checker().implicit_syncs().to_vec();
        let file = Source::File(KeptFile {
            path: path.clone(),
            temporary: false,
        });
        let report = finish_run(checker, Some(&file), &name).map_err(|e| (false, e))?;
        let mut r = Report {
            report,
            name: name.clone(),
            source: explain.then_some(file),
            implicit,
            picture: None,
            walked: false,
        };
        if !r.report.hazards.is_empty() {
            // The trace is the caller's file: explained now, while it is the one checked.
            r.walk();
        }
        Ok(r)
    });
    result.map_err(|(io, message)| {
        if io {
            PyOSError::new_err(message)
        } else {
            TraceError::new_err(message)
        }
    })
}

/// Runs the `streamsan` command line with `args` (the program name first) and returns its exit
/// status. It writes to the process's standard output and error.
#[pyfunction]
fn run_cli(py: Python<'_>, args: Vec<OsString>) -> u8 {
    py.detach(|| cli::run(args))
}

#[pymodule]
fn _streamsan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("TraceError", m.py().get_type::<TraceError>())?;
    m.add_class::<Checker>()?;
    m.add_class::<Report>()?;
    m.add_function(wrap_pyfunction!(check_trace, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(_remove_spools, m)?)?;
    m.add_function(wrap_pyfunction!(_set_checker_thread_idle, m)?)?;
    Ok(())
}
