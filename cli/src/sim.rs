//! `warden sim`: run a scenario file to its end as fast as possible, print what the
//! controller found and optionally write the run's report.

use std::process::ExitCode;

use anyhow::Context;
use warden_config::outln;
use warden_sim::{RunOptions, Scenario};

use crate::{EXIT_CONFIG, SimArgs, show};

/// Run `warden sim`.
pub fn main(args: &SimArgs) -> anyhow::Result<ExitCode> {
    let scenario = match Scenario::load(&args.scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warden sim: invalid scenario: {e}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    if !args.quiet {
        outln!(
            "Simulating {:?}: {} ranks on {} nodes, {} steps ...",
            scenario.name,
            scenario.ranks(),
            scenario.job.nodes,
            scenario.steps
        );
    }
    let report = warden_sim::run(&scenario, RunOptions::default());
    if !args.quiet {
        outln!(
            "{} ranks, {:.1} virtual s in {:.2} wall s ({:.0}x real time), {} batches, {} collective events",
            report.ranks,
            report.sim_seconds,
            report.wall_seconds,
            report.speedup(),
            report.batches,
            report.collective_events
        );
        outln!("Injected faults: {}", report.faults.len());
        for f in &report.faults {
            outln!(
                "  {:<10} at {:>7.1}s  {}",
                f.kind,
                f.onset_s,
                show::fault_target(f)
            );
        }
        outln!("Incidents: {}", report.incidents.len());
        for i in &report.incidents {
            outln!(
                "  {:<10} detected {:>7.1}s  {} — {}",
                i.kind.as_str(),
                i.detected_s,
                show::culprit(i),
                i.summary
            );
        }
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
        if !args.quiet {
            outln!("Report written to {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
