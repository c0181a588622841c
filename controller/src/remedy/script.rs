//! The script actuator, for schedulers and systems Warden has no actuator for: runs a
//! program of yours with the request in its environment and reads the outcome from its
//! exit status.
//!
//! Environment: `WARDEN_ACTION` (`isolate`, `release`, `restart`, `verify`), `WARDEN_NODE`,
//! `WARDEN_EVICT` (`true`/`false`), `WARDEN_JOB`, `WARDEN_NAMESPACE`, `WARDEN_EXCLUDE`
//! (comma-separated nodes), `WARDEN_RESUME_PATH`, `WARDEN_RESUME_STEP`,
//! `WARDEN_RESUME_FORMAT`, `WARDEN_INCIDENT`, `WARDEN_REASON`, `WARDEN_BY`, `WARDEN_AT`
//! (ns since the epoch). Exit status: 0 done, 3 already so, 4 another owner holds the
//! node (first line of stdout: who), 75 try again later, anything else failed (stderr
//! says why). For `verify` (a quarantined node's health check, e.g. `dcgmi diag -r 2`
//! over ssh): 0 the node passed, 75 try again later, anything else it failed (the first
//! line of stderr, or else of stdout, says why); it may take the check's `timeout`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncReadExt;

use super::{ActuatorError, CheckOutcome, Isolation, Outcome, Release, Restart};

/// Most bytes of a script's stdout or stderr kept.
const MAX_OUTPUT: usize = 4096;

/// The `script` section of the remediation configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptConfig {
    /// The program (an absolute path).
    pub program: PathBuf,
    /// Arguments before the request (the request itself is in the environment).
    #[serde(default)]
    pub args: Vec<String>,
    /// Seconds a run may take before it is killed and counted as failed (default 60).
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
}

fn default_timeout() -> u64 {
    60
}

impl ScriptConfig {
    /// Problems with the section, as `(field, message)`.
    pub fn problems(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.program.is_absolute() {
            out.push((
                format!("{prefix}.program"),
                format!("{} is not an absolute path", self.program.display()),
            ));
        }
        if self.timeout_secs == 0 {
            out.push((
                format!("{prefix}.timeout_secs"),
                "must be at least 1".into(),
            ));
        }
        out
    }
}

/// Runs the configured program for each request.
#[derive(Debug, Clone)]
pub struct ScriptActuator {
    config: ScriptConfig,
}

impl ScriptActuator {
    /// An actuator running `config.program`.
    pub fn new(config: ScriptConfig) -> Self {
        ScriptActuator { config }
    }

    /// Take a node out of service.
    pub async fn isolate(&self, req: &Isolation) -> Result<Outcome, ActuatorError> {
        let env = vec![
            ("WARDEN_ACTION", "isolate".to_owned()),
            ("WARDEN_NODE", req.node.clone()),
            ("WARDEN_EVICT", req.evict.to_string()),
            ("WARDEN_INCIDENT", req.incident.clone().unwrap_or_default()),
            ("WARDEN_REASON", req.reason.clone()),
            ("WARDEN_BY", req.by.clone()),
            ("WARDEN_AT", req.at.0.to_string()),
        ];
        self.run(&format!("isolate {}", req.node), env).await
    }

    /// Give a node back.
    pub async fn release(&self, req: &Release) -> Result<Outcome, ActuatorError> {
        let env = vec![
            ("WARDEN_ACTION", "release".to_owned()),
            ("WARDEN_NODE", req.node.clone()),
            ("WARDEN_BY", req.by.clone()),
            ("WARDEN_AT", req.at.0.to_string()),
        ];
        self.run(&format!("release {}", req.node), env).await
    }

    /// Restart a job without some nodes.
    pub async fn restart(&self, req: &Restart) -> Result<Outcome, ActuatorError> {
        let resume = req.resume.as_ref();
        let env = vec![
            ("WARDEN_ACTION", "restart".to_owned()),
            ("WARDEN_JOB", req.job.clone()),
            (
                "WARDEN_NAMESPACE",
                req.namespace.clone().unwrap_or_default(),
            ),
            ("WARDEN_EXCLUDE", req.exclude.join(",")),
            (
                "WARDEN_RESUME_PATH",
                resume.map_or(String::new(), |r| r.path.display().to_string()),
            ),
            (
                "WARDEN_RESUME_STEP",
                resume.map_or(String::new(), |r| r.step.to_string()),
            ),
            (
                "WARDEN_RESUME_FORMAT",
                resume.map_or(String::new(), |r| r.format.to_owned()),
            ),
            ("WARDEN_INCIDENT", req.incident.clone().unwrap_or_default()),
            ("WARDEN_AT", req.at.0.to_string()),
        ];
        self.run(&format!("restart job {}", req.job), env).await
    }

    /// Run the health check of a quarantined node, for at most `limit`.
    pub async fn verify(&self, node: &str, limit: Duration) -> Result<CheckOutcome, ActuatorError> {
        let what = format!("health check of {node}");
        let env = vec![
            ("WARDEN_ACTION", "verify".to_owned()),
            ("WARDEN_NODE", node.to_owned()),
        ];
        let (code, out, err) = self.exec(&what, env, limit).await?;
        let first = |t: &str| t.lines().next().unwrap_or_default().to_owned();
        let said = if err.is_empty() {
            first(&out)
        } else {
            first(&err)
        };
        match code {
            Some(0) => Ok(CheckOutcome::Passed(if said.is_empty() {
                "the check exited 0".to_owned()
            } else {
                said
            })),
            Some(75) => Err(ActuatorError::Retry { what, why: said }),
            Some(code) => Ok(CheckOutcome::Failed(format!("exit status {code}: {said}"))),
            None => Ok(CheckOutcome::Failed(
                "the check was killed by a signal".into(),
            )),
        }
    }

    async fn run(
        &self,
        what: &str,
        env: Vec<(&'static str, String)>,
    ) -> Result<Outcome, ActuatorError> {
        let failed = |why: String| ActuatorError::Failed {
            what: what.to_owned(),
            why,
        };
        let limit = Duration::from_secs(self.config.timeout_secs);
        let (code, out, err) = self.exec(what, env, limit).await?;
        match code {
            Some(0) => Ok(Outcome::Applied),
            Some(3) => Ok(Outcome::AlreadyDone),
            Some(4) => Ok(Outcome::NotOurs {
                owner: out.lines().next().unwrap_or("unknown").to_owned(),
            }),
            Some(75) => Err(ActuatorError::Retry {
                what: what.to_owned(),
                why: err,
            }),
            Some(code) => Err(failed(format!("exit status {code}: {err}"))),
            None => Err(failed("killed by a signal".into())),
        }
    }

    /// Run the program with `env` for at most `limit`: its exit code (none when a
    /// signal ended it), and its stdout and stderr, trimmed and bounded.
    async fn exec(
        &self,
        what: &str,
        env: Vec<(&'static str, String)>,
        limit: Duration,
    ) -> Result<(Option<i32>, String, String), ActuatorError> {
        let failed = |why: String| ActuatorError::Failed {
            what: what.to_owned(),
            why,
        };
        let mut child = tokio::process::Command::new(&self.config.program)
            .args(&self.config.args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot run {}: {e}", self.config.program.display())))?;
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let read = async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            let read_out = async {
                if let Some(s) = stdout.as_mut() {
                    let _ = s.take(MAX_OUTPUT as u64).read_to_end(&mut out).await;
                }
            };
            let read_err = async {
                if let Some(s) = stderr.as_mut() {
                    let _ = s.take(MAX_OUTPUT as u64).read_to_end(&mut err).await;
                }
            };
            tokio::join!(read_out, read_err);
            let status = child.wait().await;
            (status, out, err)
        };
        let (status, out, err) = tokio::time::timeout(limit, read)
            .await
            .map_err(|_| failed(format!("no answer within {} s", limit.as_secs())))?;
        let status = status.map_err(|e| failed(format!("waiting for it: {e}")))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
        Ok((status.code(), text(&out), text(&err)))
    }
}
