//! Helpers for tests that run the `warden-agent` binary: a controller stand-in that
//! decodes batches with the controller's own decoder, the agent process, and scraping
//! its `/metrics`. Every wait here polls for the state asked for, under
//! [`warden_testkit::PATIENCE`].
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use warden_model::wire::Batch;
use warden_testkit::{PATIENCE, poll, scaled, wait_for};

pub use warden_testkit::ports::free_port;

/// The agent process; killed when dropped.
pub struct AgentProc {
    pub child: Child,
    pub port: u16,
}

impl AgentProc {
    /// The agent process `child`, once it serves `/metrics` on `port`. Fails at once
    /// when the process exits first, and after [`PATIENCE`] when it never answers.
    #[track_caller]
    pub fn ready(child: Child, port: u16) -> AgentProc {
        let mut agent = AgentProc { child, port };
        let exited = wait_for(
            "the agent to serve /metrics (see its log above)",
            PATIENCE,
            || {
                if http_get(port, "/metrics").is_some() {
                    return Some(None);
                }
                agent.child.try_wait().ok().flatten().map(Some)
            },
        );
        if let Some(status) = exited {
            panic!("the agent exited ({status}) before it served /metrics (see its log above)");
        }
        agent
    }

    /// Start the agent with `config` and wait until it serves `/metrics` on `port`.
    pub fn start(config: &Path, port: u16) -> AgentProc {
        // WARDEN_AGENT_BIN runs another build of the agent (to compare two builds).
        let bin = std::env::var_os("WARDEN_AGENT_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_warden-agent").into());
        let child = Command::new(bin)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the agent");
        AgentProc::ready(child, port)
    }

    /// Start the agent with `config` logging at `rust_log`, its stdout and stderr read
    /// by a thread that returns everything once the agent is gone.
    pub fn start_captured(
        config: &Path,
        port: u16,
        rust_log: &str,
    ) -> (AgentProc, std::thread::JoinHandle<String>) {
        use std::io::Read;
        let mut child = Command::new(env!("CARGO_BIN_EXE_warden-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the agent");
        let mut out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let reader = std::thread::spawn(move || {
            let stdout = std::thread::spawn(move || {
                let mut text = String::new();
                let _ = out.read_to_string(&mut text);
                text
            });
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text + &stdout.join().unwrap_or_default()
        });
        let agent = AgentProc::ready(child, port);
        (agent, reader)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// The `/metrics` text, or `None` when the agent does not answer.
    pub fn scrape(&self) -> Option<String> {
        http_get(self.port, "/metrics")
    }

    /// The `/metrics` text, waiting up to [`PATIENCE`] for an answer (a busy agent may
    /// miss one).
    #[track_caller]
    pub fn metrics(&self) -> String {
        wait_for("an answer from the agent's /metrics", PATIENCE, || {
            self.scrape()
        })
    }

    /// The first `/metrics` text for which `pred` holds, waiting up to [`PATIENCE`];
    /// panics naming `what`, with the last text scraped.
    #[track_caller]
    pub fn wait_metrics(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let mut last = None;
        let found = poll(PATIENCE, || {
            let m = self.scrape()?;
            if pred(&m) {
                return Some(m);
            }
            last = Some(m);
            None
        });
        match found {
            Some(m) => m,
            None => panic!(
                "timed out after {:?} waiting for {what}; the last /metrics:\n{}",
                scaled(PATIENCE),
                last.as_deref().unwrap_or("(no answer)")
            ),
        }
    }

    /// The first `/metrics` text in which the series `name` (labels included, as
    /// exported) has a value for which `pred` holds, waiting up to [`PATIENCE`].
    #[track_caller]
    pub fn wait_metric(&self, name: &str, pred: impl Fn(f64) -> bool) -> String {
        self.wait_metrics(&format!("{name} to reach the value asked for"), |m| {
            metric(m, name).is_some_and(&pred)
        })
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Body of `GET path` on 127.0.0.1:`port`.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    // Generous: a loaded machine may take seconds to answer; a connection refused
    // still ends at once.
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

/// The value of the series `name` (with its labels, exactly as exported).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Resident set size of `pid`, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A `/proc/<pid>/status` field in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A controller stand-in on 127.0.0.1:`port` that keeps every batch it can decode.
pub struct Sink {
    pub got: Arc<Mutex<Vec<Batch>>>,
    pub bytes: Arc<Mutex<u64>>,
}

impl Sink {
    pub fn start(port: u16) -> Sink {
        let got: Arc<Mutex<Vec<Batch>>> = Arc::default();
        let bytes: Arc<Mutex<u64>> = Arc::default();
        let (sink, counted) = (got.clone(), bytes.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("controller port");
        let app = Router::new().route(
            "/api/v1/ingest",
            post(move |body: Bytes| {
                let (sink, counted) = (sink.clone(), counted.clone());
                async move {
                    *counted.lock().expect("lock") += body.len() as u64;
                    match Batch::decode_binary(&body) {
                        Ok(b) => {
                            sink.lock().expect("lock").push(b);
                            axum::http::StatusCode::OK
                        }
                        Err(_) => axum::http::StatusCode::BAD_REQUEST,
                    }
                }
            }),
        );
        std::thread::spawn(move || {
            rt.block_on(async move {
                let _ = axum::serve(listener, app).await;
            });
        });
        Sink { got, bytes }
    }

    /// The batches received, once `pred` holds over them: the very list `pred` saw,
    /// so that what is asserted afterwards is the state that was waited for. Waits up
    /// to [`PATIENCE`]; panics naming `what`, with what did arrive.
    #[track_caller]
    pub fn wait_for(&self, what: &str, pred: impl Fn(&[Batch]) -> bool) -> Vec<Batch> {
        let found = poll(PATIENCE, || {
            let got = self.got.lock().expect("lock");
            pred(&got).then(|| got.clone())
        });
        match found {
            Some(batches) => batches,
            None => {
                let got = self.got.lock().expect("lock");
                panic!(
                    "timed out after {:?} waiting for {what}: {} batches arrived, with {} \
                     events, {} GPU samples and {} job signals",
                    scaled(PATIENCE),
                    got.len(),
                    got.iter().map(|b| b.events.len()).sum::<usize>(),
                    got.iter().map(|b| b.gpus.len()).sum::<usize>(),
                    got.iter().map(|b| b.jobs.len()).sum::<usize>(),
                )
            }
        }
    }
}

/// Write the config of an agent named `name` under `dir/name` (an empty kernel log, a
/// boot id, a capture socket, no NVML) shipping to `url` every 100 ms, with `extra`
/// lines added to its `controller:` section. Returns the config file and the agent's
/// port.
pub fn agent_config(dir: &Path, name: &str, url: &str, extra: &str) -> (PathBuf, u16) {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).expect("agent dir");
    std::fs::write(d.join("kern.log"), "").expect("kernel log");
    std::fs::write(d.join("boot_id"), format!("boot-{name}\n")).expect("boot id");
    let port = free_port();
    let cfg = d.join("agent.yaml");
    std::fs::write(
        &cfg,
        format!(
            "node_name: {name}\nlisten: 127.0.0.1:{port}\n\
             controller:\n  url: {url}\n  flush_interval_ms: 100\n{extra}\
             nvml:\n  enabled: false\n\
             kmsg:\n  path: {}\n  boot_id_path: {}\n\
             capture:\n  socket: {}\n",
            d.join("kern.log").display(),
            d.join("boot_id").display(),
            d.join("capture.sock").display(),
        ),
    )
    .expect("agent config");
    (cfg, port)
}
