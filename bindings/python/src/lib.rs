//! `streamsan._streamsan`: the checker of streamsan inside a Python process, and the `streamsan`
//! command of the wheel.
//!
//! The Python package (`python/streamsan/`) re-exports what is here; this module is private.
//! Ops go in as the trace format has them (a dict, or JSON Lines text), hazards come out as the
//! JSON report has them (dicts), and bad input raises `streamsan.TraceError` with the located
//! message the command line prints. Nothing here panics across the boundary: every error a user
//! can cause is a Python exception.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use streamsan::analysis::run::{CheckRun, RecheckError, TraceFile};
use streamsan::graph::Picture;
use streamsan::report::{render_sarif, render_text, SarifOptions, TextOptions};
use streamsan::trace::{parse_line_bytes, ParseError, TraceReader};

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

/// Ends a check: the report, with the verdicts on the synchronization ops when analysed; the
/// ops the analysis left to a re-check are re-checked from `kept`.
fn finish_run(run: CheckRun, kept: Option<&Path>, name: &str) -> Result<streamsan::Report, String> {
    run.finish(kept.map(|path| TraceFile::new(path, name)))
        .map_err(|e| match e {
            RecheckError::NotKept { undecided } => format!(
                "{name}: the ops were not kept: {undecided} synchronization ops cannot be re-checked"
            ),
            RecheckError::Read(e) => e.to_string(),
            RecheckError::Check(e) => format!("{name}: op {}: {e}", e.op),
        })
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

/// A kept file; a temporary one is removed when dropped.
struct KeptFile {
    path: PathBuf,
    temporary: bool,
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A new temporary spool file, readable by its owner only.
fn spool() -> Result<(PathBuf, File), String> {
    let dir = std::env::temp_dir();
    let mut last = String::new();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut rng = streamsan::workload::SplitMix::new(seed ^ u64::from(std::process::id()));
    for _ in 0..16 {
        let path = dir.join(format!("streamsan-ops-{:016x}.jsonl", rng.next_u64()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(&path) {
            Ok(f) => return Ok((path, f)),
            Err(e) => last = format!("{}: cannot create: {e}", path.display()),
        }
    }
    Err(last)
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
#[pyclass(module = "streamsan._streamsan")]
struct Checker {
    checker: Option<CheckRun>,
    /// Lines pushed so far (the line number of bad-input messages).
    lines: u64,
    name: String,
    kept: Kept,
    out: Option<BufWriter<File>>,
    /// The first error writing the kept ops; the kept file is then incomplete.
    write_error: Option<String>,
    line: String,
}

impl Checker {
    fn checker(&mut self) -> PyResult<&mut CheckRun> {
        self.checker
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("this Checker has finished"))
    }

    /// Checks one line (without its line end); returns the number of hazards found before it.
    fn check_line(&mut self, line: &[u8]) -> PyResult<Option<usize>> {
        self.checker()?;
        self.lines += 1;
        let number = self.lines;
        let parsed = parse_line_bytes(line)
            .map_err(|e| TraceError::new_err(e.at_line(self.name.clone(), number).to_string()))?;
        let Some((op, spans)) = parsed else {
            self.keep(line);
            return Ok(None);
        };
        let checker = self.checker()?;
        let before = checker.checker().hazards().len();
        if let Err(e) = checker.check(&op).map(|_| ()) {
            let at = spans.locate(e.field);
            let err = ParseError::at(
                self.name.clone(),
                (number, at.1),
                e.message,
                e.expected.as_deref(),
            );
            return Err(TraceError::new_err(err.to_string()));
        }
        self.keep(line);
        Ok(Some(before))
    }

    fn keep(&mut self, line: &[u8]) {
        if let Some(out) = self.out.as_mut() {
            let r = out.write_all(line).and_then(|_| out.write_all(b"\n"));
            if let Err(e) = r {
                self.write_error = Some(e.to_string());
                self.out = None;
            }
        }
    }

    fn new_hazards<'py>(&self, py: Python<'py>, from: usize) -> PyResult<Bound<'py, PyList>> {
        match self.checker.as_ref() {
            Some(c) => hazards_to_py(py, &c.checker().hazards()[from..]),
            None => PyList::new(py, Vec::<Bound<'py, PyAny>>::new()),
        }
    }
}

#[pymethods]
impl Checker {
    #[new]
    #[pyo3(signature = (trace = None, explain = true, name = None, syncs = false))]
    fn new(
        trace: Option<PathBuf>,
        explain: bool,
        name: Option<String>,
        syncs: bool,
    ) -> PyResult<Self> {
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
                    Some(out),
                )
            }
            None if explain => match spool() {
                Ok((path, f)) => (
                    Kept::File {
                        path,
                        temporary: true,
                    },
                    Some(BufWriter::with_capacity(1 << 16, f)),
                ),
                Err(e) => {
                    // Checking does not need the copy: go on without explanations.
                    eprintln!("streamsan: {e}; the report will not explain its hazards");
                    (Kept::Nothing, None)
                }
            },
            None => (Kept::Nothing, None),
        };
        let name = name.unwrap_or_else(|| match &kept {
            Kept::File {
                path,
                temporary: false,
            } => path.display().to_string(),
            _ => "<ops>".to_string(),
        });
        let engine = CheckRun::new(syncs, matches!(kept, Kept::File { .. }));
        Ok(Checker {
            checker: Some(engine),
            lines: 0,
            name,
            kept,
            out,
            write_error: None,
            line: String::new(),
        })
    }

    /// Checks one op — a dict as the trace format has it, or one JSON line (str or bytes) — and
    /// returns the hazards it raised, as dicts of the JSON report. Raises `TraceError` on bad
    /// input (the op is then not checked).
    fn push<'py>(
        &mut self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let before = if let Ok(b) = op.cast::<PyBytes>() {
            let bytes = b.as_bytes();
            let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
            let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
            if bytes.contains(&b'\n') {
                return Err(PyValueError::new_err(
                    "push takes one op; use push_lines for several lines",
                ));
            }
            self.check_line(bytes)?
        } else if let Ok(s) = op.cast::<PyString>() {
            let s = s.to_cow()?;
            let line = s.strip_suffix('\n').unwrap_or(&s);
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.contains('\n') {
                return Err(PyValueError::new_err(
                    "push takes one op; use push_lines for several lines",
                ));
            }
            self.check_line(line.as_bytes())?
        } else if op.is_instance_of::<PyDict>() {
            let mut line = std::mem::take(&mut self.line);
            line.clear();
            let r = write_json(op, &mut line, 0).and_then(|_| self.check_line(line.as_bytes()));
            self.line = line;
            r?
        } else {
            return Err(PyTypeError::new_err(format!(
                "push takes an op as a dict or a JSON line (str or bytes), not {}",
                op.get_type().name()?
            )));
        };
        match before {
            Some(from) => self.new_hazards(py, from),
            None => PyList::new(py, Vec::<Bound<'py, PyAny>>::new()),
        }
    }

    /// Checks JSON Lines (str or bytes; blank and `#` lines are skipped) and returns the hazards
    /// they raised. On bad input, the ops before the bad line stay checked, the rest is dropped,
    /// and `TraceError` is raised.
    fn push_lines<'py>(
        &mut self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let owned;
        let bytes: &[u8] = if let Ok(b) = text.cast::<PyBytes>() {
            b.as_bytes()
        } else if let Ok(s) = text.cast::<PyString>() {
            owned = s.to_cow()?.into_owned();
            owned.as_bytes()
        } else {
            return Err(PyTypeError::new_err(format!(
                "push_lines takes str or bytes, not {}",
                text.get_type().name()?
            )));
        };
        let from = self.checker()?.checker().hazards().len();
        let mut rest = bytes;
        while !rest.is_empty() {
            let (line, next) = match rest.iter().position(|&c| c == b'\n') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            self.check_line(line)?;
            rest = next;
        }
        self.new_hazards(py, from)
    }

    /// The number of ops checked so far.
    #[getter]
    fn ops(&self) -> u64 {
        self.checker.as_ref().map_or(0, |c| c.checker().ops())
    }

    /// Every hazard found so far, as dicts of the JSON report.
    #[getter]
    fn hazards<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.new_hazards(py, 0)
    }

    /// Counters of the checker's state (what it keeps in memory): `ops`, `participants`,
    /// `generations`, `graveyard`, `history` (access entries kept) and `hazards`. Empty once
    /// finished. For memory measurements of long runs.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(c) = self.checker.as_ref() {
            let s = c.checker().stats();
            d.set_item("ops", s.ops)?;
            d.set_item("participants", s.participants)?;
            d.set_item("generations", s.generations)?;
            d.set_item("graveyard", s.graveyard)?;
            d.set_item("history", s.history)?;
            d.set_item("hazards", s.hazards)?;
            if let Some(a) = c.analysis() {
                let (live, tombstones, _) = a.memory();
                d.set_item("syncs_live_whatifs", live)?;
                d.set_item("syncs_tombstones", tombstones)?;
            }
        }
        Ok(d)
    }

    /// Whether `finish` was called.
    #[getter]
    fn finished(&self) -> bool {
        self.checker.is_none()
    }

    /// Ends the check and returns the `Report` (with its hazards explained when the ops were
    /// kept). The Checker takes no ops afterwards.
    fn finish(&mut self, py: Python<'_>) -> PyResult<Report> {
        let Some(checker) = self.checker.take() else {
            return Err(PyValueError::new_err("this Checker has finished"));
        };
        if let Some(out) = self.out.take() {
            if let Err(e) = out
                .into_inner()
                .map_err(|e| e.into_error())
                .and_then(|mut f| f.flush())
            {
                self.write_error.get_or_insert(e.to_string());
            }
        }
        let kept = std::mem::replace(&mut self.kept, Kept::Nothing);
        let source = match kept {
            Kept::File { path, temporary } => {
                let file = KeptFile { path, temporary };
                match &self.write_error {
                    None => Some(file),
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
        let kept_path = source.as_ref().map(|f| f.path.clone());
        let name = self.name.clone();
        let report = py
            .detach(|| finish_run(checker, kept_path.as_deref(), &name))
            .map_err(PyValueError::new_err)?;
        let mut r = Report {
            report,
            name: self.name.clone(),
            source,
            implicit,
            picture: None,
        };
        if !r.report.hazards.is_empty() {
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
    source: Option<KeptFile>,
    implicit: Vec<(u64, u64)>,
    picture: Option<Picture>,
}

impl Report {
    /// Walks the kept ops through the dependency graph: explains the hazards, draws the picture.
    fn walk(&mut self) {
        if self.picture.is_some() {
            return;
        }
        let Some(source) = &self.source else { return };
        match walk(&source.path, &self.name, &mut self.report, &self.implicit) {
            Ok(p) => self.picture = Some(p),
            Err(e) => eprintln!("streamsan: {e}; the report will not explain its hazards"),
        }
    }
}

fn walk(
    path: &Path,
    name: &str,
    report: &mut streamsan::Report,
    implicit: &[(u64, u64)],
) -> Result<Picture, String> {
    let f = File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
    streamsan::graph::explain_trace(
        BufReader::with_capacity(1 << 16, f),
        name,
        report,
        implicit,
        |_| {},
    )
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
    fn to_text(&self, color: bool) -> String {
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

    fn __str__(&self) -> String {
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
        let report = finish_run(checker, Some(&path), &name).map_err(|e| (false, e))?;
        let mut r = Report {
            report,
            name: name.clone(),
            source: explain.then(|| KeptFile {
                path: path.clone(),
                temporary: false,
            }),
            implicit,
            picture: None,
        };
        if !r.report.hazards.is_empty() {
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
    Ok(())
}
