//! A follower's relay: requests that change something (agents' batches, scheduler
//! reports, people's actions) are passed on to the leader, whose URL the leader lease
//! carries, and its answer is passed back; reads are served from the shared store
//! where they arrive. Without a known leader the answer is 503, which agents retry.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full, Limited};
use warden_http::HttpClient;

/// Largest body relayed either way, bytes (the ingest limit's default).
pub const MAX_RELAY_BYTES: usize = 16 * 1024 * 1024;

/// How long the leader gets to answer.
pub const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Header naming the controller that answered a relayed request.
pub const RELAYED_BY: &str = "x-warden-relayed-by";

static CLIENT: OnceLock<HttpClient> = OnceLock::new();

/// Relay over https trusting `tls` (public roots and a private CA); call once at start,
/// before the first relay. Without it, relays trust the public roots only.
pub fn configure(tls: rustls::ClientConfig) {
    if let Ok(client) = build(Some(tls)) {
        let _ = CLIENT.set(client);
    }
}

/// The relay's client (proxies from the environment, like every client of Warden).
fn build(tls: Option<rustls::ClientConfig>) -> Result<HttpClient, warden_http::Error> {
    let mut builder = HttpClient::builder().connect_timeout(Duration::from_secs(3));
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    builder.build()
}

fn client() -> Option<&'static HttpClient> {
    if let Some(c) = CLIENT.get() {
        return Some(c);
    }
    let client = build(None).ok()?;
    Some(CLIENT.get_or_init(|| client))
}

fn unavailable(text: String) -> Response {
    let mut resp = (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(serde_json::json!({ "error": text })),
    )
        .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// Relay `req` to the leader at `leader` (a base URL such as `http://10.0.0.5:9460`),
/// or answer 503 when there is none. `me` names this controller in the answer.
pub async fn relay(req: Request, leader: Option<String>, me: &str) -> Response {
    let Some(leader) = leader else {
        return unavailable(
            "this controller follows and no leader is known yet; retry shortly".into(),
        );
    };
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let uri: Uri = match format!("{}{path}", leader.trim_end_matches('/')).parse() {
        Ok(u) => u,
        Err(e) => return unavailable(format!("the leader's URL {leader:?} is unusable: {e}")),
    };
    let bytes = match Limited::new(body, MAX_RELAY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(serde_json::json!({ "error": format!("cannot relay the body: {e}") })),
            )
                .into_response();
        }
    };
    let mut out = hyper::Request::builder().method(parts.method).uri(uri);
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            out = out.header(name, v);
        }
    }
    let out = match out.body(Full::new(bytes)) {
        Ok(r) => r,
        Err(e) => return unavailable(format!("cannot build the relayed request: {e}")),
    };
    let Some(client) = client() else {
        return unavailable("cannot set up the relay's TLS client".into());
    };
    let answer = tokio::time::timeout(RELAY_TIMEOUT, client.fetch(out, MAX_RELAY_BYTES)).await;
    let answer = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(e @ warden_http::Error::TooLarge(_))) => {
            return unavailable(format!("the leader's answer broke off: {e}"));
        }
        Ok(Err(e)) => return unavailable(format!("the leader did not answer: {e}")),
        Err(_) => {
            return unavailable(format!(
                "the leader did not answer within {} s",
                RELAY_TIMEOUT.as_secs()
            ));
        }
    };
    let Ok(status) = StatusCode::from_u16(answer.status) else {
        return unavailable(format!("the leader answered status {}", answer.status));
    };
    let mut resp = Response::builder().status(status);
    for name in [
        header::CONTENT_TYPE,
        header::WWW_AUTHENTICATE,
        header::RETRY_AFTER,
    ] {
        if let Some(v) = answer.headers.get(&name) {
            resp = resp.header(name, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(me) {
        resp = resp.header(RELAYED_BY, v);
    }
    resp.body(Body::from(answer.body))
        .unwrap_or_else(|e| unavailable(format!("cannot pass the leader's answer on: {e}")))
}
