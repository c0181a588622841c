//! A `warden-controller` process for tests that kill and restart it: its stderr lines
//! on a channel (to wait for a failpoint) and everything it printed kept for reading,
//! plain HTTP calls (with a bearer token or without) that may never be answered, and
//! the batches and reads those tests need.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use warden_model::wire::{Batch, EventSeverity, Heartbeat, JobSignals, NodeEvent, NodeEventKind};
use warden_testkit::{PATIENCE, poll, wait_for, wait_until};

use super::{free_port, http_get};

/// A running controller and the lines of its stderr.
pub struct Ctl {
    child: Child,
    /// Its port.
    pub port: u16,
    stderr: mpsc::Receiver<String>,
    /// Every line it wrote to stdout or stderr so far.
    printed: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    /// The bearer token [`Ctl::get`], [`Ctl::call`] and the ingest helpers send.
    token: Option<String>,
}

impl Ctl {
    /// Start it with `store` (e.g. `["--data-dir", DIR]`) and an optional failpoint,
    /// and wait until it answers.
    pub fn start(store: &[&std::ffi::OsStr], failpoint: Option<&str>) -> Ctl {
        Ctl::start_env(store, failpoint, &[])
    }

    /// [`Ctl::start`] with extra environment variables.
    pub fn start_env(
        store: &[&std::ffi::OsStr],
        failpoint: Option<&str>,
        env: &[(&str, &str)],
    ) -> Ctl {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden-controller"));
        cmd.args(["--listen", &format!("127.0.0.1:{port}")])
            .args(store)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(f) = failpoint {
            cmd.env("WARDEN_FAILPOINT", f);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("warden-controller starts");
        let err = child.stderr.take().expect("stderr");
        let out = child.stdout.take().expect("stdout");
        let printed = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let kept = printed.clone();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("  controller: {line}");
                kept.lock().expect("lock").push(line.clone());
                // Nobody waiting for a line is no reason to stop keeping them.
                let _ = tx.send(line);
            }
        });
        let kept = printed.clone();
        let stdout_reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("  controller (stdout): {line}");
                kept.lock().expect("lock").push(line);
            }
        });
        let mut c = Ctl {
            child,
            port,
            stderr: rx,
            printed,
            readers: vec![stderr_reader, stdout_reader],
            token: None,
        };
        // Built first, so that a controller that never answers is killed on the way out.
        wait_until("warden-controller to answer /healthz", PATIENCE, || {
            if let Ok(Some(status)) = c.child.try_wait() {
                panic!("warden-controller exited early: {status}");
            }
            http_get(c.port, "/healthz").is_some_and(|(s, _)| s == 200)
        });
        c
    }

    /// Send `token` as a bearer token with every call from now on.
    pub fn with_token(mut self, token: &str) -> Ctl {
        self.token = Some(token.to_owned());
        self
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// Everything it printed so far, stdout and stderr, one line each.
    pub fn printed(&self) -> String {
        self.printed.lock().expect("lock").join("\n")
    }

    /// SIGKILL it and return everything it printed, to the last line.
    pub fn kill_and_read(mut self) -> String {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
        for r in std::mem::take(&mut self.readers) {
            r.join().expect("reader thread");
        }
        self.printed()
    }

    /// Wait until a line of stderr not read yet holds `needle` (e.g. a failpoint
    /// reached); the lines before it are read and dropped.
    pub fn wait_for(&self, needle: &str) {
        let seen = poll(PATIENCE, || {
            loop {
                match self.stderr.try_recv() {
                    Ok(line) if line.contains(needle) => return Some(()),
                    Ok(_) => {}
                    Err(mpsc::TryRecvError::Empty) => return None,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        panic!("the controller closed stderr before {needle:?} appeared")
                    }
                }
            }
        });
        assert!(
            seen.is_some(),
            "{needle:?} never appeared on the controller's stderr (its output is above)"
        );
    }

    /// `GET path`, expecting 200 and JSON.
    pub fn get(&self, path: &str) -> Value {
        let (status, body) = match &self.token {
            None => http_get(self.port, path).expect("answers"),
            Some(_) => self.call("GET", path, "application/json", b""),
        };
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).expect("json")
    }

    /// Send a request and do not wait for the answer (it may never come).
    pub fn send(&self, method: &str, path: &str, ct: &str, body: &[u8]) -> TcpStream {
        let auth = self
            .token
            .as_deref()
            .map(|t| format!("Authorization: Bearer {t}\r\n"));
        self.send_raw(method, path, ct, auth.as_deref().unwrap_or(""), body)
    }

    /// Send a request with `headers` (each line ending in CRLF) and no token of ours.
    pub fn send_raw(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        headers: &str,
        body: &[u8],
    ) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ct}\r\n\
             {headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .expect("write");
        s.write_all(body).expect("write body");
        s
    }

    /// Send a request and return (status, body).
    pub fn call(&self, method: &str, path: &str, ct: &str, body: &[u8]) -> (u16, String) {
        Ctl::answer(self.send(method, path, ct, body))
    }

    /// Send a request with `headers` (each ending in CRLF) and return (status, body).
    pub fn call_raw(&self, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, String) {
        Ctl::answer(self.send_raw(method, path, "application/json", headers, body))
    }

    /// Read the whole answer on `s`: (status, body).
    fn answer(mut s: TcpStream) -> (u16, String) {
        s.set_read_timeout(Some(warden_testkit::scaled(PATIENCE)))
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

    /// Post a heartbeat from `node` (so the controller knows the node).
    pub fn ingest_heartbeat(&self, node: &str, seq: u64) {
        self.ingest(&batch(node, seq, vec![]));
    }

    /// Post a batch from `node` with a fatal XID 79 on GPU 3.
    pub fn ingest_xid(&self, node: &str, seq: u64) {
        self.ingest(&xid_batch(node, seq));
    }

    /// Post a batch from `node` holding `events`, `jobs` and a heartbeat; expect 200.
    pub fn ingest_jobs(&self, node: &str, seq: u64, events: Vec<NodeEvent>, jobs: Vec<JobSignals>) {
        self.ingest(&batch_jobs(node, seq, events, jobs));
    }

    /// Post an encoded batch as an agent does: sent again while the answer is 503 (the
    /// batch was applied but is not stored yet, or a follower knows no leader yet) until
    /// it is 200; any other answer fails the test.
    pub fn ingest(&self, batch: &[u8]) {
        let mut last = String::new();
        let stored = poll(PATIENCE, || {
            let (status, body) = self.call(
                "POST",
                "/api/v1/ingest",
                "application/vnd.warden.batch",
                batch,
            );
            match status {
                200 => Some(()),
                503 => {
                    last = body;
                    None
                }
                _ => panic!("ingest answered {status}: {body}"),
            }
        });
        assert!(stored.is_some(), "the batch was never stored: {last}");
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// The stderr lines not yet read.
    pub fn lines(&self) -> Vec<String> {
        self.stderr.try_iter().collect()
    }

    /// `GET /api/v1/incidents`.
    pub fn incidents(&self) -> Vec<Value> {
        self.get("/api/v1/incidents")
            .as_array()
            .expect("array")
            .clone()
    }

    /// `GET /api/v1/actions`.
    pub fn actions(&self) -> Vec<Value> {
        self.get("/api/v1/actions")
            .as_array()
            .expect("array")
            .clone()
    }

    /// Wait until the action of `kind` on `target` has finished, and return it. An
    /// action is listed as soon as it is recorded as intended, before it runs; its
    /// result and finish time come after ([`finished`]).
    pub fn finished_action(&self, kind: &str, target: &str) -> Value {
        wait_for(
            &format!("the {kind} of {target} finished"),
            PATIENCE,
            || {
                self.actions()
                    .into_iter()
                    .find(|a| a["kind"] == kind && a["target"] == target && finished(a))
            },
        )
    }

    /// `warden_detector_ticks_total`: detector passes begun so far (0 on a controller
    /// that does not lead).
    pub fn ticks(&self) -> u64 {
        let (status, text) = http_get(self.port, "/metrics").expect("the controller answers");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| {
                l.strip_prefix("warden_detector_ticks_total ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Wait until a whole round of the detector loop (detector pass, store write,
    /// remediation pass) and the store write after it have run since this call: the
    /// barrier before a check that something did not happen.
    pub fn wait_for_a_full_pass(&self) {
        let seen = self.ticks();
        wait_until("a whole detector round after now", PATIENCE, || {
            self.ticks() >= seen + 3
        });
    }
}

/// An encoded batch from `node` with a fatal XID 79 on GPU 3 and a heartbeat.
pub fn xid_batch(node: &str, seq: u64) -> Vec<u8> {
    let event = NodeEvent {
        id: seq,
        at_ns: now_ns(),
        kind: NodeEventKind::Xid as i32,
        severity: EventSeverity::Fatal as i32,
        gpu_index: Some(3),
        pci_bus_id: "0000:3b:00".into(),
        code: Some(79),
        message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
        count: 1,
    };
    batch(node, seq, vec![event])
}

/// An encoded batch from `node` holding `events` and a heartbeat.
pub fn batch(node: &str, seq: u64, events: Vec<NodeEvent>) -> Vec<u8> {
    batch_jobs(node, seq, events, vec![])
}

/// An encoded batch from `node` holding `events`, `jobs` and a heartbeat.
pub fn batch_jobs(node: &str, seq: u64, events: Vec<NodeEvent>, jobs: Vec<JobSignals>) -> Vec<u8> {
    Batch {
        version: 0,
        node: node.into(),
        agent_id: format!("agent-{node}"),
        boot_id: "boot-1".into(),
        seq,
        sent_at_ns: now_ns(),
        jobs,
        gpus: vec![],
        events,
        heartbeat: Some(Heartbeat::default()),
    }
    .encode_binary()
}

/// Post an encoded batch to the controller on `port` as an agent does, giving up after
/// `timeout`: the status, or `None` when no answer came (refused, reset, cut off).
pub fn post_batch(port: u16, batch: &[u8], timeout: Duration) -> Option<u16> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/vnd.warden.batch\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        batch.len()
    )
    .ok()?;
    s.write_all(batch).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

impl Drop for Ctl {
    fn drop(&mut self) {
        // A failed test must not leave its controller running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Nanoseconds since the epoch, now.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64
}

/// Whether action `a` (an entry of `GET /api/v1/actions`) has finished: out of the
/// `intended` state, with its result and finish time.
pub fn finished(a: &Value) -> bool {
    a["status"] != "intended" && a["result"].is_string() && !a["finished_at"].is_null()
}

/// The actions people took (not remediation's, which records even its dry runs).
pub fn by_people(actions: &[Value]) -> Vec<Value> {
    actions
        .iter()
        .filter(|a| a["actor"] != "warden-policy")
        .cloned()
        .collect()
}

/// The actions of `kind` on `target`.
pub fn count(actions: &[Value], kind: &str, target: &str) -> Vec<Value> {
    actions
        .iter()
        .filter(|a| a["kind"] == kind && a["target"] == target)
        .cloned()
        .collect()
}
