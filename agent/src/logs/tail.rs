//! Following log files: glob expansion, rotation, bounded reading, and the line
//! pipeline (framing, CRI joining, traceback grouping, attribution) up to [`LogLine`].
//!
//! The [`Tailer`] has no thread or timer of its own: the agent's log thread calls
//! [`Tailer::poll_with`] with the current time (every 500 ms), and
//! each call does a bounded amount of work: at most `read_bytes_per_poll` bytes per file,
//! read in 64 KiB chunks into one reused buffer.
//!
//! Files and rotation:
//! - The globs are expanded at the first poll and then every `rescan_interval_ms`.
//!   Files found at the first expansion start at their end (`start_at: end`, the
//!   default) or beginning; files found later start at their beginning. A file is known
//!   by its device, inode and creation time, so one matched by two globs, or by a
//!   symlink and its target, is read once.
//! - Rotation by rename: when a read reaches end of file and the path now names another
//!   file, the old file has been read to its end; it is closed and the new one read from
//!   its beginning in the same poll, so nothing written before the rename is lost and
//!   order is kept. Where the old file is closed, the offset reached is remembered, so a
//!   glob that also matches the rotated name (`train.log.1`) does not read it again, and
//!   picks up what a writer added to it after the rename.
//! - Rotation by copytruncate: a file shorter than the offset reached is read again
//!   from its beginning. (What the writer wrote between the copy and the truncation is
//!   lost to every reader; a file truncated and then grown past the old offset between
//!   two polls cannot be told from one that grew.)
//! - A deleted file is closed once read to its end. A file renamed away with nothing in
//!   its place is still read for a minute, then closed.
//! - More than `max_open_files`: the least recently active file is closed and reopened
//!   where it left off when a rescan finds it grown.
//!
//! Lines: a line ends at `\n`, `\r\n`, or (plain files) `\r`, which progress bars
//! redraw with; NUL bytes are dropped; a line longer than `max_line_bytes` is cut there
//! and marked truncated, and its rest skipped without being read into memory. See
//! [`super::cri`] for CRI records and [`super::multiline`] for tracebacks. A last line
//! without a newline is held, up to `max_line_bytes`, until its file has been quiet for
//! `partial_flush_ms`, then emitted as it is. Invalid UTF-8 becomes U+FFFD.

use std::{
    collections::VecDeque,
    fs::{self, File, Metadata},
    io::{ErrorKind, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    sync::Arc,
};

use rustc_hash::FxHashMap;
use warden_model::wire::LogStream;

use super::{
    LogLine,
    attribution::FileAttribution,
    config::{ConfigError, Format, StartAt, TailConfig},
    cri,
    linebuf::{LineBuf, utf8_cut},
    multiline::{Bounds, Entry, Grouper},
};

/// Size of the read buffer, bytes.
const CHUNK_BYTES: usize = 64 * 1024;
/// Room for the CRI record header (time, stream, tag) on top of `max_line_bytes`.
const CRI_HEADER_BYTES: usize = 64;
/// How long a file renamed away, with nothing new at its path, is still read, ns.
const ORPHAN_GRACE_NS: i64 = 60_000_000_000;
/// Most remembered (closed) files.
const MAX_REMEMBERED: usize = 8192;

/// The tailer's self-metrics, cumulative since it was created (`files_open` is a gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TailCounters {
    /// Lines read (after framing and CRI joining, before tracebacks are grouped).
    pub lines_read: u64,
    /// Records emitted ([`LogLine`]s; a traceback counts once).
    pub records_emitted: u64,
    /// Bytes read from files.
    pub bytes_read: u64,
    /// Lines cut at `max_line_bytes`.
    pub lines_truncated: u64,
    /// Partial last lines emitted after the idle time.
    pub partial_flushes: u64,
    /// Rotations seen: by rename and by copytruncate.
    pub rotations: u64,
    /// Of those, by copytruncate.
    pub truncations: u64,
    /// Files open now.
    pub files_open: u64,
    /// Files opened.
    pub files_opened: u64,
    /// Files closed (deleted, rotated away, evicted, errors).
    pub files_closed: u64,
    /// Files closed to stay within `max_open_files`.
    pub files_evicted: u64,
    /// Read and open errors.
    pub read_errors: u64,
    /// Glob expansion errors (unreadable directories).
    pub scan_errors: u64,
    /// Lines of CRI files that are not CRI records (passed on as plain stdout lines).
    pub cri_malformed: u64,
}

/// Device, inode and (where the file system records it) creation time: an inode number
/// freed by a deleted file and given to a new one does not pass for the old file.
type FileId = (u64, u64, u128);

fn birth_ns(m: &Metadata) -> u128 {
    m.created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

#[cfg(unix)]
fn file_id(m: &Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino(), birth_ns(m))
}

#[cfg(not(unix))]
fn file_id(m: &Metadata) -> FileId {
    (0, 0, birth_ns(m))
}

#[cfg(unix)]
fn is_deleted(f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    f.metadata().map_or(true, |m| m.nlink() == 0)
}

#[cfg(not(unix))]
fn is_deleted(_: &File) -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `auto` before the first line.
    Undecided,
    Plain,
    Cri,
}

/// Joins the pieces of one stream's CRI lines.
#[derive(Debug, Default)]
struct CriJoin {
    buf: LineBuf,
    at_ns: i64,
    truncated: bool,
    started: bool,
}

#[derive(Debug)]
struct FileState {
    path: PathBuf,
    source: Arc<str>,
    source_index: usize,
    file: File,
    id: FileId,
    offset: u64,
    mode: Mode,
    raw: LineBuf,
    cri: [CriJoin; 2],
    grouper: Grouper,
    attr: FileAttribution,
    /// Last time bytes were read.
    last_data_ns: i64,
    /// When the path was first seen missing (renamed away, not deleted).
    missing_since_ns: Option<i64>,
}

/// Per-poll limits and settings, copied out of the config.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_line: usize,
    budget: usize,
    partial_flush_ns: i64,
}

/// Where finished lines go, with what they need to become [`LogLine`]s.
struct Sink<'a> {
    out: &'a mut dyn FnMut(LogLine),
    counters: &'a mut TailCounters,
    grouper: &'a mut Grouper,
    source: &'a Arc<str>,
    source_index: usize,
    attr: &'a FileAttribution,
    now_ns: i64,
}

impl Sink<'_> {
    fn line(&mut self, bytes: &[u8], at_ns: i64, stream: LogStream, truncated: bool) {
        self.counters.lines_read += 1;
        if truncated {
            self.counters.lines_truncated += 1;
        }
        // Validating first is much faster than lossy decoding when the text is valid.
        let text = match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        };
        let entry = Entry::line(text, at_ns, stream, truncated);
        let Sink {
            out,
            counters,
            grouper,
            source,
            source_index,
            attr,
            now_ns,
        } = self;
        grouper.push(entry, *now_ns, &mut |e| {
            counters.records_emitted += 1;
            out(finish(e, source, *source_index, attr));
        });
    }

    fn flush_groups(&mut self, all: bool) {
        let Sink {
            out,
            counters,
            grouper,
            source,
            source_index,
            attr,
            now_ns,
        } = self;
        let mut emit = |e: Entry| {
            counters.records_emitted += 1;
            out(finish(e, source, *source_index, attr));
        };
        if all {
            grouper.flush_all(&mut emit);
        } else {
            grouper.flush_idle(*now_ns, &mut emit);
        }
    }
}

fn finish(e: Entry, source: &Arc<str>, source_index: usize, attr: &FileAttribution) -> LogLine {
    let first = if e.lines > 1 {
        e.text.split('\n').next().unwrap_or("")
    } else {
        e.text.as_str()
    };
    let (rank, local_rank, _) = attr.rank_of(first, e.prefix.as_ref());
    LogLine {
        source: source.clone(),
        source_index,
        job: attr.job.clone(),
        rank,
        local_rank,
        at_ns: e.at_ns,
        stream: e.prefix.and_then(|p| p.stream).unwrap_or(e.stream),
        text: e.text,
        truncated: e.truncated,
        lines: e.lines,
    }
}

/// Decode one framed raw line according to the file's mode.
fn decode(
    mode: &mut Mode,
    cri_joins: &mut [CriJoin; 2],
    sink: &mut Sink<'_>,
    bytes: &[u8],
    truncated: bool,
    max_line: usize,
    plain_stream: LogStream,
) {
    if *mode == Mode::Undecided {
        *mode = if cri::looks_like_record(bytes) {
            Mode::Cri
        } else {
            Mode::Plain
        };
        if *mode == Mode::Plain && bytes.contains(&b'\r') {
            // The first line was framed before we knew to split at `\r`.
            let now = sink.now_ns;
            let mut lb = LineBuf::new();
            lb.push(bytes, max_line, true, &mut |seg, t| {
                sink.line(seg, now, plain_stream, t || truncated);
            });
            lb.end_line(max_line, &mut |seg, t| {
                if !seg.is_empty() {
                    sink.line(seg, now, plain_stream, t || truncated);
                }
            });
            return;
        }
    }
    match *mode {
        Mode::Plain | Mode::Undecided => {
            let (bytes, truncated) = if bytes.len() > max_line {
                (&bytes[..utf8_cut(&bytes[..max_line])], true)
            } else {
                (bytes, truncated)
            };
            let now = sink.now_ns;
            sink.line(bytes, now, plain_stream, truncated);
        }
        Mode::Cri => {
            let Some(rec) = cri::parse_record(bytes) else {
                sink.counters.cri_malformed += 1;
                let now = sink.now_ns;
                let cut = bytes.len().min(max_line);
                sink.line(
                    &bytes[..utf8_cut(&bytes[..cut])],
                    now,
                    plain_stream,
                    truncated || cut < bytes.len(),
                );
                return;
            };
            let idx = usize::from(rec.stream == LogStream::Stderr);
            let CriJoin {
                buf,
                at_ns,
                truncated: join_trunc,
                started,
            } = &mut cri_joins[idx];
            if !*started || !buf.has_partial() {
                // A line that starts in this record has this record's time.
                *at_ns = rec.at_ns;
                *started = true;
            }
            *join_trunc |= truncated;
            buf.push(rec.content, max_line, true, &mut |seg, t| {
                sink.line(seg, *at_ns, rec.stream, t || *join_trunc);
                *at_ns = rec.at_ns;
            });
            if !rec.partial {
                buf.end_line(max_line, &mut |seg, t| {
                    sink.line(seg, *at_ns, rec.stream, t || *join_trunc);
                });
                *started = false;
                *join_trunc = false;
            }
        }
    }
}

impl FileState {
    fn max_raw(&self, max_line: usize) -> usize {
        match self.mode {
            Mode::Plain => max_line,
            Mode::Cri | Mode::Undecided => max_line + CRI_HEADER_BYTES,
        }
    }

    /// Frame and decode freshly read bytes.
    fn feed(
        &mut self,
        data: &[u8],
        lim: Limits,
        counters: &mut TailCounters,
        out: &mut dyn FnMut(LogLine),
        now_ns: i64,
    ) {
        let mut data = data;
        while !data.is_empty() {
            // Until the format is known, frame one line at a time.
            let (chunk, rest) = if self.mode == Mode::Undecided {
                match data.iter().position(|&b| b == b'\n') {
                    Some(i) => data.split_at(i + 1),
                    None => (data, &[][..]),
                }
            } else {
                (data, &[][..])
            };
            data = rest;
            let max_raw = self.max_raw(lim.max_line);
            let split_cr = self.mode == Mode::Plain;
            let plain_stream = self.attr.stream;
            let FileState {
                source,
                source_index,
                mode,
                raw,
                cri,
                grouper,
                attr,
                ..
            } = self;
            let mut sink = Sink {
                out,
                counters,
                grouper,
                source,
                source_index: *source_index,
                attr,
                now_ns,
            };
            raw.push(chunk, max_raw, split_cr, &mut |bytes, t| {
                decode(mode, cri, &mut sink, bytes, t, lim.max_line, plain_stream);
            });
        }
    }

    /// Emit held partial lines (the file went quiet, or is being closed); with `all`,
    /// open tracebacks too.
    fn flush(
        &mut self,
        lim: Limits,
        counters: &mut TailCounters,
        out: &mut dyn FnMut(LogLine),
        now_ns: i64,
        all: bool,
    ) {
        let plain_stream = self.attr.stream;
        let FileState {
            source,
            source_index,
            mode,
            raw,
            cri,
            grouper,
            attr,
            ..
        } = self;
        let mut sink = Sink {
            out,
            counters,
            grouper,
            source,
            source_index: *source_index,
            attr,
            now_ns,
        };
        let mut flushed = raw.flush_partial(&mut |bytes, t| {
            decode(mode, cri, &mut sink, bytes, t, lim.max_line, plain_stream);
        });
        for (idx, j) in cri.iter_mut().enumerate() {
            let stream = if idx == 0 {
                LogStream::Stdout
            } else {
                LogStream::Stderr
            };
            let at = j.at_ns;
            let trunc = j.truncated;
            flushed |= j.buf.flush_partial(&mut |seg, t| {
                sink.line(seg, at, stream, t || trunc);
            });
            j.started = false;
            j.truncated = false;
        }
        if flushed {
            sink.counters.partial_flushes += 1;
        }
        sink.flush_groups(all);
    }
}

/// What to do with a file after serving it.
enum Outcome {
    Keep,
    /// Close it; remember its offset (false for a deleted file).
    Close {
        remember: bool,
    },
    /// Its path now names another file: close it and open that one from the start.
    Reopen,
    /// It was closed and nothing took its place in the list.
    Removed,
}

/// Follows the files of a [`TailConfig`].
#[derive(Debug)]
pub struct Tailer {
    cfg: TailConfig,
    files: Vec<FileState>,
    /// Closed files by identity, with the offset reached.
    remembered: FxHashMap<FileId, u64>,
    remembered_order: VecDeque<FileId>,
    /// When the globs are next expanded; `None` before the first expansion.
    next_scan_ns: Option<i64>,
    buf: Vec<u8>,
    counters: TailCounters,
    /// Records finished outside a poll (a file evicted during a rescan).
    pending: Vec<LogLine>,
}

impl Tailer {
    /// A tailer for `cfg`; every problem with it reported at once.
    pub fn new(cfg: TailConfig) -> Result<Self, ConfigError> {
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems));
        }
        Ok(Tailer {
            cfg,
            files: Vec::new(),
            remembered: FxHashMap::default(),
            remembered_order: VecDeque::new(),
            next_scan_ns: None,
            buf: vec![0; CHUNK_BYTES],
            counters: TailCounters::default(),
            pending: Vec::new(),
        })
    }

    /// The config it runs with.
    pub fn config(&self) -> &TailConfig {
        &self.cfg
    }

    /// The self-metrics so far.
    pub fn counters(&self) -> TailCounters {
        self.counters
    }

    /// Bytes held in line and traceback buffers now (partial lines, CRI pieces, open
    /// tracebacks): bounded by the limits whatever the files contain.
    pub fn buffered_bytes(&self) -> usize {
        self.files
            .iter()
            .map(|f| {
                f.raw.held() + f.cri.iter().map(|j| j.buf.held()).sum::<usize>() + f.grouper.held()
            })
            .sum()
    }

    /// Paths of the files open now.
    pub fn open_files(&self) -> Vec<&Path> {
        self.files.iter().map(|f| f.path.as_path()).collect()
    }

    fn limits(&self) -> Limits {
        Limits {
            max_line: self.cfg.max_line_bytes,
            budget: self.cfg.read_bytes_per_poll,
            partial_flush_ns: ms_to_ns(self.cfg.partial_flush_ms),
        }
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            enabled: self.cfg.multiline.enabled,
            max_lines: self.cfg.multiline.max_lines,
            max_bytes: self.cfg.multiline.max_bytes,
            flush_ns: ms_to_ns(self.cfg.multiline.flush_ms),
        }
    }

    /// Do one round of work at `now_ns` (agent clock): expand the globs when due, read
    /// what the files gained (bounded per file), handle rotation, and append finished
    /// records to `out`.
    pub fn poll(&mut self, now_ns: i64, out: &mut Vec<LogLine>) {
        self.poll_with(now_ns, &mut |line| out.push(line));
    }

    /// [`Tailer::poll`], handing each record to `out` as soon as it is finished, while
    /// its text is still in cache.
    pub fn poll_with(&mut self, now_ns: i64, out: &mut dyn FnMut(LogLine)) {
        if self.next_scan_ns.is_none_or(|t| now_ns >= t) {
            self.rescan(now_ns);
        }
        for line in self.pending.drain(..) {
            out(line);
        }
        let lim = self.limits();
        let mut i = 0;
        while i < self.files.len() {
            let mut outcome = self.serve(i, lim, now_ns, out);
            if matches!(outcome, Outcome::Reopen) {
                outcome = self.reopen(i, lim, now_ns, out);
            }
            match outcome {
                Outcome::Keep | Outcome::Reopen => i += 1,
                Outcome::Removed => {}
                Outcome::Close { remember } => {
                    let fs = self.files.remove(i);
                    self.close(fs, lim, now_ns, out, remember);
                }
            }
        }
        self.counters.files_open = self.files.len() as u64;
    }

    /// Emit everything held: partial lines and open tracebacks of every file (before
    /// shutting down).
    pub fn flush(&mut self, now_ns: i64, out: &mut dyn FnMut(LogLine)) {
        for line in self.pending.drain(..) {
            out(line);
        }
        let lim = self.limits();
        for fs in &mut self.files {
            fs.flush(lim, &mut self.counters, out, now_ns, true);
        }
    }

    /// Expand the globs now (the next expansion is then `rescan_interval_ms` away).
    pub fn rescan(&mut self, now_ns: i64) {
        let first = self.next_scan_ns.is_none();
        self.next_scan_ns = Some(now_ns.saturating_add(ms_to_ns(self.cfg.rescan_interval_ms)));
        let patterns: Vec<(usize, String)> = self
            .cfg
            .sources
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.paths.iter().map(move |p| (i, p.clone())))
            .collect();
        for (si, pattern) in patterns {
            let paths = match glob::glob(&pattern) {
                Ok(p) => p,
                Err(e) => {
                    self.counters.scan_errors += 1;
                    tracing::debug!(pattern, error = %e, "log glob failed");
                    continue;
                }
            };
            for entry in paths {
                match entry {
                    Ok(path) => self.consider(path, si, first, now_ns),
                    Err(e) => {
                        self.counters.scan_errors += 1;
                        tracing::debug!(pattern, error = %e, "log glob entry unreadable");
                    }
                }
            }
        }
        self.counters.files_open = self.files.len() as u64;
    }

    /// A path a glob matched: open it if it is new or has grown.
    fn consider(&mut self, path: PathBuf, si: usize, first: bool, now_ns: i64) {
        if self.files.iter().any(|f| f.path == path) {
            return;
        }
        let Ok(meta) = fs::metadata(&path) else {
            return;
        };
        if !meta.is_file() {
            return;
        }
        let id = file_id(&meta);
        if self.files.iter().any(|f| f.id == id) {
            return;
        }
        let size = meta.len();
        let start = if let Some(&off) = self.remembered.get(&id) {
            match size.cmp(&off) {
                std::cmp::Ordering::Equal => return,
                std::cmp::Ordering::Greater => off,
                std::cmp::Ordering::Less => 0,
            }
        } else if first && self.cfg.start_at == StartAt::End {
            if self.files.len() >= self.cfg.max_open_files {
                // Present at start-up: later growth is read, the past is not.
                self.remember(id, size);
                return;
            }
            size
        } else {
            0
        };
        if self.files.len() >= self.cfg.max_open_files {
            self.evict(now_ns);
        }
        let skip_partial = first && self.cfg.start_at == StartAt::End && start == size;
        match self.open(&path, si, start, skip_partial, now_ns) {
            Ok(fs) => {
                self.remembered.remove(&fs.id);
                self.files.push(fs);
            }
            Err(e) => {
                self.counters.read_errors += 1;
                tracing::debug!(path = %path.display(), error = %e, "cannot open log file");
            }
        }
    }

    fn evict(&mut self, now_ns: i64) {
        let Some(i) = self
            .files
            .iter()
            .enumerate()
            .min_by_key(|(_, f)| f.last_data_ns)
            .map(|(i, _)| i)
        else {
            return;
        };
        let lim = self.limits();
        let fs = self.files.remove(i);
        self.counters.files_evicted += 1;
        // A scan has no output at hand: what the flush finishes goes out next poll.
        let mut pending = std::mem::take(&mut self.pending);
        self.close(fs, lim, now_ns, &mut |line| pending.push(line), true);
        self.pending = pending;
    }

    fn open(
        &mut self,
        path: &Path,
        si: usize,
        start: u64,
        skip_partial: bool,
        now_ns: i64,
    ) -> std::io::Result<FileState> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let id = file_id(&meta);
        let start = start.min(meta.len());
        let mut raw = LineBuf::new();
        if start > 0 && skip_partial {
            // Starting mid-file: skip to the end of the line we start in, unless we are
            // already at a line start.
            file.seek(SeekFrom::Start(start - 1))?;
            let mut b = [0u8; 1];
            let n = file.read(&mut b)?;
            if n == 1 && b[0] != b'\n' {
                raw.skip_to_line_end();
            }
        }
        file.seek(SeekFrom::Start(start))?;
        let path_str = path.to_string_lossy();
        let source_cfg = &self.cfg.sources[si];
        let mode = match source_cfg.format {
            Format::Plain => Mode::Plain,
            Format::Cri => Mode::Cri,
            Format::Auto if cri::is_container_log_dir(&path_str) => Mode::Cri,
            Format::Auto => Mode::Undecided,
        };
        let attr = FileAttribution::for_path(&path_str, source_cfg);
        self.counters.files_opened += 1;
        tracing::debug!(path = %path.display(), offset = start, "following log file");
        Ok(FileState {
            path: path.to_path_buf(),
            source: Arc::from(path_str.as_ref()),
            source_index: si,
            file,
            id,
            offset: start,
            mode,
            raw,
            cri: [CriJoin::default(), CriJoin::default()],
            grouper: Grouper::new(self.bounds()),
            attr,
            last_data_ns: now_ns,
            missing_since_ns: None,
        })
    }

    fn close(
        &mut self,
        mut fs: FileState,
        lim: Limits,
        now_ns: i64,
        out: &mut dyn FnMut(LogLine),
        remember: bool,
    ) {
        fs.flush(lim, &mut self.counters, out, now_ns, true);
        if remember {
            self.remember(fs.id, fs.offset);
        }
        self.counters.files_closed += 1;
        tracing::debug!(path = %fs.path.display(), offset = fs.offset, "closed log file");
    }

    fn remember(&mut self, id: FileId, offset: u64) {
        if self.remembered.insert(id, offset).is_none() {
            self.remembered_order.push_back(id);
        }
        while self.remembered.len() > MAX_REMEMBERED {
            match self.remembered_order.pop_front() {
                Some(old) => {
                    self.remembered.remove(&old);
                }
                None => break,
            }
        }
    }

    /// The file at index `i` was rotated by rename: close it, open what its path names
    /// now from the beginning, and serve that in the same poll.
    fn reopen(
        &mut self,
        i: usize,
        lim: Limits,
        now_ns: i64,
        out: &mut dyn FnMut(LogLine),
    ) -> Outcome {
        let old = self.files.remove(i);
        let (path, si) = (old.path.clone(), old.source_index);
        self.close(old, lim, now_ns, out, true);
        self.counters.rotations += 1;
        tracing::debug!(path = %path.display(), "log file rotated");
        match self.open(&path, si, 0, false, now_ns) {
            Ok(fs) => {
                self.remembered.remove(&fs.id);
                self.files.insert(i, fs);
                match self.serve(i, lim, now_ns, out) {
                    // Rotated again already: leave it for the next poll.
                    Outcome::Reopen => Outcome::Keep,
                    o => o,
                }
            }
            Err(e) => {
                self.counters.read_errors += 1;
                tracing::debug!(path = %path.display(), error = %e, "cannot open rotated log file");
                // The next rescan finds the file.
                Outcome::Removed
            }
        }
    }

    /// Read what file `i` gained, check for rotation, flush on idle.
    fn serve(
        &mut self,
        i: usize,
        lim: Limits,
        now_ns: i64,
        out: &mut dyn FnMut(LogLine),
    ) -> Outcome {
        let Tailer {
            files,
            buf,
            counters,
            ..
        } = self;
        let fs = &mut files[i];
        let mut budget = lim.budget;
        let mut eof = false;
        let mut truncated_once = false;
        loop {
            while budget > 0 {
                let want = budget.min(buf.len());
                match fs.file.read(&mut buf[..want]) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        counters.bytes_read += n as u64;
                        fs.offset += n as u64;
                        budget -= n;
                        fs.last_data_ns = now_ns;
                        fs.missing_since_ns = None;
                        fs.feed(&buf[..n], lim, counters, out, now_ns);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        counters.read_errors += 1;
                        tracing::debug!(path = %fs.path.display(), error = %e, "log read failed");
                        return Outcome::Close { remember: true };
                    }
                }
            }
            if !eof || truncated_once {
                break;
            }
            // At the end: was the file truncated under us (copytruncate)?
            match fs.file.metadata() {
                Ok(m) if m.len() < fs.offset => {
                    fs.flush(lim, counters, out, now_ns, false);
                    fs.raw.reset();
                    if let Err(e) = fs.file.seek(SeekFrom::Start(0)) {
                        counters.read_errors += 1;
                        tracing::debug!(path = %fs.path.display(), error = %e, "log seek failed");
                        return Outcome::Close { remember: false };
                    }
                    fs.offset = 0;
                    counters.rotations += 1;
                    counters.truncations += 1;
                    tracing::debug!(path = %fs.path.display(), "log file truncated");
                    truncated_once = true;
                    eof = false;
                }
                _ => break,
            }
        }
        if eof {
            match fs::metadata(&fs.path) {
                Ok(m) if file_id(&m) == fs.id => fs.missing_since_ns = None,
                Ok(_) => return Outcome::Reopen,
                Err(_) => {
                    if is_deleted(&fs.file) {
                        return Outcome::Close { remember: false };
                    }
                    let since = *fs.missing_since_ns.get_or_insert(now_ns);
                    if now_ns.saturating_sub(since) >= ORPHAN_GRACE_NS {
                        return Outcome::Close { remember: true };
                    }
                }
            }
        }
        if now_ns.saturating_sub(fs.last_data_ns) >= lim.partial_flush_ns {
            fs.flush(lim, counters, out, now_ns, false);
        } else if fs.grouper.is_open() {
            let FileState {
                source,
                source_index,
                grouper,
                attr,
                ..
            } = fs;
            let mut sink = Sink {
                out,
                counters,
                grouper,
                source,
                source_index: *source_index,
                attr,
                now_ns,
            };
            sink.flush_groups(false);
        }
        Outcome::Keep
    }
}

fn ms_to_ns(ms: u64) -> i64 {
    i64::try_from(ms)
        .unwrap_or(i64::MAX / 1_000_000)
        .saturating_mul(1_000_000)
}
