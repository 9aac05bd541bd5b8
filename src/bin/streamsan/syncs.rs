//! `check --syncs` and `fix --remove-redundant`: the synchronization analysis.

use super::*;

/// The checker of `check`: plain, or with the synchronization analysis (`--syncs`).
pub(crate) enum CheckRun {
    Plain(Box<Checker>),
    Syncs(Box<streamsan::analysis::syncs::SyncChecker>),
}

impl CheckRun {
    pub(crate) fn new(syncs: bool) -> Self {
        if syncs {
            CheckRun::Syncs(Box::default())
        } else {
            CheckRun::Plain(Box::default())
        }
    }

    /// Checks an op; returns the number of hazards it raised.
    pub(crate) fn check(&mut self, op: &TraceOp) -> Result<usize, CheckError> {
        match self {
            CheckRun::Plain(c) => c.check(op).map(|h| h.len()),
            CheckRun::Syncs(c) => c.check(op).map(|h| h.len()),
        }
    }

    /// For `bench`: with the analysis, the number of synchronization ops, how many were needed
    /// (those left to a re-check counted as redundant), and the analysis's counters.
    pub(crate) fn finish_syncs(
        self,
    ) -> Option<(usize, usize, streamsan::analysis::syncs::SyncStats)> {
        match self {
            CheckRun::Plain(_) => None,
            CheckRun::Syncs(c) => {
                let o = c.finish();
                let needed = o.syncs.iter().filter(|s| s.needed).count();
                Some((o.syncs.len(), needed, o.stats))
            }
        }
    }

    pub(crate) fn checker(&self) -> &Checker {
        match self {
            CheckRun::Plain(c) => c,
            CheckRun::Syncs(c) => c.checker(),
        }
    }

    pub(crate) fn ops(&self) -> u64 {
        self.checker().ops()
    }

    /// Ends the walk: the report, with a verdict on every synchronization op when analysed. The
    /// few ops the analysis leaves to a re-check are decided by walking `source` again.
    pub(crate) fn finish(
        self,
        source: Option<&Source>,
        name: &str,
    ) -> Result<streamsan::Report, CliError> {
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
                return Err(CliError::Io(format!(
                    "{name}: cannot walk the trace a second time to decide {} synchronization ops",
                    outcome.undecided.len()
                )));
            };
            streamsan::analysis::syncs::resolve(&mut outcome, |skipped, real| {
                let mut reader = TraceReader::new(source.open()?, name.to_string());
                let mut failed = None;
                let ops = std::iter::from_fn(|| match reader.next_op() {
                    Ok(Some((op, _))) => Some(op),
                    Ok(None) => None,
                    Err(e) => {
                        failed = Some(CliError::BadInput(e.to_string()));
                        None
                    }
                });
                let found = streamsan::analysis::syncs::recheck(ops, skipped, real)
                    .map_err(|e| CliError::Io(format!("{name}: op {}: {e}", e.op)))?;
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
pub(crate) fn fix_remove_redundant(
    file: &PathBuf,
    output: Option<&PathBuf>,
) -> Result<u8, CliError> {
    let name = if file.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    };
    refuse_overwrite(file, output, "fixed")?;
    let (mut input, ..) = open_input(file)?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut input, &mut bytes)
        .map_err(|e| CliError::Io(format!("{name}: cannot read: {e}")))?;
    // First walk: the ops, with located errors for bad input.
    let mut reader = TraceReader::new(&bytes[..], name.clone());
    let mut checker = Checker::new();
    let mut ops = Vec::new();
    while let Some((op, spans)) = reader
        .next_op()
        .map_err(|e| CliError::BadInput(e.to_string()))?
    {
        if let Err(e) = checker.check(&op) {
            let at = locate(&checker, &op, spans, &e);
            return Err(CliError::BadInput(
                ParseError::at(name, at, e.message, e.expected.as_deref()).to_string(),
            ));
        }
        ops.push(op);
    }
    drop(reader);
    let removal = streamsan::analysis::syncs::remove_redundant(&ops)
        .map_err(|e| CliError::Run(format!("{name}: op {}: {e}", e.op)))?;
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
            .map_err(|e| {
                CliError::BadInput(format!("{name}:{}:{}: {}", number + 1, e.column, e.message))
            })?
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
        Err(e) => return Err(CliError::Io(format!("cannot write the trace: {e}"))),
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
