//! Hang from the ranks' own logs: for a job whose collectives nothing captures (no
//! warden_torch, no NCCL plugin), the first word of a hang is the process group's
//! timeout. Every rank waiting on a stuck peer logs that its collective timed out
//! (gloo's `Timed out waiting 20000ms for recv operation to complete`, the NCCL
//! watchdog's `Watchdog caught collective operation timeout`); the stuck rank logs
//! nothing. So the culprit is the rank known to the job that did not time out, once the
//! others have had a few seconds to say so, where that singles out at most a quarter of
//! the ranks heard from. A rank whose partner timed out first and went away logs
//! "connection closed by peer" instead: it was waiting too, and is no culprit. Where
//! more ranks are silent but all on one node (a pipeline stage's ranks, one of which
//! waits on the other without a timeout of its own), the node is named and no rank.
//! A silent rank its launcher terminated because a rank on its node failed may have
//! been cut short before its last words; where the silent ranks single out nobody with
//! it, they are read without it.
//! Confidence is lower than a captured hang's: a rank that never logged cannot be told
//! from a rank that does not exist.
//!
//! The lines come from different nodes' agents, each tailing its own logs, so on a busy
//! machine one rank's line can arrive seconds before the others'. A picture that singles
//! out a rank or a node is named once no new line has come for `settle_secs`; one that
//! singles out nobody waits `patience_secs` from the first line for the rest, since a
//! late line is what turns it into one that does. A line that arrives after the verdict
//! still revises it: the finding is recomputed every pass.
//!
//! A job whose silent rank died instead is a crash, and left to the crash detector.

use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::hang::list;
use super::{Verdict, Window};

/// Log-timeout hang settings.
#[derive(Debug, Clone)]
pub struct TimeoutConfig {
    /// Name the culprit once no timeout line has arrived for this long (the others'
    /// lines come within a step of each other), seconds.
    pub settle_secs: f64,
    /// Where the lines so far single out nobody, wait this long after the first for the
    /// others' before saying so, seconds.
    pub patience_secs: f64,
    /// The ranks left over may be at most this fraction of the ranks heard from (at
    /// least one): otherwise nobody is singled out.
    pub max_culprit_fraction: f64,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            settle_secs: 3.0,
            patience_secs: 12.0,
            max_culprit_fraction: 0.25,
        }
    }
}

/// Check one job.
pub fn check(cfg: &TimeoutConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let job = w.job;
    if !job.comms.is_empty() {
        // Its collectives are captured: the hang detector sees the wait itself.
        return vec![];
    }
    let timed: Vec<(u32, crate::state::TimedOut)> = job
        .ranks
        .iter()
        .filter_map(|(i, r)| r.timed_out.map(|t| (i, t)))
        .collect();
    let Some(first_received) = timed.iter().map(|(_, t)| t.received_at).min() else {
        return vec![];
    };
    let last_received = timed
        .iter()
        .map(|(_, t)| t.received_at)
        .max()
        .unwrap_or(first_received);
    let waited_for_lines = now.secs_since(first_received);
    let patient = waited_for_lines >= cfg.patience_secs;
    if waited_for_lines < cfg.settle_secs
        || (now.secs_since(last_received) < cfg.settle_secs && !patient)
    {
        return vec![Verdict::NeedMoreData];
    }
    let heard: Vec<u32> = job
        .ranks
        .iter()
        .filter(|(_, r)| r.known)
        .map(|(i, _)| i)
        .collect();
    // A rank that logged that a peer went away was waiting too: its partner gave up
    // first and closed the connection.
    let silent: Vec<u32> = heard
        .iter()
        .copied()
        .filter(|&i| {
            let r = &job.ranks[i];
            r.timed_out.is_none() && !r.peer_symptom
        })
        .collect();
    let died = silent.iter().any(|&i| {
        job.ranks[i]
            .exit
            .as_ref()
            .is_some_and(|e| e.abnormal() && !e.torn_down())
    });
    if died {
        return vec![];
    }
    let onset = timed
        .iter()
        .map(|(_, t)| {
            t.waited_secs
                .map_or(t.at, |s| Timestamp(t.at.0 - (s * 1e9) as i64))
        })
        .min()
        .unwrap_or(now);
    let waited = timed
        .iter()
        .filter_map(|(_, t)| t.waited_secs)
        .fold(0.0_f64, f64::max);
    let waiters: Vec<u32> = timed.iter().map(|(r, _)| *r).collect();
    let bound = ((heard.len() as f64 * cfg.max_culprit_fraction).floor() as usize).max(1);
    let on_one_node = |ranks: &[u32]| {
        let mut nodes: Vec<u32> = ranks.iter().map(|&i| job.ranks[i].node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len() == 1 && nodes[0] != crate::state::NO_NODE
    };
    let picks = |ranks: &[u32]| !ranks.is_empty() && (ranks.len() <= bound || on_one_node(ranks));
    // A silent rank its launcher terminated (SIGTERM) on a node where a rank timed out
    // may only have had no time to log: torchrun tears a node's other workers down
    // within a moment of the first one's failure, and under load that can come before
    // the rank's own last words. Its silence is no evidence; where the silent ranks
    // single out nobody with it, they are read without it.
    let cut_short: Vec<u32> = silent
        .iter()
        .copied()
        .filter(|&i| {
            let r = &job.ranks[i];
            r.exit.as_ref().is_some_and(|e| e.signal == Some(15))
                && waiters.iter().any(|&w| job.ranks[w].node == r.node)
        })
        .collect();
    let mut silent = silent;
    if !picks(&silent) && !cut_short.is_empty() {
        let rest: Vec<u32> = silent
            .iter()
            .copied()
            .filter(|i| !cut_short.contains(i))
            .collect();
        if picks(&rest) {
            silent = rest;
        }
    }
    let singled = !silent.is_empty() && silent.len() <= bound;
    let after = if waited > 0.0 {
        format!(" after {waited:.0} s")
    } else {
        String::new()
    };
    let mut evidence: Vec<Evidence> = timed
        .iter()
        .take(8)
        .map(|(r, t)| Evidence {
            at: t.at,
            text: format!(
                "{} logged that its collective timed out{}",
                w.describe_rank(*r),
                t.waited_secs
                    .map(|s| format!(" after {s:.0} s"))
                    .unwrap_or_default()
            ),
        })
        .collect();
    let left_out: Vec<u32> = cut_short
        .iter()
        .copied()
        .filter(|i| !silent.contains(i))
        .collect();
    if !left_out.is_empty() {
        evidence.push(Evidence {
            at: now,
            text: format!(
                "{}: terminated by the launcher (SIGTERM) after a rank on the same node \
                 failed, before logging why; not counted as silent",
                ranks(&left_out)
            ),
        });
    }
    // The silent ranks all on one node: the node is named, not a rank.
    let one_node = on_one_node(&silent);
    if !singled && !one_node && !patient {
        // Nobody singled out yet: the lines that would may still be on their way.
        return vec![Verdict::NeedMoreData];
    }
    let (culprits, confidence, summary) = if singled {
        let who = match silent[..] {
            [one] => w.describe_rank(one),
            _ => ranks(&silent),
        };
        evidence.push(Evidence {
            at: now,
            text: format!(
                "{who} logged no timeout: the others were waiting for it (from the logs; no \
                 collectives captured)"
            ),
        });
        (
            silent.clone(),
            if silent.len() == 1 { 0.75 } else { 0.5 },
            format!(
                "{who} stopped making progress: {} timed out waiting for it in their \
                 collectives{after} (from the logs)",
                ranks(&waiters)
            ),
        )
    } else if one_node {
        let node = w.places(&silent[..1]).0.join(", ");
        evidence.push(Evidence {
            at: now,
            text: format!(
                "{} logged no timeout, all on {node}: the stuck rank is likely among them",
                ranks(&silent)
            ),
        });
        (
            vec![],
            0.5,
            format!(
                "{} timed out waiting in their collectives{after}; {} on {node} logged no \
                 timeout, and one of them is likely stuck (from the logs)",
                ranks(&waiters),
                ranks(&silent)
            ),
        )
    } else {
        (
            vec![],
            0.3,
            format!(
                "{} timed out waiting in their collectives{after}; their logs do not \
                 single out whom they waited for ({} of {} ranks heard from logged no timeout)",
                ranks(&waiters),
                silent.len(),
                heard.len()
            ),
        )
    };
    // The node alone where only it is known.
    let named = if culprits.is_empty() && one_node {
        &silent[..1]
    } else {
        &culprits[..]
    };
    let (nodes, gpus) = w.places(named);
    let gpus = if culprits.is_empty() { vec![] } else { gpus };
    vec![Verdict::Finding(Finding {
        kind: IncidentKind::Hang,
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

/// "rank 3" or "ranks 0, 1, 2".
fn ranks(v: &[u32]) -> String {
    match v {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", list(v)),
    }
}
