//! The controller's HTTP API (axum): batch ingest from agents, incidents, jobs and rank
//! progress for people and tools, health probes and Prometheus metrics.
//!
//! Every error answer is JSON, `{"error": "..."}`; decode errors add a bounded
//! `"reason"` label (the same one `warden_ingest_rejected_total` counts). Every route
//! under `/api/v1` needs a bearer token whose role allows it ([`crate::auth`]); the
//! probes and `/metrics` do not.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use serde::{Deserialize, Serialize};
use warden_model::{IncidentKind, IncidentState};

use crate::auth::{Auth, Need, Principal, Refusal};
use crate::clock::Clock;
use crate::engine::{Encoding, SharedEngine};
use crate::lifecycle::{self, Applied, Phase};
use crate::metrics::{self, Metrics};
use crate::operate::{OperateError, Operator};
use crate::store::{self, ActionRecord, IncidentFilter, NodeRecord};
use crate::view::{IncidentView, JobView, NodeView, RankView};

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
    /// Who may call what.
    pub auth: Arc<Auth>,
    /// Actions on incidents and nodes, and the store behind them.
    pub operator: Operator,
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

/// Largest body of an operator's request (ack, resolve, drain), bytes.
pub const OPERATE_MAX_BYTES: usize = 16 * 1024;

/// Every route under `/api/v1`: method, path and what it needs. The authorization
/// matrix test walks this list.
pub const ROUTES: &[(&str, &str, Need)] = &[
    ("POST", "/api/v1/ingest", Need::Report),
    ("POST", "/api/v1/jobs/{job}/lifecycle", Need::Report),
    ("GET", "/api/v1/incidents", Need::Read),
    ("GET", "/api/v1/incidents/{id}", Need::Read),
    ("POST", "/api/v1/incidents/{id}/ack", Need::Operate),
    ("POST", "/api/v1/incidents/{id}/resolve", Need::Operate),
    ("GET", "/api/v1/nodes", Need::Read),
    ("POST", "/api/v1/nodes/{name}/drain", Need::Operate),
    ("DELETE", "/api/v1/nodes/{name}/drain", Need::Operate),
    ("GET", "/api/v1/jobs", Need::Read),
    ("GET", "/api/v1/jobs/{job}/ranks", Need::Read),
    ("GET", "/api/v1/actions", Need::Admin),
    ("GET", "/api/v1/whoami", Need::Read),
];

async fn guard(s: &ApiState, need: Need, mut req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match s.auth.check(header, need) {
        Ok(p) => {
            let leadership = &s.operator.leadership;
            if matches!(need, Need::Report | Need::Operate) && !leadership.is_leader() {
                // A follower does not act: the leader does.
                return crate::forward::relay(req, leadership.leader_url(), leadership.id()).await;
            }
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(refusal) => {
            let (status, text) = match refusal {
                Refusal::Missing => (
                    StatusCode::UNAUTHORIZED,
                    "a bearer token is required (Authorization: Bearer TOKEN)".to_owned(),
                ),
                Refusal::Unknown => (StatusCode::UNAUTHORIZED, "unknown token".to_owned()),
                Refusal::Forbidden(role) => (
                    StatusCode::FORBIDDEN,
                    format!("role {role} may not {} {}", req.method(), req.uri().path()),
                ),
            };
            tracing::debug!(status = status.as_u16(), path = %req.uri().path(), "request refused");
            let mut resp = ApiError::new(status, text).into_response();
            if status == StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"warden\""),
                );
            }
            resp
        }
    }
}

async fn need_read(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    guard(&s, Need::Read, req, next).await
}

async fn need_operate(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    guard(&s, Need::Operate, req, next).await
}

async fn need_admin(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    guard(&s, Need::Admin, req, next).await
}

async fn need_report(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    guard(&s, Need::Report, req, next).await
}

/// Build the router.
pub fn router(state: ApiState) -> Router {
    let max = state.max_batch_bytes;
    let report = Router::new()
        .route(
            "/api/v1/ingest",
            post(ingest).layer(DefaultBodyLimit::max(max)),
        )
        .route(
            "/api/v1/jobs/{job}/lifecycle",
            post(job_lifecycle).layer(DefaultBodyLimit::max(LIFECYCLE_MAX_BYTES)),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), need_report));
    let read = Router::new()
        .route("/api/v1/incidents", get(list_incidents))
        .route("/api/v1/incidents/{id}", get(get_incident))
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/jobs/{job}/ranks", get(job_ranks))
        .route("/api/v1/whoami", get(whoami))
        .route_layer(middleware::from_fn_with_state(state.clone(), need_read));
    let operate = Router::new()
        .route("/api/v1/incidents/{id}/ack", post(ack_incident))
        .route("/api/v1/incidents/{id}/resolve", post(resolve_incident))
        .route(
            "/api/v1/nodes/{name}/drain",
            post(drain_node).delete(undrain_node),
        )
        .layer(DefaultBodyLimit::max(OPERATE_MAX_BYTES))
        .route_layer(middleware::from_fn_with_state(state.clone(), need_operate));
    let admin = Router::new()
        .route("/api/v1/actions", get(list_actions))
        .route_layer(middleware::from_fn_with_state(state.clone(), need_admin));
    Router::new()
        .merge(report)
        .merge(read)
        .merge(operate)
        .merge(admin)
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

/// Filters and paging of `GET /api/v1/incidents`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct IncidentQuery {
    state: Option<String>,
    kind: Option<String>,
    job: Option<String>,
    node: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

/// Default page size of lists.
pub const DEFAULT_PAGE: u32 = 100;

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

fn store_error(e: &store::StoreError) -> ApiError {
    tracing::error!(error = %e, "store failed");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the incident store is unavailable: {e}"),
    )
}

fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(n) if (1..=store::MAX_PAGE).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "invalid value {n} for parameter `limit`; allowed: 1 to {}",
                store::MAX_PAGE
            ),
        )),
    }
}

/// Incidents, oldest first, a page at a time: when the page is full, the
/// `X-Warden-Next-After` header holds the `after` value of the next page.
async fn list_incidents(
    State(s): State<ApiState>,
    query: Result<Query<IncidentQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
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
    let nonempty = |v: Option<String>| v.filter(|v| !v.is_empty());
    let limit = page_limit(q.limit)?;
    let filter = IncidentFilter {
        state,
        kind,
        job: nonempty(q.job),
        node: nonempty(q.node),
        after: nonempty(q.after),
        limit,
    };
    let found = s
        .operator
        .store
        .incidents(&filter)
        .await
        .map_err(|e| store_error(&e))?;
    let origin = s.engine.lock().origin();
    let next = (found.len() == limit as usize)
        .then(|| found.last().map(|i| i.id.clone()))
        .flatten();
    let views: Vec<IncidentView> = found.iter().map(|i| IncidentView::new(i, origin)).collect();
    let mut resp = Json(views).into_response();
    if let Some(v) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-warden-next-after", v);
    }
    Ok(resp)
}

async fn get_incident(
    State(s): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<IncidentView>, ApiError> {
    let Path(id) = id.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let found = s
        .operator
        .store
        .incident(&id)
        .await
        .map_err(|e| store_error(&e))?;
    let origin = s.engine.lock().origin();
    match found {
        Some(inc) => Ok(Json(IncidentView::new(&inc, origin))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no incident {id:?}"),
        )),
    }
}

/// Body of `POST /api/v1/incidents/{id}/ack`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    #[serde(default)]
    note: String,
}

/// Body of `POST /api/v1/incidents/{id}/resolve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    reason: String,
}

/// Body of `POST /api/v1/nodes/{name}/drain`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    reason: String,
    #[serde(default)]
    incident: Option<String>,
}

/// Body of `DELETE /api/v1/nodes/{name}/drain` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UndrainBody {
    #[serde(default)]
    reason: String,
}

/// Parse an optional or required JSON body.
fn json_body<T: serde::de::DeserializeOwned>(
    body: &Result<Bytes, BytesRejection>,
    empty: Option<T>,
) -> Result<T, ApiError> {
    let bytes = match body {
        Ok(b) => b,
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body is larger than the {OPERATE_MAX_BYTES}-byte limit"),
            ));
        }
        Err(r) => return Err(ApiError::new(r.status(), r.body_text())),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        if let Some(v) = empty {
            return Ok(v);
        }
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

fn operate_error(e: OperateError) -> ApiError {
    let status = match &e {
        OperateError::Invalid(_) => StatusCode::BAD_REQUEST,
        OperateError::UnknownIncident(_) => StatusCode::NOT_FOUND,
        OperateError::Resolved(_) | OperateError::AlreadyDrained { .. } => StatusCode::CONFLICT,
        OperateError::NotDrained(_) => StatusCode::NOT_FOUND,
        OperateError::Store(e) => return store_error(e),
    };
    ApiError::new(status, e.to_string())
}

async fn incident_after(s: &ApiState, id: &str) -> Result<Json<IncidentView>, ApiError> {
    get_incident(State(s.clone()), Ok(Path(id.to_owned()))).await
}

#[tracing::instrument(name = "ack", skip_all, fields(incident = %id, actor = %who.name))]
async fn ack_incident(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IncidentView>, ApiError> {
    let b: AckBody = json_body(&body, Some(AckBody::default()))?;
    let now = s.clock.now();
    s.operator
        .acknowledge(&id, &who.name, &b.note, now)
        .await
        .map_err(operate_error)?;
    tracing::info!("incident acknowledged");
    incident_after(&s, &id).await
}

#[tracing::instrument(name = "resolve", skip_all, fields(incident = %id, actor = %who.name))]
async fn resolve_incident(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IncidentView>, ApiError> {
    let b: ResolveBody = json_body(&body, None)?;
    let now = s.clock.now();
    s.operator
        .resolve(&id, &who.name, &b.reason, now)
        .await
        .map_err(operate_error)?;
    tracing::info!("incident resolved by hand");
    incident_after(&s, &id).await
}

async fn list_nodes(State(s): State<ApiState>) -> Result<Json<Vec<NodeView>>, ApiError> {
    let now = s.clock.now();
    let drained = s
        .operator
        .store
        .nodes()
        .await
        .map_err(|e| store_error(&e))?;
    let (agents, origin) = {
        let e = s.engine.lock();
        (e.agents(now), e.origin())
    };
    Ok(Json(NodeView::merge(&agents, &drained, origin)))
}

#[tracing::instrument(name = "drain", skip_all, fields(node = %name, actor = %who.name))]
async fn drain_node(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<NodeView>), ApiError> {
    let b: DrainBody = json_body(&body, None)?;
    let now = s.clock.now();
    let rec: NodeRecord = s
        .operator
        .drain(&name, &who.name, &b.reason, b.incident.as_deref(), now)
        .await
        .map_err(operate_error)?;
    tracing::info!(reason = %b.reason, "node drained");
    let origin = s.engine.lock().origin();
    Ok((
        StatusCode::CREATED,
        Json(NodeView::from_record(&rec, None, origin)),
    ))
}

#[tracing::instrument(name = "undrain", skip_all, fields(node = %name, actor = %who.name))]
async fn undrain_node(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let b: UndrainBody = json_body(&body, Some(UndrainBody::default()))?;
    let now = s.clock.now();
    s.operator
        .undrain(&name, &who.name, &b.reason, now)
        .await
        .map_err(operate_error)?;
    tracing::info!("node undrained");
    Ok(StatusCode::NO_CONTENT)
}

/// Paging and filter of `GET /api/v1/actions`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionQuery {
    after: Option<String>,
    target: Option<String>,
    limit: Option<u32>,
}

async fn list_actions(
    State(s): State<ApiState>,
    query: Result<Query<ActionQuery>, QueryRejection>,
) -> Result<Json<Vec<ActionRecord>>, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let limit = page_limit(q.limit)?;
    let actions = s
        .operator
        .store
        .actions(q.after.as_deref(), q.target.as_deref(), limit)
        .await
        .map_err(|e| store_error(&e))?;
    Ok(Json(actions))
}

/// The caller, as the API sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoAmI {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: crate::auth::Role,
}

async fn whoami(Extension(who): Extension<Principal>) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: who.name,
        role: who.role,
    })
}

/// Jobs: live from the engine on the leader; as last stored on a follower.
async fn list_jobs(State(s): State<ApiState>) -> Result<Json<Vec<JobView>>, ApiError> {
    if s.operator.leadership.is_leader() {
        return Ok(Json(s.engine.lock().job_views()));
    }
    let stored = s.operator.store.jobs().await.map_err(|e| store_error(&e))?;
    Ok(Json(
        stored
            .iter()
            .filter_map(|j| serde_json::from_str(&j.doc).ok())
            .collect(),
    ))
}

async fn job_ranks(
    State(s): State<ApiState>,
    job: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<RankView>>, ApiError> {
    let Path(job) = job.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let lead = &s.operator.leadership;
    if !lead.is_leader() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "live rank progress is held by the leading controller ({}); ask it",
                lead.leader_url().unwrap_or_else(|| "none known yet".into())
            ),
        ));
    }
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
    s.metrics
        .leader
        .set(i64::from(s.operator.leadership.is_leader()));
    let text = s
        .metrics
        .render()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}
