//! Serialized views of incidents and ranks: what the HTTP API returns and what
//! `warden sim --report` writes. Times are seconds since the engine's origin (the run's
//! start in simulation, the Unix epoch in production).

use serde::{Deserialize, Serialize};

use crate::lifecycle::Phase;
use warden_model::{
    GpuRef, Incident, IncidentDiagnosis, IncidentKind, IncidentState, Severity, Timestamp,
};

/// An incident as the API and reports show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EvidenceView {
    /// Seconds since origin.
    pub at_s: f64,
    /// What was observed.
    pub text: String,
}

/// One timeline entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TimelineView {
    /// Seconds since origin.
    pub at_s: f64,
    /// What happened.
    pub what: String,
}

/// `t` in seconds since `origin`, to the millisecond.
pub(crate) fn rel(t: Timestamp, origin: Timestamp) -> f64 {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// Median transfer time relative to peers doing the same collectives (1.0 = typical).
    pub transfer_ratio: Option<f64>,
    /// Progress in each communicator.
    pub comms: Vec<CommProgressView>,
    /// When anything was last heard about this rank (seconds since origin).
    pub last_seen_s: Option<f64>,
}

/// A rank's progress in one communicator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
}

/// A node as `GET /api/v1/nodes` lists it: every node an agent reports from, and every
/// node Warden holds drained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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

impl NodeView {
    /// The view of a drained node.
    pub fn from_record(
        rec: &crate::store::NodeRecord,
        agent_silent_s: Option<f64>,
        origin: Timestamp,
    ) -> Self {
        NodeView {
            name: rec.name.clone(),
            state: rec.state.clone(),
            owner: Some(rec.owner.clone()),
            reason: Some(rec.reason.clone()),
            incident: rec.incident.clone(),
            drained_s: Some(rel(rec.since, origin)),
            agent_silent_s,
        }
    }

    /// Agents heard from (node, seconds silent) and drained nodes, merged by name.
    pub fn merge(
        agents: &[(String, f64)],
        drained: &[crate::store::NodeRecord],
        origin: Timestamp,
    ) -> Vec<NodeView> {
        let mut out: Vec<NodeView> = drained
            .iter()
            .map(|d| {
                let silent = agents.iter().find(|(n, _)| *n == d.name).map(|a| a.1);
                NodeView::from_record(d, silent.map(round_ms), origin)
            })
            .collect();
        for (name, silent) in agents {
            if !drained.iter().any(|d| d.name == *name) {
                out.push(NodeView {
                    name: name.clone(),
                    state: "ready".into(),
                    owner: None,
                    reason: None,
                    incident: None,
                    drained_s: None,
                    agent_silent_s: Some(round_ms(*silent)),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

fn round_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}
