//! Detectors: pure functions from job state and the current time to findings.
//!
//! Each detector looks at one job (or, for hardware faults, the whole cluster), never
//! at a socket, a file or the wall clock, and returns [`Verdict`]s. A detector repeats
//! its finding on every pass while the condition holds; the incident book groups and
//! deduplicates, and resolves an incident once its finding stops coming.
//!
//! A job its scheduler said ended (`JobState::ended_at`) gets no hang, straggler or
//! slow-link verdicts any more, and only crash and NaN findings whose onset came before
//! the end: what happens while a job is torn down is not a fault of the job.

pub mod crash;
pub mod gpu;
pub mod hang;
pub mod nan;
pub mod slow_link;
pub mod straggler;
pub mod timeout;

use warden_model::{Finding, Timestamp};

use crate::state::{Cluster, JobState};

/// A detector's answer for one job; a detector that finds nothing returns none.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Something may be wrong but the evidence is not complete yet.
    NeedMoreData,
    /// Something is wrong.
    Finding(Finding),
}

/// What a detector sees of a job: its state plus the cluster's node names.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// The job.
    pub job: &'a JobState,
    /// The cluster (node names, agents, hardware trouble).
    pub cluster: &'a Cluster,
}

impl Window<'_> {
    /// Node name of a rank.
    pub fn node_of(&self, rank: u32) -> Option<&str> {
        let r = self.job.ranks.get(rank)?;
        (r.node != crate::state::NO_NODE).then(|| self.cluster.node_name(r.node))
    }

    /// Node names and GPUs of some ranks, for a finding's culprit lists.
    pub fn places(&self, ranks: &[u32]) -> (Vec<String>, Vec<warden_model::GpuRef>) {
        let mut nodes = Vec::new();
        let mut gpus = Vec::new();
        for &r in ranks {
            if let Some(n) = self.node_of(r) {
                nodes.push(n.to_owned());
                if let Some(g) = self.job.ranks[r].gpu {
                    gpus.push(warden_model::GpuRef {
                        node: n.to_owned(),
                        index: g,
                    });
                }
            }
        }
        (nodes, gpus)
    }

    /// Whether every node of the job has reported as of `t` or later, so no record
    /// describing an earlier moment can still be on its way.
    pub fn all_reported_since(&self, t: Timestamp) -> bool {
        self.job
            .node_indices()
            .into_iter()
            .all(|n| self.cluster.cut_of(n) >= t)
    }

    /// "rank 77 (node-09 gpu 5)".
    pub fn describe_rank(&self, rank: u32) -> String {
        match (
            self.node_of(rank),
            self.job.ranks.get(rank).and_then(|r| r.gpu),
        ) {
            (Some(n), Some(g)) => format!("rank {rank} ({n} gpu {g})"),
            (Some(n), None) => format!("rank {rank} ({n})"),
            _ => format!("rank {rank}"),
        }
    }
}

/// Detector settings; the defaults are what the scenario suite is scored with.
#[derive(Debug, Clone, Default)]
pub struct DetectConfig {
    /// Hang detection.
    pub hang: hang::HangConfig,
    /// Crash detection.
    pub crash: crash::CrashConfig,
    /// NaN detection.
    pub nan: nan::NanConfig,
    /// GPU fault detection.
    pub gpu: gpu::GpuConfig,
    /// Straggler detection.
    pub straggler: straggler::StragglerConfig,
    /// Slow-link detection.
    pub slow_link: slow_link::SlowLinkConfig,
    /// Hang from the logs' collective timeouts, for jobs without captured collectives.
    pub timeout: timeout::TimeoutConfig,
}

/// All detectors with their settings.
#[derive(Debug)]
pub struct Detectors {
    config: DetectConfig,
    /// Per job: when the statistical detectors are next due, and their findings.
    heavy: rustc_hash::FxHashMap<String, (Timestamp, Vec<Finding>)>,
}

/// How often the statistical detectors (straggler, slow link) run per job, seconds: at
/// most once a second, and about twice per iteration for fast jobs (they look at
/// per-iteration samples, so more often buys nothing).
fn heavy_period_secs(job: &JobState) -> f64 {
    job.iteration_secs()
        .map_or(1.0, |p| (p / 2.0).clamp(0.25, 1.0))
}

/// Output of one pass over everything.
#[derive(Debug, Default)]
pub struct Verdicts {
    /// Findings, in no particular order.
    pub findings: Vec<Finding>,
}

impl Detectors {
    /// Detectors with these settings.
    pub fn new(config: DetectConfig) -> Self {
        Detectors {
            config,
            heavy: Default::default(),
        }
    }

    /// Run every detector at `now`.
    pub fn run(&mut self, cluster: &Cluster, now: Timestamp) -> Verdicts {
        let c = &self.config;
        let mut out = Verdicts::default();
        let mut push = |v: Verdict| {
            if let Verdict::Finding(f) = v {
                out.findings.push(f.normalize());
            }
        };
        self.heavy.retain(|job, _| cluster.jobs.contains_key(job));
        let mut names: Vec<&String> = cluster.jobs.keys().collect();
        names.sort();
        for name in names {
            let w = Window {
                job: &cluster.jobs[name],
                cluster,
            };
            if let Some(end) = w.job.ended_at().filter(|&t| t <= now) {
                // Its scheduler said it ended: silence and teardown say nothing about
                // its health. A crash or NaN from before the end is still a finding.
                self.heavy.remove(name.as_str());
                for v in crash::check(&c.crash, w, now)
                    .into_iter()
                    .chain(nan::check(&c.nan, w, now))
                {
                    if matches!(&v, Verdict::Finding(f) if f.onset < end) {
                        push(v);
                    }
                }
                continue;
            }
            // Before the crash detector: the exits that follow a timeout are the
            // hang's victims, and fold into it only once it is open.
            for v in timeout::check(&c.timeout, w, now) {
                push(v);
            }
            for v in crash::check(&c.crash, w, now) {
                push(v);
            }
            for v in nan::check(&c.nan, w, now) {
                push(v);
            }
            for v in hang::check(&c.hang, w, now) {
                push(v);
            }
            let due = self
                .heavy
                .get(name.as_str())
                .is_none_or(|(next, _)| now >= *next);
            if due {
                let mut found = Vec::new();
                for v in straggler::check(&c.straggler, w, now)
                    .into_iter()
                    .chain(slow_link::check(&c.slow_link, w, now))
                {
                    if let Verdict::Finding(f) = v {
                        found.push(f);
                    }
                }
                let next = now.plus_secs(heavy_period_secs(w.job));
                self.heavy.insert(name.clone(), (next, found));
            }
            if let Some((_, found)) = self.heavy.get(name.as_str()) {
                for f in found {
                    push(Verdict::Finding(f.clone()));
                }
            }
        }
        for v in gpu::check(&c.gpu, cluster, now) {
            push(v);
        }
        out
    }
}

#[cfg(test)]
mod tests;
