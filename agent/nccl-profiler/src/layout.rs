//! The one definition of the shared-memory segment's layout: `repr(C)` structs whose
//! field offsets are the byte offsets in the file, read by [`crate::segment`] and
//! written by the plugin. Native byte order (the reader runs on the same machine).
//!
//! ```text
//! offset  size    what
//! 0       256     Header      identity of the process and communicator, written once
//! 256     128     Counters    u64 event counters
//! 384     264     coll        Progress: last started / enqueued / completed collective
//! 648     264     p2p         Progress: the same for point-to-point operations
//! 912     22528   ring        RING_LEN Records of recent events, oldest overwritten
//! 23440   1024    links       LINK_SLOTS Links: per-peer send-step network time (v2)
//! 24464           end; the file is SEGMENT_SIZE (24576) bytes (rounded up to pages)
//! ```
//!
//! Version 1 ended at 23440 (no link table; the file was already 24576 bytes, zeros
//! after the ring); version 2 added the link table in that spare space and took the
//! first reserved counter for `link_overflow`. The reader accepts both.
//!
//! Every [`Record`] is guarded by its first and last words, `head` and `tail`. A writer
//! claims the record by moving `tail` from `head` to `head + 1`, writes the fields, and
//! publishes by setting `head` to the same value. A copy of the record (made front to
//! back, as `read(2)` of the file does) is consistent when `head == tail != 0`; a copy
//! taken while a write is under way has `head != tail` and is retried.
//!
//! A [`Link`] is not a record: its words are cumulative counters, each changed by its
//! own atomic add (the key once, by compare-exchange from 0), so a copy may count a
//! step in `send_steps` whose bytes or time are not added yet. Readers use differences
//! over intervals much longer than one step.
#![deny(unsafe_code)]

use std::mem::{offset_of, size_of};

/// First bytes of every segment.
pub const MAGIC: [u8; 8] = *b"WRDNNCCL";
/// Version of this layout, written by the plugin.
pub const LAYOUT_VERSION: u32 = 2;
/// The oldest layout version the reader accepts (1: no link table).
pub const MIN_LAYOUT_VERSION: u32 = 1;
/// Entries in the ring of recent events.
pub const RING_LEN: usize = 256;
/// Bytes of the job id field (NUL-padded, truncated at a UTF-8 boundary).
pub const JOB_ID_LEN: usize = 64;
/// Bytes of the communicator name field (NUL-padded, truncated).
pub const COMM_NAME_LEN: usize = 64;
/// Entries in the table of network links (peers this rank sends to), version 2.
pub const LINK_SLOTS: usize = 32;

/// [`Header::state`]: the plugin is recording.
pub const STATE_LIVE: u32 = 1;
/// [`Header::state`]: the communicator was finalized; the file is about to disappear.
pub const STATE_FINISHED: u32 = 2;

/// Written once at init, before `magic`; `state` and `finished_ns` change at finalize.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Header {
    /// [`MAGIC`], written last at init.
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// Bytes of the segment file.
    pub segment_size: u32,
    /// [`RING_LEN`].
    pub ring_len: u32,
    /// Which exported struct NCCL loaded: 4, 5 or 6.
    pub abi_version: u32,
    /// Process id, in the job's pid namespace.
    pub pid: i32,
    /// Global rank from RANK / OMPI_COMM_WORLD_RANK / SLURM_PROCID; -1 if unknown.
    pub global_rank: i32,
    /// Local rank from LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID; -1.
    pub local_rank: i32,
    /// World size from WORLD_SIZE / OMPI_COMM_WORLD_SIZE / SLURM_NTASKS; -1.
    pub world_size: i32,
    /// Ranks in the communicator.
    pub nranks: i32,
    /// This process's rank in the communicator.
    pub comm_rank: i32,
    /// Nodes the communicator spans.
    pub n_nodes: i32,
    /// The activation mask the plugin asked NCCL for.
    pub event_mask: u32,
    /// NCCL's communicator hash (`commHash` / `commId`).
    pub comm_hash: u64,
    /// CLOCK_REALTIME at init, ns since the Unix epoch.
    pub start_ns: i64,
    /// Inode of `/proc/self/ns/pid`: tells the agent whether `pid` is in its namespace.
    pub pid_ns: u64,
    /// Field 22 of `/proc/self/stat` (start time in clock ticks after boot): tells a
    /// reused pid from this process.
    pub proc_start_ticks: u64,
    /// [`STATE_LIVE`] or [`STATE_FINISHED`].
    pub state: u32,
    pub _reserved0: u32,
    /// CLOCK_REALTIME at finalize, 0 before.
    pub finished_ns: i64,
    pub _reserved: [u64; 3],
    /// Job id from WARDEN_JOB, SLURM_JOB_ID or TORCHELASTIC_RUN_ID.
    pub job_id: [u8; JOB_ID_LEN],
    /// The communicator's name as the application gave it, if any.
    pub comm_name: [u8; COMM_NAME_LEN],
}

/// Event counters, each a u64 written with atomic adds.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Counters {
    /// Collectives started; the last one's sequence number.
    pub coll_started: u64,
    /// Collectives whose completion was observed (child events all stopped).
    pub coll_completed: u64,
    /// Point-to-point operations started; the last one's sequence number.
    pub p2p_started: u64,
    /// Point-to-point operations whose completion was observed.
    pub p2p_completed: u64,
    /// ProxyOp and KernelCh events attributed to a collective or p2p operation.
    pub child_events: u64,
    /// ProxyOp events posted by another process (PXN), not attributed.
    pub foreign_events: u64,
    /// Events of a type this plugin does not know.
    pub unknown_events: u64,
    /// Collectives or p2p operations not recorded because every slot was busy.
    pub dropped_events: u64,
    /// Record writes given up because another writer held the record too long.
    pub dropped_writes: u64,
    /// Events written to the ring so far; the next one goes to `ring_head % RING_LEN`.
    pub ring_head: u64,
    /// ProxyStep timing (mask `proxystep`) lost: send steps whose peer found no free
    /// [`Link`] entry (or had no valid rank), and send ProxyOps that got no step record
    /// because the pool was exhausted. Version 2; reserved (0) in version 1.
    pub link_overflow: u64,
    pub _reserved: [u64; 5],
}

/// One event, or the latest of a kind. See the module docs for `head`/`tail`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// Number of the last finished write; equals `tail` when no write is under way.
    pub head: u64,
    /// Ring entries: 1-based event number (order of writing). 0 elsewhere.
    pub serial: u64,
    /// The plugin's sequence number within the communicator, 1, 2, … (collectives and
    /// p2p operations count separately).
    pub seq: u64,
    /// Collectives: NCCL's own `seqNumber` (per collective function). P2p: the
    /// operation's number among this rank's operations with the same peer in the same
    /// direction, 1, 2, … (a sender's n-th send to a peer is that peer's n-th receive
    /// from it); 0 when the plugin could not count it.
    pub nccl_seq: u64,
    /// Payload: count × datatype size; 0 when the datatype is unknown.
    pub bytes: u64,
    /// Start event, CLOCK_REALTIME ns.
    pub start_ns: i64,
    /// Stop event (NCCL enqueued the work), CLOCK_REALTIME ns; 0 before.
    pub enqueued_ns: i64,
    /// Completion (last child event stopped), CLOCK_REALTIME ns; 0 before.
    pub end_ns: i64,
    /// This rank's own network time: first ProxyOp start to last ProxyOp stop, ns;
    /// 0 without proxy events.
    pub xfer_ns: u64,
    /// Packed: kind (bits 0–7), op (8–15), phase (16–23), channels (24–31), peer or
    /// root (32–63, i32). See [`Info`].
    pub info: u64,
    /// Claimed-write number; see the module docs.
    pub tail: u64,
}

/// Last started, enqueued and completed operation of one kind.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub started: Record,
    pub enqueued: Record,
    pub completed: Record,
}

/// Cumulative network time of this rank's send steps to one peer (mask `proxystep`):
/// for each ProxyStep of a send ProxyOp to the peer that reached SendWait (data handed
/// to the network), the time from SendWait to the step's stop (the network said done).
/// Each word is a counter of its own, changed with atomic adds (see the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Link {
    /// The peer's rank in the communicator plus 1; 0 while the entry is free. Claimed
    /// once with compare-exchange, never changed after.
    pub peer_key: u64,
    /// Send steps timed.
    pub send_steps: u64,
    /// Bytes those steps sent (NCCL's `transSize`).
    pub send_bytes: u64,
    /// Sum of their SendWait-to-stop times, ns (CLOCK_MONOTONIC).
    pub send_ns: u64,
}

/// The whole segment.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub header: Header,
    pub counters: Counters,
    pub coll: Progress,
    pub p2p: Progress,
    pub ring: [Record; RING_LEN],
    pub links: [Link; LINK_SLOTS],
}

/// Bytes of the segment file: [`Segment`] rounded up to 4 KiB pages.
pub const SEGMENT_SIZE: usize = size_of::<Segment>().div_ceil(4096) * 4096;

/// Bytes a version-1 segment needs (it ended with the ring).
pub const SEGMENT_V1_END: usize = off::LINKS;

/// Byte offsets in the file.
pub mod off {
    use super::*;

    pub const HEADER: usize = offset_of!(Segment, header);
    pub const COUNTERS: usize = offset_of!(Segment, counters);
    pub const COLL: usize = offset_of!(Segment, coll);
    pub const P2P: usize = offset_of!(Segment, p2p);
    pub const RING: usize = offset_of!(Segment, ring);
    pub const LINKS: usize = offset_of!(Segment, links);

    pub const MAGIC: usize = HEADER + offset_of!(Header, magic);
    pub const STATE: usize = HEADER + offset_of!(Header, state);
    pub const FINISHED_NS: usize = HEADER + offset_of!(Header, finished_ns);

    /// Offset of the last started (`which` = 0), enqueued (1) or completed (2) record
    /// of the progress block at `progress`.
    pub const fn progress_record(progress: usize, which: usize) -> usize {
        progress + which * size_of::<Record>()
    }

    /// Offset of ring entry `i` (taken modulo [`RING_LEN`]).
    pub const fn ring_entry(i: u64) -> usize {
        RING + (i % RING_LEN as u64) as usize * size_of::<Record>()
    }

    /// Offset of link table entry `i` (taken modulo [`LINK_SLOTS`]).
    pub const fn link_entry(i: usize) -> usize {
        LINKS + (i % LINK_SLOTS) * size_of::<Link>()
    }

    /// Field offsets within a [`Link`].
    pub const L_KEY: usize = offset_of!(Link, peer_key);
    pub const L_STEPS: usize = offset_of!(Link, send_steps);
    pub const L_BYTES: usize = offset_of!(Link, send_bytes);
    pub const L_NS: usize = offset_of!(Link, send_ns);

    /// Offset of a counter, from its field offset in [`Counters`].
    pub const fn counter(field: usize) -> usize {
        COUNTERS + field
    }

    pub const C_COLL_STARTED: usize = counter(offset_of!(Counters, coll_started));
    pub const C_COLL_COMPLETED: usize = counter(offset_of!(Counters, coll_completed));
    pub const C_P2P_STARTED: usize = counter(offset_of!(Counters, p2p_started));
    pub const C_P2P_COMPLETED: usize = counter(offset_of!(Counters, p2p_completed));
    pub const C_CHILD: usize = counter(offset_of!(Counters, child_events));
    pub const C_FOREIGN: usize = counter(offset_of!(Counters, foreign_events));
    pub const C_UNKNOWN: usize = counter(offset_of!(Counters, unknown_events));
    pub const C_DROPPED_EVENTS: usize = counter(offset_of!(Counters, dropped_events));
    pub const C_DROPPED_WRITES: usize = counter(offset_of!(Counters, dropped_writes));
    pub const C_RING_HEAD: usize = counter(offset_of!(Counters, ring_head));
    pub const C_LINK_OVERFLOW: usize = counter(offset_of!(Counters, link_overflow));

    /// Field offsets within a [`Record`].
    pub const R_HEAD: usize = offset_of!(Record, head);
    pub const R_SERIAL: usize = offset_of!(Record, serial);
    pub const R_SEQ: usize = offset_of!(Record, seq);
    pub const R_NCCL_SEQ: usize = offset_of!(Record, nccl_seq);
    pub const R_BYTES: usize = offset_of!(Record, bytes);
    pub const R_START: usize = offset_of!(Record, start_ns);
    pub const R_ENQUEUED: usize = offset_of!(Record, enqueued_ns);
    pub const R_END: usize = offset_of!(Record, end_ns);
    pub const R_XFER: usize = offset_of!(Record, xfer_ns);
    pub const R_INFO: usize = offset_of!(Record, info);
    pub const R_TAIL: usize = offset_of!(Record, tail);
}

/// Which record of a [`Progress`] block.
pub const STARTED: usize = 0;
/// See [`STARTED`].
pub const ENQUEUED: usize = 1;
/// See [`STARTED`].
pub const COMPLETED: usize = 2;

/// [`Record::info`]'s kind: a collective.
pub const KIND_COLL: u8 = 1;
/// [`Record::info`]'s kind: a point-to-point operation.
pub const KIND_P2P: u8 = 2;

/// [`Record::info`]'s phase: the start event.
pub const PHASE_STARTED: u8 = 1;
/// [`Record::info`]'s phase: the stop event (NCCL enqueued the work).
pub const PHASE_ENQUEUED: u8 = 2;
/// [`Record::info`]'s phase: completion observed.
pub const PHASE_COMPLETED: u8 = 3;

/// Operation codes in [`Record::info`]. 0–9 are the numbers of `warden_model`'s
/// `CollOp`, so the agent converts by number; 11 and 12 have no wire name yet.
pub mod op {
    pub const UNKNOWN: u8 = 0;
    pub const ALL_REDUCE: u8 = 1;
    pub const ALL_GATHER: u8 = 2;
    pub const REDUCE_SCATTER: u8 = 3;
    pub const BROADCAST: u8 = 4;
    pub const REDUCE: u8 = 5;
    pub const ALL_TO_ALL: u8 = 6;
    pub const SEND: u8 = 7;
    pub const RECV: u8 = 8;
    pub const SEND_RECV: u8 = 9;
    pub const GATHER: u8 = 11;
    pub const SCATTER: u8 = 12;

    /// The code of NCCL's function name (`ncclFuncToString`), compared exactly.
    pub fn from_func(name: &[u8]) -> u8 {
        match name {
            b"AllReduce" => ALL_REDUCE,
            b"AllGather" => ALL_GATHER,
            b"ReduceScatter" => REDUCE_SCATTER,
            b"Broadcast" => BROADCAST,
            b"Reduce" => REDUCE,
            b"AlltoAll" | b"AllToAll" => ALL_TO_ALL,
            b"Send" => SEND,
            b"Recv" => RECV,
            b"SendRecv" => SEND_RECV,
            b"Gather" => GATHER,
            b"Scatter" => SCATTER,
            _ => UNKNOWN,
        }
    }
}

/// Bytes per element of NCCL's datatype name (`ncclDatatypeToString`); 0 if unknown.
pub fn datatype_size(name: &[u8]) -> u64 {
    match name {
        b"ncclInt8" | b"ncclUint8" | b"ncclFloat8e4m3" | b"ncclFloat8e5m2" => 1,
        b"ncclFloat16" | b"ncclBfloat16" => 2,
        b"ncclInt32" | b"ncclUint32" | b"ncclFloat32" => 4,
        b"ncclInt64" | b"ncclUint64" | b"ncclFloat64" => 8,
        _ => 0,
    }
}

/// The fields packed into [`Record::info`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// [`KIND_COLL`] or [`KIND_P2P`].
    pub kind: u8,
    /// An [`op`] code.
    pub op: u8,
    /// [`PHASE_STARTED`], [`PHASE_ENQUEUED`] or [`PHASE_COMPLETED`].
    pub phase: u8,
    /// Channels NCCL uses for the operation.
    pub channels: u8,
    /// Root of a rooted collective, peer of a p2p operation.
    pub peer: i32,
}

impl Info {
    /// The packed form.
    pub const fn pack(self) -> u64 {
        self.kind as u64
            | (self.op as u64) << 8
            | (self.phase as u64) << 16
            | (self.channels as u64) << 24
            | (self.peer as u32 as u64) << 32
    }

    /// From the packed form.
    pub const fn unpack(v: u64) -> Info {
        Info {
            kind: v as u8,
            op: (v >> 8) as u8,
            phase: (v >> 16) as u8,
            channels: (v >> 24) as u8,
            peer: (v >> 32) as u32 as i32,
        }
    }

    /// The same with another phase.
    pub const fn with_phase(self, phase: u8) -> Info {
        Info { phase, ..self }
    }
}

// The layout is part of the contract with the agent: changing any of these numbers
// needs a new LAYOUT_VERSION.
const _: () = {
    assert!(size_of::<Header>() == 256);
    assert!(size_of::<Counters>() == 128);
    assert!(size_of::<Record>() == 88);
    assert!(size_of::<Progress>() == 264);
    assert!(off::COUNTERS == 256);
    assert!(off::COLL == 384);
    assert!(off::P2P == 648);
    assert!(off::RING == 912);
    assert!(off::LINKS == 912 + RING_LEN * 88);
    assert!(off::LINKS == 23440 && SEGMENT_V1_END == 23440);
    assert!(size_of::<Link>() == 32);
    assert!(size_of::<Segment>() == 23440 + LINK_SLOTS * 32);
    assert!(SEGMENT_SIZE == 24576);
    assert!(offset_of!(Counters, link_overflow) == 80);
    assert!(off::C_LINK_OVERFLOW == 336);
    assert!(off::L_KEY == 0 && off::L_STEPS == 8 && off::L_BYTES == 16 && off::L_NS == 24);
    assert!(off::R_HEAD == 0);
    assert!(off::R_TAIL == 80);
    assert!(offset_of!(Header, job_id) == 128);
    assert!(offset_of!(Header, comm_name) == 192);
    assert!(offset_of!(Header, state) == 88);
    // Every u64 the writer touches atomically is 8-byte aligned.
    assert!(
        off::COUNTERS.is_multiple_of(8)
            && off::COLL.is_multiple_of(8)
            && off::RING.is_multiple_of(8)
            && off::LINKS.is_multiple_of(8)
    );
    assert!(off::STATE.is_multiple_of(4) && off::FINISHED_NS.is_multiple_of(8));
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_table_sits_after_the_ring_inside_the_same_file_size() {
        assert_eq!(off::LINKS, 23440);
        assert_eq!(off::link_entry(0), 23440);
        assert_eq!(off::link_entry(1), 23472);
        assert_eq!(off::link_entry(LINK_SLOTS - 1), 23440 + 31 * 32);
        assert_eq!(off::link_entry(LINK_SLOTS), off::link_entry(0));
        assert_eq!(off::link_entry(LINK_SLOTS - 1) + size_of::<Link>(), 24464);
        assert_eq!(SEGMENT_SIZE, 24576);
        assert_eq!(off::C_LINK_OVERFLOW, 256 + 80);
        assert_eq!(off::C_RING_HEAD + 8, off::C_LINK_OVERFLOW);
        assert_eq!(LAYOUT_VERSION, 2);
    }

    #[test]
    fn info_round_trips_negative_peers_and_every_byte() {
        let info = Info {
            kind: KIND_P2P,
            op: op::RECV,
            phase: PHASE_COMPLETED,
            channels: 255,
            peer: -1,
        };
        assert_eq!(Info::unpack(info.pack()), info);
        let info = Info {
            peer: i32::MAX,
            ..info
        };
        assert_eq!(Info::unpack(info.pack()), info);
    }

    #[test]
    fn nccl_names_map_to_codes_and_sizes() {
        assert_eq!(op::from_func(b"AllReduce"), op::ALL_REDUCE);
        assert_eq!(op::from_func(b"AlltoAll"), op::ALL_TO_ALL);
        assert_eq!(op::from_func(b"allreduce"), op::UNKNOWN);
        assert_eq!(op::from_func(b""), op::UNKNOWN);
        assert_eq!(datatype_size(b"ncclBfloat16"), 2);
        assert_eq!(datatype_size(b"ncclFloat64"), 8);
        assert_eq!(datatype_size(b"Unknown"), 0);
    }
}
