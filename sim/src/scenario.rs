//! Scenario files: the job, its noise and the faults to inject, parsed from YAML and
//! validated so that every error names the field it is about.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Largest job the simulator accepts, in ranks.
pub const MAX_RANKS: u64 = 1 << 20;
/// Largest number of steps a scenario may ask for.
pub const MAX_STEPS: u64 = 10_000_000;

/// Default of `job.host_lead_ms`: a few kernels queued ahead of the GPU.
pub const DEFAULT_HOST_LEAD_MS: f64 = 5.0;

/// Whether an XID code takes the GPU away (the rank on it stops): the codes
/// `rules/xid.yaml` holds fatal.
pub fn is_fatal_xid(code: u32) -> bool {
    warden_model::xid::XidCatalog::builtin().is_fatal(code)
}

/// One problem found in a scenario: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Field path, e.g. `faults[2].rank` (empty for the document as a whole).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not have the scenario's shape (syntax, type, unknown field).
    #[error("{problem}")]
    Parse {
        /// Field path and message (with line and column where known).
        problem: Problem,
        /// 1-based line of the error, where known.
        line: Option<usize>,
        /// 1-based column of the error, where known.
        column: Option<usize>,
    },
    /// The scenario is well formed but inconsistent; every problem found is listed.
    #[error("{}", join_problems(problems))]
    Invalid {
        /// Every problem, in document order.
        problems: Vec<Problem>,
    },
    /// An error in a named file.
    #[error("{}: {source}", file.display())]
    InFile {
        /// The scenario file.
        file: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<ScenarioError>,
    },
}

fn join_problems(p: &[Problem]) -> String {
    p.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ScenarioError {
    /// Every field path this error names.
    pub fn paths(&self) -> Vec<String> {
        match self {
            ScenarioError::Io { .. } => vec![],
            ScenarioError::Parse { problem, .. } => vec![problem.path.clone()],
            ScenarioError::Invalid { problems } => {
                problems.iter().map(|p| p.path.clone()).collect()
            }
            ScenarioError::InFile { source, .. } => source.paths(),
        }
    }
}

/// The training job being simulated.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Job name as agents report it.
    pub name: String,
    /// Number of nodes.
    pub nodes: u32,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u32,
    /// Tensor-parallel degree (innermost).
    pub tp: u32,
    /// Pipeline-parallel degree (outermost).
    pub pp: u32,
    /// Data-parallel degree.
    pub dp: u32,
    /// Nominal compute time of one iteration, seconds.
    pub iteration_secs: f64,
    /// Relative spread (standard deviation) of per-rank compute time.
    pub jitter: f64,
    /// How far ahead of its GPU a rank's host issues a collective, at most, seconds:
    /// the kernels it has queued. Capture stamps a collective's start at the host's
    /// call, this much before the GPU reaches it.
    pub host_lead_secs: f64,
    /// Tensor-parallel all-reduces in each half of a step (forward and backward): the
    /// model's layers, each with its own. The step's compute is split evenly between
    /// them, and so is the time the two TP all-reduces of a one-layer step take.
    pub layers: u32,
}

/// Most `job.layers`.
pub const MAX_LAYERS: u32 = 256;

/// Benign disturbances a healthy job shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Noise {
    /// Checkpoint after every this many steps (0: never).
    pub checkpoint_every_steps: u64,
    /// Length of a checkpoint pause, seconds.
    pub checkpoint_secs: f64,
    /// Probability per rank per step of a compute hiccup.
    pub hiccup_prob: f64,
    /// Mean extra compute time of a hiccup, seconds.
    pub hiccup_secs: f64,
    /// Agent clocks are off by up to this many milliseconds (uniform, per node).
    pub clock_skew_ms: f64,
    /// Probability that an agent batch is lost on its way.
    pub batch_drop_prob: f64,
}

impl Default for Noise {
    fn default() -> Self {
        Noise {
            checkpoint_every_steps: 0,
            checkpoint_secs: 20.0,
            hiccup_prob: 0.002,
            hiccup_secs: 0.3,
            clock_skew_ms: 5.0,
            batch_drop_prob: 0.0,
        }
    }
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Every rank of the node computes `slowdown` times slower.
    Straggler {
        /// Node name.
        node: String,
        /// Compute-time factor.
        slowdown: f64,
    },
    /// The node's network link is `slowdown` times slower for collectives that leave it.
    SlowLink {
        /// Node name.
        node: String,
        /// Transfer-time factor.
        slowdown: f64,
    },
    /// The rank's loss becomes NaN, then everyone's.
    Nan {
        /// Culprit rank.
        rank: u32,
    },
    /// The GPU reports an XID; fatal codes stop its rank.
    Xid {
        /// Node name.
        node: String,
        /// GPU index on the node.
        gpu: u32,
        /// XID code.
        code: u32,
        /// A reset brings the GPU back: the node's health check passes afterwards
        /// (`recovers: true`); otherwise the GPU stays broken and the check fails.
        recovers: bool,
    },
    /// The rank stops before its next collective and never arrives.
    Hang {
        /// Culprit rank.
        rank: u32,
    },
    /// The rank's process dies; the rest of the job follows.
    Crash {
        /// Culprit rank.
        rank: u32,
    },
}

impl FaultKind {
    /// The scenario label of this kind.
    pub fn label(&self) -> &'static str {
        match self {
            FaultKind::Straggler { .. } => "straggler",
            FaultKind::SlowLink { .. } => "slow_link",
            FaultKind::Nan { .. } => "nan",
            FaultKind::Xid { .. } => "xid",
            FaultKind::Hang { .. } => "hang",
            FaultKind::Crash { .. } => "crash",
        }
    }

    /// Whether this fault stops the job (hang, crash, fatal XID).
    pub fn stops_job(&self) -> bool {
        match self {
            FaultKind::Hang { .. } | FaultKind::Crash { .. } => true,
            FaultKind::Xid { code, .. } => is_fatal_xid(*code),
            _ => false,
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Step at which it takes effect.
    pub step: u64,
    /// Step at which it stops (exclusive); `None`: to the end of the run.
    pub until_step: Option<u64>,
    /// What it does.
    pub kind: FaultKind,
}

impl Fault {
    /// Whether the fault is in effect at `step`.
    pub fn active_at(&self, step: u64) -> bool {
        step >= self.step && self.until_step.is_none_or(|u| step < u)
    }
}

/// The capture path whose signals the simulated agents send (docs/CAPTURE.md, "What
/// each path emits"): each has its own timestamps, read interval and transfer times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Capture {
    /// `warden-nccl-profiler` at its default mask (`coll,p2p,proxyop`).
    #[default]
    Nccl,
    /// `warden-nccl-profiler` with per-peer proxy-step timing
    /// (`WARDEN_NCCL_PROFILER_MASK=default+proxystep`): the default mask's signals plus
    /// each rank's send time per peer on the wire.
    NcclProxy,
    /// `warden_torch`'s process-group capture.
    Torch,
}

impl Capture {
    /// Every path, in the order the suite runs them.
    pub const ALL: [Capture; 3] = [Capture::Nccl, Capture::NcclProxy, Capture::Torch];

    /// Its name in scenario files.
    pub fn label(self) -> &'static str {
        match self {
            Capture::Nccl => "nccl",
            Capture::NcclProxy => "nccl_proxy",
            Capture::Torch => "torch",
        }
    }

    /// Whether the path shows which link of a node is slow: only per-peer proxy-step
    /// timing does. The default mask's transfer time runs from the proxy's first
    /// operation to its last, which in a ring is paced by the slowest link for every
    /// member, and `warden_torch` reports none.
    pub fn sees_links(self) -> bool {
        self == Capture::NcclProxy
    }

    /// Whether the path is the NCCL plugin (at any mask).
    pub fn is_nccl(self) -> bool {
        matches!(self, Capture::Nccl | Capture::NcclProxy)
    }
}

/// What the job reports as its loss (`warden_torch.step(loss=...)` or its log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metrics {
    /// Each data-parallel replica reports its own loss, the same on every rank of the
    /// replica (its tensor- and pipeline-parallel group), as plain PyTorch scripts do.
    #[default]
    Local,
    /// Every rank reports the loss averaged over data parallel, as Megatron logs it.
    Reduced,
}

impl Metrics {
    /// Its name in scenario files.
    pub fn label(self) -> &'static str {
        match self {
            Metrics::Local => "local",
            Metrics::Reduced => "reduced",
        }
    }
}

/// A parsed and validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Scenario name (the file stem).
    pub name: String,
    /// Seed of every random draw.
    pub seed: u64,
    /// The job.
    pub job: Job,
    /// Benign noise.
    pub noise: Noise,
    /// Number of optimizer steps (numbered 0 ..= steps-1).
    pub steps: u64,
    /// Faults, in file order.
    pub faults: Vec<Fault>,
    /// The capture path the agents read.
    pub capture: Capture,
    /// Whether the file named the capture path (else it is the default, and the suite
    /// runs the scenario under every path).
    pub capture_named: bool,
    /// What the job reports as its loss.
    pub metrics: Metrics,
    /// Whether the job runs `warden_torch`'s opt-in input check, which names the rank
    /// that first fed a NaN or infinity into a reduction.
    pub grad_check: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    seed: u64,
    job: RawJob,
    #[serde(default)]
    noise: RawNoise,
    steps: u64,
    #[serde(default)]
    faults: Vec<RawFault>,
    capture: Option<String>,
    metrics: Option<String>,
    grad_check: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Option<String>,
    nodes: Option<u32>,
    gpus_per_node: Option<u32>,
    parallelism: Option<RawParallelism>,
    iteration_secs: Option<f64>,
    jitter: Option<f64>,
    capture: Option<String>,
    metrics: Option<String>,
    grad_check: Option<bool>,
    host_lead_ms: Option<f64>,
    layers: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawParallelism {
    tp: Option<u32>,
    pp: Option<u32>,
    dp: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNoise {
    checkpoint_every_steps: Option<u64>,
    checkpoint_secs: Option<f64>,
    hiccup_prob: Option<f64>,
    hiccup_secs: Option<f64>,
    clock_skew_ms: Option<f64>,
    batch_drop_prob: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    step: u64,
    kind: String,
    until_step: Option<u64>,
    node: Option<String>,
    rank: Option<u32>,
    gpu: Option<u32>,
    code: Option<u32>,
    slowdown: Option<f64>,
    recovers: Option<bool>,
}

/// Node name of node index `i` in a job of `nodes` nodes: `node-` and the index,
/// zero-padded to the width of `nodes - 1` (at least two digits).
pub fn node_name(i: u32, nodes: u32) -> String {
    let width = nodes.saturating_sub(1).to_string().len().max(2);
    format!("node-{i:0width$}")
}

struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    fn positive(&mut self, path: &str, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            self.fail(path, "must be > 0");
        }
    }

    fn non_negative(&mut self, path: &str, v: f64) {
        if !(v.is_finite() && v >= 0.0) {
            self.fail(path, "must be >= 0");
        }
    }

    fn probability(&mut self, path: &str, v: f64) {
        if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
            self.fail(path, "must be a probability in [0, 1]");
        }
    }
}

impl Scenario {
    /// Parse and validate a scenario; `name` becomes its name.
    pub fn from_yaml(text: &str, name: &str) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario =
            warden_model::yaml::from_str(text).map_err(|e| ScenarioError::Parse {
                problem: Problem {
                    path: e.path,
                    message: e.message,
                },
                line: e.line,
                column: e.column,
            })?;
        Self::validate(raw, name)
    }

    /// Load a scenario file; the name is the file stem and errors name the file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".to_owned());
        Self::from_yaml(&text, &name).map_err(|e| ScenarioError::InFile {
            file: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Whether a health check of `node` (a diagnostic after a GPU reset) passes: not
    /// when one of its GPUs took an XID that does not recover.
    pub fn passes_health_check(&self, node: &str) -> bool {
        !self.faults.iter().any(
            |f| matches!(&f.kind, FaultKind::Xid { node: n, recovers: false, .. } if n == node),
        )
    }

    /// Number of ranks in the job.
    pub fn ranks(&self) -> u32 {
        self.job.nodes * self.job.gpus_per_node
    }

    /// Name of node index `i`.
    pub fn node_name(&self, i: u32) -> String {
        node_name(i, self.job.nodes)
    }

    /// Index of the node called `name`, if the job has it.
    pub fn node_index(&self, name: &str) -> Option<u32> {
        let digits = name.strip_prefix("node-")?;
        let i: u32 = digits.parse().ok()?;
        (i < self.job.nodes && self.node_name(i) == name).then_some(i)
    }

    /// Node index of rank `r`.
    pub fn node_of(&self, rank: u32) -> u32 {
        rank / self.job.gpus_per_node
    }

    /// The stopping fault, if the scenario has one.
    pub fn stopping_fault(&self) -> Option<&Fault> {
        self.faults.iter().find(|f| f.kind.stops_job())
    }

    fn validate(raw: RawScenario, name: &str) -> Result<Scenario, ScenarioError> {
        let mut c = Checker { problems: vec![] };
        let j = raw.job;
        let job_name = j.name.unwrap_or_else(|| "sim".to_owned());
        if job_name.is_empty() || job_name.len() > warden_model::wire::MAX_NAME_LEN {
            c.fail("job.name", "must be 1 to 253 bytes");
        }
        let nodes = j.nodes.unwrap_or(4);
        let gpn = j.gpus_per_node.unwrap_or(8);
        if nodes == 0 {
            c.fail("job.nodes", "must be >= 1");
        }
        if gpn == 0 {
            c.fail("job.gpus_per_node", "must be >= 1");
        }
        let world = u64::from(nodes) * u64::from(gpn);
        if world > MAX_RANKS {
            c.fail(
                "job",
                format!("nodes*gpus_per_node = {world} is more than {MAX_RANKS} ranks"),
            );
        }
        let par = j.parallelism.unwrap_or_default();
        let (mut tp, mut pp, mut dp) = (par.tp, par.pp, par.dp);
        for (field, v) in [("tp", tp), ("pp", pp), ("dp", dp)] {
            if v == Some(0) {
                c.fail(format!("job.parallelism.{field}"), "must be >= 1");
            }
        }
        if world > 0 && world <= MAX_RANKS && c.problems.is_empty() {
            let divides = |x: u64| x > 0 && world % x == 0;
            if tp.is_none() {
                let given = u64::from(pp.unwrap_or(1)) * u64::from(dp.unwrap_or(1));
                tp = match (pp, dp) {
                    (Some(_), Some(_)) if divides(given) => Some((world / given) as u32),
                    _ => {
                        let mut t = u64::from(gpn.min(8));
                        while t > 1 && !(divides(t) && divides(t * given)) {
                            t -= 1;
                        }
                        Some(t as u32)
                    }
                };
            }
            let t = u64::from(tp.unwrap_or(1));
            if pp.is_none() {
                pp = match dp {
                    Some(d) if divides(t * u64::from(d)) => {
                        Some((world / (t * u64::from(d))) as u32)
                    }
                    _ => Some(1),
                };
            }
            let p = u64::from(pp.unwrap_or(1));
            if dp.is_none() && divides(t * p) {
                dp = Some((world / (t * p)) as u32);
            }
            let product = t * p * u64::from(dp.unwrap_or(0));
            if product != world {
                c.fail(
                    "job.parallelism",
                    format!("tp*pp*dp = {product} but nodes*gpus_per_node = {world}"),
                );
            }
        }
        let iteration_secs = j.iteration_secs.unwrap_or(1.0);
        c.positive("job.iteration_secs", iteration_secs);
        let jitter = j.jitter.unwrap_or(0.02);
        if !(jitter.is_finite() && (0.0..1.0).contains(&jitter)) {
            c.fail("job.jitter", "must be in [0, 1)");
        }

        let d = Noise::default();
        let n = raw.noise;
        let noise = Noise {
            checkpoint_every_steps: n.checkpoint_every_steps.unwrap_or(d.checkpoint_every_steps),
            checkpoint_secs: n.checkpoint_secs.unwrap_or(d.checkpoint_secs),
            hiccup_prob: n.hiccup_prob.unwrap_or(d.hiccup_prob),
            hiccup_secs: n.hiccup_secs.unwrap_or(d.hiccup_secs),
            clock_skew_ms: n.clock_skew_ms.unwrap_or(d.clock_skew_ms),
            batch_drop_prob: n.batch_drop_prob.unwrap_or(d.batch_drop_prob),
        };
        c.non_negative("noise.checkpoint_secs", noise.checkpoint_secs);
        c.probability("noise.hiccup_prob", noise.hiccup_prob);
        c.non_negative("noise.hiccup_secs", noise.hiccup_secs);
        c.non_negative("noise.clock_skew_ms", noise.clock_skew_ms);
        if noise.clock_skew_ms > 60_000.0 {
            c.fail("noise.clock_skew_ms", "must be at most 60000");
        }
        if !(noise.batch_drop_prob.is_finite() && (0.0..1.0).contains(&noise.batch_drop_prob)) {
            c.fail("noise.batch_drop_prob", "must be in [0, 1)");
        }

        if raw.steps == 0 {
            c.fail("steps", "must be >= 1");
        }
        if raw.steps > MAX_STEPS {
            c.fail("steps", format!("must be at most {MAX_STEPS}"));
        }

        let host_lead_ms = j.host_lead_ms.unwrap_or(DEFAULT_HOST_LEAD_MS);
        if !(host_lead_ms.is_finite() && (0.0..=60_000.0).contains(&host_lead_ms)) {
            c.fail("job.host_lead_ms", "must be in [0, 60000]");
        }
        let layers = j.layers.unwrap_or(1);
        if !(1..=MAX_LAYERS).contains(&layers) {
            c.fail("job.layers", format!("must be in [1, {MAX_LAYERS}]"));
        }
        let either = |path: &str, top: Option<String>, job: Option<String>, c: &mut Checker| match (
            top, job,
        ) {
            (Some(a), Some(b)) if a != b => {
                c.fail(
                    path,
                    format!("given as {a:?} at the top and as {b:?} under job"),
                );
                None
            }
            (a, b) => a.or(b),
        };
        let capture_given = either("capture", raw.capture, j.capture, &mut c);
        let capture_named = capture_given.is_some();
        let capture = match capture_given.as_deref() {
            None | Some("nccl") => Capture::Nccl,
            Some("torch") => Capture::Torch,
            Some("nccl_proxy") => Capture::NcclProxy,
            Some(other) => {
                c.fail(
                    "capture",
                    format!("{other:?} is not a capture path (nccl, nccl_proxy, torch)"),
                );
                Capture::Nccl
            }
        };
        let metrics = match either("metrics", raw.metrics, j.metrics, &mut c).as_deref() {
            None | Some("local") => Metrics::Local,
            Some("reduced") => Metrics::Reduced,
            Some(other) => {
                c.fail("metrics", format!("{other:?} is not local or reduced"));
                Metrics::Local
            }
        };
        let grad_check = match (raw.grad_check, j.grad_check) {
            (Some(a), Some(b)) if a != b => {
                c.fail("grad_check", "given differently at the top and under job");
                a
            }
            (a, b) => a.or(b).unwrap_or(false),
        };

        let mut scenario = Scenario {
            name: name.to_owned(),
            seed: raw.seed,
            job: Job {
                name: job_name,
                nodes,
                gpus_per_node: gpn,
                tp: tp.unwrap_or(1),
                pp: pp.unwrap_or(1),
                dp: dp.unwrap_or(1),
                iteration_secs,
                jitter,
                host_lead_secs: host_lead_ms / 1e3,
                layers,
            },
            noise,
            steps: raw.steps,
            faults: vec![],
            capture,
            capture_named,
            metrics,
            grad_check,
        };
        let ranks = world;
        for (i, f) in raw.faults.into_iter().enumerate() {
            if let Some(fault) = scenario.check_fault(&mut c, i, f, ranks) {
                scenario.faults.push(fault);
            }
        }
        let stopping: Vec<usize> = (0..scenario.faults.len())
            .filter(|&i| scenario.faults[i].kind.stops_job())
            .collect();
        if stopping.len() > 1 {
            c.fail(
                format!("faults[{}]", stopping[1]),
                "at most one fault may stop the job (hang, crash or a fatal xid)",
            );
        } else if let Some(&s) = stopping.first() {
            let step = scenario.faults[s].step;
            if let Some(later) = scenario.faults.iter().position(|f| f.step > step) {
                c.fail(
                    format!("faults[{s}].step"),
                    format!(
                        "a fault that stops the job must come last, but faults[{later}] starts later at step {}",
                        scenario.faults[later].step
                    ),
                );
            }
        }
        if c.problems.is_empty() {
            Ok(scenario)
        } else {
            Err(ScenarioError::Invalid {
                problems: c.problems,
            })
        }
    }

    fn check_fault(&self, c: &mut Checker, i: usize, f: RawFault, ranks: u64) -> Option<Fault> {
        let at = |field: &str| format!("faults[{i}].{field}");
        let before = c.problems.len();
        let needs: &[&str] = match f.kind.as_str() {
            "straggler" | "slow_link" => &["node"],
            "nan" | "hang" | "crash" => &["rank"],
            "xid" => &["node", "gpu", "code"],
            other => {
                c.fail(at("kind"), format!("unknown kind {other:?} (expected one of straggler, slow_link, nan, xid, hang, crash)"));
                return None;
            }
        };
        let allowed: &[&str] = match f.kind.as_str() {
            "straggler" | "slow_link" => &["node", "slowdown"],
            "xid" => &["node", "gpu", "code"],
            _ => &["rank"],
        };
        let present = [
            ("node", f.node.is_some()),
            ("rank", f.rank.is_some()),
            ("gpu", f.gpu.is_some()),
            ("code", f.code.is_some()),
            ("slowdown", f.slowdown.is_some()),
        ];
        for (field, is) in present {
            if needs.contains(&field) && !is {
                c.fail(
                    format!("faults[{i}]"),
                    format!("kind {} needs field {field}", f.kind),
                );
            }
            if is && !allowed.contains(&field) {
                c.fail(at(field), format!("is not a field of kind {}", f.kind));
            }
        }
        if f.step >= self.steps {
            c.fail(
                at("step"),
                format!(
                    "{} is not before the end of the run (steps = {})",
                    f.step, self.steps
                ),
            );
        }
        let stops = matches!(f.kind.as_str(), "hang" | "crash")
            || (f.kind == "xid" && f.code.is_some_and(is_fatal_xid));
        if stops && f.until_step.is_some() {
            c.fail(
                at("until_step"),
                format!("a {} stops the job for good and cannot end", f.kind),
            );
        }
        if let Some(u) = f.until_step
            && u <= f.step
        {
            c.fail(
                at("until_step"),
                format!("{u} must be after step {}", f.step),
            );
        }
        if let Some(r) = f.rank
            && u64::from(r) >= ranks
        {
            c.fail(
                at("rank"),
                format!("{r} is out of range (job has {ranks} ranks)"),
            );
        }
        if let Some(node) = &f.node
            && self.node_index(node).is_none()
        {
            c.fail(
                at("node"),
                format!(
                    "no node {node:?} in the job (nodes are {} .. {})",
                    self.node_name(0),
                    self.node_name(self.job.nodes.saturating_sub(1))
                ),
            );
        }
        if let Some(g) = f.gpu
            && g >= self.job.gpus_per_node
        {
            c.fail(
                at("gpu"),
                format!(
                    "{g} is out of range (nodes have {} GPUs)",
                    self.job.gpus_per_node
                ),
            );
        }
        if let Some(s) = f.slowdown
            && !(s.is_finite() && s >= 1.0)
        {
            c.fail(at("slowdown"), "must be >= 1.0");
        }
        if f.recovers.is_some() && f.kind != "xid" {
            c.fail(at("recovers"), "only an xid fault recovers (or not)");
        }
        if c.problems.len() > before {
            return None;
        }
        let node = f.node.unwrap_or_default();
        let rank = f.rank.unwrap_or(0);
        let kind = match f.kind.as_str() {
            "straggler" => FaultKind::Straggler {
                node,
                slowdown: f.slowdown.unwrap_or(1.3),
            },
            "slow_link" => FaultKind::SlowLink {
                node,
                slowdown: f.slowdown.unwrap_or(2.0),
            },
            "nan" => FaultKind::Nan { rank },
            "hang" => FaultKind::Hang { rank },
            "crash" => FaultKind::Crash { rank },
            _ => FaultKind::Xid {
                node,
                gpu: f.gpu.unwrap_or(0),
                code: f.code.unwrap_or(0),
                recovers: f.recovers.unwrap_or(false),
            },
        };
        Some(Fault {
            step: f.step,
            until_step: f.until_step,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_passes_its_health_check_unless_an_xid_broke_a_gpu_for_good() {
        let s = Scenario::from_yaml(
            "job: {name: j, nodes: 4, gpus_per_node: 2}\nsteps: 100\nfaults:\n  \
             - {step: 20, kind: xid, node: node-02, gpu: 0, code: 63}\n  \
             - {step: 30, kind: straggler, node: node-03}\n  \
             - {step: 40, kind: xid, node: node-01, gpu: 1, code: 79, recovers: true}\n",
            "t",
        )
        .expect("valid");
        assert!(s.passes_health_check("node-00"));
        assert!(s.passes_health_check("node-01"));
        assert!(!s.passes_health_check("node-02"));
        assert!(s.passes_health_check("node-03"));
        let e = Scenario::from_yaml(
            "job: {name: j, nodes: 4, gpus_per_node: 2}\nsteps: 100\nfaults:\n  \
             - {step: 30, kind: straggler, node: node-03, recovers: true}\n",
            "t",
        )
        .expect_err("refused");
        assert!(e.to_string().contains("recovers"), "{e}");
    }

    #[test]
    fn node_names_are_zero_padded() {
        assert_eq!(node_name(5, 16), "node-05");
        assert_eq!(node_name(5, 4), "node-05");
        assert_eq!(node_name(7, 128), "node-007");
        assert_eq!(node_name(2047, 2048), "node-2047");
        assert_eq!(node_name(3, 101), "node-003");
        assert_eq!(node_name(3, 100), "node-03");
    }

    #[test]
    fn defaults_fill_everything_but_job_and_steps() {
        let s = Scenario::from_yaml("job: {}\nsteps: 10\n", "t").expect("valid");
        assert_eq!(s.ranks(), 32);
        assert_eq!((s.job.tp, s.job.pp, s.job.dp), (8, 1, 4));
        assert_eq!(s.job.name, "sim");
        assert_eq!(s.noise, Noise::default());
        assert_eq!(s.node_index("node-03"), Some(3));
        assert_eq!(s.node_index("node-3"), None);
        assert_eq!(s.node_index("node-04"), None);
    }

    #[test]
    fn default_tp_divides_the_world() {
        let s = Scenario::from_yaml("job: {nodes: 3, gpus_per_node: 6}\nsteps: 1\n", "t")
            .expect("valid");
        assert_eq!(s.job.tp * s.job.pp * s.job.dp, 18);
        assert_eq!(s.job.tp, 6);
        let s = Scenario::from_yaml(
            "job: {nodes: 4, gpus_per_node: 8, parallelism: {pp: 2}}\nsteps: 1\n",
            "t",
        )
        .expect("valid");
        assert_eq!((s.job.tp, s.job.pp, s.job.dp), (8, 2, 2));
    }
}
