//! Controller configuration: a YAML file, `WARDEN_*` environment overrides and flags, in
//! that order of precedence (flags win), validated as a whole so every mistake is
//! reported at once, each naming the field and where it came from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
pub use warden_config::{ConfigError, ConfigErrors, Loaded, Provenance};
use warden_config::{Loader, whole};

use crate::api::DEFAULT_MAX_BATCH_BYTES;
use crate::diagnosis::DiagnosisConfig;

/// Default listen address of the controller.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9460";
/// Default interval between detector passes, milliseconds.
pub const DEFAULT_TICK_INTERVAL_MS: u64 = 250;
/// Smallest accepted `tick_interval_ms`.
pub const MIN_TICK_INTERVAL_MS: u64 = 10;
/// Largest accepted `tick_interval_ms`.
pub const MAX_TICK_INTERVAL_MS: u64 = 60_000;
/// Largest accepted `max_batch_bytes` (1 GiB).
pub const MAX_MAX_BATCH_BYTES: u64 = 1 << 30;

/// The controller configuration file, as written. Every field is optional; what is left
/// out keeps its default.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Address the HTTP API, `/metrics` and the probes listen on (`host:port`).
    pub listen: Option<String>,
    /// Largest ingest body accepted, bytes; larger batches are refused with 413.
    pub max_batch_bytes: Option<u64>,
    /// Interval between detector passes, milliseconds.
    pub tick_interval_ms: Option<u64>,
    /// Diagnosis of new incidents from the agents' logs (see `docs/DIAGNOSIS.md`).
    pub diagnosis: Option<DiagnosisConfig>,
    /// Directory of the embedded SQLite store (`warden.db`), when no `database_url`.
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL URL of the store (`postgres://...`); the credentials in it are never
    /// logged. Prefer `WARDEN_DATABASE_URL` from a secret to writing it here.
    pub database_url: Option<String>,
    /// Token file of the API (`docs/API.md`, "Authentication"); required unless the API
    /// listens on a loopback address only.
    pub tokens_file: Option<PathBuf>,
    /// Incident alerts to Alertmanager and a webhook (`docs/ALERTS.md`).
    pub alerts: Option<crate::alerts::AlertsConfig>,
    /// The base URL other controllers reach this one at (`http://HOST:PORT`), for
    /// several controllers on one PostgreSQL; default: `http://` and the listen address.
    pub advertise_url: Option<String>,
    /// Serve the API over https (`docs/API.md`, "TLS").
    pub tls: Option<crate::tls::TlsConfig>,
    /// OpenTelemetry traces of the incident pipeline over OTLP (`docs/METRICS.md`,
    /// "Traces").
    pub traces: Option<crate::telemetry::TracesConfig>,
    /// Remediation: policy, safety rails and the actuator (`docs/REMEDIATION.md`).
    pub remediation: Option<crate::remedy::run::RemedyConfig>,
    /// Limits of the HTTP server: header and idle timeouts, connection caps
    /// (`docs/API.md`, "Connections").
    pub server: Option<warden_http::server::ServerConfig>,
    /// What the detection engine holds at most (`docs/OPERATIONS.md`, "Limits"); each
    /// left out keeps its default.
    pub limits: Option<LimitsConfig>,
}

/// The `limits` section: the engine's bounds on what it holds, raised (or lowered) for
/// a fleet of a known size. Records past a bound are refused and counted in
/// `warden_ingest_refused_records_total{bound}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Jobs held at once.
    pub max_jobs: Option<u64>,
    /// Ranks held at once, over all jobs.
    pub max_ranks: Option<u64>,
    /// Nodes (agents) held at once.
    pub max_nodes: Option<u64>,
    /// Communicators one job may have.
    pub max_comms_per_job: Option<u64>,
    /// Bytes of job and node state held at once, as the engine counts them.
    pub max_state_bytes: Option<u64>,
}

impl LimitsConfig {
    /// Each field: its name, what it was given, its bounds, and where it goes in the
    /// engine's limits.
    #[allow(clippy::type_complexity)]
    fn fields<'a>(
        &self,
        l: &'a mut warden_engine::state::Limits,
    ) -> [(&'static str, Option<u64>, (u64, u64), &'a mut usize); 5] {
        [
            ("max_jobs", self.max_jobs, (1, 1 << 20), &mut l.max_jobs),
            ("max_ranks", self.max_ranks, (1, 1 << 23), &mut l.max_ranks),
            ("max_nodes", self.max_nodes, (1, 1 << 21), &mut l.max_nodes),
            (
                "max_comms_per_job",
                self.max_comms_per_job,
                (1, 1 << 24),
                &mut l.max_comms_per_job,
            ),
            (
                "max_state_bytes",
                self.max_state_bytes,
                (1 << 20, 1 << 37),
                &mut l.max_state_bytes,
            ),
        ]
    }

    /// Every field outside its bounds, as (`limits.FIELD`, what is wrong).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut scratch = warden_engine::state::Limits::default();
        self.fields(&mut scratch)
            .into_iter()
            .filter_map(|(field, v, (lo, hi), _)| {
                let v = v?;
                (!(lo..=hi).contains(&v)).then(|| {
                    (
                        format!("limits.{field}"),
                        format!("{v} is outside {lo}..={hi}"),
                    )
                })
            })
            .collect()
    }

    /// `base` with the fields given here (within their bounds) in place of its own.
    pub fn apply(&self, mut base: warden_engine::state::Limits) -> warden_engine::state::Limits {
        for (_, v, (lo, hi), slot) in self.fields(&mut base) {
            if let Some(v) = v.filter(|v| (lo..=hi).contains(v)) {
                *slot = usize::try_from(v).unwrap_or(usize::MAX);
            }
        }
        base
    }
}

/// The settings a flag can override (`None`: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--database-url`.
    pub database_url: Option<String>,
    /// `--tokens-file`.
    pub tokens_file: Option<PathBuf>,
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `warden.db` in this directory.
    Dir(PathBuf),
    /// A database URL.
    Url(String),
}

/// The default data directory: systemd's `$STATE_DIRECTORY` when set, else
/// `/var/lib/warden`.
pub fn default_data_dir(env: &impl Fn(&str) -> Option<String>) -> PathBuf {
    env("STATE_DIRECTORY")
        .and_then(|v| v.split(':').next().map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/var/lib/warden"))
}

/// The effective controller configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// Address the HTTP server listens on.
    pub listen: SocketAddr,
    /// Largest ingest body accepted, bytes.
    pub max_batch_bytes: usize,
    /// Interval between detector passes, milliseconds.
    pub tick_interval_ms: u64,
    /// Diagnosis of new incidents.
    pub diagnosis: DiagnosisConfig,
    /// The store.
    pub store: StoreLocation,
    /// The API's token file; `None`: the API is open (loopback listeners only).
    pub tokens_file: Option<PathBuf>,
    /// Incident alerts.
    pub alerts: crate::alerts::AlertsConfig,
    /// The base URL other controllers reach this one at; `None`: from the listen address.
    pub advertise_url: Option<String>,
    /// https settings; `None`: plain http.
    pub tls: Option<crate::tls::TlsConfig>,
    /// Trace export (off unless an endpoint is configured here or in the standard
    /// `OTEL_EXPORTER_OTLP_*` variables).
    pub traces: crate::telemetry::TracesConfig,
    /// Remediation (dry run unless turned on).
    pub remediation: crate::remedy::run::RemedyConfig,
    /// Limits of the HTTP server.
    pub server: warden_http::server::Limits,
    /// What the detection engine holds at most.
    pub limits: warden_engine::state::Limits,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9460)),
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            tick_interval_ms: DEFAULT_TICK_INTERVAL_MS,
            diagnosis: DiagnosisConfig::default(),
            store: StoreLocation::Dir(PathBuf::from("/var/lib/warden")),
            tokens_file: None,
            alerts: crate::alerts::AlertsConfig::default(),
            advertise_url: None,
            tls: None,
            traces: crate::telemetry::TracesConfig::default(),
            remediation: crate::remedy::run::RemedyConfig::default(),
            server: warden_http::server::Limits::default(),
            limits: warden_engine::state::Limits::default(),
        }
    }
}

/// Every top-level key of the file.
const KEYS: [&str; 14] = [
    "listen",
    "max_batch_bytes",
    "tick_interval_ms",
    "diagnosis",
    "data_dir",
    "database_url",
    "tokens_file",
    "alerts",
    "advertise_url",
    "tls",
    "traces",
    "remediation",
    "server",
    "limits",
];

impl ConfigFile {
    /// Parse a YAML document. Every unknown field and every ill-typed value is reported,
    /// not only the first one.
    pub fn from_yaml(text: &str, origin: &str) -> Result<ConfigFile, ConfigErrors> {
        Loader::read_text(text, origin, ConfigFile::read)
    }

    /// The file's sections, each checked on its own so that one mistake does not hide
    /// the next; unknown keys are mistakes.
    fn read(l: &mut Loader<'_>) -> ConfigFile {
        let file = ConfigFile {
            listen: l.section("listen"),
            max_batch_bytes: l.section("max_batch_bytes"),
            tick_interval_ms: l.section("tick_interval_ms"),
            diagnosis: l.section("diagnosis"),
            data_dir: l.section("data_dir"),
            database_url: l.section("database_url"),
            tokens_file: l.section("tokens_file"),
            alerts: l.section("alerts"),
            advertise_url: l.section("advertise_url"),
            tls: l.section("tls"),
            traces: l.section("traces"),
            remediation: l.section("remediation"),
            server: l.section("server"),
            limits: l.section("limits"),
        };
        l.unknown_keys(&KEYS);
        file
    }
}

/// A socket address like `127.0.0.1:9460`.
fn parse_listen(value: &String) -> Result<SocketAddr, String> {
    value
        .trim()
        .parse::<SocketAddr>()
        .map_err(|e| format!("{value:?} is not a socket address like {DEFAULT_LISTEN} ({e})"))
}

/// A whole number within `lo..=hi`.
fn whole_within(value: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let n = whole(value)?;
    if (lo..=hi).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} is outside {lo}..={hi}"))
    }
}

impl ControllerConfig {
    /// The effective configuration: defaults, then the file (when given), then the
    /// environment (`env` looks a variable up; pass `|k| std::env::var(k).ok()`), then
    /// the flags. Every error is collected before returning.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<ControllerConfig, ConfigErrors> {
        Self::load_traced(file, env, flags).map(|l| l.config)
    }

    /// [`ControllerConfig::load`], with where each setting given came from.
    pub fn load_traced(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<Loaded<ControllerConfig>, ConfigErrors> {
        let mut l = Loader::new(file, env);
        let parsed = ConfigFile::read(&mut l);
        let fo = l.file_origin().to_owned();
        let mut cfg = ControllerConfig {
            store: StoreLocation::Dir(default_data_dir(&|k: &str| l.env(k))),
            ..ControllerConfig::default()
        };

        // The store: a database URL (flag, environment, file), else a data directory.
        let sources = l.sources(
            parsed.data_dir.clone(),
            Some("WARDEN_DATA_DIR"),
            Some(("--data-dir", flags.data_dir.clone())),
        );
        let data_dir = l.layer("data_dir", sources, |d: &PathBuf| Ok(d.clone()));
        let sources = l.sources(
            parsed.database_url.clone(),
            Some("WARDEN_DATABASE_URL"),
            Some(("--database-url", flags.database_url.clone())),
        );
        let url = l.layer("database_url", sources, |u: &String| {
            if u.starts_with("postgres://")
                || u.starts_with("postgresql://")
                || u.starts_with("sqlite:")
            {
                Ok(u.clone())
            } else {
                Err("expected postgres://USER@HOST:PORT/DB or sqlite://PATH".into())
            }
        });
        match (url, data_dir) {
            (Some(u), _) => cfg.store = StoreLocation::Url(u),
            (None, Some(d)) => cfg.store = StoreLocation::Dir(d),
            (None, None) => {}
        }
        let sources = l.sources(
            parsed.advertise_url.clone(),
            Some("WARDEN_ADVERTISE_URL"),
            None,
        );
        cfg.advertise_url = l.layer("advertise_url", sources, |u: &String| {
            let rest = u
                .strip_prefix("http://")
                .or_else(|| u.strip_prefix("https://"));
            if rest.is_none_or(str::is_empty) {
                Err(format!("{u:?} is not an http:// or https:// base URL"))
            } else {
                Ok(u.clone())
            }
        });
        let sources = l.sources(
            parsed.tokens_file.clone(),
            Some("WARDEN_TOKENS_FILE"),
            Some(("--tokens-file", flags.tokens_file.clone())),
        );
        cfg.tokens_file = l.layer("tokens_file", sources, |p: &PathBuf| Ok(p.clone()));

        // Sections checked as a whole.
        cfg.tls = parsed.tls.clone();
        let mut problems = Vec::new();
        if let Some(t) = &parsed.traces {
            problems.extend(t.problems());
            cfg.traces = t.clone();
        }
        if let Some(r) = &parsed.remediation {
            problems.extend(r.problems());
            cfg.remediation = r.clone();
        }
        if let Some(d) = &parsed.diagnosis {
            problems.extend(d.problems());
            cfg.diagnosis = d.clone();
        }
        if let Some(s) = &parsed.server {
            problems.extend(s.problems("server"));
            cfg.server = s.limits(cfg.server);
        }
        if let Some(lim) = &parsed.limits {
            problems.extend(lim.problems());
            cfg.limits = lim.apply(cfg.limits);
        }
        for (field, message) in problems {
            l.push(&fo, &field, message);
        }
        if let Some(a) = &parsed.alerts {
            for e in a.validate(&fo, "alerts") {
                l.push(&e.origin, &e.field, e.message);
            }
            cfg.alerts = a.clone();
        }

        // Settings of their own.
        let sources = l.sources(
            parsed.listen.clone(),
            Some("WARDEN_LISTEN"),
            Some(("--listen", flags.listen.clone())),
        );
        if let Some(a) = l.layer("listen", sources, parse_listen) {
            cfg.listen = a;
        }
        let sources = l.sources(
            parsed.max_batch_bytes.map(|n| n.to_string()),
            Some("WARDEN_MAX_BATCH_BYTES"),
            None,
        );
        if let Some(b) = l.layer("max_batch_bytes", sources, |v| {
            whole_within(v, 1, MAX_MAX_BATCH_BYTES)
        }) {
            cfg.max_batch_bytes = usize::try_from(b).unwrap_or(usize::MAX);
        }
        let sources = l.sources(
            parsed.tick_interval_ms.map(|n| n.to_string()),
            Some("WARDEN_TICK_INTERVAL_MS"),
            None,
        );
        if let Some(t) = l.layer("tick_interval_ms", sources, |v| {
            whole_within(v, MIN_TICK_INTERVAL_MS, MAX_TICK_INTERVAL_MS)
        }) {
            cfg.tick_interval_ms = t;
        }
        if cfg.tokens_file.is_none() && !cfg.listen.ip().is_loopback() {
            l.push(
                "listen",
                "tokens_file",
                format!(
                    "the API listens on {}, beyond this host, so it needs a token file \
                     (tokens_file, WARDEN_TOKENS_FILE or --tokens-file); make one with \
                     `warden-controller token`",
                    cfg.listen
                ),
            );
        }
        l.finish(|| Some(cfg))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("warden-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn defaults_without_file_env_or_flags() {
        let cfg = ControllerConfig::load(None, no_env, &Overrides::default()).expect("ok");
        assert_eq!(cfg, ControllerConfig::default());
        assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(cfg.max_batch_bytes, 16 * 1024 * 1024);
    }

    #[test]
    fn unknown_field_is_named_and_every_error_is_reported() {
        let text = "listen: 127.0.0.1:1\ntick_intervall_ms: 5\nmax_batch_bytes: lots\n";
        let errs = ConfigFile::from_yaml(text, "c.yaml").expect_err("must fail");
        assert_eq!(errs.0.len(), 2, "{errs}");
        let msg = errs.to_string();
        assert!(
            msg.contains("c.yaml: field `tick_intervall_ms`: unknown field"),
            "{msg}"
        );
        assert!(
            msg.contains("field `max_batch_bytes`: invalid type"),
            "{msg}"
        );
    }

    #[test]
    fn file_then_env_then_flag() {
        let path = write(
            "layers.yaml",
            "listen: 127.0.0.1:7000\ntick_interval_ms: 500\n",
        );
        let cfg = ControllerConfig::load(Some(&path), no_env, &Overrides::default()).expect("ok");
        assert_eq!(cfg.listen.port(), 7000);
        assert_eq!(cfg.tick_interval_ms, 500);

        let env: HashMap<&str, &str> = [
            ("WARDEN_LISTEN", "0.0.0.0:7001"),
            ("WARDEN_TICK_INTERVAL_MS", "100"),
            ("WARDEN_MAX_BATCH_BYTES", "2048"),
            ("WARDEN_TOKENS_FILE", "/etc/warden/tokens.yaml"),
            ("WARDEN_DATABASE_URL", "postgres://warden@db:5432/warden"),
        ]
        .into();
        let lookup = |k: &str| env.get(k).map(|v| (*v).to_owned());
        let cfg = ControllerConfig::load(Some(&path), lookup, &Overrides::default()).expect("ok");
        assert_eq!(cfg.listen.to_string(), "0.0.0.0:7001");
        assert_eq!((cfg.tick_interval_ms, cfg.max_batch_bytes), (100, 2048));
        assert_eq!(
            cfg.store,
            StoreLocation::Url("postgres://warden@db:5432/warden".into())
        );
        assert!(cfg.tokens_file.is_some());

        let flags = Overrides {
            listen: Some("127.0.0.1:7002".into()),
            data_dir: Some("/srv/warden".into()),
            ..Overrides::default()
        };
        let cfg = ControllerConfig::load(Some(&path), lookup, &flags).expect("ok");
        assert_eq!(cfg.listen.port(), 7002);
    }

    #[test]
    fn diagnosis_section_is_read_and_checked_as_a_whole() {
        let path = write(
            "diagnosis.yaml",
            "diagnosis:\n  agent_url: http://{node}.agents:9461\n  agent_urls:\n    gpu-node02: http://127.0.0.1:9471\n  peer_nodes: 3\n  llm:\n    base_url: http://127.0.0.1:8000/v1\n    model: qwen\n",
        );
        let cfg = ControllerConfig::load(Some(&path), no_env, &Overrides::default()).expect("ok");
        assert_eq!(cfg.diagnosis.agent_url, "http://{node}.agents:9461");
        assert_eq!(cfg.diagnosis.peer_nodes, 3);
        assert_eq!(
            cfg.diagnosis
                .agent_urls
                .get("gpu-node02")
                .map(String::as_str),
            Some("http://127.0.0.1:9471")
        );
        assert_eq!(cfg.diagnosis.before_secs, 300.0, "defaults kept");
        assert_eq!(
            cfg.diagnosis.llm.as_ref().map(|l| l.model.as_str()),
            Some("qwen")
        );

        let path = write(
            "bad-diagnosis.yaml",
            "diagnosis:\n  agent_url: ftp://x\n  agent_urls: {n1: ftp://y}\n  before_secs: -1\n  max_in_flight: 0\n",
        );
        let errs = ControllerConfig::load(Some(&path), no_env, &Overrides::default())
            .expect_err("must fail");
        let msg = errs.to_string();
        for field in [
            "diagnosis.agent_url",
            "diagnosis.agent_urls.n1",
            "diagnosis.before_secs",
            "diagnosis.max_in_flight",
        ] {
            assert!(msg.contains(field), "{field} not named: {msg}");
        }
        let errs = ConfigFile::from_yaml("diagnosis:\n  agent_urls: x\n", "c.yaml")
            .expect_err("not a map");
        let msg = errs.to_string();
        assert!(
            msg.contains("diagnosis") && msg.contains("expected a map"),
            "{msg}"
        );
        let errs = ConfigFile::from_yaml("diagnosis:\n  agent_url_map: {}\n", "c.yaml")
            .expect_err("unknown field");
        assert!(errs.to_string().contains("agent_url_map"), "{errs}");
    }

    #[test]
    fn a_listener_beyond_loopback_needs_tokens_and_the_store_is_placed() {
        let flags = Overrides {
            listen: Some("0.0.0.0:9460".into()),
            ..Overrides::default()
        };
        let msg = ControllerConfig::load(None, no_env, &flags)
            .expect_err("needs tokens")
            .to_string();
        assert!(
            msg.contains("tokens_file") && msg.contains("0.0.0.0:9460"),
            "{msg}"
        );
        let env = |k: &str| (k == "STATE_DIRECTORY").then(|| "/var/lib/x:/var/lib/y".to_owned());
        let cfg = ControllerConfig::load(None, env, &Overrides::default()).expect("ok");
        assert_eq!(cfg.store, StoreLocation::Dir("/var/lib/x".into()));
        let bad = |k: &str| (k == "WARDEN_DATABASE_URL").then(|| "mysql://x".to_owned());
        let msg = ControllerConfig::load(None, bad, &Overrides::default())
            .expect_err("mysql")
            .to_string();
        assert!(
            msg.contains("WARDEN_DATABASE_URL") && msg.contains("database_url"),
            "{msg}"
        );
    }

    #[test]
    fn bad_listen_address_names_the_field_and_its_origin() {
        let flags = Overrides {
            listen: Some("localhost".into()),
            ..Overrides::default()
        };
        let errs = ControllerConfig::load(None, no_env, &flags).expect_err("must fail");
        let msg = errs.to_string();
        assert!(msg.contains("flag --listen: field `listen`"), "{msg}");

        let env = |k: &str| (k == "WARDEN_TICK_INTERVAL_MS").then(|| "fast".to_owned());
        let path = write("bad-listen.yaml", "listen: ':::'\nmax_batch_bytes: 0\n");
        let errs = ControllerConfig::load(Some(&path), env, &flags).expect_err("must fail");
        let mut found: Vec<_> = errs
            .0
            .iter()
            .map(|e| (e.field.as_str(), e.origin.rsplit('/').next().unwrap_or("")))
            .collect();
        found.sort_unstable();
        assert_eq!(
            found,
            [
                ("listen", "bad-listen.yaml"),
                ("listen", "flag --listen"),
                ("max_batch_bytes", "bad-listen.yaml"),
                ("tick_interval_ms", "environment WARDEN_TICK_INTERVAL_MS"),
            ],
            "{errs}"
        );
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let path = Path::new("/nonexistent/warden.yaml");
        let errs =
            ControllerConfig::load(Some(path), no_env, &Overrides::default()).expect_err("fails");
        assert!(
            errs.to_string()
                .contains("/nonexistent/warden.yaml: cannot read"),
            "{errs}"
        );
    }

    #[test]
    fn server_limits_are_bounded_and_named() {
        let path = write(
            "server.yaml",
            "server:\n  header_timeout_secs: 5\n  max_connections: 1000\n",
        );
        let cfg = ControllerConfig::load(Some(&path), no_env, &Overrides::default()).expect("ok");
        assert_eq!(cfg.server.header_timeout, std::time::Duration::from_secs(5));
        let limits = cfg.server;
        assert_eq!(
            (limits.max_connections, limits.max_connections_per_peer),
            (1000, 500)
        );
        let path = write(
            "bad-server.yaml",
            "server:\n  idle_timeout_secs: 0\n  max_connections: 2000000\n",
        );
        let errs = ControllerConfig::load(Some(&path), no_env, &Overrides::default())
            .expect_err("out of bounds");
        let mut fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["server.idle_timeout_secs", "server.max_connections"],
            "{errs}"
        );
    }

    #[test]
    fn engine_limits_are_raised_bounded_and_named() {
        let path = write(
            "limits.yaml",
            "limits:\n  max_ranks: 300000\n  max_state_bytes: 2147483648\n",
        );
        let cfg = ControllerConfig::load(Some(&path), no_env, &Overrides::default()).expect("ok");
        let d = warden_engine::state::Limits::default();
        assert_eq!(cfg.limits.max_ranks, 300_000);
        assert_eq!(cfg.limits.max_state_bytes, 2 << 30);
        assert_eq!(cfg.limits.max_nodes, d.max_nodes, "left out: the default");
        let path = write(
            "bad-limits.yaml",
            "limits:\n  max_ranks: 0\n  max_state_bytes: 1024\n  max_nodes: 9\n  max_threads: 4\n",
        );
        let errs = ControllerConfig::load(Some(&path), no_env, &Overrides::default())
            .expect_err("out of bounds");
        let text = errs.to_string();
        assert!(
            text.contains("max_threads"),
            "an unknown field is named: {text}"
        );
        let path = write(
            "low-limits.yaml",
            "limits:\n  max_ranks: 0\n  max_state_bytes: 1024\n  max_nodes: 9\n",
        );
        let errs = ControllerConfig::load(Some(&path), no_env, &Overrides::default())
            .expect_err("out of bounds");
        let mut fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["limits.max_ranks", "limits.max_state_bytes"],
            "{errs}"
        );
    }
}
