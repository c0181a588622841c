//! The node-health ledger in Kubernetes terms (feature `kubernetes`): a quarantined
//! node's health check as a Job pinned to the node, and each ledger change as the node
//! condition `WardenHealthy` and an Event on the node, the convention of
//! node-problem-detector.
//!
//! The check Job runs in [`KubeConfig::check_namespace`] with `spec.nodeName` set (the
//! scheduler, and so the cordon, are bypassed), tolerating Warden's taint and the
//! cordon's, with `backoffLimit: 0` and the check's timeout as its deadline; it is
//! kept for an hour after it ends (`ttlSecondsAfterFinished`) for its logs.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;
use warden_model::Timestamp;

use super::actuator::{api_error, check_subdomain, cut, failed, patch_params};
use super::{KubeActuator, KubeConfig};
use crate::alerts::rfc3339;
use crate::remedy::{ActuatorError, CheckOutcome, OWNER};

/// The node condition Warden writes.
pub const CONDITION: &str = "WardenHealthy";

/// The label on every check Job and its pod.
const CHECK_LABEL: &str = "warden.io/check";

/// The annotation naming the node a check Job checks.
const ANN_CHECKS: &str = "warden.io/checks-node";

/// Longest condition or Event message, bytes.
const MAX_MESSAGE_BYTES: usize = 1024;

/// The check Job for `node`, in `namespace`, running `command` from `image`.
pub fn check_job(
    cfg: &KubeConfig,
    node: &str,
    image: &str,
    command: &[String],
    timeout: Duration,
) -> Job {
    let mut container = json!({
        "name": "check",
        "image": image,
        "command": command,
    });
    if cfg.check_gpus > 0 {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": cfg.check_gpus}});
    }
    let value = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "generateName": "warden-check-",
            "namespace": cfg.check_namespace,
            "labels": {CHECK_LABEL: "true", "app.kubernetes.io/managed-by": OWNER},
            "annotations": {ANN_CHECKS: node},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": timeout.as_secs().max(1),
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": {CHECK_LABEL: "true"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": node,
                    "tolerations": [
                        {"key": cfg.taint_key, "operator": "Exists"},
                        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [container],
                },
            },
        },
    });
    // The shape is fixed above; a failure here is a bug in this function.
    serde_json::from_value(value).unwrap_or_default()
}

/// What a finished check Job says: `Some(passed, detail)`, or `None` while it runs.
pub fn job_verdict(job: &Job) -> Option<(bool, String)> {
    let status = job.status.as_ref()?;
    let name = job.metadata.name.as_deref().unwrap_or("?");
    if status.succeeded.unwrap_or(0) > 0 {
        return Some((true, format!("check job {name} succeeded")));
    }
    if status.failed.unwrap_or(0) > 0 {
        let why = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .map(|c| {
                let reason = c.reason.clone().unwrap_or_default();
                match c.message.as_deref() {
                    Some(m) if !m.is_empty() => format!(": {reason}: {m}"),
                    _ if !reason.is_empty() => format!(": {reason}"),
                    _ => String::new(),
                }
            })
            .unwrap_or_default();
        return Some((false, format!("check job {name} failed{why}")));
    }
    None
}

impl KubeActuator {
    /// Run the check Job on `node` and wait (polling every
    /// [`KubeConfig::check_poll_secs`]) for its verdict, at most `timeout` and a minute
    /// more; a Job with no verdict by then is deleted and the answer is
    /// [`ActuatorError::Retry`].
    pub async fn verify(
        &self,
        node: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<CheckOutcome, ActuatorError> {
        check_subdomain("node name", node)?;
        let cfg = self.config();
        let what = format!("health check of {node}");
        let image = cfg
            .check_image
            .clone()
            .ok_or_else(|| failed(what.clone(), "no kubernetes.check_image is configured"))?;
        let jobs: Api<Job> = Api::namespaced(self.client(), &cfg.check_namespace);
        let created = jobs
            .create(
                &PostParams::default(),
                &check_job(cfg, node, &image, command, timeout),
            )
            .await
            .map_err(|e| api_error(&what, e))?;
        let name = created.metadata.name.clone().unwrap_or_default();
        tracing::info!(%node, job = %name, "kubernetes: health check job created");
        let poll = Duration::from_secs(cfg.check_poll_secs.max(1));
        let deadline = tokio::time::Instant::now() + timeout + Duration::from_secs(60);
        loop {
            tokio::time::sleep(poll).await;
            let job = jobs.get(&name).await.map_err(|e| api_error(&what, e))?;
            if let Some((passed, detail)) = job_verdict(&job) {
                let detail = format!("{detail} on {node}");
                return Ok(if passed {
                    CheckOutcome::Passed(detail)
                } else {
                    CheckOutcome::Failed(detail)
                });
            }
            if tokio::time::Instant::now() >= deadline {
                let dp = DeleteParams::background();
                if let Err(e) = jobs.delete(&name, &dp).await {
                    tracing::warn!(job = %name, error = %e, "kubernetes: the check job stays");
                }
                return Err(ActuatorError::Retry {
                    what,
                    why: format!("check job {name} gave no verdict within {timeout:?}"),
                });
            }
        }
    }

    /// Write a ledger change on the node: the `WardenHealthy` condition (`False` while
    /// the ledger holds the node out, with the state as its reason) and an Event.
    pub async fn node_health(
        &self,
        node: &str,
        state: &str,
        held_out: bool,
        message: &str,
        at: Timestamp,
    ) -> Result<(), ActuatorError> {
        check_subdomain("node name", node)?;
        let what = format!("writing the health of node {node}");
        let reason = camel(state);
        let message = cut(message, MAX_MESSAGE_BYTES);
        // Kubernetes times are whole seconds.
        let when = rfc3339(at);
        let when = match when.split_once('.') {
            Some((secs, _)) => format!("{secs}Z"),
            None => when,
        };
        let status = json!({
            "status": {"conditions": [{
                "type": CONDITION,
                "status": if held_out { "False" } else { "True" },
                "reason": reason,
                "message": message,
                "lastTransitionTime": when,
                "lastHeartbeatTime": when,
            }]}
        });
        let nodes: Api<Node> = Api::all(self.client());
        nodes
            .patch_status(node, &patch_params(), &Patch::Strategic(&status))
            .await
            .map_err(|e| api_error(&what, e))?;
        let event: Event = serde_json::from_value(json!({
            "metadata": {"generateName": format!("{node}."), "namespace": "default"},
            "involvedObject": {"kind": "Node", "apiVersion": "v1", "name": node},
            "reason": format!("Warden{reason}"),
            "message": message,
            "type": if held_out { "Warning" } else { "Normal" },
            "source": {"component": OWNER},
            "reportingComponent": OWNER,
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        }))
        .unwrap_or_default();
        let events: Api<Event> = Api::namespaced(self.client(), "default");
        events
            .create(&PostParams::default(), &event)
            .await
            .map_err(|e| api_error(&what, e))?;
        Ok(())
    }
}

/// `quarantined` → `Quarantined`.
fn camel(state: &str) -> String {
    let mut c = state.chars();
    match c.next() {
        Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
        None => String::new(),
    }
}
