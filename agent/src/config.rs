//! Agent configuration: a YAML file, `WARDEN_*` environment overrides and flags, in that
//! order of precedence (flags win), validated as a whole so that every mistake is
//! reported at once, each naming the field (`controller.flush_interval_ms`) and where the
//! value came from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use warden_config::Loader;
pub use warden_config::{ConfigError, ConfigErrors, Loaded, Provenance};

use crate::logs::{ConfigError as LogsConfigError, PresetCatalog, TailConfig as LogsConfig};

/// Default address of the agent's `/metrics`, `/healthz` and local API.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9461";

/// The configuration file, as written. Every field is optional; what is left out keeps
/// its default.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Name this node reports as (default: `--node-name`, `NODE_NAME`, the hostname).
    pub node_name: Option<String>,
    /// Address `/metrics`, `/healthz` and the local API listen on (`host:port`).
    pub listen: Option<String>,
    /// Where and how to ship signals.
    pub controller: Option<ControllerFile>,
    /// GPU telemetry through NVML.
    pub nvml: Option<NvmlFile>,
    /// Hardware and kernel events from the kernel log.
    pub kmsg: Option<KmsgFile>,
    /// Training logs to tail.
    pub logs: Option<LogsConfig>,
    /// The local log window the controller can pull from.
    pub log_window: Option<LogWindowFile>,
    /// Collective progress reported from inside training processes.
    pub capture: Option<CaptureFile>,
    /// Limits of the local API's HTTP server: timeouts and connection caps.
    pub server: Option<warden_http::server::ServerConfig>,
    /// Pod, namespace and container labels on GPU metrics, from the kubelet.
    pub pod_resources: Option<PodResourcesFile>,
}

/// `pod_resources:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodResourcesFile {
    /// Read the kubelet's pod-resources API when its socket exists (default true).
    pub enabled: Option<bool>,
    /// The kubelet's socket (default `/var/lib/kubelet/pod-resources/kubelet.sock`).
    pub socket: Option<PathBuf>,
    /// Interval between reads, milliseconds.
    pub interval_ms: Option<u64>,
    /// Device-plugin resources whose device ids are GPU UUIDs (default
    /// `nvidia.com/gpu` and `nvidia.com/gpu.shared`).
    pub resources: Option<Vec<String>>,
}

/// Effective pod-resources settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PodResourcesConfig {
    /// Read the kubelet's pod-resources API when its socket exists.
    pub enabled: bool,
    /// The kubelet's socket.
    pub socket: PathBuf,
    /// Interval between reads.
    pub interval: Duration,
    /// Device-plugin resources whose device ids are GPU UUIDs.
    pub resources: Vec<String>,
}

impl Default for PodResourcesConfig {
    fn default() -> Self {
        PodResourcesConfig {
            enabled: true,
            socket: PathBuf::from(crate::pod_resources::DEFAULT_SOCKET),
            interval: Duration::from_secs(10),
            resources: crate::pod_resources::DEFAULT_RESOURCES
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        }
    }
}

/// `capture:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureFile {
    /// Listen for training processes (default true).
    pub enabled: Option<bool>,
    /// The Unix datagram socket `warden_torch` sends to (default
    /// `/run/warden/capture.sock`; processes find it through `WARDEN_AGENT_SOCKET`).
    pub socket: Option<PathBuf>,
    /// Where the pids of training processes are looked up (default `/proc`).
    pub proc_root: Option<PathBuf>,
    /// Where `warden-nccl-profiler` keeps its segments (default `/dev/shm/warden`).
    pub shm_dir: Option<PathBuf>,
}

/// Effective job-side capture settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureConfig {
    /// Listen for training processes.
    pub enabled: bool,
    /// The Unix datagram socket.
    pub socket: PathBuf,
    /// Where pids are looked up.
    pub proc_root: PathBuf,
    /// Where NCCL profiler segments are read from.
    pub shm_dir: PathBuf,
}

/// Default path of the capture socket.
pub const DEFAULT_CAPTURE_SOCKET: &str = "/run/warden/capture.sock";

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            enabled: true,
            socket: PathBuf::from(DEFAULT_CAPTURE_SOCKET),
            proc_root: PathBuf::from("/proc"),
            shm_dir: PathBuf::from("/dev/shm/warden"),
        }
    }
}

/// `controller:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerFile {
    /// Base URL of the controller (`http://warden-controller:9460`); without it the
    /// agent collects and exports metrics but ships nothing.
    pub url: Option<String>,
    /// File holding the bearer token sent with every batch (never logged).
    pub token_file: Option<PathBuf>,
    /// PEM file of CA certificates to trust, beside the public roots, for an https
    /// controller URL (a private CA).
    pub ca_file: Option<PathBuf>,
    /// Interval between batches, milliseconds.
    pub flush_interval_ms: Option<u64>,
    /// Longest time without any batch; an idle agent sends a heartbeat this often.
    pub heartbeat_interval_ms: Option<u64>,
    /// Time allowed for one delivery, milliseconds.
    pub request_timeout_ms: Option<u64>,
    /// Bound on batches kept while the controller is unreachable, bytes (oldest dropped).
    pub buffer_max_bytes: Option<u64>,
    /// First retry delay after a failed delivery, milliseconds (doubles, jittered).
    pub backoff_initial_ms: Option<u64>,
    /// Longest retry delay, milliseconds.
    pub backoff_max_ms: Option<u64>,
    /// Most log lines shipped per second; the rest stay in the local window.
    pub max_log_lines_per_sec: Option<u32>,
}

/// `nvml:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmlFile {
    /// Collect GPU telemetry (default true).
    pub enabled: Option<bool>,
    /// Path of `libnvidia-ml.so.1` (default: the loader's search path).
    pub library: Option<PathBuf>,
    /// Interval between samples, milliseconds.
    pub interval_ms: Option<u64>,
    /// Temperature that raises a thermal event, degrees Celsius.
    pub temperature_warn_c: Option<f64>,
    /// Also export dcgm-exporter's metric names (`DCGM_FI_DEV_*`).
    pub dcgm_compat: Option<bool>,
}

/// `kmsg:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KmsgFile {
    /// Watch the kernel log (default true).
    pub enabled: Option<bool>,
    /// `/dev/kmsg` (records) or a text file in dmesg/syslog form that is followed.
    pub path: Option<PathBuf>,
    /// Where the boot id is read from.
    pub boot_id_path: Option<PathBuf>,
    /// Most distinct events remembered per boot.
    pub max_distinct_events: Option<usize>,
}

/// `log_window:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogWindowFile {
    /// Bytes of recent log lines kept for the local API.
    pub max_bytes: Option<u64>,
}

/// The settings a flag can override (`None`: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--node-name` (clap also fills it from `NODE_NAME`).
    pub node_name: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--controller-url`.
    pub controller_url: Option<String>,
}

/// Effective shipping settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ShipConfig {
    /// Controller base URL; `None` ships nothing.
    pub url: Option<String>,
    /// Bearer token file.
    pub token_file: Option<PathBuf>,
    /// CA file for an https controller URL.
    pub ca_file: Option<PathBuf>,
    /// Interval between batches.
    pub flush_interval: Duration,
    /// Idle heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Time allowed for one delivery.
    pub request_timeout: Duration,
    /// Bound on kept batches, bytes.
    pub buffer_max_bytes: usize,
    /// First retry delay.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Most log lines shipped per second.
    pub max_log_lines_per_sec: u32,
}

impl Default for ShipConfig {
    fn default() -> Self {
        ShipConfig {
            url: None,
            token_file: None,
            ca_file: None,
            flush_interval: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            buffer_max_bytes: 8 << 20,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_log_lines_per_sec: 200,
        }
    }
}

/// Effective NVML settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlConfig {
    /// Collect GPU telemetry.
    pub enabled: bool,
    /// Library path.
    pub library: Option<PathBuf>,
    /// Sampling interval.
    pub interval: Duration,
    /// Thermal event threshold, °C.
    pub temperature_warn_c: f64,
    /// Export `DCGM_FI_DEV_*` names too.
    pub dcgm_compat: bool,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            enabled: true,
            library: None,
            interval: Duration::from_secs(1),
            temperature_warn_c: 87.0,
            dcgm_compat: false,
        }
    }
}

/// Effective kernel-log settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KmsgConfig {
    /// Watch the kernel log.
    pub enabled: bool,
    /// `/dev/kmsg` or a followed text file.
    pub path: PathBuf,
    /// Boot id file.
    pub boot_id_path: PathBuf,
    /// Most distinct events per boot.
    pub max_distinct_events: usize,
}

impl Default for KmsgConfig {
    fn default() -> Self {
        KmsgConfig {
            enabled: true,
            path: PathBuf::from("/dev/kmsg"),
            boot_id_path: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            max_distinct_events: crate::dedup::DEFAULT_MAX_KEYS,
        }
    }
}

/// The effective agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Node name reported in every batch.
    pub node_name: String,
    /// Listen address of `/metrics`, `/healthz` and the local API.
    pub listen: SocketAddr,
    /// Shipping.
    pub ship: ShipConfig,
    /// GPU telemetry.
    pub nvml: NvmlConfig,
    /// Kernel log.
    pub kmsg: KmsgConfig,
    /// Training logs.
    pub logs: LogsConfig,
    /// Bytes of recent log lines kept for the local API.
    pub log_window_bytes: usize,
    /// Job-side capture.
    pub capture: CaptureConfig,
    /// Limits of the local API's HTTP server.
    pub server: warden_http::server::Limits,
    /// Pod labels on GPU metrics.
    pub pod_resources: PodResourcesConfig,
}

/// Default cap on connections to the agent's local API (Prometheus, the controller,
/// a person with curl); the agent's memory budget is small.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Bounds checked on the numeric settings: (field, least, most).
const MS_BOUNDS: [(&str, u64, u64); 7] = [
    ("controller.flush_interval_ms", 50, 60_000),
    ("controller.heartbeat_interval_ms", 100, 600_000),
    ("controller.request_timeout_ms", 100, 300_000),
    ("controller.backoff_initial_ms", 10, 600_000),
    ("controller.backoff_max_ms", 10, 3_600_000),
    ("nvml.interval_ms", 100, 3_600_000),
    ("pod_resources.interval_ms", 1_000, 3_600_000),
];

/// Every top-level key of the file.
const KEYS: [&str; 10] = [
    "node_name",
    "listen",
    "controller",
    "nvml",
    "kmsg",
    "logs",
    "log_window",
    "capture",
    "server",
    "pod_resources",
];

/// The bounds of a duration in milliseconds set in the file, as a duration.
fn ms(l: &mut Loader<'_>, field: &str, value: Option<u64>, into: &mut Duration) {
    let Some(v) = value else { return };
    let (lo, hi) = MS_BOUNDS
        .iter()
        .find(|(f, ..)| *f == field)
        .map_or((1, u64::MAX), |&(_, lo, hi)| (lo, hi));
    let origin = l.file_origin().to_owned();
    if let Some(v) = l.bounded(&origin, field, v, lo, hi) {
        *into = Duration::from_millis(v);
    }
}

/// A size in bytes set in the file, at least `lo` and at most 16 GiB.
fn bytes(l: &mut Loader<'_>, field: &str, value: Option<u64>, lo: u64, into: &mut usize) {
    let Some(v) = value else { return };
    let origin = l.file_origin().to_owned();
    if let Some(v) = l.bounded(&origin, field, v, lo, 1 << 34) {
        *into = usize::try_from(v).unwrap_or(usize::MAX);
    }
}

fn listen(value: &String) -> Result<SocketAddr, String> {
    value
        .trim()
        .parse::<SocketAddr>()
        .map_err(|e| format!("{value:?} is not a socket address like {DEFAULT_LISTEN} ({e})"))
}

fn url(value: &String) -> Result<String, String> {
    let v = value.trim().trim_end_matches('/');
    let ok = v
        .strip_prefix("http://")
        .or_else(|| v.strip_prefix("https://"))
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a URL like http://warden-controller:9460"
        ))
    }
}

// The loader hands every layer's value as the setting's own type.
#[allow(clippy::ptr_arg)]
fn node_name(value: &String) -> Result<String, String> {
    let v = value.trim();
    warden_model::ids::check_node_name(v)?;
    Ok(v.to_owned())
}

impl ConfigFile {
    /// Parse a YAML document; each top-level section is checked on its own so one
    /// mistake does not hide the next.
    pub fn from_yaml(text: &str, origin: &str) -> Result<ConfigFile, ConfigErrors> {
        Loader::read_text(text, origin, ConfigFile::read)
    }

    fn read(l: &mut Loader<'_>) -> ConfigFile {
        let file = ConfigFile {
            node_name: l.section("node_name"),
            listen: l.section("listen"),
            controller: l.section("controller"),
            nvml: l.section("nvml"),
            kmsg: l.section("kmsg"),
            logs: l.section("logs"),
            log_window: l.section("log_window"),
            capture: l.section("capture"),
            server: l.section("server"),
            pod_resources: l.section("pod_resources"),
        };
        l.unknown_keys(&KEYS);
        file
    }
}

/// This machine's hostname, from the kernel, lowercased (host names are not case
/// sensitive; node names are DNS-1123).
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
}

fn millis(d: Duration) -> Option<u64> {
    Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AgentConfig {
    /// Whether GPU metrics are to carry pod labels (where the kubelet's socket exists).
    pub fn wants_pod_labels(&self) -> bool {
        self.pod_resources.enabled && self.nvml.enabled
    }

    /// The effective configuration written as a configuration file, every setting given
    /// (what `--check-config` prints).
    pub fn effective_file(&self) -> ConfigFile {
        let s = &self.ship;
        ConfigFile {
            node_name: Some(self.node_name.clone()),
            listen: Some(self.listen.to_string()),
            controller: Some(ControllerFile {
                url: s.url.clone(),
                token_file: s.token_file.clone(),
                ca_file: s.ca_file.clone(),
                flush_interval_ms: millis(s.flush_interval),
                heartbeat_interval_ms: millis(s.heartbeat_interval),
                request_timeout_ms: millis(s.request_timeout),
                buffer_max_bytes: Some(s.buffer_max_bytes as u64),
                backoff_initial_ms: millis(s.backoff_initial),
                backoff_max_ms: millis(s.backoff_max),
                max_log_lines_per_sec: Some(s.max_log_lines_per_sec),
            }),
            nvml: Some(NvmlFile {
                enabled: Some(self.nvml.enabled),
                library: self.nvml.library.clone(),
                interval_ms: millis(self.nvml.interval),
                temperature_warn_c: Some(self.nvml.temperature_warn_c),
                dcgm_compat: Some(self.nvml.dcgm_compat),
            }),
            kmsg: Some(KmsgFile {
                enabled: Some(self.kmsg.enabled),
                path: Some(self.kmsg.path.clone()),
                boot_id_path: Some(self.kmsg.boot_id_path.clone()),
                max_distinct_events: Some(self.kmsg.max_distinct_events),
            }),
            logs: Some(self.logs.clone()),
            log_window: Some(LogWindowFile {
                max_bytes: Some(self.log_window_bytes as u64),
            }),
            capture: Some(CaptureFile {
                enabled: Some(self.capture.enabled),
                socket: Some(self.capture.socket.clone()),
                proc_root: Some(self.capture.proc_root.clone()),
                shm_dir: Some(self.capture.shm_dir.clone()),
            }),
            server: Some(self.server.into()),
            pod_resources: Some(PodResourcesFile {
                enabled: Some(self.pod_resources.enabled),
                socket: Some(self.pod_resources.socket.clone()),
                interval_ms: millis(self.pod_resources.interval),
                resources: Some(self.pod_resources.resources.clone()),
            }),
        }
    }

    /// The effective configuration: defaults, then the file (when given), then the
    /// environment (`env` looks a variable up; pass `|k| std::env::var(k).ok()`), then
    /// the flags. `fallback_node_name` is used when nothing names the node (the
    /// hostname). Every error is collected before returning.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: &Overrides,
        fallback_node_name: Option<String>,
    ) -> Result<AgentConfig, ConfigErrors> {
        Self::load_traced(file, env, flags, fallback_node_name).map(|l| l.config)
    }

    /// [`AgentConfig::load`], with where each setting given came from.
    pub fn load_traced(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: &Overrides,
        fallback_node_name: Option<String>,
    ) -> Result<Loaded<AgentConfig>, ConfigErrors> {
        let mut l = Loader::new(file, env);
        let parsed = ConfigFile::read(&mut l);
        let fo = l.file_origin().to_owned();
        let fo = fo.as_str();

        // Node name: the hostname, the file, WARDEN_NODE_NAME, then the flag (or
        // NODE_NAME through the flag).
        let mut sources = vec![("hostname".to_owned(), fallback_node_name)];
        sources.extend(l.sources(
            parsed.node_name.clone(),
            Some("WARDEN_NODE_NAME"),
            Some(("--node-name", flags.node_name.clone())),
        ));
        // Only the layer that decides is checked: a bad hostname under a good flag is
        // no mistake.
        let decided = sources.into_iter().rev().find(|(_, v)| v.is_some());
        let node_name = match decided {
            Some(source) => l.layer("node_name", [source], node_name),
            None => {
                l.push(
                    "defaults",
                    "node_name",
                    "no node name: pass --node-name or set NODE_NAME",
                );
                None
            }
        };

        let sources = l.sources(
            parsed.listen.clone(),
            Some("WARDEN_LISTEN"),
            Some(("--listen", flags.listen.clone())),
        );
        let listen = l
            .layer("listen", sources, listen)
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 9461)));

        let cf = parsed.controller.clone().unwrap_or_default();
        let mut ship = ShipConfig::default();
        let sources = l.sources(
            cf.url.clone(),
            Some("WARDEN_CONTROLLER_URL"),
            Some(("--controller-url", flags.controller_url.clone())),
        );
        ship.url = l.layer("controller.url", sources, url);
        ship.token_file = cf.token_file.clone();
        ship.ca_file = cf.ca_file.clone();
        ms(
            &mut l,
            "controller.flush_interval_ms",
            cf.flush_interval_ms,
            &mut ship.flush_interval,
        );
        ms(
            &mut l,
            "controller.heartbeat_interval_ms",
            cf.heartbeat_interval_ms,
            &mut ship.heartbeat_interval,
        );
        ms(
            &mut l,
            "controller.request_timeout_ms",
            cf.request_timeout_ms,
            &mut ship.request_timeout,
        );
        ms(
            &mut l,
            "controller.backoff_initial_ms",
            cf.backoff_initial_ms,
            &mut ship.backoff_initial,
        );
        ms(
            &mut l,
            "controller.backoff_max_ms",
            cf.backoff_max_ms,
            &mut ship.backoff_max,
        );
        bytes(
            &mut l,
            "controller.buffer_max_bytes",
            cf.buffer_max_bytes,
            64 << 10,
            &mut ship.buffer_max_bytes,
        );
        if let Some(n) = cf.max_log_lines_per_sec {
            ship.max_log_lines_per_sec = n;
        }
        if ship.backoff_max < ship.backoff_initial {
            l.push(
                fo,
                "controller.backoff_max_ms",
                format!(
                    "{} ms is shorter than backoff_initial_ms ({} ms)",
                    ship.backoff_max.as_millis(),
                    ship.backoff_initial.as_millis()
                ),
            );
        }

        let nf = parsed.nvml.clone().unwrap_or_default();
        let mut nvml = NvmlConfig {
            enabled: nf.enabled.unwrap_or(true),
            library: nf.library.clone(),
            dcgm_compat: nf.dcgm_compat.unwrap_or(false),
            ..NvmlConfig::default()
        };
        ms(
            &mut l,
            "nvml.interval_ms",
            nf.interval_ms,
            &mut nvml.interval,
        );
        if let Some(t) = nf.temperature_warn_c {
            if t.is_finite() && (20.0..=150.0).contains(&t) {
                nvml.temperature_warn_c = t;
            } else {
                l.push(
                    fo,
                    "nvml.temperature_warn_c",
                    format!("{t} is outside 20..=150"),
                );
            }
        }

        let kf = parsed.kmsg.clone().unwrap_or_default();
        let mut kmsg = KmsgConfig {
            enabled: kf.enabled.unwrap_or(true),
            ..KmsgConfig::default()
        };
        if let Some(p) = kf.path {
            kmsg.path = p;
        }
        if let Some(p) = kf.boot_id_path {
            kmsg.boot_id_path = p;
        }
        if let Some(n) = kf.max_distinct_events
            && let Some(n) = l.bounded(fo, "kmsg.max_distinct_events", n, 1, 1 << 20)
        {
            kmsg.max_distinct_events = n;
        }

        let logs = parsed.logs.clone().unwrap_or_default();
        match crate::logs::check_config(&logs, PresetCatalog::builtin()) {
            Ok(()) => {}
            Err(LogsConfigError::Invalid(problems)) => {
                for p in problems {
                    // Each problem starts with the field it concerns: `sources[0].paths: ...`.
                    match p.split_once(": ") {
                        Some((field, msg)) if !field.contains(' ') => {
                            l.push(fo, &format!("logs.{field}"), msg);
                        }
                        _ => l.push(fo, "logs", p),
                    }
                }
            }
            Err(LogsConfigError::Parse(p)) => l.push(fo, "logs", p),
        }

        let mut log_window_bytes = 4 << 20;
        bytes(
            &mut l,
            "log_window.max_bytes",
            parsed.log_window.as_ref().and_then(|w| w.max_bytes),
            0,
            &mut log_window_bytes,
        );

        let capf = parsed.capture.clone().unwrap_or_default();
        let mut capture = CaptureConfig {
            enabled: capf.enabled.unwrap_or(true),
            ..CaptureConfig::default()
        };
        let sources = l.sources(capf.socket.clone(), Some("WARDEN_AGENT_SOCKET"), None);
        if let Some(p) = l.layer("capture.socket", sources, |p: &PathBuf| {
            if p.is_absolute() && p.as_os_str().len() < 100 {
                Ok(p.clone())
            } else {
                Err(format!(
                    "{} must be an absolute path shorter than 100 bytes (a Unix socket address)",
                    p.display()
                ))
            }
        }) {
            capture.socket = p;
        }
        if let Some(p) = capf.proc_root {
            capture.proc_root = p;
        }
        if let Some(p) = capf.shm_dir {
            capture.shm_dir = p;
        }

        let server_file = parsed.server.clone().unwrap_or_default();
        for (field, message) in server_file.problems("server") {
            l.push(fo, &field, message);
        }
        let server = server_file.limits(warden_http::server::Limits::with_max_connections(
            DEFAULT_MAX_CONNECTIONS,
        ));

        let pf = parsed.pod_resources.clone().unwrap_or_default();
        let mut pod_resources = PodResourcesConfig {
            enabled: pf.enabled.unwrap_or(true),
            ..PodResourcesConfig::default()
        };
        if let Some(p) = pf.socket {
            if p.is_absolute() && p.as_os_str().len() < 108 {
                pod_resources.socket = p;
            } else {
                l.push(
                    fo,
                    "pod_resources.socket",
                    format!(
                        "{} must be an absolute path shorter than 108 bytes (a Unix socket address)",
                        p.display()
                    ),
                );
            }
        }
        ms(
            &mut l,
            "pod_resources.interval_ms",
            pf.interval_ms,
            &mut pod_resources.interval,
        );
        if let Some(r) = pf.resources {
            let bad = r.iter().find(|r| {
                r.is_empty()
                    || r.len() > 253
                    || !r
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-._/".contains(c))
            });
            match bad {
                Some(b) => l.push(
                    fo,
                    "pod_resources.resources",
                    format!("{b:?} is not an extended resource name like nvidia.com/gpu"),
                ),
                None if r.len() > 64 => l.push(
                    fo,
                    "pod_resources.resources",
                    format!("{} names; at most 64", r.len()),
                ),
                None => pod_resources.resources = r,
            }
        }

        l.finish(|| {
            Some(AgentConfig {
                node_name: node_name?,
                listen,
                ship,
                nvml,
                kmsg,
                logs,
                log_window_bytes,
                capture,
                server,
                pod_resources,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("warden-agent-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    fn load(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<AgentConfig, ConfigErrors> {
        let path = write(&format!("c{}.yaml", text.len()), text);
        AgentConfig::load(
            Some(&path),
            env,
            &Overrides::default(),
            Some("host-1".into()),
        )
    }

    #[test]
    fn defaults_name_the_node_after_the_host() {
        let cfg = AgentConfig::load(None, no_env, &Overrides::default(), Some("gpu-7".into()))
            .expect("ok");
        assert_eq!(cfg.node_name, "gpu-7");
        assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(cfg.ship, ShipConfig::default());
        assert!(cfg.nvml.enabled && cfg.kmsg.enabled);
    }

    #[test]
    fn every_mistake_is_named_with_its_field() {
        let text = "listen: nowhere\ncontroller:\n  url: ftp://x\n  flush_interval_ms: 5\n\
                    nvml:\n  intervall_ms: 3\nkmsg:\n  max_distinct_events: 0\nbogus: 1\n";
        let errs = load(text, no_env).expect_err("must fail");
        let fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        for f in [
            "listen",
            "controller.url",
            "controller.flush_interval_ms",
            "nvml.intervall_ms",
            "kmsg.max_distinct_events",
            "bogus",
        ] {
            assert!(fields.contains(&f), "{f} missing from {errs}");
        }
    }

    #[test]
    fn nested_type_errors_carry_the_path() {
        let errs = load("controller:\n  buffer_max_bytes: lots\n", no_env).expect_err("fails");
        assert_eq!(errs.0[0].field, "controller.buffer_max_bytes", "{errs}");
    }

    #[test]
    fn file_then_env_then_flag() {
        let text = "node_name: from-file\ncontroller:\n  url: http://c1:9460/\n";
        let cfg = load(text, no_env).expect("ok");
        assert_eq!(cfg.node_name, "from-file");
        assert_eq!(cfg.ship.url.as_deref(), Some("http://c1:9460"));

        let env: HashMap<&str, &str> = [
            ("WARDEN_CONTROLLER_URL", "http://c2:9460"),
            ("WARDEN_NODE_NAME", "from-env"),
        ]
        .into();
        let lookup = |k: &str| env.get(k).map(|v| (*v).to_owned());
        let cfg = load(text, lookup).expect("ok");
        assert_eq!(cfg.node_name, "from-env");
        assert_eq!(cfg.ship.url.as_deref(), Some("http://c2:9460"));

        let flags = Overrides {
            node_name: Some("from-flag".into()),
            controller_url: Some("http://c3:1".into()),
            listen: Some("0.0.0.0:9999".into()),
        };
        let path = write("layers.yaml", text);
        let cfg = AgentConfig::load(Some(&path), lookup, &flags, None).expect("ok");
        assert_eq!(cfg.node_name, "from-flag");
        assert_eq!(cfg.ship.url.as_deref(), Some("http://c3:1"));
        assert_eq!(cfg.listen.port(), 9999);
    }

    #[test]
    fn no_node_name_anywhere_is_an_error() {
        let errs = AgentConfig::load(None, no_env, &Overrides::default(), None).expect_err("no");
        assert_eq!(errs.0[0].field, "node_name");
        let flags = Overrides {
            node_name: Some("bad name!".into()),
            ..Overrides::default()
        };
        let errs = AgentConfig::load(None, no_env, &flags, None).expect_err("bad");
        assert!(
            errs.to_string()
                .contains("flag --node-name: field `node_name`"),
            "{errs}"
        );
    }

    #[test]
    fn log_source_mistakes_name_their_field() {
        let text =
            "logs:\n  sources:\n    - paths: []\n      presets: [megatorn]\n  max_open_files: 0\n";
        let errs = load(text, no_env).expect_err("fails");
        let msg = errs.to_string();
        assert!(msg.contains("field `logs.sources[0].paths`"), "{msg}");
        assert!(msg.contains("field `logs.max_open_files`"), "{msg}");
        assert!(msg.contains("megatorn"), "{msg}");
        let errs = load(
            "logs:\n  sources:\n    - paths: [a]\n      format: json\n",
            no_env,
        )
        .expect_err("fails");
        assert!(errs.0[0].field.starts_with("logs"), "{errs}");
        assert!(errs.to_string().contains("json"), "{errs}");
    }

    #[test]
    fn backoff_max_below_initial_is_refused() {
        let text = "controller:\n  backoff_initial_ms: 5000\n  backoff_max_ms: 1000\n";
        let errs = load(text, no_env).expect_err("fails");
        assert_eq!(errs.0[0].field, "controller.backoff_max_ms", "{errs}");
    }

    #[test]
    fn pod_resources_default_to_the_kubelet_socket_and_check_every_setting() {
        let cfg = load("node_name: n1\n", no_env).expect("ok");
        assert_eq!(cfg.pod_resources, PodResourcesConfig::default());
        assert_eq!(
            cfg.pod_resources.socket,
            Path::new("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        let cfg = load(
            "pod_resources:\n  enabled: false\n  interval_ms: 2000\n  resources: [example.com/gpu]\n",
            no_env,
        )
        .expect("ok");
        assert!(!cfg.pod_resources.enabled);
        assert_eq!(cfg.pod_resources.interval, Duration::from_secs(2));
        assert_eq!(cfg.pod_resources.resources, ["example.com/gpu"]);
        let errs = load(
            "pod_resources:\n  socket: kubelet.sock\n  interval_ms: 10\n  resources: [\"a b\"]\n",
            no_env,
        )
        .expect_err("three mistakes");
        let mut fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "pod_resources.interval_ms",
                "pod_resources.resources",
                "pod_resources.socket"
            ],
            "{errs}"
        );
    }

    #[test]
    fn server_limits_default_small_and_are_bounded() {
        let cfg = load("node_name: n1\n", no_env).expect("ok");
        let limits = cfg.server;
        assert_eq!(limits.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(limits.max_connections_per_peer, DEFAULT_MAX_CONNECTIONS / 2);
        let cfg = load("server:\n  idle_timeout_secs: 30\n", no_env).expect("ok");
        assert_eq!(cfg.server.idle_timeout, Duration::from_secs(30));
        let errs = load(
            "server:\n  header_timeout_secs: 301\n  max_connections_per_peer: 0\n",
            no_env,
        )
        .expect_err("out of bounds");
        let mut fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        fields.sort_unstable();
        let want = [
            "server.header_timeout_secs",
            "server.max_connections_per_peer",
        ];
        assert_eq!(fields, want, "{errs}");
    }
}
