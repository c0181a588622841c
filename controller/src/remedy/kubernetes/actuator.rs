//! The Kubernetes actuator itself, on the kube client (feature `kubernetes`).

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Map, Value, json};

use super::*;
use crate::alerts::rfc3339;
use crate::remedy::{ActuatorError, Isolation, OWNER, Outcome, Release, Restart};

/// The annotations Warden writes on a node it isolates (and removes on release).
const NODE_ANNOTATIONS: [&str; 5] = [ANN_OWNER, ANN_REASON, ANN_INCIDENT, ANN_BY, ANN_AT];

/// Longest reason written to a node annotation, bytes (longer ones are cut).
const MAX_REASON_BYTES: usize = 1024;

/// The owner reported for a node cordoned without a `warden.io/owner` annotation.
const UNKNOWN_OWNER: &str = "unknown";

/// The annotation kubelet puts on mirror pods (the API's view of static pods).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Isolates, releases and restarts through the Kubernetes API.
#[derive(Clone)]
pub struct KubeActuator {
    client: kube::Client,
    config: KubeConfig,
}

impl std::fmt::Debug for KubeActuator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeActuator")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What to do with a node, decided from what it is now.
enum NodeStep {
    /// Nothing: it already is as asked.
    Done,
    /// Nothing: another owner holds it.
    NotOurs(String),
    /// Send this merge patch.
    Patch(Value),
}

/// A job kind with an object: where it lives and how its pods are labelled.
struct JobResource {
    resource: ApiResource,
    pod_label: &'static str,
}

impl JobResource {
    fn jobset() -> Self {
        JobResource {
            resource: ApiResource {
                group: "jobset.x-k8s.io".to_owned(),
                version: "v1alpha2".to_owned(),
                api_version: "jobset.x-k8s.io/v1alpha2".to_owned(),
                kind: "JobSet".to_owned(),
                plural: "jobsets".to_owned(),
            },
            pod_label: "jobset.sigs.k8s.io/jobset-name",
        }
    }

    fn pytorchjob() -> Self {
        JobResource {
            resource: ApiResource {
                group: "kubeflow.org".to_owned(),
                version: "v1".to_owned(),
                api_version: "kubeflow.org/v1".to_owned(),
                kind: "PyTorchJob".to_owned(),
                plural: "pytorchjobs".to_owned(),
            },
            pod_label: "training.kubeflow.org/job-name",
        }
    }
}

impl KubeActuator {
    /// An actuator that speaks to the cluster through `client`.
    pub fn new(client: kube::Client, config: KubeConfig) -> Self {
        KubeActuator { client, config }
    }

    /// Its settings.
    pub fn config(&self) -> &KubeConfig {
        &self.config
    }

    /// A handle on its client.
    pub(super) fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Cordon and taint `req.node` and write Warden's ownership annotations on it, then
    /// evict its pods when `req.evict`.
    ///
    /// A node already cordoned by another owner is [`Outcome::NotOurs`] and left as it
    /// is; one Warden already isolated is [`Outcome::AlreadyDone`] (its pods are still
    /// evicted when asked, and the answer is [`Outcome::Applied`] if any was).
    /// A PodDisruptionBudget that blocks an eviction answers [`ActuatorError::Retry`]
    /// with the node cordoned: evict again later.
    pub async fn isolate(&self, req: &Isolation) -> Result<Outcome, ActuatorError> {
        check_subdomain("node name", &req.node)?;
        let what = format!("isolating node {}", req.node);
        let mut outcome = self
            .change_node(&req.node, &what, |node| self.isolation_step(node, req))
            .await?;
        if matches!(outcome, Outcome::NotOurs { .. }) {
            return Ok(outcome);
        }
        if req.evict && self.evict_node(&req.node).await? > 0 {
            outcome = Outcome::Applied;
        }
        if outcome == Outcome::Applied {
            tracing::info!(node = %req.node, incident = ?req.incident, by = %req.by, evict = req.evict, "node isolated");
        }
        Ok(outcome)
    }

    /// Uncordon `req.node`, remove Warden's taint (other taints stay) and its
    /// annotations: only when Warden owns the node. One cordoned by another owner is
    /// [`Outcome::NotOurs`]; one neither cordoned nor Warden's is
    /// [`Outcome::AlreadyDone`].
    pub async fn release(&self, req: &Release) -> Result<Outcome, ActuatorError> {
        check_subdomain("node name", &req.node)?;
        let what = format!("releasing node {}", req.node);
        let outcome = self
            .change_node(&req.node, &what, |node| self.release_step(node))
            .await?;
        if outcome == Outcome::Applied {
            tracing::info!(node = %req.node, by = %req.by, "node released");
        }
        Ok(outcome)
    }

    /// Restart `req.job` in `req.namespace`: write the resume point on the job object
    /// ([`ANN_RESUME_FROM`], removed when there is none) and delete the job's pods so
    /// its operator recreates them; cordons and taints keep them off isolated nodes.
    pub async fn restart(&self, req: &Restart) -> Result<Outcome, ActuatorError> {
        let Some(ns) = req.namespace.as_deref() else {
            return Err(failed(
                format!("restarting job {}", req.job),
                "a Kubernetes job needs a namespace",
            ));
        };
        check_label("namespace", ns)?;
        check_label("job name", &req.job)?;
        for node in &req.exclude {
            check_subdomain("node name", node)?;
        }
        let what = format!("restarting job {ns}/{}", req.job);
        let kinds = match self.config.job_kind {
            JobKind::Auto => vec![JobResource::jobset(), JobResource::pytorchjob()],
            JobKind::JobSet => vec![JobResource::jobset()],
            JobKind::PyTorchJob => vec![JobResource::pytorchjob()],
            JobKind::Pods => {
                let selector = format!("{}={}", self.config.pod_label, req.job);
                let deleted = self.delete_pods(ns, &selector, &what).await?;
                if deleted == 0 {
                    return Err(ActuatorError::NotFound(format!(
                        "pods of job {ns}/{}",
                        req.job
                    )));
                }
                tracing::info!(namespace = ns, job = %req.job, pods = deleted, "job restarted");
                return Ok(Outcome::Applied);
            }
        };
        for kind in kinds {
            let jobs: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), ns, &kind.resource);
            match jobs.get(&req.job).await {
                Ok(_) => {}
                Err(e) if status_code(&e) == Some(404) => continue,
                Err(e) => return Err(api_error(&what, e)),
            }
            let resume = req
                .resume
                .as_ref()
                .map(|r| format!("{}@{}", r.path.to_string_lossy(), r.step));
            let patch = json!({"metadata": {"annotations": {
                ANN_RESUME_FROM: resume,
                ANN_RESTARTED_AT: rfc3339(req.at),
            }}});
            jobs.patch(&req.job, &patch_params(), &Patch::Merge(&patch))
                .await
                .map_err(|e| api_error(&what, e))?;
            let selector = format!("{}={}", kind.pod_label, req.job);
            let deleted = self.delete_pods(ns, &selector, &what).await?;
            tracing::info!(namespace = ns, job = %req.job, kind = %kind.resource.kind, pods = deleted, resume = ?resume, "job restarted");
            return Ok(Outcome::Applied);
        }
        Err(ActuatorError::NotFound(format!("job {ns}/{}", req.job)))
    }

    /// Read the node, decide with `step`, and patch; a 409 Conflict reads it again, up
    /// to [`KubeConfig::conflict_retries`] times.
    async fn change_node(
        &self,
        name: &str,
        what: &str,
        step: impl Fn(&Node) -> NodeStep,
    ) -> Result<Outcome, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut conflicts = 0;
        loop {
            let node = nodes.get(name).await.map_err(|e| match status_code(&e) {
                Some(404) => ActuatorError::NotFound(format!("node {name}")),
                _ => api_error(what, e),
            })?;
            let patch = match step(&node) {
                NodeStep::Done => return Ok(Outcome::AlreadyDone),
                NodeStep::NotOurs(owner) => return Ok(Outcome::NotOurs { owner }),
                NodeStep::Patch(patch) => patch,
            };
            match nodes
                .patch(name, &patch_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Outcome::Applied),
                Err(e) if status_code(&e) == Some(409) => {
                    conflicts += 1;
                    if conflicts > self.config.conflict_retries {
                        return Err(ActuatorError::Retry {
                            what: what.to_owned(),
                            why: format!("the node kept changing ({conflicts} conflicts)"),
                        });
                    }
                    tracing::debug!(
                        node = name,
                        conflicts,
                        "node changed under the patch; reading it again"
                    );
                }
                Err(e) if status_code(&e) == Some(404) => {
                    return Err(ActuatorError::NotFound(format!("node {name}")));
                }
                Err(e) => return Err(api_error(what, e)),
            }
        }
    }

    /// Whether `node` carries this actuator's taint.
    fn has_taint(&self, node: &Node) -> bool {
        taints(node).iter().any(|t| {
            t.key == self.config.taint_key && t.effect == self.config.taint_effect.as_str()
        })
    }

    fn isolation_step(&self, node: &Node, req: &Isolation) -> NodeStep {
        let cordoned = is_cordoned(node);
        let owner = owner_of(node);
        if cordoned && owner != Some(OWNER) {
            return NodeStep::NotOurs(owner.unwrap_or(UNKNOWN_OWNER).to_owned());
        }
        if cordoned && self.has_taint(node) {
            return NodeStep::Done;
        }
        let mut new_taints: Vec<Value> = other_taints(node, &self.config.taint_key);
        // The incident id when it is a valid taint value (Warden's always are).
        let value = match req.incident.as_deref() {
            None => MANUAL,
            Some(id) if is_label_value(id) => id,
            Some(_) => INCIDENT,
        };
        new_taints.push(json!({
            "key": self.config.taint_key,
            "value": value,
            "effect": self.config.taint_effect.as_str(),
        }));
        let mut annotations = Map::new();
        annotations.insert(ANN_OWNER.into(), OWNER.into());
        annotations.insert(ANN_REASON.into(), cut(&req.reason, MAX_REASON_BYTES).into());
        annotations.insert(
            ANN_INCIDENT.into(),
            req.incident.clone().map_or(Value::Null, Value::String),
        );
        annotations.insert(ANN_BY.into(), req.by.clone().into());
        annotations.insert(ANN_AT.into(), rfc3339(req.at).into());
        NodeStep::Patch(json!({
            "metadata": versioned_meta(node, annotations),
            "spec": {"unschedulable": true, "taints": new_taints},
        }))
    }

    fn release_step(&self, node: &Node) -> NodeStep {
        let owner = owner_of(node);
        if owner != Some(OWNER) {
            return if is_cordoned(node) {
                NodeStep::NotOurs(owner.unwrap_or(UNKNOWN_OWNER).to_owned())
            } else {
                NodeStep::Done
            };
        }
        let annotations: Map<String, Value> = NODE_ANNOTATIONS
            .iter()
            .map(|a| ((*a).to_owned(), Value::Null))
            .collect();
        NodeStep::Patch(json!({
            "metadata": versioned_meta(node, annotations),
            "spec": {
                "unschedulable": false,
                "taints": other_taints(node, &self.config.taint_key),
            },
        }))
    }

    /// Evict every pod on `node` that a drain moves (not DaemonSet pods, mirror pods or
    /// pods already terminating). Returns how many were evicted.
    async fn evict_node(&self, node: &str) -> Result<usize, ActuatorError> {
        let what = format!("evicting pods from node {node}");
        let all: Api<Pod> = Api::all(self.client.clone());
        let pods = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|e| api_error(&what, e))?;
        let mut evicted = 0;
        let mut blocked = Vec::new();
        let mut failures = Vec::new();
        for pod in &pods.items {
            if !drain_moves(pod) {
                continue;
            }
            let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
                continue;
            };
            match self.evict_pod(ns, name).await {
                Ok(true) => evicted += 1,
                Ok(false) => {}
                Err(ActuatorError::Retry { why, .. }) => {
                    blocked.push(format!("{ns}/{name}: {why}"))
                }
                Err(e) => failures.push(format!("{ns}/{name}: {e}")),
            }
        }
        if !failures.is_empty() {
            return Err(failed(what, failures.join("; ")));
        }
        if !blocked.is_empty() {
            return Err(ActuatorError::Retry {
                what,
                why: format!(
                    "{evicted} pod(s) evicted, {} left: {}",
                    blocked.len(),
                    blocked.join("; ")
                ),
            });
        }
        Ok(evicted)
    }

    /// Evict one pod: `Ok(true)` evicted, `Ok(false)` already gone, `Retry` when a
    /// PodDisruptionBudget refuses (429) or the pod kept changing (409).
    async fn evict_pod(&self, ns: &str, name: &str) -> Result<bool, ActuatorError> {
        let what = format!("evicting pod {ns}/{name}");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                ..ObjectMeta::default()
            },
            delete_options: self.config.eviction_grace_secs.map(|g| DeleteOptions {
                grace_period_seconds: Some(g),
                ..DeleteOptions::default()
            }),
        };
        let mut conflicts = 0;
        loop {
            let sent = pods
                .create_subresource::<_, Value>("eviction", name, &PostParams::default(), &eviction)
                .await;
            match sent {
                Ok(_) => return Ok(true),
                Err(e) => match status_code(&e) {
                    Some(404) => return Ok(false),
                    Some(429) => {
                        return Err(ActuatorError::Retry {
                            what,
                            why: message(&e),
                        });
                    }
                    Some(409) if conflicts < self.config.conflict_retries => conflicts += 1,
                    _ => return Err(api_error(&what, e)),
                },
            }
        }
    }

    /// Delete the pods in `ns` matching `selector` (not those already terminating);
    /// returns how many were deleted.
    async fn delete_pods(
        &self,
        ns: &str,
        selector: &str,
        what: &str,
    ) -> Result<usize, ActuatorError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| api_error(what, e))?;
        let mut deleted = 0;
        for pod in &list.items {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(name) = &pod.metadata.name else {
                continue;
            };
            match pods.delete(name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => return Err(api_error(what, e)),
            }
        }
        Ok(deleted)
    }
}

/// The patch options of every change: Warden as the field manager.
pub(super) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(OWNER.to_owned()),
        ..PatchParams::default()
    }
}

fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn owner_of(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_OWNER))
        .map(String::as_str)
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

/// The node's taints other than those with `key`, as JSON for a patch.
fn other_taints(node: &Node, key: &str) -> Vec<Value> {
    taints(node)
        .iter()
        .filter(|t| t.key != key)
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .filter(|v| !v.is_null())
        .collect()
}

/// Patch metadata: these annotations, and the node's resourceVersion as a precondition.
fn versioned_meta(node: &Node, annotations: Map<String, Value>) -> Value {
    let mut meta = Map::new();
    if let Some(rv) = &node.metadata.resource_version {
        meta.insert("resourceVersion".into(), rv.clone().into());
    }
    meta.insert("annotations".into(), Value::Object(annotations));
    Value::Object(meta)
}

/// Whether a drain moves this pod: not a DaemonSet's, not a mirror (static) pod, not
/// already terminating.
fn drain_moves(pod: &Pod) -> bool {
    let meta = &pod.metadata;
    let daemon = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
    !daemon && !mirror && meta.deletion_timestamp.is_none()
}

/// The HTTP status of an API error, if the server answered.
fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The server's message for an API error, or the error itself.
fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        _ => e.to_string(),
    }
}

/// An API error as an actuator error: conflicts, throttling and an unavailable
/// server are worth retrying; anything else failed.
pub(super) fn api_error(what: &str, e: kube::Error) -> ActuatorError {
    match status_code(&e) {
        Some(409 | 429 | 503 | 504) => ActuatorError::Retry {
            what: what.to_owned(),
            why: message(&e),
        },
        Some(404) => ActuatorError::NotFound(what.to_owned()),
        _ => failed(what.to_owned(), message(&e)),
    }
}

pub(super) fn failed(what: String, why: impl Into<String>) -> ActuatorError {
    ActuatorError::Failed {
        what,
        why: why.into(),
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(super) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// A DNS-1123 label: 1 to 63 of `a-z`, `0-9`, `-`, starting and ending alphanumeric.
fn is_dns_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            b.len() <= 63 && alnum(first) && alnum(last) && b.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A label (or taint) value: at most 63 of alphanumerics, `-`, `_`, `.`, starting and
/// ending alphanumeric.
fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            b.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn check_label(what: &str, s: &str) -> Result<(), ActuatorError> {
    if is_dns_label(s) {
        Ok(())
    } else {
        Err(failed(
            format!("checking {what} {s:?}"),
            "not a DNS-1123 label (1-63 of a-z, 0-9 and '-', alphanumeric at both ends)",
        ))
    }
}

pub(super) fn check_subdomain(what: &str, s: &str) -> Result<(), ActuatorError> {
    if is_dns_subdomain(s) {
        Ok(())
    } else {
        Err(failed(
            format!("checking {what} {s:?}"),
            "not a DNS-1123 subdomain (dot-separated labels of a-z, 0-9 and '-', at most 253)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_dns_1123() {
        assert!(is_dns_label("gpu-node-7"));
        assert!(!is_dns_label("Gpu"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("node-1.rack-2.example"));
        assert!(!is_dns_subdomain("node..x"));
        assert!(!is_dns_subdomain("node_1"));
        assert!(!is_dns_subdomain("../etc"));
        assert!(is_label_value("inc-0001709251199000-0001"));
        assert!(!is_label_value("a b"));
    }

    #[test]
    fn reasons_are_cut_on_character_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
    }

    #[test]
    fn config_defaults_and_unknown_fields() {
        let c: KubeConfig = warden_model::yaml::from_str("{}").expect("empty config");
        assert_eq!(c, KubeConfig::default());
        let c: KubeConfig =
            warden_model::yaml::from_str("taint_effect: NoExecute\njob_kind: pytorchjob\n")
                .expect("config");
        assert_eq!(c.taint_effect, TaintEffect::NoExecute);
        assert_eq!(c.job_kind, JobKind::PyTorchJob);
        assert!(warden_model::yaml::from_str::<KubeConfig>("taint: x").is_err());
    }
}
