use super::*;

pub(crate) fn bench(
    p: Pipeline,
    (waits, syncs): (u32, bool),
    write_trace: Option<&PathBuf>,
    json: bool,
) -> Result<u8, CliError> {
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
            .map_err(|e| CliError::Io(format!("cannot write the trace: {e}")))?;
        return Ok(0);
    }
    // The workload is generated in batches, and only the checking of each batch is timed:
    // memory stays the same for any number of ops.
    const BATCH: usize = 4096;
    let mut checker = CheckRun::new(syncs, true);
    let mut batch = Vec::with_capacity(BATCH);
    let mut elapsed = std::time::Duration::ZERO;
    let (mut hazards, mut peak_history, mut count) = (0usize, 0usize, 0u64);
    let mut failed = None;
    let mut run = |batch: &mut Vec<streamsan::trace::TraceOp>| {
        let start = Instant::now();
        for op in batch.iter() {
            match checker.check(op) {
                Ok(h) => hazards += h.len(),
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
        return Err(CliError::Run(e));
    }
    let stats = checker.checker().stats();
    // The analysis's verdicts are made at the end, timed too.
    let start = Instant::now();
    // With the analysis: the number of synchronization ops, how many were needed (those left
    // to a re-check counted as redundant), and the analysis's counters.
    let analysis = checker.end().analysis().map(|o| {
        let needed = o.syncs.iter().filter(|s| s.needed).count();
        (o.syncs.len(), needed, o.stats)
    });
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
pub(crate) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `bench --shape`: checks one hardening shape op by op (the trace is never held in memory) and
/// prints the time, the peak RSS, the checker's counters at their peak (sampled; see below) and
/// the JSON report's size.
pub(crate) fn bench_shape(
    name: &str,
    size: Option<u64>,
    write_trace: Option<&PathBuf>,
    json: bool,
) -> Result<u8, CliError> {
    let Some(shape) = Shape::from_name(name) else {
        let names: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        return Err(CliError::Usage(format!(
            "unknown shape {name:?}; expected one of {}",
            names.join(", ")
        )));
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
            .map_err(|e| CliError::Io(format!("cannot write the trace: {e}")))?;
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
        return Err(CliError::Run(e));
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
