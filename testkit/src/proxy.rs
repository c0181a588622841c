//! A forward proxy on loopback for tests: it records the request
//! line and headers of every request it is sent, passes absolute-form requests on to
//! their host, and opens `CONNECT` tunnels, so that a test can tell which requests went
//! through a proxy and that they still arrived.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Largest request head read.
const MAX_HEAD: usize = 64 * 1024;

/// One request as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `GET http://host:port/path HTTP/1.1`, `CONNECT host:port HTTP/1.1`, ...
    pub request_line: String,
    /// The headers, names in lower case, in order.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The proxy; it stops when dropped.
#[derive(Debug)]
pub struct ProxyDouble {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for ProxyDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ProxyDouble {
    /// A proxy on a free loopback port (call inside a Tokio runtime).
    pub async fn start() -> std::io::Result<ProxyDouble> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Ok(ProxyDouble::serve(listener))
    }

    /// A proxy answering on `listener`.
    pub fn serve(listener: TcpListener) -> ProxyDouble {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(handle(conn, log.clone()));
            }
        });
        ProxyDouble { addr, seen, task }
    }

    /// `http://127.0.0.1:<port>`: the value for `HTTP_PROXY` or `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request seen so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The request lines seen so far, oldest first.
    pub fn request_lines(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.request_line).collect()
    }
}

async fn handle(mut conn: TcpStream, log: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return;
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    if let Ok(mut l) = log.lock() {
        l.push(Seen {
            request_line: request_line.clone(),
            headers: headers.clone(),
        });
    }
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method == "CONNECT" {
        let Ok(mut upstream) = TcpStream::connect(target).await else {
            let _ = conn.write_all(BAD_GATEWAY).await;
            return;
        };
        if conn
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        let _ = upstream.write_all(&buf[head_end..]).await;
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
        return;
    }
    // Absolute form: http://host[:port]/path
    let Some(rest) = target.strip_prefix("http://") else {
        let _ = conn.write_all(BAD_GATEWAY).await;
        return;
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let Ok(mut upstream) = TcpStream::connect(&authority).await else {
        let _ = conn.write_all(BAD_GATEWAY).await;
        return;
    };
    let version = parts.next().unwrap_or("HTTP/1.1");
    let mut out = format!("{method} {path} {version}\r\n");
    for (n, v) in &headers {
        if n.starts_with("proxy-") || n == "connection" {
            continue;
        }
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("connection: close\r\n\r\n");
    if upstream.write_all(out.as_bytes()).await.is_err()
        || upstream.write_all(&buf[head_end..]).await.is_err()
    {
        return;
    }
    let (mut from_client, mut to_client) = conn.into_split();
    let (mut from_upstream, mut to_upstream) = upstream.into_split();
    let body = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_upstream).await;
    });
    let _ = tokio::io::copy(&mut from_upstream, &mut to_client).await;
    let _ = to_client.shutdown().await;
    body.abort();
}

const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
