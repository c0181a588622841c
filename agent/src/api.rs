//! The agent's HTTP surface on 127.0.0.1:9461: `/metrics`, `/healthz`, and the local
//! API the controller pulls log windows from (`GET /api/v1/logs`).

use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus::{Encoder, Registry, TextEncoder};
use serde::Deserialize;

use crate::window::{LogWindow, WindowQuery};

/// Longest window one request may ask for, seconds.
pub const MAX_WINDOW_SECS: f64 = 3600.0;
/// Most lines one request returns.
pub const MAX_LINES: usize = 10_000;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// Every metric the agent exports.
    pub registry: Registry,
    /// Recent log lines.
    pub window: Arc<Mutex<LogWindow>>,
    /// Bearer token the log API requires, when set (logs can hold secrets).
    pub token: Option<Arc<str>>,
    /// Collectors that are down, for `/healthz`.
    pub collectors_down: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is never printed, not even by a debug dump.
        f.debug_struct("ApiState")
            .field("registry", &self.registry)
            .field("window", &self.window)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("collectors_down", &self.collectors_down)
            .finish()
    }
}

/// Build the router.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/logs", get(logs))
        .fallback(|uri: axum::http::Uri| async move {
            error(
                StatusCode::NOT_FOUND,
                format!("no route for {}", uri.path()),
            )
        })
        .with_state(state)
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn metrics(State(s): State<ApiState>) -> Response {
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&s.registry.gather(), &mut buf) {
        Ok(()) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], buf).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn healthz(State(s): State<ApiState>) -> Response {
    // The agent is healthy while it runs; a collector that is down degrades it but is
    // not a reason to restart it.
    let down = s
        .collectors_down
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    Json(serde_json::json!({ "status": "ok", "collectors_down": down })).into_response()
}

/// Query of `GET /api/v1/logs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    /// Only this job.
    pub job: Option<String>,
    /// Only this rank.
    pub rank: Option<u32>,
    /// Centre of the window: ns since the Unix epoch, or RFC 3339.
    pub around: String,
    /// Seconds before `around` (default 60).
    pub before_secs: Option<f64>,
    /// Seconds after `around` (default 10).
    pub after_secs: Option<f64>,
    /// Most lines (default 1000, at most 10000).
    pub limit: Option<usize>,
}

fn parse_time(s: &str) -> Option<i64> {
    if let Ok(ns) = s.parse::<i64>() {
        return Some(ns);
    }
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_nanos()).ok()
}

fn authorized(token: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(want) = token else { return true };
    let got = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Compare without an early exit on the first differing byte.
    got.len() == want.len()
        && got
            .bytes()
            .zip(want.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn logs(
    State(s): State<ApiState>,
    headers: HeaderMap,
    q: Result<Query<LogsParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if !authorized(s.token.as_deref(), &headers) {
        return error(
            StatusCode::UNAUTHORIZED,
            "the log API needs `Authorization: Bearer <token>`".into(),
        );
    }
    let Query(p) = match q {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let Some(around) = parse_time(&p.around) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "around={:?} is neither ns since the Unix epoch nor an RFC 3339 time",
                p.around
            ),
        );
    };
    let before = p.before_secs.unwrap_or(60.0);
    let after = p.after_secs.unwrap_or(10.0);
    for (name, v) in [("before_secs", before), ("after_secs", after)] {
        if !(0.0..=MAX_WINDOW_SECS).contains(&v) {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{name}={v} is outside 0..={MAX_WINDOW_SECS}"),
            );
        }
    }
    let limit = p.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_LINES {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit={limit} is outside 1..={MAX_LINES}"),
        );
    }
    let q = WindowQuery {
        job: p.job,
        rank: p.rank,
        from_ns: around.saturating_sub((before * 1e9) as i64),
        to_ns: around.saturating_add((after * 1e9) as i64),
        limit,
    };
    let lines = match s.window.lock() {
        Ok(w) => w.query(&q),
        Err(e) => e.into_inner().query(&q),
    };
    Json(serde_json::json!({
        "from_ns": q.from_ns,
        "to_ns": q.to_ns,
        "lines": lines,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::window::WindowLine;

    fn state(token: Option<&str>) -> ApiState {
        let mut w = LogWindow::new(1 << 20);
        for i in 0..10 {
            w.push(WindowLine {
                at_ns: 1_000_000_000_000 + i * 1_000_000_000,
                job: Some("j".into()),
                rank: Some((i % 2) as u32),
                source: "/var/log/train.log".into(),
                stream: "stdout",
                text: format!("line {i}"),
            });
        }
        ApiState {
            registry: Registry::new(),
            window: Arc::new(Mutex::new(w)),
            token: token.map(Into::into),
            collectors_down: Arc::default(),
        }
    }

    async fn get(s: ApiState, uri: &str, auth: Option<&str>) -> (StatusCode, serde_json::Value) {
        let mut req = Request::get(uri);
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let resp = router(s)
            .oneshot(req.body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or_default())
    }

    #[tokio::test]
    async fn log_window_around_a_time() {
        let (st, v) = get(
            state(None),
            "/api/v1/logs?job=j&rank=1&around=1005000000000&before_secs=3&after_secs=2",
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        let texts: Vec<&str> = v["lines"]
            .as_array()
            .expect("lines")
            .iter()
            .filter_map(|l| l["text"].as_str())
            .collect();
        assert_eq!(texts, ["line 3", "line 5", "line 7"]);
    }

    #[tokio::test]
    async fn bad_queries_get_a_clear_error() {
        for (uri, want) in [
            ("/api/v1/logs?around=yesterday", "around"),
            ("/api/v1/logs?around=1&before_secs=99999", "before_secs"),
            ("/api/v1/logs?around=1&limit=0", "limit"),
            ("/api/v1/logs?around=1&colour=red", "colour"),
            ("/api/v1/logs", "around"),
        ] {
            let (st, v) = get(state(None), uri, None).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{uri}");
            assert!(
                v["error"].as_str().unwrap_or("").contains(want),
                "{uri}: {v}"
            );
        }
    }

    #[tokio::test]
    async fn the_log_api_needs_the_token_when_one_is_set() {
        let uri = "/api/v1/logs?around=1000000000000";
        let (st, _) = get(state(Some("s3cret")), uri, None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        let (st, _) = get(state(Some("s3cret")), uri, Some("Bearer wrong!")).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        let (st, _) = get(state(Some("s3cret")), uri, Some("Bearer s3cret")).await;
        assert_eq!(st, StatusCode::OK);
        let (st, _) = get(state(Some("s3cret")), "/healthz", None).await;
        assert_eq!(st, StatusCode::OK);
    }

    #[test]
    fn a_debug_dump_of_the_state_never_shows_the_token() {
        let dump = format!("{:?}", state(Some("wdn_5ecre7-log-api-token")));
        assert!(!dump.contains("5ecre7"), "{dump}");
        assert!(dump.contains("***"), "{dump}");
    }
}
