//! The incident store on both of its databases: an SQLite file in a temp dir and a fresh
//! database on the real PostgreSQL server (`WARDEN_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `scripts/test` starts the server when
//! it is not running). Every test runs the same body on both.

mod support;

use sqlx::{Connection, Row};
use support::pg::TestDb;
use warden_controller::store::{
    self, ActionKind, ActionRecord, ActionStatus, IncidentFilter, NodeRecord, Store, StoreError,
};
use warden_model::{Incident, IncidentKind, IncidentState, Severity, TimelineEntry, Timestamp};

/// An SQLite store in a temp dir and a PostgreSQL store in a fresh database.
async fn backends() -> Vec<(&'static str, Store, Guard)> {
    let mut out = Vec::new();
    for (name, guard) in empty_backends().await {
        let store = guard.open().await.expect(name);
        out.push((name, store, guard));
    }
    out
}

/// An empty SQLite data dir and a fresh, empty PostgreSQL database.
async fn empty_backends() -> Vec<(&'static str, Guard)> {
    vec![
        ("sqlite", Guard::Dir(tempfile::tempdir().expect("temp dir"))),
        ("postgres", Guard::Db(TestDb::create().await)),
    ]
}

/// Keeps a backend's storage alive for the test.
enum Guard {
    Dir(tempfile::TempDir),
    Db(TestDb),
}

impl Guard {
    /// Open a store on it (again).
    async fn open(&self) -> Result<Store, StoreError> {
        match self {
            Guard::Dir(d) => Store::open_dir(d.path()).await,
            Guard::Db(db) => Store::open(db.url()).await,
        }
    }

    /// The URL of its database, for a plain connection (not a store).
    fn url(&self) -> String {
        match self {
            Guard::Dir(d) => format!("sqlite://{}?mode=rwc", d.path().join("warden.db").display()),
            Guard::Db(db) => db.url().to_owned(),
        }
    }

    /// A plain connection to its database.
    async fn connect(&self) -> sqlx::AnyConnection {
        sqlx::any::install_default_drivers();
        sqlx::AnyConnection::connect(&self.url())
            .await
            .expect("plain connection")
    }
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
        let again = guard.open().await.expect("reopen");
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
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (999, 'future', $1, $2, 0)",
        )
        .bind(true)
        .bind(vec![0u8; 48])
        .execute(store.pool())
        .await
        .expect("insert");
        let e = guard.open().await.expect_err("newer schema");
        assert_too_new(name, &e);
    }
}

/// `e` refuses a database at schema version 999, with the message the store has always
/// given.
fn assert_too_new(name: &str, e: &StoreError) {
    assert!(
        matches!(e, StoreError::TooNew { found: 999, known } if *known == store::latest_schema_version()),
        "{name}: {e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "the database is at schema version 999, newer than this controller's {}; \
             run a newer controller",
            store::latest_schema_version()
        ),
        "{name}"
    );
}

/// The migrations as the store's earlier runner knew them: (version, name, SQL).
const OLD_MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (
        2,
        "remediation",
        include_str!("../migrations/0002_remediation.sql"),
    ),
];

/// Migrate `guard`'s database up to `upto` as the store's earlier runner did: its
/// `warden_migrations` table, every pending migration and its row in one transaction,
/// under its advisory lock on PostgreSQL.
async fn migrate_the_old_way(guard: &Guard, upto: i64) {
    let mut conn = guard.connect().await;
    let mut tx = conn.begin().await.expect("begin");
    if matches!(guard, Guard::Db(_)) {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(0x5741_5244_454e_0001_i64)
            .execute(&mut *tx)
            .await
            .expect("lock");
    }
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS warden_migrations (\
            version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .expect("old migrations table");
    for &(version, name, sql) in OLD_MIGRATIONS.iter().filter(|m| m.0 <= upto) {
        sqlx::raw_sql(sql).execute(&mut *tx).await.expect(name);
        sqlx::query(
            "INSERT INTO warden_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
        )
        .bind(version)
        .bind(name)
        .bind(1_700_000_000_000_000_000_i64)
        .execute(&mut *tx)
        .await
        .expect("old migration row");
    }
    tx.commit().await.expect("commit");
    conn.close().await.expect("close");
}

/// `_sqlx_migrations` as (version, checksum), in order.
async fn sqlx_rows(store: &Store) -> Vec<(i64, Vec<u8>)> {
    sqlx::query("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
        .fetch_all(store.pool())
        .await
        .expect("_sqlx_migrations")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Every embedded migration: those the earlier runner knew, then the newer ones.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    OLD_MIGRATIONS[0],
    OLD_MIGRATIONS[1],
    (
        3,
        "node_health",
        include_str!("../migrations/0003_node_health.sql"),
    ),
];

/// What sqlx records for every embedded migration: its version and the SHA-384 of its
/// file.
fn expected_sqlx_rows() -> Vec<(i64, Vec<u8>)> {
    use sha2::Digest;
    MIGRATIONS
        .iter()
        .map(|&(v, _, sql)| (v, sha2::Sha384::digest(sql).to_vec()))
        .collect()
}

/// Whether `table` exists in `store`'s database.
async fn has_table(store: &Store, table: &str) -> bool {
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(store.pool())
        .await
        .is_ok()
}

#[tokio::test]
async fn a_database_of_the_earlier_runner_is_taken_over_and_keeps_its_data() {
    for (name, guard) in empty_backends().await {
        migrate_the_old_way(&guard, 2).await;
        let mut conn = guard.connect().await;
        sqlx::query("INSERT INTO remediation_state (name, doc, updated_at) VALUES ($1, $2, $3)")
            .bind("rails")
            .bind(r#"{"tripped":{"at":2}}"#)
            .bind(2_i64)
            .execute(&mut conn)
            .await
            .expect("old data");
        conn.close().await.expect("close");

        let store = guard.open().await.expect(name);
        assert_eq!(
            store.schema_version().await.expect("version"),
            store::latest_schema_version(),
            "{name}"
        );
        assert_eq!(sqlx_rows(&store).await, expected_sqlx_rows(), "{name}");
        assert!(
            !has_table(&store, "warden_migrations").await,
            "{name}: old table dropped"
        );
        assert_eq!(
            store
                .remediation_state("rails")
                .await
                .expect("read")
                .as_deref(),
            Some(r#"{"tripped":{"at":2}}"#),
            "{name}"
        );
        drop(store);

        // Opening it again changes nothing.
        let again = guard.open().await.expect("reopen");
        assert_eq!(sqlx_rows(&again).await, expected_sqlx_rows(), "{name}");
        assert_eq!(
            again.schema_version().await.expect("version"),
            store::latest_schema_version(),
            "{name}"
        );
        assert_eq!(
            again
                .remediation_state("rails")
                .await
                .expect("read")
                .as_deref(),
            Some(r#"{"tripped":{"at":2}}"#),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_database_the_earlier_runner_left_behind_gets_the_newer_migrations() {
    for (name, guard) in empty_backends().await {
        migrate_the_old_way(&guard, 1).await;
        let store = guard.open().await.expect(name);
        assert_eq!(sqlx_rows(&store).await, expected_sqlx_rows(), "{name}");
        store
            .put_remediation_state("rails", "{}", Timestamp(1))
            .await
            .expect("migration 2's table is there");
    }
}

#[tokio::test]
async fn a_newer_database_of_the_earlier_runner_is_refused_untouched() {
    for (name, guard) in empty_backends().await {
        migrate_the_old_way(&guard, 2).await;
        let mut conn = guard.connect().await;
        sqlx::query(
            "INSERT INTO warden_migrations (version, name, applied_at) VALUES (999, 'future', 0)",
        )
        .execute(&mut conn)
        .await
        .expect("insert");
        let e = guard.open().await.expect_err("newer schema");
        assert_too_new(name, &e);
        // Nothing moved: the old table is still there, sqlx's is not.
        let old: i64 = sqlx::query("SELECT COUNT(*) FROM warden_migrations")
            .fetch_one(&mut conn)
            .await
            .expect("old table")
            .get(0);
        assert_eq!(old, 3, "{name}");
        assert!(
            sqlx::query("SELECT COUNT(*) FROM _sqlx_migrations")
                .fetch_one(&mut conn)
                .await
                .is_err(),
            "{name}: no _sqlx_migrations"
        );
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
async fn two_controllers_taking_over_one_postgres_of_the_earlier_runner_both_succeed() {
    let guard = Guard::Db(TestDb::create().await);
    migrate_the_old_way(&guard, 1).await;
    let (a, b) = tokio::join!(guard.open(), guard.open());
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_eq!(sqlx_rows(&a).await, expected_sqlx_rows());
    assert_eq!(
        b.schema_version().await.expect("v"),
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

#[tokio::test]
async fn the_node_health_ledger_survives_a_restart_and_a_bad_document_is_named() {
    use warden_controller::SharedEngine;
    use warden_controller::persist::Persister;
    use warden_engine::ledger::HealthState;
    use warden_engine::{Engine, EngineConfig};

    let now = Timestamp(1_800_000_000_000_000_000);
    for (name, store, _guard) in backends().await {
        let engine = SharedEngine::new(Engine::new(EngineConfig::default(), now));
        engine
            .lock()
            .ledger_mut()
            .decide("node-3", true, "alice", "GPU 2 flaky", now);
        let mut writer = Persister::new(store.clone());
        writer.sync(&engine, now).await.expect(name);
        // Written once: a second pass has nothing new for the ledger.
        writer.sync(&engine, now).await.expect(name);
        assert_eq!(store.node_health().await.expect(name).len(), 1, "{name}");

        // Another controller on the same store.
        let again = SharedEngine::new(Engine::new(EngineConfig::default(), now));
        let n = Persister::new(store.clone())
            .restore_ledger(&again)
            .await
            .expect(name);
        assert_eq!(n, 1, "{name}");
        assert_eq!(
            again.lock().ledger().state("node-3"),
            HealthState::Quarantined,
            "{name}"
        );
        assert_eq!(
            again.lock().ledger().node("node-3").cloned(),
            engine.lock().ledger().node("node-3").cloned(),
            "{name}"
        );

        store
            .put_node_health("node-4", "bad", now, "{not json")
            .await
            .expect(name);
        match Persister::new(store.clone()).restore_ledger(&again).await {
            Err(StoreError::Corrupt { what, id, .. }) => {
                assert_eq!((what, id.as_str()), ("node health", "node-4"), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}
