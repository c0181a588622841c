//! Remediation's safety rails with the real binary and a real actuator (the script
//! actuator running a shell script that records each request): a storm where 60 % of
//! the nodes report fatal GPU faults at once isolates no more than the circuit
//! breaker's cap, trips it (recorded in the audit log, shown by the API and the
//! `warden_remediation_breaker_tripped` metric the shipped alert rule fires on), keeps
//! it tripped across a restart, and acts again only after an admin resets it. The
//! default install only records what it would do. An action is listed as intended, with
//! no result, for as long as its actuator runs.

mod support;

use std::ffi::OsStr;
use std::path::Path;

use support::ctl::{Ctl, count, finished};
use warden_testkit::{PATIENCE, wait_for, wait_until};

const NODES: usize = 10;

/// A script actuator that appends each request to `log` and succeeds.
fn recorder(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    support::recording_actuator(
        dir,
        "",
        "$WARDEN_ACTION $WARDEN_NODE $WARDEN_EVICT $WARDEN_INCIDENT",
    )
}

fn start(dir: &Path, config: &Path) -> Ctl {
    Ctl::start(
        &[
            OsStr::new("--data-dir"),
            dir.as_os_str(),
            OsStr::new("--config"),
            config.as_os_str(),
        ],
        None,
    )
}

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every node is known; then `faulty` of them report a fatal XID at once.
fn storm(c: &Ctl, faulty: usize) {
    for i in 0..NODES {
        c.ingest_heartbeat(&format!("node-{i}"), 1);
    }
    wait_until("all nodes known", PATIENCE, || {
        c.get("/api/v1/nodes")
            .as_array()
            .is_some_and(|n| n.len() == NODES)
    });
    for i in 0..faulty {
        c.ingest_xid(&format!("node-{i}"), 2);
    }
}

#[test]
fn a_fault_storm_isolates_no_more_than_the_breaker_allows_and_trips_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (script, log) = recorder(dir.path());
    let config = dir.path().join("controller.yaml");
    std::fs::write(
        &config,
        format!(
            "remediation:\n  dry_run: false\n  actuator: script\n  script:\n    program: {}\n  \
             breaker:\n    max_nodes: 5\n    max_percent: 20\n    window: 1h\n",
            script.display()
        ),
    )
    .expect("write config");
    let c = start(dir.path(), &config);
    let faulty = NODES * 6 / 10;
    storm(&c, faulty);
    wait_until(
        "six incidents decided and the breaker tripped",
        PATIENCE,
        || {
            let incidents = c.incidents();
            c.get("/api/v1/remediation")["tripped"] == true
                && incidents.len() == faulty
                && incidents.iter().all(|i| {
                    i["timeline"].as_array().is_some_and(|t| {
                        t.iter().any(|e| {
                            e["what"]
                                .as_str()
                                .is_some_and(|w| w.contains("policy rule"))
                        })
                    })
                })
        },
    );
    // The cap: 20 % of 10 nodes, below max_nodes.
    let status = c.get("/api/v1/remediation");
    assert_eq!(status["breaker_cap"], 2, "{status}");
    assert_eq!(status["isolated_in_window"], 2, "{status}");
    assert_eq!(status["dry_run"], false);
    assert!(
        status["tripped_reason"]
            .as_str()
            .is_some_and(|r| r.contains("over the cap of 2")),
        "{status}"
    );
    let done = lines(&log);
    assert_eq!(
        done.len(),
        2,
        "the actuator ran exactly the cap's isolations: {done:?}"
    );
    assert!(
        done.iter()
            .all(|l| l.starts_with("isolate node-") && l.contains(" true inc-"))
    );
    // The trip is in the audit log once, and isolations number the cap.
    let actions = c.actions();
    let trips: Vec<_> = actions
        .iter()
        .filter(|a| a["kind"] == "breaker_trip")
        .collect();
    assert_eq!(trips.len(), 1, "{actions:?}");
    assert_eq!(actions.iter().filter(|a| a["kind"] == "isolate").count(), 2);
    // Later incidents say why nothing was done.
    let blocked = c
        .incidents()
        .iter()
        .filter(|i| {
            i["timeline"].as_array().is_some_and(|t| {
                t.iter().any(|e| {
                    e["what"]
                        .as_str()
                        .is_some_and(|w| w.contains("circuit breaker is tripped"))
                })
            })
        })
        .count();
    assert_eq!(
        blocked, 3,
        "six faults: two isolated, one tripped it, three refused"
    );
    // The metric the shipped alert rule fires on (published at the end of the pass
    // that tripped the breaker, after the trip itself shows).
    wait_until("the breaker metric", PATIENCE, || {
        support::http_get(c.port, "/metrics").is_some_and(|(_, m)| {
            m.lines()
                .any(|l| l == "warden_remediation_breaker_tripped 1")
        })
    });
    c.kill();

    // Still tripped after a restart: it waits for a person; a person's drain goes
    // through the same rails and is refused too.
    let c = start(dir.path(), &config);
    assert_eq!(c.get("/api/v1/remediation")["tripped"], true);
    let (status, body) = c.call(
        "POST",
        "/api/v1/nodes/node-8/drain",
        "application/json",
        br#"{"reason":"fans failing"}"#,
    );
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("circuit breaker is tripped"), "{body}");
    let (status, body) = c.call(
        "POST",
        "/api/v1/remediation/breaker/reset",
        "application/json",
        br#"{"reason":"the storm was a bad driver push; nodes checked"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let after = c.get("/api/v1/remediation");
    assert_eq!(after["tripped"], false, "{after}");
    assert_eq!(after["isolated_in_window"], 0);
    assert_eq!(count(&c.actions(), "breaker_reset", "breaker").len(), 1);
    // A second reset has nothing to reset.
    let (status, _) = c.call(
        "POST",
        "/api/v1/remediation/breaker/reset",
        "application/json",
        br#"{"reason":"again"}"#,
    );
    assert_eq!(status, 409);
    // A new fault is acted on again (once the agents are heard from again, the cap is
    // 20 % of ten nodes once more; right after a start it is smaller).
    for i in 0..NODES {
        c.ingest_heartbeat(&format!("node-{i}"), 3);
    }
    c.ingest_xid("node-9", 4);
    wait_until("the new fault isolated", PATIENCE, || {
        lines(&log).len() == 3
    });
    assert!(lines(&log)[2].starts_with("isolate node-9 true"));
    // A person's drain and undrain go through the same actuator.
    let (status, body) = c.call(
        "POST",
        "/api/v1/nodes/node-8/drain",
        "application/json",
        br#"{"reason":"fans failing"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = c.call(
        "DELETE",
        "/api/v1/nodes/node-8/drain",
        "application/json",
        br#"{"reason":"fans replaced"}"#,
    );
    assert_eq!(status, 204, "{body}");
    let done = lines(&log);
    assert_eq!(done[3], "isolate node-8 true ", "{done:?}");
    assert_eq!(done[4], "release node-8  ", "{done:?}");
    let drains = count(&c.actions(), "drain", "node-8");
    assert_eq!(drains.len(), 1);
    assert_eq!(drains[0]["result"], "drained; script: drained");
    // The cap holds for people too: node-9 and node-8 fill it (2 of 10).
    let (status, body) = c.call(
        "POST",
        "/api/v1/nodes/node-7/drain",
        "application/json",
        br#"{"reason":"one more"}"#,
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("over the circuit breaker's cap of 2"),
        "{body}"
    );
    c.kill();
}

#[test]
fn the_default_install_only_records_what_it_would_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (script, log) = recorder(dir.path());
    let config = dir.path().join("controller.yaml");
    // The actuator is configured, but dry_run is left at its default.
    std::fs::write(
        &config,
        format!(
            "remediation:\n  actuator: script\n  script:\n    program: {}\n",
            script.display()
        ),
    )
    .expect("write config");
    let c = start(dir.path(), &config);
    storm(&c, 1);
    // Recorded as intended first, then finished with what it would have done.
    let isolate = c.finished_action("isolate", "node-0");
    let status = c.get("/api/v1/remediation");
    assert_eq!(status["dry_run"], true, "{status}");
    assert_eq!(isolate["dry_run"], true, "{isolate}");
    assert!(
        isolate["result"]
            .as_str()
            .is_some_and(|r| r.starts_with("dry run: would drain node-0")),
        "{isolate}"
    );
    let noted = |inc: &serde_json::Value| {
        inc["timeline"].as_array().is_some_and(|t| {
            t.iter().any(|e| {
                e["what"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("dry run: policy rule gpu-fatal-xid"))
            })
        })
    };
    wait_until("the dry run on the timeline", PATIENCE, || {
        noted(&c.incidents()[0])
    });
    let inc = &c.incidents()[0];
    assert_ne!(
        inc["state"], "mitigating",
        "a dry run mitigates nothing: {inc}"
    );
    assert!(lines(&log).is_empty(), "the actuator never ran");
    c.kill();
}

#[test]
fn a_node_is_given_back_after_its_health_window() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (script, log) = recorder(dir.path());
    let config = dir.path().join("controller.yaml");
    std::fs::write(
        &config,
        format!(
            "remediation:\n  dry_run: false\n  actuator: script\n  script:\n    program: {}\n  \
             auto_release_after: 1s\n",
            script.display()
        ),
    )
    .expect("write config");
    let c = start(dir.path(), &config);
    storm(&c, 1);
    wait_until("node-0 isolated", PATIENCE, || lines(&log).len() == 1);
    assert!(lines(&log)[0].starts_with("isolate node-0 true inc-"));
    // The script has run; Warden's node table is written once it has exited.
    let held = wait_for("node-0 held drained", PATIENCE, || {
        c.get("/api/v1/nodes")
            .as_array()?
            .iter()
            .find(|n| n["name"] == "node-0" && n["state"] == "drained")
            .cloned()
    });
    assert_eq!(held["owner"], "warden-policy", "{held}");
    // While its incident is live the node stays out, however long: let the health
    // window (1 s) pass, then a whole remediation pass after it, and look. The sleep
    // only lets time pass for a check that nothing happened; the pass is the barrier.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    c.wait_for_a_full_pass();
    assert_eq!(lines(&log).len(), 1, "no release while the fault is live");
    // The fault is dealt with; a second later, with its agent still heard, it is back.
    let id = c.incidents()[0]["id"].as_str().expect("id").to_owned();
    let (status, body) = c.call(
        "POST",
        &format!("/api/v1/incidents/{id}/resolve"),
        "application/json",
        br#"{"reason":"GPU replaced"}"#,
    );
    assert_eq!(status, 200, "{body}");
    c.ingest_heartbeat("node-0", 5);
    wait_until("node-0 released", PATIENCE, || lines(&log).len() == 2);
    assert_eq!(lines(&log)[1], "release node-0  ");
    // The script ran before the release is recorded.
    let released = c.finished_action("undrain", "node-0");
    assert_eq!(released["actor"], "auto-release", "{released}");
    assert_eq!(count(&c.actions(), "undrain", "node-0").len(), 1);
    wait_until("node-0 no longer held", PATIENCE, || {
        c.get("/api/v1/nodes").as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n["name"] == "node-0" && n["state"] != "drained")
        })
    });
    c.kill();
}

/// What the actuator-wait helpers rely on: an action of remediation's is listed as
/// intended, with no result and no finish time, for as long as its actuator runs, and
/// finished only after. The script actuator is held until the test lets it go.
#[test]
fn an_action_is_listed_intended_without_a_result_while_its_actuator_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let gate = dir.path().join("go");
    // Held until the gate exists; let go anyway when the temp dir is gone (the test
    // ended without opening it) or after about two minutes, so no script outlives it.
    let hold = format!(
        "i=0\nwhile [ ! -e {gate} ] && [ -d {dir} ] && [ $i -lt 2400 ]; do sleep 0.05; \
         i=$((i+1)); done\n",
        gate = gate.display(),
        dir = dir.path().display()
    );
    let (script, log) = support::recording_actuator(
        dir.path(),
        &hold,
        "$WARDEN_ACTION $WARDEN_NODE $WARDEN_EVICT $WARDEN_INCIDENT",
    );
    let config = dir.path().join("controller.yaml");
    std::fs::write(
        &config,
        format!(
            "remediation:\n  dry_run: false\n  actuator: script\n  script:\n    program: {}\n    \
             timeout_secs: 600\n",
            script.display()
        ),
    )
    .expect("write config");
    let c = start(dir.path(), &config);
    storm(&c, 1);
    let held = wait_for("the isolation of node-0 recorded", PATIENCE, || {
        c.actions()
            .into_iter()
            .find(|a| a["kind"] == "isolate" && a["target"] == "node-0")
    });
    assert_eq!(held["status"], "intended", "{held}");
    assert!(held["result"].is_null(), "{held}");
    assert!(held["finished_at"].is_null(), "{held}");
    assert!(!finished(&held), "{held}");
    assert!(lines(&log).is_empty(), "the script is still held");

    std::fs::write(&gate, "").expect("open the gate");
    let done = c.finished_action("isolate", "node-0");
    assert_eq!(done["id"], held["id"], "the same action, finished");
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["result"], "drain node-0: done", "{done}");
    assert!(
        done["finished_at"].as_i64() >= held["intended_at"].as_i64(),
        "{done}"
    );
    let ran = lines(&log);
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert!(ran[0].starts_with("isolate node-0 true inc-"), "{ran:?}");
    c.kill();
}

/// Verification through the script actuator: three nodes' GPUs fall off the bus; each
/// node's check runs the script with `WARDEN_ACTION=verify`. node-0 passes and is given
/// back; node-1 fails and stays out, marked bad; node-2's first check cannot run (75)
/// and is no verdict: it runs again and passes.
#[test]
fn a_quarantined_node_returns_only_through_a_passed_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let once = dir.path().join("busy-once");
    let (script, log) = support::recording_actuator(
        dir.path(),
        &format!(
            "if [ \"$WARDEN_ACTION\" = verify ]; then\n\
             case \"$WARDEN_NODE\" in\n\
             node-1) echo 'GPU 3: diag level 2 failed (memory)' >&2; exit 1;;\n\
             node-2) if [ ! -e {once} ]; then touch {once}; echo 'the node is busy' >&2; exit 75; fi;;\n\
             esac\n\
             echo 'dcgmi diag -r 2: pass'\n\
             fi\n",
            once = once.display()
        ),
        "$WARDEN_ACTION $WARDEN_NODE",
    );
    let config = dir.path().join("controller.yaml");
    std::fs::write(
        &config,
        format!(
            "remediation:\n  dry_run: false\n  actuator: script\n  script:\n    program: {}\n  \
             breaker: {{max_nodes: 10, max_percent: 100}}\n  \
             verify: {{enabled: true, after: 1s}}\n",
            script.display()
        ),
    )
    .expect("write config");
    let c = start(dir.path(), &config);
    storm(&c, 3);
    let health = |node: &str| c.get(&format!("/api/v1/nodes/{node}/health"));
    wait_until("every check decided", PATIENCE * 2, || {
        health("node-0")["state"] == "returned"
            && health("node-1")["state"] == "bad"
            && health("node-2")["state"] == "returned"
    });
    let checks = |node: &str| -> Vec<String> {
        count(&c.actions(), "verify", node)
            .iter()
            .filter(|a| finished(a))
            .filter_map(|a| a["result"].as_str().map(str::to_owned))
            .collect()
    };
    wait_until("the checks recorded", PATIENCE, || {
        checks("node-0").len() == 1 && checks("node-1").len() == 1 && checks("node-2").len() == 2
    });
    assert_eq!(
        checks("node-0"),
        ["passed: dcgmi diag -r 2: pass; given back: script: given back"]
    );
    assert_eq!(
        checks("node-1"),
        ["failed: exit status 1: GPU 3: diag level 2 failed (memory); kept out: script: drained"]
    );
    let node2 = checks("node-2");
    assert!(
        node2.contains(&"no verdict: health check of node-2 refused for now: the node is busy; run again in 1s".to_owned()),
        "{node2:?}"
    );
    assert!(
        node2.contains(&"passed: dcgmi diag -r 2: pass; given back: script: given back".to_owned()),
        "{node2:?}"
    );
    // The actuator saw each step (a check that exits early logs nothing): the broken
    // node isolated again as bad, and still held in Warden's table.
    let seen = lines(&log);
    for want in [
        "verify node-0",
        "release node-0",
        "verify node-2",
        "release node-2",
    ] {
        assert!(seen.iter().any(|l| l == want), "{want} in {seen:?}");
    }
    assert_eq!(
        seen.iter().filter(|l| *l == "isolate node-1").count(),
        2,
        "{seen:?}"
    );
    assert!(!seen.iter().any(|l| l == "release node-1"), "{seen:?}");
    let drained: Vec<String> = c
        .get("/api/v1/nodes")
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["state"] == "drained")
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(drained, ["node-1"]);
    // The history says why, with the check's own words.
    let h = health("node-1");
    let reasons: Vec<&str> = h["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|t| t["reason"].as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("health check failed: exit status 1: GPU 3")),
        "{h}"
    );
    c.kill();
}

/// The controller acting through a script that logs `fields` of each request, under a
/// policy of `rules` (YAML list items) and `more` remediation settings; nodes node-0 to
/// node-3 heard. Returns it and the script's log.
fn under_policy(dir: &Path, fields: &str, rules: &str, more: &str) -> (Ctl, std::path::PathBuf) {
    let (script, log) = support::recording_actuator(dir, "", fields);
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, format!("version: 1\nrules:\n{rules}")).expect("write policy");
    let config = dir.join("controller.yaml");
    std::fs::write(
        &config,
        format!(
            "remediation:\n  dry_run: false\n  actuator: script\n  script:\n    program: {}\n  \
             policy_file: {}\n{more}",
            script.display(),
            policy.display()
        ),
    )
    .expect("write config");
    let c = start(dir, &config);
    for i in 0..4 {
        c.ingest_heartbeat(&format!("node-{i}"), 1);
    }
    (c, log)
}

/// Placement: a restart avoids every node the node-health ledger holds out, not only
/// the incident's own and the isolated ones. Under a policy that isolates nothing,
/// node-1's dead GPU (no job there) only quarantines it in the ledger; then the job's
/// GPU on node-0 dies, and its restart excludes node-0 and node-1.
#[test]
fn a_restart_avoids_every_node_the_ledger_holds_out() {
    use warden_model::wire::{JobSignals, RankInfo, TrainingMetric};
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, log) = under_policy(
        dir.path(),
        "$WARDEN_ACTION $WARDEN_JOB $WARDEN_EXCLUDE",
        "  - name: restart-only\n    when: {kind: [gpu_fault], xid_severity: [fatal]}\n    \
         then: [notify, restart_job]\n",
        "",
    );
    c.ingest_xid("node-1", 2);
    wait_until("node-1 quarantined", PATIENCE, || {
        c.get("/api/v1/nodes/node-1/health")["state"] == "quarantined"
    });
    let now = support::ctl::now_ns();
    let job = JobSignals {
        job: "train".into(),
        ranks: vec![RankInfo {
            rank: 0,
            world_size: 1,
            pid: 4242,
            gpu_index: Some(3),
            gpu_uuid: "GPU-3".into(),
        }],
        metrics: vec![TrainingMetric {
            rank: 0,
            step: 10,
            at_ns: now,
            loss: Some(2.5),
            ..TrainingMetric::default()
        }],
        ..JobSignals::default()
    };
    c.ingest_jobs("node-0", 3, vec![], vec![job]);
    c.ingest_xid("node-0", 4);
    let restart = c.finished_action("restart", "train");
    assert_eq!(restart["status"], "done", "{restart}");
    assert!(
        lines(&log).contains(&"restart train node-0,node-1".to_owned()),
        "{:?}",
        lines(&log)
    );
    assert!(
        restart["result"]
            .as_str()
            .is_some_and(|r| r.contains("without node-0, node-1")),
        "{restart}"
    );
    c.kill();
}

/// A quarantine the policy did not act on (here a policy that only notifies) is isolated
/// for the ledger before its check, so that the check runs on a node out of service;
/// the check passes and the node is given back.
#[test]
fn a_quarantine_the_policy_left_alone_is_isolated_before_its_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, log) = under_policy(
        dir.path(),
        "$WARDEN_ACTION $WARDEN_NODE $WARDEN_REASON",
        "  - name: tell\n    when: {kind: [gpu_fault]}\n    then: [notify]\n",
        "  breaker: {max_nodes: 10, max_percent: 100}\n  verify: {enabled: true, after: 1s}\n",
    );
    c.ingest_xid("node-1", 2);
    wait_until("node-1 returned", PATIENCE * 2, || {
        c.get("/api/v1/nodes/node-1/health")["state"] == "returned"
    });
    let seen: Vec<String> = lines(&log)
        .iter()
        .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        seen,
        ["isolate node-1", "verify node-1", "release node-1"],
        "{:?}",
        lines(&log)
    );
    assert!(
        lines(&log)[0].starts_with("isolate node-1 quarantined: node-health-ledger: XID 79"),
        "{:?}",
        lines(&log)
    );
    let isolate = c.finished_action("isolate", "node-1");
    assert_eq!(isolate["actor"], "warden-policy", "{isolate}");
    assert_eq!(isolate["result"], "drain node-1: done", "{isolate}");
    // It names the incident that quarantined the node, as the policy's own do.
    let incident = c.incidents()[0]["id"].as_str().expect("id").to_owned();
    assert_eq!(isolate["incident"], incident.as_str(), "{isolate}");
    c.kill();
}
