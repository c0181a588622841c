//! The `warden` binary end to end: `sim` reports, scenario errors and their exit code,
//! and a fast `demo` run with the API on a free port, which stays up after the run.

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
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
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
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("speed"), "{}", text(&out.stderr));
}

#[test]
fn demo_runs_the_built_in_scenario_to_completion() {
    let out = warden(&[
        "demo",
        "--speed",
        "1000",
        "--listen",
        "127.0.0.1:0",
        "--exit-when-done",
    ]);
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
    // Incidents the policy only notifies on say so, and never REMEDIATED.
    for kind in ["straggler", "slow_link", "nan"] {
        assert!(
            !stdout.contains(&format!("REMEDIATED {kind}")),
            "{kind} remediated:\n{stdout}"
        );
    }
    assert!(stdout.contains("NOTIFIED "), "{stdout}");
    // The job's checkpoints are written as they complete, and the restart resumes from
    // the latest one written before the job stopped, saying what was lost.
    // A save every 50 steps; node-20's GPU falls off the bus in step 240, so the
    // restart resumes from step 200 and loses the 40 steps since (39 or 40, by how the
    // ranks count the step they were in).
    for step in [50, 100, 150, 200] {
        assert!(
            stdout.contains(&format!("CHECKPOINT step {step} saved by every rank")),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("CHECKPOINT step 250"), "{stdout}");
    let restart = stdout
        .lines()
        .find(|l| l.contains("restart of job demo-llama requested from "))
        .expect("a restart line");
    assert!(
        restart.contains("step_200") && restart.contains("(step 200, dcp)"),
        "{restart}"
    );
    let lost: u64 = restart
        .split("; ")
        .find_map(|part| part.strip_suffix(" steps of work lost"))
        .and_then(|n| n.trim().parse().ok())
        .expect("the steps lost");
    assert!((39..=40).contains(&lost), "{restart}");
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

/// `GET path` on `addr` over plain HTTP/1.1: the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(addr).expect("connects to the demo's API");
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("answer");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn the_demo_serves_its_api_after_the_run_until_ctrl_c() {
    use std::io::BufRead as _;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let mut demo = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["demo", "--speed", "1000", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts the demo");
    let stdout = demo.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Read until the demo says the run is over and where its API stays up.
    let deadline = Instant::now() + warden_testkit::scaled(Duration::from_secs(180));
    let mut seen = Vec::new();
    let base = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = demo.kill();
            panic!(
                "the demo did not say its API stays up:\n{}",
                seen.join("\n")
            );
        };
        if let Some(rest) = line.split("the controller API stays up on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .expect("an address")
                .to_owned();
        }
        seen.push(line);
    };
    assert!(
        seen.iter().any(|l| l.starts_with("Summary: 256 ranks")),
        "the run's summary comes first:\n{}",
        seen.join("\n")
    );
    let addr = base.trim_start_matches("http://").to_owned();

    // After the run, the README's curls and the CLI still answer.
    let (status, body) = http_get(&addr, "/api/v1/incidents");
    assert_eq!(status, 200, "{body}");
    let incidents: serde_json::Value = serde_json::from_str(&body).expect("JSON incidents");
    let kinds: Vec<&str> = incidents
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|i| i["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"gpu_fault"), "{kinds:?}");
    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("warden_incidents_total"), "{body}");
    let out = warden(&["incidents", "list", "--server", &base]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("gpu_fault"),
        "{}",
        text(&out.stdout)
    );

    // It is still up a moment later, and Ctrl-C (SIGINT) ends it with status 0.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        demo.try_wait().expect("status").is_none(),
        "the demo exited"
    );
    let sent = Command::new("kill")
        .args(["-INT", &demo.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    let deadline = Instant::now() + warden_testkit::scaled(Duration::from_secs(30));
    let status = loop {
        if let Some(s) = demo.try_wait().expect("status") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = demo.kill();
            panic!("the demo did not stop on SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    reader.join().expect("reader");
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "the API is gone"
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

#[test]
fn completions_cover_every_command_and_the_bash_script_parses() {
    let out = warden(&["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    for word in ["incidents", "drain", "diagnose", "--output", "yaml", "wide"] {
        assert!(
            script.contains(word),
            "{word} missing from the bash completions"
        );
    }
    let path = scratch("warden.bash");
    std::fs::write(&path, &script).expect("write the script");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("runs bash");
    assert!(check.status.success(), "{}", text(&check.stderr));
    for shell in ["zsh", "fish"] {
        let out = warden(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(text(&out.stdout).contains("incidents"), "{shell}");
    }
    let out = warden(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
