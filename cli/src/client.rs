//! A small client of the controller's HTTP API for the operator commands, over the
//! diagnosis crate's [`HyperTransport`] (Warden's one HTTP client: http and https,
//! proxies from `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`). Errors carry what the exit
//! code is made of: the HTTP status, or that the server could not be reached.

use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use serde_json::Value;
use warden_diagnosis::llm::http::{HttpResponse, HyperTransport, TransportError, origin};

use crate::settings::Settings;

/// Time allowed to open a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time allowed for one whole request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The paging header of `GET /api/v1/incidents`.
pub const NEXT_AFTER: &str = "x-warden-next-after";

// The exit codes of every `warden` command (docs/CLI.md, "Exit codes"); 1 is any other
// failure.

/// Exit code of a usage or configuration error: a bad option, a bad configuration,
/// scenario or rules file. Nothing was done.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of a refused token (401 or 403).
pub const EXIT_AUTH: u8 = 3;
/// Exit code of something not found: a 404, or an input file that cannot be opened.
pub const EXIT_NOT_FOUND: u8 = 4;
/// Exit code of a 409 (already drained, already resolved).
pub const EXIT_CONFLICT: u8 = 5;
/// Exit code of input that is not usable: a binary file given as a log, a corpus
/// line that is not a case.
pub const EXIT_DATA: u8 = 6;

/// Why an operator command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpsError {
    /// A bad option, config file or token file.
    #[error("{0}")]
    Usage(String),
    /// The server answered with an error status.
    #[error("{status}: {message}")]
    Api {
        /// `404 Not Found`, ...
        status: String,
        /// The code alone.
        code: u16,
        /// The server's `error` message (or what its body says).
        message: String,
    },
    /// No answer: connection refused, DNS, TLS, timeout.
    #[error("cannot reach the controller at {server}: {detail} (is it running? see --server)")]
    Unreachable {
        /// The server, as origin and path (never user info or a query).
        server: String,
        /// What failed.
        detail: String,
    },
    /// An answer that is not what the API sends.
    #[error("unexpected answer from {server}: {detail}")]
    Answer {
        /// The server.
        server: String,
        /// What is wrong.
        detail: String,
    },
}

impl OpsError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            OpsError::Usage(_) => EXIT_USAGE,
            OpsError::Api {
                code: 401 | 403, ..
            } => EXIT_AUTH,
            OpsError::Api { code: 404, .. } => EXIT_NOT_FOUND,
            OpsError::Api { code: 409, .. } => EXIT_CONFLICT,
            OpsError::Api { .. } | OpsError::Unreachable { .. } | OpsError::Answer { .. } => 1,
        }
    }
}

/// A successful answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The body as JSON (`Null` for an empty body).
    pub json: Value,
    /// `X-Warden-Next-After`, when the server sent it.
    pub next_after: Option<String>,
}

/// The controller's API.
#[derive(Debug)]
pub struct ApiClient {
    transport: HyperTransport,
    /// What may be shown of the server URL.
    shown: String,
}

impl ApiClient {
    /// A client for `settings.server` sending `settings.token`.
    pub fn new(settings: &Settings) -> Result<Self, OpsError> {
        let shown = shown_url(&settings.server);
        let transport =
            HyperTransport::for_url(&settings.server, settings.token.clone(), CONNECT_TIMEOUT)
                .map_err(|e| OpsError::Usage(format!("server {shown}: {e}")))?
                .with_user_agent(concat!("warden-cli/", env!("CARGO_PKG_VERSION")));
        Ok(ApiClient { transport, shown })
    }

    /// The server as it may be shown.
    pub fn server(&self) -> &str {
        &self.shown
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Answer, OpsError> {
        self.call(Method::GET, path, None).await
    }

    /// `GET path`, its body as text (`/metrics`).
    pub async fn get_text(&self, path: &str) -> Result<String, OpsError> {
        let resp = self.request(Method::GET, path, None).await?;
        if !(200..300).contains(&resp.status) {
            return Err(api_error(&resp));
        }
        Ok(String::from_utf8_lossy(&resp.body).into_owned())
    }

    /// `POST path` with `body` as JSON (no body when `None`).
    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Answer, OpsError> {
        self.call(Method::POST, path, body).await
    }

    /// `DELETE path` with `body` as JSON (no body when `None`).
    pub async fn delete(&self, path: &str, body: Option<&Value>) -> Result<Answer, OpsError> {
        self.call(Method::DELETE, path, body).await
    }

    #[tracing::instrument(name = "api", skip(self, body), fields(server = %self.shown))]
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, OpsError> {
        let resp = self.request(method, path, body).await?;
        tracing::debug!(status = resp.status, bytes = resp.body.len(), "answer");
        self.answer(resp)
    }

    /// One request and its answer, whatever its status.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<HttpResponse, OpsError> {
        let bytes = body.map(|b| Bytes::from(b.to_string()));
        let sent = self.transport.send(method, path, bytes);
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, sent).await {
            Ok(Ok(r)) => r,
            Ok(Err(TransportError::Connection(detail))) => {
                return Err(OpsError::Unreachable {
                    server: self.shown.clone(),
                    detail,
                });
            }
            Ok(Err(e @ TransportError::TooLarge)) => {
                return Err(OpsError::Answer {
                    server: self.shown.clone(),
                    detail: e.to_string(),
                });
            }
            Err(_) => {
                return Err(OpsError::Unreachable {
                    server: self.shown.clone(),
                    detail: format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()),
                });
            }
        };
        Ok(resp)
    }

    fn answer(&self, resp: HttpResponse) -> Result<Answer, OpsError> {
        if !(200..300).contains(&resp.status) {
            return Err(api_error(&resp));
        }
        let json = if resp.body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&resp.body).map_err(|e| OpsError::Answer {
                server: self.shown.clone(),
                detail: format!("not JSON: {e}"),
            })?
        };
        let next_after = resp
            .headers
            .get(NEXT_AFTER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        Ok(Answer { json, next_after })
    }
}

/// Largest part of a non-JSON error body shown.
const MAX_SHOWN_BODY: usize = 200;

/// The error of an answer with an error status: the `error` of its JSON body, else
/// the start of its body, else the status's reason.
fn api_error(resp: &HttpResponse) -> OpsError {
    let status = hyper::StatusCode::from_u16(resp.status).ok();
    let reason = status.and_then(|s| s.canonical_reason()).unwrap_or("");
    let from_json = serde_json::from_slice::<Value>(&resp.body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned));
    let message = from_json.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&resp.body);
        let text = text.trim();
        if text.is_empty() {
            reason.to_lowercase()
        } else {
            text.chars().take(MAX_SHOWN_BODY).collect()
        }
    });
    OpsError::Api {
        status: format!("{} {reason}", resp.status).trim_end().to_owned(),
        code: resp.status,
        message,
    }
}

/// Origin and path of `server`: no user info, no query.
fn shown_url(server: &str) -> String {
    match server.parse::<hyper::Uri>() {
        Ok(uri) => {
            let path = uri.path().trim_end_matches('/');
            format!("{}{path}", origin(&uri))
        }
        Err(_) => "(an invalid URL)".to_owned(),
    }
}

/// `s` percent-encoded for a path segment or a query value: everything but
/// `A-Z a-z 0-9 - . _ ~`.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, body: &str) -> HttpResponse {
        HttpResponse {
            status,
            retry_after_secs: None,
            headers: hyper::HeaderMap::new(),
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn error_statuses_map_to_exit_codes() {
        for (status, code) in [
            (401, EXIT_AUTH),
            (403, EXIT_AUTH),
            (404, EXIT_NOT_FOUND),
            (409, EXIT_CONFLICT),
            (400, 1),
            (503, 1),
        ] {
            assert_eq!(api_error(&resp(status, "")).exit_code(), code, "{status}");
        }
    }

    #[test]
    fn error_messages_come_from_the_body() {
        let e = api_error(&resp(404, r#"{"error": "no incident \"x\""}"#));
        assert_eq!(e.to_string(), r#"404 Not Found: no incident "x""#);
        let e = api_error(&resp(502, "<html>bad gateway</html>"));
        assert_eq!(e.to_string(), "502 Bad Gateway: <html>bad gateway</html>");
        let e = api_error(&resp(503, ""));
        assert_eq!(
            e.to_string(),
            "503 Service Unavailable: service unavailable"
        );
    }

    #[test]
    fn shown_urls_drop_credentials_and_queries() {
        assert_eq!(
            shown_url("https://u:pw@h.example/warden/?x=1"),
            "https://h.example/warden"
        );
        assert_eq!(shown_url("http://127.0.0.1:9460"), "http://127.0.0.1:9460");
    }

    #[test]
    fn encoding_keeps_unreserved_characters_only() {
        assert_eq!(encode("node-01.a_b~"), "node-01.a_b~");
        assert_eq!(encode("a/b c?&"), "a%2Fb%20c%3F%26");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
