//! `warden`: the operator command line. `warden demo` runs a simulated job with a
//! scripted fault mix against an in-process controller; `warden sim` runs a scenario
//! as fast as possible and reports what the controller found; `warden diagnose`
//! classifies a failure from its logs; `warden incidents`, `nodes`, `drain`, `undrain`
//! and `whoami` work with a running controller over its API (docs/CLI.md);
//! `warden completions SHELL` prints a shell completion script.

mod client;
#[cfg(feature = "demo")]
mod demo;
mod diagnose;
#[cfg(feature = "demo")]
mod fleet;
#[cfg(feature = "demo")]
mod loadgen;
mod ops;
mod output;
mod settings;
mod show;
#[cfg(feature = "demo")]
mod sim;

#[cfg(feature = "demo")]
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use warden_config::{logfmt, outln};

pub use client::EXIT_USAGE;

/// Warden keeps large GPU training jobs running: it finds hangs, stragglers, slow links,
/// NaNs, crashes and GPU faults and names the culprit rank, GPU and node.
#[derive(Debug, Parser)]
#[command(
    name = "warden",
    version,
    propagate_version = true,
    after_help = ops::EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a simulated 256-GPU job with injected faults against an in-process
    /// controller, print each incident as it is found, and serve the API meanwhile.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    /// Run a scenario file as fast as possible and summarise what was detected.
    #[cfg(feature = "demo")]
    Sim(SimArgs),
    /// Run a scenario's node agents against a running controller over HTTP, in real
    /// time, and report throughput, batch latency, the controller's CPU and memory,
    /// and what it detected (docs/OPERATIONS.md).
    #[cfg(feature = "demo")]
    Loadgen(loadgen::LoadgenArgs),
    /// Classify a failure from its logs (files, or stdin): category, fault locus,
    /// culprit, evidence; optionally refined by a model. With --eval, score the rules
    /// (and the model) on a labelled corpus.
    Diagnose(DiagnoseArgs),
    /// Print the version of this build and the wire version it speaks.
    Version,
    /// Print a completion script for a shell (`warden completions bash >
    /// ~/.local/share/bash-completion/completions/warden`; docs/CLI.md).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// List, show, acknowledge and resolve incidents on a running controller.
    #[command(after_help = ops::EXIT_CODES_HELP)]
    Incidents(ops::IncidentsArgs),
    /// List nodes: agents heard from and nodes held drained; `nodes health [NAME]`:
    /// their health in the node-health ledger.
    #[command(after_help = ops::EXIT_CODES_HELP)]
    Nodes(ops::NodesArgs),
    /// Drain a node: no new work goes to it.
    #[command(after_help = ops::EXIT_CODES_HELP)]
    Drain(ops::DrainArgs),
    /// Undrain a node drained with `warden drain`.
    #[command(after_help = ops::EXIT_CODES_HELP)]
    Undrain(ops::UndrainArgs),
    /// Show remediation's state (dry run or acting, the circuit breaker), or reset a
    /// tripped breaker.
    #[command(after_help = ops::EXIT_CODES_HELP)]
    Remediation(ops::RemediationArgs),
    /// Show who the token is (name and role): a check of the token and the server.
    #[command(after_help = ops::EXIT_CODES_HELP)]
    Whoami(ops::PlainArgs),
}

/// Options of `warden demo`.
#[cfg(feature = "demo")]
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Scenario file to run instead of the built-in fault mix.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Virtual seconds simulated per wall-clock second.
    #[arg(long, value_name = "X", default_value_t = 20.0)]
    pub speed: f64,
    /// Address the controller API listens on while the demo runs (port 0: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9460")]
    pub listen: SocketAddr,
    /// Do not serve the API.
    #[arg(long)]
    pub no_api: bool,
    /// Exit once the run is over instead of serving the API until Ctrl-C (for scripts).
    #[arg(long)]
    pub exit_when_done: bool,
}

/// Options of `warden sim`.
#[cfg(feature = "demo")]
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["scenario", "fleet"])))]
pub struct SimArgs {
    /// Scenario file (YAML): one job with injected faults.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Fleet file (YAML): jobs over a node pool for simulated days, bad GPUs and
    /// job-caused XIDs, through the engine, its node-health ledger and the shipped
    /// policy (docs/LEDGER.md, "Fleet simulation").
    #[arg(long, value_name = "FILE")]
    pub fleet: Option<PathBuf>,
    /// Write the run's report (JSON) here.
    #[arg(long, value_name = "OUT.json")]
    pub report: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long)]
    pub quiet: bool,
}

/// Options of `warden diagnose`.
#[derive(Debug, clap::Args)]
pub struct DiagnoseArgs {
    /// Log files, read in order as one log (stdin when none; `-` is stdin).
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print `table` (text; `wide` is the same), or the answer as `json` or `yaml`.
    #[arg(short = 'o', long, value_enum, default_value_t = output::Output::Table)]
    pub output: output::Output,
    /// The same as `-o json`.
    #[arg(long, hide = true, conflicts_with = "output")]
    pub json: bool,
    /// Directory of rule files (*.yaml): each replaces the shipped file of the same
    /// name, others are added.
    #[arg(long, value_name = "DIR")]
    pub rules: Option<PathBuf>,
    /// Score the rules on a labelled corpus (JSON lines) instead of diagnosing logs;
    /// with --llm-url, the rules and the model side by side. Repeat it to score several
    /// files as one corpus; a directory stands for its `*.jsonl` files.
    #[arg(long, value_name = "CORPUS.jsonl", conflicts_with = "files")]
    pub eval: Vec<PathBuf>,
    /// Refine the rules' answer with a model behind this OpenAI-compatible API (base
    /// URL up to the version, e.g. http://127.0.0.1:8000/v1). Needs --llm-model.
    #[arg(long, value_name = "URL", env = "WARDEN_LLM_URL")]
    pub llm_url: Option<String>,
    /// The model to ask (as the server names it).
    #[arg(long, value_name = "MODEL", env = "WARDEN_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// File whose first line is the API key (sent as a Bearer token).
    #[arg(long, value_name = "FILE", conflicts_with = "llm_key_env")]
    pub llm_key_file: Option<PathBuf>,
    /// Environment variable holding the API key.
    #[arg(long, value_name = "VAR")]
    pub llm_key_env: Option<String>,
    /// Time allowed for one request to the model, in seconds (default 30).
    #[arg(long, value_name = "SECS")]
    pub llm_timeout_secs: Option<u64>,
}

impl DiagnoseArgs {
    /// How to print: `-o`, or `--json`.
    pub fn output(&self) -> output::Output {
        if self.json {
            output::Output::Json
        } else {
            self.output
        }
    }
}

/// Log to stderr (filtered by `RUST_LOG`, default `warn`), every field escaped so one
/// event is one line (`warden_config::logfmt`).
fn init_logging() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::registry()
        .with(logfmt::stderr_layer(logfmt::LogFormat::Text).with_filter(filter))
        .init();
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors exit 2 like configuration errors; help and version go to
            // stdout and succeed.
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging();
    let result = match cli.command {
        #[cfg(feature = "demo")]
        Command::Demo(args) => demo::main(args),
        #[cfg(feature = "demo")]
        Command::Sim(args) => sim::main(&args),
        #[cfg(feature = "demo")]
        Command::Loadgen(args) => loadgen::main(&args),
        Command::Diagnose(args) => diagnose::main(&args),
        Command::Version => {
            outln!(
                "warden {} (wire version {})",
                env!("CARGO_PKG_VERSION"),
                warden_model::wire::WIRE_VERSION
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "warden",
                &mut script,
            );
            warden_config::out!("{}", String::from_utf8_lossy(&script));
            Ok(ExitCode::SUCCESS)
        }
        Command::Incidents(args) => Ok(ops::incidents(args)),
        Command::Nodes(args) => Ok(ops::nodes(args)),
        Command::Drain(args) => Ok(ops::drain(args)),
        Command::Undrain(args) => Ok(ops::undrain(args)),
        Command::Remediation(args) => Ok(ops::remediation(args)),
        Command::Whoami(args) => Ok(ops::whoami(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warden: {e:#}");
            ExitCode::FAILURE
        }
    }
}
