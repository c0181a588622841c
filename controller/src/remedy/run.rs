//! The remediation loop: after every detector pass, each live incident the policy has
//! not yet decided on is put to the policy; what it calls for passes the safety rails —
//! dry run, the circuit breaker, per-node cooldowns, the rate limit — and then the
//! actuator. Every step is an action in the audit log and a line on the incident's
//! timeline.
//!
//! The rails' state (isolations in the breaker's window, whether it tripped, cooldowns,
//! the rate limiter's recent actions, which incidents were decided, past matches for
//! repetition) is one document in the store, written before an action runs: a
//! controller killed mid-way never repeats a job restart, and a tripped breaker stays
//! tripped across restarts until a person resets it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use warden_model::{Incident, IncidentKind, IncidentState, NodeName, Timestamp};

use super::checkpoint;
use super::policy::{ActionName, Decision, History, Policy, repeat_keys};
use super::script::{ScriptActuator, ScriptConfig};
use super::{ActuatorError, CheckOutcome, Isolation, Outcome, Restart};
use crate::shared::SharedEngine;
use crate::store::{ActionKind, ActionRecord, ActionStatus, NodeRecord, Store, StoreError};
use warden_engine::IncidentChange;

/// Name of the rails' state document in the store.
const STATE: &str = "rails";
/// How long a decided incident is remembered (longer than any reopen window).
const HANDLED_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long past matches are kept for `repeat` (longer than any sane window).
const MATCHES_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// The owner Warden writes on what it isolates.
pub const POLICY_ACTOR: &str = "warden-policy";
/// What an isolation the node-health ledger called for says in place of a rule name.
pub const LEDGER_RULE: &str = "node-health-ledger";

/// The circuit breaker: at most `max_nodes` nodes, and at most `max_percent` of the
/// nodes known, isolated within `window`; one more trips it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Most nodes isolated per window.
    pub max_nodes: usize,
    /// Most nodes isolated per window, as a percentage of the nodes known (at least one
    /// node is always allowed).
    pub max_percent: f64,
    /// The window, e.g. `1h`.
    #[serde(with = "super::duration_text")]
    pub window: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            max_nodes: 4,
            max_percent: 10.0,
            window: Duration::from_secs(3600),
        }
    }
}

/// Which actuator carries actions out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActuatorKind {
    /// None: nothing outside Warden changes. Out of a dry run, Warden's own node table
    /// is the record: isolated nodes show as drained there (the API, `warden nodes`,
    /// `warden_node_drained`) for a person or a scheduler that reads it, and restarts
    /// are recorded as requested.
    #[default]
    None,
    /// The `script` program.
    Script,
    /// Slurm, through `scontrol` (the `slurm` section).
    Slurm,
    /// Kubernetes, through the API server with the pod's service account (the
    /// `kubernetes` section).
    Kubernetes,
}

/// The `remediation` section of the controller configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemedyConfig {
    /// Only record what would be done (the default: a fresh install observes).
    pub dry_run: bool,
    /// A policy file; default: the shipped `rules/policy.yaml`.
    pub policy_file: Option<PathBuf>,
    /// Which actuator acts.
    pub actuator: ActuatorKind,
    /// The script actuator's program.
    pub script: Option<ScriptConfig>,
    /// The Slurm actuator.
    pub slurm: super::slurm::SlurmConfig,
    /// The Kubernetes actuator.
    pub kubernetes: super::kubernetes::KubeConfig,
    /// Namespace of a job whose id has none (`namespace/name` ids carry their own).
    pub kubernetes_namespace: String,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
    /// No second isolation of a node within this time of the last one.
    #[serde(with = "super::duration_text")]
    pub node_cooldown: Duration,
    /// Most actions that change something, per hour.
    pub max_actions_per_hour: usize,
    /// How long a rule on the diagnosis waits for it before it no longer matches.
    #[serde(with = "super::duration_text")]
    pub diagnosis_wait: Duration,
    /// Where a job's checkpoints are: `{job}` is replaced by the job id.
    pub checkpoint_dir: Option<String>,
    /// Give a node remediation isolated back once it has been healthy this long: no
    /// live incident names it, the last one ended at least this long ago, and its agent
    /// is heard from. Unset: nodes stay out until a person undrains them.
    #[serde(with = "super::duration_text::opt")]
    pub auto_release_after: Option<Duration>,
    /// How long after a restart the job must be seen running again (the scheduler's
    /// start report) before the timeline says it was not.
    #[serde(with = "super::duration_text")]
    pub restart_verify_window: Duration,
    /// Health checks of the nodes the node-health ledger quarantined.
    pub verify: super::verify::VerifyConfig,
}

impl Default for RemedyConfig {
    fn default() -> Self {
        RemedyConfig {
            dry_run: true,
            policy_file: None,
            actuator: ActuatorKind::None,
            script: None,
            slurm: super::slurm::SlurmConfig::default(),
            kubernetes: super::kubernetes::KubeConfig::default(),
            kubernetes_namespace: "default".to_owned(),
            breaker: BreakerConfig::default(),
            node_cooldown: Duration::from_secs(1800),
            max_actions_per_hour: 30,
            diagnosis_wait: Duration::from_secs(20),
            checkpoint_dir: None,
            auto_release_after: None,
            restart_verify_window: Duration::from_secs(1800),
            verify: super::verify::VerifyConfig::default(),
        }
    }
}

impl RemedyConfig {
    /// Problems with the section, as `(field, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let b = &self.breaker;
        if b.max_nodes == 0 {
            out.push((
                "remediation.breaker.max_nodes".into(),
                "must be at least 1".into(),
            ));
        }
        if !(b.max_percent > 0.0 && b.max_percent <= 100.0) {
            out.push((
                "remediation.breaker.max_percent".into(),
                "a percentage above 0 and at most 100".into(),
            ));
        }
        if b.window.is_zero() {
            out.push((
                "remediation.breaker.window".into(),
                "a window above zero".into(),
            ));
        }
        if self.max_actions_per_hour == 0 {
            out.push((
                "remediation.max_actions_per_hour".into(),
                "must be at least 1".into(),
            ));
        }
        match (&self.actuator, &self.script) {
            (ActuatorKind::Script, None) => out.push((
                "remediation.script".into(),
                "the script actuator needs script.program".into(),
            )),
            (_, Some(s)) => out.extend(s.problems("remediation.script")),
            _ => {}
        }
        out.extend(self.verify.problems(self.actuator));
        if self.verify.enabled
            && self.actuator == ActuatorKind::Kubernetes
            && self.kubernetes.check_image.is_none()
        {
            out.push((
                "remediation.kubernetes.check_image".into(),
                "the health check Job needs an image (verify.enabled)".into(),
            ));
        }
        out
    }
}

/// An action of remediation's, not yet recorded.
fn new_action(
    kind: ActionKind,
    target: &str,
    incident: Option<&str>,
    actor: &str,
    reason: &str,
    dry_run: bool,
    now: Timestamp,
) -> ActionRecord {
    ActionRecord {
        id: crate::operate::action_id(now),
        kind,
        target: target.to_owned(),
        incident: incident.map(str::to_owned),
        actor: actor.to_owned(),
        reason: reason.to_owned(),
        dry_run,
        status: ActionStatus::Intended,
        result: None,
        intended_at: now,
        finished_at: None,
    }
}

/// How long after taking the lead decisions wait for the agents to be heard again
/// while the breaker's cap, counted over the nodes heard, is still too small.
const AGENTS_REPORT_SECS: f64 = 10.0;

/// How recently a node's agent must have been heard for the node to count as healthy.
const AGENT_FRESH_SECS: f64 = 120.0;

/// A node isolated within the breaker's window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Isolated {
    /// The node.
    pub node: NodeName,
    /// When (ns since the epoch).
    pub at: i64,
    /// For which incident.
    pub incident: String,
}

/// Why and when the breaker tripped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trip {
    /// When (ns since the epoch).
    pub at: i64,
    /// Why, in words.
    pub reason: String,
    /// The incident whose action tripped it.
    pub incident: String,
}

/// A restarted job to be seen running again without its excluded nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verify {
    /// The incident that called for the restart.
    pub incident: String,
    /// The job.
    pub job: String,
    /// Nodes it must not run on.
    pub exclude: Vec<NodeName>,
    /// When the restart was requested (ns since the epoch).
    pub at: i64,
}

/// A past policy match, for `repeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Matched {
    rule: String,
    key: String,
    at: i64,
    incident: String,
    count: u32,
}

/// The rails' persisted state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RailsState {
    /// Isolations within the breaker's window.
    pub isolations: Vec<Isolated>,
    /// Set while the breaker is tripped.
    pub tripped: Option<Trip>,
    /// Times of recent actions that changed something (rate limit).
    pub recent: Vec<i64>,
    /// Last isolation per node (cooldown).
    pub last_isolated: BTreeMap<NodeName, i64>,
    /// Incidents decided, with when.
    pub handled: BTreeMap<String, i64>,
    /// What a dry run would have isolated within the breaker's window (never counted
    /// against real actions).
    #[serde(default)]
    pub dry_isolations: Vec<Isolated>,
    /// Set when a dry run would have tripped the breaker.
    #[serde(default)]
    pub dry_tripped: Option<Trip>,
    /// Restarted jobs not yet seen running again.
    #[serde(default)]
    pub verifying: Vec<Verify>,
    #[serde(default)]
    matches: Vec<Matched>,
}

impl History for RailsState {
    fn occurrences(&self, rule: &str, key: &str, since: Timestamp, except: &str) -> u32 {
        self.matches
            .iter()
            .filter(|m| m.rule == rule && m.key == key && m.at >= since.0 && m.incident != except)
            .map(|m| m.count)
            .sum()
    }
}

impl RailsState {
    /// The isolations counted for real actions, or for a dry run's.
    fn isolations_of(&self, dry: bool) -> &Vec<Isolated> {
        if dry {
            &self.dry_isolations
        } else {
            &self.isolations
        }
    }

    fn isolations_mut(&mut self, dry: bool) -> &mut Vec<Isolated> {
        if dry {
            &mut self.dry_isolations
        } else {
            &mut self.isolations
        }
    }

    /// The breaker's trip, real or a dry run's.
    fn trip_of(&self, dry: bool) -> &Option<Trip> {
        if dry {
            &self.dry_tripped
        } else {
            &self.tripped
        }
    }

    fn trip_mut(&mut self, dry: bool) -> &mut Option<Trip> {
        if dry {
            &mut self.dry_tripped
        } else {
            &mut self.tripped
        }
    }

    fn prune(&mut self, now: Timestamp, window: Duration) {
        let cut = |d: Duration| now.plus_secs(-d.as_secs_f64()).0;
        let w = cut(window);
        self.isolations.retain(|i| i.at >= w);
        self.dry_isolations.retain(|i| i.at >= w);
        let hour = cut(Duration::from_secs(3600));
        self.recent.retain(|&t| t >= hour);
        let keep = cut(HANDLED_KEEP);
        self.handled.retain(|_, &mut t| t >= keep);
        let keep = cut(MATCHES_KEEP);
        self.matches.retain(|m| m.at >= keep);
    }
}

pub use warden_model::view::RemedyStatus;

/// Why remediation failed.
#[derive(Debug, thiserror::Error)]
pub enum RemedyError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The policy could not be loaded.
    #[error(transparent)]
    Policy(#[from] super::policy::PolicyError),
    /// The stored state is not readable.
    #[error("remediation state in the store is unreadable: {0}")]
    State(String),
    /// The breaker is not tripped.
    #[error("the circuit breaker is not tripped")]
    NotTripped,
    /// The actuator could not be set up.
    #[error("{0}")]
    Actuator(String),
}

/// The rails' state as the store holds it (the default before it was first written).
async fn read_state(store: &Store) -> Result<RailsState, RemedyError> {
    match store.remediation_state(STATE).await? {
        Some(doc) => serde_json::from_str(&doc).map_err(|e| RemedyError::State(e.to_string())),
        None => Ok(RailsState::default()),
    }
}

/// Carries actions out.
#[derive(Debug, Clone)]
pub enum Actuator {
    /// Nothing outside Warden: Warden's own records are the only effect.
    None,
    /// A program of the operator's.
    Script(ScriptActuator),
    /// Slurm.
    Slurm(super::slurm::SlurmActuator),
    /// Kubernetes.
    #[cfg(feature = "kubernetes")]
    Kubernetes(super::kubernetes::KubeActuator),
}

impl Actuator {
    pub(super) async fn isolate(&self, req: &Isolation) -> Result<Outcome, ActuatorError> {
        match self {
            Actuator::None => Ok(Outcome::Applied),
            Actuator::Script(s) => s.isolate(req).await,
            Actuator::Slurm(s) => s.isolate(req).await,
            #[cfg(feature = "kubernetes")]
            Actuator::Kubernetes(k) => k.isolate(req).await,
        }
    }

    async fn release(&self, req: &super::Release) -> Result<Outcome, ActuatorError> {
        match self {
            Actuator::None => Ok(Outcome::Applied),
            Actuator::Script(s) => s.release(req).await,
            Actuator::Slurm(s) => s.release(req).await,
            #[cfg(feature = "kubernetes")]
            Actuator::Kubernetes(k) => k.release(req).await,
        }
    }

    async fn restart(&self, req: &Restart) -> Result<Outcome, ActuatorError> {
        match self {
            Actuator::None => Ok(Outcome::Applied),
            Actuator::Script(s) => s.restart(req).await,
            Actuator::Slurm(s) => s.restart(req).await,
            #[cfg(feature = "kubernetes")]
            Actuator::Kubernetes(k) => k.restart(req).await,
        }
    }

    /// Write a node-health ledger change where the scheduler shows it (Kubernetes: the
    /// node condition and an Event); `false` where this actuator has no such place.
    pub(super) async fn node_health(
        &self,
        node: &str,
        state: &str,
        held_out: bool,
        message: &str,
        at: Timestamp,
    ) -> Result<bool, ActuatorError> {
        match self {
            #[cfg(feature = "kubernetes")]
            Actuator::Kubernetes(k) => k
                .node_health(node, state, held_out, message, at)
                .await
                .map(|()| true),
            _ => {
                let _ = (node, state, held_out, message, at);
                Ok(false)
            }
        }
    }

    /// Whether it is the Kubernetes actuator (jobs and namespaces are its terms).
    pub(super) fn is_kubernetes(&self) -> bool {
        #[cfg(feature = "kubernetes")]
        return matches!(self, Actuator::Kubernetes(_));
        #[cfg(not(feature = "kubernetes"))]
        return false;
    }

    /// Run `node`'s health check.
    pub(super) async fn verify(
        &self,
        node: &str,
        cfg: &super::verify::VerifyConfig,
    ) -> Result<CheckOutcome, ActuatorError> {
        match self {
            Actuator::Script(s) => s.verify(node, cfg.timeout).await,
            Actuator::Slurm(s) => s.verify(node, &cfg.command, cfg.timeout).await,
            #[cfg(feature = "kubernetes")]
            Actuator::Kubernetes(k) => k.verify(node, &cfg.command, cfg.timeout).await,
            _ => Err(ActuatorError::Failed {
                what: format!("health check of {node}"),
                why: format!("the {} actuator runs no health checks", self.name()),
            }),
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Actuator::None => "none",
            Actuator::Script(_) => "script",
            Actuator::Slurm(_) => "slurm",
            #[cfg(feature = "kubernetes")]
            Actuator::Kubernetes(_) => "kubernetes",
        }
    }
}

/// A job restart a pass decided on, issued once per job after every incident of the
/// pass is decided.
struct PendingRestart {
    /// The first incident that called for it (its detection time, its timeline).
    incident: Incident,
    reason: String,
    /// Nodes isolated for it in this pass, by every incident joined.
    isolated: Vec<NodeName>,
    /// Later incidents of the same job whose restart is this one.
    joined: Vec<String>,
}

/// The remediation loop's state and parts.
#[derive(Debug, Clone)]
pub struct Remediator {
    pub(super) config: Arc<RemedyConfig>,
    policy: Arc<Policy>,
    pub(super) actuator: Actuator,
    pub(super) engine: SharedEngine,
    pub(super) store: Store,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    clock: Arc<dyn warden_engine::clock::Clock>,
    state: Arc<Mutex<RailsState>>,
    /// When this controller last took the lead ([`Remediator::reload`]), ns since the
    /// epoch; 0 before.
    led_at: Arc<AtomicI64>,
    /// Health checks under way (`remedy::verify`).
    pub(super) checks: Arc<Mutex<super::verify::Checks>>,
    /// Health checks answered in-process instead of through the actuator.
    pub(super) simulated_check: Option<super::verify::SimulatedCheck>,
    /// Per node, the time of the last ledger change written to the scheduler.
    pub(super) published: Arc<Mutex<BTreeMap<String, Timestamp>>>,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Incidents the policy decided on.
    pub decided: usize,
    /// Actions recorded (dry-run ones included).
    pub actions: usize,
    /// Whether the breaker tripped in this pass.
    pub tripped: bool,
    /// Changes to incidents (timeline notes) to persist and alert on.
    pub changes: Vec<IncidentChange>,
    /// Incidents this pass carried out an action for: an isolation or a restart (not in
    /// a dry run), whatever its result, which its note gives. The other incidents'
    /// notes only record a decision, a notification or why nothing was done.
    pub acted: Vec<String>,
}

impl Remediator {
    /// Set up from the configuration, reading the rails' state from the store.
    pub async fn new(
        config: RemedyConfig,
        engine: SharedEngine,
        store: Store,
        metrics: Option<Arc<crate::metrics::Metrics>>,
        clock: Arc<dyn warden_engine::clock::Clock>,
    ) -> Result<Remediator, RemedyError> {
        let policy = match &config.policy_file {
            Some(p) => Policy::load(p)?,
            None => Policy::shipped()?,
        };
        let actuator = match (&config.actuator, &config.script) {
            (ActuatorKind::Script, Some(s)) => Actuator::Script(ScriptActuator::new(s.clone())),
            (ActuatorKind::Slurm, _) => {
                Actuator::Slurm(super::slurm::SlurmActuator::new(config.slurm.clone()))
            }
            #[cfg(not(feature = "kubernetes"))]
            (ActuatorKind::Kubernetes, _) => {
                return Err(RemedyError::Actuator(
                    "this build of Warden has no Kubernetes actuator (cargo feature `kubernetes`)"
                        .to_owned(),
                ));
            }
            #[cfg(feature = "kubernetes")]
            (ActuatorKind::Kubernetes, _) => {
                let client = kube::Client::try_default()
                    .await
                    .map_err(|e| RemedyError::Actuator(format!("Kubernetes client: {e}")))?;
                Actuator::Kubernetes(super::kubernetes::KubeActuator::new(
                    client,
                    config.kubernetes.clone(),
                ))
            }
            _ => Actuator::None,
        };
        let state = read_state(&store).await?;
        let r = Remediator {
            config: Arc::new(config),
            policy: Arc::new(policy),
            actuator,
            engine,
            store,
            metrics,
            clock,
            state: Arc::new(Mutex::new(state)),
            led_at: Arc::new(AtomicI64::new(0)),
            checks: Arc::new(Mutex::new(super::verify::Checks::default())),
            simulated_check: None,
            published: Arc::new(Mutex::new(BTreeMap::new())),
        };
        r.publish(&*r.state.lock().await);
        Ok(r)
    }

    /// Answer health checks with `check` instead of the actuator (a simulated cluster,
    /// whose simulator knows each node's hardware).
    pub fn with_simulated_check(mut self, check: super::verify::SimulatedCheck) -> Remediator {
        self.simulated_check = Some(check);
        self
    }

    /// Read the rails' state from the store again (on taking the lead: another
    /// controller may have acted).
    pub async fn reload(&self) -> Result<(), RemedyError> {
        self.led_at
            .store(self.clock.now().0.max(1), AtomicOrdering::SeqCst);
        let state = read_state(&self.store).await?;
        let mut s = self.state.lock().await;
        *s = state;
        self.publish(&s);
        Ok(())
    }

    /// Finish an isolation a previous run recorded as intended and did not finish (it
    /// was killed between recording and acting, or while the actuator ran). Isolation
    /// is idempotent, so it is applied again, as the rule that called for it asked
    /// (cordon or drain; cordon when the rule is gone). Where it cannot be finished,
    /// the node table holds the node as `isolation_interrupted` and the incident's
    /// timeline says so (which alerts carry). Returns the action's result and the
    /// incident's change.
    pub async fn finish_isolation(
        &self,
        a: &ActionRecord,
        now: Timestamp,
    ) -> Result<(String, Option<IncidentChange>), StoreError> {
        if a.dry_run {
            return Ok((
                "dry run: interrupted before it finished; nothing to finish".to_owned(),
                None,
            ));
        }
        let node = a.target.clone();
        let rule = a.reason.split_once(": ").map_or("", |(r, _)| r);
        let evict = self
            .policy
            .rules
            .iter()
            .find(|r| r.name == rule)
            .is_some_and(|r| {
                r.then
                    .iter()
                    .any(|&x| x == ActionName::Drain || x == ActionName::IsolateGroup)
            })
            || rule == LEDGER_RULE;
        let verb = if evict { "drain" } else { "cordon" };
        let req = Isolation {
            node: node.clone(),
            incident: a.incident.clone(),
            reason: self.with_health(&node, &a.reason),
            by: POLICY_ACTOR.to_owned(),
            at: a.intended_at,
            evict,
        };
        let held = |state: &str, reason: String| NodeRecord {
            name: node.clone(),
            state: state.into(),
            owner: POLICY_ACTOR.into(),
            reason,
            incident: a.incident.clone(),
            since: a.intended_at,
            action: None,
        };
        let (result, finished) = match self.actuator.isolate(&req).await {
            Ok(Outcome::Applied | Outcome::AlreadyDone) => {
                self.store
                    .put_node(&held("drained", a.reason.clone()))
                    .await?;
                (
                    format!("{verb} {node}: done after an interruption (finished on recovery)"),
                    true,
                )
            }
            Ok(Outcome::NotOurs { owner }) => (
                format!("{verb} {node}: left alone, held by {owner} (finished on recovery)"),
                true,
            ),
            Err(e) => {
                let why =
                    format!("isolation interrupted: {verb} {node} could not be finished: {e}");
                self.store
                    .put_node(&held("isolation_interrupted", why.clone()))
                    .await?;
                (why, false)
            }
        };
        let change = a.incident.as_deref().and_then(|id| {
            self.engine
                .lock()
                .remediation_note(id, &result, finished, now)
        });
        if finished {
            tracing::info!(node = %node, action = %a.id, "an interrupted isolation was finished");
        } else {
            tracing::error!(node = %node, action = %a.id, result = %result, "an interrupted isolation could not be finished");
        }
        Ok((result, change))
    }

    /// Whether the rails let a person drain a node now: not while the breaker is
    /// tripped, nor past the breaker's cap or the rate limit. `Err` says why not.
    pub async fn check_manual(&self, node: &str, now: Timestamp) -> Result<(), String> {
        if self.config.dry_run {
            // Nothing acts in a dry run: a person's drain is only recorded.
            return Ok(());
        }
        let mut s = self.state.lock().await;
        s.prune(now, self.config.breaker.window);
        if let Some(t) = &s.tripped {
            return Err(format!(
                "the remediation circuit breaker is tripped ({}); reset it \
                 (POST /api/v1/remediation/breaker/reset) before draining more nodes",
                t.reason
            ));
        }
        let cap = self.cap(self.known_nodes(now));
        let counted = s.isolations.iter().any(|i| i.node == node);
        if !counted && s.isolations.len() + 1 > cap {
            return Err(format!(
                "draining {node} would make {} nodes isolated within {}, over the circuit \
                 breaker's cap of {cap}",
                s.isolations.len() + 1,
                humantime::format_duration(self.config.breaker.window)
            ));
        }
        if s.recent.len() >= self.config.max_actions_per_hour {
            return Err(format!(
                "the remediation rate limit ({} actions per hour) is reached",
                self.config.max_actions_per_hour
            ));
        }
        Ok(())
    }

    /// A person's drain, through the same actuator: counted by the breaker and the rate
    /// limit; in a dry run only recorded. Returns what came of it, in words.
    pub async fn isolate_manual(
        &self,
        node: &str,
        actor: &str,
        reason: &str,
        incident: Option<&str>,
        now: Timestamp,
    ) -> Result<String, RemedyError> {
        if self.config.dry_run {
            return Ok("dry run: nothing changed outside Warden".to_owned());
        }
        let mut s = self.state.lock().await;
        if !s.isolations.iter().any(|i| i.node == node) {
            s.isolations.push(Isolated {
                node: node.to_owned(),
                at: now.0,
                incident: incident.unwrap_or("manual").to_owned(),
            });
            s.recent.push(now.0);
            s.last_isolated.insert(node.to_owned(), now.0);
            self.save(&s, now).await?;
        }
        self.publish(&s);
        drop(s);
        let req = Isolation {
            node: node.to_owned(),
            incident: incident.map(str::to_owned),
            reason: reason.to_owned(),
            by: actor.to_owned(),
            at: now,
            evict: true,
        };
        let r = self.actuator.isolate(&req).await;
        Ok(self.said(r, "drained", "already drained"))
    }

    /// Isolate (drain) a node the node-health ledger quarantined that the policy did not
    /// isolate, so that its health check runs on a node out of service: under the same
    /// rails as the policy's isolations (counted by the breaker; nothing while it is
    /// tripped or when one more would go over its cap, which the ledger never trips).
    /// Whether the node is now held.
    pub(super) async fn isolate_for_ledger(
        &self,
        node: &str,
        why: &str,
        incident: Option<&str>,
        out: &mut PassReport,
        now: Timestamp,
    ) -> Result<bool, RemedyError> {
        let mut s = self.state.lock().await;
        if s.trip_of(false).is_some() {
            return Ok(false);
        }
        let cap = self.cap(self.known_nodes(now));
        if s.isolations_of(false).len() + 1 > cap {
            tracing::warn!(%node, cap, "the ledger's quarantine is not isolated: the breaker's cap is reached");
            return Ok(false);
        }
        s.isolations_mut(false).push(Isolated {
            node: node.to_owned(),
            at: now.0,
            incident: incident.unwrap_or_default().to_owned(),
        });
        s.last_isolated.insert(node.to_owned(), now.0);
        s.recent.push(now.0);
        let reason = format!("{LEDGER_RULE}: {why}");
        let record = new_action(
            ActionKind::Isolate,
            node,
            incident,
            POLICY_ACTOR,
            &reason,
            false,
            now,
        );
        self.save_and_intend(&s, &record, now).await?;
        drop(s);
        let req = Isolation {
            node: node.to_owned(),
            incident: incident.map(str::to_owned),
            reason: self.with_health(node, &reason),
            by: POLICY_ACTOR.to_owned(),
            at: now,
            evict: true,
        };
        let (held, result) = match self.actuator.isolate(&req).await {
            Ok(Outcome::Applied) => {
                self.store
                    .put_node(&NodeRecord {
                        name: node.to_owned(),
                        state: "drained".into(),
                        owner: POLICY_ACTOR.into(),
                        reason: reason.clone(),
                        incident: incident.map(str::to_owned),
                        since: now,
                        action: None,
                    })
                    .await?;
                (true, format!("drain {node}: done"))
            }
            Ok(Outcome::AlreadyDone) => (true, format!("drain {node}: already so")),
            Ok(Outcome::NotOurs { owner }) => {
                (false, format!("drain {node}: left alone, held by {owner}"))
            }
            Err(e) => (false, format!("drain {node} failed: {e}")),
        };
        self.done(&record, &result, now).await?;
        out.actions += 1;
        tracing::info!(%node, %result, "node isolated for the node-health ledger");
        Ok(held)
    }

    /// An isolation's reason with the node-health ledger's state in front where the
    /// ledger holds something against the node (`quarantined: gpu-fatal-xid: ...`), so
    /// that the scheduler's own record of it (the Slurm drain reason, the node's
    /// annotation) says where the node stands.
    fn with_health(&self, node: &str, reason: &str) -> String {
        let state = self.engine.lock().ledger().state(node);
        if state == warden_engine::ledger::HealthState::Healthy {
            reason.to_owned()
        } else {
            format!("{}: {reason}", state.as_str())
        }
    }

    /// What an actuator's answer means, in words: `done` when it acted, `already` when
    /// nothing needed doing.
    pub(super) fn said(
        &self,
        r: Result<Outcome, ActuatorError>,
        done: &str,
        already: &str,
    ) -> String {
        let name = self.actuator.name();
        match r {
            Ok(Outcome::Applied) => format!("{name}: {done}"),
            Ok(Outcome::AlreadyDone) => format!("{name}: {already}"),
            Ok(Outcome::NotOurs { owner }) => format!("{name}: left alone, held by {owner}"),
            Err(e) => format!("{name} failed: {e}"),
        }
    }

    /// A person's undrain (or the end of a node's isolation), through the same
    /// actuator, which gives back only what Warden took. Returns what came of it.
    pub async fn release_manual(&self, node: &str, actor: &str, now: Timestamp) -> String {
        if self.config.dry_run {
            return "dry run: nothing changed outside Warden".to_owned();
        }
        let req = super::Release {
            node: node.to_owned(),
            by: actor.to_owned(),
            at: now,
        };
        let r = self.actuator.release(&req).await;
        self.said(r, "given back", "was in service")
    }

    /// The breaker's cap given `nodes` known nodes.
    fn cap(&self, nodes: usize) -> usize {
        let b = &self.config.breaker;
        let by_percent = ((nodes as f64) * b.max_percent / 100.0).floor() as usize;
        b.max_nodes.min(by_percent.max(1))
    }

    fn known_nodes(&self, now: Timestamp) -> usize {
        self.engine.lock().agents(now).len()
    }

    /// What the API shows.
    pub async fn status(&self, now: Timestamp) -> RemedyStatus {
        let mut s = self.state.lock().await;
        s.prune(now, self.config.breaker.window);
        RemedyStatus {
            dry_run: self.config.dry_run,
            actuator: self.actuator.name().to_owned(),
            isolated_in_window: s.isolations.len(),
            breaker_cap: self.cap(self.known_nodes(now)),
            tripped: s.tripped.is_some(),
            dry_run_tripped: s.dry_tripped.is_some(),
            tripped_reason: s
                .tripped
                .as_ref()
                .or(s.dry_tripped.as_ref())
                .map(|t| t.reason.clone()),
            tripped_at: s
                .tripped
                .as_ref()
                .map(|t| crate::alerts::rfc3339(Timestamp(t.at))),
        }
    }

    /// A person resets a tripped breaker (or a dry run's trip): remediation acts again
    /// and the breaker's window starts afresh.
    pub async fn reset_breaker(
        &self,
        actor: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<Trip, RemedyError> {
        let mut s = self.state.lock().await;
        let Some(trip) = s.tripped.take().or_else(|| s.dry_tripped.take()) else {
            return Err(RemedyError::NotTripped);
        };
        s.dry_tripped = None;
        s.isolations.clear();
        s.dry_isolations.clear();
        self.save(&s, now).await?;
        self.record(
            ActionKind::BreakerReset,
            "breaker",
            Some(&trip.incident),
            actor,
            reason,
            false,
            "reset; the window starts afresh",
            now,
        )
        .await?;
        self.publish(&s);
        Ok(trip)
    }

    async fn save(&self, s: &RailsState, now: Timestamp) -> Result<(), StoreError> {
        let doc = serde_json::to_string(s).unwrap_or_else(|_| "{}".to_owned());
        self.store.put_remediation_state(STATE, &doc, now).await
    }

    fn publish(&self, s: &RailsState) {
        if let Some(m) = &self.metrics {
            m.breaker_tripped.set(i64::from(s.tripped.is_some()));
            m.isolated_in_window.set(s.isolations.len() as i64);
            m.remediation_dry_run.set(i64::from(self.config.dry_run));
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn record(
        &self,
        kind: ActionKind,
        target: &str,
        incident: Option<&str>,
        actor: &str,
        reason: &str,
        dry_run: bool,
        result: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let a = new_action(kind, target, incident, actor, reason, dry_run, now);
        self.store.intend(&a).await?;
        self.done(&a, result, now).await
    }

    /// Write the rails' state and record `a` as intended, in one transaction, before
    /// the actuator runs: a kill before it leaves neither (the incident is decided
    /// again), a kill after it leaves both, and the next start finishes `a` as
    /// interrupted and does not repeat it.
    async fn save_and_intend(
        &self,
        s: &RailsState,
        a: &ActionRecord,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let doc = serde_json::to_string(s).unwrap_or_else(|_| "{}".to_owned());
        self.store
            .put_remediation_state_and_intend(STATE, &doc, now, a)
            .await
    }

    /// Record `a` as done with `result` at `finished`, and count it.
    async fn done(
        &self,
        a: &ActionRecord,
        result: &str,
        finished: Timestamp,
    ) -> Result<(), StoreError> {
        self.store
            .finish(&a.id, ActionStatus::Done, result, finished)
            .await?;
        if let Some(m) = &self.metrics {
            let label = if a.dry_run { "dry_run" } else { "done" };
            m.actions.with_label_values(&[a.kind.as_str(), label]).inc();
        }
        Ok(())
    }

    fn note(&self, out: &mut PassReport, id: &str, what: &str, mitigating: bool, now: Timestamp) {
        if mitigating && !out.acted.iter().any(|a| a == id) {
            out.acted.push(id.to_owned());
        }
        if let Some(c) = self
            .engine
            .lock()
            .remediation_note(id, what, mitigating, now)
            && !out.changes.contains(&c)
        {
            out.changes.push(c);
        }
    }

    /// Put every live, undecided incident to the policy and act on what it says.
    pub async fn pass(&self, now: Timestamp) -> Result<PassReport, RemedyError> {
        let mut out = PassReport::default();
        let mut s = self.state.lock().await;
        s.prune(now, self.config.breaker.window);
        self.verify_restarts(&mut s, &mut out, now).await?;
        let candidates: Vec<Incident> = self
            .engine
            .lock()
            .incidents()
            .iter()
            .filter(|i| i.state != IncidentState::Resolved && !s.handled.contains_key(&i.id))
            .cloned()
            .collect();
        // Right after taking the lead the agents are not heard again yet, and the
        // breaker's cap counts the nodes heard: while one more isolation would go over
        // that smaller cap, decisions wait (up to AGENTS_REPORT_SECS) rather than trip
        // the breaker on a partial view of the fleet.
        let led_at = self.led_at.load(AtomicOrdering::SeqCst);
        let settling = led_at != 0
            && now.secs_since(Timestamp(led_at)) < AGENTS_REPORT_SECS
            && s.isolations_of(self.config.dry_run).len() + 1 > self.cap(self.known_nodes(now));
        let mut restarts: Vec<PendingRestart> = Vec::new();
        for inc in candidates.into_iter().filter(|_| !settling) {
            let waited_out = inc.diagnosis.is_some()
                || now.secs_since(inc.detected_at) >= self.config.diagnosis_wait.as_secs_f64();
            let rule = match self.policy.decide(&inc, &*s, now, waited_out) {
                Decision::Wait(_) => continue,
                Decision::Nothing => {
                    s.handled.insert(inc.id.clone(), now.0);
                    self.save(&s, now).await?;
                    continue;
                }
                Decision::Act(rule) => rule.clone(),
            };
            out.decided += 1;
            // Decided before acting: a restart is never repeated.
            s.handled.insert(inc.id.clone(), now.0);
            if let Some(rep) = &rule.when.repeat {
                for key in repeat_keys(&inc, rep.per) {
                    s.matches.push(Matched {
                        rule: rule.name.clone(),
                        key,
                        at: now.0,
                        incident: inc.id.clone(),
                        count: rule.occurrences_in(&inc),
                    });
                }
            }
            // The decision is written with the first action it calls for (or below,
            // when it calls for none), never before: a kill in between would leave it
            // decided with nothing done and nothing in the audit log.
            let prefix = if self.config.dry_run { "dry run: " } else { "" };
            self.note(
                &mut out,
                &inc.id,
                &format!(
                    "{prefix}policy rule {} calls for {}",
                    rule.name,
                    rule.then
                        .iter()
                        .map(|a| a.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                false,
                now,
            );
            let queued = restarts.iter().map(|r| 1 + r.joined.len()).sum::<usize>();
            self.act(
                &mut s,
                &mut out,
                &mut restarts,
                &inc,
                &rule.name,
                &rule.then,
                now,
            )
            .await?;
            // An incident whose restart waits for the end of the pass is written with
            // that restart's intent, like any other decision with its first action.
            if restarts.iter().map(|r| 1 + r.joined.len()).sum::<usize>() == queued {
                self.save(&s, now).await?;
            }
        }
        // One restart per job and pass, without every node isolated for it: faults on
        // two nodes of one job at once must not requeue it twice.
        for r in restarts {
            self.restart(&mut s, &mut out, &r.incident, &r.reason, &r.isolated, now)
                .await?;
            for other in &r.joined {
                let what = format!(
                    "restart of job {} requested once, with incident {}",
                    r.incident.job.as_deref().unwrap_or_default(),
                    r.incident.id
                );
                self.note(&mut out, other, &what, false, now);
            }
            self.save(&s, now).await?;
        }
        drop(s);
        self.release_healthy(&mut out, now).await?;
        self.verify_nodes(&mut out, now).await?;
        self.publish_health().await;
        let s = self.state.lock().await;
        self.publish(&s);
        Ok(out)
    }

    /// Give back the nodes remediation isolated that have been healthy for
    /// `auto_release_after`.
    async fn release_healthy(
        &self,
        out: &mut PassReport,
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        let Some(after) = self.config.auto_release_after else {
            return Ok(());
        };
        if self.config.dry_run {
            return Ok(());
        }
        let held: Vec<NodeRecord> = self
            .store
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.owner == POLICY_ACTOR)
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        for n in held {
            let (troubled_until, live, heard) = {
                let e = self.engine.lock();
                let names = |i: &Incident| {
                    i.nodes.contains(&n.name) || i.gpus.iter().any(|g| g.node == n.name)
                };
                let mine: Vec<&Incident> = e.incidents().iter().filter(|i| names(i)).collect();
                let live = mine.iter().any(|i| i.state != IncidentState::Resolved);
                let until = mine
                    .iter()
                    .filter_map(|i| i.resolved_at)
                    .fold(n.since, |a, b| if b.0 > a.0 { b } else { a });
                let heard = e
                    .agents(now)
                    .iter()
                    .any(|(name, ago)| *name == n.name && *ago <= AGENT_FRESH_SECS);
                (until, live, heard)
            };
            if live || !heard || now.secs_since(troubled_until) < after.as_secs_f64() {
                continue;
            }
            // With verification on, a node the ledger holds out returns only through
            // its health check.
            if self.config.verify.enabled && self.engine.lock().ledger().state(&n.name).holds_out()
            {
                continue;
            }
            let done = self.release_manual(&n.name, "auto-release", now).await;
            if done.contains("failed") {
                tracing::warn!(node = %n.name, result = %done, "auto-release failed; retried next pass");
                continue;
            }
            self.store.remove_node(&n.name).await?;
            let why = format!(
                "healthy for {} (no live incident, agent heard)",
                humantime::format_duration(after)
            );
            // The node-health ledger takes the node back with the same reason, its
            // evidence cleared.
            {
                let mut e = self.engine.lock();
                if e.ledger().state(&n.name).holds_out() {
                    e.ledger_mut()
                        .decide(&n.name, false, "auto-release", &why, now);
                }
            }
            let result = format!("released {}; {done}", n.name);
            self.record(
                ActionKind::Undrain,
                &n.name,
                n.incident.as_deref(),
                "auto-release",
                &why,
                false,
                &result,
                now,
            )
            .await?;
            out.actions += 1;
            tracing::info!(node = %n.name, "node given back after its health window");
            if let Some(id) = &n.incident {
                self.note(out, id, &format!("{result}: {why}"), false, now);
            }
        }
        Ok(())
    }

    /// Check restarted jobs against what their scheduler reports: running again after
    /// the restart, and on none of the excluded nodes.
    async fn verify_restarts(
        &self,
        s: &mut RailsState,
        out: &mut PassReport,
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        if s.verifying.is_empty() {
            return Ok(());
        }
        let mut keep = Vec::new();
        let mut changed = false;
        for v in std::mem::take(&mut s.verifying) {
            let seen = self
                .engine
                .lock()
                .job_lifecycle(&v.job)
                .filter(|l| l.ended_at.is_none() && l.started_at.is_some_and(|t| t.0 > v.at));
            let mut mitigated = false;
            let what = match seen {
                Some(l) => {
                    let bad: Vec<&String> =
                        l.nodes.iter().filter(|n| v.exclude.contains(n)).collect();
                    if bad.is_empty() {
                        mitigated = true;
                        format!(
                            "verified: job {} runs again on {} without {}",
                            v.job,
                            if l.nodes.is_empty() {
                                "nodes its scheduler did not name".to_owned()
                            } else {
                                l.nodes.join(", ")
                            },
                            v.exclude.join(", ")
                        )
                    } else {
                        let bad = bad
                            .iter()
                            .map(|n| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ");
                        tracing::warn!(job = %v.job, nodes = %bad, "restarted job runs on isolated nodes");
                        format!(
                            "job {} runs again on isolated node(s) {bad}: the scheduler did \
                             not exclude them",
                            v.job
                        )
                    }
                }
                None if now.secs_since(Timestamp(v.at))
                    > self.config.restart_verify_window.as_secs_f64() =>
                {
                    format!(
                        "job {} not seen running again within {} of its restart",
                        v.job,
                        humantime::format_duration(self.config.restart_verify_window)
                    )
                }
                None => {
                    keep.push(v);
                    continue;
                }
            };
            changed = true;
            self.note(out, &v.incident, &what, false, now);
            if mitigated {
                // The job runs again without the bad nodes: the incident is over (the
                // nodes stay drained). Its fault, still seen on those nodes, is absorbed;
                // a new one reopens it.
                let resolved = self.engine.lock().resolve_incident(
                    &v.incident,
                    POLICY_ACTOR,
                    "mitigated: the job runs again without the isolated node(s)",
                    now,
                );
                if let Ok(c) = resolved
                    && !out.changes.contains(&c)
                {
                    out.changes.push(c);
                }
            }
        }
        s.verifying = keep;
        if changed {
            self.save(s, now).await?;
        }
        Ok(())
    }

    /// The nodes an isolating action takes out.
    fn nodes_for(&self, inc: &Incident, action: ActionName) -> Vec<NodeName> {
        let mut nodes: Vec<NodeName> = inc.nodes.clone();
        nodes.extend(inc.gpus.iter().map(|g| g.node.clone()));
        if action == ActionName::IsolateGroup
            && let Some(d) = &inc.diagnosis
        {
            // A diagnosis takes its culprits from log text, which a job's user (or a
            // model reading it) controls: of the nodes it names, only those the job
            // runs on may join the group.
            let of_job = inc
                .job
                .as_deref()
                .map(|j| self.engine.lock().job_nodes(j))
                .unwrap_or_default();
            nodes.extend(d.nodes.iter().filter(|n| of_job.contains(n)).cloned());
        }
        nodes.sort();
        nodes.dedup();
        nodes.retain(|n| crate::operate::check_node_name(n).is_ok());
        if action == ActionName::IsolateGroup {
            nodes.truncate(self.policy.max_group_nodes);
        }
        nodes
    }

    #[allow(clippy::too_many_arguments)]
    async fn act(
        &self,
        s: &mut RailsState,
        out: &mut PassReport,
        restarts: &mut Vec<PendingRestart>,
        inc: &Incident,
        rule: &str,
        actions: &[ActionName],
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        let dry = self.config.dry_run;
        let reason = format!("{rule}: {}", inc.summary);
        let mut isolated: Vec<NodeName> = Vec::new();
        let mut blocked = false;
        let p = if dry { "dry run: " } else { "" };
        for &action in actions {
            if action == ActionName::Notify {
                continue;
            }
            if let Some(t) = s.trip_of(dry) {
                let what = format!(
                    "{p}{} not done: the circuit breaker is tripped ({}); reset it through \
                     the API",
                    action.as_str(),
                    t.reason
                );
                self.note(out, &inc.id, &what, false, now);
                break;
            }
            if action.isolates() {
                for node in self.nodes_for(inc, action) {
                    if s.isolations_of(dry).iter().any(|i| i.node == node) {
                        isolated.push(node);
                        continue;
                    }
                    if let Some(&last) = s.last_isolated.get(&node)
                        && now.secs_since(Timestamp(last)) < self.config.node_cooldown.as_secs_f64()
                    {
                        let what = format!(
                            "{} {node} not done: the node is in its cooldown",
                            action.as_str()
                        );
                        self.note(out, &inc.id, &what, false, now);
                        continue;
                    }
                    if s.recent.len() >= self.config.max_actions_per_hour {
                        let what = format!(
                            "{} {node} not done: the rate limit ({} actions per hour) is reached",
                            action.as_str(),
                            self.config.max_actions_per_hour
                        );
                        self.note(out, &inc.id, &what, false, now);
                        blocked = true;
                        continue;
                    }
                    let cap = self.cap(self.known_nodes(now));
                    let counted = s.isolations_of(dry).len();
                    if counted + 1 > cap {
                        let why = format!(
                            "isolating {node} would make {} nodes isolated within {}, over \
                             the cap of {cap}",
                            counted + 1,
                            humantime::format_duration(self.config.breaker.window)
                        );
                        *s.trip_mut(dry) = Some(Trip {
                            at: now.0,
                            reason: why.clone(),
                            incident: inc.id.clone(),
                        });
                        self.save(s, now).await?;
                        self.record(
                            ActionKind::BreakerTrip,
                            "breaker",
                            Some(&inc.id),
                            POLICY_ACTOR,
                            &why,
                            dry,
                            "tripped: no more actions until a person resets it",
                            now,
                        )
                        .await?;
                        if dry {
                            tracing::warn!(incident = %inc.id, reason = %why, "a dry run would trip the remediation circuit breaker");
                        } else {
                            tracing::error!(incident = %inc.id, reason = %why, "remediation circuit breaker tripped");
                        }
                        self.note(
                            out,
                            &inc.id,
                            &format!("{p}circuit breaker tripped: {why}"),
                            false,
                            now,
                        );
                        out.tripped = !dry;
                        out.actions += 1;
                        blocked = true;
                        break;
                    }
                    s.isolations_mut(dry).push(Isolated {
                        node: node.clone(),
                        at: now.0,
                        incident: inc.id.clone(),
                    });
                    if !dry {
                        s.last_isolated.insert(node.clone(), now.0);
                        s.recent.push(now.0);
                    }
                    let record = new_action(
                        ActionKind::Isolate,
                        &node,
                        Some(&inc.id),
                        POLICY_ACTOR,
                        &reason,
                        dry,
                        now,
                    );
                    self.save_and_intend(s, &record, now).await?;
                    crate::operate::failpoint("isolate-intended").await;
                    let req = Isolation {
                        node: node.clone(),
                        incident: Some(inc.id.clone()),
                        reason: self.with_health(&node, &reason),
                        by: POLICY_ACTOR.to_owned(),
                        at: now,
                        evict: action != ActionName::Cordon,
                    };
                    let result = if dry {
                        format!("dry run: would {} {node}", action.as_str())
                    } else {
                        match self.actuator.isolate(&req).await {
                            Ok(Outcome::Applied) => {
                                self.store
                                    .put_node(&NodeRecord {
                                        name: node.clone(),
                                        state: "drained".into(),
                                        owner: POLICY_ACTOR.into(),
                                        reason: reason.clone(),
                                        incident: Some(inc.id.clone()),
                                        since: now,
                                        action: None,
                                    })
                                    .await?;
                                format!("{} {node}: done", action.as_str())
                            }
                            Ok(Outcome::AlreadyDone) => {
                                format!("{} {node}: already so", action.as_str())
                            }
                            Ok(Outcome::NotOurs { owner }) => {
                                format!("{} {node}: left alone, held by {owner}", action.as_str())
                            }
                            Err(e) => format!("{} {node} failed: {e}", action.as_str()),
                        }
                    };
                    crate::operate::failpoint("isolate-applied").await;
                    self.done(&record, &result, now).await?;
                    out.actions += 1;
                    isolated.push(node);
                    self.note(out, &inc.id, &result, !dry, now);
                }
                if blocked {
                    break;
                }
            } else if action == ActionName::RestartJob {
                let job = inc.job.as_deref().filter(|j| !j.is_empty());
                match restarts
                    .iter_mut()
                    .find(|r| job.is_some() && r.incident.job.as_deref() == job)
                {
                    Some(r) => {
                        r.isolated.extend(isolated.iter().cloned());
                        r.joined.push(inc.id.clone());
                    }
                    None => restarts.push(PendingRestart {
                        incident: inc.clone(),
                        reason: reason.clone(),
                        isolated: isolated.clone(),
                        joined: Vec::new(),
                    }),
                }
            }
        }
        Ok(())
    }

    async fn restart(
        &self,
        s: &mut RailsState,
        out: &mut PassReport,
        inc: &Incident,
        reason: &str,
        isolated: &[NodeName],
        now: Timestamp,
    ) -> Result<(), RemedyError> {
        let dry = self.config.dry_run;
        let Some(job) = inc.job.clone().filter(|j| !j.is_empty()) else {
            self.note(
                out,
                &inc.id,
                "restart_job not done: the incident names no job",
                false,
                now,
            );
            return Ok(());
        };
        if s.recent.len() >= self.config.max_actions_per_hour {
            let what = "restart_job not done: the rate limit is reached";
            self.note(out, &inc.id, what, false, now);
            return Ok(());
        }
        let mut resume = None;
        if let Some(template) = &self.config.checkpoint_dir {
            let dir = PathBuf::from(template.replace("{job}", &job));
            match checkpoint::scan(&dir, None) {
                Ok(scan) => {
                    for skipped in scan.skipped() {
                        self.note(out, &inc.id, &format!("checkpoint {skipped}"), false, now);
                    }
                    resume = scan.latest();
                }
                Err(e) => self.note(out, &inc.id, &format!("no checkpoint: {e}"), false, now),
            }
        }
        let last_step = self
            .engine
            .lock()
            .rank_progress(&job)
            .and_then(|ranks| ranks.iter().filter_map(|r| r.step).max());
        let lost = match (&resume, last_step) {
            (Some(r), Some(step)) => {
                format!("; {} steps of work lost", step.saturating_sub(r.step))
            }
            _ => String::new(),
        };
        let from = match &resume {
            Some(r) => format!("from {} (step {}, {})", r.path.display(), r.step, r.format),
            None => "from the job's own start (no complete checkpoint found)".to_owned(),
        };
        let mut exclude: Vec<NodeName> = s
            .isolations_of(dry)
            .iter()
            .map(|i| i.node.clone())
            .collect();
        exclude.extend(isolated.iter().cloned());
        // Every node the node-health ledger holds out (quarantined, verifying, bad),
        // and, after non-finite values, the nodes that first computed them: a rerun
        // must not land on the GPU that produced them.
        exclude.extend(self.engine.lock().ledger().held_out());
        if inc.kind == IncidentKind::Nan {
            exclude.extend(inc.nodes.iter().cloned());
            exclude.extend(inc.gpus.iter().map(|g| g.node.clone()));
        }
        exclude.sort();
        exclude.dedup();
        if !dry {
            s.recent.push(now.0);
        }
        let record = new_action(
            ActionKind::Restart,
            &job,
            Some(&inc.id),
            POLICY_ACTOR,
            reason,
            dry,
            now,
        );
        self.save_and_intend(s, &record, now).await?;
        let (namespace, name) = match job.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (self.config.kubernetes_namespace.clone(), job.clone()),
        };
        let req = Restart {
            job: if self.actuator.is_kubernetes() {
                name
            } else {
                job.clone()
            },
            namespace: self.actuator.is_kubernetes().then_some(namespace),
            exclude: exclude.clone(),
            resume,
            incident: Some(inc.id.clone()),
            at: now,
        };
        let result = if dry {
            format!(
                "dry run: would restart job {job} {from} without {}{lost}",
                exclude.join(", ")
            )
        } else {
            // Before the scheduler kills the run: its ranks' exits are not a crash.
            self.engine
                .lock()
                .restart_requested(&job, Some(self.clock.now()));
            let r = self.actuator.restart(&req).await;
            if !matches!(r, Ok(Outcome::Applied | Outcome::AlreadyDone)) {
                self.engine.lock().restart_requested(&job, None);
            }
            let issued = self.clock.now();
            if let Some(m) = &self.metrics {
                m.restart_latency
                    .observe(issued.secs_since(inc.detected_at).max(0.0));
            }
            tracing::info!(
                incident = %inc.id,
                job = %job,
                seconds_since_detection = issued.secs_since(inc.detected_at),
                "job restart requested"
            );
            if matches!(r, Ok(Outcome::Applied | Outcome::AlreadyDone)) {
                s.verifying.push(Verify {
                    incident: inc.id.clone(),
                    job: job.clone(),
                    exclude: exclude.clone(),
                    at: issued.0,
                });
                self.save(s, now).await?;
            }
            match r {
                Ok(Outcome::Applied | Outcome::AlreadyDone) => {
                    format!(
                        "restart of job {job} requested {from} without {}{lost}",
                        exclude.join(", ")
                    )
                }
                Ok(Outcome::NotOurs { owner }) => format!("restart of job {job} left to {owner}"),
                Err(e) => format!("restart of job {job} failed: {e}"),
            }
        };
        let finished = if dry { now } else { self.clock.now() };
        self.done(&record, &result, finished).await?;
        out.actions += 1;
        self.note(out, &inc.id, &result, !dry, now);
        Ok(())
    }
}
