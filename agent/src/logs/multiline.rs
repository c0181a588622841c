//! Keeping a Python traceback together as one record.
//!
//! A traceback starts at `Traceback (most recent call last):` (or any line ending so,
//! such as the DataLoader's `Original Traceback (most recent call last):`; and
//! faulthandler's and c10's `... (most recent call first):`), goes on through its
//! indented frame lines (and c10's `frame #N:` lines) to the first unindented line, the
//! exception (`RuntimeError: ...`), and takes the indented lines right after it (a
//! multi-line message). Chained exceptions stay in the same record: a blank line, `During
//! handling of the above exception, another exception occurred:` or `The above exception
//! was the direct cause of the following exception:`, a blank line and the next
//! `Traceback`. A new bare `Traceback` after an exception starts a new record.
//!
//! Lines with a rank prefix (`[rank3]: `, `[default3]:`) are grouped per prefix, so
//! that the tracebacks of several ranks interleaved in one file come out as one record
//! each; lines of other prefixes pass by an open traceback (and so may come out before
//! it). A record is closed by the first line with its prefix that does not continue it,
//! by `flush_ms` without such a line, or by its bounds (`max_lines`, `max_bytes`: the
//! traceback then goes on in a new record, and the full one is marked truncated).
//!
//! Blank lines outside tracebacks are dropped.

use warden_model::wire::LogStream;

use super::attribution::LinePrefix;

/// A line or a grouped record on its way through.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Text; lines joined with `\n`.
    pub text: String,
    /// Time of its first line.
    pub at_ns: i64,
    /// Stream.
    pub stream: LogStream,
    /// Some of it was cut.
    pub truncated: bool,
    /// Number of lines.
    pub lines: u32,
    /// The rank prefix of its first line.
    pub prefix: Option<LinePrefix>,
}

impl Entry {
    /// A single line.
    pub fn line(text: String, at_ns: i64, stream: LogStream, truncated: bool) -> Self {
        let prefix = super::attribution::line_prefix(&text);
        Entry {
            text,
            at_ns,
            stream,
            truncated,
            lines: 1,
            prefix,
        }
    }

    fn prefix_str(&self) -> &str {
        let len = self.prefix.map_or(0, |p| p.len);
        self.text.get(..len).unwrap_or("")
    }

    /// The text after the rank prefix and one space.
    fn body(&self) -> &str {
        let len = self.prefix.map_or(0, |p| p.len);
        let rest = self.text.get(len..).unwrap_or("");
        if len > 0 {
            rest.strip_prefix(' ').unwrap_or(rest)
        } else {
            rest
        }
    }
}

/// Grouping bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Whether to group at all.
    pub enabled: bool,
    /// Most lines per record.
    pub max_lines: u32,
    /// Most bytes per record.
    pub max_bytes: usize,
    /// Idle time after which an open record is emitted, ns.
    pub flush_ns: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Inside the frames.
    Frames,
    /// After the exception line.
    AfterException,
    /// After a chain marker, waiting for the next `Traceback`.
    Chain,
}

#[derive(Debug)]
struct Group {
    key: String,
    stream: LogStream,
    entry: Entry,
    state: State,
    /// Blank lines held until we know whether the traceback goes on.
    blanks: Vec<String>,
    last_ns: i64,
}

/// Most tracebacks open at once in one file (one per rank prefix and stream).
const MAX_GROUPS: usize = 16;
/// Most blank lines inside a traceback before it is taken to have ended.
const MAX_BLANKS: usize = 2;

/// Groups the lines of one file.
#[derive(Debug)]
pub struct Grouper {
    bounds: Bounds,
    groups: Vec<Group>,
}

fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

fn is_start(body: &str) -> bool {
    let t = body.trim_end();
    t.ends_with("Traceback (most recent call last):") || t.ends_with("(most recent call first):")
}

fn is_bare_start(body: &str) -> bool {
    body.trim() == "Traceback (most recent call last):"
}

fn is_indented(body: &str) -> bool {
    body.starts_with([' ', '\t']) || body.starts_with("frame #")
}

fn is_chain_marker(body: &str) -> bool {
    let t = body.trim();
    t.starts_with("During handling of the above exception")
        || t.starts_with("The above exception was the direct cause")
}

impl Grouper {
    /// A grouper with these bounds.
    pub fn new(bounds: Bounds) -> Self {
        Grouper {
            bounds,
            groups: Vec::new(),
        }
    }

    /// Bytes held in open records.
    pub fn held(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.entry.text.len() + g.blanks.iter().map(String::len).sum::<usize>())
            .sum()
    }

    /// Whether any record is open.
    pub fn is_open(&self) -> bool {
        !self.groups.is_empty()
    }

    /// Take one line (`now_ns` on the agent clock); finished records go to `out`.
    pub fn push<F: FnMut(Entry)>(&mut self, line: Entry, now_ns: i64, out: &mut F) {
        if !self.bounds.enabled {
            if !is_blank(&line.text) {
                out(line);
            }
            return;
        }
        let pos = self
            .groups
            .iter()
            .position(|g| g.stream == line.stream && g.key == line.prefix_str());
        let line = match pos {
            Some(i) => match self.continue_group(i, line, now_ns, out) {
                None => return,
                Some(line) => {
                    let g = self.groups.remove(i);
                    out(g.entry);
                    line
                }
            },
            None => line,
        };
        self.start_or_pass(line, now_ns, out);
    }

    fn start_or_pass<F: FnMut(Entry)>(&mut self, line: Entry, now_ns: i64, out: &mut F) {
        let body = line.body();
        if is_blank(body) {
            return;
        }
        if !is_start(body) {
            out(line);
            return;
        }
        if self.groups.len() >= MAX_GROUPS {
            let oldest = self
                .groups
                .iter()
                .enumerate()
                .min_by_key(|(_, g)| g.last_ns)
                .map_or(0, |(i, _)| i);
            let g = self.groups.remove(oldest);
            out(g.entry);
        }
        self.groups.push(Group {
            key: line.prefix_str().to_string(),
            stream: line.stream,
            entry: line,
            state: State::Frames,
            blanks: Vec::new(),
            last_ns: now_ns,
        });
    }

    /// Try to add `line` to group `i`; the line back when it does not continue it.
    fn continue_group<F: FnMut(Entry)>(
        &mut self,
        i: usize,
        line: Entry,
        now_ns: i64,
        out: &mut F,
    ) -> Option<Entry> {
        let bounds = self.bounds;
        let g = &mut self.groups[i];
        let body = line.body();
        let blank = is_blank(body);
        let next = match g.state {
            State::Frames => {
                if blank {
                    None
                } else if is_indented(body) || is_start(body) {
                    Some(State::Frames)
                } else {
                    Some(State::AfterException)
                }
            }
            State::AfterException => {
                if blank {
                    None
                } else if is_chain_marker(body) {
                    Some(State::Chain)
                } else if is_start(body) && !is_bare_start(body) {
                    Some(State::Frames)
                } else if is_indented(body) && g.blanks.is_empty() {
                    Some(State::AfterException)
                } else {
                    return Some(line);
                }
            }
            State::Chain => {
                if blank {
                    None
                } else if is_start(body) {
                    Some(State::Frames)
                } else {
                    return Some(line);
                }
            }
        };
        g.last_ns = now_ns;
        let Some(next) = next else {
            if g.blanks.len() >= MAX_BLANKS {
                return Some(line);
            }
            g.blanks.push(line.text);
            return None;
        };
        g.state = next;
        let blanks = std::mem::take(&mut g.blanks);
        for b in blanks {
            append(g, b, false, line.at_ns, bounds, out);
        }
        append(g, line.text, line.truncated, line.at_ns, bounds, out);
        None
    }

    /// Emit the records that have had no line for the idle time.
    pub fn flush_idle<F: FnMut(Entry)>(&mut self, now_ns: i64, out: &mut F) {
        let flush_ns = self.bounds.flush_ns;
        let mut i = 0;
        while i < self.groups.len() {
            if now_ns.saturating_sub(self.groups[i].last_ns) >= flush_ns {
                let g = self.groups.remove(i);
                out(g.entry);
            } else {
                i += 1;
            }
        }
    }

    /// Emit every open record.
    pub fn flush_all<F: FnMut(Entry)>(&mut self, out: &mut F) {
        for g in self.groups.drain(..) {
            out(g.entry);
        }
    }
}

fn append<F: FnMut(Entry)>(
    g: &mut Group,
    text: String,
    truncated: bool,
    at_ns: i64,
    bounds: Bounds,
    out: &mut F,
) {
    let full =
        g.entry.lines >= bounds.max_lines || g.entry.text.len() + 1 + text.len() > bounds.max_bytes;
    if full {
        // Emit what we have; the traceback goes on in a fresh record.
        let fresh = Entry {
            text,
            at_ns,
            stream: g.stream,
            truncated,
            lines: 1,
            prefix: g.entry.prefix,
        };
        let mut done = std::mem::replace(&mut g.entry, fresh);
        done.truncated = true;
        out(done);
        return;
    }
    g.entry.text.push('\n');
    g.entry.text.push_str(&text);
    g.entry.lines += 1;
    g.entry.truncated |= truncated;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grouper() -> Grouper {
        Grouper::new(Bounds {
            enabled: true,
            max_lines: 100,
            max_bytes: 10_000,
            flush_ns: 2_000_000_000,
        })
    }

    fn feed(g: &mut Grouper, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (i, l) in text.lines().enumerate() {
            let e = Entry::line(l.to_string(), i as i64, LogStream::Stderr, false);
            g.push(e, i as i64, &mut |e: Entry| out.push(e.text));
        }
        out
    }

    #[test]
    fn plain_traceback_is_one_record() {
        let mut g = grouper();
        let tb = "Traceback (most recent call last):\n  File \"train.py\", line 519, in <module>\n    train(hyp, opt)\nRuntimeError: CUDA error: unspecified launch failure";
        let out = feed(&mut g, &format!("before\n{tb}\nafter"));
        assert_eq!(
            out,
            vec!["before".to_string(), tb.to_string(), "after".to_string()]
        );
        assert!(!g.is_open());
    }

    #[test]
    fn chained_traceback_stays_together() {
        let mut g = grouper();
        let tb = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    g()\nKeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    f()\nValueError: y";
        let out = feed(&mut g, &format!("{tb}\nnext line"));
        assert_eq!(out, vec![tb.to_string(), "next line".to_string()]);
    }

    #[test]
    fn message_continuation_and_original_traceback() {
        let mut g = grouper();
        let tb = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    y()\nFileNotFoundError: Caught FileNotFoundError in DataLoader worker process 2.\nOriginal Traceback (most recent call last):\n  File \"w.py\", line 302, in _worker_loop\n    data = fetcher.fetch(index)\nFileNotFoundError: no such file\n\tsize mismatch for a.weight";
        let out = feed(&mut g, &format!("{tb}\n\nunrelated"));
        assert_eq!(out, vec![tb.to_string(), "unrelated".to_string()]);
    }

    #[test]
    fn two_separate_tracebacks_are_two_records() {
        let mut g = grouper();
        let a = "Traceback (most recent call last):\n  File \"a\", line 1\nKeyError: 1";
        let b = "Traceback (most recent call last):\n  File \"b\", line 2\nValueError: 2";
        let out = feed(&mut g, &format!("{a}\n{b}"));
        assert_eq!(out, vec![a.to_string()]);
        let mut rest = Vec::new();
        g.flush_all(&mut |e: Entry| rest.push(e.text));
        assert_eq!(rest, vec![b.to_string()]);
    }

    #[test]
    fn interleaved_ranks_are_grouped_per_prefix() {
        let mut g = grouper();
        let text = "[rank7]: Traceback (most recent call last):\n[rank3]: Traceback (most recent call last):\n[rank7]:   File \"l.py\", line 23, in <module>\n[rank3]:   File \"l.py\", line 23, in <module>\n[rank7]:     run_exp()\n[rank0]: plain\n[rank3]:     run_exp()\n[rank7]: torch.OutOfMemoryError: CUDA out of memory.\n[rank3]: RuntimeError: boom\n[rank7]: next\n[rank3]: next";
        let out = feed(&mut g, text);
        assert_eq!(
            out,
            vec![
                "[rank0]: plain".to_string(),
                "[rank7]: Traceback (most recent call last):\n[rank7]:   File \"l.py\", line 23, in <module>\n[rank7]:     run_exp()\n[rank7]: torch.OutOfMemoryError: CUDA out of memory.".to_string(),
                "[rank7]: next".to_string(),
                "[rank3]: Traceback (most recent call last):\n[rank3]:   File \"l.py\", line 23, in <module>\n[rank3]:     run_exp()\n[rank3]: RuntimeError: boom".to_string(),
                "[rank3]: next".to_string(),
            ]
        );
    }

    #[test]
    fn idle_flush_and_bounds() {
        let mut g = Grouper::new(Bounds {
            enabled: true,
            max_lines: 3,
            max_bytes: 10_000,
            flush_ns: 100,
        });
        let mut out: Vec<Entry> = Vec::new();
        for (i, l) in [
            "Traceback (most recent call last):",
            "  a",
            "  b",
            "  c",
            "  d",
        ]
        .iter()
        .enumerate()
        {
            g.push(
                Entry::line(l.to_string(), 0, LogStream::Stdout, false),
                i as i64,
                &mut |e| out.push(e),
            );
        }
        assert_eq!(out.len(), 1);
        assert!(out[0].truncated);
        assert_eq!(out[0].lines, 3);
        g.flush_idle(50, &mut |e| out.push(e));
        assert_eq!(out.len(), 1, "not idle long enough");
        g.flush_idle(104, &mut |e| out.push(e));
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].text, "  c\n  d");
        assert!(!g.is_open());
    }

    #[test]
    fn disabled_grouping_passes_every_line_on() {
        let mut g = Grouper::new(Bounds {
            enabled: false,
            max_lines: 100,
            max_bytes: 10_000,
            flush_ns: 1,
        });
        let out = feed(
            &mut g,
            "Traceback (most recent call last):\n  File \"a\"\n\nKeyError: 1",
        );
        assert_eq!(out.len(), 3);
        assert!(!g.is_open());
    }

    #[test]
    fn blank_lines_outside_tracebacks_are_dropped() {
        let mut g = grouper();
        assert_eq!(
            feed(&mut g, "a\n\n   \nb"),
            vec!["a".to_string(), "b".to_string()]
        );
    }
}
