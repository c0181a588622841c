//! The agent's own Prometheus metrics: shipping, collectors, kernel events and XIDs per
//! code, log tailing. GPU readings are exported by [`crate::gpu_metrics`]. All metric
//! names are listed in docs/METRICS.md.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Every agent self-metric, registered in one registry.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    /// Batches delivered.
    pub batches_sent: IntCounter,
    /// Delivery attempts that failed.
    pub batches_failed: IntCounter,
    /// Records dropped, by reason.
    pub records_dropped: IntCounterVec,
    /// Payload bytes held in the outbox.
    pub buffer_bytes: IntGauge,
    /// Batches held in the outbox.
    pub buffer_batches: IntGauge,
    /// Whether the last delivery attempt reached the controller.
    pub controller_up: IntGauge,
    /// Whether each collector is working, by `collector`.
    pub collector_up: IntGaugeVec,
    /// Capabilities the agent holds (permitted set); 0 after it gave them up.
    pub capabilities: IntGauge,
    /// Kernel log lines read.
    pub kmsg_lines: IntCounter,
    /// Kernel records the ring overwrote before they were read.
    pub kmsg_lost: IntCounter,
    /// Node events seen (every sighting, repeats included), by `kind` and `severity`.
    pub node_events: IntCounterVec,
    /// XID sightings, by `gpu` and `code`.
    pub xid: IntCounterVec,
    /// Training log lines read.
    pub log_lines: IntCounter,
    /// Training log bytes read.
    pub log_bytes: IntCounter,
    /// Log lines cut at the length limit.
    pub log_truncated: IntCounter,
    /// Log rotations noticed.
    pub log_rotations: IntCounter,
    /// Log files open.
    pub log_files_open: IntGauge,
    /// Training metrics extracted from logs.
    pub log_metrics: IntCounter,
    /// Capture-socket messages from training processes, by `kind`.
    pub capture_messages: IntCounterVec,
    /// Training-process ranks the job-side capture knows on this node.
    pub capture_ranks: IntGauge,
}

/// Raise `c` to `total` when the running total moved past it.
pub fn advance(c: &IntCounter, total: u64) {
    let cur = c.get();
    if total > cur {
        c.inc_by(total - cur);
    }
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

impl AgentMetrics {
    /// Register every agent metric in `r`.
    pub fn register(r: &Registry) -> prometheus::Result<AgentMetrics> {
        // `process_*`: CPU seconds, resident and virtual memory, open and most file
        // descriptors, start time, as every Prometheus client library exports them.
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let records_dropped = counter_vec(
            r,
            "warden_agent_records_dropped_total",
            "Records the agent dropped, by reason (buffer_full, pending_full, refused, log_rate, capture_full).",
            &["reason"],
        )?;
        let collector_up = IntGaugeVec::new(
            Opts::new(
                "warden_agent_collector_up",
                "1 when the collector works, 0 when it is down (no GPU, no permission).",
            ),
            &["collector"],
        )?;
        r.register(Box::new(collector_up.clone()))?;
        let log_files_open = gauge(r, "warden_agent_log_files_open", "Log files open.")?;
        let info = IntGaugeVec::new(
            Opts::new("warden_agent_build_info", "Agent version; always 1."),
            &["version"],
        )?;
        r.register(Box::new(info.clone()))?;
        info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        Ok(AgentMetrics {
            batches_sent: counter(
                r,
                "warden_agent_batches_sent_total",
                "Batches delivered to the controller (heartbeats included).",
            )?,
            batches_failed: counter(
                r,
                "warden_agent_batches_failed_total",
                "Delivery attempts that failed and will be retried.",
            )?,
            records_dropped,
            buffer_bytes: gauge(
                r,
                "warden_agent_buffer_bytes",
                "Payload bytes of batches kept for delivery.",
            )?,
            buffer_batches: gauge(
                r,
                "warden_agent_buffer_batches",
                "Batches kept for delivery.",
            )?,
            controller_up: gauge(
                r,
                "warden_agent_controller_up",
                "1 when the last delivery attempt reached the controller.",
            )?,
            collector_up,
            capabilities: gauge(
                r,
                "warden_agent_capabilities",
                "Linux capabilities the agent holds; 0 once it has opened the kernel log and the capture socket.",
            )?,
            kmsg_lines: counter(r, "warden_agent_kmsg_lines_total", "Kernel log lines read.")?,
            kmsg_lost: counter(
                r,
                "warden_agent_kmsg_lost_total",
                "Kernel log records overwritten before the agent read them.",
            )?,
            node_events: counter_vec(
                r,
                "warden_node_events_total",
                "Hardware and kernel events seen, repeats included, by kind and severity.",
                &["kind", "severity"],
            )?,
            xid: counter_vec(
                r,
                "warden_gpu_xid_errors_total",
                "NVIDIA XID sightings, repeats included, by GPU index and XID code.",
                &["gpu", "code"],
            )?,
            log_lines: counter(
                r,
                "warden_agent_log_lines_total",
                "Training log lines read.",
            )?,
            log_bytes: counter(
                r,
                "warden_agent_log_bytes_total",
                "Training log bytes read.",
            )?,
            log_truncated: counter(
                r,
                "warden_agent_log_lines_truncated_total",
                "Training log lines cut at the length limit.",
            )?,
            log_rotations: counter(
                r,
                "warden_agent_log_rotations_total",
                "Log rotations noticed (rename or truncation).",
            )?,
            log_files_open,
            log_metrics: counter(
                r,
                "warden_agent_log_metrics_total",
                "Training metrics (step, loss, grad norm) extracted from logs.",
            )?,
            capture_messages: counter_vec(
                r,
                "warden_agent_capture_messages_total",
                "Messages from training processes on the capture socket, by kind (hello, comm, start, end, step, exit, invalid, unknown_sender).",
                &["kind"],
            )?,
            capture_ranks: gauge(
                r,
                "warden_agent_capture_ranks",
                "Training-process ranks on this node that report through the job-side capture.",
            )?,
        })
    }
}
