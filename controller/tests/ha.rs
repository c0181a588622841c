//! Two `warden-controller`s on one real PostgreSQL database: exactly one leads; the
//! follower serves reads from the shared store and relays writes to the leader; when
//! the leader is killed (SIGKILL) in the middle of a drain, the follower takes over
//! within 10 s, finishes that drain once, and keeps the incident it opened.

mod support;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use support::ctl::{Ctl, by_people, count};
use support::http_get;
use support::pg::TestDb;
use warden_testkit::{PATIENCE, wait_until};

fn leads(c: &Ctl) -> bool {
    http_get(c.port, "/metrics").is_some_and(|(_, m)| m.contains("\nwarden_controller_leader 1"))
}

/// Whether `follower` follows `leader`: it has seen the leader renew its lease (two
/// lease rounds at least) and relays writes to it. A follower says whom it follows
/// when asked for live rank progress, which only the leader holds.
fn follows(follower: &Ctl, leader: &Ctl) -> bool {
    http_get(follower.port, "/api/v1/jobs/none/ranks").is_some_and(|(status, body)| {
        status == 503 && body.contains(&format!("http://127.0.0.1:{}", leader.port))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follower_takes_over_within_ten_seconds_and_repeats_nothing() {
    let db = TestDb::create().await;
    let url = db.url().to_owned();
    tokio::task::spawn_blocking(move || scenario(&url))
        .await
        .expect("scenario");
}

fn scenario(url: &str) {
    let store = [OsStr::new("--database-url"), OsStr::new(url)];
    // A leads (it starts first); it will park in the middle of a drain.
    let a = Ctl::start(&store, Some("drain-intended"));
    wait_until("A to lead", PATIENCE, || leads(&a));
    let b = Ctl::start(&store, None);
    wait_until("B to follow A", PATIENCE, || follows(&b, &a));
    assert!(leads(&a) && !leads(&b), "exactly one leads");

    // Writes sent to the follower reach the leader; reads on the follower come from the
    // shared store.
    b.ingest_xid("node-3", 1);
    wait_until("the incident, read on the follower", PATIENCE, || {
        b.incidents().len() == 1
    });
    let id = b.incidents()[0]["id"].as_str().expect("id").to_owned();
    assert_eq!(a.incidents().len(), 1);

    // A drain sent to the follower is relayed to the leader, which parks after
    // recording it as intended; then the leader dies.
    let _pending = b.send(
        "POST",
        "/api/v1/nodes/node-3/drain",
        "application/json",
        br#"{"reason":"XID 79"}"#,
    );
    a.wait_for("failpoint drain-intended reached");
    a.kill();
    let killed = Instant::now();
    wait_until("B to take over", PATIENCE, || leads(&b));
    let takeover = killed.elapsed();
    eprintln!("takeover after {:.2} s", takeover.as_secs_f64());
    // The stated bound: the lease (5 s) and a round (1 s), with room to spare; a slower
    // machine is given more through WARDEN_TEST_PATIENCE.
    let bound = warden_testkit::scaled(Duration::from_secs(10));
    assert!(takeover < bound, "{takeover:?}, over {bound:?}");

    // The new leader finished the drain, once, and kept the incident.
    wait_until("the drain to finish", PATIENCE, || {
        count(&b.actions(), "drain", "node-3")
            .first()
            .is_some_and(|a| a["status"] == "done")
    });
    let actions = b.actions();
    assert_eq!(count(&actions, "drain", "node-3").len(), 1, "{actions:?}");
    assert_eq!(by_people(&actions).len(), 1, "{actions:?}");
    // Once the fault is applied, the incident's evidence is its (newer) event's; a new
    // incident would leave it as it was.
    let before = b.incidents()[0]["evidence"].clone();
    b.ingest_xid("node-3", 2);
    wait_until("the fault applied", PATIENCE, || {
        let now = b.incidents();
        now.len() > 1 || now[0]["evidence"] != before
    });
    let incidents = b.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0]["id"], id.as_str());
    let (status, body) = b.call(
        "POST",
        "/api/v1/nodes/node-3/drain",
        "application/json",
        br#"{"reason":"again"}"#,
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(by_people(&b.actions()).len(), 1);
    b.kill();
}
