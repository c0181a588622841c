//! Checks of everything under deploy/: the Kubernetes manifests and the Helm chart are
//! strictly valid objects (k8s-openapi round trip, and the PyPI `kubernetes-validate`
//! schemas), agree with each other, grant exactly the least privilege Warden needs, and
//! carry configuration the binaries' own loaders accept; the chart's values schema and
//! NOTES.txt say what they should; the Slurm units are hardened
//! and the prolog/epilog hooks report jobs without ever failing one.
//!
//! It lives in the agent crate because this is the one crate that already sees both
//! binaries' config loaders (warden-controller is a dev-dependency here), so no new
//! dependency edge is needed.

mod helm;
mod k8s;
mod slurm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s::{Obj, Typed};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

/// The Kubernetes version both checks use: k8s-openapi's `v1_33` feature and
/// `kubernetes-validate -k`. Change them together.
const KUBERNETES_VERSION: &str = "1.33.0";

/// Release name and namespace the chart is rendered with to match deploy/kubernetes.
const RELEASE: &str = "warden";
const NAMESPACE: &str = "warden";

/// Values the downward API would give, for checking the containers' environment.
const NODE_NAME: &str = "gpu-node-001";
const POD_IP: &str = "10.1.2.3";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the agent crate is inside the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The objects of a multi-document YAML text (empty documents skipped).
fn yaml_objects(text: &str, origin: &str) -> Vec<Obj> {
    let docs: Vec<Value> = warden_model::yaml::from_str_multiple(text)
        .unwrap_or_else(|e| panic!("{origin}: not YAML: {e}\n{text}"));
    docs.into_iter()
        .filter(|v| !v.is_null())
        .enumerate()
        .map(|(i, value)| Obj {
            origin: format!("{origin}#{i}"),
            value,
        })
        .collect()
}

fn plain_dir() -> PathBuf {
    repo().join("deploy/kubernetes")
}

fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/warden")
}

/// The manifest files of deploy/kubernetes (not the kustomization).
fn plain_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(plain_dir())
        .expect("deploy/kubernetes exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    files
}

fn plain() -> Vec<Obj> {
    plain_files()
        .iter()
        .flat_map(|p| yaml_objects(&read(p), &p.display().to_string()))
        .collect()
}

fn chart_values() -> Value {
    warden_model::yaml::from_str(&read(&chart_dir().join("values.yaml")))
        .expect("values.yaml parses")
}

/// The chart's templates rendered with `values`: (file name, output).
fn render(values: &Value) -> Vec<(String, String)> {
    let chart = helm::Chart::load(&chart_dir()).unwrap_or_else(|e| panic!("chart: {e}"));
    chart
        .render(values, RELEASE, NAMESPACE)
        .unwrap_or_else(|e| panic!("rendering the chart: {e}"))
}

/// The objects the chart renders with `values` (release RELEASE, namespace NAMESPACE).
fn rendered_objects(values: &Value) -> Vec<Obj> {
    render(values)
        .iter()
        .flat_map(|(n, t)| yaml_objects(t, &format!("chart templates/{n}")))
        .collect()
}

fn chart() -> Vec<Obj> {
    rendered_objects(&chart_values())
}

/// Every object typed strictly; panics listing every object that is not.
fn typed(objs: Vec<Obj>) -> Vec<(Obj, Typed)> {
    let mut errors = Vec::new();
    let mut out = Vec::new();
    for o in objs {
        match k8s::strict(&o) {
            Ok(t) => out.push((o, t)),
            Err(e) => errors.push(format!("{} ({}): {e}", o.origin, o.id())),
        }
    }
    assert!(
        errors.is_empty(),
        "objects that are not strictly valid:\n{}",
        errors.join("\n")
    );
    out
}

fn find<'a>(objs: &'a [(Obj, Typed)], kind: &str, name: &str) -> &'a Typed {
    objs.iter()
        .find(|(o, _)| o.kind() == kind && o.name() == name)
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(objs: &'a [(Obj, Typed)], kind: &str, name: &str) -> (&'a PodSpec, &'a Container) {
    let pod = find(objs, kind, name)
        .pod_spec()
        .expect("a workload has a pod spec");
    assert_eq!(pod.containers.len(), 1, "{kind} {name}: one container");
    (pod, &pod.containers[0])
}

fn both() -> [(&'static str, Vec<(Obj, Typed)>); 2] {
    [
        ("deploy/kubernetes", typed(plain())),
        ("the chart", typed(chart())),
    ]
}

#[test]
fn plain_manifests_are_strictly_valid_and_all_in_the_kustomization() {
    let objs = typed(plain());
    let kinds: BTreeSet<&str> = objs.iter().map(|(o, _)| o.kind()).collect();
    for k in [
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "DaemonSet",
        "Deployment",
        "PodDisruptionBudget",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "ServiceMonitor",
        "PrometheusRule",
    ] {
        assert!(kinds.contains(k), "deploy/kubernetes has no {k}");
    }
    let Typed::Namespace(ns) = find(&objs, "Namespace", NAMESPACE) else {
        panic!("the namespace");
    };
    assert_eq!(ns.metadata.name.as_deref(), Some(NAMESPACE));
    for (o, _) in &objs {
        if !matches!(o.kind(), "Namespace" | "ClusterRole" | "ClusterRoleBinding") {
            assert_eq!(
                o.value
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str),
                Some(NAMESPACE),
                "{} names its namespace",
                o.id()
            );
        }
    }

    let k: Value = warden_model::yaml::from_str(&read(&plain_dir().join("kustomization.yaml")))
        .expect("parses");
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .expect("kustomization resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_owned())
        .collect();
    let files: BTreeSet<String> = plain_files()
        .iter()
        .map(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .expect("name")
                .to_owned()
        })
        .collect();
    assert_eq!(
        listed, files,
        "kustomization.yaml must list exactly the manifests"
    );
    let keys: Vec<&str> = k
        .as_object()
        .expect("a mapping")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["apiVersion", "kind", "resources"],
        "kustomization fields"
    );
}

/// `objs` with each ConfigMap's `*.yaml` data parsed. The chart writes a config with
/// `toYaml` from a values map (keys sorted, no comments), deploy/kubernetes holds it as
/// written by hand (with comments): the two must hold the same settings, not the same
/// characters.
fn config_data_parsed(objs: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    let mut out = objs.clone();
    for (id, o) in &mut out {
        if o["kind"] != "ConfigMap" {
            continue;
        }
        let Some(data) = o.get_mut("data").and_then(Value::as_object_mut) else {
            continue;
        };
        for (key, text) in data.iter_mut().filter(|(k, _)| k.ends_with(".yaml")) {
            let parsed: Value = warden_model::yaml::from_str(text.as_str().unwrap_or_default())
                .unwrap_or_else(|e| panic!("{id}: data.{key} is not YAML: {e}"));
            *text = parsed;
        }
    }
    out
}

#[test]
fn chart_renders_strictly_valid_objects_and_its_defaults_are_the_plain_manifests() {
    let chart_objs = typed(chart());
    let plain_objs = typed(plain());
    let by_id = |objs: &[(Obj, Typed)]| -> BTreeMap<String, Value> {
        let mut m = BTreeMap::new();
        for (o, _) in objs {
            assert!(
                m.insert(o.id(), o.value.clone()).is_none(),
                "{} twice",
                o.id()
            );
        }
        m
    };
    let mut p = by_id(&plain_objs);
    p.remove(&format!("Namespace//{NAMESPACE}"))
        .expect("the plain manifests create the namespace");
    let c = by_id(&chart_objs);
    let (p, c) = (config_data_parsed(&p), config_data_parsed(&c));
    assert_eq!(
        p.keys().collect::<Vec<_>>(),
        c.keys().collect::<Vec<_>>(),
        "the chart must render the same objects as deploy/kubernetes"
    );
    let mut diffs = Vec::new();
    for (id, pv) in &p {
        k8s::diff(pv, &c[id], id, &mut diffs);
    }
    assert!(
        diffs.is_empty(),
        "chart (default values) and deploy/kubernetes differ:\n{}",
        diffs.join("\n")
    );

    // The important fields, said once more so a failure reads plainly.
    for (_, objs) in [("plain", &plain_objs), ("chart", &chart_objs)] {
        let (_, agent) = container(objs, "DaemonSet", "warden-agent");
        let (_, ctl) = container(objs, "Deployment", "warden-controller");
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            agent.image.as_deref(),
            Some(format!("ghcr.io/warden-project/warden-agent:{version}").as_str())
        );
        assert_eq!(
            ctl.image.as_deref(),
            Some(format!("ghcr.io/warden-project/warden-controller:{version}").as_str())
        );
        let port = |c: &Container, name: &str| {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port)
        };
        assert_eq!(port(agent, "metrics"), Some(9461));
        assert_eq!(port(ctl, "http"), Some(9460));
    }
    let chart_yaml: Value =
        warden_model::yaml::from_str(&read(&chart_dir().join("Chart.yaml"))).expect("Chart.yaml");
    assert_eq!(
        chart_yaml["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(chart_yaml["apiVersion"].as_str(), Some("v2"));
}

#[test]
fn chart_options_render_valid_objects() {
    let mut v = chart_values();
    v["agent"]["hostNetwork"] = true.into();
    v["agent"]["ncclSegments"] = false.into();
    v["agent"]["podResources"]["enabled"] = false.into();
    v["rbac"]["create"] = false.into();
    v["serviceMonitor"]["labels"] = serde_json::json!({"release": "prometheus"});
    v["alerts"]["prometheusRule"]["labels"] = serde_json::json!({"release": "prometheus"});
    v["networkPolicy"]["enabled"] = false.into();
    let objs = typed(rendered_objects(&v));
    let kinds: BTreeSet<&str> = objs.iter().map(|(o, _)| o.kind()).collect();
    assert!(
        !kinds.contains("ClusterRole") && !kinds.contains("NetworkPolicy"),
        "{kinds:?}"
    );
    let (pod, c) = container(&objs, "DaemonSet", "warden-agent");
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    for name in ["nccl-segments", "pod-resources"] {
        assert!(
            c.volume_mounts.iter().flatten().all(|m| m.name != name)
                && pod.volumes.iter().flatten().all(|v| v.name != name),
            "{name} is not mounted"
        );
    }
    let Typed::ServiceMonitor(sm) = find(&objs, "ServiceMonitor", "warden-agent") else {
        panic!("a ServiceMonitor");
    };
    let labels = sm.metadata.labels.as_ref().expect("labels");
    assert_eq!(
        labels.get("release").map(String::as_str),
        Some("prometheus")
    );
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("warden-agent")
    );
    let Typed::PrometheusRule(pr) = find(&objs, "PrometheusRule", "warden-alerts") else {
        panic!("a PrometheusRule");
    };
    let labels = pr.metadata.labels.as_ref().expect("labels");
    assert_eq!(
        labels.get("release").map(String::as_str),
        Some("prometheus"),
        "the label Prometheus' ruleSelector matches"
    );
    assert_eq!(
        labels.get("app.kubernetes.io/part-of").map(String::as_str),
        Some("warden")
    );

    // What users add to pods: a pull secret, annotations, placement, environment and
    // volumes, on both workloads.
    let mut v = chart_values();
    v["imagePullSecrets"] = serde_json::json!([{"name": "regcred"}]);
    for who in ["agent", "controller"] {
        v[who]["podAnnotations"] = serde_json::json!({"example.com/team": "ml-infra"});
        v[who]["affinity"] = serde_json::json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        ]}}});
        v[who]["extraEnv"] = serde_json::json!([{"name": "EXTRA", "value": who}]);
        v[who]["extraVolumes"] =
            serde_json::json!([{"name": "ca", "configMap": {"name": "corp-ca"}}]);
        v[who]["extraVolumeMounts"] =
            serde_json::json!([{"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": true}]);
    }
    v["controller"]["nodeSelector"] = serde_json::json!({"node-role/infra": "true"});
    v["controller"]["tolerations"] =
        serde_json::json!([{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]);
    let raw = rendered_objects(&v);
    let objs = typed(raw.clone());
    for (who, kind, name) in [
        ("agent", "DaemonSet", "warden-agent"),
        ("controller", "Deployment", "warden-controller"),
    ] {
        let (pod, c) = container(&objs, kind, name);
        let secrets: Vec<&str> = pod
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(secrets, ["regcred"], "{who}");
        assert!(
            pod.affinity
                .as_ref()
                .is_some_and(|a| a.node_affinity.is_some()),
            "{who}"
        );
        assert_eq!(pod_env(c).get("EXTRA").map(String::as_str), Some(who));
        assert!(
            pod.volumes.iter().flatten().any(|v| v.name == "ca"),
            "{who}: the extra volume"
        );
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "ca" && m.mount_path == "/etc/corp-ca"),
            "{who}: the extra mount"
        );
        let obj = raw
            .iter()
            .find(|o| o.kind() == kind && o.name() == name)
            .expect("the workload");
        assert_eq!(
            obj.value["spec"]["template"]["metadata"]["annotations"]["example.com/team"],
            "ml-infra",
            "{who}"
        );
    }
    let (pod, _) = container(&objs, "Deployment", "warden-controller");
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|n| n.get("node-role/infra"))
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(pod.tolerations.as_ref().map(Vec::len), Some(1));
    // The defaults add none of these.
    for (o, t) in &typed(chart()) {
        if let Some(pod) = t.pod_spec() {
            assert!(
                pod.image_pull_secrets.is_none() && pod.affinity.is_none(),
                "{}",
                o.id()
            );
        }
    }

    let mut v = chart_values();
    v["serviceMonitor"]["enabled"] = false.into();
    v["alerts"]["prometheusRule"]["enabled"] = false.into();
    let objs = typed(rendered_objects(&v));
    assert!(
        objs.iter()
            .all(|(o, _)| !matches!(o.kind(), "ServiceMonitor" | "PrometheusRule")),
        "without the Prometheus Operator the chart needs none of its CRDs"
    );
}

#[test]
fn chart_names_follow_fullname_override_and_service_accounts_can_be_brought() {
    let mut v = chart_values();
    v["fullnameOverride"] = "ml-warden".into();
    v["controller"]["serviceAccount"] = serde_json::json!({
        "create": false, "name": "platform-sa", "annotations": {}
    });
    v["agent"]["serviceAccount"]["annotations"] = serde_json::json!({"example.com/owner": "infra"});
    let raw = rendered_objects(&v);
    let objs = typed(raw.clone());
    for o in &raw {
        let name = o.name();
        assert!(
            name.starts_with("ml-warden-") || name == "platform-sa",
            "{}: not named after fullnameOverride",
            o.id()
        );
        assert_eq!(
            o.value["metadata"]["labels"]["app.kubernetes.io/instance"],
            RELEASE,
            "{}: the instance label stays the release",
            o.id()
        );
    }
    let accounts: Vec<&str> = raw
        .iter()
        .filter(|o| o.kind() == "ServiceAccount")
        .map(Obj::name)
        .collect();
    assert_eq!(accounts, ["ml-warden-agent"], "the controller's is brought");
    let agent_sa = raw
        .iter()
        .find(|o| o.kind() == "ServiceAccount")
        .expect("the agent's");
    assert_eq!(
        agent_sa.value["metadata"]["annotations"]["example.com/owner"],
        "infra"
    );
    let (pod, _) = container(&objs, "Deployment", "ml-warden-controller");
    assert_eq!(pod.service_account_name.as_deref(), Some("platform-sa"));
    let (pod, c) = container(&objs, "DaemonSet", "ml-warden-agent");
    assert_eq!(pod.service_account_name.as_deref(), Some("ml-warden-agent"));
    assert_eq!(
        pod_env(c).get("WARDEN_CONTROLLER_URL").map(String::as_str),
        Some("http://ml-warden-controller:9460")
    );
    for o in raw.iter().filter(|o| o.kind().ends_with("Binding")) {
        assert_eq!(
            o.value["subjects"][0]["name"],
            "platform-sa",
            "{}: binds the brought account",
            o.id()
        );
        assert!(
            o.value["roleRef"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("ml-warden-")),
            "{}",
            o.id()
        );
    }
}

#[test]
fn chart_labels_follow_name_override_and_object_names_do_not() {
    let mut v = chart_values();
    v["nameOverride"] = "gpu-warden".into();
    let raw = rendered_objects(&v);
    let defaults = rendered_objects(&chart_values());
    assert_eq!(
        raw.iter().map(Obj::id).collect::<Vec<_>>(),
        defaults.iter().map(Obj::id).collect::<Vec<_>>(),
        "nameOverride renames no object (fullnameOverride does)"
    );
    let name_label = |o: &Obj, at: &str| -> Option<String> {
        o.value
            .pointer(at)
            .and_then(|l| l.get("app.kubernetes.io/name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let mut seen = 0;
    for (o, d) in raw.iter().zip(&defaults) {
        for at in [
            "/metadata/labels",
            "/spec/selector/matchLabels",
            "/spec/selector",
            "/spec/template/metadata/labels",
            "/spec/podSelector/matchLabels",
        ] {
            let (Some(renamed), Some(default)) = (name_label(o, at), name_label(d, at)) else {
                continue;
            };
            let suffix = default
                .strip_prefix("warden")
                .unwrap_or_else(|| panic!("{} {at}: {default}", o.id()));
            assert_eq!(renamed, format!("gpu-warden{suffix}"), "{} {at}", o.id());
            seen += 1;
        }
    }
    assert!(seen > 20, "only {seen} name labels and selectors");
    // The defaults are deploy/kubernetes's names.
    let defaults = typed(defaults);
    let Typed::DaemonSet(ds) = find(&defaults, "DaemonSet", "warden-agent") else {
        panic!("the agent's DaemonSet");
    };
    assert_eq!(
        ds.spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
            .and_then(|l| l.get("app.kubernetes.io/name"))
            .map(String::as_str),
        Some("warden-agent")
    );
}

/// The agent's and the controller's configs are maps in values.yaml, rendered with
/// `toYaml`, and say what deploy/kubernetes's hand-written config files say.
#[test]
fn chart_configs_are_value_maps_that_render_the_plain_config_files() {
    let values = chart_values();
    let plain = typed(plain());
    let chart = typed(chart());
    for (who, file, sections) in [
        (
            "agent",
            "agent.yaml",
            &[
                "controller",
                "nvml",
                "kmsg",
                "logs",
                "log_window",
                "capture",
                "pod_resources",
            ][..],
        ),
        (
            "controller",
            "controller.yaml",
            &[
                "data_dir",
                "tokens_file",
                "max_batch_bytes",
                "tick_interval_ms",
                "remediation",
                "diagnosis",
            ][..],
        ),
    ] {
        let config = &values[who]["config"];
        assert!(config.is_object(), "{who}.config is a map: {config}");
        let name = format!("warden-{who}");
        let text = |objs: &[(Obj, Typed)]| -> String {
            let Typed::ConfigMap(cm) = find(objs, "ConfigMap", &name) else {
                panic!("ConfigMap {name}");
            };
            cm.data
                .as_ref()
                .and_then(|d| d.get(file))
                .unwrap_or_else(|| panic!("ConfigMap {name} has no {file}"))
                .clone()
        };
        let rendered = text(&chart);
        let parsed: Value = warden_model::yaml::from_str(&rendered)
            .unwrap_or_else(|e| panic!("{who}: {file} is not YAML: {e}\n{rendered}"));
        assert_eq!(&parsed, config, "{who}: {file} is {who}.config");
        let plain_parsed: Value =
            warden_model::yaml::from_str(&text(&plain)).expect("the plain config parses");
        assert_eq!(
            parsed, plain_parsed,
            "{who}: the chart's {file} and deploy/kubernetes's hold the same settings"
        );
        let keys: BTreeSet<&str> = parsed
            .as_object()
            .expect("a map")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, sections.iter().copied().collect(), "{who}: sections");
    }
}

#[test]
fn chart_notes_name_the_secrets_to_make_and_the_way_to_the_api() {
    let chart = helm::Chart::load(&chart_dir()).unwrap_or_else(|e| panic!("chart: {e}"));
    let mut v = chart_values();
    v["controller"]["port"] = 9999.into();
    let notes = chart
        .notes(&v, "prod", "ml")
        .expect("the chart has NOTES.txt")
        .unwrap_or_else(|e| panic!("{e}"));
    for needle in [
        "warden-api-tokens",
        "warden-agent-token",
        "kubectl -n ml port-forward svc/prod-controller 9999",
        "warden incidents --server http://127.0.0.1:9999",
        "dry_run",
    ] {
        assert!(notes.contains(needle), "{needle} not in:\n{notes}");
    }
}

/// The alert rule file: rules/prometheus/warden-alerts.yaml, parsed.
fn rule_file() -> Value {
    let path = repo().join("rules/prometheus/warden-alerts.yaml");
    warden_model::yaml::from_str(&read(&path)).expect("the alert rule file parses")
}

/// The rule groups of the chart's PrometheusRule rendered with `values`.
fn chart_rule_groups(values: &Value) -> Value {
    let objs = typed(rendered_objects(values));
    let rules: Vec<&Obj> = objs
        .iter()
        .filter(|(o, _)| o.kind() == "PrometheusRule")
        .map(|(o, _)| o)
        .collect();
    assert_eq!(rules.len(), 1, "the chart renders one PrometheusRule");
    assert_eq!(rules[0].name(), format!("{RELEASE}-alerts"));
    rules[0].value["spec"]["groups"].clone()
}

/// Every string in `v` with `f` applied.
fn map_strings(v: &Value, f: &dyn Fn(&str) -> String) -> Value {
    match v {
        Value::String(s) => Value::String(f(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| map_strings(x, f)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), map_strings(x, f)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// How many times `needle` occurs in the strings of `v`.
fn occurrences(v: &Value, needle: &str) -> usize {
    match v {
        Value::String(s) => s.matches(needle).count(),
        Value::Array(a) => a.iter().map(|x| occurrences(x, needle)).sum(),
        Value::Object(m) => m.values().map(|x| occurrences(x, needle)).sum(),
        _ => 0,
    }
}

#[test]
fn chart_prometheus_rule_with_default_values_is_the_rule_file() {
    let file = rule_file();
    let keys: Vec<&String> = file.as_object().expect("a mapping").keys().collect();
    assert_eq!(keys, ["groups"], "the rule file holds rule groups only");
    let groups = chart_rule_groups(&chart_values());
    let mut diffs = Vec::new();
    k8s::diff(&file["groups"], &groups, "groups", &mut diffs);
    assert!(
        diffs.is_empty(),
        "rules/prometheus/warden-alerts.yaml and the chart's PrometheusRule (default values) \
         differ; change deploy/helm/warden/templates/prometheusrule.yaml, the rule file and \
         deploy/kubernetes/prometheusrule.yaml together:\n{}",
        diffs.join("\n")
    );

    // The default selectors select the job names the ServiceMonitors give the targets.
    let v = chart_values();
    for (what, objs) in both() {
        for (name, selector) in [
            ("warden-agent", &v["alerts"]["agentSelector"]),
            ("warden-controller", &v["alerts"]["controllerSelector"]),
        ] {
            let Typed::ServiceMonitor(sm) = find(&objs, "ServiceMonitor", name) else {
                panic!("{what}: ServiceMonitor {name}");
            };
            let job = sm.spec.endpoints[0]
                .relabelings
                .iter()
                .find(|r| r.target_label.as_deref() == Some("job"))
                .and_then(|r| r.replacement.clone())
                .expect("a job label");
            assert_eq!(
                selector.as_str(),
                Some(format!("job=\"{job}\"").as_str()),
                "{what}: alerts selector for {name}"
            );
        }
    }
}

#[test]
fn chart_prometheus_rule_takes_its_selectors_and_runbook_url_from_the_values() {
    let defaults = chart_values();
    let custom = [
        ("agentSelector", r#"job="gpu-nodes",namespace="ml""#),
        (
            "controllerSelector",
            r#"job=~"warden-ctl|warden-controller-.*""#,
        ),
        ("runbookUrl", "https://wiki.example.com/warden/alerts"),
    ];
    let mut v = defaults.clone();
    let file = rule_file();
    let mut replaced = Vec::new();
    for (key, value) in custom {
        let default = defaults["alerts"][key]
            .as_str()
            .unwrap_or_else(|| panic!("alerts.{key} is a string"))
            .to_owned();
        assert!(
            occurrences(&file, &default) > 0,
            "the rule file never uses the default alerts.{key} {default}"
        );
        v["alerts"][key] = value.into();
        replaced.push((default, value));
    }
    // Every rule's runbook_url is the page with the alert's anchor.
    let page = defaults["alerts"]["runbookUrl"]
        .as_str()
        .expect("runbookUrl");
    for g in file["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            let name = r["alert"].as_str().expect("an alert");
            assert_eq!(
                r["annotations"]["runbook_url"].as_str(),
                Some(format!("{page}#{}", name.to_lowercase()).as_str()),
                "{name}: runbook_url"
            );
        }
    }
    let expected = map_strings(&file["groups"], &|s| {
        replaced
            .iter()
            .fold(s.to_owned(), |s, (from, to)| s.replace(from.as_str(), to))
    });
    let groups = chart_rule_groups(&v);
    let mut diffs = Vec::new();
    k8s::diff(&expected, &groups, "groups", &mut diffs);
    assert!(
        diffs.is_empty(),
        "custom alerts values were not put everywhere the defaults are:\n{}",
        diffs.join("\n")
    );
    for (from, to) in &replaced {
        assert_eq!(occurrences(&groups, from), 0, "{from} is left");
        assert_eq!(
            occurrences(&groups, to),
            occurrences(&file, from),
            "{to} replaces every {from}"
        );
    }
    for needle in ["warden-agent\"", "warden-controller\""] {
        assert_eq!(occurrences(&groups, needle), 0, "a job name left: {needle}");
    }

    // The expressions with the custom selectors still parse.
    let Some(promtool) = warden_testkit::tools::promtool() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rules.yaml");
    let doc = serde_json::json!({ "groups": groups });
    std::fs::write(&path, serde_saphyr::to_string(&doc).expect("yaml")).expect("write rules");
    let out = std::process::Command::new(promtool)
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules on the chart's rules with custom selectors:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (role kind, role name, API group, resource, verb).
type Grant = (String, String, String, String, String);

#[test]
fn rbac_is_exactly_the_least_privilege_set() {
    let expected: BTreeSet<Grant> = [
        ("ClusterRole", "", "nodes", &["get", "patch"][..]),
        ("ClusterRole", "", "pods", &["list", "delete"][..]),
        ("ClusterRole", "", "pods/eviction", &["create"][..]),
        (
            "ClusterRole",
            "jobset.x-k8s.io",
            "jobsets",
            &["get", "patch"][..],
        ),
        (
            "ClusterRole",
            "kubeflow.org",
            "pytorchjobs",
            &["get", "patch"][..],
        ),
        ("ClusterRole", "", "nodes/status", &["patch"][..]),
        ("ClusterRole", "", "events", &["create"][..]),
        ("Role", "batch", "jobs", &["get", "create", "delete"][..]),
    ]
    .iter()
    .flat_map(|(kind, group, res, verbs)| {
        verbs.iter().map(move |v| {
            (
                kind.to_string(),
                "warden-controller".to_string(),
                group.to_string(),
                res.to_string(),
                v.to_string(),
            )
        })
    })
    .collect();

    for (what, objs) in both() {
        let mut grants = BTreeSet::new();
        let mut bindings = Vec::new();
        for (o, t) in &objs {
            let rules = match t {
                Typed::ClusterRole(r) => {
                    assert!(r.aggregation_rule.is_none(), "{what}: no aggregation");
                    r.rules.clone().unwrap_or_default()
                }
                Typed::Role(r) => r.rules.clone().unwrap_or_default(),
                Typed::ClusterRoleBinding(b) => {
                    bindings.push((o.kind(), b.role_ref.clone(), b.subjects.clone()));
                    continue;
                }
                Typed::RoleBinding(b) => {
                    bindings.push((o.kind(), b.role_ref.clone(), b.subjects.clone()));
                    continue;
                }
                _ => continue,
            };
            for r in rules {
                assert!(
                    r.non_resource_urls.is_none() && r.resource_names.is_none(),
                    "{what}: {}: no URLs or names",
                    o.id()
                );
                for g in r.api_groups.iter().flatten() {
                    for res in r.resources.iter().flatten() {
                        for v in &r.verbs {
                            grants.insert((
                                o.kind().to_owned(),
                                o.name().to_owned(),
                                g.clone(),
                                res.clone(),
                                v.clone(),
                            ));
                        }
                    }
                }
            }
        }
        assert_eq!(
            grants, expected,
            "{what}: RBAC rules differ from the least-privilege set"
        );

        assert_eq!(bindings.len(), 2, "{what}: one binding per role");
        for (kind, role_ref, subjects) in bindings {
            let want = if kind == "ClusterRoleBinding" {
                "ClusterRole"
            } else {
                "Role"
            };
            assert_eq!(role_ref.kind, want, "{what}: {kind} binds a {want}");
            assert_eq!(role_ref.name, "warden-controller");
            let subjects = subjects.unwrap_or_default();
            assert_eq!(subjects.len(), 1, "{what}: {kind}: only the controller");
            assert_eq!(subjects[0].kind, "ServiceAccount");
            assert_eq!(subjects[0].name, "warden-controller");
            assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));
        }

        let Typed::ServiceAccount(sa) = find(&objs, "ServiceAccount", "warden-agent") else {
            panic!("agent service account");
        };
        assert_eq!(sa.automount_service_account_token, Some(false), "{what}");
        let (pod, _) = container(&objs, "DaemonSet", "warden-agent");
        assert_eq!(pod.automount_service_account_token, Some(false), "{what}");
        assert_eq!(pod.service_account_name.as_deref(), Some("warden-agent"));
        let (pod, _) = container(&objs, "Deployment", "warden-controller");
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("warden-controller")
        );
    }
}

fn mebibytes(q: &str) -> f64 {
    let (n, mult) = if let Some(n) = q.strip_suffix("Mi") {
        (n, 1.0)
    } else if let Some(n) = q.strip_suffix("Gi") {
        (n, 1024.0)
    } else {
        panic!("quantity {q:?}: write memory in Mi or Gi")
    };
    n.parse::<f64>().expect("a number") * mult
}

#[test]
fn agent_daemonset_keeps_privileges_minimal() {
    for (what, objs) in both() {
        let (pod, c) = container(&objs, "DaemonSet", "warden-agent");
        let sel = pod.node_selector.as_ref().expect("node selector");
        assert_eq!(
            sel.get("nvidia.com/gpu.present").map(String::as_str),
            Some("true")
        );
        assert!(
            pod.tolerations
                .iter()
                .flatten()
                .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")),
            "{what}: tolerates the GPU taint"
        );
        assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
        assert_eq!(
            pod.host_network,
            Some(false),
            "{what}: pod network by default"
        );
        assert_ne!(pod.host_pid, Some(true));
        assert_ne!(pod.host_ipc, Some(true));

        let sc = c
            .security_context
            .as_ref()
            .expect("container security context");
        // File capabilities need no_new_privs off; the agent sets it itself
        // (agent/tests/privilege.rs).
        assert_eq!(sc.allow_privilege_escalation, Some(true), "{what}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}");
        assert_ne!(sc.privileged, Some(true), "{what}");
        let caps = sc.capabilities.as_ref().expect("capabilities");
        assert_eq!(
            caps.drop.as_deref(),
            Some(&["ALL".to_string()][..]),
            "{what}"
        );
        assert_eq!(
            caps.add.as_deref(),
            Some(&["SYSLOG".to_string(), "DAC_OVERRIDE".to_string()][..]),
            "{what}"
        );
        let psc = pod.security_context.as_ref().expect("pod security context");
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.run_as_non_root),
            (Some(65532), Some(65532), Some(true)),
            "{what}: the agent's user"
        );
        assert_eq!(
            psc.supplemental_groups.as_deref(),
            Some(&[0][..]),
            "{what}: group 0, for the container logs"
        );
        let token = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "token")
            .and_then(|v| v.secret.as_ref())
            .expect("token volume");
        assert_eq!(token.default_mode, Some(0o440), "{what}: token mode");
        assert_eq!(psc.fs_group, Some(65532), "{what}: the token's group");

        let env: BTreeMap<_, _> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e))
            .collect();
        let field = |name: &str| {
            env.get(name)
                .and_then(|e| e.value_from.as_ref())
                .and_then(|f| f.field_ref.as_ref())
                .map(|f| f.field_path.as_str())
        };
        assert_eq!(field("NODE_NAME"), Some("spec.nodeName"), "{what}");
        let value = |name: &str| env.get(name).and_then(|e| e.value.as_deref());
        assert_eq!(value("NVIDIA_VISIBLE_DEVICES"), Some("all"));
        assert_eq!(value("NVIDIA_DRIVER_CAPABILITIES"), Some("utility"));

        let host: BTreeMap<&str, &str> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| Some((v.name.as_str(), v.host_path.as_ref()?.path.as_str())))
            .collect();
        let paths: BTreeSet<&str> = host.values().copied().collect();
        assert_eq!(
            paths,
            [
                "/dev/kmsg",
                "/dev/shm",
                "/run/warden",
                "/var/lib/kubelet/pod-resources",
                "/var/log/containers",
                "/var/log/pods"
            ]
            .into(),
            "{what}: host paths"
        );
        // Read-only everywhere but the capture socket's directory, where the agent
        // creates the socket training processes connect to.
        for m in c.volume_mounts.iter().flatten() {
            let writable = host.get(m.name.as_str()) == Some(&"/run/warden");
            assert_eq!(
                m.read_only.unwrap_or(false),
                !writable,
                "{what}: mount {} is read-only (only /run/warden is writable)",
                m.name
            );
        }
        assert!(
            host.keys()
                .all(|v| c.volume_mounts.iter().flatten().any(|m| m.name == *v)),
            "{what}: every host path is mounted"
        );

        let res = c.resources.as_ref().expect("resources");
        let get = |m: &Option<
            BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >,
                   k: &str| {
            m.as_ref()
                .and_then(|m| m.get(k))
                .map(|q| mebibytes(&q.0))
                .unwrap_or_else(|| panic!("{what}: memory {k}"))
        };
        let (req, lim) = (get(&res.requests, "memory"), get(&res.limits, "memory"));
        // The budget is 25 MB of RSS (BENCHMARKS.md): ask for it, cap at a small multiple.
        assert!(
            (24.0..=48.0).contains(&req),
            "{what}: memory request {req} Mi"
        );
        assert!(
            (req..=128.0).contains(&lim),
            "{what}: memory limit {lim} Mi"
        );
        assert!(
            c.liveness_probe.is_some() && c.readiness_probe.is_some(),
            "{what}: probes"
        );
    }
}

#[test]
fn controller_runs_one_unprivileged_replica() {
    for (what, objs) in both() {
        let Typed::Deployment(d) = find(&objs, "Deployment", "warden-controller") else {
            panic!("deployment");
        };
        let spec = d.spec.as_ref().expect("spec");
        // One by default: on the default SQLite store each pod would lead on its own file
        // and see part of the batches; more replicas need PostgreSQL (docs/DEPLOY.md).
        assert_eq!(spec.replicas, Some(1), "{what}");
        assert_eq!(
            spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
            Some("Recreate"),
            "{what}"
        );
        let (pod, c) = container(&objs, "Deployment", "warden-controller");
        let psc = pod.security_context.as_ref().expect("pod security context");
        assert_eq!(psc.run_as_non_root, Some(true), "{what}");
        let sc = c.security_context.as_ref().expect("security context");
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let caps = sc.capabilities.as_ref().expect("capabilities");
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(
            caps.add.is_none(),
            "{what}: the controller needs no capability"
        );
        assert!(pod.volumes.iter().flatten().all(|v| v.host_path.is_none()));

        let Typed::PodDisruptionBudget(pdb) =
            find(&objs, "PodDisruptionBudget", "warden-controller")
        else {
            panic!("pdb");
        };
        // With one replica the budget must let it go, or `kubectl drain` waits forever;
        // with more, one at a time.
        assert_eq!(
            pdb.spec.as_ref().and_then(|s| s.max_unavailable.clone()),
            Some(IntOrString::Int(1)),
            "{what}"
        );

        // Secrets are referenced, never held.
        assert!(
            objs.iter().all(|(o, _)| o.kind() != "Secret"),
            "{what}: no Secret values"
        );
        let llm = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "WARDEN_LLM_API_KEY")
            .and_then(|e| e.value_from.as_ref()?.secret_key_ref.clone())
            .expect("the LLM key comes from a Secret");
        assert_eq!(llm.optional, Some(true), "{what}: the LLM key is optional");
    }
}

/// Containers that may add capabilities, with the only ones each may add. They need
/// `allowPrivilegeEscalation: true`, because the capabilities reach a non-root process
/// only as file capabilities on its binary, which `no_new_privs` turns off; the process
/// must use them once and drop them (agent/tests/privilege.rs checks the agent does).
/// The agent opens /dev/kmsg under `kernel.dmesg_restrict=1` (SYSLOG) and binds its
/// socket in the root-owned /run/warden (DAC_OVERRIDE) (SECURITY.md, docs/DEPLOY.md).
/// Widening this table is a security review, not a test fix.
const FILE_CAP_CONTAINERS: &[(&str, &str, &[&str])] =
    &[("warden-agent", "agent", &["SYSLOG", "DAC_OVERRIDE"])];

/// Every container of every workload in `objs` is locked down: a non-root user with an
/// explicit uid and gid, no privilege, a read-only root filesystem, every capability
/// dropped, the runtime's default seccomp profile, no host PID or IPC namespace, and no
/// escalation, capabilities added back or group 0 unless [`FILE_CAP_CONTAINERS`] names
/// it. Returns how many containers were checked.
fn check_lockdown(what: &str, objs: &[(Obj, Typed)]) -> usize {
    let mut checked = 0;
    for (o, t) in objs {
        let has_template = o.value.pointer("/spec/template/spec").is_some()
            || o.value.pointer("/spec/containers").is_some();
        let Some(pod) = t.pod_spec() else {
            assert!(
                !has_template,
                "{what}: {} runs pods this test does not see; teach Typed::pod_spec its kind",
                o.id()
            );
            continue;
        };
        let workload = o.name();
        assert_ne!(pod.host_pid, Some(true), "{what}: {workload} hostPID");
        assert_ne!(pod.host_ipc, Some(true), "{what}: {workload} hostIPC");
        let psc = pod.security_context.clone().unwrap_or_default();
        let containers = pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten());
        for c in containers {
            let at = format!("{what}: {workload}/{}", c.name);
            let sc = c
                .security_context
                .as_ref()
                .unwrap_or_else(|| panic!("{at}: no securityContext"));
            assert_eq!(sc.privileged, Some(false), "{at}: privileged: false");
            assert_eq!(
                sc.read_only_root_filesystem,
                Some(true),
                "{at}: readOnlyRootFilesystem: true"
            );
            let seccomp = sc
                .seccomp_profile
                .as_ref()
                .or(psc.seccomp_profile.as_ref())
                .map(|p| p.type_.as_str());
            assert_eq!(seccomp, Some("RuntimeDefault"), "{at}: seccompProfile");
            let caps = sc
                .capabilities
                .as_ref()
                .unwrap_or_else(|| panic!("{at}: no capabilities"));
            assert_eq!(
                caps.drop.as_deref(),
                Some(&["ALL".to_string()][..]),
                "{at}: drop ALL"
            );
            let uid = sc.run_as_user.or(psc.run_as_user);
            let gid = sc.run_as_group.or(psc.run_as_group);
            let non_root = sc.run_as_non_root.or(psc.run_as_non_root);
            assert_eq!(non_root, Some(true), "{at}: runAsNonRoot: true");
            assert!(
                uid.is_some_and(|u| u != 0),
                "{at}: an explicit non-root runAsUser"
            );
            assert!(
                gid.is_some_and(|g| g != 0),
                "{at}: an explicit non-root runAsGroup"
            );
            let added: Vec<&str> = caps.add.iter().flatten().map(String::as_str).collect();
            let group_0 = psc.supplemental_groups.iter().flatten().any(|g| *g == 0);
            match FILE_CAP_CONTAINERS
                .iter()
                .find(|(w, name, _)| *w == workload && *name == c.name)
            {
                Some((_, _, allowed)) => {
                    assert!(
                        added.iter().all(|a| allowed.contains(a)),
                        "{at}: adds {added:?}, more than {allowed:?}"
                    );
                    // Escalation only for the file capabilities.
                    assert_eq!(
                        sc.allow_privilege_escalation,
                        Some(!added.is_empty()),
                        "{at}: allowPrivilegeEscalation only with file capabilities"
                    );
                }
                None => {
                    assert!(added.is_empty(), "{at}: adds capabilities {added:?}");
                    assert_eq!(
                        sc.allow_privilege_escalation,
                        Some(false),
                        "{at}: allowPrivilegeEscalation: false"
                    );
                    assert!(!group_0, "{at}: in group 0");
                }
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_container_runs_locked_down_and_as_a_non_root_user() {
    for (what, objs) in both() {
        assert_eq!(
            check_lockdown(what, &objs),
            2,
            "{what}: agent and controller"
        );
    }
    // And with every chart option that changes the pods.
    let mut v = chart_values();
    v["agent"]["hostNetwork"] = true.into();
    v["agent"]["ncclSegments"] = false.into();
    v["controller"]["automountServiceAccountToken"] = false.into();
    let objs = typed(rendered_objects(&v));
    assert_eq!(check_lockdown("the chart with options", &objs), 2);
    // Without file capabilities the agent adds none and cannot escalate.
    v["agent"]["fileCapabilities"] = false.into();
    let objs = typed(rendered_objects(&v));
    assert_eq!(
        check_lockdown("the chart without file capabilities", &objs),
        2
    );
    let (_, c) = container(&objs, "DaemonSet", "warden-agent");
    let sc = c.security_context.as_ref().expect("security context");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert!(sc.capabilities.as_ref().is_some_and(|c| c.add.is_none()));
}

/// The container's environment as the kubelet would set it (downward API values from
/// NODE_NAME / POD_IP above, `$(VAR)` expanded from earlier variables; Secret
/// references left out).
fn pod_env(c: &Container) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in c.env.iter().flatten() {
        let v = if let Some(v) = &e.value {
            let mut v = v.clone();
            for (k, x) in &env {
                v = v.replace(&format!("$({k})"), x.as_str());
            }
            assert!(
                !v.contains("$("),
                "{}: {v} names an unknown variable",
                e.name
            );
            v
        } else if let Some(f) = e.value_from.as_ref().and_then(|f| f.field_ref.as_ref()) {
            match f.field_path.as_str() {
                "spec.nodeName" => NODE_NAME.to_owned(),
                "status.podIP" => POD_IP.to_owned(),
                other => panic!("{}: unexpected field {other}", e.name),
            }
        } else {
            continue;
        };
        env.insert(e.name.clone(), v);
    }
    env
}

/// The object behind file `path` in container `c`: ("ConfigMap" | "Secret", name, key).
fn mounted(pod: &PodSpec, c: &Container, path: &Path) -> Option<(&'static str, String, String)> {
    let dir = path.parent()?;
    let file = path.file_name()?.to_str()?;
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Path::new(&m.mount_path) == dir)?;
    let vol = pod.volumes.iter().flatten().find(|v| v.name == m.name)?;
    let key_of = |items: &Option<Vec<k8s_openapi::api::core::v1::KeyToPath>>| match items {
        None => Some(file.to_owned()),
        Some(items) => items.iter().find(|i| i.path == file).map(|i| i.key.clone()),
    };
    if let Some(cm) = &vol.config_map {
        return Some(("ConfigMap", cm.name.clone(), key_of(&cm.items)?));
    }
    if let Some(s) = &vol.secret {
        return Some(("Secret", s.secret_name.clone()?, key_of(&s.items)?));
    }
    None
}

fn config_text(objs: &[(Obj, Typed)], pod: &PodSpec, c: &Container) -> (String, String) {
    let args = c.args.clone().unwrap_or_default();
    let i = args
        .iter()
        .position(|a| a == "--config")
        .expect("the container is given --config");
    let path = args.get(i + 1).expect("--config has a value");
    let (kind, name, key) =
        mounted(pod, c, Path::new(path)).unwrap_or_else(|| panic!("{path} is not mounted"));
    assert_eq!(kind, "ConfigMap", "{path}");
    let Typed::ConfigMap(cm) = find(objs, "ConfigMap", &name) else {
        panic!("ConfigMap {name}");
    };
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .unwrap_or_else(|| panic!("ConfigMap {name} has no {key}"))
        .clone();
    let file = Path::new(path)
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name")
        .to_owned();
    (file, text)
}

fn container_port(c: &Container, name: &str) -> u16 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or_else(|| panic!("container {} has no port {name}", c.name))
}

#[test]
fn config_maps_hold_config_the_binaries_accept() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (what, objs) in both() {
        let (apod, agent) = container(&objs, "DaemonSet", "warden-agent");
        let (cpod, ctl) = container(&objs, "Deployment", "warden-controller");

        // The agent, loaded as main.rs loads it: NODE_NAME reaches --node-name.
        let (file, text) = config_text(&objs, apod, agent);
        let path = dir
            .path()
            .join(format!("{}-{file}", what.replace([' ', '/'], "-")));
        std::fs::write(&path, &text).expect("write config");
        let env = pod_env(agent);
        let flags = warden_agent::config::Overrides {
            node_name: env.get("NODE_NAME").cloned(),
            ..Default::default()
        };
        let cfg = warden_agent::config::AgentConfig::load(
            Some(&path),
            |k| env.get(k).cloned(),
            &flags,
            None,
        )
        .unwrap_or_else(|e| panic!("{what}: agent config refused: {e}\n{text}"));
        assert_eq!(cfg.node_name, NODE_NAME);
        assert_eq!(
            cfg.listen.to_string(),
            format!("{POD_IP}:{}", container_port(agent, "metrics")),
            "{what}: the agent listens on its container port"
        );
        let Typed::Service(svc) = find(&objs, "Service", "warden-controller") else {
            panic!("controller service");
        };
        let svc_port = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .map(|p| p.port)
            .expect("service port");
        assert_eq!(
            cfg.ship.url.as_deref(),
            Some(format!("http://warden-controller:{svc_port}").as_str()),
            "{what}: agents ship to the controller's Service"
        );
        let token = cfg
            .ship
            .token_file
            .as_deref()
            .expect("the agent sends a token");
        let agent_secret = mounted(apod, agent, token);
        assert_eq!(
            agent_secret,
            Some(("Secret", "warden-agent-token".into(), "token".into())),
            "{what}: token file"
        );
        let mounts: Vec<&str> = agent
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(
            mounts.contains(&cfg.kmsg.path.to_str().expect("path")),
            "{what}: kmsg mounted"
        );
        for s in &cfg.logs.sources {
            for p in &s.paths {
                assert!(
                    mounts.iter().any(|m| p.starts_with(&format!("{m}/"))),
                    "{what}: log path {p} is under a mount"
                );
            }
        }
        assert!(cfg.pod_resources.enabled, "{what}");
        let socket_dir = cfg.pod_resources.socket.parent().and_then(Path::to_str);
        assert!(
            socket_dir.is_some_and(|d| mounts.contains(&d)),
            "{what}: the kubelet's pod-resources socket {} is in a mount",
            cfg.pod_resources.socket.display()
        );

        // The controller.
        let (file, text) = config_text(&objs, cpod, ctl);
        let path = dir
            .path()
            .join(format!("{}-{file}", what.replace([' ', '/'], "-")));
        std::fs::write(&path, &text).expect("write config");
        let env = pod_env(ctl);
        let cfg = warden_controller::config::ControllerConfig::load(
            Some(&path),
            |k| env.get(k).cloned(),
            &warden_controller::config::Overrides::default(),
        )
        .unwrap_or_else(|e| panic!("{what}: controller config refused: {e}\n{text}"));
        assert_eq!(cfg.listen.port(), container_port(ctl, "http"), "{what}");
        assert!(
            cfg.listen.ip().is_unspecified(),
            "{what}: reachable through the Service"
        );
        let token = cfg
            .diagnosis
            .agent_token_file
            .as_deref()
            .expect("agent token");
        assert_eq!(
            mounted(cpod, ctl, token),
            agent_secret,
            "{what}: the same token both ways"
        );
        assert!(
            cfg.diagnosis
                .agent_url
                .ends_with(&format!(":{}", container_port(agent, "metrics"))),
            "{what}: log pulls go to the agent's port"
        );
    }
}

#[test]
fn services_monitors_and_policies_point_at_real_pods_and_ports() {
    let mut renamed = chart_values();
    renamed["nameOverride"] = "gpu-warden".into();
    let renamed = typed(rendered_objects(&renamed));
    for (what, objs) in both()
        .into_iter()
        .chain([("the chart with nameOverride", renamed)])
    {
        let workloads: Vec<(&BTreeMap<String, String>, &Container)> = objs
            .iter()
            .filter_map(|(_, t)| Some((t.pod_labels()?, &t.pod_spec()?.containers[0])))
            .collect();
        let selects = |sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>| {
            sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        };
        let mut services = Vec::new();
        for (o, t) in &objs {
            match t {
                Typed::Service(s) => {
                    let spec = s.spec.as_ref().expect("spec");
                    let sel = spec.selector.as_ref().expect("selector");
                    let (_, c) = workloads
                        .iter()
                        .find(|(l, _)| selects(sel, l))
                        .unwrap_or_else(|| panic!("{what}: {} selects no pods", o.id()));
                    for p in spec.ports.iter().flatten() {
                        let Some(IntOrString::String(name)) = &p.target_port else {
                            panic!("{what}: {} targets ports by name", o.id());
                        };
                        assert_eq!(
                            i32::from(container_port(c, name)),
                            p.port,
                            "{what}: {}",
                            o.id()
                        );
                    }
                    services.push(s.clone());
                }
                Typed::NetworkPolicy(np) => {
                    let spec = np.spec.as_ref().expect("spec");
                    let sel = spec
                        .pod_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.clone())
                        .unwrap_or_default();
                    let (_, c) = workloads
                        .iter()
                        .find(|(l, _)| selects(&sel, l))
                        .unwrap_or_else(|| panic!("{what}: {} selects no pods", o.id()));
                    let ports: BTreeSet<i32> =
                        c.ports.iter().flatten().map(|p| p.container_port).collect();
                    for rule in spec.ingress.iter().flatten() {
                        for p in rule.ports.iter().flatten() {
                            let Some(IntOrString::Int(n)) = p.port else {
                                panic!("{what}: {} names ports by number", o.id());
                            };
                            assert!(ports.contains(&n), "{what}: {} port {n}", o.id());
                        }
                        for peer in rule.from.iter().flatten() {
                            let Some(ps) = &peer.pod_selector else {
                                continue;
                            };
                            if peer.namespace_selector.is_some() {
                                continue;
                            }
                            let sel = ps.match_labels.clone().unwrap_or_default();
                            assert!(
                                workloads.iter().any(|(l, _)| selects(&sel, l)),
                                "{what}: {} admits pods that do not exist",
                                o.id()
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        // With two or more replicas (PostgreSQL store) a follower relays writes to the
        // leader's pod on its API port (controller/src/forward.rs, docs/DEPLOY.md): the
        // policy that selects the controller's pods must admit controller pods there.
        let ctl_labels = find(&objs, "Deployment", "warden-controller")
            .pod_labels()
            .expect("controller pod labels");
        let (_, ctl) = container(&objs, "Deployment", "warden-controller");
        let api = i32::from(container_port(ctl, "http"));
        let admits_controllers = objs.iter().any(|(_, t)| {
            let Typed::NetworkPolicy(np) = t else {
                return false;
            };
            let Some(spec) = np.spec.as_ref() else {
                return false;
            };
            let sel = spec
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone())
                .unwrap_or_default();
            selects(&sel, ctl_labels)
                && spec.ingress.iter().flatten().any(|rule| {
                    rule.from.iter().flatten().any(|peer| {
                        peer.namespace_selector.is_none()
                            && peer.pod_selector.as_ref().is_some_and(|ps| {
                                selects(&ps.match_labels.clone().unwrap_or_default(), ctl_labels)
                            })
                    }) && rule
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| p.port == Some(IntOrString::Int(api)))
                })
        });
        assert!(
            admits_controllers,
            "{what}: controller pods must reach each other on port {api} (a follower relays \
             writes to the leader)"
        );
        let monitors: Vec<_> = objs
            .iter()
            .filter_map(|(o, t)| match t {
                Typed::ServiceMonitor(sm) => Some((o, sm)),
                _ => None,
            })
            .collect();
        assert_eq!(
            monitors.len(),
            2,
            "{what}: controller and agents are scraped"
        );
        for (o, sm) in monitors {
            let sel = sm.spec.selector.match_labels.clone().unwrap_or_default();
            let svc = services
                .iter()
                .find(|s| s.metadata.labels.as_ref().is_some_and(|l| selects(&sel, l)))
                .unwrap_or_else(|| panic!("{what}: {} selects no Service", o.id()));
            for e in &sm.spec.endpoints {
                assert!(
                    svc.spec
                        .as_ref()
                        .and_then(|s| s.ports.as_ref())
                        .is_some_and(|ps| ps.iter().any(|p| p.name.as_deref() == Some(&e.port))),
                    "{what}: {} scrapes a port its Service has",
                    o.id()
                );
                // The alert rules select on these job names.
                let job = e
                    .relabelings
                    .iter()
                    .find(|r| r.target_label.as_deref() == Some("job"))
                    .and_then(|r| r.replacement.as_deref());
                assert_eq!(job, Some(o.name()), "{what}: {} job label", o.id());
            }
        }
    }
}

async fn status(router: axum::Router, path: &str) -> u16 {
    use tower::ServiceExt;
    let req = axum::http::Request::get(path)
        .body(axum::body::Body::empty())
        .expect("request");
    router
        .oneshot(req)
        .await
        .expect("router answers")
        .status()
        .as_u16()
}

#[tokio::test]
async fn probes_hit_routes_the_binaries_serve() {
    let agent = || {
        warden_agent::api::router(warden_agent::api::ApiState {
            registry: prometheus::Registry::new(),
            window: Arc::new(std::sync::Mutex::new(warden_agent::window::LogWindow::new(
                1024,
            ))),
            token: None,
            collectors_down: Arc::new(std::sync::Mutex::new(Vec::new())),
        })
    };
    let engine = warden_controller::SharedEngine::new(warden_engine::Engine::new(
        warden_engine::EngineConfig::default(),
        Default::default(),
    ));
    let operator = warden_controller::operate::Operator::in_memory(engine.clone())
        .await
        .expect("in-memory store");
    let controller = || {
        warden_controller::api::router(warden_controller::api::ApiState {
            engine: engine.clone(),
            clock: Arc::new(warden_engine::ManualClock::new(Default::default())),
            metrics: Arc::new(warden_controller::metrics::Metrics::new("test").expect("metrics")),
            max_batch_bytes: 1024,
            auth: Arc::new(warden_controller::auth::Auth::Open),
            operator: operator.clone(),
        })
    };
    for (what, objs) in both() {
        for (kind, name) in [
            ("DaemonSet", "warden-agent"),
            ("Deployment", "warden-controller"),
        ] {
            let (_, c) = container(&objs, kind, name);
            for probe in [&c.liveness_probe, &c.readiness_probe] {
                let get = probe
                    .as_ref()
                    .and_then(|p| p.http_get.as_ref())
                    .unwrap_or_else(|| panic!("{what}: {name}: HTTP probes"));
                let path = get.path.as_deref().expect("probe path");
                let IntOrString::String(port) = &get.port else {
                    panic!("{what}: {name}: probe ports by name");
                };
                container_port(c, port);
                let router = if kind == "DaemonSet" {
                    agent()
                } else {
                    controller()
                };
                assert_eq!(status(router, path).await, 200, "{what}: {name} {path}");
            }
        }
    }
    // A probe on a route that does not exist must be caught.
    assert_eq!(status(agent(), "/readyz").await, 404);
}

#[test]
fn kubernetes_validate_accepts_every_object() {
    let exe = warden_testkit::tools::venv().join("bin/kubernetes-validate");
    if !exe.exists() {
        let msg = format!(
            "{} is missing: run scripts/test, which installs kubernetes-validate",
            exe.display()
        );
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{msg}");
        eprintln!("NOT CHECKED against the Kubernetes schemas: {msg}");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = plain_files();
    for (name, text) in render(&chart_values()) {
        let p = dir.path().join(format!("chart-{name}"));
        std::fs::write(&p, text).expect("write rendered template");
        files.push(p);
    }
    let expected = plain().len() + chart().len();
    let crds = plain()
        .iter()
        .chain(chart().iter())
        .filter(|o| matches!(o.kind(), "ServiceMonitor" | "PrometheusRule"))
        .count();
    let out = std::process::Command::new(&exe)
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .args(&files)
        .output()
        .expect("kubernetes-validate runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");
    let passed = text
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    let skipped: Vec<&str> = text.lines().filter(|l| l.starts_with("WARN")).collect();
    assert!(
        skipped
            .iter()
            .all(|l| l.contains("kind ServiceMonitor") || l.contains("kind PrometheusRule")),
        "only the Prometheus Operator's CRDs lack a schema (k8s::ServiceMonitor and \
         k8s::PrometheusRule check them):\n{text}"
    );
    assert_eq!(skipped.len(), crds, "{text}");
    assert_eq!(
        passed + crds,
        expected,
        "every object was validated:\n{text}"
    );
}

/// (dotted path, preceded by a comment) of every key in values.yaml.
fn values_keys(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut block: Option<usize> = None;
    let mut prev_comment = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if let Some(b) = block {
            if t.is_empty() || indent > b {
                continue;
            }
            block = None;
        }
        if t.is_empty() {
            prev_comment = false;
            continue;
        }
        if t.starts_with('#') {
            prev_comment = true;
            continue;
        }
        let commented = std::mem::take(&mut prev_comment);
        if t.starts_with("- ") {
            continue;
        }
        let Some((key, rest)) = t.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        out.push((path.join("."), commented));
        stack.push((indent, key.to_owned()));
        if rest.trim().starts_with('|') || rest.trim().starts_with('>') {
            block = Some(indent);
        }
    }
    out
}

#[test]
fn every_chart_value_is_documented_and_used() {
    let keys = values_keys(&read(&chart_dir().join("values.yaml")));
    let re = regex::Regex::new(r"\.Values\.([A-Za-z0-9_.]+)").expect("regex");
    let mut used = BTreeSet::new();
    for entry in std::fs::read_dir(chart_dir().join("templates")).expect("templates") {
        let path = entry.expect("entry").path();
        for c in re.captures_iter(&read(&path)) {
            used.insert(c[1].to_owned());
        }
    }
    assert!(!used.is_empty());
    let mut problems = Vec::new();
    for u in &used {
        match keys.iter().find(|(k, _)| k == u) {
            None => problems.push(format!("{u}: used by a template, not in values.yaml")),
            Some((_, false)) => problems.push(format!("{u}: no comment says what it is")),
            Some(_) => {}
        }
    }
    for (k, _) in &keys {
        let reached = used
            .iter()
            .any(|u| u == k || k.starts_with(&format!("{u}.")) || u.starts_with(&format!("{k}.")));
        if !reached {
            problems.push(format!("{k}: in values.yaml but no template uses it"));
        }
    }
    assert!(problems.is_empty(), "values.yaml:\n{}", problems.join("\n"));
}

/// The dotted path of every key under `v`, where `children` gives a node's keyed
/// children (a values map itself, a schema's `properties`).
fn key_paths(
    v: &Value,
    at: &str,
    children: fn(&Value) -> Option<&serde_json::Map<String, Value>>,
    out: &mut BTreeSet<String>,
) {
    for (k, x) in children(v).into_iter().flatten() {
        let p = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        key_paths(x, &p, children, out);
        out.insert(p);
    }
}

/// values.schema.json, the schema Helm checks values against on install, upgrade and
/// lint, checked here by Python's `jsonschema` (installed with kubernetes-validate): it
/// is a valid Draft 7 schema, the defaults pass, mistakes a user makes are refused, and
/// it names exactly the keys of values.yaml.
#[test]
fn values_schema_accepts_the_defaults_and_refuses_mistakes() {
    let python = warden_testkit::tools::venv().join("bin/python");
    if !python.exists() {
        let msg = format!("{} is missing: run scripts/test", python.display());
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{msg}");
        eprintln!("NOT CHECKED: {msg}");
        return;
    }
    let schema_path = chart_dir().join("values.schema.json");
    let schema: Value = serde_json::from_str(&read(&schema_path)).expect("the schema is JSON");
    let (mut want, mut have) = (BTreeSet::new(), BTreeSet::new());
    // Free-form maps and lists (labels, annotations, affinity, resources) are values, not
    // keys the schema lists.
    let free = |p: &String| {
        [
            "nodeSelector.",
            "Labels.",
            "labels.",
            "podAnnotations.",
            "affinity.",
            "resources.",
            "config.",
        ]
        .iter()
        .any(|f| p.contains(f))
    };
    key_paths(&chart_values(), "", Value::as_object, &mut want);
    key_paths(
        &schema,
        "",
        |s| s.get("properties").and_then(Value::as_object),
        &mut have,
    );
    want.retain(|p| !free(p));
    have.retain(|p| !free(p));
    assert_eq!(
        want.symmetric_difference(&have).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "keys of values.yaml and properties of values.schema.json"
    );

    let check = |values: &Value| -> Result<(), String> {
        let script = "import json, sys\n\
                      import jsonschema\n\
                      schema = json.load(open(sys.argv[1]))\n\
                      jsonschema.Draft7Validator.check_schema(schema)\n\
                      errors = sorted(e.message for e in jsonschema.Draft7Validator(schema).iter_errors(json.load(sys.stdin)))\n\
                      print('\\n'.join(errors))\n\
                      sys.exit(1 if errors else 0)\n";
        let mut child = std::process::Command::new(&python)
            .arg("-c")
            .arg(script)
            .arg(&schema_path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python runs");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin
                .write_all(values.to_string().as_bytes())
                .expect("values to python");
        }
        let out = child.wait_with_output().expect("python ends");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match out.status.code() {
            Some(0) => Ok(()),
            Some(1) if !text.contains("Traceback") => Err(text),
            _ => panic!("the schema check did not run: {text}"),
        }
    };
    check(&chart_values()).unwrap_or_else(|e| panic!("the defaults are refused: {e}"));
    for (what, path, bad, says) in [
        (
            "a port as text",
            "/agent/port",
            serde_json::json!("9461x"),
            "is not of type 'integer'",
        ),
        (
            "a port out of range",
            "/controller/port",
            70000.into(),
            "is greater than the maximum",
        ),
        (
            "an unknown pull policy",
            "/agent/image/pullPolicy",
            "Sometimes".into(),
            "is not one of",
        ),
        (
            "an empty selector",
            "/alerts/agentSelector",
            "".into(),
            "''",
        ),
        (
            "a pull secret without a name",
            "/imagePullSecrets",
            serde_json::json!([{"nam": "x"}]),
            "unexpected",
        ),
        (
            "a misspelt key",
            "/controller/extraEnvs",
            serde_json::json!([]),
            "unexpected",
        ),
        (
            "a label that is not text",
            "/serviceMonitor/labels",
            serde_json::json!({"release": 1}),
            "is not of type 'string'",
        ),
        (
            "a config as text, as the chart took it before",
            "/agent/config",
            "controller:\n  flush_interval_ms: 1000\n".into(),
            "is not of type 'object'",
        ),
        (
            "a controller config as text",
            "/controller/config",
            "data_dir: /var/lib/warden\n".into(),
            "is not of type 'object'",
        ),
        (
            "a name that is not a DNS label",
            "/nameOverride",
            "Warden_GPU".into(),
            "does not match",
        ),
        (
            "a name too long for the labels",
            "/nameOverride",
            "w".repeat(41).into(),
            "is too long",
        ),
    ] {
        let mut v = chart_values();
        let (parent, key) = path.rsplit_once('/').expect("a path");
        v.pointer_mut(if parent.is_empty() { "" } else { parent })
            .and_then(Value::as_object_mut)
            .expect("the parent object")
            .insert(key.to_owned(), bad);
        let err = check(&v).expect_err(what);
        assert!(err.contains(says), "{what}: {err}");
    }
}

/// The real helm (`warden_testkit::tools::helm`), run with homes of its own in a temp
/// dir and a kubeconfig that does not exist: nothing of the user's is read or written,
/// and no cluster is reached.
struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    fn find() -> Option<Helm> {
        Some(Helm {
            bin: warden_testkit::tools::helm()?,
            home: tempfile::tempdir().expect("temp dir"),
        })
    }

    /// `helm ARGS`: (exit status 0, stdout, stderr).
    fn run(&self, args: &[&std::ffi::OsStr]) -> (bool, String, String) {
        let home = self.home.path();
        let out = std::process::Command::new(&self.bin)
            .args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env("KUBECONFIG", home.join("no-kubeconfig"))
            .output()
            .unwrap_or_else(|e| panic!("{} does not run: {e}", self.bin.display()));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `values` written where helm can read it with `-f` (JSON).
    fn values_file(&self, name: &str, values: &Value) -> PathBuf {
        let path = self.home.path().join(format!("{name}.json"));
        std::fs::write(&path, values.to_string()).expect("write values");
        path
    }

    fn version(&self) -> String {
        self.run(&["version".as_ref(), "--short".as_ref()])
            .1
            .trim()
            .to_owned()
    }
}

/// `over` merged into `base` as Helm merges a values file into the chart's values: maps
/// key by key, anything else replaced, a null removing the key.
fn coalesce(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    _ if v.is_null() => {
                        b.remove(k);
                    }
                    Some(old) if old.is_object() && v.is_object() => coalesce(old, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Values files a user might give: none; every option the chart has turned on (and its
/// configs changed key by key); every option off. (name, release, namespace, values).
fn helm_value_sets() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let extras = |who: &str| {
        serde_json::json!({
            "podAnnotations": {"example.com/team": "ml-infra"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]}
                ]}]
            }}},
            "extraEnv": [{"name": "EXTRA", "value": who}, {"name": "FLAG", "value": "true"}],
            "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
            "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": true}],
            "image": {"repository": format!("registry.example.com/warden-{who}"), "tag": "0.1.0-rc.1", "pullPolicy": "Always"},
            "logLevel": "info,warden=debug",
            "resources": {"requests": {"cpu": "100m", "memory": "48Mi"}, "limits": {"memory": "1Gi"}},
        })
    };
    let mut on = serde_json::json!({
        "fullnameOverride": "ml-warden",
        "nameOverride": "gpu-warden",
        "imagePullSecrets": [{"name": "regcred"}],
        "agent": {
            "hostNetwork": true,
            "port": 19461,
            "maxUnavailable": 2,
            "fileCapabilities": true,
            "ncclSegments": true,
            "podResources": {"enabled": true},
            "nodeSelector": {"nvidia.com/gpu.present": "true", "pool": "training"},
            "serviceAccount": {"create": true, "name": "", "annotations": {"example.com/owner": "infra"}},
            "config": {
                "nvml": {"dcgm_compat": true, "interval_ms": 500},
                "kmsg": null,
                "logs": {"sources": [
                    {"paths": ["/var/log/pods/*/*/*.log"], "format": "cri"},
                    {"paths": ["/var/log/containers/*.log"], "format": "cri"}
                ]},
            },
        },
        "controller": {
            "port": 19460,
            "automountServiceAccountToken": true,
            "nodeSelector": {"node-role/infra": "true"},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
            "serviceAccount": {"create": false, "name": "platform-sa", "annotations": {}},
            "config": {
                "remediation": {"dry_run": false, "breaker": {"max_nodes": 2}},
                "diagnosis": {"agent_url": "http://{node}.nodes.example.com:19461"},
                "traces": {"otlp_endpoint": "http://otel-collector:4318"},
            },
        },
        "secrets": {"agentToken": "agent-token", "apiTokens": "api-tokens", "database": "pg", "llmApiKey": "llm"},
        "rbac": {"create": true},
        "serviceMonitor": {"enabled": true, "interval": "30s", "labels": {"release": "prometheus"}},
        "alerts": {
            "prometheusRule": {"enabled": true, "labels": {"release": "prometheus"}},
            "agentSelector": "job=\"gpu-nodes\",namespace=\"ml\"",
            "controllerSelector": "job=~\"warden-ctl|warden-controller-.*\"",
            "runbookUrl": "https://wiki.example.com/warden/alerts",
        },
        "networkPolicy": {
            "enabled": true,
            "prometheusNamespace": "observability",
            "prometheusPodLabels": {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"},
        },
    });
    for who in ["agent", "controller"] {
        coalesce(&mut on[who], &extras(who));
    }
    let off = serde_json::json!({
        "agent": {
            "hostNetwork": false,
            "fileCapabilities": false,
            "ncclSegments": false,
            "podResources": {"enabled": false},
            "serviceAccount": {"create": false, "name": "node-agent"},
        },
        "controller": {
            "automountServiceAccountToken": false,
            "serviceAccount": {"create": false, "name": ""},
        },
        "rbac": {"create": false},
        "serviceMonitor": {"enabled": false},
        "alerts": {"prometheusRule": {"enabled": false}},
        "networkPolicy": {"enabled": false},
    });
    vec![
        ("the defaults", RELEASE, NAMESPACE, serde_json::json!({})),
        ("every option on", "prod", "ml", on),
        ("every option off", "lean", "gpu-ops", off),
    ]
}

#[test]
fn helm_lints_the_chart_strictly_with_defaults_and_every_option() {
    let Some(helm) = Helm::find() else {
        return;
    };
    let chart = chart_dir();
    for (what, _, namespace, values) in helm_value_sets() {
        let file = helm.values_file("values", &values);
        let (ok, out, err) = helm.run(&[
            "lint".as_ref(),
            "--strict".as_ref(),
            chart.as_os_str(),
            "--namespace".as_ref(),
            namespace.as_ref(),
            "-f".as_ref(),
            file.as_os_str(),
        ]);
        let text = format!("{out}{err}");
        assert!(
            ok && text.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm {} lint --strict, {what}:\n{text}",
            helm.version()
        );
        let findings: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with('['))
            .filter(|l| *l != "[INFO] Chart.yaml: icon is recommended")
            .collect();
        assert!(
            findings.is_empty(),
            "helm lint, {what}: {findings:#?}\n{text}"
        );
    }
}

/// `helm template` and this crate's renderer (helm.rs) make the same objects from the
/// same values: the renderer the other tests trust is the real thing's twin. And `helm
/// install --dry-run=client` shows the NOTES.txt the renderer renders.
#[test]
fn helm_renders_the_same_objects_and_notes_as_the_test_renderer() {
    let Some(helm) = Helm::find() else {
        return;
    };
    let chart = chart_dir();
    let renderer = helm::Chart::load(&chart).unwrap_or_else(|e| panic!("chart: {e}"));
    for (what, release, namespace, overrides) in helm_value_sets() {
        let file = helm.values_file("values", &overrides);
        let mut values = chart_values();
        coalesce(&mut values, &overrides);

        let (ok, out, err) = helm.run(&[
            "template".as_ref(),
            release.as_ref(),
            chart.as_os_str(),
            "--namespace".as_ref(),
            namespace.as_ref(),
            "-f".as_ref(),
            file.as_os_str(),
        ]);
        assert!(ok, "helm template, {what}:\n{err}");
        let key = |o: &Obj| format!("{}/{}", o.kind(), o.name());
        let mut from_helm = BTreeMap::new();
        for o in yaml_objects(&out, &format!("helm template ({what})")) {
            assert!(
                from_helm.insert(key(&o), o.value).is_none(),
                "helm, {what}: {} twice",
                o.origin
            );
        }
        let mut ours = BTreeMap::new();
        let rendered = renderer
            .render(&values, release, namespace)
            .unwrap_or_else(|e| panic!("the renderer, {what}: {e}"));
        for (name, text) in &rendered {
            for o in yaml_objects(text, &format!("templates/{name}")) {
                assert!(
                    ours.insert(key(&o), o.value).is_none(),
                    "renderer, {what}: {} twice",
                    o.origin
                );
            }
        }
        assert_eq!(
            from_helm.keys().collect::<Vec<_>>(),
            ours.keys().collect::<Vec<_>>(),
            "{what}: helm's objects and the renderer's"
        );
        // The config files inside the ConfigMaps by what they hold: the renderer's
        // `toYaml` prints valid YAML, not go-yaml's exact characters.
        let text_from_helm = from_helm.clone();
        let (from_helm, ours) = (config_data_parsed(&from_helm), config_data_parsed(&ours));
        for (id, h) in &from_helm {
            let mine = &ours[id];
            if h == mine {
                continue;
            }
            let mut diffs = Vec::new();
            k8s::diff(h, mine, id, &mut diffs);
            let show = |v: &Value| serde_saphyr::to_string(v).unwrap_or_else(|e| e.to_string());
            panic!(
                "{what}: helm {} and the renderer differ first in {id}:\n{}\n\
                 (\"only in the input\": helm's only; \"after the round trip\": the \
                 renderer's only)\n--- helm:\n{}\n--- renderer:\n{}",
                helm.version(),
                diffs.join("\n"),
                show(h),
                show(mine)
            );
        }
        // Rendered with helm, the config files load.
        let text = |id: &str, file: &str| {
            text_from_helm[id]["data"][file]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: {id} has no {file}"))
                .to_owned()
        };
        let prefix = values["fullnameOverride"]
            .as_str()
            .filter(|p| !p.is_empty())
            .unwrap_or(release)
            .to_owned();
        let dir = tempfile::tempdir().expect("temp dir");
        let agent_file = dir.path().join("agent.yaml");
        std::fs::write(
            &agent_file,
            text(&format!("ConfigMap/{prefix}-agent"), "agent.yaml"),
        )
        .expect("write");
        let env = BTreeMap::from([
            ("WARDEN_CONTROLLER_URL", "http://controller:9460".to_owned()),
            ("WARDEN_LISTEN", "127.0.0.1:9461".to_owned()),
        ]);
        warden_agent::config::AgentConfig::load(
            Some(&agent_file),
            |k| env.get(k).cloned(),
            &warden_agent::config::Overrides {
                node_name: Some(NODE_NAME.into()),
                ..Default::default()
            },
            None,
        )
        .unwrap_or_else(|e| panic!("{what}: helm's agent.yaml is refused: {e}"));
        let ctl_file = dir.path().join("controller.yaml");
        std::fs::write(
            &ctl_file,
            text(&format!("ConfigMap/{prefix}-controller"), "controller.yaml"),
        )
        .expect("write");
        warden_controller::config::ControllerConfig::load(
            Some(&ctl_file),
            |_| None,
            &warden_controller::config::Overrides::default(),
        )
        .unwrap_or_else(|e| panic!("{what}: helm's controller.yaml is refused: {e}"));

        // NOTES.txt, as an install shows it.
        let (ok, out, err) = helm.run(&[
            "install".as_ref(),
            release.as_ref(),
            chart.as_os_str(),
            "--dry-run=client".as_ref(),
            "--namespace".as_ref(),
            namespace.as_ref(),
            "-f".as_ref(),
            file.as_os_str(),
        ]);
        assert!(ok, "helm install --dry-run=client, {what}:\n{err}");
        let (_, notes) = out
            .split_once("\nNOTES:\n")
            .unwrap_or_else(|| panic!("{what}: no NOTES in helm's output:\n{out}"));
        let expected = renderer
            .notes(&values, release, namespace)
            .expect("the chart has NOTES.txt")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            notes.trim(),
            expected.trim(),
            "{what}: NOTES.txt from helm (left) and the renderer (right)"
        );
    }
}

/// Helm checks values against values.schema.json before it renders anything: a
/// mistake is refused with the key it is at.
#[test]
fn helm_refuses_values_the_schema_refuses_and_names_the_key() {
    let Some(helm) = Helm::find() else {
        return;
    };
    let chart = chart_dir();
    for (what, values, says) in [
        (
            "a port as text",
            serde_json::json!({"agent": {"port": "x"}}),
            "/agent/port",
        ),
        (
            "a negative port",
            serde_json::json!({"controller": {"port": -1}}),
            "/controller/port",
        ),
        (
            "a config as text, as the chart took it before",
            serde_json::json!({"agent": {"config": "controller: {}\n"}}),
            "/agent/config",
        ),
        (
            "a name that is not a DNS label",
            serde_json::json!({"nameOverride": "Warden_GPU"}),
            "/nameOverride",
        ),
        (
            "a misspelt key",
            serde_json::json!({"agent": {"podResource": {"enabled": false}}}),
            "podResource",
        ),
    ] {
        let file = helm.values_file("bad", &values);
        let (ok, out, err) = helm.run(&[
            "template".as_ref(),
            RELEASE.as_ref(),
            chart.as_os_str(),
            "-f".as_ref(),
            file.as_os_str(),
        ]);
        assert!(!ok, "helm renders {what}:\n{out}");
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(says),
            "{what}: helm's error does not name {says}:\n{err}"
        );
    }
}
