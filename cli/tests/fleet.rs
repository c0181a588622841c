//! `warden sim --fleet` on every fleet file in `sim/fleets/`: a week of jobs over 64 to
//! 512 nodes, through the engine, its node-health ledger and the shipped policy. Each
//! report is checked against the truth its file states, not only by the score the run
//! prints: every bad GPU quarantined by its third incident, no healthy node marked bad
//! or left out, no placement on a node the ledger held out, job-caused XIDs never
//! quarantining a node.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fleets() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/fleets");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sim/fleets/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn run(file: &Path) -> Value {
    let out = std::env::temp_dir().join(format!(
        "warden-fleet-{}-{}.json",
        std::process::id(),
        file.file_stem().and_then(|s| s.to_str()).unwrap_or("fleet")
    ));
    let status = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["sim", "--quiet", "--fleet"])
        .arg(file)
        .arg("--report")
        .arg(&out)
        .status()
        .expect("runs warden");
    assert!(status.success(), "{}: {status}", file.display());
    let text = std::fs::read_to_string(&out).expect("the report");
    let _ = std::fs::remove_file(&out);
    serde_json::from_str(&text).expect("a JSON report")
}

/// The file's bad GPUs, as (node index, gpu).
fn truth(file: &Path) -> BTreeSet<(u32, u64)> {
    let text = std::fs::read_to_string(file).expect("fleet file");
    file_truth::bad_gpus(&text)
}

/// Just enough of a fleet file to know its bad GPUs, read without the code under test
/// (the files write one bad GPU per line, as a flow mapping).
mod file_truth {
    use std::collections::BTreeSet;

    pub fn bad_gpus(text: &str) -> BTreeSet<(u32, u64)> {
        let mut bad_gpus = BTreeSet::new();
        let mut inside = false;
        for line in text.lines() {
            let t = line.trim();
            if !line.starts_with(' ') && !t.is_empty() {
                inside = t.starts_with("bad_gpus:");
                continue;
            }
            if !inside || !t.starts_with("- {") {
                continue;
            }
            let field = |k: &str| {
                t.split(&format!("{k}: "))
                    .nth(1)
                    .and_then(|r| r.split([',', '}']).next())
                    .map(str::trim)
                    .expect("field")
                    .to_owned()
            };
            let node: u32 = field("node")
                .trim_start_matches("node-")
                .parse()
                .expect("node index");
            let gpu: u64 = field("gpu").parse().expect("gpu");
            bad_gpus.insert((node, gpu));
        }
        bad_gpus
    }
}

fn index(node: &str) -> u32 {
    node.trim_start_matches("node-")
        .parse()
        .expect("node index")
}

#[test]
fn every_fleet_file_is_decided_as_its_truth_says() {
    let files = fleets();
    assert!(files.len() >= 10, "{} fleet files", files.len());
    // The runs are independent processes: all at once.
    let reports: Vec<Value> = std::thread::scope(|s| {
        let runs: Vec<_> = files.iter().map(|f| s.spawn(|| run(f))).collect();
        runs.into_iter()
            .map(|r| r.join().expect("a fleet run"))
            .collect()
    });
    let mut failures = Vec::new();
    for (file, report) in files.iter().zip(reports) {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let bad = truth(file);
        let bad_nodes: BTreeSet<u32> = bad.iter().map(|(n, _)| *n).collect();
        let nodes = report["nodes"].as_array().expect("nodes");
        assert!(
            (64..=512).contains(&nodes.len()),
            "{name}: {} nodes",
            nodes.len()
        );
        assert!(report["hours"].as_f64().expect("hours") >= 24.0 * 7.0 - 0.1);
        // Every bad GPU: quarantined by its third incident.
        for (node, gpu) in &bad {
            let mut detected: Vec<f64> = report["incidents"]
                .as_array()
                .expect("incidents")
                .iter()
                .filter(|i| {
                    i["gpus"].as_array().is_some_and(|g| {
                        g.iter().any(|g| {
                            g["node"].as_str().map(index) == Some(*node)
                                && g["index"].as_u64() == Some(*gpu)
                        })
                    })
                })
                .filter_map(|i| i["detected_s"].as_f64())
                .collect();
            detected.sort_by(f64::total_cmp);
            let row = report["score"]["bad_gpus"]
                .as_array()
                .expect("scored bad GPUs")
                .iter()
                .find(|b| {
                    b["node"].as_str().map(index) == Some(*node) && b["gpu"].as_u64() == Some(*gpu)
                })
                .cloned()
                .unwrap_or(Value::Null);
            if let Some(third) = detected.get(2) {
                match row["quarantined_h"].as_f64() {
                    // `quarantined_h` is rounded to a thousandth of an hour (3.6 s).
                    Some(q) if q * 3_600.0 <= third + 3.6 => {}
                    q => failures.push(format!(
                        "{name}: GPU {gpu} of node {node} had {} incidents, the third at {:.1} h, quarantined {q:?} h",
                        detected.len(),
                        third / 3_600.0
                    )),
                }
            }
        }
        // No healthy node bad, held out at the end, or ever quarantined.
        for n in nodes {
            let node = n["node"].as_str().expect("node");
            let state = n["state"].as_str().expect("state");
            if bad_nodes.contains(&index(node)) {
                continue;
            }
            if !matches!(state, "healthy" | "suspect") {
                failures.push(format!("{name}: healthy {node} ends {state}"));
            }
        }
        let score = &report["score"];
        for (field, what) in [
            ("healthy_marked_bad", "healthy nodes marked bad"),
            ("healthy_quarantined", "healthy nodes quarantined"),
            (
                "quarantined_by_app_noise",
                "nodes quarantined by job-caused XIDs",
            ),
        ] {
            if score[field].as_array().is_some_and(|a| !a.is_empty()) {
                failures.push(format!("{name}: {what}: {}", score[field]));
            }
        }
        if score["placements_on_held_out"].as_u64() != Some(0) {
            failures.push(format!(
                "{name}: {} placements on held-out nodes",
                score["placements_on_held_out"]
            ));
        }
        // Jobs ran: the week was not spent waiting.
        let placements = report["placements"].as_array().expect("placements");
        if placements.len() < 7 {
            failures.push(format!("{name}: only {} placements", placements.len()));
        }
        if score["passed"] != Value::Bool(true) {
            failures.push(format!("{name}: the run's own score failed: {score}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_bad_fleet_file_is_refused_naming_its_field() {
    let file = std::env::temp_dir().join(format!("warden-bad-fleet-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        "fleet: {nodes: 64, gpus_per_node: 8, days: 7}\njobs: [{name: a, nodes: 4, hours: 1}]\n\
         bad_gpus: [{node: node-99, gpu: 0, kind: sdc, mean_hours: 5}]\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["sim", "--fleet"])
        .arg(&file)
        .output()
        .expect("runs warden");
    let _ = std::fs::remove_file(&file);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad_gpus[0].node"), "{err}");
    assert!(err.contains("node-99"), "{err}");
}
