//! Warden's NCCL profiler plugin: NCCL loads this library (`NCCL_PROFILER_PLUGIN=<path
//! to libwarden_nccl_profiler.so>`) and calls it on every collective; the plugin keeps
//! each communicator's progress in a small shared-memory file that the Warden agent
//! reads. A hung or SIGSTOPped rank still shows exactly which collective it entered
//! last, because that is written before NCCL launches the work.
//!
//! # Use
//!
//! The agent (or the deployment) creates the directory `/dev/shm/warden`
//! (`WARDEN_SHM_DIR` moves it); the plugin never creates it, so a job on a node without
//! Warden leaves nothing behind. Per communicator the plugin writes
//! `nccl-<pid>-<comm hash>-<comm rank>.seg` there at init and removes it at finalize.
//! A file whose process is gone without finalize means the process died.
//!
//! Environment, read at each communicator's init:
//! - `WARDEN_SHM_DIR` — segment directory (default `/dev/shm/warden`).
//! - `WARDEN_NCCL_PROFILER_MASK` — NCCL event mask, a number (`0x4a`) or names
//!   (`coll,p2p,proxyop,kernelch`, `default+kernelch`). Default `coll,p2p,proxyop`.
//! - `WARDEN_JOB`, else `SLURM_JOB_ID`, else `TORCHELASTIC_RUN_ID` unless it is `none` (plain
//!   torchrun's value for every job) — the job id.
//! - `RANK` / `OMPI_COMM_WORLD_RANK` / `SLURM_PROCID`, `LOCAL_RANK` /
//!   `OMPI_COMM_WORLD_LOCAL_RANK` / `SLURM_LOCALID`, `WORLD_SIZE` /
//!   `OMPI_COMM_WORLD_SIZE` / `SLURM_NTASKS` — who this process is (-1 if unknown).
//!
//! # What is recorded, and what an event means
//!
//! - A **Coll** (or **P2p**) start event: the rank entered the operation. It gets the
//!   communicator's next sequence number (1, 2, …; collectives and p2p operations
//!   count separately, since p2p operations differ between ranks) and is written as the
//!   "last started" record and to the ring, with NCCL's own per-function `seqNumber`,
//!   the operation, bytes (count × datatype size) and a CLOCK_REALTIME timestamp.
//! - Its stop event means NCCL **enqueued** the work, not that it completed; it is
//!   written as the "last enqueued" record.
//! - **Completion** is the stop of the last child event (ProxyOp, KernelCh) under the
//!   operation: each child holds a reference on its parent, as does the operation until
//!   its own stop, and whoever drops the last reference writes the "last completed"
//!   record (end time = last child stop). The rank's own network time (`xfer_ns`) is
//!   the span from its first ProxyOp start to its last ProxyOp stop.
//! - NCCL runs a communicator's operations in order, so a completed sequence number
//!   also covers every earlier one, including those that had no child events.
//!
//! # Default event mask: Coll | P2p | ProxyOp
//!
//! Coll and P2p give "entered" and "enqueued". ProxyOp is the cheapest level that shows
//! completion: a few events per collective per network channel, emitted by NCCL's proxy
//! thread, which already does that bookkeeping, with no extra GPU work. It shows
//! completion wherever this rank moves data over the network — for a hang, the
//! communicators that matter. Operations that stay inside the node (NVLink, shared
//! memory) have no proxy operations, so on those completion is not observed
//! ([`segment::Snapshot::completion_observed`] says which case a segment is in), and a
//! reader falls back to "enqueued". KernelCh events show completion of every
//! operation, but NCCL adds proxy work for every collective to produce them (10.5%
//! overhead in one release), so they are opt-in: `WARDEN_NCCL_PROFILER_MASK=default+kernelch`.
//! Deeper levels (NetPlugin, the API events) can be switched on the same way; the
//! plugin hands back null handles for types it does not follow, which NCCL accepts.
//!
//! # Per-peer link timing: `proxystep` (opt-in)
//!
//! `xfer_ns` is paced by the slowest link of a ring, so it cannot say which link is
//! slow. With `WARDEN_NCCL_PROFILER_MASK=default+proxystep` the plugin also follows
//! NCCL's ProxyStep events of **send** ProxyOps: each such op gets a step record from a
//! per-communicator pool made at init (its handle is the record's address, tagged in
//! the low bits as the other child handles are; a step's handle carries the step's
//! index, `step % 8`, in its tag, since stopEvent and recordEventState get no context).
//! `recordEventState(step, SendWait, args)` stamps the step and keeps
//! `args->proxyStep.transSize`; the step's stop adds one step, those bytes and the
//! time since SendWait to the segment's link entry for the op's peer
//! ([`segment::LinkTotals`]). That is this rank's send time on the edge to the peer:
//! from handing the data to the network until the network said done, including any
//! queueing behind earlier steps on the same connection. Receive steps are not used
//! (their waits include waiting for upstream data) and their ops keep plain handles.
//! When the pool is exhausted an op runs untimed as before, and the loss is counted
//! (`link_overflow`), as are steps whose peer finds the 32-entry table full.
//! Completion and `xfer_ns` work as without it. `recordEventState` is ignored for
//! every other handle and state.
//!
//! # Failing open
//!
//! Any problem making a segment (directory missing or read-only, disk full, mmap
//! failure) turns the plugin off for that communicator only: init logs a warning
//! through NCCL's logger, leaves the context null and the activation mask untouched,
//! and returns success. It does not return an error because NCCL answers an init
//! error by unloading the plugin once for that communicator and again when the
//! communicator is destroyed (its finalize path unloads unconditionally), which can
//! close the library under the other communicators; and it does not write 0 to the
//! mask because the mask is one process-wide variable shared by all communicators.
//! NCCL calls a null context's events with that null context; they return at once.
//! Every entry point catches panics (a panic switches the plugin off for the rest of
//! the process) and returns success. Nothing on the event path allocates, locks or
//! waits: slots come from a per-communicator pool made at init (when it is exhausted
//! the operation is counted as dropped and gets a null handle), records are written
//! with atomics, and a writer that finds a record held by another writer retries a
//! bounded number of times and then drops the write (counted).
//!
//! # Segment layout
//!
//! One file per communicator, [`layout::SEGMENT_SIZE`] bytes, defined once in
//! [`layout`] (offsets and field meanings; also docs/NCCL-PROFILER.md): a header
//! (magic `WRDNNCCL`, layout version, pid, ranks, job id, comm hash and name, nranks,
//! comm rank, nodes, start time, finished flag), counters (started, completed,
//! dropped, …), the last started / enqueued / completed record for collectives and
//! for p2p operations, a ring of the 256 most recent events, and (layout version 2)
//! the table of 32 per-peer link entries. Each record is guarded
//! by a head and a tail word (a per-record seqlock). [`segment::parse`] reads a copy of
//! the file; [`segment::read_retrying`] trusts a record only when two consecutive
//! copies agree on it (see [`segment`] for why one copy is not enough), rereading a
//! few times before it reports what is consistent. The reader accepts layout versions
//! 1 (no link table) and 2.
//!
//! `#![allow(unsafe_code)]`: this crate is an FFI boundary — NCCL calls it through C
//! function pointers with raw pointers, and it maps shared memory. Each `unsafe` block
//! is small and says why it holds; [`layout`], [`config`] and [`segment`] deny unsafe.
#![allow(unsafe_code)]

pub mod abi;
pub mod config;
pub mod layout;
pub mod plugin;
pub mod segment;
pub mod shm;

use abi::{ProfilerV4, ProfilerV5, ProfilerV6};

/// The name NCCL prints for this plugin.
const NAME: &std::ffi::CStr = c"warden";

/// The v4 struct NCCL 2.27 looks up.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static ncclProfiler_v4: ProfilerV4 = ProfilerV4 {
    name: NAME.as_ptr(),
    init: plugin::init_v4,
    startEvent: plugin::start_event_v4,
    stopEvent: plugin::stop_event,
    recordEventState: plugin::record_event_state,
    finalize: plugin::finalize,
};

/// The v5 struct NCCL 2.28 looks up.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static ncclProfiler_v5: ProfilerV5 = ProfilerV5 {
    name: NAME.as_ptr(),
    init: plugin::init_v5,
    startEvent: plugin::start_event_v5,
    stopEvent: plugin::stop_event,
    recordEventState: plugin::record_event_state,
    finalize: plugin::finalize,
};

/// The v6 struct NCCL 2.29 looks up first.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static ncclProfiler_v6: ProfilerV6 = ProfilerV6 {
    name: NAME.as_ptr(),
    init: plugin::init_v6,
    startEvent: plugin::start_event_v6,
    stopEvent: plugin::stop_event,
    recordEventState: plugin::record_event_state,
    finalize: plugin::finalize,
};
