//! The operator commands: `warden incidents`, `nodes`, `drain`, `undrain`,
//! `remediation` and `whoami` against a running controller's API, printed as tables or
//! as the server's JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Value, json};
use warden_config::{out, outln};
use warden_diagnosis::llm::ApiKey;
use warden_model::view::{FleetHealthView, IncidentView, NodeHealthView, NodeView, RemedyStatus};

use crate::client::{ApiClient, OpsError, encode};
use crate::output::{self, Output};
use crate::settings::{FlagValues, Settings};
use crate::show;

/// The exit codes of the commands that talk to a controller, for their help.
pub const EXIT_CODES_HELP: &str = "\
Exit codes of every command:
  0 done; 1 server or other error (and server unreachable); 2 usage or configuration;
  3 token refused (401/403); 4 not found (404, or an input file that cannot be opened);
  5 conflict (409: already drained, already resolved, breaker not tripped, refused by
  the safety rails); 6 input that is not usable (a binary log, a bad corpus line).";

/// The help section of the options every operator command takes.
const HEADING: &str = "Controller and output";

/// Where the controller is and how to prove who you are: flag > environment > config
/// file > default.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnArgs {
    /// Print a `table` (cut to the terminal's width), `wide` (not cut), or the server's
    /// answer as `json` or `yaml`.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, global = true, help_heading = HEADING)]
    pub output: Output,
    /// The controller's URL [env: WARDEN_SERVER] [default: http://127.0.0.1:9460].
    #[arg(long, value_name = "URL", global = true, help_heading = HEADING)]
    pub server: Option<String>,
    /// The API token; prefer --token-file, since other users can see command lines
    /// [env: WARDEN_TOKEN].
    #[arg(
        long,
        value_name = "TOKEN",
        global = true,
        help_heading = HEADING,
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,
    /// File whose first line is the API token [env: WARDEN_TOKEN_FILE].
    #[arg(long, value_name = "FILE", global = true, help_heading = HEADING)]
    pub token_file: Option<PathBuf>,
    /// Config file with `server:` and `token_file:` [env: WARDEN_CONFIG] [default:
    /// ~/.config/warden/cli.yaml when it exists].
    #[arg(long, value_name = "FILE", global = true, help_heading = HEADING)]
    pub config: Option<PathBuf>,
}

/// Options of `warden incidents`: without a subcommand, `list` (and its options).
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct IncidentsArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Option<IncidentsCommand>,
    #[command(flatten)]
    list: ListArgs,
}

#[derive(Debug, clap::Subcommand)]
enum IncidentsCommand {
    /// List incidents, oldest first (one page unless --all); the default.
    #[command(after_help = EXIT_CODES_HELP)]
    List(ListArgs),
    /// One incident in full: culprit, times, evidence, timeline, diagnosis.
    #[command(after_help = EXIT_CODES_HELP)]
    Show {
        /// The incident's id.
        id: String,
    },
    /// Acknowledge an incident: someone is on it.
    #[command(after_help = EXIT_CODES_HELP)]
    Ack {
        /// The incident's id.
        id: String,
        /// A note kept with the acknowledgement.
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
    },
    /// Resolve an incident by hand.
    #[command(after_help = EXIT_CODES_HELP)]
    Resolve {
        /// The incident's id.
        id: String,
        /// Why it is over (kept in the timeline and the audit log).
        #[arg(long, value_name = "TEXT")]
        reason: String,
    },
}

#[derive(Debug, clap::Args)]
struct ListArgs {
    /// Only incidents in this state: open, diagnosed, mitigating, resolved.
    #[arg(long, value_name = "S")]
    state: Option<String>,
    /// Only incidents of this kind: hang, crash, straggler, slow_link, nan, gpu_fault.
    #[arg(long, value_name = "K")]
    kind: Option<String>,
    /// Only incidents of this job.
    #[arg(long, value_name = "J")]
    job: Option<String>,
    /// Only incidents blaming this node.
    #[arg(long, value_name = "N")]
    node: Option<String>,
    /// Page size (the server's default is 100).
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// Start after this incident id (the next page's `--after` is printed on stderr).
    #[arg(long, value_name = "ID")]
    after: Option<String>,
    /// Follow every page to the end.
    #[arg(long)]
    all: bool,
}

/// Options of `warden nodes`.
#[derive(Debug, clap::Args)]
pub struct NodesArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Option<NodesCommand>,
}

#[derive(Debug, clap::Subcommand)]
enum NodesCommand {
    /// Node health from the node-health ledger: the fleet by state with its repeat
    /// offenders, or one node's state, history and evidence.
    #[command(after_help = EXIT_CODES_HELP)]
    Health {
        /// One node (default: the whole fleet).
        name: Option<String>,
    },
}

/// Options of `warden whoami`.
#[derive(Debug, clap::Args)]
pub struct PlainArgs {
    #[command(flatten)]
    conn: ConnArgs,
}

/// Options of `warden drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The node.
    node: String,
    /// Why (kept with the drain and in the audit log).
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// The incident the drain answers.
    #[arg(long, value_name = "ID")]
    incident: Option<String>,
}

/// Options of `warden undrain`.
#[derive(Debug, clap::Args)]
pub struct UndrainArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The node.
    node: String,
    /// Why it may take work again.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Options of `warden remediation`.
#[derive(Debug, clap::Args)]
pub struct RemediationArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Option<RemediationCommand>,
}

/// `warden remediation` subcommands.
#[derive(Debug, clap::Subcommand)]
enum RemediationCommand {
    /// Dry run or acting, the actuator, the circuit breaker (the default).
    #[command(after_help = EXIT_CODES_HELP)]
    Status,
    /// Reset a tripped circuit breaker (admin): remediation acts again.
    #[command(after_help = EXIT_CODES_HELP)]
    ResetBreaker {
        /// What was found and fixed (kept in the audit log).
        #[arg(long, value_name = "TEXT")]
        reason: String,
    },
}

/// `warden incidents ...`.
pub fn incidents(args: IncidentsArgs) -> ExitCode {
    run(&args.conn, |c, out| {
        Box::pin(async move {
            match args.command {
                None => list(c, out, &args.list).await,
                Some(IncidentsCommand::List(l)) => list(c, out, &l).await,
                Some(IncidentsCommand::Show { id }) => show_one(c, out, &id).await,
                Some(IncidentsCommand::Ack { id, note }) => ack(c, out, &id, note.as_deref()).await,
                Some(IncidentsCommand::Resolve { id, reason }) => {
                    let reason = required(&reason, "--reason")?;
                    resolve(c, out, &id, reason).await
                }
            }
        })
    })
}

/// `warden nodes` and `warden nodes health [NAME]`.
pub fn nodes(args: NodesArgs) -> ExitCode {
    run(&args.conn, |c, out| {
        Box::pin(async move {
            match args.command {
                None => {
                    let a = c.get("/api/v1/nodes").await?;
                    if out.is_document() {
                        return print_doc(out, &a.json);
                    }
                    let nodes: Vec<NodeView> = parse(c, a.json)?;
                    out!(
                        "{}",
                        show::fit(&show::node_rows(&nodes, now()), out.width())
                    );
                }
                Some(NodesCommand::Health { name: None }) => {
                    let a = c.get("/api/v1/fleet/health").await?;
                    if out.is_document() {
                        return print_doc(out, &a.json);
                    }
                    let fleet: FleetHealthView = parse(c, a.json)?;
                    out!("{}", show::fleet_health(&fleet));
                }
                Some(NodesCommand::Health { name: Some(name) }) => {
                    let path = format!("/api/v1/nodes/{}/health", encode(&name));
                    let a = c.get(&path).await?;
                    if out.is_document() {
                        return print_doc(out, &a.json);
                    }
                    let n: NodeHealthView = parse(c, a.json)?;
                    out!("{}", show::node_health(&n, now()));
                }
            }
            Ok(())
        })
    })
}

/// `warden drain NODE --reason TEXT [--incident ID]`.
pub fn drain(args: DrainArgs) -> ExitCode {
    run(&args.conn, |c, out| {
        Box::pin(async move {
            let reason = required(&args.reason, "--reason")?;
            let mut body = json!({ "reason": reason });
            if let Some(i) = &args.incident {
                body["incident"] = json!(i);
            }
            let path = format!("/api/v1/nodes/{}/drain", encode(&args.node));
            let a = c.post(&path, Some(&body)).await?;
            if out.is_document() {
                return print_doc(out, &a.json);
            }
            let n: NodeView = parse(c, a.json)?;
            let incident = n
                .incident
                .as_deref()
                .map_or(String::new(), |i| format!(", incident {i}"));
            outln!(
                "{} {} by {} ({}{incident})",
                n.name,
                n.state,
                n.owner.as_deref().unwrap_or("?"),
                n.reason.as_deref().unwrap_or(reason)
            );
            Ok(())
        })
    })
}

/// `warden undrain NODE [--reason TEXT]`.
pub fn undrain(args: UndrainArgs) -> ExitCode {
    run(&args.conn, |c, out| {
        Box::pin(async move {
            let body = match &args.reason {
                Some(r) => Some(json!({ "reason": required(r, "--reason")? })),
                None => None,
            };
            let path = format!("/api/v1/nodes/{}/drain", encode(&args.node));
            let a = c.delete(&path, body.as_ref()).await?;
            match out {
                Output::Table | Output::Wide => outln!("{} undrained", args.node),
                // 204 has no body: a document prints nothing.
                Output::Json | Output::Yaml if a.json.is_null() => {}
                Output::Json | Output::Yaml => print_doc(out, &a.json)?,
            }
            Ok(())
        })
    })
}

/// `warden remediation [status | reset-breaker --reason TEXT]`.
pub fn remediation(args: RemediationArgs) -> ExitCode {
    run(&args.conn, |c, out| {
        Box::pin(async move {
            let a = match &args.command {
                None | Some(RemediationCommand::Status) => c.get("/api/v1/remediation").await?,
                Some(RemediationCommand::ResetBreaker { reason }) => {
                    let body = json!({ "reason": required(reason, "--reason")? });
                    let a = c
                        .post("/api/v1/remediation/breaker/reset", Some(&body))
                        .await?;
                    if !out.is_document() {
                        outln!("circuit breaker reset");
                    }
                    a
                }
            };
            if out.is_document() {
                return print_doc(out, &a.json);
            }
            let status: RemedyStatus = parse(c, a.json)?;
            out!("{}", show::remediation(&status));
            Ok(())
        })
    })
}

/// `warden whoami`.
pub fn whoami(args: PlainArgs) -> ExitCode {
    run(&args.conn, |c, out| {
        Box::pin(async move {
            let a = c.get("/api/v1/whoami").await?;
            if out.is_document() {
                return print_doc(out, &a.json);
            }
            let name = a.json.get("name").and_then(Value::as_str);
            let role = a.json.get("role").and_then(Value::as_str);
            match (name, role) {
                (Some(n), Some(r)) => {
                    outln!("{n} ({r}) at {}", c.server());
                    Ok(())
                }
                _ => Err(OpsError::Answer {
                    server: c.server().to_owned(),
                    detail: "whoami without a name and a role".into(),
                }),
            }
        })
    })
}

type Step<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), OpsError>> + 'a>>;

/// Load the settings, run `f` on a small runtime, print an error as `warden: ...` and
/// turn it into the exit code.
fn run(conn: &ConnArgs, f: impl for<'a> FnOnce(&'a ApiClient, Output) -> Step<'a>) -> ExitCode {
    let flags = FlagValues {
        server: conn.server.clone(),
        token: conn.token.as_deref().map(|t| ApiKey::new(t.trim())),
        token_file: conn.token_file.clone(),
        config: conn.config.clone(),
    };
    let result = Settings::load(&flags, |name| std::env::var(name).ok())
        .map_err(|e| OpsError::Usage(e.0))
        .and_then(|settings| {
            tracing::debug!(
                server = %settings.server,
                config = ?settings.config,
                settings = %settings.provenance,
                "settings"
            );
            let client = ApiClient::new(&settings)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| OpsError::Usage(format!("cannot start the runtime: {e}")))?;
            rt.block_on(f(&client, conn.output))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warden: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `value` unless it is blank.
fn required<'a>(value: &'a str, flag: &str) -> Result<&'a str, OpsError> {
    let v = value.trim();
    if v.is_empty() {
        Err(OpsError::Usage(format!("{flag} must not be empty")))
    } else {
        Ok(v)
    }
}

/// Seconds since the epoch, now.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn print_doc(out: Output, v: &Value) -> Result<(), OpsError> {
    output::print_document(out, v).map_err(|e| OpsError::Answer {
        server: String::new(),
        detail: e.to_string(),
    })
}

fn parse<T: serde::de::DeserializeOwned>(c: &ApiClient, v: Value) -> Result<T, OpsError> {
    serde_json::from_value(v).map_err(|e| OpsError::Answer {
        server: c.server().to_owned(),
        detail: format!("not the shape this CLI knows: {e}"),
    })
}

/// The query string of a list request (`?a=b&...`, or nothing).
fn list_query(l: &ListArgs, after: Option<&str>) -> String {
    let limit = l.limit.map(|n| n.to_string());
    let pairs = [
        ("state", l.state.as_deref()),
        ("kind", l.kind.as_deref()),
        ("job", l.job.as_deref()),
        ("node", l.node.as_deref()),
        ("limit", limit.as_deref()),
        ("after", after),
    ];
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Most pages `--all` follows: a guard against a server that never stops paging.
const MAX_PAGES: usize = 100_000;

async fn list(c: &ApiClient, out: Output, l: &ListArgs) -> Result<(), OpsError> {
    let mut items: Vec<Value> = vec![];
    let mut after = l.after.clone();
    let mut more = None;
    for _ in 0..MAX_PAGES {
        let a = c
            .get(&format!(
                "/api/v1/incidents{}",
                list_query(l, after.as_deref())
            ))
            .await?;
        match a.json {
            Value::Array(page) => items.extend(page),
            _ => {
                return Err(OpsError::Answer {
                    server: c.server().to_owned(),
                    detail: "the incident list is not an array".into(),
                });
            }
        }
        match a.next_after {
            Some(next) if l.all && after.as_deref() != Some(next.as_str()) => after = Some(next),
            next => {
                more = next.filter(|_| !l.all);
                break;
            }
        }
    }
    if out.is_document() {
        print_doc(out, &Value::Array(items))?;
    } else {
        let incidents: Vec<IncidentView> = parse(c, Value::Array(items))?;
        out!(
            "{}",
            show::fit(&show::incident_rows(&incidents, now()), out.width())
        );
    }
    if let Some(next) = more {
        eprintln!("warden: more incidents: --after {next}, or --all");
    }
    Ok(())
}

async fn show_one(c: &ApiClient, out: Output, id: &str) -> Result<(), OpsError> {
    let a = c.get(&format!("/api/v1/incidents/{}", encode(id))).await?;
    if out.is_document() {
        return print_doc(out, &a.json);
    }
    let inc: IncidentView = parse(c, a.json)?;
    out!("{}", show::incident_detail(&inc, now()));
    Ok(())
}

async fn ack(c: &ApiClient, out: Output, id: &str, note: Option<&str>) -> Result<(), OpsError> {
    let body = note.map(|n| json!({ "note": n }));
    let path = format!("/api/v1/incidents/{}/ack", encode(id));
    let a = c.post(&path, body.as_ref()).await?;
    confirm(c, out, a.json, "acknowledged")
}

async fn resolve(c: &ApiClient, out: Output, id: &str, reason: &str) -> Result<(), OpsError> {
    let path = format!("/api/v1/incidents/{}/resolve", encode(id));
    let a = c.post(&path, Some(&json!({ "reason": reason }))).await?;
    confirm(c, out, a.json, "resolved")
}

/// The incident an action returned, in one line (or as JSON).
fn confirm(c: &ApiClient, out: Output, v: Value, done: &str) -> Result<(), OpsError> {
    if out.is_document() {
        return print_doc(out, &v);
    }
    let inc: IncidentView = parse(c, v)?;
    outln!(
        "{} {done}: {} {}, {}",
        inc.id,
        inc.kind.as_str(),
        inc.state.as_str(),
        show::truncate(&inc.summary, 80)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_args() -> ListArgs {
        ListArgs {
            state: None,
            kind: None,
            job: None,
            node: None,
            limit: None,
            after: None,
            all: false,
        }
    }

    #[test]
    fn list_queries_encode_their_values() {
        assert_eq!(list_query(&list_args(), None), "");
        let l = ListArgs {
            state: Some("open".into()),
            job: Some("llama 70b/2".into()),
            limit: Some(5),
            ..list_args()
        };
        assert_eq!(
            list_query(&l, Some("inc-1")),
            "?state=open&job=llama%2070b%2F2&limit=5&after=inc-1"
        );
    }

    #[test]
    fn blank_reasons_are_refused_locally() {
        assert_eq!(
            required("  ", "--reason").map_err(|e| e.exit_code()),
            Err(crate::client::EXIT_USAGE)
        );
        assert_eq!(required(" ok ", "--reason"), Ok("ok"));
    }
}
