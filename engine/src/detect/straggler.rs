//! Straggler: a node (or a single rank) whose own compute time per iteration is
//! persistently above the job's median. Compute time is the iteration's length minus
//! the time the rank spent waiting inside collectives, both on its own clock, so clock
//! skew cannot fake it, and the ranks a straggler delays (which wait longer but compute
//! the same) are not blamed. Medians over several iterations make one-off hiccups that
//! move between ranks, and checkpoint pauses that hit every rank at once, noise. A
//! median must also stand above what chance makes of its window, given how far single
//! samples scatter (ranks sharing busy CPUs scatter far; a GPU's compute hardly) and
//! how far a node's iterations scatter as a whole (its ranks share a host and a
//! tensor-parallel group, so their samples of one iteration rise and fall together).

use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::{Verdict, Window};
use crate::state::{NO_NODE, median, rank_compute_median};

/// Straggler detection settings.
#[derive(Debug, Clone)]
pub struct StragglerConfig {
    /// Iterations in the quickest window (catches large slowdowns in two or three steps).
    pub quick_window: usize,
    /// Smallest slowdown the quickest window reports.
    pub quick_min_ratio: f64,
    /// Iterations in the fast window (catches large slowdowns quickly).
    pub fast_window: usize,
    /// Smallest slowdown the fast window reports.
    pub fast_min_ratio: f64,
    /// Iterations in the slow window (catches small slowdowns reliably).
    pub slow_window: usize,
    /// Smallest slowdown the slow window reports.
    pub slow_min_ratio: f64,
    /// Smallest slowdown reported for a single rank whose node is otherwise healthy.
    pub rank_min_ratio: f64,
    /// A node must stand this many robust standard deviations above the others.
    pub sigmas: f64,
    /// ... and this many standard errors of its pooled samples above the median.
    pub sample_sigmas: f64,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        StragglerConfig {
            quick_window: 3,
            quick_min_ratio: 1.2,
            fast_window: 5,
            fast_min_ratio: 1.15,
            slow_window: 16,
            slow_min_ratio: 1.05,
            rank_min_ratio: 1.1,
            sigmas: 6.0,
            sample_sigmas: 5.0,
        }
    }
}

/// Robust spread: 1.4826 × median absolute deviation.
fn robust_sigma(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    let Some(m) = median(&mut v) else { return 0.0 };
    let mut dev: Vec<f64> = values.iter().map(|x| (x - m).abs()).collect();
    1.4826 * median(&mut dev).unwrap_or(0.0)
}

struct NodeScore {
    node: u32,
    ratio: f64,
    ranks: Vec<u32>,
    /// Samples pooled into `ratio`.
    samples: usize,
}

/// Scores of one window: the job's median compute, per-rank ratios, per-node scores, and
/// the robust relative spread of single samples.
struct Scores {
    base: f64,
    ratios: Vec<(u32, f64)>,
    nodes: Vec<NodeScore>,
    sample_sigma: f64,
    /// Robust relative spread of a node's iteration (the median of its ranks' samples
    /// of one iteration) about the job's same iteration, over nodes of
    /// [`SHARED_NOISE_RANKS`] ranks or more: the noise a node's ranks share within an
    /// iteration, which their pooled samples cannot average out.
    iteration_sigma: f64,
    /// Robust relative spread of single samples about their own rank's median: the
    /// noise a rank's median is read through, its speed left out.
    within_sigma: f64,
}

/// A node's score from its pooled, normalised samples: the median when there are
/// many, the lower quartile when there are fewer, the smallest when there are five or
/// fewer (a node of one or two ranks in a short window). A slow node is slow in every
/// sample; chance hiccups must then fill nearly all of a small pool to pass for one
/// (four of five at 3 % a step: C(5,4)·0.03⁴ ≈ 1 in 250,000 windows, which 64 nodes of
/// 20 seeds of `small_nodes_under_heavy_noise_raise_nothing_over_twenty_seeds` exceed).
fn node_score(pooled: &mut [f64]) -> Option<f64> {
    if pooled.is_empty() {
        return None;
    }
    if pooled.len() >= 16 {
        return median(pooled);
    }
    pooled.sort_unstable_by(f64::total_cmp);
    if pooled.len() <= 5 {
        return Some(pooled[0]);
    }
    Some(pooled[pooled.len() / 4])
}

/// Ranks a node needs for its iterations' medians to measure the noise its ranks share.
const SHARED_NOISE_RANKS: usize = 3;

/// How far nodes' iterations scatter about the job's same iterations (robust relative
/// spread), from each node of [`SHARED_NOISE_RANKS`] ranks or more: per iteration of the
/// window, the median of its ranks' samples, over the median of all such nodes' medians
/// of that iteration. Samples of one node in one iteration are not independent (its
/// ranks share a host, a tensor-parallel group and what delays it), so the chance a
/// node's pooled median stands high is bounded by this as well as by the samples'
/// count. `nodes` yields each node's rank count and pooled samples (`window` a rank,
/// rank after rank, newest first: a node's ranks report in the same batches, so their
/// iterations line up). 0 when fewer than three nodes qualify.
fn shared_noise<'a>(nodes: impl Iterator<Item = (usize, &'a [f64])>, window: usize) -> f64 {
    if window == 0 {
        return 0.0;
    }
    // Every qualifying node's iteration medians in one buffer, `window` a node.
    let mut medians: Vec<f64> = Vec::new();
    let mut column = Vec::new();
    for (ranks, pooled) in nodes {
        if ranks < SHARED_NOISE_RANKS || pooled.len() != ranks * window {
            continue;
        }
        for j in 0..window {
            column.clear();
            column.extend(pooled.iter().skip(j).step_by(window));
            medians.push(median(&mut column).unwrap_or(0.0));
        }
    }
    if medians.len() < 3 * window {
        return 0.0;
    }
    let mut relative = Vec::with_capacity(medians.len());
    for j in 0..window {
        column.clear();
        column.extend(medians.iter().skip(j).step_by(window));
        let Some(job) = median(&mut column).filter(|m| *m > 1e-9) else {
            continue;
        };
        relative.extend(medians.iter().skip(j).step_by(window).map(|m| m / job));
    }
    robust_sigma(&relative)
}

/// Samples longer than this many times the job's typical compute are pauses (a
/// checkpoint, a long hiccup), not compute: ranks report them at slightly different
/// moments, so left in they would make whoever reported last look slow.
const PAUSE_FACTOR: f64 = 3.0;

/// The job's typical compute per iteration: the median over ranks of each rank's median
/// over its last 16 iterations.
fn typical_compute(w: Window<'_>) -> Option<f64> {
    let mut v: Vec<f64> = w
        .job
        .ranks
        .values()
        .filter(|r| r.alive())
        .filter_map(|r| rank_compute_median(r, 16))
        .collect();
    median(&mut v)
}

/// A rank's last `window` samples that are not pauses, appended to `out`, if it has
/// enough (otherwise `out` is left as it was).
fn recent_compute(
    r: &crate::state::RankState,
    window: usize,
    cap: f64,
    out: &mut Vec<f64>,
) -> bool {
    let start = out.len();
    out.extend(
        r.compute
            .recent(window + 2)
            .map(|s| f64::from(s.secs))
            .filter(|&x| x <= cap)
            .take(window),
    );
    if out.len() - start == window {
        true
    } else {
        out.truncate(start);
        false
    }
}

/// Per-node and per-rank compute ratios over the last `window` iterations.
///
/// A node's ratio is the median of all its ranks' samples pooled: a slow node shows in
/// most of them, while hiccups, which strike one rank in one iteration, stay a minority
/// however they fall between ranks. Nodes with fewer than `min_ranks` ranks scored are
/// left out.
fn scores(w: Window<'_>, window: usize, min_ranks: usize, cap: f64) -> Option<Scores> {
    let job = w.job;
    if window == 0 {
        return None;
    }
    // Every scored rank's samples in one buffer, `window` each, in the ranks' order:
    // the job's ranks are walked once a pass per window, so nothing is allocated per
    // rank.
    let mut samples: Vec<f64> = Vec::with_capacity(job.ranks.len() * window);
    let mut scored: Vec<(u32, f64)> = Vec::with_capacity(job.ranks.len());
    let mut scratch: Vec<f64> = Vec::with_capacity(window);
    for (i, r) in job.ranks.iter() {
        if !r.alive() || r.node == NO_NODE || !recent_compute(r, window, cap, &mut samples) {
            continue;
        }
        // Each rank's median, taken once (`median` reorders a copy; the samples stay).
        scratch.clear();
        scratch.extend_from_slice(&samples[samples.len() - window..]);
        match median(&mut scratch) {
            Some(m) => scored.push((i, m)),
            None => samples.truncate(samples.len() - window),
        }
    }
    if scored.len() < 4 {
        return None;
    }
    let mut medians: Vec<f64> = scored.iter().map(|(_, m)| *m).collect();
    let base = median(&mut medians)?;
    if base <= 1e-6 {
        return None;
    }
    let per_rank = scored
        .iter()
        .zip(samples.chunks_exact(window))
        .map(|(&(r, m), v)| (r, m, v));
    let mut ratios = Vec::with_capacity(scored.len());
    let mut all = Vec::with_capacity(samples.len());
    let mut within = Vec::with_capacity(samples.len());
    let mut by_node: std::collections::BTreeMap<u32, (Vec<u32>, Vec<f64>)> = Default::default();
    for (r, m, v) in per_rank {
        ratios.push((r, m / base));
        let e = by_node.entry(job.ranks[r].node).or_default();
        e.0.push(r);
        e.1.extend(v.iter().map(|x| x / base));
        all.extend(v.iter().map(|x| x / base));
        if m > 1e-9 {
            within.extend(v.iter().map(|x| x / m));
        }
    }
    let iteration_sigma = shared_noise(
        by_node.values().map(|(r, p)| (r.len(), p.as_slice())),
        window,
    );
    let nodes = by_node
        .into_iter()
        .filter(|(_, (ranks, _))| ranks.len() >= min_ranks)
        .filter_map(|(node, (ranks, mut pooled))| {
            let samples = pooled.len();
            node_score(&mut pooled).map(|ratio| NodeScore {
                node,
                ratio,
                ranks,
                samples,
            })
        })
        .collect();
    Some(Scores {
        base,
        ratios,
        nodes,
        sample_sigma: robust_sigma(&all),
        iteration_sigma,
        within_sigma: robust_sigma(&within),
    })
}

/// Recent samples per rank for the two-node comparison.
const TWO_NODE_RECENT: usize = 5;
/// Earlier samples (before the recent ones) each rank needs for it.
const TWO_NODE_EARLIER: usize = 8;
/// How far a node's own compute may drift and still count as unchanged.
const TWO_NODE_STEADY: f64 = 1.08;

/// A rank, its compute median over earlier iterations and over the recent ones.
type RankChange = (u32, f64, f64);

/// A rank's recent and earlier compute medians, pauses left out.
fn before_and_now(r: &crate::state::RankState, cap: f64) -> Option<(f64, f64)> {
    let v: Vec<f64> = r
        .compute
        .recent(usize::MAX)
        .map(|s| f64::from(s.secs))
        .filter(|&x| x <= cap)
        .collect();
    if v.len() < TWO_NODE_RECENT + TWO_NODE_EARLIER {
        return None;
    }
    let (recent, earlier) = v.split_at(TWO_NODE_RECENT);
    Some((
        median(&mut earlier.to_vec())?,
        median(&mut recent.to_vec())?,
    ))
}

/// A job on two nodes has no majority of nodes to compare with: with half the job
/// slow, the median sits between the halves. There, a node is slow when the compute of
/// every one of its ranks rose against its own earlier iterations, by at least
/// `min_ratio`, while the other node's stayed where it was. Returns (node, ratio to the
/// other node, the other node's compute, its ranks, the other node).
fn two_node_change(
    cfg: &StragglerConfig,
    w: Window<'_>,
    cap: f64,
) -> Option<(u32, f64, f64, Vec<u32>, u32)> {
    // Only a job on exactly two nodes: a large job stops at its third node, before any
    // rank's samples are read (this runs on every pass of the detector).
    let mut nodes_seen: Vec<u32> = Vec::with_capacity(3);
    for r in w.job.ranks.values() {
        if r.node != NO_NODE && !nodes_seen.contains(&r.node) {
            nodes_seen.push(r.node);
            if nodes_seen.len() > 2 {
                return None;
            }
        }
    }
    let mut by_node: std::collections::BTreeMap<u32, Vec<RankChange>> = Default::default();
    for (i, r) in w.job.ranks.iter() {
        if !r.alive() || r.node == NO_NODE {
            continue;
        }
        let (before, now) = before_and_now(r, cap)?;
        if before <= 1e-6 {
            return None;
        }
        by_node.entry(r.node).or_default().push((i, before, now));
    }
    if by_node.len() != 2 || by_node.values().map(Vec::len).sum::<usize>() < 4 {
        return None;
    }
    let nodes: Vec<(u32, Vec<RankChange>)> = by_node.into_iter().collect();
    let change =
        |ranks: &[RankChange]| -> Vec<f64> { ranks.iter().map(|(_, b, n)| n / b).collect() };
    let now_of = |ranks: &[RankChange]| median(&mut ranks.iter().map(|x| x.2).collect::<Vec<_>>());
    for (slow, steady) in [(0, 1), (1, 0)] {
        let (node, ranks) = &nodes[slow];
        let (other, others) = &nodes[steady];
        let rose = change(ranks).into_iter().fold(f64::INFINITY, f64::min);
        let mut held = change(others);
        let held = median(&mut held)?;
        let (now, base) = (now_of(ranks)?, now_of(others)?);
        if base <= 1e-6 {
            continue;
        }
        let ratio = now / base;
        if rose >= cfg.fast_min_ratio && held <= TWO_NODE_STEADY && ratio >= cfg.fast_min_ratio {
            return Some((
                *node,
                ratio,
                base,
                ranks.iter().map(|x| x.0).collect(),
                *other,
            ));
        }
    }
    None
}

/// Check one job.
pub fn check(cfg: &StragglerConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let mut flagged: Vec<(u32, f64, f64, Vec<u32>, usize)> = Vec::new(); // node, ratio, base, ranks, window
    // Against the other node rather than the job median, for a two-node job.
    let mut versus: Option<(u32, u32)> = None;
    let Some(typical) = typical_compute(w) else {
        return vec![];
    };
    let cap = PAUSE_FACTOR * typical;
    // Short windows only for nodes with several ranks: one rank's unlucky streak of
    // hiccups must not pass for a slow node.
    for (window, min_ratio, min_ranks) in [
        (cfg.quick_window, cfg.quick_min_ratio, 3),
        (cfg.fast_window, cfg.fast_min_ratio, 1),
        (cfg.slow_window, cfg.slow_min_ratio, 1),
    ] {
        let Some(sc) = scores(w, window, min_ranks, cap) else {
            continue;
        };
        if sc.nodes.len() < 3 {
            continue;
        }
        let sigma = robust_sigma(&sc.nodes.iter().map(|n| n.ratio).collect::<Vec<_>>());
        for n in sc.nodes {
            // Above the floor, above the spread between nodes, and above what chance
            // makes of this many samples.
            let mut chance =
                1.0 + cfg.sample_sigmas * 1.25 * sc.sample_sigma / (n.samples as f64).sqrt();
            if n.ranks.len() >= SHARED_NOISE_RANKS {
                // ... and above what the noise its ranks share makes of this many
                // iterations.
                chance = chance.max(
                    1.0 + cfg.sample_sigmas * 1.25 * sc.iteration_sigma / (window as f64).sqrt(),
                );
            }
            let threshold = min_ratio.max(1.0 + cfg.sigmas * sigma).max(chance);
            if n.ratio >= threshold && !flagged.iter().any(|f| f.0 == n.node) {
                flagged.push((n.node, n.ratio, sc.base, n.ranks, window));
            }
        }
    }
    if flagged.is_empty()
        && let Some((node, ratio, base, ranks, other)) = two_node_change(cfg, w, cap)
    {
        flagged.push((node, ratio, base, ranks, TWO_NODE_RECENT));
        versus = Some((node, other));
    }
    // Single slow ranks on otherwise healthy nodes (a throttling GPU).
    if let Some(Scores {
        base,
        ratios,
        within_sigma,
        ..
    }) = scores(w, cfg.slow_window, 1, cap)
    {
        let sigma = robust_sigma(&ratios.iter().map(|r| r.1).collect::<Vec<_>>());
        // Above what chance makes of the median of one rank's window, given how much
        // single samples scatter about their rank's own median: on a noisy job (ranks
        // sharing busy CPUs) a rank's run of bad luck stands for nothing, while a
        // GPU's steady compute leaves the floor in charge.
        let chance =
            1.0 + cfg.sample_sigmas * 1.25 * within_sigma / (cfg.slow_window as f64).sqrt();
        let threshold = cfg
            .rank_min_ratio
            .max(1.0 + 1.5 * cfg.sigmas * sigma)
            .max(chance);
        for (r, x) in ratios {
            let node = w.job.ranks[r].node;
            if x >= threshold && !flagged.iter().any(|f| f.0 == node) {
                flagged.push((node, x, base, vec![r], cfg.slow_window));
            }
        }
    }
    let iteration = w.job.iteration_secs();
    flagged
        .into_iter()
        .map(|(node, ratio, base, ranks, window)| {
            let name = w.cluster.node_name(node).to_owned();
            let excess = (ratio - 1.0) * base;
            let (job_slowdown, detail) = match iteration {
                Some(p) if p > excess && excess > 0.0 => (
                    p / (p - excess),
                    format!(" ({p:.2} s per iteration instead of about {:.2} s)", p - excess),
                ),
                _ => (ratio, String::new()),
            };
            let total = w.job.ranks.values().filter(|r| r.node == node && r.alive()).count();
            let scope = if ranks.len() == 1 && total > 1 {
                format!("rank {} on {name}", ranks[0])
            } else {
                format!("{name} ({} of {total} ranks)", ranks.len())
            };
            let onset = onset_of(w, &ranks, base * (1.0 + (ratio - 1.0) / 2.0)).unwrap_or(now);
            let (_, gpus) = w.places(&ranks);
            let against = match versus {
                Some((n, other)) if n == node => w.cluster.node_name(other).to_owned(),
                _ => "the job median".to_owned(),
            };
            Finding {
                kind: IncidentKind::Straggler,
                job: Some(w.job.name.clone()),
                ranks: ranks.clone(),
                nodes: vec![name.clone()],
                gpus: if ranks.len() == 1 { gpus } else { vec![] },
                onset,
                confidence: (0.6 + (ratio - 1.0) * 1.5).clamp(0.6, 0.97),
                severity: Severity::Warning,
                summary: format!(
                    "{scope} computes {ratio:.2}x slower than {against}; the job runs about \
                     {job_slowdown:.2}x slower because of it{detail}"
                ),
                evidence: vec![Evidence {
                    at: now,
                    text: format!(
                        "median compute over the last {window} iterations: {:.3} s on {name} vs {base:.3} s ({against})",
                        base * ratio
                    ),
                }],
            }
        })
        .map(Verdict::Finding)
        .collect()
}

/// Start of the current run of samples above `level` seconds, earliest over `ranks`.
fn onset_of(w: Window<'_>, ranks: &[u32], level: f64) -> Option<Timestamp> {
    ranks
        .iter()
        .filter_map(|&r| {
            let mut start = None;
            for s in w.job.ranks[r].compute.recent(usize::MAX) {
                if f64::from(s.secs) >= level {
                    start = Some(s.at);
                } else {
                    break;
                }
            }
            start
        })
        .min()
        .map(|t| {
            // The sample is taken at the end of the first slow iteration; it began one
            // iteration earlier.
            let p = w.job.iteration_secs().unwrap_or(0.0);
            t.plus_secs(-p)
        })
}

#[cfg(test)]
mod shared_noise_tests {
    use super::shared_noise;

    /// `nodes` nodes of `ranks` ranks over `window` iterations: sample = 1 + the node's
    /// shared offset of that iteration + the rank's own; pooled rank after rank.
    fn pools(
        nodes: usize,
        ranks: usize,
        window: usize,
        shared: impl Fn(usize, usize) -> f64,
        own: impl Fn(usize, usize, usize) -> f64,
    ) -> Vec<Vec<f64>> {
        (0..nodes)
            .map(|n| {
                (0..ranks)
                    .flat_map(|r| (0..window).map(move |j| (r, j)))
                    .map(|(r, j)| 1.0 + shared(n, j) + own(n, r, j))
                    .collect()
            })
            .collect()
    }

    /// Deterministic spread in [-1, 1).
    fn spread(a: usize, b: usize, c: usize) -> f64 {
        ((a * 7919 + b * 104_729 + c * 1_299_709) % 1000) as f64 / 500.0 - 1.0
    }

    #[test]
    fn what_a_nodes_ranks_share_in_an_iteration_is_measured_and_their_own_noise_is_not() {
        let window = 3;
        // Ranks' own noise only (±10%): a node's iteration median averages it away.
        let own = pools(16, 8, window, |_, _| 0.0, |n, r, j| 0.1 * spread(n, r, j));
        let own = shared_noise(own.iter().map(|p| (8, p.as_slice())), window);
        // The same, plus ±10% a node's ranks share in each iteration.
        let both = pools(
            16,
            8,
            window,
            |n, j| 0.1 * spread(n, j, 7),
            |n, r, j| 0.1 * spread(n, r, j),
        );
        let both = shared_noise(both.iter().map(|p| (8, p.as_slice())), window);
        assert!(own < 0.05, "own noise alone: {own}");
        assert!(
            both > 0.05 && both > 2.0 * own,
            "shared {both} vs own {own}"
        );
        // Nodes of two ranks say nothing about it, and three nodes are the least.
        let small = pools(16, 2, window, |n, j| 0.1 * spread(n, j, 7), |_, _, _| 0.0);
        assert_eq!(
            shared_noise(small.iter().map(|p| (2, p.as_slice())), window),
            0.0
        );
        let few = pools(2, 8, window, |n, j| 0.1 * spread(n, j, 7), |_, _, _| 0.0);
        assert_eq!(
            shared_noise(few.iter().map(|p| (8, p.as_slice())), window),
            0.0
        );
    }
}
