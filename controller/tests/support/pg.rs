//! A fresh database on the real PostgreSQL server for one test, dropped afterwards.
//! The server is named by `WARDEN_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); it must be running (`scripts/test`
//! starts it when it is not), and a test that cannot reach it fails, naming the URL.
//! A test that stops and starts the server runs one of its own instead ([`PrivatePg`]).

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

/// A PostgreSQL server of this test's own (for a test that stops and starts it): a
/// cluster made by `initdb` in a temp dir, on a free loopback port, run as the
/// `postgres` user when the test runs as root (the server refuses root). Stopped with
/// `pg_ctl stop -m immediate` on drop.
pub struct PrivatePg {
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    /// Its port.
    pub port: u16,
    as_postgres: bool,
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`: `WARDEN_PG_BIN`, else the
/// newest `/usr/lib/postgresql/*/bin`, else the directory of `pg_ctl` on `PATH`.
pub fn server_bin_dir() -> Option<std::path::PathBuf> {
    if let Some(dir) = std::env::var_os("WARDEN_PG_BIN") {
        return Some(dir.into());
    }
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("pg_ctl").exists() && d.join("initdb").exists())
    })
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

impl PrivatePg {
    /// Make the cluster and start it. `None` (after saying why, loudly) when the server
    /// binaries are missing; under `CI=true` that is a failure instead.
    pub fn start() -> Option<PrivatePg> {
        let Some(bin) = server_bin_dir() else {
            let why = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in \
                       /usr/lib/postgresql/*/bin, WARDEN_PG_BIN or PATH";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why}");
            }
            eprintln!("SKIPPED: {why}");
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("warden-pg-")
            .tempdir()
            .expect("temp dir");
        let as_postgres = running_as_root();
        if as_postgres {
            let chowned = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown runs");
            assert!(chowned.success(), "chown of the cluster dir to postgres");
        }
        let pg = PrivatePg {
            bin,
            dir,
            port: super::free_port(),
            as_postgres,
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        pg.up();
        Some(pg)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Run a server program (as `postgres` when root); panics naming it on failure.
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            std::process::Command::new(&path)
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("{} does not run: {e}", path.display()));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Start the server and wait until it accepts connections.
    pub fn up(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &opts,
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Stop it at once, as a crash would (`pg_ctl stop -m immediate`): every
    /// connection is cut.
    pub fn down(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let path = self.bin.join("pg_ctl");
        let data = self.data();
        let mut cmd = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            std::process::Command::new(&path)
        };
        // Already stopped is fine; nothing else can be done about a failure here.
        let _ = cmd
            .args(["-D", &data, "-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
