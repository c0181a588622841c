//! The HTTP API through `Router::oneshot`: ingest in both encodings and every way a
//! batch is refused, incident queries and their filters, probes and metrics.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use serde_json::Value;
use tower::ServiceExt;
use warden_controller::SharedEngine;
use warden_controller::api::{ApiState, router};
use warden_controller::metrics::Metrics;
use warden_engine::{Engine, EngineConfig, ManualClock};
use warden_model::wire::{
    Batch, CollOp, CollectiveEvent, CommInfo, Heartbeat, JobSignals, MAGIC, RankInfo,
    TrainingMetric,
};
use warden_model::{Timestamp, wire};

const T0: i64 = 1_700_000_000_000_000_000;

async fn app_with_limit(max_batch_bytes: usize) -> Router {
    app_and_engine(max_batch_bytes).await.0
}

/// The router, and its engine for a test that runs the detectors itself.
async fn app_and_engine(max_batch_bytes: usize) -> (Router, SharedEngine) {
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp::ZERO));
    let state = ApiState {
        engine: engine.clone(),
        clock: Arc::new(ManualClock::new(Timestamp(T0 + 1_000_000_000))),
        metrics: Arc::new(Metrics::new("test").expect("metrics")),
        max_batch_bytes,
        auth: Arc::new(warden_controller::auth::Auth::Open),
        operator: warden_controller::operate::Operator::in_memory(engine.clone())
            .await
            .expect("store"),
    };
    (router(state), engine)
}

async fn app() -> Router {
    app_with_limit(warden_controller::api::DEFAULT_MAX_BATCH_BYTES).await
}

fn batch() -> Batch {
    let comm = 0xfeed_beef_u64;
    let ranks = 0..8u32;
    Batch {
        version: 0,
        node: "node-01".into(),
        agent_id: "agent-1".into(),
        boot_id: "boot-1".into(),
        seq: 1,
        sent_at_ns: T0,
        jobs: vec![JobSignals {
            job: "llama".into(),
            ranks: ranks
                .clone()
                .map(|r| RankInfo {
                    rank: r,
                    world_size: 8,
                    pid: 100 + r,
                    gpu_index: Some(r),
                    gpu_uuid: format!("GPU-{r}"),
                })
                .collect(),
            comms: ranks
                .clone()
                .map(|r| CommInfo {
                    comm,
                    name: "dp-0".into(),
                    size: 8,
                    rank: r,
                    comm_rank: r,
                })
                .collect(),
            collectives: ranks
                .clone()
                .map(|r| CollectiveEvent {
                    comm,
                    rank: r,
                    seq: 1,
                    op: CollOp::AllReduce as i32,
                    bytes: 1 << 20,
                    start_ns: T0 - 500_000_000,
                    end_ns: T0 - 400_000_000,
                    xfer_ns: 50_000_000,
                })
                .collect(),
            metrics: vec![TrainingMetric {
                rank: 0,
                step: 1,
                at_ns: T0 - 100,
                loss: Some(2.5),
                grad_norm: Some(1.0),
                tokens_per_s: None,
                first_nonfinite_op: None,
            }],
            processes: vec![],
            logs: vec![],
            links: vec![],
        }],
        gpus: vec![],
        events: vec![],
        heartbeat: Some(Heartbeat::default()),
    }
}

fn post(body: Vec<u8>, content_type: Option<&str>) -> Request<Body> {
    let mut r = Request::post("/api/v1/ingest");
    if let Some(ct) = content_type {
        r = r.header(header::CONTENT_TYPE, ct);
    }
    r.body(Body::from(body)).expect("request")
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).expect("request")
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let body = to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    (status, body.to_vec())
}

async fn send_json(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let (status, body) = send(app, req).await;
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (status, v)
}

async fn metrics_text(app: &Router) -> String {
    let (status, body) = send(app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(body).expect("utf8")
}

fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l[name.len()..].trim().parse().ok())
}

#[tokio::test]
async fn binary_batch_is_accepted_under_every_binary_content_type() {
    let app = app().await;
    for ct in [
        wire::CONTENT_TYPE_BINARY,
        "application/octet-stream",
        "application/x-protobuf",
    ] {
        let (status, v) = send_json(&app, post(batch().encode_binary(), Some(ct))).await;
        assert_eq!(status, StatusCode::OK, "{ct}: {v}");
        assert!(v["accepted"].is_u64(), "{v}");
    }
    let text = metrics_text(&app).await;
    assert_eq!(
        series(&text, "warden_ingest_batches_total"),
        Some(3.0),
        "{text}"
    );
    let bytes = batch().encode_binary().len() as f64 * 3.0;
    assert_eq!(series(&text, "warden_ingest_bytes_total"), Some(bytes));
}

#[tokio::test]
async fn json_batch_is_accepted() {
    let app = app().await;
    let (status, v) = send_json(
        &app,
        post(
            batch().encode_json(),
            Some("application/json; charset=utf-8"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v.get("accepted").is_some());
}

#[tokio::test]
async fn truncated_batch_is_400_truncated_and_counted() {
    let app = app().await;
    let bytes = batch().encode_binary();
    let (status, v) = send_json(
        &app,
        post(
            bytes[..bytes.len() - 3].to_vec(),
            Some(wire::CONTENT_TYPE_BINARY),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["reason"], "truncated");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("truncated")),
        "{v}"
    );

    let before = metrics_text(&app).await;
    let name = r#"warden_ingest_rejected_total{reason="truncated"}"#;
    assert_eq!(series(&before, name), Some(1.0), "{before}");
    let _ = send(
        &app,
        post(bytes[..5].to_vec(), Some(wire::CONTENT_TYPE_BINARY)),
    )
    .await;
    let after = metrics_text(&app).await;
    assert_eq!(series(&after, name), Some(2.0));
    assert_eq!(series(&after, "warden_ingest_batches_total"), Some(0.0));
}

#[tokio::test]
async fn unknown_wire_version_is_400_naming_the_version() {
    let app = app().await;
    let mut bytes = batch().encode_binary();
    bytes[4] = 7;
    let (status, v) = send_json(&app, post(bytes, Some(wire::CONTENT_TYPE_BINARY))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["reason"], "unsupported_version");
    let msg = v["error"].as_str().expect("error text");
    assert!(msg.contains("version 7"), "{msg}");

    let json = br#"{"version": 3, "node": "n", "sent_at_ns": 1}"#.to_vec();
    let (status, v) = send_json(&app, post(json, Some("application/json"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("version 3")),
        "{v}"
    );
}

#[tokio::test]
async fn garbage_is_400_malformed() {
    let app = app().await;
    let mut bytes = MAGIC.to_vec();
    bytes.push(wire::WIRE_VERSION);
    bytes.extend_from_slice(&4u32.to_le_bytes());
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    let (status, v) = send_json(&app, post(bytes, Some(wire::CONTENT_TYPE_BINARY))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["reason"], "malformed");

    let (status, v) = send_json(&app, post(b"[1, 2, 3]".to_vec(), Some("application/json"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["reason"], "malformed");

    let (status, v) = send_json(
        &app,
        post(
            b"GET / HTTP/1.1\r\n".to_vec(),
            Some(wire::CONTENT_TYPE_BINARY),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["reason"], "bad_magic");
}

#[tokio::test]
async fn oversized_batch_is_413_and_counted() {
    let app = app_with_limit(1024).await;
    let (status, v) = send_json(&app, post(vec![0u8; 4096], Some(wire::CONTENT_TYPE_BINARY))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("1024")),
        "{v}"
    );
    let text = metrics_text(&app).await;
    assert_eq!(
        series(&text, r#"warden_ingest_rejected_total{reason="too_large"}"#),
        Some(1.0)
    );

    let (status, _) = send_json(
        &app,
        post(batch().encode_binary(), Some(wire::CONTENT_TYPE_BINARY)),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a batch under the limit still passes"
    );
}

#[tokio::test]
async fn wrong_content_type_is_415() {
    let app = app().await;
    for ct in [Some("text/plain"), None] {
        let (status, v) = send_json(&app, post(batch().encode_binary(), ct)).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}");
        let msg = v["error"].as_str().expect("error text");
        assert!(msg.contains("application/vnd.warden.batch"), "{msg}");
    }
}

#[tokio::test]
async fn incidents_list_is_an_array_and_filters_are_checked() {
    let app = app().await;
    let (status, v) = send_json(&app, get("/api/v1/incidents")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v, Value::Array(vec![]));

    let (status, v) = send_json(
        &app,
        get("/api/v1/incidents?state=open&kind=gpu_fault&job=llama"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v.is_array());

    let (status, v) = send_json(&app, get("/api/v1/incidents?state=sleeping")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = v["error"].as_str().expect("error text");
    assert!(
        msg.contains("`state`") && msg.contains("open, diagnosed, mitigating, resolved"),
        "{msg}"
    );

    let (status, v) = send_json(&app, get("/api/v1/incidents?kind=meteor")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = v["error"].as_str().expect("error text");
    assert!(
        msg.contains("`kind`") && msg.contains("slow_link") && msg.contains("gpu_fault"),
        "{msg}"
    );
}

#[tokio::test]
async fn unknown_incident_job_and_route_are_404_json() {
    let app = app().await;
    let (status, v) = send_json(&app, get("/api/v1/incidents/inc-does-not-exist")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("inc-does-not-exist")),
        "{v}"
    );

    let (status, v) = send_json(&app, get("/api/v1/jobs/nope/ranks")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("nope")),
        "{v}"
    );

    let (status, v) = send_json(&app, get("/api/v2/everything")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(v["error"].is_string());

    let (status, v) = send_json(&app, get("/api/v1/ingest")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(v["error"].is_string());
}

#[tokio::test]
async fn jobs_list_is_an_array() {
    let app = app().await;
    let (status, v) = send_json(&app, get("/api/v1/jobs")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(v.is_array(), "{v}");
}

#[tokio::test]
async fn probes_answer() {
    let app = app().await;
    let (status, body) = send(&app, get("/healthz")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"ok"[..]));
    let (status, _) = send(&app, get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    let resp = app
        .clone()
        .oneshot(get("/metrics"))
        .await
        .expect("infallible");
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    assert!(ct.is_some_and(|c| c.starts_with("text/plain")), "{ct:?}");
    let text = metrics_text(&app).await;
    assert!(
        text.contains(r#"warden_controller_build_info{version="test"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"warden_incidents_open{kind="hang"} 0"#));
}

#[tokio::test]
async fn metrics_export_job_and_rank_progress_labelled_job_name() {
    let app = app().await;
    let (status, v) = send_json(
        &app,
        post(batch().encode_binary(), Some(wire::CONTENT_TYPE_BINARY)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let text = metrics_text(&app).await;
    for (name, want) in [
        (r#"warden_job_ranks{job_name="llama"}"#, 8.0),
        (r#"warden_job_ranks_exited{job_name="llama"}"#, 0.0),
        (r#"warden_job_step{job_name="llama"}"#, 1.0),
        (
            r#"warden_job_incidents_open{job_name="llama",kind="hang"}"#,
            0.0,
        ),
        (r#"warden_rank_step{job_name="llama",rank="0"}"#, 1.0),
        (r#"warden_rank_step_lag{job_name="llama",rank="0"}"#, 0.0),
        (r#"warden_rank_loss{job_name="llama",rank="0"}"#, 2.5),
        (r#"warden_rank_grad_norm{job_name="llama",rank="0"}"#, 1.0),
    ] {
        assert_eq!(series(&text, name), Some(want), "{name}:\n{text}");
    }
    // Rank 1 reported no training metric: no step series rather than a made-up zero.
    assert_eq!(
        series(&text, r#"warden_rank_step{job_name="llama",rank="1"}"#),
        None
    );
}

fn lifecycle(job: &str, body: &str, content_type: Option<&str>) -> Request<Body> {
    let mut r = Request::post(format!("/api/v1/jobs/{job}/lifecycle"));
    if let Some(ct) = content_type {
        r = r.header(header::CONTENT_TYPE, ct);
    }
    r.body(Body::from(body.to_owned())).expect("request")
}

const START: &str = r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"4242",
    "name":"llama-70b","nodes":["gpu01","gpu02"],"ranks":16}"#;
const END: &str = r#"{"event":"end","scheduler":"slurm","scheduler_job_id":"4242",
    "name":"llama-70b","nodes":["gpu01","gpu02"],"ranks":16}"#;

async fn job_view(app: &Router, job: &str) -> Value {
    let (status, v) = send_json(app, get("/api/v1/jobs")).await;
    assert_eq!(status, StatusCode::OK);
    v.as_array()
        .expect("array")
        .iter()
        .find(|j| j["job"] == job)
        .cloned()
        .unwrap_or_else(|| panic!("no job {job} in {v}"))
}

#[tokio::test]
async fn lifecycle_start_and_end_show_in_the_jobs_list_and_repeats_change_nothing() {
    let app = app().await;
    let json = Some("application/json");
    let (status, v) = send_json(&app, lifecycle("4242", START, json)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(
        v,
        serde_json::json!({"job": "4242", "event": "start", "phase": "running", "repeat": false})
    );
    let j = job_view(&app, "4242").await;
    assert_eq!(j["scheduler"], "slurm", "{j}");
    assert_eq!(j["scheduler_job_id"], "4242");
    assert_eq!(j["scheduler_job_name"], "llama-70b");
    assert_eq!(j["phase"], "running");
    assert_eq!(j["expected_nodes"], serde_json::json!(["gpu01", "gpu02"]));
    assert_eq!(j["expected_ranks"], 16);
    assert_eq!(j["ended_s"], Value::Null);
    let started = j["started_s"].as_f64().expect("started_s");

    let (status, v) = send_json(&app, lifecycle("4242", START, json)).await;
    assert_eq!(
        (status, &v["repeat"]),
        (StatusCode::ACCEPTED, &Value::Bool(true))
    );
    assert_eq!(job_view(&app, "4242").await["started_s"], started);

    for repeat in [false, true] {
        let (status, v) = send_json(&app, lifecycle("4242", END, json)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        assert_eq!(
            (&v["phase"], &v["repeat"]),
            (&"ended".into(), &repeat.into())
        );
    }
    let j = job_view(&app, "4242").await;
    assert_eq!(j["phase"], "ended");
    assert!(j["ended_s"].is_f64(), "{j}");

    // A job the agents know gets the scheduler's view added.
    let (status, _) = send(&app, post(batch().encode_json(), json)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(&app, lifecycle("llama", START, json)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let j = job_view(&app, "llama").await;
    assert_eq!(
        (j["ranks"].as_u64(), &j["phase"]),
        (Some(8), &"running".into())
    );

    let text = metrics_text(&app).await;
    let name = r#"warden_job_lifecycle_events_total{event="start",scheduler="slurm"}"#;
    assert_eq!(series(&text, name), Some(3.0), "{text}");
    let name = r#"warden_job_lifecycle_events_total{event="end",scheduler="slurm"}"#;
    assert_eq!(series(&text, name), Some(2.0), "{text}");
}

#[tokio::test]
async fn lifecycle_refusals_are_400_or_415_and_name_the_problem() {
    let app = app().await;
    let json = Some("application/json");
    let cases = [
        ("4242", START.replace("\"start\"", "\"pause\""), "`event`"),
        (
            "4242",
            START.replace(r#"["gpu01","gpu02"]"#, "[]"),
            "`nodes`",
        ),
        ("4242", START.replace(r#""gpu02""#, r#""""#), "`nodes[1]`"),
        (
            "4242",
            START.replace(r#""ranks":16"#, r#""ranks":-1"#),
            "`ranks`",
        ),
        ("4242", START.replace(r#""slurm""#, "7"), "`scheduler`"),
        ("4242", "{".to_owned(), "body"),
        ("bad%20name", START.to_owned(), "job name"),
        ("%07", START.to_owned(), "job name"),
    ];
    for (job, body, needle) in cases {
        let (status, v) = send_json(&app, lifecycle(job, &body, json)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{job} {body}: {v}");
        let e = v["error"].as_str().expect("error string");
        assert!(e.contains(needle), "{needle} missing from {e}");
    }
    let many: Vec<String> = (0..=warden_engine::lifecycle::MAX_NODES)
        .map(|i| format!("\"n{i}\""))
        .collect();
    let body = START.replace(r#"["gpu01","gpu02"]"#, &format!("[{}]", many.join(",")));
    let (status, v) = send_json(&app, lifecycle("4242", &body, json)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("16384")),
        "{v}"
    );

    for ct in [None, Some("text/plain"), Some(wire::CONTENT_TYPE_BINARY)] {
        let (status, v) = send_json(&app, lifecycle("4242", START, ct)).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}: {v}");
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains("application/json"))
        );
    }
    let (status, v) = send_json(&app, get("/api/v1/jobs/4242/lifecycle")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{v}");
    // Nothing refused left a trace.
    let (_, jobs) = send_json(&app, get("/api/v1/jobs")).await;
    assert_eq!(jobs, serde_json::json!([]));
}

/// Job 4242's end with `exit` (JSON fields) added.
fn end_with(exit: &str) -> String {
    format!(r#"{{"event":"end","scheduler":"slurm","scheduler_job_id":"4242"{exit}}}"#)
}

#[tokio::test]
async fn an_end_with_an_exit_state_shows_in_the_job_and_on_open_incidents() {
    let (app, engine) = app_and_engine(warden_controller::api::DEFAULT_MAX_BATCH_BYTES).await;
    let json = Some("application/json");
    // Job 4242's rank 0 reports a NaN loss: an open incident for the job.
    let mut b = batch();
    b.jobs[0].job = "4242".into();
    b.jobs[0].metrics[0].loss = Some(f64::NAN);
    let (status, v) = send_json(
        &app,
        post(b.encode_binary(), Some(wire::CONTENT_TYPE_BINARY)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // Past the NaN detector's grace for the other ranks to report the step.
    let opened = engine.lock().tick(Timestamp(T0 + 2_000_000_000));
    let [opened] = opened.as_slice() else {
        panic!("one incident for job 4242: {opened:?}");
    };
    let id = opened.id.clone();

    let (status, v) = send_json(&app, lifecycle("4242", START, json)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let j = job_view(&app, "4242").await;
    assert_eq!(
        (&j["exit_code"], &j["signal"]),
        (&Value::Null, &Value::Null),
        "{j}"
    );

    let body = end_with(r#","exit_code":0,"signal":9,"derived_exit_code":1,"derived_signal":0"#);
    let (status, v) = send_json(&app, lifecycle("4242", &body, json)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(
        (&v["phase"], &v["repeat"]),
        (&"ended".into(), &false.into())
    );
    let j = job_view(&app, "4242").await;
    assert_eq!(j["phase"], "ended", "{j}");
    // Killed by SIGKILL: no exit code (wait(2) gives one or the other).
    assert_eq!(j["exit_code"], Value::Null, "{j}");
    assert_eq!(j["signal"], 9, "{j}");
    assert_eq!(j["derived_exit_code"], 1, "{j}");
    assert_eq!(j["derived_signal"], Value::Null, "{j}");

    // The API serves incidents from the store, which no persister fills here: read the
    // engine's own.
    let inc = engine.lock().incident(&id).expect("the incident").clone();
    let notes: Vec<&str> = inc.timeline.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(
        notes.last(),
        Some(
            &"slurm job 4242 ended: killed by signal 9 (SIGKILL), worst step: exit code 1; \
              no new hang, straggler or slow-link findings for it"
        ),
        "{notes:#?}"
    );
}

#[tokio::test]
async fn an_exit_state_out_of_range_or_on_a_start_is_a_400_naming_the_field() {
    let app = app().await;
    let json = Some("application/json");
    let cases = [
        (
            end_with(r#","exit_code":256"#),
            "field `exit_code`: 256 is not in 0..=255",
        ),
        (end_with(r#","exit_code":-1"#), "field `exit_code`"),
        (end_with(r#","exit_code":"1""#), "field `exit_code`"),
        (
            end_with(r#","signal":128"#),
            "field `signal`: 128 is not in 0..=127",
        ),
        (end_with(r#","signal":1.5"#), "field `signal`"),
        (
            end_with(r#","derived_exit_code":300"#),
            "field `derived_exit_code`",
        ),
        (
            end_with(r#","derived_signal":4294967296"#),
            "field `derived_signal`",
        ),
        (
            START.replace(r#""ranks":16"#, r#""ranks":16,"exit_code":0"#),
            "field `exit_code`: only an end carries exit state",
        ),
    ];
    for (body, needle) in cases {
        let (status, v) = send_json(&app, lifecycle("4242", &body, json)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        let e = v["error"].as_str().expect("error string");
        assert!(e.contains(needle), "{needle:?} missing from {e:?}");
    }
    // Nothing refused left a trace; the bounds themselves are accepted.
    let (_, jobs) = send_json(&app, get("/api/v1/jobs")).await;
    assert_eq!(jobs, serde_json::json!([]));
    let body = end_with(r#","exit_code":255,"signal":127"#);
    let (status, v) = send_json(&app, lifecycle("4242", &body, json)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let j = job_view(&app, "4242").await;
    assert_eq!(
        (&j["exit_code"], &j["signal"]),
        (&255.into(), &127.into()),
        "{j}"
    );
}

#[tokio::test]
async fn node_and_fleet_health_come_from_the_ledger() {
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp::ZERO));
    let state = ApiState {
        engine: engine.clone(),
        clock: Arc::new(ManualClock::new(Timestamp(T0 + 1_000_000_000))),
        metrics: Arc::new(Metrics::new("test").expect("metrics")),
        max_batch_bytes: warden_controller::api::DEFAULT_MAX_BATCH_BYTES,
        auth: Arc::new(warden_controller::auth::Auth::Open),
        operator: warden_controller::operate::Operator::in_memory(engine.clone())
            .await
            .expect("store"),
    };
    let app = router(state);
    // node-01's agent reports; node-03 is quarantined by a person.
    let (status, _) = send(
        &app,
        post(batch().encode_binary(), Some(wire::CONTENT_TYPE_BINARY)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    engine
        .lock()
        .ledger_mut()
        .decide("node-03", true, "alice", "GPU 2 flaky", Timestamp(T0));

    let (status, v) = send_json(&app, get("/api/v1/nodes/node-03/health")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "quarantined");
    assert_eq!(v["held_out"], true);
    assert_eq!(v["history"][0]["to"], "quarantined");
    assert!(
        v["reason"].as_str().is_some_and(|r| r.contains("alice")),
        "{v}"
    );

    let (status, v) = send_json(&app, get("/api/v1/nodes/node-01/health")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "healthy");
    assert_eq!(v["history"], serde_json::json!([]));

    let (status, v) = send_json(&app, get("/api/v1/nodes/node-77/health")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("node-77")),
        "{v}"
    );
    let (status, v) = send_json(&app, get("/api/v1/nodes/Not_A_Node/health")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");

    let (status, v) = send_json(&app, get("/api/v1/fleet/health")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["by_state"]["quarantined"], 1);
    assert_eq!(v["by_state"]["bad"], 0);
    assert_eq!(v["held_out"], serde_json::json!(["node-03"]));
}
