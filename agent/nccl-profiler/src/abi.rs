//! The C types of NCCL's profiler plugin interface, versions 4, 5 and 6, as NCCL lays
//! them out (`plugins/profiler/.../profiler_v4.h` … `profiler_v6.h`), with size and
//! offset assertions for x86_64 and aarch64.
//!
//! Only the members this plugin reads need to be right for correctness, but every union
//! member is spelled out so that the descriptor sizes match NCCL's and the assertions
//! below document the ABI.
#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t` (a C enum).
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;

/// `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel, unsigned long flags, const char*
/// file, int line, const char* fmt, ...)`. May be null.
pub type NcclLogger =
    Option<unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...)>;
/// `NCCL_LOG_WARN`.
pub const LOG_WARN: c_int = 2;
/// `NCCL_LOG_INFO`.
pub const LOG_INFO: c_int = 3;
/// `NCCL_INIT` (debug subsystem flag).
pub const LOG_FLAG_INIT: c_ulong = 0x1;

/// Event type bits (`ncclProfileGroup` …); also the activation mask's bits.
pub mod event {
    pub const GROUP: u64 = 1 << 0;
    pub const COLL: u64 = 1 << 1;
    pub const P2P: u64 = 1 << 2;
    pub const PROXY_OP: u64 = 1 << 3;
    pub const PROXY_STEP: u64 = 1 << 4;
    pub const PROXY_CTRL: u64 = 1 << 5;
    pub const KERNEL_CH: u64 = 1 << 6;
    pub const NET_PLUGIN: u64 = 1 << 7;
    pub const GROUP_API: u64 = 1 << 8;
    pub const COLL_API: u64 = 1 << 9;
    pub const P2P_API: u64 = 1 << 10;
    pub const KERNEL_LAUNCH: u64 = 1 << 11;
    pub const CE_COLL: u64 = 1 << 12;
    pub const CE_SYNC: u64 = 1 << 13;
    pub const CE_BATCH: u64 = 1 << 14;
    /// Every type a v6 NCCL knows; anything else is unknown.
    pub const KNOWN: u64 = (1 << 15) - 1;
}

/// Event states (`ncclProfilerEventState_t`, the same numbers in v4, v5 and v6).
pub mod state {
    /// `ncclProfilerProxyOpInProgress_v4`: a proxy operation began moving data.
    pub const PROXY_OP_IN_PROGRESS: i32 = 19;
    /// `ncclProfilerProxyStepSendGPUWait`: a send step waits for the GPU to fill its
    /// buffer (recorded right after the step's start).
    pub const PROXY_STEP_SEND_GPU_WAIT: i32 = 8;
    /// `ncclProfilerProxyStepSendPeerWait_v4`: the data is ready; waiting for the
    /// receiver to accept it.
    pub const PROXY_STEP_SEND_PEER_WAIT: i32 = 20;
    /// `ncclProfilerProxyStepSendWait`: the network send is posted; the step waits for
    /// the network to say it is done. Its arguments carry `proxyStep.transSize`.
    pub const PROXY_STEP_SEND_WAIT: i32 = 9;
    /// `ncclProfilerProxyStepRecvWait`: a receive step waits for data.
    pub const PROXY_STEP_RECV_WAIT: i32 = 10;
    /// `ncclProfilerProxyStepRecvFlushWait`: received; waiting for the flush.
    pub const PROXY_STEP_RECV_FLUSH_WAIT: i32 = 11;
    /// `ncclProfilerProxyStepRecvGPUWait`: waiting for the GPU to consume the data.
    pub const PROXY_STEP_RECV_GPU_WAIT: i32 = 12;
}

/// `proxyStep` of the state-argument union `ncclProfilerEventStateArgs_v4_t` (v5 and
/// v6 use the same union): its first member, at offset 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyStepStateArgs {
    /// Bytes the step sends (with [`state::PROXY_STEP_SEND_WAIT`]).
    pub transSize: usize,
}

// ---------------------------------------------------------------------------------
// Descriptor union members. Names follow the C headers.

/// `coll` in v4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollV4 {
    pub seqNumber: u64,
    pub func: *const c_char,
    pub sendBuff: *const c_void,
    pub recvBuff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub nChannels: u8,
    pub nWarps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// `coll` in v5 and v6: v4's plus `parentGroup`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollV5 {
    pub seqNumber: u64,
    pub func: *const c_char,
    pub sendBuff: *const c_void,
    pub recvBuff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub nChannels: u8,
    pub nWarps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parentGroup: *mut c_void,
}

/// `p2p` in v4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pV4 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub nChannels: u8,
}

/// `p2p` in v5 and v6.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pV5 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub nChannels: u8,
    pub parentGroup: *mut c_void,
}

/// `proxyOp` (all versions).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyOp {
    /// Pid of the process that posted the operation: with PXN it is another process,
    /// and then `parentObj` is an address in that process.
    pub pid: libc::pid_t,
    pub channelId: u8,
    pub peer: c_int,
    pub nSteps: c_int,
    pub chunkSize: c_int,
    pub isSend: c_int,
}

/// `proxyStep`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyStep {
    pub step: c_int,
}

/// `kernelCh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelCh {
    pub channelId: u8,
    pub pTimer: u64,
}

/// `netPlugin`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPlugin {
    pub id: i64,
    pub data: *mut c_void,
}

/// `groupApi` (v5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GroupApi {
    pub graphCaptured: bool,
    pub groupDepth: c_int,
}

/// `collApi` (v5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graphCaptured: bool,
}

/// `p2pApi` (v5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graphCaptured: bool,
}

/// `kernelLaunch` (v5+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelLaunch {
    pub stream: *mut c_void,
}

/// `kernelStep` (v6).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelStep {
    pub channelId: u8,
    pub isSend: u8,
    pub peer: u8,
    pub step: u32,
    pub size: u32,
    pub startTs: u64,
    pub readyTs: u64,
}

/// `ceColl` (v6).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeColl {
    pub seqNumber: u64,
    pub func: *const c_char,
    pub sendBuff: *const c_void,
    pub recvBuff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub syncStrategy: *const c_char,
    pub intraBatchSync: bool,
    pub batchSize: u32,
    pub numBatches: u32,
    pub ceSeqNum: u32,
    pub stream: *mut c_void,
}

/// `ceCollSync` (v6).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeCollSync {
    pub isComplete: bool,
    pub nRanks: c_int,
}

/// `ceCollBatch` (v6).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeCollBatch {
    pub numOps: c_int,
    pub totalBytes: usize,
    pub useIntraSync: bool,
}

// ---------------------------------------------------------------------------------
// Descriptors.

/// The anonymous union of `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV4 {
    pub coll: CollV4,
    pub p2p: P2pV4,
    pub proxyOp: ProxyOp,
    pub proxyStep: ProxyStep,
    pub kernelCh: KernelCh,
    pub netPlugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v4_t`: note the one-byte `type`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DescrV4 {
    pub type_: u8,
    pub parentObj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnionV4,
}

/// The anonymous union of `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV5 {
    pub groupApi: GroupApi,
    pub collApi: CollApi,
    pub p2pApi: P2pApi,
    pub kernelLaunch: KernelLaunch,
    pub coll: CollV5,
    pub p2p: P2pV5,
    pub proxyOp: ProxyOp,
    pub proxyStep: ProxyStep,
    pub kernelCh: KernelCh,
    pub netPlugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DescrV5 {
    pub type_: u64,
    pub parentObj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnionV5,
}

/// The anonymous union of `ncclProfilerEventDescr_v6_t`: v5's members plus the
/// copy-engine ones.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV6 {
    pub groupApi: GroupApi,
    pub collApi: CollApi,
    pub p2pApi: P2pApi,
    pub kernelLaunch: KernelLaunch,
    pub coll: CollV5,
    pub p2p: P2pV5,
    pub proxyOp: ProxyOp,
    pub proxyStep: ProxyStep,
    pub kernelCh: KernelCh,
    pub kernelStep: KernelStep,
    pub netPlugin: NetPlugin,
    pub ceColl: CeColl,
    pub ceCollSync: CeCollSync,
    pub ceCollBatch: CeCollBatch,
}

/// `ncclProfilerEventDescr_v6_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DescrV6 {
    pub type_: u64,
    pub parentObj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnionV6,
}

/// Unions print as their name only: which member is live depends on the type field.
macro_rules! opaque_debug {
    ($($t:ty),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($t))
            }
        }
    )*};
}
opaque_debug!(DescrUnionV4, DescrUnionV5, DescrUnionV6);

// ---------------------------------------------------------------------------------
// The exported structs.

/// `init` of v4: `(void** context, int* eActivationMask, const char* commName,
/// uint64_t commHash, int nNodes, int nranks, int rank, ncclDebugLogger_t logfn)`.
pub type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    NcclLogger,
) -> NcclResult;

/// `init` of v5 and v6: `(void** context, uint64_t commId, int* eActivationMask, const
/// char* commName, int nNodes, int nranks, int rank, ncclDebugLogger_t logfn)`.
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    NcclLogger,
) -> NcclResult;

/// `stopEvent(void* eHandle)`.
pub type StopEvent = unsafe extern "C" fn(*mut c_void) -> NcclResult;
/// `recordEventState(void* eHandle, ncclProfilerEventState_t eState, args*)`; the
/// state-argument union is only read through its pointer.
pub type RecordEventState = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> NcclResult;
/// `finalize(void* context)`.
pub type Finalize = unsafe extern "C" fn(*mut c_void) -> NcclResult;

/// `ncclProfiler_v4_t`.
#[repr(C)]
#[derive(Debug)]
pub struct ProfilerV4 {
    pub name: *const c_char,
    pub init: InitV4,
    pub startEvent: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut DescrV4) -> NcclResult,
    pub stopEvent: StopEvent,
    pub recordEventState: RecordEventState,
    pub finalize: Finalize,
}

/// `ncclProfiler_v5_t`.
#[repr(C)]
#[derive(Debug)]
pub struct ProfilerV5 {
    pub name: *const c_char,
    pub init: InitV5,
    pub startEvent: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut DescrV5) -> NcclResult,
    pub stopEvent: StopEvent,
    pub recordEventState: RecordEventState,
    pub finalize: Finalize,
}

/// `ncclProfiler_v6_t`.
#[repr(C)]
#[derive(Debug)]
pub struct ProfilerV6 {
    pub name: *const c_char,
    pub init: InitV5,
    pub startEvent: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut DescrV6) -> NcclResult,
    pub stopEvent: StopEvent,
    pub recordEventState: RecordEventState,
    pub finalize: Finalize,
}

// SAFETY: the structs hold a pointer to a static C string and function pointers; none
// of it is ever written after construction, so sharing them between threads is sound.
unsafe impl Sync for ProfilerV4 {}
// SAFETY: as for ProfilerV4.
unsafe impl Sync for ProfilerV5 {}
// SAFETY: as for ProfilerV4.
unsafe impl Sync for ProfilerV6 {}

// Layout facts of the 64-bit Linux ABIs NCCL ships for (LP64: 8-byte pointers and
// size_t, 4-byte int). The C harness asserts the same numbers from its own structs.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<DescrV4>() == 104);
    assert!(offset_of!(DescrV4, parentObj) == 8);
    assert!(offset_of!(DescrV4, u) == 24);
    assert!(size_of::<CollV4>() == 80);
    assert!(size_of::<DescrV5>() == 112);
    assert!(offset_of!(DescrV5, rank) == 16);
    assert!(offset_of!(DescrV5, u) == 24);
    assert!(offset_of!(DescrV5, u) + offset_of!(CollV5, algo) == 88);
    assert!(offset_of!(CollV5, nChannels) == 56);
    assert!(offset_of!(CollV5, parentGroup) == 80);
    assert!(offset_of!(P2pV5, peer) == 32);
    assert!(offset_of!(ProxyOp, channelId) == 4);
    assert!(offset_of!(ProxyOp, peer) == 8);
    assert!(size_of::<ProxyOp>() == 24);
    assert!(size_of::<DescrV6>() == 112);
    assert!(offset_of!(DescrV6, u) == 24);
    assert!(size_of::<CeColl>() == 88);
    assert!(size_of::<ProfilerV5>() == 48);
};
