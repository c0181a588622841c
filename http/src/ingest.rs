//! The client of the controller's ingest endpoint: one binary batch per `POST
//! /api/v1/ingest` (`application/vnd.warden.batch`), with the bearer token, a deadline,
//! and the answer sorted into what the sender does next ([`SendError`]). The agent's
//! shipper sends through it, and so does `warden loadgen`'s emulated agents.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};

use crate::HttpClient;

/// Why a delivery failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Could not reach the controller or it failed; try again later.
    #[error("controller unreachable: {0}")]
    Unreachable(String),
    /// The controller answered with an error status that retrying will not fix for
    /// this batch (400, 413): drop it.
    #[error("controller refused the batch: {status}: {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// The controller answered with an error worth retrying (401, 429, 5xx).
    #[error("controller answered {status}: {body}")]
    Retry {
        /// HTTP status.
        status: u16,
        /// The start of the response body.
        body: String,
    },
}

/// HTTP POST to `<url>/api/v1/ingest` with the binary content type, through Warden's
/// one HTTP client (proxies from the environment).
#[derive(Debug, Clone)]
pub struct IngestClient {
    client: HttpClient,
    uri: hyper::Uri,
    auth: Option<hyper::header::HeaderValue>,
    timeout: Duration,
}

/// Most bytes of an answer read (the controller's answers are short).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

impl IngestClient {
    /// A transport to the controller at `base_url` (`http://host:port` or
    /// `https://...`, trusting the public roots and the CA certificates in `ca_file`),
    /// sending `token` as a bearer token when given.
    pub fn new(
        base_url: &str,
        token: Option<&str>,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<IngestClient, String> {
        let uri = format!("{}/api/v1/ingest", base_url.trim_end_matches('/'))
            .parse::<hyper::Uri>()
            .map_err(|e| format!("{base_url:?} is not a usable URL: {e}"))?;
        let tls = crate::tls::client_config(ca_file).map_err(|e| match e {
            crate::tls::TlsError::CaFile { path, detail } => {
                format!("CA file {path}: {detail}")
            }
            other => other.to_string(),
        })?;
        let client = HttpClient::builder()
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .tls(tls)
            .build()
            .map_err(|e| e.to_string())?;
        let auth = token
            .map(|t| {
                let mut v = hyper::header::HeaderValue::try_from(format!("Bearer {}", t.trim()))
                    .map_err(|_| "the token holds characters a header cannot".to_owned())?;
                // Kept out of any Debug output of the request.
                v.set_sensitive(true);
                Ok::<_, String>(v)
            })
            .transpose()?;
        Ok(IngestClient {
            client,
            uri,
            auth,
            timeout,
        })
    }
}

impl IngestClient {
    /// Deliver one framed batch.
    pub async fn send(&self, body: Vec<u8>) -> Result<(), SendError> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(hyper::header::CONTENT_TYPE, "application/vnd.warden.batch");
        if let Some(a) = &self.auth {
            req = req.header(hyper::header::AUTHORIZATION, a);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| SendError::Unreachable(e.to_string()))?;
        let call = async {
            let resp = self
                .client
                .send(req)
                .await
                .map_err(|e| SendError::Unreachable(e.to_string()))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES);
            if status.is_success() {
                // Drain the body so the connection can be reused.
                let _ = body.collect().await;
                return Ok(());
            }
            let body = match body.collect().await {
                Ok(b) => {
                    let bytes = b.to_bytes();
                    String::from_utf8_lossy(&bytes[..bytes.len().min(256)]).into_owned()
                }
                Err(_) => String::new(),
            };
            let code = status.as_u16();
            if status == StatusCode::BAD_REQUEST
                || status == StatusCode::PAYLOAD_TOO_LARGE
                || status == StatusCode::UNSUPPORTED_MEDIA_TYPE
            {
                Err(SendError::Refused { status: code, body })
            } else {
                Err(SendError::Retry { status: code, body })
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(SendError::Unreachable(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}
