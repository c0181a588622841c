//! A follower's relay: requests that change something (agents' batches, scheduler
//! reports, people's actions) are passed on to the leader, whose URL the leader lease
//! carries, and its answer is passed back; reads are served from the shared store
//! where they arrive. Without a known leader the answer is 503, which agents retry.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Largest body relayed either way, bytes (the ingest limit's default).
pub const MAX_RELAY_BYTES: usize = 16 * 1024 * 1024;

/// How long the leader gets to answer.
pub const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Header naming the controller that answered a relayed request.
pub const RELAYED_BY: &str = "x-warden-relayed-by";

type Relay = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

static CLIENT: OnceLock<Relay> = OnceLock::new();

/// Relay over https trusting `tls` (public roots and a private CA); call once at start,
/// before the first relay. Without it, relays trust the public roots only.
pub fn configure(tls: rustls::ClientConfig) {
    let _ = CLIENT.set(build(tls));
}

fn build(tls: rustls::ClientConfig) -> Relay {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(3)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(https)
}

fn client() -> Option<&'static Relay> {
    if let Some(c) = CLIENT.get() {
        return Some(c);
    }
    let tls = crate::tls::client_config(None).ok()?;
    Some(CLIENT.get_or_init(|| build(tls)))
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
    let answer = tokio::time::timeout(RELAY_TIMEOUT, client.request(out)).await;
    let resp = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return unavailable(format!("the leader did not answer: {e}")),
        Err(_) => {
            return unavailable(format!(
                "the leader did not answer within {} s",
                RELAY_TIMEOUT.as_secs()
            ));
        }
    };
    let (parts, body) = resp.into_parts();
    let bytes = match Limited::new(body, MAX_RELAY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return unavailable(format!("the leader's answer broke off: {e}")),
    };
    let mut resp = Response::builder().status(parts.status);
    for name in [
        header::CONTENT_TYPE,
        header::WWW_AUTHENTICATE,
        header::RETRY_AFTER,
    ] {
        if let Some(v) = parts.headers.get(&name) {
            resp = resp.header(name, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(me) {
        resp = resp.header(RELAYED_BY, v);
    }
    resp.body(Body::from(bytes))
        .unwrap_or_else(|e| unavailable(format!("cannot pass the leader's answer on: {e}")))
}
