//! The agent runtime: wires collectors (each on its own thread, so a slow NVML call
//! never delays the kernel log), the shipper and the HTTP surface, and runs them until
//! shutdown. A collector that fails degrades the agent — it is reported down in the
//! metrics and heartbeats — and never stops it.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::Registry;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::sync::watch;

use crate::api::{self, ApiState};
use crate::config::AgentConfig;
use crate::dedup::Deduper;
use crate::kernel_log::{self, KernelLog};
use crate::metrics::{AgentMetrics, advance};
use crate::privilege::{Preopened, Privileges};
use crate::ship::{self, Identity, IngestClient, SharedPending, Shipper, wall_ns};
use crate::window::LogWindow;

/// Interval between kernel-log polls.
const KMSG_POLL: Duration = Duration::from_millis(500);
/// Most kernel lines handled per poll (a flood is worked off over several polls).
const KMSG_LINES_PER_POLL: usize = 200_000;
/// Interval between re-reports of repeat counts.
const COUNTS_EVERY: Duration = Duration::from_secs(10);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The token file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The controller URL was refused by the HTTP client.
    #[error("controller URL: {0}")]
    Url(String),
    /// The metrics could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Serving HTTP failed.
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
}

/// Tells collector threads to stop, waking them from their sleep at once.
#[derive(Debug, Default)]
pub struct StopFlag {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl StopFlag {
    /// Stop every thread that waits on this flag.
    pub fn raise(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Whether the flag is raised.
    pub fn is_raised(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait up to `d`; false when the flag is (or gets) raised.
    pub fn wait(&self, d: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self
            .cv
            .wait_timeout_while(guard, d, |stopped| !*stopped)
            .unwrap_or_else(|e| e.into_inner());
        !*guard
    }
}

/// What the collector threads share.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Records for the next batch.
    pub pending: SharedPending,
    /// Agent self-metrics.
    pub metrics: Arc<AgentMetrics>,
    /// Recent log lines.
    pub window: Arc<Mutex<LogWindow>>,
    /// Collectors that are down.
    pub collectors_down: Arc<Mutex<Vec<String>>>,
    /// Raised when the agent stops.
    pub stop: Arc<StopFlag>,
    /// PCI address → GPU index, once NVML has listed the GPUs.
    pub gpu_map: crate::collectors::GpuMap,
}

impl Shared {
    /// Mark `collector` up or down (metric, heartbeat, `/healthz`).
    pub fn set_up(&self, collector: &str, up: bool) {
        self.metrics
            .collector_up
            .with_label_values(&[collector])
            .set(i64::from(up));
        let mut down = self
            .collectors_down
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        down.retain(|c| c != collector);
        if !up {
            down.push(collector.to_owned());
            down.sort();
        }
    }

    /// Sleep up to `d`, waking early when the agent stops; false once stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        self.stop.wait(d)
    }
}

/// A fresh id for this agent instance.
fn new_agent_id() -> String {
    let mut rng = SmallRng::seed_from_u64(wall_ns() as u64 ^ u64::from(std::process::id()));
    format!("{:016x}", rng.random::<u64>())
}

/// Run the kernel-log collector until the agent stops.
fn kmsg_loop(shared: Shared, mut log: KernelLog) {
    let mut events = Vec::new();
    let mut last_counts = std::time::Instant::now();
    let mut failing = false;
    let mut mapped = false;
    loop {
        if !mapped && let Some(map) = shared.gpu_map.lock().ok().and_then(|m| m.clone()) {
            log.dedup_mut().set_gpu_map(&map);
            mapped = true;
        }
        match log.poll(wall_ns(), KMSG_LINES_PER_POLL, &mut events) {
            Ok(stats) => {
                if failing {
                    tracing::info!("kernel log readable again");
                    shared.set_up("kmsg", true);
                    failing = false;
                }
                let m = &shared.metrics;
                m.kmsg_lines.inc_by(stats.lines);
                m.kmsg_lost.inc_by(stats.lost);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "reading the kernel log failed; retrying");
                    shared.set_up("kmsg", false);
                    failing = true;
                }
            }
        }
        for &(code, gpu, n) in log.xid_counts() {
            let gpu = gpu.map_or_else(|| "unknown".to_owned(), |g| g.to_string());
            advance(
                &shared
                    .metrics
                    .xid
                    .with_label_values(&[&gpu, &code.to_string()]),
                n,
            );
        }
        if last_counts.elapsed() >= COUNTS_EVERY {
            events.extend(log.drain_counts());
            last_counts = std::time::Instant::now();
        }
        if !events.is_empty() {
            for e in &events {
                let kind = warden_model::wire::NodeEventKind::from_wire(e.kind);
                let sev = warden_model::wire::EventSeverity::from_wire(e.severity);
                if e.count == 1 {
                    shared
                        .metrics
                        .node_events
                        .with_label_values(&[kind.as_str(), sev.as_str()])
                        .inc();
                }
            }
            ship::lock(&shared.pending).events(events.drain(..));
        }
        if !shared.sleep(KMSG_POLL) {
            return;
        }
    }
}

/// Start the kernel-log collector, or report it down.
/// `opened` is the source [`crate::privilege::preopen`] opened, if it did.
fn start_kmsg(
    cfg: &AgentConfig,
    opened: Option<std::io::Result<kernel_log::KernelSource>>,
    shared: &Shared,
    boot_id: &str,
) -> Option<JoinHandle<()>> {
    if !cfg.kmsg.enabled {
        return None;
    }
    let dedup = Deduper::with_max_keys(boot_id, cfg.kmsg.max_distinct_events);
    let opened =
        opened.unwrap_or_else(|| kernel_log::KernelSource::open(&cfg.kmsg.path, wall_ns()));
    match opened.map(|source| KernelLog::new(source, dedup)) {
        Ok(log) => {
            shared.set_up("kmsg", true);
            tracing::info!(path = %cfg.kmsg.path.display(), "kernel log collector started");
            let s = shared.clone();
            crate::collectors::spawn("kmsg", move || kmsg_loop(s, log))
        }
        Err(e) => {
            tracing::warn!(path = %cfg.kmsg.path.display(), error = %e, "kernel log collector is down");
            shared.set_up("kmsg", false);
            None
        }
    }
}

/// Start reading the kubelet's pod-resources API where it is enabled and its socket
/// exists (a Kubernetes node): the assignment the GPU metrics label their series with,
/// and the task that keeps it current. `opened` is the connection
/// [`crate::privilege::preopen`] made, if it did.
fn start_pod_resources(
    cfg: &AgentConfig,
    opened: Option<std::io::Result<std::os::unix::net::UnixStream>>,
    shared: &Shared,
) -> (
    Option<crate::pod_resources::SharedGpuPods>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let pc = &cfg.pod_resources;
    if !cfg.wants_pod_labels() {
        return (None, None);
    }
    if opened.is_none() && !pc.socket.exists() {
        tracing::info!(
            socket = %pc.socket.display(),
            "no kubelet pod-resources socket: GPU metrics carry no pod labels"
        );
        return (None, None);
    }
    let preopened = match opened {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            // The poller tries again, and reports itself down until it can.
            tracing::warn!(socket = %pc.socket.display(), error = %e, "cannot connect to the kubelet's pod-resources socket");
            None
        }
        None => None,
    };
    let pods = crate::pod_resources::SharedGpuPods::default();
    let client = crate::pod_resources::Client::new(&pc.socket, Duration::from_secs(5), preopened);
    let s = shared.clone();
    let task = tokio::spawn(crate::pod_resources::poll(
        client,
        pc.interval,
        pc.resources.clone(),
        pods.clone(),
        move |up| s.set_up("pod_resources", up),
    ));
    tracing::info!(socket = %pc.socket.display(), "reading GPU pod assignments from the kubelet");
    (Some(pods), Some(task))
}

/// Run the agent until `shutdown` resolves. `ready` receives the bound address.
pub async fn run(
    cfg: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), RunError> {
    run_preopened(cfg, Preopened::default(), shutdown, ready).await
}

/// [`run`], with the kernel log and capture socket that [`crate::privilege::preopen`]
/// opened before the process gave up its capabilities.
pub async fn run_preopened(
    cfg: AgentConfig,
    preopened: Preopened,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> Result<(), RunError> {
    let registry = Registry::new();
    let metrics = Arc::new(AgentMetrics::register(&registry)?);
    match Privileges::current() {
        Ok(p) => metrics
            .capabilities
            .set(p.permitted.bits().count_ones().into()),
        Err(e) => tracing::warn!(error = %e, "cannot read this process's capabilities"),
    }
    let boot_id = match kernel_log::read_boot_id(&cfg.kmsg.boot_id_path) {
        Ok(b) if !b.is_empty() => b,
        Ok(_) | Err(_) => {
            tracing::warn!(path = %cfg.kmsg.boot_id_path.display(), "cannot read the boot id; using \"unknown\"");
            "unknown".to_owned()
        }
    };
    let id = Identity {
        node: cfg.node_name.clone(),
        agent_id: new_agent_id(),
        boot_id: boot_id.clone(),
    };
    let shared = Shared {
        pending: SharedPending::default(),
        metrics: metrics.clone(),
        window: Arc::new(Mutex::new(LogWindow::new(cfg.log_window_bytes))),
        collectors_down: Arc::default(),
        stop: Arc::new(StopFlag::default()),
        gpu_map: Arc::default(),
    };
    let token = match &cfg.ship.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t.trim().to_owned()),
            Err(source) => {
                return Err(RunError::Token {
                    path: path.clone(),
                    source,
                });
            }
        },
        None => None,
    };

    // A long accept queue: a burst of connections waits instead of losing SYNs.
    let listener = warden_http::server::bind(cfg.listen).map_err(|source| RunError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let local = listener.local_addr().map_err(RunError::Serve)?;

    let mut threads = Vec::new();
    let Preopened {
        kmsg,
        capture,
        pod_resources,
    } = preopened;
    threads.extend(start_kmsg(&cfg, kmsg, &shared, &boot_id));
    let (pods, pods_task) = start_pod_resources(&cfg, pod_resources, &shared);
    threads.extend(crate::collectors::start(&cfg, &shared, &registry, pods));
    let progress = crate::progress::Progress::default();
    threads.extend(crate::capture::start(
        &cfg.capture,
        capture,
        &shared,
        &progress,
    ));
    threads.extend(crate::nccl::start(&cfg.capture, &shared, &progress));

    let (stop_tx, stop_rx) = watch::channel(false);
    let shipper = match &cfg.ship.url {
        Some(url) => {
            let transport = IngestClient::new(
                url,
                token.as_deref(),
                cfg.ship.request_timeout,
                cfg.ship.ca_file.as_deref(),
            )
            .map_err(RunError::Url)?;
            let sh = Shipper::new(cfg.ship.clone(), transport, id.clone())
                .with_metrics(metrics.clone())
                .with_collectors_down(shared.collectors_down.clone())
                .with_progress(progress.clone());
            tracing::info!(controller = %url, "shipping to the controller");
            Some(tokio::spawn(sh.run(shared.pending.clone(), stop_rx)))
        }
        None => {
            tracing::warn!("no controller URL: collecting and exporting only");
            None
        }
    };

    let state = ApiState {
        registry,
        window: shared.window.clone(),
        token: token.map(Into::into),
        collectors_down: shared.collectors_down.clone(),
    };
    tracing::info!(
        listen = %local,
        node = %id.node,
        agent_id = %id.agent_id,
        boot_id = %id.boot_id,
        version = env!("CARGO_PKG_VERSION"),
        "agent running"
    );
    if let Some(tx) = ready {
        let _ = tx.send(local);
    }
    // HTTP/1.1 only, under the configured timeouts and connection caps; `shutdown`
    // lets requests in flight finish.
    warden_http::server::serve(listener, api::router(state), cfg.server, shutdown).await;

    // Stop collectors, then flush what they left.
    shared.stop.raise();
    for t in threads {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    if let Some(t) = pods_task {
        t.abort();
    }
    let _ = stop_tx.send(true);
    if let Some(s) = shipper {
        let _ = s.await;
    }
    tracing::info!("agent stopped");
    Ok(())
}
