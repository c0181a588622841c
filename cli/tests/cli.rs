//! The `warden` binary end to end: `sim` reports, scenario errors and their exit code,
//! and a fast `demo` run with the API on a free port.

use std::path::PathBuf;
use std::process::{Command, Output};

fn warden(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .output()
        .expect("runs warden")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warden-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

const TINY: &str = "\
seed: 1
job:
  name: tiny
  nodes: 2
  gpus_per_node: 4
  parallelism: { tp: 4, pp: 1, dp: 2 }
  iteration_secs: 0.5
steps: 40
faults:
  - { step: 10, kind: xid, node: node-01, gpu: 2, code: 79 }
";

#[test]
fn sim_writes_a_report_with_the_contract_fields() {
    let scenario = scratch("tiny.yaml");
    std::fs::write(&scenario, TINY).expect("write scenario");
    let report = scratch("tiny-report.json");
    let out = warden(&[
        "sim",
        "--scenario",
        scenario.to_str().expect("utf8 path"),
        "--report",
        report.to_str().expect("utf8 path"),
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("8 ranks"),
        "{}",
        text(&out.stdout)
    );

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("report written")).expect("JSON");
    assert_eq!(json["scenario"], "tiny");
    assert_eq!(json["ranks"], 8);
    assert!(
        json["sim_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{json}"
    );
    assert!(
        json["wall_seconds"].as_f64().is_some_and(|s| s >= 0.0),
        "{json}"
    );
    assert!(json["incidents"].is_array(), "{json}");
    let faults = json["faults"].as_array().expect("faults array");
    assert_eq!(faults.len(), 1, "{json}");
    assert_eq!(faults[0]["kind"], "xid");
    assert_eq!(faults[0]["node"], "node-01");

    let quiet = warden(&[
        "sim",
        "--scenario",
        scenario.to_str().expect("utf8"),
        "--quiet",
    ]);
    assert!(quiet.status.success());
    assert!(
        quiet.stdout.is_empty(),
        "--quiet printed {}",
        text(&quiet.stdout)
    );
}

#[test]
fn broken_scenario_exits_64_naming_the_field() {
    let scenario = scratch("broken.yaml");
    std::fs::write(
        &scenario,
        "job:\n  nodes: 0\n  gpus_per_node: 8\nsteps: 10\n",
    )
    .expect("write scenario");
    let out = warden(&["sim", "--scenario", scenario.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("job.nodes"),
        "{}",
        text(&out.stderr)
    );

    let unknown = scratch("unknown-field.yaml");
    std::fs::write(&unknown, "job: { nodes: 1 }\nsteps: 10\nspeed: 3\n").expect("write");
    let out = warden(&[
        "demo",
        "--no-api",
        "--scenario",
        unknown.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("speed"), "{}", text(&out.stderr));
}

#[test]
fn demo_runs_the_built_in_scenario_to_completion() {
    let out = warden(&["demo", "--speed", "1000", "--listen", "127.0.0.1:0"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("The controller API is served on http://127.0.0.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("Summary: 256 ranks"), "{stdout}");
    assert!(stdout.contains("Incidents ("), "{stdout}");
    // Remediation under the shipped policy: the fatal XID's node is drained in
    // Warden's node table and a restart requested; XID 63 (a row remap pending, a
    // warning in rules/xid.yaml) is reported and touches nothing.
    assert!(stdout.contains("REMEDIATED gpu_fault"), "{stdout}");
    // The demo's capture path times each peer's sends (nccl_proxy): the slow link is
    // found, on its node.
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("OPENED slow_link") && l.ends_with("node node-11")),
        "{stdout}"
    );
    assert!(
        stdout.contains("drain node-20: done"),
        "node-20 not drained:\n{stdout}"
    );
    assert!(
        !stdout.contains("drain node-09"),
        "node-09 drained for a warning:\n{stdout}"
    );
    let actions = stdout
        .split_once("Actions (")
        .map(|(_, rest)| rest)
        .expect("an actions summary");
    let isolations = actions.lines().filter(|l| l.contains(" isolate ")).count();
    assert_eq!(isolations, 1, "{actions}");
    assert!(actions.contains(" restart "), "{actions}");
    // The node-health ledger: node-20 quarantined, checked once the job stopped, and
    // back (its GPU recovers after a reset), in that order; node-09 only suspect.
    let node20: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("] NODE node-20 "))
        .collect();
    let moves: Vec<&str> = node20
        .iter()
        .filter_map(|l| l.split_once("] NODE node-20 ")?.1.split_once(':'))
        .map(|(m, _)| m)
        .collect();
    assert_eq!(
        moves,
        [
            "healthy -> quarantined",
            "quarantined -> verifying",
            "verifying -> returned"
        ],
        "{stdout}"
    );
    assert!(
        stdout.contains("] NODE node-09 healthy -> suspect: XID 63"),
        "{stdout}"
    );
    assert!(
        actions.lines().any(|l| l.contains(" verify ")
            && l.contains("node-20")
            && l.contains("passed: every GPU answers after a reset; given back")),
        "{actions}"
    );
    // Not a terminal: one progress line per tenth of the run at most, plus the last.
    // The demo is paced by the wall clock, so a stalled machine may run all of it in
    // one advance and print a single line; the last line is always the run's end.
    let progress = stderr.lines().filter(|l| l.starts_with("step ")).count();
    assert!((1..=12).contains(&progress), "{stderr}");
    let reached = stdout
        .split_once("Summary: 256 ranks, ")
        .and_then(|(_, rest)| rest.split_once(" of "))
        .map(|(step, _)| step)
        .expect("the summary names the step reached");
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("step "))
        .expect("a progress line");
    assert!(
        last.starts_with(&format!("step {reached}/")),
        "the last progress line is the run's end (step {reached}):\n{stderr}"
    );
}

#[test]
fn demo_on_a_taken_port_explains_and_exits_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = warden(&["demo", "--speed", "1000", "--listen", &addr]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--listen") && stderr.contains("--no-api"),
        "{stderr}"
    );
}

#[test]
fn version_names_the_wire_version() {
    let out = warden(&["version"]);
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("wire version 1"),
        "{}",
        text(&out.stdout)
    );
}
