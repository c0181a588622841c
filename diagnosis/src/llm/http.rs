//! The one door to the network: POST a JSON body to the chat-completions URL and read
//! the answer, bounded in size. [`ChatTransport`] is the narrow seam; [`HyperTransport`]
//! (Warden's one HTTP client, [`warden_http::HttpClient`]: rustls with the Mozilla
//! roots, proxies from `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`) is the real one. The
//! controller's incident alerts post through the same transport
//! ([`HyperTransport::for_url`]), and the `warden` CLI's operator commands call the
//! controller's API with it ([`HyperTransport::send`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Uri};
use warden_http::{HttpClient, Proxies};

use super::config::ApiKey;

pub use warden_http::{HttpResponse, MAX_RESPONSE_BYTES, origin};

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
    client: HttpClient,
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

    /// A client that posts to `url` exactly as given (`http://` or `https://`), through
    /// the proxies the environment names.
    pub fn for_url(
        url: &str,
        key: Option<ApiKey>,
        connect_timeout: Duration,
    ) -> Result<Self, TransportError> {
        Self::with_proxies(url, key, connect_timeout, Proxies::from_env())
    }

    /// [`HyperTransport::for_url`] through `proxies` instead of the environment's.
    pub fn with_proxies(
        url: &str,
        key: Option<ApiKey>,
        connect_timeout: Duration,
        proxies: Proxies,
    ) -> Result<Self, TransportError> {
        let uri = url
            .parse::<Uri>()
            .map_err(|e| TransportError::Connection(format!("bad URL: {e}")))?;
        let client = HttpClient::builder()
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .proxies(proxies)
            .build()
            .map_err(TransportError::from)?;
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
        self.client
            .fetch(req, MAX_RESPONSE_BYTES)
            .await
            .map_err(TransportError::from)
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

impl From<warden_http::Error> for TransportError {
    fn from(e: warden_http::Error) -> Self {
        match e {
            warden_http::Error::TooLarge(_) => TransportError::TooLarge,
            warden_http::Error::Connection(detail) => TransportError::Connection(detail),
            other => TransportError::Connection(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_prints_its_origin_only() {
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
