//! The local log window: the most recent training log lines of this node, bounded in
//! bytes, so the controller can pull the lines around an incident without the agent
//! shipping every line.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;

/// One line kept in the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowLine {
    /// Agent time of the line, ns since the Unix epoch.
    pub at_ns: i64,
    /// Job the line belongs to, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<Arc<str>>,
    /// Global rank, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// File the line was read from.
    pub source: Arc<str>,
    /// `stdout` or `stderr`.
    pub stream: &'static str,
    /// The text (a traceback is one multi-line entry).
    pub text: String,
}

impl WindowLine {
    fn cost(&self) -> usize {
        self.text.len() + 64
    }
}

/// What to pull from the window.
#[derive(Debug, Clone, Default)]
pub struct WindowQuery {
    /// Only this job.
    pub job: Option<String>,
    /// Only this rank.
    pub rank: Option<u32>,
    /// Lines at or after this time (ns).
    pub from_ns: i64,
    /// Lines at or before this time (ns).
    pub to_ns: i64,
    /// Most lines returned (the ones nearest `to_ns` are kept).
    pub limit: usize,
}

/// Recent lines, oldest first, at most `max_bytes` of text (plus a small per-line cost).
#[derive(Debug)]
pub struct LogWindow {
    lines: VecDeque<WindowLine>,
    bytes: usize,
    max_bytes: usize,
    /// Lines pushed out to stay within the bound, since start.
    pub evicted: u64,
}

impl LogWindow {
    /// An empty window of `max_bytes`.
    pub fn new(max_bytes: usize) -> LogWindow {
        LogWindow {
            lines: VecDeque::new(),
            bytes: 0,
            max_bytes,
            evicted: 0,
        }
    }

    /// Add a line, evicting the oldest to make room.
    pub fn push(&mut self, line: WindowLine) {
        let cost = line.cost();
        if cost > self.max_bytes {
            return;
        }
        self.bytes += cost;
        self.lines.push_back(line);
        while self.bytes > self.max_bytes {
            match self.lines.pop_front() {
                Some(old) => {
                    self.bytes -= old.cost();
                    self.evicted += 1;
                }
                None => break,
            }
        }
    }

    /// Lines matching `q`, oldest first.
    pub fn query(&self, q: &WindowQuery) -> Vec<WindowLine> {
        // Lines arrive roughly in time order; scan from the newest end and stop once
        // well before the window (allowing for sources that lag each other).
        let mut out: Vec<WindowLine> = Vec::new();
        const SLACK_NS: i64 = 60_000_000_000;
        for l in self.lines.iter().rev() {
            if l.at_ns < q.from_ns.saturating_sub(SLACK_NS) {
                break;
            }
            if l.at_ns < q.from_ns || l.at_ns > q.to_ns {
                continue;
            }
            if q.job
                .as_deref()
                .is_some_and(|j| l.job.as_deref() != Some(j))
            {
                continue;
            }
            if q.rank.is_some_and(|r| l.rank != Some(r)) {
                continue;
            }
            out.push(l.clone());
            if out.len() >= q.limit {
                break;
            }
        }
        out.reverse();
        out.sort_by_key(|l| l.at_ns);
        out
    }

    /// Bytes held (text plus per-line cost).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Lines held.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at: i64, job: &str, rank: u32, text: &str) -> WindowLine {
        WindowLine {
            at_ns: at,
            job: Some(job.into()),
            rank: Some(rank),
            source: "f".into(),
            stream: "stdout",
            text: text.into(),
        }
    }

    #[test]
    fn window_is_bounded_and_answers_by_time_job_and_rank() {
        let mut w = LogWindow::new(100 * 74);
        for i in 0..1000 {
            w.push(line(
                i * 1000,
                if i % 2 == 0 { "a" } else { "b" },
                (i % 4) as u32,
                "0123456789",
            ));
        }
        assert_eq!(w.len(), 100);
        assert_eq!(w.evicted, 900);
        assert!(w.bytes() <= 100 * 74);
        let q = WindowQuery {
            job: Some("a".into()),
            rank: Some(2),
            from_ns: 950_000,
            to_ns: 990_000,
            limit: 100,
        };
        let got: Vec<i64> = w.query(&q).iter().map(|l| l.at_ns).collect();
        assert_eq!(
            got,
            [
                950_000, 954_000, 958_000, 962_000, 966_000, 970_000, 974_000, 978_000, 982_000,
                986_000, 990_000
            ]
        );
        let q = WindowQuery { limit: 2, ..q };
        let got: Vec<i64> = w.query(&q).iter().map(|l| l.at_ns).collect();
        assert_eq!(
            got,
            [986_000, 990_000],
            "the lines nearest the end are kept"
        );
    }
}
