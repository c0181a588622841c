//! The Kubernetes actuator against a scripted API server: each test lists the exact
//! requests it expects (method, path and query, the JSON body fields that matter) with
//! the answer to each; a spawned task answers them in order and fails the test on any
//! other request, on one too many, or on one that never came.

use std::path::PathBuf;
use std::pin::pin;

use hyper::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use warden_controller::remedy::kubernetes::{JobKind, KubeActuator, KubeConfig};
use warden_controller::remedy::{
    ActuatorError, CheckOutcome, Isolation, Outcome, Release, Restart, ResumePoint,
};
use warden_model::Timestamp;

/// 2023-11-14T22:13:20Z.
const AT: Timestamp = Timestamp(1_700_000_000_000_000_000);
const AT_RFC3339: &str = "2023-11-14T22:13:20.000000000Z";
const INCIDENT: &str = "inc-0001700000000000-0001";

/// Checks a request's JSON body (panics when it is wrong).
type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One expected request and the answer to it.
struct Exchange {
    method: Method,
    uri: String,
    body: Option<BodyCheck>,
    status: u16,
    reply: Value,
}

fn expect(method: Method, uri: &str, status: u16, reply: Value) -> Exchange {
    Exchange {
        method,
        uri: uri.to_owned(),
        body: None,
        status,
        reply,
    }
}

impl Exchange {
    fn body(mut self, check: impl Fn(&Value) + Send + 'static) -> Self {
        self.body = Some(Box::new(check));
        self
    }
}

/// An API error answer, as the server writes it.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

/// A request target as its path and its query's parameters, in order (still
/// percent-encoded; empty parameters, like the `&` in `?&a=b`, dropped).
fn split_uri(uri: &str) -> (&str, Vec<&str>) {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    (path, query.split('&').filter(|p| !p.is_empty()).collect())
}

/// A client whose requests go to a task that answers `script` in order. Await the
/// handle after the actuator is dropped: it fails if a request was missing or extra.
fn scripted(script: Vec<Exchange>) -> (kube::Client, tokio::task::JoinHandle<()>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let total = script.len();
        for (i, step) in script.into_iter().enumerate() {
            let (request, reply) = handle.next_request().await.unwrap_or_else(|| {
                panic!(
                    "request {}/{total} ({} {}) never came",
                    i + 1,
                    step.method,
                    step.uri
                )
            });
            let uri = request.uri().to_string();
            assert_eq!(
                (request.method(), split_uri(&uri)),
                (&step.method, split_uri(&step.uri)),
                "request {}/{total}: {uri}",
                i + 1
            );
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .expect("request body");
            if let Some(check) = &step.body {
                let body: Value = serde_json::from_slice(&bytes).expect("a JSON body");
                check(&body);
            }
            let response = Response::builder()
                .status(step.status)
                .header("content-type", "application/json")
                .body(Body::from(
                    serde_json::to_vec(&step.reply).expect("reply JSON"),
                ))
                .expect("response");
            reply.send_response(response);
        }
        if let Some((request, _)) = handle.next_request().await {
            panic!(
                "unexpected request after the script: {} {}",
                request.method(),
                request.uri()
            );
        }
    });
    (kube::Client::new(service, "default"), server)
}

/// Run `f` against the actuator over `script`, then check the server saw exactly it.
async fn run<T, F>(config: KubeConfig, script: Vec<Exchange>, f: F) -> T
where
    F: AsyncFnOnce(&KubeActuator) -> T,
{
    let (client, server) = scripted(script);
    let out = {
        let actuator = KubeActuator::new(client, config);
        f(&actuator).await
    };
    server
        .await
        .expect("the scripted server saw exactly its script");
    out
}

fn node(rv: &str, unschedulable: bool, annotations: Value, taints: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-7", "resourceVersion": rv, "annotations": annotations},
        "spec": {"unschedulable": unschedulable, "taints": taints},
    })
}

fn ours() -> Value {
    json!({
        "warden.io/owner": "warden", "warden.io/reason": "xid 79",
        "warden.io/incident": INCIDENT, "warden.io/by": "policy", "warden.io/at": AT_RFC3339,
        "team": "ml",
    })
}

fn gpu_taint() -> Value {
    json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
}

fn warden_taint() -> Value {
    json!({"key": "warden.io/fault", "value": INCIDENT, "effect": "NoSchedule"})
}

fn isolation(evict: bool) -> Isolation {
    Isolation {
        node: "gpu-7".to_owned(),
        incident: Some(INCIDENT.to_owned()),
        reason: "xid 79: GPU fell off the bus".to_owned(),
        by: "policy".to_owned(),
        at: AT,
        evict,
    }
}

fn release() -> Release {
    Release {
        node: "gpu-7".to_owned(),
        by: "auto-uncordon".to_owned(),
        at: AT,
    }
}

const NODE: &str = "/api/v1/nodes/gpu-7";
const NODE_PATCH: &str = "/api/v1/nodes/gpu-7?fieldManager=warden";

/// The cordon patch of [`isolation`] on a node at resourceVersion `rv`.
fn cordon_patch(rv: &'static str) -> impl Fn(&Value) + Send + 'static {
    move |b: &Value| {
        assert_eq!(b["metadata"]["resourceVersion"], rv, "{b}");
        assert_eq!(
            b["metadata"]["annotations"],
            json!({
                "warden.io/owner": "warden",
                "warden.io/reason": "xid 79: GPU fell off the bus",
                "warden.io/incident": INCIDENT,
                "warden.io/by": "policy",
                "warden.io/at": AT_RFC3339,
            }),
        );
        assert_eq!(b["spec"]["unschedulable"], true);
        assert_eq!(b["spec"]["taints"], json!([gpu_taint(), warden_taint()]));
    }
}

#[tokio::test]
async fn cordons_taints_and_annotates_a_fresh_node() {
    let fresh = node("100", false, json!({"team": "ml"}), json!([gpu_taint()]));
    let script = vec![
        expect(Method::GET, NODE, 200, fresh.clone()),
        expect(Method::PATCH, NODE_PATCH, 200, fresh).body(cordon_patch("100")),
    ];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(false)).await
    })
    .await;
    assert_eq!(out.expect("isolated"), Outcome::Applied);
}

#[tokio::test]
async fn a_manual_drain_is_tainted_manual() {
    let fresh = node("5", false, json!({}), json!([]));
    let script = vec![
        expect(Method::GET, NODE, 200, fresh.clone()),
        expect(Method::PATCH, NODE_PATCH, 200, fresh).body(|b| {
            assert_eq!(
                b["spec"]["taints"],
                json!([{"key": "warden.io/fault", "value": "manual", "effect": "NoSchedule"}])
            );
            assert_eq!(
                b["metadata"]["annotations"]["warden.io/incident"],
                Value::Null
            );
            assert_eq!(b["metadata"]["annotations"]["warden.io/by"], "alice");
        }),
    ];
    let req = Isolation {
        incident: None,
        by: "alice".to_owned(),
        ..isolation(false)
    };
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&req).await
    })
    .await;
    assert_eq!(out.expect("isolated"), Outcome::Applied);
}

#[tokio::test]
async fn a_node_warden_already_isolated_is_left_as_it_is() {
    let done = node("7", true, ours(), json!([gpu_taint(), warden_taint()]));
    let script = vec![expect(Method::GET, NODE, 200, done)];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(false)).await
    })
    .await;
    assert_eq!(out.expect("no change"), Outcome::AlreadyDone);
}

#[tokio::test]
async fn a_node_cordoned_by_someone_else_is_not_touched() {
    let foreign = node("8", true, json!({"team": "ml"}), json!([]));
    let script = vec![expect(Method::GET, NODE, 200, foreign)];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(true)).await
    })
    .await;
    assert_eq!(
        out.expect("left alone"),
        Outcome::NotOurs {
            owner: "unknown".to_owned()
        }
    );

    let other = node("9", true, json!({"warden.io/owner": "ops-bot"}), json!([]));
    let script = vec![expect(Method::GET, NODE, 200, other)];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(false)).await
    })
    .await;
    assert_eq!(
        out.expect("left alone"),
        Outcome::NotOurs {
            owner: "ops-bot".to_owned()
        }
    );
}

#[tokio::test]
async fn a_conflict_reads_the_node_again_and_retries() {
    let v1 = node("100", false, json!({"team": "ml"}), json!([gpu_taint()]));
    let v2 = node("101", false, json!({"team": "ml"}), json!([gpu_taint()]));
    let conflict = status(409, "Conflict", "the object has been modified");
    let script = vec![
        expect(Method::GET, NODE, 200, v1),
        expect(Method::PATCH, NODE_PATCH, 409, conflict).body(cordon_patch("100")),
        expect(Method::GET, NODE, 200, v2.clone()),
        expect(Method::PATCH, NODE_PATCH, 200, v2).body(cordon_patch("101")),
    ];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(false)).await
    })
    .await;
    assert_eq!(out.expect("isolated on the second try"), Outcome::Applied);
}

#[tokio::test]
async fn conflicts_that_never_end_ask_for_a_retry() {
    let fresh = node("1", false, json!({}), json!([]));
    let conflict = status(409, "Conflict", "the object has been modified");
    let config = KubeConfig {
        conflict_retries: 1,
        ..KubeConfig::default()
    };
    let script = vec![
        expect(Method::GET, NODE, 200, fresh.clone()),
        expect(Method::PATCH, NODE_PATCH, 409, conflict.clone()),
        expect(Method::GET, NODE, 200, fresh),
        expect(Method::PATCH, NODE_PATCH, 409, conflict),
    ];
    let out = run(config, script, async |a| a.isolate(&isolation(false)).await).await;
    assert!(matches!(out, Err(ActuatorError::Retry { .. })), "{out:?}");
}

#[tokio::test]
async fn an_unknown_node_is_not_found() {
    let script = vec![expect(
        Method::GET,
        NODE,
        404,
        status(404, "NotFound", "nodes \"gpu-7\" not found"),
    )];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(true)).await
    })
    .await;
    assert!(matches!(out, Err(ActuatorError::NotFound(_))), "{out:?}");
}

#[tokio::test]
async fn bad_names_send_nothing() {
    let req = Isolation {
        node: "GPU_7".to_owned(),
        ..isolation(false)
    };
    let out = run(KubeConfig::default(), vec![], async |a| {
        a.isolate(&req).await
    })
    .await;
    assert!(matches!(out, Err(ActuatorError::Failed { .. })), "{out:?}");
    let req = restart(Some("train"), "../jobs");
    let out = run(KubeConfig::default(), vec![], async |a| {
        a.restart(&req).await
    })
    .await;
    assert!(matches!(out, Err(ActuatorError::Failed { .. })), "{out:?}");
}

fn pod(ns: &str, name: &str, extra_meta: Value) -> Value {
    let mut meta = json!({"name": name, "namespace": ns});
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), extra_meta.as_object()) {
        m.extend(extra.clone());
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}})
}

fn pod_list(pods: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": pods})
}

fn eviction_of(ns: &'static str, name: &'static str) -> impl Fn(&Value) + Send + 'static {
    move |b: &Value| {
        assert_eq!(b["apiVersion"], "policy/v1", "{b}");
        assert_eq!(b["kind"], "Eviction");
        assert_eq!(b["metadata"]["name"], name);
        assert_eq!(b["metadata"]["namespace"], ns);
    }
}

#[tokio::test]
async fn eviction_skips_daemonsets_and_reports_a_pdb_as_retry() {
    let done = node("7", true, ours(), json!([warden_taint()]));
    let daemon = pod(
        "warden",
        "warden-agent-x1",
        json!({"ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "warden-agent",
            "uid": "u1", "controller": true,
        }]}),
    );
    let mirror = pod(
        "kube-system",
        "kube-proxy-gpu-7",
        json!({"annotations": {"kubernetes.io/config.mirror": "abc"}}),
    );
    let leaving = pod(
        "train",
        "old-0",
        json!({"deletionTimestamp": "2023-11-14T22:00:00Z"}),
    );
    let worker = pod("train", "worker-0", json!({}));
    let guarded = pod("serve", "api-0", json!({}));
    let evicted = json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201});
    let config = KubeConfig {
        eviction_grace_secs: Some(30),
        ..KubeConfig::default()
    };
    let script = vec![
        expect(Method::GET, NODE, 200, done),
        expect(
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-7",
            200,
            pod_list(vec![daemon, mirror, leaving, worker, guarded]),
        ),
        expect(
            Method::POST,
            "/api/v1/namespaces/train/pods/worker-0/eviction?",
            201,
            evicted,
        )
        .body(|b| {
            eviction_of("train", "worker-0")(b);
            assert_eq!(b["deleteOptions"]["gracePeriodSeconds"], 30);
        }),
        expect(
            Method::POST,
            "/api/v1/namespaces/serve/pods/api-0/eviction?",
            429,
            status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ),
        )
        .body(eviction_of("serve", "api-0")),
    ];
    let out = run(config, script, async |a| a.isolate(&isolation(true)).await).await;
    match out {
        Err(ActuatorError::Retry { what, why }) => {
            assert!(what.contains("gpu-7"), "{what}");
            assert!(why.contains("serve/api-0"), "{why}");
            assert!(why.contains("disruption budget"), "{why}");
            assert!(!why.contains("worker-0"), "{why}");
        }
        other => panic!("a PDB asks for a retry, got {other:?}"),
    }
}

#[tokio::test]
async fn eviction_of_a_vanished_pod_is_fine_and_a_conflict_is_retried() {
    let fresh = node("3", false, json!({}), json!([]));
    let evicted = json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201});
    let script = vec![
        expect(Method::GET, NODE, 200, fresh.clone()),
        expect(Method::PATCH, NODE_PATCH, 200, fresh),
        expect(
            Method::GET,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-7",
            200,
            pod_list(vec![
                pod("train", "gone-0", json!({})),
                pod("train", "w-1", json!({})),
            ]),
        ),
        expect(
            Method::POST,
            "/api/v1/namespaces/train/pods/gone-0/eviction?",
            404,
            status(404, "NotFound", "pods \"gone-0\" not found"),
        ),
        expect(
            Method::POST,
            "/api/v1/namespaces/train/pods/w-1/eviction?",
            409,
            status(409, "Conflict", "the object has been modified"),
        ),
        expect(
            Method::POST,
            "/api/v1/namespaces/train/pods/w-1/eviction?",
            201,
            evicted,
        )
        .body(|b| {
            eviction_of("train", "w-1")(b);
            assert!(b.get("deleteOptions").is_none(), "the pod's own grace: {b}");
        }),
    ];
    let out = run(KubeConfig::default(), script, async |a| {
        a.isolate(&isolation(true)).await
    })
    .await;
    assert_eq!(out.expect("drained"), Outcome::Applied);
}

#[tokio::test]
async fn release_uncordons_warden_s_node_and_keeps_other_taints() {
    let held = node("40", true, ours(), json!([gpu_taint(), warden_taint()]));
    let script = vec![
        expect(Method::GET, NODE, 200, held.clone()),
        expect(Method::PATCH, NODE_PATCH, 200, held).body(|b| {
            assert_eq!(b["metadata"]["resourceVersion"], "40");
            assert_eq!(
                b["metadata"]["annotations"],
                json!({
                    "warden.io/owner": null, "warden.io/reason": null,
                    "warden.io/incident": null, "warden.io/by": null, "warden.io/at": null,
                }),
            );
            assert_eq!(b["spec"]["unschedulable"], false);
            assert_eq!(b["spec"]["taints"], json!([gpu_taint()]));
        }),
    ];
    let out = run(KubeConfig::default(), script, async |a| {
        a.release(&release()).await
    })
    .await;
    assert_eq!(out.expect("released"), Outcome::Applied);
}

#[tokio::test]
async fn release_refuses_a_foreign_cordon() {
    let foreign = node(
        "41",
        true,
        json!({"warden.io/owner": "ops-bot"}),
        json!([gpu_taint()]),
    );
    let script = vec![expect(Method::GET, NODE, 200, foreign)];
    let out = run(KubeConfig::default(), script, async |a| {
        a.release(&release()).await
    })
    .await;
    assert_eq!(
        out.expect("left alone"),
        Outcome::NotOurs {
            owner: "ops-bot".to_owned()
        }
    );

    let free = node("42", false, json!({}), json!([]));
    let script = vec![expect(Method::GET, NODE, 200, free)];
    let out = run(KubeConfig::default(), script, async |a| {
        a.release(&release()).await
    })
    .await;
    assert_eq!(out.expect("nothing to do"), Outcome::AlreadyDone);
}

fn restart(namespace: Option<&str>, job: &str) -> Restart {
    Restart {
        job: job.to_owned(),
        namespace: namespace.map(str::to_owned),
        exclude: vec!["gpu-7".to_owned()],
        resume: Some(ResumePoint {
            path: PathBuf::from("/ckpt/llama/iter_0004200"),
            step: 4200,
            format: "megatron",
        }),
        incident: Some(INCIDENT.to_owned()),
        at: AT,
    }
}

fn job_object(api_version: &str, kind: &str) -> Value {
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": "llama", "namespace": "train", "resourceVersion": "9"},
        "spec": {},
    })
}

fn resume_annotation(b: &Value) {
    assert_eq!(
        b,
        &json!({"metadata": {"annotations": {
            "warden.io/resume-from": "/ckpt/llama/iter_0004200@4200",
            "warden.io/restarted-at": AT_RFC3339,
        }}})
    );
}

const JOBSET: &str = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/train/jobsets/llama";
const PYTORCHJOB: &str = "/apis/kubeflow.org/v1/namespaces/train/pytorchjobs/llama";

#[tokio::test]
async fn restart_of_a_jobset_annotates_it_and_deletes_its_pods() {
    let js = job_object("jobset.x-k8s.io/v1alpha2", "JobSet");
    let script = vec![
        expect(Method::GET, JOBSET, 200, js.clone()),
        expect(
            Method::PATCH,
            &format!("{JOBSET}?fieldManager=warden"),
            200,
            js,
        )
        .body(resume_annotation),
        expect(
            Method::GET,
            "/api/v1/namespaces/train/pods?labelSelector=jobset.sigs.k8s.io%2Fjobset-name%3Dllama",
            200,
            pod_list(vec![
                pod("train", "llama-w-0-0", json!({})),
                pod(
                    "train",
                    "llama-w-0-1",
                    json!({"deletionTimestamp": "2023-11-14T22:00:00Z"}),
                ),
                pod("train", "llama-w-0-2", json!({})),
            ]),
        ),
        expect(
            Method::DELETE,
            "/api/v1/namespaces/train/pods/llama-w-0-0?",
            200,
            pod("train", "llama-w-0-0", json!({})),
        ),
        expect(
            Method::DELETE,
            "/api/v1/namespaces/train/pods/llama-w-0-2?",
            404,
            status(404, "NotFound", "pods \"llama-w-0-2\" not found"),
        ),
    ];
    let req = restart(Some("train"), "llama");
    let out = run(KubeConfig::default(), script, async |a| {
        a.restart(&req).await
    })
    .await;
    assert_eq!(out.expect("restarted"), Outcome::Applied);
}

#[tokio::test]
async fn restart_falls_back_to_a_pytorchjob() {
    let pj = job_object("kubeflow.org/v1", "PyTorchJob");
    let script = vec![
        expect(
            Method::GET,
            JOBSET,
            404,
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        ),
        expect(Method::GET, PYTORCHJOB, 200, pj.clone()),
        expect(
            Method::PATCH,
            &format!("{PYTORCHJOB}?fieldManager=warden"),
            200,
            pj,
        )
        .body(resume_annotation),
        expect(
            Method::GET,
            "/api/v1/namespaces/train/pods?labelSelector=training.kubeflow.org%2Fjob-name%3Dllama",
            200,
            pod_list(vec![pod("train", "llama-master-0", json!({}))]),
        ),
        expect(
            Method::DELETE,
            "/api/v1/namespaces/train/pods/llama-master-0?",
            200,
            pod("train", "llama-master-0", json!({})),
        ),
    ];
    let req = restart(Some("train"), "llama");
    let out = run(KubeConfig::default(), script, async |a| {
        a.restart(&req).await
    })
    .await;
    assert_eq!(out.expect("restarted"), Outcome::Applied);
}

#[tokio::test]
async fn restart_of_a_pytorchjob_without_a_checkpoint_clears_the_resume_point() {
    let pj = job_object("kubeflow.org/v1", "PyTorchJob");
    let config = KubeConfig {
        job_kind: JobKind::PyTorchJob,
        ..KubeConfig::default()
    };
    let script = vec![
        expect(Method::GET, PYTORCHJOB, 200, pj.clone()),
        expect(
            Method::PATCH,
            &format!("{PYTORCHJOB}?fieldManager=warden"),
            200,
            pj,
        )
        .body(|b| {
            assert_eq!(
                b["metadata"]["annotations"]["warden.io/resume-from"],
                Value::Null
            );
        }),
        expect(
            Method::GET,
            "/api/v1/namespaces/train/pods?labelSelector=training.kubeflow.org%2Fjob-name%3Dllama",
            200,
            pod_list(vec![]),
        ),
    ];
    let req = Restart {
        resume: None,
        ..restart(Some("train"), "llama")
    };
    let out = run(config, script, async |a| a.restart(&req).await).await;
    assert_eq!(out.expect("restarted"), Outcome::Applied);
}

#[tokio::test]
async fn restart_of_an_unknown_job_is_not_found() {
    let gone = status(404, "NotFound", "not found");
    let script = vec![
        expect(Method::GET, JOBSET, 404, gone.clone()),
        expect(Method::GET, PYTORCHJOB, 404, gone),
    ];
    let req = restart(Some("train"), "llama");
    let out = run(KubeConfig::default(), script, async |a| {
        a.restart(&req).await
    })
    .await;
    assert!(matches!(out, Err(ActuatorError::NotFound(_))), "{out:?}");

    let req = restart(None, "llama");
    let out = run(KubeConfig::default(), vec![], async |a| {
        a.restart(&req).await
    })
    .await;
    assert!(matches!(out, Err(ActuatorError::Failed { .. })), "{out:?}");
}

/// Settings with a health check image.
fn checking() -> KubeConfig {
    KubeConfig {
        check_image: Some("nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04".to_owned()),
        check_gpus: 8,
        ..KubeConfig::default()
    }
}

const CHECK_JOBS: &str = "/apis/batch/v1/namespaces/warden/jobs?";
const CHECK_JOB: &str = "/apis/batch/v1/namespaces/warden/jobs/warden-check-x7k2p";

fn check_job(status: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "warden-check-x7k2p", "namespace": "warden"},
        "spec": {"template": {"spec": {"containers": []}}},
        "status": status,
    })
}

/// The check Job as created: pinned to the node, tolerating Warden's taint and the
/// cordon, one try, the timeout as its deadline, the GPUs asked for.
fn the_check_job(b: &Value) {
    assert_eq!(b["metadata"]["generateName"], "warden-check-", "{b}");
    assert_eq!(b["metadata"]["namespace"], "warden", "{b}");
    assert_eq!(
        b["metadata"]["annotations"]["warden.io/checks-node"], "gpu-7",
        "{b}"
    );
    let spec = &b["spec"];
    assert_eq!(spec["backoffLimit"], 0, "{b}");
    assert_eq!(spec["activeDeadlineSeconds"], 1200, "{b}");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["nodeName"], "gpu-7", "{b}");
    assert_eq!(pod["restartPolicy"], "Never", "{b}");
    assert_eq!(
        pod["tolerations"],
        json!([
            {"key": "warden.io/fault", "operator": "Exists"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        ]),
        "{b}"
    );
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    );
    assert_eq!(c["command"], json!(["dcgmi", "diag", "-r", "2"]));
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "8", "{b}");
}

/// The check of gpu-7 with a `secs` timeout, against `script`.
async fn check_over(script: Vec<Exchange>, secs: u64) -> Result<CheckOutcome, ActuatorError> {
    run(checking(), script, async |a| {
        a.verify("gpu-7", &diag(), std::time::Duration::from_secs(secs))
            .await
    })
    .await
}

fn diag() -> Vec<String> {
    ["dcgmi", "diag", "-r", "2"].map(str::to_owned).to_vec()
}

#[tokio::test(start_paused = true)]
async fn a_health_check_is_a_job_pinned_to_the_node_and_its_success_a_pass() {
    let script = vec![
        expect(Method::POST, CHECK_JOBS, 201, check_job(json!({}))).body(the_check_job),
        expect(Method::GET, CHECK_JOB, 200, check_job(json!({"active": 1}))),
        expect(
            Method::GET,
            CHECK_JOB,
            200,
            check_job(json!({"succeeded": 1})),
        ),
    ];
    let out = check_over(script, 1200).await;
    assert_eq!(
        out.expect("a verdict"),
        CheckOutcome::Passed("check job warden-check-x7k2p succeeded on gpu-7".to_owned())
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_check_job_is_a_failed_check_with_its_reason() {
    let failed = json!({"failed": 1, "conditions": [{
        "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
    }]});
    let script = vec![
        expect(Method::POST, CHECK_JOBS, 201, check_job(json!({}))).body(the_check_job),
        expect(Method::GET, CHECK_JOB, 200, check_job(failed)),
    ];
    let out = check_over(script, 1200).await;
    assert_eq!(
        out.expect("a verdict"),
        CheckOutcome::Failed(
            "check job warden-check-x7k2p failed: BackoffLimitExceeded: Job has reached the \
             specified backoff limit on gpu-7"
                .to_owned()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_check_job_with_no_verdict_in_time_is_deleted_and_no_verdict() {
    // A 60 s check polled every 10 s: seven reads within the check's time and the
    // minute after it, then the Job goes.
    let mut script =
        vec![expect(Method::POST, CHECK_JOBS, 201, check_job(json!({}))).body(the_check_job_60)];
    for _ in 0..12 {
        script.push(expect(
            Method::GET,
            CHECK_JOB,
            200,
            check_job(json!({"active": 1})),
        ));
    }
    script.push(
        expect(
            Method::DELETE,
            &format!("{CHECK_JOB}?"),
            200,
            check_job(json!({"active": 1})),
        )
        .body(|b| assert_eq!(b["propagationPolicy"], "Background", "{b}")),
    );
    let out = check_over(script, 60).await;
    match out {
        Err(ActuatorError::Retry { why, .. }) => {
            assert!(why.contains("gave no verdict"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

fn the_check_job_60(b: &Value) {
    assert_eq!(b["spec"]["activeDeadlineSeconds"], 60, "{b}");
}

/// The Event on gpu-7 the server expects, its body checked by `check`.
fn event_posted(check: impl Fn(&Value) + Send + 'static) -> Exchange {
    expect(
        Method::POST,
        "/api/v1/namespaces/default/events?",
        201,
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "gpu-7.1"},
               "involvedObject": {"kind": "Node", "name": "gpu-7"}}),
    )
    .body(check)
}

#[tokio::test]
async fn a_ledger_change_is_the_node_condition_and_an_event() {
    let script = vec![
        expect(
            Method::PATCH,
            "/api/v1/nodes/gpu-7/status?fieldManager=warden",
            200,
            node("100", true, json!({}), json!([])),
        )
        .body(|b| {
            assert_eq!(
                b["status"]["conditions"],
                json!([{
                    "type": "WardenHealthy", "status": "False", "reason": "Quarantined",
                    "message": "healthy -> quarantined: XID 79, fatal in the XID catalog (GPU 3)",
                    "lastTransitionTime": "2023-11-14T22:13:20Z",
                    "lastHeartbeatTime": "2023-11-14T22:13:20Z",
                }]),
                "{b}"
            );
        }),
        event_posted(|b| {
            assert_eq!(b["metadata"]["generateName"], "gpu-7.", "{b}");
            assert_eq!(
                b["involvedObject"],
                json!({"kind": "Node", "apiVersion": "v1", "name": "gpu-7"}),
                "{b}"
            );
            assert_eq!(b["reason"], "WardenQuarantined", "{b}");
            assert_eq!(b["type"], "Warning", "{b}");
            assert_eq!(b["source"]["component"], "warden", "{b}");
            assert_eq!(b["firstTimestamp"], "2023-11-14T22:13:20Z", "{b}");
            assert!(
                b["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("healthy -> quarantined: XID 79")),
                "{b}"
            );
        }),
    ];
    run(KubeConfig::default(), script, async |a| {
        a.node_health(
            "gpu-7",
            "quarantined",
            true,
            "healthy -> quarantined: XID 79, fatal in the XID catalog (GPU 3)",
            AT,
        )
        .await
    })
    .await
    .expect("written");
}

#[tokio::test]
async fn a_returned_node_is_healthy_again_with_a_normal_event() {
    let script = vec![
        expect(
            Method::PATCH,
            "/api/v1/nodes/gpu-7/status?fieldManager=warden",
            200,
            node("101", false, json!({}), json!([])),
        )
        .body(|b| {
            let c = &b["status"]["conditions"][0];
            assert_eq!(c["status"], "True", "{b}");
            assert_eq!(c["reason"], "Returned", "{b}");
        }),
        event_posted(|b| {
            assert_eq!(b["reason"], "WardenReturned", "{b}");
            assert_eq!(b["type"], "Normal", "{b}");
        }),
    ];
    run(KubeConfig::default(), script, async |a| {
        a.node_health(
            "gpu-7",
            "returned",
            false,
            "verifying -> returned: health check passed",
            AT,
        )
        .await
    })
    .await
    .expect("written");
}
