//! The one door to the network: POST a JSON body to the chat-completions URL and read
//! the answer, bounded in size. [`ChatTransport`] is the narrow seam; [`HyperTransport`]
//! (hyper 1, rustls with the ring provider and the Mozilla roots) is the real one. The
//! controller's incident alerts post through the same client
//! ([`HyperTransport::for_url`]), and the `warden` CLI's operator commands call the
//! controller's API with it ([`HyperTransport::send`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{HeaderMap, Method, Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::config::ApiKey;

/// Largest answer body read; anything longer is an error.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// What came back from one POST.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// `Retry-After` in seconds, when the server sent one as a number.
    pub retry_after_secs: Option<u64>,
    /// Every header of the answer.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

/// Why a POST produced no response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// Connecting, sending or reading failed.
    #[error("connection: {0}")]
    Connection(String),
    /// The body was longer than [`MAX_RESPONSE_BYTES`].
    #[error("response body over {MAX_RESPONSE_BYTES} bytes")]
    TooLarge,
}

/// A boxed future, so the trait stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Sends one chat-completions request. Timeouts are the caller's: it drops the future.
pub trait ChatTransport: Send + Sync + std::fmt::Debug {
    /// POSTs `body` (JSON) and returns the status and the whole body.
    fn post(&self, body: Bytes) -> BoxFuture<'_, Result<HttpResponse, TransportError>>;
}

/// [`ChatTransport`] over hyper, for `http://` and `https://` URLs.
pub struct HyperTransport {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    uri: Uri,
    auth: Option<ApiKey>,
    user_agent: &'static str,
}

impl std::fmt::Debug for HyperTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Paths and queries may hold tokens (webhook URLs do): the origin only.
        f.debug_struct("HyperTransport")
            .field("origin", &origin(&self.uri))
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// `scheme://host[:port]` of `uri`, without user info, path or query: what may be
/// logged of a URL that can carry credentials.
pub fn origin(uri: &Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("http");
    match (uri.host(), uri.port_u16()) {
        (Some(host), Some(port)) => format!("{scheme}://{host}:{port}"),
        (Some(host), None) => format!("{scheme}://{host}"),
        (None, _) => format!("{scheme}://?"),
    }
}

/// The chat-completions URL for a base URL (`.../v1` → `.../v1/chat/completions`).
pub fn completions_url(base_url: &str) -> String {
    let base = base_url.trim_end_matches('/');
    if base.ends_with("/chat/completions") {
        base.to_owned()
    } else {
        format!("{base}/chat/completions")
    }
}

impl HyperTransport {
    /// A client for `base_url` (see [`completions_url`]), sending `key` as a bearer token.
    pub fn new(
        base_url: &str,
        key: Option<ApiKey>,
        connect_timeout: Duration,
    ) -> Result<Self, TransportError> {
        Self::for_url(&completions_url(base_url), key, connect_timeout)
    }

    /// A client that posts to `url` exactly as given (`http://` or `https://`).
    pub fn for_url(
        url: &str,
        key: Option<ApiKey>,
        connect_timeout: Duration,
    ) -> Result<Self, TransportError> {
        let uri = url
            .parse::<Uri>()
            .map_err(|e| TransportError::Connection(format!("bad URL: {e}")))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| TransportError::Connection(format!("TLS setup: {e}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(HyperTransport {
            client,
            uri,
            auth: key,
            user_agent: "warden-diagnosis",
        })
    }

    /// Send `user_agent` as the `User-Agent` header (default `warden-diagnosis`).
    pub fn with_user_agent(mut self, user_agent: &'static str) -> Self {
        self.user_agent = user_agent;
        self
    }
}

impl HyperTransport {
    /// Sends `method` to `path_and_query` (which starts with `/`) under the URL the
    /// transport was made for (`http://h:9460` or `https://h/prefix`), with `body` as
    /// JSON when given, and returns the status, headers and whole body.
    pub fn send<'a>(
        &'a self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
        let uri = join(&self.uri, path_and_query);
        Box::pin(async move { self.request(method, uri?, body).await })
    }

    async fn request(
        &self,
        method: Method,
        uri: Uri,
        body: Option<Bytes>,
    ) -> Result<HttpResponse, TransportError> {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, self.user_agent);
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(key) = &self.auth {
            let mut value =
                hyper::header::HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(
                    |_| TransportError::Connection("API key is not a valid header value".into()),
                )?;
            value.set_sensitive(true);
            req = req.header(hyper::header::AUTHORIZATION, value);
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| TransportError::Connection(e.to_string()))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| TransportError::Connection(error_chain(&e)))?;
        let status = resp.status();
        let retry_after_secs = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let headers = resp.headers().clone();
        let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    TransportError::TooLarge
                } else {
                    TransportError::Connection(e.to_string())
                }
            })?
            .to_bytes();
        Ok(HttpResponse {
            status: status.as_u16(),
            retry_after_secs,
            headers,
            body,
        })
    }
}

/// `base` with `path_and_query` appended to its path (any query of `base` is dropped).
fn join(base: &Uri, path_and_query: &str) -> Result<Uri, TransportError> {
    let prefix = base.path().trim_end_matches('/');
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        format!("{prefix}{path_and_query}")
            .parse()
            .map_err(|e| TransportError::Connection(format!("bad request path: {e}")))?,
    );
    Uri::from_parts(parts).map_err(|e| TransportError::Connection(format!("bad URL: {e}")))
}

impl ChatTransport for HyperTransport {
    fn post(&self, body: Bytes) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(self.request(Method::POST, self.uri.clone(), Some(body)))
    }
}

/// An error and its sources on one line (hyper's top-level message alone says little).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_keeps_credentials_paths_and_queries_out() {
        let uri: Uri = "https://user:secret@hooks.example.com/services/T0/B1/XYZ?token=abc"
            .parse()
            .expect("valid URL");
        assert_eq!(origin(&uri), "https://hooks.example.com");
        let uri: Uri = "http://127.0.0.1:9093/api/v2/alerts"
            .parse()
            .expect("valid");
        assert_eq!(origin(&uri), "http://127.0.0.1:9093");
        let t = HyperTransport::for_url(
            "https://hooks.example.com/services/T0/B1/XYZ",
            None,
            Duration::from_secs(1),
        )
        .expect("client");
        let debug = format!("{t:?}");
        assert!(!debug.contains("XYZ"), "{debug}");
    }

    #[test]
    fn send_paths_go_under_the_base_url() {
        let base: Uri = "https://h.example/warden/".parse().expect("valid");
        let joined = join(&base, "/api/v1/incidents?state=open").expect("joins");
        assert_eq!(
            joined.to_string(),
            "https://h.example/warden/api/v1/incidents?state=open"
        );
        let base: Uri = "http://127.0.0.1:9460".parse().expect("valid");
        let joined = join(&base, "/api/v1/nodes").expect("joins");
        assert_eq!(joined.to_string(), "http://127.0.0.1:9460/api/v1/nodes");
    }

    #[test]
    fn completions_url_appends_the_path_once() {
        assert_eq!(
            completions_url("http://127.0.0.1:8000/v1/"),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        assert_eq!(
            completions_url("https://h/v1/chat/completions"),
            "https://h/v1/chat/completions"
        );
    }
}
