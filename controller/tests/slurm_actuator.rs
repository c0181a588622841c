//! The Slurm actuator against a real slurmctld with four slurmd nodes: it drains with a
//! marked reason, leaves alone and never resumes another owner's drain, resumes its own,
//! requeues a running job without a node (and the job runs again elsewhere), only
//! excludes for a pending job, never reruns a completed one, and says NotFound for an
//! unknown node or job. Everything is read back with Slurm's own commands. A slurmctld
//! that does not answer is a step to retry.

mod support;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::slurm::{Options, SlurmCluster};
use warden_controller::remedy::slurm::{SlurmActuator, SlurmConfig};
use warden_controller::remedy::{ActuatorError, Isolation, Outcome, Release, Restart};
use warden_model::Timestamp;
use warden_testkit::PATIENCE;

/// Long enough for a requeued job to start again on a busy two-core machine (it waits
/// `cred_expire`, 5 s here, first).
const JOB_TIMEOUT: Duration = PATIENCE;

/// Run a Slurm client command against the cluster; its stdout (panics on failure).
fn slurm(cluster: &SlurmCluster, program: &str, args: &[&str]) -> String {
    let out = cluster
        .command(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A node as `sinfo --json` shows it: (state, state flags, reason).
fn sinfo_node(cluster: &SlurmCluster, node: &str) -> (String, Vec<String>, String) {
    let v: Value =
        serde_json::from_str(&slurm(cluster, "sinfo", &["--json"])).expect("sinfo --json is JSON");
    let n = v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == node)
        .unwrap_or_else(|| panic!("sinfo shows {node}: {v}"));
    let flags = n["state_flags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    (
        n["state"].as_str().expect("state").to_owned(),
        flags,
        n["reason"].as_str().unwrap_or("").to_owned(),
    )
}

/// `scontrol show node NODE --oneliner`: (State=, the text after Reason=).
fn scontrol_node(cluster: &SlurmCluster, node: &str) -> (String, String) {
    let line = slurm(cluster, "scontrol", &["show", "node", node, "--oneliner"]);
    let state = line
        .split(' ')
        .find_map(|f| f.strip_prefix("State="))
        .expect("State=")
        .to_owned();
    let reason = line
        .split_once(" Reason=")
        .map(|(_, r)| r.trim().to_owned())
        .unwrap_or_default();
    (state, reason)
}

/// A field of `scontrol show job ID --oneliner` (the test's jobs have no blanks in
/// their names or paths).
fn job_field(cluster: &SlurmCluster, id: u32, key: &str) -> String {
    let line = slurm(
        cluster,
        "scontrol",
        &["show", "job", &id.to_string(), "--oneliner"],
    );
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
        .to_owned()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn hosts(cluster: &SlurmCluster, list: &str) -> BTreeSet<String> {
    if list.is_empty() || list == "(null)" {
        return BTreeSet::new();
    }
    cluster.hostnames(list).into_iter().collect()
}

fn isolation(node: &str, incident: &str, reason: &str) -> Isolation {
    Isolation {
        node: node.to_owned(),
        incident: Some(incident.to_owned()),
        reason: reason.to_owned(),
        by: "policy".to_owned(),
        at: Timestamp(0),
        evict: false,
    }
}

fn release(node: &str) -> Release {
    Release {
        node: node.to_owned(),
        by: "auto-uncordon".to_owned(),
        at: Timestamp(0),
    }
}

fn restart(job: &str, exclude: &[&str]) -> Restart {
    Restart {
        job: job.to_owned(),
        namespace: None,
        exclude: exclude.iter().map(|s| (*s).to_owned()).collect(),
        resume: None,
        incident: Some("inc-9".to_owned()),
        at: Timestamp(0),
    }
}

#[tokio::test]
async fn the_slurm_actuator_drains_resumes_and_requeues_on_a_real_cluster() {
    if !SlurmCluster::available() {
        return;
    }
    let began = Instant::now();
    let cluster = SlurmCluster::start(&Options {
        nodes: 4,
        cred_expire_secs: Some(5),
        ..Options::default()
    });
    let act = SlurmActuator::new(SlurmConfig {
        slurm_conf: Some(cluster.conf().to_owned()),
        ..SlurmConfig::default()
    });

    // Unknown node and job; ids that are no job id never reach Slurm.
    for r in [
        act.isolate(&isolation("n9", "inc-1", "x")).await,
        act.release(&release("n9")).await,
    ] {
        assert!(
            matches!(&r, Err(ActuatorError::NotFound(w)) if w == "node n9"),
            "{r:?}"
        );
    }
    let r = act.restart(&restart("999999", &["n1"])).await;
    assert!(
        matches!(&r, Err(ActuatorError::NotFound(w)) if w == "job 999999"),
        "{r:?}"
    );
    let r = act.restart(&restart("12;true", &["n1"])).await;
    assert!(matches!(&r, Err(ActuatorError::Failed { .. })), "{r:?}");

    // Drain: state DRAIN, Warden's reason on one line.
    let drain = isolation(
        "n1",
        "inc-7",
        "XID 79: GPU has fallen off the bus\n\"again\"",
    );
    let expected = "warden: inc-7: XID 79: GPU has fallen off the bus again";
    assert_eq!(
        act.isolate(&drain).await.expect("drain n1"),
        Outcome::Applied
    );
    let (state, flags, reason) = sinfo_node(&cluster, "n1");
    assert_eq!(
        (state.as_str(), flags, reason.as_str()),
        ("idle", vec!["DRAIN".to_owned()], expected)
    );
    let (state, reason) = scontrol_node(&cluster, "n1");
    assert_eq!(state, "IDLE+DRAIN");
    assert!(
        reason.starts_with(&format!("{expected} [root@")),
        "{reason}"
    );
    assert_eq!(
        act.isolate(&drain).await.expect("drain n1 again"),
        Outcome::AlreadyDone
    );

    // Someone else's drain: left alone, never resumed.
    slurm(
        &cluster,
        "scontrol",
        &[
            "update",
            "NodeName=n2",
            "State=DRAIN",
            "Reason=disk replacement",
        ],
    );
    let theirs = Outcome::NotOurs {
        owner: "root: disk replacement".to_owned(),
    };
    assert_eq!(
        act.isolate(&isolation("n2", "inc-8", "nccl hang"))
            .await
            .expect("drain n2"),
        theirs
    );
    assert_eq!(
        act.release(&release("n2")).await.expect("release n2"),
        theirs
    );
    let (state, flags, reason) = sinfo_node(&cluster, "n2");
    assert_eq!(
        (state.as_str(), flags, reason.as_str()),
        ("idle", vec!["DRAIN".to_owned()], "disk replacement")
    );

    // Resume Warden's own drain; a node in service is already released.
    assert_eq!(
        act.release(&release("n1")).await.expect("release n1"),
        Outcome::Applied
    );
    // Slurm marks a resumed node NOT_RESPONDING until its slurmd registers again.
    let (state, flags, reason) = sinfo_node(&cluster, "n1");
    assert_eq!((state.as_str(), reason.as_str()), ("idle", ""), "{flags:?}");
    assert!(
        flags.iter().all(|f| f == "NOT_RESPONDING"),
        "no longer drained: {flags:?}"
    );
    let (state, reason) = scontrol_node(&cluster, "n1");
    assert!(state == "IDLE" || state == "IDLE+NOT_RESPONDING", "{state}");
    assert_eq!(reason, "");
    cluster.wait_for("n1 to register again", JOB_TIMEOUT, |c| {
        sinfo_node(c, "n1").1.is_empty().then_some(())
    });
    assert_eq!(
        scontrol_node(&cluster, "n1"),
        ("IDLE".to_owned(), String::new())
    );
    assert_eq!(
        act.release(&release("n1")).await.expect("release n1 again"),
        Outcome::AlreadyDone
    );
    assert_eq!(
        act.release(&release("n3")).await.expect("release n3"),
        Outcome::AlreadyDone
    );
    eprintln!("nodes after {:?}", began.elapsed());
    // The other owner gives n2 back.
    slurm(
        &cluster,
        "scontrol",
        &["update", "NodeName=n2", "State=RESUME"],
    );
    cluster.wait_for("n2 to register again", JOB_TIMEOUT, |c| {
        let (state, flags, _) = sinfo_node(c, "n2");
        (state == "idle" && flags.is_empty()).then_some(())
    });

    // A running two-node job that already excludes n4 loses one of its nodes: requeued,
    // it runs again on the only two nodes left.
    let id = cluster.sbatch(&[
        "--job-name=warden-requeue",
        "--nodes=2",
        "--ntasks=2",
        "--exclude=n4",
        "--wrap",
        "srun sleep 300",
    ]);
    let running = cluster.wait_job(id, "running", JOB_TIMEOUT, |j| j.state == "RUNNING");
    let first = hosts(&cluster, &running.nodes);
    assert_eq!(first.len(), 2, "{running:?}");
    let bad = first.iter().next().expect("a node").clone();
    let mut left: BTreeSet<String> = set(&["n1", "n2", "n3"]);
    left.remove(&bad);
    assert_eq!(job_field(&cluster, id, "Restarts"), "0");

    assert_eq!(
        act.restart(&restart(&id.to_string(), &[&bad]))
            .await
            .expect("restart"),
        Outcome::Applied
    );
    assert_eq!(job_field(&cluster, id, "Restarts"), "1");
    let state = job_field(&cluster, id, "JobState");
    // Requeued: COMPLETING while the old processes end, then PENDING.
    assert!(state == "COMPLETING" || state == "PENDING", "{state}");
    assert_eq!(
        hosts(&cluster, &job_field(&cluster, id, "ExcNodeList")),
        set(&["n4", &bad])
    );
    // Asked again while it waits: nothing to do.
    assert_eq!(
        act.restart(&restart(&id.to_string(), &[&bad]))
            .await
            .expect("restart again"),
        Outcome::AlreadyDone
    );
    eprintln!("requeued after {:?}", began.elapsed());
    let again = cluster.wait_job(id, "running again", JOB_TIMEOUT, |j| j.state == "RUNNING");
    assert_eq!(hosts(&cluster, &again.nodes), left, "{again:?}");
    assert_eq!(job_field(&cluster, id, "Restarts"), "1");
    assert_eq!(
        act.restart(&restart(&id.to_string(), &[&bad]))
            .await
            .expect("restart once more"),
        Outcome::AlreadyDone
    );

    eprintln!("ran again after {:?}", began.elapsed());
    // A pending job only gets the exclusion (all four nodes can never be free now).
    let pending = cluster.sbatch(&["--nodes=4", "--wrap", "true"]);
    cluster.wait_job(pending, "pending", JOB_TIMEOUT, |j| j.state == "PENDING");
    assert_eq!(
        act.restart(&restart(&pending.to_string(), &["n3"]))
            .await
            .expect("restart pending"),
        Outcome::Applied
    );
    assert_eq!(job_field(&cluster, pending, "JobState"), "PENDING");
    assert_eq!(job_field(&cluster, pending, "Restarts"), "0");
    assert_eq!(job_field(&cluster, pending, "ExcNodeList"), "n3");
    slurm(
        &cluster,
        "scancel",
        &[&pending.to_string(), &id.to_string()],
    );

    // A completed job is never run again.
    let done = cluster.sbatch(&["--wrap", "true"]);
    cluster.wait_job(done, "completed", JOB_TIMEOUT, |j| j.state == "COMPLETED");
    let r = act.restart(&restart(&done.to_string(), &["n1"])).await;
    assert!(matches!(&r, Err(ActuatorError::Failed { .. })), "{r:?}");
    assert_eq!(job_field(&cluster, done, "JobState"), "COMPLETED");
    assert_eq!(job_field(&cluster, done, "Restarts"), "0");

    eprintln!("Slurm actuator checks took {:?}", began.elapsed());
}

#[tokio::test]
async fn a_slurmctld_that_does_not_answer_is_retried_later() {
    if !SlurmCluster::available() {
        return;
    }
    // A configuration whose slurmctld port nothing listens on.
    let dir = tempfile::tempdir().expect("temp dir");
    let conf = dir.path().join("slurm.conf");
    let mut text = String::new();
    let w = &mut text;
    let _ = writeln!(w, "ClusterName=warden-nobody");
    let _ = writeln!(w, "SlurmctldHost=localhost(127.0.0.1)");
    let _ = writeln!(w, "SlurmctldPort={}", support::free_port());
    let _ = writeln!(w, "NodeName=n1 CPUs=1 State=UNKNOWN");
    let _ = writeln!(w, "PartitionName=debug Nodes=n1 Default=YES");
    std::fs::write(&conf, text).expect("write slurm.conf");

    // Slurm gives up after its own retries ("Unable to contact slurm controller").
    let act = SlurmActuator::new(SlurmConfig {
        slurm_conf: Some(conf.clone()),
        ..SlurmConfig::default()
    });
    let r = act.isolate(&isolation("n1", "inc-1", "x")).await;
    assert!(
        matches!(&r, Err(ActuatorError::Retry { why, .. }) if why.contains("Unable to contact")),
        "{r:?}"
    );
    // Or the actuator's timeout ends the command first.
    let act = SlurmActuator::new(SlurmConfig {
        slurm_conf: Some(conf),
        command_timeout_secs: 1,
        ..SlurmConfig::default()
    });
    let began = Instant::now();
    let r = act.restart(&restart("12", &["n1"])).await;
    // The timeout's own answer, naming the configured limit: the command was cut short
    // at 1 s.
    assert!(
        matches!(&r, Err(ActuatorError::Retry { why, .. })
            if why.contains("did not finish within 1s")),
        "{r:?}"
    );
    eprintln!(
        "a restart against a silent slurmctld gave up after {:?} (timeout 1 s)",
        began.elapsed()
    );
}
