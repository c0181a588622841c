//! Verification before return: a node the node-health ledger quarantined runs a health
//! check through the actuator (a Slurm job pinned to the node, a Kubernetes Job pinned
//! to it, the script's `verify`),
//! and only a pass gives it back. Each remediation pass starts the checks of the nodes
//! quarantined for at least `after` (at most `max_parallel` at once; the ledger says
//! `verifying`) and collects the ones that ended: a pass returns the node (the ledger
//! clears its evidence, and an isolation of Warden's is given back); a failure marks it
//! `bad`, isolated with the ledger's state in the reason, for a person to look at
//! (`warden_node_health{state="bad"}`, the `WardenNodeFailedHealthCheck` alert). Every
//! check is a `verify` action in the audit log. A quarantined node the policy did not
//! isolate (the ledger's across-jobs rules quarantine under policy) is isolated first,
//! under the breaker, so that its check runs on a node out of service.
//!
//! Each ledger change is also written where the scheduler shows it: under Kubernetes the
//! node condition `WardenHealthy` and an Event on the node
//! (`remedy::kubernetes::health`); under Slurm the drain reasons of the check say
//! `bad` and `quarantined`.
//!
//! A check that could not run (the scheduler refused, the node is held by someone
//! else, a controller took the lead while one ran) is no verdict: the node stays
//! `verifying` and its check starts again `after` later.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::task::JoinHandle;
use warden_engine::ledger::HealthState;
use warden_model::Timestamp;

use super::run::{POLICY_ACTOR, PassReport, Remediator, RemedyError};
use super::{ActuatorError, CheckOutcome, Isolation};
use crate::store::{ActionKind, NodeRecord};

/// Who the ledger's checks are done by, in the audit log.
pub const VERIFY_ACTOR: &str = "verification";

/// Most words of a check command, and bytes of one word.
const MAX_COMMAND_WORDS: usize = 64;
const MAX_WORD_BYTES: usize = 1024;

/// The `remediation.verify` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifyConfig {
    /// Run health checks of quarantined nodes (off: a quarantined node waits for a
    /// person's undrain).
    pub enabled: bool,
    /// How long a node stays quarantined before its check starts (its jobs move off
    /// first), e.g. `2m`.
    #[serde(with = "super::duration_text")]
    pub after: Duration,
    /// The longest a check may take; one that takes longer is no verdict and runs
    /// again.
    #[serde(with = "super::duration_text")]
    pub timeout: Duration,
    /// Checks running at once.
    pub max_parallel: usize,
    /// What the Slurm check job runs on the node, e.g. `[dcgmi, diag, -r, "2"]`; exit
    /// status 0 is a pass. The script actuator runs its own program with
    /// `WARDEN_ACTION=verify` instead.
    pub command: Vec<String>,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            enabled: false,
            after: Duration::from_secs(120),
            timeout: Duration::from_secs(30 * 60),
            max_parallel: 4,
            command: Vec::new(),
        }
    }
}

impl VerifyConfig {
    /// Problems with the section for this actuator, as `(field, message)`.
    pub fn problems(&self, actuator: super::run::ActuatorKind) -> Vec<(String, String)> {
        use super::run::ActuatorKind;
        let mut out = Vec::new();
        let field = |f: &str| format!("remediation.verify.{f}");
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(24 * 3600) {
            out.push((field("timeout"), "above zero and at most 24h".into()));
        }
        if self.after > Duration::from_secs(7 * 24 * 3600) {
            out.push((field("after"), "at most 7 days".into()));
        }
        if self.max_parallel == 0 || self.max_parallel > 1000 {
            out.push((field("max_parallel"), "from 1 to 1000".into()));
        }
        if self.command.len() > MAX_COMMAND_WORDS {
            out.push((
                field("command"),
                format!("at most {MAX_COMMAND_WORDS} words"),
            ));
        }
        for (i, w) in self.command.iter().enumerate() {
            if w.is_empty() || w.len() > MAX_WORD_BYTES || w.contains('\0') {
                out.push((
                    format!("remediation.verify.command[{i}]"),
                    format!("a word of 1 to {MAX_WORD_BYTES} bytes without NUL"),
                ));
            }
        }
        if !self.enabled {
            return out;
        }
        match actuator {
            ActuatorKind::Slurm if self.command.is_empty() => out.push((
                field("command"),
                "the Slurm check job needs a command, e.g. [dcgmi, diag, -r, \"2\"]".into(),
            )),
            ActuatorKind::Kubernetes if self.command.is_empty() => out.push((
                field("command"),
                "the Kubernetes check Job needs a command, e.g. [dcgmi, diag, -r, \"2\"]".into(),
            )),
            ActuatorKind::None => out.push((
                field("enabled"),
                "health checks run through an actuator: set remediation.actuator to slurm \
                 or script"
                    .into(),
            )),
            _ => {}
        }
        out
    }
}

/// A health check answered in-process, for a simulated cluster (`warden demo`): the
/// simulator knows whether the node's hardware is sound.
#[derive(Clone)]
pub struct SimulatedCheck(pub Arc<dyn Fn(&str) -> CheckOutcome + Send + Sync>);

impl std::fmt::Debug for SimulatedCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimulatedCheck")
    }
}

/// The checks under way and the ones to try again, by node.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    running: BTreeMap<String, Running>,
    /// A check that gave no verdict runs again from this time on.
    retry_at: BTreeMap<String, Timestamp>,
}

#[derive(Debug)]
struct Running {
    started: Timestamp,
    how: String,
    task: JoinHandle<Result<CheckOutcome, ActuatorError>>,
}

/// A check that ended.
pub(crate) struct Ended {
    pub node: String,
    pub how: String,
    pub secs: f64,
    pub result: Result<CheckOutcome, String>,
}

impl Checks {
    /// The checks that ended since the last call.
    pub(crate) async fn take_ended(&mut self, now: Timestamp) -> Vec<Ended> {
        let done: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        let mut out = Vec::new();
        for node in done {
            let Some(r) = self.running.remove(&node) else {
                continue;
            };
            let result = match r.task.await {
                Ok(Ok(o)) => Ok(o),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("the check's task ended: {e}")),
            };
            out.push(Ended {
                node,
                how: r.how,
                secs: now.secs_since(r.started).max(0.0),
                result,
            });
        }
        out
    }

    /// Whether `node`'s check runs now.
    pub(crate) fn running(&self, node: &str) -> bool {
        self.running.contains_key(node)
    }

    /// How many run now.
    pub(crate) fn count(&self) -> usize {
        self.running.len()
    }

    /// Whether a check of `node` may start at `now` (none runs, no retry pending).
    pub(crate) fn may_start(&self, node: &str, now: Timestamp) -> bool {
        !self.running(node) && self.retry_at.get(node).is_none_or(|t| now >= *t)
    }

    /// A check with no verdict: again at `at`.
    pub(crate) fn retry(&mut self, node: &str, at: Timestamp) {
        self.retry_at.insert(node.to_owned(), at);
    }

    /// Start `task` as `node`'s check.
    pub(crate) fn start(
        &mut self,
        node: &str,
        how: &str,
        now: Timestamp,
        task: JoinHandle<Result<CheckOutcome, ActuatorError>>,
    ) {
        self.retry_at.remove(node);
        self.running.insert(
            node.to_owned(),
            Running {
                started: now,
                how: how.to_owned(),
                task,
            },
        );
    }

    /// Forget the nodes the ledger no longer holds for a check (a person returned
    /// one): their checks stop.
    pub(crate) fn keep_only(&mut self, wanted: impl Fn(&str) -> bool) {
        self.running.retain(|n, r| {
            let keep = wanted(n);
            if !keep {
                r.task.abort();
            }
            keep
        });
        self.retry_at.retain(|n, _| wanted(n));
    }
}

impl Remediator {
    /// The verification step of a pass (module docs): collect the checks that ended,
    /// start the ones due. Nothing in a dry run.
    pub(super) async fn verify_nodes(
        &self,
        out: &mut PassReport,
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        let cfg = &self.config.verify;
        if !cfg.enabled || self.config.dry_run {
            return Ok(());
        }
        let again = now.plus_secs(cfg.after.as_secs_f64());
        let mut checks = self.checks.lock().await;
        for end in checks.take_ended(now).await {
            match end.result {
                Ok(ref outcome) => self.conclude(&end, outcome.clone(), out, now).await?,
                Err(ref why) => {
                    tracing::warn!(node = %end.node, %why, "health check gave no verdict; run again later");
                    checks.retry(&end.node, again);
                    let result = format!(
                        "no verdict: {why}; run again in {}",
                        humantime::format_duration(cfg.after)
                    );
                    self.record_check(&end, &result, now).await?;
                }
            }
        }
        // Each with the reason and the latest incident of its last change.
        type Wanted = (String, HealthState, Timestamp, String, Option<String>);
        let wanted: Vec<Wanted> = {
            let e = self.engine.lock();
            e.ledger()
                .nodes()
                .filter(|n| wants_check(n.state))
                .map(|n| {
                    let last = n.history.back();
                    let why = last.map(|t| t.reason.clone()).unwrap_or_default();
                    let incident = last.and_then(|t| t.incidents.last().cloned());
                    (n.node.clone(), n.state, n.since, why, incident)
                })
                .collect()
        };
        checks.keep_only(|n| wanted.iter().any(|(w, ..)| w == n));
        let held: std::collections::BTreeSet<String> = if wanted.is_empty() {
            Default::default()
        } else {
            self.store
                .nodes()
                .await?
                .into_iter()
                .map(|n| n.name)
                .collect()
        };
        for (node, state, since, why, incident) in wanted {
            if checks.count() >= cfg.max_parallel {
                break;
            }
            if !checks.may_start(&node, now)
                || (state == HealthState::Quarantined
                    && now.secs_since(since) < cfg.after.as_secs_f64())
            {
                continue;
            }
            // A quarantine the policy did not isolate is isolated first: the check runs
            // on a node out of service.
            if state == HealthState::Quarantined
                && !held.contains(&node)
                && !self
                    .isolate_for_ledger(&node, &why, incident.as_deref(), out, now)
                    .await?
            {
                checks.retry(&node, again);
                continue;
            }
            let how = self.check_name();
            if state == HealthState::Quarantined
                && let Err(e) = self.engine.lock().ledger_mut().verifying(&node, &how, now)
            {
                tracing::warn!(%node, error = %e, "health check not started");
                continue;
            }
            let actuator = self.actuator.clone();
            let cfg = cfg.clone();
            let simulated = self.simulated_check.clone();
            let target = node.clone();
            let task = tokio::spawn(async move {
                match simulated {
                    Some(check) => Ok((check.0)(&target)),
                    None => actuator.verify(&target, &cfg).await,
                }
            });
            tracing::info!(%node, %how, "health check started");
            checks.start(&node, &how, now, task);
        }
        Ok(())
    }

    /// Write each node's latest ledger change where the scheduler shows it (module
    /// docs); one that could not be written is tried again next pass. Not in a dry run.
    pub(super) async fn publish_health(&self) {
        // Only Kubernetes has a place for it (Slurm's is the drain reason).
        if self.config.dry_run || !self.actuator.is_kubernetes() {
            return;
        }
        let latest: Vec<(String, HealthState, warden_engine::ledger::Transition)> = {
            let e = self.engine.lock();
            e.ledger()
                .nodes()
                .filter_map(|n| Some((n.node.clone(), n.state, n.history.back()?.clone())))
                .collect()
        };
        let mut published = self.published.lock().await;
        for (node, state, t) in latest {
            if published.get(&node) == Some(&t.at) {
                continue;
            }
            let message = format!("{} -> {}: {}", t.from.as_str(), t.to.as_str(), t.reason);
            match self
                .actuator
                .node_health(&node, state.as_str(), state.holds_out(), &message, t.at)
                .await
            {
                Ok(true) => {
                    published.insert(node, t.at);
                }
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "cannot write the node's health; tried again next pass");
                }
            }
        }
    }

    /// What runs a check, in words.
    fn check_name(&self) -> String {
        if self.simulated_check.is_some() {
            return "the simulated node's self-test".to_owned();
        }
        let cmd = self.config.verify.command.join(" ");
        match self.actuator.name() {
            "slurm" => format!("a Slurm job running {cmd}"),
            "kubernetes" => format!("a Kubernetes Job running {cmd}"),
            "script" => "the script's verify".to_owned(),
            other => format!("the {other} actuator"),
        }
    }

    /// A check's verdict: the ledger moves, the node is given back or kept out.
    async fn conclude(
        &self,
        end: &Ended,
        outcome: CheckOutcome,
        out: &mut PassReport,
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        let node = end.node.as_str();
        let (passed, detail) = match &outcome {
            CheckOutcome::Passed(d) => (true, d.as_str()),
            CheckOutcome::Failed(d) => (false, d.as_str()),
        };
        let moved = self
            .engine
            .lock()
            .ledger_mut()
            .verified(node, passed, detail, now);
        if let Err(e) = moved {
            // A person decided while it ran.
            let result = format!("{}: {detail}; not applied: {e}", verdict(passed));
            return self.record_check(end, &result, now).await;
        }
        let held = self
            .store
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == node);
        let result = if passed {
            match held.filter(|n| n.owner == POLICY_ACTOR) {
                Some(_) => {
                    let done = self.release_manual(node, VERIFY_ACTOR, now).await;
                    if !done.contains("failed") {
                        self.store.remove_node(node).await?;
                    }
                    format!("passed: {detail}; given back: {done}")
                }
                None => format!("passed: {detail}"),
            }
        } else {
            let reason = format!("bad: health check failed: {detail}");
            let req = Isolation {
                node: node.to_owned(),
                incident: None,
                reason: reason.clone(),
                by: VERIFY_ACTOR.to_owned(),
                at: now,
                evict: true,
            };
            let said = self.said(
                self.actuator.isolate(&req).await,
                "drained",
                "already drained",
            );
            if held.is_none() && !said.contains("failed") && !said.contains("left alone") {
                self.store
                    .put_node(&NodeRecord {
                        name: node.to_owned(),
                        state: "drained".to_owned(),
                        owner: POLICY_ACTOR.to_owned(),
                        reason,
                        incident: None,
                        since: now,
                        action: None,
                    })
                    .await?;
            }
            format!("failed: {detail}; kept out: {said}")
        };
        tracing::info!(%node, %result, "health check ended");
        out.actions += 1;
        self.record_check(end, &result, now).await
    }

    async fn record_check(
        &self,
        end: &Ended,
        result: &str,
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        let reason = format!("health check by {} ({:.0} s)", end.how, end.secs);
        self.record(
            ActionKind::Verify,
            &end.node,
            None,
            VERIFY_ACTOR,
            &reason,
            false,
            result,
            now,
        )
        .await?;
        Ok(())
    }
}

fn verdict(passed: bool) -> &'static str {
    if passed { "passed" } else { "failed" }
}

/// Whether the ledger's `state` wants a check: quarantined, or verifying (a check
/// that gave no verdict, or one a former leader started).
pub(crate) fn wants_check(state: HealthState) -> bool {
    matches!(state, HealthState::Quarantined | HealthState::Verifying)
}

#[cfg(test)]
mod tests {
    use super::super::run::ActuatorKind;
    use super::*;

    fn problems(yaml: &str, actuator: ActuatorKind) -> Vec<String> {
        let c: VerifyConfig = warden_model::yaml::from_str(yaml).expect("parses");
        c.problems(actuator)
            .into_iter()
            .map(|(f, m)| format!("{f}: {m}"))
            .collect()
    }

    #[test]
    fn the_section_has_defaults_and_every_mistake_is_named() {
        let c: VerifyConfig = warden_model::yaml::from_str("{}").expect("parses");
        assert!(!c.enabled);
        assert_eq!(c.after, Duration::from_secs(120));
        assert!(problems("{}", ActuatorKind::None).is_empty());
        assert_eq!(
            problems("{enabled: true}", ActuatorKind::Slurm),
            [
                "remediation.verify.command: the Slurm check job needs a command, e.g. [dcgmi, \
              diag, -r, \"2\"]"
            ]
        );
        assert!(problems("{enabled: true, command: [/bin/true]}", ActuatorKind::Slurm).is_empty());
        assert!(problems("{enabled: true}", ActuatorKind::Script).is_empty());
        assert_eq!(problems("{enabled: true}", ActuatorKind::None).len(), 1);
        assert_eq!(
            problems("{enabled: true}", ActuatorKind::Kubernetes).len(),
            1
        );
        assert_eq!(
            problems(
                "{timeout: 0s, max_parallel: 0, command: [\"\"]}",
                ActuatorKind::Slurm
            ),
            [
                "remediation.verify.timeout: above zero and at most 24h",
                "remediation.verify.max_parallel: from 1 to 1000",
                "remediation.verify.command[0]: a word of 1 to 1024 bytes without NUL",
            ]
        );
        assert!(warden_model::yaml::from_str::<VerifyConfig>("{enable: true}").is_err());
    }
}
