//! Incident alerts: Prometheus Alertmanager (API v2) and a Slack-compatible webhook.
//!
//! The tick loop hands every incident change to [`AlertQueue::submit`], which copies
//! what the alert needs and queues it without waiting (a full queue drops the change and
//! counts it). Each configured sink runs in its own task with at most one request in
//! flight, so a slow or failing sink delays nobody else:
//!
//! - Alertmanager: every live incident is one alert, re-sent every `resend_interval_secs`
//!   with `endsAt` four intervals ahead (as Prometheus does), and sent once more with
//!   `endsAt` = its resolution time when it resolves. All alerts due in one pass go in
//!   one POST. A culprit revision that changes the labels resolves the old label set.
//! - Webhook: one message per transition (opened, reopened, reclassified, resolved; not
//!   per evidence update), rate-limited by a token bucket of `max_per_minute`; the next
//!   message that goes out says how many were suppressed, and when none follows, a
//!   digest says it as soon as the bucket allows.
//!
//! Deliveries are retried with jittered exponential backoff on connection errors,
//! timeouts, 429 and 5xx, a bounded number of times; other answers are logged once and
//! not retried. URLs are logged as `scheme://host[:port]` only: webhook URLs carry
//! tokens.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;
use warden_diagnosis::llm::http::{ChatTransport, HyperTransport, origin};
use warden_model::config::ConfigError;
use warden_model::{GpuRef, Incident, IncidentKind, IncidentState, Severity, Timestamp};

use crate::metrics::Metrics;
use warden_engine::clock::{Clock, SystemClock};
use warden_engine::{Change, Engine, IncidentChange};

/// Default `alertmanager.resend_interval_secs`.
pub const DEFAULT_RESEND_INTERVAL_SECS: u64 = 60;
/// Default `timeout_ms` of both sinks.
pub const DEFAULT_TIMEOUT_MS: u64 = 5000;
/// Default `webhook.max_per_minute`.
pub const DEFAULT_MAX_PER_MINUTE: u32 = 20;
/// Incident changes waiting for a sink's task; more are dropped and counted.
pub const QUEUE_CAPACITY: usize = 1024;
/// Attempts per delivery (the first included) before it is given up.
pub const MAX_ATTEMPTS: u32 = 5;
/// Wait before the first retry; it doubles with each further one.
pub const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest wait between two attempts, `Retry-After` included.
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// An alert's `endsAt` is this many resend intervals ahead while it fires.
pub const ENDS_AT_INTERVALS: u32 = 4;
/// Most alerts in one POST to Alertmanager; the rest go in the next pass at once.
const MAX_ALERTS_PER_POST: usize = 500;
/// Webhook messages waiting for delivery; beyond this the oldest is dropped and counted.
const MAX_PENDING_MESSAGES: usize = 256;
/// Most ranks or GPUs spelled out in an annotation or message.
const MAX_LISTED: usize = 32;
/// Most nodes named in the `node` label.
const MAX_NODES_IN_LABEL: usize = 16;
/// Longest error body excerpt logged.
const MAX_BODY_EXCERPT: usize = 200;
/// Resolved incidents the webhook keeps in mind (to tell a reopening from an opening).
const MAX_REMEMBERED: usize = 4096;

/// The `alerts:` section of the controller configuration. Nothing configured: no alerts.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Send incidents to a Prometheus Alertmanager.
    pub alertmanager: Option<AlertmanagerConfig>,
    /// Post incident transitions to a Slack-compatible webhook.
    pub webhook: Option<WebhookConfig>,
}

/// Where and how to send alerts to Alertmanager.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    /// Base URL of Alertmanager (`http://alertmanager:9093`); alerts go to
    /// `{url}/api/v2/alerts`.
    pub url: SecretUrl,
    /// Seconds between re-sends of a live incident's alert.
    #[serde(default = "default_resend_interval_secs")]
    pub resend_interval_secs: u64,
    /// Time allowed for one POST, milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Link sent as each alert's `generatorURL`; `{incident}` stands for the incident id
    /// (e.g. `https://warden.example/api/v1/incidents/{incident}`).
    #[serde(default)]
    pub generator_url: Option<String>,
}

/// Where and how to post webhook messages.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The URL messages are posted to (a Slack incoming-webhook URL, or any endpoint
    /// that takes `{"text": ...}`). It usually holds a token: it is never logged whole.
    pub url: SecretUrl,
    /// Time allowed for one POST, milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Most messages per minute (a burst of this many, then one every
    /// `60 / max_per_minute` seconds); the rest are suppressed and counted.
    #[serde(default = "default_max_per_minute")]
    pub max_per_minute: u32,
}

fn default_resend_interval_secs() -> u64 {
    DEFAULT_RESEND_INTERVAL_SECS
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

fn default_max_per_minute() -> u32 {
    DEFAULT_MAX_PER_MINUTE
}

/// A URL that may carry credentials: `Debug` shows its origin only.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wrap `url`.
    pub fn new(url: impl Into<String>) -> Self {
        SecretUrl(url.into())
    }

    /// The whole URL, for the client only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `scheme://host[:port]`, safe to log.
    pub fn origin(&self) -> String {
        self.0
            .parse::<hyper::Uri>()
            .map_or_else(|_| "<invalid URL>".to_owned(), |u| origin(&u))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({:?})", self.origin())
    }
}

/// Whether `url` is an absolute `http://` or `https://` URL with a host.
fn check_url(url: &str) -> Result<(), String> {
    let uri = url
        .parse::<hyper::Uri>()
        .map_err(|e| format!("not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("must start with http:// or https://".to_owned()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("has no host".to_owned());
    }
    Ok(())
}

impl AlertsConfig {
    /// Whether any sink is configured.
    pub fn is_enabled(&self) -> bool {
        self.alertmanager.is_some() || self.webhook.is_some()
    }

    /// Every problem with the settings, each naming its field as `{prefix}.{field}`
    /// (`prefix` is where the section sits, e.g. `alerts`) and `origin` (the file).
    /// URLs are never quoted in a message: they may hold tokens.
    pub fn validate(&self, origin: &str, prefix: &str) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut bad = |field: &str, message: String| {
            errors.push(ConfigError {
                origin: origin.to_owned(),
                field: format!("{prefix}.{field}"),
                message,
            });
        };
        let timeout =
            |v: u64| (!(100..=60_000).contains(&v)).then(|| format!("{v} is outside 100..=60000"));
        if let Some(am) = &self.alertmanager {
            if let Err(m) = check_url(am.url.expose()) {
                bad("alertmanager.url", m);
            }
            if !(1..=3600).contains(&am.resend_interval_secs) {
                bad(
                    "alertmanager.resend_interval_secs",
                    format!("{} is outside 1..=3600", am.resend_interval_secs),
                );
            }
            if let Some(m) = timeout(am.timeout_ms) {
                bad("alertmanager.timeout_ms", m);
            }
            if let Some(g) = &am.generator_url
                && let Err(m) = check_url(&g.replace("{incident}", "x"))
            {
                bad("alertmanager.generator_url", m);
            }
        }
        if let Some(w) = &self.webhook {
            if let Err(m) = check_url(w.url.expose()) {
                bad("webhook.url", m);
            }
            if let Some(m) = timeout(w.timeout_ms) {
                bad("webhook.timeout_ms", m);
            }
            if !(1..=10_000).contains(&w.max_per_minute) {
                bad(
                    "webhook.max_per_minute",
                    format!("{} is outside 1..=10000", w.max_per_minute),
                );
            }
        }
        errors
    }
}

/// Why the alert sinks could not be started.
#[derive(Debug, thiserror::Error)]
pub enum AlertsError {
    /// The HTTP client for a sink could not be built (bad URL, TLS setup).
    #[error("{sink} client for {origin}: {source}")]
    Client {
        /// `alertmanager` or `webhook`.
        sink: &'static str,
        /// The URL's origin.
        origin: String,
        /// What failed.
        #[source]
        source: warden_diagnosis::llm::TransportError,
    },
}

/// What an alert needs of an incident, copied when the change is submitted.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    id: String,
    kind: IncidentKind,
    job: Option<String>,
    state: IncidentState,
    severity: Severity,
    ranks: Vec<u32>,
    nodes: Vec<String>,
    gpus: Vec<GpuRef>,
    summary: String,
    detected_at: Timestamp,
    resolved_at: Option<Timestamp>,
    diagnosis: Option<String>,
    /// The timeline's word when an isolation could not be finished.
    isolation: Option<String>,
}

impl Snapshot {
    fn of(inc: &Incident) -> Self {
        // The culprit nodes, and the nodes of culprit GPUs.
        let mut nodes = inc.nodes.clone();
        nodes.extend(inc.gpus.iter().map(|g| g.node.clone()));
        nodes.sort();
        nodes.dedup();
        Snapshot {
            id: inc.id.clone(),
            kind: inc.kind,
            job: inc.job.clone().filter(|j| !j.is_empty()),
            state: inc.state,
            severity: inc.severity,
            ranks: inc.ranks.iter().take(MAX_LISTED + 1).copied().collect(),
            nodes,
            gpus: inc.gpus.iter().take(MAX_LISTED + 1).cloned().collect(),
            summary: inc.summary.clone(),
            detected_at: inc.detected_at,
            resolved_at: inc.resolved_at,
            diagnosis: inc
                .diagnosis
                .as_ref()
                .and_then(|d| d.category.clone().or_else(|| d.fault_locus.clone())),
            isolation: inc
                .timeline
                .iter()
                .rev()
                .find(|t| t.what.starts_with("isolation interrupted"))
                .map(|t| t.what.clone()),
        }
    }

    fn resolved(&self) -> bool {
        self.state == IncidentState::Resolved
    }
}

/// One submitted change.
#[derive(Debug, Clone)]
struct Event {
    incident: Snapshot,
    change: Change,
}

/// Hands incident changes to the alert sinks without ever waiting.
#[derive(Debug, Clone)]
pub struct AlertQueue {
    alertmanager: Option<mpsc::Sender<Event>>,
    webhook: Option<mpsc::Sender<Event>>,
    metrics: Option<Arc<Metrics>>,
    /// Changes dropped so far (the log says so at 1, 2, 4, 8, ... drops).
    dropped: Arc<AtomicU64>,
}

impl AlertQueue {
    /// Queue `change` of `incident` for every sink. Never blocks: a sink whose queue is
    /// full loses the change (counted as `dropped`; Alertmanager catches up at its next
    /// re-send).
    pub fn submit(&self, incident: &Incident, change: Change) {
        let event = Event {
            incident: Snapshot::of(incident),
            change,
        };
        for (sink, tx) in [
            ("alertmanager", &self.alertmanager),
            ("webhook", &self.webhook),
        ] {
            let Some(tx) = tx else { continue };
            if tx.try_send(event.clone()).is_err() {
                count(self.metrics.as_deref(), sink, "dropped", 1);
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(sink, incident = %event.incident.id, dropped = n, "alert queue full; change dropped");
                }
            }
        }
    }

    /// [`AlertQueue::submit`] for each of `changes` (what [`Engine::tick`] returned),
    /// reading the incidents from `engine`.
    pub fn submit_changes(&self, engine: &Engine, changes: &[IncidentChange]) {
        for c in changes {
            if let Some(inc) = engine.incident(&c.id) {
                self.submit(inc, c.change);
            }
        }
    }
}

fn count(metrics: Option<&Metrics>, sink: &str, result: &str, n: u64) {
    if let Some(m) = metrics
        && n > 0
    {
        m.alerts_sent.with_label_values(&[sink, result]).inc_by(n);
    }
}

/// Start a task per configured sink on the current tokio runtime, with the wall clock.
/// `None` when nothing is configured.
pub fn start(
    config: AlertsConfig,
    metrics: Option<Arc<Metrics>>,
) -> Result<Option<AlertQueue>, AlertsError> {
    start_with_clock(config, metrics, Arc::new(SystemClock))
}

/// [`start`] with the clock that dates `endsAt` (tests).
pub fn start_with_clock(
    config: AlertsConfig,
    metrics: Option<Arc<Metrics>>,
    clock: Arc<dyn Clock>,
) -> Result<Option<AlertQueue>, AlertsError> {
    if !config.is_enabled() {
        return Ok(None);
    }
    let mut queue = AlertQueue {
        alertmanager: None,
        webhook: None,
        metrics: metrics.clone(),
        dropped: Arc::default(),
    };
    if let Some(am) = config.alertmanager {
        let url = format!("{}/api/v2/alerts", am.url.expose().trim_end_matches('/'));
        let timeout = Duration::from_millis(am.timeout_ms);
        let sink = Sink::new("alertmanager", &url, timeout, metrics.clone())?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        tracing::info!(target_url = %sink.origin, resend_interval_secs = am.resend_interval_secs, "alerts to Alertmanager on");
        let book = AmBook::new(
            Duration::from_secs(am.resend_interval_secs),
            am.generator_url,
        );
        tokio::spawn(run_alertmanager(rx, sink, book, clock.clone()));
        queue.alertmanager = Some(tx);
    }
    if let Some(w) = config.webhook {
        let timeout = Duration::from_millis(w.timeout_ms);
        let sink = Sink::new("webhook", w.url.expose(), timeout, metrics)?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        tracing::info!(target_url = %sink.origin, max_per_minute = w.max_per_minute, "alerts to a webhook on");
        let notifier = Notifier::new(w.max_per_minute, Instant::now());
        tokio::spawn(run_webhook(rx, sink, notifier));
        queue.webhook = Some(tx);
    }
    Ok(Some(queue))
}

// ---------------------------------------------------------------------------------------
// Delivery with retries.

/// One sink's client and what its deliveries need.
struct Sink {
    name: &'static str,
    origin: String,
    transport: Arc<HyperTransport>,
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
}

impl fmt::Debug for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sink")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Sink {
    fn new(
        name: &'static str,
        url: &str,
        timeout: Duration,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Sink, AlertsError> {
        let origin = SecretUrl::new(url).origin();
        let transport = HyperTransport::for_url(url, None, timeout)
            .map_err(|source| AlertsError::Client {
                sink: name,
                origin: origin.clone(),
                source,
            })?
            .with_user_agent("warden-controller");
        Ok(Sink {
            name,
            origin,
            transport: Arc::new(transport),
            timeout,
            metrics,
        })
    }

    /// Deliver `body` in a task of its own.
    fn spawn(&self, body: Bytes) -> JoinHandle<Delivery> {
        let transport = self.transport.clone();
        let (name, origin, timeout) = (self.name, self.origin.clone(), self.timeout);
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "alert.deliver",
            sink = name,
            bytes = body.len(),
            outcome = tracing::field::Empty,
        );
        tokio::spawn(
            async move {
                let d = deliver(&*transport, body, timeout, name, &origin).await;
                tracing::Span::current().record("outcome", d.label());
                d
            }
            .instrument(span),
        )
    }

    fn count(&self, result: &str, n: u64) {
        count(self.metrics.as_deref(), self.name, result, n);
    }
}

/// How a delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// A 2xx answer.
    Delivered,
    /// An answer that retrying would not change (4xx other than 429).
    Refused(u16),
    /// Every attempt failed (connection, timeout, 429, 5xx).
    GaveUp,
}

impl Delivery {
    /// The outcome in a word (trace attribute).
    fn label(self) -> &'static str {
        match self {
            Delivery::Delivered => "delivered",
            Delivery::Refused(_) => "refused",
            Delivery::GaveUp => "gave_up",
        }
    }
}

/// The wait between attempts: from [`BACKOFF_BASE`], doubling, never over
/// [`BACKOFF_MAX`] (`Retry-After` included).
const BACKOFF: warden_http::Backoff = warden_http::Backoff::new(BACKOFF_BASE, BACKOFF_MAX);

/// The wait before retry number `attempt` (0 = the first retry): `BACKOFF_BASE · 2^attempt`
/// scaled by a jitter in [50 %, 100 %] (`unit` in [0, 1]), or the server's `Retry-After`
/// when longer; never over [`BACKOFF_MAX`].
fn backoff(attempt: u32, unit: f64, retry_after_secs: Option<u64>) -> Duration {
    BACKOFF.delay(attempt, unit, retry_after_secs.map(Duration::from_secs))
}

/// POST `body` through `transport`, retrying what may pass later.
async fn deliver(
    transport: &dyn ChatTransport,
    body: Bytes,
    timeout: Duration,
    sink: &'static str,
    origin: &str,
) -> Delivery {
    let seed = SystemClock.now().0 as u64 ^ u64::from(std::process::id());
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut last = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        let mut retry_after = None;
        match tokio::time::timeout(timeout, transport.post(body.clone())).await {
            Ok(Ok(r)) if (200..300).contains(&r.status) => return Delivery::Delivered,
            Ok(Ok(r)) if r.status == 429 || r.status >= 500 => {
                last = format!("answered {}", r.status);
                retry_after = r.retry_after_secs;
            }
            Ok(Ok(r)) => {
                let text = String::from_utf8_lossy(&r.body);
                let excerpt: String = text.chars().take(MAX_BODY_EXCERPT).collect();
                tracing::warn!(sink, target_url = origin, status = r.status, body = %excerpt, "alert refused; not retried");
                return Delivery::Refused(r.status);
            }
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = format!("no answer within {} ms", timeout.as_millis()),
        }
        tracing::debug!(sink, target_url = origin, attempt, error = %last, "alert delivery failed");
        if attempt + 1 < MAX_ATTEMPTS {
            tokio::time::sleep(backoff(attempt, rng.random::<f64>(), retry_after)).await;
        }
    }
    tracing::warn!(
        sink,
        target_url = origin,
        attempts = MAX_ATTEMPTS,
        error = %last,
        "alert not delivered; given up"
    );
    Delivery::GaveUp
}

/// Wait for `task` if there is one; never completes otherwise.
async fn join(task: &mut Option<JoinHandle<Delivery>>) -> Delivery {
    match task {
        Some(t) => {
            let out = t.await.unwrap_or(Delivery::GaveUp);
            *task = None;
            out
        }
        None => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------------------
// Alertmanager.

/// One alert as Alertmanager's API v2 takes it (`postableAlert`).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct PostableAlert {
    labels: BTreeMap<&'static str, String>,
    annotations: BTreeMap<&'static str, String>,
    #[serde(rename = "startsAt")]
    starts_at: String,
    #[serde(rename = "endsAt")]
    ends_at: String,
    #[serde(rename = "generatorURL", skip_serializing_if = "Option::is_none")]
    generator_url: Option<String>,
}

/// The labels that identify an incident's alert.
fn alert_labels(s: &Snapshot) -> BTreeMap<&'static str, String> {
    let mut l = BTreeMap::new();
    l.insert("alertname", "WardenIncident".to_owned());
    l.insert("kind", s.kind.as_str().to_owned());
    if let Some(job) = &s.job {
        l.insert("job", job.clone());
    }
    if !s.nodes.is_empty() {
        let mut v = s
            .nodes
            .iter()
            .take(MAX_NODES_IN_LABEL)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",");
        if s.nodes.len() > MAX_NODES_IN_LABEL {
            v.push_str(&format!(",+{} more", s.nodes.len() - MAX_NODES_IN_LABEL));
        }
        l.insert("node", v);
    }
    l.insert("severity", s.severity.as_str().to_owned());
    l.insert("incident", s.id.clone());
    l
}

/// The annotations: the summary, and the culprit ranks, GPUs and diagnosis when known.
fn alert_annotations(s: &Snapshot) -> BTreeMap<&'static str, String> {
    let mut a = BTreeMap::new();
    a.insert("summary", s.summary.clone());
    if !s.ranks.is_empty() {
        a.insert("ranks", list_ranks(&s.ranks));
    }
    if !s.gpus.is_empty() {
        a.insert("gpus", list_gpus(&s.gpus));
    }
    if let Some(d) = &s.diagnosis {
        a.insert("diagnosis", d.clone());
    }
    if let Some(i) = &s.isolation {
        a.insert("isolation", i.clone());
    }
    a
}

/// Ranks as `0-3,7`, at most [`MAX_LISTED`] of them (`…` when there were more).
fn list_ranks(ranks: &[u32]) -> String {
    let mut out = String::new();
    let shown = &ranks[..ranks.len().min(MAX_LISTED)];
    let mut i = 0;
    while i < shown.len() {
        let mut j = i;
        while j + 1 < shown.len() && shown[j + 1] == shown[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j > i + 1 {
            out.push_str(&format!("{}-{}", shown[i], shown[j]));
        } else {
            out.push_str(&shown[i].to_string());
            if j == i + 1 {
                out.push_str(&format!(",{}", shown[j]));
            }
        }
        i = j + 1;
    }
    if ranks.len() > MAX_LISTED {
        out.push_str(",…");
    }
    out
}

fn list_gpus(gpus: &[GpuRef]) -> String {
    let mut out = gpus
        .iter()
        .take(MAX_LISTED)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if gpus.len() > MAX_LISTED {
        out.push_str(", …");
    }
    out
}

/// `t` as RFC 3339 in UTC with nanoseconds (`2024-05-01T12:00:00.000000001Z`).
pub(crate) fn rfc3339(t: Timestamp) -> String {
    let ns = t.0;
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// One incident's alert as the sink knows it.
#[derive(Debug, Clone)]
struct AmAlert {
    labels: BTreeMap<&'static str, String>,
    annotations: BTreeMap<&'static str, String>,
    starts_at: Timestamp,
    resolved_at: Option<Timestamp>,
    /// Bumped by every change, so a send's result is matched to what it sent.
    version: u64,
    /// When it was last sent (or tried).
    last_sent: Option<Instant>,
    /// Send it at the next pass, whatever the interval says.
    urgent: bool,
}

/// What one POST carried, to settle when it comes back.
#[derive(Debug, Default)]
struct Sent {
    /// (incident, version) of tracked alerts sent.
    alerts: Vec<(String, u64)>,
    /// Alerts in the POST, retired label sets included.
    count: u64,
}

/// Every live incident's alert, and when each is due.
#[derive(Debug)]
struct AmBook {
    resend: Duration,
    generator_url: Option<String>,
    alerts: BTreeMap<String, AmAlert>,
    /// Label sets an incident no longer has (culprit or kind revised): sent once as
    /// resolved.
    retired: Vec<AmAlert>,
    next_version: u64,
}

impl AmBook {
    fn new(resend: Duration, generator_url: Option<String>) -> Self {
        AmBook {
            resend,
            generator_url,
            alerts: BTreeMap::new(),
            retired: Vec::new(),
            next_version: 0,
        }
    }

    /// Take a change in at `wall` (controller clock).
    fn apply(&mut self, ev: &Event, wall: Timestamp) {
        let s = &ev.incident;
        self.next_version += 1;
        let version = self.next_version;
        let labels = alert_labels(s);
        let annotations = alert_annotations(s);
        let resolved_at = s.resolved().then(|| s.resolved_at.unwrap_or(wall));
        match self.alerts.get_mut(&s.id) {
            None => {
                self.alerts.insert(
                    s.id.clone(),
                    AmAlert {
                        labels,
                        annotations,
                        starts_at: s.detected_at,
                        resolved_at,
                        version,
                        last_sent: None,
                        urgent: true,
                    },
                );
            }
            Some(a) => {
                if a.labels != labels {
                    // A new identity for Alertmanager: resolve the old one now.
                    let mut old = a.clone();
                    old.resolved_at = Some(wall);
                    self.retired.push(old);
                    a.labels = labels;
                    a.urgent = true;
                }
                if a.resolved_at.is_some() != resolved_at.is_some() {
                    a.urgent = true; // resolved, or reopened
                }
                if matches!(ev.change, Change::Opened | Change::Reclassified) {
                    a.urgent = true;
                }
                a.annotations = annotations;
                a.starts_at = s.detected_at;
                a.resolved_at = resolved_at;
                a.version = version;
            }
        }
    }

    /// When the next alert is due (`None`: nothing to send).
    fn next_due(&self) -> Option<Instant> {
        if !self.retired.is_empty() {
            return Some(Instant::now());
        }
        self.alerts
            .values()
            .map(|a| match a.last_sent {
                Some(t) if !a.urgent => t + self.resend,
                _ => Instant::now(),
            })
            .min()
    }

    /// Every alert due at `now`, as the body to POST (wall time `wall`), and what it
    /// carries. `None` when nothing is due.
    fn take_due(&mut self, now: Instant, wall: Timestamp) -> Option<(Vec<PostableAlert>, Sent)> {
        let ends = wall.plus_secs(self.resend.as_secs_f64() * f64::from(ENDS_AT_INTERVALS));
        let mut out = Vec::new();
        let mut sent = Sent::default();
        let retired = std::mem::take(&mut self.retired);
        for a in &retired {
            out.push(self.postable(a, ends));
        }
        for (id, a) in &mut self.alerts {
            if out.len() + sent.alerts.len() >= MAX_ALERTS_PER_POST {
                break;
            }
            let due = a.urgent || a.last_sent.is_none_or(|t| now >= t + self.resend);
            if !due {
                continue;
            }
            a.urgent = false;
            sent.alerts.push((id.clone(), a.version));
        }
        for (id, _) in &sent.alerts {
            if let Some(a) = self.alerts.get(id) {
                out.push(self.postable(a, ends));
            }
        }
        sent.count = out.len() as u64;
        (!out.is_empty()).then_some((out, sent))
    }

    fn postable(&self, a: &AmAlert, ends_if_firing: Timestamp) -> PostableAlert {
        let generator_url = self.generator_url.as_ref().map(|g| {
            let id = a.labels.get("incident").map_or("", String::as_str);
            g.replace("{incident}", id)
        });
        PostableAlert {
            labels: a.labels.clone(),
            annotations: a.annotations.clone(),
            starts_at: rfc3339(a.starts_at),
            ends_at: rfc3339(a.resolved_at.unwrap_or(ends_if_firing)),
            generator_url,
        }
    }

    /// Settle a POST: resolved alerts it carried are done (delivered or given up: a
    /// firing alert left behind expires at its `endsAt`), firing ones wait an interval.
    fn settle(&mut self, sent: &Sent, now: Instant) {
        for (id, version) in &sent.alerts {
            let Some(a) = self.alerts.get_mut(id) else {
                continue;
            };
            if a.version == *version && a.resolved_at.is_some() {
                self.alerts.remove(id);
            } else {
                a.last_sent = Some(now);
            }
        }
    }
}

async fn run_alertmanager(
    mut rx: mpsc::Receiver<Event>,
    sink: Sink,
    mut book: AmBook,
    clock: Arc<dyn Clock>,
) {
    let mut in_flight: Option<JoinHandle<Delivery>> = None;
    let mut sent = Sent::default();
    let mut closed = false;
    loop {
        if closed && in_flight.is_none() {
            return;
        }
        let due = book.next_due().filter(|_| in_flight.is_none());
        tokio::select! {
            ev = rx.recv(), if !closed => match ev {
                Some(ev) => book.apply(&ev, clock.now()),
                None => closed = true,
            },
            done = join(&mut in_flight) => {
                let result = match done {
                    Delivery::Delivered => "ok",
                    Delivery::Refused(_) | Delivery::GaveUp => "error",
                };
                sink.count(result, sent.count);
                book.settle(&sent, Instant::now());
            }
            () = sleep_until(due), if due.is_some() => {
                if let Some((alerts, what)) = book.take_due(Instant::now(), clock.now()) {
                    match serde_json::to_vec(&alerts) {
                        Ok(body) => {
                            sent = what;
                            in_flight = Some(sink.spawn(Bytes::from(body)));
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "cannot encode alerts");
                            sink.count("error", what.count);
                            book.settle(&what, Instant::now());
                        }
                    }
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

// ---------------------------------------------------------------------------------------
// Webhook.

/// A token bucket: `capacity` messages at once, refilled at `capacity` per minute.
#[derive(Debug)]
struct Limiter {
    capacity: f64,
    tokens: f64,
    last: Instant,
    /// Messages suppressed since the last one that went out.
    suppressed: u64,
}

impl Limiter {
    fn new(max_per_minute: u32, now: Instant) -> Self {
        let capacity = f64::from(max_per_minute.max(1));
        Limiter {
            capacity,
            tokens: capacity,
            last: now,
            suppressed: 0,
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + secs * self.capacity / 60.0).min(self.capacity);
        self.last = now;
    }

    /// Take a token for a message at `now`: `Some(n)` with the number of messages
    /// suppressed before it (now reported), or `None` when it is suppressed itself.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self.take(now) {
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    /// Take a token at `now`, if there is one.
    fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        // Refills are sums of float fractions: a hair short of one counts as one.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// When a token is next available, if messages were suppressed (`None` otherwise).
    fn digest_due(&self) -> Option<Instant> {
        (self.suppressed > 0).then(|| {
            let missing = (1.0 - self.tokens).max(0.0);
            self.last + Duration::from_secs_f64(missing * 60.0 / self.capacity)
        })
    }
}

/// The JSON body of one webhook message.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Message {
    /// What Slack shows.
    text: String,
    /// `opened`, `reopened`, `reclassified`, `resolved`, or `suppressed` (a digest).
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    incident: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    severity: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<String>,
    nodes: Vec<String>,
    ranks: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<String>,
    /// Messages suppressed by the rate limit since the previous one.
    suppressed: u64,
}

/// What a change means for the webhook.
#[derive(Debug, Clone, PartialEq)]
enum Notice {
    /// Post this.
    Send(Message),
    /// Nothing worth a message (evidence, a diagnosis, a repeat).
    Quiet,
    /// Worth a message, but over the rate limit.
    Suppressed,
}

/// The webhook's half of the work that is not IO: which transition deserves a message,
/// and the rate limit.
#[derive(Debug)]
struct Notifier {
    limiter: Limiter,
    max_per_minute: u32,
    /// Incidents seen: whether each was last notified as resolved, and when.
    seen: HashMap<String, Option<Instant>>,
}

impl Notifier {
    fn new(max_per_minute: u32, now: Instant) -> Self {
        Notifier {
            limiter: Limiter::new(max_per_minute, now),
            max_per_minute,
            seen: HashMap::new(),
        }
    }

    /// The transition `ev` is, if it deserves a message.
    fn transition(&mut self, ev: &Event, now: Instant) -> Option<&'static str> {
        let s = &ev.incident;
        let before = self.seen.get(&s.id).copied();
        let state = if s.resolved() {
            match before {
                Some(Some(_)) => None, // already said
                _ => Some("resolved"),
            }
        } else {
            match (ev.change, before) {
                (Change::Reclassified, _) => Some("reclassified"),
                (_, Some(Some(_))) => Some("reopened"),
                (_, None) => Some("opened"), // Opened, or a change whose opening was lost
                (_, Some(None)) => None,     // evidence, diagnosis: no message
            }
        };
        self.seen.insert(s.id.clone(), s.resolved().then_some(now));
        if self.seen.len() > MAX_REMEMBERED {
            self.forget_oldest_resolved();
        }
        state
    }

    fn forget_oldest_resolved(&mut self) {
        let oldest = self
            .seen
            .iter()
            .filter_map(|(id, at)| at.map(|t| (t, id.clone())))
            .min();
        if let Some((_, id)) = oldest {
            self.seen.remove(&id);
        }
    }

    /// What to post for `ev` at `now`.
    fn message(&mut self, ev: &Event, now: Instant) -> Notice {
        let Some(state) = self.transition(ev, now) else {
            return Notice::Quiet;
        };
        match self.limiter.admit(now) {
            Some(suppressed) => Notice::Send(incident_message(&ev.incident, state, suppressed)),
            None => Notice::Suppressed,
        }
    }

    /// A digest of suppressed messages, if one is due at `now` and the bucket allows.
    fn digest(&mut self, now: Instant) -> Option<Message> {
        if self.limiter.suppressed == 0 {
            return None;
        }
        if !self.limiter.take(now) {
            return None;
        }
        let n = std::mem::take(&mut self.limiter.suppressed);
        Some(Message {
            text: format!(
                "Warden suppressed {n} incident message{} (rate limit: {} per minute); \
                 see the incident list for all of them",
                if n == 1 { "" } else { "s" },
                self.max_per_minute
            ),
            state: "suppressed",
            incident: None,
            kind: None,
            severity: None,
            job: None,
            nodes: Vec::new(),
            ranks: Vec::new(),
            summary: None,
            suppressed: n,
        })
    }
}

fn incident_message(s: &Snapshot, state: &'static str, suppressed: u64) -> Message {
    let mut text = format!("[{}] {} {}", s.severity.as_str(), s.kind.as_str(), state);
    if let Some(job) = &s.job {
        text.push_str(&format!(" in job {job}"));
    }
    if !s.nodes.is_empty() {
        let shown: Vec<&str> = s
            .nodes
            .iter()
            .take(MAX_NODES_IN_LABEL)
            .map(String::as_str)
            .collect();
        text.push_str(&format!(" on {}", shown.join(", ")));
        if s.nodes.len() > MAX_NODES_IN_LABEL {
            text.push_str(&format!(" and {} more", s.nodes.len() - MAX_NODES_IN_LABEL));
        }
    }
    text.push_str(&format!(": {} (incident {})", s.summary, s.id));
    if state == "resolved"
        && let Some(at) = s.resolved_at
    {
        let secs = at.secs_since(s.detected_at).max(0.0);
        text.push_str(&format!(
            ", after {}",
            humantime::format_duration(Duration::from_secs(secs as u64),)
        ));
    }
    if suppressed > 0 {
        text.push_str(&format!(
            " [{suppressed} earlier message{} suppressed by the rate limit]",
            if suppressed == 1 { "" } else { "s" }
        ));
    }
    Message {
        text,
        state,
        incident: Some(s.id.clone()),
        kind: Some(s.kind.as_str()),
        severity: Some(s.severity.as_str()),
        job: s.job.clone(),
        nodes: s.nodes.clone(),
        ranks: s.ranks.iter().take(MAX_LISTED).copied().collect(),
        summary: Some(s.summary.clone()),
        suppressed,
    }
}

async fn run_webhook(mut rx: mpsc::Receiver<Event>, sink: Sink, mut notifier: Notifier) {
    let mut pending: VecDeque<Message> = VecDeque::new();
    let mut in_flight: Option<JoinHandle<Delivery>> = None;
    let mut closed = false;
    loop {
        if in_flight.is_none() {
            while let Some(m) = pending.pop_front() {
                match serde_json::to_vec(&m) {
                    Ok(body) => {
                        in_flight = Some(sink.spawn(Bytes::from(body)));
                        break;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot encode a webhook message");
                        sink.count("error", 1);
                    }
                }
            }
        }
        if closed && in_flight.is_none() {
            return;
        }
        let digest = notifier.limiter.digest_due();
        let push = |m: Message, pending: &mut VecDeque<Message>| {
            pending.push_back(m);
            if pending.len() > MAX_PENDING_MESSAGES {
                pending.pop_front();
                sink.count("dropped", 1);
            }
        };
        tokio::select! {
            ev = rx.recv(), if !closed => match ev {
                Some(ev) => match notifier.message(&ev, Instant::now()) {
                    Notice::Send(m) => push(m, &mut pending),
                    Notice::Quiet => {}
                    Notice::Suppressed => sink.count("suppressed", 1),
                },
                None => closed = true,
            },
            done = join(&mut in_flight) => {
                let result = match done {
                    Delivery::Delivered => "ok",
                    Delivery::Refused(_) | Delivery::GaveUp => "error",
                };
                sink.count(result, 1);
            }
            () = sleep_until(digest), if digest.is_some() && !closed => {
                if let Some(m) = notifier.digest(Instant::now()) {
                    push(m, &mut pending);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(id: &str) -> Snapshot {
        Snapshot {
            id: id.to_owned(),
            kind: IncidentKind::Hang,
            job: Some("llama".to_owned()),
            state: IncidentState::Open,
            severity: Severity::Critical,
            ranks: vec![0, 1, 2, 3, 7],
            nodes: vec!["gpu-01".to_owned(), "gpu-02".to_owned()],
            gpus: vec![],
            summary: "ranks 0-3 and 7 never entered all-reduce #12".to_owned(),
            detected_at: Timestamp::from_secs_f64(1_700_000_000.0),
            resolved_at: None,
            diagnosis: None,
            isolation: None,
        }
    }

    #[test]
    fn an_isolation_that_could_not_be_finished_is_said_in_the_alert() {
        let mut s = snapshot("inc-1");
        assert!(!alert_annotations(&s).contains_key("isolation"));
        s.isolation = Some("isolation interrupted: drain gpu-01 could not be finished".into());
        assert_eq!(
            alert_annotations(&s)["isolation"],
            "isolation interrupted: drain gpu-01 could not be finished"
        );
    }

    fn ev(s: &Snapshot, change: Change) -> Event {
        Event {
            incident: s.clone(),
            change,
        }
    }

    #[test]
    fn labels_name_the_incident_and_omit_what_is_unknown() {
        let s = snapshot("inc-1");
        let l = alert_labels(&s);
        let want: BTreeMap<&str, String> = [
            ("alertname", "WardenIncident"),
            ("kind", "hang"),
            ("job", "llama"),
            ("node", "gpu-01,gpu-02"),
            ("severity", "critical"),
            ("incident", "inc-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        assert_eq!(l, want);

        let mut bare = snapshot("inc-2");
        bare.job = None;
        bare.nodes.clear();
        let l = alert_labels(&bare);
        assert!(!l.contains_key("job") && !l.contains_key("node"), "{l:?}");

        let a = alert_annotations(&s);
        assert_eq!(a.get("ranks").map(String::as_str), Some("0-3,7"));
        assert!(!a.contains_key("gpus"));
    }

    #[test]
    fn an_empty_job_name_is_no_job_label() {
        let mut inc = Incident {
            id: "inc-9".into(),
            kind: IncidentKind::GpuFault,
            job: Some(String::new()),
            state: IncidentState::Open,
            acknowledged: false,
            severity: Severity::Critical,
            ranks: vec![],
            nodes: vec![],
            gpus: vec![GpuRef {
                node: "gpu-09".into(),
                index: 3,
            }],
            onset: Timestamp(0),
            detected_at: Timestamp(0),
            updated_at: Timestamp(0),
            resolved_at: None,
            confidence: 1.0,
            summary: "XID 79".into(),
            evidence: vec![],
            finding_count: 1,
            timeline: vec![],
            diagnosis: None,
        };
        let l = alert_labels(&Snapshot::of(&inc));
        assert!(!l.contains_key("job"));
        assert_eq!(
            l.get("node").map(String::as_str),
            Some("gpu-09"),
            "GPU's node"
        );
        inc.job = None;
        let a = alert_annotations(&Snapshot::of(&inc));
        assert_eq!(a.get("gpus").map(String::as_str), Some("gpu-09 gpu 3"));
    }

    #[test]
    fn many_nodes_and_ranks_are_cut() {
        let mut s = snapshot("inc-1");
        s.nodes = (0..40).map(|i| format!("n{i:02}")).collect();
        let node = alert_labels(&s).remove("node").expect("node label");
        assert!(node.ends_with(",+24 more"), "{node}");
        let ranks: Vec<u32> = (0..100).step_by(2).collect();
        assert!(list_ranks(&ranks).ends_with(",…"));
        assert_eq!(list_ranks(&[1, 2, 5, 6, 7]), "1,2,5-7");
    }

    #[test]
    fn rfc3339_is_utc_with_nanoseconds() {
        assert_eq!(rfc3339(Timestamp(0)), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339(Timestamp(1_709_251_199_000_000_001)),
            "2024-02-29T23:59:59.000000001Z"
        );
        assert_eq!(
            rfc3339(Timestamp(951_782_400_000_000_000)),
            "2000-02-29T00:00:00.000000000Z"
        );
    }

    fn book() -> AmBook {
        AmBook::new(
            Duration::from_secs(60),
            Some("http://warden:9460/api/v1/incidents/{incident}".into()),
        )
    }

    #[test]
    fn a_firing_alert_ends_four_intervals_ahead_and_a_resolved_one_at_its_resolution() {
        let mut b = book();
        let s = snapshot("inc-1");
        let wall = s.detected_at.plus_secs(5.0);
        b.apply(&ev(&s, Change::Opened), wall);
        let now = Instant::now();
        let (alerts, sent) = b.take_due(now, wall).expect("due at once");
        assert_eq!(alerts.len(), 1);
        let a = &alerts[0];
        assert_eq!(a.starts_at, rfc3339(s.detected_at));
        assert_eq!(a.ends_at, rfc3339(wall.plus_secs(240.0)));
        assert_eq!(
            a.generator_url.as_deref(),
            Some("http://warden:9460/api/v1/incidents/inc-1")
        );
        let json = serde_json::to_value(a).expect("json");
        assert!(json.get("startsAt").is_some() && json.get("generatorURL").is_some());
        b.settle(&sent, now);

        // Not due again before the interval; due after it.
        assert!(b.take_due(now + Duration::from_secs(59), wall).is_none());
        let later = wall.plus_secs(60.0);
        let (alerts, sent) = b
            .take_due(now + Duration::from_secs(60), later)
            .expect("re-sent");
        assert_eq!(alerts[0].ends_at, rfc3339(later.plus_secs(240.0)));
        b.settle(&sent, now + Duration::from_secs(60));

        // Resolution: sent at once with endsAt = the resolution time, then forgotten.
        let mut r = s.clone();
        r.state = IncidentState::Resolved;
        r.resolved_at = Some(s.detected_at.plus_secs(70.0));
        b.apply(&ev(&r, Change::Resolved), later.plus_secs(10.0));
        let t = now + Duration::from_secs(61);
        let (alerts, sent) = b.take_due(t, later).expect("resolution due");
        assert_eq!(alerts[0].ends_at, rfc3339(s.detected_at.plus_secs(70.0)));
        b.settle(&sent, t);
        assert!(b.alerts.is_empty() && b.next_due().is_none());
    }

    #[test]
    fn evidence_updates_wait_for_the_interval_but_new_labels_resolve_the_old_set() {
        let mut b = book();
        let s = snapshot("inc-1");
        let wall = s.detected_at;
        b.apply(&ev(&s, Change::Opened), wall);
        let now = Instant::now();
        let (_, sent) = b.take_due(now, wall).expect("due");
        b.settle(&sent, now);

        let mut more = s.clone();
        more.summary = "more evidence".into();
        b.apply(&ev(&more, Change::Updated), wall);
        assert!(
            b.take_due(now, wall).is_none(),
            "an update alone sends nothing"
        );

        let mut moved = more.clone();
        moved.nodes = vec!["gpu-03".into()];
        b.apply(&ev(&moved, Change::Updated), wall.plus_secs(1.0));
        let (alerts, sent) = b.take_due(now, wall.plus_secs(1.0)).expect("due");
        assert_eq!(alerts.len(), 2, "old label set resolved, new one firing");
        assert_eq!(alerts[0].labels["node"], "gpu-01,gpu-02");
        assert_eq!(alerts[0].ends_at, rfc3339(wall.plus_secs(1.0)));
        assert_eq!(alerts[1].labels["node"], "gpu-03");
        assert_eq!(alerts[1].annotations["summary"], "more evidence");
        assert_eq!(sent.count, 2);
    }

    #[test]
    fn a_change_during_a_send_is_not_lost() {
        let mut b = book();
        let s = snapshot("inc-1");
        b.apply(&ev(&s, Change::Opened), s.detected_at);
        let now = Instant::now();
        let (_, sent) = b.take_due(now, s.detected_at).expect("due");
        let mut r = s.clone();
        r.state = IncidentState::Resolved;
        r.resolved_at = Some(s.detected_at.plus_secs(3.0));
        b.apply(&ev(&r, Change::Resolved), s.detected_at.plus_secs(3.0));
        b.settle(&sent, now); // the firing send comes back after the resolution
        let (alerts, _) = b
            .take_due(now, s.detected_at)
            .expect("resolution still due");
        assert_eq!(alerts[0].ends_at, rfc3339(s.detected_at.plus_secs(3.0)));
    }

    #[test]
    fn one_post_carries_every_due_alert() {
        let mut b = book();
        for i in 0..7 {
            let s = snapshot(&format!("inc-{i}"));
            b.apply(&ev(&s, Change::Opened), s.detected_at);
        }
        let (alerts, sent) = b.take_due(Instant::now(), Timestamp(0)).expect("due");
        assert_eq!((alerts.len(), sent.count), (7, 7));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_one_per_period_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut l = Limiter::new(6, t0); // one token per 10 s
        for _ in 0..6 {
            assert_eq!(l.admit(t0), Some(0));
        }
        assert_eq!(l.admit(t0), None);
        assert_eq!(l.admit(t0 + Duration::from_secs(5)), None);
        assert_eq!(l.suppressed, 2);
        let due = l.digest_due().expect("a digest is due");
        assert_eq!(due, t0 + Duration::from_secs(10));
        assert_eq!(
            l.admit(t0 + Duration::from_secs(10)),
            Some(2),
            "reports them"
        );
        assert_eq!(l.suppressed, 0);
        assert!(l.digest_due().is_none());
    }

    #[test]
    fn the_webhook_speaks_once_per_transition() {
        let t = Instant::now();
        let mut n = Notifier::new(100, t);
        let s = snapshot("inc-1");
        let state = |n: &mut Notifier, s: &Snapshot, c| match n.message(&ev(s, c), t) {
            Notice::Send(m) => Some(m.state),
            Notice::Quiet => None,
            Notice::Suppressed => panic!("rate-limited"),
        };
        assert_eq!(state(&mut n, &s, Change::Opened), Some("opened"));
        assert_eq!(state(&mut n, &s, Change::Updated), None);
        assert_eq!(state(&mut n, &s, Change::Diagnosed), None);
        assert_eq!(
            state(&mut n, &s, Change::Reclassified),
            Some("reclassified")
        );
        let mut r = s.clone();
        r.state = IncidentState::Resolved;
        r.resolved_at = Some(s.detected_at.plus_secs(125.0));
        let Notice::Send(m) = n.message(&ev(&r, Change::Resolved), t) else {
            panic!("a message");
        };
        assert_eq!(m.state, "resolved");
        assert!(m.text.contains("after 2m 5s"), "{}", m.text);
        assert_eq!(state(&mut n, &r, Change::Updated), None);
        assert_eq!(state(&mut n, &s, Change::Updated), Some("reopened"));
        // A change whose opening was lost still opens it.
        assert_eq!(
            state(&mut n, &snapshot("inc-2"), Change::Updated),
            Some("opened")
        );
    }

    #[test]
    fn a_storm_is_suppressed_and_the_count_reported_later() {
        let t = Instant::now();
        let mut n = Notifier::new(3, t);
        let mut sent = 0;
        let mut suppressed = 0;
        for i in 0..10 {
            match n.message(&ev(&snapshot(&format!("inc-{i}")), Change::Opened), t) {
                Notice::Send(_) => sent += 1,
                Notice::Quiet => panic!("every opening deserves a message"),
                Notice::Suppressed => suppressed += 1,
            }
        }
        assert_eq!((sent, suppressed), (3, 7));
        assert!(n.digest(t).is_none(), "no token yet");
        let due = n.limiter.digest_due().expect("due");
        assert_eq!(due, t + Duration::from_secs(20));
        let d = n.digest(due).expect("digest");
        assert_eq!((d.state, d.suppressed), ("suppressed", 7));
        assert!(
            d.text.contains("suppressed 7 incident messages"),
            "{}",
            d.text
        );
        let json = serde_json::to_value(&d).expect("json");
        assert!(json.get("incident").is_none());
    }

    #[test]
    fn backoff_doubles_with_jitter_and_stays_bounded() {
        for attempt in 0..20 {
            let exp = BACKOFF_BASE
                .saturating_mul(1 << attempt.min(16))
                .min(BACKOFF_MAX);
            let lo = backoff(attempt, 0.0, None);
            let hi = backoff(attempt, 1.0, None);
            assert_eq!(lo, exp / 2);
            assert_eq!(hi, exp);
            assert!(backoff(attempt, 0.37, None) <= BACKOFF_MAX);
        }
        assert_eq!(backoff(0, 0.0, Some(3)), Duration::from_secs(3));
        assert_eq!(backoff(0, 0.0, Some(3600)), BACKOFF_MAX);
        // Every retry of one delivery together stays well under a minute.
        let total: Duration = (0..MAX_ATTEMPTS - 1).map(|a| backoff(a, 1.0, None)).sum();
        assert!(total <= Duration::from_secs(5), "{total:?}");
    }

    #[test]
    fn validation_names_each_bad_field_and_never_quotes_a_url() {
        let cfg = AlertsConfig {
            alertmanager: Some(AlertmanagerConfig {
                url: SecretUrl::new("ftp://am"),
                resend_interval_secs: 0,
                timeout_ms: 10,
                generator_url: Some("/relative/{incident}".into()),
            }),
            webhook: Some(WebhookConfig {
                url: SecretUrl::new("hooks.slack.com/services/T0/B0/SECRET"),
                timeout_ms: 5000,
                max_per_minute: 0,
            }),
        };
        let errs = cfg.validate("c.yaml", "alerts");
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "alerts.alertmanager.url",
                "alerts.alertmanager.resend_interval_secs",
                "alerts.alertmanager.timeout_ms",
                "alerts.alertmanager.generator_url",
                "alerts.webhook.url",
                "alerts.webhook.max_per_minute",
            ]
        );
        assert!(errs.iter().all(|e| e.origin == "c.yaml"));
        let text = format!("{errs:?}");
        assert!(!text.contains("SECRET"), "{text}");
        assert!(
            AlertsConfig::default()
                .validate("c.yaml", "alerts")
                .is_empty()
        );
    }

    #[test]
    fn config_parses_with_defaults_and_rejects_unknown_fields() {
        let cfg: AlertsConfig = warden_model::yaml::from_str(
            "alertmanager:\n  url: http://am:9093\nwebhook:\n  url: https://hooks.slack.com/services/T/B/SECRET\n",
        )
        .expect("valid");
        let am = cfg.alertmanager.as_ref().expect("alertmanager");
        assert_eq!(am.resend_interval_secs, DEFAULT_RESEND_INTERVAL_SECS);
        assert_eq!(am.timeout_ms, DEFAULT_TIMEOUT_MS);
        let w = cfg.webhook.as_ref().expect("webhook");
        assert_eq!(w.max_per_minute, DEFAULT_MAX_PER_MINUTE);
        assert!(cfg.validate("", "alerts").is_empty());
        let debug = format!("{cfg:?}");
        assert!(
            !debug.contains("SECRET") && debug.contains("https://hooks.slack.com"),
            "{debug}"
        );
        assert!(
            warden_model::yaml::from_str::<AlertsConfig>("webhook:\n  url: http://x\n  rate: 1\n")
                .is_err()
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let metrics = Arc::new(Metrics::new("test").expect("metrics"));
        let (tx, _rx) = mpsc::channel(2);
        let q = AlertQueue {
            alertmanager: None,
            webhook: Some(tx),
            metrics: Some(metrics.clone()),
            dropped: Arc::default(),
        };
        let inc = Incident {
            id: "inc-1".into(),
            kind: IncidentKind::Crash,
            job: None,
            state: IncidentState::Open,
            acknowledged: false,
            severity: Severity::Critical,
            ranks: vec![3],
            nodes: vec![],
            gpus: vec![],
            onset: Timestamp(0),
            detected_at: Timestamp(0),
            updated_at: Timestamp(0),
            resolved_at: None,
            confidence: 1.0,
            summary: "rank 3 exited with signal 9".into(),
            evidence: vec![],
            finding_count: 1,
            timeline: vec![],
            diagnosis: None,
        };
        for _ in 0..5 {
            q.submit(&inc, Change::Updated);
        }
        let dropped = metrics
            .alerts_sent
            .with_label_values(&["webhook", "dropped"])
            .get();
        assert_eq!(dropped, 3);
    }

    #[tokio::test]
    async fn nothing_configured_starts_nothing() {
        assert!(
            start(AlertsConfig::default(), None)
                .expect("no client to build")
                .is_none()
        );
    }
}
