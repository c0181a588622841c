//! Starts the GPU and training-log collectors, each on its own thread, and moves what
//! they produce into the pending batch, the metrics and the log window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus::Registry;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use warden_model::wire::{NodeEvent, NodeEventKind};

use crate::config::AgentConfig;
use crate::gpu_metrics::{GpuMetrics, GpuMetricsOptions};
use crate::nvml::{self, ChangeConfig, ChangeDetector, GpuSource, NvmlSource};
use crate::pod_resources::SharedGpuPods;
use crate::runtime::Shared;
use crate::ship::{self, wall_ns};

/// How often a missing NVML library or driver is looked for again.
const NVML_RETRY: Duration = Duration::from_secs(60);

/// Ids for events the agent makes itself (NVML events, counter jumps): unique per
/// agent instance and disjoint from the kernel-log ids, which count up from 1.
#[derive(Debug)]
pub struct EventIds(AtomicU64);

impl EventIds {
    /// A fresh id space: the top bit set and a random base.
    pub fn new() -> EventIds {
        let seed = wall_ns() as u64 ^ (u64::from(std::process::id()) << 32);
        let base = SmallRng::seed_from_u64(seed).random::<u64>() >> 2;
        EventIds(AtomicU64::new((1 << 63) | base))
    }

    /// Stamp `e` with the next id.
    pub fn assign(&self, e: &mut NodeEvent) {
        e.id = self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl Default for EventIds {
    fn default() -> Self {
        Self::new()
    }
}

/// Start the NVML and log collectors that are enabled. With `pods`, the GPU metrics
/// carry the pod labels of that assignment.
pub fn start(
    cfg: &AgentConfig,
    shared: &Shared,
    registry: &Registry,
    pods: Option<SharedGpuPods>,
) -> Vec<JoinHandle<()>> {
    let mut threads = Vec::new();
    if cfg.nvml.enabled {
        match GpuMetrics::new(
            registry,
            GpuMetricsOptions {
                dcgm_compat: cfg.nvml.dcgm_compat,
                hostname: cfg.node_name.clone(),
                pods,
            },
        ) {
            Ok(m) => {
                let (cfg, shared) = (cfg.clone(), shared.clone());
                threads.extend(spawn("nvml", move || nvml_loop(&cfg, &shared, &m)));
            }
            Err(e) => tracing::error!(error = %e, "cannot register the GPU metrics"),
        }
    }
    threads.extend(crate::logs_collector::start(cfg, shared));
    threads
}

/// Start `f` on a thread named `warden-<name>`; `None` (logged) when the system refuses.
pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Option<JoinHandle<()>> {
    match std::thread::Builder::new()
        .name(format!("warden-{name}"))
        .spawn(f)
    {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::error!(collector = name, error = %e, "cannot start the collector thread");
            None
        }
    }
}

/// Open NVML, retrying quietly once a minute until the agent stops.
fn open_nvml(cfg: &AgentConfig, shared: &Shared, metrics: &GpuMetrics) -> Option<NvmlSource> {
    let mut logged = false;
    loop {
        let nc = nvml::NvmlConfig {
            lib_path: cfg.nvml.library.clone(),
            ..nvml::NvmlConfig::default()
        };
        match NvmlSource::open(nc) {
            Ok(s) => {
                tracing::info!(
                    gpus = s.inventory().len(),
                    events = s.watches_events(),
                    "NVML collector started"
                );
                shared.set_up("nvml", true);
                metrics.set_collector_up(true);
                return Some(s);
            }
            Err(e) => {
                if !logged {
                    tracing::warn!(error = %e, "NVML collector is down (no GPU or driver?); looking again every minute");
                    logged = true;
                } else {
                    tracing::debug!(error = %e, "NVML still unavailable");
                }
                shared.set_up("nvml", false);
                metrics.set_collector_up(false);
            }
        }
        if !shared.sleep(NVML_RETRY) {
            return None;
        }
    }
}

fn nvml_loop(cfg: &AgentConfig, shared: &Shared, metrics: &GpuMetrics) {
    let Some(mut source) = open_nvml(cfg, shared, metrics) else {
        return;
    };
    if let Ok(mut map) = shared.gpu_map.lock() {
        *map = Some(nvml::pci_index_map(source.inventory()));
    }
    let ids = EventIds::new();
    let mut changes = ChangeDetector::new(ChangeConfig {
        temp_threshold_c: Some(cfg.nvml.temperature_warn_c.round() as u32),
        ..ChangeConfig::default()
    });
    let interval = cfg.nvml.interval;
    let mut failing = false;
    loop {
        let tick = Instant::now();
        let mut events = Vec::new();
        match source.sample(wall_ns()) {
            Ok(readings) => {
                if failing {
                    tracing::info!("NVML answers again");
                    failing = false;
                    shared.set_up("nvml", true);
                    metrics.set_collector_up(true);
                }
                events.extend(changes.observe(&readings));
                metrics.observe(&readings);
                ship::lock(&shared.pending).gpus(readings.iter().map(nvml::to_wire));
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "NVML sample failed");
                    failing = true;
                    shared.set_up("nvml", false);
                    metrics.set_collector_up(false);
                }
            }
        }
        // Wait for hardware events for the rest of the interval: the loop's clock.
        loop {
            let left = interval.saturating_sub(tick.elapsed());
            let wait = left;
            match source.poll_events(wait.as_millis() as u32, wall_ns()) {
                Ok(evs) => events.extend(evs),
                Err(_) => {
                    // A hung driver: do not spin; the sample reports it.
                    if !shared.sleep(wait) {
                        return;
                    }
                }
            }
            if shared.stop.is_raised() {
                return;
            }
            if tick.elapsed() >= interval {
                break;
            }
        }
        if events.is_empty() {
            continue;
        }
        let kmsg_down = shared
            .collectors_down
            .lock()
            .map(|d| d.iter().any(|c| c == "kmsg"))
            .unwrap_or(false)
            || !cfg.kmsg.enabled;
        for e in &mut events {
            ids.assign(e);
            if NodeEventKind::from_wire(e.kind) == NodeEventKind::Xid {
                metrics.observe_xid(e);
                // The kernel log counts XIDs when it can be read; NVML stands in when not.
                if kmsg_down {
                    let gpu = e
                        .gpu_index
                        .map_or_else(|| "unknown".into(), |g| g.to_string());
                    let code = e.code.unwrap_or(0).to_string();
                    shared.metrics.xid.with_label_values(&[&gpu, &code]).inc();
                }
            }
            shared
                .metrics
                .node_events
                .with_label_values(&[
                    NodeEventKind::from_wire(e.kind).as_str(),
                    warden_model::wire::EventSeverity::from_wire(e.severity).as_str(),
                ])
                .inc();
        }
        ship::lock(&shared.pending).events(events);
    }
}

/// The PCI → GPU index map, once NVML has listed the GPUs.
pub type GpuMap = Arc<Mutex<Option<std::collections::HashMap<String, u32>>>>;
