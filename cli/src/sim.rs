//! `warden sim`: run a scenario file (or a fleet file, `fleet.rs`) to its end as fast
//! as possible, print what the controller found and optionally write the run's report.

use std::process::ExitCode;

use anyhow::Context;
use warden_config::outln;
use warden_sim::{RunOptions, Scenario};

use crate::{EXIT_USAGE, SimArgs, fleet::FleetSpec, show};

/// Run `warden sim`.
pub fn main(args: &SimArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.fleet {
        return fleet(args, path);
    }
    let Some(path) = &args.scenario else {
        eprintln!("warden sim: give --scenario FILE or --fleet FILE");
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    let scenario = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warden sim: invalid scenario: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
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

/// `warden sim --fleet FILE`: the fleet run, its node states and score.
fn fleet(args: &SimArgs, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let spec = match FleetSpec::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warden sim: invalid fleet: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if !args.quiet {
        outln!(
            "Simulating a fleet of {} nodes x {} GPUs for {} days, {} job(s), {} bad GPU(s) ...",
            spec.fleet.nodes,
            spec.fleet.gpus_per_node,
            spec.fleet.days,
            spec.jobs.len(),
            spec.bad_gpus.len()
        );
    }
    let started = std::time::Instant::now();
    let report = crate::fleet::run(&spec);
    if !args.quiet {
        outln!(
            "{} placements, {} injected faults, {} incidents in {:.1} wall s",
            report.placements.len(),
            report.faults.len(),
            report.incidents.len(),
            started.elapsed().as_secs_f64()
        );
        let mut by_state = std::collections::BTreeMap::<&str, u32>::new();
        for n in &report.nodes {
            *by_state.entry(n.state.as_str()).or_default() += 1;
        }
        let states: Vec<String> = by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
        outln!("Nodes: {}", states.join(", "));
        for n in report.nodes.iter().filter(|n| n.state != "healthy") {
            outln!(
                "  {:<10} {:<12} since {:>7.1} h, {} incident(s)",
                n.node,
                n.state,
                n.since_h,
                n.incidents
            );
        }
        for b in &report.score.bad_gpus {
            outln!(
                "Bad GPU {} on {}: {} incident(s), quarantined {}: {}",
                b.gpu,
                b.node,
                b.incidents,
                b.quarantined_h
                    .map_or_else(|| "never".to_owned(), |h| format!("at {h:.1} h")),
                if b.ok { "ok" } else { "MISSED" }
            );
        }
        outln!(
            "Score: {}",
            if report.score.passed {
                "passed"
            } else {
                "FAILED"
            }
        );
    }
    if let Some(out) = &args.report {
        let json = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(out, json)
            .with_context(|| format!("writing the report to {}", out.display()))?;
        if !args.quiet {
            outln!("Report written to {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
