//! Configuration of the log tailer: which files to follow, how to read them, which
//! presets extract metrics from them, and the limits that bound memory and CPU.
//!
//! YAML shape (every field but `sources[].paths` optional; defaults shown):
//!
//! ```yaml
//! sources:
//!   - paths: ["/var/log/pods/*/*/*.log"]   # globs, re-expanded every rescan
//!     format: auto            # auto | plain | cri
//!     job: null               # static job name
//!     job_from_dir: null      # or: the name of the folder N levels above the file
//!     rank: null              # static global rank
//!     local_rank_offset: null # global rank of local rank 0 on this node
//!     ranks_per_pod: null     # with a pod index from the pod name: rank = index * this (+ local rank)
//!     stream: null            # stdout | stderr for plain files (default: from the file name)
//!     presets: null           # preset names; null = every enabled preset, [] = none
//!     patterns: []            # custom regexes: {name, regex, needle, throughput_unit}
//! max_line_bytes: 16384
//! max_open_files: 256
//! start_at: end               # end | beginning, for files present at start-up
//! rescan_interval_ms: 5000
//! partial_flush_ms: 2000
//! read_bytes_per_poll: 1048576
//! multiline: {enabled: true, max_lines: 256, max_bytes: 65536, flush_ms: 2000}
//! ```

use serde::{Deserialize, Serialize};

/// Everything the tailer and the extractor need to know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TailConfig {
    /// The log sources to follow.
    pub sources: Vec<SourceConfig>,
    /// Longest line kept, bytes. A longer line is cut here, marked truncated, and the
    /// rest of it is skipped as it is read (never buffered).
    pub max_line_bytes: usize,
    /// Most files open at once; beyond it the least recently active file is closed (and
    /// reopened where it left off when it grows again).
    pub max_open_files: usize,
    /// Where to start reading files that already exist at the first scan. Files that
    /// appear later are always read from their beginning.
    pub start_at: StartAt,
    /// How often the globs are expanded again to pick up new files, ms.
    pub rescan_interval_ms: u64,
    /// A last line without a newline is emitted anyway once its file has been quiet for
    /// this long, ms (so the last line before a hang is not held back).
    pub partial_flush_ms: u64,
    /// Most bytes read from one file in one poll.
    pub read_bytes_per_poll: usize,
    /// Keeping Python tracebacks together.
    pub multiline: MultilineConfig,
}

impl Default for TailConfig {
    fn default() -> Self {
        TailConfig {
            sources: Vec::new(),
            max_line_bytes: 16 * 1024,
            max_open_files: 256,
            start_at: StartAt::End,
            rescan_interval_ms: 5_000,
            partial_flush_ms: 2_000,
            read_bytes_per_poll: 1024 * 1024,
            multiline: MultilineConfig::default(),
        }
    }
}

/// One group of log files read the same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Glob patterns of the files to follow (`/var/log/pods/*/*/*.log`,
    /// `/scratch/runs/*/logs/rank_*.log`).
    pub paths: Vec<String>,
    /// How the files are framed.
    #[serde(default)]
    pub format: Format,
    /// The job every line of these files belongs to; overrides what the path says.
    #[serde(default)]
    pub job: Option<String>,
    /// The job is the name of the folder this many levels above each file (1: the
    /// folder that holds it, so `/scratch/runs/<job>/rank3.log` is 1); below `job`,
    /// above what a pod or Slurm path says.
    #[serde(default)]
    pub job_from_dir: Option<u32>,
    /// The global rank every line of these files belongs to; overrides everything else.
    #[serde(default)]
    pub rank: Option<u32>,
    /// Global rank of local rank 0 on this node: with it, a local rank seen in a
    /// torchrun prefix (`[default3]:`) or log-dir path becomes global rank
    /// `local_rank_offset + local rank`.
    #[serde(default)]
    pub local_rank_offset: Option<u32>,
    /// Ranks each pod runs, when a rank may be derived from the pod's index in its name
    /// (`job-master-0`, an indexed Job's `job-3-xk2pq`): the pod's first rank is
    /// `index * ranks_per_pod`, plus the local rank when a line shows one. Unset: pod
    /// indexes are not used for ranks.
    #[serde(default)]
    pub ranks_per_pod: Option<u32>,
    /// Stream of plain files; default: stderr when the file name says `stderr` or ends in
    /// `.err`, stdout otherwise. CRI records carry their own.
    #[serde(default)]
    pub stream: Option<StreamName>,
    /// Names of the metric presets to apply (see `rules/log-presets.yaml`); unset means
    /// every enabled preset, an empty list none.
    #[serde(default)]
    pub presets: Option<Vec<String>>,
    /// The user's own metric patterns, tried after the presets.
    #[serde(default)]
    pub patterns: Vec<CustomPattern>,
}

impl SourceConfig {
    /// A source following `paths` with everything else at its default.
    pub fn new<S: Into<String>>(paths: impl IntoIterator<Item = S>) -> Self {
        SourceConfig {
            paths: paths.into_iter().map(Into::into).collect(),
            format: Format::Auto,
            job: None,
            job_from_dir: None,
            rank: None,
            local_rank_offset: None,
            ranks_per_pod: None,
            stream: None,
            presets: None,
            patterns: Vec::new(),
        }
    }
}

/// A user-written metric pattern: a regex with named groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomPattern {
    /// Name, reported with each metric it produces.
    pub name: String,
    /// Regex with named groups among `step`, `loss`, `grad_norm`, `lr`, `throughput`,
    /// `tokens_per_s`, `samples_per_s`, `rank`. Without a `step` group the step is the
    /// count of matching lines from the same file and rank.
    pub regex: String,
    /// A literal every matching line contains, checked before the regex runs.
    #[serde(default)]
    pub needle: Option<String>,
    /// What the `throughput` group counts per second.
    #[serde(default)]
    pub throughput_unit: ThroughputUnitName,
}

/// Unit of a custom pattern's `throughput` group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThroughputUnitName {
    /// Tokens per second.
    #[default]
    Tokens,
    /// Samples per second.
    Samples,
    /// Iterations (batches) per second.
    Iterations,
}

/// How a source's files are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// CRI when the path is under `/var/log/pods/` or `/var/log/containers/` or the
    /// first line has the CRI shape; plain otherwise.
    #[default]
    Auto,
    /// Lines as the program wrote them (`\n`, `\r\n`, and `\r` from progress bars, end a
    /// line).
    Plain,
    /// Kubernetes CRI container log records.
    Cri,
}

/// Where to start in a file that exists when the tailer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    /// At its end: only what is written from now on.
    #[default]
    End,
    /// At its beginning.
    Beginning,
}

/// A stream name in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamName {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Bounds of a multi-line record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultilineConfig {
    /// Whether tracebacks are grouped at all.
    pub enabled: bool,
    /// Most lines in one record; a longer traceback continues in the next record.
    pub max_lines: u32,
    /// Most bytes in one record.
    pub max_bytes: usize,
    /// An open traceback is emitted after this long without a line of its own, ms.
    pub flush_ms: u64,
}

impl Default for MultilineConfig {
    fn default() -> Self {
        MultilineConfig {
            enabled: true,
            max_lines: 256,
            max_bytes: 64 * 1024,
            flush_ms: 2_000,
        }
    }
}

/// A config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not valid YAML, or a field of the wrong type or name.
    #[error("log tailer config: {0}")]
    Parse(String),
    /// Well formed but wrong; every problem found, each naming its field.
    #[error("log tailer config: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

impl TailConfig {
    /// Parse from YAML; the error names the field (`sources[0].format: unknown variant`).
    /// Values are not checked here: see [`TailConfig::problems`].
    pub fn from_yaml(yaml: &str) -> Result<Self, ConfigError> {
        warden_model::yaml::from_str(yaml).map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// Everything wrong with the tailing part of this config (globs, limits), each
    /// naming its field. Presets and patterns are checked by
    /// [`Extractor::new`](super::Extractor::new).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.max_line_bytes < 64 {
            p.push(format!(
                "max_line_bytes: {} is below the minimum of 64",
                self.max_line_bytes
            ));
        }
        if self.max_line_bytes > 64 * 1024 * 1024 {
            p.push(format!(
                "max_line_bytes: {} is above the maximum of 64 MiB",
                self.max_line_bytes
            ));
        }
        if self.max_open_files == 0 {
            p.push("max_open_files: must be at least 1".to_string());
        }
        if self.read_bytes_per_poll < 4096 {
            p.push(format!(
                "read_bytes_per_poll: {} is below the minimum of 4096",
                self.read_bytes_per_poll
            ));
        }
        if self.rescan_interval_ms == 0 {
            p.push("rescan_interval_ms: must be at least 1".to_string());
        }
        if self.multiline.max_lines < 2 {
            p.push("multiline.max_lines: must be at least 2".to_string());
        }
        if self.multiline.max_bytes < self.max_line_bytes {
            p.push(format!(
                "multiline.max_bytes: {} is below max_line_bytes ({})",
                self.multiline.max_bytes, self.max_line_bytes
            ));
        }
        for (i, s) in self.sources.iter().enumerate() {
            if s.paths.is_empty() {
                p.push(format!("sources[{i}].paths: at least one glob is needed"));
            }
            if let Some(n) = s.job_from_dir
                && !(1..=64).contains(&n)
            {
                p.push(format!(
                    "sources[{i}].job_from_dir: {n} is outside 1..=64 (1: the folder holding the file)"
                ));
            }
            for (j, g) in s.paths.iter().enumerate() {
                if g.trim().is_empty() {
                    p.push(format!("sources[{i}].paths[{j}]: empty glob"));
                } else if let Err(e) = glob::Pattern::new(g) {
                    p.push(format!("sources[{i}].paths[{j}]: invalid glob {g:?}: {e}"));
                }
            }
            if let Some(job) = &s.job
                && job.trim().is_empty()
            {
                p.push(format!("sources[{i}].job: empty"));
            }
            if s.ranks_per_pod == Some(0) {
                p.push(format!("sources[{i}].ranks_per_pod: must be at least 1"));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_an_empty_document() {
        let c = TailConfig::from_yaml("{}").expect("empty config parses");
        assert_eq!(c, TailConfig::default());
        assert_eq!(c.max_line_bytes, 16 * 1024);
        assert_eq!(c.start_at, StartAt::End);
        assert!(c.problems().is_empty());
    }

    #[test]
    fn full_shape_parses() {
        let yaml = r#"
sources:
  - paths: ["/var/log/pods/*/*/*.log"]
    format: cri
    ranks_per_pod: 8
  - paths: ["/scratch/run/rank_*.log"]
    format: plain
    job: llama
    stream: stderr
    presets: [megatron]
    patterns:
      - {name: mine, regex: 'step (?P<step>\d+)', needle: "step ", throughput_unit: samples}
max_line_bytes: 4096
start_at: beginning
multiline: {max_lines: 50}
"#;
        let c = TailConfig::from_yaml(yaml).expect("parses");
        assert_eq!(c.sources.len(), 2);
        assert_eq!(c.sources[0].format, Format::Cri);
        assert_eq!(c.sources[1].stream, Some(StreamName::Stderr));
        assert_eq!(
            c.sources[1].patterns[0].throughput_unit,
            ThroughputUnitName::Samples
        );
        assert_eq!(c.multiline.max_lines, 50);
        assert!(c.multiline.enabled);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = TailConfig::from_yaml("sources:\n  - paths: [a]\n    fromat: cri\n")
            .expect_err("typo must fail");
        assert!(e.to_string().contains("fromat"), "{e}");
        assert!(e.to_string().contains("sources[0]"), "{e}");
        let e = TailConfig::from_yaml("start_at: middle").expect_err("bad variant");
        assert!(e.to_string().contains("start_at"), "{e}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut c = TailConfig {
            max_line_bytes: 10,
            max_open_files: 0,
            ..TailConfig::default()
        };
        c.sources.push(SourceConfig::new(["/a/[b"]));
        c.sources.push(SourceConfig::new(Vec::<String>::new()));
        let p = c.problems();
        let all = p.join("\n");
        assert!(all.contains("max_line_bytes"), "{all}");
        assert!(all.contains("max_open_files"), "{all}");
        assert!(all.contains("sources[0].paths[0]: invalid glob"), "{all}");
        assert!(all.contains("sources[1].paths"), "{all}");
        assert_eq!(p.len(), 4, "{all}");
    }
}
