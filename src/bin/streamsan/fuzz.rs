use super::*;

pub(crate) fn fuzz(args: FuzzArgs) -> Result<u8, CliError> {
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
        graphs,
        keep_unconfirmed,
        fix,
        json,
    } = args;
    use streamsan::fuzz::campaign::{run_campaign, CampaignConfig, Executor, SimExecutor};
    use streamsan::fuzz::gen::GenConfig;
    if !(0.0..=1.0).contains(&missing_sync) {
        return Err(CliError::Usage(format!(
            "--missing-sync {missing_sync}: expected a probability from 0 to 1"
        )));
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
            graphs,
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
    })
    .map_err(CliError::Run)?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let s = &res.summary;
    if json {
        outln!(
            "{}",
            serde_json::to_string(s).map_err(|e| CliError::Run(e.to_string()))?
        );
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
        let g = &res.in_graphs;
        if g.hazards > 0 {
            outln!(
                "  in graphs    {:6} reported, {:6} confirmed ({:.1}%)",
                g.hazards,
                g.confirmed,
                pct(g.confirmed, g.hazards)
            );
        }
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

pub(crate) fn fuzz_fix(
    cfg: &streamsan::fuzz::campaign::CampaignConfig,
    exec: &mut dyn streamsan::fuzz::campaign::Executor,
    bar: &indicatif::ProgressBar,
    start: Instant,
    json: bool,
) -> Result<u8, CliError> {
    let res = streamsan::fuzz::fixes::run_fix_campaign(cfg, exec, |n, s| {
        bar.set_position(n);
        bar.set_message(format!(
            "{} hazards, {} fixed, {} inserted ops",
            s.hazards, s.fixed, s.inserted
        ));
    })
    .map_err(CliError::Run)?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if json {
        outln!(
            "{}",
            serde_json::to_string(&res).map_err(|e| CliError::Run(e.to_string()))?
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
