//! The `streamsan` command line: check recorded traces, benchmark the engine.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use streamsan::output::{OutputFile, TempFile};
use streamsan::report::{render_text, TextOptions};
use streamsan::text::{escape, for_terminal};
use streamsan::trace::{Field, Op, ParseError, Spans, TraceOp, TraceReader, TraceWriter};
use streamsan::workload::{Pipeline, Shape};
use streamsan::{CheckError, Checker};

/// Finds the synchronization bugs of multi-stream GPU programs: data races between streams and
/// the host, and buffers freed to a caching allocator while another stream still uses them.
///
/// Exit status: 0 when no error-severity hazard was found, 1 when at least one was, 2 on bad
/// input or usage. Set STREAMSAN_LOG (e.g. `STREAMSAN_LOG=trace`) to log every op and hazard.
#[derive(Parser, Debug)]
#[command(name = "streamsan", version, about, long_about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a recorded trace (JSON Lines, trace format v1) and report every hazard.
    ///
    /// Examples:
    ///   streamsan check examples/traces/reuse-without-record-stream.jsonl
    ///   streamsan check --format json trace.jsonl > report.json
    ///   streamsan check --format html -o report.html trace.jsonl
    ///   streamsan check --format dot trace.jsonl | dot -Tsvg > graph.svg
    ///   streamsan check --format sarif -o streamsan.sarif trace.jsonl
    ///   my-recorder | streamsan check -
    #[command(verbatim_doc_comment)]
    Check {
        /// The trace file, or `-` for standard input.
        file: PathBuf,
        /// Report format: rustc-style text with explanations, the JSON report of the trace
        /// format, SARIF for code scanning, or a picture of the streams (dot, html).
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// When to colour text reports.
        #[arg(long, value_enum, default_value_t = Color::Auto)]
        color: Color,
        /// Write the report to this file instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Also try to make each data-race, reuse-race and unsafe-free manifest on this backend
        /// (`sim`: the simulated device; `cuda`: this machine's GPU): run it under a schedule
        /// steered to make the race happen, and say for every hazard in how many attempts its
        /// data were corrupted — or why it was not run. Recorded traces (addresses, external
        /// buffers, pinned and managed memory) run as they were recorded, memory reuse
        /// included. JSON and SARIF reports carry it as `confirmation`.
        #[arg(long, value_enum, value_name = "BACKEND")]
        confirm: Option<Backend>,
        /// Provocation attempts per hazard with --confirm.
        #[arg(long, default_value_t = 5)]
        attempts: u32,
        /// Also say which synchronization ops (event waits, host syncs and queries,
        /// record_stream) the program needs and what each prevents, and which are redundant:
        /// text lists them by site, JSON adds the `syncs` array, SARIF adds a note for each
        /// redundant one, HTML greys redundant sync edges. It never changes the exit status.
        #[arg(long)]
        syncs: bool,
    },
    /// Write the trace with the synchronization that removes its races inserted.
    ///
    /// Before each op with a data-race, reuse-race or unsafe-free, `fix` inserts what orders
    /// the unordered accesses before it: `record_stream` before a caching free of device
    /// memory that other streams still use; otherwise an `event_record` on each earlier stream
    /// and an `event_wait` (or, for the host, an `event_sync`) on it. At most two ops per
    /// hazard fixed (where events would take more, the host waits: `stream_sync`s, or one
    /// `device_sync` per device, the only case that can exceed two: unordered accesses on three
    /// or more devices); one insertion often fixes several. Every original line (comments too) is
    /// kept as it was, in order; each insertion is preceded by a `# streamsan fix for op N`
    /// comment (N: the op index in the original trace).
    /// The written trace is checked as it is written; the summary on standard error says what
    /// was fixed, and what is left that no synchronization fixes (use-after-free,
    /// invalid-free, warnings).
    ///
    /// Exit status: 0 when the written trace has no error-severity hazard, 1 when some remain,
    /// 2 on bad input.
    ///
    /// Examples:
    ///   streamsan fix examples/traces/reuse-without-record-stream.jsonl -o fixed.jsonl
    ///   streamsan fix trace.jsonl | streamsan check -
    #[command(verbatim_doc_comment)]
    Fix {
        /// The trace file, or `-` for standard input.
        file: PathBuf,
        /// Write the fixed trace to this file instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Instead of inserting synchronization, remove the synchronization ops that are
        /// redundant together: each removal is checked, and the written trace has no error
        /// the trace as written does not have (a clean trace stays clean). Every other line is
        /// kept as it was; standard error says how many were removed.
        #[arg(long)]
        remove_redundant: bool,
    },
    /// Measure the checking engine on a synthetic clean pipeline (no parsing): ns/op and ops/s.
    ///
    /// The workload is a ring of stages over S streams and B persistent buffers, with
    /// temporaries allocated and freed and a host sync every 64 steps. With --write-trace the
    /// same workload is written as a trace file instead, e.g. to measure `streamsan check` end
    /// to end under callgrind.
    Bench {
        /// Number of ops.
        #[arg(long, default_value_t = 1_000_000)]
        ops: u64,
        /// Number of streams.
        #[arg(long, default_value_t = 8)]
        streams: u32,
        /// Number of persistent buffers.
        #[arg(long, default_value_t = 1_000)]
        buffers: u32,
        /// Seed of the workload's random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Events each step of the pipeline waits on: 1 (the previous stage's) or up to
        /// streams - 1 (the previous stages' too, in a random order: "insurance" waits, most of
        /// them redundant).
        #[arg(long, default_value_t = 1)]
        waits: u32,
        /// Time the checker with the synchronization analysis (`check --syncs`).
        #[arg(long)]
        syncs: bool,
        /// Write the workload as a trace to this file (`-` for stdout) instead of timing it.
        #[arg(long)]
        write_trace: Option<PathBuf>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Instead of the pipeline, check one of the hardening shapes, generated op by op, and
        /// print the time, the peak RSS and the size of the JSON report: churn, huge, streams,
        /// ring, loop-race, ranges, regions, live.
        #[arg(long, value_name = "SHAPE")]
        shape: Option<String>,
        /// The shape's size (cycles, log2 of bytes, streams, rounds, ranges, regions or buffers);
        /// by default the size of the hardening issue.
        #[arg(long, requires = "shape")]
        size: Option<u64>,
    },
    /// Generate random multi-stream programs, check them, run them, and confirm every reported
    /// hazard by provoking the corruption it warns about.
    ///
    /// Each program runs on the backend in issue order (the reference), under random schedules,
    /// and, for every data-race, reuse-race and unsafe-free the checker reports, under a schedule
    /// steered to make it manifest. `confirmed` counts hazards whose provocation observed
    /// corrupted data; `unexplained` counts programs whose data differed from the reference with
    /// no hazard reported on the differing buffers (a missed hazard). Every unexplained program
    /// is shrunk and written as a trace that `streamsan check` reproduces.
    ///
    /// Examples:
    ///   streamsan fuzz --backend sim --cases 2000 --seed 7 --json
    ///   streamsan fuzz --backend cuda --cases 200
    #[command(verbatim_doc_comment)]
    Fuzz(FuzzArgs),
}

/// Options of `streamsan fuzz`.
#[derive(clap::Args, Debug)]
struct FuzzArgs {
    /// Where programs run: the CPU simulator, or the GPU (needs a CUDA driver).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    backend: Backend,
    /// Number of programs.
    #[arg(long, default_value_t = 100)]
    cases: u64,
    /// Seed of the campaign.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Ops per program.
    #[arg(long, default_value_t = 40)]
    ops: usize,
    /// Probability that a needed synchronization is left out (0 to 1).
    #[arg(long, default_value_t = 0.2)]
    missing_sync: f64,
    /// Random schedules per program.
    #[arg(long, default_value_t = 3)]
    schedules: u32,
    /// Where counterexample traces are written.
    #[arg(long, default_value = "streamsan-counterexamples")]
    out_dir: PathBuf,
    /// Provocation attempts per hazard (each with another schedule; on a GPU, another delay).
    #[arg(long, default_value_t = 3)]
    attempts: u32,
    /// Generate programs that write every new buffer before reading it (implied by --backend
    /// cuda: a GPU leaves the previous owner's bytes in new memory, and reading them is a bug
    /// of its own that the trace format does not define).
    #[arg(long)]
    initialize: bool,
    /// Also write up to N programs with a hazard no provocation confirmed, for inspection.
    #[arg(long, default_value_t = 0, value_name = "N")]
    keep_unconfirmed: usize,
    /// Instead of confirming hazards, fix every program as `streamsan fix` does and run the
    /// fixed programs: the sequential reference, random schedules, and each original hazard's
    /// provocation. Counts what was fixed, the inserted ops per hazard, and fixed programs
    /// whose runs differ from their reference (there must be none).
    #[arg(long)]
    fix: bool,
    /// Print exactly one JSON object: the summary.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// The CPU simulator.
    Sim,
    /// A CUDA GPU through cudarc.
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Human-readable diagnostics.
    Text,
    /// The trace format's JSON report.
    Json,
    /// SARIF 2.1.0, for code-scanning tools: hazards at their file:line sites.
    Sarif,
    /// Graphviz DOT of the stream-dependency graph around the hazards (`| dot -Tsvg`).
    Dot,
    /// One self-contained HTML page: streams as lanes, sync edges, each hazard's missing edge
    /// dashed, and the hazard list with its explanations.
    Html,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Color {
    /// Colour when writing to a terminal and NO_COLOR is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// Prints a line to standard output; a closed pipe (`streamsan … | head`) is not an error.
macro_rules! outln {
    ($($arg:tt)*) => {{
        let _ = writeln!(io::stdout(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    ExitCode::from(run(std::env::args_os()))
}

/// Runs the command line `args` (the program name first) and returns the exit status. The
/// Python package's `streamsan` command runs this too.
pub(crate) fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    init_tracing();
    streamsan::output::remove_temporaries_on_signals();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let result = match cli.command {
        Command::Check {
            file,
            format,
            color,
            output,
            confirm,
            attempts,
            syncs,
        } => check(
            &file,
            format,
            color,
            output.as_ref(),
            confirm.map(|b| (b, attempts)),
            syncs,
        ),
        Command::Fix {
            file,
            output,
            remove_redundant: true,
        } => fix_remove_redundant(&file, output.as_ref()),
        Command::Fix { file, output, .. } => fix(&file, output.as_ref()),
        Command::Bench {
            write_trace,
            json,
            shape: Some(shape),
            size,
            ..
        } => bench_shape(&shape, size, write_trace.as_ref(), json),
        Command::Bench {
            ops,
            streams,
            buffers,
            seed,
            write_trace,
            json,
            waits,
            syncs,
            ..
        } => bench(
            Pipeline {
                ops,
                streams,
                buffers,
                seed,
            },
            (waits, syncs),
            write_trace.as_ref(),
            json,
        ),
        Command::Fuzz(args) => fuzz(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("streamsan: {}", for_terminal(&message));
            2
        }
    }
}

fn init_tracing() {
    if let Ok(filter) = std::env::var("STREAMSAN_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(io::stderr)
            .try_init();
    }
}

/// A reader that counts the bytes it hands out, for the progress bar.
struct Counting<R> {
    inner: R,
    count: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: io::Read> io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

type Input = (
    Box<dyn BufRead>,
    String,
    Option<u64>,
    std::rc::Rc<std::cell::Cell<u64>>,
);

fn open_input(path: &PathBuf) -> Result<Input, String> {
    let count = std::rc::Rc::new(std::cell::Cell::new(0));
    if path.as_os_str() == "-" {
        let r = Counting {
            inner: io::stdin(),
            count: count.clone(),
        };
        return Ok((
            Box::new(BufReader::with_capacity(1 << 16, r)),
            "<stdin>".into(),
            None,
            count,
        ));
    }
    let name = path.display().to_string();
    let f = File::open(path).map_err(|e| format!("{name}: cannot open: {e}"))?;
    let len = f.metadata().ok().map(|m| m.len());
    let r = Counting {
        inner: f,
        count: count.clone(),
    };
    Ok((
        Box::new(BufReader::with_capacity(1 << 16, r)),
        name,
        len,
        count,
    ))
}

/// Where a command writes its result: standard output, or a file written safely (replaced
/// atomically, links followed, devices and FIFOs written in place; see `streamsan::output`).
enum Output {
    Stdout(io::BufWriter<io::Stdout>),
    File(OutputFile),
}

impl Output {
    /// Standard output for `None` and `-`, else the file.
    fn open(path: Option<&PathBuf>) -> Result<Output, String> {
        match path {
            Some(p) if p.as_os_str() != "-" => OutputFile::create(p)
                .map(Output::File)
                .map_err(|e| format!("{}: cannot write: {e}", p.display())),
            _ => Ok(Output::Stdout(io::BufWriter::with_capacity(
                1 << 16,
                io::stdout(),
            ))),
        }
    }

    /// Flushes the output and, for a file, puts it in place.
    fn commit(self) -> io::Result<()> {
        match self {
            Output::Stdout(mut w) => w.flush(),
            Output::File(f) => f.commit(),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::Stdout(w) => w.write(buf),
            Output::File(f) => f.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout(w) => w.write_all(buf),
            Output::File(f) => f.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(w) => w.flush(),
            Output::File(f) => f.flush(),
        }
    }
}

/// Where the checker's error about `op` points: the offending field's value. A `stream_create`
/// that contradicts an earlier declaration or first use is located at the value that differs
/// (`device` or `blocking`), or at the stream's name when that value is left to its default.
fn locate(checker: &Checker, op: &TraceOp, spans: &Spans, e: &CheckError) -> (u64, u64) {
    let mut field = e.field;
    if let (
        Field::Op,
        Op::StreamCreate {
            stream,
            device,
            blocking,
        },
    ) = (field, &op.op)
    {
        let order = checker.order();
        field = Field::Stream;
        if let Some(info) = order.find_stream(stream).map(|p| order.stream_info(p)) {
            let differs = if info.device != *device {
                Some(Field::Device)
            } else if info.blocking != *blocking {
                Some(Field::Blocking)
            } else {
                None
            };
            if let Some(f) = differs.filter(|&f| spans.column(f).is_some()) {
                field = f;
            }
        }
    }
    spans.locate(field)
}

/// Refuses to write `output` over the trace `file` being read (the same file, also through
/// links or another name).
fn refuse_overwrite(file: &PathBuf, output: Option<&PathBuf>, what: &str) -> Result<(), String> {
    match output {
        Some(out) if rereadable(file) && same_file(file, out) => Err(format!(
            "{}: the output would overwrite the trace being {what}; write it elsewhere",
            out.display()
        )),
        _ => Ok(()),
    }
}

fn progress(len: Option<u64>) -> indicatif::ProgressBar {
    match len {
        Some(len) if len > (16 << 20) && io::stderr().is_terminal() => {
            let bar = indicatif::ProgressBar::new(len);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} checking {bytes}/{total_bytes} {wide_bar} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        }
        _ => indicatif::ProgressBar::hidden(),
    }
}

fn check(
    file: &PathBuf,
    format: Format,
    color: Color,
    output: Option<&PathBuf>,
    confirm: Option<(Backend, u32)>,
    syncs: bool,
) -> Result<u8, String> {
    refuse_overwrite(file, output, "checked")?;
    let (input, name, len, count) = open_input(file)?;
    let bar = progress(len);
    // Text, dot and html walk the trace a second time to explain the hazards; what cannot be
    // read twice (standard input, a pipe) is kept in a temporary file for that.
    let explains = matches!(format, Format::Text | Format::Dot | Format::Html);
    let mut spool = None;
    // The synchronization analysis may walk it again too, to re-check a few syncs.
    let input: Box<dyn BufRead> = if (explains || syncs) && !rereadable(file) {
        match Spool::create() {
            Ok((s, f)) => {
                let tee = Tee {
                    inner: input,
                    copy: Some(io::BufWriter::new(f)),
                    failed: s.failed.clone(),
                };
                spool = Some(s);
                Box::new(BufReader::with_capacity(1 << 16, tee))
            }
            Err(e) => {
                eprintln!(
                    "streamsan: {}; the report will not explain its hazards",
                    for_terminal(&e)
                );
                input
            }
        }
    } else {
        input
    };
    let mut reader = TraceReader::new(input, name.clone());
    let mut checker = CheckRun::new(syncs);
    // With --confirm the program is kept, to run it.
    let mut program = Vec::new();
    loop {
        let (op, spans) = match reader.next_op() {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => return Err(e.to_string()),
        };
        if let Err(e) = checker.check(&op) {
            let at = locate(checker.checker(), &op, spans, &e);
            return Err(ParseError::at(name, at, e.message, e.expected.as_deref()).to_string());
        }
        if confirm.is_some() {
            program.push(op);
        }
        if checker.ops() % 65_536 == 0 {
            bar.set_position(count.get());
        }
    }
    bar.finish_and_clear();
    drop(reader);
    let implicit = checker.checker().implicit_syncs().to_vec();
    let mut report = match &spool {
        Some(s) if !s.failed.get() => {
            checker.finish(Some(&Source::File(s.file.path().into())), &name)?
        }
        Some(_) => checker.finish(None, &name)?,
        None => checker.finish(
            rereadable(file)
                .then(|| Source::File(file.clone()))
                .as_ref(),
            &name,
        )?,
    };
    if let Some((backend, attempts)) = confirm {
        confirm_hazards(&program, &mut report, backend, attempts)?;
    }
    let source = match &spool {
        Some(s) if !s.failed.get() && explains => Some(Source::File(s.file.path().to_path_buf())),
        Some(_) => None,
        None if explains && rereadable(file) => Some(Source::File(file.clone())),
        None => None,
    };
    if explains && spool.as_ref().is_some_and(|s| s.failed.get()) {
        eprintln!(
            "streamsan: cannot keep a copy of the input; the report will not explain its hazards"
        );
    }
    let wants_graph = explains && (!report.hazards.is_empty() || format != Format::Text);
    let picture = match source.filter(|_| wants_graph) {
        Some(source) => match explain(&source, &name, &mut report, &implicit, len) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!(
                    "streamsan: {}; the report will not explain its hazards",
                    for_terminal(&e)
                );
                None
            }
        },
        None => None,
    };
    if picture.is_none() && matches!(format, Format::Dot | Format::Html) {
        return Err(format!(
            "{name}: cannot walk the trace a second time to draw it"
        ));
    }
    let text = match format {
        Format::Json => report.to_json() + "\n",
        Format::Dot | Format::Html => match picture.as_ref() {
            Some(p) if format == Format::Dot => streamsan::graph::render_dot(p),
            Some(p) => streamsan::graph::render_html(p),
            None => String::new(),
        },
        Format::Sarif => {
            let trace = (file.as_os_str() != "-").then(|| name.clone());
            streamsan::report::render_sarif(&report, &streamsan::report::SarifOptions { trace })
        }
        Format::Text => {
            let to_terminal = output.is_none() && io::stdout().is_terminal();
            let mut opts = match color {
                Color::Auto => TextOptions::for_terminal(to_terminal),
                Color::Always => TextOptions {
                    color: true,
                    file: None,
                },
                Color::Never => TextOptions::plain(),
            };
            opts.file = Some(name);
            render_text(&report, &opts)
        }
    };
    let mut out = Output::open(output)?;
    match out.write_all(text.as_bytes()).and_then(|_| out.commit()) {
        // `streamsan check … | head`: the reader has what it wanted; the verdict stands.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(format!("cannot write the report: {e}")),
        Ok(()) => {}
    }
    Ok(if report.is_clean() { 0 } else { 1 })
}

/// The trace, opened again for a second walk: the file, or the copy of standard input.
enum Source {
    File(PathBuf),
}

impl Source {
    fn open(&self) -> Result<Box<dyn BufRead + '_>, String> {
        match self {
            Source::File(path) => File::open(path)
                .map(|f| Box::new(BufReader::with_capacity(1 << 16, f)) as Box<dyn BufRead>)
                .map_err(|e| format!("{}: cannot open: {e}", path.display())),
        }
    }
}

fn fix(file: &PathBuf, output: Option<&PathBuf>) -> Result<u8, String> {
    use streamsan::fix::{is_fixable, Fixer};
    let name = if file.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    };
    refuse_overwrite(file, output, "fixed")?;
    // Standard input or a pipe is read once, and copied to a private temporary file for the
    // second walk (memory stays bounded whatever the input).
    let mut spool = None;
    let input: Box<dyn BufRead> = if rereadable(file) {
        Box::new(BufReader::with_capacity(
            1 << 16,
            File::open(file).map_err(|e| format!("{name}: cannot open: {e}"))?,
        ))
    } else {
        let (input, ..) = open_input(file)?;
        let (s, f) = Spool::create().map_err(|e| {
            format!("{e}: `fix` needs a copy of the trace it reads from {name} (set TMPDIR)")
        })?;
        let tee = Tee {
            inner: input,
            copy: Some(io::BufWriter::new(f)),
            failed: s.failed.clone(),
        };
        spool = Some(s);
        Box::new(BufReader::with_capacity(1 << 16, tee))
    };
    // First walk: the hazards, and the event names in use.
    let mut reader = TraceReader::new(input, name.clone());
    let mut checker = Checker::new();
    let mut events = std::collections::HashSet::new();
    while let Some((op, spans)) = reader.next_op().map_err(|e| e.to_string())? {
        if let Err(e) = checker.check(&op) {
            let at = locate(&checker, &op, spans, &e);
            return Err(ParseError::at(name, at, e.message, e.expected.as_deref()).to_string());
        }
        if let Some(e) = op.op.event() {
            events.insert(e.clone());
        }
    }
    drop(reader);
    let before = checker.finish();
    let source = match &spool {
        Some(s) if s.failed.get() => {
            return Err(format!(
                "{}: cannot write a copy of {name} for the second walk",
                s.file.path().display()
            ))
        }
        Some(s) => Source::File(s.file.path().to_path_buf()),
        None => Source::File(file.clone()),
    };
    // Second walk: copy every line, with the insertions before their ops.
    let mut fixer = Fixer::new(&before, events);
    let mut input = source.open()?;
    // A file is written beside its final name and renamed there only when complete.
    let mut out = Some(Output::open(output)?);
    // Writes to `out`; a reader that went away (`fix … | head`) closes it, and the walk goes on
    // without output, to the verdict.
    let write = |out: &mut Option<Output>, bytes: &[u8]| -> Result<(), String> {
        let Some(w) = out.as_mut() else {
            return Ok(());
        };
        match w.write_all(bytes) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                *out = None;
                Ok(())
            }
            Err(e) => Err(format!("cannot write the fixed trace: {e}")),
        }
    };
    let (mut line, mut number, mut index) = (Vec::new(), 0u64, 0u64);
    let mut text = String::new();
    let longest = streamsan::trace::MAX_LINE_BYTES as u64;
    loop {
        line.clear();
        // The first walk read every line within the limit; reading no more than that (and its
        // `\n`) keeps memory bounded if the file changed since.
        let n = io::Read::take(&mut input, longest + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("{name}: cannot read: {e}"))?;
        if n == 0 {
            break;
        }
        number += 1;
        let mut content = line.strip_suffix(b"\n").unwrap_or(&line);
        if content.len() as u64 > longest {
            return Err(format!(
                "{name}:{number}: the trace changed since it was read (the line is too long now)"
            ));
        }
        if number == 1 {
            content = content.strip_prefix(b"\xef\xbb\xbf").unwrap_or(content);
        }
        let parsed = streamsan::trace::parse_line_bytes(content)
            .map_err(|e| format!("{name}:{number}:{}: {}", e.column, e.message))?;
        if let Some((op, _)) = parsed {
            let inserted = fixer.op(index, &op).map_err(|e| {
                format!("{name}:{number}: {e} (the trace changed since it was read?)")
            })?;
            if let Some(ins) = inserted {
                text.clear();
                text.push_str("# ");
                text.push_str(&ins.comment);
                text.push('\n');
                for extra in &ins.ops {
                    streamsan::trace::write_op(extra, &mut text);
                    text.push('\n');
                }
                write(&mut out, text.as_bytes())?;
            }
            index += 1;
        }
        write(&mut out, &line)?;
    }
    if index != before.ops {
        return Err(format!(
            "{name}: the trace changed while it was read ({} ops, then {index})",
            before.ops
        ));
    }
    if let Some(out) = out {
        match out.commit() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            Err(e) => return Err(format!("cannot write the fixed trace: {e}")),
            Ok(()) => {}
        }
    }
    let (summary, after) = fixer.finish();
    let plural = |n: u64, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    if summary.fixable == 0 {
        eprintln!("streamsan: no data-race, reuse-race or unsafe-free to fix; the trace is written unchanged");
    } else {
        eprintln!(
            "streamsan: fixed {} of {} with {} ({:.2} per hazard fixed)",
            summary.fixed,
            plural(summary.fixable, "hazard"),
            plural(summary.inserted, "inserted op"),
            summary.inserted as f64 / summary.fixed.max(1) as f64
        );
    }
    let left: Vec<String> = after
        .hazards
        .iter()
        .map(|h| {
            let buffer = h
                .buffer
                .as_deref()
                .map(|b| format!(" on {}", escape(b)))
                .unwrap_or_default();
            match fixer.original_index(h.op) {
                Some(op) => format!("{}{buffer} at op {op}", h.kind),
                None => format!("{}{buffer} at inserted op {}", h.kind, h.op),
            }
        })
        .collect();
    if after.hazards.iter().any(|h| is_fixable(h.kind)) {
        eprintln!(
            "streamsan: the fixed trace still has hazards: {}; please report this with the trace",
            left.join(", ")
        );
        return Ok(1);
    }
    if left.is_empty() {
        eprintln!("streamsan: the written trace checks clean");
    } else {
        eprintln!(
            "streamsan: left as they were (no synchronization fixes them): {}",
            left.join(", ")
        );
    }
    Ok(if after.is_clean() { 0 } else { 1 })
}

/// Walks the trace a second time through the dependency graph: explains the report's hazards
/// and returns the picture.
fn explain(
    source: &Source,
    name: &str,
    report: &mut streamsan::Report,
    implicit: &[(u64, u64)],
    len: Option<u64>,
) -> Result<streamsan::graph::Picture, String> {
    use streamsan::graph::{DepGraph, GraphConfig};
    let bar = progress(len);
    let mut graph = DepGraph::new(report, GraphConfig::default()).with_implicit_syncs(implicit);
    let mut reader = TraceReader::new(source.open()?, name.to_string());
    let mut index = 0u64;
    while let Some((op, _)) = reader.next_op().map_err(|e| e.to_string())? {
        graph.add(index, &op);
        index += 1;
        if index % 65_536 == 0 {
            bar.inc(65_536);
        }
    }
    bar.finish_and_clear();
    if index != report.ops {
        return Err(format!(
            "{name}: the trace changed while it was read ({} ops, then {index})",
            report.ops
        ));
    }
    let stats = graph.stats();
    tracing::info!(
        ops = stats.ops,
        peak_nodes = stats.peak_nodes,
        peak_edges = stats.peak_edges,
        nodes = stats.nodes,
        edges = stats.edges,
        lanes = stats.lanes,
        "dependency graph"
    );
    Ok(graph.finish(report, name))
}

/// Whether two paths name the same file (also through links).
fn same_file(a: &PathBuf, b: &PathBuf) -> bool {
    let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        x.dev() == y.dev() && x.ino() == y.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (x, y);
        std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    }
}

/// Whether `path` names a regular file, which can be read a second time.
fn rereadable(path: &PathBuf) -> bool {
    path.as_os_str() != "-" && std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// A temporary copy of an input that cannot be read twice: a private file, removed when
/// dropped, and on SIGINT or SIGTERM.
struct Spool {
    file: TempFile,
    /// Set when writing the copy failed: the copy is then incomplete.
    failed: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Spool {
    /// A new file of this process alone (created exclusively, readable by its owner only).
    fn create() -> Result<(Self, File), String> {
        let (file, f) = TempFile::private("streamsan-input-", ".jsonl").map_err(|e| {
            let dir = std::env::temp_dir();
            format!("{}: cannot create a temporary file: {e}", dir.display())
        })?;
        let failed = Default::default();
        Ok((Spool { file, failed }, f))
    }
}

/// A reader that copies what it reads to `copy`; a failed write stops the copy (and sets
/// `failed`) without failing the read.
struct Tee<R, W: Write> {
    inner: R,
    copy: Option<W>,
    failed: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: io::Read, W: Write> io::Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(copy) = self.copy.as_mut() {
            let written =
                copy.write_all(&buf[..n])
                    .and_then(|_| if n == 0 { copy.flush() } else { Ok(()) });
            if written.is_err() {
                self.failed.set(true);
                self.copy = None;
            }
        }
        Ok(n)
    }
}

fn bench(
    p: Pipeline,
    (waits, syncs): (u32, bool),
    write_trace: Option<&PathBuf>,
    json: bool,
) -> Result<u8, String> {
    if let Some(path) = write_trace {
        let out = Output::open(Some(path))?;
        let mut w = TraceWriter::new(out);
        let mut result = Ok(());
        p.generate_waiting(waits, |op| {
            if result.is_ok() {
                result = w.write(&op);
            }
        });
        result
            .and_then(|_| w.finish())
            .and_then(Output::commit)
            .map_err(|e| format!("cannot write the trace: {e}"))?;
        return Ok(0);
    }
    // The workload is generated in batches, and only the checking of each batch is timed:
    // memory stays the same for any number of ops.
    const BATCH: usize = 4096;
    let mut checker = CheckRun::new(syncs);
    let mut batch = Vec::with_capacity(BATCH);
    let mut elapsed = std::time::Duration::ZERO;
    let (mut hazards, mut peak_history, mut count) = (0usize, 0usize, 0u64);
    let mut failed = None;
    let mut run = |batch: &mut Vec<streamsan::trace::TraceOp>| {
        let start = Instant::now();
        for op in batch.iter() {
            match checker.check(op) {
                Ok(h) => hazards += h,
                Err(e) => {
                    failed.get_or_insert(format!(
                        "the generated workload is invalid at op {count}: {e}"
                    ));
                    return;
                }
            }
            if count % 1024 == 0 {
                peak_history = peak_history.max(checker.checker().stats().history);
            }
            count += 1;
        }
        elapsed += start.elapsed();
        batch.clear();
    };
    p.generate_waiting(waits, |op| {
        batch.push(op);
        if batch.len() == BATCH {
            run(&mut batch);
        }
    });
    run(&mut batch);
    if let Some(e) = failed {
        return Err(e);
    }
    let stats = checker.checker().stats();
    // The analysis's verdicts are made at the end, timed too.
    let start = Instant::now();
    let analysis = checker.finish_syncs();
    elapsed += start.elapsed();
    let ops = count;
    let n = ops as f64;
    let ns_per_op = elapsed.as_nanos() as f64 / n;
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "ops": ops, "streams": p.streams, "buffers": p.buffers,
                "seconds": elapsed.as_secs_f64(), "ns_per_op": ns_per_op,
                "ops_per_second": n / elapsed.as_secs_f64(), "hazards": hazards,
                "peak_history": peak_history, "generations": stats.generations,
                "syncs": analysis.as_ref().map(|(n, needed, s)| serde_json::json!({
                    "syncs": n, "needed": needed, "stats": s,
                })),
            })
        );
    } else {
        outln!(
            "{} ops, {} streams, {} buffers: {:.1} ns/op, {:.2} M ops/s ({:.3} s); {} hazards; peak history {} accesses",
            ops,
            p.streams,
            p.buffers,
            ns_per_op,
            n / elapsed.as_secs_f64() / 1e6,
            elapsed.as_secs_f64(),
            hazards,
            peak_history
        );
        if let Some((n, needed, s)) = analysis {
            outln!(
                "synchronization analysis: {n} synchronization ops, {needed} needed; {} unchanged by their removal, {} what-ifs (at most {} at once), {} given up; {} what-if updates, {} accesses checked again",
                s.unchanged, s.whatifs, s.peak_live, s.abandoned, s.updates, s.probes
            );
        }
    }
    Ok(0)
}

/// The peak resident set size of this process in KiB (`VmHWM`), where /proc tells it.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `bench --shape`: checks one hardening shape op by op (the trace is never held in memory) and
/// prints the time, the peak RSS, the checker's counters at their peak (sampled; see below) and
/// the JSON report's size.
fn bench_shape(
    name: &str,
    size: Option<u64>,
    write_trace: Option<&PathBuf>,
    json: bool,
) -> Result<u8, String> {
    let Some(shape) = Shape::from_name(name) else {
        let names: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        return Err(format!(
            "unknown shape {name:?}; expected one of {}",
            names.join(", ")
        ));
    };
    let size = size.unwrap_or(shape.default_size());
    if let Some(path) = write_trace {
        let out = Output::open(Some(path))?;
        let mut w = TraceWriter::new(out);
        let mut result = Ok(());
        shape.generate(size, |op| {
            if result.is_ok() {
                result = w.write(&op);
            }
        });
        result
            .and_then(|_| w.finish())
            .and_then(Output::commit)
            .map_err(|e| format!("cannot write the trace: {e}"))?;
        return Ok(0);
    }
    let mut checker = Checker::new();
    let start = Instant::now();
    let mut error = None;
    let mut peak = checker.stats();
    shape.generate(size, |op| {
        if error.is_some() {
            return;
        }
        if let Err(e) = checker.check(&op) {
            error = Some(format!(
                "the generated shape is invalid at op {}: {e}",
                checker.ops()
            ));
        }
        // Counting clock storage walks every clock: sample the counters every 256 ops, and at
        // least 64 times per doubling of the trace.
        let n = checker.ops();
        let every = (n.next_power_of_two() / 64).max(256);
        if n % every == 0 {
            peak = peak.max(&checker.stats());
        }
    });
    peak = peak.max(&checker.stats());
    if let Some(e) = error {
        return Err(e);
    }
    let checked = start.elapsed();
    let report = checker.finish();
    let report_bytes = report.to_json().len();
    let elapsed = start.elapsed();
    let rss = peak_rss_kib();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "shape": shape.name(), "size": size, "ops": report.ops,
                "seconds": elapsed.as_secs_f64(), "check_seconds": checked.as_secs_f64(),
                "peak_rss_kib": rss, "hazards": report.hazards.len(),
                "report_bytes": report_bytes, "peak_history": peak.history,
                "peak_graveyard": peak.graveyard, "peak_clock_entries": peak.clock_entries,
                "peak_generations": peak.generations,
            })
        );
    } else {
        outln!(
            "{} {}: {} ops in {:.3} s ({:.1} ns/op); peak RSS {}; {} hazards, JSON report {} bytes; peak history {}, graveyard {}, clock entries {}, generations {}",
            shape.name(),
            size,
            report.ops,
            elapsed.as_secs_f64(),
            checked.as_nanos() as f64 / report.ops.max(1) as f64,
            rss.map_or("unknown".to_string(), |k| format!("{k} KiB")),
            report.hazards.len(),
            report_bytes,
            peak.history,
            peak.graveyard,
            peak.clock_entries,
            peak.generations,
        );
    }
    Ok(0)
}

fn fuzz(args: FuzzArgs) -> Result<u8, String> {
    let FuzzArgs {
        backend,
        cases,
        seed,
        ops,
        missing_sync,
        schedules,
        out_dir,
        attempts,
        initialize,
        keep_unconfirmed,
        fix,
        json,
    } = args;
    use streamsan::fuzz::campaign::{run_campaign, CampaignConfig, Executor, SimExecutor};
    use streamsan::fuzz::gen::GenConfig;
    if !(0.0..=1.0).contains(&missing_sync) {
        return Err(format!(
            "--missing-sync {missing_sync}: expected a probability from 0 to 1"
        ));
    }
    let cfg = CampaignConfig {
        cases,
        seed,
        gen: GenConfig {
            ops,
            missing_sync,
            // A GPU leaves the previous owner's bytes in new memory; programs there never read
            // memory they have not written.
            initialize: initialize || backend == Backend::Cuda,
            ..GenConfig::default()
        },
        random_schedules: schedules,
        attempts,
        out_dir,
        keep_unconfirmed,
    };
    let mut exec: Box<dyn Executor> = match backend {
        Backend::Sim => Box::new(SimExecutor::default()),
        Backend::Cuda => cuda_executor()?,
    };
    let bar = if io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(cases);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {pos}/{len} programs {wide_bar} {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let start = Instant::now();
    if fix {
        return fuzz_fix(&cfg, exec.as_mut(), &bar, start, json);
    }
    let res = run_campaign(&cfg, exec.as_mut(), |n, s| {
        bar.set_position(n);
        bar.set_message(format!(
            "{} hazards, {} confirmed, {} unexplained",
            s.hazards, s.confirmed, s.unexplained
        ));
    })?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let s = &res.summary;
    if json {
        outln!("{}", serde_json::to_string(s).map_err(|e| e.to_string())?);
    } else {
        let pct = |a: u64, b: u64| {
            if b == 0 {
                100.0
            } else {
                100.0 * a as f64 / b as f64
            }
        };
        outln!(
            "{} programs on {} in {:.1} s ({:.0} programs/min, {} runs): {} with hazards",
            s.programs,
            exec.name(),
            secs,
            s.programs as f64 / secs * 60.0,
            res.runs,
            s.with_hazards
        );
        for (name, k) in ["data-race", "unsafe-free", "reuse-race"]
            .iter()
            .zip(&res.by_kind)
        {
            outln!(
                "  {name:12} {:6} reported, {:6} confirmed ({:.1}%)",
                k.hazards,
                k.confirmed,
                pct(k.confirmed, k.hazards)
            );
        }
        outln!(
            "  all          {:6} reported, {:6} confirmed ({:.1}%)",
            s.hazards,
            s.confirmed,
            pct(s.confirmed, s.hazards)
        );
        outln!("  unexplained: {}", s.unexplained);
        for c in s.counterexamples.iter().take(10) {
            let c = escape(c);
            outln!("  counterexample: {c}  (reproduce: streamsan check {c})");
        }
        if s.counterexamples.len() > 10 {
            outln!(
                "  … and {} more counterexamples in {}",
                s.counterexamples.len() - 10,
                escape(&cfg.out_dir.display().to_string())
            );
        }
        for c in &res.unconfirmed {
            outln!("  unconfirmed: {}", escape(c));
        }
    }
    Ok(if s.unexplained == 0 { 0 } else { 1 })
}

fn fuzz_fix(
    cfg: &streamsan::fuzz::campaign::CampaignConfig,
    exec: &mut dyn streamsan::fuzz::campaign::Executor,
    bar: &indicatif::ProgressBar,
    start: Instant,
    json: bool,
) -> Result<u8, String> {
    let res = streamsan::fuzz::fixes::run_fix_campaign(cfg, exec, |n, s| {
        bar.set_position(n);
        bar.set_message(format!(
            "{} hazards, {} fixed, {} inserted ops",
            s.hazards, s.fixed, s.inserted
        ));
    })?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if json {
        outln!(
            "{}",
            serde_json::to_string(&res).map_err(|e| e.to_string())?
        );
    } else {
        outln!(
            "{} programs fixed on {} in {:.1} s: {} with hazards",
            res.programs,
            exec.name(),
            secs,
            res.with_hazards
        );
        outln!(
            "  hazards {}, fixed {}, inserted ops {} ({:.2} per hazard fixed, at most {:.2} at one op)",
            res.hazards,
            res.fixed,
            res.inserted,
            res.per_hazard,
            res.max_per_hazard
        );
        outln!(
            "  fixed programs run: {} ({} runs, {} provocations of the original hazards); diverged: {}",
            res.run,
            res.runs,
            res.provocations,
            res.diverged
        );
        outln!(
            "  not fixed: {}; original ops lost or reordered: {}; over two ops per hazard: {}",
            res.not_fixed,
            res.reordered,
            res.over_budget
        );
        for c in res.counterexamples.iter().take(10) {
            let c = escape(c);
            outln!("  counterexample: {c}  (reproduce: streamsan fix {c} | streamsan check -)");
        }
    }
    let failed = res.not_fixed + res.reordered + res.over_budget + res.diverged;
    Ok(if failed == 0 { 0 } else { 1 })
}

/// Provokes every hazard and records in the report what was observed (or why it did not run).
fn confirm_hazards(
    program: &[streamsan::trace::TraceOp],
    report: &mut streamsan::Report,
    backend: Backend,
    attempts: u32,
) -> Result<(), String> {
    use streamsan::fuzz::campaign::{confirm_report, Executor, SimExecutor};
    let mut exec: Box<dyn Executor> = match backend {
        Backend::Sim => Box::new(SimExecutor::default()),
        Backend::Cuda => cuda_executor()?,
    };
    let bar = if io::stderr().is_terminal() && !report.hazards.is_empty() {
        let bar = indicatif::ProgressBar::new(report.hazards.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} provoking hazard {pos}/{len} {wide_bar} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    confirm_report(program, report, exec.as_mut(), attempts, |done, _| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    for h in &mut report.hazards {
        if let Some(c) = &h.confirmation {
            h.detail.notes.push(streamsan::report::OpNote {
                what: c.describe(),
                op: h.op,
                site: None,
            });
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda_executor() -> Result<Box<dyn streamsan::fuzz::campaign::Executor>, String> {
    if !streamsan::cuda::Gpu::available() {
        return Err(
            "--backend cuda: no CUDA driver or device found on this machine; use --backend sim"
                .into(),
        );
    }
    let exec =
        streamsan::fuzz::cuda::CudaExecutor::new(0).map_err(|e| format!("--backend cuda: {e}"))?;
    Ok(Box::new(exec))
}

#[cfg(not(feature = "cuda"))]
fn cuda_executor() -> Result<Box<dyn streamsan::fuzz::campaign::Executor>, String> {
    Err("--backend cuda: this streamsan was built without the `cuda` feature".into())
}

/// The checker of `check`: plain, or with the synchronization analysis (`--syncs`).
enum CheckRun {
    Plain(Box<Checker>),
    Syncs(Box<streamsan::analysis::syncs::SyncChecker>),
}

impl CheckRun {
    fn new(syncs: bool) -> Self {
        if syncs {
            CheckRun::Syncs(Box::default())
        } else {
            CheckRun::Plain(Box::default())
        }
    }

    /// Checks an op; returns the number of hazards it raised.
    fn check(&mut self, op: &TraceOp) -> Result<usize, CheckError> {
        match self {
            CheckRun::Plain(c) => c.check(op).map(|h| h.len()),
            CheckRun::Syncs(c) => c.check(op).map(|h| h.len()),
        }
    }

    /// For `bench`: with the analysis, the number of synchronization ops, how many were needed
    /// (those left to a re-check counted as redundant), and the analysis's counters.
    fn finish_syncs(self) -> Option<(usize, usize, streamsan::analysis::syncs::SyncStats)> {
        match self {
            CheckRun::Plain(_) => None,
            CheckRun::Syncs(c) => {
                let o = c.finish();
                let needed = o.syncs.iter().filter(|s| s.needed).count();
                Some((o.syncs.len(), needed, o.stats))
            }
        }
    }

    fn checker(&self) -> &Checker {
        match self {
            CheckRun::Plain(c) => c,
            CheckRun::Syncs(c) => c.checker(),
        }
    }

    fn ops(&self) -> u64 {
        self.checker().ops()
    }

    /// Ends the walk: the report, with a verdict on every synchronization op when analysed. The
    /// few ops the analysis leaves to a re-check are decided by walking `source` again.
    fn finish(self, source: Option<&Source>, name: &str) -> Result<streamsan::Report, String> {
        let c = match self {
            CheckRun::Plain(c) => return Ok((*c).finish()),
            CheckRun::Syncs(c) => c,
        };
        let stats = c.stats();
        let mut outcome = c.finish();
        tracing::info!(
            unchanged = stats.unchanged,
            whatifs = stats.whatifs,
            peak_live = stats.peak_live,
            abandoned = stats.abandoned,
            probes = stats.probes,
            "synchronization analysis"
        );
        if !outcome.undecided.is_empty() {
            let Some(source) = source else {
                return Err(format!(
                    "{name}: cannot walk the trace a second time to decide {} synchronization ops",
                    outcome.undecided.len()
                ));
            };
            streamsan::analysis::syncs::resolve(&mut outcome, |skipped, real| {
                let mut reader = TraceReader::new(source.open()?, name.to_string());
                let mut failed = None;
                let ops = std::iter::from_fn(|| match reader.next_op() {
                    Ok(Some((op, _))) => Some(op),
                    Ok(None) => None,
                    Err(e) => {
                        failed = Some(e.to_string());
                        None
                    }
                });
                let found = streamsan::analysis::syncs::recheck(ops, skipped, real)
                    .map_err(|e| format!("{name}: op {}: {e}", e.op))?;
                match failed {
                    Some(e) => Err(e),
                    None => Ok(found),
                }
            })?;
        }
        Ok(outcome.into_report())
    }
}

/// `fix --remove-redundant`: writes the trace without the synchronization ops that are
/// redundant together, every other line as it was. The trace is held in memory.
fn fix_remove_redundant(file: &PathBuf, output: Option<&PathBuf>) -> Result<u8, String> {
    let name = if file.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    };
    refuse_overwrite(file, output, "fixed")?;
    let (mut input, ..) = open_input(file)?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut input, &mut bytes)
        .map_err(|e| format!("{name}: cannot read: {e}"))?;
    // First walk: the ops, with located errors for bad input.
    let mut reader = TraceReader::new(&bytes[..], name.clone());
    let mut checker = Checker::new();
    let mut ops = Vec::new();
    while let Some((op, spans)) = reader.next_op().map_err(|e| e.to_string())? {
        if let Err(e) = checker.check(&op) {
            let at = locate(&checker, &op, spans, &e);
            return Err(ParseError::at(name, at, e.message, e.expected.as_deref()).to_string());
        }
        ops.push(op);
    }
    drop(reader);
    let removal = streamsan::analysis::syncs::remove_redundant(&ops)
        .map_err(|e| format!("{name}: op {}: {e}", e.op))?;
    // Second walk: every line, but those of the removed ops.
    let removed: std::collections::HashSet<u64> = removal.removed.iter().copied().collect();
    let mut out = Output::open(output)?;
    let mut index = 0u64;
    let mut written = Ok(());
    for (number, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
        let mut content = line.strip_suffix(b"\n").unwrap_or(line);
        content = content.strip_suffix(b"\r").unwrap_or(content);
        if number == 0 {
            content = content.strip_prefix(b"\xef\xbb\xbf").unwrap_or(content);
        }
        let is_op = streamsan::trace::parse_line_bytes(content)
            .map_err(|e| format!("{name}:{}:{}: {}", number + 1, e.column, e.message))?
            .is_some();
        if is_op {
            index += 1;
            if removed.contains(&(index - 1)) {
                continue;
            }
        }
        if written.is_ok() {
            written = out.write_all(line);
        }
    }
    match written.and_then(|_| out.commit()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(format!("cannot write the trace: {e}")),
        Ok(()) => {}
    }
    let after = &removal.after;
    eprintln!(
        "streamsan: removed {} of {} synchronization ops ({} ops left of {}); the written trace has {}",
        removal.removed.len(),
        removal.syncs,
        ops.len() - removal.removed.len(),
        ops.len(),
        if after.errors == 0 {
            "no error".to_string()
        } else {
            format!(
                "the {} error{} of the trace as written, no other",
                after.errors,
                if after.errors == 1 { "" } else { "s" }
            )
        }
    );
    Ok(if after.is_clean() { 0 } else { 1 })
}
