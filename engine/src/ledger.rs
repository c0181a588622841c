//! The node-health ledger: the evidence of every incident accrues to the GPUs and nodes
//! it names, with the job that ran there and the phase that job was in, across jobs and
//! time; each node moves healthy → suspect → quarantined → verifying → returned | bad,
//! every change with its reason and the incidents behind it. Pure: the engine feeds it
//! incidents, the controller stores it and runs verification through its actuator, the
//! fleet simulator drives it in virtual time.
//!
//! Attribution (docs/LEDGER.md):
//! - an XID the catalog (`rules/xid.yaml`) holds fatal quarantines its node at once;
//! - an XID the catalog puts on the application or the driver, while the job is
//!   tearing down or after its own crash, counts against the job, never the node (the
//!   engine opens no incident for the catalog's information-level XIDs at all, which
//!   the application-caused ones are);
//! - other hardware events count against the GPU: `repeat_count` of them within the
//!   window quarantine the node;
//! - a hang or crash the detectors pin on one GPU counts against it only across jobs:
//!   `repeat_count` within the window under at least `repeat_jobs` different jobs;
//! - a non-finite value first computed on one GPU, under `nan_jobs` different jobs,
//!   is suspected silent data corruption and quarantines the node;
//! - anything else a node is blamed for makes it suspect, and a suspect node with no
//!   evidence for a whole window is healthy again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use warden_model::view::{
    FleetHealthView, HealthChangeView, HealthEvidenceView, NodeHealthView, OffenderView, rel,
};
use warden_model::wire::EventSeverity;
use warden_model::xid::{Cause, XidCatalog, named_codes};
use warden_model::{Incident, IncidentKind, Timestamp};

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Nothing held against it.
    Healthy,
    /// Evidence against it, not enough to take it out.
    Suspect,
    /// Taken out; waiting for its health check.
    Quarantined,
    /// Its health check is running.
    Verifying,
    /// Its health check passed; back in service, its earlier evidence cleared.
    Returned,
    /// Its health check failed: it stays out until a person returns it.
    Bad,
}

impl HealthState {
    /// Every state, in lifecycle order.
    pub const ALL: [HealthState; 6] = [
        HealthState::Healthy,
        HealthState::Suspect,
        HealthState::Quarantined,
        HealthState::Verifying,
        HealthState::Returned,
        HealthState::Bad,
    ];

    /// The label used in the API, metrics and the store.
    pub const fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Suspect => "suspect",
            HealthState::Quarantined => "quarantined",
            HealthState::Verifying => "verifying",
            HealthState::Returned => "returned",
            HealthState::Bad => "bad",
        }
    }

    /// Whether no work may be placed on a node in this state.
    pub const fn holds_out(self) -> bool {
        matches!(
            self,
            HealthState::Quarantined | HealthState::Verifying | HealthState::Bad
        )
    }
}

/// What the job an incident came from was doing when it began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    /// Its first minutes.
    Starting,
    /// Training.
    Running,
    /// Its processes were exiting: it ended, or one of its ranks had already exited.
    TearingDown,
    /// No job ran there, or none is known.
    #[default]
    Unknown,
}

impl JobPhase {
    /// The label used in the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            JobPhase::Starting => "starting",
            JobPhase::Running => "running",
            JobPhase::TearingDown => "tearing_down",
            JobPhase::Unknown => "unknown",
        }
    }
}

/// An incident's job, and its phase at the incident's onset, as the engine saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobContext {
    /// The job.
    pub job: Option<String>,
    /// Its phase.
    pub phase: JobPhase,
}

/// What a piece of evidence weighs against the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// The job's own doing: kept for the record, never held against the node.
    Job,
    /// A hint (a straggler, a slow link, an application XID mid-run): makes the node
    /// suspect, never takes it out.
    Hint,
    /// A hang or crash pinned on the GPU: counted across jobs.
    Fault,
    /// A hardware event the catalog does not hold fatal: counted within the window.
    Hardware,
    /// A non-finite value first computed there: counted across jobs.
    Nan,
    /// The hardware is lost: quarantine at once.
    Fatal,
}

impl Weight {
    /// The label used in the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Weight::Job => "job",
            Weight::Hint => "hint",
            Weight::Fault => "fault",
            Weight::Hardware => "hardware",
            Weight::Nan => "nan",
            Weight::Fatal => "fatal",
        }
    }
}

/// One incident's evidence on one GPU of a node (or on the node, when it names none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    /// The incident's onset.
    pub at: Timestamp,
    /// The incident.
    pub incident: String,
    /// Its kind.
    pub kind: IncidentKind,
    /// The job that ran there.
    pub job: Option<String>,
    /// That job's phase.
    pub phase: JobPhase,
    /// The GPU, when the incident names one.
    pub gpu: Option<u32>,
    /// What it weighs.
    pub weight: Weight,
    /// Occurrences it stands for (an incident folding three XIDs is three).
    pub count: u32,
    /// Why it weighs what it does.
    pub why: String,
}

/// One change of a node's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// When.
    pub at: Timestamp,
    /// From.
    pub from: HealthState,
    /// To.
    pub to: HealthState,
    /// Why, in a sentence.
    pub reason: String,
    /// The incidents behind it.
    pub incidents: Vec<String>,
}

/// One node's health: its state, the evidence within the window, its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// The node.
    pub node: String,
    /// Where it stands.
    pub state: HealthState,
    /// Since when.
    pub since: Timestamp,
    /// Evidence, oldest first, at most [`LedgerConfig::max_marks`].
    pub marks: VecDeque<Mark>,
    /// State changes, oldest first, at most [`LedgerConfig::max_history`].
    pub history: VecDeque<Transition>,
    /// Evidence before this time was cleared by a passed health check.
    pub cleared_at: Option<Timestamp>,
    /// Incidents ever held against the node (weight above `job`).
    pub incidents: u64,
    /// The distinct jobs whose incidents touched the node, most recent last (bounded).
    pub jobs: VecDeque<String>,
}

impl NodeHealth {
    fn new(node: &str, now: Timestamp) -> NodeHealth {
        NodeHealth {
            node: node.to_owned(),
            state: HealthState::Healthy,
            since: now,
            marks: VecDeque::new(),
            history: VecDeque::new(),
            cleared_at: None,
            incidents: 0,
            jobs: VecDeque::new(),
        }
    }

    /// The marks that count now: within the window and after the last clearing.
    fn live(&self, now: Timestamp, window_secs: f64) -> impl Iterator<Item = &Mark> {
        let cleared = self.cleared_at;
        self.marks.iter().filter(move |m| {
            now.secs_since(m.at) <= window_secs && cleared.is_none_or(|c| m.at > c)
        })
    }

    /// Mean time between the incidents held against the node since it was first
    /// marked, seconds; `None` before the second.
    pub fn mean_secs_between(&self) -> Option<f64> {
        let mut held: Vec<Timestamp> = self.held_times().collect();
        held.sort_unstable();
        let (first, last) = (held.first()?, held.last()?);
        (held.len() > 1).then(|| last.secs_since(*first) / (held.len() - 1) as f64)
    }
}

impl NodeHealth {
    /// The times of the incidents held against the node that it still holds.
    fn held_times(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.marks
            .iter()
            .filter(|m| m.weight > Weight::Job)
            .map(|m| m.at)
    }

    /// What the API shows; times relative to `origin`.
    pub fn view(&self, origin: Timestamp) -> NodeHealthView {
        NodeHealthView {
            node: self.node.clone(),
            state: self.state.as_str().to_owned(),
            since_s: rel(self.since, origin),
            reason: self.history.back().map(|t| t.reason.clone()),
            held_out: self.state.holds_out(),
            incidents: self.incidents,
            mean_hours_between_incidents: self.mean_secs_between().map(hours),
            jobs: self.jobs.iter().cloned().collect(),
            history: self
                .history
                .iter()
                .map(|t| HealthChangeView {
                    at_s: rel(t.at, origin),
                    from: t.from.as_str().to_owned(),
                    to: t.to.as_str().to_owned(),
                    reason: t.reason.clone(),
                    incidents: t.incidents.clone(),
                })
                .collect(),
            evidence: self
                .marks
                .iter()
                .map(|m| HealthEvidenceView {
                    at_s: rel(m.at, origin),
                    incident: m.incident.clone(),
                    kind: m.kind,
                    job: m.job.clone(),
                    phase: m.phase.as_str().to_owned(),
                    gpu: m.gpu,
                    weight: m.weight.as_str().to_owned(),
                    count: m.count,
                    why: m.why.clone(),
                })
                .collect(),
        }
    }
}

fn hours(secs: f64) -> f64 {
    (secs / 3_600.0 * 100.0).round() / 100.0
}

/// The fleet's health from its nodes' records.
pub fn fleet_view<'n>(nodes: impl IntoIterator<Item = &'n NodeHealth>) -> FleetHealthView {
    let nodes: Vec<&NodeHealth> = nodes.into_iter().collect();
    let mut by_state: std::collections::BTreeMap<String, u64> = HealthState::ALL
        .iter()
        .map(|s| (s.as_str().to_owned(), 0))
        .collect();
    for n in &nodes {
        *by_state.entry(n.state.as_str().to_owned()).or_default() += 1;
    }
    let held_out = nodes
        .iter()
        .filter(|n| n.state.holds_out())
        .map(|n| n.node.clone())
        .collect();
    let mut offenders: Vec<&&NodeHealth> = nodes.iter().filter(|n| n.incidents > 0).collect();
    offenders.sort_by(|a, b| b.incidents.cmp(&a.incidents).then(a.node.cmp(&b.node)));
    let top_offenders = offenders
        .into_iter()
        .take(10)
        .map(|n| OffenderView {
            node: n.node.clone(),
            state: n.state.as_str().to_owned(),
            incidents: n.incidents,
            jobs: n.jobs.len() as u64,
            mean_hours_between_incidents: n.mean_secs_between().map(hours),
        })
        .collect();
    let mut times: Vec<Timestamp> = nodes.iter().flat_map(|n| n.held_times()).collect();
    times.sort_unstable();
    let mean = match (times.first(), times.last()) {
        (Some(a), Some(b)) if times.len() > 1 => {
            Some(hours(b.secs_since(*a) / (times.len() - 1) as f64))
        }
        _ => None,
    };
    FleetHealthView {
        by_state,
        held_out,
        top_offenders,
        mean_hours_between_incidents: mean,
    }
}

/// The ledger's thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerConfig {
    /// How long evidence counts, seconds (default 7 days).
    pub window_secs: f64,
    /// Hardware events, or pinned faults, on one GPU within the window that quarantine
    /// its node (default 3).
    pub repeat_count: u32,
    /// Different jobs a pinned hang or crash must come from to count (default 2).
    pub repeat_jobs: usize,
    /// Different jobs a non-finite value on one GPU must come from to be suspected
    /// silent data corruption (default 2).
    pub nan_jobs: usize,
    /// A job is starting for this long after its scheduler reported its start, seconds.
    pub starting_secs: f64,
    /// Below this confidence an incident's culprit is not held against its node.
    pub min_confidence: f64,
    /// Marks kept per node.
    pub max_marks: usize,
    /// Transitions kept per node.
    pub max_history: usize,
    /// Nodes kept; past it, the longest-healthy nodes are forgotten.
    pub max_nodes: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            window_secs: 7.0 * 86_400.0,
            repeat_count: 3,
            repeat_jobs: 2,
            nan_jobs: 2,
            starting_secs: 300.0,
            min_confidence: 0.7,
            max_marks: 64,
            max_history: 64,
            max_nodes: 100_000,
        }
    }
}

/// Why a request to the ledger was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The ledger holds nothing on that node.
    #[error("the ledger holds nothing on node {0:?}")]
    UnknownNode(String),
    /// The node is not in a state the request applies to.
    #[error("node {node:?} is {state}, not {wanted}")]
    WrongState {
        /// The node.
        node: String,
        /// Where it stands.
        state: &'static str,
        /// What the request needs.
        wanted: &'static str,
    },
}

/// The ledger.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    cfg: LedgerConfig,
    nodes: BTreeMap<String, NodeHealth>,
    /// Nodes changed since [`Ledger::take_dirty`] was last called.
    dirty: BTreeSet<String>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new(cfg: LedgerConfig) -> Ledger {
        Ledger {
            cfg,
            nodes: BTreeMap::new(),
            dirty: BTreeSet::new(),
        }
    }

    /// Its thresholds.
    pub fn config(&self) -> &LedgerConfig {
        &self.cfg
    }

    /// Take back what a store held (at start, or on becoming the leader).
    pub fn restore(&mut self, nodes: impl IntoIterator<Item = NodeHealth>) {
        for n in nodes {
            self.nodes.insert(n.node.clone(), n);
        }
    }

    /// One node's health.
    pub fn node(&self, node: &str) -> Option<&NodeHealth> {
        self.nodes.get(node)
    }

    /// Every node the ledger holds anything on, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeHealth> {
        self.nodes.values()
    }

    /// The state of `node` (healthy when the ledger holds nothing on it).
    pub fn state(&self, node: &str) -> HealthState {
        self.nodes
            .get(node)
            .map_or(HealthState::Healthy, |n| n.state)
    }

    /// The nodes no work may be placed on: quarantined, verifying or bad.
    pub fn held_out(&self) -> BTreeSet<String> {
        self.nodes
            .values()
            .filter(|n| n.state.holds_out())
            .map(|n| n.node.clone())
            .collect()
    }

    /// The nodes whose health check should start: quarantined.
    pub fn to_verify(&self) -> Vec<String> {
        self.nodes
            .values()
            .filter(|n| n.state == HealthState::Quarantined)
            .map(|n| n.node.clone())
            .collect()
    }

    /// The nodes changed since the last call, for the store.
    pub fn take_dirty(&mut self) -> Vec<NodeHealth> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .filter_map(|n| self.nodes.get(&n).cloned())
            .collect()
    }

    /// Fold an incident (new, or changed: an incident is counted once per GPU, at its
    /// heaviest) into the ledger; the transitions it caused.
    pub fn observe(
        &mut self,
        inc: &Incident,
        ctx: &JobContext,
        now: Timestamp,
    ) -> Vec<(String, Transition)> {
        let Some((weight, why)) = weigh(inc, ctx, self.cfg.min_confidence) else {
            return Vec::new();
        };
        let count = named_codes(texts(inc))
            .iter()
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(1);
        let mut places: Vec<(String, Option<u32>)> = inc
            .gpus
            .iter()
            .map(|g| (g.node.clone(), Some(g.index)))
            .collect();
        for n in &inc.nodes {
            if !places.iter().any(|(p, _)| p == n) {
                places.push((n.clone(), None));
            }
        }
        let mut out = Vec::new();
        for (node, gpu) in places {
            let mark = Mark {
                at: inc.onset,
                incident: inc.id.clone(),
                kind: inc.kind,
                job: ctx.job.clone(),
                phase: ctx.phase,
                gpu,
                weight,
                count,
                why: why.clone(),
            };
            if let Some(t) = self.add(&node, mark, now) {
                out.push((node, t));
            }
        }
        out
    }

    fn add(&mut self, node: &str, mark: Mark, now: Timestamp) -> Option<Transition> {
        if !self.nodes.contains_key(node) && self.nodes.len() >= self.cfg.max_nodes {
            self.forget_one();
        }
        let cfg = self.cfg.clone();
        let entry = self
            .nodes
            .entry(node.to_owned())
            .or_insert_with(|| NodeHealth::new(node, now));
        match entry
            .marks
            .iter_mut()
            .find(|m| m.incident == mark.incident && m.gpu == mark.gpu)
        {
            // The incident again: its latest reading decides what it weighs (a diagnosis
            // may put a hang on the program), its largest count how often it happened.
            Some(m) if m.weight == mark.weight && m.count >= mark.count => return None,
            Some(m) => {
                m.count = m.count.max(mark.count);
                m.kind = mark.kind;
                m.weight = mark.weight;
                m.why = mark.why;
                m.phase = mark.phase;
            }
            None => {
                if mark.weight > Weight::Job {
                    entry.incidents = entry.incidents.saturating_add(1);
                }
                if let Some(j) = &mark.job {
                    entry.jobs.retain(|x| x != j);
                    entry.jobs.push_back(j.clone());
                    while entry.jobs.len() > cfg.max_marks {
                        entry.jobs.pop_front();
                    }
                }
                entry.marks.push_back(mark);
                while entry.marks.len() > cfg.max_marks {
                    entry.marks.pop_front();
                }
            }
        }
        self.dirty.insert(node.to_owned());
        let (to, reason, incidents) = judge(entry, &cfg, now)?;
        Some(move_to(entry, to, reason, incidents, now, cfg.max_history))
    }

    /// Forget the node that has been healthy longest (the ledger is full).
    fn forget_one(&mut self) {
        let oldest = self
            .nodes
            .values()
            .filter(|n| n.state == HealthState::Healthy || n.state == HealthState::Returned)
            .min_by_key(|n| n.since)
            .map(|n| n.node.clone());
        if let Some(n) = oldest {
            self.nodes.remove(&n);
        }
    }

    /// Let time pass: a suspect or returned node with no evidence left in the window is
    /// healthy again. The transitions.
    pub fn tick(&mut self, now: Timestamp) -> Vec<(String, Transition)> {
        let window = self.cfg.window_secs;
        let max_history = self.cfg.max_history;
        let mut out = Vec::new();
        for n in self.nodes.values_mut() {
            let quiet = n.live(now, window).all(|m| m.weight == Weight::Job);
            let after_return = n.state == HealthState::Returned && now.secs_since(n.since) > window;
            if (n.state == HealthState::Suspect && quiet) || after_return {
                let reason = format!("nothing held against it for {}", span(window));
                let t = move_to(
                    n,
                    HealthState::Healthy,
                    reason,
                    Vec::new(),
                    now,
                    max_history,
                );
                self.dirty.insert(n.node.clone());
                out.push((n.node.clone(), t));
            }
        }
        out
    }

    /// The health check of a quarantined node started.
    pub fn verifying(
        &mut self,
        node: &str,
        how: &str,
        now: Timestamp,
    ) -> Result<Transition, LedgerError> {
        self.step(
            node,
            HealthState::Quarantined,
            HealthState::Verifying,
            format!("health check started: {how}"),
            now,
        )
    }

    /// The health check of a verifying node ended: returned on a pass (its evidence
    /// cleared), bad on a failure.
    pub fn verified(
        &mut self,
        node: &str,
        passed: bool,
        detail: &str,
        now: Timestamp,
    ) -> Result<Transition, LedgerError> {
        let (to, verdict) = if passed {
            (HealthState::Returned, "passed")
        } else {
            (HealthState::Bad, "failed")
        };
        let t = self.step(
            node,
            HealthState::Verifying,
            to,
            format!("health check {verdict}: {detail}"),
            now,
        )?;
        if passed && let Some(n) = self.nodes.get_mut(node) {
            n.cleared_at = Some(now);
        }
        Ok(t)
    }

    /// A person returns a node the ledger holds out (or quarantines one it does not):
    /// `hold` true quarantines, false returns it with its evidence cleared.
    pub fn decide(
        &mut self,
        node: &str,
        hold: bool,
        who: &str,
        reason: &str,
        now: Timestamp,
    ) -> Transition {
        let max_history = self.cfg.max_history;
        let n = self
            .nodes
            .entry(node.to_owned())
            .or_insert_with(|| NodeHealth::new(node, now));
        let (to, what) = if hold {
            (HealthState::Quarantined, "quarantined")
        } else {
            (HealthState::Returned, "returned")
        };
        if !hold {
            n.cleared_at = Some(now);
        }
        self.dirty.insert(node.to_owned());
        move_to(
            n,
            to,
            format!("{what} by {who}: {reason}"),
            Vec::new(),
            now,
            max_history,
        )
    }

    fn step(
        &mut self,
        node: &str,
        from: HealthState,
        to: HealthState,
        reason: String,
        now: Timestamp,
    ) -> Result<Transition, LedgerError> {
        let max_history = self.cfg.max_history;
        let n = self
            .nodes
            .get_mut(node)
            .ok_or_else(|| LedgerError::UnknownNode(node.to_owned()))?;
        if n.state != from {
            return Err(LedgerError::WrongState {
                node: node.to_owned(),
                state: n.state.as_str(),
                wanted: from.as_str(),
            });
        }
        self.dirty.insert(node.to_owned());
        Ok(move_to(n, to, reason, Vec::new(), now, max_history))
    }
}

fn move_to(
    n: &mut NodeHealth,
    to: HealthState,
    reason: String,
    incidents: Vec<String>,
    now: Timestamp,
    max_history: usize,
) -> Transition {
    let t = Transition {
        at: now,
        from: n.state,
        to,
        reason,
        incidents,
    };
    n.state = to;
    n.since = now;
    n.history.push_back(t.clone());
    while n.history.len() > max_history {
        n.history.pop_front();
    }
    t
}

/// Where the evidence now puts a node, when that differs from where it stands.
fn judge(
    n: &NodeHealth,
    cfg: &LedgerConfig,
    now: Timestamp,
) -> Option<(HealthState, String, Vec<String>)> {
    if n.state.holds_out() {
        return None;
    }
    let live: Vec<&Mark> = n.live(now, cfg.window_secs).collect();
    let ids = |ms: &[&Mark]| ms.iter().map(|m| m.incident.clone()).collect::<Vec<_>>();
    if let Some(m) = live.iter().rev().find(|m| m.weight == Weight::Fatal) {
        return Some((
            HealthState::Quarantined,
            format!("{} ({})", m.why, gpu_name(m.gpu)),
            vec![m.incident.clone()],
        ));
    }
    let gpus: BTreeSet<Option<u32>> = live.iter().map(|m| m.gpu).collect();
    for gpu in gpus {
        let on: Vec<&Mark> = live.iter().copied().filter(|m| m.gpu == gpu).collect();
        let jobs = |ms: &[&Mark]| {
            ms.iter()
                .filter_map(|m| m.job.as_deref())
                .collect::<BTreeSet<_>>()
                .len()
        };
        let nan: Vec<&Mark> = on
            .iter()
            .copied()
            .filter(|m| m.weight == Weight::Nan)
            .collect();
        if jobs(&nan) >= cfg.nan_jobs {
            return Some((
                HealthState::Quarantined,
                format!(
                    "suspected silent data corruption: non-finite values first computed on {} under {} different jobs within {}",
                    gpu_name(gpu),
                    jobs(&nan),
                    span(cfg.window_secs)
                ),
                ids(&nan),
            ));
        }
        let hardware: Vec<&Mark> = on
            .iter()
            .copied()
            .filter(|m| m.weight == Weight::Hardware)
            .collect();
        let occurrences: u32 = hardware.iter().map(|m| m.count.max(1)).sum();
        if occurrences >= cfg.repeat_count {
            return Some((
                HealthState::Quarantined,
                format!(
                    "{} hardware events on {} within {}",
                    occurrences,
                    gpu_name(gpu),
                    span(cfg.window_secs)
                ),
                ids(&hardware),
            ));
        }
        let pinned: Vec<&Mark> = on
            .iter()
            .copied()
            .filter(|m| m.weight >= Weight::Fault)
            .collect();
        if pinned.len() >= cfg.repeat_count as usize && jobs(&pinned) >= cfg.repeat_jobs {
            return Some((
                HealthState::Quarantined,
                format!(
                    "implicated by {} incidents under {} different jobs on {} within {}",
                    pinned.len(),
                    jobs(&pinned),
                    gpu_name(gpu),
                    span(cfg.window_secs)
                ),
                ids(&pinned),
            ));
        }
    }
    let held: Vec<&Mark> = live
        .iter()
        .copied()
        .filter(|m| m.weight > Weight::Job)
        .collect();
    if !held.is_empty() && n.state != HealthState::Suspect {
        let last = held[held.len() - 1];
        return Some((
            HealthState::Suspect,
            format!("{} ({})", last.why, gpu_name(last.gpu)),
            ids(&held),
        ));
    }
    None
}

fn gpu_name(gpu: Option<u32>) -> String {
    gpu.map_or_else(|| "the node".to_owned(), |g| format!("GPU {g}"))
}

fn span(secs: f64) -> String {
    if secs >= 86_400.0 && (secs / 86_400.0).fract() == 0.0 {
        format!("{}d", secs / 86_400.0)
    } else if secs >= 3_600.0 {
        format!("{:.0}h", secs / 3_600.0)
    } else {
        format!("{secs:.0}s")
    }
}

fn texts(inc: &Incident) -> impl Iterator<Item = &str> {
    std::iter::once(inc.summary.as_str()).chain(inc.evidence.iter().map(|e| e.text.as_str()))
}

/// What an incident weighs against the nodes it names, and why; `None` when it names
/// no culprit worth holding against one.
pub fn weigh(inc: &Incident, ctx: &JobContext, min_confidence: f64) -> Option<(Weight, String)> {
    let catalog = XidCatalog::builtin();
    let user_code = inc
        .diagnosis
        .as_ref()
        .and_then(|d| d.fault_locus.as_deref())
        == Some("user-code");
    let teardown = ctx.phase == JobPhase::TearingDown;
    match inc.kind {
        IncidentKind::GpuFault => {
            let codes = named_codes(texts(inc));
            let severity = |c: u32| {
                texts(inc)
                    .map(|t| catalog.severity_in(c, t))
                    .max_by_key(|s| *s as i32)
                    .unwrap_or(EventSeverity::Warning)
            };
            if let Some((c, _)) = codes
                .iter()
                .find(|(c, _)| severity(*c) == EventSeverity::Fatal)
            {
                return Some((Weight::Fatal, format!("XID {c}, fatal in the XID catalog")));
            }
            if codes.is_empty() {
                // A hardware event named without an XID (ECC, NVLink, PCIe): the
                // finding grades it.
                if inc.summary.contains(", fatal") {
                    return Some((
                        Weight::Fatal,
                        format!("{}, fatal", first_clause(&inc.summary)),
                    ));
                }
                return Some((Weight::Hardware, first_clause(&inc.summary)));
            }
            let list = codes
                .iter()
                .map(|(c, _)| format!("XID {c}"))
                .collect::<Vec<_>>()
                .join(", ");
            let cause_in = |causes: &[Cause]| {
                codes
                    .iter()
                    .all(|(c, _)| catalog.get(*c).is_some_and(|x| causes.contains(&x.cause)))
            };
            let application = cause_in(&[Cause::Application]);
            // Processes killed or exiting leave the application's and the driver's
            // XIDs behind; memory, links and the board stay the hardware's.
            if teardown && cause_in(&[Cause::Application, Cause::Driver]) {
                return Some((
                    Weight::Job,
                    format!("{list} while the job was tearing down"),
                ));
            }
            if application {
                return Some((
                    Weight::Hint,
                    format!("{list}, caused by the application in the XID catalog"),
                ));
            }
            Some((Weight::Hardware, list))
        }
        IncidentKind::Nan => {
            if inc.gpus.is_empty() || inc.gpus.len() > 2 || inc.confidence < min_confidence {
                return None;
            }
            Some((
                Weight::Nan,
                "non-finite values first computed here".to_owned(),
            ))
        }
        IncidentKind::Hang | IncidentKind::Crash => {
            if inc.confidence < min_confidence || inc.nodes.len() > 2 {
                return None;
            }
            if user_code || teardown {
                return Some((
                    Weight::Job,
                    format!("{} put on the program", inc.kind.as_str()),
                ));
            }
            Some((Weight::Fault, format!("{} pinned here", inc.kind.as_str())))
        }
        IncidentKind::Straggler | IncidentKind::SlowLink => {
            if inc.confidence < min_confidence || inc.nodes.len() > 2 {
                return None;
            }
            Some((Weight::Hint, format!("{} here", inc.kind.as_str())))
        }
    }
}

fn first_clause(s: &str) -> String {
    s.split([';', ',']).next().unwrap_or(s).trim().to_owned()
}

#[cfg(test)]
mod tests;
