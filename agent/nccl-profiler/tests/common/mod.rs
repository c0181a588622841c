//! Calls the plugin's v5 entry points in-process through the rlib, with descriptors
//! shaped as NCCL fills them. Shared by the in-process tests, the allocation test and
//! the benchmark (`#[path = "../tests/common/mod.rs"] mod common;`).
#![allow(dead_code, unsafe_code)] // calling C function pointers is unsafe by nature

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Mutex, OnceLock, PoisonError};

use warden_nccl_profiler::abi::{
    CollV5, DescrUnionV5, DescrV5, P2pV5, ProxyOp, ProxyStep, ProxyStepStateArgs, event,
};
use warden_nccl_profiler::ncclProfiler_v5 as P;
use warden_nccl_profiler::segment::{self, Snapshot};
use warden_nccl_profiler::shm::file_name;

/// The segment directory of this test process, set in the environment once before
/// any init.
pub fn shm_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("nccl-inprocess-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the segment directory");
        // SAFETY: runs once, inside OnceLock, before any thread reads the environment
        // through the plugin (every caller goes through this function first).
        unsafe { std::env::set_var("WARDEN_SHM_DIR", &dir) };
        dir
    })
}

/// One communicator as NCCL sees it.
#[derive(Debug)]
pub struct Comm {
    pub ctx: *mut c_void,
    pub hash: u64,
    pub rank: i32,
    pub mask: c_int,
}

// SAFETY: the context is the plugin's, which is built for use from any thread.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// Held around every init: the plugin reads `WARDEN_NCCL_PROFILER_MASK` at init, and
/// [`Comm::init_with_mask`] sets it for its init only.
static INIT: Mutex<()> = Mutex::new(());

impl Comm {
    /// ncclCommInitRank → the plugin's init, with the default mask.
    pub fn init(hash: u64, rank: i32) -> Comm {
        Comm::init_with_mask(hash, rank, None)
    }

    /// ncclCommInitRank → the plugin's init, with `WARDEN_NCCL_PROFILER_MASK=mask`
    /// (e.g. `default+proxystep`) when given.
    pub fn init_with_mask(hash: u64, rank: i32, mask_var: Option<&str>) -> Comm {
        shm_dir();
        let _held = INIT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = mask_var {
            // SAFETY: the plugin reads the environment only in init, and every init in
            // a test process goes through here, under `INIT`; Rust's own environment
            // functions lock internally.
            unsafe { std::env::set_var("WARDEN_NCCL_PROFILER_MASK", m) };
        }
        let mut ctx = ptr::null_mut();
        let mut mask: c_int = 0;
        // SAFETY: valid out-pointers and a static name, as NCCL passes.
        let rc = unsafe {
            (P.init)(
                &mut ctx,
                hash,
                &mut mask,
                c"test".as_ptr(),
                1,
                4,
                rank,
                None,
            )
        };
        if mask_var.is_some() {
            // SAFETY: as above.
            unsafe { std::env::remove_var("WARDEN_NCCL_PROFILER_MASK") };
        }
        assert_eq!(rc, 0);
        assert!(!ctx.is_null(), "init made a segment");
        Comm {
            ctx,
            hash,
            rank,
            mask,
        }
    }

    pub fn start(&self, d: &mut DescrV5) -> *mut c_void {
        let mut h = ptr::null_mut();
        // SAFETY: our context, a valid handle slot and descriptor.
        let rc = unsafe { (P.startEvent)(self.ctx, &mut h, d) };
        assert_eq!(rc, 0);
        h
    }

    pub fn path(&self) -> PathBuf {
        shm_dir().join(file_name(std::process::id(), self.hash, self.rank, 0))
    }

    pub fn read(&self) -> Snapshot {
        let path = self.path();
        segment::read_retrying(|| std::fs::read(&path), segment::READ_ATTEMPTS)
            .expect("read the segment")
            .expect("parse the segment")
    }

    pub fn finalize(self) {
        // SAFETY: our context, finalized once.
        assert_eq!(unsafe { (P.finalize)(self.ctx) }, 0);
    }
}

pub fn stop(h: *mut c_void) {
    // SAFETY: a handle the plugin returned (or null).
    assert_eq!(unsafe { (P.stopEvent)(h) }, 0);
}

pub fn record(h: *mut c_void, state: c_int) {
    // SAFETY: a handle the plugin returned (or null); no state arguments.
    assert_eq!(
        unsafe { (P.recordEventState)(h, state, ptr::null_mut()) },
        0
    );
}

/// recordEventState with state arguments whose `proxyStep.transSize` is `bytes`.
pub fn record_trans(h: *mut c_void, state: c_int, bytes: usize) {
    let mut args = ProxyStepStateArgs { transSize: bytes };
    // SAFETY: a handle the plugin returned (or null); the arguments outlive the call.
    assert_eq!(
        unsafe { (P.recordEventState)(h, state, (&raw mut args).cast()) },
        0
    );
}

/// An AllReduce of `count` floats, NCCL's `seqNumber` `nccl_seq`.
pub fn allreduce(nccl_seq: u64, count: usize) -> DescrV5 {
    DescrV5 {
        type_: event::COLL,
        parentObj: ptr::null_mut(),
        rank: 0,
        u: DescrUnionV5 {
            coll: CollV5 {
                seqNumber: nccl_seq,
                func: c"AllReduce".as_ptr(),
                sendBuff: ptr::null(),
                recvBuff: ptr::null_mut(),
                count,
                root: 0,
                datatype: c"ncclFloat32".as_ptr(),
                nChannels: 2,
                nWarps: 16,
                algo: c"RING".as_ptr(),
                proto: c"SIMPLE".as_ptr(),
                parentGroup: ptr::null_mut(),
            },
        },
    }
}

/// A send of `count` bf16 to `peer`.
pub fn send(count: usize, peer: i32) -> DescrV5 {
    p2p(c"Send", count, peer)
}

/// A receive of `count` bf16 from `peer`.
pub fn recv(count: usize, peer: i32) -> DescrV5 {
    p2p(c"Recv", count, peer)
}

fn p2p(func: &'static std::ffi::CStr, count: usize, peer: i32) -> DescrV5 {
    DescrV5 {
        type_: event::P2P,
        parentObj: ptr::null_mut(),
        rank: 0,
        u: DescrUnionV5 {
            p2p: P2pV5 {
                func: func.as_ptr(),
                buff: ptr::null_mut(),
                datatype: c"ncclBfloat16".as_ptr(),
                count,
                peer,
                nChannels: 1,
                parentGroup: ptr::null_mut(),
            },
        },
    }
}

/// A ProxyOp under `parent`, posted by `pid`, with peer 1.
pub fn proxy_op(parent: *mut c_void, pid: i32, is_send: bool) -> DescrV5 {
    proxy_op_to(parent, pid, is_send, 1)
}

/// A ProxyStep of the ProxyOp handle `op`.
pub fn proxy_step(op: *mut c_void, step: i32) -> DescrV5 {
    DescrV5 {
        type_: event::PROXY_STEP,
        parentObj: op,
        rank: 0,
        u: DescrUnionV5 {
            proxyStep: ProxyStep { step },
        },
    }
}

/// A ProxyOp under `parent`, posted by `pid`, to or from `peer`.
pub fn proxy_op_to(parent: *mut c_void, pid: i32, is_send: bool, peer: i32) -> DescrV5 {
    DescrV5 {
        type_: event::PROXY_OP,
        parentObj: parent,
        rank: 0,
        u: DescrUnionV5 {
            proxyOp: ProxyOp {
                pid,
                channelId: 0,
                peer,
                nSteps: 8,
                chunkSize: 1 << 19,
                isSend: c_int::from(is_send),
            },
        },
    }
}

pub fn my_pid() -> i32 {
    std::process::id() as i32
}
