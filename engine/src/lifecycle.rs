//! Job lifecycle reports from schedulers (`POST /api/v1/jobs/{job}/lifecycle`): the
//! body's shape, its validation (every error names the field), and what the controller
//! keeps of a job's start and end, how it ended included. Pure: no IO, no clock.

use serde::Deserialize;
use warden_model::Timestamp;
use warden_model::wire::{MAX_NAME_LEN, MAX_RANK};

/// Most nodes one report may name (the largest jobs Warden is built for run on 16,384
/// GPUs, so on at most 16,384 nodes).
pub const MAX_NODES: usize = 16_384;

/// Longest scheduler name, bytes.
pub const MAX_SCHEDULER_LEN: usize = 32;

/// Longest human job name kept, bytes.
pub const MAX_JOB_NAME_LEN: usize = 1024;

/// Highest exit code a report may carry: wait(2) keeps 8 bits of it.
pub const MAX_EXIT_CODE: u64 = 255;

/// Highest signal a report may carry: wait(2) keeps 7 bits of it (0x7f itself means
/// "stopped", never an end, but a scheduler's own numbering may use it).
pub const MAX_SIGNAL: u64 = 127;

/// Scheduler names that get their own `scheduler` metric label; any other is counted
/// as `other`, so a client cannot grow the label set.
pub const METRIC_SCHEDULERS: &[&str] = &["slurm", "kubernetes"];

/// What happened to the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(rename_all = "snake_case"))]
pub enum LifecycleEvent {
    /// The scheduler started it (Slurm: PrologSlurmctld).
    Start,
    /// It ended, however it ended (Slurm: EpilogSlurmctld).
    End,
}

impl LifecycleEvent {
    /// `start` or `end`.
    pub fn as_str(self) -> &'static str {
        match self {
            LifecycleEvent::Start => "start",
            LifecycleEvent::End => "end",
        }
    }
}

/// A validated report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleReport {
    /// Start or end.
    pub event: LifecycleEvent,
    /// `slurm`, `kubernetes`, ...: lowercase letters, digits, `-` and `_`.
    pub scheduler: String,
    /// The scheduler's own id of the job.
    pub scheduler_job_id: String,
    /// The job's name for people (may be empty).
    pub name: String,
    /// Nodes allocated, in the order given, without repeats.
    pub nodes: Vec<String>,
    /// Ranks (tasks) the job runs, when known.
    pub ranks: Option<u32>,
    /// How the job ended, as far as an end says (all unknown for a start, and for an end
    /// from a hook that does not say).
    pub end: EndState,
}

impl LifecycleReport {
    /// The `scheduler` label of `warden_job_lifecycle_events_total`.
    pub fn metric_scheduler(&self) -> &'static str {
        METRIC_SCHEDULERS
            .iter()
            .find(|s| **s == self.scheduler)
            .copied()
            .unwrap_or("other")
    }
}

/// How a job, or the worst of its steps, ended, in wait(2)'s terms, as its scheduler
/// said at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExitState {
    /// The exit code (0-255) when the job exited; `None` when a signal ended it (a
    /// process killed by a signal has no exit code) or the scheduler did not say.
    pub code: Option<u8>,
    /// The signal (1-127) that ended it; `None` when none did.
    pub signal: Option<u8>,
}

impl ExitState {
    /// From a report's two fields, range-checked before: a signal of 0 is "no signal",
    /// and an exit code of 0 beside a signal is wait(2)'s "no exit code" (Slurm's
    /// `0:9`). `None` when that leaves nothing known.
    fn from_fields(code: Option<u8>, signal: Option<u8>) -> Option<Self> {
        let signal = signal.filter(|&s| s != 0);
        let code = code.filter(|&c| c != 0 || signal.is_none());
        (code.is_some() || signal.is_some()).then_some(ExitState { code, signal })
    }

    /// Whether it ended well: exit code 0, no signal.
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none()
    }

    /// For people: "exit code 1", "killed by signal 9 (SIGKILL)", or both when a
    /// scheduler gave both.
    pub fn describe(&self) -> String {
        let killed = self.signal.map(|s| {
            let name = crate::state::signal_name(i32::from(s));
            if name == "signal" {
                format!("killed by signal {s}")
            } else {
                format!("killed by signal {s} ({name})")
            }
        });
        match (self.code, killed) {
            (Some(c), Some(k)) => format!("exit code {c}, {k}"),
            (Some(c), None) => format!("exit code {c}"),
            (None, Some(k)) => k,
            (None, None) => "no exit status".to_owned(),
        }
    }
}

/// What an end report says about how the job ended; all unknown by default (a start,
/// or an end from a hook that does not say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EndState {
    /// How the job ended (Slurm: `SLURM_JOB_EXIT_CODE`, the batch script's or
    /// salloc's status).
    pub exit: Option<ExitState>,
    /// How the worst of its steps ended (Slurm: `SLURM_JOB_DERIVED_EC`, the highest
    /// status of its steps): a batch script may exit 0 after an `srun` step failed.
    pub derived: Option<ExitState>,
}

impl EndState {
    /// Whether the report said anything about the exit.
    pub fn is_known(&self) -> bool {
        self.exit.is_some() || self.derived.is_some()
    }

    /// For people, `None` when nothing is known: "exit code 1", or with a worst step
    /// that ended otherwise, "exit code 0, worst step: exit code 2".
    pub fn describe(&self) -> Option<String> {
        let step = |d: &ExitState| format!("worst step: {}", d.describe());
        match (&self.exit, &self.derived) {
            (Some(e), Some(d)) if e != d => Some(format!("{}, {}", e.describe(), step(d))),
            (Some(e), _) => Some(e.describe()),
            (None, Some(d)) => Some(step(d)),
            (None, None) => None,
        }
    }
}

/// Why a report was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LifecycleError(pub String);

/// A scheduler's report of a job's start or end, as sent (JSON); unknown fields are
/// ignored so schedulers' hooks can add some.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = LifecycleBody))]
pub struct Body {
    /// `start` or `end`.
    #[cfg_attr(feature = "openapi", schema(value_type = LifecycleEvent))]
    event: String,
    /// `slurm`, `kubernetes`, ...: 1 to 32 lowercase letters, digits, `-` and `_`,
    /// starting with a letter.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z][a-z0-9_-]{0,31}$"))]
    scheduler: String,
    /// The scheduler's own id of the job: 1 to 253 bytes without whitespace, control
    /// characters or `/`.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 253))]
    scheduler_job_id: String,
    /// The job's name for people, at most 1024 bytes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    name: Option<String>,
    /// Nodes allocated (at most 16,384; repeats are dropped). A start must name at
    /// least one; an end may leave them out.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_items = 16384))]
    nodes: Option<Vec<String>>,
    /// Ranks (tasks) the job runs, when known.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4194304))]
    ranks: Option<u64>,
    /// An end only: the job's exit code (0 to 255) when it exited (Slurm: the high
    /// byte of `SLURM_JOB_EXIT_CODE`); left out, or 0, when a signal ended it, and left
    /// out when unknown.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 255))]
    exit_code: Option<u64>,
    /// An end only: the signal (1 to 127; 0 is none) that ended the job (Slurm: the low
    /// 7 bits of `SLURM_JOB_EXIT_CODE`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 127))]
    signal: Option<u64>,
    /// An end only: the exit code (0 to 255) of the job's worst step (Slurm:
    /// `SLURM_JOB_DERIVED_EC`, the highest exit status of its steps).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 255))]
    derived_exit_code: Option<u64>,
    /// An end only: the signal (1 to 127; 0 is none) that ended the job's worst step.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 127))]
    derived_signal: Option<u64>,
}

fn bad(msg: impl Into<String>) -> LifecycleError {
    LifecycleError(msg.into())
}

/// Whether `s` is a usable identifier: 1..=`max` bytes, no whitespace, no control
/// character, no `/`.
fn plain_id(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
}

/// Check a Warden job name from the URL path.
pub fn check_job_name(job: &str) -> Result<(), LifecycleError> {
    if plain_id(job, MAX_NAME_LEN) {
        Ok(())
    } else {
        Err(bad(format!(
            "job name {job:?} in the path must be 1..={MAX_NAME_LEN} bytes without \
             whitespace, control characters or `/`"
        )))
    }
}

/// `value` of field `field` if it is at most `max`.
fn bounded(field: &str, value: Option<u64>, max: u64) -> Result<Option<u8>, LifecycleError> {
    match value {
        None => Ok(None),
        Some(v) => u8::try_from(v)
            .ok()
            .filter(|&v| u64::from(v) <= max)
            .map(Some)
            .ok_or_else(|| {
                bad(format!(
                    "field `{field}`: {v} is not in 0..={max} (leave it out when unknown)"
                ))
            }),
    }
}

/// Parse and validate a JSON body, with the exit state an end may carry (all unknown
/// for a start).
pub fn parse(body: &[u8]) -> Result<LifecycleReport, LifecycleError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let b: Body = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let data = e.inner().classify() == serde_json::error::Category::Data;
        if !data {
            bad(format!("body: not JSON: {}", e.inner()))
        } else if matches!(path.as_str(), "" | "." | "?") {
            bad(format!("body: {}", e.inner()))
        } else {
            bad(format!("field `{path}`: {}", e.inner()))
        }
    })?;
    let event = match b.event.as_str() {
        "start" => LifecycleEvent::Start,
        "end" => LifecycleEvent::End,
        other => {
            return Err(bad(format!(
                "field `event`: unknown event {other:?}; allowed: start, end"
            )));
        }
    };
    let scheduler_ok = !b.scheduler.is_empty()
        && b.scheduler.len() <= MAX_SCHEDULER_LEN
        && b.scheduler.starts_with(|c: char| c.is_ascii_lowercase())
        && b.scheduler
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !scheduler_ok {
        return Err(bad(format!(
            "field `scheduler`: {:?} must be 1..={MAX_SCHEDULER_LEN} lowercase letters, digits, \
             `-` or `_`, starting with a letter (e.g. \"slurm\")",
            b.scheduler
        )));
    }
    if !plain_id(&b.scheduler_job_id, MAX_NAME_LEN) {
        return Err(bad(format!(
            "field `scheduler_job_id`: {:?} must be 1..={MAX_NAME_LEN} bytes without \
             whitespace, control characters or `/`",
            b.scheduler_job_id
        )));
    }
    let name = b.name.unwrap_or_default();
    if name.len() > MAX_JOB_NAME_LEN {
        return Err(bad(format!(
            "field `name`: longer than {MAX_JOB_NAME_LEN} bytes"
        )));
    }
    let given = b.nodes.unwrap_or_default();
    if given.len() > MAX_NODES {
        return Err(bad(format!(
            "field `nodes`: {} nodes, more than the {MAX_NODES} one report may name",
            given.len()
        )));
    }
    if event == LifecycleEvent::Start && given.is_empty() {
        return Err(bad(
            "field `nodes`: a start must name the nodes the job runs on (an end may leave \
             them out)",
        ));
    }
    let mut nodes: Vec<String> = Vec::with_capacity(given.len());
    let mut seen = rustc_hash::FxHashSet::default();
    for (i, n) in given.into_iter().enumerate() {
        if let Err(e) = warden_model::ids::check_node_name(&n) {
            return Err(bad(format!("field `nodes[{i}]`: {e}")));
        }
        if seen.insert(n.clone()) {
            nodes.push(n);
        }
    }
    let ranks = match b.ranks {
        None => None,
        Some(r) if r >= 1 && r <= u64::from(MAX_RANK) => Some(r as u32),
        Some(r) => {
            return Err(bad(format!(
                "field `ranks`: {r} is not in 1..={MAX_RANK} (send null when unknown)"
            )));
        }
    };
    let exit_fields = [
        ("exit_code", b.exit_code, MAX_EXIT_CODE),
        ("signal", b.signal, MAX_SIGNAL),
        ("derived_exit_code", b.derived_exit_code, MAX_EXIT_CODE),
        ("derived_signal", b.derived_signal, MAX_SIGNAL),
    ];
    let mut checked = [None; 4];
    for (slot, (field, value, max)) in checked.iter_mut().zip(exit_fields) {
        // A start has not ended: an exit state on it is a confused client, and
        // keeping it would show a running job as failed.
        if event == LifecycleEvent::Start && value.is_some() {
            return Err(bad(format!(
                "field `{field}`: only an end carries exit state (leave it out of a start)"
            )));
        }
        *slot = bounded(field, value, max)?;
    }
    let [code, signal, derived_code, derived_signal] = checked;
    let end = EndState {
        exit: ExitState::from_fields(code, signal),
        derived: ExitState::from_fields(derived_code, derived_signal),
    };
    Ok(LifecycleReport {
        event,
        scheduler: b.scheduler,
        scheduler_job_id: b.scheduler_job_id,
        name,
        nodes,
        ranks,
        end,
    })
}

pub use warden_model::view::Phase;

/// What the scheduler said about a job, kept in its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLifecycle {
    /// Scheduler name.
    pub scheduler: String,
    /// The scheduler's id of the job.
    pub scheduler_job_id: String,
    /// The job's name for people.
    pub name: String,
    /// Nodes the scheduler allocated.
    pub nodes: Vec<String>,
    /// Ranks the scheduler expects.
    pub ranks: Option<u32>,
    /// When the start was received (controller clock); `None` when only the end was.
    pub started_at: Option<Timestamp>,
    /// When the end was received (controller clock); `None` while running.
    pub ended_at: Option<Timestamp>,
    /// Times the job started again after it had ended (Slurm requeues keep the id).
    pub restarts: u32,
    /// How the last run ended, as far as its scheduler said; all unknown while it runs.
    pub end: EndState,
}

/// What applying a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The job entered this phase now.
    Changed,
    /// The job already was in this phase: nothing changed but details the report
    /// added (nodes, ranks, names).
    Repeat,
}

impl JobLifecycle {
    /// A lifecycle born of `r` at `now`.
    pub fn new(r: &LifecycleReport, now: Timestamp) -> Self {
        let mut l = JobLifecycle {
            scheduler: String::new(),
            scheduler_job_id: String::new(),
            name: String::new(),
            nodes: Vec::new(),
            ranks: None,
            started_at: None,
            ended_at: None,
            restarts: 0,
            end: EndState::default(),
        };
        l.apply(r, now);
        l
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        if self.ended_at.is_some() {
            Phase::Ended
        } else {
            Phase::Running
        }
    }

    /// Apply `r` received at `now`. Idempotent: a repeated event keeps the first time.
    /// A start after an end is a new run of the same job (a requeue); an end with no
    /// start seen before records the end alone. Like its time, the first end's exit
    /// state is kept: a repeat only adds what the first did not say (a retry from a
    /// hook that now reads the exit state).
    pub fn apply(&mut self, r: &LifecycleReport, now: Timestamp) -> Applied {
        self.scheduler.clone_from(&r.scheduler);
        self.scheduler_job_id.clone_from(&r.scheduler_job_id);
        if !r.name.is_empty() {
            self.name.clone_from(&r.name);
        }
        if !r.nodes.is_empty() {
            self.nodes.clone_from(&r.nodes);
        }
        if r.ranks.is_some() {
            self.ranks = r.ranks;
        }
        match r.event {
            LifecycleEvent::Start => {
                if self.started_at.is_some() && self.ended_at.is_none() {
                    return Applied::Repeat;
                }
                if self.ended_at.take().is_some() {
                    self.restarts += 1;
                    // How the last run ended says nothing about the new one.
                    self.end = EndState::default();
                }
                self.started_at = Some(now);
                Applied::Changed
            }
            LifecycleEvent::End => {
                self.end.exit = self.end.exit.or(r.end.exit);
                self.end.derived = self.end.derived.or(r.end.derived);
                if self.ended_at.is_some() {
                    return Applied::Repeat;
                }
                self.ended_at = Some(now);
                Applied::Changed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(event: &str, nodes: &str) -> Result<LifecycleReport, LifecycleError> {
        parse(
            format!(
                r#"{{"event":"{event}","scheduler":"slurm","scheduler_job_id":"42",
                    "name":"llama","nodes":{nodes},"ranks":8}}"#
            )
            .as_bytes(),
        )
    }

    fn err(body: &str) -> String {
        parse(body.as_bytes()).expect_err("refused").0
    }

    #[test]
    fn a_good_report_parses_and_repeated_nodes_collapse() {
        let r = report("start", r#"["n1","n2","n1"]"#).expect("valid");
        assert_eq!(r.event, LifecycleEvent::Start);
        assert_eq!(r.nodes, ["n1", "n2"]);
        assert_eq!(r.ranks, Some(8));
        assert_eq!(r.metric_scheduler(), "slurm");
        let end = report("end", "[]").expect("an end may name no nodes");
        assert!(end.nodes.is_empty());
        let minimal = parse(br#"{"event":"end","scheduler":"pbs","scheduler_job_id":"7"}"#)
            .expect("name, nodes and ranks are optional on an end");
        assert_eq!(minimal.metric_scheduler(), "other");
    }

    #[test]
    fn every_refusal_names_its_field() {
        let e = report("pause", r#"["n1"]"#).expect_err("unknown event").0;
        assert!(e.contains("`event`") && e.contains("start, end"), "{e}");
        let e = report("start", "[]").expect_err("no nodes").0;
        assert!(e.contains("`nodes`"), "{e}");
        let e = report("start", r#"["n1",""]"#).expect_err("empty node").0;
        assert!(e.contains("`nodes[1]`"), "{e}");
        let e = report("start", r#"["gpu 01"]"#).expect_err("space").0;
        assert!(e.contains("`nodes[0]`"), "{e}");
        let many: Vec<String> = (0..=MAX_NODES).map(|i| format!("\"n{i}\"")).collect();
        let e = report("start", &format!("[{}]", many.join(","))).expect_err("too many");
        assert!(e.0.contains("more than the 16384"), "{}", e.0);
        let e =
            err(r#"{"event":"start","scheduler":"Slurm!","scheduler_job_id":"1","nodes":["a"]}"#);
        assert!(e.contains("`scheduler`"), "{e}");
        let e = err(r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"","nodes":["a"]}"#);
        assert!(e.contains("`scheduler_job_id`"), "{e}");
        let e = err(
            r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"1","nodes":["a"],"ranks":0}"#,
        );
        assert!(e.contains("`ranks`"), "{e}");
        let e = err(
            r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"1","nodes":["a"],"ranks":"8"}"#,
        );
        assert!(e.contains("`ranks`"), "{e}");
        let e = err(r#"{"event":"start","scheduler":"slurm","nodes":["a"]}"#);
        assert!(e.contains("scheduler_job_id"), "{e}");
        let e = err("not json");
        assert!(e.starts_with("body:"), "{e}");
        assert!(check_job_name("4242").is_ok());
        for bad in ["", "a b", "a\u{7}", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(check_job_name(bad).is_err(), "{bad:?}");
        }
    }

    /// Job 42's end as the Slurm hook sends it, with `exit` (JSON fields) added.
    fn end_report(exit: &str) -> Result<LifecycleReport, LifecycleError> {
        parse(
            format!(r#"{{"event":"end","scheduler":"slurm","scheduler_job_id":"42"{exit}}}"#)
                .as_bytes(),
        )
    }

    fn end(exit: &str) -> Result<EndState, LifecycleError> {
        end_report(exit).map(|r| r.end)
    }

    #[test]
    fn an_end_carries_its_exit_state_in_range_or_is_refused_naming_the_field() {
        let exited = |code| {
            Some(ExitState {
                code: Some(code),
                signal: None,
            })
        };
        let killed = |signal| {
            Some(ExitState {
                code: None,
                signal: Some(signal),
            })
        };
        assert_eq!(end(""), Ok(EndState::default()));
        assert_eq!(
            end(r#","exit_code":null,"signal":null"#),
            Ok(EndState::default())
        );
        let e = end(r#","exit_code":0"#).expect("valid");
        assert_eq!(e.exit, exited(0));
        assert!(e.exit.is_some_and(|x| x.success()));
        assert_eq!(e.describe().as_deref(), Some("exit code 0"));
        // Slurm's `0:9`: killed, no exit code; a signal 0 is none.
        let e = end(r#","exit_code":0,"signal":9"#).expect("valid");
        assert_eq!(e.exit, killed(9));
        assert_eq!(
            e.describe().as_deref(),
            Some("killed by signal 9 (SIGKILL)")
        );
        assert_eq!(
            end(r#","exit_code":1,"signal":0"#).expect("valid").exit,
            exited(1)
        );
        assert_eq!(end(r#","signal":0"#), Ok(EndState::default()));
        let e = end(r#","exit_code":255,"signal":127,"derived_exit_code":2"#).expect("bounds");
        assert_eq!(
            e.describe().as_deref(),
            Some("exit code 255, killed by signal 127, worst step: exit code 2")
        );
        let e = end(r#","exit_code":3,"derived_exit_code":3,"derived_signal":0"#).expect("valid");
        assert_eq!(e.describe().as_deref(), Some("exit code 3"), "{e:?}");
        let e = end(r#","derived_signal":15"#).expect("valid");
        assert_eq!(
            e.describe().as_deref(),
            Some("worst step: killed by signal 15 (SIGTERM)")
        );

        for (field, value) in [
            ("exit_code", "256"),
            ("exit_code", "-1"),
            ("exit_code", "1.5"),
            ("exit_code", "\"1\""),
            ("signal", "128"),
            ("signal", "18446744073709551615"),
            ("derived_exit_code", "1000"),
            ("derived_signal", "200"),
        ] {
            let e = end(&format!(r#","{field}":{value}"#)).expect_err(value).0;
            assert!(
                e.contains(&format!("field `{field}`")),
                "{field}={value}: {e}"
            );
        }
        let e = end(r#","signal":128"#).expect_err("range").0;
        assert!(e.contains("0..=127"), "{e}");
        let e = err(
            r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"1","nodes":["a"],"exit_code":0}"#,
        );
        assert!(
            e.contains("`exit_code`") && e.contains("only an end"),
            "{e}"
        );
    }

    #[test]
    fn an_exit_state_is_kept_until_the_job_runs_again() {
        let t = |s: f64| Timestamp::from_secs_f64(1e9 + s);
        let start = report("start", r#"["n1"]"#).expect("valid");
        let failed = end_report(r#","exit_code":1"#).expect("valid");
        let mut l = JobLifecycle::new(&start, t(0.0));
        assert_eq!(l.apply(&failed, t(1.0)), Applied::Changed);
        assert_eq!(l.end, failed.end);
        // A repeat keeps what the first end said, and adds only what it did not say.
        let none = end_report("").expect("valid");
        assert_eq!(l.apply(&none, t(2.0)), Applied::Repeat);
        assert_eq!(l.end, failed.end);
        let other = end_report(r#","signal":9,"derived_exit_code":2"#).expect("valid");
        assert_eq!(l.apply(&other, t(2.5)), Applied::Repeat);
        assert_eq!(
            (l.end.exit, l.end.derived),
            (failed.end.exit, other.end.derived)
        );
        // A start never carries one; a requeue forgets the last run's.
        assert_eq!(l.apply(&start, t(3.0)), Applied::Changed);
        assert_eq!(l.end, EndState::default());
        let only_end = JobLifecycle::new(&failed, t(4.0));
        assert_eq!((only_end.phase(), only_end.end), (Phase::Ended, failed.end));
    }

    #[test]
    fn repeats_change_nothing_and_a_start_after_an_end_is_a_new_run() {
        let t = |s: f64| Timestamp::from_secs_f64(1e9 + s);
        let start = report("start", r#"["n1","n2"]"#).expect("valid");
        let end = report("end", "[]").expect("valid");
        let mut l = JobLifecycle::new(&start, t(0.0));
        assert_eq!(l.phase(), Phase::Running);
        assert_eq!(l.apply(&start, t(1.0)), Applied::Repeat);
        assert_eq!(l.started_at, Some(t(0.0)));
        assert_eq!(l.apply(&end, t(5.0)), Applied::Changed);
        assert_eq!(l.nodes, ["n1", "n2"], "an end without nodes keeps them");
        assert_eq!(l.apply(&end, t(6.0)), Applied::Repeat);
        assert_eq!((l.phase(), l.ended_at), (Phase::Ended, Some(t(5.0))));
        assert_eq!(l.apply(&start, t(9.0)), Applied::Changed);
        assert_eq!((l.phase(), l.restarts), (Phase::Running, 1));
        assert_eq!(l.started_at, Some(t(9.0)));
        let only_end = JobLifecycle::new(&end, t(3.0));
        assert_eq!(
            (only_end.phase(), only_end.started_at),
            (Phase::Ended, None)
        );
    }
}
