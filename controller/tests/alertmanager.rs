//! Incident alerts against real receivers: the real Prometheus Alertmanager (Debian's
//! `prometheus-alertmanager`, on a free port with its own storage and no clustering)
//! routing to a webhook receiver inside the test, and the webhook sink against a local
//! server that fails before it answers, and under a storm of incidents.
//!
//! `ALERTMANAGER` names another binary. Under `CI=true` a missing Alertmanager fails the
//! test (scripts/test installs it); elsewhere the test says so and passes.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::Value;
use tokio::sync::mpsc;
use warden_controller::alerts::{self, AlertmanagerConfig, AlertsConfig, SecretUrl, WebhookConfig};
use warden_controller::metrics::Metrics;
use warden_engine::{Change, Clock, SystemClock};
use warden_model::{Incident, IncidentState};
use warden_testkit::{PATIENCE, scaled, wait_for_async};

/// Longest wait for one notification (Alertmanager groups for a second, then sends),
/// scaled by `WARDEN_TEST_PATIENCE`.
fn wait() -> Duration {
    scaled(PATIENCE)
}

/// Everything the controller's code logs in this test binary, from debug level up.
fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buf
    })
    .clone()
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The Alertmanager binary, or `None` (with advice) outside CI when it is missing.
fn alertmanager_bin() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("ALERTMANAGER") {
        Some(b) => vec![b.into()],
        None => vec![
            "/usr/bin/prometheus-alertmanager".into(),
            "prometheus-alertmanager".into(),
            "alertmanager".into(),
        ],
    };
    for bin in candidates {
        let works = Command::new(&bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if works {
            return Some(bin);
        }
    }
    let hint = "Alertmanager is not installed: apt-get install --no-install-recommends \
                prometheus-alertmanager (scripts/test does it), or set ALERTMANAGER to its path";
    assert!(!in_ci(), "{hint}");
    eprintln!(
        "\n*** SKIPPING alertmanager: {hint} ***\n*** (under CI=true this is a failure) ***\n"
    );
    None
}

/// A real Alertmanager in a temp dir; killed on drop.
struct Alertmanager {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Alertmanager {
    /// Start `bin` routing every alert to `hook_url`, grouped per incident, and wait
    /// until it is ready.
    fn start(bin: &PathBuf, hook_url: &str) -> Alertmanager {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = format!(
            "route:\n  receiver: hook\n  group_by: [incident]\n  group_wait: 1s\n  \
             group_interval: 1s\n  repeat_interval: 1h\n\
             receivers:\n  - name: hook\n    webhook_configs:\n      - url: {hook_url}\n        \
             send_resolved: true\n"
        );
        let config_path = dir.path().join("alertmanager.yml");
        std::fs::write(&config_path, config).expect("write the config");
        let log = std::fs::File::create(dir.path().join("alertmanager.log")).expect("log file");
        let port = support::free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut am = Alertmanager { child, port, dir };
        let ready = warden_testkit::poll(PATIENCE, || {
            if let Ok(Some(status)) = am.child.try_wait() {
                panic!("Alertmanager exited early ({status}):\n{}", am.log());
            }
            support::http_get(port, "/-/ready")
                .is_some_and(|(s, _)| s == 200)
                .then_some(())
        });
        assert!(
            ready.is_some(),
            "Alertmanager never became ready:\n{}",
            am.log()
        );
        am
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("alertmanager.log")).unwrap_or_default()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A receiver: answers `fail_status` to the first `fail_first` POSTs, then 200, and
/// forwards the JSON bodies it accepted.
struct Receiver {
    port: u16,
    hits: Arc<AtomicUsize>,
    bodies: mpsc::UnboundedReceiver<Value>,
}

#[derive(Clone)]
struct ReceiverState {
    hits: Arc<AtomicUsize>,
    fail_first: usize,
    fail_status: StatusCode,
    tx: mpsc::UnboundedSender<Value>,
}

async fn receive(State(s): State<ReceiverState>, body: axum::body::Bytes) -> StatusCode {
    if s.hits.fetch_add(1, Ordering::SeqCst) < s.fail_first {
        return s.fail_status;
    }
    match serde_json::from_slice::<Value>(&body) {
        Ok(v) => {
            let _ = s.tx.send(v);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

impl Receiver {
    /// Listen on a free loopback port at `path`; the first `fail_first` POSTs get 503.
    async fn start(path: &str, fail_first: usize) -> Receiver {
        Self::failing(path, fail_first, StatusCode::SERVICE_UNAVAILABLE).await
    }

    /// Listen on a free loopback port at `path`; the first `fail_first` POSTs get
    /// `fail_status`.
    async fn failing(path: &str, fail_first: usize, fail_status: StatusCode) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (tx, bodies) = mpsc::unbounded_channel();
        let hits = Arc::new(AtomicUsize::new(0));
        let state = ReceiverState {
            hits: hits.clone(),
            fail_first,
            fail_status,
            tx,
        };
        let app = Router::new().route(path, post(receive)).with_state(state);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { port, hits, bodies }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The next accepted body, or a panic naming `what` after `limit`.
    async fn next(&mut self, what: &str, limit: Duration) -> Value {
        match tokio::time::timeout(limit, self.bodies.recv()).await {
            Ok(Some(v)) => v,
            _ => panic!("no {what} within {limit:?}"),
        }
    }
}

fn incident(id: &str) -> Incident {
    support::gpu_fault_incident(id, vec![12, 13])
}

/// The value of `warden_alerts_sent_total{sink,result}`.
fn sent(metrics: &Metrics, sink: &str, result: &str) -> u64 {
    let text = metrics.render().expect("metrics render");
    let series = format!("warden_alerts_sent_total{{result=\"{result}\",sink=\"{sink}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series}in\n{text}"))
}

/// Wait until `warden_alerts_sent_total{sink,result}` reaches `want` (a delivery is
/// counted once its answer is read, just after the receiver saw the body); returns the
/// value then, which a caller compares with `want` where more would be wrong.
async fn wait_sent(metrics: &Metrics, sink: &str, result: &str, want: u64) -> u64 {
    wait_for_async(
        &format!("{want} {sink} deliveries counted as {result}"),
        PATIENCE,
        || {
            let n = sent(metrics, sink, result);
            async move { (n >= want).then_some(n) }
        },
    )
    .await
}

/// Alertmanager's notification for `id` with `status`, skipping others (repeats of the
/// firing alert while it waits for the resolution).
async fn notification(rx: &mut Receiver, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + wait();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let body = rx
            .next(&format!("{status} notification for {id}"), left)
            .await;
        let alerts = body["alerts"].as_array().cloned().unwrap_or_default();
        if let Some(a) = alerts
            .into_iter()
            .find(|a| a["labels"]["incident"] == id && a["status"] == status)
        {
            return a;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_notifies_the_firing_incident_then_its_resolution() {
    let Some(bin) = alertmanager_bin() else {
        return;
    };
    let mut hook = Receiver::start("/hook", 0).await;
    let am = Alertmanager::start(&bin, &hook.url("/hook"));
    let metrics = Arc::new(Metrics::new("test").expect("metrics"));
    let config = AlertsConfig {
        alertmanager: Some(AlertmanagerConfig {
            url: SecretUrl::new(am.url()),
            resend_interval_secs: 1,
            timeout_ms: 5000,
            generator_url: Some("http://warden.test/api/v1/incidents/{incident}".into()),
        }),
        webhook: None,
    };
    assert!(config.validate("test", "alerts").is_empty());
    let queue = alerts::start(config, Some(metrics.clone()))
        .expect("clients build")
        .expect("a sink is configured");

    let mut inc = incident("inc-am-1");
    queue.submit(&inc, Change::Opened);
    let firing = notification(&mut hook, "inc-am-1", "firing").await;
    let labels = &firing["labels"];
    assert_eq!(labels["alertname"], "WardenIncident", "{firing}");
    assert_eq!(labels["kind"], "gpu_fault");
    assert_eq!(labels["job"], "llama-70b");
    assert_eq!(labels["node"], "gpu-07");
    assert_eq!(labels["severity"], "critical");
    assert_eq!(firing["annotations"]["summary"], inc.summary.as_str());
    assert_eq!(firing["annotations"]["ranks"], "12,13");
    assert_eq!(firing["annotations"]["gpus"], "gpu-07 gpu 4");
    assert_eq!(
        firing["generatorURL"],
        "http://warden.test/api/v1/incidents/inc-am-1"
    );

    // Evidence updates go to Alertmanager with the next re-send; the incident resolves.
    queue.submit(&inc, Change::Updated);
    inc.state = IncidentState::Resolved;
    inc.resolved_at = Some(SystemClock.now());
    queue.submit(&inc, Change::Resolved);
    let resolved = notification(&mut hook, "inc-am-1", "resolved").await;
    assert_eq!(resolved["labels"], *labels, "the same alert resolves");
    // Alertmanager answered the resolution before it notified the hook; Warden counts
    // the delivery once it has read that answer. Re-sends count too.
    wait_sent(&metrics, "alertmanager", "ok", 2).await;
    assert_eq!(sent(&metrics, "alertmanager", "error"), 0, "{}", am.log());
    assert_eq!(sent(&metrics, "alertmanager", "dropped"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_retries_server_errors_and_rate_limits_a_storm() {
    const PATH: &str = "/services/T000/B000/SECRET";
    let log = captured_log();
    let metrics = Arc::new(Metrics::new("test").expect("metrics"));
    let webhook = |url: String, max_per_minute| AlertsConfig {
        alertmanager: None,
        webhook: Some(WebhookConfig {
            url: SecretUrl::new(url),
            timeout_ms: 2000,
            max_per_minute,
        }),
    };

    // 503, 503, then 200: delivered once, after two retries.
    let mut flaky = Receiver::start(PATH, 2).await;
    let queue = alerts::start(webhook(flaky.url(PATH), 20), Some(metrics.clone()))
        .expect("client builds")
        .expect("a sink is configured");
    let inc = incident("inc-wh-1");
    queue.submit(&inc, Change::Opened);
    queue.submit(&inc, Change::Updated); // evidence: no message
    let m = flaky.next("webhook message", wait()).await;
    assert_eq!(m["state"], "opened", "{m}");
    assert_eq!(m["incident"], "inc-wh-1");
    assert_eq!(m["kind"], "gpu_fault");
    assert_eq!(m["severity"], "critical");
    assert_eq!(m["job"], "llama-70b");
    assert_eq!(m["nodes"], serde_json::json!(["gpu-07"]));
    let text = m["text"].as_str().expect("text");
    assert!(
        text.contains("gpu_fault opened") && text.contains("gpu-07"),
        "{text}"
    );
    assert_eq!(flaky.hits.load(Ordering::SeqCst), 3, "two 503s, then 200");
    // Messages go out one at a time, in order: the next incident's message coming next
    // shows that the evidence update sent none and that the first went once.
    queue.submit(&incident("inc-wh-1b"), Change::Opened);
    let next = flaky.next("the next incident's message", wait()).await;
    assert_eq!(next["incident"], "inc-wh-1b", "delivered once: {next}");
    assert_eq!(flaky.hits.load(Ordering::SeqCst), 4, "one POST more");
    assert_eq!(wait_sent(&metrics, "webhook", "ok", 2).await, 2);
    assert_eq!(sent(&metrics, "webhook", "error"), 0);
    drop(queue);

    // A 4xx other than 429 is not retried: one attempt, counted as an error. (Only the
    // first POST is refused: a retry would be accepted.)
    let mut refusing = Receiver::failing(PATH, 1, StatusCode::NOT_FOUND).await;
    let queue = alerts::start(webhook(refusing.url(PATH), 20), Some(metrics.clone()))
        .expect("client builds")
        .expect("a sink is configured");
    queue.submit(&incident("inc-wh-2"), Change::Opened);
    assert_eq!(wait_sent(&metrics, "webhook", "error", 1).await, 1);
    queue.submit(&incident("inc-wh-2b"), Change::Opened);
    let next = refusing.next("the next incident's message", wait()).await;
    assert_eq!(next["incident"], "inc-wh-2b", "not retried: {next}");
    assert_eq!(refusing.hits.load(Ordering::SeqCst), 2, "not retried");
    drop(queue);
    let text = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    let origin = format!("http://127.0.0.1:{}", refusing.port);
    assert!(
        text.contains("alert refused") && text.contains(&origin) && text.contains("404"),
        "the refusal is logged with its origin and status:\n{text}"
    );
    assert!(!text.contains("SECRET"), "a URL was logged whole:\n{text}");

    // A storm of 100 incidents at 30 per minute: a burst of 30, the rest suppressed,
    // and a later message (a token frees every 2 s) says how many.
    let mut storm = Receiver::start(PATH, 0).await;
    let queue = alerts::start(webhook(storm.url(PATH), 30), Some(metrics.clone()))
        .expect("client builds")
        .expect("a sink is configured");
    let started = Instant::now();
    for i in 0..100 {
        queue.submit(&incident(&format!("inc-storm-{i}")), Change::Opened);
    }
    // Submit never waits: a submit that waited for the rate limit would take over two
    // minutes here (a token frees every 2 s).
    let took = started.elapsed();
    eprintln!("100 submits took {took:?}");
    assert!(took < Duration::from_secs(30), "submit waited: {took:?}");
    for i in 0..30 {
        let m = storm.next("a message of the burst", wait()).await;
        assert_eq!(m["state"], "opened", "{m}");
        assert_eq!(m["incident"], format!("inc-storm-{i}"), "in order");
        assert_eq!(m["suppressed"], 0);
    }
    let digest = storm.next("the suppressed count", wait()).await;
    assert_eq!(digest["suppressed"], 70, "{digest}");
    assert_eq!(digest["state"], "suppressed");
    assert!(
        digest["text"]
            .as_str()
            .is_some_and(|t| t.contains("suppressed 70")),
        "{digest}"
    );
    assert_eq!(sent(&metrics, "webhook", "suppressed"), 70);
    // Two from the first receiver, one from the second, 31 from the storm.
    assert_eq!(
        wait_sent(&metrics, "webhook", "ok", 2 + 1 + 31).await,
        2 + 1 + 31
    );
    assert_eq!(sent(&metrics, "webhook", "dropped"), 0);
}
