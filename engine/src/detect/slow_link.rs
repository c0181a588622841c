//! Slow link: from per-peer network timing ([`crate::links`]), the node common to the
//! network edges whose sends take far longer per byte than the job's other edges.
//!
//! Only the NCCL plugin's proxy steps (mask `proxystep`, capture path `nccl_proxy`) give
//! this signal: a send step's time from its isend to the network's completion, which
//! belongs to one sender → receiver edge. A collective's own transfer time cannot
//! localize a link (in a ring it is paced by the slowest link for every member), so a
//! job without per-peer timing gets no slow-link verdict at all (docs/CAPTURE.md).
//!
//! A degraded NIC, port or cable slows every edge through its node, in and out, while
//! the edges it feeds downstream keep their own pace (they wait for data, not for the
//! wire). So: each edge's recent time per byte against the healthy pace (the lower
//! quartile) of the job's other edges whose steps are of the same size; slow edges stand
//! well above; the node with the largest share of slow edges explains them, and the next
//! one is named only for slow edges still unexplained, at least two, at least half of
//! its edges, and leading to at least two other nodes. Slow edges between one pair of nodes alone, or
//! a job of two nodes, localize nothing, and nothing is said.

use rustc_hash::{FxHashMap, FxHashSet};
use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::{Verdict, Window};
use crate::state::{NO_NODE, median};

/// Slow-link detection settings.
#[derive(Debug, Clone)]
pub struct SlowLinkConfig {
    /// Judge per-peer timing where a job has it.
    pub enabled: bool,
    /// Smallest slowdown of an edge against its peers reported.
    pub min_ratio: f64,
    /// A slow edge must also stand this many robust standard deviations above its
    /// peers.
    pub sigmas: f64,
    /// Recent samples per edge judged (the median of them).
    pub samples: usize,
    /// Samples an edge needs before it is judged.
    pub min_samples: usize,
    /// An edge whose last sample is older than this is not judged, seconds.
    pub max_age_secs: f64,
}

impl Default for SlowLinkConfig {
    fn default() -> Self {
        SlowLinkConfig {
            enabled: true,
            min_ratio: 1.5,
            sigmas: 6.0,
            samples: 11,
            min_samples: 8,
            max_age_secs: 60.0,
        }
    }
}

/// One judged edge.
#[derive(Debug, Clone, Copy)]
struct Judged {
    src: u32,
    dst: u32,
    src_node: u32,
    dst_node: u32,
    comm: u64,
    /// Median time per byte of its recent samples, ns.
    score: f64,
    /// Against its group's median.
    ratio: f64,
    slow: bool,
}

/// Check one job.
pub fn check(cfg: &SlowLinkConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let job = w.job;
    if !cfg.enabled || job.links.edges.is_empty() {
        return vec![];
    }
    let oldest = now.plus_secs(-cfg.max_age_secs);
    // Edges by the size of their steps: on one fabric, steps of one size take the same
    // time per byte whatever communicator they belong to, while steps of very different
    // sizes differ by latency alone. A communicator alone is too small a sample: a
    // pipeline of four stages has six edges, four of them through a middle stage.
    let mut groups: FxHashMap<u32, Vec<Judged>> = FxHashMap::default();
    for (&(comm, src, peer), e) in &job.links.edges {
        if e.last_at < oldest || e.samples.len() < cfg.min_samples {
            continue;
        }
        let Some(dst) = job.links.rank_of(comm, peer) else {
            continue;
        };
        let (Some(s), Some(d)) = (job.ranks.get(src), job.ranks.get(dst)) else {
            continue;
        };
        if s.node == NO_NODE || d.node == NO_NODE || s.node == d.node || !s.alive() || !d.alive() {
            continue;
        }
        let mut v: Vec<f64> = e.samples.recent(cfg.samples).map(f64::from).collect();
        let Some(score) = median(&mut v) else {
            continue;
        };
        let class = e.step_bytes().max(1).ilog2();
        groups.entry(class).or_default().push(Judged {
            src,
            dst,
            src_node: s.node,
            dst_node: d.node,
            comm,
            score,
            ratio: 1.0,
            slow: false,
        });
    }
    let mut judged: Vec<Judged> = Vec::new();
    for mut g in groups.into_values() {
        if g.len() < 3 {
            continue;
        }
        // The pace of a healthy edge: the lower quartile, and the spread of the faster
        // half around it, so that a group up to half of whose edges are slow (two bad
        // nodes in a ring of eight) still has a healthy baseline.
        let mut xs: Vec<f64> = g.iter().map(|j| j.score).collect();
        xs.sort_by(f64::total_cmp);
        let base = xs[(xs.len() - 1) / 4];
        if base <= 0.0 {
            continue;
        }
        let mut dev: Vec<f64> = xs[..=xs.len() / 2]
            .iter()
            .map(|x| (x - base).abs())
            .collect();
        let sigma = 1.4826 * median(&mut dev).unwrap_or(0.0);
        let threshold = (base * cfg.min_ratio).max(base + cfg.sigmas * sigma);
        for j in &mut g {
            j.ratio = j.score / base;
            j.slow = j.score >= threshold;
        }
        judged.extend(g);
    }
    let slow_total = judged.iter().filter(|j| j.slow).count();
    if slow_total < 2 {
        return vec![];
    }
    // Name nodes greedily: the node through which the most slow edges pass explains
    // them; a neighbour whose only slow edges lead to it is explained by it. A node is
    // named while at least two slow edges not yet explained pass through it and they
    // are at least half of its edges.
    let mut all: FxHashMap<u32, usize> = FxHashMap::default();
    for j in &judged {
        *all.entry(j.src_node).or_default() += 1;
        *all.entry(j.dst_node).or_default() += 1;
    }
    if all.len() < 3 {
        return vec![];
    }
    let mut explained = vec![false; judged.len()];
    let mut culprits: Vec<(u32, usize, usize)> = Vec::new();
    loop {
        // Per node: its slow edges not yet explained, and the other nodes they lead to.
        let mut open: FxHashMap<u32, (usize, FxHashSet<u32>)> = FxHashMap::default();
        for (j, done) in judged.iter().zip(&explained) {
            if j.slow && !done {
                for (n, other) in [(j.src_node, j.dst_node), (j.dst_node, j.src_node)] {
                    let o = open.entry(n).or_default();
                    o.0 += 1;
                    o.1.insert(other);
                }
            }
        }
        // Slow edges that all lead to one other node say as much about that node: the
        // two are not told apart until another of their edges is slow.
        let best = open
            .into_iter()
            .filter(|(_, (_, others))| others.len() >= 2)
            .map(|(n, (slow, _))| (n, slow))
            .filter(|&(n, slow)| slow >= 2 && 2 * slow >= all[&n])
            .max_by(|a, b| {
                (a.1 * all[&b.0])
                    .cmp(&(b.1 * all[&a.0]))
                    .then(a.1.cmp(&b.1))
                    .then(b.0.cmp(&a.0))
            });
        let Some((node, slow)) = best else { break };
        for (j, done) in judged.iter().zip(explained.iter_mut()) {
            if j.slow && (j.src_node == node || j.dst_node == node) {
                *done = true;
            }
        }
        culprits.push((node, all[&node], slow));
    }
    culprits.sort_by_key(|c| c.0);
    culprits
        .into_iter()
        .map(|(node, all, slow)| {
            let name = w.cluster.node_name(node).to_owned();
            let mut mine: Vec<&Judged> = judged
                .iter()
                .filter(|j| j.slow && (j.src_node == node || j.dst_node == node))
                .collect();
            mine.sort_by(|a, b| b.ratio.total_cmp(&a.ratio));
            let mut ratios: Vec<f64> = mine.iter().map(|j| j.ratio).collect();
            let ratio = median(&mut ratios).unwrap_or(1.0);
            let ranks: Vec<u32> = job
                .ranks
                .iter()
                .filter(|(_, r)| r.node == node)
                .map(|(i, _)| i)
                .collect();
            let iteration = job.iteration_secs().unwrap_or(1.0);
            let evidence = mine
                .iter()
                .take(4)
                .map(|j| Evidence {
                    at: now,
                    text: format!(
                        "{} -> {} (communicator {:016x}): {:.1} µs per MiB on the wire, {:.2}x its peers",
                        w.describe_rank(j.src),
                        w.describe_rank(j.dst),
                        j.comm,
                        j.score * 1_048_576.0 / 1e3,
                        j.ratio
                    ),
                })
                .collect();
            Verdict::Finding(Finding {
                kind: IncidentKind::SlowLink,
                job: Some(job.name.clone()),
                ranks,
                nodes: vec![name.clone()],
                gpus: vec![],
                onset: now.plus_secs(-(iteration * cfg.min_samples as f64)),
                confidence: (0.6 + (ratio - 1.0) * 0.3).clamp(0.6, 0.97)
                    * (0.8 + 0.2 * slow as f64 / all as f64),
                severity: Severity::Warning,
                summary: format!(
                    "the network through {name} is slow: {slow} of its {all} network edges take \
                     {ratio:.2}x the time per byte of their peers"
                ),
                evidence,
            })
        })
        .collect()
}
