//! The `warden-controller` binary killed with SIGKILL at several points of an incident's
//! life, and started again on the same SQLite store: no incident is lost or split in
//! two, and no action is lost or repeated. The points: after an incident opened; between
//! "acknowledge intended" and done; between "drain intended" and the node being drained;
//! between the node being drained and the action recorded as done. A failpoint
//! (`WARDEN_FAILPOINT`) parks the controller at the exact point; the test then kills it.

mod support;

use std::ffi::OsStr;
use std::path::Path;

use support::ctl::{Ctl, by_people, count, finished};
use warden_testkit::{PATIENCE, wait_until};

fn start(data: &Path, failpoint: Option<&str>) -> Ctl {
    Ctl::start(&[OsStr::new("--data-dir"), data.as_os_str()], failpoint)
}

#[test]
fn sigkill_at_every_step_loses_nothing_and_repeats_nothing() {
    let data = tempfile::tempdir().expect("temp dir");

    // 1. An incident opens; the controller dies right after.
    let c = start(data.path(), None);
    c.ingest_xid("node-3", 1);
    wait_until("the GPU fault incident", PATIENCE, || {
        c.incidents().len() == 1
    });
    let id = c.incidents()[0]["id"].as_str().expect("id").to_owned();
    c.kill();

    // 2. It is still there after the restart, and the same fault groups into it.
    let c = start(data.path(), Some("ack-intended"));
    let found = c.incidents();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["id"], id.as_str());
    // Once the fault is applied, the incident's evidence is its (newer) event's; a
    // new incident would leave it as it was.
    let before = found[0]["evidence"].clone();
    c.ingest_xid("node-3", 2);
    wait_until("the fault applied", PATIENCE, || {
        let now = c.incidents();
        now.len() > 1 || now[0]["evidence"] != before
    });
    assert_eq!(
        c.incidents().len(),
        1,
        "the same fault after a restart is no new incident"
    );

    // 3. Killed between "acknowledge intended" and done.
    let _pending = c.send(
        "POST",
        &format!("/api/v1/incidents/{id}/ack"),
        "application/json",
        br#"{"note":"looking"}"#,
    );
    c.wait_for("failpoint ack-intended reached");
    c.kill();

    // 4. The restart finishes the acknowledgement (once it has taken the lead, after
    //    it answers); then it dies between "drain intended" and the drain itself.
    let c = start(data.path(), Some("drain-intended"));
    let ack = c.finished_action("acknowledge", &id);
    assert_eq!(ack["status"], "done", "{ack}");
    let acks = count(&c.actions(), "acknowledge", &id);
    assert_eq!(acks.len(), 1, "{acks:?}");
    // The incident is written before the action is recorded as done.
    let inc = c.get(&format!("/api/v1/incidents/{id}"));
    assert_eq!(inc["acknowledged"], true, "{inc}");
    let _pending = c.send(
        "POST",
        "/api/v1/nodes/node-3/drain",
        "application/json",
        br#"{"reason":"XID 79"}"#,
    );
    c.wait_for("failpoint drain-intended reached");
    // Parked between the two: listed as intended, with no result yet.
    let parked = count(&c.actions(), "drain", "node-3");
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0]["status"], "intended", "{parked:?}");
    assert!(!finished(&parked[0]), "{parked:?}");
    c.kill();

    // 5. The restart finishes that drain; then a second drain dies after the node was
    //    drained but before the action was recorded as done.
    let c = start(data.path(), Some("drain-applied"));
    c.finished_action("drain", "node-3");
    let nodes = c.get("/api/v1/nodes");
    let n3 = nodes
        .as_array()
        .expect("array")
        .iter()
        .find(|n| n["name"] == "node-3")
        .expect("node-3 listed")
        .clone();
    assert_eq!(n3["state"], "drained", "{n3}");
    assert_eq!(n3["owner"], "local", "{n3}");
    let _pending = c.send(
        "POST",
        "/api/v1/nodes/node-4/drain",
        "application/json",
        br#"{"reason":"suspect NVLink"}"#,
    );
    c.wait_for("failpoint drain-applied reached");
    c.kill();

    // 6. A clean restart: every action exactly once, all done; one incident.
    let c = start(data.path(), None);
    c.finished_action("drain", "node-4");
    let actions = c.actions();
    for (kind, target) in [
        ("acknowledge", id.as_str()),
        ("drain", "node-3"),
        ("drain", "node-4"),
    ] {
        let found = count(&actions, kind, target);
        assert_eq!(found.len(), 1, "{kind} {target}: {actions:?}");
        assert_eq!(found[0]["status"], "done", "{found:?}");
    }
    assert_eq!(by_people(&actions).len(), 3, "{actions:?}");
    let drained: Vec<_> = c
        .get("/api/v1/nodes")
        .as_array()
        .expect("array")
        .iter()
        .filter(|n| n["state"] == "drained")
        .map(|n| n["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(drained, ["node-3", "node-4"]);
    // Draining again is refused, not repeated.
    let (status, body) = c.call(
        "POST",
        "/api/v1/nodes/node-3/drain",
        "application/json",
        br#"{"reason":"again"}"#,
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(by_people(&c.actions()).len(), 3);
    // The incident's timeline kept every step across four restarts.
    let inc = c.get(&format!("/api/v1/incidents/{id}"));
    let timeline: Vec<_> = inc["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|e| e["what"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(timeline[0].starts_with("opened"), "{timeline:?}");
    assert!(
        timeline
            .iter()
            .filter(|w| w.starts_with("acknowledged by local"))
            .count()
            == 1,
        "{timeline:?}"
    );
    assert_eq!(c.incidents().len(), 1);
    // Resolving by hand ends it, once.
    let (status, body) = c.call(
        "POST",
        &format!("/api/v1/incidents/{id}/resolve"),
        "application/json",
        br#"{"reason":"GPU replaced"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.call(
        "POST",
        &format!("/api/v1/incidents/{id}/resolve"),
        "application/json",
        br#"{"reason":"again"}"#,
    );
    assert_eq!(status, 409, "{body}");
    c.kill();
    let c = start(data.path(), None);
    let inc = c.get(&format!("/api/v1/incidents/{id}"));
    assert_eq!(inc["state"], "resolved", "{inc}");
    c.kill();
}

/// A controller that serves the API but has not yet taken the lease's work back (it is
/// parked at `lead-started`, before restoring incidents) has no detector pass that
/// could store a kernel event: the batch is answered 503, never 200, so the agent keeps
/// it and sends it again; once a controller leads, the same batch is acknowledged and
/// its incident is there.
#[test]
fn a_kernel_event_is_not_acknowledged_before_a_leader_can_store_it() {
    let data = tempfile::tempdir().expect("temp dir");
    let c = start(data.path(), Some("lead-started"));
    c.wait_for("failpoint lead-started reached");
    let batch = support::ctl::xid_batch("node-7", 1);
    let (status, body) = c.call(
        "POST",
        "/api/v1/ingest",
        "application/vnd.warden.batch",
        &batch,
    );
    assert_eq!(
        status, 503,
        "acknowledged before any pass could store it: {body}"
    );
    c.kill();

    let c = start(data.path(), None);
    c.ingest(&batch);
    wait_until("the GPU fault incident", PATIENCE, || {
        c.incidents().len() == 1
    });
}
