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
use utoipa::{IntoParams, ToSchema};
use warden_model::wire::Batch;
use warden_model::{IncidentKind, IncidentState, Timestamp};

use crate::auth::{Auth, Need, Principal, Refusal};
use crate::metrics::{self, Metrics};
use crate::operate::{OperateError, Operator};
use crate::shared::SharedEngine;
use crate::store::{self, ActionRecord, IncidentFilter, NodeRecord};
use warden_engine::Encoding;
use warden_engine::clock::Clock;
use warden_engine::ledger::{self, NodeHealth};
use warden_engine::lifecycle::{self, Applied, Phase};
use warden_model::view::{
    FleetHealthView, IncidentView, JobView, NodeHealthView, NodeView, RankView, rel,
};

/// Default largest ingest body accepted, bytes.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

/// How long a batch with node events waits to be stored before the answer is 503.
const STORED_WAIT: Duration = Duration::from_secs(5);

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
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ApiError {
    #[serde(skip)]
    status: StatusCode,
    /// What went wrong, in words.
    pub error: String,
    /// A bounded label for decode errors of `POST /api/v1/ingest`: `truncated`,
    /// `bad_magic`, `unsupported_version` or `malformed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
    ("GET", "/api/v1/nodes/{name}/health", Need::Read),
    ("GET", "/api/v1/fleet/health", Need::Read),
    ("GET", "/api/v1/jobs", Need::Read),
    ("GET", "/api/v1/jobs/{job}/ranks", Need::Read),
    ("GET", "/api/v1/actions", Need::Admin),
    ("GET", "/api/v1/remediation", Need::Read),
    ("POST", "/api/v1/remediation/breaker/reset", Need::Admin),
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
            let writes = matches!(need, Need::Report | Need::Operate)
                || (need == Need::Admin && req.method() != Method::GET);
            if writes && !leadership.is_leader() {
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
        .route("/api/v1/nodes/{name}/health", get(node_health))
        .route("/api/v1/fleet/health", get(fleet_health))
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/jobs/{job}/ranks", get(job_ranks))
        .route("/api/v1/whoami", get(whoami))
        .route("/api/v1/remediation", get(remediation_status))
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
        .route(
            "/api/v1/remediation/breaker/reset",
            post(reset_breaker).layer(DefaultBodyLimit::max(OPERATE_MAX_BYTES)),
        )
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

/// A batch in the binary form (the document's name for it): the 9-byte envelope, then
/// the protobuf payload.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)]
struct BinaryBatch(Vec<u8>);

#[utoipa::path(
    post,
    path = "/api/v1/ingest",
    tag = "ingest",
    request_body(
        description = "One batch (docs/WIRE.md): binary (envelope + protobuf) or its JSON form.",
        content(
            (BinaryBatch = "application/vnd.warden.batch"),
            (BinaryBatch = "application/octet-stream"),
            (BinaryBatch = "application/x-protobuf"),
            (Batch = "application/json"),
        ),
    ),
    responses(
        (status = 200, description = "The batch was decoded and applied.", body = IngestResponse),
        (status = 400, description = "The batch could not be decoded; nothing of it is applied. `reason` says why.", body = ApiError),
        (status = 413, description = "The body is larger than `max_batch_bytes`.", body = ApiError),
        (status = 415, description = "Another or no `Content-Type`.", body = ApiError),
    ),
)]
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
    let span = tracing::info_span!(
        target: crate::telemetry::TARGET,
        "ingest",
        bytes = body.len(),
        accepted = tracing::field::Empty,
    );
    let result = span.in_scope(|| s.engine.ingest(&body, encoding, now));
    match result {
        Ok((accepted, mark)) => {
            span.record("accepted", accepted);
            // Node events are sent once: acknowledged only when stored (a crash before
            // would lose them); the agent sends the batch again otherwise.
            if !s.engine.wait_stored(mark, STORED_WAIT).await {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "applied, but not stored yet; send the batch again".to_owned(),
                ));
            }
            Ok(Json(IngestResponse { accepted }))
        }
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

/// Filters and paging of `GET /api/v1/incidents`; an empty value is the same as none.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct IncidentQuery {
    /// Only incidents in this state.
    #[param(value_type = Option<IncidentState>)]
    state: Option<String>,
    /// Only incidents of this kind.
    #[param(value_type = Option<IncidentKind>)]
    kind: Option<String>,
    /// Only incidents of this job (exact match).
    job: Option<String>,
    /// Only incidents naming this node.
    node: Option<String>,
    /// Start after this incident id: the `X-Warden-Next-After` header of the last page.
    after: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
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

/// Longest value of a query parameter, bytes: the longest name anything has (a job's,
/// [`lifecycle::MAX_JOB_NAME_LEN`]).
pub const MAX_QUERY_VALUE_BYTES: usize = lifecycle::MAX_JOB_NAME_LEN;

/// The value of query parameter `name`, `None` when absent or empty, or the 400 answer
/// when it is longer than [`MAX_QUERY_VALUE_BYTES`] or holds a control character: no
/// name has one, and a NUL cut the store's `LIKE` pattern short (`?node=%00` listed
/// every incident).
fn query_value(name: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if v.len() > MAX_QUERY_VALUE_BYTES {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "invalid value for parameter `{name}`: {} bytes, longer than the \
                 {MAX_QUERY_VALUE_BYTES}-byte limit",
                v.len()
            ),
        ));
    }
    if let Some(c) = v.chars().find(|c| c.is_control()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "invalid value for parameter `{name}`: control character {} is not \
                 allowed",
                c.escape_unicode()
            ),
        ));
    }
    Ok(Some(v))
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
#[utoipa::path(
    get,
    path = "/api/v1/incidents",
    tag = "incidents",
    params(IncidentQuery),
    responses(
        (status = 200, description = "Incidents, oldest first.", body = [IncidentView],
            headers(("X-Warden-Next-After" = String, description = "When the page is full: the `after` value of the next page."))),
        (status = 400, description = "A filter or `limit` has a value it cannot have (named).", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
async fn list_incidents(
    State(s): State<ApiState>,
    query: Result<Query<IncidentQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let state = query_value("state", q.state)?
        .as_deref()
        .map(parse_state)
        .transpose()?;
    let kind = query_value("kind", q.kind)?
        .as_deref()
        .map(parse_kind)
        .transpose()?;
    let limit = page_limit(q.limit)?;
    let filter = IncidentFilter {
        state,
        kind,
        job: query_value("job", q.job)?,
        node: query_value("node", q.node)?,
        after: query_value("after", q.after)?,
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
    Ok(with_next_after(Json(views).into_response(), next))
}

/// `resp` with the `X-Warden-Next-After` header set to `next`, when there is a next page.
fn with_next_after(mut resp: Response, next: Option<String>) -> Response {
    if let Some(v) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-warden-next-after", v);
    }
    resp
}

/// One incident with its evidence and timeline.
#[utoipa::path(
    get,
    path = "/api/v1/incidents/{id}",
    tag = "incidents",
    params(("id" = String, Path, description = "Incident id.")),
    responses(
        (status = 200, description = "The incident.", body = IncidentView),
        (status = 400, description = "The path does not decode.", body = ApiError),
        (status = 404, description = "No such incident.", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
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

/// Body of `POST /api/v1/incidents/{id}/ack` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AckBody {
    /// A note for the timeline: at most 1024 characters, no control characters but
    /// newline and tab.
    #[serde(default)]
    #[schema(
        max_length = 1024,
        pattern = r"^[^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*$"
    )]
    note: String,
}

/// Body of `POST /api/v1/incidents/{id}/resolve`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    /// Why it is over: at most 1024 characters, not blank, no control characters but
    /// newline and tab.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = r"^[^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*$"
    )]
    reason: String,
}

/// Body of `POST /api/v1/nodes/{name}/drain`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    /// Why the node is taken out of scheduling: at most 1024 characters, not blank, no
    /// control characters but newline and tab.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = r"^[^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*$"
    )]
    reason: String,
    /// The incident behind the drain, if any.
    #[serde(default)]
    incident: Option<String>,
}

/// Body of `DELETE /api/v1/nodes/{name}/drain` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UndrainBody {
    /// Why the node is given back.
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
    // No body, or JSON `null`, is the default where the body is optional.
    if (bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null")
        && let Some(v) = empty
    {
        return Ok(v);
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

/// A path parameter, recorded on the current span as `field`, or the 400 answer when
/// it does not decode.
fn path_param(p: Result<Path<String>, PathRejection>, field: &str) -> Result<String, ApiError> {
    let Path(v) = p.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    tracing::Span::current().record(field, v.as_str());
    Ok(v)
}

fn operate_error(e: OperateError) -> ApiError {
    let status = match &e {
        OperateError::Invalid(_) => StatusCode::BAD_REQUEST,
        OperateError::UnknownIncident(_) => StatusCode::NOT_FOUND,
        OperateError::Resolved(_) | OperateError::AlreadyDrained { .. } => StatusCode::CONFLICT,
        OperateError::NotDrained(_) => StatusCode::NOT_FOUND,
        OperateError::Refused(_) => StatusCode::CONFLICT,
        OperateError::Store(e) => return store_error(e),
    };
    ApiError::new(status, e.to_string())
}

async fn incident_after(s: &ApiState, id: &str) -> Result<Json<IncidentView>, ApiError> {
    get_incident(State(s.clone()), Ok(Path(id.to_owned()))).await
}

/// Acknowledge an incident: someone is on it.
#[utoipa::path(
    post,
    path = "/api/v1/incidents/{id}/ack",
    tag = "incidents",
    params(("id" = String, Path, description = "Incident id.")),
    request_body(content = Option<AckBody>, content_type = "application/json"),
    responses(
        (status = 200, description = "Acknowledged; the incident as it is now.", body = IncidentView),
        (status = 400, description = "The body is not a valid request.", body = ApiError),
        (status = 404, description = "No such incident.", body = ApiError),
        (status = 409, description = "The incident is resolved.", body = ApiError),
        (status = 413, description = "The body is larger than 16 KiB.", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
#[tracing::instrument(name = "ack", skip_all, fields(incident, actor = %who.name))]
async fn ack_incident(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IncidentView>, ApiError> {
    let id = path_param(id, "incident")?;
    let b: AckBody = json_body(&body, Some(AckBody::default()))?;
    let now = s.clock.now();
    s.operator
        .acknowledge(&id, &who.name, &b.note, now)
        .await
        .map_err(operate_error)?;
    tracing::info!("incident acknowledged");
    incident_after(&s, &id).await
}

/// Resolve an incident by hand.
#[utoipa::path(
    post,
    path = "/api/v1/incidents/{id}/resolve",
    tag = "incidents",
    params(("id" = String, Path, description = "Incident id.")),
    request_body(content = ResolveBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Resolved; the incident as it is now.", body = IncidentView),
        (status = 400, description = "The body is not a valid request.", body = ApiError),
        (status = 404, description = "No such incident.", body = ApiError),
        (status = 409, description = "The incident is already resolved.", body = ApiError),
        (status = 413, description = "The body is larger than 16 KiB.", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
#[tracing::instrument(name = "resolve", skip_all, fields(incident, actor = %who.name))]
async fn resolve_incident(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<IncidentView>, ApiError> {
    let id = path_param(id, "incident")?;
    let b: ResolveBody = json_body(&body, None)?;
    let now = s.clock.now();
    s.operator
        .resolve(&id, &who.name, &b.reason, now)
        .await
        .map_err(operate_error)?;
    tracing::info!("incident resolved by hand");
    incident_after(&s, &id).await
}

/// Every node an agent reports from and every node Warden holds drained, by name.
#[utoipa::path(
    get,
    path = "/api/v1/nodes",
    tag = "nodes",
    responses(
        (status = 200, description = "Nodes, by name.", body = [NodeView]),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
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
    Ok(Json(node_views(&agents, &drained, origin)))
}

/// The node-health ledger's records: live from the engine on the leader; as last
/// stored on a follower.
async fn ledger_nodes(s: &ApiState, only: Option<&str>) -> Result<Vec<NodeHealth>, ApiError> {
    if s.operator.leadership.is_leader() {
        let e = s.engine.lock();
        return Ok(match only {
            Some(n) => e.ledger().node(n).cloned().into_iter().collect(),
            None => e.ledger().nodes().cloned().collect(),
        });
    }
    let docs = s
        .operator
        .store
        .node_health()
        .await
        .map_err(|e| store_error(&e))?;
    Ok(docs
        .iter()
        .filter(|(n, _)| only.is_none_or(|o| o == n))
        .filter_map(|(_, d)| serde_json::from_str(d).ok())
        .collect())
}

/// One node's health: its state in the node-health ledger with the reason, the
/// history of its states, the evidence of the incidents held against it and the jobs
/// they came from.
#[utoipa::path(
    get,
    path = "/api/v1/nodes/{name}/health",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name (DNS-1123).", max_length = 253,
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")),
    responses(
        (status = 200, description = "The node's health (healthy, with no history, for a node an agent reports from that the ledger holds nothing on).", body = NodeHealthView),
        (status = 400, description = "The node name is not valid.", body = ApiError),
        (status = 404, description = "No agent reports from the node and the ledger holds nothing on it.", body = ApiError),
        (status = 503, description = "The store is unavailable (follower).", body = ApiError),
    ),
)]
async fn node_health(
    State(s): State<ApiState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<NodeHealthView>, ApiError> {
    let name = path_param(name, "node")?;
    crate::operate::check_node_name(&name).map_err(operate_error)?;
    let now = s.clock.now();
    let origin = s.engine.lock().origin();
    if let Some(n) = ledger_nodes(&s, Some(&name)).await?.first() {
        return Ok(Json(n.view(origin)));
    }
    let heard = s.engine.lock().agents(now).iter().any(|(n, _)| *n == name);
    if !heard {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no node {name:?}: no agent reports from it and the ledger holds nothing on it"
            ),
        ));
    }
    Ok(Json(NodeHealthView {
        node: name,
        state: ledger::HealthState::Healthy.as_str().to_owned(),
        since_s: 0.0,
        reason: None,
        held_out: false,
        incidents: 0,
        mean_hours_between_incidents: None,
        jobs: Vec::new(),
        history: Vec::new(),
        evidence: Vec::new(),
    }))
}

/// The fleet's health: nodes per state, the nodes held out of placement, the top
/// repeat offenders, and the fleet's mean time between incidents.
#[utoipa::path(
    get,
    path = "/api/v1/fleet/health",
    tag = "nodes",
    responses(
        (status = 200, description = "The fleet's health.", body = FleetHealthView),
        (status = 503, description = "The store is unavailable (follower).", body = ApiError),
    ),
)]
async fn fleet_health(State(s): State<ApiState>) -> Result<Json<FleetHealthView>, ApiError> {
    let nodes = ledger_nodes(&s, None).await?;
    Ok(Json(ledger::fleet_view(&nodes)))
}

/// Take a node out of scheduling.
#[utoipa::path(
    post,
    path = "/api/v1/nodes/{name}/drain",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name (DNS-1123).", max_length = 253,
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")),
    request_body(content = DrainBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Drained.", body = NodeView),
        (status = 400, description = "The body or node name is not valid.", body = ApiError),
        (status = 404, description = "The incident named in the body does not exist.", body = ApiError),
        (status = 409, description = "The node is already drained, or the safety rails refuse it now (tripped circuit breaker, its cap, the rate limit).", body = ApiError),
        (status = 413, description = "The body is larger than 16 KiB.", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
#[tracing::instrument(name = "drain", skip_all, fields(node, actor = %who.name))]
async fn drain_node(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<NodeView>), ApiError> {
    let name = path_param(name, "node")?;
    let b: DrainBody = json_body(&body, None)?;
    let now = s.clock.now();
    let rec: NodeRecord = s
        .operator
        .drain(&name, &who.name, &b.reason, b.incident.as_deref(), now)
        .await
        .map_err(operate_error)?;
    tracing::info!(reason = %b.reason, "node drained");
    let origin = s.engine.lock().origin();
    Ok((StatusCode::CREATED, Json(node_view(&rec, None, origin))))
}

/// Give a drained node back to scheduling.
#[utoipa::path(
    delete,
    path = "/api/v1/nodes/{name}/drain",
    tag = "nodes",
    params(("name" = String, Path, description = "Node name (DNS-1123).", max_length = 253,
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")),
    request_body(content = Option<UndrainBody>, content_type = "application/json"),
    responses(
        (status = 204, description = "Given back."),
        (status = 400, description = "The body or node name is not valid.", body = ApiError),
        (status = 404, description = "The node is not drained.", body = ApiError),
        (status = 413, description = "The body is larger than 16 KiB.", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
#[tracing::instrument(name = "undrain", skip_all, fields(node, actor = %who.name))]
async fn undrain_node(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_param(name, "node")?;
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
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ActionQuery {
    /// Start after this action id: the `X-Warden-Next-After` header of the last page.
    after: Option<String>,
    /// Only actions on this node or incident.
    target: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The audit log: actions in the order they were recorded, a page at a time.
#[utoipa::path(
    get,
    path = "/api/v1/actions",
    tag = "admin",
    params(ActionQuery),
    responses(
        (status = 200, description = "Actions, oldest first.", body = [ActionRecord],
            headers(("X-Warden-Next-After" = String, description = "When the page is full: the `after` value of the next page."))),
        (status = 400, description = "A parameter has a value it cannot have (named).", body = ApiError),
        (status = 503, description = "The incident store is unavailable.", body = ApiError),
    ),
)]
async fn list_actions(
    State(s): State<ApiState>,
    query: Result<Query<ActionQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let after = query_value("after", q.after)?;
    let target = query_value("target", q.target)?;
    let limit = page_limit(q.limit)?;
    let actions = s
        .operator
        .store
        .actions(after.as_deref(), target.as_deref(), limit)
        .await
        .map_err(|e| store_error(&e))?;
    let next = (actions.len() == limit as usize)
        .then(|| actions.last().map(|a| a.id.clone()))
        .flatten();
    Ok(with_next_after(Json(actions).into_response(), next))
}

fn remedy(s: &ApiState) -> Result<&crate::remedy::run::Remediator, ApiError> {
    s.operator.remedy.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "remediation is not running on this controller".to_owned(),
        )
    })
}

/// Remediation: dry run or acting, the actuator, and the circuit breaker.
#[utoipa::path(
    get,
    path = "/api/v1/remediation",
    tag = "remediation",
    responses(
        (status = 200, description = "Where remediation stands.", body = crate::remedy::run::RemedyStatus),
        (status = 503, description = "Remediation is not running on this controller.", body = ApiError),
    ),
)]
async fn remediation_status(
    State(s): State<ApiState>,
) -> Result<Json<crate::remedy::run::RemedyStatus>, ApiError> {
    let r = remedy(&s)?;
    Ok(Json(r.status(s.clock.now()).await))
}

/// Body of `POST /api/v1/remediation/breaker/reset`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    /// Why it is safe to act again: at most 1024 characters, not blank, no control
    /// characters but newline and tab.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = r"^[^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*$"
    )]
    reason: String,
}

/// Reset a tripped circuit breaker: remediation acts again, and its window starts
/// afresh.
#[utoipa::path(
    post,
    path = "/api/v1/remediation/breaker/reset",
    tag = "remediation",
    request_body(content = ResetBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Reset; remediation as it stands now.", body = crate::remedy::run::RemedyStatus),
        (status = 400, description = "The body is not a valid request.", body = ApiError),
        (status = 409, description = "The breaker is not tripped.", body = ApiError),
        (status = 413, description = "The body is larger than 16 KiB.", body = ApiError),
        (status = 503, description = "Remediation is not running, or the store is unavailable.", body = ApiError),
    ),
)]
#[tracing::instrument(name = "breaker_reset", skip_all, fields(actor = %who.name))]
async fn reset_breaker(
    State(s): State<ApiState>,
    Extension(who): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::remedy::run::RemedyStatus>, ApiError> {
    let b: ResetBody = json_body(&body, None)?;
    crate::operate::check_reason("reason", &b.reason, true).map_err(operate_error)?;
    let r = remedy(&s)?;
    let now = s.clock.now();
    match r.reset_breaker(&who.name, &b.reason, now).await {
        Ok(trip) => {
            tracing::warn!(tripped_for = %trip.reason, "circuit breaker reset by hand");
            Ok(Json(r.status(now).await))
        }
        Err(crate::remedy::run::RemedyError::NotTripped) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "the circuit breaker is not tripped".to_owned(),
        )),
        Err(crate::remedy::run::RemedyError::Store(e)) => Err(store_error(&e)),
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        )),
    }
}

/// The caller, as the API sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// The token's name.
    pub name: String,
    /// Its role.
    pub role: crate::auth::Role,
}

/// The caller: the name and role of the token.
#[utoipa::path(
    get,
    path = "/api/v1/whoami",
    tag = "admin",
    responses((status = 200, description = "Who is calling.", body = WhoAmI)),
)]
async fn whoami(Extension(who): Extension<Principal>) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: who.name,
        role: who.role,
    })
}

/// Jobs: live from the engine on the leader; as last stored on a follower.
#[utoipa::path(
    get,
    path = "/api/v1/jobs",
    tag = "jobs",
    responses(
        (status = 200, description = "Jobs.", body = [JobView]),
        (status = 503, description = "The store is unavailable (follower).", body = ApiError),
    ),
)]
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

/// Live progress of every rank of a job.
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{job}/ranks",
    tag = "jobs",
    params(("job" = String, Path, description = "Job name.")),
    responses(
        (status = 200, description = "One entry per rank.", body = [RankView]),
        (status = 400, description = "The path does not decode.", body = ApiError),
        (status = 404, description = "No such job.", body = ApiError),
        (status = 503, description = "This controller follows; the leader holds live progress.", body = ApiError),
    ),
)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LifecycleResponse {
    /// The Warden job.
    pub job: String,
    /// `start` or `end`.
    #[schema(value_type = lifecycle::LifecycleEvent)]
    pub event: String,
    /// The job's phase now.
    pub phase: Phase,
    /// Whether the job already was in that phase (nothing changed).
    pub repeat: bool,
}

/// A scheduler says a job started or ended.
#[utoipa::path(
    post,
    path = "/api/v1/jobs/{job}/lifecycle",
    tag = "jobs",
    params(("job" = String, Path, description = "Warden job name: 1 to 253 bytes without whitespace, control characters or `/`.")),
    request_body(content = lifecycle::Body, content_type = "application/json"),
    responses(
        (status = 202, description = "Recorded (or a repeat, which changes nothing).", body = LifecycleResponse),
        (status = 400, description = "A bad job name or body (an exit code or signal out of range, or on a start, included); the error names the field.", body = ApiError),
        (status = 404, description = "An empty job name (no route).", body = ApiError),
        (status = 413, description = "The body is larger than 8 MiB.", body = ApiError),
        (status = 415, description = "A `Content-Type` other than `application/json`, or none.", body = ApiError),
    ),
)]
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
        exit = report.end.describe().as_deref(),
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

/// Liveness: `ok` while the process serves HTTP.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "probes",
    responses((status = 200, description = "Alive.", body = String, content_type = "text/plain")),
)]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: `ready` when the engine can be locked within 2 seconds.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "probes",
    responses(
        (status = 200, description = "Ready.", body = String, content_type = "text/plain"),
        (status = 503, description = "The store does not answer, or the engine is stuck or overloaded.", body = ApiError),
    ),
)]
async fn readyz(State(s): State<ApiState>) -> Result<&'static str, ApiError> {
    // The store answers: a controller that cannot read or write incidents is not ready.
    match tokio::time::timeout(READY_TIMEOUT, s.operator.store.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(store_error(&e)),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the store did not answer within {} s",
                    READY_TIMEOUT.as_secs()
                ),
            ));
        }
    }
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

/// How long a scrape waits for the store's list of drained nodes.
const DRAINED_READ: std::time::Duration = std::time::Duration::from_millis(500);

/// Prometheus metrics (docs/METRICS.md), text exposition format 0.0.4.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "probes",
    responses(
        (status = 200, description = "Metrics.", body = String, content_type = "text/plain"),
        (status = 500, description = "The metrics could not be rendered.", body = ApiError),
    ),
)]
async fn render_metrics(State(s): State<ApiState>) -> Result<Response, ApiError> {
    let now = s.clock.now();
    s.metrics.update(&s.engine.lock(), now);
    // The node table is the store's. A scrape never waits on a database that is down:
    // on an error or past DRAINED_READ the last set stays.
    match tokio::time::timeout(DRAINED_READ, s.operator.store.nodes()).await {
        Ok(Ok(nodes)) => s
            .metrics
            .set_drained(nodes.iter().map(|n| (n.name.as_str(), n.owner.as_str()))),
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot read drained nodes for the metrics"),
        Err(_) => tracing::warn!(
            "the store did not list drained nodes within {} ms; the metrics show the last list",
            DRAINED_READ.as_millis()
        ),
    }
    s.metrics
        .leader
        .set(i64::from(s.operator.leadership.is_leader()));
    let text = s
        .metrics
        .render()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

/// The view of a drained node.
fn node_view(rec: &NodeRecord, agent_silent_s: Option<f64>, origin: Timestamp) -> NodeView {
    NodeView {
        name: rec.name.clone(),
        state: rec.state.clone(),
        owner: Some(rec.owner.clone()),
        reason: Some(rec.reason.clone()),
        incident: rec.incident.clone(),
        drained_s: Some(rel(rec.since, origin)),
        agent_silent_s,
    }
}

/// Agents heard from (node, seconds silent) and drained nodes, merged by name.
fn node_views(
    agents: &[(String, f64)],
    drained: &[NodeRecord],
    origin: Timestamp,
) -> Vec<NodeView> {
    let round_ms = |s: f64| (s * 1000.0).round() / 1000.0;
    let mut out: Vec<NodeView> = drained
        .iter()
        .map(|d| {
            let silent = agents.iter().find(|(n, _)| *n == d.name).map(|a| a.1);
            node_view(d, silent.map(round_ms), origin)
        })
        .collect();
    for (name, silent) in agents {
        if !drained.iter().any(|d| d.name == *name) {
            out.push(NodeView {
                name: name.clone(),
                state: "ready".into(),
                owner: None,
                reason: None,
                incident: None,
                drained_s: None,
                agent_silent_s: Some(round_ms(*silent)),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
