//! The controller's HTTP API (axum): batch ingest from agents, incidents, jobs and rank
//! progress for people and tools, health probes and Prometheus metrics.
//!
//! Every error answer is JSON, `{"error": "..."}`; decode errors add a bounded
//! `"reason"` label (the same one `warden_ingest_rejected_total` counts).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use serde::{Deserialize, Serialize};
use warden_model::{IncidentKind, IncidentState};

use crate::clock::Clock;
use crate::engine::{Encoding, SharedEngine};
use crate::lifecycle::{self, Applied, Phase};
use crate::metrics::{self, Metrics};
use crate::view::{IncidentView, JobView, RankView};

/// Default largest ingest body accepted, bytes.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

/// How long `/readyz` waits for the engine lock before answering 503.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Content types accepted as the binary batch form.
pub const BINARY_CONTENT_TYPES: &[&str] = &[
    "application/vnd.warden.batch",
    "application/octet-stream",
    "application/x-protobuf",
];

/// Largest lifecycle report body accepted, bytes: room for
/// [`lifecycle::MAX_NODES`] node names of ordinary length.
pub const LIFECYCLE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The engine.
    pub engine: SharedEngine,
    /// Source of "now" (receipt times, rank views, agent liveness).
    pub clock: Arc<dyn Clock>,
    /// Metrics rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Largest ingest body accepted, bytes.
    pub max_batch_bytes: usize,
}

/// An error answer: a status and a JSON body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApiError {
    #[serde(skip)]
    status: StatusCode,
    /// What went wrong, in words.
    pub error: String,
    /// A bounded label for decode errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, error: impl Into<String>) -> Self {
        ApiError {
            status,
            error: error.into(),
            reason: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(&self)).into_response()
    }
}

/// The answer to a successful ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestResponse {
    /// Records applied.
    pub accepted: usize,
}

/// Build the router.
pub fn router(state: ApiState) -> Router {
    let max = state.max_batch_bytes;
    Router::new()
        .route(
            "/api/v1/ingest",
            post(ingest).layer(DefaultBodyLimit::max(max)),
        )
        .route("/api/v1/incidents", get(list_incidents))
        .route("/api/v1/incidents/{id}", get(get_incident))
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/jobs/{job}/ranks", get(job_ranks))
        .route(
            "/api/v1/jobs/{job}/lifecycle",
            post(job_lifecycle).layer(DefaultBodyLimit::max(LIFECYCLE_MAX_BYTES)),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

/// The encoding a `Content-Type` names, or the 415 answer.
fn encoding_of(headers: &HeaderMap) -> Result<Encoding, ApiError> {
    let raw = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let mime = raw.map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    match mime.as_deref() {
        Some(m) if BINARY_CONTENT_TYPES.contains(&m) => Ok(Encoding::Binary),
        Some("application/json") => Ok(Encoding::Json),
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "unsupported content type {}; send {} (binary) or application/json",
                raw.map_or_else(|| "(none)".to_owned(), |r| format!("{r:?}")),
                BINARY_CONTENT_TYPES.join(", ")
            ),
        )),
    }
}

#[tracing::instrument(name = "ingest", skip_all)]
async fn ingest(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IngestResponse>, ApiError> {
    let encoding = encoding_of(&headers)?;
    let body = match body {
        Ok(b) => b,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            s.engine.lock().count_rejection("too_large");
            tracing::debug!(limit_bytes = s.max_batch_bytes, "batch rejected: too large");
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("batch is larger than the {}-byte limit", s.max_batch_bytes),
            ));
        }
        Err(rejection) => {
            return Err(ApiError::new(rejection.status(), rejection.body_text()));
        }
    };
    let now = s.clock.now();
    let result = s.engine.lock().ingest(&body, encoding, now);
    match result {
        Ok(accepted) => Ok(Json(IngestResponse { accepted })),
        Err(e) => {
            tracing::debug!(reason = e.reason(), bytes = body.len(), error = %e, "batch rejected");
            Err(ApiError {
                status: StatusCode::BAD_REQUEST,
                error: e.to_string(),
                reason: Some(e.reason()),
            })
        }
    }
}

/// Filters of `GET /api/v1/incidents`.
#[derive(Debug, Default, Deserialize)]
struct IncidentQuery {
    state: Option<String>,
    kind: Option<String>,
    job: Option<String>,
}

const STATES: [IncidentState; 4] = [
    IncidentState::Open,
    IncidentState::Diagnosed,
    IncidentState::Mitigating,
    IncidentState::Resolved,
];

fn parse_state(s: &str) -> Result<IncidentState, ApiError> {
    STATES
        .into_iter()
        .find(|st| st.as_str() == s)
        .ok_or_else(|| {
            let allowed: Vec<_> = STATES.iter().map(|st| st.as_str()).collect();
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "invalid value {s:?} for parameter `state`; allowed: {}",
                    allowed.join(", ")
                ),
            )
        })
}

fn parse_kind(s: &str) -> Result<IncidentKind, ApiError> {
    s.parse().map_err(|_| {
        let allowed: Vec<_> = IncidentKind::ALL.iter().map(|k| k.as_str()).collect();
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "invalid value {s:?} for parameter `kind`; allowed: {}",
                allowed.join(", ")
            ),
        )
    })
}

async fn list_incidents(
    State(s): State<ApiState>,
    query: Result<Query<IncidentQuery>, QueryRejection>,
) -> Result<Json<Vec<IncidentView>>, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let state = q
        .state
        .as_deref()
        .filter(|v| !v.is_empty())
        .map(parse_state)
        .transpose()?;
    let kind = q
        .kind
        .as_deref()
        .filter(|v| !v.is_empty())
        .map(parse_kind)
        .transpose()?;
    let job = q.job.as_deref().filter(|v| !v.is_empty());
    let views = s.engine.lock().incident_views(state, kind, job);
    Ok(Json(views))
}

async fn get_incident(
    State(s): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<IncidentView>, ApiError> {
    let Path(id) = id.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let engine = s.engine.lock();
    match engine.incident(&id) {
        Some(inc) => Ok(Json(IncidentView::new(inc, engine.origin()))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no incident {id:?}"),
        )),
    }
}

async fn list_jobs(State(s): State<ApiState>) -> Json<Vec<JobView>> {
    Json(s.engine.lock().job_views())
}

async fn job_ranks(
    State(s): State<ApiState>,
    job: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<RankView>>, ApiError> {
    let Path(job) = job.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let now = s.clock.now();
    let ranks = s.engine.lock().rank_views(&job, now);
    ranks
        .map(Json)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no job {job:?}")))
}

/// The answer to an accepted lifecycle report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleResponse {
    /// The Warden job.
    pub job: String,
    /// `start` or `end`.
    pub event: String,
    /// The job's phase now.
    pub phase: Phase,
    /// Whether the job already was in that phase (nothing changed).
    pub repeat: bool,
}

#[tracing::instrument(name = "lifecycle", skip_all, fields(job))]
async fn job_lifecycle(
    State(s): State<ApiState>,
    job: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<LifecycleResponse>), ApiError> {
    let Path(job) = job.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    tracing::Span::current().record("job", job.as_str());
    if !matches!(encoding_of(&headers), Ok(Encoding::Json)) {
        let got = headers
            .get(header::CONTENT_TYPE)
            .map_or("(none)", |v| v.to_str().unwrap_or("(not text)"));
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("unsupported content type {got:?}; a lifecycle report is application/json"),
        ));
    }
    let body = match body {
        Ok(b) => b,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("lifecycle report is larger than the {LIFECYCLE_MAX_BYTES}-byte limit"),
            ));
        }
        Err(rejection) => return Err(ApiError::new(rejection.status(), rejection.body_text())),
    };
    let refuse = |e: lifecycle::LifecycleError| {
        tracing::debug!(error = %e, "lifecycle report refused");
        ApiError::new(StatusCode::BAD_REQUEST, e.0)
    };
    lifecycle::check_job_name(&job).map_err(refuse)?;
    let report = lifecycle::parse(&body).map_err(refuse)?;
    let now = s.clock.now();
    let mut engine = s.engine.lock();
    let applied = engine.lifecycle(&job, &report, now);
    let phase = engine.job_phase(&job).unwrap_or(match report.event {
        lifecycle::LifecycleEvent::Start => Phase::Running,
        lifecycle::LifecycleEvent::End => Phase::Ended,
    });
    drop(engine);
    tracing::info!(
        event = report.event.as_str(),
        scheduler = %report.scheduler,
        scheduler_job_id = %report.scheduler_job_id,
        nodes = report.nodes.len(),
        repeat = applied == Applied::Repeat,
        "job lifecycle"
    );
    Ok((
        StatusCode::ACCEPTED,
        Json(LifecycleResponse {
            job,
            event: report.event.as_str().to_owned(),
            phase,
            repeat: applied == Applied::Repeat,
        }),
    ))
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<ApiState>) -> Result<&'static str, ApiError> {
    let engine = s.engine.clone();
    let taken = tokio::task::spawn_blocking(move || drop(engine.lock()));
    match tokio::time::timeout(READY_TIMEOUT, taken).await {
        Ok(Ok(())) => Ok("ready"),
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("engine lock check failed: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("engine busy for more than {} s", READY_TIMEOUT.as_secs()),
        )),
    }
}

async fn render_metrics(State(s): State<ApiState>) -> Result<Response, ApiError> {
    let now = s.clock.now();
    s.metrics.update(&s.engine.lock(), now);
    let text = s
        .metrics
        .render()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}
