//! Worker deaths as the launcher reports them: torchrun's failure report.
//!
//! When a worker fails, torchrun (torch.distributed.elastic) ends with a report on its
//! own stderr, one block per failed worker of its node:
//!
//! ```text
//! Root Cause (first observed failure):
//! [0]:
//!   time      : 2026-11-27_12:01:38
//!   host      : node-b
//!   rank      : 3 (local_rank: 0)
//!   exitcode  : -9 (pid: 6593)  (SIGKILL)
//!   error_file: <N/A>
//!   traceback : Signal 9 (SIGKILL) received by PID 6593
//! ```
//!
//! Each block gives a global rank, its pid and how it ended (a negative exit code is
//! the signal that killed it). That is all a job without in-process capture says about
//! its deaths, so these become exits. What the report calls the root cause is only the
//! first failure *this* node's launcher saw: on every other node it is a survivor that
//! failed because the culprit went away. The controller orders the deaths of the whole
//! job itself; nothing here trusts the heading.
//!
//! The report arrives as lines or inside a multi-line record (it follows a traceback):
//! both are read line by line. Memory: one pending rank per source file, for at most
//! [`MAX_SOURCES`] files.

use std::sync::{Arc, OnceLock};

use regex::Regex;
use rustc_hash::FxHashMap;

use super::LogLine;

/// Most files with a half-read block remembered at once.
const MAX_SOURCES: usize = 1024;
/// Lines between a block's `rank` and its `exitcode` (one: `host`/`time` come before).
const MAX_GAP_LINES: u32 = 4;

/// A worker's death read from a launcher's failure report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LauncherExit {
    /// Global rank.
    pub rank: u32,
    /// Process id.
    pub pid: u32,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
}

/// Reads failure reports out of the lines of many files.
#[derive(Debug, Default)]
pub struct LauncherReports {
    /// Per source file: the rank of the block being read and lines seen since.
    pending: FxHashMap<Arc<str>, (u32, u32)>,
}

fn rank_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^\s*rank\s*:\s*(\d{1,9})\s*\(local_rank:\s*\d{1,9}\)").expect("valid regex")
    })
}

fn exit_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^\s*exitcode\s*:\s*(-?\d{1,9})\s*\(pid:\s*(\d{1,10})\)").expect("valid regex")
    })
}

impl LauncherReports {
    /// An empty reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// The deaths that `line` completes (usually none).
    pub fn push(&mut self, line: &LogLine) -> Vec<LauncherExit> {
        let mut out = Vec::new();
        // Cheap test first: almost no line has either field.
        if !line.text.contains("rank") && !self.pending.contains_key(&line.source) {
            return out;
        }
        for text in line.text.lines() {
            self.one(&line.source, strip_prefix(text), &mut out);
        }
        out
    }

    fn one(&mut self, source: &Arc<str>, text: &str, out: &mut Vec<LauncherExit>) {
        if let Some(c) = rank_re().captures(text) {
            if let Ok(rank) = c[1].parse::<u32>() {
                if self.pending.len() >= MAX_SOURCES && !self.pending.contains_key(source) {
                    self.pending.clear();
                }
                self.pending.insert(source.clone(), (rank, 0));
            }
            return;
        }
        let Some(&(rank, gap)) = self.pending.get(source) else {
            return;
        };
        if let Some(c) = exit_re().captures(text) {
            self.pending.remove(source);
            let (Ok(code), Ok(pid)) = (c[1].parse::<i32>(), c[2].parse::<u32>()) else {
                return;
            };
            out.push(LauncherExit {
                rank,
                pid,
                exit_code: (code >= 0).then_some(code),
                signal: (code < 0).then(|| code.saturating_neg()),
            });
        } else if gap + 1 > MAX_GAP_LINES {
            self.pending.remove(source);
        } else {
            self.pending.insert(source.clone(), (rank, gap + 1));
        }
    }
}

/// The text after a `[rank3]:`-style prefix (the report is torchrun's own output and
/// has none, but a launcher wrapped in another may add one).
fn strip_prefix(text: &str) -> &str {
    match super::attribution::line_prefix(text) {
        Some(p) => text.get(p.len..).unwrap_or(text),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_model::wire::LogStream;

    fn line(source: &str, text: &str) -> LogLine {
        LogLine {
            source: Arc::from(source),
            source_index: 0,
            job: Some(Arc::from("j")),
            rank: None,
            local_rank: None,
            at_ns: 1,
            stream: LogStream::Stderr,
            text: text.to_owned(),
            truncated: false,
            lines: text.lines().count() as u32,
        }
    }

    /// torchrun 2.15's report after SIGKILL of its one worker, as printed.
    const KILLED: &str = "\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_12:01:38
  host      : localhost
  rank      : 3 (local_rank: 0)
  exitcode  : -9 (pid: 6593)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 6593
============================================================";

    #[test]
    fn a_killed_worker_is_its_rank_pid_and_signal() {
        let mut r = LauncherReports::new();
        let got: Vec<LauncherExit> = KILLED
            .lines()
            .flat_map(|t| r.push(&line("a.log", t)))
            .collect();
        assert_eq!(
            got,
            vec![LauncherExit {
                rank: 3,
                pid: 6593,
                exit_code: None,
                signal: Some(9)
            }]
        );
    }

    #[test]
    fn a_report_inside_one_multi_line_record_is_read_too() {
        let mut r = LauncherReports::new();
        let got = r.push(&line("a.log", KILLED));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].rank, 3);
    }

    #[test]
    fn every_failed_worker_of_a_node_is_reported_with_its_exit_code() {
        let text = "\
Failures:
[1]:
  time      : 2026-11-27_12:01:43
  host      : node-a
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 7001)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_12:01:43
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 7000)";
        let mut r = LauncherReports::new();
        let got = r.push(&line("a.log", text));
        let ranks: Vec<(u32, Option<i32>)> = got.iter().map(|e| (e.rank, e.exit_code)).collect();
        assert_eq!(ranks, vec![(1, Some(1)), (0, Some(1))]);
    }

    #[test]
    fn blocks_of_different_files_do_not_mix_and_a_stray_exitcode_is_nothing() {
        let mut r = LauncherReports::new();
        assert!(
            r.push(&line("a.log", "  rank      : 5 (local_rank: 1)"))
                .is_empty()
        );
        // Another file's exit code does not complete a.log's block.
        assert!(
            r.push(&line("b.log", "  exitcode  : -9 (pid: 1)"))
                .is_empty()
        );
        let got = r.push(&line("a.log", "  exitcode  : -6 (pid: 2)"));
        assert_eq!(got[0].rank, 5);
        assert_eq!(got[0].signal, Some(6));
        // A block whose exit code never comes is dropped after a few lines.
        assert!(
            r.push(&line("a.log", "  rank      : 7 (local_rank: 1)"))
                .is_empty()
        );
        for _ in 0..=MAX_GAP_LINES {
            assert!(r.push(&line("a.log", "unrelated")).is_empty());
        }
        assert!(
            r.push(&line("a.log", "  exitcode  : 1 (pid: 3)"))
                .is_empty()
        );
    }

    #[test]
    fn numbers_out_of_range_are_no_exit() {
        let mut r = LauncherReports::new();
        r.push(&line("a.log", "  rank      : 3 (local_rank: 0)"));
        assert!(
            r.push(&line("a.log", "  exitcode  : 1 (pid: 99999999999)"))
                .is_empty()
        );
    }
}
