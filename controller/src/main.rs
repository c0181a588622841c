//! `warden-controller`: loads the configuration, starts logging, runs the detector timer
//! and serves the HTTP API until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Instrument;
use warden_config::{logfmt, out, outln};
use warden_controller::SharedEngine;
use warden_controller::api::{self, ApiState};
use warden_controller::auth::{self, Auth, Role};
use warden_controller::config::{ControllerConfig, Overrides, StoreLocation};
use warden_controller::diagnosis::{self, Diagnoser, DiagnosisQueue, HttpLogSource};
use warden_controller::leader::{Change, Leadership};
use warden_controller::metrics::Metrics;
use warden_controller::operate::{self, Operator};
use warden_controller::persist::Persister;
use warden_controller::store::Store;
use warden_controller::{forward, telemetry, tls};
use warden_diagnosis::llm::LlmDiagnoser;
use warden_diagnosis::rules::RuleSet;
use warden_engine::incidents::BookConfig;
use warden_engine::{Clock, Engine, EngineConfig, IncidentChange, SystemClock};
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
    /// Directory of the embedded SQLite store (overrides the file and WARDEN_DATA_DIR).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// PostgreSQL store, postgres://USER@HOST:PORT/DB (overrides the file and
    /// WARDEN_DATABASE_URL).
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// API token file (overrides the file and WARDEN_TOKENS_FILE).
    #[arg(long, value_name = "FILE")]
    tokens_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "WARDEN_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Make a new API token: prints the token (give it to its holder) and the entry to
    /// add to the token file (which keeps only its SHA-256).
    Token {
        /// Who holds it (shown in the audit log).
        #[arg(long)]
        name: String,
        /// viewer, operator, admin or agent.
        #[arg(long)]
        role: Role,
    },
    /// Print the OpenAPI document of the HTTP API (what docs/openapi.json holds):
    /// `warden-controller openapi > docs/openapi.json`.
    Openapi,
}

/// Log to stderr (filtered by `RUST_LOG`, default `info`), every field escaped so one
/// event is one line (`warden_config::logfmt`), and, when `traces` is given, send the
/// pipeline's spans and the controller's events within them to it.
fn init_logging(format: LogFormat, traces: Option<&SdkTracerProvider>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let format = match format {
        LogFormat::Json => logfmt::LogFormat::Json,
        LogFormat::Text => logfmt::LogFormat::Text,
    };
    let fmt = logfmt::stderr_layer(format);
    let spans = traces.map(|p| {
        telemetry::layer(p).with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(telemetry::TARGET, tracing::Level::INFO)
                .with_target("warden_controller", tracing::Level::INFO),
        )
    });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(spans)
        .init();
}

/// Start trace export when an endpoint is configured; `None` when off.
fn start_traces(config: &ControllerConfig) -> Result<Option<SdkTracerProvider>, String> {
    let Some(endpoint) = telemetry::endpoint(&config.traces, |k| std::env::var(k).ok()) else {
        return Ok(None);
    };
    let ca = config.tls.as_ref().and_then(|t| t.ca_file.as_deref());
    let tls = tls::client_config(ca).map_err(|e| format!("traces: {e}"))?;
    telemetry::start(&config.traces, endpoint, Arc::new(tls))
        .map(Some)
        .map_err(|e| format!("traces: {e}"))
}

fn make_token(name: &str, role: Role) -> ExitCode {
    match auth::new_token() {
        Ok(token) => {
            outln!("token (give it to {name}; it is not stored):\n  {token}\n");
            outln!("token file entry:");
            outln!(
                "  - name: {name}\n    role: {role}\n    sha256: {}",
                auth::hash_token(&token)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("warden-controller: cannot read random bytes: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Token { name, role }) = &args.command {
        return make_token(name, *role);
    }
    if let Some(Command::Openapi) = &args.command {
        out!("{}", warden_controller::openapi::openapi_json());
        return ExitCode::SUCCESS;
    }
    let overrides = Overrides {
        listen: args.listen.clone(),
        data_dir: args.data_dir.clone(),
        database_url: args.database_url.clone(),
        tokens_file: args.tokens_file.clone(),
    };
    let (config, provenance) = match ControllerConfig::load_traced(
        args.config.as_deref(),
        |k| std::env::var(k).ok(),
        &overrides,
    ) {
        Ok(c) => (c.config, c.provenance),
        Err(errors) => {
            eprintln!("warden-controller: {errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let auth = match &config.tokens_file {
        Some(path) => match Auth::from_file(path) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("warden-controller: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => Auth::Open,
    };
    let tls = match &config.tls {
        Some(t) => {
            let setup = tls::server_config(t).and_then(|server| {
                let client = tls::client_config(t.ca_file.as_deref())?;
                Ok((server, client))
            });
            match setup {
                Ok((server, client)) => {
                    forward::configure(client);
                    Some(server)
                }
                Err(e) => {
                    eprintln!("warden-controller: tls: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            }
        }
        None => None,
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
    let traces = {
        let _in_runtime = runtime.enter();
        match start_traces(&config) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("warden-controller: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    };
    init_logging(args.log_format, traces.as_ref());
    // Names and origins only: values can be secrets (a database URL).
    tracing::info!(settings = %provenance, "configuration loaded");
    if traces.is_some() {
        tracing::info!("sending traces of the incident pipeline over OTLP");
    }
    let code = match runtime.block_on(run(config, auth, tls)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "controller stopped");
            eprintln!("warden-controller: {e:#}");
            ExitCode::FAILURE
        }
    };
    // Send the spans still queued while the runtime that sends them still runs.
    if let Some(t) = traces
        && let Err(e) = t.shutdown()
    {
        eprintln!("warden-controller: traces: {e}");
    }
    code
}

async fn open_store(location: &StoreLocation) -> anyhow::Result<Store> {
    let created = match location {
        StoreLocation::Dir(dir) => !dir.join("warden.db").exists(),
        StoreLocation::Url(_) => false,
    };
    let store = match location {
        StoreLocation::Dir(dir) => Store::open_dir(dir).await,
        StoreLocation::Url(url) => Store::open(url).await,
    }
    .context("opening the incident store")?;
    let where_ = match location {
        StoreLocation::Dir(dir) => dir.join("warden.db").display().to_string(),
        StoreLocation::Url(_) => "the database URL".to_owned(),
    };
    if created {
        // Said at warning level: a controller started without a data directory in mind
        // should not leave a database somewhere unnoticed.
        tracing::warn!(
            backend = store.backend().as_str(),
            at = %where_,
            "created a new incident store; --data-dir, WARDEN_DATA_DIR, data_dir in the config file or --database-url put it elsewhere"
        );
    } else {
        tracing::info!(backend = store.backend().as_str(), at = %where_, "incident store open");
    }
    Ok(store)
}

/// A name for this controller among others sharing its database.
fn controller_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let salt = auth::new_token()
        .map(|t| t.chars().skip(4).take(6).collect::<String>())
        .unwrap_or_default();
    format!(
        "{}-{}-{salt}",
        if host.is_empty() { "controller" } else { &host },
        std::process::id()
    )
}

async fn run(
    config: ControllerConfig,
    auth: Auth,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let engine = SharedEngine::new(Engine::new(
        EngineConfig {
            limits: config.limits,
            ..EngineConfig::default()
        },
        Timestamp::ZERO,
    ));
    let metrics = Arc::new(Metrics::new(env!("CARGO_PKG_VERSION")).context("setting up metrics")?);
    let store = open_store(&config.store).await?;
    // A long accept queue: a burst of connections waits instead of losing SYNs.
    let listener = warden_http::server::bind(config.listen)
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let advertise = config
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{local}"));
    let leadership = Leadership::new(controller_id(), advertise);
    let alerts = warden_controller::alerts::start(config.alerts.clone(), Some(metrics.clone()))
        .context("starting incident alerts")?;
    let remedy = warden_controller::remedy::run::Remediator::new(
        config.remediation.clone(),
        engine.clone(),
        store.clone(),
        Some(metrics.clone()),
        clock.clone(),
    )
    .await
    .context("setting up remediation")?;
    tracing::info!(
        dry_run = config.remediation.dry_run,
        actuator = ?config.remediation.actuator,
        "remediation {}",
        if config.remediation.dry_run { "records what it would do (dry run)" } else { "acts" }
    );
    let operator = Operator {
        remedy: Some(remedy),
        engine: engine.clone(),
        persister: Arc::new(tokio::sync::Mutex::new(Persister::new(store.clone()))),
        store: store.clone(),
        alerts,
        leadership: leadership.clone(),
        metrics: Some(metrics.clone()),
    };
    if auth.is_open() {
        tracing::warn!(
            listen = %config.listen,
            "no token file: the API is open to every local user (set tokens_file)"
        );
    }
    let state = ApiState {
        engine: engine.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        max_batch_bytes: config.max_batch_bytes,
        auth: Arc::new(auth),
        operator: operator.clone(),
    };
    tracing::info!(
        listen = %local,
        scheme,
        id = %leadership.id(),
        max_batch_bytes = config.max_batch_bytes,
        tick_interval_ms = config.tick_interval_ms,
        version = env!("CARGO_PKG_VERSION"),
        "controller listening"
    );
    // This binary always writes a store: a batch with node events is acknowledged only
    // once a pass has stored what it found, from the first request on. Until the lease
    // is taken and the detector loop runs, such a batch is answered 503 and the agent
    // sends it again; an acknowledgement before would be lost to a crash.
    engine.ack_when_stored();
    let app = api::router(state);
    // HTTP/1.1 only, under the configured timeouts and connection caps; a shutdown
    // signal lets requests in flight finish.
    let server = warden_http::server::Server::new(config.server);
    let mut server = match tls {
        Some(config) => {
            let server = server.with_handshake(tls::TlsHandshake::new(config));
            tokio::spawn(server.serve(listener, app, shutdown_signal()))
        }
        None => tokio::spawn(server.serve(listener, app, shutdown_signal())),
    };

    // Follow until the lease is ours; then take the incidents back, finish what the
    // previous leader left unfinished, and start detecting. A leader cut off from its
    // database stops acting and starts again once the lease is back (`leader::Change`).
    let (changes_tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let lease = tokio::spawn(leadership.clone().run(store, clock.clone(), changes_tx));
    let mut ticker: Option<tokio::task::JoinHandle<()>> = None;
    let outcome = loop {
        let change = tokio::select! {
            served = &mut server => break finish(served),
            change = changes.recv() => change,
        };
        match change {
            Some(Change::Lead) => {
                if let Some(t) = ticker.take() {
                    t.abort();
                }
                ticker = Some(lead(&config, &operator, &clock, &metrics).await?);
            }
            Some(Change::Pause(why)) => {
                if let Some(t) = ticker.take() {
                    t.abort();
                }
                tracing::warn!(reason = %why, "stopped acting until the leader lease is back");
            }
            Some(Change::Lost(why)) => break Err(anyhow::anyhow!("stopped leading: {why}")),
            None => break finish(server.await),
        }
    };
    if let Some(t) = ticker {
        t.abort();
    }
    lease.abort();
    tracing::info!("controller stopped");
    outcome
}

fn finish(served: Result<(), tokio::task::JoinError>) -> anyhow::Result<()> {
    served.map_err(|e| anyhow::anyhow!("the HTTP server task failed: {e}"))
}

/// Become the acting controller: restore live incidents, finish unfinished actions,
/// start diagnosis and the detector timer.
async fn lead(
    config: &ControllerConfig,
    operator: &Operator,
    clock: &Arc<dyn Clock>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    warden_controller::operate::failpoint("lead-started").await;
    let restored = operator
        .persister
        .lock()
        .await
        .restore(
            &operator.engine,
            clock.now(),
            BookConfig::default().reopen_secs,
        )
        .await
        .context("restoring incidents from the store")?;
    if restored > 0 {
        tracing::info!(
            incidents = restored,
            "live incidents taken back from the store"
        );
    }
    let nodes = operator
        .persister
        .lock()
        .await
        .restore_ledger(&operator.engine)
        .await
        .context("restoring the node-health ledger from the store")?;
    if nodes > 0 {
        tracing::info!(nodes, "node-health ledger taken back from the store");
    }
    if let Some(r) = &operator.remedy {
        r.reload().await.context("reading the remediation state")?;
    }
    let finished = operate::recover(operator, clock.now())
        .await
        .context("finishing actions a previous run left unfinished")?;
    if finished > 0 {
        tracing::info!(actions = finished, "unfinished actions finished");
    }
    let queue = start_diagnosis(config, &operator.engine, clock, metrics)?;
    Ok(tokio::spawn(tick_loop(
        operator.clone(),
        clock.clone(),
        config.tick_interval_ms,
        queue,
    )))
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
    let source = Arc::new(
        HttpLogSource::new(
            &d.agent_url,
            token,
            Duration::from_millis(d.fetch_timeout_ms),
        )
        .with_agent_urls(&d.agent_urls),
    );
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
    operator: Operator,
    clock: Arc<dyn Clock>,
    interval_ms: u64,
    queue: Option<DiagnosisQueue>,
) {
    let engine = operator.engine.clone();
    let mut store_failing = false;
    let mut interval = tokio::time::interval(Duration::from_millis(interval_ms));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let pass_engine = engine.clone();
        let pass_alerts = operator.alerts.clone();
        let now = clock.now();
        let span = tracing::info_span!(
            target: telemetry::TARGET,
            "detect_pass",
            changes = tracing::field::Empty,
        );
        let pass_span = span.clone();
        let pass = tokio::task::spawn_blocking(move || {
            let _in = pass_span.enter();
            let mut e = pass_engine.lock();
            let seen = e.event_batches();
            let changes = e.tick(now);
            pass_span.record("changes", changes.len());
            log_changes(&e, &changes);
            if let Some(a) = &pass_alerts {
                a.submit_changes(&e, &changes);
            }
            (changes, seen)
        });
        let seen = match pass.await {
            Ok((changes, seen)) => {
                if let Some(q) = &queue {
                    q.submit_opened(&changes);
                }
                Some(seen)
            }
            Err(e) => {
                tracing::error!(error = %e, "detector pass failed");
                None
            }
        };
        // Write what changed; a failing store is retried on every pass and reported
        // once until it recovers.
        let synced = operator
            .persister
            .lock()
            .await
            .sync(&engine, now)
            .instrument(tracing::info_span!(
                target: telemetry::TARGET,
                parent: &span,
                "store.sync"
            ))
            .await;
        if let (Ok(_), Some(seen)) = (&synced, seen) {
            engine.stored_through(seen);
        }
        match synced {
            Ok(_) if store_failing => {
                store_failing = false;
                tracing::info!("incident store writable again");
            }
            Ok(_) => {}
            Err(e) if !store_failing => {
                store_failing = true;
                tracing::error!(error = %e, "cannot write incidents to the store; retrying");
            }
            Err(_) => {}
        }
        if let Some(r) = &operator.remedy {
            let span = tracing::info_span!(
                target: telemetry::TARGET,
                parent: &span,
                "remediate",
                decided = tracing::field::Empty,
                actions = tracing::field::Empty,
            );
            let done = r.pass(now).instrument(span.clone()).await;
            match done {
                Ok(report) => {
                    span.record("decided", report.decided);
                    span.record("actions", report.actions);
                    if let Some(q) = &operator.alerts {
                        q.submit_changes(&engine.lock(), &report.changes);
                    }
                }
                Err(e) => tracing::error!(error = %e, "remediation pass failed"),
            }
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
