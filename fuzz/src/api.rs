//! Fuzz target: the controller's HTTP API bodies, paths and queries through the real
//! axum router in-process (`warden_controller::api::router`, `tower::ServiceExt::oneshot`),
//! so every handler's own parsing and validation runs: ingest batches (JSON and binary),
//! scheduler lifecycle reports, acknowledge / resolve bodies, drain / undrain bodies,
//! the breaker reset body, incident queries and path parameters.
//!
//! The first byte picks the route (and, for ingest, the content type), the bytes up to
//! the first NUL are the path parameter or query (percent-encoded as a client would),
//! the rest is the body. The router runs on an in-memory store with one open incident
//! (a fatal XID) and remediation as the binary's default (shipped policy, dry run),
//! rebuilt every 2,000 requests so memory stays bounded. Checked: no
//! request panics the handlers or gets a 5xx answer; every refusal is a JSON
//! `{"error": "..."}` body; every JSON answer parses.

use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Method, Request, header};
use tower::ServiceExt;
use warden_controller::SharedEngine;
use warden_controller::api::{ApiState, router};
use warden_controller::auth::Auth;
use warden_controller::metrics::Metrics;
use warden_controller::operate::Operator;
use warden_controller::remedy::run::{Remediator, RemedyConfig};
use warden_engine::{Engine, EngineConfig, ManualClock};
use warden_model::Timestamp;
use warden_model::wire::{Batch, EventSeverity, Heartbeat, NodeEvent, NodeEventKind};

const T0: i64 = 1_800_000_000_000_000_000;
const REBUILD_EVERY: u64 = 2_000;

struct App {
    rt: tokio::runtime::Runtime,
    router: Router,
    incident: String,
    requests: u64,
}

fn xid_batch() -> Batch {
    Batch {
        version: 0,
        node: "node-3".into(),
        agent_id: "agent-node-3".into(),
        boot_id: "boot-1".into(),
        seq: 1,
        sent_at_ns: T0,
        jobs: vec![],
        gpus: vec![],
        events: vec![NodeEvent {
            id: 1,
            at_ns: T0,
            kind: NodeEventKind::Xid as i32,
            severity: EventSeverity::Fatal as i32,
            gpu_index: Some(0),
            pci_bus_id: "0000:3b:00".into(),
            code: Some(79),
            message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
            count: 1,
        }],
        heartbeat: Some(Heartbeat::default()),
    }
}

/// A fresh router over a fresh engine and in-memory store, with one open incident.
fn build(rt: &tokio::runtime::Runtime) -> (Router, String) {
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp(T0)));
    let now = Timestamp(T0 + 1_000_000_000);
    engine.lock().apply(xid_batch(), now);
    engine.lock().tick(now);
    let incident = engine
        .lock()
        .incidents()
        .first()
        .map(|i| i.id.clone())
        .expect("a fatal XID opens an incident");
    let clock = Arc::new(ManualClock::new(now));
    let mut operator = rt
        .block_on(Operator::in_memory(engine.clone()))
        .expect("an in-memory store");
    // Remediation as the binary runs it by default: the shipped policy, a dry run.
    let remedy = rt
        .block_on(Remediator::new(
            RemedyConfig::default(),
            engine.clone(),
            operator.store.clone(),
            None,
            clock.clone(),
        ))
        .expect("remediation with the shipped policy");
    operator.remedy = Some(remedy);
    let state = ApiState {
        engine,
        clock,
        metrics: Arc::new(Metrics::new("fuzz").expect("metrics")),
        max_batch_bytes: 1 << 20,
        auth: Arc::new(Auth::Open),
        operator,
    };
    (router(state), incident)
}

fn app() -> &'static Mutex<App> {
    static APP: OnceLock<Mutex<App>> = OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (router, incident) = build(&rt);
        Mutex::new(App {
            rt,
            router,
            incident,
            requests: 0,
        })
    })
}

/// `bytes` percent-encoded for a URI; `keep` lists the bytes kept as they are besides
/// the unreserved ones.
fn encode(bytes: &[u8], keep: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One input, as libFuzzer passes it (`fuzz_targets/api.rs`).
pub fn run(input: &[u8]) {
    let Some((&route, rest)) = input.split_first() else {
        return;
    };
    let (param, body) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut app = app().lock().unwrap_or_else(|p| p.into_inner());
    app.requests += 1;
    if app.requests.is_multiple_of(REBUILD_EVERY) {
        let (router, incident) = build(&app.rt);
        app.router = router;
        app.incident = incident;
    }
    let p = encode(param, b"");
    let q = encode(param, b"=&");
    let id = if route & 0x80 != 0 {
        app.incident.clone()
    } else {
        p.clone()
    };
    let json = "application/json";
    let (method, uri, content_type) = match route % 16 {
        0 | 1 => (Method::POST, "/api/v1/ingest".to_owned(), json),
        2 | 3 => (
            Method::POST,
            "/api/v1/ingest".to_owned(),
            "application/vnd.warden.batch",
        ),
        4 => (Method::POST, "/api/v1/ingest".to_owned(), "text/plain"),
        5 => (Method::POST, format!("/api/v1/jobs/{p}/lifecycle"), json),
        6 => (Method::POST, format!("/api/v1/incidents/{id}/ack"), json),
        7 => (
            Method::POST,
            format!("/api/v1/incidents/{id}/resolve"),
            json,
        ),
        8 => (Method::POST, format!("/api/v1/nodes/{p}/drain"), json),
        9 => (Method::DELETE, format!("/api/v1/nodes/{p}/drain"), json),
        10 => (
            Method::POST,
            "/api/v1/remediation/breaker/reset".to_owned(),
            json,
        ),
        11 => (Method::GET, format!("/api/v1/incidents?{q}"), json),
        12 => (Method::GET, format!("/api/v1/incidents/{id}"), json),
        13 => (Method::GET, format!("/api/v1/jobs/{p}/ranks"), json),
        14 => (Method::GET, format!("/api/v1/actions?{q}"), json),
        _ => (Method::GET, format!("/api/v1/nodes?{q}"), json),
    };
    let Ok(request) = Request::builder()
        .method(method.clone())
        .uri(&uri)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_vec()))
    else {
        return;
    };
    let router = app.router.clone();
    let (status, headers, answer) = app.rt.block_on(async move {
        let response = router
            .oneshot(request)
            .await
            .expect("the router answers every request");
        let (parts, body) = response.into_parts();
        let bytes = to_bytes(body, 64 << 20)
            .await
            .expect("the answer is readable");
        (parts.status, parts.headers, bytes)
    });
    assert!(
        !status.is_server_error(),
        "{method} {uri} answered {status}: {}",
        String::from_utf8_lossy(&answer)
    );
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.is_client_error() {
        assert!(is_json, "{method} {uri}: a refusal is JSON");
        let v: serde_json::Value =
            serde_json::from_slice(&answer).expect("a refusal's body is JSON");
        assert!(
            v.get("error").is_some_and(serde_json::Value::is_string),
            "{method} {uri}: a refusal says why: {v}"
        );
    } else if is_json {
        serde_json::from_slice::<serde_json::Value>(&answer).expect("a JSON answer parses");
    }
}
