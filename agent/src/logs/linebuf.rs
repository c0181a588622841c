//! Bounded line assembly: bytes in, finished lines out, never more than `max` bytes
//! held for one line however long the line is.

/// Assembles lines from chunks of bytes.
///
/// A line ends at `\n`; with `split_cr`, also at `\r` (progress bars redraw with `\r`),
/// and `\r\n` ends one line, not two. NUL bytes are dropped: a writer that carried on at
/// its old offset after a copytruncate leaves a run of them. A line longer than `max`
/// is emitted as soon as `max` bytes have arrived (cut at a UTF-8 boundary, marked
/// truncated) and the rest of it is skipped without being buffered.
#[derive(Debug, Default)]
pub(crate) struct LineBuf {
    buf: Vec<u8>,
    /// Inside the unkept rest of a truncated line.
    skipping: bool,
    /// The last byte seen was a `\r` that ended a line.
    after_cr: bool,
}

impl LineBuf {
    /// An empty buffer.
    pub(crate) fn new() -> Self {
        LineBuf::default()
    }

    /// Whether part of a line is held.
    pub(crate) fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Bytes held.
    pub(crate) fn held(&self) -> usize {
        self.buf.len()
    }

    /// Start skipping until the next line end (used when reading starts mid-line).
    pub(crate) fn skip_to_line_end(&mut self) {
        self.buf.clear();
        self.skipping = true;
    }

    /// Forget everything held.
    pub(crate) fn reset(&mut self) {
        self.buf.clear();
        self.skipping = false;
        self.after_cr = false;
    }

    /// Feed bytes; `emit(line, truncated)` is called for each line finished.
    pub(crate) fn push<F: FnMut(&[u8], bool)>(
        &mut self,
        data: &[u8],
        max: usize,
        split_cr: bool,
        emit: &mut F,
    ) {
        let mut rest = data;
        while !rest.is_empty() {
            // A vectorised search for the bytes that end or interrupt a line.
            let found = if split_cr {
                memchr::memchr3(b'\n', b'\r', 0, rest)
            } else {
                memchr::memchr2(b'\n', 0, rest)
            };
            let Some(i) = found else {
                self.take(rest, false, max, emit);
                self.after_cr = false;
                return;
            };
            let term = rest[i];
            let seg = &rest[..i];
            rest = &rest[i + 1..];
            if term == 0 {
                if !seg.is_empty() {
                    self.take(seg, false, max, emit);
                    self.after_cr = false;
                }
                continue;
            }
            let empty = seg.is_empty() && self.buf.is_empty() && !self.skipping;
            if empty && term == b'\n' && self.after_cr {
                // The `\n` of a `\r\n`.
                self.after_cr = false;
                continue;
            }
            self.after_cr = term == b'\r';
            if empty && term == b'\r' {
                // A redraw with nothing before it: no line.
                continue;
            }
            self.take(seg, true, max, emit);
        }
    }

    /// End the current line as if a line terminator had arrived (a CRI `F` record).
    pub(crate) fn end_line<F: FnMut(&[u8], bool)>(&mut self, max: usize, emit: &mut F) {
        self.take(&[], true, max, emit);
    }

    /// Emit the held part of a line as a line of its own (the file went quiet before
    /// its newline). Returns whether anything was held.
    pub(crate) fn flush_partial<F: FnMut(&[u8], bool)>(&mut self, emit: &mut F) -> bool {
        if self.buf.is_empty() {
            return false;
        }
        emit(&self.buf, false);
        self.buf.clear();
        true
    }

    fn take<F: FnMut(&[u8], bool)>(
        &mut self,
        seg: &[u8],
        complete: bool,
        max: usize,
        emit: &mut F,
    ) {
        if self.skipping {
            if complete {
                self.skipping = false;
            }
            return;
        }
        let room = max.saturating_sub(self.buf.len());
        if seg.len() > room {
            self.buf.extend_from_slice(&seg[..room]);
            let keep = utf8_cut(&self.buf);
            emit(&self.buf[..keep], true);
            self.buf.clear();
            self.skipping = !complete;
            return;
        }
        if !complete {
            self.buf.extend_from_slice(seg);
        } else if self.buf.is_empty() {
            emit(seg, false);
        } else {
            self.buf.extend_from_slice(seg);
            emit(&self.buf, false);
            self.buf.clear();
        }
    }
}

/// Length of the longest prefix of `b` that does not end inside a UTF-8 sequence (as far
/// as the last few bytes tell; invalid bytes elsewhere are left to lossy decoding).
pub(crate) fn utf8_cut(b: &[u8]) -> usize {
    let n = b.len();
    let mut i = n;
    // Walk back over at most 3 continuation bytes to the lead byte.
    while i > 0 && n - i < 3 && b[i - 1] & 0xC0 == 0x80 {
        i -= 1;
    }
    if i == 0 {
        return n;
    }
    let lead = b[i - 1];
    let width = match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => return n,
    };
    if n - (i - 1) < width { i - 1 } else { n }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]], max: usize, split_cr: bool) -> Vec<(String, bool)> {
        let mut lb = LineBuf::new();
        let mut out = Vec::new();
        let mut emit = |l: &[u8], t: bool| out.push((String::from_utf8_lossy(l).into_owned(), t));
        for c in chunks {
            lb.push(c, max, split_cr, &mut emit);
        }
        out
    }

    fn lines(v: &[(&str, bool)]) -> Vec<(String, bool)> {
        v.iter().map(|(s, t)| (s.to_string(), *t)).collect()
    }

    #[test]
    fn lines_split_across_chunks_are_joined() {
        let got = run(&[b"ab", b"c\nde", b"f\n\ng"], 100, false);
        assert_eq!(got, lines(&[("abc", false), ("def", false), ("", false)]));
    }

    #[test]
    fn carriage_returns_end_lines_only_when_asked() {
        let data: &[&[u8]] = &[b"a\r\nb\rc\r", b"\nd\r\re\n"];
        assert_eq!(
            run(data, 100, true),
            lines(&[
                ("a", false),
                ("b", false),
                ("c", false),
                ("d", false),
                ("e", false)
            ])
        );
        assert_eq!(
            run(data, 100, false),
            lines(&[("a\r", false), ("b\rc\r", false), ("d\r\re", false)])
        );
    }

    #[test]
    fn long_line_is_cut_once_and_the_rest_skipped() {
        let long = vec![b'x'; 1000];
        let got = run(&[b"ok\n", &long, &long, b"tail\nnext\n"], 64, false);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], ("ok".to_string(), false));
        assert_eq!(got[1], ("x".repeat(64), true));
        assert_eq!(got[2], ("next".to_string(), false));
    }

    #[test]
    fn line_of_exactly_max_bytes_is_not_truncated() {
        let got = run(&[b"abcd", b"\nef\n"], 4, false);
        assert_eq!(got, lines(&[("abcd", false), ("ef", false)]));
        let got = run(&[b"abcde\nef\n"], 4, false);
        assert_eq!(got, lines(&[("abcd", true), ("ef", false)]));
    }

    #[test]
    fn nul_bytes_are_dropped() {
        let got = run(&[b"\0\0\0a\0b\n\0\0\nc\n"], 100, false);
        assert_eq!(got, lines(&[("ab", false), ("", false), ("c", false)]));
    }

    #[test]
    fn truncation_does_not_split_a_character() {
        // "é" is 2 bytes: a cut at 3 bytes of "aéé" would end inside the second one.
        let got = run(&["aéé\n".as_bytes()], 4, false);
        assert_eq!(got, lines(&[("aé", true)]));
        assert_eq!(utf8_cut("a€".as_bytes()), 4);
        assert_eq!(utf8_cut(&"a€".as_bytes()[..3]), 1);
        assert_eq!(utf8_cut(&[0xff, 0xfe]), 2);
    }

    #[test]
    fn partial_line_flushes_and_skip_to_line_end() {
        let mut lb = LineBuf::new();
        let mut out = Vec::new();
        let mut emit = |l: &[u8], t: bool| out.push((String::from_utf8_lossy(l).into_owned(), t));
        lb.skip_to_line_end();
        lb.push(b"rest of old\nnew", 100, false, &mut emit);
        assert!(lb.has_partial());
        assert!(lb.flush_partial(&mut emit));
        assert!(!lb.flush_partial(&mut emit));
        lb.push(b"more", 100, false, &mut emit);
        lb.end_line(100, &mut emit);
        assert_eq!(out, lines(&[("new", false), ("more", false)]));
    }
}
