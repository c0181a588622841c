//! Job lifecycle reports from schedulers (`POST /api/v1/jobs/{job}/lifecycle`): the
//! body's shape, its validation (every error names the field), and what the controller
//! keeps of a job's start and end. Pure: no IO, no clock.

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

/// Parse and validate a JSON body.
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
    Ok(LifecycleReport {
        event,
        scheduler: b.scheduler,
        scheduler_job_id: b.scheduler_job_id,
        name,
        nodes,
        ranks,
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
    /// start seen before records the end alone.
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
                }
                self.started_at = Some(now);
                Applied::Changed
            }
            LifecycleEvent::End => {
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
