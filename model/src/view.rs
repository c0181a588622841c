//! What the controller's HTTP API serves and the CLI reads: views of incidents, jobs,
//! ranks and nodes, the audit log's actions and where remediation stands; also what
//! `warden sim --report` writes. Times are seconds since the engine's origin (the run's
//! start in simulation, the Unix epoch in production).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{
    GpuRef, Incident, IncidentDiagnosis, IncidentKind, IncidentState, Severity, Timestamp,
};

/// An incident as the API and reports show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IncidentView {
    /// Stable identifier.
    pub id: String,
    /// Root-cause kind.
    pub kind: IncidentKind,
    /// Job concerned.
    pub job: Option<String>,
    /// Lifecycle state.
    pub state: IncidentState,
    /// Whether a person acknowledged it.
    pub acknowledged: bool,
    /// Severity.
    pub severity: Severity,
    /// Culprit ranks.
    pub ranks: Vec<u32>,
    /// Culprit nodes.
    pub nodes: Vec<String>,
    /// Culprit GPUs.
    pub gpus: Vec<GpuRef>,
    /// When the problem started (seconds since origin).
    pub onset_s: f64,
    /// When it was detected (seconds since origin).
    pub detected_s: f64,
    /// When it resolved (seconds since origin).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resolved_s: Option<f64>,
    /// Confidence in the culprit, 0..=1.
    pub confidence: f64,
    /// One sentence naming the culprit and the symptom.
    pub summary: String,
    /// Supporting observations.
    pub evidence: Vec<EvidenceView>,
    /// History.
    pub timeline: Vec<TimelineView>,
    /// What the logs say, once diagnosed (a recommendation only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub diagnosis: Option<IncidentDiagnosis>,
}

/// One piece of evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EvidenceView {
    /// Seconds since origin.
    pub at_s: f64,
    /// What was observed.
    pub text: String,
}

/// One timeline entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TimelineView {
    /// Seconds since origin.
    pub at_s: f64,
    /// What happened.
    pub what: String,
}

/// `t` in seconds since `origin`, to the millisecond.
pub fn rel(t: Timestamp, origin: Timestamp) -> f64 {
    // Millisecond precision is what people and scorers need.
    (t.secs_since(origin) * 1000.0).round() / 1000.0
}

impl IncidentView {
    /// The view of `inc` with times relative to `origin`.
    pub fn new(inc: &Incident, origin: Timestamp) -> Self {
        IncidentView {
            id: inc.id.clone(),
            kind: inc.kind,
            job: inc.job.clone(),
            state: inc.state,
            acknowledged: inc.acknowledged,
            severity: inc.severity,
            ranks: inc.ranks.clone(),
            nodes: inc.nodes.clone(),
            gpus: inc.gpus.clone(),
            onset_s: rel(inc.onset, origin),
            detected_s: rel(inc.detected_at, origin),
            resolved_s: inc.resolved_at.map(|t| rel(t, origin)),
            confidence: (inc.confidence * 1000.0).round() / 1000.0,
            summary: inc.summary.clone(),
            evidence: inc
                .evidence
                .iter()
                .map(|e| EvidenceView {
                    at_s: rel(e.at, origin),
                    text: e.text.clone(),
                })
                .collect(),
            timeline: inc
                .timeline
                .iter()
                .map(|e| TimelineView {
                    at_s: rel(e.at, origin),
                    what: e.what.clone(),
                })
                .collect(),
            diagnosis: inc.diagnosis.clone(),
        }
    }
}

/// Live progress of one rank (`GET /api/v1/jobs/{job}/ranks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankView {
    /// Global rank.
    pub rank: u32,
    /// Node it runs on, when known.
    pub node: Option<String>,
    /// GPU index on that node, when known.
    pub gpu: Option<u32>,
    /// Whether its process is alive (as last reported).
    pub alive: bool,
    /// Exit code or signal, when it exited.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exit: Option<String>,
    /// Last optimizer step reported.
    pub step: Option<u64>,
    /// Last loss reported.
    pub loss: Option<f64>,
    /// Last gradient norm reported.
    pub grad_norm: Option<f64>,
    /// Median compute time per iteration relative to the job's median (1.0 = typical).
    pub compute_ratio: Option<f64>,
    /// What its iterations are measured from: `steps` (the job's own step marks,
    /// `warden_torch.step()`) or `collectives` (no step marks: completions of its least
    /// frequent communicator, which is one iteration only when that communicator runs
    /// once a step).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub iterations: Option<String>,
    /// Median transfer time relative to peers doing the same collectives (1.0 = typical).
    pub transfer_ratio: Option<f64>,
    /// Progress in each communicator.
    pub comms: Vec<CommProgressView>,
    /// When anything was last heard about this rank (seconds since origin).
    pub last_seen_s: Option<f64>,
}

/// A rank's progress in one communicator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommProgressView {
    /// Communicator hash (hex).
    pub comm: String,
    /// Communicator name, when known.
    pub name: String,
    /// Last sequence number the rank entered.
    pub last_started_seq: u64,
    /// Last sequence number that completed on the rank.
    pub last_completed_seq: u64,
    /// Seconds the rank has been inside its current collective, if it is in one.
    pub in_flight_s: Option<f64>,
}

/// A job as `GET /api/v1/jobs` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    /// Job name.
    pub job: String,
    /// Ranks known.
    pub ranks: u32,
    /// Nodes known.
    pub nodes: u32,
    /// Communicators known.
    pub comms: u32,
    /// Ranks whose process exited.
    pub exited: u32,
    /// Highest step reported by any rank.
    pub step: Option<u64>,
    /// Median iteration time in seconds, when known.
    pub iteration_s: Option<f64>,
    /// Open incidents of this job.
    pub open_incidents: u32,
    /// The scheduler that reported the job's start or end (`slurm`, ...), if any.
    #[serde(default)]
    pub scheduler: Option<String>,
    /// The scheduler's id of the job.
    #[serde(default)]
    pub scheduler_job_id: Option<String>,
    /// The job's name as the scheduler has it.
    #[serde(default)]
    pub scheduler_job_name: Option<String>,
    /// `running` or `ended` as the scheduler said; `None` when no scheduler reported.
    #[serde(default)]
    pub phase: Option<Phase>,
    /// When the scheduler said it started (seconds since origin).
    #[serde(default)]
    pub started_s: Option<f64>,
    /// When the scheduler said it ended (seconds since origin).
    #[serde(default)]
    pub ended_s: Option<f64>,
    /// Nodes the scheduler allocated to it.
    #[serde(default)]
    pub expected_nodes: Vec<String>,
    /// Ranks (tasks) the scheduler says it runs.
    #[serde(default)]
    pub expected_ranks: Option<u32>,
    /// Times it started again after an end (a requeue).
    #[serde(default)]
    pub restarts: u32,
    /// The exit code its scheduler reported at its end (0 to 255); `None` while it
    /// runs, when a signal ended it, or when the scheduler did not say.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 255))]
    pub exit_code: Option<u8>,
    /// The signal that ended it (1 to 127), as its scheduler reported at its end.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 127))]
    pub signal: Option<u8>,
    /// The exit code of its worst step (Slurm's derived exit code, the highest of its
    /// steps'), when reported.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 255))]
    pub derived_exit_code: Option<u8>,
    /// The signal that ended its worst step, when reported.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 127))]
    pub derived_signal: Option<u8>,
}

/// A node as `GET /api/v1/nodes` lists it: every node an agent reports from, and every
/// node Warden holds drained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// `ready` or `drained`.
    pub state: String,
    /// Who owns the drain (a token's name, or `warden`), when drained.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub owner: Option<String>,
    /// Why it was drained.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// The incident behind the drain, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub incident: Option<String>,
    /// Drained since (seconds since origin).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub drained_s: Option<f64>,
    /// Seconds since its agent was last heard from; `None` when no agent reports.
    pub agent_silent_s: Option<f64>,
}

/// Where a job is in its scheduler's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Started and not ended.
    Running,
    /// Ended.
    Ended,
}

/// What an action is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Take a node out of scheduling (`POST /nodes/{name}/drain`).
    Drain,
    /// Give a drained node back.
    Undrain,
    /// A person acknowledged an incident.
    Acknowledge,
    /// A person resolved an incident.
    Resolve,
    /// Remediation isolated a node (cordon, drain).
    Isolate,
    /// Remediation restarted a job.
    Restart,
    /// The remediation circuit breaker tripped.
    BreakerTrip,
    /// A person reset the circuit breaker.
    BreakerReset,
    /// A quarantined node's health check ran (the node-health ledger).
    Verify,
}

impl ActionKind {
    /// The label stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            ActionKind::Drain => "drain",
            ActionKind::Undrain => "undrain",
            ActionKind::Acknowledge => "acknowledge",
            ActionKind::Resolve => "resolve",
            ActionKind::Isolate => "isolate",
            ActionKind::Restart => "restart",
            ActionKind::BreakerTrip => "breaker_trip",
            ActionKind::BreakerReset => "breaker_reset",
            ActionKind::Verify => "verify",
        }
    }
}

impl FromStr for ActionKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        [
            ActionKind::Drain,
            ActionKind::Undrain,
            ActionKind::Acknowledge,
            ActionKind::Resolve,
            ActionKind::Isolate,
            ActionKind::Restart,
            ActionKind::BreakerTrip,
            ActionKind::BreakerReset,
            ActionKind::Verify,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or(())
    }
}

/// Where an action stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ActionStatus {
    /// Recorded, not yet known to have run.
    Intended,
    /// Ran to the end.
    Done,
    /// Ran and failed.
    Failed,
}

impl ActionStatus {
    /// The label stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            ActionStatus::Intended => "intended",
            ActionStatus::Done => "done",
            ActionStatus::Failed => "failed",
        }
    }
}

impl FromStr for ActionStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "intended" => Ok(ActionStatus::Intended),
            "done" => Ok(ActionStatus::Done),
            "failed" => Ok(ActionStatus::Failed),
            _ => Err(()),
        }
    }
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActionRecord {
    /// Stable id.
    pub id: String,
    /// What.
    pub kind: ActionKind,
    /// On what: a node name or an incident id.
    pub target: String,
    /// The incident it serves, if any.
    pub incident: Option<String>,
    /// Who: a token's name, or `warden` for the policy.
    pub actor: String,
    /// Why, as given.
    pub reason: String,
    /// Whether it only pretended.
    pub dry_run: bool,
    /// Where it stands.
    pub status: ActionStatus,
    /// What came of it, once finished.
    pub result: Option<String>,
    /// When it was recorded as intended.
    pub intended_at: Timestamp,
    /// When it finished.
    pub finished_at: Option<Timestamp>,
}

/// What the API shows of remediation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RemedyStatus {
    /// Whether actions are only recorded.
    pub dry_run: bool,
    /// The actuator: `none`, `script`, `slurm` or `kubernetes`.
    pub actuator: String,
    /// Nodes isolated within the breaker's window.
    pub isolated_in_window: usize,
    /// How many the breaker allows per window now.
    pub breaker_cap: usize,
    /// Whether the breaker is tripped (no action until a person resets it).
    pub tripped: bool,
    /// Whether a dry run would have tripped it (reset it like a real trip).
    pub dry_run_tripped: bool,
    /// Why it tripped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tripped_reason: Option<String>,
    /// When it tripped (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tripped_at: Option<String>,
}

/// A node's health as the node-health ledger holds it
/// (`GET /api/v1/nodes/{name}/health`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeHealthView {
    /// Node name.
    pub node: String,
    /// `healthy`, `suspect`, `quarantined`, `verifying`, `returned` or `bad`.
    pub state: String,
    /// In this state since (seconds since origin).
    pub since_s: f64,
    /// Why it is in this state: its last change's reason (absent when it never changed).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// Whether no work may be placed on it (quarantined, verifying, bad).
    pub held_out: bool,
    /// Incidents ever held against it.
    pub incidents: u64,
    /// Mean time between the incidents held against it, hours (absent before the
    /// second).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mean_hours_between_incidents: Option<f64>,
    /// Jobs whose incidents touched it, most recent last.
    pub jobs: Vec<String>,
    /// Its state changes, oldest first.
    pub history: Vec<HealthChangeView>,
    /// The evidence it holds, oldest first.
    pub evidence: Vec<HealthEvidenceView>,
}

/// One change of a node's health state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthChangeView {
    /// When (seconds since origin).
    pub at_s: f64,
    /// The state before.
    pub from: String,
    /// The state after.
    pub to: String,
    /// Why.
    pub reason: String,
    /// The incidents behind it.
    pub incidents: Vec<String>,
}

/// One incident's evidence on a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthEvidenceView {
    /// The incident's onset (seconds since origin).
    pub at_s: f64,
    /// The incident.
    pub incident: String,
    /// Its kind.
    pub kind: IncidentKind,
    /// The job that ran there.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub job: Option<String>,
    /// What that job was doing: `starting`, `running`, `tearing_down` or `unknown`.
    pub phase: String,
    /// The GPU, when the incident names one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub gpu: Option<u32>,
    /// What it weighs against the node: `job` (the job's own doing), `hint`, `fault`,
    /// `hardware`, `nan` or `fatal`.
    pub weight: String,
    /// Occurrences it stands for.
    pub count: u32,
    /// Why it weighs what it does.
    pub why: String,
}

/// The fleet's health (`GET /api/v1/fleet/health`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetHealthView {
    /// Nodes the ledger holds anything on, per state (every state present).
    pub by_state: std::collections::BTreeMap<String, u64>,
    /// The nodes no work may be placed on, by name.
    pub held_out: Vec<String>,
    /// The nodes with the most incidents held against them, most first (at most 10).
    pub top_offenders: Vec<OffenderView>,
    /// Mean time between incidents held against any node of the fleet, hours (absent
    /// before the second).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mean_hours_between_incidents: Option<f64>,
}

/// A node with incidents held against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OffenderView {
    /// Node name.
    pub node: String,
    /// Its health state.
    pub state: String,
    /// Incidents ever held against it.
    pub incidents: u64,
    /// Distinct jobs whose incidents touched it.
    pub jobs: u64,
    /// Mean time between its incidents, hours.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mean_hours_between_incidents: Option<f64>,
}
