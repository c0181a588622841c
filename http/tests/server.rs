//! The server's limits over real sockets on loopback: a client dripping its request head
//! is closed at the header timeout, a silent keep-alive connection at the idle timeout
//! (and not at the header timeout), so is one whose client stops reading its answer, a
//! full server makes room by closing idle
//! connections (never one with a request in flight), fairly between peers, an h2c
//! preface is refused, and shutdown lets the request in flight finish.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};
use warden_http::server::{Limits, Server, ServerStats, StatsSnapshot};
use warden_testkit::{PATIENCE, scaled, wait_for_async};

/// Answers `ok`; `/slow` answers `slow` once the test releases it; `/big` answers more
/// than loopback's socket buffers hold.
#[derive(Clone)]
struct App {
    started: Arc<AtomicUsize>,
    release: watch::Receiver<bool>,
}

impl tower_service::Service<Request<Incoming>> for App {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let slow = req.uri().path() == "/slow";
        if req.uri().path() == "/big" {
            let body = Bytes::from(vec![b'x'; 64 << 20]);
            return Box::pin(async move { Ok(Response::new(Full::new(body))) });
        }
        let started = self.started.clone();
        let mut release = self.release.clone();
        Box::pin(async move {
            if slow {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = release.wait_for(|r| *r).await;
                return Ok(Response::new(Full::new(Bytes::from_static(b"slow"))));
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    }
}

/// A server on 127.0.0.1 with its controls.
struct Running {
    addr: SocketAddr,
    stats: Arc<ServerStats>,
    started: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn start(limits: Limits) -> Running {
        let listener =
            warden_http::server::bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (release, release_rx) = watch::channel(false);
        let started = Arc::new(AtomicUsize::new(0));
        let app = App {
            started: started.clone(),
            release: release_rx,
        };
        let server = Server::new(limits);
        let stats = server.stats();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, app, async {
            let _ = stop_rx.await;
        }));
        Running {
            addr,
            stats,
            started,
            release,
            stop: Some(stop),
            task,
        }
    }

    fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Wait until the server's counts satisfy `ok`.
    async fn wait_stats(&self, what: &str, ok: impl Fn(&StatsSnapshot) -> bool) {
        wait_for_async(what, PATIENCE, || {
            let s = self.stats();
            std::future::ready(ok(&s).then_some(()))
        })
        .await;
    }

    /// Connect from 127.0.0.1 and wait until the server holds one more connection.
    async fn connect(&self) -> TcpStream {
        self.connect_from([127, 0, 0, 1]).await
    }

    /// Connect from a loopback address of our choosing and wait until the server holds
    /// it, so that connections are admitted in the order the test makes them.
    async fn connect_from(&self, source: [u8; 4]) -> TcpStream {
        let before = self.stats().accepted;
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((IpAddr::from(source), 0)))
            .expect("bind a loopback source address");
        let stream = socket.connect(self.addr).await.expect("connect");
        self.wait_stats("the connection to be accepted", |s| s.accepted > before)
            .await;
        stream
    }

    /// Wait until `n` `/slow` requests are in the handler.
    async fn wait_started(&self, n: usize) {
        wait_for_async("the slow request to reach the handler", PATIENCE, || {
            std::future::ready((self.started.load(Ordering::SeqCst) >= n).then_some(()))
        })
        .await;
    }
}

/// Send `GET path` on `s` and read the answer's body (answers here are short and carry
/// a content-length).
async fn get(s: &mut TcpStream, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes())
        .await
        .expect("write request");
    read_answer(s).await
}

async fn read_answer(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = scaled(PATIENCE);
    let read = async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                assert!(head.starts_with("http/1.1 200"), "answer: {head}");
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("content-length");
                if buf.len() >= end + 4 + len {
                    return String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                }
            }
            let n = s.read(&mut chunk).await.expect("read answer");
            assert!(
                n > 0,
                "closed before answering: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(deadline, read)
        .await
        .expect("an answer in time")
}

/// Read until the server closes `s` (end of stream or a reset); what it sent before.
async fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    let read = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(scaled(PATIENCE), read)
        .await
        .expect("the server to close the connection");
    got
}

/// Whether the server still holds `s` open (nothing to read, no end of stream).
fn still_open(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

fn limits(header_ms: u64, idle_ms: u64, max: usize, per_peer: usize) -> Limits {
    Limits {
        header_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_connections: max,
        max_connections_per_peer: per_peer,
    }
}

const LONG: u64 = 600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_connection_is_closed_at_the_header_timeout() {
    let header = Duration::from_millis(800);
    let srv = Running::start(limits(800, LONG, 16, 16)).await;
    // Before connecting: the server's clock for the head starts later.
    let t0 = Instant::now();
    let stream = srv.connect().await;
    let (mut rd, mut wr) = stream.into_split();
    // A byte every 100 ms, never the end of the head.
    let drip = tokio::spawn(async move {
        let _ = wr.write_all(b"GET / HTTP/1.1\r\n").await;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if wr.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(scaled(PATIENCE), async {
        let mut chunk = [0u8; 256];
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    drip.abort();
    assert!(closed.is_ok(), "the dripping client was never closed");
    assert!(
        t0.elapsed() >= header - Duration::from_millis(50),
        "closed early: {:?}",
        t0.elapsed()
    );
    assert!(
        got.is_empty(),
        "no answer to a head never finished: {got:?}"
    );
    srv.wait_stats("a header timeout counted", |s| {
        s.header_timeouts == 1 && s.open == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    let idle = Duration::from_millis(800);
    let srv = Running::start(limits(LONG, 800, 16, 16)).await;
    let mut s = srv.connect().await;
    // Before asking: the server's idle clock starts once it has answered.
    let asked = Instant::now();
    assert_eq!(get(&mut s, "/").await, "ok");
    let after = until_closed(&mut s).await;
    assert!(after.is_empty());
    assert!(
        asked.elapsed() >= idle - Duration::from_millis(50),
        "closed early: {:?}",
        asked.elapsed()
    );
    srv.wait_stats("an idle timeout counted", |s| {
        s.idle_timeouts == 1 && s.header_timeouts == 0 && s.open == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_outlives_the_header_timeout_between_requests() {
    let header = Duration::from_millis(1000);
    let srv = Running::start(limits(1000, LONG, 16, 16)).await;
    let mut s = srv.connect().await;
    assert_eq!(get(&mut s, "/").await, "ok");
    // Silent for several header timeouts: the idle timeout governs, not the header one.
    tokio::time::sleep(header * 3).await;
    assert_eq!(get(&mut s, "/").await, "ok");
    // A head started and never finished is held to the header timeout again.
    s.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
    assert!(until_closed(&mut s).await.is_empty());
    srv.wait_stats("a header timeout counted", |s| {
        s.header_timeouts == 1 && s.idle_timeouts == 0 && s.open == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_new_connection_is_served_by_evicting_the_longest_idle_one() {
    let srv = Running::start(limits(LONG, LONG, 3, 3)).await;
    let mut oldest = srv.connect().await;
    let mut busy = srv.connect().await;
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("write");
    srv.wait_started(1).await;
    let mut idle = srv.connect().await;
    srv.wait_stats("three connections held", |s| s.open == 3)
        .await;

    // Full: the newcomer is served, the longest-idle connection makes room.
    let mut newcomer = srv.connect().await;
    assert_eq!(get(&mut newcomer, "/").await, "ok");
    assert!(until_closed(&mut oldest).await.is_empty());
    assert!(
        still_open(&idle),
        "only one connection is evicted per newcomer"
    );

    // Next: `idle` (idle since it connected) goes before `newcomer` (idle since its
    // answer); the request in flight is never touched.
    let mut another = srv.connect().await;
    assert_eq!(get(&mut another, "/").await, "ok");
    assert!(until_closed(&mut idle).await.is_empty());
    assert!(still_open(&newcomer));
    srv.release.send_replace(true);
    assert_eq!(read_answer(&mut busy).await, "slow");
    let s = srv.stats();
    assert_eq!((s.evicted, s.refused), (2, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_a_request_in_flight_is_never_evicted() {
    let srv = Running::start(limits(LONG, LONG, 1, 1)).await;
    let mut busy = srv.connect().await;
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("write");
    srv.wait_started(1).await;
    // Nothing idle to close: the newcomer is refused.
    let mut refused = srv.connect().await;
    assert!(until_closed(&mut refused).await.is_empty());
    srv.wait_stats("a refusal counted", |s| s.refused == 1)
        .await;
    srv.release.send_replace(true);
    assert_eq!(read_answer(&mut busy).await, "slow");
    assert_eq!(srv.stats().evicted, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_holding_the_most_connections_makes_room_first() {
    let srv = Running::start(limits(LONG, LONG, 4, 4)).await;
    // The longest-idle connection belongs to a peer holding one.
    let lone = srv.connect_from([127, 0, 0, 1]).await;
    let mut crowd = Vec::new();
    for _ in 0..3 {
        crowd.push(srv.connect_from([127, 0, 0, 2]).await);
    }
    let mut newcomer = srv.connect_from([127, 0, 0, 3]).await;
    assert_eq!(get(&mut newcomer, "/").await, "ok");
    assert!(until_closed(&mut crowd[0]).await.is_empty());
    assert!(still_open(&lone), "the lone peer keeps its connection");
    assert!(still_open(&crowd[1]) && still_open(&crowd[2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_at_its_share_makes_room_from_its_own_connections() {
    let srv = Running::start(limits(LONG, LONG, 10, 2)).await;
    let other = srv.connect_from([127, 0, 0, 1]).await;
    let mut first = srv.connect_from([127, 0, 0, 4]).await;
    let second = srv.connect_from([127, 0, 0, 4]).await;
    let mut third = srv.connect_from([127, 0, 0, 4]).await;
    assert_eq!(get(&mut third, "/").await, "ok");
    assert!(until_closed(&mut first).await.is_empty());
    assert!(still_open(&second) && still_open(&other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_prior_knowledge_preface_is_refused() {
    let srv = Running::start(limits(LONG, LONG, 16, 16)).await;
    let mut s = srv.connect().await;
    // The HTTP/2 connection preface, then an empty SETTINGS frame.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .expect("write");
    let got = until_closed(&mut s).await;
    // An HTTP/2 server answers with its own SETTINGS frame (type 4 in the fourth byte).
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 "),
        "spoke something other than HTTP/1.1: {got:?}"
    );
    // HTTP/1.1 is still served.
    let mut fine = srv.connect().await;
    assert_eq!(get(&mut fine, "/").await, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_and_lets_the_request_in_flight_finish() {
    let mut srv = Running::start(limits(LONG, LONG, 16, 16)).await;
    let mut busy = srv.connect().await;
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("write");
    srv.wait_started(1).await;
    let mut idle = srv.connect().await;
    assert_eq!(get(&mut idle, "/").await, "ok");

    let _ = srv.stop.take().map(|s| s.send(()));
    assert!(until_closed(&mut idle).await.is_empty());
    let addr = srv.addr;
    wait_for_async("the listener to close", PATIENCE, || async move {
        TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
    assert!(!srv.task.is_finished(), "a request is still in flight");

    srv.release.send_replace(true);
    assert_eq!(read_answer(&mut busy).await, "slow");
    assert!(until_closed(&mut busy).await.is_empty());
    tokio::time::timeout(scaled(PATIENCE), &mut srv.task)
        .await
        .expect("serve returns once every connection is closed")
        .expect("the server task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answer_is_closed_at_the_idle_timeout() {
    let srv = Running::start(limits(LONG, 800, 16, 16)).await;
    let s = srv.connect().await;
    s.try_write(b"GET /big HTTP/1.1\r\nhost: test\r\n\r\n")
        .expect("write the request");
    // Never read: the answer's write stalls once the socket buffers are full, and the
    // request in flight is cut after the idle timeout.
    srv.wait_stats("the stalled connection to be closed", |s| {
        s.stalled_writes == 1 && s.open == 0
    })
    .await;
    drop(s);
}
