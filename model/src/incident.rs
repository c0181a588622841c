//! Findings (a detector's verdict) and incidents (grouped, deduplicated findings with a
//! lifecycle and a timeline), shaped so a store can persist them as they are.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::{GpuRef, JobId, NodeName, Rank};
use crate::time::Timestamp;

/// What went wrong.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentKind {
    /// A collective stopped making progress; culprit: the ranks everyone waits for.
    Hang,
    /// A rank's process exited abnormally; culprit: the first to exit.
    Crash,
    /// A rank or node is persistently slower than its peers.
    Straggler,
    /// Collectives that cross a node's network link are slow although arrivals are even.
    SlowLink,
    /// Loss or gradient norm became NaN/Inf; culprit: the first rank to show it.
    Nan,
    /// A GPU reported a hardware fault (XID, ECC, NVLink, PCIe, fell off the bus).
    GpuFault,
}

impl IncidentKind {
    /// Every kind, in a stable order.
    pub const ALL: [IncidentKind; 6] = [
        IncidentKind::Hang,
        IncidentKind::Crash,
        IncidentKind::Straggler,
        IncidentKind::SlowLink,
        IncidentKind::Nan,
        IncidentKind::GpuFault,
    ];

    /// The label used in the API, metrics and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            IncidentKind::Hang => "hang",
            IncidentKind::Crash => "crash",
            IncidentKind::Straggler => "straggler",
            IncidentKind::SlowLink => "slow_link",
            IncidentKind::Nan => "nan",
            IncidentKind::GpuFault => "gpu_fault",
        }
    }

    /// Whether this kind stops the job's progress (as opposed to degrading it).
    pub const fn stops_job(self) -> bool {
        matches!(self, IncidentKind::Hang | IncidentKind::Crash)
    }
}

impl fmt::Display for IncidentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown incident-kind label.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "unknown incident kind {0:?} (expected one of hang, crash, straggler, slow_link, nan, gpu_fault)"
)]
pub struct UnknownKind(pub String);

impl FromStr for IncidentKind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IncidentKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

/// How bad it is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; no action.
    #[default]
    Info,
    /// Degraded: the job runs, slower or at risk.
    Warning,
    /// Broken: the job cannot make progress or the hardware needs attention.
    Critical,
}

impl Severity {
    /// The label used in the API and alerts.
    pub const fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One piece of evidence, in plain words, with the time it refers to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// When the evidence was observed (controller clock).
    pub at: Timestamp,
    /// What was observed.
    pub text: String,
}

/// A detector's verdict: something is wrong, here is who and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// What kind of problem.
    pub kind: IncidentKind,
    /// The job it concerns; `None` for a node fault on a node running no known job.
    pub job: Option<JobId>,
    /// Culprit ranks (sorted, deduplicated).
    pub ranks: Vec<Rank>,
    /// Culprit nodes (sorted, deduplicated).
    pub nodes: Vec<NodeName>,
    /// Culprit GPUs (sorted, deduplicated).
    pub gpus: Vec<GpuRef>,
    /// When the problem started, as best the detector can tell (controller clock).
    pub onset: Timestamp,
    /// How sure the detector is, 0..=1.
    pub confidence: f64,
    /// How bad it is.
    pub severity: Severity,
    /// One sentence naming the culprit and the symptom.
    pub summary: String,
    /// Supporting observations, most telling first.
    pub evidence: Vec<Evidence>,
}

impl Finding {
    /// Sort and deduplicate the culprit lists, so findings compare and group stably.
    pub fn normalize(mut self) -> Self {
        self.ranks.sort_unstable();
        self.ranks.dedup();
        self.nodes.sort();
        self.nodes.dedup();
        self.gpus.sort();
        self.gpus.dedup();
        self.confidence = self.confidence.clamp(0.0, 1.0);
        self
    }
}

/// Where an incident is in its life.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentState {
    /// Found; nobody has explained or acted on it yet.
    Open,
    /// A diagnosis is attached.
    Diagnosed,
    /// Remediation is under way.
    Mitigating,
    /// Over: the condition cleared, it was mitigated, or a person resolved it.
    Resolved,
}

impl IncidentState {
    /// The label used in the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            IncidentState::Open => "open",
            IncidentState::Diagnosed => "diagnosed",
            IncidentState::Mitigating => "mitigating",
            IncidentState::Resolved => "resolved",
        }
    }

    /// Whether `self -> next` is a legal step of the lifecycle
    /// (open → diagnosed → mitigating → resolved; any live state may resolve).
    pub fn can_become(self, next: IncidentState) -> bool {
        use IncidentState::*;
        matches!(
            (self, next),
            (Open, Diagnosed)
                | (Open, Mitigating)
                | (Diagnosed, Mitigating)
                | (Open | Diagnosed | Mitigating, Resolved)
        )
    }
}

/// One line of an incident's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// When it happened (controller clock).
    pub at: Timestamp,
    /// What happened, in plain words.
    pub what: String,
}

/// Grouped, deduplicated findings about one root cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// Stable identifier.
    pub id: String,
    /// The root cause's kind (a hang caused by a GPU fault is a `gpu_fault`).
    pub kind: IncidentKind,
    /// The job concerned, if any.
    pub job: Option<JobId>,
    /// Lifecycle state.
    pub state: IncidentState,
    /// Whether a person has acknowledged it.
    pub acknowledged: bool,
    /// Highest severity of its findings.
    pub severity: Severity,
    /// Culprit ranks.
    pub ranks: Vec<Rank>,
    /// Culprit nodes.
    pub nodes: Vec<NodeName>,
    /// Culprit GPUs.
    pub gpus: Vec<GpuRef>,
    /// When the problem started.
    pub onset: Timestamp,
    /// When it was first detected.
    pub detected_at: Timestamp,
    /// When anything about it last changed.
    pub updated_at: Timestamp,
    /// When it resolved, if it has.
    pub resolved_at: Option<Timestamp>,
    /// Confidence of the root-cause finding.
    pub confidence: f64,
    /// One sentence naming the culprit and the symptom.
    pub summary: String,
    /// Supporting observations (bounded; most telling first).
    pub evidence: Vec<Evidence>,
    /// Findings merged into this incident, by kind, including the root cause's own.
    pub finding_count: u32,
    /// History, oldest first.
    pub timeline: Vec<TimelineEntry>,
    /// What the logs say about it, once diagnosed (a recommendation: actions come from
    /// policy, never from a diagnosis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<IncidentDiagnosis>,
}

/// The log diagnosis attached to an incident: category and fault locus (the labels of
/// the diagnosis crate, kept as strings here so the model depends on nothing), culprit,
/// confidence, the evidence lines and an explanation citing them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct IncidentDiagnosis {
    /// Failure category, e.g. `gpu_hardware_xid`; `None` when the logs do not say.
    pub category: Option<String>,
    /// Who has to fix it: hardware, network, software-framework, user-code,
    /// infrastructure.
    pub fault_locus: Option<String>,
    /// Culprit ranks the logs name.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<u32>))]
    pub ranks: Vec<Rank>,
    /// Culprit nodes (or addresses) the logs name.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub nodes: Vec<NodeName>,
    /// Culprit GPUs as the logs name them (index, PCI bus id or UUID).
    pub gpus: Vec<String>,
    /// The culprit in words.
    pub culprit: String,
    /// 0..=1.
    pub confidence: f64,
    /// Rules whose matches support it.
    pub rule_ids: Vec<String>,
    /// The lines that show it, most telling first.
    pub evidence: Vec<DiagnosisEvidence>,
    /// The answer in words, citing evidence line ids.
    pub explanation: String,
    /// `rules`, or `llm:<model>` when a language model refined it.
    pub source: String,
    /// Lines read to reach it, and from how many nodes.
    pub lines_read: u64,
    /// Nodes whose logs were read.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub nodes_read: Vec<NodeName>,
}

/// One line cited by a diagnosis.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagnosisEvidence {
    /// The line's number in the diagnosed input, from 1 (cited by the explanation).
    pub id: u64,
    /// Node it came from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub node: Option<NodeName>,
    /// Rank that printed it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>))]
    pub rank: Option<Rank>,
    /// The line.
    pub text: String,
    /// Why it was chosen.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_labels_round_trip() {
        for k in IncidentKind::ALL {
            assert_eq!(k.as_str().parse::<IncidentKind>().ok(), Some(k));
            assert_eq!(
                serde_json::to_string(&k).ok(),
                Some(format!("\"{}\"", k.as_str()))
            );
        }
        assert!("meltdown".parse::<IncidentKind>().is_err());
    }

    #[test]
    fn lifecycle_only_moves_forward() {
        use IncidentState::*;
        assert!(Open.can_become(Diagnosed));
        assert!(Diagnosed.can_become(Mitigating));
        assert!(Mitigating.can_become(Resolved));
        assert!(Open.can_become(Resolved));
        assert!(!Resolved.can_become(Open));
        assert!(!Mitigating.can_become(Diagnosed));
        assert!(!Resolved.can_become(Resolved));
    }

    #[test]
    fn normalize_sorts_and_dedups_culprits() {
        let f = Finding {
            kind: IncidentKind::Hang,
            job: None,
            ranks: vec![5, 1, 5],
            nodes: vec!["b".into(), "a".into(), "b".into()],
            gpus: vec![],
            onset: Timestamp::ZERO,
            confidence: 1.7,
            severity: Severity::Critical,
            summary: String::new(),
            evidence: vec![],
        }
        .normalize();
        assert_eq!(f.ranks, vec![1, 5]);
        assert_eq!(f.nodes, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(f.confidence, 1.0);
    }
}
