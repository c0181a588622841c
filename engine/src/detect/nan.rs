//! NaN/Inf: a rank reported a non-finite loss or gradient norm. A NaN born in one rank
//! reaches every rank through the next reduction, so the culprit is the first to show
//! it, told apart three ways, best first:
//!
//! 1. warden_torch's input check: the rank that fed the first non-finite input into a
//!    reduction (smallest step, then operation index), before any peer saw it.
//! 2. Otherwise the ranks that showed it first: earliest step, then the loss (forward
//!    pass) before the gradient norm (backward). All of them, whatever their arrival
//!    times: the ranks of one replica report the same local loss moments apart.
//! 3. Where those are every rank that reported the step (the loss or gradient norm
//!    is a reduced value, the same everywhere), no rank: the finding names the job and
//!    the step, and says the rank is unknown.

use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::hang::list;
use super::{Verdict, Window};
use crate::state::{NonFinite, NonFiniteInput};

/// NaN detection settings.
#[derive(Debug, Clone)]
pub struct NanConfig {
    /// Name a culprit once every rank reported the step of the first non-finite metric
    /// and every node reported past it, or at the latest this long (or 1.5 iterations)
    /// after it arrived, seconds.
    pub grace_secs: f64,
}

impl Default for NanConfig {
    fn default() -> Self {
        NanConfig { grace_secs: 0.4 }
    }
}

/// How the culprit was told apart.
enum Named {
    /// The input check named the ranks that fed the first non-finite input.
    Input(Vec<(u32, NonFiniteInput)>),
    /// The ranks that showed it first, a proper subset (or a lone rank).
    First,
    /// Every rank that reported the step showed it at once: unknown.
    Nobody,
}

/// Check one job.
pub fn check(cfg: &NanConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let job = w.job;
    let reports: Vec<(u32, NonFinite)> = job
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
    let mut first: Vec<(u32, NonFinite)> = reports
        .iter()
        .filter(|(_, n)| (n.step, n.stage) == key)
        .copied()
        .collect();
    first.sort_unstable_by_key(|(r, _)| *r);
    let Some(t0) = first.iter().map(|(_, n)| n.at).min() else {
        return vec![];
    };
    let what = if key.1 == 0 { "loss" } else { "gradient norm" };

    // Non-finite inputs of the step that first showed a non-finite metric, or of the
    // step before (a rank that reports no gradient norm spreads a NaN through the
    // gradient reduction a step before its loss shows it). Earlier ones were blips the
    // job recovered from; later ones are the spread.
    let mut inputs: Vec<(u32, NonFiniteInput)> = job
        .ranks
        .iter()
        .filter_map(|(i, r)| r.nonfinite_input.map(|n| (i, n)))
        .filter(|(_, n)| n.step <= key.0 && n.step.saturating_add(1) >= key.0)
        .collect();
    inputs.sort_unstable_by_key(|(r, n)| (n.step, n.op, *r));
    let named = match inputs.first() {
        Some(&(_, lead)) => Named::Input(
            inputs
                .iter()
                .filter(|(_, n)| (n.step, n.op) == (lead.step, lead.op))
                .copied()
                .collect(),
        ),
        None => {
            // The ranks that could have reported it: those that reached the step with
            // a value of that kind.
            let reporting = job
                .ranks
                .values()
                .filter(|r| r.step.is_some_and(|s| s >= key.0))
                .filter(|r| r.loss.is_some() || (key.1 == 1 && r.grad_norm.is_some()))
                .count();
            if first.len() > 1 && first.len() >= reporting {
                Named::Nobody
            } else {
                Named::First
            }
        }
    };

    let mut evidence = Vec::new();
    let (culprits, confidence, onset, summary) = match &named {
        Named::Input(fed) => {
            let culprits: Vec<u32> = fed.iter().map(|(r, _)| *r).collect();
            let lead = fed[0].1;
            let onset = fed.iter().map(|(_, n)| n.at).fold(t0, Timestamp::min);
            let who = if let [one] = culprits.as_slice() {
                w.describe_rank(*one)
            } else {
                format!("ranks {}", list(&culprits))
            };
            for (r, n) in fed {
                evidence.push(Evidence {
                    at: n.at,
                    text: format!(
                        "{} fed a NaN or infinity into collective operation {} of step {} \
                         (counted from 0 since its previous step), before the reduction \
                         (warden_torch's input check)",
                        w.describe_rank(*r),
                        n.op,
                        n.step
                    ),
                });
            }
            let later: Vec<String> = inputs
                .iter()
                .filter(|(r, _)| !culprits.contains(r))
                .take(4)
                .map(|(r, n)| format!("rank {r} at operation {} of step {}", n.op, n.step))
                .collect();
            if !later.is_empty() {
                let others = inputs.len() - culprits.len();
                evidence.push(Evidence {
                    at: onset,
                    text: format!(
                        "{others} other {} fed one only later: {}{}",
                        if others == 1 { "rank" } else { "ranks" },
                        later.join(", "),
                        if others > later.len() { ", ..." } else { "" }
                    ),
                });
            }
            evidence.push(Evidence {
                at: t0,
                text: format!(
                    "{} ranks showed a non-finite {what} at step {}",
                    first.len(),
                    key.0
                ),
            });
            let confidence = if culprits.len() == 1 {
                0.95
            } else {
                (0.9 / culprits.len() as f64).max(0.3)
            };
            let summary = format!(
                "{who} fed the first non-finite input into a reduction (operation {} of step \
                 {}, warden_torch's input check); {} of the job's ranks reported a \
                 non-finite {what} at step {}",
                lead.op,
                lead.step,
                first.len(),
                key.0
            );
            (culprits, confidence, onset, summary)
        }
        Named::First => {
            let culprits: Vec<u32> = first.iter().map(|(r, _)| *r).collect();
            let later = reports.len() - culprits.len();
            let who = if let [one] = culprits.as_slice() {
                w.describe_rank(*one)
            } else {
                format!("ranks {}", list(&culprits))
            };
            let followed = match later {
                0 => "no other rank has so far".to_owned(),
                1 => "1 other rank followed".to_owned(),
                n => format!("{n} other ranks followed"),
            };
            let (verb, confidence) = if culprits.len() == 1 {
                ("reported", 0.95)
            } else {
                ("each reported", (0.6 / culprits.len() as f64).max(0.2))
            };
            evidence.push(Evidence {
                at: t0,
                text: format!(
                    "{who} {verb} a non-finite {what} at step {}, before any other rank",
                    key.0
                ),
            });
            let summary = format!(
                "{who} {verb} a non-finite {what} at step {} first; {followed}",
                key.0
            );
            (culprits, confidence, t0, summary)
        }
        Named::Nobody => {
            evidence.push(Evidence {
                at: t0,
                text: format!(
                    "all {} ranks that reported step {} showed a non-finite {what} there; \
                     warden_torch.init(check_inputs=True) would name the rank that fed it \
                     into a reduction",
                    first.len(),
                    key.0
                ),
            });
            let summary = format!(
                "job {} reported a non-finite {what} at step {}; the rank is unknown: every \
                 rank reported the same (reduced) value",
                job.name, key.0
            );
            (Vec::new(), 0.1, t0, summary)
        }
    };
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
        onset,
        confidence,
        severity: Severity::Critical,
        summary,
        evidence,
    })]
}
