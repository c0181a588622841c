//! `warden-controller`: loads the configuration, starts logging, runs the detector timer
//! and serves the HTTP API until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use tokio::net::TcpListener;
use warden_controller::api::{self, ApiState};
use warden_controller::config::{ControllerConfig, Overrides};
use warden_controller::diagnosis::{self, Diagnoser, DiagnosisQueue, HttpLogSource};
use warden_controller::metrics::Metrics;
use warden_controller::{Clock, Engine, EngineConfig, IncidentChange, SharedEngine, SystemClock};
use warden_diagnosis::llm::LlmDiagnoser;
use warden_diagnosis::rules::RuleSet;
use warden_model::Timestamp;

/// Exit code for configuration errors (EX_USAGE in sysexits.h).
const EXIT_CONFIG: u8 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// The Warden controller: ingests agent batches, detects faults and serves the API.
#[derive(Debug, Parser)]
#[command(name = "warden-controller", version)]
struct Args {
    /// Configuration file (YAML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the file and WARDEN_LISTEN).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "WARDEN_LOG_FORMAT")]
    log_format: LogFormat,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    let overrides = Overrides {
        listen: args.listen.clone(),
    };
    let config = match ControllerConfig::load(
        args.config.as_deref(),
        |k| std::env::var(k).ok(),
        &overrides,
    ) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("warden-controller: {errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warden-controller: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "controller stopped");
            eprintln!("warden-controller: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: ControllerConfig) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp::ZERO));
    let metrics = Arc::new(Metrics::new(env!("CARGO_PKG_VERSION")).context("setting up metrics")?);
    let queue = start_diagnosis(&config, &engine, &clock, &metrics)?;
    let state = ApiState {
        engine: engine.clone(),
        clock: clock.clone(),
        metrics,
        max_batch_bytes: config.max_batch_bytes,
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;
    tracing::info!(
        listen = %local,
        max_batch_bytes = config.max_batch_bytes,
        tick_interval_ms = config.tick_interval_ms,
        version = env!("CARGO_PKG_VERSION"),
        "controller listening"
    );

    let ticker = tokio::spawn(tick_loop(engine, clock, config.tick_interval_ms, queue));
    let served = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving HTTP");
    ticker.abort();
    tracing::info!("controller stopped");
    served
}

/// Start diagnosing new incidents, unless the configuration turns it off.
fn start_diagnosis(
    config: &ControllerConfig,
    engine: &SharedEngine,
    clock: &Arc<dyn Clock>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<DiagnosisQueue>> {
    let d = &config.diagnosis;
    if !d.enabled {
        tracing::info!("incident diagnosis is off");
        return Ok(None);
    }
    let rules = Arc::new(RuleSet::builtin().context("loading the shipped log rules")?);
    let token = match &d.agent_token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the agent token file {}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let source = Arc::new(HttpLogSource::new(
        &d.agent_url,
        token,
        Duration::from_millis(d.fetch_timeout_ms),
    ));
    let llm = match &d.llm {
        Some(cfg) => Some(LlmDiagnoser::new(cfg.clone()).context("setting up the LLM client")?),
        None => None,
    };
    tracing::info!(
        agent_url = %d.agent_url,
        llm = d.llm.as_ref().map_or("none", |l| l.model.as_str()),
        "incident diagnosis on"
    );
    let diagnoser = Arc::new(Diagnoser::new(d.clone(), rules, source, llm));
    Ok(Some(diagnosis::start(
        diagnoser,
        engine.clone(),
        clock.clone(),
        Some(metrics.clone()),
    )))
}

/// Run the detectors every `interval_ms`, log what changed and queue new incidents for
/// diagnosis.
async fn tick_loop(
    engine: SharedEngine,
    clock: Arc<dyn Clock>,
    interval_ms: u64,
    queue: Option<DiagnosisQueue>,
) {
    let mut interval = tokio::time::interval(Duration::from_millis(interval_ms));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let engine = engine.clone();
        let now = clock.now();
        let pass = tokio::task::spawn_blocking(move || {
            let mut e = engine.lock();
            let changes = e.tick(now);
            log_changes(&e, &changes);
            changes
        });
        match pass.await {
            Ok(changes) => {
                if let Some(q) = &queue {
                    q.submit_opened(&changes);
                }
            }
            Err(e) => tracing::error!(error = %e, "detector pass failed"),
        }
    }
}

fn log_changes(engine: &Engine, changes: &[IncidentChange]) {
    for c in changes {
        match engine.incident(&c.id) {
            Some(inc) => tracing::info!(
                incident = %c.id,
                change = ?c.change,
                kind = %inc.kind,
                job = inc.job.as_deref().unwrap_or(""),
                ranks = ?inc.ranks,
                nodes = ?inc.nodes,
                confidence = inc.confidence,
                summary = %inc.summary,
                "incident changed"
            ),
            None => tracing::info!(incident = %c.id, change = ?c.change, "incident changed"),
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!(signal = "SIGINT", "shutting down"),
        () = term => tracing::info!(signal = "SIGTERM", "shutting down"),
    }
}
