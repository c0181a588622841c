//! Training metrics and watchdog reports out of log lines.
//!
//! [`Extractor::extract`] tries the presets of the line's source (see [`presets`]) and
//! the source's custom patterns, each behind its cheap literal check, and parses
//! PyTorch's NCCL and gloo watchdog lines into a [`Watchdog`]. Non-finite values are
//! kept as they are: a `nan` loss becomes `f64::NAN`, never an error or a skipped line.
//!
//! Watchdog lines differ between PyTorch releases; these are recognised:
//!
//! - `[Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=312774,
//!   OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1801487 milliseconds before timing
//!   out.` (≤ 2.1; 2.2 and later add `NumelIn=96, NumelOut=96`, and a `[rank4]:[E1109
//!   14:37:52.603317482 ProcessGroupNCCL.cpp:629]` prefix)
//! - `[PG 0 (default_pg) Rank 1] Timeout at NCCL work: 6463, last enqueued NCCL work:
//!   6463, last completed NCCL work: 6462.` and `... Exception (either an error or
//!   timeout) detected by watchdog at work: 6463, last enqueued ...` (2.3 – 2.5)
//! - `[PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work
//!   sequence id: 1284 PG status: last enqueued work: 1315, last completed work: 1283`
//!   (2.6 and later)
//! - `Received a dump signal due to a collective timeout from this local rank (or: from
//!   rank 10) and we will try our best to dump the debug info. Last enqueued NCCL work:
//!   1315, last completed NCCL work: 1283.`
//! - `ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in
//!   monitoring enqueued collectives.`
//! - gloo: `Timed out waiting 1800000ms for recv operation to complete`.
//!
//! [`presets`]: super::presets

use std::sync::{Arc, OnceLock};

use regex::Regex;
use rustc_hash::FxHashMap;
use warden_model::wire::{CollOp, TrainingMetric};

use super::{
    LogLine, TailConfig,
    attribution::{PrefixKind, line_prefix, rank_tag},
    config::{ConfigError, ThroughputUnitName},
    numfield::Scan,
    presets::{FIELDS, Field, Preset, PresetCatalog},
};

/// What a throughput value counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThroughputUnit {
    /// Tokens per second.
    TokensPerS,
    /// Samples per second.
    SamplesPerS,
    /// Iterations (batches) per second.
    ItersPerS,
}

/// A throughput reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// The value.
    pub value: f64,
    /// What it counts.
    pub unit: ThroughputUnit,
}

/// Training progress read from one log line.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetric {
    /// The preset or custom pattern that read it.
    pub preset: Arc<str>,
    /// The job, when attributed.
    pub job: Option<Arc<str>>,
    /// Global rank, when attributed.
    pub rank: Option<u32>,
    /// The step: the framework's own, or (when `step_is_ordinal`) the count of such
    /// lines from the same file and rank.
    pub step: u64,
    /// The step is a count of lines, not the framework's step number.
    pub step_is_ordinal: bool,
    /// When the line was written (see [`LogLine::at_ns`]).
    pub at_ns: i64,
    /// Loss (NaN and infinities kept).
    pub loss: Option<f64>,
    /// Gradient norm (NaN and infinities kept).
    pub grad_norm: Option<f64>,
    /// Learning rate.
    pub lr: Option<f64>,
    /// Throughput.
    pub throughput: Option<Throughput>,
}

impl StepMetric {
    /// Whether loss or gradient norm is NaN or infinite.
    pub fn has_non_finite(&self) -> bool {
        self.loss.is_some_and(|v| !v.is_finite()) || self.grad_norm.is_some_and(|v| !v.is_finite())
    }

    /// The wire form. The rank is the metric's own or else `fallback_rank`; without
    /// either there is no wire form (the wire needs a rank). Throughput goes into
    /// `tokens_per_s` only when it counts tokens.
    pub fn to_wire(&self, fallback_rank: Option<u32>) -> Option<TrainingMetric> {
        let rank = self.rank.or(fallback_rank)?;
        Some(TrainingMetric {
            rank,
            step: self.step,
            at_ns: self.at_ns,
            loss: self.loss,
            grad_norm: self.grad_norm,
            tokens_per_s: self
                .throughput
                .filter(|t| t.unit == ThroughputUnit::TokensPerS)
                .map(|t| t.value),
            first_nonfinite_op: None,
        })
    }
}

/// The communication backend a watchdog line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// ProcessGroupNCCL.
    Nccl,
    /// ProcessGroupGloo.
    Gloo,
}

/// Which watchdog message a [`Watchdog`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchdogKind {
    /// `Watchdog caught collective operation timeout: WorkNCCL(...) ran for N ms`.
    CollectiveTimeout,
    /// `Timeout at NCCL work: N, last enqueued NCCL work: A, last completed ...`.
    WorkTimeout,
    /// `Exception (either an error or timeout) detected by watchdog at work: N, ...`.
    WatchdogException,
    /// `failure detected by watchdog at work sequence id: N PG status: ...`.
    FailureDetected,
    /// `Received a dump signal due to a collective timeout from ...`.
    DumpSignal,
    /// `ProcessGroupNCCL's watchdog got stuck for N seconds ...` (heartbeat monitor).
    WatchdogStuck,
    /// gloo's `Timed out waiting Nms for recv operation to complete`.
    GlooTimeout,
}

/// A PyTorch process-group watchdog or timeout report, as structured as the line allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watchdog {
    /// Which message.
    pub kind: WatchdogKind,
    /// NCCL or gloo.
    pub backend: Backend,
    /// Global rank: the line's `[rankN]:` prefix, else the line's attributed rank.
    pub rank: Option<u32>,
    /// Rank within the process group (`[Rank N]`, `[PG ... Rank N]`).
    pub pg_rank: Option<u32>,
    /// Process group id (`PG 0`, `PG ID 0`).
    pub pg_id: Option<u32>,
    /// Process group GUID (`PG GUID 0`), when printed.
    pub pg_guid: Option<String>,
    /// Process group name (`default_pg`), when printed.
    pub pg_name: Option<String>,
    /// Sequence number of the work that timed out (`SeqNum=`, `NCCL work:`).
    pub seq: Option<u64>,
    /// Operation as printed (`ALLREDUCE`, `_ALLGATHER_BASE`, gloo's `recv`).
    pub op: Option<String>,
    /// Elements in.
    pub numel_in: Option<u64>,
    /// Elements out.
    pub numel_out: Option<u64>,
    /// The timeout, ms (`Timeout(ms)=`; for `WatchdogStuck`, the heartbeat timeout).
    pub timeout_ms: Option<u64>,
    /// How long the work ran before the watchdog gave up, ms.
    pub ran_for_ms: Option<u64>,
    /// Last work this rank enqueued in the group.
    pub last_enqueued: Option<u64>,
    /// Last work this rank completed in the group.
    pub last_completed: Option<u64>,
    /// The rank that signalled the dump (`... from rank 10`).
    pub signalled_by: Option<u32>,
}

impl Watchdog {
    /// A report of this kind with nothing else known yet.
    pub fn new(kind: WatchdogKind, backend: Backend) -> Self {
        Watchdog {
            kind,
            backend,
            rank: None,
            pg_rank: None,
            pg_id: None,
            pg_guid: None,
            pg_name: None,
            seq: None,
            op: None,
            numel_in: None,
            numel_out: None,
            timeout_ms: None,
            ran_for_ms: None,
            last_enqueued: None,
            last_completed: None,
            signalled_by: None,
        }
    }

    /// The operation as a wire [`CollOp`].
    pub fn coll_op(&self) -> CollOp {
        let Some(op) = &self.op else {
            return CollOp::Unknown;
        };
        let op = op.trim_start_matches('_').to_ascii_uppercase();
        let table = [
            ("ALLREDUCE", CollOp::AllReduce),
            ("ALLGATHER", CollOp::AllGather),
            ("REDUCE_SCATTER", CollOp::ReduceScatter),
            ("REDUCESCATTER", CollOp::ReduceScatter),
            ("BROADCAST", CollOp::Broadcast),
            ("ALLTOALL", CollOp::AllToAll),
            ("REDUCE", CollOp::Reduce),
            ("SEND", CollOp::Send),
            ("RECV", CollOp::Recv),
            ("BARRIER", CollOp::Barrier),
        ];
        table
            .iter()
            .find(|(name, _)| op.starts_with(name))
            .map_or(CollOp::Unknown, |(_, o)| *o)
    }
}

/// What [`Extractor::extract`] found in a line.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Extracted {
    /// Training progress.
    pub metric: Option<StepMetric>,
    /// A watchdog or timeout report.
    pub watchdog: Option<Watchdog>,
    /// Worth shipping on its own: a traceback, or a line with one of
    /// [`NOTABLE_NEEDLES`].
    pub notable: bool,
}

/// Literals that make a line worth shipping on its own (case-sensitive, as printed).
/// Each starts with bytes that ordinary lowercase log text rarely has, so the one-pass
/// search seldom stops to verify a candidate.
pub const NOTABLE_NEEDLES: [&str; 12] = [
    "Error",
    "ERROR",
    "Exception",
    "Traceback",
    "NCCL WARN",
    "Watchdog",
    "Timeout",
    "TIMEOUT",
    "Timed out",
    "Segmentation fault",
    "Killed",
    "CUDA error",
];

/// Whether `text` holds one of [`NOTABLE_NEEDLES`].
pub fn is_notable_text(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE.get_or_init(|| {
        let alternation: Vec<String> = NOTABLE_NEEDLES.iter().map(|n| regex::escape(n)).collect();
        Regex::new(&alternation.join("|")).ok()
    });
    match re {
        Some(re) => re.is_match(text),
        None => NOTABLE_NEEDLES.iter().any(|n| text.contains(n)),
    }
}

/// Most (file, rank, preset) step counters kept; beyond it they start again.
const MAX_COUNTERS: usize = 4096;

/// The presets one source tries, in order, behind one combined literal check.
#[derive(Debug, Clone)]
struct PresetSet {
    /// Indexes into `Extractor::presets`.
    members: Vec<usize>,
    /// Matches any needle of any member; `None` when some member has no needle (every
    /// line must be tried).
    prefilter: Option<Regex>,
    /// The same plus the watchdog and notable needles: one scan rejects most lines for
    /// all three.
    any: Option<Regex>,
}

impl PresetSet {
    fn new(members: Vec<usize>, presets: &[Compiled]) -> Self {
        let mut needles: Vec<String> = Vec::new();
        let mut all_have = true;
        for &i in &members {
            let n = &presets[i].preset.needles;
            if n.is_empty() {
                all_have = false;
            }
            needles.extend(n.iter().map(|s| regex::escape(s)));
        }
        // Escaped literals always compile; should they not, every line is tried.
        let prefilter = if all_have && !needles.is_empty() {
            Regex::new(&needles.join("|")).ok()
        } else {
            None
        };
        let any = if all_have {
            needles.push(WATCHDOG_NEEDLES.to_string());
            needles.extend(NOTABLE_NEEDLES.iter().map(|s| regex::escape(s)));
            Regex::new(&needles.join("|")).ok()
        } else {
            None
        };
        PresetSet {
            members,
            prefilter,
            any,
        }
    }
}

/// A preset with the capture buffers reused from line to line.
#[derive(Debug, Clone)]
struct Compiled {
    name: Arc<str>,
    preset: Preset,
    locs: regex::CaptureLocations,
    field_locs: Vec<regex::CaptureLocations>,
}

impl Compiled {
    fn new(preset: Preset) -> Self {
        Compiled {
            name: Arc::from(preset.name.as_str()),
            locs: preset.pattern.capture_locations(),
            field_locs: preset
                .fields
                .iter()
                .map(|(_, re)| re.capture_locations())
                .collect(),
            preset,
        }
    }

    /// The values the preset reads from `text`, if its pattern matches.
    fn read(&mut self, text: &str) -> Option<[Option<f64>; FIELDS]> {
        let p = &self.preset;
        p.pattern.captures_read(&mut self.locs, text)?;
        let num = |span: Option<(usize, usize)>| {
            span.and_then(|(a, b)| text.get(a..b))
                .and_then(|s| s.parse::<f64>().ok())
        };
        let mut v = [None; FIELDS];
        for &(gi, f) in &p.groups {
            v[f as usize] = num(self.locs.get(gi));
        }
        let fields = p.fields.iter().zip(&p.fast_fields);
        for (((f, re), fast), locs) in fields.zip(self.field_locs.iter_mut()) {
            if v[*f as usize].is_some() {
                continue;
            }
            let span = match fast.as_ref().map(|fast| fast.find(text)) {
                Some(Scan::Found(a, b)) => Some((a, b)),
                Some(Scan::Absent) => None,
                // Group 1 is `v`, the field regex's only group (checked at load).
                Some(Scan::Unsure) | None => re.captures_read(locs, text).and_then(|_| locs.get(1)),
            };
            v[*f as usize] = num(span);
        }
        Some(v)
    }
}

/// Reads metrics with the presets each source asks for.
#[derive(Debug)]
pub struct Extractor {
    presets: Vec<Compiled>,
    /// Per config source.
    per_source: Vec<PresetSet>,
    /// For lines of a source the config does not have: every enabled preset.
    default_set: PresetSet,
    counts: FxHashMap<(Arc<str>, Option<u32>, usize), u64>,
}

impl Extractor {
    /// Build from the sources' `presets` and `patterns`; every unknown preset name and
    /// bad pattern is reported, each naming its field.
    pub fn new(cfg: &TailConfig, catalog: &PresetCatalog) -> Result<Self, ConfigError> {
        let mut presets: Vec<Compiled> = catalog.iter().cloned().map(Compiled::new).collect();
        let enabled: Vec<usize> = (0..presets.len())
            .filter(|&i| presets[i].preset.enabled)
            .collect();
        let mut problems = Vec::new();
        let mut members = Vec::with_capacity(cfg.sources.len());
        for (si, s) in cfg.sources.iter().enumerate() {
            let mut set = match &s.presets {
                None => enabled.clone(),
                Some(names) => {
                    let mut set = Vec::new();
                    for (j, n) in names.iter().enumerate() {
                        match presets.iter().position(|c| *c.name == **n) {
                            Some(i) => set.push(i),
                            None => problems.push(format!(
                                "sources[{si}].presets[{j}]: unknown preset {n:?} (known: {})",
                                catalog.names().join(", ")
                            )),
                        }
                    }
                    set
                }
            };
            for (j, c) in s.patterns.iter().enumerate() {
                match Preset::custom(c) {
                    Ok(p) => {
                        presets.push(Compiled::new(p));
                        set.push(presets.len() - 1);
                    }
                    Err(e) => problems.push(format!("sources[{si}].patterns[{j}].{e}")),
                }
            }
            members.push(set);
        }
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems));
        }
        let per_source = members
            .into_iter()
            .map(|m| PresetSet::new(m, &presets))
            .collect();
        let default_set = PresetSet::new(enabled, &presets);
        Ok(Extractor {
            presets,
            per_source,
            default_set,
            counts: FxHashMap::default(),
        })
    }

    /// An extractor that applies every enabled preset of `catalog` to every line.
    pub fn with_presets(catalog: &PresetCatalog) -> Self {
        let presets: Vec<Compiled> = catalog.iter().cloned().map(Compiled::new).collect();
        let enabled = (0..presets.len())
            .filter(|&i| presets[i].preset.enabled)
            .collect();
        let default_set = PresetSet::new(enabled, &presets);
        Extractor {
            presets,
            per_source: Vec::new(),
            default_set,
            counts: FxHashMap::default(),
        }
    }

    /// Metric and watchdog report of one line.
    pub fn extract(&mut self, line: &LogLine) -> Extracted {
        let set = self
            .per_source
            .get(line.source_index)
            .unwrap_or(&self.default_set);
        if set.any.as_ref().is_some_and(|re| !re.is_match(&line.text)) {
            return Extracted {
                notable: line.lines > 1,
                ..Extracted::default()
            };
        }
        Extracted {
            metric: self.metric(line),
            watchdog: parse_watchdog(&line.text).map(|mut w| {
                w.rank = w.rank.or(line.rank);
                w
            }),
            notable: line.lines > 1 || is_notable_text(&line.text),
        }
    }

    /// The training metric of one line, if a preset reads one. Multi-line records
    /// (tracebacks) are not read for metrics.
    pub fn metric(&mut self, line: &LogLine) -> Option<StepMetric> {
        if line.lines > 1 {
            return None;
        }
        let text = line.text.as_str();
        let Extractor {
            presets,
            per_source,
            default_set,
            counts,
        } = self;
        let set = per_source.get(line.source_index).unwrap_or(default_set);
        if let Some(pf) = &set.prefilter
            && !pf.is_match(text)
        {
            return None;
        }
        for &pi in &set.members {
            let c = &mut presets[pi];
            if !c.preset.wants(text) {
                continue;
            }
            let Some(values) = c.read(text) else {
                continue;
            };
            let rank = line.rank.or_else(|| {
                as_u64(values[Field::Rank as usize]).and_then(|r| u32::try_from(r).ok())
            });
            let (epoch_base, unit) = (c.preset.epoch_base, c.preset.throughput_unit);
            let Some(m) = build(c.name.clone(), values, epoch_base, unit, line, rank) else {
                continue;
            };
            let m = match m {
                Built::Done(m) => m,
                Built::NeedsCount(mut m) => {
                    if counts.len() >= MAX_COUNTERS {
                        counts.clear();
                    }
                    let n = counts.entry((line.source.clone(), rank, pi)).or_insert(0);
                    *n += 1;
                    m.step = *n;
                    m.step_is_ordinal = true;
                    m
                }
            };
            return Some(m);
        }
        None
    }
}

enum Built {
    Done(StepMetric),
    NeedsCount(StepMetric),
}

/// A non-negative finite float as an integer.
fn as_u64(v: Option<f64>) -> Option<u64> {
    let v = v?;
    (0.0..1.8e19).contains(&v).then(|| v.round() as u64)
}

fn build(
    preset: Arc<str>,
    v: [Option<f64>; FIELDS],
    epoch_base: u64,
    unit: ThroughputUnitName,
    line: &LogLine,
    rank: Option<u32>,
) -> Option<Built> {
    let get = |f: Field| v[f as usize];
    let mut loss = get(Field::Loss);
    if loss.is_none() && as_u64(get(Field::NanIterations)).is_some_and(|n| n > 0) {
        // Megatron leaves NaN iterations out of the average and counts them instead.
        loss = Some(f64::NAN);
    }
    let throughput = if let Some(t) = get(Field::TokensPerS) {
        Some((t, ThroughputUnit::TokensPerS))
    } else if let Some(s) = get(Field::SamplesPerS) {
        Some((s, ThroughputUnit::SamplesPerS))
    } else if let (Some(gbs), Some(ms)) = (get(Field::GlobalBatchSize), get(Field::IterMs)) {
        (ms > 0.0).then(|| (gbs * 1000.0 / ms, ThroughputUnit::SamplesPerS))
    } else if let Some(i) = get(Field::ItersPerS) {
        Some((i, ThroughputUnit::ItersPerS))
    } else if let Some(s) = get(Field::SecsPerIter) {
        (s > 0.0).then(|| (1.0 / s, ThroughputUnit::ItersPerS))
    } else {
        get(Field::Throughput).map(|t| {
            let unit = match unit {
                ThroughputUnitName::Tokens => ThroughputUnit::TokensPerS,
                ThroughputUnitName::Samples => ThroughputUnit::SamplesPerS,
                ThroughputUnitName::Iterations => ThroughputUnit::ItersPerS,
            };
            (t, unit)
        })
    }
    .map(|(value, unit)| Throughput { value, unit });
    let explicit = as_u64(get(Field::Step)).or_else(|| {
        let (e, b, n) = (
            as_u64(get(Field::Epoch))?,
            as_u64(get(Field::Batch))?,
            as_u64(get(Field::Batches))?,
        );
        e.saturating_sub(epoch_base).checked_mul(n)?.checked_add(b)
    });
    let lr = get(Field::Lr);
    let grad_norm = get(Field::GradNorm);
    if explicit.is_none() && loss.is_none() && grad_norm.is_none() && throughput.is_none() {
        return None;
    }
    let m = StepMetric {
        preset,
        job: line.job.clone(),
        rank,
        step: explicit.unwrap_or(0),
        step_is_ordinal: false,
        at_ns: line.at_ns,
        loss,
        grad_norm,
        lr,
        throughput,
    };
    // A preset with `step: count`, or one whose line lacked the step this time (a
    // progress bar of unknown length), numbers its lines instead.
    Some(match explicit {
        Some(_) => Built::Done(m),
        None => Built::NeedsCount(m),
    })
}

struct WatchdogRegexes {
    needles: Regex,
    pg: Regex,
    seq: Regex,
    op: Regex,
    numel_in: Regex,
    numel_out: Regex,
    timeout: Regex,
    ran_for: Regex,
    work: Regex,
    exception: Regex,
    failure: Regex,
    dump: Regex,
    stuck: Regex,
    gloo: Regex,
    enq_done: Regex,
}

fn regexes() -> Option<&'static WatchdogRegexes> {
    static RE: OnceLock<Option<WatchdogRegexes>> = OnceLock::new();
    RE.get_or_init(|| {
        let r = |s: &str| Regex::new(s).ok();
        Some(WatchdogRegexes {
            needles: r(WATCHDOG_NEEDLES)?,
            pg: r(
                r"\[PG (?:ID )?(?P<id>\d+)(?: PG GUID (?P<guid>[^\s(\]]+))?\s*(?:\((?P<name>[^)\]]*)\))?\s*Rank (?P<rank>\d+)\]",
            )?,
            seq: r(r"SeqNum=(\d+)")?,
            op: r(r"OpType=([A-Za-z_]+)")?,
            numel_in: r(r"NumelIn=(\d+)")?,
            numel_out: r(r"NumelOut=(\d+)")?,
            timeout: r(r"Timeout\(ms\)=(\d+)")?,
            ran_for: r(r"ran for (\d+) milliseconds")?,
            work: r(r"Timeout at NCCL work: (\d+)")?,
            exception: r(r"detected by watchdog at work: (\d+)")?,
            failure: r(r"failure detected by watchdog at work sequence id: (\d+)")?,
            dump: r(
                r"Received a dump signal due to a collective timeout from (?:this local rank|rank (\d+))",
            )?,
            stuck: r(r"watchdog got stuck for (\d+) seconds")?,
            gloo: r(r"Timed out waiting (\d+)ms for (send|recv) operation")?,
            enq_done: r(
                r"(?i:last) enqueued (?:NCCL )?work: (\d+), last completed (?:NCCL )?work: (\d+)",
            )?,
        })
    })
    .as_ref()
}

/// Literals one of which every recognised watchdog line contains.
/// (Not `NCCL work`: its first bytes are those of every `NCCL INFO` line.)
const WATCHDOG_NEEDLES: &str = "atchdog|enqueued|Timed out waiting|dump signal";

/// Parse a PyTorch watchdog or process-group timeout line (in a multi-line record, the
/// first line that is one). Cheap on other lines: one literal search rejects them.
pub fn parse_watchdog(text: &str) -> Option<Watchdog> {
    let re = regexes()?;
    let mut done_to = 0;
    for m in re.needles.find_iter(text) {
        if m.start() < done_to {
            continue;
        }
        // Work on the line that holds the match.
        let start = text[..m.start()].rfind('\n').map_or(0, |i| i + 1);
        let end = text[m.start()..]
            .find('\n')
            .map_or(text.len(), |i| m.start() + i);
        if let Some(w) = parse_watchdog_line(&text[start..end], re) {
            return Some(w);
        }
        done_to = end;
    }
    None
}

fn parse_watchdog_line(line: &str, re: &WatchdogRegexes) -> Option<Watchdog> {
    let num = |r: &Regex| -> Option<u64> {
        r.captures(line)
            .and_then(|c| c.get(1))
            .and_then(|m| m.as_str().parse().ok())
    };
    let mut w;
    if line.contains("Watchdog caught collective operation timeout") {
        w = Watchdog::new(WatchdogKind::CollectiveTimeout, Backend::Nccl);
        w.seq = num(&re.seq);
        w.op = re
            .op
            .captures(line)
            .and_then(|c| c.get(1))
            .map(|m| m.as_str().to_string());
        w.numel_in = num(&re.numel_in);
        w.numel_out = num(&re.numel_out);
        w.timeout_ms = num(&re.timeout);
        w.ran_for_ms = num(&re.ran_for);
    } else if let Some(seq) = num(&re.failure) {
        w = Watchdog::new(WatchdogKind::FailureDetected, Backend::Nccl);
        w.seq = Some(seq);
    } else if let Some(seq) = num(&re.work) {
        w = Watchdog::new(WatchdogKind::WorkTimeout, Backend::Nccl);
        w.seq = Some(seq);
    } else if let Some(seq) = num(&re.exception) {
        w = Watchdog::new(WatchdogKind::WatchdogException, Backend::Nccl);
        w.seq = Some(seq);
    } else if let Some(c) = re.dump.captures(line) {
        w = Watchdog::new(WatchdogKind::DumpSignal, Backend::Nccl);
        w.signalled_by = c.get(1).and_then(|m| m.as_str().parse().ok());
    } else if let Some(secs) = num(&re.stuck) {
        w = Watchdog::new(WatchdogKind::WatchdogStuck, Backend::Nccl);
        w.timeout_ms = secs.checked_mul(1000);
    } else if let Some(c) = re.gloo.captures(line) {
        w = Watchdog::new(WatchdogKind::GlooTimeout, Backend::Gloo);
        w.timeout_ms = c.get(1).and_then(|m| m.as_str().parse().ok());
        w.op = c.get(2).map(|m| m.as_str().to_string());
    } else {
        return None;
    }
    if let Some(c) = re.enq_done.captures(line) {
        w.last_enqueued = c.get(1).and_then(|m| m.as_str().parse().ok());
        w.last_completed = c.get(2).and_then(|m| m.as_str().parse().ok());
    }
    if let Some(c) = re.pg.captures(line) {
        w.pg_id = c.name("id").and_then(|m| m.as_str().parse().ok());
        w.pg_guid = c.name("guid").map(|m| m.as_str().to_string());
        w.pg_name = c
            .name("name")
            .map(|m| m.as_str().to_string())
            .filter(|s| !s.is_empty());
        w.pg_rank = c.name("rank").and_then(|m| m.as_str().parse().ok());
    }
    if w.pg_rank.is_none() {
        w.pg_rank = rank_tag(line);
    }
    w.rank = line_prefix(line)
        .filter(|p| p.kind == PrefixKind::Global)
        .map(|p| p.n);
    Some(w)
}
