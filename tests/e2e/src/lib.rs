//! The full loop on real parts, for `tests/full_loop.rs` and `scripts/e2e`: a
//! PostgreSQL-backed `warden-controller` acting through the Slurm actuator, one
//! `warden-agent` per node of a real four-node Slurm cluster (`gpu-node01`..`04`, all
//! on this host), Prometheus scraping the controller, Alertmanager sending the
//! controller's alerts to a webhook receiver in the test, and a torchrun gloo job
//! launched through Slurm that trains with `warden_torch`, checkpoints in Megatron-LM's
//! layout and resumes from its latest checkpoint when Slurm starts it again.
//!
//! Every part is a real process started in a temp dir on free ports and stopped when the
//! [`FullLoop`] is dropped; the database is a fresh one on the PostgreSQL server
//! (`WARDEN_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`),
//! dropped afterwards. [`Tools::find`] says what is missing; under `CI=true` a missing
//! part is a failure.

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

#[allow(missing_debug_implementations, dead_code)]
#[path = "../../../controller/tests/support/slurm.rs"]
pub mod slurm;

use slurm::{Options, SlurmCluster};

/// The four nodes.
pub const NODES: [&str; 4] = ["gpu-node01", "gpu-node02", "gpu-node03", "gpu-node04"];
/// Nodes the job runs on (one is left for the restart).
pub const JOB_NODES: usize = 3;
/// Rendezvous ports set aside per job, one for each run (restart) of it.
const RUN_PORTS: u16 = 8;
/// Ranks per node (`torchrun --nproc-per-node`).
pub const RANKS_PER_NODE: u32 = 2;

/// Whether this is CI, where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Seconds since the Unix epoch.
pub fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub use warden_testkit::ports::free_port;

/// The repository root.
pub fn repo() -> PathBuf {
    slurm::repo()
}

/// `(status, body)` of an HTTP/1.0 request to 127.0.0.1:`port`.
pub fn http(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(scaled(PATIENCE))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The JSON body of `GET path`, when the answer is 200 and JSON.
pub fn get_json(port: u16, path: &str) -> Option<Value> {
    match http(port, "GET", path)? {
        (200, body) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// The workspace's one way of waiting: poll for the exact state an assertion needs,
/// under a deadline scaled by `WARDEN_TEST_PATIENCE`.
pub use warden_testkit::{PATIENCE, poll, scaled};

/// The programs the loop runs.
#[derive(Debug, Clone)]
pub struct Tools {
    /// `warden-controller` of this build.
    pub controller: PathBuf,
    /// `warden-agent` of this build.
    pub agent: PathBuf,
    /// Python with torch (`$WARDEN_VENV/bin/python`, default `~/.cache/warden/venv`).
    pub python: PathBuf,
    /// Prometheus (`PROMETHEUS`, else `prometheus`).
    pub prometheus: PathBuf,
    /// Alertmanager (`ALERTMANAGER`, else `prometheus-alertmanager`).
    pub alertmanager: PathBuf,
}

fn runs(bin: &Path, arg: &str) -> bool {
    Command::new(bin)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Tools {
    /// Everything the loop needs, or `None` after saying what is missing. Under
    /// `CI=true` a missing part panics instead (`scripts/test` installs them all).
    pub fn find() -> Option<Tools> {
        let mut missing = SlurmCluster::missing();
        // target/<profile>/deps/full_loop-<hash> → target/<profile>/warden-*.
        let profile_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent()?.parent().map(Path::to_owned))
            .unwrap_or_default();
        let controller = profile_dir.join("warden-controller");
        let agent = profile_dir.join("warden-agent");
        for bin in [&controller, &agent] {
            if !bin.exists() {
                missing.push(format!(
                    "{} (cargo build -p warden-controller -p warden-agent, same profile)",
                    bin.display()
                ));
            }
        }
        let venv = std::env::var_os("WARDEN_VENV")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/warden/venv")))
            .unwrap_or_default();
        let python = venv.join("bin/python");
        let torch = Command::new(&python)
            .args([
                "-c",
                "import torch.distributed as d; assert d.is_gloo_available()",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !torch {
            missing.push(format!("torch in {}", python.display()));
        }
        let pick = |var: &str, names: &[&str]| -> Option<PathBuf> {
            let candidates: Vec<PathBuf> = match std::env::var_os(var) {
                Some(v) => vec![v.into()],
                None => names.iter().map(PathBuf::from).collect(),
            };
            candidates.into_iter().find(|b| runs(b, "--version"))
        };
        let prometheus = pick("PROMETHEUS", &["prometheus"]);
        let alertmanager = pick(
            "ALERTMANAGER",
            &[
                "prometheus-alertmanager",
                "/usr/bin/prometheus-alertmanager",
                "alertmanager",
            ],
        );
        if prometheus.is_none() {
            missing.push("prometheus (Debian package prometheus)".into());
        }
        if alertmanager.is_none() {
            missing.push("Alertmanager (Debian package prometheus-alertmanager)".into());
        }
        if !runs(Path::new("psql"), "--version") {
            missing.push("psql (Debian package postgresql-client)".into());
        }
        if missing.is_empty() {
            return Some(Tools {
                controller,
                agent,
                python,
                prometheus: prometheus?,
                alertmanager: alertmanager?,
            });
        }
        let msg = format!(
            "the full loop cannot run here: missing {} (scripts/test installs them)",
            missing.join("; ")
        );
        assert!(!in_ci(), "{msg}");
        eprintln!("NOT CHECKED: {msg}");
        None
    }
}

/// A child process with its output in a log file; killed when dropped.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Start `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("log {}: {e}", log.display()));
        let err = file.try_clone().expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        }
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// Panic with its log if it has exited.
    pub fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, self.tail(40));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A webhook receiver: keeps the JSON body of every POST and answers 200.
#[derive(Debug)]
pub struct Webhook {
    /// Its port.
    pub port: u16,
    got: Arc<Mutex<Vec<Value>>>,
}

impl Webhook {
    /// Listen on a free loopback port.
    pub fn start() -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").expect("webhook port");
        let port = listener.local_addr().expect("address").port();
        let got: Arc<Mutex<Vec<Value>>> = Arc::default();
        let sink = got.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let sink = sink.clone();
                std::thread::spawn(move || serve_hook(conn, &sink));
            }
        });
        Webhook { port, got }
    }

    /// Every notification received so far.
    pub fn received(&self) -> Vec<Value> {
        self.got.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// `(status, alert)` of every alert in every notification that names `incident`.
    pub fn about(&self, incident: &str) -> Vec<(String, Value)> {
        self.received()
            .iter()
            .flat_map(|n| n["alerts"].as_array().cloned().unwrap_or_default())
            .filter(|a| a["labels"]["incident"].as_str() == Some(incident))
            .map(|a| (a["status"].as_str().unwrap_or("").to_owned(), a))
            .collect()
    }
}

/// Serve one keep-alive connection of Alertmanager's.
fn serve_hook(conn: TcpStream, sink: &Mutex<Vec<Value>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(conn);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if l.is_empty() && !first {
                break;
            }
            first = false;
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length.min(16 << 20)];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&body)
            && let Ok(mut g) = sink.lock()
        {
            g.push(v);
        }
        if out
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// A fresh database on the test PostgreSQL server, dropped afterwards; read with `psql`.
#[derive(Debug)]
pub struct Database {
    name: String,
    admin: String,
    /// Its URL.
    pub url: String,
}

fn psql(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-F",
            "\t",
            url,
            "-c",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Database {
    /// Create an empty database.
    pub fn create() -> Database {
        let admin = std::env::var("WARDEN_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let name = format!("warden_e2e_{}_{}", std::process::id(), now_s() as u64);
        psql(&admin, &format!("DROP DATABASE IF EXISTS {name}"))
            .and_then(|_| psql(&admin, &format!("CREATE DATABASE {name}")))
            .unwrap_or_else(|e| {
                panic!(
                    "cannot create a database on the test PostgreSQL at {admin} (start it; \
                     scripts/test does): {e}"
                )
            });
        let (server, _) = admin.rsplit_once('/').expect("the URL names a database");
        Database {
            url: format!("{server}/{name}"),
            name,
            admin,
        }
    }

    /// Rows of `sql`, each a list of its columns' text (`NULL` as empty).
    pub fn rows(&self, sql: &str) -> Vec<Vec<String>> {
        psql(&self.url, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .lines()
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if psql(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        )
        .is_err()
        {
            eprintln!("note: could not drop the test database {}", self.name);
        }
    }
}

/// One agent: its process, port and files.
#[derive(Debug)]
pub struct Agent {
    /// Its node.
    pub node: String,
    /// Its port (metrics, log window).
    pub port: u16,
    /// The kernel-log file it follows (XIDs are injected here).
    pub kern_log: PathBuf,
    proc: Proc,
}

/// A job submitted to the loop's Slurm.
#[derive(Debug, Clone)]
pub struct Job {
    /// Slurm's job id (also Warden's job id).
    pub id: u32,
    /// Its run directory: `rank<N>.pid`, `rank<N>.node`, `steps.log`.
    pub run: PathBuf,
}

/// Everything, started.
pub struct FullLoop {
    /// The Slurm cluster.
    pub slurm: SlurmCluster,
    /// The store.
    pub db: Database,
    /// The webhook Alertmanager sends to.
    pub webhook: Webhook,
    /// The agents, one per node.
    pub agents: Vec<Agent>,
    /// The controller's port.
    pub port: u16,
    /// Prometheus's port.
    pub prometheus_port: u16,
    controller: Proc,
    prometheus: Proc,
    alertmanager: Proc,
    tools: Tools,
    dir: PathBuf,
    /// Removes `dir` when dropped; `None` when `WARDEN_E2E_KEEP` asks to keep it.
    tmp: Option<tempfile::TempDir>,
}

impl Drop for FullLoop {
    fn drop(&mut self) {
        // A failed scenario leaves its logs, checkpoints and configs for a person.
        if std::thread::panicking()
            && let Some(t) = self.tmp.take()
        {
            eprintln!("the failed scenario's files stay in {}", t.keep().display());
        }
    }
}

impl std::fmt::Debug for FullLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FullLoop")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

fn write(path: &Path, text: &str) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    }
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn wait_ready(proc: &mut Proc, port: u16, path: &str) {
    let ok = poll(PATIENCE, || {
        proc.check_alive();
        http(port, "GET", path)
            .filter(|(s, _)| *s == 200)
            .map(|_| ())
    });
    assert!(
        ok.is_some(),
        "{} never answered {path}:\n{}",
        proc.name,
        proc.tail(40)
    );
}

impl FullLoop {
    /// Start every part, from nothing.
    pub fn start(tools: &Tools) -> FullLoop {
        let dir = tempfile::Builder::new()
            .prefix("warden-e2e-")
            .tempdir()
            .expect("temp dir");
        let (d, tmp) = if std::env::var_os("WARDEN_E2E_KEEP").is_some() {
            let kept = dir.keep();
            eprintln!("WARDEN_E2E_KEEP: everything stays in {}", kept.display());
            (kept, None)
        } else {
            (dir.path().to_owned(), Some(dir))
        };
        let d = d.as_path();
        let webhook = Webhook::start();

        // Alertmanager: one group per incident, sent at once, resolutions too.
        let am_port = free_port();
        let am_cfg = d.join("alertmanager.yml");
        write(
            &am_cfg,
            &format!(
                "route:\n  receiver: hook\n  group_by: [incident]\n  group_wait: 1s\n  \
                 group_interval: 1s\n  repeat_interval: 1h\n\
                 receivers:\n  - name: hook\n    webhook_configs:\n      - url: \
                 http://127.0.0.1:{}/alerts\n        send_resolved: true\n",
                webhook.port
            ),
        );
        let mut cmd = Command::new(&tools.alertmanager);
        cmd.arg(format!("--config.file={}", am_cfg.display()))
            .arg(format!("--storage.path={}", d.join("am-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            .arg("--cluster.listen-address=");
        let mut alertmanager = Proc::spawn("alertmanager", cmd, &d.join("alertmanager.log"));
        wait_ready(&mut alertmanager, am_port, "/-/ready");

        let db = Database::create();

        // Slurm first (its conf goes in the controller's config), with the job hook
        // pointing at the controller's port.
        let port = free_port();
        let slurm = SlurmCluster::start(&Options {
            nodes: NODES.len(),
            names: NODES.iter().map(|n| (*n).to_owned()).collect(),
            job_hook: Some(format!("http://127.0.0.1:{port}")),
            // A requeued job may start again this long after it was requeued.
            cred_expire_secs: Some(5),
        });

        // Agents' ports and files, known before the controller starts.
        let agent_ports: Vec<u16> = NODES.iter().map(|_| free_port()).collect();
        let mut agent_urls = String::new();
        for (n, p) in NODES.iter().zip(&agent_ports) {
            let _ = writeln!(agent_urls, "    {n}: http://127.0.0.1:{p}");
        }
        let ctl_cfg = d.join("controller.yaml");
        write(
            &ctl_cfg,
            &format!(
                "tick_interval_ms: 250\n\
                 alerts:\n  alertmanager:\n    url: http://127.0.0.1:{am_port}\n    \
                 resend_interval_secs: 5\n\
                 remediation:\n  dry_run: false\n  actuator: slurm\n  slurm:\n    \
                 slurm_conf: {}\n  checkpoint_dir: {}/ckpt/{{job}}\n  diagnosis_wait: 20s\n\
                 diagnosis:\n  before_secs: 120\n  after_secs: 10\n  agent_urls:\n{agent_urls}",
                slurm.conf().display(),
                d.display()
            ),
        );
        let mut cmd = Command::new(&tools.controller);
        cmd.arg("--config")
            .arg(&ctl_cfg)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--database-url", &db.url])
            .env("RUST_LOG", "info");
        let mut controller = Proc::spawn("warden-controller", cmd, &d.join("controller.log"));
        wait_ready(&mut controller, port, "/readyz");

        let mut agents = Vec::new();
        for (node, agent_port) in NODES.iter().zip(agent_ports) {
            let a = d.join("agents").join(node);
            let kern_log = a.join("kern.log");
            write(&kern_log, "");
            write(&a.join("boot_id"), &format!("boot-{node}\n"));
            fs::create_dir_all(d.join("logs").join(node)).expect("log dir");
            let cfg = a.join("agent.yaml");
            write(
                &cfg,
                &format!(
                    "node_name: {node}\nlisten: 127.0.0.1:{agent_port}\n\
                     controller:\n  url: http://127.0.0.1:{port}\n  flush_interval_ms: 200\n\
                     nvml:\n  enabled: false\n\
                     kmsg:\n  path: {}\n  boot_id_path: {}\n\
                     capture:\n  socket: {}\n\
                     logs:\n  sources:\n    - paths: [\"{}/*.out\"]\n  rescan_interval_ms: 500\n",
                    kern_log.display(),
                    a.join("boot_id").display(),
                    a.join("capture.sock").display(),
                    d.join("logs").join(node).display(),
                ),
            );
            let mut cmd = Command::new(&tools.agent);
            cmd.arg("--config").arg(&cfg).env("RUST_LOG", "warn");
            let mut proc = Proc::spawn(&format!("warden-agent {node}"), cmd, &a.join("agent.log"));
            wait_ready(&mut proc, agent_port, "/metrics");
            agents.push(Agent {
                node: (*node).to_owned(),
                port: agent_port,
                kern_log,
                proc,
            });
        }

        // Prometheus scrapes the controller every second.
        let prometheus_port = free_port();
        let prom_cfg = d.join("prometheus.yml");
        write(
            &prom_cfg,
            &format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: warden-controller\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{port}']\n"
            ),
        );
        let mut cmd = Command::new(&tools.prometheus);
        cmd.arg(format!("--config.file={}", prom_cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                d.join("prom-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .arg("--log.level=warn");
        let mut prometheus = Proc::spawn("prometheus", cmd, &d.join("prometheus.log"));
        wait_ready(&mut prometheus, prometheus_port, "/-/ready");

        FullLoop {
            slurm,
            db,
            webhook,
            agents,
            port,
            prometheus_port,
            controller,
            prometheus,
            alertmanager,
            tools: tools.clone(),
            dir: d.to_owned(),
            tmp,
        }
    }

    /// Submit the training job on [`JOB_NODES`] nodes with `train_ddp.py` arguments
    /// `args` (steps, faults); it checkpoints every `ckpt_every` steps.
    pub fn submit(&self, ckpt_every: u32, args: &[&str]) -> Job {
        let d = self.dir.as_path();
        // One rendezvous port per run of the job: Slurm starts it again on a restart,
        // while the old run's store may still hold the last one.
        let port_base = warden_testkit::ports::port_block(RUN_PORTS);
        let per_node = d.join("node-task.sh");
        // One torchrun per node; its output goes where that node's agent tails it, in
        // Slurm's own file naming (`slurm-<job id>.out`, which names the job).
        write(
            &per_node,
            &format!(
                "#!/bin/bash\n\
                 # One torchrun per node of the job (srun runs it once per node).\n\
                 set -u\n\
                 node=\"$SLURMD_NODENAME\"\n\
                 run={runs}/$SLURM_JOB_ID\n\
                 mkdir -p \"$run\"\n\
                 export WARDEN_AGENT_SOCKET={agents}/$node/capture.sock\n\
                 export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 PYTHONPATH={pythonpath}\n\
                 port=$(( {port_base} + ${{SLURM_RESTART_COUNT:-0}} % {RUN_PORTS} ))\n\
                 exec {py} -m torch.distributed.run --nnodes=\"$SLURM_NNODES\" \
                 --node-rank=\"$SLURM_NODEID\" --nproc-per-node={RANKS_PER_NODE} \
                 --master-addr=127.0.0.1 --master-port=\"$port\" --monitor-interval=0.1 \
                 {script} --pid-dir \"$run\" --checkpoint-dir {ckpt}/$SLURM_JOB_ID \
                 --checkpoint-every {ckpt_every} \"$@\" \
                 >> {logs}/$node/slurm-$SLURM_JOB_ID.out 2>&1\n",
                runs = d.join("runs").display(),
                agents = d.join("agents").display(),
                pythonpath = repo().join("integrations/python").display(),
                py = self.tools.python.display(),
                script = repo()
                    .join("integrations/python/examples/train_ddp.py")
                    .display(),
                ckpt = d.join("ckpt").display(),
                logs = d.join("logs").display(),
            ),
        );
        let batch = d.join("train.sbatch");
        write(
            &batch,
            &format!(
                "#!/bin/bash\n\
                 # The training job: one task per node, killed whole if one fails.\n\
                 exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 {} \"$@\"\n",
                per_node.display()
            ),
        );
        for f in [&per_node, &batch] {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(f, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let nodes = format!("--nodes={JOB_NODES}");
        let mut sbatch: Vec<&str> = vec!["--job-name=train", nodes.as_str(), "--ntasks-per-node=1"];
        let script = batch.to_string_lossy().into_owned();
        sbatch.push(&script);
        sbatch.extend_from_slice(args);
        let id = self.slurm.sbatch(&sbatch);
        Job {
            id,
            run: d.join("runs").join(id.to_string()),
        }
    }

    /// The job's output on every node so far (the last `n` lines of each).
    pub fn job_logs(&self, job: &Job, n: usize) -> String {
        let mut out = String::new();
        for node in NODES {
            let p = self
                .dir
                .join("logs")
                .join(node)
                .join(format!("slurm-{}.out", job.id));
            if p.exists() {
                let _ = writeln!(out, "--- {node} ---\n{}", tail(&p, n));
            }
        }
        out
    }

    /// Everything that helps understand a failure.
    pub fn state(&self, job: Option<&Job>) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "incidents: {}\nactions: {}\nslurm nodes: {:?}",
            get_json(self.port, "/api/v1/incidents").unwrap_or_default(),
            get_json(self.port, "/api/v1/actions").unwrap_or_default(),
            self.slurm.node_states()
        );
        if let Some(j) = job {
            let _ = writeln!(out, "job {}: {:?}", j.id, self.slurm.job(j.id));
            out.push_str(&self.job_logs(j, 60));
        }
        let _ = writeln!(out, "--- controller ---\n{}", self.controller.tail(40));
        for a in &self.agents {
            let _ = writeln!(out, "--- agent {} ---\n{}", a.node, a.proc.tail(10));
        }
        let _ = writeln!(out, "--- alertmanager ---\n{}", self.alertmanager.tail(10));
        let _ = writeln!(out, "--- prometheus ---\n{}", self.prometheus.tail(10));
        out.push_str(&self.slurm.logs());
        out
    }

    /// (step, wall seconds) of every step rank 0 finished, restarts included.
    pub fn steps(&self, job: &Job) -> Vec<(u64, f64)> {
        fs::read_to_string(job.run.join("steps.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (s, t) = l.split_once(' ')?;
                Some((s.parse().ok()?, t.parse::<f64>().ok()? / 1e9))
            })
            .collect()
    }

    /// The last step rank 0 finished.
    pub fn last_step(&self, job: &Job) -> u64 {
        self.steps(job).last().map_or(0, |&(s, _)| s)
    }

    /// Wait until rank 0 finished `step`; panics with the state after `limit`.
    pub fn wait_step(&self, job: &Job, step: u64, limit: Duration) {
        if poll(limit, || (self.last_step(job) >= step).then_some(())).is_none() {
            panic!(
                "job {} did not reach step {step} in {:?}\n{}",
                job.id,
                scaled(limit),
                self.state(Some(job))
            );
        }
    }

    /// The global ranks on `node` and their pids, from the run directory.
    pub fn ranks_on(&self, job: &Job, node: &str) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for rank in 0..JOB_NODES as u32 * RANKS_PER_NODE {
            let on = fs::read_to_string(job.run.join(format!("rank{rank}.node")));
            let pid = fs::read_to_string(job.run.join(format!("rank{rank}.pid")));
            if let (Ok(on), Ok(pid)) = (on, pid)
                && on.trim() == node
                && let Ok(pid) = pid.trim().parse()
            {
                out.push((rank, pid));
            }
        }
        out
    }

    /// Send `sig` (`-STOP`, `-KILL`) to `pid`.
    pub fn signal(&self, pid: u32, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// Append a kernel-log line to `node`'s kernel log (the agent follows the file).
    pub fn inject_kernel_line(&self, node: &str, line: &str) {
        let agent = self
            .agents
            .iter()
            .find(|a| a.node == node)
            .expect("an agent for the node");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&agent.kern_log)
            .expect("kernel log");
        writeln!(f, "{line}").expect("append to the kernel log");
    }

    /// The controller's incidents of `job`, oldest first.
    pub fn incidents(&self, job: &Job) -> Vec<Value> {
        let mut v = get_json(self.port, &format!("/api/v1/incidents?job={}", job.id))
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        v.sort_by(|a, b| {
            let t = |x: &Value| x["detected_s"].as_f64().unwrap_or(0.0);
            t(a).total_cmp(&t(b))
        });
        v
    }

    /// One incident, whole.
    pub fn incident(&self, id: &str) -> Option<Value> {
        get_json(self.port, &format!("/api/v1/incidents/{id}"))
    }

    /// Every action the controller recorded.
    pub fn actions(&self) -> Vec<Value> {
        get_json(self.port, "/api/v1/actions")
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }

    /// The value of an instant PromQL query's first series, if it has one.
    pub fn prom_value(&self, query: &str) -> Option<f64> {
        let q: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let v = get_json(self.prometheus_port, &format!("/api/v1/query?query={q}"))?;
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
    }

    /// `scontrol show node NODE --oneliner`.
    pub fn node_line(&self, node: &str) -> String {
        let out = self
            .slurm
            .command("scontrol")
            .args(["show", "node", node, "--oneliner"])
            .output()
            .expect("scontrol runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A field of `scontrol show job ID --oneliner`.
    pub fn job_field(&self, job: &Job, key: &str) -> String {
        let out = self
            .slurm
            .command("scontrol")
            .args(["show", "job", &job.id.to_string(), "--oneliner"])
            .output()
            .expect("scontrol runs");
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        line.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{key}=")))
            .unwrap_or_default()
            .to_owned()
    }

    /// Check that the controller and agents are still running.
    pub fn check_alive(&mut self) {
        self.controller.check_alive();
        for a in &mut self.agents {
            a.proc.check_alive();
        }
    }
}
