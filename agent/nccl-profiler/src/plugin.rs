//! The functions NCCL calls, for each ABI version: decode the version's descriptor into
//! one shape, then record through [`crate::shm`]. Every entry catches panics and
//! returns success; only init reports anything, and it too returns success (see the
//! crate docs for why).

use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use crate::abi::{
    self, DescrV4, DescrV5, DescrV6, NCCL_SUCCESS, NcclLogger, NcclResult, ProxyStepStateArgs,
    event,
};
use crate::config::Config;
use crate::layout::{self, datatype_size, op};
use crate::shm::{self, CommIdentity, Context, OpRecord, STEP_SLOTS, Slot, TaskStart};

/// Set after a panic inside the plugin: from then on every entry returns at once.
static POISONED: AtomicBool = AtomicBool::new(false);

/// This process's pid, to tell PXN proxy operations of other processes apart.
static PID: AtomicI32 = AtomicI32::new(0);

/// Handle tag (low bits of the slot address) of a ProxyOp child.
const TAG_PROXY: usize = 1;
/// Handle tag of a KernelCh child.
const TAG_KERNEL: usize = 2;
/// Handle tag of a send ProxyOp with a step record (mask `proxystep`): the address is
/// the [`OpRecord`]'s, not the slot's.
const TAG_OP: usize = 3;
/// Handle tags of a ProxyStep: `TAG_STEP + step % STEP_SLOTS` on its op's record
/// address (8 to 15).
const TAG_STEP: usize = 8;
/// Slots and step records are 64-byte aligned, so the low 6 bits of a handle are free
/// for the tag.
const TAG_MASK: usize = 63;

const _: () = assert!(STEP_SLOTS.is_power_of_two() && TAG_STEP.is_multiple_of(STEP_SLOTS));
const _: () = assert!(TAG_STEP > TAG_OP && TAG_STEP + STEP_SLOTS <= TAG_MASK + 1);
const _: () = assert!(align_of::<Slot>() > TAG_MASK && align_of::<OpRecord>() > TAG_MASK);

/// Run `f` unless poisoned; a panic poisons the plugin instead of unwinding into NCCL.
#[inline]
fn guard(f: impl FnOnce()) {
    if POISONED.load(Ordering::Relaxed) {
        return;
    }
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        POISONED.store(true, Ordering::Relaxed);
    }
}

/// A start event, whatever the ABI version.
#[derive(Clone, Copy, Debug)]
pub enum Start {
    /// A collective or p2p operation.
    Task(TaskStart),
    /// A ProxyOp (`proxy`) or KernelCh event under `parent`; `pid` is the posting
    /// process for ProxyOps, `peer` and `is_send` their remote rank and direction.
    Child {
        parent: *mut c_void,
        proxy: bool,
        pid: Option<i32>,
        peer: i32,
        is_send: bool,
    },
    /// A ProxyStep under the ProxyOp handle `parent` (followed with mask `proxystep`).
    Step { parent: *mut c_void, step: i32 },
    /// A type NCCL defines that this plugin does not follow (group, API, net plugin,
    /// copy-engine events).
    Untracked,
    /// A type this plugin has never heard of.
    Unknown,
}

/// At most this many bytes of a C string are looked at.
const NAME_MAX: usize = 32;

/// The bytes of a NUL-terminated string, at most [`NAME_MAX`]; empty for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string (NCCL passes static names).
unsafe fn name(p: *const c_char, buf: &mut [u8; NAME_MAX]) -> &[u8] {
    if p.is_null() {
        return &[];
    }
    let mut n = 0;
    while n < NAME_MAX {
        // SAFETY: the caller promises a NUL-terminated string; we stop at its NUL.
        let b = unsafe { *p.add(n) } as u8;
        if b == 0 {
            break;
        }
        buf[n] = b;
        n += 1;
    }
    &buf[..n]
}

/// Decoded names by address. NCCL passes its names from static tables
/// (`ncclFuncToString`, `ncclDatatypeToString`), so an address always holds the same
/// name, and a hit saves reading and matching the string. Each entry packs the address
/// and the decoded byte into one word (`addr << 8 | value`; user-space addresses fit in
/// 56 bits), so readers never see a key with another key's value. Entries are only
/// ever added; when the table is full, names are decoded every time.
struct NameCache([AtomicU64; 32]);

static NAMES: NameCache = NameCache([const { AtomicU64::new(0) }; 32]);

impl NameCache {
    /// `decode(name at p)`, cached by `p`. Names of different kinds (function,
    /// datatype) are at different addresses, so one table serves both.
    ///
    /// # Safety
    /// `p` is null or a NUL-terminated string that does not change while loaded.
    #[inline]
    unsafe fn get(&self, p: *const c_char, decode: fn(&[u8]) -> u8) -> u8 {
        let key = p as u64;
        if p.is_null() || key >> 56 != 0 {
            let mut buf = [0u8; NAME_MAX];
            // SAFETY: per the caller.
            return decode(unsafe { name(p, &mut buf) });
        }
        for entry in &self.0 {
            let v = entry.load(Ordering::Relaxed);
            if v >> 8 == key {
                return v as u8;
            }
            if v == 0 {
                let mut buf = [0u8; NAME_MAX];
                // SAFETY: per the caller.
                let value = decode(unsafe { name(p, &mut buf) });
                // Taken by another name meanwhile: fine, this one is decoded next time.
                let _ = entry.compare_exchange(
                    0,
                    key << 8 | u64::from(value),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return value;
            }
        }
        let mut buf = [0u8; NAME_MAX];
        // SAFETY: per the caller.
        decode(unsafe { name(p, &mut buf) })
    }
}

/// [`datatype_size`] as a byte, for the name cache (sizes are 0, 1, 2, 4 or 8).
fn datatype_size_u8(name: &[u8]) -> u8 {
    datatype_size(name) as u8
}

/// A collective's or p2p operation's start from its fields.
///
/// # Safety
/// `func` and `datatype` are null or NUL-terminated strings that do not change (NCCL's
/// static names).
unsafe fn task(
    kind: u8,
    nccl_seq: u64,
    func: *const c_char,
    count: usize,
    datatype: *const c_char,
    channels: u8,
    peer: c_int,
) -> Start {
    // SAFETY: forwarded from the caller; NCCL's names are static.
    let op = unsafe { NAMES.get(func, op::from_func) };
    // SAFETY: as above.
    let size = u64::from(unsafe { NAMES.get(datatype, datatype_size_u8) });
    Start::Task(TaskStart {
        kind,
        op,
        nccl_seq,
        bytes: (count as u64).wrapping_mul(size),
        channels,
        peer,
    })
}

/// Classify a type that is not a collective, p2p or child event.
fn other(ty: u64) -> Start {
    if ty != 0 && ty & !event::KNOWN == 0 && ty.is_power_of_two() {
        Start::Untracked
    } else {
        Start::Unknown
    }
}

/// The body both descriptor versions share: v4 and v5 differ in the width of `type_`
/// and in layout, not in the members read here.
macro_rules! decode_descriptor {
    ($d:expr, $ty:expr) => {{
        let d = $d;
        let ty: u64 = $ty;
        match ty {
            event::COLL => {
                let c = (*d).u.coll;
                task(
                    layout::KIND_COLL,
                    c.seqNumber,
                    c.func,
                    c.count,
                    c.datatype,
                    c.nChannels,
                    c.root,
                )
            }
            event::P2P => {
                let p = (*d).u.p2p;
                task(
                    layout::KIND_P2P,
                    0,
                    p.func,
                    p.count,
                    p.datatype,
                    p.nChannels,
                    p.peer,
                )
            }
            event::PROXY_OP => {
                let o = (*d).u.proxyOp;
                Start::Child {
                    parent: (*d).parentObj,
                    proxy: true,
                    pid: Some(o.pid),
                    peer: o.peer,
                    is_send: o.isSend != 0,
                }
            }
            event::PROXY_STEP => Start::Step {
                parent: (*d).parentObj,
                step: (*d).u.proxyStep.step,
            },
            event::KERNEL_CH => Start::Child {
                parent: (*d).parentObj,
                proxy: false,
                pid: None,
                peer: -1,
                is_send: false,
            },
            _ => other(ty),
        }
    }};
}

/// Decode a v4 descriptor.
///
/// # Safety
/// `d` points to a v4 descriptor whose union member matches its type, as NCCL passes.
pub unsafe fn decode_v4(d: *const DescrV4) -> Start {
    // SAFETY: the caller promises a valid descriptor; each arm reads the union member
    // its type selects, and the struct is Copy (plain pointers and integers).
    unsafe { decode_descriptor!(d, u64::from((*d).type_)) }
}

/// Decode a v5 descriptor.
///
/// # Safety
/// As for [`decode_v4`], with a v5 descriptor.
pub unsafe fn decode_v5(d: *const DescrV5) -> Start {
    // SAFETY: as in decode_v4.
    unsafe { decode_descriptor!(d, (*d).type_) }
}

/// Decode a v6 descriptor: v5's members sit at the same offsets.
///
/// # Safety
/// As for [`decode_v4`], with a v6 descriptor.
pub unsafe fn decode_v6(d: *const DescrV6) -> Start {
    // SAFETY: the v6 descriptor starts with v5's fields and its union holds v5's members
    // at the same offsets (asserted in `abi`), so it can be read as a v5 descriptor for
    // every type v5 knows; the copy-engine types fall through to `other`.
    unsafe { decode_v5(d.cast()) }
}

/// The common start path: record `start` for the communicator `ctx` and return the
/// handle NCCL gets (null when nothing is followed).
#[inline]
fn start(ctx: *mut c_void, start: Start) -> *mut c_void {
    if ctx.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: a non-null context is one our init returned: a leaked, never freed Context.
    let ctx: &'static Context = unsafe { &*ctx.cast::<Context>() };
    if !ctx.is_live() {
        return ptr::null_mut();
    }
    match start {
        Start::Task(t) => ctx
            .start_task(&t)
            .map_or(ptr::null_mut(), |s| ptr::from_ref(s).cast_mut().cast()),
        Start::Child {
            parent,
            proxy,
            pid,
            peer,
            is_send,
        } => {
            if pid.is_some_and(|p| p != PID.load(Ordering::Relaxed)) {
                // PXN: posted by another process; `parent` is its address, not ours.
                shm::count_unattributed(ctx, true);
                return ptr::null_mut();
            }
            if parent.is_null() || !ctx.owns(parent) {
                // The parent was not recorded (pool full, or not a collective we
                // follow): nothing to attribute to.
                return ptr::null_mut();
            }
            // SAFETY: `owns` checked that `parent` is the address of one of ctx's slots.
            let slot: &'static Slot = unsafe { &*parent.cast::<Slot>() };
            if proxy
                && is_send
                && ctx.steps_enabled()
                && let Some(rec) = ctx.start_op(slot, peer)
            {
                return (ptr::from_ref(rec) as usize | TAG_OP) as *mut c_void;
            }
            shm::start_child(slot, proxy);
            let tag = if proxy { TAG_PROXY } else { TAG_KERNEL };
            (parent as usize | tag) as *mut c_void
        }
        Start::Step { parent, step } => {
            // Only steps of ops with a step record are followed: receive ops, ops of
            // a communicator without `proxystep`, ops that found the pool exhausted
            // and ops not recorded at all get null step handles.
            let addr = parent as usize & !TAG_MASK;
            if parent as usize & TAG_MASK != TAG_OP || !ctx.owns_op(addr as *const c_void) {
                return ptr::null_mut();
            }
            // SAFETY: `owns_op` checked that `addr` is one of ctx's step records.
            let rec: &'static OpRecord = unsafe { &*(addr as *const OpRecord) };
            let i = shm::start_step(rec, step);
            (addr | TAG_STEP | i) as *mut c_void
        }
        Start::Untracked => ptr::null_mut(),
        Start::Unknown => {
            shm::count_unattributed(ctx, false);
            ptr::null_mut()
        }
    }
}

/// Write `h` to NCCL's handle pointer, if it gave one.
///
/// # Safety
/// `out` is null or valid for a pointer write.
#[inline]
unsafe fn set_handle(out: *mut *mut c_void, h: *mut c_void) {
    if !out.is_null() {
        // SAFETY: per the caller.
        unsafe { *out = h };
    }
}

macro_rules! start_entry {
    ($fn_name:ident, $descr:ty, $decode:ident) => {
        /// `startEvent`: records the event and hands back a handle (or null).
        ///
        /// # Safety
        /// Called by NCCL with its context, handle pointer and descriptor.
        pub unsafe extern "C" fn $fn_name(
            ctx: *mut c_void,
            out: *mut *mut c_void,
            d: *mut $descr,
        ) -> NcclResult {
            // SAFETY: NCCL's handle pointer; cleared first so that no path leaves it
            // stale.
            unsafe { set_handle(out, ptr::null_mut()) };
            if out.is_null() || d.is_null() {
                return NCCL_SUCCESS;
            }
            guard(|| {
                // SAFETY: NCCL passes a descriptor of this ABI version.
                let s = unsafe { $decode(d) };
                let h = start(ctx, s);
                // SAFETY: checked non-null above.
                unsafe { set_handle(out, h) };
            });
            NCCL_SUCCESS
        }
    };
}

start_entry!(start_event_v4, DescrV4, decode_v4);
start_entry!(start_event_v5, DescrV5, decode_v5);
start_entry!(start_event_v6, DescrV6, decode_v6);

/// `stopEvent`.
///
/// # Safety
/// `handle` is null or a handle this plugin's startEvent returned.
pub unsafe extern "C" fn stop_event(handle: *mut c_void) -> NcclResult {
    if handle.is_null() {
        return NCCL_SUCCESS;
    }
    guard(|| {
        let tag = handle as usize & TAG_MASK;
        let addr = handle as usize & !TAG_MASK;
        let slot = || {
            // SAFETY: handles with tags 0 to 2 are slot addresses (plus the tag) from
            // `start`; slots live in leaked contexts, so they are valid for 'static.
            let slot: &'static Slot = unsafe { &*(addr as *const Slot) };
            slot
        };
        match tag {
            0 => shm::stop_task(slot()),
            TAG_PROXY => shm::stop_child(slot(), true),
            TAG_KERNEL => shm::stop_child(slot(), false),
            // SAFETY: a handle tagged TAG_OP is a step record's address (see op_record).
            TAG_OP => shm::stop_op(unsafe { op_record(addr) }),
            t if t & !(STEP_SLOTS - 1) == TAG_STEP => {
                // SAFETY: a handle tagged TAG_STEP.. is a step record's address.
                shm::stop_step(unsafe { op_record(addr) }, t - TAG_STEP);
            }
            _ => {}
        }
    });
    NCCL_SUCCESS
}

/// The step record at `addr`, from a handle tagged [`TAG_OP`] or [`TAG_STEP`].
///
/// # Safety
/// `addr` is the untagged address of a handle with one of those tags that `start`
/// returned: it hands them out only on addresses `owns_op` confirmed to be a step
/// record of a context.
#[inline]
unsafe fn op_record(addr: usize) -> &'static OpRecord {
    // SAFETY: per the caller, a step record; pools live in leaked contexts and are
    // never freed (a context's pool, once made, stays), so it is valid for 'static.
    unsafe { &*(addr as *const OpRecord) }
}

/// `recordEventState`: only ProxyStep handles' SendWait is used (with mask
/// `proxystep`): it stamps the step and reads `proxyStep.transSize` from `args`. Every
/// other handle and state returns at once, without reading `args`.
///
/// # Safety
/// `handle` is null or a handle this plugin's startEvent returned; `args` is null or
/// NCCL's state-argument union (`ncclProfilerEventStateArgs_v4_t` or later).
pub unsafe extern "C" fn record_event_state(
    handle: *mut c_void,
    state: c_int,
    args: *mut c_void,
) -> NcclResult {
    let tag = handle as usize & TAG_MASK;
    if handle.is_null() || tag & !(STEP_SLOTS - 1) != TAG_STEP {
        return NCCL_SUCCESS;
    }
    if state != abi::state::PROXY_STEP_SEND_WAIT {
        return NCCL_SUCCESS;
    }
    guard(|| {
        let trans_size = if args.is_null() {
            0
        } else {
            // SAFETY: NCCL passes its state-argument union, whose `proxyStep.transSize`
            // (a size_t) is at offset 0 and is the member SendWait fills; unaligned
            // read in case a caller's buffer is not 8-aligned.
            unsafe { ptr::read_unaligned(args.cast::<ProxyStepStateArgs>()) }.transSize
        };
        // SAFETY: the handle's tag is TAG_STEP.. (checked above).
        let rec = unsafe { op_record(handle as usize & !TAG_MASK) };
        shm::record_step(rec, tag - TAG_STEP, state, trans_size);
    });
    NCCL_SUCCESS
}

/// `finalize`.
///
/// # Safety
/// `ctx` is null or a context this plugin's init returned.
pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    if ctx.is_null() {
        return NCCL_SUCCESS;
    }
    guard(|| {
        // SAFETY: a non-null context is one our init returned (leaked, never freed).
        let ctx: &'static Context = unsafe { &*ctx.cast::<Context>() };
        shm::close(ctx);
    });
    NCCL_SUCCESS
}

/// Send one line to NCCL's logger (shown with `NCCL_DEBUG=WARN` or `INFO`).
fn log(logger: NcclLogger, level: c_int, msg: &str) {
    let Some(f) = logger else { return };
    let Ok(msg) = CString::new(msg.replace('\0', " ")) else {
        return;
    };
    // SAFETY: NCCL's logger is printf-like; "%s" with one NUL-terminated string
    // matches it, and all strings outlive the call.
    unsafe {
        f(
            level,
            abi::LOG_FLAG_INIT,
            c"warden-nccl-profiler".as_ptr(),
            0,
            c"%s".as_ptr(),
            msg.as_ptr(),
        );
    }
}

/// The common init: make the segment; on success set the activation mask and the
/// context. On failure leave both alone (context null) and still return success.
///
/// # Safety
/// `out` and `mask` are null or valid for writes; `name` is null or a C string.
#[allow(clippy::too_many_arguments)]
unsafe fn init(
    out: *mut *mut c_void,
    mask: *mut c_int,
    name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logger: NcclLogger,
    abi_version: u32,
) -> NcclResult {
    if out.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: NCCL's context pointer, checked non-null.
    unsafe { *out = ptr::null_mut() };
    guard(|| {
        PID.store(std::process::id() as i32, Ordering::Relaxed);
        let cfg = Config::from_env();
        if let Some(problem) = &cfg.mask_problem {
            log(
                logger,
                abi::LOG_WARN,
                &format!("Warden profiler: {problem}"),
            );
        }
        let comm_name = if name.is_null() {
            String::new()
        } else {
            // SAFETY: NCCL passes its communicator name as a C string.
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        let comm = CommIdentity {
            comm_hash,
            name: comm_name,
            n_nodes,
            nranks,
            rank,
            abi_version,
            event_mask: cfg.mask,
        };
        match shm::open(&cfg, &comm) {
            Ok(ctx) => {
                if !mask.is_null() {
                    // SAFETY: NCCL's mask pointer, checked non-null. NCCL reads it with
                    // relaxed atomic loads; an aligned int store is what NCCL's own
                    // plugins do here.
                    unsafe { *mask = cfg.mask as c_int };
                }
                // SAFETY: checked non-null above.
                unsafe { *out = ptr::from_ref(ctx).cast_mut().cast() };
                log(
                    logger,
                    abi::LOG_INFO,
                    &format!(
                        "Warden profiler: comm {comm_hash:#018x} rank {rank}/{nranks} -> {} (mask {:#x})",
                        cfg.shm_dir.display(),
                        cfg.mask
                    ),
                );
            }
            Err(e) => log(
                logger,
                abi::LOG_WARN,
                &format!(
                    "Warden profiler off for comm {comm_hash:#018x} rank {rank}: {e}; the job goes on without it"
                ),
            ),
        }
    });
    NCCL_SUCCESS
}

/// `init` of the v4 struct (mask before name, hash after).
///
/// # Safety
/// Called by NCCL with its argument pointers.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn init_v4(
    out: *mut *mut c_void,
    mask: *mut c_int,
    name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logger: NcclLogger,
) -> NcclResult {
    // SAFETY: forwarded from NCCL.
    unsafe { init(out, mask, name, comm_hash, n_nodes, nranks, rank, logger, 4) }
}

macro_rules! init_entry {
    ($fn_name:ident, $version:literal) => {
        /// `init` of the v5/v6 struct (comm id before the mask).
        ///
        /// # Safety
        /// Called by NCCL with its argument pointers.
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $fn_name(
            out: *mut *mut c_void,
            comm_id: u64,
            mask: *mut c_int,
            name: *const c_char,
            n_nodes: c_int,
            nranks: c_int,
            rank: c_int,
            logger: NcclLogger,
        ) -> NcclResult {
            // SAFETY: forwarded from NCCL.
            unsafe {
                init(
                    out, mask, name, comm_id, n_nodes, nranks, rank, logger, $version,
                )
            }
        }
    };
}

init_entry!(init_v5, 5);
init_entry!(init_v6, 6);
