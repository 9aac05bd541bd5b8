//! `check --syncs` and `fix --remove-redundant`: the synchronization analysis.

use super::*;
use streamsan::analysis::run::{RecheckError, RereadError};

/// Ends the walk of `check`: the report, with a verdict on every synchronization op when
/// analysed. The few ops the analysis leaves to a re-check are decided by walking `source`
/// again.
pub(crate) fn finish_check(
    run: CheckRun,
    source: Option<&Source>,
    name: &str,
) -> Result<streamsan::Report, CliError> {
    if let Some(stats) = run.analysis().map(|a| a.stats()) {
        tracing::info!(
            unchanged = stats.unchanged,
            whatifs = stats.whatifs,
            peak_live = stats.peak_live,
            abandoned = stats.abandoned,
            probes = stats.probes,
            "synchronization analysis"
        );
    }
    run.finish(source.map(|s| s.reread(name)))
        .map_err(|e| match e {
            RecheckError::NotKept { undecided } => CliError::Io(format!(
                "{name}: cannot walk the trace a second time to decide {undecided} synchronization ops"
            )),
            RecheckError::Read(e @ RereadError::Open { .. }) => CliError::Io(e.to_string()),
            RecheckError::Read(e) => CliError::BadInput(e.to_string()),
            RecheckError::Check(e) => CliError::Io(format!("{name}: op {}: {e}", e.op)),
        })
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
