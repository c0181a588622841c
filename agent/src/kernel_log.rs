//! The kernel-log collector: reads `/dev/kmsg` records (or follows a dmesg/syslog text
//! file), recognises hardware events with [`kmsg::parse_line`], folds repeats per boot
//! with [`Deduper`] and hands out the [`NodeEvent`]s to ship. Work per poll is bounded,
//! and so is memory, however many lines the kernel prints.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use warden_model::wire::NodeEvent;

use crate::dedup::Deduper;
use crate::kmsg::{self, KernelEvent};

/// Longest kernel record or line read, bytes (longer ones are cut).
const MAX_RECORD: usize = 8192;

/// What one [`KernelLog::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Lines (records) read.
    pub lines: u64,
    /// Lines recognised as events (first sightings and repeats).
    pub recognised: u64,
    /// Records the kernel overwrote before they were read (`/dev/kmsg` only).
    pub lost: u64,
}

/// Where kernel lines come from.
enum Source {
    /// `/dev/kmsg`: one record per read, non-blocking; `boot_wall_ns` turns the
    /// record's microseconds since boot into wall time.
    Kmsg { file: File, boot_wall_ns: i64 },
    /// A text stream (dmesg output, syslog file, test input), followed as it grows.
    Text {
        reader: Box<dyn Read + Send>,
        buf: Vec<u8>,
        /// Unread bytes at the head of `buf`.
        len: usize,
        /// Inside an overlong line whose head was handled.
        skipping: bool,
    },
}

/// The kernel-log collector.
pub struct KernelLog {
    source: Source,
    dedup: Deduper,
    path: PathBuf,
    /// Total lines read since start.
    pub lines_total: u64,
    /// Total recognised lines since start.
    pub recognised_total: u64,
    /// Recognised lines per XID code since start, for the per-code counters.
    xid_seen: Vec<(u32, Option<u32>, u64)>,
}

impl std::fmt::Debug for KernelLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelLog")
            .field("path", &self.path)
            .field("lines_total", &self.lines_total)
            .finish_non_exhaustive()
    }
}

/// This boot's id, from `path` (`/proc/sys/kernel/random/boot_id`).
pub fn read_boot_id(path: &Path) -> io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

/// Wall-clock time of boot, ns since the Unix epoch, from `/proc/uptime`.
fn boot_wall_ns(now_ns: i64) -> i64 {
    let uptime_s = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    now_ns - (uptime_s * 1e9) as i64
}

/// An opened kernel log, not yet read: what [`KernelSource::open`] returns before the
/// agent gives up the capability the open may have needed (`crate::privilege`).
pub struct KernelSource {
    source: Source,
    path: PathBuf,
}

impl std::fmt::Debug for KernelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelSource")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl KernelSource {
    /// Open `path`: `/dev/kmsg` (or any character device speaking its record protocol)
    /// is read from the oldest record the kernel still holds; any other file is a text
    /// log followed from its start.
    pub fn open(path: &Path, now_ns: i64) -> io::Result<KernelSource> {
        let meta = std::fs::metadata(path)?;
        let source = if std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type()) {
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)?;
            Source::Kmsg {
                file,
                boot_wall_ns: boot_wall_ns(now_ns),
            }
        } else {
            text_source(Box::new(File::open(path)?))
        };
        Ok(KernelSource {
            source,
            path: path.to_owned(),
        })
    }
}

/// A text source over `reader`.
fn text_source(reader: Box<dyn Read + Send>) -> Source {
    Source::Text {
        reader,
        buf: vec![0; 64 << 10],
        len: 0,
        skipping: false,
    }
}

impl KernelLog {
    /// Open `path` (see [`KernelSource::open`]) and read it with `dedup`.
    pub fn open(path: &Path, dedup: Deduper, now_ns: i64) -> io::Result<KernelLog> {
        Ok(Self::new(KernelSource::open(path, now_ns)?, dedup))
    }

    /// A collector over an opened source.
    pub fn new(opened: KernelSource, dedup: Deduper) -> KernelLog {
        KernelLog {
            source: opened.source,
            dedup,
            path: opened.path,
            lines_total: 0,
            recognised_total: 0,
            xid_seen: Vec::new(),
        }
    }

    /// A collector over a text stream (tests, dmesg output piped in).
    pub fn from_reader(reader: Box<dyn Read + Send>, dedup: Deduper, name: PathBuf) -> KernelLog {
        Self::new(
            KernelSource {
                source: text_source(reader),
                path: name,
            },
            dedup,
        )
    }

    /// The deduper (to update its GPU map, or read its counters).
    pub fn dedup_mut(&mut self) -> &mut Deduper {
        &mut self.dedup
    }

    /// Sightings per (XID code, GPU index) since start, for per-code counters.
    pub fn xid_counts(&self) -> &[(u32, Option<u32>, u64)] {
        &self.xid_seen
    }

    /// Read what is available, at most `max_lines` lines, at agent time `now_ns`;
    /// first sightings go to `out`.
    pub fn poll(
        &mut self,
        now_ns: i64,
        max_lines: usize,
        out: &mut Vec<NodeEvent>,
    ) -> io::Result<PollStats> {
        let mut stats = PollStats::default();
        let KernelLog {
            source,
            dedup,
            xid_seen,
            ..
        } = self;
        let mut handle = |line: &str, at_ns: i64, stats: &mut PollStats| {
            stats.lines += 1;
            if let Some(ev) = kmsg::parse_line(line) {
                stats.recognised += 1;
                count_xid(xid_seen, dedup, &ev);
                if let Some(e) = dedup.observe(&ev, at_ns) {
                    out.push(e);
                }
            }
        };
        match source {
            Source::Kmsg { file, boot_wall_ns } => {
                let mut rec = [0u8; MAX_RECORD];
                while (stats.lines as usize) < max_lines {
                    match file.read(&mut rec) {
                        Ok(0) => break,
                        Ok(n) => {
                            let text = String::from_utf8_lossy(&rec[..n]);
                            // Continuation lines (` KEY=value`) follow the message.
                            let first = text.split('\n').next().unwrap_or_default();
                            handle(
                                first,
                                record_at_ns(first, *boot_wall_ns, now_ns),
                                &mut stats,
                            );
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // The ring overwrote records before we read them; the next read
                        // goes on from the oldest one left.
                        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => stats.lost += 1,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Source::Text {
                reader,
                buf,
                len,
                skipping,
            } => {
                // `buf[..len]` holds the unread tail of the last read.
                while (stats.lines as usize) < max_lines {
                    let n = match reader.read(&mut buf[*len..]) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    let end = *len + n;
                    let mut start = 0;
                    while let Some(nl) = buf[start..end].iter().position(|&c| c == b'\n') {
                        if !*skipping {
                            let line = String::from_utf8_lossy(&buf[start..start + nl]);
                            handle(&line, now_ns, &mut stats);
                        }
                        *skipping = false;
                        start += nl + 1;
                    }
                    if end - start >= MAX_RECORD {
                        // An overlong line: keep its head, skip the rest.
                        if !*skipping {
                            let head = String::from_utf8_lossy(&buf[start..end]);
                            handle(&head, now_ns, &mut stats);
                        }
                        *skipping = true;
                        start = end;
                    }
                    buf.copy_within(start..end, 0);
                    *len = end - start;
                }
            }
        }
        self.lines_total += stats.lines;
        self.recognised_total += stats.recognised;
        Ok(stats)
    }

    /// Events whose repeat count grew since the last call (same ids, larger counts).
    pub fn drain_counts(&mut self) -> Vec<NodeEvent> {
        self.dedup.drain_counts()
    }
}

fn count_xid(seen: &mut Vec<(u32, Option<u32>, u64)>, dedup: &Deduper, ev: &KernelEvent) {
    let Some(code) = ev.code else { return };
    let gpu = ev.pci_bus_id.as_deref().and_then(|p| dedup.gpu_index(p));
    if let Some(slot) = seen.iter_mut().find(|(c, g, _)| *c == code && *g == gpu) {
        slot.2 += 1;
    } else if seen.len() < 4096 {
        // Codes and GPUs are few; the bound keeps a corrupt log from growing it.
        seen.push((code, gpu, 1));
    }
}

/// Wall time of a `/dev/kmsg` record (`pri,seq,usec,flags;msg`), ns: boot time plus the
/// record's microseconds since boot, never later than `now_ns` (the time of the read
/// when the header has no time, or one too large for an `i64` of nanoseconds).
#[doc(hidden)]
pub fn record_at_ns(rec: &str, boot_wall_ns: i64, now_ns: i64) -> i64 {
    record_usec(rec)
        .and_then(|us| i64::try_from(us).ok()?.checked_mul(1000))
        .and_then(|ns| ns.checked_add(boot_wall_ns))
        .map_or(now_ns, |at| at.min(now_ns))
}

/// Microseconds since boot of a `/dev/kmsg` record (`pri,seq,usec,flags;msg`).
fn record_usec(rec: &str) -> Option<u64> {
    let head = rec.split_once(';')?.0;
    head.split(',').nth(2)?.parse().ok()
}
