//! Log input read defensively into [`LogLine`]s, one at a time: invalid UTF-8 replaced,
//! overlong lines cut with a marker, CRLF accepted, binary input refused, everything
//! counted. Memory per line is bounded by [`MAX_LINE_BYTES`] whatever the input.

use std::io::{BufRead, ErrorKind};

use serde::Serialize;

use crate::model::LogLine;

/// Longest line kept, in bytes; the rest of a longer line is skipped.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Appended to a line that was cut at [`MAX_LINE_BYTES`].
pub const TRUNCATION_MARKER: &str = " …[truncated]";
/// A NUL byte this early in the input means it is not a text log.
pub const BINARY_SNIFF_BYTES: u64 = 8 * 1024;

/// What reading the input ran into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct InputStats {
    /// Lines read.
    pub lines: u64,
    /// Bytes read, terminators included.
    pub bytes: u64,
    /// Lines longer than the cap, cut.
    pub truncated_lines: u64,
    /// Lines with invalid UTF-8, replaced with U+FFFD.
    pub invalid_utf8_lines: u64,
    /// NUL bytes dropped (after the first [`BINARY_SNIFF_BYTES`]).
    pub nul_bytes: u64,
}

impl InputStats {
    /// Add another input's counts.
    pub fn add(&mut self, other: &InputStats) {
        self.lines += other.lines;
        self.bytes += other.bytes;
        self.truncated_lines += other.truncated_lines;
        self.invalid_utf8_lines += other.invalid_utf8_lines;
        self.nul_bytes += other.nul_bytes;
    }
}

/// Why the input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Reading failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// A NUL byte near the start: a binary file, not a log.
    #[error(
        "input looks binary (NUL byte at offset {offset}); give a text log (decompress it first)"
    )]
    Binary {
        /// Byte offset of the NUL.
        offset: u64,
    },
}

/// Reads lines from a byte stream; see the module docs.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    next_id: u64,
    offset: u64,
    max_line: usize,
    buf: Vec<u8>,
    stats: InputStats,
}

impl<R: BufRead> LineReader<R> {
    /// A reader whose first line gets id 1: ids are line numbers as an editor shows them.
    pub fn new(inner: R) -> Self {
        LineReader::starting_at(inner, 1)
    }

    /// A reader whose first line gets `first_id` (to number several inputs as one).
    pub fn starting_at(inner: R, first_id: u64) -> Self {
        LineReader {
            inner,
            next_id: first_id,
            offset: 0,
            max_line: MAX_LINE_BYTES,
            buf: Vec::new(),
            stats: InputStats::default(),
        }
    }

    /// Change the line cap (bytes, at least 16).
    pub fn with_max_line(mut self, max_line: usize) -> Self {
        self.max_line = max_line.max(16);
        self
    }

    /// Counts so far.
    pub fn stats(&self) -> &InputStats {
        &self.stats
    }

    /// The id the next line will get.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The next line, `None` at the end of the input.
    pub fn next_line(&mut self) -> Result<Option<LogLine>, InputError> {
        self.buf.clear();
        let mut truncated = false;
        let mut read_any = false;
        loop {
            let available = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if available.is_empty() {
                break;
            }
            read_any = true;
            let newline = available.iter().position(|&b| b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            if let Some(p) = chunk.iter().position(|&b| b == 0) {
                let at = self.offset + p as u64;
                if at < BINARY_SNIFF_BYTES {
                    return Err(InputError::Binary { offset: at });
                }
            }
            let room = self.max_line.saturating_sub(self.buf.len());
            if chunk.len() > room {
                self.buf.extend_from_slice(&chunk[..room]);
                truncated = true;
            } else {
                self.buf.extend_from_slice(chunk);
            }
            let consumed = newline.map_or(available.len(), |i| i + 1);
            self.inner.consume(consumed);
            self.offset += consumed as u64;
            self.stats.bytes += consumed as u64;
            if newline.is_some() {
                break;
            }
        }
        if !read_any {
            return Ok(None);
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        let nuls = self.buf.iter().filter(|&&b| b == 0).count();
        if nuls > 0 {
            self.stats.nul_bytes += nuls as u64;
            self.buf.retain(|&b| b != 0);
        }
        if truncated {
            self.stats.truncated_lines += 1;
            // Do not count a character split by the cut as invalid.
            if let Err(e) = std::str::from_utf8(&self.buf)
                && e.error_len().is_none()
            {
                self.buf.truncate(e.valid_up_to());
            }
        }
        let mut text = match std::str::from_utf8(&self.buf) {
            Ok(s) => s.to_owned(),
            Err(_) => {
                self.stats.invalid_utf8_lines += 1;
                String::from_utf8_lossy(&self.buf).into_owned()
            }
        };
        if truncated {
            text.push_str(TRUNCATION_MARKER);
        }
        let line = LogLine {
            id: self.next_id,
            text,
            ..LogLine::default()
        };
        self.next_id += 1;
        self.stats.lines += 1;
        Ok(Some(line))
    }
}

/// Read every line of `reader`, handing each to `sink`.
pub fn for_each_line<R: BufRead>(
    reader: &mut LineReader<R>,
    mut sink: impl FnMut(&LogLine),
) -> Result<(), InputError> {
    while let Some(line) = reader.next_line()? {
        sink(&line);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8], max: usize) -> (Vec<String>, InputStats) {
        let mut r = LineReader::new(bytes).with_max_line(max);
        let mut out = Vec::new();
        for_each_line(&mut r, |l| out.push(l.text.clone())).expect("reads");
        (out, *r.stats())
    }

    #[test]
    fn crlf_and_a_missing_final_newline_are_accepted() {
        let (lines, stats) = read(b"one\r\ntwo\r\nthree", 1024);
        assert_eq!(lines, ["one", "two", "three"]);
        assert_eq!(stats.lines, 3);
        assert_eq!(stats.bytes, 15);
    }

    #[test]
    fn invalid_utf8_is_replaced_and_counted() {
        let (lines, stats) = read(b"ok\nbad \xff\xfe here\n", 1024);
        assert_eq!(lines, ["ok", "bad \u{fffd}\u{fffd} here"]);
        assert_eq!(stats.invalid_utf8_lines, 1);
    }

    #[test]
    fn overlong_lines_are_cut_with_a_marker_and_reading_goes_on() {
        let mut input = vec![b'x'; 100_000];
        input.extend_from_slice("é\nnext\n".as_bytes());
        let (lines, stats) = read(&input, 32);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], format!("{}{TRUNCATION_MARKER}", "x".repeat(32)));
        assert_eq!(lines[1], "next");
        assert_eq!(stats.truncated_lines, 1);
        assert_eq!(stats.invalid_utf8_lines, 0);
    }

    #[test]
    fn a_cut_through_a_multibyte_character_is_not_invalid_utf8() {
        let (lines, stats) = read("aé".repeat(20).as_bytes(), 16);
        assert!(lines[0].starts_with("aéaé"), "{lines:?}");
        assert_eq!(stats.invalid_utf8_lines, 0);
    }

    #[test]
    fn a_nul_near_the_start_is_binary_input() {
        let mut r = LineReader::new(&b"\x7fELF\x02\x01\x01\x00\x00"[..]);
        match r.next_line() {
            Err(InputError::Binary { offset }) => assert_eq!(offset, 7),
            other => panic!("expected binary, got {other:?}"),
        }
    }

    #[test]
    fn late_nuls_are_dropped_and_counted() {
        let mut input = "line\n".repeat(3000).into_bytes();
        input.extend_from_slice(b"after\0\0crash\n");
        let (lines, stats) = read(&input, 1024);
        assert_eq!(lines.last().map(String::as_str), Some("aftercrash"));
        assert_eq!(stats.nul_bytes, 2);
    }

    #[test]
    fn empty_input_has_no_lines() {
        let (lines, stats) = read(b"", 1024);
        assert!(lines.is_empty());
        assert_eq!(stats.lines, 0);
    }
}
