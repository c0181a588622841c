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
#![deny(unsafe_code)]

use std::mem::{offset_of, size_of};

use crate::layout::{
    self, COMM_NAME_LEN, Counters as RawCounters, Header, Info, JOB_ID_LEN, LAYOUT_VERSION, MAGIC,
    RING_LEN, off,
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
    #[error("segment layout version {found}, this reader knows {LAYOUT_VERSION}")]
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
    if version != LAYOUT_VERSION {
        return Err(SegmentError::Version { found: version });
    }
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
    };
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
        torn,
    })
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
