//! The scenario suite: every `sim/scenarios/*.yaml` run against the real controller and
//! graded; the controller must meet every target. Also checks that every shipped
//! scenario file (the scale ones too) loads.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use warden_sim::{Capture, Report, RunOptions, Scenario, run, score};

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("scenario directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

#[test]
fn every_shipped_scenario_loads() {
    let mut files = yaml_files(&suite_dir());
    files.extend(yaml_files(&suite_dir().join("scale")));
    assert!(files.len() >= 30, "{} scenario files", files.len());
    let mut errors = vec![];
    for f in &files {
        if let Err(e) = Scenario::load(f) {
            errors.push(e.to_string());
        }
    }
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Run `scenarios` on two threads, in order of the list, and return their reports.
fn run_all(scenarios: &[Scenario]) -> Vec<Report> {
    let next = Mutex::new(0usize);
    let reports = Mutex::new(Vec::<Report>::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(sc) = scenarios.get(i) else { break };
                    let mut rep = run(sc, RunOptions::default());
                    rep.scenario = format!("{} [{}]", rep.scenario, sc.capture.label());
                    println!(
                        "{:<32} {:>5} ranks {:>7.1} sim s {:>6.2} wall s {:>3} faults {:>3} incidents",
                        rep.scenario,
                        rep.ranks,
                        rep.sim_seconds,
                        rep.wall_seconds,
                        rep.faults.len(),
                        rep.incidents.len()
                    );
                    reports.lock().unwrap_or_else(|p| p.into_inner()).push(rep);
                }
            });
        }
    });
    let mut reports = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    reports.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    reports
}

/// The suite under every capture path: each scenario that names no path runs once per
/// path, each that names one runs under it alone.
#[test]
fn the_controller_meets_its_targets_on_the_suite_under_each_capture_path() {
    let files = yaml_files(&suite_dir());
    let mut scenarios: Vec<Scenario> = vec![];
    for f in &files {
        let sc = Scenario::load(f).expect("valid scenario");
        if sc.capture_named {
            scenarios.push(sc);
            continue;
        }
        for c in Capture::ALL {
            let mut s = sc.clone();
            s.capture = c;
            scenarios.push(s);
        }
    }
    let reports = run_all(&scenarios);
    assert_eq!(reports.len(), scenarios.len());
    let expected_faults: usize = scenarios.iter().map(|s| s.faults.len()).sum();
    let took_effect: usize = reports.iter().map(|r| r.faults.len()).sum();
    assert_eq!(
        took_effect, expected_faults,
        "every injected fault took effect"
    );
    for c in Capture::ALL {
        let tag = format!("[{}]", c.label());
        let mine: Vec<Report> = reports
            .iter()
            .filter(|r| r.scenario.ends_with(&tag))
            .cloned()
            .collect();
        let card = score(&mine);
        println!("capture {}:\n{card}", c.label());
        let failures = card.failures();
        assert!(
            failures.is_empty(),
            "capture {}: {} unmet targets:\n{}",
            c.label(),
            failures.len(),
            failures.join("\n")
        );
    }
}

/// Nodes of one and two GPUs under heavy noise, over 20 seeds and every capture path:
/// no straggler, nor anything else, in jobs without faults.
#[test]
fn small_nodes_under_heavy_noise_raise_nothing_over_twenty_seeds() {
    let mut scenarios = vec![];
    for file in ["clean-heavy-gpn1.yaml", "clean-heavy-gpn2.yaml"] {
        let base = Scenario::load(&suite_dir().join(file)).expect("valid scenario");
        for seed in 0..20u64 {
            for c in Capture::ALL {
                let mut s = base.clone();
                s.seed = 10_000 + seed;
                s.steps = 250;
                s.capture = c;
                s.name = format!("{}-seed{}", base.name, s.seed);
                scenarios.push(s);
            }
        }
    }
    let reports = run_all(&scenarios);
    let noisy: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.incidents
                .iter()
                .map(move |i| format!("{}: {} {:?} {}", r.scenario, i.kind, i.nodes, i.summary))
        })
        .collect();
    assert!(
        noisy.is_empty(),
        "{} incidents:\n{}",
        noisy.len(),
        noisy.join("\n")
    );
}
