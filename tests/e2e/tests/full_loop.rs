//! The full loop: a real torchrun job on a real Slurm cluster hits a fault; Warden finds
//! it, says why, drains the node, requeues the job without it, and the job resumes from
//! its last complete checkpoint and finishes. Four scenarios, each from a clean start
//! (`warden_e2e::FullLoop`): (a) a rank on gpu-node02 stopped with SIGSTOP, (b) an
//! XID 79 in gpu-node03's kernel log, (c) an exception in user code (notify only), (d) a
//! clean run (nothing at all). For each, the incident, its timeline and every action are
//! read back from PostgreSQL, the webhook behind Alertmanager got the alert (and its
//! resolution), and Prometheus has the incident metric. Each prints a `REPORT` line:
//! detection, isolation and restart times, and the steps of work lost.
//!
//! The scenarios run one at a time (they share the machine's two cores).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use warden_e2e::{FullLoop, Job, PATIENCE, Tools, now_s, poll, scaled};

/// One scenario at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Steps of the job, and its checkpoint interval.
const STEPS: u64 = 200;
const CKPT_EVERY: u32 = 20;
/// The step after which faults are injected: past the hang detector's warm-up (32
/// collectives per communicator) and a few checkpoints in.
const FAULT_AFTER: u64 = 65;
/// torch's start on a loaded two-core machine: six processes importing it at once.
const START_LIMIT: Duration = Duration::from_secs(300);

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_default()
}

fn strings(v: &Value, k: &str) -> Vec<String> {
    v[k].as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Wait for `what`, or fail with everything the loop can say.
fn wait<T>(
    l: &FullLoop,
    job: &Job,
    what: &str,
    limit: Duration,
    f: impl FnMut() -> Option<T>,
) -> T {
    match poll(limit, f) {
        Some(v) => v,
        None => panic!(
            "timed out after {:?} waiting for {what}\n{}",
            scaled(limit),
            l.state(Some(job))
        ),
    }
}

/// Start the job and wait until it is past [`FAULT_AFTER`]; returns its nodes.
fn start_job(l: &mut FullLoop, args: &[&str]) -> (Job, Vec<String>) {
    let job = l.submit(CKPT_EVERY, args);
    let slurm_job = wait(l, &job, "the job running", START_LIMIT, || {
        l.slurm.job(job.id).filter(|j| j.state == "RUNNING")
    });
    let nodes = l.slurm.hostnames(&slurm_job.nodes);
    (job, nodes)
}

/// A fresh loop whose job of [`STEPS`] steps runs on `node` (among others) and is past
/// [`FAULT_AFTER`]; `None` when the loop cannot run here.
fn running_on(node: &str) -> Option<(FullLoop, Job)> {
    let tools = Tools::find()?;
    let mut l = FullLoop::start(&tools);
    let steps = STEPS.to_string();
    let (job, nodes) = start_job(&mut l, &["--steps", &steps]);
    assert!(nodes.iter().any(|n| n == node), "{nodes:?}");
    l.wait_step(&job, FAULT_AFTER, START_LIMIT);
    Some((l, job))
}

/// The timeline entries of incident `id` in PostgreSQL, in order.
fn stored_timeline(l: &FullLoop, id: &str) -> Vec<String> {
    l.db.rows(&format!(
        "SELECT what FROM incident_timeline WHERE incident_id = '{id}' ORDER BY seq"
    ))
    .into_iter()
    .filter_map(|r| r.into_iter().next())
    .collect()
}

/// `(kind, target, status, result)` of every action in PostgreSQL, oldest first.
fn stored_actions(l: &FullLoop) -> Vec<(String, String, String, String, String)> {
    l.db.rows(
        "SELECT kind, target, status, COALESCE(result, ''), COALESCE(incident_id, '') \
         FROM actions ORDER BY intended_at",
    )
    .into_iter()
    .map(|r| {
        let f = |i: usize| r.get(i).cloned().unwrap_or_default();
        (f(0), f(1), f(2), f(3), f(4))
    })
    .collect()
}

/// What a scenario that isolates and restarts measured.
struct Measured {
    detection: f64,
    isolation: f64,
    restart: f64,
    running_again: f64,
    resumed_from: u64,
    reached_before: u64,
    lost_said: String,
}

/// The part of (a) and (b) after detection: diagnosis, drain, requeue, resume, finish,
/// resolution, and the record in PostgreSQL, the webhook and Prometheus.
fn the_loop_closes(
    l: &mut FullLoop,
    job: &Job,
    incident: &Value,
    bad: &str,
    t0: f64,
    kind: &str,
) -> Measured {
    let id = text(incident, "id").to_owned();
    let detection = incident["detected_s"].as_f64().unwrap_or(f64::MAX) - t0;

    // The diagnosis is attached.
    let diagnosed = wait(l, job, "the diagnosis attached", PATIENCE, || {
        l.incident(&id).filter(|i| !i["diagnosis"].is_null())
    });
    let diagnosis = diagnosed["diagnosis"].clone();

    // The node is drained in Slurm with the incident in the reason.
    let isolate = wait(l, job, "the isolate action", PATIENCE, || {
        l.actions()
            .into_iter()
            .find(|a| text(a, "kind") == "isolate" && text(a, "target") == bad)
            .filter(|a| a["finished_at"].as_i64().is_some())
    });
    assert_eq!(
        text(&isolate, "result"),
        format!("drain {bad}: done"),
        "{isolate}"
    );
    let node = l.node_line(bad);
    assert!(node.contains("DRAIN"), "{node}");
    assert!(node.contains(&format!("Reason=warden: {id}")), "{node}");

    // The job is requeued without it.
    let restart = wait(l, job, "the restart action", PATIENCE, || {
        l.actions()
            .into_iter()
            .find(|a| text(a, "kind") == "restart")
            .filter(|a| a["finished_at"].as_i64().is_some())
    });
    let result = text(&restart, "result").to_owned();
    assert_eq!(text(&restart, "target"), job.id.to_string(), "{restart}");
    assert!(result.contains(&format!("without {bad}")), "{result}");
    assert!(result.contains("megatron"), "{result}");
    let lost_said = result.rsplit("; ").next().unwrap_or_default().to_owned();
    assert!(lost_said.ends_with("steps of work lost"), "{result}");
    assert!(l.job_field(job, "ExcNodeList").contains(bad));

    // Running again elsewhere, resumed from the latest complete checkpoint, and
    // finished with a finite loss.
    let again = wait(l, job, "the job running again", START_LIMIT, || {
        let j = l.slurm.job(job.id)?;
        (j.state == "RUNNING" && l.job_field(job, "Restarts") == "1").then_some(j)
    });
    let hosts = l.slurm.hostnames(&again.nodes);
    assert!(!hosts.iter().any(|h| h == bad), "{hosts:?} avoids {bad}");
    let done = wait(l, job, "the job finished", START_LIMIT, || {
        l.slurm.job(job.id).filter(|j| j.finished())
    });
    assert_eq!(done.state, "COMPLETED", "{done:?}\n{}", l.state(Some(job)));
    let logs = l.job_logs(job, 400);
    let resumed_from: u64 = logs
        .lines()
        .find_map(|x| x.split("resumed from checkpoint step ").nth(1))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no resume in the job's output:\n{logs}"));
    let final_loss: f64 = logs
        .lines()
        .find_map(|x| {
            x.contains(&format!("done: {STEPS} steps"))
                .then(|| x.split("final loss ").nth(1))
                .flatten()
        })
        .and_then(|s| s.split(',').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no final step in the job's output:\n{logs}"));
    assert!(final_loss.is_finite(), "final loss {final_loss}");
    assert!(
        result.contains(&format!(
            "iter_{resumed_from:07} (step {resumed_from}, megatron)"
        )),
        "the job resumed from step {resumed_from}; Warden said: {result}"
    );

    // Steps: the last one the first run finished, then where the second began.
    let steps = l.steps(job);
    // The second run starts where the step number falls back, or (when the first
    // run saved the checkpoint it resumes from just before it was killed) after the
    // restart's pause, seconds long where steps take a fraction of one.
    let split = steps
        .windows(2)
        .position(|w| w[1].0 <= w[0].0 || w[1].1 - w[0].1 > 3.0)
        .unwrap_or_else(|| panic!("no restart in the step log: {steps:?}"));
    let reached_before = steps[split].0;
    let (first_again, running_again_at) = steps[split + 1];
    assert_eq!(first_again, resumed_from + 1, "{steps:?}");
    assert_eq!(steps.last().map(|s| s.0), Some(STEPS));

    // The incident resolves once the fault's findings stop; the webhook behind
    // Alertmanager got it firing and resolved.
    wait(l, job, "the incident resolved", 3 * PATIENCE, || {
        l.incident(&id).filter(|i| text(i, "state") == "resolved")
    });
    let notes = wait(
        l,
        job,
        "the alert and its resolution at the webhook",
        PATIENCE,
        || {
            let got = l.webhook.about(&id);
            let firing = got.iter().any(|(s, _)| s == "firing");
            let resolved = got.iter().any(|(s, _)| s == "resolved");
            (firing && resolved).then_some(got)
        },
    );
    assert_eq!(notes[0].0, "firing", "{notes:?}");

    // PostgreSQL holds the incident, its whole timeline and every action. The store is
    // written by the detector pass after a change (a remediation note of one pass is
    // written by the next), so it can trail what the API just showed: wait for the
    // stored state read below; if it never comes, the assertions say what is missing.
    let needles = [
        "diagnos".to_owned(),
        format!("drain {bad}: done"),
        result.clone(),
        format!("verified: job {} runs again on ", job.id),
        "resolved".to_owned(),
    ];
    let stored_incident = || {
        l.db.rows(&format!(
            "SELECT kind, job, state, nodes FROM incidents WHERE id = '{id}'"
        ))
    };
    let stored_diagnoses = || {
        l.db.rows(&format!(
            "SELECT source FROM diagnoses WHERE incident_id = '{id}'"
        ))
    };
    let _ = poll(PATIENCE, || {
        let resolved = stored_incident()
            .iter()
            .any(|r| r.get(2).is_some_and(|s| s == "resolved"));
        let timeline = stored_timeline(l, &id);
        let complete = needles
            .iter()
            .all(|n| timeline.iter().any(|w| w.contains(n.as_str())));
        (resolved && complete && !stored_diagnoses().is_empty()).then_some(())
    });
    let rows = stored_incident();
    assert_eq!(
        rows,
        vec![vec![
            kind.to_owned(),
            job.id.to_string(),
            "resolved".to_owned(),
            format!(",{bad},")
        ]],
        "the stored incident; its timeline: {:#?}\n{}",
        stored_timeline(l, &id),
        l.state(Some(job))
    );
    let timeline = stored_timeline(l, &id);
    for needle in &needles {
        assert!(
            timeline.iter().any(|w| w.contains(needle.as_str())),
            "{needle:?} not in the stored timeline {timeline:#?}"
        );
    }
    let stored = stored_actions(l);
    let api: Vec<(String, String)> = l
        .actions()
        .iter()
        .map(|a| (text(a, "kind").to_owned(), text(a, "target").to_owned()))
        .collect();
    assert_eq!(stored.len(), api.len(), "{stored:?} / {api:?}");
    assert_eq!(
        stored
            .iter()
            .map(|a| (a.0.as_str(), a.1.as_str(), a.2.as_str(), a.4.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("isolate", bad, "done", id.as_str()),
            ("restart", job.id.to_string().as_str(), "done", id.as_str()),
        ],
        "stored actions"
    );
    let stored_diag = stored_diagnoses();
    assert!(!stored_diag.is_empty(), "no stored diagnosis: {diagnosis}");

    // Prometheus scraped the incident.
    let q = format!("warden_incidents_total{{kind=\"{kind}\"}}");
    wait(
        l,
        job,
        "the incident metric in Prometheus",
        PATIENCE,
        || l.prom_value(&q).filter(|v| *v >= 1.0),
    );

    let at = |a: &Value| a["finished_at"].as_i64().unwrap_or(0) as f64 / 1e9 - t0;
    Measured {
        detection,
        isolation: at(&isolate),
        restart: at(&restart),
        running_again: running_again_at - t0,
        resumed_from,
        reached_before,
        lost_said,
    }
}

fn report(scenario: &str, m: &Measured) {
    eprintln!(
        "REPORT {scenario}: detection {:.2} s, isolation {:.2} s, restart requested {:.2} s, \
         first step after the restart {:.2} s (all after the fault); steps lost {} \
         (reached step {}, resumed from the checkpoint at {}; Warden said \"{}\")",
        m.detection,
        m.isolation,
        m.restart,
        m.running_again,
        m.reached_before - m.resumed_from,
        m.reached_before,
        m.resumed_from,
        m.lost_said
    );
}

#[test]
fn a_a_stopped_rank_is_found_isolated_and_the_job_finishes_without_its_node() {
    let _one = serial();
    let bad = "gpu-node02";
    let Some((mut l, job)) = running_on(bad) else {
        return;
    };
    let (rank, pid) = l.ranks_on(&job, bad)[0];
    let t0 = now_s();
    l.signal(pid, "-STOP");
    let incident = wait(&l, &job, "a hang incident", PATIENCE, || {
        l.incidents(&job)
            .into_iter()
            .find(|i| text(i, "kind") == "hang")
    });
    assert_eq!(strings(&incident, "nodes"), [bad], "{incident}");
    assert!(
        incident["ranks"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x.as_u64() == Some(u64::from(rank)))),
        "rank {rank}: {incident}"
    );
    // The detection time is reported, not asserted: the hang bound is learned from the
    // job's own collective waits, which stretch when the machine is busy.
    let m = the_loop_closes(&mut l, &job, &incident, bad, t0, "hang");
    report("(a) SIGSTOP of a rank on gpu-node02", &m);
    l.check_alive();
}

#[test]
fn b_an_xid_79_is_found_isolated_and_the_job_finishes_without_its_node() {
    let _one = serial();
    let bad = "gpu-node03";
    let Some((mut l, job)) = running_on(bad) else {
        return;
    };
    let t0 = now_s();
    l.inject_kernel_line(
        bad,
        "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has \
         fallen off the bus.",
    );
    let incident = wait(&l, &job, "a gpu_fault incident", PATIENCE, || {
        l.incidents(&job)
            .into_iter()
            .find(|i| text(i, "kind") == "gpu_fault")
    });
    assert_eq!(strings(&incident, "nodes"), [bad], "{incident}");
    let m = the_loop_closes(&mut l, &job, &incident, bad, t0, "gpu_fault");
    report("(b) XID 79 on gpu-node03", &m);
    l.check_alive();
}

#[test]
fn c_an_exception_in_user_code_is_diagnosed_and_only_notified() {
    let _one = serial();
    let Some(tools) = Tools::find() else {
        return;
    };
    let mut l = FullLoop::start(&tools);
    let steps = STEPS.to_string();
    let fault_step = (FAULT_AFTER - 20).to_string();
    let (job, _) = start_job(
        &mut l,
        &[
            "--steps",
            &steps,
            "--fault",
            "raise",
            "--fault-rank",
            "3",
            "--fault-step",
            &fault_step,
        ],
    );
    let done = wait(&l, &job, "the job failed", START_LIMIT, || {
        l.slurm.job(job.id).filter(|j| j.finished())
    });
    assert_eq!(done.state, "FAILED", "{done:?}");
    let incident = wait(&l, &job, "a diagnosed incident", PATIENCE, || {
        l.incidents(&job)
            .into_iter()
            .find(|i| i["diagnosis"]["category"].as_str() == Some("user_code_error"))
    });
    let id = text(&incident, "id").to_owned();
    assert_eq!(text(&incident, "kind"), "crash", "{incident}");
    assert_eq!(
        incident["diagnosis"]["fault_locus"].as_str(),
        Some("user-code"),
        "{incident}"
    );
    // The policy notifies and does nothing else.
    wait(&l, &job, "the policy's decision", PATIENCE, || {
        l.incident(&id).filter(|i| {
            i["timeline"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|e| text(e, "what").contains("policy rule user-code calls for notify"))
            })
        })
    });
    wait(&l, &job, "the alert at the webhook", PATIENCE, || {
        l.webhook
            .about(&id)
            .iter()
            .any(|(s, _)| s == "firing")
            .then_some(())
    });
    // The store is written by the detector pass after the one that decided (the tick
    // loop persists, then remediates, in turn), so once the decision is stored the
    // deciding pass, with anything it did, is over: a barrier for the checks that
    // nothing was done. The incident and its diagnosis are stored by then too; if they
    // never are, the assertions below say which is missing.
    let stored_incident = || {
        l.db.rows(&format!(
            "SELECT kind, job FROM incidents WHERE id = '{id}'"
        ))
    };
    let stored_diagnoses = || {
        l.db.rows(&format!(
            "SELECT category FROM diagnoses WHERE incident_id = '{id}'"
        ))
    };
    let _ = poll(PATIENCE, || {
        let decided = stored_timeline(&l, &id)
            .iter()
            .any(|w| w.contains("calls for notify"));
        let diagnosed = stored_diagnoses()
            .iter()
            .any(|r| r.first().is_some_and(|c| c == "user_code_error"));
        (decided && diagnosed && !stored_incident().is_empty()).then_some(())
    });
    let timeline = stored_timeline(&l, &id);
    assert!(
        timeline.iter().any(|w| w.contains("calls for notify")),
        "{timeline:#?}\n{}",
        l.state(Some(&job))
    );
    assert!(stored_actions(&l).is_empty(), "{:?}", stored_actions(&l));
    assert!(l.actions().is_empty());
    let states = l.slurm.node_states();
    assert!(
        states.values().all(|s| !s.contains("drain")),
        "no node drained: {states:?}"
    );
    assert_eq!(l.job_field(&job, "Restarts"), "0");
    let rows = stored_incident();
    assert_eq!(rows, vec![vec!["crash".to_owned(), job.id.to_string()]]);
    let stored_diag = stored_diagnoses();
    assert!(
        stored_diag.iter().any(|r| r[0] == "user_code_error"),
        "{stored_diag:?}"
    );
    wait(&l, &job, "the crash metric in Prometheus", PATIENCE, || {
        l.prom_value("warden_incidents_total{kind=\"crash\"}")
            .filter(|v| *v >= 1.0)
    });
    let at = |k: &str| incident[k].as_f64().unwrap_or(0.0);
    eprintln!(
        "REPORT (c) exception in user code on rank 3: crash incident detected {:.2} s after \
         the rank exited, diagnosed user_code_error (user-code); notify only: no action, no \
         drain, no restart",
        at("detected_s") - at("onset_s")
    );
    l.check_alive();
}

#[test]
fn d_a_clean_run_has_no_incident_and_no_action() {
    let _one = serial();
    let Some(tools) = Tools::find() else {
        return;
    };
    let mut l = FullLoop::start(&tools);
    // Each step's compute is mostly a wait on the device (a sleep), as in a GPU job.
    // With the 50 ms default most of a step is the ranks' own CPU work, and on two busy
    // cores one rank can run 1.3x slower for many steps: a real straggler, not a clean
    // run.
    let (job, _) = start_job(&mut l, &["--steps", "120", "--compute-ms", "250"]);
    let done = wait(&l, &job, "the job finished", START_LIMIT, || {
        l.slurm.job(job.id).filter(|j| j.finished())
    });
    assert_eq!(done.state, "COMPLETED", "{done:?}\n{}", l.state(Some(&job)));
    assert!(l.job_logs(&job, 50).contains("done: 120 steps"));
    // The job's end is past; anything the detectors would say, they have said.
    // A negative check with no barrier to wait for (nothing is expected to happen): the
    // pause cannot cause a false failure, only give a false incident time to show.
    std::thread::sleep(Duration::from_secs(5));
    let incidents = l.incidents(&job);
    assert!(incidents.is_empty(), "{incidents:?}");
    assert!(
        l.db.rows("SELECT id FROM incidents").is_empty(),
        "stored incidents"
    );
    assert!(stored_actions(&l).is_empty(), "{:?}", stored_actions(&l));
    assert!(
        l.webhook.received().is_empty(),
        "{:?}",
        l.webhook.received()
    );
    // Slurm gives the nodes back once the job's epilogs are done: every node returns to
    // idle, none drained.
    wait(&l, &job, "every node idle", PATIENCE, || {
        l.slurm
            .node_states()
            .values()
            .all(|s| s == "idle")
            .then_some(())
    });
    // Prometheus scrapes the controller, and no incident was ever counted.
    wait(
        &l,
        &job,
        "Prometheus scraping the controller",
        PATIENCE,
        || {
            l.prom_value("up{job=\"warden-controller\"}")
                .filter(|v| *v == 1.0)
        },
    );
    let opened = l.prom_value("sum(warden_incidents_total)").unwrap_or(0.0);
    assert_eq!(opened, 0.0);
    eprintln!(
        "REPORT (d) clean run: 120 steps, {} finished, no incident, no action, no alert",
        l.steps(&job).len()
    );
    l.check_alive();
}
