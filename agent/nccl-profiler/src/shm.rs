//! The writing side: a communicator's context (its mapped segment and its pool of event
//! slots), segment files, and lock-free record writes.
//!
//! The mapping of a context is never unmapped while the process lives: finalize maps
//! anonymous memory over the same addresses (`MAP_FIXED` replaces a mapping in one
//! step), so a stray late event can never touch unmapped memory, and the next init that
//! reuses the context maps its new file over the same addresses again. Contexts are kept
//! in a process-wide free list for that reuse; they are never freed.
//!
//! With mask `proxystep`, each send ProxyOp also gets an [`OpRecord`] from a pool of
//! the context (made at init, also never freed) that times its steps: SendWait is
//! stamped into the record, and the step's stop adds the step, its bytes and the time
//! since SendWait to the segment's entry for the op's peer (`layout::Link`).

use std::ffi::c_void;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering, fence,
};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::abi::{event, state};
use crate::config::Config;
use crate::layout::{self, Info, LINK_SLOTS, SEGMENT_SIZE, off};

/// Event slots per communicator. A slot stays with its operation until the operation's
/// stop event and all its child events are done, and is handed out again only after
/// all other slots were (round robin), so a child event that arrives late still finds
/// its parent. When all are busy, the operation is not recorded (counted).
pub const SLOTS: usize = 512;

/// How many times a writer retries a record another writer holds before giving up on
/// the write (counted). A write takes tens of nanoseconds, so this is never reached
/// unless the other writer was descheduled in the middle.
const WRITE_SPINS: u32 = 64;

/// How many slots a start event looks at before it gives up.
const SLOT_PROBES: u32 = 8;

/// Entries in a communicator's table of point-to-point directions (peer, send or
/// receive), each with its own count of operations. A communicator with more
/// directions than this (an all-to-all over more than 128 ranks) records the rest with
/// no count (0), which the agent does not report.
pub const PAIRS: usize = 256;

/// Step records per communicator (mask `proxystep`): one per send ProxyOp in flight,
/// from its start to its stop, handed out round robin. When the 8 looked at in a row
/// are busy, the op runs without step timing (counted in `link_overflow`).
pub const OP_RECORDS: usize = 512;

/// How many step records a ProxyOp start looks at before it gives up.
const OP_PROBES: u32 = 8;

/// Steps of one ProxyOp in flight at once: NCCL's `NCCL_STEPS`. NCCL keeps a step's
/// handle at `step % NCCL_STEPS`, and so does an [`OpRecord`] its timing.
pub const STEP_SLOTS: usize = 8;

/// [`OpRecord::link`]: the peer's link entry is not looked up yet.
const LINK_UNRESOLVED: u32 = u32::MAX;
/// [`OpRecord::link`]: the peer found no entry (table full, or no valid rank).
const LINK_NONE: u32 = u32::MAX - 1;

/// Why a segment could not be made; the communicator then runs without the plugin.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("segment directory {dir} is not there (create it to enable Warden's NCCL profiler)")]
    MissingDir { dir: PathBuf },
    #[error("segment directory {dir}: {source}")]
    Dir { dir: PathBuf, source: io::Error },
    #[error("cannot create segment {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot size segment {path}: {source}")]
    Size { path: PathBuf, source: io::Error },
    #[error("cannot map segment {path}: {source}")]
    Map { path: PathBuf, source: io::Error },
}

/// CLOCK_REALTIME in ns since the Unix epoch (through the vDSO: no system call).
#[inline]
#[allow(clippy::unnecessary_cast)] // time_t and c_long are i32 on 32-bit targets
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as i64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as i64)
}

/// CLOCK_MONOTONIC in ns (through the vDSO), for step durations: unlike
/// CLOCK_REALTIME it never steps.
#[inline]
#[allow(clippy::unnecessary_cast)] // time_t and c_long are i32 on 32-bit targets
pub fn mono_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as i64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as i64)
}

/// The mapped bytes of one segment.
#[derive(Debug)]
struct Shm {
    base: *mut u8,
}

// SAFETY: `base` points to SEGMENT_SIZE bytes that stay mapped for the rest of the
// process (see the module docs); every access after init goes through atomics.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

impl Shm {
    #[inline]
    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= SEGMENT_SIZE);
        // SAFETY: `offset` comes from the layout constants: 8-aligned and inside the
        // mapping, which lives as long as `self` (forever; see the module docs). Other
        // threads touch these bytes only through atomics as well.
        unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) }
    }

    #[inline]
    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= SEGMENT_SIZE);
        // SAFETY: as in `u64_at`, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }

    #[inline]
    fn add(&self, counter: usize, n: u64) -> u64 {
        self.u64_at(counter).fetch_add(n, Ordering::Relaxed)
    }

    /// Write `v` into the record at `rec` (see `layout`'s module docs for the protocol).
    /// With `newer_only`, a record holding a higher sequence number is left alone.
    /// Never waits for long: gives up (and counts it) if another writer holds the record.
    #[inline]
    fn write(&self, rec: usize, v: &Values, newer_only: bool) {
        let head = self.u64_at(rec + off::R_HEAD);
        let tail = self.u64_at(rec + off::R_TAIL);
        let mut n = 0;
        for _ in 0..WRITE_SPINS {
            let h = head.load(Ordering::Acquire);
            if tail
                .compare_exchange_weak(h, h.wrapping_add(1), Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                n = h.wrapping_add(1);
                break;
            }
            std::hint::spin_loop();
        }
        if n == 0 {
            self.add(off::C_DROPPED_WRITES, 1);
            return;
        }
        // The claim (tail) becomes visible before any field changes.
        fence(Ordering::Release);
        let seq = self.u64_at(rec + off::R_SEQ);
        if !newer_only || v.seq >= seq.load(Ordering::Relaxed) {
            let r = Ordering::Relaxed;
            self.u64_at(rec + off::R_SERIAL).store(v.serial, r);
            seq.store(v.seq, r);
            self.u64_at(rec + off::R_NCCL_SEQ).store(v.nccl_seq, r);
            self.u64_at(rec + off::R_BYTES).store(v.bytes, r);
            self.u64_at(rec + off::R_START).store(v.start_ns as u64, r);
            self.u64_at(rec + off::R_ENQUEUED)
                .store(v.enqueued_ns as u64, r);
            self.u64_at(rec + off::R_END).store(v.end_ns as u64, r);
            self.u64_at(rec + off::R_XFER).store(v.xfer_ns, r);
            self.u64_at(rec + off::R_INFO).store(v.info.pack(), r);
        }
        head.store(n, Ordering::Release);
    }

    /// The link table entry of `peer` (a communicator rank), claimed if it has none;
    /// `None` when the table is full or `peer` is not a rank.
    #[inline]
    fn link_index(&self, peer: i32) -> Option<u32> {
        let peer = u64::try_from(peer).ok()?;
        let key = peer + 1;
        for n in 0..LINK_SLOTS as u64 {
            let i = ((peer + n) % LINK_SLOTS as u64) as usize;
            let k = self.u64_at(off::link_entry(i) + off::L_KEY);
            let mut held = k.load(Ordering::Relaxed);
            if held == 0 {
                held = match k.compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => key,
                    Err(other) => other,
                };
            }
            if held == key {
                return Some(i as u32);
            }
        }
        None
    }

    /// Add one timed send step to link entry `i`.
    #[inline]
    fn link_add(&self, i: u32, bytes: u64, ns: u64) {
        let at = off::link_entry(i as usize);
        let r = Ordering::Relaxed;
        self.u64_at(at + off::L_BYTES).fetch_add(bytes, r);
        self.u64_at(at + off::L_NS).fetch_add(ns, r);
        self.u64_at(at + off::L_STEPS).fetch_add(1, r);
    }

    /// Append `v` to the ring of recent events.
    #[inline]
    fn ring(&self, v: &Values) {
        let i = self.add(off::C_RING_HEAD, 1);
        let v = Values {
            serial: i.wrapping_add(1),
            ..*v
        };
        self.write(off::ring_entry(i), &v, false);
    }
}

/// The fields of one record write.
#[derive(Clone, Copy, Debug, Default)]
struct Values {
    serial: u64,
    seq: u64,
    nccl_seq: u64,
    bytes: u64,
    start_ns: i64,
    enqueued_ns: i64,
    end_ns: i64,
    xfer_ns: u64,
    info: Info,
}

/// One collective or p2p operation from its start event until it and its children are
/// done. All fields are atomics: the host thread writes the start, proxy threads the
/// children.
#[derive(Debug)]
#[repr(align(64))]
pub struct Slot {
    /// The operation's own reference (until its stop event) plus one per running child.
    refs: AtomicU32,
    /// Children (ProxyOp, KernelCh) started under it.
    children: AtomicU32,
    /// Of those, ProxyOps (this rank's network transfers).
    proxy_children: AtomicU32,
    /// Completion already counted.
    completed: AtomicBool,
    info: AtomicU64,
    seq: AtomicU64,
    nccl_seq: AtomicU64,
    bytes: AtomicU64,
    start_ns: AtomicI64,
    enqueued_ns: AtomicI64,
    proxy_first_ns: AtomicI64,
    proxy_last_ns: AtomicI64,
    last_child_ns: AtomicI64,
    ctx: AtomicPtr<Context>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            refs: AtomicU32::new(0),
            children: AtomicU32::new(0),
            proxy_children: AtomicU32::new(0),
            completed: AtomicBool::new(false),
            info: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            nccl_seq: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            start_ns: AtomicI64::new(0),
            enqueued_ns: AtomicI64::new(0),
            proxy_first_ns: AtomicI64::new(i64::MAX),
            proxy_last_ns: AtomicI64::new(0),
            last_child_ns: AtomicI64::new(0),
            ctx: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The context this slot belongs to.
    #[inline]
    pub fn context(&self) -> &'static Context {
        // SAFETY: set once when the context is built to the context's own address;
        // contexts are leaked (never freed), so the pointer is valid for 'static.
        unsafe { &*self.ctx.load(Ordering::Relaxed) }
    }

    fn values(&self, phase: u8) -> Values {
        let r = Ordering::Relaxed;
        let proxies = self.proxy_children.load(r);
        let xfer_ns = if proxies > 0 {
            (self.proxy_last_ns.load(r) - self.proxy_first_ns.load(r)).max(0) as u64
        } else {
            0
        };
        Values {
            serial: 0,
            seq: self.seq.load(r),
            nccl_seq: self.nccl_seq.load(r),
            bytes: self.bytes.load(r),
            start_ns: self.start_ns.load(r),
            enqueued_ns: self.enqueued_ns.load(r),
            end_ns: if phase == layout::PHASE_COMPLETED {
                self.last_child_ns.load(r)
            } else {
                0
            },
            xfer_ns: if phase == layout::PHASE_COMPLETED {
                xfer_ns
            } else {
                0
            },
            info: Info::unpack(self.info.load(r)).with_phase(phase),
        }
    }
}

/// The step timing of one send ProxyOp (mask `proxystep`), from its start to its stop.
/// Its address (64-byte aligned) is the op's handle, tagged; a step's handle is the same
/// address with the step's index in the tag. One proxy thread drives an op and its
/// steps, but every field is an atomic all the same.
#[derive(Debug)]
#[repr(align(64))]
pub struct OpRecord {
    /// 1 while an op holds the record.
    busy: AtomicU32,
    /// The peer's rank in the communicator.
    peer: AtomicI32,
    /// The peer's link entry, or [`LINK_UNRESOLVED`] / [`LINK_NONE`].
    link: AtomicU32,
    /// The parent operation's slot, for completion (as a plain ProxyOp handle has).
    slot: AtomicPtr<Slot>,
    /// The context this record belongs to (set once).
    ctx: AtomicPtr<Context>,
    /// Per step (`step % STEP_SLOTS`): CLOCK_MONOTONIC at SendWait, 0 before.
    wait_ns: [AtomicI64; STEP_SLOTS],
    /// Per step: bytes SendWait said the step sends.
    bytes: [AtomicU32; STEP_SLOTS],
}

impl OpRecord {
    fn new() -> OpRecord {
        OpRecord {
            busy: AtomicU32::new(0),
            peer: AtomicI32::new(-1),
            link: AtomicU32::new(LINK_UNRESOLVED),
            slot: AtomicPtr::new(ptr::null_mut()),
            ctx: AtomicPtr::new(ptr::null_mut()),
            wait_ns: [const { AtomicI64::new(0) }; STEP_SLOTS],
            bytes: [const { AtomicU32::new(0) }; STEP_SLOTS],
        }
    }

    /// The context this record belongs to.
    #[inline]
    fn context(&self) -> &'static Context {
        // SAFETY: set once, when the pool is made, to its context's address; contexts
        // are leaked (never freed), so the pointer is valid for 'static.
        unsafe { &*self.ctx.load(Ordering::Relaxed) }
    }
}

/// What a start event of a collective or p2p operation says.
#[derive(Clone, Copy, Debug)]
pub struct TaskStart {
    pub kind: u8,
    pub op: u8,
    pub nccl_seq: u64,
    pub bytes: u64,
    pub channels: u8,
    pub peer: i32,
}

/// Who a communicator is, from NCCL's init arguments.
#[derive(Clone, Debug)]
pub struct CommIdentity {
    pub comm_hash: u64,
    pub name: String,
    pub n_nodes: i32,
    pub nranks: i32,
    pub rank: i32,
    pub abi_version: u32,
    pub event_mask: u64,
}

/// One communicator's state in this process.
#[derive(Debug)]
pub struct Context {
    shm: Shm,
    slots: Box<[Slot]>,
    next_slot: AtomicU32,
    /// Point-to-point directions: key `(peer << 1 | receive) + 1`, 0 when free.
    pair_keys: Box<[AtomicU64]>,
    /// Operations so far in the direction of the same index of `pair_keys`.
    pair_counts: Box<[AtomicU64]>,
    /// Send steps are timed (mask `proxystep`) for the current communicator.
    steps: AtomicBool,
    /// Step records, made at the first init that asks for `proxystep`.
    ops: OnceLock<Box<[OpRecord]>>,
    next_op: AtomicU32,
    live: AtomicBool,
    /// The segment file while live.
    path: Mutex<Option<PathBuf>>,
}

/// Contexts of finalized communicators, for reuse, and the files of live ones (names
/// must not collide within the process).
struct Registry {
    free: Vec<&'static Context>,
    live_paths: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    free: Vec::new(),
    live_paths: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Context {
    /// Whether the communicator is live (not finalized).
    #[inline]
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Whether `p` is the address of one of this context's slots.
    #[inline]
    pub fn owns(&self, p: *const c_void) -> bool {
        let start = self.slots.as_ptr() as usize;
        let end = start + self.slots.len() * size_of::<Slot>();
        let a = p as usize;
        a >= start && a < end && (a - start).is_multiple_of(size_of::<Slot>())
    }

    /// Whether send steps are timed (mask `proxystep`).
    #[inline]
    pub fn steps_enabled(&self) -> bool {
        self.steps.load(Ordering::Relaxed)
    }

    /// Whether `p` is the address of one of this context's step records.
    #[inline]
    pub fn owns_op(&self, p: *const c_void) -> bool {
        let Some(ops) = self.ops.get() else {
            return false;
        };
        let start = ops.as_ptr() as usize;
        let end = start + ops.len() * size_of::<OpRecord>();
        let a = p as usize;
        a >= start && a < end && (a - start).is_multiple_of(size_of::<OpRecord>())
    }

    /// A send ProxyOp to `peer` started under `slot`, with step timing on: its step
    /// record, counted as `slot`'s child as [`start_child`] does. `None` when no record
    /// is free (counted in `link_overflow`); the caller then calls [`start_child`] and
    /// the op runs untimed.
    #[inline]
    pub fn start_op(&'static self, slot: &'static Slot, peer: i32) -> Option<&'static OpRecord> {
        let Some(rec) = self.claim_op() else {
            self.shm.add(off::C_LINK_OVERFLOW, 1);
            return None;
        };
        let r = Ordering::Relaxed;
        rec.peer.store(peer, r);
        rec.link.store(LINK_UNRESOLVED, r);
        rec.slot.store(ptr::from_ref(slot).cast_mut(), r);
        start_child(slot, true);
        Some(rec)
    }

    /// A free step record, round robin (as [`Context::claim`] for slots).
    #[inline]
    fn claim_op(&'static self) -> Option<&'static OpRecord> {
        let ops = self.ops.get()?;
        let mut i = self.next_op.load(Ordering::Relaxed);
        for _ in 0..OP_PROBES {
            let rec = &ops[i as usize % ops.len()];
            i = i.wrapping_add(1);
            if rec
                .busy
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.next_op.store(i, Ordering::Relaxed);
                return Some(rec);
            }
        }
        self.next_op.store(i, Ordering::Relaxed);
        None
    }

    /// Record the start of a collective or p2p operation; the slot that follows it, or
    /// `None` when every slot is busy (counted).
    #[inline]
    pub fn start_task(&'static self, t: &TaskStart) -> Option<&'static Slot> {
        let now = now_ns();
        let Some(slot) = self.claim() else {
            self.shm.add(off::C_DROPPED_EVENTS, 1);
            return None;
        };
        let (started, progress) = if t.kind == layout::KIND_P2P {
            (off::C_P2P_STARTED, off::P2P)
        } else {
            (off::C_COLL_STARTED, off::COLL)
        };
        let seq = self.shm.add(started, 1).wrapping_add(1);
        let nccl_seq = if t.kind == layout::KIND_P2P {
            self.pair_seq(t.peer, t.op == layout::op::RECV)
        } else {
            t.nccl_seq
        };
        let info = Info {
            kind: t.kind,
            op: t.op,
            phase: layout::PHASE_STARTED,
            channels: t.channels,
            peer: t.peer,
        };
        let r = Ordering::Relaxed;
        slot.info.store(info.pack(), r);
        slot.seq.store(seq, r);
        slot.nccl_seq.store(nccl_seq, r);
        slot.bytes.store(t.bytes, r);
        slot.start_ns.store(now, r);
        slot.enqueued_ns.store(0, r);
        slot.children.store(0, r);
        slot.proxy_children.store(0, r);
        slot.proxy_first_ns.store(i64::MAX, r);
        slot.proxy_last_ns.store(0, r);
        slot.last_child_ns.store(0, r);
        slot.completed.store(false, r);
        let v = Values {
            seq,
            nccl_seq,
            bytes: t.bytes,
            start_ns: now,
            info,
            ..Values::default()
        };
        self.shm
            .write(off::progress_record(progress, layout::STARTED), &v, true);
        self.shm.ring(&v);
        Some(slot)
    }

    /// The number of this point-to-point operation among this rank's operations with
    /// `peer` in the same direction: 1, 2, … The sender's n-th send to a peer and that
    /// peer's n-th receive from it are the same transfer. 0 when the peer is unknown
    /// or the table is full.
    #[inline]
    fn pair_seq(&self, peer: i32, receive: bool) -> u64 {
        let Ok(peer) = u64::try_from(peer) else {
            return 0;
        };
        let key = (peer << 1 | u64::from(receive)) + 1;
        let n = self.pair_keys.len();
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % n;
        for _ in 0..n {
            let k = &self.pair_keys[i];
            let mut held = k.load(Ordering::Acquire);
            if held == 0 {
                held = match k.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => key,
                    Err(other) => other,
                };
            }
            if held == key {
                return self.pair_counts[i].fetch_add(1, Ordering::Relaxed) + 1;
            }
            i = (i + 1) % n;
        }
        0
    }

    /// A free slot, taking them round robin. The cursor is advanced with a plain load
    /// and store, not a locked add: two threads racing for the same slot are settled by
    /// the compare-exchange on its references, and the loser moves on.
    #[inline]
    fn claim(&'static self) -> Option<&'static Slot> {
        let mut i = self.next_slot.load(Ordering::Relaxed);
        for _ in 0..SLOT_PROBES {
            let slot = &self.slots[i as usize % SLOTS];
            i = i.wrapping_add(1);
            if slot
                .refs
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.next_slot.store(i, Ordering::Relaxed);
                return Some(slot);
            }
        }
        self.next_slot.store(i, Ordering::Relaxed);
        None
    }

    fn progress(kind: u8) -> (usize, usize) {
        if kind == layout::KIND_P2P {
            (off::P2P, off::C_P2P_COMPLETED)
        } else {
            (off::COLL, off::C_COLL_COMPLETED)
        }
    }
}

/// The stop event of a collective or p2p operation: NCCL enqueued it.
#[inline]
pub fn stop_task(slot: &'static Slot) {
    let ctx = slot.context();
    if !ctx.is_live() {
        return;
    }
    slot.enqueued_ns.store(now_ns(), Ordering::Relaxed);
    let v = slot.values(layout::PHASE_ENQUEUED);
    let (progress, _) = Context::progress(v.info.kind);
    ctx.shm
        .write(off::progress_record(progress, layout::ENQUEUED), &v, true);
    release(slot);
}

/// A child event (ProxyOp when `proxy`, else KernelCh) started under `slot`.
#[inline]
pub fn start_child(slot: &'static Slot, proxy: bool) {
    let ctx = slot.context();
    let now = now_ns();
    slot.refs.fetch_add(1, Ordering::Acquire);
    slot.children.fetch_add(1, Ordering::Relaxed);
    if proxy {
        slot.proxy_children.fetch_add(1, Ordering::Relaxed);
        slot.proxy_first_ns.fetch_min(now, Ordering::Relaxed);
    }
    ctx.shm.add(off::C_CHILD, 1);
}

/// A child event under `slot` stopped.
#[inline]
pub fn stop_child(slot: &'static Slot, proxy: bool) {
    let now = now_ns();
    if proxy {
        slot.proxy_last_ns.fetch_max(now, Ordering::Relaxed);
    }
    slot.last_child_ns.fetch_max(now, Ordering::Relaxed);
    release(slot);
}

/// The stop of a send ProxyOp that has a step record: the record is free again, and
/// the op's parent is released as [`stop_child`] does. NCCL stops all of the op's steps
/// before.
#[inline]
pub fn stop_op(rec: &'static OpRecord) {
    let slot = rec.slot.load(Ordering::Relaxed);
    rec.busy.store(0, Ordering::Release);
    if !slot.is_null() {
        // SAFETY: set at the op's start to one of the context's slots, which are never
        // freed.
        stop_child(unsafe { &*slot }, true);
    }
}

/// A ProxyStep of `rec`'s op started: its timing (index `step % STEP_SLOTS`) starts
/// empty. The index, for the step's handle.
#[inline]
pub fn start_step(rec: &OpRecord, step: i32) -> usize {
    let i = step as u32 as usize % STEP_SLOTS;
    rec.wait_ns[i].store(0, Ordering::Relaxed);
    rec.bytes[i].store(0, Ordering::Relaxed);
    i
}

/// A state transition of step `i` of `rec`'s op. Only SendWait counts: it stamps the
/// time and keeps `trans_size` (the bytes the step sends). Other states are ignored.
#[inline]
pub fn record_step(rec: &OpRecord, i: usize, state: i32, trans_size: usize) {
    if state != state::PROXY_STEP_SEND_WAIT {
        return;
    }
    let i = i % STEP_SLOTS;
    rec.bytes[i].store(
        u32::try_from(trans_size).unwrap_or(u32::MAX),
        Ordering::Relaxed,
    );
    rec.wait_ns[i].store(mono_ns().max(1), Ordering::Relaxed);
}

/// Step `i` of `rec`'s op stopped: if it reached SendWait, add it, its bytes and the
/// time since SendWait to the link entry of the op's peer.
#[inline]
pub fn stop_step(rec: &OpRecord, i: usize) {
    let i = i % STEP_SLOTS;
    let wait = rec.wait_ns[i].swap(0, Ordering::Relaxed);
    if wait == 0 {
        return;
    }
    let ns = (mono_ns() - wait).max(0) as u64;
    let ctx = rec.context();
    if !ctx.is_live() {
        return;
    }
    let mut link = rec.link.load(Ordering::Relaxed);
    if link == LINK_UNRESOLVED {
        link = ctx
            .shm
            .link_index(rec.peer.load(Ordering::Relaxed))
            .unwrap_or(LINK_NONE);
        rec.link.store(link, Ordering::Relaxed);
    }
    if link == LINK_NONE {
        ctx.shm.add(off::C_LINK_OVERFLOW, 1);
        return;
    }
    let bytes = u64::from(rec.bytes[i].load(Ordering::Relaxed));
    ctx.shm.link_add(link, bytes, ns);
}

/// Drop one reference; the last one out records completion when children showed it.
///
/// The last holder does that work *before* letting go (1 → 0), so the slot cannot be
/// claimed by another operation while it is read. If a late child takes a reference
/// meanwhile, the drop fails and is retried as an ordinary one; that child's stop then
/// records completion again, later (the record keeps the later end).
#[inline]
fn release(slot: &'static Slot) {
    let mut refs = slot.refs.load(Ordering::Acquire);
    loop {
        if refs == 1 {
            complete_if_observed(slot);
        }
        match slot.refs.compare_exchange(
            refs,
            refs.wrapping_sub(1),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return,
            Err(now) => refs = now,
        }
    }
}

/// Record completion of `slot`'s operation, held by the caller's reference, if child
/// events showed it.
#[inline]
fn complete_if_observed(slot: &'static Slot) {
    if slot.children.load(Ordering::Acquire) == 0 {
        // Only the stop event so far: NCCL enqueued the work, and nothing says when it
        // ends. Children may still come (they start on proxy threads later); if none
        // do, the next observed completion on this communicator covers this one.
        return;
    }
    let ctx = slot.context();
    if !ctx.is_live() {
        return;
    }
    let v = slot.values(layout::PHASE_COMPLETED);
    let (progress, counter) = Context::progress(v.info.kind);
    ctx.shm
        .write(off::progress_record(progress, layout::COMPLETED), &v, true);
    ctx.shm.ring(&v);
    if !slot.completed.swap(true, Ordering::Relaxed) {
        ctx.shm.add(counter, 1);
    }
}

/// Count an event the plugin does not attribute: `foreign` for PXN proxy operations of
/// another process, otherwise an unknown type.
pub fn count_unattributed(ctx: &Context, foreign: bool) {
    ctx.shm.add(
        if foreign {
            off::C_FOREIGN
        } else {
            off::C_UNKNOWN
        },
        1,
    );
}

// ---------------------------------------------------------------------------------
// Init and finalize (not on the hot path: allocation and locks are fine here).

/// Make the segment for a communicator and the context that writes it.
pub fn open(cfg: &Config, comm: &CommIdentity) -> Result<&'static Context, InitError> {
    match fs::metadata(&cfg.shm_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(InitError::Dir {
                dir: cfg.shm_dir.clone(),
                source: io::Error::from(io::ErrorKind::NotADirectory),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InitError::MissingDir {
                dir: cfg.shm_dir.clone(),
            });
        }
        Err(e) => {
            return Err(InitError::Dir {
                dir: cfg.shm_dir.clone(),
                source: e,
            });
        }
    }
    let (path, file) = create_file(cfg, comm)?;
    let result = size_file(&path, &file).and_then(|()| map(&path, &file));
    let ctx = match result {
        Ok(ctx) => ctx,
        Err(e) => {
            let _ = fs::remove_file(&path);
            unregister(&path);
            return Err(e);
        }
    };
    write_header(ctx, cfg, comm);
    let steps = comm.event_mask & event::PROXY_STEP != 0;
    if steps {
        let me = ptr::from_ref(ctx).cast_mut();
        let ops = ctx.ops.get_or_init(|| {
            (0..OP_RECORDS)
                .map(|_| {
                    let rec = OpRecord::new();
                    rec.ctx.store(me, Ordering::Relaxed);
                    rec
                })
                .collect()
        });
        // A reused context: records of the last communicator's unfinished ops are free.
        for rec in ops.iter() {
            rec.busy.store(0, Ordering::Relaxed);
        }
        ctx.next_op.store(0, Ordering::Relaxed);
    }
    ctx.steps.store(steps, Ordering::Relaxed);
    *ctx.path.lock().unwrap_or_else(PoisonError::into_inner) = Some(path);
    ctx.live.store(true, Ordering::Release);
    Ok(ctx)
}

/// The segment file's name: `nccl-<pid>-<comm hash, 16 hex digits>-<comm rank>.seg`,
/// with `.<n>` before `.seg` if this process already has a segment of that name.
pub fn file_name(pid: u32, comm_hash: u64, rank: i32, n: u32) -> String {
    if n == 0 {
        format!("nccl-{pid}-{comm_hash:016x}-{rank}.seg")
    } else {
        format!("nccl-{pid}-{comm_hash:016x}-{rank}.{n}.seg")
    }
}

fn create_file(cfg: &Config, comm: &CommIdentity) -> Result<(PathBuf, File), InitError> {
    let pid = std::process::id();
    let mut reg = registry();
    let mut n = 0;
    let path = loop {
        let p = cfg
            .shm_dir
            .join(file_name(pid, comm.comm_hash, comm.rank, n));
        if !reg.live_paths.contains(&p) {
            break p;
        }
        n += 1;
    };
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
    };
    let file = match open() {
        Ok(f) => f,
        // Not one of ours: left by an earlier process with our pid that never
        // finalized. Replace it.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = fs::remove_file(&path);
            open().map_err(|source| InitError::Create {
                path: path.clone(),
                source,
            })?
        }
        Err(source) => return Err(InitError::Create { path, source }),
    };
    reg.live_paths.push(path.clone());
    Ok((path, file))
}

fn unregister(path: &Path) {
    registry().live_paths.retain(|p| p != path);
}

/// Give the file its size and its memory now: writing to a tmpfs page that cannot be
/// allocated later would raise SIGBUS in the training process.
fn size_file(path: &Path, file: &File) -> Result<(), InitError> {
    let err = |source| InitError::Size {
        path: path.to_owned(),
        source,
    };
    file.set_len(SEGMENT_SIZE as u64).map_err(err)?;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, SEGMENT_SIZE as libc::off_t) };
    // Filesystems without fallocate (EOPNOTSUPP) keep the sized file.
    if rc != 0 && rc != libc::EOPNOTSUPP {
        return Err(err(io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// Map `file`, into a free context's addresses if there is one, else a new context.
fn map(path: &Path, file: &File) -> Result<&'static Context, InitError> {
    let reused = registry().free.pop();
    let addr = reused.map_or(ptr::null_mut(), |c| c.shm.base.cast::<c_void>());
    let flags = libc::MAP_SHARED | if reused.is_some() { libc::MAP_FIXED } else { 0 };
    // SAFETY: maps SEGMENT_SIZE bytes of a file we just sized to that length. With
    // MAP_FIXED, `addr` is a free context's range of the same size, which nothing else
    // uses (its communicator was finalized); replacing it is what MAP_FIXED does.
    let p = unsafe {
        libc::mmap(
            addr,
            SEGMENT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let source = io::Error::last_os_error();
        if let Some(ctx) = reused {
            // The old anonymous mapping may be gone: put one back before reuse.
            if replace_with_anonymous(ctx.shm.base) {
                registry().free.push(ctx);
            }
        }
        return Err(InitError::Map {
            path: path.to_owned(),
            source,
        });
    }
    let ctx = match reused {
        Some(ctx) => {
            for slot in ctx.slots.iter() {
                slot.refs.store(0, Ordering::Relaxed);
                slot.children.store(0, Ordering::Relaxed);
            }
            ctx.next_slot.store(0, Ordering::Relaxed);
            for (k, c) in ctx.pair_keys.iter().zip(ctx.pair_counts.iter()) {
                k.store(0, Ordering::Relaxed);
                c.store(0, Ordering::Relaxed);
            }
            ctx
        }
        None => {
            let ctx: &'static Context = Box::leak(Box::new(Context {
                shm: Shm { base: p.cast() },
                slots: (0..SLOTS).map(|_| Slot::new()).collect(),
                next_slot: AtomicU32::new(0),
                pair_keys: (0..PAIRS).map(|_| AtomicU64::new(0)).collect(),
                pair_counts: (0..PAIRS).map(|_| AtomicU64::new(0)).collect(),
                steps: AtomicBool::new(false),
                ops: OnceLock::new(),
                next_op: AtomicU32::new(0),
                live: AtomicBool::new(false),
                path: Mutex::new(None),
            }));
            let me = ptr::from_ref(ctx).cast_mut();
            for slot in ctx.slots.iter() {
                slot.ctx.store(me, Ordering::Relaxed);
            }
            ctx
        }
    };
    Ok(ctx)
}

/// Map anonymous memory over a context's segment addresses. False if that failed (the
/// context then keeps whatever is mapped there and is not reused).
fn replace_with_anonymous(base: *mut u8) -> bool {
    // SAFETY: `base` is the start of a SEGMENT_SIZE range this module mapped and owns;
    // MAP_FIXED replaces it in one step, so concurrent stray writers see either the old
    // or the new memory, never a hole.
    let p = unsafe {
        libc::mmap(
            base.cast(),
            SEGMENT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

fn write_header(ctx: &Context, cfg: &Config, comm: &CommIdentity) {
    let h = layout::Header {
        magic: [0; 8],
        layout_version: layout::LAYOUT_VERSION,
        segment_size: SEGMENT_SIZE as u32,
        ring_len: layout::RING_LEN as u32,
        abi_version: comm.abi_version,
        pid: std::process::id() as i32,
        global_rank: cfg.global_rank.map_or(-1, |r| r as i32),
        local_rank: cfg.local_rank.map_or(-1, |r| r as i32),
        world_size: cfg.world_size.map_or(-1, |r| r as i32),
        nranks: comm.nranks,
        comm_rank: comm.rank,
        n_nodes: comm.n_nodes,
        event_mask: comm.event_mask as u32,
        comm_hash: comm.comm_hash,
        start_ns: now_ns(),
        pid_ns: fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino()),
        proc_start_ticks: proc_start_ticks().unwrap_or(0),
        state: layout::STATE_LIVE,
        _reserved0: 0,
        finished_ns: 0,
        _reserved: [0; 3],
        job_id: fixed_str(&cfg.job),
        comm_name: fixed_str(&comm.name),
    };
    // SAFETY: the mapping holds SEGMENT_SIZE >= size_of::<Header>() bytes at `base`,
    // aligned for the header (page-aligned), and no other thread knows this context yet
    // (it is published to NCCL after init returns).
    unsafe { ptr::write(ctx.shm.base.cast::<layout::Header>(), h) };
    // Magic last: a reader that sees it sees the rest of the header.
    fence(Ordering::Release);
    ctx.shm
        .u64_at(off::MAGIC)
        .store(u64::from_ne_bytes(layout::MAGIC), Ordering::Release);
}

/// `s` NUL-padded into N bytes, cut at a UTF-8 boundary to leave at least one NUL.
fn fixed_str<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut end = s.len().min(N - 1);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

/// Field 22 of `/proc/self/stat`.
fn proc_start_ticks() -> Option<u64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Finalize a communicator: mark the segment finished, remove the file, unmap it, and
/// keep the context for reuse.
pub fn close(ctx: &'static Context) {
    if !ctx.live.swap(false, Ordering::AcqRel) {
        return;
    }
    ctx.shm
        .u64_at(off::FINISHED_NS)
        .store(now_ns() as u64, Ordering::Relaxed);
    ctx.shm
        .u32_at(off::STATE)
        .store(layout::STATE_FINISHED, Ordering::Release);
    let path = ctx
        .path
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(path) = path {
        let _ = fs::remove_file(&path);
        unregister(&path);
    }
    if replace_with_anonymous(ctx.shm.base) {
        registry().free.push(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_strings_are_cut_on_a_char_boundary_and_keep_a_nul() {
        let s: [u8; 4] = fixed_str("abcdef");
        assert_eq!(&s, b"abc\0");
        let s: [u8; 4] = fixed_str("aé€");
        assert_eq!(&s, b"a\xc3\xa9\0");
        let s: [u8; 4] = fixed_str("");
        assert_eq!(s, [0; 4]);
    }

    #[test]
    fn file_names_carry_pid_hash_and_rank() {
        assert_eq!(file_name(42, 0xabc, 3, 0), "nccl-42-0000000000000abc-3.seg");
        assert_eq!(
            file_name(42, 0xabc, 3, 2),
            "nccl-42-0000000000000abc-3.2.seg"
        );
    }

    #[test]
    fn this_process_has_a_start_time() {
        assert!(proc_start_ticks().is_some_and(|t| t > 0));
    }
}
