//! Remediation end to end on a real Slurm cluster (slurmctld and four slurmd nodes):
//! a running two-node job's GPU falls off the bus; the real controller, acting (not a
//! dry run) through the Slurm actuator, drains that node with Warden's reason and
//! requeues the job without it, resuming from the latest complete Megatron checkpoint
//! (the newest one is half-written and skipped), with the steps of work lost on the
//! timeline. The time from detection to the restart command is measured and must stay
//! within 30 s of Warden's own time.

mod support;

use std::ffi::OsStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::ctl::{Ctl, finished};
use support::slurm::{Options, SlurmCluster};
use warden_model::wire::{
    Batch, EventSeverity, Heartbeat, JobSignals, NodeEvent, NodeEventKind, RankInfo, TrainingMetric,
};
use warden_testkit::{PATIENCE, wait_for, wait_until};

/// A requeued job waits `cred_expire` (5 s here) before it may start again.
const JOB_TIMEOUT: Duration = PATIENCE;

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64
}

/// Rank 0 of `job` on GPU 3 of `node` at step 250, and that GPU falling off the bus.
fn fault(node: &str, job: &str) -> Batch {
    let now = now_ns();
    Batch {
        version: 0,
        node: node.into(),
        agent_id: format!("agent-{node}"),
        boot_id: "boot-1".into(),
        seq: 2,
        sent_at_ns: now,
        jobs: vec![JobSignals {
            job: job.into(),
            ranks: vec![RankInfo {
                rank: 0,
                world_size: 2,
                pid: 4242,
                gpu_index: Some(3),
                gpu_uuid: "GPU-3".into(),
            }],
            metrics: vec![TrainingMetric {
                rank: 0,
                step: 250,
                at_ns: now - 1_000_000,
                loss: Some(2.5),
                ..TrainingMetric::default()
            }],
            ..JobSignals::default()
        }],
        gpus: vec![],
        events: vec![NodeEvent {
            id: 1,
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
    }
}

fn write(path: &std::path::Path, text: &str) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("mkdir");
    }
    std::fs::write(path, text).expect("write");
}

/// The controller with its data under `dir` and its configuration file `config`.
fn controller(dir: &std::path::Path, config: &std::path::Path) -> Ctl {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    Ctl::start(
        &[
            OsStr::new("--data-dir"),
            data.as_os_str(),
            OsStr::new("--config"),
            config.as_os_str(),
        ],
        None,
    )
}

fn job_field(cluster: &SlurmCluster, id: u32, key: &str) -> String {
    let out = cluster
        .command("scontrol")
        .args(["show", "job", &id.to_string(), "--oneliner"])
        .output()
        .expect("scontrol runs");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    line.split(' ')
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key}= in {line}"))
        .to_owned()
}

#[test]
fn a_dead_gpu_drains_its_node_and_requeues_the_job_without_it_from_the_last_checkpoint() {
    if !SlurmCluster::available() {
        return;
    }
    // The job hook reports starts and ends; it points nowhere until the controller
    // is up (a hook that cannot report never fails a job).
    let cluster = SlurmCluster::start(&Options {
        nodes: 4,
        cred_expire_secs: Some(5),
        job_hook: Some("http://127.0.0.1:9".to_owned()),
        ..Options::default()
    });
    let id = cluster.sbatch(&[
        "--job-name=warden-train",
        "--nodes=2",
        "--ntasks=2",
        "--wrap",
        "srun sleep 300",
    ]);
    let running = cluster.wait_job(id, "running", JOB_TIMEOUT, |j| j.state == "RUNNING");
    let hosts = cluster.hostnames(&running.nodes);
    let bad = hosts.first().expect("a node").clone();

    // The job's checkpoints: step 200 complete, step 300 half-written.
    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().join("ckpt").join(id.to_string());
    write(&ckpt.join("latest_checkpointed_iteration.txt"), "200\n");
    write(
        &ckpt.join("iter_0000200/mp_rank_00/model_optim_rng.pt"),
        "weights",
    );
    std::fs::create_dir_all(ckpt.join("iter_0000300/mp_rank_00")).expect("mkdir");

    let config = dir.path().join("controller.yaml");
    write(
        &config,
        &format!(
            "remediation:\n  dry_run: false\n  actuator: slurm\n  slurm:\n    slurm_conf: {}\n  \
             checkpoint_dir: {}/ckpt/{{job}}\n",
            cluster.conf().display(),
            dir.path().display()
        ),
    );
    let c = controller(dir.path(), &config);
    cluster.set_controller_url(&format!("http://127.0.0.1:{}", c.port));
    for (i, n) in cluster.nodes().iter().enumerate() {
        c.ingest_heartbeat(n, i as u64 + 1);
    }
    let sent = Instant::now();
    c.ingest(&fault(&bad, &id.to_string()).encode_binary());
    // Both actions are listed as intended before their actuator runs: wait for their
    // results. The drain is done before the restart is intended.
    let restart = c.finished_action("restart", &id.to_string());
    let seen = sent.elapsed();
    let isolate = c.finished_action("isolate", &bad);

    assert_eq!(restart["dry_run"], false);
    assert_eq!(restart["status"], "done", "{restart}");
    let result = restart["result"].as_str().expect("result");
    assert!(
        result.starts_with(&format!("restart of job {id} requested from ")),
        "{result}"
    );
    assert!(
        result.contains("iter_0000200 (step 200, megatron)"),
        "{result}"
    );
    assert!(result.contains(&format!("without {bad}")), "{result}");
    assert!(result.ends_with("; 50 steps of work lost"), "{result}");
    assert_eq!(isolate["result"], format!("drain {bad}: done").as_str());

    // Detection to restart command, in Warden's own time.
    let incidents = c.incidents();
    let inc = incidents.first().expect("the incident");
    let detected_ns = (inc["detected_s"].as_f64().expect("detected_s") * 1e9) as i64;
    let finished_ns = restart["finished_at"].as_i64().expect("finished_at ns");
    let latency = (finished_ns - detected_ns) as f64 / 1e9;
    eprintln!(
        "detection → restart command: {latency:.3} s (batch sent → restart seen by the test: \
         {:.3} s)",
        seen.as_secs_f64()
    );
    assert!(latency <= 30.0, "detection to restart took {latency:.3} s");

    // Slurm's own view: the node drained with Warden's reason, the job requeued
    // excluding it and running again elsewhere.
    let out = cluster
        .command("scontrol")
        .args(["show", "node", &bad, "--oneliner"])
        .output()
        .expect("scontrol runs");
    let node = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(node.contains("DRAIN"), "{node}");
    assert!(
        node.contains(&format!(
            "Reason=warden: {}: quarantined: gpu-fatal-xid: GPU 3 on {bad}",
            inc["id"].as_str().expect("id")
        )),
        "{node}"
    );
    assert!(job_field(&cluster, id, "ExcNodeList").contains(&bad));
    assert_eq!(job_field(&cluster, id, "Restarts"), "1");
    let again = cluster.wait_job(id, "running again", JOB_TIMEOUT, |j| j.state == "RUNNING");
    assert!(
        !cluster.hostnames(&again.nodes).contains(&bad),
        "{again:?} avoids {bad}"
    );

    // The timeline tells the story, checkpoint skipped included.
    wait_until("the timeline written", PATIENCE, || {
        c.incidents()[0]["timeline"]
            .as_array()
            .is_some_and(|t| t.iter().any(|e| e["what"].as_str() == Some(result)))
    });
    let inc = &c.incidents()[0];
    let timeline: Vec<&str> = inc["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter_map(|e| e["what"].as_str())
        .collect();
    assert!(
        timeline
            .iter()
            .any(|w| w.starts_with("checkpoint skipped iter_0000300")),
        "{timeline:?}"
    );
    assert!(
        inc["state"] == "mitigating" || inc["state"] == "resolved",
        "{inc}"
    );

    // Warden itself sees the job running again without the node (the scheduler's start
    // report after the requeue).
    wait_until("the restart verified", PATIENCE, || {
        c.incidents()[0]["timeline"].as_array().is_some_and(|t| {
            t.iter().any(|e| {
                e["what"].as_str().is_some_and(|w| {
                    w.starts_with(&format!("verified: job {id} runs again on "))
                        && w.ends_with(&format!(" without {bad}"))
                })
            })
        })
    });
    // Running again without the node ends the incident (the node stays drained).
    wait_until("the incident resolved as mitigated", PATIENCE, || {
        let inc = &c.incidents()[0];
        inc["state"] == "resolved"
            && inc["timeline"].as_array().is_some_and(|t| {
                t.iter().any(|e| {
                    e["what"].as_str()
                        == Some(
                            "resolved by warden-policy: mitigated: the job runs again without \
                             the isolated node(s)",
                        )
                })
            })
    });
    c.kill();
}

/// The `Reason=` of `node` as `scontrol show node` prints it.
fn node_line(cluster: &SlurmCluster, node: &str) -> String {
    let out = cluster
        .command("scontrol")
        .args(["show", "node", node, "--oneliner"])
        .output()
        .expect("scontrol runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_quarantined_node_returns_only_when_its_check_job_passes_on_the_node() {
    if !SlurmCluster::available() {
        return;
    }
    let cluster = SlurmCluster::start(&Options {
        nodes: 3,
        cred_expire_secs: Some(5),
        ..Options::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    // The check the job runs on the node: a node with a `broken-<node>` file fails.
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).expect("mkdir");
    let [broken, sound, _] = [0, 1, 2].map(|i| cluster.nodes()[i].clone());
    write(
        &marks.join(format!("broken-{broken}")),
        "the GPU stays off the bus\n",
    );
    let config = dir.path().join("controller.yaml");
    write(
        &config,
        &format!(
            "remediation:\n  dry_run: false\n  actuator: slurm\n  slurm:\n    slurm_conf: {}\n  \
             breaker: {{max_percent: 100}}\n  \
             verify:\n    enabled: true\n    after: 1s\n    timeout: 2m\n    command: \
             [/bin/sh, -c, 'test ! -e {}/broken-$SLURMD_NODENAME']\n",
            cluster.conf().display(),
            marks.display()
        ),
    );
    let c = controller(dir.path(), &config);
    for (i, n) in cluster.nodes().iter().enumerate() {
        c.ingest_heartbeat(n, i as u64 + 1);
    }
    // Both GPUs fall off the bus: the ledger quarantines both nodes, the policy drains
    // them, and each one's check runs as a Slurm job on it.
    c.ingest_xid(&broken, 10);
    c.ingest_xid(&sound, 11);
    let c = &c;
    let verified = |node: &str| {
        let node = node.to_owned();
        move || {
            c.actions()
                .into_iter()
                .find(|a| a["kind"] == "verify" && a["target"] == node.as_str() && finished(a))
        }
    };
    let failed = wait_for("the broken node's check", PATIENCE * 4, verified(&broken));
    let passed = wait_for("the sound node's check", PATIENCE * 4, verified(&sound));
    let result = |a: &serde_json::Value| a["result"].as_str().unwrap_or_default().to_owned();
    assert!(
        result(&passed).starts_with("passed: check job "),
        "{passed}"
    );
    assert!(
        result(&passed).contains(&format!(" exited 0 on {sound}; given back: slurm: ")),
        "{passed}"
    );
    assert!(
        result(&failed).starts_with(&format!(
            "failed: check job on {broken}: exited with status 1 (job "
        )),
        "{failed}"
    );
    // The check was a real Slurm job, named for the node, run on it.
    let job: u32 = result(&passed)
        .strip_prefix("passed: check job ")
        .and_then(|r| r.split(' ').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a job id in {passed}"));
    assert_eq!(
        job_field(&cluster, job, "JobName"),
        format!("warden-verify-{sound}")
    );
    assert_eq!(job_field(&cluster, job, "NodeList"), sound);
    assert_eq!(job_field(&cluster, job, "JobState"), "COMPLETED");

    // The ledger's verdicts, and Slurm's: the sound node in service, the broken one
    // drained with its state in the reason; no reservation left behind.
    let health = |node: &str| c.get(&format!("/api/v1/nodes/{node}/health"));
    assert_eq!(health(&sound)["state"], "returned", "{}", health(&sound));
    assert_eq!(health(&broken)["state"], "bad", "{}", health(&broken));
    let line = node_line(&cluster, &sound);
    assert!(
        !line.contains("DRAIN") && !line.contains("RESERVED"),
        "{line}"
    );
    let line = node_line(&cluster, &broken);
    assert!(line.contains("DRAIN"), "{line}");
    assert!(
        line.contains("Reason=warden: bad: health check failed: check job on"),
        "{line}"
    );
    let out = cluster
        .command("scontrol")
        .args(["show", "reservation"])
        .output()
        .expect("scontrol runs");
    let reservations = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!reservations.contains("warden-verify"), "{reservations}");
    // Warden's node table: the broken node still held, the sound one not.
    let nodes = c.get("/api/v1/nodes");
    let held: Vec<&str> = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["state"] == "drained")
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert!(held.contains(&broken.as_str()), "{nodes}");
    assert!(!held.contains(&sound.as_str()), "{nodes}");
    // The alert's series.
    let (_, metrics) = support::http_get(c.port, "/metrics").expect("metrics");
    assert!(
        metrics.contains(&format!(
            "warden_node_health{{node=\"{broken}\",state=\"bad\"}} 1"
        )),
        "{metrics}"
    );
}
