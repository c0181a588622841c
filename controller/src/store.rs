//! The incident store: incidents and their full timelines, diagnoses, drained nodes, the
//! audit log of actions, jobs and leadership leases, in an embedded SQLite file by
//! default or in PostgreSQL, through one sqlx `Any` pool and one set of migrations.
//!
//! Every statement is written once for both databases: TEXT and BIGINT columns, `$N`
//! parameters, `ON CONFLICT ... DO UPDATE` upserts. Times are nanoseconds since the Unix
//! epoch. A document that no longer parses is reported with its id, never skipped.

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use warden_model::{Incident, IncidentKind, IncidentState, TimelineEntry, Timestamp};

mod migrate;

/// The schema version this binary brings its database to: the highest version among
/// the migrations embedded from `controller/migrations/`.
pub fn latest_schema_version() -> i64 {
    migrate::latest(&migrate::migrator())
}

/// Largest page of a list query.
pub const MAX_PAGE: u32 = 1000;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL is not one the store speaks.
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    /// The SQLite file's directory could not be created.
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The database could not be reached or opened.
    #[error("cannot open the {backend} database {target}: {source}")]
    Open {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// Where (a file, or host and database; never credentials).
        target: String,
        /// Why.
        source: sqlx::Error,
    },
    /// A migration's SQL failed (nothing of the run was kept).
    #[error("migration {version} ({name}) failed: {source}")]
    Migrate {
        /// Its version.
        version: i64,
        /// Its name (the file name's description).
        name: String,
        /// Why.
        source: sqlx::Error,
    },
    /// Migrating failed outside any one migration's SQL: the lock, the migrations
    /// table, a migration applied earlier whose file has since changed.
    #[error("migrating the schema failed ({what}): {source}")]
    Migrator {
        /// What the migration run was doing.
        what: &'static str,
        /// Why.
        source: sqlx::migrate::MigrateError,
    },
    /// The database holds migrations newer than this binary knows.
    #[error(
        "the database is at schema version {found}, newer than this controller's {known}; \
         run a newer controller"
    )]
    TooNew {
        /// Highest version applied.
        found: i64,
        /// Highest version known here.
        known: i64,
    },
    /// A query failed.
    #[error("database query ({what}) failed: {source}")]
    Query {
        /// What the query was for.
        what: &'static str,
        /// Why.
        source: sqlx::Error,
    },
    /// A stored document does not parse.
    #[error("stored {what} {id:?} is unreadable: {detail}")]
    Corrupt {
        /// What kind of record.
        what: &'static str,
        /// Its id.
        id: String,
        /// The parse error.
        detail: String,
    },
}

fn q(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { what, source }
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// The INSERT recording `a` as intended.
fn intend_query(a: &ActionRecord) -> AnyQuery<'_> {
    sqlx::query(
        "INSERT INTO actions (id, kind, target, incident_id, actor, reason, dry_run, \
             status, result, intended_at, finished_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'intended', NULL, $8, NULL)",
    )
    .bind(&a.id)
    .bind(a.kind.as_str())
    .bind(&a.target)
    .bind(a.incident.as_deref())
    .bind(&a.actor)
    .bind(&a.reason)
    .bind(flag(a.dry_run))
    .bind(a.intended_at.0)
}

/// The upsert of remediation state `name`.
fn state_query<'q>(name: &'q str, doc: &'q str, at: Timestamp) -> AnyQuery<'q> {
    sqlx::query(
        "INSERT INTO remediation_state (name, doc, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (name) DO UPDATE SET doc = excluded.doc, \
             updated_at = excluded.updated_at",
    )
    .bind(name)
    .bind(doc)
    .bind(at.0)
}

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An embedded SQLite file (or memory).
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

impl Backend {
    /// `sqlite` or `postgres`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// The store: a connection pool and the backend behind it.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

/// Filters and paging of an incident list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncidentFilter {
    /// Only this state.
    pub state: Option<IncidentState>,
    /// Only this kind.
    pub kind: Option<IncidentKind>,
    /// Only this job.
    pub job: Option<String>,
    /// Only incidents naming this node as a culprit.
    pub node: Option<String>,
    /// Only incidents whose id sorts after this one (the previous page's last id).
    pub after: Option<String>,
    /// At most this many (0: [`MAX_PAGE`]).
    pub limit: u32,
}

pub use warden_model::view::{ActionKind, ActionRecord, ActionStatus};

/// A node Warden drained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Node name.
    pub name: String,
    /// `drained` (the only state stored; a node without a record is schedulable).
    pub state: String,
    /// Who owns the drain (a token's name, or `warden`).
    pub owner: String,
    /// Why it was drained.
    pub reason: String,
    /// The incident behind it, if any.
    pub incident: Option<String>,
    /// Since when.
    pub since: Timestamp,
    /// The action that drained it.
    pub action: Option<String>,
}

/// A job as last stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// Job id.
    pub id: String,
    /// The serialized view.
    pub doc: String,
}

/// Make sure the `Any` drivers are installed (once per process).
fn install_drivers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(sqlx::any::install_default_drivers);
}

/// Where a database URL points, without credentials.
fn describe(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            let host = host.split('?').next().unwrap_or(host);
            format!("{scheme}://{host}")
        }
        None => url.split('?').next().unwrap_or(url).to_owned(),
    }
}

fn flag(b: bool) -> i64 {
    i64::from(b)
}

fn ts(t: Option<i64>) -> Option<Timestamp> {
    t.map(Timestamp)
}

impl Store {
    /// Open the database at `url` (`sqlite://PATH`, `sqlite::memory:`, `postgres://...`)
    /// and bring its schema up to date.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        install_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(StoreError::UnsupportedUrl(describe(url)));
        };
        let memory = url.contains(":memory:");
        let options = AnyPoolOptions::new()
            // One connection keeps an in-memory database alive and shared; a file gets
            // a few readers beside the writer.
            .max_connections(match (backend, memory) {
                (Backend::Sqlite, true) => 1,
                (Backend::Sqlite, false) => 4,
                (Backend::Postgres, _) => 8,
            })
            .min_connections(u32::from(memory))
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(300))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(1800))
            })
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        sqlx::raw_sql("PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON;")
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            });
        let pool = options
            .connect(url)
            .await
            .map_err(|source| StoreError::Open {
                backend: backend.as_str(),
                target: describe(url),
                source,
            })?;
        if backend == Backend::Sqlite && !memory {
            sqlx::raw_sql("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
                .execute(&pool)
                .await
                .map_err(q("setting SQLite's journal mode"))?;
        }
        let store = Store { pool, backend };
        store.migrate().await?;
        Ok(store)
    }

    /// Open (creating as needed) the SQLite file `warden.db` in `dir`.
    pub async fn open_dir(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
            path: dir.display().to_string(),
            source,
        })?;
        let file = dir.join("warden.db");
        Store::open(&format!("sqlite://{}?mode=rwc", file.display())).await
    }

    /// A fresh in-memory SQLite store (tests, simulations).
    pub async fn memory() -> Result<Store, StoreError> {
        Store::open("sqlite::memory:").await
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool, for leadership (which needs a connection of its own).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Highest schema version applied.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        let v: Option<i64> = sqlx::query("SELECT MAX(version) FROM _sqlx_migrations")
            .fetch_one(&self.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(q("reading the schema version"))?;
        Ok(v.unwrap_or(0))
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(q("ping"))?;
        Ok(())
    }

    // ---- incidents -------------------------------------------------------------------

    /// Write `inc` (insert or replace) and append `timeline` to its stored timeline,
    /// numbered from `first_seq`, in one transaction; with `new_diagnosis`, its
    /// diagnosis joins the diagnosis history too.
    pub async fn save_incident(
        &self,
        inc: &Incident,
        timeline: &[TimelineEntry],
        first_seq: i64,
        new_diagnosis: bool,
    ) -> Result<(), StoreError> {
        let doc = serde_json::to_string(inc).map_err(|e| StoreError::Corrupt {
            what: "incident",
            id: inc.id.clone(),
            detail: e.to_string(),
        })?;
        let nodes = if inc.nodes.is_empty() {
            String::new()
        } else {
            format!(",{},", inc.nodes.join(","))
        };
        let mut tx = self.pool.begin().await.map_err(q("saving an incident"))?;
        sqlx::query(
            "INSERT INTO incidents (id, kind, job, state, acknowledged, severity, nodes, \
                 detected_at, updated_at, resolved_at, summary, doc) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, job = excluded.job, \
                 state = excluded.state, acknowledged = excluded.acknowledged, \
                 severity = excluded.severity, nodes = excluded.nodes, \
                 detected_at = excluded.detected_at, updated_at = excluded.updated_at, \
                 resolved_at = excluded.resolved_at, summary = excluded.summary, \
                 doc = excluded.doc",
        )
        .bind(&inc.id)
        .bind(inc.kind.as_str())
        .bind(inc.job.as_deref())
        .bind(inc.state.as_str())
        .bind(flag(inc.acknowledged))
        .bind(inc.severity.as_str())
        .bind(nodes)
        .bind(inc.detected_at.0)
        .bind(inc.updated_at.0)
        .bind(inc.resolved_at.map(|t| t.0))
        .bind(&inc.summary)
        .bind(doc)
        .execute(&mut *tx)
        .await
        .map_err(q("saving an incident"))?;
        for (i, e) in timeline.iter().enumerate() {
            let seq = first_seq + i64::try_from(i).unwrap_or(i64::MAX - first_seq);
            sqlx::query(
                "INSERT INTO incident_timeline (incident_id, seq, at, what) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (incident_id, seq) DO NOTHING",
            )
            .bind(&inc.id)
            .bind(seq)
            .bind(e.at.0)
            .bind(&e.what)
            .execute(&mut *tx)
            .await
            .map_err(q("saving a timeline entry"))?;
        }
        if let Some(d) = inc.diagnosis.as_ref().filter(|_| new_diagnosis) {
            let ddoc = serde_json::to_string(d).map_err(|e| StoreError::Corrupt {
                what: "diagnosis",
                id: inc.id.clone(),
                detail: e.to_string(),
            })?;
            sqlx::query(
                "INSERT INTO diagnoses (incident_id, at, source, category, doc) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (incident_id, at) DO NOTHING",
            )
            .bind(&inc.id)
            .bind(inc.updated_at.0)
            .bind(&d.source)
            .bind(d.category.as_deref())
            .bind(ddoc)
            .execute(&mut *tx)
            .await
            .map_err(q("saving a diagnosis"))?;
        }
        tx.commit().await.map_err(q("saving an incident"))?;
        Ok(())
    }

    fn incident_of(row: &AnyRow) -> Result<Incident, StoreError> {
        let id: String = row.try_get("id").map_err(q("reading an incident"))?;
        let doc: String = row.try_get("doc").map_err(q("reading an incident"))?;
        serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
            what: "incident",
            id,
            detail: e.to_string(),
        })
    }

    /// One incident with its whole stored timeline, or `None`.
    pub async fn incident(&self, id: &str) -> Result<Option<Incident>, StoreError> {
        let row = sqlx::query("SELECT id, doc FROM incidents WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("reading an incident"))?;
        let Some(row) = row else { return Ok(None) };
        let mut inc = Self::incident_of(&row)?;
        let timeline = self.timeline(id).await?;
        if !timeline.is_empty() {
            inc.timeline = timeline;
        }
        Ok(Some(inc))
    }

    /// The whole stored timeline of incident `id`, oldest first.
    pub async fn timeline(&self, id: &str) -> Result<Vec<TimelineEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT at, what FROM incident_timeline WHERE incident_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(q("reading a timeline"))?;
        rows.iter()
            .map(|r| {
                Ok(TimelineEntry {
                    at: Timestamp(r.try_get("at").map_err(q("reading a timeline"))?),
                    what: r.try_get("what").map_err(q("reading a timeline"))?,
                })
            })
            .collect()
    }

    /// How many timeline entries incident `id` has stored.
    pub async fn timeline_len(&self, id: &str) -> Result<i64, StoreError> {
        let n: Option<i64> =
            sqlx::query("SELECT MAX(seq) + 1 FROM incident_timeline WHERE incident_id = $1")
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .and_then(|r| r.try_get(0))
                .map_err(q("counting a timeline"))?;
        Ok(n.unwrap_or(0))
    }

    /// Incidents matching `filter`, in id order (oldest first), with the recent timeline
    /// their documents carry.
    pub async fn incidents(&self, filter: &IncidentFilter) -> Result<Vec<Incident>, StoreError> {
        let mut sql = String::from("SELECT id, doc FROM incidents WHERE 1 = 1");
        let mut args: Vec<String> = Vec::new();
        let mut cond = |sql: &mut String, column: &str, op: &str, value: String| {
            args.push(value);
            sql.push_str(&format!(" AND {column} {op} ${}", args.len()));
        };
        if let Some(s) = filter.state {
            cond(&mut sql, "state", "=", s.as_str().to_owned());
        }
        if let Some(k) = filter.kind {
            cond(&mut sql, "kind", "=", k.as_str().to_owned());
        }
        if let Some(j) = &filter.job {
            cond(&mut sql, "job", "=", j.clone());
        }
        if let Some(n) = &filter.node {
            cond(&mut sql, "nodes", "LIKE", format!("%,{},%", like_escape(n)));
            sql.push_str(" ESCAPE '\\'");
        }
        if let Some(a) = &filter.after {
            cond(&mut sql, "id", ">", a.clone());
        }
        let limit = if filter.limit == 0 {
            MAX_PAGE
        } else {
            filter.limit.min(MAX_PAGE)
        };
        sql.push_str(&format!(" ORDER BY id LIMIT {limit}"));
        // Safe: only fixed column names and operators are spliced in; values are bound.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for a in &args {
            query = query.bind(a.as_str());
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(q("listing incidents"))?;
        rows.iter().map(Self::incident_of).collect()
    }

    /// Incidents not resolved, or resolved at or after `resolved_since`: the ones a
    /// restarted controller keeps grouping findings into.
    pub async fn live_incidents(
        &self,
        resolved_since: Timestamp,
    ) -> Result<Vec<Incident>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, doc FROM incidents WHERE state <> 'resolved' OR resolved_at >= $1 \
             ORDER BY id",
        )
        .bind(resolved_since.0)
        .fetch_all(&self.pool)
        .await
        .map_err(q("loading live incidents"))?;
        rows.iter().map(Self::incident_of).collect()
    }

    // ---- actions ---------------------------------------------------------------------

    /// Record `a` as intended (its status is ignored: it is stored as intended).
    pub async fn intend(&self, a: &ActionRecord) -> Result<(), StoreError> {
        intend_query(a)
            .execute(&self.pool)
            .await
            .map_err(q("recording an intended action"))?;
        Ok(())
    }

    /// Write remediation state `name` and record `a` as intended in one transaction:
    /// a decision and the action it calls for are stored together or not at all.
    pub async fn put_remediation_state_and_intend(
        &self,
        name: &str,
        doc: &str,
        at: Timestamp,
        a: &ActionRecord,
    ) -> Result<(), StoreError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(q("starting a transaction"))?;
        state_query(name, doc, at)
            .execute(&mut *tx)
            .await
            .map_err(q("writing remediation state"))?;
        intend_query(a)
            .execute(&mut *tx)
            .await
            .map_err(q("recording an intended action"))?;
        tx.commit()
            .await
            .map_err(q("committing remediation state and an intended action"))?;
        Ok(())
    }

    /// Record action `id` as finished with `status` and `result`. Returns false when it
    /// was already finished (nothing changes then).
    pub async fn finish(
        &self,
        id: &str,
        status: ActionStatus,
        result: &str,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE actions SET status = $1, result = $2, finished_at = $3 \
             WHERE id = $4 AND status = 'intended'",
        )
        .bind(status.as_str())
        .bind(result)
        .bind(at.0)
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(q("recording a finished action"))?;
        Ok(done.rows_affected() == 1)
    }

    fn action_of(r: &AnyRow) -> Result<ActionRecord, StoreError> {
        let e = || q("reading an action");
        let id: String = r.try_get("id").map_err(e())?;
        let kind: String = r.try_get("kind").map_err(e())?;
        let status: String = r.try_get("status").map_err(e())?;
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "action",
            id: id.clone(),
            detail,
        };
        Ok(ActionRecord {
            kind: kind
                .parse()
                .map_err(|()| corrupt(format!("unknown kind {kind:?}")))?,
            status: status
                .parse()
                .map_err(|()| corrupt(format!("unknown status {status:?}")))?,
            target: r.try_get("target").map_err(e())?,
            incident: r.try_get("incident_id").map_err(e())?,
            actor: r.try_get("actor").map_err(e())?,
            reason: r.try_get("reason").map_err(e())?,
            dry_run: r.try_get::<i64, _>("dry_run").map_err(e())? != 0,
            result: r.try_get("result").map_err(e())?,
            intended_at: Timestamp(r.try_get("intended_at").map_err(e())?),
            finished_at: ts(r.try_get("finished_at").map_err(e())?),
            id,
        })
    }

    /// Actions recorded as intended and never finished, oldest first.
    pub async fn unfinished_actions(&self) -> Result<Vec<ActionRecord>, StoreError> {
        let rows =
            sqlx::query("SELECT * FROM actions WHERE status = 'intended' ORDER BY intended_at, id")
                .fetch_all(&self.pool)
                .await
                .map_err(q("loading unfinished actions"))?;
        rows.iter().map(Self::action_of).collect()
    }

    /// The audit log, oldest first: actions with ids after `after`, at most `limit`.
    pub async fn actions(
        &self,
        after: Option<&str>,
        target: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ActionRecord>, StoreError> {
        let limit = if limit == 0 {
            MAX_PAGE
        } else {
            limit.min(MAX_PAGE)
        };
        // Safe: the only spliced value is a number.
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT * FROM actions WHERE id > $1 AND ($2 = '' OR target = $2) \
             ORDER BY id LIMIT {limit}"
        )))
        .bind(after.unwrap_or(""))
        .bind(target.unwrap_or(""))
        .fetch_all(&self.pool)
        .await
        .map_err(q("listing actions"))?;
        rows.iter().map(Self::action_of).collect()
    }

    // ---- nodes -----------------------------------------------------------------------

    fn node_of(r: &AnyRow) -> Result<NodeRecord, StoreError> {
        let e = || q("reading a node");
        Ok(NodeRecord {
            name: r.try_get("name").map_err(e())?,
            state: r.try_get("state").map_err(e())?,
            owner: r
                .try_get::<Option<String>, _>("owner")
                .map_err(e())?
                .unwrap_or_default(),
            reason: r
                .try_get::<Option<String>, _>("reason")
                .map_err(e())?
                .unwrap_or_default(),
            incident: r.try_get("incident_id").map_err(e())?,
            since: Timestamp(r.try_get("since").map_err(e())?),
            action: r.try_get("action_id").map_err(e())?,
        })
    }

    /// The drain record of node `name`, if it is drained.
    /// A remediation state document (`None` before it was first written).
    pub async fn remediation_state(&self, name: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT doc FROM remediation_state WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("reading remediation state"))?;
        row.map(|r| r.try_get::<String, _>("doc"))
            .transpose()
            .map_err(q("reading remediation state"))
    }

    /// Write a remediation state document.
    pub async fn put_remediation_state(
        &self,
        name: &str,
        doc: &str,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        state_query(name, doc, at)
            .execute(&self.pool)
            .await
            .map_err(q("writing remediation state"))?;
        Ok(())
    }

    /// A drained node's record.
    pub async fn node(&self, name: &str) -> Result<Option<NodeRecord>, StoreError> {
        let row = sqlx::query("SELECT * FROM nodes WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(q("reading a node"))?;
        row.as_ref().map(Self::node_of).transpose()
    }

    /// Every drained node, by name.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM nodes ORDER BY name")
            .fetch_all(&self.pool)
            .await
            .map_err(q("listing nodes"))?;
        rows.iter().map(Self::node_of).collect()
    }

    /// Record node `n` as drained (replacing any earlier record).
    pub async fn put_node(&self, n: &NodeRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO nodes (name, state, owner, reason, incident_id, since, action_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (name) DO UPDATE SET state = excluded.state, owner = excluded.owner, \
                 reason = excluded.reason, incident_id = excluded.incident_id, \
                 since = excluded.since, action_id = excluded.action_id",
        )
        .bind(&n.name)
        .bind(&n.state)
        .bind(&n.owner)
        .bind(&n.reason)
        .bind(n.incident.as_deref())
        .bind(n.since.0)
        .bind(n.action.as_deref())
        .execute(&self.pool)
        .await
        .map_err(q("recording a node"))?;
        Ok(())
    }

    /// Forget node `name`'s drain. Returns whether there was one.
    pub async fn remove_node(&self, name: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM nodes WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(q("removing a node"))?;
        Ok(r.rows_affected() > 0)
    }

    // ---- node health -----------------------------------------------------------------

    /// Write one node's ledger document (replacing the earlier one).
    pub async fn put_node_health(
        &self,
        node: &str,
        state: &str,
        since: Timestamp,
        doc: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO node_health (node, state, since, doc) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (node) DO UPDATE SET state = excluded.state, \
                 since = excluded.since, doc = excluded.doc",
        )
        .bind(node)
        .bind(state)
        .bind(since.0)
        .bind(doc)
        .execute(&self.pool)
        .await
        .map_err(q("writing node health"))?;
        Ok(())
    }

    /// Every node's ledger document, by node: `(node, doc)`.
    pub async fn node_health(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT node, doc FROM node_health ORDER BY node")
            .fetch_all(&self.pool)
            .await
            .map_err(q("reading node health"))?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("node").map_err(q("reading node health"))?,
                    r.try_get("doc").map_err(q("reading node health"))?,
                ))
            })
            .collect()
    }

    // ---- jobs ------------------------------------------------------------------------

    /// Write job `id` with its serialized view.
    pub async fn save_job(
        &self,
        id: &str,
        phase: &str,
        doc: &str,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO jobs (id, phase, updated_at, doc) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET phase = excluded.phase, \
                 updated_at = excluded.updated_at, doc = excluded.doc",
        )
        .bind(id)
        .bind(phase)
        .bind(at.0)
        .bind(doc)
        .execute(&self.pool)
        .await
        .map_err(q("saving a job"))?;
        Ok(())
    }

    /// Every stored job, by id.
    pub async fn jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        let rows = sqlx::query("SELECT id, doc FROM jobs ORDER BY id")
            .fetch_all(&self.pool)
            .await
            .map_err(q("listing jobs"))?;
        rows.iter()
            .map(|r| {
                Ok(JobRecord {
                    id: r.try_get("id").map_err(q("listing jobs"))?,
                    doc: r.try_get("doc").map_err(q("listing jobs"))?,
                })
            })
            .collect()
    }
}

/// `s` with LIKE's wildcards and the escape character escaped by `\`.
fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_described_without_credentials() {
        assert_eq!(
            describe("postgres://warden:hunter2@db.example:5432/warden?sslmode=require"),
            "postgres://db.example:5432/warden"
        );
        assert_eq!(
            describe("sqlite:///var/lib/warden/warden.db?mode=rwc"),
            "sqlite:///var/lib/warden/warden.db"
        );
    }

    #[test]
    fn like_wildcards_are_escaped() {
        assert_eq!(like_escape("node_1%"), "node\\_1\\%");
    }
}
