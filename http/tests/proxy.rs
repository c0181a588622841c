//! The client against a forward proxy and a server on 127.0.0.1, over real sockets:
//! http:// targets are asked of `HTTP_PROXY` in absolute form with the proxy's
//! credentials, https:// targets go through `CONNECT` to `HTTPS_PROXY`, and `NO_PROXY`
//! hosts are reached directly.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use warden_http::{Error, HttpClient, Proxies};

use warden_testkit::proxy::ProxyDouble;

/// A server that answers every request `200 origin` and records its request heads.
struct Origin {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        // Not HTTP (a TLS hello through a tunnel): hang up.
                        if !buf[0].is_ascii_uppercase() {
                            return;
                        }
                    }
                    log.lock()
                        .expect("lock")
                        .push(String::from_utf8_lossy(&buf).into_owned());
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\norigin",
                        )
                        .await;
                });
            }
        });
        Origin { addr, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("lock").clone()
    }
}

fn client(vars: &[(&'static str, String)]) -> HttpClient {
    let vars = vars.to_vec();
    HttpClient::builder()
        .connect_timeout(Duration::from_secs(5))
        .proxies(Proxies::from_lookup(move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }))
        .build()
        .expect("client")
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .body(Full::new(Bytes::new()))
        .expect("request")
}

async fn fetch(client: &HttpClient, url: &str) -> Result<warden_http::HttpResponse, Error> {
    tokio::time::timeout(Duration::from_secs(30), client.fetch(get(url), 1024))
        .await
        .expect("an answer or an error in time")
}

#[tokio::test]
async fn an_http_target_is_asked_of_the_proxy_in_absolute_form_with_its_credentials() {
    let origin = Origin::start().await;
    let proxy = ProxyDouble::start().await.expect("proxy");
    let with_user = proxy.url().replace("http://", "http://warden:pa%20ss@");
    let client = client(&[("HTTP_PROXY", with_user)]);
    let url = format!("http://{}/api/v1/x?token=abc", origin.addr);

    let resp = fetch(&client, &url).await.expect("answered");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, "origin");
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].request_line, format!("GET {url} HTTP/1.1"));
    // base64("warden:pa ss")
    assert_eq!(
        seen[0].header("proxy-authorization"),
        Some("Basic d2FyZGVuOnBhIHNz")
    );
    let heads = origin.heads();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].starts_with("GET /api/v1/x?token=abc HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert!(
        !heads[0]
            .to_ascii_lowercase()
            .contains("proxy-authorization"),
        "{heads:?}"
    );
    assert_eq!(
        client.proxy_for(&url.parse().expect("url")),
        Some(proxy.url())
    );

    // A name only the proxy would resolve: the client never looks it up itself.
    let resp = fetch(&client, "http://warden-target.invalid/x")
        .await
        .expect("the proxy answers");
    assert_eq!(resp.status, 502);
    assert_eq!(
        proxy.request_lines().last().map(String::as_str),
        Some("GET http://warden-target.invalid/x HTTP/1.1")
    );
}

#[tokio::test]
async fn no_proxy_hosts_are_reached_directly() {
    let origin = Origin::start().await;
    let proxy = ProxyDouble::start().await.expect("proxy");
    for no_proxy in ["127.0.0.1", "localhost, 127.0.0.0/8", "*"] {
        let client = client(&[
            ("HTTP_PROXY", proxy.url()),
            ("HTTPS_PROXY", proxy.url()),
            ("no_proxy", no_proxy.to_owned()),
        ]);
        let url = format!("http://{}/direct", origin.addr);
        let resp = fetch(&client, &url).await.expect("answered");
        assert_eq!(resp.body, "origin", "{no_proxy}");
        assert_eq!(client.proxy_for(&url.parse().expect("url")), None);
    }
    assert!(proxy.seen().is_empty(), "{:?}", proxy.seen());
    let heads = origin.heads();
    assert_eq!(heads.len(), 3);
    assert!(
        heads
            .iter()
            .all(|h| h.starts_with("GET /direct HTTP/1.1\r\n"))
    );
}

#[tokio::test]
async fn an_https_target_goes_through_a_connect_tunnel() {
    let origin = Origin::start().await;
    let proxy = ProxyDouble::start().await.expect("proxy");
    let with_user = proxy.url().replace("http://", "http://warden:secret@");
    let client = client(&[
        ("HTTPS_PROXY", with_user),
        ("NO_PROXY", "example.org".into()),
    ]);

    // The tunnel opens; the TLS handshake then fails, the server behind it speaking
    // plain HTTP. What matters is how the connection was made.
    let err = fetch(&client, &format!("https://{}/x", origin.addr))
        .await
        .expect_err("no TLS behind the tunnel");
    assert!(matches!(err, Error::Connection(_)), "{err}");
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].request_line,
        format!("CONNECT {} HTTP/1.1", origin.addr)
    );
    // base64("warden:secret")
    assert_eq!(
        seen[0].header("proxy-authorization"),
        Some("Basic d2FyZGVuOnNlY3JldA==")
    );

    // The default port, and a refused tunnel named in the error.
    let err = fetch(&client, "https://warden-target.invalid/v1")
        .await
        .expect_err("the proxy cannot reach it");
    assert_eq!(
        proxy.request_lines().last().map(String::as_str),
        Some("CONNECT warden-target.invalid:443 HTTP/1.1")
    );
    let text = err.to_string();
    assert!(text.contains(&proxy.url()), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test]
async fn a_proxy_that_is_not_http_fails_the_request_instead_of_being_bypassed() {
    let origin = Origin::start().await;
    let client = client(&[("HTTP_PROXY", "socks5://127.0.0.1:1".into())]);
    let err = fetch(&client, &format!("http://{}/x", origin.addr))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("only http:// proxies"), "{err}");
    assert!(origin.heads().is_empty());

    // A proxy that is down is an error too, naming the proxy.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let client = self::client(&[("HTTP_PROXY", dead.clone())]);
    let err = fetch(&client, &format!("http://{}/x", origin.addr))
        .await
        .expect_err("the proxy is down");
    assert!(err.to_string().contains(&dead), "{err}");
    assert!(origin.heads().is_empty());
}

#[tokio::test]
async fn without_proxies_the_body_bound_holds() {
    let origin = Origin::start().await;
    let client = client(&[]);
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        client.fetch(get(&format!("http://{}/x", origin.addr)), 3),
    )
    .await
    .expect("in time")
    .expect_err("the body is 6 bytes");
    assert_eq!(err, Error::TooLarge(3));
}
