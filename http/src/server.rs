//! The one HTTP server of Warden's binaries (the controller's API, plain or TLS, and the
//! agent's local API): HTTP/1.1 only, with limits, so that whoever can connect cannot
//! take the service down by holding connections.
//!
//! - **HTTP/1.1 only.** hyper's http1 connection, never the automatic HTTP/1-or-2 one:
//!   an HTTP/2 prior-knowledge preface (h2c) is refused and the connection closed.
//! - **Header timeout.** A new connection has [`Limits::header_timeout`] from accept to
//!   the end of its first request head, its TLS handshake ([`Handshake`]) included; a
//!   later request has as long from the first byte of its head. A client that drips
//!   its head a byte at a time is closed when the time is up.
//! - **Idle timeout.** A keep-alive connection that sends nothing for
//!   [`Limits::idle_timeout`] after an answer is closed, and so is one whose client
//!   reads nothing of its answer for as long (the answer's write stalled).
//! - **Connection cap with per-peer fairness.** At most [`Limits::max_connections`] are
//!   held (lowered at start to fit the open-file limit, [`Limits::fitted`]), at most
//!   [`Limits::max_connections_per_peer`] from one address (IPv6: one /64). At a cap, a
//!   new connection is admitted by closing an idle one (no request in flight): the
//!   longest-idle of its own peer at the per-peer share, else of the peer holding the
//!   most connections; when none is idle the new connection is closed. Reaching a cap is
//!   logged, at most once a minute, and counted ([`ServerStats`]). Accepting never
//!   pauses for the cap: a full accept queue would make new clients wait out a SYN
//!   retransmission (1 s).
//! - **Accept errors** (out of file descriptors and the like) never end or spin the
//!   loop: when descriptors ran out it closes an idle connection and waits 1 ms for it
//!   to go; otherwise (or with none idle) it waits 10 ms, doubling to 0.5 s, before
//!   accepting again. Evicted connections hold their descriptors until their tasks
//!   close them: while more than the cap are open, the loop lets them run after each
//!   accept, so a fast reconnecting flood does not run the process out of descriptors.
//! - **Graceful shutdown.** When `shutdown` resolves the listener closes, idle
//!   connections close, requests in flight finish and their connections then close, and
//!   [`Server::serve`] returns once every connection is gone.
//!
//! hyper's own `header_read_timeout` is not used: it runs from the moment hyper waits
//! for a head, which on a keep-alive connection is as soon as the previous answer is
//! out, so it would also close every connection idle for longer than the header timeout.

mod admission;
mod limits;

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};
use tower_service::Service;

use admission::{Admission, Admit, Refusal};
pub use limits::{
    DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, HEADER_TIMEOUT_SECS,
    IDLE_TIMEOUT_SECS, Limits, MAX_CONNECTIONS, ServerConfig, open_file_limit,
};

/// How long a connection being closed with no request in flight (evicted, or at
/// shutdown) may take to flush what it already wrote before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Least time between two warnings about the same limit or failure.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// Length of the listener's accept queue ([`bind`]); the kernel caps it at
/// `net.core.somaxconn` (4096 by default since Linux 5.4).
pub const ACCEPT_BACKLOG: u32 = 4096;
/// The wait after an accept that failed for want of descriptors, once an idle
/// connection was closed to free one.
const FREED_PAUSE: Duration = Duration::from_millis(1);
/// First and longest wait after an accept failed for want of a resource.
const ACCEPT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(500));

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// What turns an accepted TCP connection into the stream HTTP is spoken on: nothing
/// ([`Plain`]) or a TLS handshake. It runs inside the connection's slot and under its
/// header timeout, so connections still in their handshake count against the cap and
/// are evicted like any idle one.
pub trait Handshake: Send + Sync + 'static {
    /// The stream HTTP is read from and written to.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Make the stream; an error closes the connection (logged at debug level).
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// Plain http: the TCP stream as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    async fn handshake(&self, tcp: TcpStream) -> io::Result<TcpStream> {
        Ok(tcp)
    }
}

/// Counts of what the server did, for metrics and tests.
#[derive(Debug, Default)]
pub struct ServerStats {
    open: AtomicUsize,
    accepted: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
    header_timeouts: AtomicU64,
    idle_timeouts: AtomicU64,
    stalled_writes: AtomicU64,
    accept_errors: AtomicU64,
}

/// [`ServerStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Connections open now (admitted and not yet closed, evicted ones still closing
    /// included).
    pub open: usize,
    /// Connections accepted.
    pub accepted: u64,
    /// Idle connections closed to make room for a new one (or for a descriptor).
    pub evicted: u64,
    /// New connections closed at once: the cap was reached and none was idle.
    pub refused: u64,
    /// Connections closed because a request head (or TLS handshake) took too long.
    pub header_timeouts: u64,
    /// Keep-alive connections closed after waiting too long for a request.
    pub idle_timeouts: u64,
    /// Connections closed because their client read nothing of an answer for the idle
    /// timeout.
    pub stalled_writes: u64,
    /// Failed accepts other than a client giving up (out of descriptors and the like).
    pub accept_errors: u64,
}

impl ServerStats {
    /// The counts now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            open: self.open.load(Ordering::Relaxed),
            accepted: get(&self.accepted),
            evicted: get(&self.evicted),
            refused: get(&self.refused),
            header_timeouts: get(&self.header_timeouts),
            idle_timeouts: get(&self.idle_timeouts),
            stalled_writes: get(&self.stalled_writes),
            accept_errors: get(&self.accept_errors),
        }
    }

    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// An HTTP/1.1 server with [`Limits`]; [`Server::serve`] runs it.
#[derive(Debug)]
pub struct Server<H = Plain> {
    limits: Limits,
    handshake: H,
    stats: Arc<ServerStats>,
}

impl Server<Plain> {
    /// A plain-http server with these limits.
    pub fn new(limits: Limits) -> Server<Plain> {
        Server {
            limits,
            handshake: Plain,
            stats: Arc::default(),
        }
    }
}

/// Listen on `addr` (within a Tokio runtime) with an accept queue of [`ACCEPT_BACKLOG`],
/// not the usual 128: under a burst of new connections a full queue drops SYNs, and a
/// client whose SYN is dropped tries again only after a second.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted server can bind again at once.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// Serve `service` on `listener`, plain http, under `limits`, until `shutdown` resolves
/// and every connection has finished ([`Server::serve`]).
pub async fn serve<S, B, F>(listener: TcpListener, service: S, limits: Limits, shutdown: F)
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    F: Future<Output = ()> + Send,
{
    Server::new(limits).serve(listener, service, shutdown).await;
}

impl<H: Handshake> Server<H> {
    /// This server with `handshake` run on every accepted connection (TLS).
    pub fn with_handshake<H2: Handshake>(self, handshake: H2) -> Server<H2> {
        Server {
            limits: self.limits,
            handshake,
            stats: self.stats,
        }
    }

    /// The server's counts, live.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// Serve `service` on `listener` until `shutdown` resolves; then stop accepting,
    /// close idle connections, let requests in flight finish, and return once every
    /// connection is closed. Never fails: a failed accept is waited out.
    pub async fn serve<S, B, F>(self, listener: TcpListener, service: S, shutdown: F)
    where
        S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
        F: Future<Output = ()> + Send,
    {
        let open_files = open_file_limit();
        let limits = self.limits.fitted(open_files);
        if limits.max_connections < self.limits.max_connections {
            tracing::warn!(
                configured = self.limits.max_connections,
                max_connections = limits.max_connections,
                max_connections_per_peer = limits.max_connections_per_peer,
                open_files = open_files.unwrap_or_default(),
                "max_connections lowered to leave a quarter of the open-file limit free; \
                 raise the limit (LimitNOFILE) to hold more"
            );
        }
        tracing::info!(
            max_connections = limits.max_connections,
            max_connections_per_peer = limits.max_connections_per_peer,
            header_timeout_secs = limits.header_timeout.as_secs_f64(),
            idle_timeout_secs = limits.idle_timeout.as_secs_f64(),
            "serving HTTP/1.1"
        );
        let registry = Registry::new(limits, self.stats.clone());
        let handshake = Arc::new(self.handshake);
        let (stop_tx, stop_rx) = watch::channel(false);
        // Every connection task holds a receiver; `closed()` says they all ended.
        let (done_tx, done_rx) = watch::channel(());
        let mut shutdown = pin!(shutdown);
        let mut backoff = ACCEPT_BACKOFF.0;
        let mut accept_warned: Option<Instant> = None;

        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                r = listener.accept() => r,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => {
                    backoff = ACCEPT_BACKOFF.0;
                    c
                }
                // The client gave up before we took it: nothing to wait for.
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    ServerStats::bump(&self.stats.accept_errors);
                    let freed = out_of_descriptors(&e) && registry.evict_one();
                    if accept_warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        accept_warned = Some(Instant::now());
                        tracing::warn!(
                            error = %e,
                            closed_an_idle_connection = freed,
                            failed_accepts = self.stats.snapshot().accept_errors,
                            "accepting a connection failed; retrying after a pause"
                        );
                    }
                    // A descriptor is on its way back: only give its task time to close
                    // it. Otherwise wait longer each time.
                    let pause = if freed { FREED_PAUSE } else { backoff };
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                    if !freed {
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                    }
                    continue;
                }
            };
            ServerStats::bump(&self.stats.accepted);
            let (evict_tx, evict_rx) = oneshot::channel();
            let Some(slot) = registry.admit(peer.ip(), evict_tx) else {
                // Refused: dropping the stream closes it.
                continue;
            };
            tokio::spawn(connection(Conn {
                slot,
                tcp,
                peer,
                handshake: handshake.clone(),
                service: service.clone(),
                evict: evict_rx,
                stop: stop_rx.clone(),
                _done: done_rx.clone(),
            }));
            // Evicted connections keep their descriptors until their tasks run: give
            // them the turn before accepting more.
            if self.stats.open.load(Ordering::Relaxed) > limits.max_connections {
                tokio::task::yield_now().await;
            }
        }

        drop(listener);
        let _ = stop_tx.send(true);
        drop(done_rx);
        done_tx.closed().await;
    }
}

/// A client that went away between connecting and being accepted.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// EMFILE or ENFILE.
fn out_of_descriptors(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        let code = e.raw_os_error();
        code == Some(rustix::io::Errno::MFILE.raw_os_error())
            || code == Some(rustix::io::Errno::NFILE.raw_os_error())
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// The address a peer is counted under: IPv4 as it is (an IPv4-mapped IPv6 address as
/// its IPv4 address), IPv6 by its /64, which one host can fill with addresses.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => {
            let s = a.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The held connections of one server.
#[derive(Debug)]
struct Registry {
    table: Mutex<Table>,
    stats: Arc<ServerStats>,
    limits: Limits,
}

#[derive(Debug)]
struct Table {
    /// Each connection's payload is its eviction signal.
    admission: Admission<oneshot::Sender<()>>,
    /// When a limit was last warned about.
    warned: Option<Instant>,
}

impl Table {
    /// Warn about a reached limit, at most once a [`WARN_EVERY`].
    fn warn(&mut self, now: Instant, stats: &ServerStats, limits: &Limits, what: &'static str) {
        if self
            .warned
            .is_some_and(|t| now.duration_since(t) < WARN_EVERY)
        {
            return;
        }
        self.warned = Some(now);
        let s = stats.snapshot();
        tracing::warn!(
            max_connections = limits.max_connections,
            max_connections_per_peer = limits.max_connections_per_peer,
            evicted = s.evicted,
            refused = s.refused,
            "connection limit reached: {what}"
        );
    }
}

impl Registry {
    fn new(limits: Limits, stats: Arc<ServerStats>) -> Arc<Registry> {
        Arc::new(Registry {
            table: Mutex::new(Table {
                admission: Admission::new(limits.max_connections, limits.max_connections_per_peer),
                warned: None,
            }),
            stats,
            limits,
        })
    }

    /// Admit a connection from `ip`, closing an idle one when a cap is reached; `None`
    /// when it is refused.
    fn admit(self: &Arc<Self>, ip: IpAddr, evict: oneshot::Sender<()>) -> Option<Slot> {
        let now = Instant::now();
        let mut t = lock(&self.table);
        let full = t.admission.len() >= self.limits.max_connections;
        match t.admission.admit(peer_key(ip), now, evict) {
            Admit::Admitted { id, evicted } => {
                if let Some(signal) = evicted {
                    let _ = signal.send(());
                    ServerStats::bump(&self.stats.evicted);
                    let what = if full {
                        "closing the longest-idle connection of the peer holding the most"
                    } else {
                        "a peer at its share; closing its longest-idle connection"
                    };
                    t.warn(now, &self.stats, &self.limits, what);
                }
                self.stats.open.fetch_add(1, Ordering::Relaxed);
                Some(Slot {
                    registry: self.clone(),
                    id,
                })
            }
            Admit::Refused(why) => {
                ServerStats::bump(&self.stats.refused);
                let what = match why {
                    Refusal::Full => "every connection has a request in flight; refusing new ones",
                    Refusal::PeerFull => {
                        "a peer's every connection has a request in flight; refusing its new ones"
                    }
                };
                t.warn(now, &self.stats, &self.limits, what);
                None
            }
        }
    }

    /// Close one idle connection to free a descriptor; whether there was one.
    fn evict_one(&self) -> bool {
        let evicted = lock(&self.table).admission.evict_one();
        match evicted {
            Some(signal) => {
                let _ = signal.send(());
                ServerStats::bump(&self.stats.evicted);
                true
            }
            None => false,
        }
    }
}

/// A connection's place in the [`Registry`]; dropping it gives the place back.
#[derive(Debug)]
struct Slot {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.registry.table).admission.remove(self.id);
        self.registry.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Which timeout a connection's deadline is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Header,
    Idle,
    /// An answer could not be written for the idle timeout: its client reads nothing.
    Stalled,
}

/// Where one connection is, for its deadline and for eviction: read by its task, written
/// by its stream (bytes arrived, a write waits) and its requests (started, answered).
/// Each change between idle and in flight is told to the [`Registry`].
#[derive(Debug)]
struct Phase {
    accepted: Instant,
    registry: Arc<Registry>,
    id: u64,
    state: Mutex<PhaseState>,
}

#[derive(Debug)]
struct PhaseState {
    /// Requests whose answer's body hyper has not taken whole.
    requests: u32,
    /// Since when a write has been waiting for the client to read: the last answer is
    /// still going out.
    write_blocked: Option<Instant>,
    /// Requests answered.
    served: u64,
    /// When the connection last became idle.
    idle_since: Instant,
    /// When the first byte of the next request head arrived.
    head_started: Option<Instant>,
}

impl PhaseState {
    /// A request is in flight: its answer is being made or still being written.
    fn in_flight(&self) -> bool {
        self.requests > 0 || self.write_blocked.is_some()
    }
}

/// A change [`Phase`] tells the [`Registry`] about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    None,
    Busy,
    Idle(Instant),
}

impl Phase {
    fn new(accepted: Instant, registry: Arc<Registry>, id: u64) -> Phase {
        Phase {
            accepted,
            registry,
            id,
            state: Mutex::new(PhaseState {
                requests: 0,
                write_blocked: None,
                served: 0,
                idle_since: accepted,
                head_started: None,
            }),
        }
    }

    /// When the connection is to be closed, and why. With a request in flight, only
    /// when its answer cannot be written.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, Expiry)> {
        let s = lock(&self.state);
        if let Some(t) = s.write_blocked {
            Some((t + limits.idle_timeout, Expiry::Stalled))
        } else if s.requests > 0 {
            None
        } else if s.served == 0 {
            Some((self.accepted + limits.header_timeout, Expiry::Header))
        } else if let Some(t) = s.head_started {
            Some((t + limits.header_timeout, Expiry::Header))
        } else {
            Some((s.idle_since + limits.idle_timeout, Expiry::Idle))
        }
    }

    fn in_flight(&self) -> bool {
        lock(&self.state).in_flight()
    }

    /// Apply `f` to the state; tell the registry when the connection became busy or idle.
    fn update(&self, f: impl FnOnce(&mut PhaseState)) {
        let change = {
            let mut s = lock(&self.state);
            let was = s.in_flight();
            f(&mut s);
            match (was, s.in_flight()) {
                (false, true) => Change::Busy,
                (true, false) => {
                    let now = Instant::now();
                    s.idle_since = now;
                    Change::Idle(now)
                }
                _ => Change::None,
            }
        };
        match change {
            Change::None => {}
            Change::Busy => {
                lock(&self.registry.table).admission.busy(self.id);
            }
            Change::Idle(now) => lock(&self.registry.table).admission.idle(self.id, now),
        }
    }

    /// Bytes arrived: between requests, the next head has started.
    fn saw_bytes(&self) {
        let mut s = lock(&self.state);
        if !s.in_flight() && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
        }
    }

    /// A write waits for the client to read (`blocked`), or went through.
    fn wrote(&self, blocked: bool) {
        let now_blocked = lock(&self.state).write_blocked.is_some();
        if blocked != now_blocked {
            self.update(|s| s.write_blocked = blocked.then(Instant::now));
        }
    }

    /// A request started.
    fn begin(&self) {
        self.update(|s| {
            s.requests += 1;
            s.head_started = None;
        });
    }

    /// A request's answer was taken whole by hyper (or dropped).
    fn end(&self) {
        self.update(|s| {
            s.requests = s.requests.saturating_sub(1);
            s.served += 1;
        });
    }
}

/// One request in flight, from its head until hyper has taken its answer's body whole.
#[derive(Debug)]
struct InFlight {
    phase: Arc<Phase>,
}

impl InFlight {
    fn begin(phase: &Arc<Phase>) -> InFlight {
        phase.begin();
        InFlight {
            phase: phase.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.phase.end();
    }
}

/// The caller's service, with each request marked in flight until its body is sent.
struct Tracked<S> {
    inner: S,
    phase: Arc<Phase>,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::begin(&self.phase);
        let mut svc = self.inner.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
            let res = svc.call(req).await?;
            Ok(res.map(|body| TrackedBody {
                body: Box::pin(body),
                _in_flight: in_flight,
            }))
        })
    }
}

/// An answer's body, holding its request in flight until hyper has taken all of it.
struct TrackedBody<B> {
    body: Pin<Box<B>>,
    _in_flight: InFlight,
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection's stream, noting when bytes arrive between requests and when a write
/// waits for the client.
struct Watched<I> {
    io: I,
    phase: Arc<Phase>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.phase.saw_bytes();
        }
        read
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.phase.wrote(written.is_pending());
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.phase.wrote(written.is_pending());
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        self.phase.wrote(flushed.is_pending());
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What a connection's task owns.
struct Conn<H, S> {
    slot: Slot,
    tcp: TcpStream,
    peer: SocketAddr,
    handshake: Arc<H>,
    service: S,
    /// Fires when the connection is evicted.
    evict: oneshot::Receiver<()>,
    /// Turns true when the server shuts down.
    stop: watch::Receiver<bool>,
    /// Dropped when the task ends.
    _done: watch::Receiver<()>,
}

/// Run one connection: handshake, then HTTP/1.1 under its deadlines, until the client
/// closes it, a deadline passes, it is evicted, or the server shuts down.
async fn connection<H, S, B>(c: Conn<H, S>)
where
    H: Handshake,
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let Conn {
        slot,
        tcp,
        peer,
        handshake,
        service,
        mut evict,
        mut stop,
        _done,
    } = c;
    let registry = slot.registry.clone();
    let limits = registry.limits;
    let stats = &registry.stats;
    let phase = Arc::new(Phase::new(Instant::now(), registry.clone(), slot.id));

    let first_deadline = phase.accepted + limits.header_timeout;
    let io = tokio::select! {
        r = tokio::time::timeout_at(first_deadline.into(), handshake.handshake(tcp)) => match r {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "handshake failed");
                return;
            }
            Err(_) => {
                ServerStats::bump(&stats.header_timeouts);
                tracing::debug!(%peer, "handshake timed out");
                return;
            }
        },
        _ = &mut evict => return,
        _ = stop.wait_for(|s| *s) => return,
    };

    let io = TokioIo::new(Watched {
        io,
        phase: phase.clone(),
    });
    let svc = Tracked {
        inner: service,
        phase: phase.clone(),
    };
    let mut builder = http1::Builder::new();
    builder.keep_alive(true).header_read_timeout(None);
    let mut conn = pin!(builder.serve_connection(io, svc));

    // Deadlines move only later, except when a head starts or a write blocks (then
    // they are at least this far ahead): looking again this often catches them in time.
    let look_every = limits.header_timeout.min(limits.idle_timeout);
    let mut closing = false;
    let mut evicted = false;
    let mut stopping = false;
    let mut hard_stop: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let mut wake = now + look_every;
        if let Some((d, _)) = phase.deadline(&limits) {
            wake = wake.min(d);
        }
        if let Some(h) = hard_stop {
            wake = wake.min(h);
        }
        let close = tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                if hard_stop.is_some_and(|h| now >= h) {
                    return;
                }
                if let Some((d, why)) = phase.deadline(&limits)
                    && now >= d
                {
                    match why {
                        Expiry::Header => ServerStats::bump(&stats.header_timeouts),
                        Expiry::Idle => ServerStats::bump(&stats.idle_timeouts),
                        Expiry::Stalled => ServerStats::bump(&stats.stalled_writes),
                    }
                    tracing::debug!(%peer, ?why, "connection timed out");
                    return;
                }
                false
            }
            _ = &mut evict, if !evicted => {
                evicted = true;
                tracing::debug!(%peer, "connection evicted");
                true
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                true
            }
        };
        if close {
            if !closing {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            // Nothing in flight: what is left is flushing; a request in flight
            // (shutdown, or evicted as it started one) finishes first.
            if hard_stop.is_none() && !phase.in_flight() {
                hard_stop = Some(Instant::now() + CLOSE_GRACE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_counted_by_address_and_ipv6_by_its_slash_64() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(peer_key(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            peer_key(ip("2001:db8:1:2:bbbb::9")),
            peer_key(ip("2001:db8:1:2:aaaa::1"))
        );
    }

    #[test]
    fn a_connection_is_in_flight_from_its_head_until_its_answer_is_written() {
        let limits = Limits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1,
            max_connections_per_peer: 1,
        };
        let registry = Registry::new(limits, Arc::default());
        let (tx, _rx) = oneshot::channel();
        let slot = registry
            .admit(IpAddr::from([10, 0, 0, 1]), tx)
            .expect("admitted");
        let evictable = || {
            let mut t = lock(&registry.table);
            let victim = t.admission.evict_one();
            victim.is_some()
        };
        let t0 = Instant::now();
        let p = Phase::new(t0, registry.clone(), slot.id);
        // New: the first head is due within the header timeout.
        assert_eq!(
            p.deadline(&limits),
            Some((t0 + limits.header_timeout, Expiry::Header))
        );
        p.begin();
        assert_eq!(p.deadline(&limits), None);
        assert!(!evictable(), "never evicted with a request in flight");
        // hyper took the whole body, but the client reads nothing of it: still in
        // flight, until the idle timeout.
        p.wrote(true);
        p.end();
        assert!(p.in_flight());
        assert_eq!(
            p.deadline(&limits).map(|(_, why)| why),
            Some(Expiry::Stalled)
        );
        p.wrote(false);
        assert!(!p.in_flight());
        let (idle_due, why) = p.deadline(&limits).expect("a deadline");
        assert_eq!(why, Expiry::Idle);
        assert!(idle_due >= t0 + limits.idle_timeout);
        // A head started between requests is held to the header timeout.
        p.saw_bytes();
        let (due, why) = p.deadline(&limits).expect("a deadline");
        assert_eq!(why, Expiry::Header);
        assert!(due < idle_due);
        // Idle: the table may evict it.
        assert!(evictable());
        drop(slot);
    }
}
