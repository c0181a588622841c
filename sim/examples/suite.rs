//! Runs the scenario suite in release and prints the scorecard with timings:
//! `cargo run --release -p warden-sim --example suite [DIR] [THREADS] [--capture=PATH]`.
//! `--capture=nccl|torch` runs every scenario under that capture path instead of its own.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use warden_sim::{Capture, Report, RunOptions, Scenario, run, score};

fn main() -> ExitCode {
    let mut capture = None;
    let mut args = vec![];
    for a in std::env::args().skip(1) {
        match a.strip_prefix("--capture=") {
            Some(c) => match Capture::ALL.into_iter().find(|x| x.label() == c) {
                Some(x) => capture = Some(x),
                None => {
                    eprintln!("error: --capture={c}: not a capture path (nccl, torch)");
                    return ExitCode::from(64);
                }
            },
            None => args.push(a),
        }
    }
    let dir = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios"));
    let threads: usize = args.get(1).and_then(|t| t.parse().ok()).unwrap_or(2);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect(),
        Err(e) => {
            eprintln!("error: {}: {e}", dir.display());
            return ExitCode::from(66);
        }
    };
    files.sort();
    let mut scenarios = vec![];
    for f in &files {
        match Scenario::load(f) {
            Ok(mut s) => {
                if let Some(c) = capture {
                    s.capture = c;
                }
                scenarios.push(s)
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(64);
            }
        }
    }
    let wall = Instant::now();
    let next = Mutex::new(0usize);
    let reports = Mutex::new(Vec::<Report>::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                        *n += 1;
                        *n - 1
                    };
                    let Some(sc) = scenarios.get(i) else { break };
                    let rep = run(sc, RunOptions::default());
                    println!(
                        "{:<24} {:>6} ranks {:>7.1} sim s {:>6.2} wall s {:>6.0}x {:>2} faults {:>2} incidents",
                        rep.scenario,
                        rep.ranks,
                        rep.sim_seconds,
                        rep.wall_seconds,
                        rep.speedup(),
                        rep.faults.len(),
                        rep.incidents.len()
                    );
                    reports.lock().unwrap_or_else(|p| p.into_inner()).push(rep);
                }
            });
        }
    });
    let reports = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    let card = score(&reports);
    println!("{card}");
    println!(
        "suite: {} scenarios in {:.1} wall s on {threads} threads",
        reports.len(),
        wall.elapsed().as_secs_f64()
    );
    for c in &card.classes {
        for l in c.latencies.iter().filter(|l| l.ratio > 1.0) {
            println!(
                "over budget: {} in {}: {:.2} s, {:.2} steps (target {})",
                c.class, l.scenario, l.secs, l.steps, c.budget
            );
        }
    }
    let failures = card.failures();
    for f in &failures {
        println!("FAIL {f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
