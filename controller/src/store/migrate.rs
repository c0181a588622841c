//! The store's schema migrations: `controller/migrations/` embedded by sqlx's
//! `migrate!` (from `sqlx-macros`, without the query macros) and run by sqlx's
//! migrator, recorded in sqlx's `_sqlx_migrations` table.
//!
//! All pending migrations run in one transaction (PostgreSQL and SQLite both take DDL
//! transactionally; sqlx's per-migration transactions become savepoints inside it), under
//! the store's advisory lock on PostgreSQL beside sqlx's own, so two controllers starting
//! together apply each migration once: the second waits, then finds nothing to do.
//!
//! A database migrated before sqlx ran the migrations records them in `warden_migrations`
//! instead. Opening it copies the versions applied there into `_sqlx_migrations` (with
//! sqlx's checksums of the embedded migrations) and drops the old table, in that same
//! transaction.

use std::collections::BTreeSet;

use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{Any, Connection, Row, Transaction};

use super::{Backend, Store, StoreError};

/// The migrations this binary knows, embedded at build time. sqlx's own lock (a
/// PostgreSQL advisory lock per database) stays on, and a database holding a migration
/// not known here is refused.
pub(super) fn migrator() -> Migrator {
    let mut migrator = sqlx_macros::migrate!("./migrations");
    migrator.set_locking(true).set_ignore_missing(false);
    migrator
}

/// The highest version among `migrator`'s migrations (0 with none).
pub(super) fn latest(migrator: &Migrator) -> i64 {
    migrator.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Where sqlx records the applied migrations (its default name).
const SQLX_TABLE: &str = "_sqlx_migrations";

/// Where the store recorded them before sqlx ran the migrations.
const OLD_TABLE: &str = "warden_migrations";

/// Key of the PostgreSQL advisory lock held (for the transaction) while migrating, the
/// key the earlier runner took too, so the bridge from its table and the migrations never
/// run twice at once, whichever controller version starts beside.
const MIGRATION_LOCK: i64 = 0x5741_5244_454e_0001;

/// Why `what` failed, outside any one migration's SQL.
fn failed(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Migrator {
        what,
        source: MigrateError::Execute(e),
    }
}

impl Store {
    /// Bring the schema up to date (see the module's documentation).
    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = migrator();
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(failed("taking a connection"))?;
        let outcome = self.migrate_on(&mut conn, &migrator).await;
        if outcome.is_err() {
            // A run that stopped half way may still hold sqlx's session-level advisory
            // lock on this connection: close it instead of handing it back to the pool.
            // The transaction was rolled back; closing can only fail on a dead link.
            if let Err(e) = conn.close().await {
                tracing::debug!(error = %e, "closing the migrating connection");
            }
        }
        let applied = outcome?;
        for (version, name) in applied {
            tracing::info!(
                version,
                name,
                backend = self.backend.as_str(),
                "migration applied"
            );
        }
        Ok(())
    }

    /// Migrate on `conn` in one transaction; the migrations applied, as (version, name).
    async fn migrate_on(
        &self,
        conn: &mut sqlx::AnyConnection,
        migrator: &Migrator,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let known = latest(migrator);
        let mut tx = conn
            .begin()
            .await
            .map_err(failed("starting the transaction"))?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATION_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(failed("taking the migration lock"))?;
        }
        self.bridge(&mut tx, migrator, known).await?;
        let before = if self.has_table(&mut tx, SQLX_TABLE).await? {
            applied_versions(&mut tx).await?
        } else {
            BTreeSet::new()
        };
        match migrator.run(&mut tx).await {
            Ok(()) => {}
            Err(MigrateError::VersionMissing(version)) => {
                let found = applied_versions(&mut tx)
                    .await?
                    .last()
                    .copied()
                    .unwrap_or(version);
                return Err(if found > known {
                    StoreError::TooNew { found, known }
                } else {
                    StoreError::Migrator {
                        what: "checking the applied migrations",
                        source: MigrateError::VersionMissing(version),
                    }
                });
            }
            Err(MigrateError::ExecuteMigration(source, version)) => {
                let name = migrator
                    .iter()
                    .find(|m| m.version == version)
                    .map_or_else(String::new, |m| m.description.to_string());
                return Err(StoreError::Migrate {
                    version,
                    name,
                    source,
                });
            }
            Err(source) => {
                return Err(StoreError::Migrator {
                    what: "applying the migrations",
                    source,
                });
            }
        }
        tx.commit().await.map_err(failed("committing"))?;
        Ok(migrator
            .iter()
            .filter(|m| !before.contains(&m.version))
            .map(|m| (m.version, m.description.to_string()))
            .collect())
    }

    /// A database migrated by the earlier runner (`warden_migrations`, no
    /// `_sqlx_migrations`): record its applied versions in sqlx's table, so that sqlx
    /// sees them applied and unchanged, and drop the old table. Refuses (before changing
    /// anything) a database whose old table holds versions newer than this binary's.
    async fn bridge(
        &self,
        tx: &mut Transaction<'_, Any>,
        migrator: &Migrator,
        known: i64,
    ) -> Result<(), StoreError> {
        if !self.has_table(tx, OLD_TABLE).await? || self.has_table(tx, SQLX_TABLE).await? {
            return Ok(());
        }
        let what = "recording the migrations of warden_migrations in _sqlx_migrations";
        let applied: BTreeSet<i64> = sqlx::query("SELECT version FROM warden_migrations")
            .fetch_all(&mut **tx)
            .await
            .and_then(|rows| rows.iter().map(|r| r.try_get::<i64, _>(0)).collect())
            .map_err(failed(what))?;
        if let Some(&found) = applied.last()
            && found > known
        {
            return Err(StoreError::TooNew { found, known });
        }
        tx.ensure_migrations_table(SQLX_TABLE)
            .await
            .map_err(|source| StoreError::Migrator { what, source })?;
        for migration in migrator.iter().filter(|m| applied.contains(&m.version)) {
            // Records the migration as applied, with the checksum sqlx computed for the
            // embedded file, without running its SQL.
            tx.skip(SQLX_TABLE, migration)
                .await
                .map_err(|source| StoreError::Migrator { what, source })?;
        }
        sqlx::raw_sql("DROP TABLE warden_migrations")
            .execute(&mut **tx)
            .await
            .map_err(failed(what))?;
        tracing::info!(
            versions = ?applied,
            backend = self.backend.as_str(),
            "migrations recorded by the earlier runner moved to _sqlx_migrations"
        );
        Ok(())
    }

    /// Whether the table `name` exists (in the current schema, on PostgreSQL).
    async fn has_table(
        &self,
        tx: &mut Transaction<'_, Any>,
        name: &str,
    ) -> Result<bool, StoreError> {
        let sql = match self.backend {
            Backend::Sqlite => {
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1"
            }
            Backend::Postgres => {
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = $1"
            }
        };
        let n: i64 = sqlx::query(sql)
            .bind(name)
            .fetch_one(&mut **tx)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(failed("looking for the migrations table"))?;
        Ok(n > 0)
    }
}

/// The versions `_sqlx_migrations` records as applied.
async fn applied_versions(tx: &mut Transaction<'_, Any>) -> Result<BTreeSet<i64>, StoreError> {
    sqlx::query("SELECT version FROM _sqlx_migrations")
        .fetch_all(&mut **tx)
        .await
        .and_then(|rows| rows.iter().map(|r| r.try_get::<i64, _>(0)).collect())
        .map_err(failed("reading the applied migrations"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_files_parse_as_consecutive_versions() {
        let migrator = migrator();
        let found: Vec<(i64, String)> = migrator
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect();
        assert_eq!(
            found,
            [
                (1, "init".to_owned()),
                (2, "remediation".to_owned()),
                (3, "node health".to_owned())
            ]
        );
        assert_eq!(latest(&migrator), 3);
        assert!(
            migrator.iter().all(|m| !m.no_tx),
            "every migration runs inside the one migration transaction"
        );
    }
}
