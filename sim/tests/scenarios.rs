//! The scenario suite: every `sim/scenarios/*.yaml` run against the real controller and
//! graded; the controller must meet every target. Also checks that every shipped
//! scenario file (the scale ones too) loads.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use warden_sim::{Report, RunOptions, Scenario, run, score};

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

#[test]
fn the_controller_meets_its_targets_on_the_suite() {
    let files = yaml_files(&suite_dir());
    let scenarios: Vec<Scenario> = files
        .iter()
        .map(|f| Scenario::load(f).expect("valid scenario"))
        .collect();
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
                    let rep = run(sc, RunOptions::default());
                    println!(
                        "{:<24} {:>5} ranks {:>7.1} sim s {:>6.2} wall s {:>3} faults {:>3} incidents",
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
    assert_eq!(reports.len(), scenarios.len());
    let expected_faults: usize = scenarios.iter().map(|s| s.faults.len()).sum();
    let took_effect: usize = reports.iter().map(|r| r.faults.len()).sum();
    assert_eq!(
        took_effect, expected_faults,
        "every injected fault took effect"
    );
    let card = score(&reports);
    println!("{card}");
    let failures = card.failures();
    assert!(
        failures.is_empty(),
        "{} unmet targets:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
