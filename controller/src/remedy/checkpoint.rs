//! Finding the latest complete training checkpoint (Megatron-LM, DeepSpeed, PyTorch DCP, Hugging Face Trainer).
//!
//! A restarted job should resume from the newest checkpoint that was completely written,
//! never from one a crash cut short. [`latest_complete`] answers that for a job's
//! checkpoint directory; [`scan`] lists every candidate it looked at and, for each one it
//! would not use, why ("skipped iter_0000200: tracker names iter_0000100; shard
//! mp_rank_01 missing"), for the incident's timeline.
//!
//! Each convention has its own notion of "complete":
//!
//! - **Megatron-LM** ([`Format::Megatron`]): `latest_checkpointed_iteration.txt` (an
//!   iteration number or `release`) is written once a save has completed; `iter_NNNNNNN/`
//!   directories newer than the one it names are in progress or abandoned. A checkpoint
//!   holds either `mp_rank_XX[_YYY[_ZZZ]]/model_optim_rng.pt` shards with no gap in their
//!   numbering, or a `torch_dist` checkpoint (`.metadata`, `common.pt`, `*.distcp`).
//! - **DeepSpeed** ([`Format::DeepSpeed`]): `latest` holds the tag of the last completed
//!   save (`global_step200`); a checkpoint `<tag>/` holds `mp_rank_NN_model_states.pt`
//!   and, with ZeRO, `*zero_pp_rank_D_mp_rank_NN_optim_states.pt` for every data-parallel
//!   rank. The step is the tag's trailing number.
//! - **PyTorch Distributed Checkpoint** ([`Format::Dcp`]): one directory per step
//!   (`step_200`, `step-200`, `iter_200`, `checkpoint_200`, any name ending in digits)
//!   holding `__R_N.distcp` data files and `.metadata`, which is written last.
//! - **Hugging Face Trainer** ([`Format::HuggingFace`]): `checkpoint-N/` directories; the
//!   Trainer writes `trainer_state.json` after the weights, and its `global_step` is the
//!   step. Weights are `model.safetensors`, `pytorch_model.bin`, a PEFT adapter, a sharded
//!   index whose every shard exists, an FSDP sharded (DCP) directory or a nested DeepSpeed
//!   checkpoint.
//!
//! Everywhere, a zero-length tensor file (`.pt`, `.pth`, `.bin`, `.safetensors`,
//! `.distcp`) makes a checkpoint incomplete, and without its tracker file no Megatron or
//! DeepSpeed checkpoint counts as complete (the frameworks themselves would not load one).
//!
//! The reader is careful with what it is given: files it reads (trackers, JSON) are
//! bounded ([`MAX_TRACKER_BYTES`], [`MAX_JSON_BYTES`]), directory listings too
//! ([`MAX_ENTRIES`]), only regular files are opened, and a symbolic link whose target lies
//! outside the checkpoint directory is never followed.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

use super::ResumePoint;

/// The largest tracker file (`latest_checkpointed_iteration.txt`, `latest`) read.
pub const MAX_TRACKER_BYTES: u64 = 4096;
/// The largest JSON file (`trainer_state.json`, a sharded weights index) read.
pub const MAX_JSON_BYTES: u64 = 64 << 20;
/// The most entries read from one directory.
pub const MAX_ENTRIES: usize = 200_000;

/// Megatron-LM's tracker file.
const MEGATRON_TRACKER: &str = "latest_checkpointed_iteration.txt";
/// DeepSpeed's tracker file.
const DEEPSPEED_TRACKER: &str = "latest";
/// The file a DCP save writes last.
const DCP_METADATA: &str = ".metadata";
/// Hugging Face Trainer's state, written after the weights.
const HF_TRAINER_STATE: &str = "trainer_state.json";
/// Single-file weights the Trainer writes (full model or PEFT adapter).
const HF_WEIGHTS: [&str; 4] = [
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
];
/// Indexes of sharded weights.
const HF_INDEXES: [&str; 2] = [
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
];
/// How many names a problem lists before it says how many more there are.
const LIST_MAX: usize = 3;

/// A checkpoint convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Megatron-LM: `latest_checkpointed_iteration.txt` and `iter_NNNNNNN/`.
    Megatron,
    /// DeepSpeed: `latest` and `<tag>/`.
    DeepSpeed,
    /// PyTorch Distributed Checkpoint: one directory per step with `.metadata`.
    Dcp,
    /// Hugging Face Trainer: `checkpoint-N/` with `trainer_state.json`.
    HuggingFace,
}

impl Format {
    /// Every convention, in the order auto-detection prefers them.
    pub const ALL: [Format; 4] = [
        Format::Megatron,
        Format::DeepSpeed,
        Format::HuggingFace,
        Format::Dcp,
    ];

    /// Its label, as in [`ResumePoint::format`]: `megatron`, `deepspeed`, `dcp`,
    /// `huggingface`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Megatron => "megatron",
            Format::DeepSpeed => "deepspeed",
            Format::Dcp => "dcp",
            Format::HuggingFace => "huggingface",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A label that names no convention.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown checkpoint format {0:?} (expected megatron, deepspeed, dcp or huggingface)")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownFormat(s.to_owned()))
    }
}

/// Why a checkpoint directory could not be judged at all.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The directory (or its tracker file) could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// What could not be read.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The path given is not a directory.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory holds more than [`MAX_ENTRIES`] entries.
    #[error("{path} holds more than {max} entries")]
    TooManyEntries {
        /// The directory.
        path: PathBuf,
        /// The limit.
        max: usize,
    },
    /// The tracker file exists but says nothing usable.
    #[error("tracker {path}: {what}")]
    Tracker {
        /// The tracker file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
}

/// One checkpoint directory that was looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its directory.
    pub path: PathBuf,
    /// Its name in the checkpoint directory (`iter_0000200`, `checkpoint-500`).
    pub name: String,
    /// The step it holds, when known.
    pub step: Option<u64>,
    /// Why it is not a checkpoint to resume from; empty when it is complete.
    pub problems: Vec<String>,
}

impl Candidate {
    /// Whether it can be resumed from: complete, confirmed by the tracker where the
    /// convention has one, and with a known step.
    pub fn is_complete(&self) -> bool {
        self.problems.is_empty() && self.step.is_some()
    }

    /// `skipped <name>: <problem>; <problem>`, or `<name>: complete (step N)`.
    pub fn describe(&self) -> String {
        match (self.problems.is_empty(), self.step) {
            (true, Some(step)) => format!("{}: complete (step {step})", self.name),
            (true, None) => format!("skipped {}: no step number in its name", self.name),
            (false, _) => format!("skipped {}: {}", self.name, self.problems.join("; ")),
        }
    }
}

/// Everything found in a checkpoint directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// The directory scanned.
    pub dir: PathBuf,
    /// The convention used (given or detected); `None` when none was recognised.
    pub format: Option<Format>,
    /// What the tracker file says, when the convention has one and it exists.
    pub tracker: Option<String>,
    /// Findings that concern no single candidate ("tracker names iter_0000300, which is
    /// missing").
    pub notes: Vec<String>,
    /// Every candidate, newest first (those with no known step last).
    pub candidates: Vec<Candidate>,
}

impl Scan {
    /// The newest complete candidate, if any.
    pub fn chosen(&self) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.is_complete())
    }

    /// Where to resume: the newest complete candidate, if any.
    pub fn latest(&self) -> Option<ResumePoint> {
        let format = self.format?;
        let chosen = self.chosen()?;
        Some(ResumePoint {
            path: chosen.path.clone(),
            step: chosen.step?,
            format: format.as_str(),
        })
    }

    /// One line per candidate passed over: every incomplete candidate newer than the one
    /// chosen (all of them when none was), as [`Candidate::describe`] writes it.
    pub fn skipped(&self) -> Vec<String> {
        self.candidates
            .iter()
            .take_while(|c| !c.is_complete())
            .map(Candidate::describe)
            .collect()
    }
}

/// The latest complete checkpoint in `dir`, in the given convention or the one detected.
///
/// `Ok(None)` when there is none: an empty directory, one whose contents no convention
/// recognises (a job that has not saved yet often has only logs there), or one whose
/// every checkpoint is incomplete. Errors are for a directory that cannot be read or is
/// not one, and for a tracker file that exists but cannot be used (unreadable, too large,
/// not an iteration or tag); the frameworks refuse to resume in that case too.
pub fn latest_complete(
    dir: &Path,
    format: Option<Format>,
) -> Result<Option<ResumePoint>, CheckpointError> {
    Ok(scan(dir, format)?.latest())
}

/// Every candidate in `dir`, judged, in the given convention or the one detected
/// ([`detect`]). Errors as for [`latest_complete`].
pub fn scan(dir: &Path, format: Option<Format>) -> Result<Scan, CheckpointError> {
    let root = Root::new(dir)?;
    let entries = root.list_top(dir)?;
    let format = match format {
        Some(format) => Some(format),
        None => detect_in(&root, &entries),
    };
    let mut scan = Scan {
        dir: dir.to_path_buf(),
        format,
        tracker: None,
        notes: Vec::new(),
        candidates: Vec::new(),
    };
    match format {
        None => {}
        Some(Format::Megatron) => megatron(&root, dir, &entries, &mut scan)?,
        Some(Format::DeepSpeed) => deepspeed(&root, dir, &entries, &mut scan)?,
        Some(Format::Dcp) => dcp(&root, &entries, &mut scan),
        Some(Format::HuggingFace) => huggingface(&root, &entries, &mut scan),
    }
    scan.candidates.sort_by(|a, b| {
        b.step
            .is_some()
            .cmp(&a.step.is_some())
            .then(b.step.cmp(&a.step))
            .then(a.name.cmp(&b.name))
    });
    Ok(scan)
}

/// The convention `dir` follows, if any is recognised.
///
/// A tracker file decides (Megatron's first, then DeepSpeed's); otherwise the contents
/// of the subdirectories: Megatron shards or `common.pt` in `iter_*`, DeepSpeed
/// `*_model_states.pt`, Hugging Face `checkpoint-N` with its state or weights, then DCP
/// `.metadata` or `*.distcp`.
pub fn detect(dir: &Path) -> Result<Option<Format>, CheckpointError> {
    let root = Root::new(dir)?;
    let entries = root.list_top(dir)?;
    Ok(detect_in(&root, &entries))
}

fn detect_in(root: &Root, entries: &[Entry]) -> Option<Format> {
    let has_file = |name: &str| {
        entries
            .iter()
            .any(|e| e.name == name && matches!(e.kind, Kind::File(_)))
    };
    if has_file(MEGATRON_TRACKER) {
        return Some(Format::Megatron);
    }
    if has_file(DEEPSPEED_TRACKER) {
        return Some(Format::DeepSpeed);
    }
    let (mut megatron, mut deepspeed, mut hf, mut dcp) = (false, false, false, false);
    for entry in entries.iter().filter(|e| e.kind == Kind::Dir) {
        let Ok(inside) = root.list(&entry.path) else {
            continue;
        };
        let any = |f: &dyn Fn(&Entry) -> bool| inside.iter().any(f);
        if entry.name == "release" || megatron_iteration(&entry.name).is_some() {
            megatron |= any(&|e| {
                (e.name.starts_with("mp_rank_") && e.kind == Kind::Dir) || e.name == "common.pt"
            });
        }
        deepspeed |= any(&|e| ds_shard(&e.name).is_some());
        if hf_step(&entry.name).is_some() {
            hf |= any(&|e| {
                e.name == HF_TRAINER_STATE
                    || HF_WEIGHTS.contains(&e.name.as_str())
                    || HF_INDEXES.contains(&e.name.as_str())
            });
        }
        dcp |= any(&|e| e.name == DCP_METADATA || e.name.ends_with(".distcp"));
    }
    [
        (megatron, Format::Megatron),
        (deepspeed, Format::DeepSpeed),
        (hf, Format::HuggingFace),
        (dcp, Format::Dcp),
    ]
    .into_iter()
    .find_map(|(seen, format)| seen.then_some(format))
}

// ---------------------------------------------------------------------------------------
// Megatron-LM

/// What Megatron's tracker names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MegatronTracker {
    Iteration(u64),
    Release,
}

impl fmt::Display for MegatronTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MegatronTracker::Iteration(n) => write!(f, "iter_{n:07}"),
            MegatronTracker::Release => f.write_str("release"),
        }
    }
}

fn parse_megatron_tracker(text: &str) -> Option<MegatronTracker> {
    let text = text.trim();
    if text == "release" {
        return Some(MegatronTracker::Release);
    }
    digits(text).map(MegatronTracker::Iteration)
}

/// The iteration of a Megatron `iter_NNNNNNN` directory name.
fn megatron_iteration(name: &str) -> Option<u64> {
    name.strip_prefix("iter_").and_then(digits)
}

fn megatron(
    root: &Root,
    dir: &Path,
    entries: &[Entry],
    scan: &mut Scan,
) -> Result<(), CheckpointError> {
    let tracker_path = dir.join(MEGATRON_TRACKER);
    let tracked = match root.read_tracker(&tracker_path)? {
        None => None,
        Some(text) => {
            let tracked =
                parse_megatron_tracker(&text).ok_or_else(|| CheckpointError::Tracker {
                    path: tracker_path.clone(),
                    what: format!(
                        "holds {:?}, not an iteration number or `release`",
                        shorten(text.trim())
                    ),
                })?;
            scan.tracker = Some(tracked.to_string());
            Some(tracked)
        }
    };
    let mut tracked_seen = false;
    for entry in entries {
        let release = entry.name == "release";
        let step = if release {
            Some(0)
        } else {
            megatron_iteration(&entry.name)
        };
        let Some(step) = step else { continue };
        if matches!(entry.kind, Kind::File(_)) {
            continue;
        }
        let mut problems = Vec::new();
        match tracked {
            None => problems.push(format!(
                "no {MEGATRON_TRACKER} (Megatron writes it once a save completes)"
            )),
            Some(MegatronTracker::Release) if !release => {
                problems.push("tracker names release".to_owned());
            }
            Some(MegatronTracker::Iteration(n)) if release || step > n => {
                problems.push(format!("tracker names {}", MegatronTracker::Iteration(n)));
            }
            Some(MegatronTracker::Iteration(n)) => tracked_seen |= step == n,
            Some(MegatronTracker::Release) => tracked_seen = true,
        }
        problems
            .extend(entry_problems(entry).unwrap_or_else(|| megatron_content(root, &entry.path)));
        scan.candidates.push(Candidate {
            path: entry.path.clone(),
            name: entry.name.clone(),
            step: Some(step),
            problems,
        });
    }
    if let Some(tracked) = tracked
        && !tracked_seen
    {
        scan.notes
            .push(format!("tracker names {tracked}, which is missing"));
    }
    Ok(())
}

/// Why a Megatron checkpoint directory is incomplete, if it is.
fn megatron_content(root: &Root, dir: &Path) -> Vec<String> {
    let entries = match root.list(dir) {
        Ok(entries) => entries,
        Err(err) => return vec![format!("cannot read it: {err}")],
    };
    let mut problems = Vec::new();
    let shards: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.name.starts_with("mp_rank_"))
        .collect();
    if !shards.is_empty() {
        let mut coords = Vec::new();
        for shard in &shards {
            match megatron_shard(&shard.name) {
                Some(c) => coords.push(c),
                None => problems.push(format!("unexpected shard name {}", shorten(&shard.name))),
            }
        }
        problems.extend(grid_gaps(&coords, &[], |c| {
            let mut name = format!("mp_rank_{:02}", c[0]);
            for n in &c[1..] {
                name.push_str(&format!("_{n:03}"));
            }
            format!("shard {name} missing")
        }));
        for shard in shards {
            if let Some(p) = entry_problems(shard) {
                problems.extend(p);
                continue;
            }
            match root.list(&shard.path) {
                Err(err) => problems.push(format!("cannot read {}: {err}", shard.name)),
                Ok(files) => {
                    match files.iter().find(|e| e.name == "model_optim_rng.pt") {
                        None => problems.push(format!("{}/model_optim_rng.pt missing", shard.name)),
                        Some(file) => {
                            if let Some(p) = file_problem(file) {
                                problems.push(format!("{}/{p}", shard.name));
                            }
                        }
                    }
                    problems.extend(
                        empty_tensor_files(&files, &["model_optim_rng.pt"])
                            .map(|p| format!("{}/{p}", shard.name)),
                    );
                }
            }
        }
    } else if entries
        .iter()
        .any(|e| e.name == DCP_METADATA || e.name == "common.pt" || e.name.ends_with(".distcp"))
    {
        problems.extend(dcp_problems(&entries, &["common.pt"]));
        match entries.iter().find(|e| e.name == "common.pt") {
            None => problems.push("common.pt missing".to_owned()),
            Some(file) => problems.extend(file_problem(file)),
        }
    } else {
        problems.push("no mp_rank_* shards and no .metadata".to_owned());
    }
    problems
}

/// The coordinates of a Megatron shard directory: `mp_rank_01` → `[1]`,
/// `mp_rank_01_002` → `[1, 2]`, `mp_rank_01_002_003` → `[1, 2, 3]`.
fn megatron_shard(name: &str) -> Option<Vec<u64>> {
    let rest = name.strip_prefix("mp_rank_")?;
    let coords: Option<Vec<u64>> = rest.split('_').map(digits).collect();
    coords.filter(|c| (1..=3).contains(&c.len()))
}

// ---------------------------------------------------------------------------------------
// DeepSpeed

/// A DeepSpeed checkpoint file: model or optimizer state, its data-parallel (ZeRO) rank
/// when named, and its model-parallel rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DsShard {
    optim: bool,
    dp: Option<u64>,
    mp: u64,
}

/// `mp_rank_00_model_states.pt`, `zero_pp_rank_1_mp_rank_00_model_states.pt`,
/// `bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt`.
fn ds_shard(name: &str) -> Option<DsShard> {
    let (stem, optim) = if let Some(stem) = name.strip_suffix("_model_states.pt") {
        (stem, false)
    } else {
        (name.strip_suffix("_optim_states.pt")?, true)
    };
    let (before, mp) = stem.rsplit_once("mp_rank_")?;
    let mp = digits(mp)?;
    let dp = match before.rsplit_once("zero_pp_rank_") {
        Some((_, dp)) => Some(digits(dp.strip_suffix('_')?)?),
        None if before.is_empty() => None,
        None => return None,
    };
    if optim && dp.is_none() {
        return None;
    }
    Some(DsShard { optim, dp, mp })
}

/// Whether a DeepSpeed tag is one directory name and nothing else.
fn valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 255
        && tag != "."
        && tag != ".."
        && !tag.chars().any(|c| c == '/' || c == '\\' || c.is_control())
}

fn deepspeed(
    root: &Root,
    dir: &Path,
    entries: &[Entry],
    scan: &mut Scan,
) -> Result<(), CheckpointError> {
    let tag = read_tag(root, dir)?;
    scan.tracker = tag.clone();
    let tag_step = tag.as_deref().and_then(trailing_digits);
    let mut tag_seen = false;
    for entry in entries {
        if matches!(entry.kind, Kind::File(_)) {
            continue;
        }
        let named = tag.as_deref() == Some(entry.name.as_str());
        let step = trailing_digits(&entry.name);
        let content = if entry.kind == Kind::Dir {
            root.list(&entry.path).ok()
        } else {
            None
        };
        let holds_states = content
            .as_ref()
            .is_some_and(|c| c.iter().any(|e| ds_shard(&e.name).is_some()));
        if !(named || holds_states || entry.name.starts_with("global_step") && step.is_some()) {
            continue;
        }
        tag_seen |= named;
        let mut problems = Vec::new();
        match (&tag, tag_step) {
            (None, _) => problems.push(format!(
                "no `{DEEPSPEED_TRACKER}` file (DeepSpeed writes it once a save completes)"
            )),
            (Some(_), _) if named => {}
            (Some(tag), Some(n)) if step.is_none_or(|s| s > n) => {
                problems.push(format!("tracker names {tag}"));
            }
            (Some(tag), None) => problems.push(format!("tracker names {tag}")),
            (Some(_), Some(_)) => {}
        }
        if step.is_none() {
            problems.push("no step number in its name".to_owned());
        }
        problems.extend(entry_problems(entry).unwrap_or_else(|| ds_content(root, &entry.path)));
        scan.candidates.push(Candidate {
            path: entry.path.clone(),
            name: entry.name.clone(),
            step,
            problems,
        });
    }
    if let Some(tag) = &tag
        && !tag_seen
    {
        scan.notes
            .push(format!("tracker names {tag}, which is missing"));
    }
    Ok(())
}

/// DeepSpeed's `latest` in `dir`: `None` when there is none.
fn read_tag(root: &Root, dir: &Path) -> Result<Option<String>, CheckpointError> {
    let path = dir.join(DEEPSPEED_TRACKER);
    let Some(text) = root.read_tracker(&path)? else {
        return Ok(None);
    };
    let tag = text.trim();
    if !valid_tag(tag) {
        return Err(CheckpointError::Tracker {
            path,
            what: format!("holds {:?}, not a checkpoint tag", shorten(tag)),
        });
    }
    Ok(Some(tag.to_owned()))
}

/// Why a DeepSpeed checkpoint directory is incomplete, if it is.
fn ds_content(root: &Root, dir: &Path) -> Vec<String> {
    let entries = match root.list(dir) {
        Ok(entries) => entries,
        Err(err) => return vec![format!("cannot read it: {err}")],
    };
    let shards: Vec<DsShard> = entries.iter().filter_map(|e| ds_shard(&e.name)).collect();
    let model: Vec<Vec<u64>> = shards
        .iter()
        .filter(|s| !s.optim)
        .map(|s| match s.dp {
            Some(dp) => vec![dp, s.mp],
            None => vec![s.mp],
        })
        .collect();
    let optim: Vec<Vec<u64>> = shards
        .iter()
        .filter_map(|s| s.dp.filter(|_| s.optim).map(|dp| vec![dp, s.mp]))
        .collect();
    // Every file names the ranks it belongs to: any of them tells how many there are.
    let ranks = |rank: fn(&DsShard) -> Option<u64>| {
        shards
            .iter()
            .filter_map(rank)
            .max()
            .map_or(0, |r| r.saturating_add(1))
    };
    let (dp_ranks, mp_ranks) = (ranks(|s| s.dp), ranks(|s| Some(s.mp)));
    let mut problems = Vec::new();
    if model.is_empty() {
        problems.push("no mp_rank_*_model_states.pt".to_owned());
    } else {
        let sizes = if model[0].len() == 1 {
            vec![mp_ranks]
        } else {
            vec![dp_ranks, mp_ranks]
        };
        problems.extend(grid_gaps(&model, &sizes, |c| match c {
            [mp] => format!("mp_rank_{mp:02}_model_states.pt missing"),
            [dp, mp, ..] => format!("zero_pp_rank_{dp}_mp_rank_{mp:02}_model_states.pt missing"),
            [] => String::new(),
        }));
    }
    if !optim.is_empty() {
        problems.extend(grid_gaps(&optim, &[dp_ranks, mp_ranks], |c| {
            format!(
                "optimizer shard zero_pp_rank_{}_mp_rank_{:02} missing",
                c[0], c[1]
            )
        }));
    }
    problems.extend(empty_tensor_files(&entries, &[]));
    problems
}

// ---------------------------------------------------------------------------------------
// PyTorch Distributed Checkpoint

/// The step in a checkpoint directory's name: its trailing digits (`step_200`,
/// `step-200`, `iter_200`, `checkpoint_200`, `global_step200`, `200`).
pub fn step_from_name(name: &str) -> Option<u64> {
    trailing_digits(name)
}

/// Whether a name is a step directory's (`step_200`) rather than any name that happens
/// to end in digits (`run2`); the latter counts only when it holds DCP files.
fn step_dir_name(name: &str) -> bool {
    let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
    prefix.len() < name.len()
        && [
            "",
            "step_",
            "step-",
            "step",
            "iter_",
            "iter-",
            "checkpoint_",
            "checkpoint-",
            "ckpt_",
            "ckpt-",
            "global_step",
        ]
        .contains(&prefix)
}

fn dcp(root: &Root, entries: &[Entry], scan: &mut Scan) {
    for entry in entries {
        if matches!(entry.kind, Kind::File(_)) {
            continue;
        }
        let step = step_from_name(&entry.name);
        let content = if entry.kind == Kind::Dir {
            Some(root.list(&entry.path))
        } else {
            None
        };
        let holds_dcp = matches!(&content, Some(Ok(c)) if c.iter().any(|e| e.name == DCP_METADATA || e.name.ends_with(".distcp")));
        if step.is_none() {
            if holds_dcp {
                scan.notes.push(format!(
                    "ignored {}: no step number in its name",
                    shorten(&entry.name)
                ));
            }
            continue;
        }
        if !holds_dcp && !step_dir_name(&entry.name) {
            continue;
        }
        let problems = match (entry_problems(entry), content) {
            (Some(p), _) => p,
            (None, Some(Ok(content))) => dcp_problems(&content, &[]),
            (None, Some(Err(err))) => vec![format!("cannot read it: {err}")],
            (None, None) => vec!["not a directory".to_owned()],
        };
        scan.candidates.push(Candidate {
            path: entry.path.clone(),
            name: entry.name.clone(),
            step,
            problems,
        });
    }
}

/// Why a DCP directory (its listing) is incomplete: `.metadata` missing or empty, no data
/// files, empty data files.
fn dcp_problems(entries: &[Entry], skip: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    match entries.iter().find(|e| e.name == DCP_METADATA) {
        None => {
            problems.push(".metadata missing (written last: the save did not finish)".to_owned())
        }
        Some(file) => problems.extend(file_problem(file)),
    }
    if !entries.iter().any(|e| e.name.ends_with(".distcp")) {
        problems.push("no .distcp data files".to_owned());
    }
    problems.extend(empty_tensor_files(entries, skip));
    problems
}

// ---------------------------------------------------------------------------------------
// Hugging Face Trainer

/// The step of a Trainer `checkpoint-N` directory name.
fn hf_step(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint-").and_then(digits)
}

/// The part of `trainer_state.json` that matters here.
#[derive(Debug, Deserialize)]
struct TrainerState {
    global_step: Option<u64>,
}

/// What a sharded weights index says.
#[derive(Debug, Deserialize)]
struct WeightsIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

fn huggingface(root: &Root, entries: &[Entry], scan: &mut Scan) {
    for entry in entries {
        let Some(named) = hf_step(&entry.name) else {
            continue;
        };
        if matches!(entry.kind, Kind::File(_)) {
            continue;
        }
        let (step, problems) = match entry_problems(entry) {
            Some(p) => (Some(named), p),
            None => hf_content(root, &entry.path, named),
        };
        scan.candidates.push(Candidate {
            path: entry.path.clone(),
            name: entry.name.clone(),
            step,
            problems,
        });
    }
}

/// The step of a Trainer checkpoint (its `global_step`, else its name's) and why it is
/// incomplete, if it is.
fn hf_content(root: &Root, dir: &Path, named: u64) -> (Option<u64>, Vec<String>) {
    let entries = match root.list(dir) {
        Ok(entries) => entries,
        Err(err) => return (Some(named), vec![format!("cannot read it: {err}")]),
    };
    let mut problems = Vec::new();
    let mut step = Some(named);
    match root.read_json::<TrainerState>(&dir.join(HF_TRAINER_STATE)) {
        Err(FileProblem::Missing) => problems.push(format!(
            "{HF_TRAINER_STATE} missing (written last: the save did not finish)"
        )),
        Err(problem) => problems.push(format!("{HF_TRAINER_STATE} {problem}")),
        Ok(TrainerState { global_step: None }) => {
            problems.push(format!("{HF_TRAINER_STATE} has no global_step"));
        }
        Ok(TrainerState {
            global_step: Some(global_step),
        }) => step = Some(global_step),
    }
    // Whether some weights are whole, and whether there were any to judge.
    let (mut weights, mut seen) = (false, false);
    for name in HF_WEIGHTS {
        if let Some(file) = entries.iter().find(|e| e.name == name) {
            seen = true;
            match file_problem(file) {
                Some(p) => problems.push(p),
                None => weights = true,
            }
        }
    }
    for name in HF_INDEXES {
        if entries.iter().any(|e| e.name == name) {
            seen = true;
            let before = problems.len();
            problems.extend(hf_index(root, dir, name, &entries));
            weights |= problems.len() == before;
        }
    }
    for sub in entries
        .iter()
        .filter(|e| e.name.starts_with("pytorch_model_fsdp_") || e.name.starts_with("model_fsdp_"))
    {
        seen = true;
        let before = problems.len();
        match entry_problems(sub) {
            Some(p) => problems.extend(p),
            None => match root.list(&sub.path) {
                Ok(content) => problems.extend(
                    dcp_problems(&content, &[])
                        .into_iter()
                        .map(|p| format!("{}/{p}", sub.name)),
                ),
                Err(err) => problems.push(format!("cannot read {}: {err}", sub.name)),
            },
        }
        weights |= problems.len() == before;
    }
    if entries.iter().any(|e| e.name == DEEPSPEED_TRACKER) {
        seen = true;
        let before = problems.len();
        match read_tag(root, dir) {
            Err(err) => problems.push(err.to_string()),
            Ok(None) => {}
            Ok(Some(tag)) => match entries.iter().find(|e| e.name == tag) {
                None => problems.push(format!("DeepSpeed checkpoint {tag} missing")),
                Some(sub) => problems.extend(
                    entry_problems(sub)
                        .unwrap_or_else(|| ds_content(root, &sub.path))
                        .into_iter()
                        .map(|p| format!("{tag}/{p}")),
                ),
            },
        }
        weights |= problems.len() == before;
    }
    if !weights && !seen {
        problems.push(
            "no model weights (model.safetensors, pytorch_model.bin or a sharded index)".to_owned(),
        );
    }
    problems.extend(empty_tensor_files(&entries, &HF_WEIGHTS));
    (step, problems)
}

/// Why the sharded weights an index names are incomplete, if they are.
fn hf_index(root: &Root, dir: &Path, index: &str, entries: &[Entry]) -> Vec<String> {
    let parsed = match root.read_json::<WeightsIndex>(&dir.join(index)) {
        Ok(parsed) => parsed,
        Err(problem) => return vec![format!("{index} {problem}")],
    };
    let shards: BTreeSet<&str> = parsed.weight_map.values().map(String::as_str).collect();
    if shards.is_empty() {
        return vec![format!("{index} names no shards")];
    }
    let mut missing = Vec::new();
    let mut problems = Vec::new();
    for shard in shards {
        if !valid_tag(shard) {
            problems.push(format!(
                "{index} names {:?}, not a file of the checkpoint",
                shorten(shard)
            ));
            continue;
        }
        match entries.iter().find(|e| e.name == shard) {
            None => missing.push(shard.to_owned()),
            // An empty shard is named with the other empty tensor files.
            Some(file) if file.kind == Kind::File(0) => {}
            Some(file) => problems.extend(file_problem(file)),
        }
    }
    if !missing.is_empty() {
        let noun = if missing.len() == 1 {
            "shard"
        } else {
            "shards"
        };
        problems.insert(
            0,
            format!("{noun} {} missing ({index})", list_some(&missing)),
        );
    }
    problems
}

// ---------------------------------------------------------------------------------------
// Shared helpers

/// What a directory entry is, symbolic links resolved when they stay inside the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A regular file of this many bytes.
    File(u64),
    /// A directory.
    Dir,
    /// A link whose target lies outside the checkpoint directory (not followed).
    Outside,
    /// A dangling link, a socket, a FIFO, a device.
    Other,
}

/// One entry of a directory.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    path: PathBuf,
    kind: Kind,
}

/// Why a directory could not be listed.
#[derive(Debug)]
enum ListError {
    Io(io::Error),
    TooMany,
}

impl From<io::Error> for ListError {
    fn from(err: io::Error) -> Self {
        ListError::Io(err)
    }
}

impl fmt::Display for ListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListError::Io(err) => err.fmt(f),
            ListError::TooMany => write!(f, "more than {MAX_ENTRIES} entries"),
        }
    }
}

/// Why a file could not be used.
#[derive(Debug)]
enum FileProblem {
    Missing,
    Outside,
    NotAFile,
    Empty,
    TooLarge(u64),
    Io(io::Error),
    Invalid(String),
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::Missing => f.write_str("missing"),
            FileProblem::Outside => f.write_str("links outside the checkpoint directory"),
            FileProblem::NotAFile => f.write_str("is not a regular file"),
            FileProblem::Empty => f.write_str("is empty"),
            FileProblem::TooLarge(max) => write!(f, "is larger than {max} bytes"),
            FileProblem::Io(err) => write!(f, "cannot be read: {err}"),
            FileProblem::Invalid(why) => write!(f, "is not valid: {why}"),
        }
    }
}

/// The checkpoint directory, canonical, that links may not leave.
#[derive(Debug)]
struct Root {
    canonical: PathBuf,
}

impl Root {
    fn new(dir: &Path) -> Result<Root, CheckpointError> {
        let read = |source| CheckpointError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let meta = fs::metadata(dir).map_err(read)?;
        if !meta.is_dir() {
            return Err(CheckpointError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        let canonical = fs::canonicalize(dir).map_err(read)?;
        Ok(Root { canonical })
    }

    /// What `path` is, following a link only when its target stays inside the root.
    fn kind(&self, path: &Path) -> io::Result<Kind> {
        let meta = fs::symlink_metadata(path)?;
        let meta = if meta.file_type().is_symlink() {
            let target = match fs::canonicalize(path) {
                Ok(target) => target,
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Kind::Other),
                Err(err) => return Err(err),
            };
            if !target.starts_with(&self.canonical) {
                return Ok(Kind::Outside);
            }
            fs::metadata(&target)?
        } else {
            meta
        };
        Ok(if meta.is_file() {
            Kind::File(meta.len())
        } else if meta.is_dir() {
            Kind::Dir
        } else {
            Kind::Other
        })
    }

    /// The entries of `dir` whose names are UTF-8 (no convention uses any other), at most
    /// [`MAX_ENTRIES`].
    fn list(&self, dir: &Path) -> Result<Vec<Entry>, ListError> {
        let mut entries = Vec::new();
        for item in fs::read_dir(dir)? {
            let item = item?;
            if entries.len() == MAX_ENTRIES {
                return Err(ListError::TooMany);
            }
            let Ok(name) = item.file_name().into_string() else {
                continue;
            };
            let path = item.path();
            let kind = match self.kind(&path) {
                Ok(kind) => kind,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(ListError::Io(err)),
            };
            entries.push(Entry { name, path, kind });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// [`Root::list`] of the checkpoint directory itself, its errors named.
    fn list_top(&self, dir: &Path) -> Result<Vec<Entry>, CheckpointError> {
        self.list(dir).map_err(|err| match err {
            ListError::TooMany => CheckpointError::TooManyEntries {
                path: dir.to_path_buf(),
                max: MAX_ENTRIES,
            },
            ListError::Io(source) => CheckpointError::Read {
                path: dir.to_path_buf(),
                source,
            },
        })
    }

    /// The bytes of a regular file inside the root, at most `max` of them.
    fn read_bounded(&self, path: &Path, max: u64) -> Result<Vec<u8>, FileProblem> {
        match self.kind(path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Err(FileProblem::Missing),
            Err(err) => Err(FileProblem::Io(err)),
            Ok(Kind::Outside) => Err(FileProblem::Outside),
            Ok(Kind::Dir | Kind::Other) => Err(FileProblem::NotAFile),
            Ok(Kind::File(len)) if len > max => Err(FileProblem::TooLarge(max)),
            Ok(Kind::File(_)) => {
                let file = File::open(path).map_err(FileProblem::Io)?;
                let mut bytes = Vec::new();
                file.take(max + 1)
                    .read_to_end(&mut bytes)
                    .map_err(FileProblem::Io)?;
                if bytes.len() as u64 > max {
                    return Err(FileProblem::TooLarge(max));
                }
                Ok(bytes)
            }
        }
    }

    /// A tracker file's text: `None` when there is none.
    fn read_tracker(&self, path: &Path) -> Result<Option<String>, CheckpointError> {
        let tracker = |what: String| CheckpointError::Tracker {
            path: path.to_path_buf(),
            what,
        };
        let bytes = match self.read_bounded(path, MAX_TRACKER_BYTES) {
            Ok(bytes) => bytes,
            Err(FileProblem::Missing) => return Ok(None),
            Err(FileProblem::Io(source)) => {
                return Err(CheckpointError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
            Err(problem) => return Err(tracker(problem.to_string())),
        };
        let text = String::from_utf8(bytes).map_err(|_| tracker("is not UTF-8".to_owned()))?;
        if text.trim().is_empty() {
            return Err(tracker("is empty".to_owned()));
        }
        Ok(Some(text))
    }

    /// A JSON file inside the root, at most [`MAX_JSON_BYTES`].
    fn read_json<T: for<'de> Deserialize<'de>>(&self, path: &Path) -> Result<T, FileProblem> {
        let bytes = self.read_bounded(path, MAX_JSON_BYTES)?;
        if bytes.is_empty() {
            return Err(FileProblem::Empty);
        }
        serde_json::from_slice(&bytes).map_err(|err| FileProblem::Invalid(err.to_string()))
    }
}

/// Why an entry that should be a directory cannot be judged, if it cannot.
fn entry_problems(entry: &Entry) -> Option<Vec<String>> {
    match entry.kind {
        Kind::Dir => None,
        Kind::Outside => Some(vec!["links outside the checkpoint directory".to_owned()]),
        Kind::File(_) | Kind::Other => Some(vec!["not a directory".to_owned()]),
    }
}

/// Why a file that must hold data does not, if it does not: `<name> is empty`.
fn file_problem(entry: &Entry) -> Option<String> {
    let problem = match entry.kind {
        Kind::File(0) => FileProblem::Empty,
        Kind::File(_) => return None,
        Kind::Outside => FileProblem::Outside,
        Kind::Dir | Kind::Other => FileProblem::NotAFile,
    };
    Some(format!("{} {problem}", entry.name))
}

/// One problem naming the zero-length tensor files among `entries` (other than `skip`,
/// judged elsewhere), if there are any.
fn empty_tensor_files(entries: &[Entry], skip: &[&str]) -> Option<String> {
    const TENSORS: [&str; 5] = [".pt", ".pth", ".bin", ".safetensors", ".distcp"];
    let empty: Vec<String> = entries
        .iter()
        .filter(|e| e.kind == Kind::File(0))
        .filter(|e| TENSORS.iter().any(|ext| e.name.ends_with(ext)))
        .filter(|e| !skip.contains(&e.name.as_str()))
        .map(|e| e.name.clone())
        .collect();
    match empty.len() {
        0 => None,
        1 => Some(format!("{} is empty", list_some(&empty))),
        _ => Some(format!("{} are empty", list_some(&empty))),
    }
}

/// The gaps in a numbered grid of shards: with every coordinate of every dimension from 0
/// to its largest value (or below `min_sizes[d]`) expected, one problem per missing point
/// (a few named, then a count). Coordinate lists of different lengths are a problem of
/// their own.
fn grid_gaps(
    coords: &[Vec<u64>],
    min_sizes: &[u64],
    name: impl Fn(&[u64]) -> String,
) -> Vec<String> {
    let Some(first) = coords.first() else {
        return Vec::new();
    };
    let dims = first.len();
    if coords.iter().any(|c| c.len() != dims) {
        return vec!["shards named with different numbers of ranks".to_owned()];
    }
    let present: BTreeSet<&[u64]> = coords.iter().map(Vec::as_slice).collect();
    let sizes: Vec<u64> = (0..dims)
        .map(|d| {
            let largest = coords.iter().map(|c| c[d]).max().unwrap_or(0);
            largest
                .saturating_add(1)
                .max(min_sizes.get(d).copied().unwrap_or(0))
        })
        .collect();
    let expected = sizes
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n))
        .unwrap_or(u64::MAX);
    let absent = expected.saturating_sub(present.len() as u64);
    if absent == 0 {
        return Vec::new();
    }
    let mut problems = Vec::new();
    let mut point = vec![0u64; dims];
    'walk: loop {
        if !present.contains(point.as_slice()) {
            problems.push(name(&point));
            if problems.len() == LIST_MAX {
                break;
            }
        }
        for d in (0..dims).rev() {
            point[d] += 1;
            if point[d] < sizes[d] {
                continue 'walk;
            }
            point[d] = 0;
        }
        break;
    }
    if absent > problems.len() as u64 {
        problems.push(format!(
            "{} more shards missing",
            absent - problems.len() as u64
        ));
    }
    problems
}

/// A few names, then how many more.
fn list_some(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(LIST_MAX).map(String::as_str).collect();
    let mut out = shown.join(", ");
    if names.len() > LIST_MAX {
        out.push_str(&format!(" and {} more", names.len() - LIST_MAX));
    }
    out
}

/// A string of ASCII digits as a number (no sign, no spaces, no overflow).
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The number a name ends with.
fn trailing_digits(name: &str) -> Option<u64> {
    let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
    digits(&name[prefix.len()..])
}

/// At most 64 characters of something read from outside, for a message.
fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if s.chars().nth(64).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_from_directory_names() {
        assert_eq!(step_from_name("step_200"), Some(200));
        assert_eq!(step_from_name("step-200"), Some(200));
        assert_eq!(step_from_name("iter_0000200"), Some(200));
        assert_eq!(step_from_name("checkpoint_200"), Some(200));
        assert_eq!(step_from_name("global_step200"), Some(200));
        assert_eq!(step_from_name("200"), Some(200));
        assert_eq!(step_from_name("epoch_3_step_7"), Some(7));
        assert_eq!(step_from_name("step_200_final"), None);
        assert_eq!(step_from_name("latest"), None);
        assert_eq!(step_from_name(""), None);
        assert_eq!(step_from_name("step_99999999999999999999999"), None);
    }

    #[test]
    fn step_directory_names_are_told_from_other_names() {
        assert!(step_dir_name("step_200"));
        assert!(step_dir_name("checkpoint-3"));
        assert!(step_dir_name("42"));
        assert!(!step_dir_name("run2"));
        assert!(!step_dir_name("step_"));
    }

    #[test]
    fn megatron_names_and_trackers() {
        assert_eq!(megatron_iteration("iter_0000100"), Some(100));
        assert_eq!(megatron_iteration("iter_100"), Some(100));
        assert_eq!(megatron_iteration("iter_"), None);
        assert_eq!(megatron_iteration("iter_-1"), None);
        assert_eq!(megatron_iteration("iter_0000100.tmp"), None);
        assert_eq!(
            parse_megatron_tracker("100\n"),
            Some(MegatronTracker::Iteration(100))
        );
        assert_eq!(
            parse_megatron_tracker(" release "),
            Some(MegatronTracker::Release)
        );
        assert_eq!(parse_megatron_tracker("+100"), None);
        assert_eq!(parse_megatron_tracker("1e3"), None);
        assert_eq!(parse_megatron_tracker("Release"), None);
        assert_eq!(MegatronTracker::Iteration(100).to_string(), "iter_0000100");
        assert_eq!(megatron_shard("mp_rank_01"), Some(vec![1]));
        assert_eq!(megatron_shard("mp_rank_01_002"), Some(vec![1, 2]));
        assert_eq!(megatron_shard("mp_rank_01_002_003"), Some(vec![1, 2, 3]));
        assert_eq!(megatron_shard("mp_rank_"), None);
        assert_eq!(megatron_shard("mp_rank_01_x"), None);
    }

    #[test]
    fn hugging_face_names() {
        assert_eq!(hf_step("checkpoint-500"), Some(500));
        assert_eq!(hf_step("checkpoint_500"), None);
        assert_eq!(hf_step("tmp-checkpoint-500"), None);
        assert_eq!(hf_step("checkpoint-"), None);
    }

    #[test]
    fn deepspeed_file_names() {
        assert_eq!(
            ds_shard("mp_rank_01_model_states.pt"),
            Some(DsShard {
                optim: false,
                dp: None,
                mp: 1
            })
        );
        assert_eq!(
            ds_shard("zero_pp_rank_3_mp_rank_00_model_states.pt"),
            Some(DsShard {
                optim: false,
                dp: Some(3),
                mp: 0
            })
        );
        assert_eq!(
            ds_shard("bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt"),
            Some(DsShard {
                optim: true,
                dp: Some(2),
                mp: 1
            })
        );
        assert_eq!(ds_shard("layer_01-model_states.pt"), None);
        assert_eq!(ds_shard("mp_rank_xx_model_states.pt"), None);
        assert_eq!(ds_shard("model_optim_rng.pt"), None);
        assert!(valid_tag("global_step200"));
        assert!(!valid_tag("../etc"));
        assert!(!valid_tag(".."));
        assert!(!valid_tag(""));
        assert!(!valid_tag("a\nb"));
    }

    #[test]
    fn grid_gaps_are_named() {
        assert!(grid_gaps(&[vec![0], vec![1]], &[], |c| format!("{c:?}")).is_empty());
        assert_eq!(
            grid_gaps(&[vec![0], vec![2]], &[], |c| format!("{c:?}")),
            vec!["[1]".to_owned()]
        );
        assert_eq!(
            grid_gaps(&[vec![0, 0], vec![1, 1]], &[], |c| format!("{c:?}")),
            vec!["[0, 1]".to_owned(), "[1, 0]".to_owned()]
        );
        assert_eq!(
            grid_gaps(&[vec![0, 0]], &[0, 2], |c| format!("{c:?}")),
            vec!["[0, 1]".to_owned()]
        );
        let sparse = grid_gaps(&[vec![0], vec![u64::MAX - 1]], &[], |c| format!("{c:?}"));
        assert_eq!(sparse.len(), LIST_MAX + 1);
        assert_eq!(
            sparse[LIST_MAX],
            format!("{} more shards missing", u64::MAX - 2 - 3)
        );
    }

    #[test]
    fn formats_round_trip() {
        for format in Format::ALL {
            assert_eq!(format.as_str().parse::<Format>(), Ok(format));
        }
        assert!("torch".parse::<Format>().is_err());
    }
}
