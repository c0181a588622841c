//! Reading a segment: safe Rust over copies of the file's bytes, for the agent.
//!
//! A record's `head == tail` in one copy is not enough to trust it: `read(2)` copies
//! with `rep movsb` and the like, which may load the bytes of a record in any order,
//! so a copy can pair an old head and tail with a field a writer just changed. A record
//! is trusted when it is consistent and byte-identical in two copies read one after the
//! other: if the first copy held a field of a newer write, that write had claimed the
//! record (moved `tail`) before, so the second copy shows the new `tail` and differs.
//!
//! [`parse`] reads one copy and checks `head == tail` only (for tests and for a writer
//! known to be stopped); [`parse_confirmed`] checks two copies; [`read_retrying`] reads
//! copies until every record is confirmed or the attempts run out, and then reports
//! what was confirmed.
//!
//! The link table (layout version 2, [`Snapshot::links`]) is cumulative counters, not
//! records: it is taken from the final copy as it is. Version-1 segments (no table)
//! read with no links.
#![deny(unsafe_code)]

use std::mem::{offset_of, size_of};

use crate::layout::{
    self, COMM_NAME_LEN, Counters as RawCounters, Header, Info, JOB_ID_LEN, LAYOUT_VERSION,
    LINK_SLOTS, MAGIC, MIN_LAYOUT_VERSION, RING_LEN, off,
};

/// Why bytes are not a segment (yet).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// Shorter than the layout needs.
    #[error("segment too short: {len} bytes, need {need}")]
    TooShort { len: usize, need: usize },
    /// The magic is zero: the plugin is still writing the header.
    #[error("segment not initialised yet")]
    NotReady,
    /// Not a Warden segment.
    #[error("not a Warden NCCL segment (bad magic)")]
    BadMagic,
    /// Written by a plugin with another layout.
    #[error(
        "segment layout version {found}, this reader knows {MIN_LAYOUT_VERSION} to {LAYOUT_VERSION}"
    )]
    Version { found: u32 },
    /// The header contradicts itself.
    #[error("segment header is inconsistent: {0}")]
    Header(&'static str),
}

/// Collective or point-to-point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Coll,
    P2p,
    Other(u8),
}

/// Which event a record stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The start event: the rank entered the operation.
    Started,
    /// The stop event: NCCL enqueued the work (not completion).
    Enqueued,
    /// The last child event stopped: the work completed on this rank.
    Completed,
    Other(u8),
}

/// One decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Ring entries: order of writing, from 1. 0 for the "last" records.
    pub serial: u64,
    pub kind: Kind,
    pub phase: Phase,
    /// Sequence number within the communicator (collectives and p2p separately).
    pub seq: u64,
    /// Collectives: NCCL's own per-function sequence number. P2p: the number among
    /// this rank's operations with the same peer in the same direction, from 1 (0:
    /// not counted).
    pub nccl_seq: u64,
    /// Operation code (`layout::op`; 0–9 are `warden_model`'s `CollOp` numbers).
    pub op: u8,
    /// count × datatype size; 0 if the datatype was unknown.
    pub bytes: u64,
    /// CLOCK_REALTIME ns of the start event.
    pub start_ns: i64,
    /// CLOCK_REALTIME ns of the stop event (enqueued); 0 if not yet.
    pub enqueued_ns: i64,
    /// CLOCK_REALTIME ns of completion; 0 if not observed.
    pub end_ns: i64,
    /// This rank's own network time (ProxyOp span), ns; 0 if none.
    pub xfer_ns: u64,
    pub channels: u8,
    /// Root of a rooted collective, peer of a p2p operation.
    pub peer: i32,
}

/// The last started, enqueued and completed operation of one kind; `None` until there
/// is one (or when its record was torn in every copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub started: Option<Event>,
    pub enqueued: Option<Event>,
    pub completed: Option<Event>,
}

/// The counters block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub coll_started: u64,
    pub coll_completed: u64,
    pub p2p_started: u64,
    pub p2p_completed: u64,
    pub child_events: u64,
    pub foreign_events: u64,
    pub unknown_events: u64,
    pub dropped_events: u64,
    pub dropped_writes: u64,
    pub ring_head: u64,
    /// ProxyStep timing lost: send steps whose peer found no free link entry, and send
    /// ProxyOps that got no step record (pool exhausted). 0 in version-1 segments.
    pub link_overflow: u64,
}

/// Cumulative network time of this rank's send steps to one peer, since the
/// communicator's init (mask `proxystep`; see `layout::Link`). `busy_ns / bytes` is
/// the time per byte on this rank's edge to `peer`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkTotals {
    /// The peer's rank in the communicator.
    pub peer: u32,
    /// Send steps timed.
    pub steps: u64,
    /// Bytes they sent.
    pub bytes: u64,
    /// Sum of their SendWait-to-stop times, ns.
    pub busy_ns: u64,
}

/// Everything a segment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub abi_version: u32,
    pub pid: u32,
    pub global_rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub job: String,
    pub comm_hash: u64,
    pub comm_name: String,
    pub nranks: u32,
    pub comm_rank: u32,
    pub n_nodes: u32,
    pub event_mask: u32,
    pub start_ns: i64,
    pub pid_ns: u64,
    pub proc_start_ticks: u64,
    /// The communicator was finalized.
    pub finished: bool,
    pub finished_ns: i64,
    pub counters: Counters,
    pub coll: Progress,
    pub p2p: Progress,
    /// Recent events, oldest first (consistent entries only).
    pub recent: Vec<Event>,
    /// Per-peer send-step network time, in table order (claimed entries only; empty
    /// without mask `proxystep` and in version-1 segments).
    pub links: Vec<LinkTotals>,
    /// Records the (final) copy could not confirm: a write was under way. "Last"
    /// records may still be filled from an earlier confirmed copy by [`read_retrying`].
    pub torn: u32,
}

impl Snapshot {
    /// Whether completion events have been seen on this communicator: without child
    /// events (ProxyOp, KernelCh) only starts and enqueues are known.
    pub fn completion_observed(&self) -> bool {
        self.counters.child_events > 0
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(a)
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    u32_at(b, at) as i32
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    u64_at(b, at) as i64
}

fn opt(v: i32) -> Option<u32> {
    u32::try_from(v).ok()
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A record: `Ok(None)` never written, `Err(())` torn (or different in `earlier`).
fn record(b: &[u8], earlier: Option<&[u8]>, at: usize) -> Result<Option<Event>, ()> {
    let span = at..at + size_of::<layout::Record>();
    if earlier.is_some_and(|e| e.get(span.clone()) != Some(&b[span])) {
        return Err(());
    }
    let head = u64_at(b, at + off::R_HEAD);
    let tail = u64_at(b, at + off::R_TAIL);
    if head != tail {
        return Err(());
    }
    if head == 0 {
        return Ok(None);
    }
    let info = Info::unpack(u64_at(b, at + off::R_INFO));
    Ok(Some(Event {
        serial: u64_at(b, at + off::R_SERIAL),
        kind: match info.kind {
            layout::KIND_COLL => Kind::Coll,
            layout::KIND_P2P => Kind::P2p,
            k => Kind::Other(k),
        },
        phase: match info.phase {
            layout::PHASE_STARTED => Phase::Started,
            layout::PHASE_ENQUEUED => Phase::Enqueued,
            layout::PHASE_COMPLETED => Phase::Completed,
            p => Phase::Other(p),
        },
        seq: u64_at(b, at + off::R_SEQ),
        nccl_seq: u64_at(b, at + off::R_NCCL_SEQ),
        op: info.op,
        bytes: u64_at(b, at + off::R_BYTES),
        start_ns: i64_at(b, at + off::R_START),
        enqueued_ns: i64_at(b, at + off::R_ENQUEUED),
        end_ns: i64_at(b, at + off::R_END),
        xfer_ns: u64_at(b, at + off::R_XFER),
        channels: info.channels,
        peer: info.peer,
    }))
}

/// Parse one copy of a segment file, trusting every record with `head == tail`.
pub fn parse(bytes: &[u8]) -> Result<Snapshot, SegmentError> {
    parse_with(bytes, None)
}

/// Parse the `later` of two copies read one after the other, trusting only records
/// that are consistent and identical in both; the others count as torn.
pub fn parse_confirmed(earlier: &[u8], later: &[u8]) -> Result<Snapshot, SegmentError> {
    parse_with(later, Some(earlier))
}

fn parse_with(bytes: &[u8], earlier: Option<&[u8]>) -> Result<Snapshot, SegmentError> {
    let need = size_of::<layout::Segment>();
    if bytes.len() < size_of::<Header>() {
        return Err(SegmentError::TooShort {
            len: bytes.len(),
            need,
        });
    }
    let h = off::HEADER;
    let magic = &bytes[off::MAGIC..off::MAGIC + 8];
    if magic == [0; 8] {
        return Err(SegmentError::NotReady);
    }
    if magic != MAGIC {
        return Err(SegmentError::BadMagic);
    }
    let version = u32_at(bytes, h + offset_of!(Header, layout_version));
    if !(MIN_LAYOUT_VERSION..=LAYOUT_VERSION).contains(&version) {
        return Err(SegmentError::Version { found: version });
    }
    let has_links = version >= 2;
    let need = if has_links {
        need
    } else {
        layout::SEGMENT_V1_END
    };
    if bytes.len() < need {
        return Err(SegmentError::TooShort {
            len: bytes.len(),
            need,
        });
    }
    if u32_at(bytes, h + offset_of!(Header, ring_len)) as usize != RING_LEN {
        return Err(SegmentError::Header("ring length"));
    }
    let field_u32 = |f: usize| u32_at(bytes, h + f);
    let field_i32 = |f: usize| i32_at(bytes, h + f);
    let c = |f: usize| u64_at(bytes, off::COUNTERS + f);
    let counters = Counters {
        coll_started: c(offset_of!(RawCounters, coll_started)),
        coll_completed: c(offset_of!(RawCounters, coll_completed)),
        p2p_started: c(offset_of!(RawCounters, p2p_started)),
        p2p_completed: c(offset_of!(RawCounters, p2p_completed)),
        child_events: c(offset_of!(RawCounters, child_events)),
        foreign_events: c(offset_of!(RawCounters, foreign_events)),
        unknown_events: c(offset_of!(RawCounters, unknown_events)),
        dropped_events: c(offset_of!(RawCounters, dropped_events)),
        dropped_writes: c(offset_of!(RawCounters, dropped_writes)),
        ring_head: c(offset_of!(RawCounters, ring_head)),
        link_overflow: if has_links {
            c(offset_of!(RawCounters, link_overflow))
        } else {
            0
        },
    };
    let links = if has_links { links(bytes) } else { Vec::new() };
    let mut torn = 0;
    let mut take = |at: usize| {
        record(bytes, earlier, at).unwrap_or_else(|()| {
            torn += 1;
            None
        })
    };
    let mut progress = |base: usize| Progress {
        started: take(off::progress_record(base, layout::STARTED)),
        enqueued: take(off::progress_record(base, layout::ENQUEUED)),
        completed: take(off::progress_record(base, layout::COMPLETED)),
    };
    let coll = progress(off::COLL);
    let p2p = progress(off::P2P);
    let mut recent: Vec<Event> = (0..RING_LEN as u64)
        .filter_map(|i| take(off::ring_entry(i)))
        .collect();
    recent.sort_by_key(|e| e.serial);
    Ok(Snapshot {
        abi_version: field_u32(offset_of!(Header, abi_version)),
        pid: field_u32(offset_of!(Header, pid)),
        global_rank: opt(field_i32(offset_of!(Header, global_rank))),
        local_rank: opt(field_i32(offset_of!(Header, local_rank))),
        world_size: opt(field_i32(offset_of!(Header, world_size))),
        job: text(&bytes[h + offset_of!(Header, job_id)..][..JOB_ID_LEN]),
        comm_hash: u64_at(bytes, h + offset_of!(Header, comm_hash)),
        comm_name: text(&bytes[h + offset_of!(Header, comm_name)..][..COMM_NAME_LEN]),
        nranks: field_i32(offset_of!(Header, nranks)).max(0) as u32,
        comm_rank: field_i32(offset_of!(Header, comm_rank)).max(0) as u32,
        n_nodes: field_i32(offset_of!(Header, n_nodes)).max(0) as u32,
        event_mask: field_u32(offset_of!(Header, event_mask)),
        start_ns: i64_at(bytes, h + offset_of!(Header, start_ns)),
        pid_ns: u64_at(bytes, h + offset_of!(Header, pid_ns)),
        proc_start_ticks: u64_at(bytes, h + offset_of!(Header, proc_start_ticks)),
        finished: field_u32(offset_of!(Header, state)) == layout::STATE_FINISHED,
        finished_ns: i64_at(bytes, h + offset_of!(Header, finished_ns)),
        counters,
        coll,
        p2p,
        recent,
        links,
        torn,
    })
}

/// The claimed entries of the link table; an entry whose key is not a rank + 1 (a
/// corrupt file) is left out.
fn links(b: &[u8]) -> Vec<LinkTotals> {
    (0..LINK_SLOTS)
        .filter_map(|i| {
            let at = off::link_entry(i);
            let key = u64_at(b, at + off::L_KEY);
            let peer = u32::try_from(key.checked_sub(1)?).ok()?;
            Some(LinkTotals {
                peer,
                steps: u64_at(b, at + off::L_STEPS),
                bytes: u64_at(b, at + off::L_BYTES),
                busy_ns: u64_at(b, at + off::L_NS),
            })
        })
        .collect()
}

/// Copies [`read_retrying`] makes at most.
pub const READ_ATTEMPTS: usize = 5;

/// Read copies with `read` (e.g. `|| std::fs::read(path)`), at most `attempts`, until
/// every record is confirmed by two consecutive copies. A "last" record that never
/// was is taken from the newest earlier pair that confirmed it; ring entries only from
/// the final pair. An error of `read` is the outer error; a parse error is returned
/// when no pair parsed.
pub fn read_retrying<E>(
    mut read: impl FnMut() -> Result<Vec<u8>, E>,
    attempts: usize,
) -> Result<Result<Snapshot, SegmentError>, E> {
    let mut prev = read()?;
    if let Err(e) = parse(&prev) {
        return Ok(Err(e));
    }
    let mut best: Option<Snapshot> = None;
    for _ in 1..attempts.max(2) {
        let cur = read()?;
        match parse_confirmed(&prev, &cur) {
            Ok(snap) => {
                let snap = match best.take() {
                    Some(older) => fill(snap, &older),
                    None => snap,
                };
                if snap.torn == 0 {
                    return Ok(Ok(snap));
                }
                best = Some(snap);
            }
            Err(e) if best.is_none() => return Ok(Err(e)),
            Err(_) => break,
        }
        prev = cur;
    }
    Ok(best.ok_or(SegmentError::NotReady))
}

/// `snap` with its missing "last" records taken from `prev`.
fn fill(mut snap: Snapshot, prev: &Snapshot) -> Snapshot {
    for (now, before) in [(&mut snap.coll, &prev.coll), (&mut snap.p2p, &prev.p2p)] {
        now.started = now.started.or(before.started);
        now.enqueued = now.enqueued.or(before.enqueued);
        now.completed = now.completed.or(before.completed);
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> Vec<u8> {
        let mut b = vec![0u8; layout::SEGMENT_SIZE];
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
        b[offset_of!(Header, layout_version)..][..4].copy_from_slice(&LAYOUT_VERSION.to_ne_bytes());
        b[offset_of!(Header, ring_len)..][..4].copy_from_slice(&(RING_LEN as u32).to_ne_bytes());
        b[offset_of!(Header, global_rank)..][..4].copy_from_slice(&(-1i32).to_ne_bytes());
        b
    }

    fn put(b: &mut [u8], at: usize, head: u64, tail: u64, seq: u64) {
        b[at + off::R_HEAD..][..8].copy_from_slice(&head.to_ne_bytes());
        b[at + off::R_TAIL..][..8].copy_from_slice(&tail.to_ne_bytes());
        b[at + off::R_SEQ..][..8].copy_from_slice(&seq.to_ne_bytes());
        let info = Info {
            kind: layout::KIND_COLL,
            op: layout::op::ALL_REDUCE,
            phase: layout::PHASE_STARTED,
            channels: 2,
            peer: -1,
        };
        b[at + off::R_INFO..][..8].copy_from_slice(&info.pack().to_ne_bytes());
    }

    #[test]
    fn header_errors_are_told_apart() {
        assert!(matches!(
            parse(&[0; 10]),
            Err(SegmentError::TooShort { .. })
        ));
        let mut b = blank();
        b[0..8].copy_from_slice(&[0; 8]);
        assert_eq!(parse(&b), Err(SegmentError::NotReady));
        b[0..8].copy_from_slice(b"NOTWRDN!");
        assert_eq!(parse(&b), Err(SegmentError::BadMagic));
        let mut b = blank();
        b[8..12].copy_from_slice(&99u32.to_ne_bytes());
        assert_eq!(parse(&b), Err(SegmentError::Version { found: 99 }));
        let b = blank();
        assert!(matches!(
            parse(&b[..1000]),
            Err(SegmentError::TooShort { .. })
        ));
    }

    #[test]
    fn empty_segment_has_no_records_and_unknown_rank() {
        let s = parse(&blank()).expect("parses");
        assert_eq!(s.global_rank, None);
        assert_eq!(s.coll, Progress::default());
        assert!(s.recent.is_empty());
        assert_eq!(s.torn, 0);
    }

    #[test]
    fn a_record_mid_write_is_left_out_and_counted() {
        let mut b = blank();
        put(
            &mut b,
            off::progress_record(off::COLL, layout::STARTED),
            5,
            5,
            9,
        );
        put(
            &mut b,
            off::progress_record(off::COLL, layout::COMPLETED),
            3,
            4,
            8,
        );
        let s = parse(&b).expect("parses");
        assert_eq!(s.coll.started.map(|e| e.seq), Some(9));
        assert_eq!(s.coll.started.map(|e| e.peer), Some(-1));
        assert_eq!(s.coll.completed, None);
        assert_eq!(s.torn, 1);
    }

    #[test]
    fn a_record_that_differs_between_copies_is_not_trusted() {
        let at = off::progress_record(off::COLL, layout::STARTED);
        let mut first = blank();
        put(&mut first, at, 5, 5, 9);
        let mut second = blank();
        put(&mut second, at, 5, 5, 10);
        let s = parse_confirmed(&first, &second).expect("parses");
        assert_eq!(s.coll.started, None);
        assert_eq!(s.torn, 1);
        let s = parse_confirmed(&second, &second).expect("parses");
        assert_eq!(s.coll.started.map(|e| e.seq), Some(10));
        assert_eq!(s.torn, 0);
    }

    #[test]
    fn retrying_keeps_records_confirmed_by_earlier_pairs() {
        let started = off::progress_record(off::COLL, layout::STARTED);
        let completed = off::progress_record(off::COLL, layout::COMPLETED);
        let mut a = blank();
        put(&mut a, completed, 3, 3, 8);
        put(&mut a, started, 4, 5, 9);
        let mut b = a.clone();
        put(&mut b, started, 5, 5, 9);
        let mut c = b.clone();
        put(&mut c, completed, 3, 4, 9);
        // Pair (a, b): completed confirmed, started not. Pair (b, c): the reverse.
        let mut copies = vec![a, b, c].into_iter();
        let s = read_retrying(|| copies.next().ok_or("no more copies"), 3)
            .expect("reads")
            .expect("parses");
        assert_eq!(s.coll.started.map(|e| e.seq), Some(9));
        assert_eq!(s.coll.completed.map(|e| e.seq), Some(8));
        assert_eq!(s.torn, 1, "torn counts what the final pair did not confirm");
    }

    fn put_link(b: &mut [u8], i: usize, key: u64, steps: u64, bytes: u64, ns: u64) {
        let at = off::link_entry(i);
        for (f, v) in [
            (off::L_KEY, key),
            (off::L_STEPS, steps),
            (off::L_BYTES, bytes),
            (off::L_NS, ns),
        ] {
            b[at + f..][..8].copy_from_slice(&v.to_ne_bytes());
        }
    }

    #[test]
    fn claimed_link_entries_come_back_by_peer() {
        let mut b = blank();
        put_link(&mut b, 3, 4, 10, 40960, 7000);
        put_link(&mut b, 0, 1, 2, 8192, 900);
        // A key that is no rank + 1: left out, no panic.
        put_link(&mut b, 5, u64::MAX, 1, 1, 1);
        b[off::C_LINK_OVERFLOW..][..8].copy_from_slice(&6u64.to_ne_bytes());
        let s = parse(&b).expect("parses");
        assert_eq!(
            s.links,
            vec![
                LinkTotals {
                    peer: 0,
                    steps: 2,
                    bytes: 8192,
                    busy_ns: 900
                },
                LinkTotals {
                    peer: 3,
                    steps: 10,
                    bytes: 40960,
                    busy_ns: 7000
                },
            ]
        );
        assert_eq!(s.counters.link_overflow, 6);
        let s = parse_confirmed(&b, &b).expect("parses");
        assert_eq!(s.links.len(), 2);
        let s = read_retrying(|| Ok::<_, ()>(b.clone()), READ_ATTEMPTS)
            .expect("reads")
            .expect("parses");
        assert_eq!(s.links.len(), 2);
        assert!(parse(&blank()).expect("parses").links.is_empty());
    }

    #[test]
    fn version_1_segments_read_with_no_links() {
        let mut b = blank();
        b[offset_of!(Header, layout_version)..][..4].copy_from_slice(&1u32.to_ne_bytes());
        // Whatever lies after the ring of a version-1 file is not a link table.
        put_link(&mut b, 0, 1, 2, 3, 4);
        b[off::C_LINK_OVERFLOW..][..8].copy_from_slice(&6u64.to_ne_bytes());
        put(
            &mut b,
            off::progress_record(off::COLL, layout::STARTED),
            1,
            1,
            4,
        );
        let s = parse(&b).expect("a version-1 segment parses");
        assert!(s.links.is_empty());
        assert_eq!(s.counters.link_overflow, 0);
        assert_eq!(s.coll.started.map(|e| e.seq), Some(4));
        // A version-1 file needs only what version 1 had.
        let s = parse(&b[..layout::SEGMENT_V1_END]).expect("short version-1 file parses");
        assert!(s.links.is_empty());
        assert!(matches!(
            parse(&b[..layout::SEGMENT_V1_END - 1]),
            Err(SegmentError::TooShort { .. })
        ));
        // Version 2 needs the table.
        let v2 = blank();
        assert!(matches!(
            parse(&v2[..layout::SEGMENT_V1_END]),
            Err(SegmentError::TooShort { .. })
        ));
        for bad in [0u32, LAYOUT_VERSION + 1] {
            b[offset_of!(Header, layout_version)..][..4].copy_from_slice(&bad.to_ne_bytes());
            assert_eq!(parse(&b), Err(SegmentError::Version { found: bad }));
        }
    }

    #[test]
    fn ring_entries_come_back_oldest_first() {
        let mut b = blank();
        for (i, serial) in [(3u64, 260u64), (4, 261), (5, 6)] {
            let at = off::ring_entry(i);
            put(&mut b, at, 1, 1, serial);
            b[at + off::R_SERIAL..][..8].copy_from_slice(&serial.to_ne_bytes());
        }
        let s = parse(&b).expect("parses");
        let serials: Vec<u64> = s.recent.iter().map(|e| e.serial).collect();
        assert_eq!(serials, vec![6, 260, 261]);
    }
}
