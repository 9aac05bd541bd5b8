use std::collections::BTreeSet;

use super::*;

pub(crate) fn fix(file: &PathBuf, output: Option<&PathBuf>) -> Result<u8, CliError> {
    use streamsan::fix::{is_fixable, Fixer};
    let name = if file.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    };
    refuse_overwrite(file, output, "fixed")?;
    // Standard input or a pipe is read once, and copied to a private temporary file for the
    // later walks (memory stays bounded whatever the input).
    let mut spool = None;
    let input: Box<dyn BufRead> = if rereadable(file) {
        Box::new(BufReader::with_capacity(
            1 << 16,
            File::open(file).map_err(|e| CliError::Io(format!("{name}: cannot open: {e}")))?,
        ))
    } else {
        let (input, ..) = open_input(file)?;
        let (s, f) = Spool::create().map_err(|e| {
            CliError::Io(format!(
                "{e}: `fix` needs a copy of the trace it reads from {name} (set TMPDIR)"
            ))
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
        if let Some(e) = op.op.event() {
            events.insert(e.clone());
        }
    }
    drop(reader);
    let before = checker.finish();
    let source = match &spool {
        Some(s) if s.failed.get() => {
            return Err(CliError::Io(format!(
                "{}: cannot write a copy of {name} for the later walks",
                s.file.path().display()
            )))
        }
        Some(s) => Source::File(s.file.path().to_path_buf()),
        None => Source::File(file.clone()),
    };
    // The walks: every line, with the insertions before their ops, until the written trace
    // keeps no reuse race that a walk keeping its wait whole fixes (a conflict the first check
    // listed at an earlier reuse only; see `Fixer::strict`): most traces need one. A file is
    // written beside its final name each time and renamed there only when it is the last;
    // standard output (and a file written in place: a pipe, a device) is written once, after
    // walks that write nothing.
    let to_file = output.is_some_and(|p| {
        p.as_os_str() != "-" && std::fs::metadata(p).map_or(true, |m| m.is_file())
    });
    let each = |strict: &BTreeSet<u64>, write: bool| -> Result<Walked, CliError> {
        let mut fixer = Fixer::new(&before, events.iter().cloned()).strict(strict.iter().copied());
        let mut out = if write {
            Some(Output::open(output)?)
        } else {
            None
        };
        walk(&name, &source, &mut fixer, &mut out, before.ops)?;
        let (summary, after) = fixer.finish();
        Ok(Walked {
            fixer,
            summary,
            after,
            out,
        })
    };
    let (mut last, strict) = streamsan::fix::settle(
        |strict| each(strict, to_file),
        |w: &Walked| (&w.after, w.fixer.insertions()),
    )?;
    if !to_file {
        last = each(&strict, true)?;
    }
    let Walked {
        fixer,
        summary,
        after,
        out,
    } = last;
    if let Some(out) = out {
        match out.commit() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            Err(e) => return Err(CliError::Io(format!("cannot write the fixed trace: {e}"))),
            Ok(()) => {}
        }
    }
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

/// A walk of the trace in `source` through `fixer`: every line copied to `out` (none: a dry
/// walk), with the insertions before their ops. `ops`: the number of ops the first walk read.
fn walk(
    name: &str,
    source: &Source,
    fixer: &mut streamsan::fix::Fixer,
    out: &mut Option<Output>,
    ops: u64,
) -> Result<(), CliError> {
    let mut input = source.open()?;
    // Writes to `out`; a reader that went away (`fix … | head`) closes it, and the walk goes on
    // without output, to the verdict.
    let write = |out: &mut Option<Output>, bytes: &[u8]| -> Result<(), CliError> {
        let Some(w) = out.as_mut() else {
            return Ok(());
        };
        match w.write_all(bytes) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                *out = None;
                Ok(())
            }
            Err(e) => Err(CliError::Io(format!("cannot write the fixed trace: {e}"))),
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
            .map_err(|e| CliError::Io(format!("{name}: cannot read: {e}")))?;
        if n == 0 {
            break;
        }
        number += 1;
        let mut content = line.strip_suffix(b"\n").unwrap_or(&line);
        if content.len() as u64 > longest {
            return Err(CliError::Io(format!(
                "{name}:{number}: the trace changed since it was read (the line is too long now)"
            )));
        }
        if number == 1 {
            content = content.strip_prefix(b"\xef\xbb\xbf").unwrap_or(content);
        }
        let parsed = streamsan::trace::parse_line_bytes(content).map_err(|e| {
            CliError::BadInput(format!("{name}:{number}:{}: {}", e.column, e.message))
        })?;
        if let Some((op, _)) = parsed {
            let inserted = fixer.op(index, &op).map_err(|e| {
                CliError::BadInput(format!(
                    "{name}:{number}: {e} (the trace changed since it was read?)"
                ))
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
                write(out, text.as_bytes())?;
            }
            index += 1;
        }
        write(out, &line)?;
    }
    if index != ops {
        return Err(CliError::Io(format!(
            "{name}: the trace changed while it was read ({ops} ops, then {index})"
        )));
    }
    Ok(())
}

/// One walk of `fix`: its fixer, the counts and report of what it wrote, and its output (none
/// for a walk that writes nothing).
struct Walked {
    fixer: streamsan::fix::Fixer,
    summary: streamsan::fix::FixSummary,
    after: streamsan::Report,
    out: Option<Output>,
}
