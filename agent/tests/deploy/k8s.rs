//! Strict typing of Kubernetes objects: each one is deserialized into its k8s-openapi
//! type (or, for the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, into
//! our own structs that deny unknown fields), serialized back and compared with the
//! input, because k8s-openapi's types ignore fields they do not know: a misspelled or
//! misplaced field shows up as a difference.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An object from a manifest: where it came from and its content.
#[derive(Debug, Clone)]
pub struct Obj {
    /// File (and document) it came from.
    pub origin: String,
    /// Its content.
    pub value: Value,
}

impl Obj {
    fn str_at(&self, ptr: &str) -> &str {
        self.value
            .pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// `kind`.
    pub fn kind(&self) -> &str {
        self.str_at("/kind")
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.str_at("/metadata/name")
    }

    /// `Kind/namespace/name`.
    pub fn id(&self) -> String {
        format!(
            "{}/{}/{}",
            self.kind(),
            self.str_at("/metadata/namespace"),
            self.name()
        )
    }
}

/// The objects Warden's manifests may contain, typed.
#[derive(Debug, Clone)]
pub enum Typed {
    Namespace(Box<Namespace>),
    ServiceAccount(Box<ServiceAccount>),
    ConfigMap(Box<ConfigMap>),
    Service(Box<Service>),
    DaemonSet(Box<DaemonSet>),
    Deployment(Box<Deployment>),
    PodDisruptionBudget(Box<PodDisruptionBudget>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    Role(Box<Role>),
    RoleBinding(Box<RoleBinding>),
    NetworkPolicy(Box<NetworkPolicy>),
    ServiceMonitor(Box<ServiceMonitor>),
    PrometheusRule(Box<PrometheusRule>),
}

impl Typed {
    /// The pod spec of a workload.
    pub fn pod_spec(&self) -> Option<&PodSpec> {
        match self {
            Typed::DaemonSet(d) => d.spec.as_ref()?.template.spec.as_ref(),
            Typed::Deployment(d) => d.spec.as_ref()?.template.spec.as_ref(),
            _ => None,
        }
    }

    /// The pod template's labels of a workload.
    pub fn pod_labels(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            Typed::DaemonSet(d) => d.spec.as_ref()?.template.metadata.as_ref()?.labels.as_ref(),
            Typed::Deployment(d) => d.spec.as_ref()?.template.metadata.as_ref()?.labels.as_ref(),
            _ => None,
        }
    }
}

/// `monitoring.coreos.com/v1` ServiceMonitor: the fields Warden uses, nothing else.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

/// Its `spec`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    pub selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_label: Option<String>,
    pub endpoints: Vec<Endpoint>,
}

/// One scrape endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub port: String,
    pub path: String,
    pub interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relabelings: Vec<Relabel>,
}

/// A relabeling rule (Prometheus `relabel_config`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Relabel {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_labels: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// `monitoring.coreos.com/v1` PrometheusRule: the fields Warden uses, nothing else.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PrometheusRuleSpec,
}

/// Its `spec`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusRuleSpec {
    pub groups: Vec<RuleGroup>,
}

/// A rule group, as in a Prometheus rule file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleGroup {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    pub rules: Vec<Rule>,
}

/// An alerting or recording rule.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    pub expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Every path where `a` and `b` differ.
pub fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let p = format!("{path}.{k}");
                match y.get(k) {
                    Some(w) => diff(v, w, &p, out),
                    None => out.push(format!(
                        "{p}: only in the input (unknown or misplaced field)"
                    )),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!("{path}.{k}: only after the round trip"));
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("{path}: {a} became {b}")),
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<T, String> {
    let typed: T = serde_path_to_error::deserialize(v.clone())
        .map_err(|e| format!("at {}: {}", e.path(), e.inner()))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut d = Vec::new();
    diff(v, &back, "", &mut d);
    if d.is_empty() {
        Ok(typed)
    } else {
        Err(d.join("; "))
    }
}

/// Type `obj` strictly, or say what is wrong with it.
pub fn strict(obj: &Obj) -> Result<Typed, String> {
    let v = &obj.value;
    let api = obj.str_at("/apiVersion");
    Ok(match (api, obj.kind()) {
        ("v1", "Namespace") => Typed::Namespace(round_trip(v)?),
        ("v1", "ServiceAccount") => Typed::ServiceAccount(round_trip(v)?),
        ("v1", "ConfigMap") => Typed::ConfigMap(round_trip(v)?),
        ("v1", "Service") => Typed::Service(round_trip(v)?),
        ("apps/v1", "DaemonSet") => Typed::DaemonSet(round_trip(v)?),
        ("apps/v1", "Deployment") => Typed::Deployment(round_trip(v)?),
        ("policy/v1", "PodDisruptionBudget") => Typed::PodDisruptionBudget(round_trip(v)?),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => Typed::ClusterRole(round_trip(v)?),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            Typed::ClusterRoleBinding(round_trip(v)?)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => Typed::Role(round_trip(v)?),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => Typed::RoleBinding(round_trip(v)?),
        ("networking.k8s.io/v1", "NetworkPolicy") => Typed::NetworkPolicy(round_trip(v)?),
        ("monitoring.coreos.com/v1", "ServiceMonitor") => {
            let sm: Box<ServiceMonitor> = round_trip(v)?;
            check_service_monitor(&sm)?;
            Typed::ServiceMonitor(sm)
        }
        ("monitoring.coreos.com/v1", "PrometheusRule") => {
            let pr: Box<PrometheusRule> = round_trip(v)?;
            check_prometheus_rule(&pr)?;
            Typed::PrometheusRule(pr)
        }
        (api, kind) => return Err(format!("{api} {kind} is not a kind the manifests may hold")),
    })
}

/// A Prometheus duration (`15s`, `1h30m`), as the CRDs' schemas accept it.
fn duration(s: &str) -> bool {
    let mut rest = s;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
        parts += 1;
    }
    parts > 0
}

/// What the CRD's schema would refuse among the fields we model.
fn check_service_monitor(sm: &ServiceMonitor) -> Result<(), String> {
    for e in &sm.spec.endpoints {
        for d in std::iter::once(&e.interval).chain(e.scrape_timeout.as_ref()) {
            if !duration(d) {
                return Err(format!("{d:?} is not a Prometheus duration"));
            }
        }
        if !e.path.starts_with('/') {
            return Err(format!("path {:?} must start with /", e.path));
        }
        for r in &e.relabelings {
            let action = r.action.as_deref().unwrap_or("replace");
            let known = [
                "replace",
                "keep",
                "drop",
                "hashmod",
                "labelmap",
                "labeldrop",
                "labelkeep",
                "lowercase",
                "uppercase",
                "keepequal",
                "dropequal",
            ];
            if !known.contains(&action) {
                return Err(format!("relabel action {action:?} is unknown"));
            }
            if action == "replace" && r.target_label.is_none() {
                return Err("a replace relabeling needs targetLabel".into());
            }
        }
    }
    Ok(())
}

/// What the CRD's schema (or the Operator, which refuses the whole object) would refuse:
/// a rule that is neither or both of alert and record, a bad duration, a group name twice.
fn check_prometheus_rule(pr: &PrometheusRule) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    for g in &pr.spec.groups {
        if g.name.is_empty() || !names.insert(g.name.as_str()) {
            return Err(format!("group name {:?} is empty or used twice", g.name));
        }
        if let Some(d) = g.interval.as_deref().filter(|d| !duration(d)) {
            return Err(format!(
                "group {}: {d:?} is not a Prometheus duration",
                g.name
            ));
        }
        for r in &g.rules {
            let what = r.alert.as_deref().or(r.record.as_deref()).unwrap_or("");
            if r.alert.is_some() == r.record.is_some() {
                return Err(format!(
                    "group {}: rule {what:?} must be exactly one of alert and record",
                    g.name
                ));
            }
            if what.is_empty() || r.expr.trim().is_empty() {
                return Err(format!("group {}: a rule without a name or expr", g.name));
            }
            if let Some(d) = r.for_.as_deref().filter(|d| !duration(d)) {
                return Err(format!("{what}: for {d:?} is not a Prometheus duration"));
            }
            if r.record.is_some() && (r.for_.is_some() || r.annotations.is_some()) {
                return Err(format!(
                    "{what}: a recording rule has no for or annotations"
                ));
            }
        }
    }
    Ok(())
}
