//! Controller configuration: a YAML file, `WARDEN_*` environment overrides and flags, in
//! that order of precedence (flags win), validated as a whole so every mistake is
//! reported at once, each naming the field and where it came from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
pub use warden_model::config::{ConfigError, ConfigErrors};

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
        }
    }
}

impl ConfigFile {
    /// Parse a YAML document. Every unknown field and every ill-typed value is reported,
    /// not only the first one.
    pub fn from_yaml(text: &str, origin: &str) -> Result<ConfigFile, ConfigErrors> {
        let (file, errors) = Self::parse_partial(text, origin);
        if errors.is_empty() {
            Ok(file)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The fields that parsed, and an error for each one that did not.
    fn parse_partial(text: &str, origin: &str) -> (ConfigFile, Vec<ConfigError>) {
        let err = |field: String, message: String| ConfigError {
            origin: origin.to_owned(),
            field,
            message,
        };
        let doc: serde_yaml_ng::Value = match serde_yaml_ng::from_str(text) {
            Ok(d) => d,
            Err(e) => {
                return (
                    ConfigFile::default(),
                    vec![err(String::new(), e.to_string())],
                );
            }
        };
        let mapping = match doc {
            serde_yaml_ng::Value::Null => return (ConfigFile::default(), vec![]),
            serde_yaml_ng::Value::Mapping(m) => m,
            _ => {
                let msg = "expected a mapping of settings at the top level".to_owned();
                return (ConfigFile::default(), vec![err(String::new(), msg)]);
            }
        };
        // Check each entry on its own, so one mistake does not hide the next.
        let mut errors = Vec::new();
        let mut out = ConfigFile::default();
        for (key, value) in mapping {
            let name = match &key {
                serde_yaml_ng::Value::String(s) => s.clone(),
                other => format!("{other:?}"),
            };
            let mut single = serde_yaml_ng::Mapping::new();
            single.insert(key, value);
            let parsed: Result<ConfigFile, _> =
                serde_path_to_error::deserialize(serde_yaml_ng::Value::Mapping(single));
            match parsed {
                Ok(one) => {
                    out.listen = one.listen.or(out.listen);
                    out.max_batch_bytes = one.max_batch_bytes.or(out.max_batch_bytes);
                    out.tick_interval_ms = one.tick_interval_ms.or(out.tick_interval_ms);
                    out.diagnosis = one.diagnosis.or(out.diagnosis);
                    out.data_dir = one.data_dir.or(out.data_dir);
                    out.database_url = one.database_url.or(out.database_url);
                    out.tokens_file = one.tokens_file.or(out.tokens_file);
                    out.alerts = one.alerts.or(out.alerts);
                    out.advertise_url = one.advertise_url.or(out.advertise_url);
                    out.tls = one.tls.or(out.tls);
                    out.traces = one.traces.or(out.traces);
                    out.remediation = one.remediation.or(out.remediation);
                }
                Err(e) => errors.push(err(name, e.into_inner().to_string())),
            }
        }
        (out, errors)
    }
}

fn parse_listen(value: &str, origin: &str, errors: &mut Vec<ConfigError>) -> Option<SocketAddr> {
    match value.trim().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(e) => {
            errors.push(ConfigError {
                origin: origin.to_owned(),
                field: "listen".into(),
                message: format!("{value:?} is not a socket address like 127.0.0.1:9460 ({e})"),
            });
            None
        }
    }
}

fn parse_u64(value: &str, field: &str, origin: &str, errors: &mut Vec<ConfigError>) -> Option<u64> {
    match value.trim().parse::<u64>() {
        Ok(n) => Some(n),
        Err(e) => {
            errors.push(ConfigError {
                origin: origin.to_owned(),
                field: field.into(),
                message: format!("{value:?} is not a whole number ({e})"),
            });
            None
        }
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
        let mut errors = Vec::new();
        let parsed = match file {
            None => ConfigFile::default(),
            Some(path) => {
                let origin = path.display().to_string();
                match std::fs::read_to_string(path) {
                    Ok(text) => {
                        let (file, file_errors) = ConfigFile::parse_partial(&text, &origin);
                        errors.extend(file_errors);
                        file
                    }
                    Err(e) => {
                        errors.push(ConfigError {
                            origin,
                            field: String::new(),
                            message: format!("cannot read the file: {e}"),
                        });
                        ConfigFile::default()
                    }
                }
            }
        };
        let file_origin = file.map_or_else(String::new, |p| p.display().to_string());
        let mut cfg = ControllerConfig {
            store: StoreLocation::Dir(default_data_dir(&env)),
            ..ControllerConfig::default()
        };
        // Store and tokens: flag, then environment, then file.
        let data_dir = flags
            .data_dir
            .clone()
            .or_else(|| env("WARDEN_DATA_DIR").map(PathBuf::from))
            .or_else(|| parsed.data_dir.clone());
        let (url, url_origin) = match (&flags.database_url, env("WARDEN_DATABASE_URL")) {
            (Some(u), _) => (Some(u.clone()), "flag --database-url".to_owned()),
            (None, Some(u)) => (Some(u), "environment WARDEN_DATABASE_URL".to_owned()),
            (None, None) => (parsed.database_url.clone(), file_origin.clone()),
        };
        match url {
            Some(u)
                if !(u.starts_with("postgres://")
                    || u.starts_with("postgresql://")
                    || u.starts_with("sqlite:")) =>
            {
                errors.push(ConfigError {
                    origin: url_origin,
                    field: "database_url".into(),
                    message: "expected postgres://USER@HOST:PORT/DB or sqlite://PATH".into(),
                });
            }
            Some(u) => cfg.store = StoreLocation::Url(u),
            None => {
                if let Some(d) = data_dir {
                    cfg.store = StoreLocation::Dir(d);
                }
            }
        }
        cfg.advertise_url = env("WARDEN_ADVERTISE_URL").or_else(|| parsed.advertise_url.clone());
        if let Some(u) = &cfg.advertise_url {
            let rest = u
                .strip_prefix("http://")
                .or_else(|| u.strip_prefix("https://"));
            if rest.is_none_or(str::is_empty) {
                errors.push(ConfigError {
                    origin: file_origin.clone(),
                    field: "advertise_url".into(),
                    message: format!("{u:?} is not an http:// or https:// base URL"),
                });
            }
        }
        cfg.tls = parsed.tls.clone();
        if let Some(t) = &parsed.traces {
            for (field, message) in t.problems() {
                errors.push(ConfigError {
                    origin: file_origin.clone(),
                    field,
                    message,
                });
            }
            cfg.traces = t.clone();
        }
        if let Some(r) = &parsed.remediation {
            for (field, message) in r.problems() {
                errors.push(ConfigError {
                    origin: file_origin.clone(),
                    field,
                    message,
                });
            }
            cfg.remediation = r.clone();
        }
        cfg.tokens_file = flags
            .tokens_file
            .clone()
            .or_else(|| env("WARDEN_TOKENS_FILE").map(PathBuf::from))
            .or_else(|| parsed.tokens_file.clone());

        // The file.
        if let Some(l) = &parsed.listen
            && let Some(a) = parse_listen(l, &file_origin, &mut errors)
        {
            cfg.listen = a;
        }
        let mut batch_origin = file_origin.clone();
        let mut batch = parsed.max_batch_bytes;
        let mut tick_origin = file_origin.clone();
        let mut tick = parsed.tick_interval_ms;

        if let Some(d) = &parsed.diagnosis {
            for (field, message) in d.problems() {
                errors.push(ConfigError {
                    origin: file_origin.clone(),
                    field,
                    message,
                });
            }
            cfg.diagnosis = d.clone();
        }

        if let Some(a) = &parsed.alerts {
            errors.extend(a.validate(&file_origin, "alerts"));
            cfg.alerts = a.clone();
        }

        // The environment.
        if let Some(v) = env("WARDEN_LISTEN")
            && let Some(a) = parse_listen(&v, "environment WARDEN_LISTEN", &mut errors)
        {
            cfg.listen = a;
        }
        if let Some(v) = env("WARDEN_MAX_BATCH_BYTES") {
            batch_origin = "environment WARDEN_MAX_BATCH_BYTES".into();
            batch = parse_u64(&v, "max_batch_bytes", &batch_origin, &mut errors).or(batch);
        }
        if let Some(v) = env("WARDEN_TICK_INTERVAL_MS") {
            tick_origin = "environment WARDEN_TICK_INTERVAL_MS".into();
            tick = parse_u64(&v, "tick_interval_ms", &tick_origin, &mut errors).or(tick);
        }

        // The flags.
        if let Some(l) = &flags.listen
            && let Some(a) = parse_listen(l, "flag --listen", &mut errors)
        {
            cfg.listen = a;
        }

        // Ranges.
        if let Some(b) = batch {
            if b == 0 || b > MAX_MAX_BATCH_BYTES {
                errors.push(ConfigError {
                    origin: batch_origin,
                    field: "max_batch_bytes".into(),
                    message: format!("{b} is outside 1..={MAX_MAX_BATCH_BYTES}"),
                });
            } else {
                cfg.max_batch_bytes = usize::try_from(b).unwrap_or(usize::MAX);
            }
        }
        if let Some(t) = tick {
            if !(MIN_TICK_INTERVAL_MS..=MAX_TICK_INTERVAL_MS).contains(&t) {
                errors.push(ConfigError {
                    origin: tick_origin,
                    field: "tick_interval_ms".into(),
                    message: format!(
                        "{t} is outside {MIN_TICK_INTERVAL_MS}..={MAX_TICK_INTERVAL_MS}"
                    ),
                });
            } else {
                cfg.tick_interval_ms = t;
            }
        }
        if cfg.tokens_file.is_none() && !cfg.listen.ip().is_loopback() {
            errors.push(ConfigError {
                origin: "listen".into(),
                field: "tokens_file".into(),
                message: format!(
                    "the API listens on {}, beyond this host, so it needs a token file \
                     (tokens_file, WARDEN_TOKENS_FILE or --tokens-file); make one with \
                     `warden-controller token`",
                    cfg.listen
                ),
            });
        }
        if errors.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigErrors(errors))
        }
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
        let fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["listen", "tick_interval_ms", "listen", "max_batch_bytes"],
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
}
