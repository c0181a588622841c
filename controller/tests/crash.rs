//! The `warden-controller` binary killed with SIGKILL at several points of an incident's
//! life, and started again on the same SQLite store: no incident is lost or split in
//! two, and no action is lost or repeated. The points: after an incident opened; between
//! "acknowledge intended" and done; between "drain intended" and the node being drained;
//! between the node being drained and the action recorded as done. A failpoint
//! (`WARDEN_FAILPOINT`) parks the controller at the exact point; the test then kills it.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{free_port, http_get};
use warden_model::wire::{Batch, EventSeverity, Heartbeat, NodeEvent, NodeEventKind};

/// A running controller and the lines of its stderr.
struct Ctl {
    child: Child,
    port: u16,
    stderr: mpsc::Receiver<String>,
}

impl Ctl {
    fn start(data: &Path, failpoint: Option<&str>) -> Ctl {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden-controller"));
        cmd.args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(data)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(f) = failpoint {
            cmd.env("WARDEN_FAILPOINT", f);
        }
        let mut child = cmd.spawn().expect("warden-controller starts");
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("  controller: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_get(port, "/healthz").is_none_or(|(s, _)| s != 200) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("warden-controller exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "warden-controller never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ctl {
            child,
            port,
            stderr: rx,
        }
    }

    /// SIGKILL, and wait for it to be gone.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// Wait until stderr says the failpoint was reached.
    fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("{needle:?} never appeared"),
            }
        }
    }

    fn get(&self, path: &str) -> Value {
        let (status, body) = http_get(self.port, path).expect("answers");
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).expect("json")
    }

    /// Send a request and do not wait for the answer (it may never come).
    fn send(&self, method: &str, path: &str, ct: &str, body: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ct}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .expect("write");
        s.write_all(body).expect("write body");
        s
    }

    /// Send a request and return (status, body).
    fn call(&self, method: &str, path: &str, ct: &str, body: &[u8]) -> (u16, String) {
        let mut s = self.send(method, path, ct, body);
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status");
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        (status, body)
    }

    fn ingest_xid(&self, seq: u64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as i64;
        let batch = Batch {
            version: 0,
            node: "node-3".into(),
            agent_id: "agent-3".into(),
            boot_id: "boot-1".into(),
            seq,
            sent_at_ns: now,
            jobs: vec![],
            gpus: vec![],
            events: vec![NodeEvent {
                id: seq,
                at_ns: now,
                kind: NodeEventKind::Xid as i32,
                severity: EventSeverity::Fatal as i32,
                gpu_index: Some(3),
                pci_bus_id: "0000:3b:00".into(),
                code: Some(79),
                message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
                count: 1,
            }],
            heartbeat: Some(Heartbeat::default()),
        };
        let (status, body) = self.call(
            "POST",
            "/api/v1/ingest",
            "application/vnd.warden.batch",
            &batch.encode_binary(),
        );
        assert_eq!(status, 200, "{body}");
    }

    fn incidents(&self) -> Vec<Value> {
        self.get("/api/v1/incidents")
            .as_array()
            .expect("array")
            .clone()
    }

    fn actions(&self) -> Vec<Value> {
        self.get("/api/v1/actions")
            .as_array()
            .expect("array")
            .clone()
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn count(actions: &[Value], kind: &str, target: &str) -> Vec<Value> {
    actions
        .iter()
        .filter(|a| a["kind"] == kind && a["target"] == target)
        .cloned()
        .collect()
}

#[test]
fn sigkill_at_every_step_loses_nothing_and_repeats_nothing() {
    let data = tempfile::tempdir().expect("temp dir");

    // 1. An incident opens; the controller dies right after.
    let c = Ctl::start(data.path(), None);
    c.ingest_xid(1);
    wait_until("the GPU fault incident", || c.incidents().len() == 1);
    let id = c.incidents()[0]["id"].as_str().expect("id").to_owned();
    c.kill();

    // 2. It is still there after the restart, and the same fault groups into it.
    let c = Ctl::start(data.path(), Some("ack-intended"));
    let found = c.incidents();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["id"], id.as_str());
    c.ingest_xid(2);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        c.incidents().len(),
        1,
        "the same fault after a restart is no new incident"
    );

    // 3. Killed between "acknowledge intended" and done.
    let _pending = c.send(
        "POST",
        &format!("/api/v1/incidents/{id}/ack"),
        "application/json",
        br#"{"note":"looking"}"#,
    );
    c.wait_for("failpoint ack-intended reached");
    c.kill();

    // 4. The restart finishes the acknowledgement; then it dies between "drain
    //    intended" and the drain itself.
    let c = Ctl::start(data.path(), Some("drain-intended"));
    let inc = c.get(&format!("/api/v1/incidents/{id}"));
    assert_eq!(inc["acknowledged"], true, "{inc}");
    let acks = count(&c.actions(), "acknowledge", &id);
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0]["status"], "done");
    let _pending = c.send(
        "POST",
        "/api/v1/nodes/node-3/drain",
        "application/json",
        br#"{"reason":"XID 79"}"#,
    );
    c.wait_for("failpoint drain-intended reached");
    c.kill();

    // 5. The restart finishes that drain; then a second drain dies after the node was
    //    drained but before the action was recorded as done.
    let c = Ctl::start(data.path(), Some("drain-applied"));
    let nodes = c.get("/api/v1/nodes");
    let n3 = nodes
        .as_array()
        .expect("array")
        .iter()
        .find(|n| n["name"] == "node-3")
        .expect("node-3 listed")
        .clone();
    assert_eq!(n3["state"], "drained", "{n3}");
    assert_eq!(n3["owner"], "local", "{n3}");
    let _pending = c.send(
        "POST",
        "/api/v1/nodes/node-4/drain",
        "application/json",
        br#"{"reason":"suspect NVLink"}"#,
    );
    c.wait_for("failpoint drain-applied reached");
    c.kill();

    // 6. A clean restart: every action exactly once, all done; one incident.
    let c = Ctl::start(data.path(), None);
    let actions = c.actions();
    for (kind, target) in [
        ("acknowledge", id.as_str()),
        ("drain", "node-3"),
        ("drain", "node-4"),
    ] {
        let found = count(&actions, kind, target);
        assert_eq!(found.len(), 1, "{kind} {target}: {actions:?}");
        assert_eq!(found[0]["status"], "done", "{found:?}");
    }
    assert_eq!(actions.len(), 3, "{actions:?}");
    let drained: Vec<_> = c
        .get("/api/v1/nodes")
        .as_array()
        .expect("array")
        .iter()
        .filter(|n| n["state"] == "drained")
        .map(|n| n["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(drained, ["node-3", "node-4"]);
    // Draining again is refused, not repeated.
    let (status, body) = c.call(
        "POST",
        "/api/v1/nodes/node-3/drain",
        "application/json",
        br#"{"reason":"again"}"#,
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(c.actions().len(), 3);
    // The incident's timeline kept every step across four restarts.
    let inc = c.get(&format!("/api/v1/incidents/{id}"));
    let timeline: Vec<_> = inc["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|e| e["what"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(timeline[0].starts_with("opened"), "{timeline:?}");
    assert!(
        timeline
            .iter()
            .filter(|w| w.starts_with("acknowledged by local"))
            .count()
            == 1,
        "{timeline:?}"
    );
    assert_eq!(c.incidents().len(), 1);
    // Resolving by hand ends it, once.
    let (status, body) = c.call(
        "POST",
        &format!("/api/v1/incidents/{id}/resolve"),
        "application/json",
        br#"{"reason":"GPU replaced"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.call(
        "POST",
        &format!("/api/v1/incidents/{id}/resolve"),
        "application/json",
        br#"{"reason":"again"}"#,
    );
    assert_eq!(status, 409, "{body}");
    c.kill();
    let c = Ctl::start(data.path(), None);
    let inc = c.get(&format!("/api/v1/incidents/{id}"));
    assert_eq!(inc["state"], "resolved", "{inc}");
    c.kill();
}
