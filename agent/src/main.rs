//! `warden-agent`: loads the configuration, starts logging and runs the node agent until
//! SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use warden_agent::config::{AgentConfig, Overrides, hostname};
use warden_agent::{privilege, runtime};
use warden_config::{logfmt, out, outln};

/// Exit code for configuration errors (EX_USAGE in sysexits.h).
const EXIT_CONFIG: u8 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// The Warden node agent: GPU telemetry, kernel-log hardware events and training logs,
/// exported on /metrics and shipped to the controller.
#[derive(Debug, Parser)]
#[command(name = "warden-agent", version)]
struct Args {
    /// Configuration file (YAML).
    #[arg(long, value_name = "FILE", env = "WARDEN_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Name this node reports as (default: the hostname).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node_name: Option<String>,
    /// Address of /metrics, /healthz and the local API (overrides the file and
    /// WARDEN_LISTEN).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Controller base URL, e.g. http://warden-controller:9460 (overrides the file and
    /// WARDEN_CONTROLLER_URL).
    #[arg(long, value_name = "URL")]
    controller_url: Option<String>,
    /// Check the configuration, print the effective settings and exit.
    #[arg(long)]
    check_config: bool,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "WARDEN_LOG_FORMAT")]
    log_format: LogFormat,
}

/// Log to stderr (filtered by `RUST_LOG`, default `info`), every field escaped so one
/// event is one line (`warden_config::logfmt`).
fn init_logging(format: LogFormat) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let format = match format {
        LogFormat::Json => logfmt::LogFormat::Json,
        LogFormat::Text => logfmt::LogFormat::Text,
    };
    tracing_subscriber::registry()
        .with(logfmt::stderr_layer(format).with_filter(filter))
        .init();
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if e.use_stderr() => {
            // A bad flag is a configuration error like a bad file.
            let _ = e.print();
            return ExitCode::from(EXIT_CONFIG);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    init_logging(args.log_format);
    let overrides = Overrides {
        node_name: args.node_name.clone(),
        listen: args.listen.clone(),
        controller_url: args.controller_url.clone(),
    };
    let (config, provenance) = match AgentConfig::load_traced(
        args.config.as_deref(),
        |k| std::env::var(k).ok(),
        &overrides,
        hostname(),
    ) {
        Ok(c) => (c.config, c.provenance),
        Err(errors) => {
            eprintln!("warden-agent: {errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args.check_config {
        let yaml = match serde_saphyr::to_string(&config.effective_file()) {
            Ok(y) => y,
            Err(e) => {
                eprintln!("warden-agent: cannot write the effective configuration: {e}");
                return ExitCode::FAILURE;
            }
        };
        outln!("# The effective configuration: a file with these values configures the same");
        outln!("# agent. `# from` names the file, environment variable or flag that set a");
        outln!("# value; `# default` marks a value nothing set.");
        out!("{}", warden_config::annotated_yaml(&yaml, &provenance));
        return ExitCode::SUCCESS;
    }
    // Names and origins only: values can be secrets.
    tracing::info!(settings = %provenance, "configuration loaded");
    // While the process has one thread: open what may need a capability, then give up
    // every capability for good (warden_agent::privilege).
    let preopened = privilege::preopen(&config, warden_agent::ship::wall_ns());
    match privilege::drop_all() {
        Ok(before) if before.permitted.is_empty() => {
            tracing::info!("holding no capability; no_new_privs set");
        }
        Ok(before) => tracing::info!(
            dropped = ?before.permitted_names(),
            "gave up every capability after opening the kernel log and the capture socket (each logs its own failure)"
        ),
        Err(e) => tracing::warn!(error = %e, "could not give up capabilities; running with them"),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warden-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(runtime::run_preopened(
        config,
        preopened,
        shutdown_signal(),
        None,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agent stopped");
            eprintln!("warden-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for SIGINT/SIGTERM; stop the agent with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
    }
}
