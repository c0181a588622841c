//! A real PyTorch job caught in the act: the `warden-controller` binary, two
//! `warden-agent`s posing as node-00 and node-01, and a torchrun gloo job of 8 ranks (4
//! per "node", on 127.0.0.1) training a small DDP model with `warden_torch`, with a
//! process-group timeout of 120 s so that detection visibly beats PyTorch's own. Faults:
//! SIGSTOP of one rank (hang), kill -9 of one rank (crash), NaN in one rank's loss, one
//! rank 50% slower (straggler), and a clean run with no incident. Beside it, a check of
//! `warden_torch`'s DDP hook against DDP's built-in all-reduce on two ranks, and the
//! same faults on the other job shapes (all-reduce by hand, FSDP2, a pipeline) through
//! `scripts/job-matrix`, and on jobs nothing captures, found from their logs.
//!
//! Needs Python with `torch` in `$WARDEN_VENV` (default `~/.cache/warden/venv`; the
//! test command installs it). Under CI a missing torch is a failure; elsewhere the test
//! says so and passes without running.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{AgentProc, free_port, http_get, metric};
use warden_testkit::{PATIENCE, poll, wait_for, wait_until};

const NODES: [&str; 2] = ["node-00", "node-01"];
const RANKS_PER_NODE: u32 = 4;

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The Python interpreter with torch, if there is one.
fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("WARDEN_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/warden/venv")))?;
    let py = venv.join("bin/python");
    let ok = Command::new(&py)
        .args([
            "-c",
            "import torch.distributed as d; assert d.is_gloo_available()",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(py)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// The controller binary of the same build as the agent under test.
fn controller_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_warden-agent")).with_file_name("warden-controller");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p warden-controller` (same profile)",
        bin.display()
    );
    bin
}

/// Controller and agents, killed when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    controller: Child,
    port: u16,
    _agents: Vec<AgentProc>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.controller.kill();
        let _ = self.controller.wait();
    }
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let controller = Command::new(controller_bin())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(dir.path().join("controller"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the controller");
        wait_until("the controller to answer /healthz", PATIENCE, || {
            http_get(port, "/healthz").is_some()
        });
        let agents = NODES
            .iter()
            .map(|node| {
                let url = format!("http://127.0.0.1:{port}");
                let (cfg, agent_port) = support::agent_config(dir.path(), node, &url, "");
                AgentProc::start(&cfg, agent_port)
            })
            .collect();
        Cluster {
            dir,
            controller,
            port,
            _agents: agents,
        }
    }

    fn incidents(&self, job: &str) -> Vec<Value> {
        http_get(self.port, &format!("/api/v1/incidents?job={job}"))
            .and_then(|b| serde_json::from_str::<Vec<Value>>(&b).ok())
            .unwrap_or_default()
    }

    /// What the controller knows, for failure messages.
    fn state(&self) -> String {
        format!(
            "jobs: {}\nincidents: {}\nranks: {}",
            http_get(self.port, "/api/v1/jobs").unwrap_or_default(),
            http_get(self.port, "/api/v1/incidents").unwrap_or_default(),
            http_get(self.port, "/api/v1/jobs/hang/ranks").unwrap_or_default()
        )
    }

    /// The first incident of `job` once it is of `kind` and names its culprit nodes
    /// and its detection time, waiting up to [`PATIENCE`]. Waiting for the kind, not
    /// just an incident: a symptom's incident (a hang) is re-attributed to its root
    /// cause (a crash) when that shows up later. The detection bounds are checked on the
    /// incident's own `detected_s`, so this wait may be generous.
    fn wait_incident(&self, job: &Job, kind: &str) -> Value {
        let found = poll(PATIENCE, || {
            self.incidents(&job.name).into_iter().next().filter(|i| {
                field(i, "kind") == kind
                    && field(i, "detected_s").as_f64().is_some()
                    && !nodes(i).is_empty()
            })
        });
        found.unwrap_or_else(|| {
            panic!(
                "no {kind} incident of job {} within {:?}\n{}\n{}",
                job.name,
                warden_testkit::scaled(PATIENCE),
                self.state(),
                job.logs()
            )
        })
    }

    /// The ranks of `job` whose exit the controller holds.
    fn exited(&self, job: &str) -> Option<u64> {
        let jobs: Vec<Value> =
            http_get(self.port, "/api/v1/jobs").and_then(|b| serde_json::from_str(&b).ok())?;
        jobs.iter()
            .find(|j| j["job"] == job)
            .and_then(|j| j["exited"].as_u64())
    }

    /// Detector passes the controller has run.
    fn ticks(&self) -> Option<f64> {
        http_get(self.port, "/metrics").and_then(|m| metric(&m, "warden_detector_ticks_total"))
    }
}

/// One torchrun launch per node; every process is killed when dropped.
struct Job {
    name: String,
    work: PathBuf,
    launches: Vec<Child>,
}

impl Job {
    fn start(cluster: &Cluster, py: &Path, name: &str, args: &[&str]) -> Job {
        let work = cluster.dir.path().join(name);
        std::fs::create_dir_all(&work).expect("job dir");
        // torchrun binds it seconds from now, once torch is imported: a port from below
        // the ephemeral range, which no gloo connection takes as its source port meanwhile.
        let master_port = free_port().to_string();
        let script = repo().join("integrations/python/examples/train_ddp.py");
        let launches = NODES
            .iter()
            .enumerate()
            .map(|(k, node)| {
                let log = std::fs::File::create(work.join(format!("{node}.log"))).expect("log");
                let err = log.try_clone().expect("log");
                let mut cmd = Command::new(py);
                cmd.args(["-m", "torch.distributed.run", "--nnodes=2"])
                    .arg(format!("--node-rank={k}"))
                    .arg(format!("--nproc-per-node={RANKS_PER_NODE}"))
                    .args(["--master-addr=127.0.0.1", "--monitor-interval=0.1"])
                    .arg(format!("--master-port={master_port}"))
                    .arg(&script)
                    .arg("--pid-dir")
                    .arg(&work)
                    .args(args)
                    .env("WARDEN_JOB", name)
                    .env(
                        "WARDEN_AGENT_SOCKET",
                        cluster.dir.path().join(node).join("capture.sock"),
                    )
                    .env("PYTHONPATH", repo().join("integrations/python"))
                    .env("GLOO_SOCKET_IFNAME", "lo")
                    .env("OMP_NUM_THREADS", "1")
                    .stdout(log)
                    .stderr(err);
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                cmd.spawn().expect("start torchrun")
            })
            .collect();
        Job {
            name: name.to_owned(),
            work,
            launches,
        }
    }

    /// (step, wall seconds) of the last step rank 0 finished.
    fn last_step(&self) -> Option<(u64, f64)> {
        self.steps().last().copied()
    }

    fn steps(&self) -> Vec<(u64, f64)> {
        let text = std::fs::read_to_string(self.work.join("steps.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let (s, t) = l.split_once(' ')?;
                Some((s.parse().ok()?, t.parse::<f64>().ok()? / 1e9))
            })
            .collect()
    }

    fn wait_step(&self, step: u64, limit: Duration) {
        let reached = poll(limit, || {
            self.last_step()
                .is_some_and(|(s, _)| s >= step)
                .then_some(())
        });
        assert!(
            reached.is_some(),
            "job {} did not reach step {step} in {:?}:\n{}",
            self.name,
            warden_testkit::scaled(limit),
            self.logs()
        );
    }

    fn pid(&self, rank: u32) -> String {
        std::fs::read_to_string(self.work.join(format!("rank{rank}.pid")))
            .expect("pid file")
            .trim()
            .to_owned()
    }

    fn signal(&self, rank: u32, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid(rank)])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} rank {rank}");
    }

    /// Wait for both launches to end; false if they are still running after `limit`.
    fn wait(&mut self, limit: Duration) -> bool {
        poll(limit, || {
            self.launches
                .iter_mut()
                .all(|c| c.try_wait().ok().flatten().is_some())
                .then_some(())
        })
        .is_some()
    }

    fn logs(&self) -> String {
        NODES
            .iter()
            .map(|n| {
                let text =
                    std::fs::read_to_string(self.work.join(format!("{n}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!(
                    "--- {n} ---\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // torchrun starts each worker in a session of its own, so the workers are
        // killed by pid (SIGKILL also ends a stopped one), then the launchers' groups.
        for rank in 0..RANKS_PER_NODE * NODES.len() as u32 {
            if let Ok(pid) = std::fs::read_to_string(self.work.join(format!("rank{rank}.pid"))) {
                let _ = Command::new("kill")
                    .args(["-KILL", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for c in &mut self.launches {
            // The whole process group: torchrun and its workers (a stopped one too).
            let pg = format!("-{}", c.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &pg])
                .stderr(Stdio::null())
                .status();
            let _ = c.wait();
        }
    }
}

fn field<'a>(i: &'a Value, k: &str) -> &'a Value {
    &i[k]
}

fn ranks(i: &Value) -> Vec<u64> {
    field(i, "ranks")
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn nodes(i: &Value) -> Vec<String> {
    field(i, "nodes")
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The tests of this file each start several torch processes: one at a time.
static ONE_JOB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The interpreter with torch, and this test's turn to run torch processes; under CI
/// a missing torch is a failure.
fn torch_turn() -> Option<(PathBuf, std::sync::MutexGuard<'static, ()>)> {
    let Some(py) = python() else {
        let msg = "torch is not installed in $WARDEN_VENV (run scripts/test, which installs it)";
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("skipping: {msg}");
        return None;
    };
    let turn = ONE_JOB_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Some((py, turn))
}

/// Run `integrations/python/tests/<script> <args>` with `py` (gloo on loopback, one
/// thread) and assert that it exits 0 and says `passed` in its output.
fn run_check(py: &Path, script: &str, args: &[&str], passed: &str) {
    let out = Command::new(py)
        .arg(repo().join("integrations/python/tests").join(script))
        .args(args)
        .env("GLOO_SOCKET_IFNAME", "lo")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} {args:?}: {text}");
    assert!(text.contains(passed), "{script} {args:?}: {text}");
}

/// `warden_torch`'s DDP hook gives the gradients of DDP's built-in all-reduce and reports
/// every gradient all-reduce once, start and end, on two gloo ranks
/// (`integrations/python/tests/check_ddp_hook.py`).
#[test]
fn the_ddp_hook_matches_the_built_in_all_reduce_and_reports_each() {
    let Some((py, _turn)) = torch_turn() else {
        return;
    };
    run_check(&py, "check_ddp_hook.py", &[], "every all-reduce reported");
}

/// Every operation real training code issues (each collective in each spelling,
/// point-to-point traffic with its peer, coalesced and functional collectives, DDP with
/// several buckets, FSDP2) is reported once, start and end, lined up across ranks, with
/// process-group hooks and with the method wrappers older torch releases get
/// (`integrations/python/tests/check_capture.py`).
#[test]
fn every_operation_of_real_training_code_is_reported_once() {
    let Some((py, _turn)) = torch_turn() else {
        return;
    };
    for mode in ["hooks", "methods"] {
        run_check(&py, "check_capture.py", &[mode], "every operation reported");
    }
}

/// With `warden_torch`'s input check on, the rank that put a NaN into a gradient
/// reports the operation that fed it into a reduction at that step and its peer none,
/// with process-group hooks and with the method wrappers; with it off no step carries
/// an op index (`integrations/python/tests/check_input_nan.py`).
#[test]
fn the_input_check_names_the_rank_that_fed_a_nan_into_a_reduction() {
    let Some((py, _turn)) = torch_turn() else {
        return;
    };
    for mode in ["hooks", "methods"] {
        run_check(&py, "check_input_nan.py", &[mode], "passed");
    }
}

/// A device work (NCCL) is reported as ended when it ran on the GPU, not when its
/// future completed at enqueue (`integrations/python/tests/check_device_work.py`: a
/// stand-in work of that shape; no GPU needed).
#[test]
fn a_device_work_ends_when_it_ran_not_when_it_was_enqueued() {
    let Some((py, _turn)) = torch_turn() else {
        return;
    };
    run_check(
        &py,
        "check_device_work.py",
        &[],
        "device work check: passed",
    );
}

/// A rank's exit message reaches an agent that fell behind (it reads nothing until 1 s
/// into the rank's shutdown, with 256 KiB waiting in the rank's backlog): the last
/// frame on the connection is the exit, whole, so the agent never takes a clean exit
/// for a death
/// (`integrations/python/tests/check_goodbye.py`).
#[test]
fn a_ranks_goodbye_reaches_an_agent_that_fell_behind() {
    let Some((py, _turn)) = torch_turn() else {
        return;
    };
    run_check(&py, "check_goodbye.py", &[], "goodbye check: passed");
}

/// The other shapes real jobs take (gradients all-reduced by hand, FSDP2's
/// `fully_shard`, a 2-stage pipeline by send/recv with data parallel in each stage),
/// each fault once in a run of its own, through `scripts/job-matrix` (the controller
/// and agent binaries of this build, the agents at their default settings, 4 ranks on
/// two nodes): a SIGSTOP found as a hang naming the rank and its node within 5 s and
/// still the one open incident after the process group's timeout, a kill -9 as a crash
/// within 3 s, a NaN as a nan naming the rank and step before the next step ends, a
/// rank 1.5x slower as a straggler within 20 steps, and a clean run with no incident.
/// (DDP's cases are the test below, on 8 ranks.)
#[test]
fn every_job_shape_has_each_fault_found_with_its_culprit() {
    let Some(text) = job_matrix(&["--shapes", "manual,fsdp2,pipeline"]) else {
        return;
    };
    // Three shapes × hang, crash, nan, slow, slow-node, clean.
    assert!(text.contains("18 runs, 0 failed"), "{text}");
}

/// Jobs that nothing captures (no `warden_torch`, no plugin): the agents follow their
/// logs, and a SIGSTOP is a hang naming the rank and its node once the process group's
/// timeout fires on the others (and still the one incident after their exits), a kill
/// -9 a crash naming the killed rank (not the survivor each other node's torchrun
/// calls its root cause), a NaN a nan naming the rank and step, a clean run nothing.
/// DDP with four buckets, and the pipeline, whose stages wait on each other by
/// send/recv and on their data-parallel peers by all-reduce.
#[test]
fn a_job_nothing_captures_has_its_hang_crash_and_nan_found_from_its_logs() {
    let Some(text) = job_matrix(&["--capture", "none", "--shapes", "ddp,pipeline"]) else {
        return;
    };
    assert!(text.contains("8 runs, 0 failed"), "{text}");
}

/// Run `scripts/job-matrix` with `args` on this build's binaries; its output, once it
/// passed (`None` where torch is missing outside CI).
fn job_matrix(args: &[&str]) -> Option<String> {
    let (py, _turn) = torch_turn()?;
    let agent = Path::new(env!("CARGO_BIN_EXE_warden-agent"));
    let bin = agent.parent().expect("the binaries' folder");
    let controller = controller_bin();
    assert_eq!(
        controller.parent(),
        Some(bin),
        "the controller and the agent must be of one build"
    );
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(&py)
        .arg(repo().join("scripts/job-matrix"))
        .arg("--bin")
        .arg(bin)
        .arg("--out")
        .arg(out.path())
        .arg("--python")
        .arg(&py)
        .args(args)
        .env("GLOO_SOCKET_IFNAME", "lo")
        .output()
        .expect("run scripts/job-matrix");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{text}");
    eprintln!("{text}");
    Some(text)
}

#[test]
fn a_real_gloo_job_is_caught_in_the_act() {
    let Some((py, _turn)) = torch_turn() else {
        return;
    };
    let cluster = Cluster::start();
    let mut report = vec![];
    // Starting torch and training past the detector's warm-up, on a loaded machine.
    let warm = PATIENCE * 4;

    // (a) SIGSTOP of rank 5 (node-01) at step 8 → hang naming rank 5 and node-01 within
    // 5 s; when the process group's 20 s timeout then fires on the others, their exits
    // are evidence on the hang, which stays the one open incident, naming rank 5.
    {
        let job = Job::start(
            &cluster,
            &py,
            "hang",
            &["--steps", "100000", "--pg-timeout-s", "20"],
        );
        // In the job's first steps, before the detector's warm-up (32 collectives per
        // communicator) is over: the bound comes from the few waits seen and the
        // iteration time the step marks give.
        job.wait_step(8, warm);
        let t0 = now_s();
        job.signal(5, "-STOP");
        let i = cluster.wait_incident(&job, "hang");
        assert_eq!(field(&i, "kind"), "hang", "{i}");
        assert_eq!(ranks(&i), [5], "{i}");
        assert_eq!(nodes(&i), ["node-01"], "{i}");
        let latency = field(&i, "detected_s").as_f64().unwrap_or(f64::MAX) - t0;
        assert!(latency < 5.0, "{latency} s");
        let id = field(&i, "id").as_str().unwrap_or_default().to_owned();
        let after = poll(PATIENCE * 4, || {
            let all = cluster.incidents(&job.name);
            all.iter()
                .any(|i| {
                    field(i, "evidence").as_array().is_some_and(|e| {
                        e.iter().any(|e| {
                            e["text"]
                                .as_str()
                                .is_some_and(|t| t.starts_with("consequence (crash)"))
                        })
                    })
                })
                .then_some(all)
        });
        let after = after.unwrap_or_else(|| {
            panic!(
                "the waiters' timeouts never reached the hang incident\n{}\n{}",
                cluster.state(),
                job.logs()
            )
        });
        assert_eq!(after.len(), 1, "{after:#?}");
        assert_eq!(field(&after[0], "id"), id.as_str(), "{after:#?}");
        assert_eq!(field(&after[0], "kind"), "hang", "{after:#?}");
        assert_eq!(ranks(&after[0]), [5], "{after:#?}");
        assert_ne!(field(&after[0], "state"), "resolved", "{after:#?}");
        report.push(format!(
            "hang: rank 5 node-01 detected {latency:.2} s after SIGSTOP at step 8; after the process \
             group's timeout still the one open incident, the hang naming rank 5"
        ));
    }

    // (b) kill -9 of rank 2 (node-00) → crash naming rank 2 within 5 s.
    {
        let job = Job::start(&cluster, &py, "crash", &["--steps", "100000"]);
        job.wait_step(45, warm);
        let t0 = now_s();
        job.signal(2, "-KILL");
        let i = cluster.wait_incident(&job, "crash");
        assert_eq!(field(&i, "kind"), "crash", "{i}");
        assert_eq!(ranks(&i), [2], "{i}");
        assert_eq!(nodes(&i), ["node-00"], "{i}");
        let latency = field(&i, "detected_s").as_f64().unwrap_or(f64::MAX) - t0;
        assert!(latency < 5.0, "{latency} s");
        // The diagnosis names the rank that died first, not the peers whose lines say
        // they lost it ("Connection reset by peer" in gloo).
        let diagnosed = poll(PATIENCE * 2, || {
            cluster
                .incidents(&job.name)
                .into_iter()
                .find(|i| i["diagnosis"].is_object())
        });
        let diagnosed = diagnosed
            .unwrap_or_else(|| panic!("the crash was never diagnosed\n{}", cluster.state()));
        let d = &diagnosed["diagnosis"];
        assert_eq!(d["ranks"], serde_json::json!([2]), "{d}");
        assert_ne!(d["category"], "user_code_error", "{d}");
        report.push(format!(
            "crash: rank 2 node-00 detected {latency:.2} s after kill -9; diagnosis {} naming rank 2",
            d["category"]
        ));
    }

    // (c) NaN in rank 6's loss at step 20 → nan naming rank 6 and step 20, before rank 0
    // finishes step 21. Steps here take about 0.63 s (the signal path takes up to one
    // agent flush, 100 ms here, plus one controller tick, 250 ms by default).
    {
        let mut job = Job::start(
            &cluster,
            &py,
            "nan",
            &[
                "--steps",
                "30",
                "--compute-ms",
                "600",
                "--fault",
                "nan",
                "--fault-rank",
                "6",
                "--fault-step",
                "20",
            ],
        );
        job.wait_step(19, warm);
        let i = cluster.wait_incident(&job, "nan");
        assert_eq!(field(&i, "kind"), "nan", "{i}");
        assert_eq!(ranks(&i), [6], "{i}");
        assert_eq!(nodes(&i), ["node-01"], "{i}");
        let summary = field(&i, "summary").as_str().unwrap_or_default();
        assert!(summary.contains("step 20"), "{summary}");
        let detected = field(&i, "detected_s").as_f64().unwrap_or(f64::MAX);
        assert!(job.wait(warm), "nan job did not finish\n{}", job.logs());
        let steps = job.steps();
        let at = |n: u64| steps.iter().find(|(s, _)| *s == n).map(|&(_, t)| t);
        let (s20, s21) = (at(20).expect("step 20"), at(21).expect("step 21"));
        assert!(
            detected <= s21,
            "detected {:.3} s after step 20 ended, step 21 ended {:.3} s after it",
            detected - s20,
            s21 - s20
        );
        report.push(format!(
            "nan: rank 6 step 20 detected {:.2} s after step 20 ended (a step takes {:.2} s)",
            detected - s20,
            s21 - s20
        ));
    }

    // (d) rank 1 (node-00) 50% slower from step 20, in a model DDP reduces in four
    // buckets a step → straggler naming rank 1 on node-00 within 20 steps. 0.25 s of
    // compute a step, as in scripts/job-matrix: with the default 50 ms, a step under
    // load is shorter than a flush and twenty of them measure the flush cadence and
    // the machine's load more than the evidence.
    {
        let mut job = Job::start(
            &cluster,
            &py,
            "slow",
            &[
                "--steps",
                "60",
                "--compute-ms",
                "250",
                "--buckets",
                "4",
                "--fault",
                "slow",
                "--fault-rank",
                "1",
                "--fault-step",
                "20",
                "--slow-factor",
                "1.5",
            ],
        );
        job.wait_step(20, warm);
        let i = cluster.wait_incident(&job, "straggler");
        assert_eq!(field(&i, "kind"), "straggler", "{i}");
        assert_eq!(nodes(&i), ["node-00"], "{i}");
        assert_eq!(ranks(&i), [1], "{i}");
        assert!(job.wait(warm), "slow job did not finish\n{}", job.logs());
        // The last step rank 0 had finished when the controller detected it, from the
        // incident's own time: when this test happened to look is no measure.
        let detected = field(&i, "detected_s").as_f64().unwrap_or(f64::MAX);
        let detected_step = job
            .steps()
            .iter()
            .filter(|&&(_, t)| t <= detected)
            .map(|&(s, _)| s)
            .max()
            .unwrap_or(0);
        assert!(
            detected_step <= 40,
            "straggler seen at step {detected_step}, more than 20 steps after it began at 20"
        );
        report.push(format!(
            "straggler: rank 1 on node-00, four buckets a step, detected by step \
             {detected_step} (slow from step 20)"
        ));
    }

    // (e) A clean run → no incident, during the run or after it ended.
    {
        let mut job = Job::start(&cluster, &py, "clean", &["--steps", "80"]);
        assert!(job.wait(warm), "clean job did not finish\n{}", job.logs());
        let logs = job.logs();
        assert!(logs.contains("done: 80 steps"), "{logs}");
        // Barrier for the check that nothing was found: the controller holds every
        // rank's exit, then runs at least 12 more detector passes (3 s at its 250 ms
        // tick) over that state.
        let world = u64::from(RANKS_PER_NODE) * NODES.len() as u64;
        wait_until(
            "the controller to hold every exit of job clean",
            PATIENCE,
            || cluster.exited("clean") == Some(world),
        );
        let ticks = wait_for("the controller's /metrics", PATIENCE, || cluster.ticks());
        wait_until("12 more detector passes", PATIENCE, || {
            cluster.ticks().is_some_and(|t| t >= ticks + 12.0)
        });
        let incidents = cluster.incidents("clean");
        assert!(incidents.is_empty(), "{incidents:?}");
        report.push("clean: 80 steps, no incident".to_owned());
    }
    eprintln!("{}", report.join("\n"));
}
