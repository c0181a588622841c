//! The incident store on both of its databases: an SQLite file in a temp dir and a fresh
//! database on the real PostgreSQL server (`WARDEN_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `scripts/test` starts the server when
//! it is not running). Every test runs the same body on both.

mod support;

use support::pg::TestDb;
use warden_controller::store::{
    self, ActionKind, ActionRecord, ActionStatus, IncidentFilter, NodeRecord, Store, StoreError,
};
use warden_model::{Incident, IncidentKind, IncidentState, Severity, TimelineEntry, Timestamp};

/// An SQLite store in a temp dir and a PostgreSQL store in a fresh database.
async fn backends() -> Vec<(&'static str, Store, Guard)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = Store::open_dir(dir.path()).await.expect("sqlite store");
    let db = TestDb::create().await;
    let pg = Store::open(db.url()).await.expect("postgres store");
    vec![
        ("sqlite", sqlite, Guard::Dir(dir)),
        ("postgres", pg, Guard::Db(db)),
    ]
}

/// Keeps a backend's storage alive for the test.
#[allow(dead_code)]
enum Guard {
    Dir(tempfile::TempDir),
    Db(TestDb),
}

fn incident(id: &str, kind: IncidentKind, job: &str, nodes: &[&str]) -> Incident {
    Incident {
        id: id.to_owned(),
        kind,
        job: Some(job.to_owned()),
        state: IncidentState::Open,
        acknowledged: false,
        severity: Severity::Critical,
        ranks: vec![3],
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        gpus: Vec::new(),
        onset: Timestamp(1_000),
        detected_at: Timestamp(2_000),
        updated_at: Timestamp(2_000),
        resolved_at: None,
        confidence: 0.9,
        summary: format!("{kind} on {nodes:?}"),
        evidence: Vec::new(),
        finding_count: 1,
        timeline: vec![entry(2_000, "opened")],
        diagnosis: None,
    }
}

fn entry(at: i64, what: &str) -> TimelineEntry {
    TimelineEntry {
        at: Timestamp(at),
        what: what.to_owned(),
    }
}

#[tokio::test]
async fn migrations_apply_once_and_reopen_cleanly() {
    for (name, store, guard) in backends().await {
        assert_eq!(
            store.schema_version().await.expect("version"),
            store::latest_schema_version(),
            "{name}"
        );
        // Opening the same database again finds everything applied.
        let again = match &guard {
            Guard::Dir(d) => Store::open_dir(d.path()).await,
            Guard::Db(db) => Store::open(db.url()).await,
        }
        .expect("reopen");
        assert_eq!(
            again.schema_version().await.expect("version"),
            store::latest_schema_version(),
            "{name}"
        );
        again.ping().await.expect("ping");
    }
}

#[tokio::test]
async fn incidents_round_trip_with_their_whole_timeline() {
    for (name, store, _guard) in backends().await {
        let mut inc = incident("inc-1", IncidentKind::Hang, "llama", &["node-1"]);
        store
            .save_incident(&inc, &inc.timeline.clone(), 0, false)
            .await
            .expect("save");
        // Later: more timeline, a diagnosis, a new state. Only the new entries are sent.
        inc.state = IncidentState::Diagnosed;
        inc.updated_at = Timestamp(3_000);
        let more = vec![entry(2_500, "culprit revised"), entry(3_000, "diagnosed")];
        inc.timeline.extend(more.clone());
        inc.diagnosis = Some(warden_model::IncidentDiagnosis {
            category: Some("nccl_timeout_hang".into()),
            source: "rules".into(),
            ..Default::default()
        });
        store
            .save_incident(&inc, &more, 1, true)
            .await
            .expect("save again");
        // A repeated save of the same entries adds nothing.
        store
            .save_incident(&inc, &more, 1, false)
            .await
            .expect("idempotent");

        let got = store.incident("inc-1").await.expect("get").expect("found");
        assert_eq!(got.state, IncidentState::Diagnosed, "{name}");
        assert_eq!(got.diagnosis, inc.diagnosis, "{name}");
        let whats: Vec<_> = got.timeline.iter().map(|e| e.what.as_str()).collect();
        assert_eq!(whats, ["opened", "culprit revised", "diagnosed"], "{name}");
        assert_eq!(store.timeline_len("inc-1").await.expect("len"), 3, "{name}");
        assert!(
            store.incident("inc-2").await.expect("get").is_none(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn lists_filter_and_page() {
    for (name, store, _guard) in backends().await {
        let mut all = vec![
            incident("inc-01", IncidentKind::Hang, "llama", &["node-1", "node_2"]),
            incident("inc-02", IncidentKind::Crash, "llama", &["node-3"]),
            incident("inc-03", IncidentKind::GpuFault, "gpt", &["nodex2"]),
            incident("inc-04", IncidentKind::Hang, "gpt", &[]),
        ];
        all[1].state = IncidentState::Resolved;
        all[1].resolved_at = Some(Timestamp(5_000));
        for inc in &all {
            store.save_incident(inc, &[], 0, false).await.expect("save");
        }
        let ids = |v: Vec<Incident>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
        let list = |f: IncidentFilter| {
            let store = store.clone();
            async move { ids(store.incidents(&f).await.expect("list")) }
        };
        assert_eq!(list(IncidentFilter::default()).await.len(), 4, "{name}");
        let f = IncidentFilter {
            kind: Some(IncidentKind::Hang),
            ..Default::default()
        };
        assert_eq!(list(f).await, ["inc-01", "inc-04"], "{name}");
        let f = IncidentFilter {
            state: Some(IncidentState::Resolved),
            ..Default::default()
        };
        assert_eq!(list(f).await, ["inc-02"], "{name}");
        let f = IncidentFilter {
            job: Some("gpt".into()),
            ..Default::default()
        };
        assert_eq!(list(f).await, ["inc-03", "inc-04"], "{name}");
        // `_` is a LIKE wildcard: node_2 must not match nodex2.
        let f = IncidentFilter {
            node: Some("node_2".into()),
            ..Default::default()
        };
        assert_eq!(list(f).await, ["inc-01"], "{name}");
        let f = IncidentFilter {
            node: Some("node-".into()),
            ..Default::default()
        };
        assert!(list(f).await.is_empty(), "{name}: whole names only");
        // Pages of two.
        let f = IncidentFilter {
            limit: 2,
            ..Default::default()
        };
        assert_eq!(list(f).await, ["inc-01", "inc-02"], "{name}");
        let f = IncidentFilter {
            limit: 2,
            after: Some("inc-02".into()),
            ..Default::default()
        };
        assert_eq!(list(f).await, ["inc-03", "inc-04"], "{name}");

        // What a restarted controller keeps grouping into.
        let live = ids(store.live_incidents(Timestamp(6_000)).await.expect("live"));
        assert_eq!(live, ["inc-01", "inc-03", "inc-04"], "{name}");
        let live = ids(store.live_incidents(Timestamp(4_000)).await.expect("live"));
        assert_eq!(live.len(), 4, "{name}: recently resolved ones too");
    }
}

#[tokio::test]
async fn actions_are_intended_then_finished_once() {
    for (name, store, _guard) in backends().await {
        let a = ActionRecord {
            id: "act-1".into(),
            kind: ActionKind::Drain,
            target: "node-7".into(),
            incident: Some("inc-1".into()),
            actor: "alice".into(),
            reason: "XID 79 twice".into(),
            dry_run: false,
            status: ActionStatus::Done,
            result: None,
            intended_at: Timestamp(10),
            finished_at: None,
        };
        store.intend(&a).await.expect("intend");
        let pending = store.unfinished_actions().await.expect("pending");
        assert_eq!(pending.len(), 1, "{name}");
        assert_eq!(
            pending[0].status,
            ActionStatus::Intended,
            "{name}: stored as intended"
        );
        assert_eq!(pending[0].actor, "alice", "{name}");
        // The same id twice is refused: an action is recorded once.
        assert!(store.intend(&a).await.is_err(), "{name}");

        assert!(
            store
                .finish("act-1", ActionStatus::Done, "drained", Timestamp(20))
                .await
                .expect("finish"),
            "{name}"
        );
        assert!(
            !store
                .finish("act-1", ActionStatus::Failed, "again", Timestamp(30))
                .await
                .expect("finish"),
            "{name}: a finished action stays finished"
        );
        assert!(
            store
                .unfinished_actions()
                .await
                .expect("pending")
                .is_empty(),
            "{name}"
        );
        let log = store.actions(None, None, 0).await.expect("log");
        assert_eq!(log.len(), 1, "{name}");
        assert_eq!(log[0].status, ActionStatus::Done, "{name}");
        assert_eq!(log[0].result.as_deref(), Some("drained"), "{name}");
        assert_eq!(log[0].finished_at, Some(Timestamp(20)), "{name}");
        assert!(
            store
                .actions(None, Some("node-8"), 0)
                .await
                .expect("log")
                .is_empty(),
            "{name}"
        );
        assert!(
            store
                .actions(Some("act-1"), None, 0)
                .await
                .expect("log")
                .is_empty(),
            "{name}: paged past"
        );
    }
}

#[tokio::test]
async fn node_drains_and_jobs_are_kept() {
    for (name, store, _guard) in backends().await {
        let n = NodeRecord {
            name: "node-7".into(),
            state: "drained".into(),
            owner: "alice".into(),
            reason: "bad NVLink".into(),
            incident: None,
            since: Timestamp(5),
            action: Some("act-1".into()),
        };
        store.put_node(&n).await.expect("put");
        assert_eq!(
            store.node("node-7").await.expect("get"),
            Some(n.clone()),
            "{name}"
        );
        assert_eq!(store.nodes().await.expect("list"), [n], "{name}");
        assert!(store.remove_node("node-7").await.expect("remove"), "{name}");
        assert!(
            !store.remove_node("node-7").await.expect("remove"),
            "{name}"
        );
        assert!(store.nodes().await.expect("list").is_empty(), "{name}");

        store
            .save_job("llama", "running", "{\"job\":\"llama\"}", Timestamp(1))
            .await
            .expect("job");
        store
            .save_job(
                "llama",
                "ended",
                "{\"job\":\"llama\",\"x\":1}",
                Timestamp(2),
            )
            .await
            .expect("job");
        let jobs = store.jobs().await.expect("jobs");
        assert_eq!(jobs.len(), 1, "{name}");
        assert!(jobs[0].doc.contains("\"x\":1"), "{name}");
    }
}

#[tokio::test]
async fn bad_urls_and_unreadable_documents_are_named() {
    let e = Store::open("mysql://localhost/db")
        .await
        .expect_err("mysql");
    assert!(matches!(e, StoreError::UnsupportedUrl(_)), "{e}");
    let e = Store::open("postgres://nobody:secret@127.0.0.1:1/warden")
        .await
        .expect_err("nothing listens on port 1");
    let msg = e.to_string();
    assert!(msg.contains("127.0.0.1:1/warden"), "{msg}");
    assert!(
        !msg.contains("secret"),
        "credentials are never shown: {msg}"
    );

    for (name, store, _guard) in backends().await {
        sqlx::query(
            "INSERT INTO incidents (id, kind, state, severity, detected_at, updated_at, \
             summary, doc) VALUES ('inc-x', 'hang', 'open', 'critical', 1, 1, 's', '{oops')",
        )
        .execute(store.pool())
        .await
        .expect("insert");
        let e = store.incident("inc-x").await.expect_err("corrupt");
        assert!(e.to_string().contains("\"inc-x\""), "{name}: {e}");
    }
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    for (name, store, guard) in backends().await {
        sqlx::query(
            "INSERT INTO warden_migrations (version, name, applied_at) VALUES (999, 'future', 0)",
        )
        .execute(store.pool())
        .await
        .expect("insert");
        let e = match &guard {
            Guard::Dir(d) => Store::open_dir(d.path()).await,
            Guard::Db(db) => Store::open(db.url()).await,
        }
        .expect_err("newer schema");
        assert!(e.to_string().contains("999"), "{name}: {e}");
    }
}

#[tokio::test]
async fn two_controllers_migrating_one_postgres_at_once_both_succeed() {
    let db = TestDb::create().await;
    let (a, b) = tokio::join!(Store::open(db.url()), Store::open(db.url()));
    assert_eq!(
        a.expect("first").schema_version().await.expect("v"),
        store::latest_schema_version()
    );
    assert_eq!(
        b.expect("second").schema_version().await.expect("v"),
        store::latest_schema_version()
    );
}

#[tokio::test]
async fn remediation_state_round_trips() {
    for (name, store, _guard) in backends().await {
        assert_eq!(
            store.remediation_state("rails").await.expect("read"),
            None,
            "{name}"
        );
        store
            .put_remediation_state("rails", r#"{"tripped":null}"#, Timestamp(1))
            .await
            .expect("write");
        store
            .put_remediation_state("rails", r#"{"tripped":{"at":2}}"#, Timestamp(2))
            .await
            .expect("overwrite");
        assert_eq!(
            store
                .remediation_state("rails")
                .await
                .expect("read")
                .as_deref(),
            Some(r#"{"tripped":{"at":2}}"#),
            "{name}"
        );
    }
}
