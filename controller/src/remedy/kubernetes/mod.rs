//! The Kubernetes actuator: cordon, taint, annotate, evict and restart through the API server.
//!
//! Every node Warden isolates carries its ownership in annotations ([`ANN_OWNER`] and
//! the others below) next to the cordon (`spec.unschedulable`) and one taint
//! ([`KubeConfig::taint_key`]). Ownership decides everything: a node cordoned by anyone
//! else is [`Outcome::NotOurs`] and never touched, and only a node Warden owns is ever
//! released. Node changes are single merge patches that carry the node's
//! `metadata.resourceVersion`, so a concurrent change answers 409 Conflict; the node is
//! then read again and the patch recomputed, a bounded number of times.
//!
//! Evictions go through the Eviction API (`policy/v1`), so PodDisruptionBudgets are
//! honoured: a pod a budget protects is left where it is and the call answers
//! [`ActuatorError::Retry`]; the node stays cordoned and the caller evicts again later.
//!
//! A restart deletes the job's pods so its operator (JobSet, Kubeflow training operator)
//! recreates them, and the cordon and taint keep the new ones off isolated nodes. The
//! checkpoint to resume from is written on the job object as [`ANN_RESUME_FROM`].

use serde::Deserialize;

#[cfg(feature = "kubernetes")]
mod actuator;
#[cfg(feature = "kubernetes")]
pub use actuator::KubeActuator;
#[cfg(feature = "kubernetes")]
pub mod health;

/// Who holds an isolated node: [`OWNER`] when Warden does.
pub const ANN_OWNER: &str = "warden.io/owner";
/// Why the node was isolated, in words.
pub const ANN_REASON: &str = "warden.io/reason";
/// The incident that called for the isolation (absent for a manual drain).
pub const ANN_INCIDENT: &str = "warden.io/incident";
/// Who asked for the isolation: `policy`, or the API token's name.
pub const ANN_BY: &str = "warden.io/by";
/// When the node was isolated (RFC 3339, UTC).
pub const ANN_AT: &str = "warden.io/at";
/// On a restarted job: the checkpoint it resumes from, `<path>@<step>`.
pub const ANN_RESUME_FROM: &str = "warden.io/resume-from";
/// On a restarted job: when Warden restarted it (RFC 3339, UTC).
pub const ANN_RESTARTED_AT: &str = "warden.io/restarted-at";

/// The taint value of a manual drain (one with no incident).
pub const MANUAL: &str = "manual";

/// The taint value of an isolation whose incident id is not a valid taint value.
pub const INCIDENT: &str = "incident";

/// The effect of the isolation taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum TaintEffect {
    /// New pods without a toleration are not scheduled on the node (the default).
    #[default]
    NoSchedule,
    /// The scheduler avoids the node when it can.
    PreferNoSchedule,
    /// Also evicts running pods without a toleration, by the taint manager rather than
    /// the Eviction API, so PodDisruptionBudgets are not consulted.
    NoExecute,
}

impl TaintEffect {
    /// The name the API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// Which kind of object a job to restart is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// A JobSet if one has the name, else a PyTorchJob (the default).
    #[default]
    Auto,
    /// A JobSet (`jobset.x-k8s.io/v1alpha2`).
    JobSet,
    /// A Kubeflow PyTorchJob (`kubeflow.org/v1`).
    PyTorchJob,
    /// Plain pods labelled [`KubeConfig::pod_label`]`=<job>`, recreated by whatever
    /// owns them; there is no job object to carry the resume annotation.
    Pods,
}

/// Settings of the Kubernetes actuator (the `kubernetes` section of remediation).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    /// Key of the taint put on isolated nodes. Default `warden.io/fault`.
    pub taint_key: String,
    /// Effect of that taint. Default `NoSchedule`.
    pub taint_effect: TaintEffect,
    /// Grace period given to evicted pods, seconds. Default none: each pod's own
    /// `terminationGracePeriodSeconds`.
    pub eviction_grace_secs: Option<i64>,
    /// How many times a change that met a 409 Conflict is read again and retried
    /// before the call answers [`ActuatorError::Retry`]. Default 3.
    pub conflict_retries: u32,
    /// Which kind of object a job is. Default `auto` (JobSet, then PyTorchJob).
    pub job_kind: JobKind,
    /// For `job_kind: pods`, the label naming a pod's job. Default
    /// `batch.kubernetes.io/job-name`.
    pub pod_label: String,
    /// The image of a quarantined node's health check Job (it runs
    /// `remediation.verify.command`), e.g. `nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04`.
    pub check_image: Option<String>,
    /// The namespace check Jobs run in (the controller's). Default `warden`.
    pub check_namespace: String,
    /// GPUs the check's pod asks for (`nvidia.com/gpu`); 0 asks for none. Default 0.
    pub check_gpus: u32,
    /// How often a running check Job is read, seconds. Default 10.
    pub check_poll_secs: u64,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            taint_key: "warden.io/fault".to_owned(),
            taint_effect: TaintEffect::NoSchedule,
            eviction_grace_secs: None,
            conflict_retries: 3,
            job_kind: JobKind::Auto,
            pod_label: "batch.kubernetes.io/job-name".to_owned(),
            check_image: None,
            check_namespace: "warden".to_owned(),
            check_gpus: 0,
            check_poll_secs: 10,
        }
    }
}
