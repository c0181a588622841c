//! Slow link: collectives that cross a node's network are slow although arrivals are
//! even. Given each rank's own transfer time per collective, a node whose ranks'
//! transfer times stand well above those of peers doing the same collectives (same
//! operation, size and payload) in multi-node communicators is the culprit.
//!
//! No capture path reports such a time today, so the detector is off by default
//! ([`SlowLinkConfig::enabled`]): the NCCL plugin's `xfer_ns` runs from the proxy's first
//! operation (soon after the enqueue) to its last, which holds the wait for the GPU and
//! for the slowest peer and, in a ring, is paced by the slowest link for every member;
//! `warden_torch` reports none. Judged as a rank's own, it names whichever node's ranks
//! arrive early (docs/CAPTURE.md, "What each path emits").

use rustc_hash::FxHashMap;
use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::{Verdict, Window};
use crate::state::{NO_NODE, median};

/// Slow-link detection settings.
#[derive(Debug, Clone)]
pub struct SlowLinkConfig {
    /// Judge `xfer_ns` as each rank's own link time. Off by default: no capture path
    /// reports that yet (see the module's documentation).
    pub enabled: bool,
    /// Smallest transfer slowdown reported.
    pub min_ratio: f64,
    /// A node must stand this many robust standard deviations above the others.
    pub sigmas: f64,
    /// Transfer samples per rank and communicator needed before judging.
    pub min_samples: usize,
}

impl Default for SlowLinkConfig {
    fn default() -> Self {
        SlowLinkConfig {
            enabled: false,
            min_ratio: 1.4,
            sigmas: 6.0,
            min_samples: 5,
        }
    }
}

/// Check one job.
pub fn check(cfg: &SlowLinkConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    if !cfg.enabled {
        return vec![];
    }
    let job = w.job;
    // Per (rank, comm) median own transfer time, grouped by collective class.
    let mut classes: FxHashMap<(i32, usize, u64), Vec<(u32, f64)>> = FxHashMap::default();
    let mut comms_of_node: FxHashMap<u32, usize> = FxHashMap::default();
    for c in &job.comms {
        let mut nodes = c
            .members
            .iter()
            .filter_map(|m| job.ranks.get(m.rank).map(|r| r.node))
            .filter(|&n| n != NO_NODE);
        let Some(first) = nodes.next() else { continue };
        if nodes.all(|n| n == first) {
            continue; // intra-node: NVLink, not the network
        }
        let class = classes.entry((c.op, c.members.len(), c.bytes)).or_default();
        for m in &c.members {
            let Some(rank) = job.ranks.get(m.rank) else {
                continue;
            };
            if !rank.alive() || rank.node == NO_NODE || m.xfer.len() < cfg.min_samples {
                continue;
            }
            let mut v: Vec<f64> = m.xfer.recent(m.xfer.len()).map(f64::from).collect();
            if let Some(x) = median(&mut v) {
                class.push((m.rank, x));
                *comms_of_node.entry(rank.node).or_default() += 1;
            }
        }
    }
    let mut per_node: FxHashMap<u32, Vec<f64>> = FxHashMap::default();
    for members in classes.values() {
        let mut xs: Vec<f64> = members.iter().map(|p| p.1).collect();
        let Some(base) = median(&mut xs) else {
            continue;
        };
        if base <= 0.0 || members.len() < 3 {
            continue;
        }
        for &(r, x) in members {
            per_node
                .entry(job.ranks[r].node)
                .or_default()
                .push(x / base);
        }
    }
    let mut scores: Vec<(u32, f64, usize)> = per_node
        .into_iter()
        .filter_map(|(n, mut v)| {
            let k = v.len();
            median(&mut v).map(|m| (n, m, k))
        })
        .collect();
    if scores.len() < 3 {
        return vec![];
    }
    scores.sort_by_key(|s| s.0);
    let mut ratios: Vec<f64> = scores.iter().map(|s| s.1).collect();
    let mid = median(&mut ratios).unwrap_or(1.0);
    let mut dev: Vec<f64> = scores.iter().map(|s| (s.1 - mid).abs()).collect();
    let sigma = 1.4826 * median(&mut dev).unwrap_or(0.0);
    let threshold = cfg.min_ratio.max(mid + cfg.sigmas * sigma);
    scores
        .into_iter()
        .filter(|s| s.1 >= threshold)
        .map(|(node, ratio, samples)| {
            let name = w.cluster.node_name(node).to_owned();
            let ranks: Vec<u32> = job
                .ranks
                .iter()
                .filter(|(_, r)| r.node == node)
                .map(|(i, _)| i)
                .collect();
            let comms = comms_of_node.get(&node).copied().unwrap_or(0);
            let iteration = job.iteration_secs().unwrap_or(0.0);
            Verdict::Finding(Finding {
                kind: IncidentKind::SlowLink,
                job: Some(job.name.clone()),
                ranks,
                nodes: vec![name.clone()],
                gpus: vec![],
                onset: now.plus_secs(-(iteration * cfg.min_samples as f64)),
                confidence: (0.6 + (ratio - 1.0) * 0.4).clamp(0.6, 0.97),
                severity: Severity::Warning,
                summary: format!(
                    "collectives crossing {name}'s network are slow: its ranks' own transfer time is \
                     {ratio:.2}x that of peers doing the same collectives"
                ),
                evidence: vec![Evidence {
                    at: now,
                    text: format!(
                        "{samples} rank-communicator pairs on {name} in {comms} multi-node communicators; \
                         median transfer ratio {ratio:.2} (threshold {threshold:.2})"
                    ),
                }],
            })
        })
        .collect()
}
