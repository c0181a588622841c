//! [`HttpClient`]: the hyper client every Warden component sends through, its
//! [`Builder`], the bounded [`HttpResponse`] and the [`origin`] of a URL (what may be
//! logged of it).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, PROXY_AUTHORIZATION, RETRY_AFTER};
use hyper::{Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::proxy::{Proxies, ProxyConnector};

/// The largest answer body [`HttpClient::fetch`] callers usually allow: 1 MiB.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// The connector under [`HttpClient`]: TLS (for https:// targets) over
/// [`ProxyConnector`]. Clients that need their own hyper client type (trace export)
/// build one over it with [`Builder::connector`].
pub type Connector = HttpsConnector<ProxyConnector>;

/// Why a request produced no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The URL (or the request built from it) is unusable.
    #[error("bad URL: {0}")]
    Url(String),
    /// The TLS client settings could not be made.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// Connecting (directly or through a proxy), sending or reading failed.
    #[error("connection: {0}")]
    Connection(String),
    /// The answer's body was longer than the caller allows.
    #[error("response body over {0} bytes")]
    TooLarge(usize),
}

/// What came back from one request, body read whole.
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

/// Settings of an [`HttpClient`]: connect timeout, idle connections, TLS trust and
/// proxies.
#[derive(Debug)]
pub struct Builder {
    connect_timeout: Duration,
    pool_idle_timeout: Duration,
    tls: Option<rustls::ClientConfig>,
    proxies: Option<Proxies>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            connect_timeout: Duration::from_secs(10),
            pool_idle_timeout: Duration::from_secs(90),
            tls: None,
            proxies: None,
        }
    }
}

impl Builder {
    /// Longest wait for a TCP connection (to the target or to its proxy); 10 s unless
    /// set.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an idle connection is kept for reuse; 90 s unless set.
    pub fn pool_idle_timeout(mut self, timeout: Duration) -> Self {
        self.pool_idle_timeout = timeout;
        self
    }

    /// Trust what `config` trusts (a private CA, the controller's TLS settings) instead
    /// of the public roots alone.
    pub fn tls(mut self, config: rustls::ClientConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Use `proxies` instead of those of the process environment
    /// ([`Proxies::from_env`]).
    pub fn proxies(mut self, proxies: Proxies) -> Self {
        self.proxies = Some(proxies);
        self
    }

    /// The connector these settings describe, for a caller that builds its own hyper
    /// client over it. (Requests sent through such a client to an http:// target via
    /// a proxy carry no `Proxy-Authorization`; [`HttpClient`] adds it.)
    pub fn connector(self) -> Result<Connector, Error> {
        Ok(self.parts()?.0)
    }

    fn parts(self) -> Result<(Connector, Arc<Proxies>, Duration), Error> {
        let tls = match self.tls {
            Some(tls) => tls,
            None => crate::tls::client_config(None).map_err(|e| Error::Tls(e.to_string()))?,
        };
        let proxies = Arc::new(self.proxies.unwrap_or_else(Proxies::from_env));
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(self.connect_timeout));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(ProxyConnector::new(http, proxies.clone()));
        Ok((connector, proxies, self.pool_idle_timeout))
    }

    /// The client.
    pub fn build(self) -> Result<HttpClient, Error> {
        let (connector, proxies, idle) = self.parts()?;
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(idle)
            .build(connector);
        Ok(HttpClient { client, proxies })
    }
}

/// The HTTP(S) client: cheap to clone (clones share their connections).
#[derive(Clone)]
pub struct HttpClient {
    client: Client<Connector, Full<Bytes>>,
    proxies: Arc<Proxies>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("proxies", &self.proxies)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// Settings to start from: public roots, proxies from the environment.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Sends `req` and returns the answer with its body still to read. Timeouts beyond
    /// the connect timeout are the caller's: it drops the future.
    pub async fn send(&self, mut req: Request<Full<Bytes>>) -> Result<Response<Incoming>, Error> {
        if req.uri().scheme_str() == Some("http")
            && let Some(auth) = self.proxies.route(req.uri()).and_then(|r| r.auth)
        {
            // Sent in absolute form to the proxy, which wants to know who asks.
            req.headers_mut().insert(PROXY_AUTHORIZATION, auth);
        }
        self.client
            .request(req)
            .await
            .map_err(|e| Error::Connection(error_chain(&e)))
    }

    /// Sends `req` and reads the whole answer, refusing a body over `max_body` bytes.
    pub async fn fetch(
        &self,
        req: Request<Full<Bytes>>,
        max_body: usize,
    ) -> Result<HttpResponse, Error> {
        let resp = self.send(req).await?;
        let status = resp.status().as_u16();
        let retry_after_secs = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, max_body)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Error::TooLarge(max_body)
                } else {
                    Error::Connection(error_chain(&*e))
                }
            })?
            .to_bytes();
        Ok(HttpResponse {
            status,
            retry_after_secs,
            headers: parts.headers,
            body,
        })
    }

    /// The origin of the proxy that carries requests to `dst`, `None` when direct.
    pub fn proxy_for(&self, dst: &Uri) -> Option<String> {
        self.proxies.proxy_for(dst)
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

/// An error and its sources on one line (hyper's top-level message alone says little).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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
    }

    #[test]
    fn debug_names_proxies_without_their_credentials() {
        let client = HttpClient::builder()
            .proxies(Proxies::from_lookup(|k| {
                (k == "HTTPS_PROXY").then(|| "http://bob:hunter2@proxy.corp:3128".to_owned())
            }))
            .build()
            .expect("client");
        let debug = format!("{client:?}");
        assert!(debug.contains("proxy.corp"), "{debug}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("bob"),
            "{debug}"
        );
    }
}
