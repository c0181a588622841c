//! A real Slurm cluster for tests, in a temp dir: its own munged, one slurmctld and one
//! to four slurmd daemons on this host, all children of the test, stopped when the
//! [`SlurmCluster`] is dropped (a panicking test included). Nothing under /etc is read
//! or written: every client command gets `SLURM_CONF` (use [`SlurmCluster::command`]).
//!
//! Debian's slurm-wlm 22.05 is built with multiple-slurmd support, so the nodes are
//! separate `slurmd -N n<i>` daemons, each with its own port, spool dir and log, all
//! on this host (`NodeHostname` is the real hostname, `NodeAddr=127.0.0.1`). Each has
//! one CPU, so a job of `-N k` lands on k distinct daemons.
//!
//! Everything runs as root (`SlurmUser=root`): slurmd must be root to start jobs.
//! [`SlurmCluster::available`] says whether the daemons, the clients and root are
//! there; under `CI=true` a test must fail instead of skipping when they are not.
//!
//! slurmctld runs `PrologSlurmctld`/`EpilogSlurmctld` with only the job's `SLURM_*`
//! variables, none of its own environment, and the Warden hook reads its settings from
//! `/etc/warden/slurm-hook.env` unless `WARDEN_HOOK_CONFIG` says otherwise. So with
//! [`Options::job_hook`] the hooks are two-line wrappers in the temp dir that set
//! `WARDEN_HOOK_CONFIG` and exec the repository's `deploy/slurm/prolog.sh` and
//! `epilog.sh` unchanged; the config file sets the controller URL and `SLURM_CONF`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use warden_testkit::PATIENCE;

/// Programs the cluster needs, and the Debian package of each.
pub const PROGRAMS: &[(&str, &str)] = &[
    ("munged", "munge"),
    ("slurmctld", "slurmctld"),
    ("slurmd", "slurmd"),
    ("sbatch", "slurm-client"),
    ("squeue", "slurm-client"),
    ("sinfo", "slurm-client"),
    ("scontrol", "slurm-client"),
    ("scancel", "slurm-client"),
    ("curl", "curl"),
];

/// How to set the cluster up.
#[derive(Debug, Clone)]
pub struct Options {
    /// slurmd daemons, 1..=4 (`n1`..`n4` unless `names` says otherwise).
    pub nodes: usize,
    /// The nodes' names, one per daemon (empty: `n1`..`nN`).
    pub names: Vec<String>,
    /// Install the Warden job hook as PrologSlurmctld/EpilogSlurmctld, reporting to
    /// this controller URL.
    pub job_hook: Option<String>,
    /// Job credential lifetime, seconds (`AuthInfo=...,cred_expire=`); `None`: Slurm's
    /// 120. It is also how long a requeued job waits before it may start again.
    pub cred_expire_secs: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 4,
            names: Vec::new(),
            job_hook: None,
            cred_expire_secs: None,
        }
    }
}

/// A job as `squeue --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// `PENDING`, `RUNNING`, `COMPLETED`, `FAILED`, ...
    pub state: String,
    /// Compact node list (`n[1-2]`), empty while pending.
    pub nodes: String,
    /// Exit code of the batch script.
    pub exit_code: Option<i64>,
}

impl JobInfo {
    /// Whether the job is over, whatever the outcome.
    pub fn finished(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED"
        )
    }
}

struct Daemon {
    name: String,
    child: Child,
}

/// The running cluster.
pub struct SlurmCluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    nodes: Vec<String>,
    /// slurmds, slurmctld, munged: stopped in that order.
    daemons: Vec<Daemon>,
}

use warden_testkit::ports::free_port;

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            fs::metadata(d.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

fn write_mode(path: &Path, text: &[u8], mode: u32) {
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn mkdir(path: &Path, mode: u32) -> PathBuf {
    fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    path.to_owned()
}

/// The repository root: the nearest directory above the crate holding `deploy/slurm`
/// (this file is shared by crates at different depths).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("deploy/slurm/prolog.sh").exists())
        .expect("the repository root above the crate")
        .to_owned()
}

impl SlurmCluster {
    /// What is missing to run a cluster here (programs with their Debian package, or
    /// root); empty when everything is there.
    pub fn missing() -> Vec<String> {
        let mut out: Vec<String> = PROGRAMS
            .iter()
            .filter(|(p, _)| !on_path(p))
            .map(|(p, pkg)| format!("{p} (Debian package {pkg})"))
            .collect();
        if !is_root() {
            out.push("root (slurmd starts jobs as root here)".to_owned());
        }
        out
    }

    /// Whether a cluster can run here. When it cannot: under `CI=true` this panics
    /// (scripts/test installs the packages, so a missing one is a failure); otherwise it
    /// says what was not checked and returns false.
    pub fn available() -> bool {
        let missing = Self::missing();
        if missing.is_empty() {
            return true;
        }
        let msg = format!(
            "no Slurm test cluster: missing {} (scripts/test installs them)",
            missing.join(", ")
        );
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{msg}");
        eprintln!("NOT CHECKED against a real Slurm: {msg}");
        false
    }

    /// Start munged, slurmctld and the slurmds and wait until every node is idle.
    pub fn start(opts: &Options) -> SlurmCluster {
        assert!((1..=4).contains(&opts.nodes), "1..=4 nodes");
        let dir = tempfile::Builder::new()
            .prefix("warden-slurm-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().to_owned();
        // munged wants its socket's directories searchable by all, its key private.
        mkdir(&root, 0o755);
        let run = mkdir(&root.join("run"), 0o755);
        let munge = mkdir(&root.join("munge"), 0o700);
        let state = mkdir(&root.join("state"), 0o700);
        let spool = mkdir(&root.join("spool"), 0o755);
        let log = mkdir(&root.join("log"), 0o755);
        let mut key = vec![0u8; 128];
        {
            use std::io::Read;
            fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut key))
                .expect("random munge key");
        }
        write_mode(&munge.join("munge.key"), &key, 0o600);

        let nodes: Vec<String> = if opts.names.is_empty() {
            (1..=opts.nodes).map(|i| format!("n{i}")).collect()
        } else {
            assert_eq!(opts.names.len(), opts.nodes, "one name per node");
            opts.names.clone()
        };
        let conf = root.join("slurm.conf");
        let mut cluster = SlurmCluster {
            dir,
            conf: conf.clone(),
            nodes: nodes.clone(),
            daemons: Vec::new(),
        };

        let socket = run.join("munge.sock");
        let munged = Command::new("munged")
            .arg("--foreground")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", munge.join("munge.key").display()))
            .arg(format!("--log-file={}", munge.join("munged.log").display()))
            .arg(format!("--pid-file={}", run.join("munged.pid").display()))
            .arg(format!(
                "--seed-file={}",
                munge.join("munged.seed").display()
            ))
            .stdin(Stdio::null())
            .stdout(log_file(&log, "munged.out"))
            .stderr(log_file(&log, "munged.out"))
            .spawn()
            .expect("munged starts");
        cluster.daemons.push(Daemon {
            name: "munged".into(),
            child: munged,
        });
        cluster.wait_for("munged's socket", PATIENCE, |_| {
            socket.exists().then_some(())
        });

        let (prolog, epilog) = match &opts.job_hook {
            Some(url) => {
                let (p, e) = cluster.install_hook(url);
                (Some(p), Some(e))
            }
            None => (None, None),
        };

        let host = hostname();
        let mut text = String::new();
        let w = &mut text;
        let _ = writeln!(w, "# Written by controller/tests/support/slurm.rs");
        let _ = writeln!(w, "ClusterName=warden-test");
        let _ = writeln!(w, "SlurmctldHost={host}(127.0.0.1)");
        let _ = writeln!(w, "SlurmctldPort={}", free_port());
        let _ = writeln!(w, "SlurmdPort={}", free_port());
        let _ = writeln!(w, "AuthType=auth/munge");
        let _ = writeln!(w, "CredType=cred/munge");
        let cred_expire = opts
            .cred_expire_secs
            .map(|s| format!(",cred_expire={s}"))
            .unwrap_or_default();
        let _ = writeln!(w, "AuthInfo=socket={}{cred_expire}", socket.display());
        let _ = writeln!(w, "SlurmUser=root");
        let _ = writeln!(w, "SlurmdUser=root");
        let _ = writeln!(w, "StateSaveLocation={}", state.display());
        let _ = writeln!(w, "SlurmdSpoolDir={}/%n", spool.display());
        let _ = writeln!(w, "SlurmctldPidFile={}/slurmctld.pid", run.display());
        let _ = writeln!(w, "SlurmdPidFile={}/slurmd-%n.pid", run.display());
        let _ = writeln!(w, "SlurmctldLogFile={}/slurmctld.log", log.display());
        let _ = writeln!(w, "SlurmdLogFile={}/slurmd-%n.log", log.display());
        let _ = writeln!(w, "ProctrackType=proctrack/linuxproc");
        let _ = writeln!(w, "TaskPlugin=task/none");
        let _ = writeln!(w, "JobAcctGatherType=jobacct_gather/none");
        let _ = writeln!(w, "AccountingStorageType=accounting_storage/none");
        let _ = writeln!(w, "JobCompType=jobcomp/none");
        let _ = writeln!(w, "SwitchType=switch/none");
        let _ = writeln!(w, "MpiDefault=none");
        let _ = writeln!(w, "SelectType=select/cons_tres");
        let _ = writeln!(w, "SelectTypeParameters=CR_Core");
        let _ = writeln!(w, "SchedulerType=sched/builtin");
        let _ = writeln!(w, "ReturnToService=2");
        let _ = writeln!(w, "MailProg=/bin/true");
        // The configured CPUs and memory, not this machine's, are what count.
        let _ = writeln!(w, "SlurmdParameters=config_overrides");
        // Quick to notice and to requeue; finished jobs stay visible a while.
        let _ = writeln!(w, "SlurmdTimeout=30");
        let _ = writeln!(w, "MinJobAge=300");
        let _ = writeln!(w, "KillWait=2");
        // A requeued job becomes eligible with no event that wakes the scheduler: its
        // periodic pass (60 s by default) starts it.
        let _ = writeln!(w, "SchedulerParameters=sched_interval=2");
        if let (Some(p), Some(e)) = (&prolog, &epilog) {
            let _ = writeln!(w, "PrologSlurmctld={}", p.display());
            let _ = writeln!(w, "EpilogSlurmctld={}", e.display());
        }
        for n in &nodes {
            let _ = writeln!(
                w,
                "NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={} CPUs=1 \
                 RealMemory=100 State=UNKNOWN",
                free_port()
            );
        }
        let _ = writeln!(
            w,
            "PartitionName=debug Nodes={} Default=YES MaxTime=INFINITE State=UP",
            nodes.join(",")
        );
        write_mode(&conf, text.as_bytes(), 0o644);

        let ctld = Command::new("slurmctld")
            .args(["-D", "-i", "-f"])
            .arg(&conf)
            .env("SLURM_CONF", &conf)
            .stdin(Stdio::null())
            .stdout(log_file(&log, "slurmctld.out"))
            .stderr(log_file(&log, "slurmctld.out"))
            .spawn()
            .expect("slurmctld starts");
        cluster.daemons.push(Daemon {
            name: "slurmctld".into(),
            child: ctld,
        });
        cluster.wait_for("slurmctld to answer", PATIENCE, |c| {
            c.command("scontrol")
                .arg("ping")
                .output()
                .ok()
                .filter(|o| String::from_utf8_lossy(&o.stdout).contains("is UP"))
                .map(|_| ())
        });
        for n in &nodes {
            let out = format!("slurmd-{n}.out");
            mkdir(&spool.join(n), 0o755);
            let d = Command::new("slurmd")
                .args(["-D", "-N", n, "-f"])
                .arg(&conf)
                .env("SLURM_CONF", &conf)
                .stdin(Stdio::null())
                .stdout(log_file(&log, &out))
                .stderr(log_file(&log, &out))
                .spawn()
                .expect("slurmd starts");
            // Stopped before slurmctld: keep slurmds at the front.
            cluster.daemons.insert(
                0,
                Daemon {
                    name: format!("slurmd -N {n}"),
                    child: d,
                },
            );
        }
        cluster.wait_for("every node idle", PATIENCE, |c| {
            let states = c.node_states();
            (states.len() == c.nodes.len() && states.values().all(|s| s == "idle")).then_some(())
        });
        cluster
    }

    /// Write the hook's config and the two wrappers; returns (prolog, epilog).
    fn install_hook(&self, url: &str) -> (PathBuf, PathBuf) {
        let hooks = mkdir(&self.dir.path().join("hooks"), 0o755);
        self.set_controller_url(url);
        let mut out = Vec::new();
        for which in ["prolog", "epilog"] {
            let target = repo().join(format!("deploy/slurm/{which}.sh"));
            assert!(target.exists(), "{}", target.display());
            let wrapper = hooks.join(format!("{which}.sh"));
            write_mode(
                &wrapper,
                format!(
                    "#!/bin/sh\n# slurmctld passes no environment of its own: say where the \
                     hook's config is.\nexport WARDEN_HOOK_CONFIG={}\nexec {} \"$@\"\n",
                    hooks.join("slurm-hook.env").display(),
                    target.display()
                )
                .as_bytes(),
                0o755,
            );
            out.push(wrapper);
        }
        let epilog = out.pop().expect("epilog");
        let prolog = out.pop().expect("prolog");
        (prolog, epilog)
    }

    /// Point the job hook at another controller URL (read by the next hook run).
    pub fn set_controller_url(&self, url: &str) {
        let hooks = self.dir.path().join("hooks");
        write_mode(
            &hooks.join("slurm-hook.env"),
            format!(
                "WARDEN_CONTROLLER_URL={url}\nWARDEN_HOOK_TIMEOUT_SECS=2\n\
                 WARDEN_TOKEN_FILE={}\nSLURM_CONF={}\n",
                hooks.join("no-token").display(),
                self.conf.display()
            )
            .as_bytes(),
            0o644,
        );
    }

    /// The node names, `n1`...
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The cluster's slurm.conf.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// A Slurm client command pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        c
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} runs: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        out
    }

    /// Submit a batch job (`sbatch --parsable ARGS`), output to the temp dir; its id.
    pub fn sbatch(&self, args: &[&str]) -> u32 {
        let output = format!("--output={}/log/job-%j.out", self.dir.path().display());
        let mut all = vec!["--parsable", output.as_str()];
        all.extend_from_slice(args);
        let out = self.run("sbatch", &all);
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("sbatch printed no job id: {text}"))
    }

    /// Node states by name, from `sinfo --json` (`idle`, `allocated`, `down`, ...).
    pub fn node_states(&self) -> BTreeMap<String, String> {
        let Ok(out) = self.command("sinfo").arg("--json").output() else {
            return BTreeMap::new();
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            return BTreeMap::new();
        };
        v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| {
                Some((
                    n["name"].as_str()?.to_owned(),
                    n["state"].as_str()?.to_ascii_lowercase(),
                ))
            })
            .collect()
    }

    /// A job as `squeue --json --states=all` shows it (finished jobs stay for
    /// `MinJobAge`); `None` when Slurm does not know it.
    pub fn job(&self, id: u32) -> Option<JobInfo> {
        let out = self
            .command("squeue")
            .args(["--json", "--states=all", &format!("--jobs={id}")])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let j = v["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["job_id"].as_u64() == Some(u64::from(id)))?;
        Some(JobInfo {
            state: j["job_state"].as_str()?.to_owned(),
            nodes: j["nodes"].as_str().unwrap_or("").to_owned(),
            exit_code: j["exit_code"].as_i64(),
        })
    }

    /// Expand a compact node list (`n[1-2]`) with `scontrol show hostnames`.
    pub fn hostnames(&self, list: &str) -> Vec<String> {
        let out = self.run("scontrol", &["show", "hostnames", list]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Wait until `job`'s info satisfies `done`; panics with the logs at `timeout`.
    pub fn wait_job(
        &self,
        id: u32,
        what: &str,
        timeout: Duration,
        done: impl Fn(&JobInfo) -> bool,
    ) -> JobInfo {
        self.wait_for(&format!("job {id}: {what}"), timeout, |c| {
            c.job(id).filter(|j| done(j))
        })
    }

    /// Poll `f` until it gives a value; panics with the logs at `timeout` (scaled by
    /// `WARDEN_TEST_PATIENCE`, see `warden_testkit`).
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        match warden_testkit::poll(timeout, || f(self)) {
            Some(v) => v,
            None => panic!(
                "timed out after {:?} waiting for {what}\n{}",
                warden_testkit::scaled(timeout),
                self.logs()
            ),
        }
    }

    /// The last lines of every daemon log and job output, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for dir in [self.dir.path().join("log"), self.dir.path().join("munge")] {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "out"))
            {
                let text = fs::read_to_string(p).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let _ = writeln!(out, "--- {}", p.display());
                for l in &lines[lines.len().saturating_sub(15)..] {
                    let _ = writeln!(out, "{l}");
                }
            }
        }
        out
    }
}

fn log_file(dir: &Path, name: &str) -> fs::File {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .unwrap_or_else(|e| panic!("log file {name}: {e}"))
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Jobs first, so no slurmstepd outlives its slurmd.
        if self.daemons.iter().any(|d| d.name == "slurmctld") {
            let _ = self
                .command("scancel")
                .args(["--partition=debug", "--full"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        for d in &mut self.daemons {
            let pid = d.child.id().to_string();
            let _ = Command::new("kill")
                .args(["-TERM", &pid])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                match d.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        let _ = d.child.kill();
                        let _ = d.child.wait();
                        break;
                    }
                }
            }
        }
    }
}
