//! Remediation: what Warden does about an incident once policy says to act — isolate the
//! bad node (cordon, taint, drain in Kubernetes; drain in Slurm; a webhook or script
//! elsewhere), restart the job from its last complete checkpoint without it, and undo
//! its own isolations once a node is healthy again.
//!
//! This module holds what every actuator shares: the requests ([`Isolation`],
//! [`Release`], [`Restart`]), what came of them ([`Outcome`]) and how they fail
//! ([`ActuatorError`]). Every step is idempotent (isolating an isolated node is
//! [`Outcome::AlreadyDone`]), and no actuator ever touches a node another owner
//! isolated ([`Outcome::NotOurs`]).

pub mod checkpoint;
pub mod kubernetes;
pub mod policy;
pub mod run;
pub mod script;
pub mod slurm;
pub mod verify;

use std::path::PathBuf;

use warden_model::{JobId, NodeName, Timestamp};

/// The name Warden writes as the owner of what it does (annotations, Slurm reasons).
pub const OWNER: &str = "warden";

/// Take a node out of service.
#[derive(Debug, Clone, PartialEq)]
pub struct Isolation {
    /// The node.
    pub node: NodeName,
    /// The incident that called for it; `None` for a manual drain.
    pub incident: Option<String>,
    /// Why, in words (ends up on the node: annotation, Slurm reason).
    pub reason: String,
    /// Who asked: `policy`, or the API token's name for a manual drain.
    pub by: String,
    /// When.
    pub at: Timestamp,
    /// Also move the node's workload off it (Kubernetes eviction); a cordon alone
    /// only stops new work landing there.
    pub evict: bool,
}

/// Give a node back to service (only one Warden isolated).
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    /// The node.
    pub node: NodeName,
    /// Who asked: `auto-uncordon`, or the API token's name.
    pub by: String,
    /// When.
    pub at: Timestamp,
}

/// Where a restarted job resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The checkpoint's directory (or file, for the conventions that have one).
    pub path: PathBuf,
    /// The training step (iteration) it holds.
    pub step: u64,
    /// Its convention: `megatron`, `deepspeed`, `dcp`, `huggingface`.
    pub format: &'static str,
}

/// Restart a job without some nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Restart {
    /// The job, as its scheduler names it (Slurm job id, JobSet or PyTorchJob name).
    pub job: JobId,
    /// The Kubernetes namespace of the job; `None` under Slurm.
    pub namespace: Option<String>,
    /// Nodes the restarted job must not run on.
    pub exclude: Vec<NodeName>,
    /// The checkpoint it resumes from, when one was found.
    pub resume: Option<ResumePoint>,
    /// The incident that called for it.
    pub incident: Option<String>,
    /// When.
    pub at: Timestamp,
}

/// What came of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done now.
    Applied,
    /// It was already so (and Warden's doing); nothing changed.
    AlreadyDone,
    /// Another owner holds the node (cordoned by a person or another system);
    /// Warden left it alone.
    NotOurs {
        /// Who holds it, as far as can be told.
        owner: String,
    },
}

/// What a node's health check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// The node is fit to return: what the check said.
    Passed(String),
    /// The node is not: what the check said.
    Failed(String),
}

/// Why an actuator could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ActuatorError {
    /// The scheduler refused for now and may accept later (a PodDisruptionBudget, a
    /// conflict, a controller that is busy): retry after a while.
    #[error("{what} refused for now: {why}")]
    Retry {
        /// The step.
        what: String,
        /// The scheduler's answer.
        why: String,
    },
    /// No such node or job.
    #[error("{0} not found")]
    NotFound(String),
    /// The scheduler failed or could not be reached.
    #[error("{what} failed: {why}")]
    Failed {
        /// The step.
        what: String,
        /// What went wrong.
        why: String,
    },
}

/// Durations in configuration and policy, written like `90s`, `30m`, `1h`.
pub(crate) mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    fn parse<E: serde::de::Error>(s: &str) -> Result<Duration, E> {
        humantime::parse_duration(s)
            .map_err(|e| E::custom(format!("{s:?} is not a duration like 30m or 1h ({e})")))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse(&String::deserialize(d)?)
    }

    /// An optional duration.
    pub mod opt {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer};

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| super::parse(&s))
                .transpose()
        }
    }
}
