//! A fresh database on the real PostgreSQL server for one test, dropped afterwards.
//! The server is named by `WARDEN_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); it must be running (`scripts/test`
//! starts it when it is not), and a test that cannot reach it fails, naming the URL.

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection;

/// The server's admin URL.
pub fn admin_url() -> String {
    std::env::var("WARDEN_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A database of its own on the test server.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    url: String,
}

async fn admin() -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    let url = admin_url();
    sqlx::AnyConnection::connect(&url)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot reach the test PostgreSQL at {url} ({e}); start it (scripts/test does) \
             or point WARDEN_TEST_DATABASE_URL at one"
            )
        })
}

impl TestDb {
    /// Create an empty database named after this process and a counter.
    pub async fn create() -> TestDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "warden_test_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = admin().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name}"
        )))
        .execute(&mut conn)
        .await
        .expect("dropping a leftover test database");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("creating the test database");
        let base = admin_url();
        let (server, _) = base.rsplit_once('/').expect("the URL names a database");
        TestDb {
            url: format!("{server}/{name}"),
            name,
        }
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside any runtime's reach; a thread of its own has one.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut conn = admin().await;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(_))) {
            eprintln!("note: could not drop test database {}", self.name);
        }
    }
}
