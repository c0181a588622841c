//! The Slurm job hook on a real Slurm cluster (issue 8): slurmctld runs
//! deploy/slurm/prolog.sh and epilog.sh as PrologSlurmctld/EpilogSlurmctld, they report to
//! a real `warden-controller`, and `GET /api/v1/jobs` shows each job running on the nodes
//! Slurm gave it, then ended, with the exit code or signal Slurm gave the epilog. A
//! controller that is down or never answers delays a job by at most the hook's timeout
//! and never fails it. docs/SLURM-TESTS.md says how to run it.

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::Controller;
use support::slurm::{JobInfo, Options, SlurmCluster};
use warden_testkit::PATIENCE;

/// Long enough for what a job of a few seconds needs on a busy two-core machine.
const JOB_TIMEOUT: Duration = PATIENCE;

/// Poll the controller until `job`'s entry satisfies `ok`; panics with the last entry
/// and the cluster's logs at the deadline.
fn wait_view(
    ctl: &Controller,
    cluster: &SlurmCluster,
    job: u32,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = None;
    let seen = warden_testkit::poll(JOB_TIMEOUT, || {
        last = ctl.job(&job.to_string());
        last.as_ref().filter(|v| ok(v)).cloned()
    });
    seen.unwrap_or_else(|| {
        panic!(
            "job {job}: the controller never showed it {what}; last: {last:?}\n{}",
            cluster.logs()
        )
    })
}

/// A batch script that waits until `go` exists (the test has seen the job run), then
/// runs `then`: the job cannot end before the test has looked.
fn held(go: &Path, then: &str) -> String {
    format!(
        "while [ ! -e {go} ]; do sleep 0.2; done; {then}",
        go = go.display()
    )
}

/// While `id` runs the controller shows it running on exactly the nodes Slurm gave it;
/// once Slurm says it completed, the controller shows it ended. The job waits for `go`
/// (see [`held`]), which this creates once it has seen the job running.
fn check_job(ctl: &Controller, cluster: &SlurmCluster, id: u32, name: &str, ranks: u64, go: &Path) {
    let running = cluster.wait_job(id, "running", JOB_TIMEOUT, |j| j.state == "RUNNING");
    let nodes = cluster.hostnames(&running.nodes);
    assert_eq!(nodes.len() as u64, ranks, "one rank per node: {running:?}");

    let v = wait_view(ctl, cluster, id, "running", |v| v["phase"] == "running");
    // The job is held until the test lets it go: the controller saw it while it ran.
    let now = cluster.job(id).expect("Slurm knows the job");
    assert_eq!(now.state, "RUNNING", "{now:?}");
    assert_eq!(v["scheduler"], "slurm", "{v}");
    assert_eq!(v["scheduler_job_id"], id.to_string(), "{v}");
    assert_eq!(v["scheduler_job_name"], name, "{v}");
    assert_eq!(v["expected_nodes"], serde_json::json!(nodes), "{v}");
    assert_eq!(v["expected_ranks"].as_u64(), Some(ranks), "{v}");
    assert_eq!(v["ended_s"], Value::Null, "{v}");
    let started = v["started_s"].as_f64().expect("started_s");
    std::fs::write(go, "").expect("let the job go on");

    let done = cluster.wait_job(id, "finished", JOB_TIMEOUT, JobInfo::finished);
    assert_eq!(
        (done.state.as_str(), done.exit_code),
        ("COMPLETED", Some(0)),
        "{done:?}"
    );
    let v = ended_as(ctl, cluster, id, serde_json::json!([0, null, 0, null]));
    let ended = v["ended_s"].as_f64().expect("ended_s");
    assert!(
        ended >= started + 2.0,
        "ran 3 s at least: started {started}, ended {ended}"
    );
    assert_eq!(v["open_incidents"], 0, "{v}");
}

/// Wait until the controller shows job `id` ended, and check how: `want` is
/// `[exit_code, signal, derived_exit_code, derived_signal]` as the job view has them.
fn ended_as(ctl: &Controller, cluster: &SlurmCluster, id: u32, want: Value) -> Value {
    let v = wait_view(ctl, cluster, id, "ended", |v| v["phase"] == "ended");
    let got = serde_json::json!([
        v["exit_code"],
        v["signal"],
        v["derived_exit_code"],
        v["derived_signal"]
    ]);
    assert_eq!(got, want, "job {id}: {v}");
    v
}

#[test]
fn the_controller_sees_slurm_jobs_start_and_end() {
    if !SlurmCluster::available() {
        return;
    }
    let began = Instant::now();
    let ctl = Controller::start();
    let cluster = SlurmCluster::start(&Options {
        nodes: 4,
        job_hook: Some(ctl.url()),
        ..Options::default()
    });
    let gates = tempfile::tempdir().expect("temp dir");
    let go = gates.path().join("one");
    let one = cluster.sbatch(&["--job-name=warden-one", "--wrap", &held(&go, "sleep 3")]);
    check_job(&ctl, &cluster, one, "warden-one", 1, &go);
    let go = gates.path().join("two");
    let two = cluster.sbatch(&[
        "--job-name=warden-two",
        "--nodes=2",
        "--ntasks=2",
        "--wrap",
        &held(&go, "srun sleep 3"),
    ]);
    check_job(&ctl, &cluster, two, "warden-two", 2, &go);

    // How a job ended reaches the controller: the batch script's exit code, the signal
    // that killed it, and the worst step's exit code when the script itself went on.
    // slurmctld counts a step's exit code into the job's derived one when the step's
    // completion message reaches it, which on a busy machine can be after the batch
    // script has ended and the end hook has run: the script goes on a while after its
    // failed step, as a real one does.
    let endings = [
        ("exit 3", serde_json::json!([3, null, 0, null])),
        ("kill -9 $$", serde_json::json!([null, 9, 0, null])),
        (
            "srun false; sleep 2; exit 0",
            serde_json::json!([0, null, 1, null]),
        ),
    ];
    for (script, want) in &endings {
        let id = cluster.sbatch(&["--wrap", script]);
        let done = cluster.wait_job(id, "finished", JOB_TIMEOUT, JobInfo::finished);
        eprintln!("`{script}`: Slurm says {done:?}");
        ended_as(&ctl, &cluster, id, want.clone());
    }

    let metrics = ctl.metrics();
    let jobs = 2 + endings.len();
    for event in ["start", "end"] {
        let series = format!(
            "warden_job_lifecycle_events_total{{event=\"{event}\",scheduler=\"slurm\"}} {jobs}"
        );
        assert!(metrics.contains(&series), "{series} missing:\n{metrics}");
    }
    eprintln!("Slurm acceptance took {:?}", began.elapsed());
}

#[test]
fn a_job_whose_controller_is_down_or_silent_still_runs_and_completes() {
    if !SlurmCluster::available() {
        return;
    }
    // Nothing listens here.
    let down = format!("http://127.0.0.1:{}", support::free_port());
    let cluster = SlurmCluster::start(&Options {
        nodes: 1,
        job_hook: Some(down),
        ..Options::default()
    });
    let id = cluster.sbatch(&["--wrap", "true"]);
    let done = cluster.wait_job(id, "finished", JOB_TIMEOUT, JobInfo::finished);
    assert_eq!(
        (done.state.as_str(), done.exit_code),
        ("COMPLETED", Some(0)),
        "{done:?}"
    );

    // A controller that accepts connections and never answers: the hook gives up
    // after its timeout (2 s here) and the job goes on. The connections show that the
    // hook did run, at the start and at the end.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("address"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            seen.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    cluster.set_controller_url(&url);
    let began = Instant::now();
    let id = cluster.sbatch(&["--wrap", "true"]);
    let done = cluster.wait_job(id, "finished", JOB_TIMEOUT, JobInfo::finished);
    assert_eq!(
        (done.state.as_str(), done.exit_code),
        ("COMPLETED", Some(0)),
        "{done:?}"
    );
    cluster.wait_for("the epilog's connection", JOB_TIMEOUT, |_| {
        (accepted.load(Ordering::SeqCst) >= 2).then_some(())
    });
    // The stated bound: two hook runs of 2 s each, and the job's own few seconds, with
    // room to spare; a slower machine is given more through WARDEN_TEST_PATIENCE.
    let took = began.elapsed();
    eprintln!("a job with a silent controller took {took:?}");
    let bound = warden_testkit::scaled(Duration::from_secs(30));
    assert!(
        took < bound,
        "bounded by the hook's timeout: {took:?}, over {bound:?}"
    );
}
