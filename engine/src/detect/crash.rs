//! Crash: a rank's process exited abnormally. When one rank dies its peers fail within
//! a fraction of a second ("connection closed by peer"), or are terminated by their
//! launcher (SIGTERM), so the culprit is the first exit that does neither, by
//! skew-corrected time, once a short grace period has let the other exits arrive. While
//! every exit so far blames a peer, the grace period runs out in full: the peer's own
//! exit is likely still on its way. Exits that arrive after remediation asked for the
//! job's restart are that restart, not a crash.
//!
//! A rank whose log said its collective timed out was waiting for someone else: when
//! every exit is such a rank's, or one that blames a peer or was terminated beside them
//! (the teardown that follows), the job hung and the ranks gave up. Their crash then
//! waits a few seconds, so that the hang they gave up on is named first and takes their
//! exits as evidence (the incident book folds a crash of a hang's victims into the
//! hang). An exit read from the launcher's failure report (no capture on the job) is
//! believed a little less than an observed one.

use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::hang::list;
use super::{Verdict, Window};

/// Crash detection settings.
#[derive(Debug, Clone)]
pub struct CrashConfig {
    /// Name a culprit once every node reported past the first exit, or at the latest
    /// this long after the first abnormal exit arrived, seconds.
    pub grace_secs: f64,
    /// Exits closer than this are simultaneous (clock uncertainty), seconds.
    pub tie_secs: f64,
    /// When every exit is a hang's victim's (its rank logged a collective timeout) or
    /// torn down beside one, wait this long after the first arrived, seconds: the hang
    /// they gave up on is named first (from its collectives, long before), and their
    /// exits become evidence on it. Shorter than the incident book's quiet time for a
    /// hang, which resolves once the waiters are gone.
    pub victims_secs: f64,
    /// The same for a job whose collectives nothing captures: its hang comes from the
    /// logs, within the log-timeout detector's `patience_secs` of the first timeout.
    pub log_victims_secs: f64,
}

impl Default for CrashConfig {
    fn default() -> Self {
        CrashConfig {
            grace_secs: 1.0,
            tie_secs: 0.005,
            victims_secs: 5.0,
            log_victims_secs: 15.0,
        }
    }
}

/// Check one job.
pub fn check(cfg: &CrashConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let job = w.job;
    let exits: Vec<(u32, &crate::state::ExitRecord)> = job
        .ranks
        .iter()
        .filter_map(|(i, r)| {
            r.exit
                .as_ref()
                .filter(|e| e.abnormal())
                // The run Warden asked to restart being torn down.
                .filter(|e| job.restart_requested_at.is_none_or(|t| e.received_at < t))
                .map(|e| (i, e))
        })
        .collect();
    let Some(first_received) = exits.iter().map(|(_, e)| e.received_at).min() else {
        return vec![];
    };
    let victim = |r: u32| job.ranks[r].timed_out.is_some();
    if exits.iter().any(|(r, _)| victim(*r))
        && exits.iter().all(|(r, e)| victim(*r) || e.torn_down())
        && now.secs_since(first_received)
            < if job.comms.is_empty() {
                cfg.log_victims_secs
            } else {
                cfg.victims_secs
            }
    {
        // Ranks gave up waiting, and the rest went down with them: a hang, to be
        // named before their exits are.
        return vec![Verdict::NeedMoreData];
    }
    let first_seen = exits.iter().map(|(_, e)| e.at).min().unwrap_or(now);
    let causes: Vec<&(u32, &crate::state::ExitRecord)> = exits
        .iter()
        .filter(|(r, e)| !e.torn_down() && !victim(*r))
        .collect();
    let settled = now.secs_since(first_received) >= cfg.grace_secs;
    if !settled && (causes.is_empty() || !w.all_reported_since(first_seen)) {
        return vec![Verdict::NeedMoreData];
    }
    let pool: Vec<&(u32, &crate::state::ExitRecord)> = if causes.is_empty() {
        exits.iter().collect()
    } else {
        causes
    };
    let Some(first_at) = pool.iter().map(|(_, e)| e.at).min() else {
        return vec![];
    };
    let mut culprits: Vec<u32> = pool
        .iter()
        .filter(|(_, e)| e.at.secs_since(first_at) <= cfg.tie_secs)
        .map(|(r, _)| *r)
        .collect();
    culprits.sort_unstable();
    let followers = exits.len() - culprits.len();
    let symptom_free = exits.iter().filter(|(_, e)| !e.torn_down()).count();
    let confidence = match (culprits.len(), symptom_free) {
        (1, 1) => 0.97,
        (1, _) => 0.85,
        (n, _) => (0.8 / n as f64).max(0.3),
    };
    let lead = &job.ranks[culprits[0]];
    let from_log = lead.exit.as_ref().is_some_and(|e| e.from_log);
    let confidence = if from_log {
        confidence * 0.85
    } else {
        confidence
    };
    let how = lead.exit.as_ref().map(|e| e.describe()).unwrap_or_default();
    let last_exit = exits.iter().map(|(_, e)| e.at).max().unwrap_or(first_at);
    let who = if culprits.len() == 1 {
        w.describe_rank(culprits[0])
    } else {
        format!("ranks {}", list(&culprits))
    };
    let summary = if followers > 0 {
        format!(
            "{who} exited first ({how}); {followers} peers failed within {:.2} s after it",
            last_exit.secs_since(first_at)
        )
    } else {
        format!("{who} exited ({how})")
    };
    let mut evidence = vec![Evidence {
        at: first_at,
        text: format!(
            "{} exited with {how}{}",
            w.describe_rank(culprits[0]),
            if from_log {
                " (from the launcher's failure report)"
            } else {
                ""
            }
        ),
    }];
    for line in lead.last_errors.iter().rev().take(3) {
        evidence.push(Evidence {
            at: first_at,
            text: format!("rank {} logged: {line}", culprits[0]),
        });
    }
    let symptomatic = exits.iter().filter(|(_, e)| e.peer_symptom).count();
    if symptomatic > 0 {
        evidence.push(Evidence {
            at: last_exit,
            text: format!("{symptomatic} ranks exited after logging that a peer went away"),
        });
    }
    let (nodes, gpus) = w.places(&culprits);
    vec![Verdict::Finding(Finding {
        kind: IncidentKind::Crash,
        job: Some(job.name.clone()),
        ranks: culprits,
        nodes,
        gpus,
        onset: first_at,
        confidence,
        severity: Severity::Critical,
        summary,
        evidence,
    })]
}
