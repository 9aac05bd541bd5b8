use super::*;

/// Where the checker's error about `op` points: the offending field's value. A `stream_create`
/// that contradicts an earlier declaration or first use is located at the value that differs
/// (`device` or `blocking`), or at the stream's name when that value is left to its default.
pub(crate) fn locate(checker: &Checker, op: &TraceOp, spans: &Spans, e: &CheckError) -> (u64, u64) {
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

pub(crate) fn check(
    file: &PathBuf,
    format: Format,
    color: Color,
    output: Option<&PathBuf>,
    confirm: Option<(Backend, u32)>,
    syncs: bool,
) -> Result<u8, CliError> {
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
                    for_terminal(&e.to_string())
                );
                input
            }
        }
    } else {
        input
    };
    let mut reader = TraceReader::new(input, name.clone());
    let mut checker = CheckRun::new(syncs, true);
    // With --confirm the program is kept, to run it.
    let mut program = Vec::new();
    loop {
        let (op, spans) = match reader.next_op() {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => return Err(CliError::BadInput(e.to_string())),
        };
        if let Err(e) = checker.check(&op) {
            let at = locate(checker.checker(), &op, spans, &e);
            return Err(CliError::BadInput(
                ParseError::at(name, at, e.message, e.expected.as_deref()).to_string(),
            ));
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
    // What a second walk reads: the spooled copy, or the file itself when it can be read again.
    let again = match &spool {
        Some(s) if !s.failed.get() => Some(Source::File(s.file.path().to_path_buf())),
        Some(_) => None,
        None => rereadable(file).then(|| Source::File(file.clone())),
    };
    let mut report = finish_check(checker, again.as_ref(), &name)?;
    if let Some((backend, attempts)) = confirm {
        confirm_hazards(&program, &mut report, backend, attempts)?;
    }
    let source = again.filter(|_| explains);
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
                    for_terminal(&e.to_string())
                );
                None
            }
        },
        None => None,
    };
    if picture.is_none() && matches!(format, Format::Dot | Format::Html) {
        return Err(CliError::Io(format!(
            "{name}: cannot walk the trace a second time to draw it"
        )));
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
        Err(e) => return Err(CliError::Io(format!("cannot write the report: {e}"))),
        Ok(()) => {}
    }
    Ok(if report.is_clean() { 0 } else { 1 })
}

/// Walks the trace a second time through the dependency graph: explains the report's hazards
/// and returns the picture.
pub(crate) fn explain(
    source: &Source,
    name: &str,
    report: &mut streamsan::Report,
    implicit: &[(u64, u64)],
    len: Option<u64>,
) -> Result<streamsan::graph::Picture, CliError> {
    let bar = progress(len);
    let picture = streamsan::graph::explain_trace(source.open()?, name, report, implicit, |_| {
        bar.inc(65_536)
    })
    .map_err(|e| match e {
        streamsan::graph::ExplainError::Read(e) => CliError::BadInput(e.to_string()),
        changed => CliError::Io(changed.to_string()),
    });
    bar.finish_and_clear();
    picture
}

/// Provokes every hazard and records in the report what was observed (or why it did not run).
pub(crate) fn confirm_hazards(
    program: &[streamsan::trace::TraceOp],
    report: &mut streamsan::Report,
    backend: Backend,
    attempts: u32,
) -> Result<(), CliError> {
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
pub(crate) fn cuda_executor() -> Result<Box<dyn streamsan::fuzz::campaign::Executor>, CliError> {
    if !streamsan::cuda::Gpu::available() {
        return Err(CliError::Usage(
            "--backend cuda: no CUDA driver or device found on this machine; use --backend sim"
                .into(),
        ));
    }
    let exec = streamsan::fuzz::cuda::CudaExecutor::new(0)
        .map_err(|e| CliError::Usage(format!("--backend cuda: {e}")))?;
    Ok(Box::new(exec))
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_executor() -> Result<Box<dyn streamsan::fuzz::campaign::Executor>, CliError> {
    Err(CliError::Usage(
        "--backend cuda: this streamsan was built without the `cuda` feature".into(),
    ))
}
