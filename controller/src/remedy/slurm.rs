//! The Slurm actuator: drain, resume and requeue through `scontrol`.
//!
//! Every step reads before it writes. A node is drained with a reason that starts with
//! Warden's marker (`warden: `), and that marker is how Warden later tells its own drains
//! from everybody else's: a node that is already drained, draining or down for another
//! reason is [`Outcome::NotOurs`] and left as it is, and only a drain carrying the marker
//! is ever resumed.
//!
//! A job is restarted by `scontrol requeue` followed by `scontrol update JobId=..
//! ExcNodeList=..`, in that order: Slurm refuses to change the exclusions of a job that
//! is no longer pending, and a requeued job is held back for the credential lifetime
//! (`cred_expire`, 120 s by default) before it may start again, so the exclusion is in
//! place before it can. A pending job only gets the exclusion.
//!
//! A quarantined node's health check runs as a Slurm job pinned to it
//! ([`SlurmActuator::verify`]). A drained node runs no job at all, so the node is first
//! covered by a maintenance reservation of its own (`warden-verify-<node>`, flags
//! `MAINT,IGNORE_JOBS`) that keeps every other job off, then resumed, and the check job
//! runs inside the reservation. A pass leaves the node in service; a failure drains it
//! again with the ledger's state in the reason (`warden: bad: health check failed ...`).
//! The reservation goes either way.
//!
//! Commands run directly (never through a shell) with a timeout; what they print is
//! bounded before it lands in an error. The check job's command is the one place a
//! shell runs (`sbatch --wrap`), on the node, with every word quoted.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;

use super::{ActuatorError, CheckOutcome, Isolation, OWNER, Outcome, Release, Restart};

/// Most characters of a drain reason Warden writes.
pub const MAX_REASON_CHARS: usize = 200;

/// Most characters of a command's output quoted in an error.
const MAX_QUOTED_CHARS: usize = 1000;

/// Settings of the Slurm actuator (the `slurm:` section of the remediation config).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Directory holding `scontrol` and `squeue`; `None`: found on `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for every command; `None`: Slurm's own default (or the
    /// controller's environment).
    pub slurm_conf: Option<PathBuf>,
    /// Time allowed for one command, seconds; one that takes longer is killed and the
    /// step is [`ActuatorError::Retry`].
    pub command_timeout_secs: u64,
    /// The user a health check's reservation is for (the check job runs as the
    /// controller's user); `None`: `$USER`, else `root`.
    pub check_user: Option<String>,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            bin_dir: None,
            slurm_conf: None,
            command_timeout_secs: 30,
            check_user: None,
        }
    }
}

/// Drains, resumes and requeues through the Slurm client commands.
#[derive(Debug, Clone)]
pub struct SlurmActuator {
    config: SlurmConfig,
}

/// What `scontrol show node` says about a node's availability.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeState {
    /// The whole state, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`, ...
    state: String,
    /// The reason text, without Slurm's ` [user@time]` suffix; empty when none.
    reason: String,
    /// Who set the reason, when Slurm says.
    reason_by: Option<String>,
}

impl NodeState {
    /// Out of service: drained or draining, failing, or down.
    fn isolated(&self) -> bool {
        let mut parts = self.state.split('+');
        let base = parts.next().unwrap_or("");
        base == "DOWN" || base == "FAIL" || parts.any(|f| f == "DRAIN" || f == "FAIL")
    }

    /// The reason carries Warden's marker.
    fn ours(&self) -> bool {
        self.reason.starts_with(&marker())
    }

    /// Who holds the node, in words, for [`Outcome::NotOurs`].
    fn owner(&self) -> String {
        match (&self.reason_by, self.reason.is_empty()) {
            (Some(by), false) => format!("{by}: {}", self.reason),
            (None, false) => self.reason.clone(),
            (Some(by), true) => format!("{by} (state {})", self.state),
            (None, true) => format!("unknown (state {}, no reason)", self.state),
        }
    }
}

/// A job as `squeue` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobState {
    /// `PENDING`, `RUNNING`, `FAILED`, ...
    state: String,
    /// Its excluded nodes, a host list expression; empty when none.
    excluded: String,
    /// The nodes it runs on, a host list expression; empty while pending.
    nodes: String,
}

/// How the `why` of a check job's non-zero exit starts.
const CHECK_EXIT: &str = "exited with status";

/// The job id `sbatch --parsable` printed first (`1234` or `1234;cluster`).
fn job_id_of(stdout: &str) -> String {
    let id = stdout.lines().next().unwrap_or_default().trim();
    let id = id.split(';').next().unwrap_or_default();
    if id.bytes().all(|b| b.is_ascii_digit()) && !id.is_empty() {
        id.to_owned()
    } else {
        "?".to_owned()
    }
}

/// One word for `sh`: single-quoted, its own single quotes closed and escaped.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The marker every reason Warden writes starts with.
fn marker() -> String {
    format!("{OWNER}: ")
}

impl SlurmActuator {
    /// An actuator with these settings.
    pub fn new(config: SlurmConfig) -> Self {
        SlurmActuator { config }
    }

    /// Its settings.
    pub fn config(&self) -> &SlurmConfig {
        &self.config
    }

    /// Drain the node (`scontrol update NodeName=.. State=DRAIN Reason="warden: ..."`):
    /// running jobs finish, no new ones start. A node already out of service by Warden's
    /// drain is [`Outcome::AlreadyDone`]; one drained or down for any other reason is
    /// [`Outcome::NotOurs`] and left unchanged.
    pub async fn isolate(&self, req: &Isolation) -> Result<Outcome, ActuatorError> {
        check_node_name(&req.node)?;
        let node = self.node(&req.node).await?;
        if node.isolated() {
            return Ok(if node.ours() {
                Outcome::AlreadyDone
            } else {
                Outcome::NotOurs {
                    owner: node.owner(),
                }
            });
        }
        let reason = drain_reason(req);
        let subject = format!("node {}", req.node);
        self.scontrol(
            &format!("drain {}", req.node),
            &subject,
            &[
                "update",
                &format!("NodeName={}", req.node),
                "State=DRAIN",
                &format!("Reason={reason}"),
            ],
        )
        .await?;
        tracing::info!(node = %req.node, %reason, "slurm: node drained");
        Ok(Outcome::Applied)
    }

    /// Resume the node (`scontrol update NodeName=.. State=RESUME`), only when Warden
    /// drained it. A node in service is [`Outcome::AlreadyDone`]; one drained or down
    /// for another reason is [`Outcome::NotOurs`] and stays so.
    pub async fn release(&self, req: &Release) -> Result<Outcome, ActuatorError> {
        check_node_name(&req.node)?;
        let node = self.node(&req.node).await?;
        if !node.isolated() {
            return Ok(Outcome::AlreadyDone);
        }
        if !node.ours() {
            return Ok(Outcome::NotOurs {
                owner: node.owner(),
            });
        }
        let subject = format!("node {}", req.node);
        self.scontrol(
            &format!("resume {}", req.node),
            &subject,
            &["update", &format!("NodeName={}", req.node), "State=RESUME"],
        )
        .await?;
        tracing::info!(node = %req.node, by = %req.by, "slurm: node resumed");
        Ok(Outcome::Applied)
    }

    /// Restart the batch job without `req.exclude`: its excluded nodes become the union
    /// of what it had and `req.exclude`. A pending job only gets the exclusion; a running
    /// (or suspended) one, and one that ended in failure (`FAILED`, `NODE_FAIL`,
    /// `BOOT_FAIL`, `PREEMPTED`, `TIMEOUT`, `OUT_OF_MEMORY`), is requeued first. A job
    /// that completed or was cancelled is never run again ([`ActuatorError::Failed`]),
    /// and one still completing is retried later ([`ActuatorError::Retry`]). Already
    /// excluded and not running on any of them (a requeued job shows `COMPLETING` until
    /// its processes are gone): [`Outcome::AlreadyDone`]. With no nodes to exclude a
    /// running job is requeued every time: nothing tells an earlier restart apart.
    pub async fn restart(&self, req: &Restart) -> Result<Outcome, ActuatorError> {
        let id = req.job.as_str();
        check_job_id(id)?;
        for n in &req.exclude {
            check_node_name(n)?;
        }
        let subject = format!("job {id}");
        let job = self.job(id).await?;
        let had = self.hostnames(&job.excluded).await?;
        let mut excluded: Vec<String> = had.clone();
        for n in &req.exclude {
            if !excluded.contains(n) {
                excluded.push(n.clone());
            }
        }
        // With nothing to exclude nothing marks an earlier restart: requeue again.
        let covered = excluded.len() == had.len() && !req.exclude.is_empty();
        let requeue = match job.state.as_str() {
            "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "SPECIAL_EXIT" => false,
            "RUNNING" | "CONFIGURING" | "SUSPENDED" | "STOPPED" => {
                let on: BTreeSet<String> = self.hostnames(&job.nodes).await?.into_iter().collect();
                if covered && !req.exclude.iter().any(|n| on.contains(n)) {
                    return Ok(Outcome::AlreadyDone);
                }
                true
            }
            "FAILED" | "NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED" | "TIMEOUT" | "OUT_OF_MEMORY" => {
                true
            }
            // A requeued job shows COMPLETING until its processes are gone: with the
            // exclusion in place that is this step done before.
            "COMPLETING" if covered => return Ok(Outcome::AlreadyDone),
            "COMPLETING" | "RESIZING" | "SIGNALING" | "STAGE_OUT" => {
                return Err(ActuatorError::Retry {
                    what: format!("restart job {id}"),
                    why: format!("the job is {}", job.state),
                });
            }
            other => {
                return Err(ActuatorError::Failed {
                    what: format!("restart job {id}"),
                    why: format!("the job ended as {other}; it is not run again"),
                });
            }
        };
        if !requeue && (covered || req.exclude.is_empty()) {
            return Ok(Outcome::AlreadyDone);
        }
        if requeue {
            self.scontrol(&format!("requeue job {id}"), &subject, &["requeue", id])
                .await?;
        }
        if excluded.len() > had.len() {
            self.scontrol(
                &format!("exclude nodes from job {id}"),
                &subject,
                &[
                    "update",
                    &format!("JobId={id}"),
                    &format!("ExcNodeList={}", excluded.join(",")),
                ],
            )
            .await?;
        }
        tracing::info!(
            job = id,
            requeued = requeue,
            excluded = %excluded.join(","),
            "slurm: job restarted"
        );
        Ok(Outcome::Applied)
    }

    /// Run `command` as a Slurm job pinned to `node`, for at most `limit`, and say
    /// whether it passed (module docs: the reservation, the resume, the drain on a
    /// failure). A node drained or down for someone else's reason is not touched
    /// ([`ActuatorError::Retry`]: checked once its owner gives it back).
    pub async fn verify(
        &self,
        node: &str,
        command: &[String],
        limit: Duration,
    ) -> Result<CheckOutcome, ActuatorError> {
        check_node_name(node)?;
        let what = format!("health check of {node}");
        if command.is_empty() {
            return Err(ActuatorError::Failed {
                what,
                why: "no check command is configured (remediation.verify.command)".into(),
            });
        }
        let state = self.node(node).await?;
        if state.isolated() && !state.ours() {
            return Err(ActuatorError::Retry {
                what,
                why: format!("the node is held by {}, not by Warden", state.owner()),
            });
        }
        let reservation = format!("warden-verify-{node}");
        let subject = format!("node {node}");
        // One left by an earlier controller (killed mid-check) goes first.
        let _ = self.drop_reservation(&reservation).await;
        let user = self
            .config
            .check_user
            .clone()
            .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| "root".to_owned());
        self.scontrol(
            &format!("reserve {node} for its health check"),
            &subject,
            &[
                "create",
                "reservation",
                &format!("ReservationName={reservation}"),
                &format!("Nodes={node}"),
                "StartTime=now",
                "Duration=infinite",
                &format!("Users={user}"),
                "Flags=MAINT,IGNORE_JOBS",
            ],
        )
        .await?;
        let outcome = self.check_job(node, &reservation, command, limit).await;
        // A failure drains the node as bad; a check with no verdict puts a node that
        // was drained back as it was, still quarantined: it leaves the reservation only
        // drained, or returned by a pass.
        let drain_as = match &outcome {
            Ok(CheckOutcome::Failed(why)) => Some(format!("bad: health check failed: {why}")),
            Err(e) if state.isolated() => {
                Some(format!("quarantined: health check gave no verdict: {e}"))
            }
            _ => None,
        };
        let outcome = match drain_as {
            Some(why) => {
                let reason = sanitize(&format!("{}{why}", marker()));
                let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
                let drained = self
                    .scontrol(
                        &format!("drain {node} after its health check"),
                        &subject,
                        &[
                            "update",
                            &format!("NodeName={node}"),
                            "State=DRAIN",
                            &format!("Reason={reason}"),
                        ],
                    )
                    .await;
                match (outcome, drained) {
                    (Ok(o), Ok(_)) => Ok(o),
                    (Err(e), Ok(_)) => Err(e),
                    (_, Err(e)) => {
                        // Not drained again: the reservation stays and keeps other jobs
                        // off until the next check takes it down.
                        tracing::warn!(%node, error = %e, "slurm: the node stays in its health check's reservation");
                        return Err(e);
                    }
                }
            }
            None => outcome,
        };
        if let Err(e) = self.drop_reservation(&reservation).await {
            tracing::warn!(%node, error = %e, "slurm: the health check's reservation stays");
        }
        outcome
    }

    /// Resume the node inside its reservation and run the check job there.
    async fn check_job(
        &self,
        node: &str,
        reservation: &str,
        command: &[String],
        limit: Duration,
    ) -> Result<CheckOutcome, ActuatorError> {
        let subject = format!("node {node}");
        if self.node(node).await?.isolated() {
            self.scontrol(
                &format!("resume {node} into its health check's reservation"),
                &subject,
                &["update", &format!("NodeName={node}"), "State=RESUME"],
            )
            .await?;
        }
        let minutes = limit.as_secs().div_ceil(60).max(1);
        let name = format!("warden-verify-{node}");
        let wrap = command
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ");
        let out = self
            .run_for(
                "sbatch",
                &format!("run the health check job on {node}"),
                &subject,
                &[
                    "--wait",
                    "--parsable",
                    &format!("--reservation={reservation}"),
                    &format!("--nodelist={node}"),
                    "--nodes=1",
                    "--ntasks=1",
                    &format!("--time={minutes}"),
                    &format!("--job-name={name}"),
                    "--output=/dev/null",
                    &format!("--wrap={wrap}"),
                ],
                // Queueing and Slurm's own end of the job on top of the check's time.
                limit + Duration::from_secs(60),
                true,
            )
            .await;
        match out {
            Ok(text) => Ok(CheckOutcome::Passed(format!(
                "check job {} exited 0 on {node}",
                job_id_of(&text)
            ))),
            Err(ActuatorError::Failed { why, .. }) if why.starts_with(CHECK_EXIT) => {
                Ok(CheckOutcome::Failed(format!("check job on {node}: {why}")))
            }
            Err(e) => {
                // Ran out of time, or never ran: the job goes.
                let _ = self
                    .run(
                        "scancel",
                        "cancel the health check job",
                        &subject,
                        &[&format!("--name={name}")],
                    )
                    .await;
                Err(e)
            }
        }
    }

    async fn drop_reservation(&self, name: &str) -> Result<String, ActuatorError> {
        self.scontrol(
            &format!("remove reservation {name}"),
            &format!("reservation {name}"),
            &["delete", &format!("ReservationName={name}")],
        )
        .await
    }

    /// `scontrol show node NAME --oneliner`, parsed.
    async fn node(&self, name: &str) -> Result<NodeState, ActuatorError> {
        let what = format!("read node {name}");
        let subject = format!("node {name}");
        let out = self
            .scontrol(&what, &subject, &["show", "node", name, "--oneliner"])
            .await?;
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("NodeName={name} ")))
            .ok_or_else(|| ActuatorError::NotFound(format!("node {name}")))?;
        parse_node(line).ok_or_else(|| ActuatorError::Failed {
            what,
            why: format!("no State= in: {}", bounded(line)),
        })
    }

    /// `squeue` for one job, finished ones included.
    async fn job(&self, id: &str) -> Result<JobState, ActuatorError> {
        let what = format!("read job {id}");
        let out = self
            .run(
                "squeue",
                &what,
                &format!("job {id}"),
                &[
                    "--noheader",
                    "--states=all",
                    &format!("--jobs={id}"),
                    "--format=%i|%T|%x|%N",
                ],
            )
            .await?;
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        match lines.as_slice() {
            [] => Err(ActuatorError::NotFound(format!("job {id}"))),
            [line] => parse_job(line).ok_or_else(|| ActuatorError::Failed {
                what,
                why: format!("unexpected squeue line: {}", bounded(line)),
            }),
            more => Err(ActuatorError::Failed {
                what,
                why: format!(
                    "{id} names {} jobs (an array?); restart one task: {id}_N",
                    more.len()
                ),
            }),
        }
    }

    /// Expand a host list expression (`n[1-3],m4`) with `scontrol show hostnames`.
    async fn hostnames(&self, list: &str) -> Result<Vec<String>, ActuatorError> {
        if list.is_empty() || list == "(null)" {
            return Ok(Vec::new());
        }
        let out = self
            .scontrol(
                &format!("expand host list {list}"),
                &format!("host list {list}"),
                &["show", "hostnames", list],
            )
            .await?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    async fn scontrol(
        &self,
        what: &str,
        subject: &str,
        args: &[&str],
    ) -> Result<String, ActuatorError> {
        self.run("scontrol", what, subject, args).await
    }

    /// Run one Slurm command with the timeout; its stdout when it succeeds.
    /// `subject` (`node n1`, `job 12`) is what [`ActuatorError::NotFound`] names.
    async fn run(
        &self,
        program: &str,
        what: &str,
        subject: &str,
        args: &[&str],
    ) -> Result<String, ActuatorError> {
        let limit = Duration::from_secs(self.config.command_timeout_secs.max(1));
        self.run_for(program, what, subject, args, limit, false)
            .await
    }

    /// [`SlurmActuator::run`] for at most `limit`. With `exit_is_verdict` (a job run
    /// with `sbatch --wait`), a non-zero status is the job's own, answered as
    /// [`ActuatorError::Failed`] whose `why` starts with [`CHECK_EXIT`].
    async fn run_for(
        &self,
        program: &str,
        what: &str,
        subject: &str,
        args: &[&str],
        limit: Duration,
        exit_is_verdict: bool,
    ) -> Result<String, ActuatorError> {
        let path = match &self.config.bin_dir {
            Some(dir) => dir.join(program),
            None => PathBuf::from(program),
        };
        let mut cmd = tokio::process::Command::new(&path);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.config.slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        let output = match tokio::time::timeout(limit, cmd.output()).await {
            Err(_) => {
                return Err(ActuatorError::Retry {
                    what: what.to_owned(),
                    why: format!("{program} did not finish within {limit:?}"),
                });
            }
            Ok(Err(e)) => {
                return Err(ActuatorError::Failed {
                    what: what.to_owned(),
                    why: format!("cannot run {}: {e}", path.display()),
                });
            }
            Ok(Ok(o)) => o,
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = if stderr.trim().is_empty() {
            stdout.trim().to_owned()
        } else {
            stderr.trim().to_owned()
        };
        // sbatch --wait printed the job id: it ran, and its status is the verdict.
        if exit_is_verdict && !stdout.trim().is_empty() {
            return Err(ActuatorError::Failed {
                what: what.to_owned(),
                why: format!(
                    "{CHECK_EXIT} {} (job {}){}",
                    output
                        .status
                        .code()
                        .map_or_else(|| "by a signal".to_owned(), |c| c.to_string()),
                    job_id_of(&stdout),
                    if said.is_empty() || said == stdout.trim() {
                        String::new()
                    } else {
                        format!(": {}", bounded(&said))
                    }
                ),
            });
        }
        Err(classify(what, subject, &said, output.status))
    }
}

/// The error a failed command stands for, from what it printed.
fn classify(
    what: &str,
    subject: &str,
    said: &str,
    status: std::process::ExitStatus,
) -> ActuatorError {
    let lower = said.to_ascii_lowercase();
    let why = if said.is_empty() {
        format!("exited with {status} and printed nothing")
    } else {
        bounded(said)
    };
    if lower.contains("invalid job id")
        || lower.contains("invalid node name")
        || (lower.starts_with("node ") && lower.ends_with(" not found"))
    {
        return ActuatorError::NotFound(subject.to_owned());
    }
    const TRANSIENT: &[&str] = &[
        "unable to contact slurm controller",
        "slurmctld not responding",
        "socket timed out",
        "connection refused",
        "connection timed out",
        "zero bytes were transmitted",
        "resource temporarily unavailable",
        "in standby mode",
        "try again",
        "slurm_persist_conn",
    ];
    if TRANSIENT.iter().any(|t| lower.contains(t)) {
        return ActuatorError::Retry {
            what: what.to_owned(),
            why,
        };
    }
    ActuatorError::Failed {
        what: what.to_owned(),
        why,
    }
}

/// Text quoted in an error: at most [`MAX_QUOTED_CHARS`] characters.
fn bounded(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

/// The reason Warden writes on a node it drains: `warden: <incident>: <reason>`, or
/// `warden: manual (<by>): <reason>` without an incident; one line of plain ASCII with
/// nothing `scontrol` could trip on, at most [`MAX_REASON_CHARS`] characters.
pub fn drain_reason(req: &Isolation) -> String {
    let origin = match &req.incident {
        Some(id) => sanitize(id),
        None => format!("manual ({})", sanitize(&req.by)),
    };
    let why = sanitize(&req.reason);
    let why = if why.is_empty() {
        "no reason given".to_owned()
    } else {
        why
    };
    let mut text = format!("{}{origin}: {why}", marker());
    if text.len() > MAX_REASON_CHARS {
        // ASCII only: every index is a character boundary.
        text.truncate(MAX_REASON_CHARS);
        text = text.trim_end().to_owned();
    }
    text
}

/// One line of printable ASCII without quotes, brackets or backslashes (Slurm appends
/// ` [user@time]` to a reason and `scontrol` reads quotes), runs of blanks as one.
fn sanitize(text: &str) -> String {
    let kept: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && !matches!(c, '"' | '\'' | '`' | '[' | ']' | '\\') {
                c
            } else {
                ' '
            }
        })
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A node name as ingest accepts it (DNS-1123), so no host list expression.
fn check_node_name(name: &str) -> Result<(), ActuatorError> {
    warden_model::ids::check_node_name(name).map_err(|why| ActuatorError::Failed {
        what: "check node name".to_owned(),
        why,
    })
}

/// A Slurm job id: digits, optionally `_` and an array task's digits.
fn check_job_id(id: &str) -> Result<(), ActuatorError> {
    let digits = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    let ok = match id.split_once('_') {
        Some((job, task)) => digits(job) && digits(task),
        None => digits(id),
    };
    if ok {
        Ok(())
    } else {
        Err(ActuatorError::Failed {
            what: "check job id".to_owned(),
            why: format!("not a Slurm job id: {:?}", bounded(id)),
        })
    }
}

/// The state and reason from a `scontrol show node --oneliner` line. The reason is the
/// text after ` Reason=` up to Slurm's ` [user@time]`.
fn parse_node(line: &str) -> Option<NodeState> {
    let state = line
        .split(' ')
        .find_map(|f| f.strip_prefix("State="))?
        .to_owned();
    let (reason, reason_by) = match line.find(" Reason=") {
        None => (String::new(), None),
        Some(at) => {
            let rest = &line[at + " Reason=".len()..];
            match find_set_by(rest) {
                Some((end, by)) => (rest[..end].trim().to_owned(), Some(by)),
                None => (rest.trim().to_owned(), None),
            }
        }
    };
    Some(NodeState {
        state,
        reason,
        reason_by,
    })
}

/// Where ` [user@time]` starts in `rest`, and the user.
fn find_set_by(rest: &str) -> Option<(usize, String)> {
    let mut from = 0;
    while let Some(i) = rest[from..].find(" [") {
        let start = from + i;
        let inner = &rest[start + 2..];
        if let Some(close) = inner.find(']') {
            let tag = &inner[..close];
            match tag.split_once('@') {
                Some((user, _when)) if !tag.contains(' ') => {
                    return Some((start, user.to_owned()));
                }
                _ => {}
            }
        }
        from = start + 2;
    }
    None
}

/// A `%i|%T|%x|%N` line of `squeue`.
fn parse_job(line: &str) -> Option<JobState> {
    let mut f = line.trim().split('|');
    let _id = f.next()?;
    let state = f.next()?.trim().to_owned();
    let excluded = f.next()?.trim().to_owned();
    let nodes = f.next()?.trim().to_owned();
    (!state.is_empty()).then_some(JobState {
        state,
        excluded,
        nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isolation(incident: Option<&str>, reason: &str) -> Isolation {
        Isolation {
            node: "n1".into(),
            incident: incident.map(str::to_owned),
            reason: reason.into(),
            by: "alice".into(),
            at: Default::default(),
            evict: false,
        }
    }

    #[test]
    fn the_reason_is_one_marked_bounded_line() {
        assert_eq!(
            drain_reason(&isolation(
                Some("inc-7"),
                "XID 79\n  \"fell\" [off] the bus\t"
            )),
            "warden: inc-7: XID 79 fell off the bus"
        );
        assert_eq!(
            drain_reason(&isolation(None, "")),
            "warden: manual (alice): no reason given"
        );
        let long = drain_reason(&isolation(Some("i"), &"é x".repeat(500)));
        assert!(long.len() <= MAX_REASON_CHARS, "{long}");
        assert!(long.starts_with("warden: i: x x"), "{long}");
    }

    #[test]
    fn node_lines_parse_with_and_without_a_reason() {
        let line = "NodeName=n1 Arch=x86_64 OS=Linux 6.1 #1 SMP State=IDLE+DRAIN \
                    ThreadsPerCore=1 Reason=disk [ssd] swap [bob@2026-11-24T02:31:50]";
        let n = parse_node(line).expect("parses");
        assert_eq!(n.state, "IDLE+DRAIN");
        assert_eq!(n.reason, "disk [ssd] swap");
        assert_eq!(n.reason_by.as_deref(), Some("bob"));
        assert!(n.isolated() && !n.ours());
        assert_eq!(n.owner(), "bob: disk [ssd] swap");

        let n = parse_node("NodeName=n2 State=ALLOCATED Weight=1").expect("parses");
        assert!(!n.isolated());
        assert_eq!(n.reason, "");
        for (state, out) in [
            ("DOWN+NOT_RESPONDING", true),
            ("ALLOCATED+DRAIN", true),
            ("MIXED+FAIL", true),
            ("IDLE+NOT_RESPONDING", false),
        ] {
            let n = parse_node(&format!("NodeName=n State={state}")).expect("parses");
            assert_eq!(n.isolated(), out, "{state}");
        }
    }

    #[test]
    fn ids_and_names_are_checked() {
        for ok in ["12", "12_3"] {
            assert!(check_job_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "12_",
            "_3",
            "12;rm",
            "1 2",
            "12_3_4",
            "n1",
            "123456789012",
        ] {
            assert!(check_job_id(bad).is_err(), "{bad}");
        }
        assert!(check_node_name("gpu-node.rack-1").is_ok());
        for bad in ["", "n[1-2]", "n1,n2", "n1 State=DOWN", "n1\n"] {
            assert!(check_node_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_are_sorted_by_what_slurm_said() {
        let status = std::process::Command::new("false")
            .status()
            .expect("false runs");
        assert!(matches!(
            classify(
                "read job 9",
                "job 9",
                "slurm_load_jobs error: Invalid job id specified",
                status
            ),
            ActuatorError::NotFound(j) if j == "job 9"
        ));
        assert!(matches!(
            classify(
                "drain n1",
                "node n1",
                "slurm_update error: Unable to contact slurm controller (connect failure)",
                status
            ),
            ActuatorError::Retry { .. }
        ));
        assert!(matches!(
            classify("drain n1", "node n1", "Access/permission denied", status),
            ActuatorError::Failed { .. }
        ));
    }

    #[test]
    fn the_config_has_defaults_and_refuses_unknown_fields() {
        let c: SlurmConfig = warden_model::yaml::from_str("slurm_conf: /etc/slurm/slurm.conf\n")
            .expect("valid config");
        assert_eq!(c.command_timeout_secs, 30);
        assert_eq!(c.bin_dir, None);
        assert!(warden_model::yaml::from_str::<SlurmConfig>("timeout: 3\n").is_err());
    }
}
