//! Query parameters of the list routes (`GET /api/v1/incidents`, `GET /api/v1/actions`)
//! through `Router::oneshot`: a value with a control character or longer than any name
//! is a 400 naming the parameter, before it reaches the store (`?node=%00` once listed
//! every incident: the NUL cut the store's `LIKE` pattern short).

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;
use warden_controller::SharedEngine;
use warden_controller::api::{ApiState, DEFAULT_MAX_BATCH_BYTES, MAX_QUERY_VALUE_BYTES, router};
use warden_controller::metrics::Metrics;
use warden_controller::operate::Operator;
use warden_engine::{Engine, EngineConfig, ManualClock};
use warden_model::{Incident, IncidentKind, IncidentState, Severity, TimelineEntry, Timestamp};

fn incident(id: &str, job: &str, nodes: &[&str]) -> Incident {
    Incident {
        id: id.to_owned(),
        kind: IncidentKind::GpuFault,
        job: Some(job.to_owned()),
        state: IncidentState::Open,
        acknowledged: false,
        severity: Severity::Critical,
        ranks: vec![3],
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        gpus: Vec::new(),
        onset: Timestamp(1_000),
        detected_at: Timestamp(2_000),
        updated_at: Timestamp(2_000),
        resolved_at: None,
        confidence: 0.9,
        summary: format!("gpu fault on {nodes:?}"),
        evidence: Vec::new(),
        finding_count: 1,
        timeline: vec![TimelineEntry {
            at: Timestamp(2_000),
            what: "opened".to_owned(),
        }],
        diagnosis: None,
    }
}

/// The API over an in-memory store holding two incidents, on different nodes.
async fn app() -> Router {
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp::ZERO));
    let operator = Operator::in_memory(engine.clone()).await.expect("store");
    for inc in [
        incident("inc-0001", "llama", &["gpu-1"]),
        incident("inc-0002", "mistral", &["gpu-2"]),
    ] {
        operator
            .store
            .save_incident(&inc, &inc.timeline.clone(), 0, false)
            .await
            .expect("save");
    }
    router(ApiState {
        engine,
        clock: Arc::new(ManualClock::new(Timestamp(3_000))),
        metrics: Arc::new(Metrics::new("test").expect("metrics")),
        max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
        auth: Arc::new(warden_controller::auth::Auth::Open),
        operator,
    })
}

async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    let req = Request::get(uri).body(Body::empty()).expect("request");
    let resp = app.clone().oneshot(req).await.expect("answer");
    let status = resp.status();
    let body = to_bytes(resp.into_body(), 1 << 20).await.expect("body");
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{uri}: not JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (status, v)
}

fn ids(v: &Value) -> Vec<&str> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|i| i["id"].as_str().expect("id"))
        .collect()
}

/// Every string query parameter of every list route.
const PARAMS: [(&str, &str); 7] = [
    ("/api/v1/incidents", "node"),
    ("/api/v1/incidents", "job"),
    ("/api/v1/incidents", "state"),
    ("/api/v1/incidents", "kind"),
    ("/api/v1/incidents", "after"),
    ("/api/v1/actions", "target"),
    ("/api/v1/actions", "after"),
];

#[tokio::test]
async fn a_nul_in_the_node_filter_is_400_not_every_incident() {
    let app = app().await;
    let (status, v) = get(&app, "/api/v1/incidents?node=%00").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let error = v["error"].as_str().expect("error text");
    assert!(
        error.contains("`node`") && error.contains("control character"),
        "{error}"
    );
    // A NUL after a real name does not widen the filter either.
    let (status, v) = get(&app, "/api/v1/incidents?node=gpu-1%00").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn a_control_character_in_any_query_parameter_is_400_naming_it() {
    let app = app().await;
    // NUL, LF, CR, TAB, ESC, DEL and C1 CSI.
    for bad in ["%00", "a%0Ab", "a%0D", "%09", "%1B%5B31m", "%7F", "%C2%9B"] {
        for (path, param) in PARAMS {
            let uri = format!("{path}?{param}={bad}");
            let (status, v) = get(&app, &uri).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {v}");
            let error = v["error"].as_str().expect("error text");
            assert!(
                error.contains(&format!("parameter `{param}`")),
                "{uri}: {error}"
            );
            assert!(
                !error.chars().any(char::is_control),
                "{uri}: the answer echoes the control character: {error:?}"
            );
        }
    }
}

#[tokio::test]
async fn an_over_long_query_parameter_is_400_and_the_longest_name_is_not() {
    let app = app().await;
    let longest = "a".repeat(MAX_QUERY_VALUE_BYTES);
    let too_long = "a".repeat(MAX_QUERY_VALUE_BYTES + 1);
    for (path, param) in PARAMS {
        let uri = format!("{path}?{param}={too_long}");
        let (status, v) = get(&app, &uri).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{path}?{param}=<long>: {v}"
        );
        let error = v["error"].as_str().expect("error text");
        assert!(error.contains(&format!("parameter `{param}`")), "{error}");
        assert!(!error.contains(&too_long), "the answer echoes the value");
    }
    for (path, param) in [
        ("/api/v1/incidents", "node"),
        ("/api/v1/incidents", "job"),
        ("/api/v1/incidents", "after"),
        ("/api/v1/actions", "target"),
        ("/api/v1/actions", "after"),
    ] {
        let (status, v) = get(&app, &format!("{path}?{param}={longest}")).await;
        assert_eq!(status, StatusCode::OK, "{path}?{param}=<longest>: {v}");
    }
}

#[tokio::test]
async fn ordinary_filters_still_select_what_they_name() {
    let app = app().await;
    let (status, v) = get(&app, "/api/v1/incidents?node=gpu-1").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(ids(&v), ["inc-0001"]);
    let (_, v) = get(
        &app,
        "/api/v1/incidents?job=mistral&state=open&kind=gpu_fault",
    )
    .await;
    assert_eq!(ids(&v), ["inc-0002"]);
    let (_, v) = get(&app, "/api/v1/incidents?node=&job=&after=").await;
    assert_eq!(
        ids(&v),
        ["inc-0001", "inc-0002"],
        "empty is the same as none"
    );
    let (_, v) = get(&app, "/api/v1/incidents?after=inc-0001").await;
    assert_eq!(ids(&v), ["inc-0002"]);
    // Non-ASCII that is not a control is a value like any other.
    let (status, v) = get(&app, "/api/v1/incidents?node=n%C3%B6de").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(ids(&v).is_empty());
    let (status, v) = get(&app, "/api/v1/actions?target=gpu-1").await;
    assert_eq!(status, StatusCode::OK, "{v}");
}
