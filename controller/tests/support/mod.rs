//! Helpers for the controller's process-level tests: the `warden-controller` binary on a
//! free port, a plain HTTP GET, and a real Slurm cluster ([`slurm`]).
#![allow(dead_code)]

pub mod ctl;
pub mod pg;
pub mod slurm;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use warden_testkit::{PATIENCE, wait_until};

pub use warden_testkit::ports::free_port;

/// `GET path` on `127.0.0.1:port`: (status, body), or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(warden_testkit::scaled(PATIENCE)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The `warden-controller` binary listening on a free loopback port, with its store in
/// a temp dir of its own; killed on drop.
pub struct Controller {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Its data dir.
    pub data: tempfile::TempDir,
}

impl Controller {
    /// Start it and wait until `/healthz` answers.
    pub fn start() -> Controller {
        Controller::start_with(&[])
    }

    /// Start it with `extra` arguments and wait until `/healthz` answers.
    pub fn start_with(extra: &[&std::ffi::OsStr]) -> Controller {
        let port = free_port();
        let data = tempfile::tempdir().expect("temp dir");
        let child = Command::new(env!("CARGO_BIN_EXE_warden-controller"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(data.path())
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("warden-controller starts");
        let mut c = Controller { child, port, data };
        // Built first, so that a controller that never answers is killed on the way out.
        wait_until("warden-controller to answer /healthz", PATIENCE, || {
            if let Ok(Some(status)) = c.child.try_wait() {
                panic!("warden-controller exited early: {status}");
            }
            http_get(c.port, "/healthz").is_some_and(|(s, _)| s == 200)
        });
        c
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `GET /api/v1/jobs`, parsed.
    pub fn jobs(&self) -> serde_json::Value {
        let (status, body) = http_get(self.port, "/api/v1/jobs").expect("the controller answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    }

    /// The entry of `GET /api/v1/jobs` for `job`, if listed.
    pub fn job(&self, job: &str) -> Option<serde_json::Value> {
        self.jobs()
            .as_array()?
            .iter()
            .find(|j| j["job"] == job)
            .cloned()
    }

    /// `GET /metrics`.
    pub fn metrics(&self) -> String {
        let (status, body) = http_get(self.port, "/metrics").expect("the controller answers");
        assert_eq!(status, 200);
        body
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A script actuator (docs/REMEDIATION.md, "Script actuator") in `dir` that runs
/// `before` (shell lines, may be empty), appends `fields` (shell words such as
/// `$WARDEN_ACTION $WARDEN_NODE`) as one line per request to `actuator.log`, and
/// succeeds. Returns the script and the log.
pub fn recording_actuator(dir: &Path, before: &str, fields: &str) -> (PathBuf, PathBuf) {
    let log = dir.join("actuator.log");
    let script = dir.join("actuator.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{before}echo \"{fields}\" >> {}\n",
            log.display()
        ),
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (script, log)
}

/// An open, critical XID 79 incident on gpu-07 GPU 4 of job `llama-70b`, naming `ranks`,
/// detected now: what the alert tests send.
pub fn gpu_fault_incident(id: &str, ranks: Vec<u32>) -> warden_model::Incident {
    use warden_engine::{Clock, SystemClock};
    use warden_model::{GpuRef, Incident, IncidentKind, IncidentState, Severity};
    let now = SystemClock.now();
    Incident {
        id: id.to_owned(),
        kind: IncidentKind::GpuFault,
        job: Some("llama-70b".into()),
        state: IncidentState::Open,
        acknowledged: false,
        severity: Severity::Critical,
        ranks,
        nodes: vec!["gpu-07".into()],
        gpus: vec![GpuRef {
            node: "gpu-07".into(),
            index: 4,
        }],
        onset: now.plus_secs(-2.0),
        detected_at: now,
        updated_at: now,
        resolved_at: None,
        confidence: 1.0,
        summary: "XID 79: gpu-07 GPU 4 fell off the bus".into(),
        evidence: vec![],
        finding_count: 1,
        timeline: vec![],
        diagnosis: None,
    }
}

/// A controller configuration with remediation on, acting through the script actuator
/// `script`, with rails wide enough for a hundred isolations, written into `dir`.
pub fn script_remediation_config(dir: &Path, script: &Path) -> PathBuf {
    let config = dir.join("controller.yaml");
    std::fs::write(
        &config,
        format!(
            "diagnosis:\n  enabled: false\n\
             remediation:\n  dry_run: false\n  actuator: script\n  script:\n    program: {}\n  \
             breaker:\n    max_nodes: 1000\n    max_percent: 100\n    window: 1h\n  \
             max_actions_per_hour: 1000\n  diagnosis_wait: 1s\n",
            script.display()
        ),
    )
    .expect("write config");
    config
}
