//! What people do through the API — acknowledge or resolve an incident, drain or
//! undrain a node — each as an action in the audit log: recorded as intended before it
//! runs and as finished after, so that a controller killed in between finishes it on
//! restart ([`recover`]) instead of repeating or losing it.
//!
//! Draining records the node as drained and owned by whoever asked; taking it out of a
//! scheduler's hands is the actuators' job. Every step here is idempotent, which is what
//! lets [`recover`] simply run an unfinished action again.

use std::sync::Arc;

use tokio::sync::Mutex;
use tracing::Instrument;
use warden_model::Timestamp;

use crate::persist::Persister;
use crate::shared::SharedEngine;
use crate::store::{ActionKind, ActionRecord, ActionStatus, NodeRecord, Store, StoreError};
use warden_engine::IncidentChange;
use warden_engine::incidents::ManualError;

/// Longest reason or note accepted, characters.
pub const MAX_REASON_CHARS: usize = 1024;

/// Environment variable naming a failpoint (tests): `drain-intended`,
/// `drain-applied`, `ack-intended`, `resolve-intended`, and `lead-started` (the
/// controller has the lease and has not yet taken the incidents back). When the
/// controller reaches it, it says so on stderr and stops there for good, so a test can
/// look at it or kill it at exactly that point.
pub const FAILPOINT_ENV: &str = "WARDEN_FAILPOINT";

/// Why an operator's request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum OperateError {
    /// The input is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// No such live incident.
    #[error("no live incident {0:?} (unknown, or resolved before this controller started)")]
    UnknownIncident(String),
    /// The incident is resolved.
    #[error("incident {0:?} is already resolved")]
    Resolved(String),
    /// The node is drained already.
    #[error("node {name:?} is already drained by {owner} since {since}: {reason}")]
    AlreadyDrained {
        /// Node.
        name: String,
        /// Owner of the drain.
        owner: String,
        /// Its reason.
        reason: String,
        /// Since when, in UTC to the second (`2026-11-29T16:05:09Z`).
        since: String,
    },
    /// The node is not drained.
    #[error("node {0:?} is not drained")]
    NotDrained(String),
    /// The safety rails refuse it now (circuit breaker, rate limit).
    #[error("{0}")]
    Refused(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Check a node name: a DNS-1123 subdomain ([`warden_model::ids::check_node_name`]).
pub fn check_node_name(name: &str) -> Result<(), OperateError> {
    warden_model::ids::check_node_name(name).map_err(OperateError::Invalid)
}

/// Check a reason or note: at most [`MAX_REASON_CHARS`], no control characters other
/// than newline and tab; `required` ones must not be blank.
pub fn check_reason(field: &str, text: &str, required: bool) -> Result<(), OperateError> {
    if required && text.trim().is_empty() {
        return Err(OperateError::Invalid(format!("`{field}` is required")));
    }
    if text.chars().count() > MAX_REASON_CHARS {
        return Err(OperateError::Invalid(format!(
            "`{field}` is longer than {MAX_REASON_CHARS} characters"
        )));
    }
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(OperateError::Invalid(format!(
            "`{field}` holds control characters"
        )));
    }
    Ok(())
}

/// Stop here for good when the failpoint `name` is set (see [`FAILPOINT_ENV`]).
pub async fn failpoint(name: &str) {
    if std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == name) {
        eprintln!("failpoint {name} reached");
        std::future::pending::<()>().await;
    }
}

/// A new action id: the time in milliseconds and 32 random bits.
pub fn action_id(now: Timestamp) -> String {
    let salt = crate::auth::new_token()
        .map(|t| t.chars().skip(4).take(8).collect::<String>())
        .unwrap_or_else(|_| format!("{:08x}", now.0 & 0xffff_ffff));
    format!("act-{:013}-{salt}", now.0 / 1_000_000)
}

/// Everything an action needs.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The engine (incidents live here).
    pub engine: SharedEngine,
    /// Writes incidents through to the store.
    pub persister: Arc<Mutex<Persister>>,
    /// The store.
    pub store: Store,
    /// Where alerts about changes people make go, if anywhere.
    pub alerts: Option<crate::alerts::AlertQueue>,
    /// Whether this controller leads (only the leader acts).
    pub leadership: Arc<crate::leader::Leadership>,
    /// Where finished actions are counted, if anywhere.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Remediation (policy, rails, actuator), when it runs here.
    pub remedy: Option<crate::remedy::run::Remediator>,
}

impl Operator {
    /// An operator over `engine` with a fresh in-memory store (simulations, tests).
    pub async fn in_memory(engine: SharedEngine) -> Result<Operator, StoreError> {
        let store = Store::memory().await?;
        Ok(Operator {
            engine,
            persister: Arc::new(Mutex::new(Persister::new(store.clone()))),
            store,
            alerts: None,
            leadership: crate::leader::Leadership::solo(),
            metrics: None,
            remedy: None,
        })
    }

    async fn intend(
        &self,
        kind: ActionKind,
        target: &str,
        incident: Option<&str>,
        actor: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<ActionRecord, OperateError> {
        let a = ActionRecord {
            id: action_id(now),
            kind,
            target: target.to_owned(),
            incident: incident.map(str::to_owned),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
            dry_run: false,
            status: ActionStatus::Intended,
            result: None,
            intended_at: now,
            finished_at: None,
        };
        self.store.intend(&a).await?;
        Ok(a)
    }

    async fn persist(&self, now: Timestamp) -> Result<(), OperateError> {
        self.persister.lock().await.sync(&self.engine, now).await?;
        Ok(())
    }

    /// Acknowledge incident `id`. Returns the change (none when it already was).
    pub async fn acknowledge(
        &self,
        id: &str,
        actor: &str,
        note: &str,
        now: Timestamp,
    ) -> Result<Option<IncidentChange>, OperateError> {
        check_reason("note", note, false)?;
        self.live(id)?;
        let a = self
            .intend(ActionKind::Acknowledge, id, Some(id), actor, note, now)
            .await?;
        failpoint("ack-intended").await;
        let change = self.apply(&a, now, false).await?;
        Ok(change)
    }

    /// Resolve incident `id` by hand.
    pub async fn resolve(
        &self,
        id: &str,
        actor: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<Option<IncidentChange>, OperateError> {
        check_reason("reason", reason, true)?;
        self.live(id)?;
        let a = self
            .intend(ActionKind::Resolve, id, Some(id), actor, reason, now)
            .await?;
        failpoint("resolve-intended").await;
        self.apply(&a, now, false).await
    }

    fn live(&self, id: &str) -> Result<(), OperateError> {
        let e = self.engine.lock();
        match e.incident(id) {
            None => Err(OperateError::UnknownIncident(id.to_owned())),
            Some(inc) if inc.state == warden_model::IncidentState::Resolved => {
                Err(OperateError::Resolved(id.to_owned()))
            }
            Some(_) => Ok(()),
        }
    }

    /// Drain node `name`.
    pub async fn drain(
        &self,
        name: &str,
        actor: &str,
        reason: &str,
        incident: Option<&str>,
        now: Timestamp,
    ) -> Result<NodeRecord, OperateError> {
        check_node_name(name)?;
        check_reason("reason", reason, true)?;
        if let Some(n) = self.store.node(name).await? {
            return Err(OperateError::AlreadyDrained {
                name: n.name,
                owner: n.owner,
                reason: n.reason,
                since: utc_seconds(n.since),
            });
        }
        if let Some(r) = &self.remedy {
            r.check_manual(name, now)
                .await
                .map_err(OperateError::Refused)?;
        }
        let a = self
            .intend(ActionKind::Drain, name, incident, actor, reason, now)
            .await?;
        failpoint("drain-intended").await;
        self.apply(&a, now, false).await?;
        self.store
            .node(name)
            .await?
            .ok_or_else(|| OperateError::NotDrained(name.to_owned()))
    }

    /// Undrain node `name`.
    pub async fn undrain(
        &self,
        name: &str,
        actor: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), OperateError> {
        check_node_name(name)?;
        check_reason("reason", reason, false)?;
        if self.store.node(name).await?.is_none() {
            return Err(OperateError::NotDrained(name.to_owned()));
        }
        let a = self
            .intend(ActionKind::Undrain, name, None, actor, reason, now)
            .await?;
        self.apply(&a, now, false).await?;
        Ok(())
    }

    /// Carry out action `a` (intended, maybe partly done by a run that died) and
    /// record it as finished. Every step tolerates having been done already. Failpoints
    /// only stop requests, never the recovery of a restart.
    async fn apply(
        &self,
        a: &ActionRecord,
        now: Timestamp,
        recovering: bool,
    ) -> Result<Option<IncidentChange>, OperateError> {
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "action",
            action = %a.id,
            kind = a.kind.as_str(),
            subject = %a.target,
            incident = a.incident.as_deref().unwrap_or(""),
            actor = %a.actor,
            recovering,
            result = tracing::field::Empty,
        );
        self.apply_in(a, now, recovering).instrument(span).await
    }

    async fn apply_in(
        &self,
        a: &ActionRecord,
        now: Timestamp,
        recovering: bool,
    ) -> Result<Option<IncidentChange>, OperateError> {
        let mut change = None;
        let result = match a.kind {
            ActionKind::Acknowledge => {
                let r = self
                    .engine
                    .lock()
                    .acknowledge(&a.target, &a.actor, &a.reason, now);
                match r {
                    Ok(c) => {
                        change = c;
                        "acknowledged".to_owned()
                    }
                    Err(ManualError::Unknown) => "incident no longer live".to_owned(),
                    Err(ManualError::Resolved) => "incident already resolved".to_owned(),
                }
            }
            ActionKind::Resolve => {
                let r = self
                    .engine
                    .lock()
                    .resolve_incident(&a.target, &a.actor, &a.reason, now);
                match r {
                    Ok(c) => {
                        change = Some(c);
                        "resolved".to_owned()
                    }
                    Err(ManualError::Unknown) => "incident no longer live".to_owned(),
                    Err(ManualError::Resolved) => "incident already resolved".to_owned(),
                }
            }
            ActionKind::Drain => {
                let held = self.store.node(&a.target).await?;
                match held {
                    Some(n) if n.action.as_deref() != Some(a.id.as_str()) => {
                        format!("not applied: already drained by {}", n.owner)
                    }
                    Some(_) => "drained".to_owned(),
                    None => {
                        self.store
                            .put_node(&NodeRecord {
                                name: a.target.clone(),
                                state: "drained".into(),
                                owner: a.actor.clone(),
                                reason: a.reason.clone(),
                                incident: a.incident.clone(),
                                since: a.intended_at,
                                action: Some(a.id.clone()),
                            })
                            .await?;
                        if !recovering {
                            failpoint("drain-applied").await;
                        }
                        match &self.remedy {
                            Some(r) => {
                                let done = r
                                    .isolate_manual(
                                        &a.target,
                                        &a.actor,
                                        &a.reason,
                                        a.incident.as_deref(),
                                        now,
                                    )
                                    .await
                                    .map_err(|e| OperateError::Refused(e.to_string()))?;
                                format!("drained; {done}")
                            }
                            None => "drained".to_owned(),
                        }
                    }
                }
            }
            ActionKind::Isolate => match &self.remedy {
                // Isolation is idempotent: finish it.
                Some(r) => {
                    let (result, c) = r.finish_isolation(a, now).await?;
                    change = c;
                    result
                }
                None => "interrupted before it finished; not repeated".to_owned(),
            },
            ActionKind::Restart
            | ActionKind::BreakerTrip
            | ActionKind::BreakerReset
            | ActionKind::Verify => {
                // Remediation records these as intended and done together; one left
                // intended was cut short. Its incident counts as decided, so nothing
                // runs twice (a job is never restarted twice).
                "interrupted before it finished; not repeated".to_owned()
            }
            ActionKind::Undrain => {
                // A person giving a node back decides for the node-health ledger too:
                // it is returned, its evidence cleared.
                {
                    let mut e = self.engine.lock();
                    if e.ledger().state(&a.target).holds_out() {
                        let why = if a.reason.is_empty() {
                            "undrained"
                        } else {
                            a.reason.as_str()
                        };
                        e.ledger_mut().decide(&a.target, false, &a.actor, why, now);
                    }
                }
                if self.store.remove_node(&a.target).await? {
                    match &self.remedy {
                        Some(r) => format!(
                            "undrained; {}",
                            r.release_manual(&a.target, &a.actor, now).await
                        ),
                        None => "undrained".to_owned(),
                    }
                } else {
                    "was not drained".to_owned()
                }
            }
        };
        tracing::Span::current().record("result", result.as_str());
        self.persist(now).await?;
        if let (Some(q), Some(c)) = (&self.alerts, &change) {
            let e = self.engine.lock();
            if let Some(inc) = e.incident(&c.id) {
                q.submit(inc, c.change);
            }
        }
        self.store
            .finish(&a.id, ActionStatus::Done, &result, now)
            .await?;
        if let Some(m) = &self.metrics {
            m.actions
                .with_label_values(&[a.kind.as_str(), "done"])
                .inc();
        }
        Ok(change)
    }
}

/// Finish every action a previous run recorded as intended and did not finish.
/// Returns how many were finished.
pub async fn recover(op: &Operator, now: Timestamp) -> Result<usize, OperateError> {
    let pending = op.store.unfinished_actions().await?;
    let n = pending.len();
    for a in pending {
        tracing::info!(
            action = %a.id,
            kind = a.kind.as_str(),
            subject = %a.target,
            actor = %a.actor,
            "finishing an action a previous run left unfinished"
        );
        op.apply(&a, now, true).await?;
    }
    Ok(n)
}

/// `t` in RFC 3339 UTC to the second (`2026-11-29T16:05:09Z`), for messages people read.
fn utc_seconds(t: Timestamp) -> String {
    let full = crate::alerts::rfc3339(t);
    match full.split_once('.') {
        Some((seconds, _)) => format!("{seconds}Z"),
        None => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_is_checked_as_ingest_checks_it() {
        assert!(check_node_name("node-1").is_ok());
        assert!(matches!(
            check_node_name("127.0.0.1:18002/x?"),
            Err(OperateError::Invalid(_))
        ));
    }

    #[test]
    fn reasons_are_bounded_and_printable() {
        assert!(check_reason("reason", "XID 79\non GPU 3", true).is_ok());
        assert!(check_reason("reason", "  ", true).is_err());
        assert!(check_reason("note", "", false).is_ok());
        assert!(check_reason("reason", &"x".repeat(MAX_REASON_CHARS + 1), true).is_err());
        assert!(check_reason("reason", "bell\u{7}", true).is_err());
    }
}
