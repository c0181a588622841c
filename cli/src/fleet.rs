//! `warden sim --fleet FILE`: jobs placed over a pool of nodes for simulated days,
//! through the engine (its detectors and node-health ledger) and the shipped policy, as
//! the controller runs them. Bad GPUs (intermittent XIDs, silent data corruption) and
//! job-caused XIDs are the truth the controller never sees: it learns of them only
//! through the batches an agent would send. The report holds each node's final state,
//! every placement, the injected faults, the incidents, and a score of the ledger's
//! decisions against that truth (docs/LEDGER.md, "Fleet simulation").

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use warden_controller::remedy::policy::{ActionName, Decision, NoHistory, Policy};
use warden_engine::ledger::HealthState;
use warden_engine::lifecycle::{EndState, LifecycleEvent, LifecycleReport};
use warden_engine::{Change, Engine, EngineConfig};
use warden_model::view::IncidentView;
use warden_model::wire::{
    Batch, Heartbeat, JobSignals, NodeEvent, NodeEventKind, ProcessState, RankInfo, TrainingMetric,
};
use warden_model::xid::XidCatalog;
use warden_model::{Incident, IncidentKind, Timestamp};
use warden_sim::rng::Draw;
use warden_sim::scenario::node_name;

/// Largest fleet, nodes.
const MAX_NODES: u32 = 4096;
/// Most GPUs per node.
const MAX_GPUS: u32 = 16;
/// Longest run, days.
const MAX_DAYS: f64 = 31.0;
/// Most job entries, bad GPUs or noise entries in a file.
const MAX_ENTRIES: usize = 256;
/// Largest fleet file, bytes.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The simulation's step, seconds: the engine's detector pass and the ledger's
/// decisions run once per step.
const STEP_SECS: f64 = 60.0;
/// How often each node of a running job reports its ranks and step, seconds.
const REPORT_SECS: f64 = 1_200.0;
/// How long after the policy asks for a diagnosis it stops waiting, seconds.
const DIAGNOSIS_WAIT_SECS: f64 = 20.0;
/// Time zero of the run.
const T0: i64 = 1_767_225_600 * 1_000_000_000;

/// A fleet file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSpec {
    /// Seed of every random draw.
    #[serde(default)]
    pub seed: u64,
    /// The pool.
    pub fleet: Shape,
    /// The jobs, placed on free healthy nodes as they arrive.
    pub jobs: Vec<JobSpec>,
    /// The truth the controller never sees.
    #[serde(default)]
    pub bad_gpus: Vec<BadGpu>,
    /// Job-caused XIDs: not the node's fault.
    #[serde(default)]
    pub app_noise: Vec<AppNoise>,
    /// The health check.
    #[serde(default)]
    pub verify: Verify,
}

/// The pool and the run's length.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Simulated days.
    pub days: f64,
}

/// A job: run once, again as soon as it ends (`repeat`), or every `every_hours`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Its name; instances are `NAME-1`, `NAME-2`, ...
    pub name: String,
    /// Nodes it takes.
    pub nodes: u32,
    /// Hours of work.
    pub hours: f64,
    /// Submitted again as soon as it ends.
    #[serde(default)]
    pub repeat: bool,
    /// Submitted every this many hours.
    pub every_hours: Option<f64>,
}

/// What is wrong with a bad GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BadKind {
    /// It raises XID `code` every `mean_hours` of use, on average.
    IntermittentXid,
    /// It computes non-finite values in the jobs that use it, every `mean_hours` of
    /// use on average.
    Sdc,
}

/// A bad GPU.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BadGpu {
    /// Its node (`node-17`: the index counts, as `warden sim` names nodes).
    pub node: String,
    /// Its index on the node.
    pub gpu: u32,
    /// What is wrong.
    pub kind: BadKind,
    /// The XID it raises (`intermittent_xid`).
    pub code: Option<u32>,
    /// Mean hours of use between its faults.
    pub mean_hours: f64,
}

/// Job-caused XIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoiseKind {
    /// At a job's end, with `prob_per_job_end`, on one of its GPUs.
    TeardownXid,
    /// While a job runs, with `prob_per_job_hour` each hour, on one of its GPUs.
    AppXid,
}

/// One kind of job-caused XID.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppNoise {
    /// What kind.
    pub kind: NoiseKind,
    /// The XID.
    pub code: u32,
    /// Chance per job end (`teardown_xid`).
    pub prob_per_job_end: Option<f64>,
    /// Chance per job hour (`app_xid`).
    pub prob_per_job_hour: Option<f64>,
}

/// The health check: passes on healthy GPUs, fails on bad ones.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verify {
    /// How long one takes, minutes.
    pub minutes: f64,
}

impl Default for Verify {
    fn default() -> Self {
        Verify { minutes: 20.0 }
    }
}

/// Why a fleet file was refused.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Unreadable, or larger than a fleet file can be.
    #[error(transparent)]
    File(#[from] warden_config::file::FileError),
    /// Not a fleet file: the field and the problem.
    #[error("{origin}: {field}: {message}")]
    Invalid {
        /// Where it came from.
        origin: String,
        /// The field (`bad_gpus[1].node`), empty for the document.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl FleetSpec {
    /// Read and check a fleet file.
    pub fn load(path: &Path) -> Result<FleetSpec, FleetError> {
        let text = warden_config::file::read_bounded(path, MAX_FILE_BYTES)?;
        FleetSpec::parse(&text, &path.display().to_string())
    }

    /// Parse and check a fleet file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<FleetSpec, FleetError> {
        let spec: FleetSpec =
            warden_model::yaml::from_str(text).map_err(|e| FleetError::Invalid {
                origin: origin.to_owned(),
                field: e.path,
                message: e.message,
            })?;
        spec.check()
            .map_err(|(field, message)| FleetError::Invalid {
                origin: origin.to_owned(),
                field,
                message,
            })?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, m: &str| Err((f.to_owned(), m.to_owned()));
        let f = &self.fleet;
        if !(1..=MAX_NODES).contains(&f.nodes) {
            return bad("fleet.nodes", &format!("between 1 and {MAX_NODES}"));
        }
        if !(1..=MAX_GPUS).contains(&f.gpus_per_node) {
            return bad("fleet.gpus_per_node", &format!("between 1 and {MAX_GPUS}"));
        }
        if !(f.days > 0.0 && f.days <= MAX_DAYS) {
            return bad("fleet.days", &format!("above 0 and at most {MAX_DAYS}"));
        }
        if self.jobs.is_empty() {
            return bad("jobs", "at least one job");
        }
        for (what, n) in [
            ("jobs", self.jobs.len()),
            ("bad_gpus", self.bad_gpus.len()),
            ("app_noise", self.app_noise.len()),
        ] {
            if n > MAX_ENTRIES {
                return bad(what, &format!("at most {MAX_ENTRIES} entries"));
            }
        }
        let mut names = BTreeSet::new();
        for (i, j) in self.jobs.iter().enumerate() {
            let at = |x: &str| format!("jobs[{i}].{x}");
            if warden_engine::lifecycle::check_job_name(&j.name).is_err() || j.name.len() > 48 {
                return Err((
                    at("name"),
                    "a job name of 1 to 48 letters, digits, `-`, `_` or `.`".into(),
                ));
            }
            if !names.insert(j.name.as_str()) {
                return Err((at("name"), format!("{:?} is used twice", j.name)));
            }
            if j.nodes == 0 || j.nodes > f.nodes {
                return Err((
                    at("nodes"),
                    format!("between 1 and the fleet's {} nodes", f.nodes),
                ));
            }
            if !(j.hours > 0.0 && j.hours <= 24.0 * MAX_DAYS) {
                return Err((at("hours"), "above 0 and at most a month".into()));
            }
            if let Some(h) = j.every_hours {
                if !(0.1..=24.0 * MAX_DAYS).contains(&h) {
                    return Err((at("every_hours"), "at least 0.1 and at most a month".into()));
                }
                if j.repeat {
                    return Err((
                        at("every_hours"),
                        "`repeat` or `every_hours`, not both".into(),
                    ));
                }
            }
        }
        let mut seen = BTreeSet::new();
        for (i, b) in self.bad_gpus.iter().enumerate() {
            let at = |x: &str| format!("bad_gpus[{i}].{x}");
            let Some(n) = node_index(&b.node).filter(|n| *n < f.nodes) else {
                return Err((
                    at("node"),
                    format!(
                        "{:?} is not a node of the fleet (node-0 to node-{})",
                        b.node,
                        f.nodes - 1
                    ),
                ));
            };
            if b.gpu >= f.gpus_per_node {
                return Err((
                    at("gpu"),
                    format!("below gpus_per_node ({})", f.gpus_per_node),
                ));
            }
            if !seen.insert((n, b.gpu)) {
                return Err((at("gpu"), "this GPU is listed twice".into()));
            }
            if !(b.mean_hours >= 0.01 && b.mean_hours <= 24.0 * 365.0) {
                return Err((at("mean_hours"), "between 0.01 and a year".into()));
            }
            match (b.kind, b.code) {
                (BadKind::IntermittentXid, None) => {
                    return Err((at("code"), "the XID an intermittent_xid GPU raises".into()));
                }
                (BadKind::Sdc, Some(_)) => {
                    return Err((at("code"), "an sdc GPU raises no XID".into()));
                }
                (_, Some(c)) if c == 0 || c > 1000 => {
                    return Err((at("code"), "an XID between 1 and 1000".into()));
                }
                _ => {}
            }
        }
        for (i, a) in self.app_noise.iter().enumerate() {
            let at = |x: &str| format!("app_noise[{i}].{x}");
            if a.code == 0 || a.code > 1000 {
                return Err((at("code"), "an XID between 1 and 1000".into()));
            }
            let (field, p) = match a.kind {
                NoiseKind::TeardownXid => ("prob_per_job_end", a.prob_per_job_end),
                NoiseKind::AppXid => ("prob_per_job_hour", a.prob_per_job_hour),
            };
            if !p.is_some_and(|p| (0.0..=1.0).contains(&p)) {
                return Err((at(field), "a probability between 0 and 1".into()));
            }
        }
        if !(self.verify.minutes > 0.0 && self.verify.minutes <= 24.0 * 60.0) {
            return bad("verify.minutes", "above 0 and at most a day");
        }
        Ok(())
    }
}

/// The index in `node-17` (any zero padding).
fn node_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("node-")?;
    if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What a fleet run found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetReport {
    /// The seed.
    pub seed: u64,
    /// Simulated hours.
    pub hours: f64,
    /// Every node of the fleet at the end.
    pub nodes: Vec<NodeRow>,
    /// Every placement, in order.
    pub placements: Vec<Placement>,
    /// The injected faults, in order.
    pub faults: Vec<FaultRow>,
    /// The incidents the engine opened.
    pub incidents: Vec<IncidentView>,
    /// The ledger's decisions scored against the truth.
    pub score: FleetScore,
}

/// One node at the end of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRow {
    /// Name.
    pub node: String,
    /// Its health state.
    pub state: String,
    /// In that state since, hours.
    pub since_h: f64,
    /// Incidents held against it.
    pub incidents: u64,
}

/// A job placed on nodes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Placement {
    /// The job instance.
    pub job: String,
    /// When, hours.
    pub start_h: f64,
    /// Where.
    pub nodes: Vec<String>,
}

/// An injected fault.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRow {
    /// When, hours.
    pub at_h: f64,
    /// `intermittent_xid`, `sdc`, `teardown_xid` or `app_xid`.
    pub kind: String,
    /// Where.
    pub node: String,
    /// Which GPU.
    pub gpu: u32,
    /// The XID, if one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub code: Option<u32>,
    /// The job running there.
    pub job: String,
}

/// The ledger's decisions against the truth.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FleetScore {
    /// Each bad GPU: its incidents, when its node was first quarantined, whether by its
    /// third incident.
    pub bad_gpus: Vec<BadGpuScore>,
    /// Healthy nodes marked bad (none is right).
    pub healthy_marked_bad: Vec<String>,
    /// Healthy nodes ever quarantined.
    pub healthy_quarantined: Vec<String>,
    /// Healthy nodes quarantined and not returned by the end (a check still running at
    /// the end is not counted).
    pub healthy_not_returned: Vec<String>,
    /// Placements on a node the ledger held out at the time (none is right).
    pub placements_on_held_out: u32,
    /// Healthy nodes quarantined with only job-caused XIDs against them (none is right).
    pub quarantined_by_app_noise: Vec<String>,
    /// Every criterion met.
    pub passed: bool,
}

/// One bad GPU's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BadGpuScore {
    /// Node.
    pub node: String,
    /// GPU.
    pub gpu: u32,
    /// Incidents that named it.
    pub incidents: u32,
    /// When its node was first quarantined, hours.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quarantined_h: Option<f64>,
    /// Quarantined by its third incident (or it had fewer than three).
    pub ok: bool,
}

/// A job instance waiting or running.
#[derive(Debug, Clone)]
struct Instance {
    name: String,
    spec: usize,
    /// Work left, seconds.
    left: f64,
    /// Nodes it must not land on (the GPUs that computed its non-finite values).
    avoid: BTreeSet<u32>,
    /// Where it runs, when it runs.
    nodes: Vec<u32>,
    step: u64,
    last_report: f64,
    /// The pid of its rank 0 in this run (rank r's is `pid + r`).
    pid: u32,
}

/// The run.
struct Fleet<'s> {
    spec: &'s FleetSpec,
    policy: Policy,
    engine: Engine,
    draw: Draw,
    now: f64,
    seq: Vec<u64>,
    pid: u32,
    waiting: Vec<Instance>,
    running: Vec<Instance>,
    /// Instances started so far per job entry.
    started: Vec<u32>,
    /// Nodes running a job.
    busy: BTreeSet<u32>,
    /// Nodes the policy isolated.
    drained: BTreeSet<u32>,
    /// Health checks running: node → when they end.
    checks: BTreeMap<u32, f64>,
    /// Bad GPUs: (node, gpu) → (spec index, use left before the next fault, seconds).
    bad: BTreeMap<(u32, u32), (usize, f64)>,
    decided: BTreeSet<String>,
    /// Incidents to decide (again) on the next step.
    pending: BTreeSet<String>,
    /// NaN incidents whose job was rerun.
    reran: BTreeSet<String>,
    placements: Vec<Placement>,
    faults: Vec<FaultRow>,
    /// Incidents that came of job-caused XIDs.
    noise_incidents: BTreeSet<String>,
    on_held_out: u32,
}

/// Run a fleet file to its end.
pub fn run(spec: &FleetSpec) -> FleetReport {
    let policy = match Policy::shipped() {
        Ok(p) => p,
        Err(e) => panic!("the shipped policy does not load: {e}"),
    };
    let mut f = Fleet {
        spec,
        policy,
        engine: Engine::new(EngineConfig::default(), Timestamp(T0)),
        draw: Draw::new(spec.seed, 26),
        now: 0.0,
        seq: vec![0; spec.fleet.nodes as usize],
        pid: 1000,
        waiting: Vec::new(),
        running: Vec::new(),
        started: vec![0; spec.jobs.len()],
        busy: BTreeSet::new(),
        drained: BTreeSet::new(),
        checks: BTreeMap::new(),
        bad: BTreeMap::new(),
        decided: BTreeSet::new(),
        pending: BTreeSet::new(),
        reran: BTreeSet::new(),
        placements: Vec::new(),
        faults: Vec::new(),
        noise_incidents: BTreeSet::new(),
        on_held_out: 0,
    };
    for (i, b) in spec.bad_gpus.iter().enumerate() {
        let n = node_index(&b.node).unwrap_or(0);
        let next = f.exponential(b.mean_hours * 3_600.0);
        f.bad.insert((n, b.gpu), (i, next));
    }
    let end = spec.fleet.days * 86_400.0;
    while f.now < end {
        f.arrivals();
        f.place();
        f.work(STEP_SECS);
        f.now += STEP_SECS;
        let changes = f.engine.tick(f.ts(f.now));
        f.decide(&changes);
        f.verify();
    }
    f.report()
}

impl Fleet<'_> {
    fn ts(&self, secs: f64) -> Timestamp {
        Timestamp(T0 + (secs * 1e9).round() as i64)
    }

    fn name(&self, n: u32) -> String {
        node_name(n, self.spec.fleet.nodes)
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.draw.unit()).max(1e-12).ln()
    }

    /// Submit what is due: each job's first instance at the start, a repeating job's
    /// next as its last ends (see `finish`), a periodic job's every `every_hours`.
    fn arrivals(&mut self) {
        for (i, j) in self.spec.jobs.iter().enumerate() {
            let due = match j.every_hours {
                Some(h) => (self.now / (h * 3_600.0)).floor() as u32 + 1,
                None => 1,
            };
            while self.started[i] < due {
                self.started[i] += 1;
                let name = format!("{}-{}", j.name, self.started[i]);
                self.waiting.push(Instance {
                    name,
                    spec: i,
                    left: j.hours * 3_600.0,
                    avoid: BTreeSet::new(),
                    nodes: Vec::new(),
                    step: 0,
                    last_report: 0.0,
                    pid: 0,
                });
            }
        }
    }

    /// Place waiting instances, oldest first, on free nodes the ledger does not hold
    /// out, the policy did not isolate and the instance must avoid.
    fn place(&mut self) {
        let held = self.engine.ledger().held_out();
        let mut still = Vec::new();
        let waiting = std::mem::take(&mut self.waiting);
        for mut inst in waiting {
            let want = self.spec.jobs[inst.spec].nodes as usize;
            let mut free: Vec<u32> = (0..self.spec.fleet.nodes)
                .filter(|n| {
                    !self.busy.contains(n)
                        && !self.drained.contains(n)
                        && !self.checks.contains_key(n)
                        && !inst.avoid.contains(n)
                        && !held.contains(&self.name(*n))
                })
                .collect();
            if free.len() < want {
                still.push(inst);
                continue;
            }
            for k in 0..want {
                let pick = k + self.draw.below((free.len() - k) as u32) as usize;
                free.swap(k, pick);
            }
            let mut nodes: Vec<u32> = free[..want].to_vec();
            nodes.sort_unstable();
            // The check the report scores: the ledger as it stands now.
            self.on_held_out += nodes
                .iter()
                .filter(|n| self.engine.ledger().state(&self.name(**n)).holds_out())
                .count() as u32;
            self.start(&mut inst, nodes);
            self.running.push(inst);
        }
        self.waiting = still;
    }

    fn start(&mut self, inst: &mut Instance, nodes: Vec<u32>) {
        let names: Vec<String> = nodes.iter().map(|n| self.name(*n)).collect();
        let g = self.spec.fleet.gpus_per_node;
        let report = LifecycleReport {
            event: LifecycleEvent::Start,
            scheduler: "slurm".into(),
            scheduler_job_id: inst.name.clone(),
            name: self.spec.jobs[inst.spec].name.clone(),
            nodes: names.clone(),
            ranks: Some(g * nodes.len() as u32),
            end: EndState::default(),
        };
        let now = self.ts(self.now);
        self.engine.lifecycle(&inst.name, &report, now);
        self.placements.push(Placement {
            job: inst.name.clone(),
            start_h: self.now / 3_600.0,
            nodes: names,
        });
        for n in &nodes {
            self.busy.insert(*n);
        }
        inst.nodes = nodes;
        inst.step = 0;
        inst.last_report = self.now;
        let pid = self.pid;
        self.pid = self.pid.saturating_add(g * inst.nodes.len() as u32);
        inst.pid = pid;
        for (i, n) in inst.nodes.clone().into_iter().enumerate() {
            let ranks = (0..g)
                .map(|k| RankInfo {
                    rank: i as u32 * g + k,
                    world_size: g * inst.nodes.len() as u32,
                    pid: pid + i as u32 * g + k,
                    gpu_index: Some(k),
                    gpu_uuid: String::new(),
                })
                .collect();
            let signals = JobSignals {
                job: inst.name.clone(),
                ranks,
                ..JobSignals::default()
            };
            self.send(n, vec![signals], vec![]);
        }
    }

    fn send(&mut self, node: u32, jobs: Vec<JobSignals>, events: Vec<NodeEvent>) {
        let i = node as usize;
        self.seq[i] += 1;
        let at = self.ts(self.now);
        let batch = Batch {
            version: 0,
            node: self.name(node),
            agent_id: format!("agent-{}", self.name(node)),
            boot_id: "boot-1".into(),
            seq: self.seq[i],
            sent_at_ns: at.0,
            jobs,
            gpus: vec![],
            events,
            heartbeat: Some(Heartbeat::default()),
        };
        self.engine.apply(batch, at);
    }

    fn xid(&mut self, node: u32, gpu: u32, code: u32) {
        let at = self.ts(self.now);
        let detail = "fleet simulation";
        let event = NodeEvent {
            id: self.seq[node as usize] + 1,
            at_ns: at.0,
            kind: NodeEventKind::Xid as i32,
            severity: XidCatalog::builtin().severity_in(code, detail) as i32,
            gpu_index: Some(gpu),
            pci_bus_id: format!("0000:{:02x}:00", 0x18 + gpu),
            code: Some(code),
            message: format!(
                "NVRM: Xid (PCI:0000:{:02x}:00): {code}, {detail}",
                0x18 + gpu
            ),
            count: 1,
        };
        self.send(node, vec![], vec![event]);
    }

    /// The metrics of every rank of `inst` at its current step; the rank on `nan` (a
    /// node and GPU) computed a non-finite value the input check caught.
    fn report_steps(&mut self, idx: usize, nan: Option<(u32, u32)>) {
        let g = self.spec.fleet.gpus_per_node;
        let inst = &self.running[idx];
        let (name, nodes, step) = (inst.name.clone(), inst.nodes.clone(), inst.step);
        let at = self.ts(self.now).0;
        for (i, n) in nodes.into_iter().enumerate() {
            let metrics = (0..g)
                .map(|k| {
                    let bad = nan == Some((n, k));
                    TrainingMetric {
                        rank: i as u32 * g + k,
                        step,
                        at_ns: at,
                        loss: Some(if bad { f64::NAN } else { 2.5 }),
                        grad_norm: None,
                        tokens_per_s: None,
                        first_nonfinite_op: bad.then_some(0),
                    }
                })
                .collect();
            let signals = JobSignals {
                job: name.clone(),
                metrics,
                ..JobSignals::default()
            };
            self.send(n, vec![signals], vec![]);
        }
    }

    /// Let `dt` seconds of work pass on every running instance: steps reported, bad
    /// GPUs' faults and job-caused XIDs raised, finished instances ended.
    fn work(&mut self, dt: f64) {
        let mut idx = 0;
        while idx < self.running.len() {
            self.running[idx].left -= dt;
            self.running[idx].step += 1;
            if self.now - self.running[idx].last_report >= REPORT_SECS {
                self.running[idx].last_report = self.now;
                self.report_steps(idx, None);
            }
            if self.faults_of(idx, dt) {
                // The instance lost a rank: what happens next is the policy's.
                idx += 1;
                continue;
            }
            if self.running[idx].left <= 0.0 {
                let inst = self.running.remove(idx);
                self.finish(inst, true);
                continue;
            }
            idx += 1;
        }
    }

    /// Faults on instance `idx` during `dt`; whether a rank died.
    fn faults_of(&mut self, idx: usize, dt: f64) -> bool {
        let spec = self.spec;
        let nodes = self.running[idx].nodes.clone();
        let name = self.running[idx].name.clone();
        let g = self.spec.fleet.gpus_per_node;
        let mut died = false;
        for n in &nodes {
            for k in 0..g {
                let Some((b, left)) = self.bad.get(&(*n, k)).copied() else {
                    continue;
                };
                let left = left - dt;
                if left > 0.0 {
                    self.bad.insert((*n, k), (b, left));
                    continue;
                }
                let bad = &spec.bad_gpus[b];
                let next = self.exponential(bad.mean_hours * 3_600.0);
                self.bad.insert((*n, k), (b, next));
                self.faults.push(FaultRow {
                    at_h: self.now / 3_600.0,
                    kind: match bad.kind {
                        BadKind::IntermittentXid => "intermittent_xid",
                        BadKind::Sdc => "sdc",
                    }
                    .into(),
                    node: self.name(*n),
                    gpu: k,
                    code: bad.code,
                    job: name.clone(),
                });
                match (bad.kind, bad.code) {
                    (BadKind::IntermittentXid, Some(code)) => {
                        self.xid(*n, k, code);
                        if XidCatalog::builtin().is_fatal(code) {
                            self.rank_died(idx, *n, k);
                            died = true;
                        }
                    }
                    _ => self.report_steps(idx, Some((*n, k))),
                }
            }
        }
        for a in &spec.app_noise {
            let Some(p) = a.prob_per_job_hour.filter(|_| a.kind == NoiseKind::AppXid) else {
                continue;
            };
            if self.draw.chance(p * dt / 3_600.0) {
                let n = nodes[self.draw.below(nodes.len() as u32) as usize];
                let k = self.draw.below(g);
                self.noise(n, k, a.code, NoiseKind::AppXid, &name);
            }
        }
        died
    }

    fn noise(&mut self, node: u32, gpu: u32, code: u32, kind: NoiseKind, job: &str) {
        self.faults.push(FaultRow {
            at_h: self.now / 3_600.0,
            kind: match kind {
                NoiseKind::TeardownXid => "teardown_xid",
                NoiseKind::AppXid => "app_xid",
            }
            .into(),
            node: self.name(node),
            gpu,
            code: Some(code),
            job: job.to_owned(),
        });
        self.xid(node, gpu, code);
    }

    fn rank_died(&mut self, idx: usize, node: u32, gpu: u32) {
        let inst = &self.running[idx];
        let g = self.spec.fleet.gpus_per_node;
        let Some(i) = inst.nodes.iter().position(|n| *n == node) else {
            return;
        };
        let rank = i as u32 * g + gpu;
        let signals = JobSignals {
            job: inst.name.clone(),
            processes: vec![ProcessState {
                rank,
                pid: inst.pid + rank,
                at_ns: self.ts(self.now).0,
                alive: false,
                signal: Some(6),
                ..ProcessState::default()
            }],
            ..JobSignals::default()
        };
        self.send(node, vec![signals], vec![]);
    }

    /// End an instance: its scheduler reports the end, its nodes are free, a teardown
    /// XID may follow; `done` when its work is over (a repeating job's next instance is
    /// submitted), else it waits to run again.
    fn finish(&mut self, mut inst: Instance, done: bool) {
        let now = self.ts(self.now);
        let report = LifecycleReport {
            event: LifecycleEvent::End,
            scheduler: "slurm".into(),
            scheduler_job_id: inst.name.clone(),
            name: self.spec.jobs[inst.spec].name.clone(),
            nodes: inst.nodes.iter().map(|n| self.name(*n)).collect(),
            ranks: None,
            // A simulated job finishes its work or is ended by the fleet: no exit state.
            end: EndState::default(),
        };
        self.engine.lifecycle(&inst.name, &report, now);
        for n in &inst.nodes {
            self.busy.remove(n);
        }
        let g = self.spec.fleet.gpus_per_node;
        let spec = self.spec;
        for a in &spec.app_noise {
            let Some(p) = a
                .prob_per_job_end
                .filter(|_| a.kind == NoiseKind::TeardownXid)
            else {
                continue;
            };
            if !inst.nodes.is_empty() && self.draw.chance(p) {
                let n = inst.nodes[self.draw.below(inst.nodes.len() as u32) as usize];
                let k = self.draw.below(g);
                self.noise(n, k, a.code, NoiseKind::TeardownXid, &inst.name);
            }
        }
        inst.nodes.clear();
        if !done {
            self.waiting.insert(0, inst);
            return;
        }
        let job = &spec.jobs[inst.spec];
        if job.repeat {
            self.started[inst.spec] += 1;
            self.waiting.push(Instance {
                name: format!("{}-{}", job.name, self.started[inst.spec]),
                spec: inst.spec,
                left: job.hours * 3_600.0,
                avoid: BTreeSet::new(),
                nodes: Vec::new(),
                step: 0,
                last_report: 0.0,
                pid: 0,
            });
        }
    }

    /// Stop the running instance `job` and queue it again, avoiding `avoid`.
    fn restart(&mut self, job: &str, avoid: &[String]) {
        let Some(idx) = self.running.iter().position(|i| i.name == job) else {
            return;
        };
        let mut inst = self.running.remove(idx);
        inst.avoid
            .extend(avoid.iter().filter_map(|n| node_index(n)));
        self.finish(inst, false);
    }

    /// The policy on every incident that opened or changed, once each (an incident a
    /// rule waits on the diagnosis for is asked again each step until the wait is
    /// over); people's answer to non-finite values: the job reruns away from the GPU
    /// the incident names.
    fn decide(&mut self, changes: &[warden_engine::IncidentChange]) {
        for c in changes {
            if matches!(
                c.change,
                Change::Opened | Change::Updated | Change::Reclassified
            ) && !self.decided.contains(&c.id)
            {
                self.pending.insert(c.id.clone());
            }
        }
        let now = self.ts(self.now);
        for id in std::mem::take(&mut self.pending) {
            let Some(inc) = self.engine.incident(&id).cloned() else {
                continue;
            };
            if self.is_noise(&inc) {
                self.noise_incidents.insert(inc.id.clone());
            }
            let mut culprits: Vec<String> = inc.nodes.clone();
            culprits.extend(inc.gpus.iter().map(|g| g.node.clone()));
            culprits.sort();
            culprits.dedup();
            if inc.kind == IncidentKind::Nan
                && !inc.gpus.is_empty()
                && self.reran.insert(inc.id.clone())
                && let Some(job) = &inc.job
            {
                self.restart(job, &culprits);
            }
            let waited = now.secs_since(inc.detected_at) >= DIAGNOSIS_WAIT_SECS;
            let rule = match self.policy.decide(&inc, &NoHistory, now, waited) {
                Decision::Act(r) => r.clone(),
                Decision::Wait(_) => {
                    self.pending.insert(id);
                    continue;
                }
                Decision::Nothing => {
                    self.decided.insert(id);
                    continue;
                }
            };
            self.decided.insert(id);
            if rule.then.iter().any(|a| a.isolates()) {
                for n in &culprits {
                    if let Some(i) = node_index(n) {
                        self.drained.insert(i);
                    }
                }
            }
            if rule.then.contains(&ActionName::RestartJob)
                && let Some(job) = &inc.job
            {
                self.restart(job, &culprits);
            }
        }
        // A node the ledger quarantines is taken out: its job restarts elsewhere.
        for node in self.engine.ledger().to_verify() {
            let Some(i) = node_index(&node) else {
                continue;
            };
            let jobs: Vec<String> = self
                .running
                .iter()
                .filter(|r| r.nodes.contains(&i))
                .map(|r| r.name.clone())
                .collect();
            for j in jobs {
                self.restart(&j, std::slice::from_ref(&node));
            }
        }
    }

    /// Whether the incident came only of job-caused XIDs the fleet injected.
    fn is_noise(&self, inc: &Incident) -> bool {
        inc.kind == IncidentKind::GpuFault
            && !inc.gpus.is_empty()
            && inc.gpus.iter().all(|g| {
                let n = node_index(&g.node);
                !self
                    .bad
                    .keys()
                    .any(|(bn, bg)| Some(*bn) == n && *bg == g.index)
            })
    }

    /// Start health checks of quarantined nodes no job runs on; end those due.
    fn verify(&mut self) {
        let now = self.ts(self.now);
        for node in self.engine.ledger().to_verify() {
            let Some(i) = node_index(&node) else {
                continue;
            };
            if self.busy.contains(&i) || self.checks.contains_key(&i) {
                continue;
            }
            if self
                .engine
                .ledger_mut()
                .verifying(&node, "fleet health check", now)
                .is_ok()
            {
                self.checks
                    .insert(i, self.now + self.spec.verify.minutes * 60.0);
            }
        }
        let due: Vec<u32> = self
            .checks
            .iter()
            .filter(|(_, end)| **end <= self.now)
            .map(|(n, _)| *n)
            .collect();
        for n in due {
            self.checks.remove(&n);
            let healthy = !self.bad.keys().any(|(bn, _)| *bn == n);
            let detail = if healthy {
                "every GPU passed"
            } else {
                "a GPU failed"
            };
            let name = self.name(n);
            if self
                .engine
                .ledger_mut()
                .verified(&name, healthy, detail, now)
                .is_ok()
                && healthy
            {
                self.drained.remove(&n);
            }
        }
    }

    fn report(self) -> FleetReport {
        let hours =
            |t: Timestamp| (t.secs_since(Timestamp(T0)) / 3_600.0 * 1000.0).round() / 1000.0;
        let ledger = self.engine.ledger();
        let nodes: Vec<NodeRow> = (0..self.spec.fleet.nodes)
            .map(|n| {
                let name = self.name(n);
                match ledger.node(&name) {
                    Some(h) => NodeRow {
                        node: name,
                        state: h.state.as_str().to_owned(),
                        since_h: hours(h.since),
                        incidents: h.incidents,
                    },
                    None => NodeRow {
                        node: name,
                        state: HealthState::Healthy.as_str().to_owned(),
                        since_h: 0.0,
                        incidents: 0,
                    },
                }
            })
            .collect();
        let incidents = self.engine.incident_views(None, None, None);
        let bad_nodes: BTreeSet<u32> = self.bad.keys().map(|(n, _)| *n).collect();
        let mut score = FleetScore {
            placements_on_held_out: self.on_held_out,
            ..FleetScore::default()
        };
        for (n, g) in self.bad.keys() {
            let name = self.name(*n);
            let mut named: Vec<&Incident> = self
                .engine
                .incidents()
                .iter()
                .filter(|i| i.gpus.iter().any(|x| x.node == name && x.index == *g))
                .collect();
            named.sort_by_key(|i| i.detected_at);
            let quarantined = ledger.node(&name).and_then(|h| {
                h.history
                    .iter()
                    .find(|t| t.to == HealthState::Quarantined)
                    .map(|t| t.at)
            });
            let ok = match (named.get(2), quarantined) {
                (None, _) => true,
                (Some(third), Some(q)) => q <= third.detected_at,
                (Some(_), None) => false,
            };
            score.bad_gpus.push(BadGpuScore {
                node: name,
                gpu: *g,
                incidents: named.len() as u32,
                quarantined_h: quarantined.map(hours),
                ok,
            });
        }
        let end = self.now;
        for h in ledger.nodes() {
            let Some(i) = node_index(&h.node) else {
                continue;
            };
            if bad_nodes.contains(&i) {
                continue;
            }
            if h.history.iter().any(|t| t.to == HealthState::Bad) {
                score.healthy_marked_bad.push(h.node.clone());
            }
            let quarantines: Vec<_> = h
                .history
                .iter()
                .filter(|t| t.to == HealthState::Quarantined)
                .collect();
            if quarantines.is_empty() {
                continue;
            }
            score.healthy_quarantined.push(h.node.clone());
            let pending = self.checks.contains_key(&i)
                || (h.state == HealthState::Quarantined
                    && end - hours(h.since) * 3_600.0
                        <= self.spec.verify.minutes * 60.0 + 2.0 * STEP_SECS);
            if h.state.holds_out() && !pending {
                score.healthy_not_returned.push(h.node.clone());
            }
            if quarantines.iter().all(|t| {
                t.incidents
                    .iter()
                    .all(|id| self.noise_incidents.contains(id))
            }) {
                score.quarantined_by_app_noise.push(h.node.clone());
            }
        }
        score.passed = score.bad_gpus.iter().all(|b| b.ok)
            && score.healthy_marked_bad.is_empty()
            && score.healthy_not_returned.is_empty()
            && score.placements_on_held_out == 0
            && score.quarantined_by_app_noise.is_empty();
        FleetReport {
            seed: self.spec.seed,
            hours: end / 3_600.0,
            nodes,
            placements: self.placements,
            faults: self.faults,
            incidents,
            score,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Result<FleetSpec, String> {
        FleetSpec::parse(text, "t.yaml").map_err(|e| e.to_string())
    }

    const CONTRACT: &str = "seed: 3
fleet: {nodes: 64, gpus_per_node: 8, days: 7}
jobs:
  - {name: pretrain, nodes: 32, hours: 24, repeat: true}
  - {name: ft, nodes: 4, hours: 2, every_hours: 3}
bad_gpus:
  - {node: node-17, gpu: 3, kind: intermittent_xid, code: 79, mean_hours: 20}
  - {node: node-40, gpu: 1, kind: sdc, mean_hours: 30}
app_noise:
  - {kind: teardown_xid, code: 45, prob_per_job_end: 0.3}
  - {kind: app_xid, code: 13, prob_per_job_hour: 0.05}
verify: {minutes: 20}
";

    #[test]
    fn the_contract_example_parses() {
        let s = spec(CONTRACT).expect("parses");
        assert_eq!(s.fleet.nodes, 64);
        assert_eq!(s.bad_gpus[1].kind, BadKind::Sdc);
        assert_eq!(node_index("node-17"), Some(17));
        assert_eq!(node_index("node-017"), Some(17));
        assert_eq!(node_index("node-"), None);
        assert_eq!(node_index("gpu-1"), None);
    }

    #[test]
    fn mistakes_are_named_with_their_field() {
        let cases = [
            (CONTRACT.replace("nodes: 64,", "nodes: 0,"), "fleet.nodes"),
            (
                CONTRACT.replace("node: node-17", "node: node-99"),
                "bad_gpus[0].node",
            ),
            (CONTRACT.replace("gpu: 3,", "gpu: 8,"), "bad_gpus[0].gpu"),
            (CONTRACT.replace("code: 79, ", ""), "bad_gpus[0].code"),
            (
                CONTRACT.replace("prob_per_job_end: 0.3", "prob_per_job_end: 3"),
                "app_noise[0].prob_per_job_end",
            ),
            (
                CONTRACT.replace("name: ft", "name: pretrain"),
                "jobs[1].name",
            ),
            (
                CONTRACT.replace("hours: 2,", "hours: 2, repeat: true,"),
                "jobs[1].every_hours",
            ),
            (CONTRACT.replace("days: 7", "dayz: 7"), "fleet"),
        ];
        for (text, field) in cases {
            match spec(&text) {
                Ok(_) => panic!("accepted: {text}"),
                Err(e) => assert!(e.contains(field), "{field}: {e}"),
            }
        }
    }
}
