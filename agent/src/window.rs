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
        self.text.len() + LINE_COST
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

/// Per-line bookkeeping besides the text, for the byte bound.
const LINE_COST: usize = 64;

/// Bytes in a circular buffer that grows up to the window's bound and then wraps:
/// appending is one or two `memcpy`s, dropping from the front moves an index.
#[derive(Debug, Default)]
struct ByteRing {
    buf: Vec<u8>,
    head: usize,
    len: usize,
}

impl ByteRing {
    fn len(&self) -> usize {
        self.len
    }

    fn push_back(&mut self, bytes: &[u8], max: usize) {
        if self.len + bytes.len() > self.buf.len() {
            // Grow (up to the bound), unwrapping the contents first.
            let want = (self.len + bytes.len())
                .max(self.buf.len() * 2)
                .min(max.max(self.len + bytes.len()));
            let mut grown = Vec::with_capacity(want);
            let (a, b) = self.slices();
            grown.extend_from_slice(a);
            grown.extend_from_slice(b);
            grown.resize(want, 0);
            self.buf = grown;
            self.head = 0;
        }
        let cap = self.buf.len();
        // `head < cap` and `len <= cap`: one subtraction wraps (no division per line).
        let mut tail = self.head + self.len;
        if tail >= cap {
            tail -= cap;
        }
        let first = bytes.len().min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&bytes[..first]);
        self.buf[..bytes.len() - first].copy_from_slice(&bytes[first..]);
        self.len += bytes.len();
    }

    fn pop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head += n;
        if self.head >= self.buf.len() {
            self.head -= self.buf.len();
        }
        self.len -= n;
    }

    fn slices(&self) -> (&[u8], &[u8]) {
        let cap = self.buf.len();
        if cap == 0 {
            return (&[], &[]);
        }
        let end = self.head + self.len;
        if end <= cap {
            (&self.buf[self.head..end], &[])
        } else {
            (&self.buf[self.head..], &self.buf[..end - cap])
        }
    }

    /// Bytes `range` (offsets from the front), copied out.
    fn copy_range(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let (a, b) = self.slices();
        let mut out = Vec::with_capacity(range.len());
        let (s, e) = (range.start.min(self.len), range.end.min(self.len));
        if s < a.len() {
            out.extend_from_slice(&a[s..e.min(a.len())]);
        }
        if e > a.len() {
            out.extend_from_slice(&b[s.saturating_sub(a.len())..e - a.len()]);
        }
        out
    }
}

/// What is kept of a line besides its text, which lives in the window's byte ring.
#[derive(Debug, Clone)]
struct Meta {
    at_ns: i64,
    job: Option<Arc<str>>,
    rank: Option<u32>,
    source: Arc<str>,
    stream: &'static str,
    len: usize,
}

/// Recent lines, oldest first, at most `max_bytes` of text plus a small per-line cost.
/// The text of every line sits in one ring of bytes, so keeping a line costs a copy
/// and no allocation, and the caller's string is freed while still hot in cache.
#[derive(Debug)]
pub struct LogWindow {
    meta: VecDeque<Meta>,
    text: ByteRing,
    bytes: usize,
    max_bytes: usize,
    /// Lines pushed out to stay within the bound, since start.
    pub evicted: u64,
}

impl LogWindow {
    /// An empty window of `max_bytes`.
    pub fn new(max_bytes: usize) -> LogWindow {
        LogWindow {
            meta: VecDeque::new(),
            text: ByteRing::default(),
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
        while self.bytes + cost > self.max_bytes {
            let Some(old) = self.meta.pop_front() else {
                break;
            };
            self.text.pop_front(old.len);
            self.bytes -= old.len + LINE_COST;
            self.evicted += 1;
        }
        self.bytes += cost;
        self.text.push_back(line.text.as_bytes(), self.max_bytes);
        self.meta.push_back(Meta {
            at_ns: line.at_ns,
            job: line.job,
            rank: line.rank,
            source: line.source,
            stream: line.stream,
            len: line.text.len(),
        });
    }

    /// Lines matching `q`, oldest first.
    pub fn query(&self, q: &WindowQuery) -> Vec<WindowLine> {
        // Lines arrive roughly in time order; scan from the newest end and stop once
        // well before the window (allowing for sources that lag each other).
        const SLACK_NS: i64 = 60_000_000_000;
        let mut out: Vec<WindowLine> = Vec::new();
        let mut end = self.text.len();
        for m in self.meta.iter().rev() {
            let start = end - m.len;
            let span = start..end;
            end = start;
            if m.at_ns < q.from_ns.saturating_sub(SLACK_NS) {
                break;
            }
            if m.at_ns < q.from_ns || m.at_ns > q.to_ns {
                continue;
            }
            if q.job
                .as_deref()
                .is_some_and(|j| m.job.as_deref() != Some(j))
            {
                continue;
            }
            if q.rank.is_some_and(|r| m.rank != Some(r)) {
                continue;
            }
            let bytes = self.text.copy_range(span);
            out.push(WindowLine {
                at_ns: m.at_ns,
                job: m.job.clone(),
                rank: m.rank,
                source: m.source.clone(),
                stream: m.stream,
                text: String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            });
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
        self.meta.len()
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
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

    #[test]
    fn text_survives_the_ring_wrapping_around() {
        let mut w = LogWindow::new(10 * (LINE_COST + 6));
        for i in 0..1000 {
            w.push(line(i, "a", 0, &format!("l{i:05}")));
            assert!(w.bytes() <= 10 * (LINE_COST + 6));
        }
        let q = WindowQuery {
            job: None,
            rank: None,
            from_ns: 0,
            to_ns: 10_000,
            limit: 100,
        };
        let texts: Vec<String> = w.query(&q).into_iter().map(|l| l.text).collect();
        let want: Vec<String> = (990..1000).map(|i| format!("l{i:05}")).collect();
        assert_eq!(texts, want);
        // Lines of different lengths wrap at different places.
        for i in 0..500 {
            w.push(line(10_000 + i, "a", 0, &"x".repeat((i % 7) as usize)));
        }
        let q = WindowQuery {
            from_ns: 10_490,
            to_ns: 10_499,
            ..q
        };
        let lens: Vec<usize> = w.query(&q).into_iter().map(|l| l.text.len()).collect();
        let want: Vec<usize> = (490..500).map(|i| i % 7).collect();
        assert_eq!(lens, want);
    }
}
