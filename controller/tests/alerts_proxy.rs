//! Incident alerts through a proxy: with `HTTP_PROXY` naming a forward proxy on
//! 127.0.0.1, the webhook sink's POST goes through it (in absolute form) and still
//! reaches the receiver; with `NO_PROXY` naming the receiver's host, it goes straight
//! there.
//!
//! The proxies come from the process environment, as in production. So that no test
//! changes the environment of a process running other tests, the alert client runs in
//! a child process of this test binary (the `child_` test, which does nothing unless
//! [`CHILD`] is set) with an environment of its own; the proxy and the receiver run here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use warden_controller::alerts::{self, AlertsConfig, SecretUrl, WebhookConfig};
use warden_controller::metrics::Metrics;
use warden_engine::Change;
use warden_model::Incident;
use warden_testkit::proxy::ProxyDouble;
use warden_testkit::{PATIENCE, scaled, wait_for_async};

mod support;

/// Names the webhook URL in a child's environment, and makes the `child_` test run.
const CHILD: &str = "WARDEN_TEST_ALERTS_PROXY_WEBHOOK";

const PATH: &str = "/services/T000/B000/SECRET";

fn incident(id: &str) -> Incident {
    support::gpu_fault_incident(id, vec![12])
}

fn sent(metrics: &Metrics, result: &str) -> u64 {
    let text = metrics.render().expect("metrics render");
    let series = format!("warden_alerts_sent_total{{result=\"{result}\",sink=\"webhook\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// In a child process only: deliver one alert to the webhook [`CHILD`] names, through
/// whatever proxies the environment names, and fail unless it is delivered.
#[test]
fn child_delivers_one_alert() {
    let Ok(url) = std::env::var(CHILD) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let metrics = Arc::new(Metrics::new("test").expect("metrics"));
        let config = AlertsConfig {
            alertmanager: None,
            webhook: Some(WebhookConfig {
                url: SecretUrl::new(url),
                timeout_ms: 5000,
                max_per_minute: 20,
            }),
        };
        let queue = alerts::start(config, Some(metrics.clone()))
            .expect("client builds")
            .expect("a sink is configured");
        queue.submit(&incident("inc-proxy-1"), Change::Opened);
        wait_for_async("the alert delivered", PATIENCE, || {
            let (ok, error) = (sent(&metrics, "ok"), sent(&metrics, "error"));
            assert_eq!(error, 0, "the delivery failed");
            async move { (ok >= 1).then_some(()) }
        })
        .await;
    });
}

/// Run [`child_delivers_one_alert`] in a child process with `env` (and no other proxy
/// variables) and check that it passed.
async fn run_child(env: &[(&str, String)]) {
    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args([
        "child_delivers_one_alert",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ]);
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let out = tokio::time::timeout(scaled(PATIENCE) * 2, cmd.output())
        .await
        .expect("the child finishes")
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {}\n{stdout}\n{stderr}",
        out.status
    );
}

#[derive(Default)]
struct Hits(AtomicUsize);

async fn hook(State(hits): State<Arc<Hits>>) -> &'static str {
    hits.0.fetch_add(1, Ordering::SeqCst);
    "ok"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_goes_through_http_proxy_unless_no_proxy_names_its_host() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let hits = Arc::new(Hits::default());
    let app = Router::new()
        .route(PATH, post(hook))
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let proxy = ProxyDouble::start().await.expect("a proxy on loopback");
    let url = format!("http://{addr}{PATH}");

    run_child(&[("HTTP_PROXY", proxy.url()), (CHILD, url.clone())]).await;
    assert_eq!(
        proxy.request_lines(),
        [format!("POST {url} HTTP/1.1")],
        "asked of the proxy, in absolute form"
    );
    assert_eq!(hits.0.load(Ordering::SeqCst), 1, "and passed on");

    run_child(&[
        ("http_proxy", proxy.url()),
        ("no_proxy", "hooks.example.com,127.0.0.1".into()),
        (CHILD, url.clone()),
    ])
    .await;
    assert_eq!(
        proxy.request_lines().len(),
        1,
        "NO_PROXY bypasses the proxy"
    );
    assert_eq!(hits.0.load(Ordering::SeqCst), 2);
}
