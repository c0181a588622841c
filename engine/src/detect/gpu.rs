//! GPU faults: hardware events (XID, ECC, NVLink, PCIe, fallen off the bus) folded per
//! GPU, joined with the ranks that run there. One finding per GPU, however many lines
//! the kernel printed.

use warden_model::wire::{EventSeverity, NodeEventKind};
use warden_model::xid::XidCatalog;
use warden_model::{Evidence, Finding, GpuRef, IncidentKind, Severity, Timestamp};

use super::Verdict;
use crate::state::{Cluster, GpuTrouble};

/// GPU fault detection settings.
#[derive(Debug, Clone)]
pub struct GpuConfig {
    /// Report trouble whose last event is at most this old, seconds.
    pub retention_secs: f64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            retention_secs: 3600.0,
        }
    }
}

fn describe(kind: NodeEventKind, code: Option<u32>) -> String {
    match (kind, code) {
        (NodeEventKind::Xid, Some(c)) => match XidCatalog::builtin().get(c) {
            Some(x) => format!("XID {c} ({})", x.name),
            None => format!("XID {c}"),
        },
        (k, Some(c)) => format!("{} event {c}", k.as_str()),
        (k, None) => format!("{} event", k.as_str()),
    }
}

/// Check the whole cluster.
pub fn check(cfg: &GpuConfig, cluster: &Cluster, now: Timestamp) -> Vec<Verdict> {
    let mut keys: Vec<&(u32, Option<u32>)> = cluster.gpu_trouble.keys().collect();
    keys.sort_unstable();
    keys.into_iter()
        .filter_map(|k| {
            let t = &cluster.gpu_trouble[k];
            (now.secs_since(t.last_at) <= cfg.retention_secs).then(|| finding(cluster, t))
        })
        .map(Verdict::Finding)
        .collect()
}

fn finding(cluster: &Cluster, t: &GpuTrouble) -> Finding {
    let node = cluster.node_name(t.node).to_owned();
    // Ranks of any job running on that GPU (or on the node, when no GPU was named).
    let mut job = None;
    let mut ranks = Vec::new();
    let mut names: Vec<&String> = cluster.jobs.keys().collect();
    names.sort();
    for name in names {
        let js = &cluster.jobs[name];
        for (i, r) in js.ranks.iter() {
            if r.node == t.node && (t.gpu.is_none() || r.gpu == t.gpu) {
                if job.is_none() {
                    job = Some(name.clone());
                }
                if job.as_ref() == Some(name) {
                    ranks.push(i);
                }
            }
        }
    }
    let (worst_kind, worst_code) = t
        .codes
        .iter()
        .max_by_key(|(k, c, _)| {
            (
                matches!(k, NodeEventKind::FallenOffBus | NodeEventKind::Xid),
                c.unwrap_or(0),
            )
        })
        .map(|(k, c, _)| (*k, *c))
        .unwrap_or((NodeEventKind::Other, None));
    let what = describe(worst_kind, worst_code);
    let (severity, confidence, grade) = match t.severity {
        EventSeverity::Fatal => (Severity::Critical, 0.99, "fatal"),
        EventSeverity::Error => (Severity::Critical, 0.9, "error"),
        _ => (Severity::Warning, 0.7, "warning"),
    };
    let place = match t.gpu {
        Some(g) => format!("GPU {g} on {node}"),
        None => node.clone(),
    };
    let runs = match (&job, ranks.len()) {
        (Some(j), 1) => format!("; rank {} of {j} runs there", ranks[0]),
        (Some(j), n) if n > 1 => format!("; {n} ranks of {j} run there"),
        _ => String::new(),
    };
    let total: u32 = t
        .codes
        .iter()
        .fold(0u32, |sum, (_, _, n)| sum.saturating_add(*n));
    let mut evidence = vec![Evidence {
        at: t.first_at,
        text: format!("{node} kernel log: {}", t.message),
    }];
    for (k, c, n) in &t.codes {
        evidence.push(Evidence {
            at: t.last_at,
            text: format!("{} seen {n} time(s)", describe(*k, *c)),
        });
    }
    Finding {
        kind: IncidentKind::GpuFault,
        job,
        ranks,
        nodes: vec![node.clone()],
        gpus: t
            .gpu
            .map(|index| vec![GpuRef { node, index }])
            .unwrap_or_default(),
        onset: t.first_at,
        confidence,
        severity,
        summary: format!(
            "{place} reported {what}, {grade}{runs}{}",
            if total > 1 {
                format!(" ({total} events)")
            } else {
                String::new()
            }
        ),
        evidence,
    }
}
