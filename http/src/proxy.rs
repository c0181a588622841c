//! Proxies, the way users behind a corporate proxy expect: `HTTPS_PROXY` for https://
//! targets, `HTTP_PROXY` for http:// targets, `NO_PROXY` for the hosts that bypass
//! both (the lower-case names too; the upper-case one wins when both are set).
//!
//! An http:// target is asked of the proxy in absolute form (`GET http://host/path`),
//! with `Proxy-Authorization` from the proxy URL's user info; an https:// target goes
//! through a `CONNECT host:port` tunnel, and TLS runs to the real host inside it. Only
//! `http://` proxies are supported; a proxy of another scheme fails each request it
//! would carry, naming itself, rather than being bypassed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper::header::HeaderValue;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use crate::client::origin;

/// The variables read for http:// targets, first set wins.
pub const HTTP_PROXY_VARS: [&str; 2] = ["HTTP_PROXY", "http_proxy"];
/// The variables read for https:// targets, first set wins.
pub const HTTPS_PROXY_VARS: [&str; 2] = ["HTTPS_PROXY", "https_proxy"];
/// The variables listing the hosts that bypass the proxies, first set wins.
pub const NO_PROXY_VARS: [&str; 2] = ["NO_PROXY", "no_proxy"];

/// Which proxy, if any, carries a request to a given URL.
pub struct Proxies {
    matcher: Option<Matcher>,
}

impl std::fmt::Debug for Proxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The matcher prints proxies without their user info.
        match &self.matcher {
            Some(m) => std::fmt::Debug::fmt(m, f),
            None => f.write_str("Proxies(none)"),
        }
    }
}

/// The proxy chosen for one request.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// `scheme://host:port/` of the proxy, without user info.
    pub(crate) uri: Uri,
    /// `Basic ...` from the proxy URL's user info (marked sensitive).
    pub(crate) auth: Option<HeaderValue>,
}

impl Proxies {
    /// The proxies the process environment names ([`HTTPS_PROXY_VARS`],
    /// [`HTTP_PROXY_VARS`], [`NO_PROXY_VARS`]); what every production client uses.
    pub fn from_env() -> Proxies {
        Proxies::from_lookup(|name| std::env::var(name).ok())
    }

    /// The proxies `lookup` names, read as [`Proxies::from_env`] reads the environment
    /// (tests pass a closure instead of changing the process environment). An empty
    /// value counts as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Proxies {
        let first = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|n| lookup(n).filter(|v| !v.trim().is_empty()))
                .unwrap_or_default()
        };
        let (http, https, no) = (
            first(HTTP_PROXY_VARS),
            first(HTTPS_PROXY_VARS),
            first(NO_PROXY_VARS),
        );
        // `*` bypasses the proxies for every host (the matcher applies it to names only).
        if (http.is_empty() && https.is_empty()) || no.split(',').any(|e| e.trim() == "*") {
            return Proxies::none();
        }
        let matcher = Matcher::builder()
            .http(http.trim())
            .https(https.trim())
            .no(no)
            .build();
        Proxies {
            matcher: Some(matcher),
        }
    }

    /// Every request goes straight to its host.
    pub fn none() -> Proxies {
        Proxies { matcher: None }
    }

    /// The proxy that carries a request to `dst`: `None` for a direct connection.
    pub(crate) fn route(&self, dst: &Uri) -> Option<Route> {
        let hit = self.matcher.as_ref()?.intercept(dst)?;
        Some(Route {
            uri: hit.uri().clone(),
            auth: hit.basic_auth().cloned(),
        })
    }

    /// The origin (`http://host:port`, never user info) of the proxy for `dst`, or
    /// `None` when it is reached directly.
    pub fn proxy_for(&self, dst: &Uri) -> Option<String> {
        self.route(dst).map(|r| origin(&r.uri))
    }
}

/// Why a connection through a proxy failed before the target was reached.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The proxy URL has a scheme other than `http`.
    #[error("proxy {proxy} is not an http:// proxy; only http:// proxies are supported")]
    UnsupportedScheme {
        /// The proxy's origin.
        proxy: String,
    },
    /// Connecting to the proxy, or its CONNECT answer, failed.
    #[error("through proxy {proxy}: {source}")]
    Tunnel {
        /// The proxy's origin.
        proxy: String,
        /// What went wrong.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The TCP connector under TLS: straight to the target, to an http:// target's proxy,
/// or through a CONNECT tunnel of an https:// target's proxy.
#[derive(Debug, Clone)]
pub struct ProxyConnector {
    http: HttpConnector,
    proxies: Arc<Proxies>,
}

impl ProxyConnector {
    pub(crate) fn new(http: HttpConnector, proxies: Arc<Proxies>) -> ProxyConnector {
        ProxyConnector { http, proxies }
    }
}

impl Service<Uri> for ProxyConnector {
    type Response = ProxyStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ProxyStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let route = self.proxies.route(&dst);
        let mut http = self.http.clone();
        Box::pin(async move {
            let Some(route) = route else {
                let io = http.call(dst).await?;
                return Ok(ProxyStream {
                    io,
                    absolute: false,
                });
            };
            let proxy = origin(&route.uri);
            if route.uri.scheme_str() != Some("http") {
                return Err(ProxyError::UnsupportedScheme { proxy }.into());
            }
            if dst.scheme_str() == Some("https") {
                let mut tunnel = Tunnel::new(route.uri, http);
                if let Some(auth) = route.auth {
                    tunnel = tunnel.with_auth(auth);
                }
                let io = tunnel.call(dst).await.map_err(|e| ProxyError::Tunnel {
                    proxy,
                    source: e.into(),
                })?;
                Ok(ProxyStream {
                    io,
                    absolute: false,
                })
            } else {
                let io = http.call(route.uri).await.map_err(|e| ProxyError::Tunnel {
                    proxy,
                    source: e.into(),
                })?;
                Ok(ProxyStream { io, absolute: true })
            }
        })
    }
}

/// A connection made by [`ProxyConnector`]. It tells the client to send requests in
/// absolute form when it leads to an http:// target's proxy.
#[derive(Debug)]
pub struct ProxyStream {
    io: TokioIo<TcpStream>,
    absolute: bool,
}

impl Connection for ProxyStream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.absolute)
    }
}

impl Read for ProxyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for ProxyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn uri(s: &str) -> Uri {
        s.parse().expect("valid URL")
    }

    #[test]
    fn each_scheme_has_its_variable_and_no_proxy_bypasses_both() {
        let p = Proxies::from_lookup(env(&[
            ("HTTP_PROXY", "http://plain.proxy:3128"),
            ("HTTPS_PROXY", "http://tls.proxy:3129"),
            ("NO_PROXY", "internal.example, 10.0.0.0/8,127.0.0.1"),
        ]));
        assert_eq!(
            p.proxy_for(&uri("http://api.example.com/v1")).as_deref(),
            Some("http://plain.proxy:3128")
        );
        assert_eq!(
            p.proxy_for(&uri("https://api.example.com/v1")).as_deref(),
            Some("http://tls.proxy:3129")
        );
        for direct in [
            "https://internal.example/x",
            "https://svc.internal.example/x",
            "http://10.1.2.3:9460/api",
            "http://127.0.0.1:8000/v1",
        ] {
            assert_eq!(p.proxy_for(&uri(direct)), None, "{direct}");
        }
        assert!(
            p.proxy_for(&uri("https://notinternal.example/")).is_some(),
            "a suffix that is not a subdomain does not match"
        );
    }

    #[test]
    fn lower_case_names_count_and_the_upper_case_one_wins() {
        let p = Proxies::from_lookup(env(&[
            ("https_proxy", "http://lower:1"),
            ("no_proxy", "skip.example"),
        ]));
        assert_eq!(
            p.proxy_for(&uri("https://a.example/")).as_deref(),
            Some("http://lower:1")
        );
        assert_eq!(p.proxy_for(&uri("https://skip.example/")), None);
        assert_eq!(
            p.proxy_for(&uri("http://a.example/")),
            None,
            "no HTTP_PROXY"
        );
        let p = Proxies::from_lookup(env(&[
            ("HTTPS_PROXY", "http://upper:2"),
            ("https_proxy", "http://lower:1"),
        ]));
        assert_eq!(
            p.proxy_for(&uri("https://a.example/")).as_deref(),
            Some("http://upper:2")
        );
        // Empty counts as unset.
        let p = Proxies::from_lookup(env(&[("HTTPS_PROXY", " "), ("https_proxy", "http://l:1")]));
        assert_eq!(
            p.proxy_for(&uri("https://a.example/")).as_deref(),
            Some("http://l:1")
        );
        assert_eq!(
            Proxies::from_lookup(env(&[])).proxy_for(&uri("https://a.example/")),
            None
        );
        let all = Proxies::from_lookup(env(&[
            ("HTTPS_PROXY", "http://p:1"),
            ("NO_PROXY", "a.example, *"),
        ]));
        assert_eq!(
            all.proxy_for(&uri("https://10.0.0.1/")),
            None,
            "* covers addresses"
        );
        assert_eq!(all.proxy_for(&uri("https://b.example/")), None);
    }

    #[test]
    fn user_info_becomes_basic_auth_and_is_never_printed() {
        let p = Proxies::from_lookup(env(&[("HTTP_PROXY", "http://al%40ice:s3cret@proxy:8080")]));
        let route = p.route(&uri("http://a.example/")).expect("proxied");
        let auth = route.auth.expect("basic auth");
        assert!(auth.is_sensitive());
        // base64("al@ice:s3cret")
        assert_eq!(auth, "Basic YWxAaWNlOnMzY3JldA==");
        assert_eq!(
            p.proxy_for(&uri("http://a.example/")).as_deref(),
            Some("http://proxy:8080")
        );
        let debug = format!("{p:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("ice"),
            "{debug}"
        );
    }

    #[test]
    fn a_proxy_without_a_scheme_is_http() {
        let p = Proxies::from_lookup(env(&[("HTTPS_PROXY", "proxy.corp:3128")]));
        assert_eq!(
            p.proxy_for(&uri("https://a.example/")).as_deref(),
            Some("http://proxy.corp:3128")
        );
    }
}
