//! Measures simulation speed: `cargo run --release -p warden-sim --example speed [FILE]`
//! runs a scenario file (default: a 1,024-rank job with mild noise) against a real
//! engine and prints virtual seconds per wall second; a second argument names a file to
//! write the JSON report to.

use std::path::Path;
use std::process::ExitCode;

use warden_sim::{RunOptions, Scenario, run};

const DEFAULT: &str = "
seed: 1
job: {name: speed, nodes: 128, gpus_per_node: 8, parallelism: {tp: 8, pp: 2, dp: 64}, iteration_secs: 1.0}
noise: {checkpoint_every_steps: 100, checkpoint_secs: 20}
steps: 300
";

fn main() -> ExitCode {
    let scenario = match std::env::args().nth(1) {
        Some(path) => Scenario::load(Path::new(&path)),
        None => Scenario::from_yaml(DEFAULT, "speed-1024"),
    };
    let scenario = match scenario {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(64);
        }
    };
    let report = run(&scenario, RunOptions::default());
    println!(
        "{}: {} ranks, {:.1} virtual s in {:.2} wall s = {:.0}x real time; {} batches, {} collective records ({:.0}/wall s); {} incidents",
        report.scenario,
        report.ranks,
        report.sim_seconds,
        report.wall_seconds,
        report.speedup(),
        report.batches,
        report.collective_events,
        report.collective_events as f64 / report.wall_seconds.max(1e-9),
        report.incidents.len()
    );
    if let Some(out) = std::env::args().nth(2) {
        let json = match serde_json::to_vec_pretty(&report) {
            Ok(j) => j,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(&out, json) {
            eprintln!("error: {out}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
