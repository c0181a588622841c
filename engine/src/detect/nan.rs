//! NaN/Inf: a rank reported a non-finite loss or gradient norm. A NaN born in one rank
//! reaches every rank through the next allreduce, so the culprit is the first to show
//! it: earliest step, then the loss (forward pass) before the gradient norm (backward),
//! then skew-corrected time.

use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::hang::list;
use super::{Verdict, Window};

/// NaN detection settings.
#[derive(Debug, Clone)]
pub struct NanConfig {
    /// Name a culprit once every rank reported the step of the first non-finite metric
    /// and every node reported past it, or at the latest this long (or 1.5 iterations)
    /// after it arrived, seconds.
    pub grace_secs: f64,
    /// Reports of the same step and stage closer than this are simultaneous, seconds.
    pub tie_secs: f64,
}

impl Default for NanConfig {
    fn default() -> Self {
        NanConfig {
            grace_secs: 0.4,
            tie_secs: 0.05,
        }
    }
}

/// Check one job.
pub fn check(cfg: &NanConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let job = w.job;
    let reports: Vec<(u32, crate::state::NonFinite)> = job
        .ranks
        .iter()
        .filter_map(|(i, r)| r.nonfinite.map(|n| (i, n)))
        .collect();
    let Some(first_received) = reports.iter().map(|(_, n)| n.received_at).min() else {
        return vec![];
    };
    let Some(key) = reports.iter().map(|(_, n)| (n.step, n.stage)).min() else {
        return vec![];
    };
    // Decide once every reporting rank has reported that step (a rank that finishes the
    // step later may be the one whose loss went first), or after the grace period.
    let complete = job
        .ranks
        .values()
        .filter(|r| r.alive())
        .all(|r| r.step.is_none_or(|s| s >= key.0));
    let first_seen = reports.iter().map(|(_, n)| n.at).min().unwrap_or(now);
    let patience = cfg
        .grace_secs
        .max(1.5 * job.iteration_secs().unwrap_or(0.0));
    if now.secs_since(first_received) < patience && !(complete && w.all_reported_since(first_seen))
    {
        return vec![Verdict::NeedMoreData];
    }
    let first: Vec<&(u32, crate::state::NonFinite)> = reports
        .iter()
        .filter(|(_, n)| (n.step, n.stage) == key)
        .collect();
    let Some(t0) = first.iter().map(|(_, n)| n.at).min() else {
        return vec![];
    };
    let mut culprits: Vec<u32> = first
        .iter()
        .filter(|(_, n)| n.at.secs_since(t0) <= cfg.tie_secs)
        .map(|(r, _)| *r)
        .collect();
    culprits.sort_unstable();
    let what = if key.1 == 0 { "loss" } else { "gradient norm" };
    let confidence = match (culprits.len(), first.len()) {
        (1, 1) => 0.95,
        (1, _) => 0.7,
        (n, _) => (0.6 / n as f64).max(0.2),
    };
    let later = reports.len() - culprits.len();
    let who = if culprits.len() == 1 {
        w.describe_rank(culprits[0])
    } else {
        format!("ranks {}", list(&culprits))
    };
    let followed = match later {
        0 => "no other rank has so far".to_owned(),
        1 => "1 other rank followed".to_owned(),
        n => format!("{n} other ranks followed"),
    };
    let summary = format!(
        "{who} reported a non-finite {what} at step {} first; {followed}",
        key.0
    );
    let mut evidence = vec![Evidence {
        at: t0,
        text: format!(
            "{} {what} was not finite at step {}",
            w.describe_rank(culprits[0]),
            key.0
        ),
    }];
    if first.len() > culprits.len() {
        evidence.push(Evidence {
            at: t0,
            text: format!(
                "{} ranks showed a non-finite {what} at the same step",
                first.len()
            ),
        });
    }
    let same_step_grad = reports
        .iter()
        .filter(|(_, n)| n.step == key.0 && n.stage == 1)
        .count();
    if key.1 == 0 && same_step_grad > 0 {
        evidence.push(Evidence {
            at: t0,
            text: format!(
                "{same_step_grad} ranks saw only a non-finite gradient norm at step {} (spread by the allreduce)",
                key.0
            ),
        });
    }
    let (nodes, gpus) = w.places(&culprits);
    vec![Verdict::Finding(Finding {
        kind: IncidentKind::Nan,
        job: Some(job.name.clone()),
        ranks: culprits,
        nodes,
        gpus,
        onset: t0,
        confidence,
        severity: Severity::Critical,
        summary,
        evidence,
    })]
}
