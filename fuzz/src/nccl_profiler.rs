//! Fuzz target: the NCCL profiler plugin's entry points and descriptor handling
//! (`warden_nccl_profiler`: `ncclProfiler_v4`/`_v5`/`_v6`, `segment`, `config`).
//!
//! The first byte picks a mode:
//! - descriptors (most inputs): one communicator is initialised through the v4, v5 or
//!   v6 struct with fuzzed identity, then the input is a program of `startEvent`,
//!   `stopEvent`, `recordEventState` and re-init calls as NCCL makes them: descriptors
//!   of every type (known, followed or not, unknown numbers) with fuzzed fields, names
//!   from NCCL's tables or fuzzed C strings (kept at fixed addresses, as NCCL's are),
//!   parents that are operations started before (stopped or not), null, another
//!   process's (PXN) or stray addresses;
//!   stops only of handles the plugin returned and not yet stopped (or null). The
//!   segment is read back with `segment::parse` before finalize; finalize removes it.
//! - segment: a real segment file with fuzzed bytes written over it, read as the agent
//!   reads untrusted files (`segment::parse`, `parse_confirmed`, `read_retrying`).
//! - config: the environment the plugin reads at init (`config::Config::from_lookup`,
//!   `parse_mask`).
//!
//! Checked: nothing crashes (AddressSanitizer watches every pointer the plugin
//! follows) and the plugin is never switched off by a caught panic; the segment of a
//! live communicator parses, names its communicator, and never counts more
//! completions than starts; a finalized communicator leaves no file behind; a segment
//! that parses is consistent in the same way when nothing tore.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Mutex, OnceLock};

use warden_nccl_profiler::abi::{DescrV4, DescrV5, DescrV6, event};
use warden_nccl_profiler::config::{Config, parse_mask};
use warden_nccl_profiler::layout::SEGMENT_SIZE;
use warden_nccl_profiler::segment::{self, Snapshot};
use warden_nccl_profiler::shm::file_name;
use warden_nccl_profiler::{ncclProfiler_v4, ncclProfiler_v5, ncclProfiler_v6};

/// The segment directory, set in the environment once before any init.
fn shm_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("warden-fuzz-nccl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make the segment directory");
        // SAFETY: runs once, before the plugin reads the environment; the fuzzer runs
        // the target on one thread.
        unsafe { std::env::set_var("WARDEN_SHM_DIR", &dir) };
        dir
    })
}

/// Names as NCCL passes them: `ncclFuncToString` and `ncclDatatypeToString` entries.
const NAMES: &[&CStr] = &[
    c"AllReduce",
    c"AllGather",
    c"ReduceScatter",
    c"Broadcast",
    c"Reduce",
    c"AllToAll",
    c"Send",
    c"Recv",
    c"SendRecv",
    c"Gather",
    c"Scatter",
    c"ncclInt8",
    c"ncclUint8",
    c"ncclInt32",
    c"ncclUint32",
    c"ncclInt64",
    c"ncclUint64",
    c"ncclFloat16",
    c"ncclFloat32",
    c"ncclFloat64",
    c"ncclBfloat16",
    c"ncclFloat8e4m3",
    c"ncclFloat8e5m2",
    c"",
];

/// A fuzzed name at a fixed address: NCCL's names are static, and the plugin caches
/// decoded names by address. At most 256 are kept; then a table name stands in.
fn interned(bytes: &[u8]) -> *const c_char {
    static TABLE: OnceLock<Mutex<HashMap<Vec<u8>, &'static CStr>>> = OnceLock::new();
    let mut t = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = t.get(bytes) {
        return s.as_ptr();
    }
    if t.len() >= 256 {
        return NAMES[bytes.len() % NAMES.len()].as_ptr();
    }
    let owned: Vec<u8> = bytes.iter().copied().filter(|&b| b != 0).collect();
    let s: &'static CStr = Box::leak(
        CString::new(owned)
            .expect("NULs were removed")
            .into_boxed_c_str(),
    );
    t.insert(bytes.to_vec(), s);
    s.as_ptr()
}

/// Reads the fuzz input as a program; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn i32(&mut self) -> i32 {
        self.u32() as i32
    }
    fn slice(&mut self, max: usize) -> &[u8] {
        let n = usize::from(self.u8()).min(max).min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    /// A name pointer: null, one of NCCL's, or a fuzzed string.
    fn name(&mut self) -> *const c_char {
        match self.u8() {
            0 => ptr::null(),
            b @ 1..=200 => NAMES[usize::from(b) % NAMES.len()].as_ptr(),
            _ => {
                let bytes = self.slice(48).to_vec();
                interned(&bytes)
            }
        }
    }
    /// A count: small, near a power of two, or any.
    fn count(&mut self) -> usize {
        match self.u8() % 4 {
            0 => usize::from(self.u8()),
            1 => 1usize << (self.u8() % 64),
            2 => usize::MAX - usize::from(self.u8()),
            _ => self.u64() as usize,
        }
    }
}

/// A handle the plugin returned, as NCCL holds it.
#[derive(Clone, Copy, Debug)]
struct Handle {
    ptr: *mut c_void,
    /// A collective or p2p operation: it may parent ProxyOp and KernelCh events, also
    /// after its own stop (NCCL stops an operation once it is enqueued, before the
    /// proxy thread starts its children).
    task: bool,
    /// Its stop was called.
    stopped: bool,
}

/// One communicator under test.
struct Comm {
    version: u8,
    ctx: *mut c_void,
    hash: u64,
    rank: i32,
}

fn init(inp: &mut Input<'_>) -> Comm {
    let version = 4 + inp.u8() % 3;
    let hash = inp.u64();
    let n_nodes = inp.i32();
    let nranks = inp.i32();
    let rank = match inp.u8() % 4 {
        0 => -1,
        1 => inp.i32(),
        _ => i32::from(inp.u8() % 8),
    };
    let name = CString::new(
        inp.slice(80)
            .iter()
            .copied()
            .filter(|&b| b != 0)
            .collect::<Vec<u8>>(),
    )
    .expect("NULs were removed");
    init_with(version, hash, n_nodes, nranks, rank, &name)
}

/// ncclCommInitRank → the plugin's init of ABI `version`.
fn init_with(version: u8, hash: u64, n_nodes: i32, nranks: i32, rank: i32, name: &CStr) -> Comm {
    shm_dir();
    let mut ctx = ptr::null_mut();
    let mut mask: c_int = 0;
    // SAFETY: valid out-pointers and a NUL-terminated name, as NCCL passes.
    let rc = unsafe {
        match version {
            4 => (ncclProfiler_v4.init)(
                &mut ctx,
                &mut mask,
                name.as_ptr(),
                hash,
                n_nodes,
                nranks,
                rank,
                None,
            ),
            5 => (ncclProfiler_v5.init)(
                &mut ctx,
                hash,
                &mut mask,
                name.as_ptr(),
                n_nodes,
                nranks,
                rank,
                None,
            ),
            _ => (ncclProfiler_v6.init)(
                &mut ctx,
                hash,
                &mut mask,
                name.as_ptr(),
                n_nodes,
                nranks,
                rank,
                None,
            ),
        }
    };
    assert_eq!(rc, 0, "init always answers success");
    assert!(
        !ctx.is_null(),
        "init made a segment in a writable directory"
    );
    Comm {
        version,
        ctx,
        hash,
        rank,
    }
}

/// The fields of one start event.
struct StartArgs {
    ty: u64,
    parent: *mut c_void,
    parent_index: Option<usize>,
    pid: i32,
    seq: u64,
    func: *const c_char,
    datatype: *const c_char,
    count: usize,
    channels: u8,
    peer: i32,
    rank: i32,
    null_out: bool,
    null_descr: bool,
}

impl StartArgs {
    fn is_child(&self) -> bool {
        self.ty == event::PROXY_OP || self.ty == event::KERNEL_CH
    }

    /// A start event read from the input; parents are chosen among `handles`.
    fn read(inp: &mut Input<'_>, handles: &[Handle]) -> StartArgs {
        let my_pid = std::process::id() as i32;
        let ty: u64 = match inp.u8() % 8 {
            0 | 1 => event::COLL,
            2 => event::P2P,
            3 | 4 => event::PROXY_OP,
            5 => event::KERNEL_CH,
            6 => 1 << (inp.u8() % 16),
            _ => inp.u64(),
        };
        // Parent: an operation of this communicator, null, or a stray address.
        let mut parent_index = None;
        let parent: *mut c_void = match inp.u8() % 4 {
            0 | 1 => {
                let open: Vec<usize> = (0..handles.len()).filter(|&i| handles[i].task).collect();
                if open.is_empty() {
                    ptr::null_mut()
                } else {
                    let i = open[usize::from(inp.u8()) % open.len()];
                    parent_index = Some(i);
                    handles[i].ptr
                }
            }
            2 => ptr::null_mut(),
            // Odd, so never a slot's address.
            _ => (inp.u64() | 1) as usize as *mut c_void,
        };
        let pid = match inp.u8() % 4 {
            0 => inp.i32(),
            _ => my_pid,
        };
        if ty == event::PROXY_OP && pid != my_pid {
            parent_index = None;
        }
        StartArgs {
            ty,
            parent,
            parent_index,
            pid,
            seq: inp.u64(),
            func: inp.name(),
            datatype: inp.name(),
            count: inp.count(),
            channels: inp.u8(),
            peer: inp.i32(),
            rank: inp.i32(),
            null_out: inp.u8() == 0xff,
            null_descr: inp.u8() == 0xff,
        }
    }

    /// An AllReduce of `count` floats, as NCCL describes it.
    fn allreduce(seq: u64, count: usize) -> StartArgs {
        StartArgs {
            ty: event::COLL,
            parent: ptr::null_mut(),
            parent_index: None,
            pid: std::process::id() as i32,
            seq,
            func: c"AllReduce".as_ptr(),
            datatype: c"ncclFloat32".as_ptr(),
            count,
            channels: 2,
            peer: 0,
            rank: 0,
            null_out: false,
            null_descr: false,
        }
    }
}

impl Comm {
    fn path(&self) -> PathBuf {
        shm_dir().join(file_name(std::process::id(), self.hash, self.rank, 0))
    }

    /// `startEvent` with the descriptor `a` describes, in this communicator's ABI:
    /// the handle NCCL would get (`None` when it passed no handle pointer).
    fn start(&self, a: &StartArgs) -> Option<*mut c_void> {
        let StartArgs {
            ty,
            parent,
            pid,
            seq,
            func,
            datatype,
            count,
            channels,
            peer,
            rank,
            null_out,
            null_descr,
            ..
        } = *a;
        let mut h: *mut c_void = ptr::null_mut();
        let out: *mut *mut c_void = if null_out { ptr::null_mut() } else { &mut h };
        // The union bytes NCCL leaves for types the plugin does not read.
        let filler: [u8; 88] = std::array::from_fn(|i| (seq as u8).wrapping_add(i as u8));
        let rc = match self.version {
            4 => {
                // SAFETY: plain integers and pointers; all-zero is a valid descriptor.
                let mut d: DescrV4 = unsafe { std::mem::zeroed() };
                d.type_ = ty as u8;
                d.parentObj = parent;
                d.rank = rank;
                fill_union(&mut d.u, &filler);
                // SAFETY: the union member written is the one the type selects.
                match ty as u8 {
                    t if u64::from(t) == event::COLL => unsafe {
                        let c = &mut d.u.coll;
                        c.seqNumber = seq;
                        c.func = func;
                        c.count = count;
                        c.datatype = datatype;
                        c.nChannels = channels;
                        c.root = peer;
                        c.algo = ptr::null();
                        c.proto = ptr::null();
                    },
                    t if u64::from(t) == event::P2P => unsafe {
                        let p = &mut d.u.p2p;
                        p.func = func;
                        p.datatype = datatype;
                        p.count = count;
                        p.peer = peer;
                        p.nChannels = channels;
                    },
                    t if u64::from(t) == event::PROXY_OP => unsafe {
                        let o = &mut d.u.proxyOp;
                        o.pid = pid;
                        o.channelId = channels;
                        o.peer = peer;
                    },
                    _ => {}
                }
                let dp: *mut DescrV4 = if null_descr { ptr::null_mut() } else { &mut d };
                // SAFETY: our context, a valid (or null) handle slot and descriptor whose
                // union member matches its type, as NCCL passes.
                unsafe { (ncclProfiler_v4.startEvent)(self.ctx, out, dp) }
            }
            v => {
                // SAFETY: as above.
                let mut d: DescrV5 = unsafe { std::mem::zeroed() };
                d.type_ = ty;
                d.parentObj = parent;
                d.rank = rank;
                fill_union(&mut d.u, &filler);
                // SAFETY: the union member written is the one the type selects.
                match ty {
                    event::COLL => unsafe {
                        let c = &mut d.u.coll;
                        c.seqNumber = seq;
                        c.func = func;
                        c.count = count;
                        c.datatype = datatype;
                        c.nChannels = channels;
                        c.root = peer;
                        c.algo = ptr::null();
                        c.proto = ptr::null();
                        c.parentGroup = ptr::null_mut();
                    },
                    event::P2P => unsafe {
                        let p = &mut d.u.p2p;
                        p.func = func;
                        p.datatype = datatype;
                        p.count = count;
                        p.peer = peer;
                        p.nChannels = channels;
                        p.parentGroup = ptr::null_mut();
                    },
                    event::PROXY_OP => unsafe {
                        let o = &mut d.u.proxyOp;
                        o.pid = pid;
                        o.channelId = channels;
                        o.peer = peer;
                    },
                    _ => {}
                }
                if v == 5 {
                    let dp: *mut DescrV5 = if null_descr { ptr::null_mut() } else { &mut d };
                    // SAFETY: as above.
                    unsafe { (ncclProfiler_v5.startEvent)(self.ctx, out, dp) }
                } else {
                    // A v6 descriptor starts with v5's fields at the same offsets; the
                    // copy-engine members are never read for the types built here.
                    // SAFETY: as above; DescrV6 is at least as large as DescrV5.
                    let mut d6: DescrV6 = unsafe { std::mem::zeroed() };
                    // SAFETY: copying DescrV5's bytes into the larger DescrV6.
                    unsafe {
                        ptr::copy_nonoverlapping(
                            (&raw const d).cast::<u8>(),
                            (&raw mut d6).cast::<u8>(),
                            size_of::<DescrV5>(),
                        )
                    };
                    let dp: *mut DescrV6 = if null_descr { ptr::null_mut() } else { &mut d6 };
                    // SAFETY: as above.
                    unsafe { (ncclProfiler_v6.startEvent)(self.ctx, out, dp) }
                }
            }
        };
        assert_eq!(rc, 0, "startEvent always answers success");
        if null_out {
            return None;
        }
        if !h.is_null() && a.is_child() {
            assert!(
                a.parent_index.is_some(),
                "a child handle only under a live parent of this process"
            );
        }
        Some(h)
    }
}

/// Fill a descriptor union with NCCL's leftovers for the types the plugin ignores.
fn fill_union<U>(u: &mut U, filler: &[u8; 88]) {
    let n = size_of::<U>().min(filler.len());
    // SAFETY: the unions are plain old data (integers and pointers that are never
    // followed for the types this is used for); writing bytes into them is sound.
    unsafe { ptr::copy_nonoverlapping(filler.as_ptr(), (u as *mut U).cast::<u8>(), n) };
}

fn stop(h: *mut c_void) {
    // SAFETY: a handle the plugin returned and that was not stopped yet, or null.
    let rc = unsafe { (ncclProfiler_v5.stopEvent)(h) };
    assert_eq!(rc, 0, "stopEvent always answers success");
}

fn finalize(c: &Comm) {
    // SAFETY: our context, finalized once.
    let rc = unsafe { (ncclProfiler_v5.finalize)(c.ctx) };
    assert_eq!(rc, 0, "finalize always answers success");
    assert!(!c.path().exists(), "finalize removes the segment file");
}

fn check(s: &Snapshot) {
    let c = &s.counters;
    assert!(c.coll_completed <= c.coll_started, "{c:?}");
    assert!(c.p2p_completed <= c.p2p_started, "{c:?}");
    for p in [&s.coll, &s.p2p] {
        if let (Some(started), Some(done)) = (p.started, p.completed) {
            assert!(
                done.seq <= started.seq,
                "completed {done:?} after started {started:?}"
            );
        }
    }
}

fn descriptors(inp: &mut Input<'_>) {
    let mut comm = init(inp);
    let mut handles: Vec<Handle> = Vec::new();
    let mut ops = 0;
    while !inp.is_empty() && ops < 512 {
        ops += 1;
        match inp.u8() % 8 {
            0..=3 => {
                let mut args = StartArgs::read(inp, &handles);
                if comm.version == 4 {
                    // The v4 descriptor's type is one byte.
                    args.ty &= 0xff;
                }
                if let Some(h) = comm.start(&args).filter(|h| !h.is_null()) {
                    handles.push(Handle {
                        ptr: h,
                        task: !args.is_child(),
                        stopped: false,
                    });
                }
            }
            4 | 5 => {
                let live: Vec<usize> = (0..handles.len())
                    .filter(|&i| !handles[i].stopped)
                    .collect();
                if live.is_empty() {
                    stop(ptr::null_mut());
                    continue;
                }
                let i = live[usize::from(inp.u8()) % live.len()];
                stop(handles[i].ptr);
                handles[i].stopped = true;
            }
            6 => {
                let h = if handles.is_empty() {
                    ptr::null_mut()
                } else {
                    handles[usize::from(inp.u8()) % handles.len()].ptr
                };
                let mut args = [0u64; 4];
                let a: *mut c_void = if inp.u8() & 1 == 0 {
                    ptr::null_mut()
                } else {
                    args.as_mut_ptr().cast()
                };
                let state = inp.i32();
                // SAFETY: a handle the plugin returned (or null); the arguments are a
                // valid buffer or null.
                let rc = unsafe { (ncclProfiler_v5.recordEventState)(h, state, a) };
                assert_eq!(rc, 0);
            }
            _ => {
                // The communicator goes away (destroy or abort: open events are never
                // stopped), and a new one starts.
                read_back(&comm);
                finalize(&comm);
                handles.clear();
                comm = init(inp);
            }
        }
    }
    read_back(&comm);
    if inp.u16() & 1 == 0 {
        for h in handles.iter_mut().rev().filter(|h| !h.stopped) {
            stop(h.ptr);
            h.stopped = true;
        }
    }
    finalize(&comm);
}

fn read_back(c: &Comm) {
    let bytes = std::fs::read(c.path()).expect("the live segment file is there");
    let s = segment::parse(&bytes).expect("the plugin's own segment parses");
    assert_eq!(s.comm_hash, c.hash);
    assert_eq!(s.abi_version, u32::from(c.version));
    assert!(!s.finished);
    check(&s);
}

/// A segment the plugin wrote, to write fuzzed bytes over.
fn template() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let comm = init_with(5, 0x42, 1, 4, 1, c"template");
        let mut handles = Vec::new();
        for seq in 0..3 {
            if let Some(h) = comm.start(&StartArgs::allreduce(seq, 1000)) {
                handles.push(Handle {
                    ptr: h,
                    task: true,
                    stopped: false,
                });
            }
        }
        if let Some(h) = handles.first_mut() {
            stop(h.ptr);
            h.stopped = true;
        }
        let bytes = std::fs::read(comm.path()).expect("the template segment");
        finalize(&comm);
        bytes
    })
}

fn segment_bytes(inp: &mut Input<'_>) {
    let mut later = template().to_vec();
    let mut earlier = later.clone();
    if inp.u8() & 1 == 0 {
        later.truncate(usize::from(inp.u16()) % (SEGMENT_SIZE + 1));
    }
    while !inp.is_empty() {
        let which = inp.u8();
        let at = usize::from(inp.u16());
        let patch = inp.slice(16).to_vec();
        let buf = if which & 1 == 0 {
            &mut later
        } else {
            &mut earlier
        };
        for (i, b) in patch.into_iter().enumerate() {
            if let Some(slot) = buf.get_mut(at + i) {
                *slot = b;
            }
        }
    }
    if let Ok(s) = segment::parse(&later) {
        let _ = s.completion_observed();
    }
    if let Ok(s) = segment::parse_confirmed(&earlier, &later) {
        let _ = s.recent.len();
    }
    let copies = [earlier, later];
    let mut n = 0;
    let _ = segment::read_retrying(
        || {
            n += 1;
            Ok::<_, ()>(copies[n % 2].clone())
        },
        segment::READ_ATTEMPTS,
    );
}

fn mask_config(inp: &mut Input<'_>) {
    let text = String::from_utf8_lossy(inp.0).into_owned();
    let _ = parse_mask(&text);
    let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let cfg = Config::from_lookup(|k| vars.get(k).map(|v| (*v).to_owned()));
    if cfg.mask_problem.is_none()
        && let Some(v) = vars.get("WARDEN_NCCL_PROFILER_MASK")
    {
        assert_eq!(parse_mask(v).ok(), Some(cfg.mask));
    }
}

/// One input, as libFuzzer passes it (`fuzz_targets/nccl_profiler.rs`).
pub fn run(input: &[u8]) {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let mut inp = Input(rest);
    match mode % 8 {
        0..=5 => descriptors(&mut inp),
        6 => segment_bytes(&mut inp),
        _ => mask_config(&mut inp),
    }
}
