//! Two `warden-controller`s on one real PostgreSQL database: exactly one leads; the
//! follower serves reads from the shared store and relays writes to the leader; when
//! the leader is killed (SIGKILL) in the middle of a drain, the follower takes over
//! within 10 s, finishes that drain once, and keeps the incident it opened.

mod support;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use support::ctl::{Ctl, by_people, count, wait_until};
use support::http_get;
use support::pg::TestDb;

fn leads(c: &Ctl) -> bool {
    http_get(c.port, "/metrics").is_some_and(|(_, m)| m.contains("\nwarden_controller_leader 1"))
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
    wait_until("A to lead", || leads(&a));
    let b = Ctl::start(&store, None);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(leads(&a) && !leads(&b), "exactly one leads");

    // Writes sent to the follower reach the leader; reads on the follower come from the
    // shared store.
    b.ingest_xid("node-3", 1);
    wait_until("the incident, read on the follower", || {
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
    wait_until("B to take over", || leads(&b));
    let takeover = killed.elapsed();
    eprintln!("takeover after {:.2} s", takeover.as_secs_f64());
    assert!(takeover < Duration::from_secs(10), "{takeover:?}");

    // The new leader finished the drain, once, and kept the incident.
    wait_until("the drain to finish", || {
        count(&b.actions(), "drain", "node-3")
            .first()
            .is_some_and(|a| a["status"] == "done")
    });
    let actions = b.actions();
    assert_eq!(count(&actions, "drain", "node-3").len(), 1, "{actions:?}");
    assert_eq!(by_people(&actions).len(), 1, "{actions:?}");
    b.ingest_xid("node-3", 2);
    std::thread::sleep(Duration::from_millis(800));
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
