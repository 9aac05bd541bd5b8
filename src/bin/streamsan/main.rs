//! The `streamsan` command line: check recorded traces, fix them, benchmark the engine, fuzz.
//!
//! One file per subcommand (`check`, `fix`, `bench`, `fuzz`) and `files` for inputs and outputs;
//! every command returns its verdict as the exit status or a [`CliError`] (exit status 2). The
//! Python package runs the same code (`run`) as its `streamsan` command.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use streamsan::analysis::run::CheckRun;
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
        /// ring, loop-race, ranges, regions, live, graph-replays.
        #[arg(long, value_name = "SHAPE")]
        shape: Option<String>,
        /// The shape's size (cycles, log2 of bytes, streams, rounds, ranges, regions, buffers or
        /// replays); by default the size each shape was designed for.
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
    /// Generate programs with CUDA graphs: captures (forked and joined, with temporaries from
    /// private or shared pools) and their launches on several streams.
    #[arg(long)]
    graphs: bool,
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

/// Why a command gave no verdict: exit status 2, the message on standard error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The trace is not valid input (`FILE:LINE:COL: what was wrong; expected …`).
    #[error("{0}")]
    BadInput(String),
    /// A file could not be opened, read or written, or changed while it was read.
    #[error("{0}")]
    Io(String),
    /// The options ask for what this build, this machine or these arguments cannot do (no GPU,
    /// a feature built out, an output over its own input, an unknown shape).
    #[error("{0}")]
    Usage(String),
    /// A run went wrong: a generated program the checker rejected, a result that cannot be
    /// written as JSON, a backend that failed.
    #[error("{0}")]
    Run(String),
}

/// Prints a line to standard output; a closed pipe (`streamsan … | head`) is not an error.
macro_rules! outln {
    ($($arg:tt)*) => {{
        let _ = writeln!(io::stdout(), $($arg)*);
    }};
}

mod bench;
mod check;
mod files;
mod fix;
mod fuzz;
mod syncs;

use bench::*;
use check::*;
use files::*;
use fix::*;
use fuzz::*;
use syncs::*;

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
        Err(e) => {
            eprintln!("streamsan: {}", for_terminal(&e.to_string()));
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
