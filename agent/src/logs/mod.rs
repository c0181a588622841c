//! The zero-instrumentation path: follow training logs on the node and turn them into
//! log records, training metrics and PyTorch watchdog reports.
//!
//! The pieces, in the order a byte goes through them:
//!
//! - [`tail`]: the [`Tailer`] follows the files that a list of globs names (plain files
//!   and Kubernetes CRI container logs), across rotation by rename and by copytruncate,
//!   with bounded memory per file and bounded work per [`Tailer::poll`].
//! - [`cri`]: the CRI log format (`<RFC 3339 time> <stream> <P|F> <text>`), partial
//!   records joined, and the `/var/log/pods` path layout.
//! - [`multiline`]: Python tracebacks (chained ones too, and `[rank3]: ` prefixed ones)
//!   kept together as one record.
//! - [`attribution`]: which job and rank a line belongs to, from the source config, the
//!   path and the line's own prefix.
//! - [`extract`]: step, loss, grad norm and throughput from framework log lines, with
//!   presets shipped as data in `rules/log-presets.yaml` ([`presets`]), and the PyTorch
//!   NCCL / gloo watchdog lines as structured [`Watchdog`] reports.
//! - [`launcher`]: worker deaths from torchrun's failure report, for jobs that nothing
//!   else reports on.
//!
//! Nothing here spawns a thread or sleeps: the agent's log thread calls
//! [`Tailer::poll_with`] with the current time every 500 ms and hands each [`LogLine`] to
//! an [`Extractor`] as soon as the tailer finishes it.

pub mod attribution;
pub mod config;
pub mod cri;
pub mod extract;
pub mod launcher;
mod linebuf;
pub mod multiline;
mod numfield;
pub mod presets;
pub mod tail;

use std::sync::Arc;

use warden_model::wire::{LogRecord, LogStream};

pub use config::{
    ConfigError, CustomPattern, Format, MultilineConfig, SourceConfig, StartAt, StreamName,
    TailConfig,
};
pub use extract::{
    Backend, Extracted, Extractor, StepMetric, Throughput, ThroughputUnit, Watchdog, WatchdogKind,
    parse_watchdog,
};
pub use launcher::{LauncherExit, LauncherReports};
pub use presets::{PresetCatalog, PresetError};
pub use tail::{TailCounters, Tailer};

/// Every problem with a config, the tailer's and the extractor's together (for
/// reporting them all at once at start-up).
pub fn check_config(cfg: &TailConfig, catalog: &PresetCatalog) -> Result<(), ConfigError> {
    let mut problems = cfg.problems();
    if let Err(ConfigError::Invalid(more)) = Extractor::new(cfg, catalog) {
        problems.extend(more);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// One record read from a training log: a single line, or a whole Python traceback.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    /// The file it was read from.
    pub source: Arc<str>,
    /// Index of the [`SourceConfig`] in [`TailConfig::sources`] whose glob matched the
    /// file (the [`Extractor`] uses it to pick presets).
    pub source_index: usize,
    /// The job the line belongs to, when known (see [`attribution`] for the order of
    /// precedence).
    pub job: Option<Arc<str>>,
    /// Global rank, when known.
    pub rank: Option<u32>,
    /// Rank on the node (torchrun's `[default3]:` prefix, its `--log-dir` layout), when
    /// seen; a global rank is derived from it only where the config says how.
    pub local_rank: Option<u32>,
    /// When it was written: the CRI timestamp for container logs, otherwise when the
    /// agent read it (agent clock, ns since the Unix epoch).
    pub at_ns: i64,
    /// Stdout or stderr.
    pub stream: LogStream,
    /// The text, without its line terminator; invalid UTF-8 replaced by U+FFFD, NUL
    /// bytes dropped; the lines of a traceback joined with `\n`.
    pub text: String,
    /// Some of the text was cut: a line longer than `max_line_bytes`, a CRI message
    /// longer than that, or a traceback longer than the multi-line bounds.
    pub truncated: bool,
    /// Number of lines in `text` (more than 1 for a traceback).
    pub lines: u32,
}

impl LogLine {
    /// The wire form, for shipping to the controller.
    pub fn to_record(&self) -> LogRecord {
        LogRecord {
            rank: self.rank,
            at_ns: self.at_ns,
            stream: self.stream as i32,
            line: self.text.clone(),
        }
    }

    /// The wire form, moving the text.
    pub fn into_record(self) -> LogRecord {
        LogRecord {
            rank: self.rank,
            at_ns: self.at_ns,
            stream: self.stream as i32,
            line: self.text,
        }
    }
}
