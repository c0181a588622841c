//! The authorization matrix: every route under `/api/v1` (the list the router is built
//! from, `api::ROUTES`) × every role × no token and an unknown token. A refused request
//! is 401 (with `WWW-Authenticate`) or 403 and changes nothing; an allowed one reaches
//! its handler. The probes and `/metrics` answer without a token.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt;
use warden_controller::SharedEngine;
use warden_controller::api::{ApiState, ROUTES, router};
use warden_controller::auth::{Auth, Role, hash_token};
use warden_controller::metrics::Metrics;
use warden_controller::operate::Operator;
use warden_controller::remedy::run::{Remediator, RemedyConfig};
use warden_engine::{Engine, EngineConfig, ManualClock};
use warden_model::Timestamp;

const T0: i64 = 1_700_000_000_000_000_000;

fn token(role: Role) -> String {
    format!("wdn_test_{role}")
}

async fn app() -> (Router, Operator) {
    let yaml = format!(
        "tokens:\n{}",
        Role::ALL
            .iter()
            .map(|r| format!(
                "  - name: {r}-bot\n    role: {r}\n    sha256: {}\n",
                hash_token(&token(*r))
            ))
            .collect::<String>()
    );
    let auth = Auth::from_yaml(&yaml, "test").expect("tokens");
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp::ZERO));
    let mut operator = Operator::in_memory(engine.clone()).await.expect("store");
    let clock = Arc::new(ManualClock::new(Timestamp(T0)));
    operator.remedy = Some(
        Remediator::new(
            RemedyConfig::default(),
            engine.clone(),
            operator.store.clone(),
            None,
            clock.clone(),
        )
        .await
        .expect("remediation"),
    );
    let state = ApiState {
        engine,
        clock,
        metrics: Arc::new(Metrics::new("test").expect("metrics")),
        max_batch_bytes: 1 << 20,
        auth: Arc::new(auth),
        operator: operator.clone(),
    };
    (router(state), operator)
}

/// A request for `route` with sample path values and a body the handler accepts.
fn request(method: &str, path: &str, auth: Option<&str>) -> Request<Body> {
    let uri = path
        .replace("{job}", "llama")
        .replace("{id}", "inc-1")
        .replace("{name}", "node-7");
    let (ct, body) = match (method, path) {
        ("POST", "/api/v1/ingest") => ("application/json", r#"{"version":0}"#.to_owned()),
        ("POST", "/api/v1/jobs/{job}/lifecycle") => (
            "application/json",
            r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"1","nodes":["n1"]}"#
                .to_owned(),
        ),
        ("POST", "/api/v1/nodes/{name}/drain") => {
            ("application/json", r#"{"reason":"matrix"}"#.to_owned())
        }
        ("POST", "/api/v1/incidents/{id}/resolve") => {
            ("application/json", r#"{"reason":"matrix"}"#.to_owned())
        }
        _ => ("application/json", String::new()),
    };
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, ct);
    if let Some(a) = auth {
        b = b.header(header::AUTHORIZATION, a);
    }
    b.body(Body::from(body)).expect("request")
}

#[tokio::test]
async fn every_route_role_and_credential() {
    let (app, operator) = app().await;
    let mut checked = 0;
    for &(method, path, need) in ROUTES {
        // No token, an unknown token, a malformed header: 401 with a challenge.
        for cred in [
            None,
            Some("Bearer wdn_nobody".to_owned()),
            Some("Basic YTpi".to_owned()),
        ] {
            let resp = app
                .clone()
                .oneshot(request(method, path, cred.as_deref()))
                .await
                .expect("answer");
            assert_eq!(
                resp.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {cred:?}"
            );
            assert!(
                resp.headers().contains_key(header::WWW_AUTHENTICATE),
                "{method} {path}: 401 names the scheme"
            );
            let body = to_bytes(resp.into_body(), 1 << 16).await.expect("body");
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json error");
            assert!(v["error"].is_string(), "{method} {path}: {v}");
            checked += 1;
        }
        for role in Role::ALL {
            let bearer = format!("Bearer {}", token(role));
            let resp = app
                .clone()
                .oneshot(request(method, path, Some(&bearer)))
                .await
                .expect("answer");
            let status = resp.status();
            let body = to_bytes(resp.into_body(), 1 << 20).await.expect("body");
            let text = String::from_utf8_lossy(&body);
            if role.allows(need) {
                assert!(
                    !matches!(
                        status,
                        StatusCode::UNAUTHORIZED
                            | StatusCode::FORBIDDEN
                            | StatusCode::METHOD_NOT_ALLOWED
                    ) && !text.contains("no route for"),
                    "{method} {path} as {role}: must reach its handler, got {status} {text}"
                );
                assert!(
                    !status.is_server_error(),
                    "{method} {path} as {role}: {status} {text}"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{method} {path} as {role}: {text}"
                );
                assert!(text.contains(role.as_str()), "{text}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, ROUTES.len() * (3 + Role::ALL.len()));

    // Refused requests changed nothing: the only actions are the allowed drains and
    // undrains (the incident routes found no live incident).
    let log = operator.store.actions(None, None, 0).await.expect("log");
    let kinds: Vec<_> = log.iter().map(|a| a.kind.as_str()).collect();
    assert!(
        kinds.iter().all(|k| *k == "drain" || *k == "undrain"),
        "{kinds:?}"
    );
    assert!(
        log.iter()
            .all(|a| a.actor == "operator-bot" || a.actor == "admin-bot")
    );
}

#[tokio::test]
async fn probes_and_metrics_need_no_token() {
    let (app, _) = app().await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        let resp = app
            .clone()
            .oneshot(request("GET", path, None))
            .await
            .expect("answer");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn readyz_fails_when_the_store_is_gone() {
    let (app, operator) = app().await;
    operator.store.pool().close().await;
    let resp = app
        .oneshot(request("GET", "/readyz", None))
        .await
        .expect("answer");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn whoami_names_the_caller() {
    let (app, _) = app().await;
    let bearer = format!("Bearer {}", token(Role::Operator));
    let resp = app
        .oneshot(request("GET", "/api/v1/whoami", Some(&bearer)))
        .await
        .expect("answer");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = to_bytes(resp.into_body(), 1 << 16).await.expect("body");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["name"], "operator-bot");
    assert_eq!(v["role"], "operator");
}
