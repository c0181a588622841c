//! NCCL profiler segments: the agent reads the files `warden-nccl-profiler` keeps in
//! the shared-memory directory (every [`POLL_EVERY`], with plain `read(2)`), and turns
//! them into [`Progress`]: rank and communicator registrations, the collectives each
//! rank entered and completed, and the exits of processes that died without
//! finalizing their communicators.
//!
//! - Job and rank come from the segment header (the plugin reads `WARDEN_JOB` /
//!   `SLURM_JOB_ID` / `TORCHELASTIC_RUN_ID` and `RANK` / `OMPI_COMM_WORLD_RANK` /
//!   `SLURM_PROCID`); a segment without both is counted and skipped.
//! - Completions: where the segment shows child events, the completed records of the
//!   ring since the last poll (and the last completed record), in order; where it shows
//!   none (operations that never leave the node, default event mask), completion is
//!   not observable and the last *enqueued* collective stands in for it, one per poll.
//!   The last started collective, if newer, is reported in flight. A collective
//!   reported in flight whose own completion was not seen (the ring moved past it) is
//!   settled after the later completion that covers it (NCCL runs a communicator's
//!   operations in order), so the controller takes it as already known.
//! - Point-to-point operations go on a communicator of their own per pair and
//!   direction, `nccl:<comm hash>:p2p:<src>><dst>` in communicator ranks, of two members
//!   (the sender is 0), as `warden_torch` reports them: the plugin numbers each rank's
//!   operations per peer and direction, so the sender's n-th send and the receiver's
//!   n-th receive share sequence number n. They complete as collectives do (child
//!   events, or the last enqueue where the segment shows none), and an operation
//!   without child events of its own (a transfer inside the node) is complete once an
//!   operation of the same communicator started after it has completed: NCCL runs a
//!   communicator's operations in order on one stream.
//! - Per-peer send totals (segments written under the plugin's `proxystep` mask): each
//!   peer's steps, bytes and wire time since the communicator began, sent as a
//!   `LinkSample` whenever they moved since the last poll (totals, so a lost batch
//!   loses nothing; the controller takes differences).
//! - Exits: a process whose segments are still live (not finalized) and whose pid is
//!   gone from `/proc`, a zombie, or taken by another process (start time differs) has
//!   exited; it is reported once, with its wait status when the kernel still has it,
//!   and its segments are not reported again (the files stay until someone removes
//!   them; the agent's mount may be read-only).
//!   This needs the agent to see the job's pids: under Kubernetes `hostPID: true` (or a
//!   pid namespace shared with the job). The header's pid namespace says whether a pid
//!   is from the agent's namespace; when it is not, liveness is not judged at all.
//!   Only processes seen alive by this agent are reported, so segments left by
//!   processes that died before the agent started do not raise old exits.
//!   Between polls the reader waits on a pidfd of each live process it can judge, so
//!   an exit wakes it at once and is stamped with that moment: the first death of a
//!   job and the deaths it causes milliseconds later land in different reads, in
//!   order (without pidfds, as under an older kernel, the poll interval decides).

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use warden_model::wire::{
    CollectiveEvent, CommInfo, LinkSample, MAX_LINK_TOTAL, MAX_WORLD_SIZE, ProcessState, RankInfo,
};
use warden_nccl_profiler::segment::{self, Event, Kind, Phase, SegmentError, Snapshot};

use crate::capture::{LiveProcess, Liveness, liveness, report_stopped};
use crate::progress::Progress;

/// How often the agent should call [`poll_segments`].
pub const POLL_EVERY: Duration = Duration::from_millis(500);

/// Most segment files followed at once; further files are skipped (counted).
pub const MAX_SEGMENTS: usize = 4096;

/// Highest op code that is also a wire `CollOp` number; others are sent as unknown.
const MAX_WIRE_OP: u8 = 10;

/// What one poll found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Segments read and reported.
    pub segments: usize,
    /// Segments without a job id or global rank.
    pub unattributed: usize,
    /// Segments that could not be read or parsed (other than not yet initialised).
    pub unreadable: usize,
    /// Segment files beyond [`MAX_SEGMENTS`].
    pub skipped: usize,
    /// Collective records handed to [`Progress`] (started and completed).
    pub collectives: usize,
    /// Process exits reported.
    pub exits: usize,
    /// Per-peer network totals reported (segments written under the `proxystep` mask).
    pub links: usize,
}

/// What the agent remembers between polls.
#[derive(Debug)]
pub struct SegmentTracker {
    proc_root: PathBuf,
    /// Inode of the agent's pid namespace, when known.
    own_pid_ns: Option<u64>,
    segments: HashMap<PathBuf, Seen>,
    processes: HashMap<(u32, u64), Process>,
    /// Watch live processes with pidfds (their pids are real: `/proc` is the host's).
    watch_exits: bool,
}

/// One segment file.
#[derive(Debug)]
struct Seen {
    /// Who wrote it: a file replaced under the same name starts over.
    identity: (u32, u64, u64),
    /// Last sequence number reported started / completed.
    started: u64,
    completed: u64,
    /// Reported in flight and not yet completed.
    in_flight: Option<CollectiveEvent>,
    /// Point-to-point operations.
    p2p: P2pSeen,
    /// Per-peer send steps last reported, by peer.
    links: HashMap<u32, u64>,
}

/// Point-to-point operations of one segment, by the plugin's p2p sequence number
/// (every p2p operation of the communicator, whatever its peer).
#[derive(Debug, Default)]
struct P2pSeen {
    started: u64,
    completed: u64,
    /// Reported in flight and not yet completed: plugin sequence, start time, record.
    in_flight: Vec<(u64, i64, CollectiveEvent)>,
    /// Pair communicators already registered.
    pairs: HashSet<u64>,
}

/// Most point-to-point operations of one segment held in flight; older ones are
/// forgotten (the controller still holds them).
const MAX_P2P_IN_FLIGHT: usize = 256;

/// One training process (pid and start time), over all its segments.
#[derive(Debug)]
struct Process {
    job: String,
    rank: u32,
    /// Last poll that found it alive (agent clock, ns); 0 if never.
    alive_at_ns: i64,
    /// Its exit was reported.
    exited: bool,
    /// Stopped (SIGSTOP, a debugger) at the last look.
    stopped: bool,
    /// A pidfd of the process while it is watched (alive, in our pid namespace).
    pidfd: Option<std::os::fd::OwnedFd>,
    /// When its pidfd said it exited (agent clock, ns).
    exited_at_ns: Option<i64>,
}

impl SegmentTracker {
    /// A tracker that looks pids up under `proc_root` (normally `/proc`), in the pid
    /// namespace of this agent process.
    pub fn new(proc_root: impl Into<PathBuf>) -> SegmentTracker {
        let own = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
        SegmentTracker::with_pid_namespace(proc_root, own)
    }

    /// As [`SegmentTracker::new`], with the agent's pid namespace given (`None`:
    /// unknown, every pid is taken as the agent's).
    pub fn with_pid_namespace(proc_root: impl Into<PathBuf>, own_pid_ns: Option<u64>) -> Self {
        SegmentTracker {
            proc_root: proc_root.into(),
            own_pid_ns,
            segments: HashMap::new(),
            processes: HashMap::new(),
            watch_exits: false,
        }
    }

    /// Segment files followed now.
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Whether a pid from namespace `ns` can be looked up in ours.
    fn same_pid_namespace(&self, ns: u64) -> bool {
        ns == 0 || self.own_pid_ns.is_none_or(|own| own == ns)
    }

    /// Wait up to `limit` for a watched process to exit; true when one did (its exit
    /// time is kept for the next poll). Without watched processes, or where pidfds do
    /// not work, it only sleeps (through `stop`, which may end the wait early: false
    /// then). The tracker is locked only between waits (each on duplicates of the
    /// pidfds), so the shipper's read before a flush never waits on this one.
    pub fn wait_for_exit(
        tracker: &Mutex<SegmentTracker>,
        limit: Duration,
        stop: &crate::runtime::StopFlag,
        now_ns: impl Fn() -> i64,
    ) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        const SLICE: Duration = Duration::from_millis(100);
        let lock = || tracker.lock().unwrap_or_else(PoisonError::into_inner);
        let started = std::time::Instant::now();
        loop {
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                return true;
            }
            let watched: Vec<((u32, u64), std::os::fd::OwnedFd)> = lock()
                .processes
                .iter()
                .filter(|(_, p)| p.exited_at_ns.is_none())
                .filter_map(|(k, p)| Some((*k, p.pidfd.as_ref()?.try_clone().ok()?)))
                .collect();
            if watched.is_empty() {
                return stop.wait(left);
            }
            if stop.is_raised() {
                return false;
            }
            let ready: Vec<(u32, u64)> = {
                let mut fds: Vec<PollFd<'_>> = watched
                    .iter()
                    .map(|(_, fd)| PollFd::new(fd, PollFlags::IN))
                    .collect();
                let wait = left.min(SLICE);
                let timeout = Timespec {
                    tv_sec: 0,
                    tv_nsec: i64::from(wait.subsec_nanos()),
                };
                match poll(&mut fds, Some(&timeout)) {
                    Ok(0) => Vec::new(),
                    Ok(_) => watched
                        .iter()
                        .zip(fds.iter())
                        .filter(|(_, fd)| !fd.revents().is_empty())
                        .map(|((k, _), _)| *k)
                        .collect(),
                    Err(rustix::io::Errno::INTR) => Vec::new(),
                    Err(_) => {
                        // pidfds do not work here: the poll interval decides.
                        for p in lock().processes.values_mut() {
                            p.pidfd = None;
                        }
                        return stop.wait(left);
                    }
                }
            };
            if !ready.is_empty() {
                let at = now_ns();
                let mut t = lock();
                for k in ready {
                    if let Some(p) = t.processes.get_mut(&k) {
                        p.exited_at_ns = Some(at);
                        p.pidfd = None;
                    }
                }
                return !stop.is_raised();
            }
        }
    }
}

/// A pidfd of `pid`, which must still be the process that started at `ticks` (checked
/// after opening, so a pid reused in between is not watched); `None` where pidfds are
/// not available.
fn watch(proc_root: &Path, pid: u32, ticks: u64) -> Option<std::os::fd::OwnedFd> {
    let raw = i32::try_from(pid).ok()?;
    let fd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(raw)?,
        rustix::process::PidfdFlags::empty(),
    )
    .ok()?;
    (ticks == 0 || start_ticks(proc_root, pid) == Some(ticks)).then_some(fd)
}

/// Start the segment reader when the capture is enabled: every [`POLL_EVERY`], and
/// just before each flush (through [`Progress::read_before_flush`]), it reads
/// `cfg.shm_dir` into `progress` until the agent stops. The controller takes a batch
/// as complete up to the moment it was cut; read on its own schedule alone, the
/// segments would lag a batch by up to one poll, and a rank that finished a collective
/// would still look inside it. A directory that cannot be read (other than missing)
/// marks the `nccl` collector down until it can.
pub fn start(
    cfg: &crate::config::CaptureConfig,
    shared: &crate::runtime::Shared,
    progress: &Progress,
) -> Option<std::thread::JoinHandle<()>> {
    if !cfg.enabled {
        return None;
    }
    let (dir, shared, progress) = (cfg.shm_dir.clone(), shared.clone(), progress.clone());
    let mut tracker = SegmentTracker::new(cfg.proc_root.clone());
    tracker.watch_exits = cfg.proc_root == Path::new("/proc");
    let tracker = Arc::new(Mutex::new(tracker));
    progress.read_before_flush(reader(dir.clone(), Arc::clone(&tracker)));
    crate::collectors::spawn("nccl", move || {
        let mut up = None;
        loop {
            let ok = match poll_shared(&dir, &tracker, &progress) {
                Ok(_) => true,
                Err(e) => {
                    if up != Some(false) {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot read NCCL profiler segments");
                    }
                    false
                }
            };
            if up != Some(ok) {
                shared.set_up("nccl", ok);
                up = Some(ok);
            }
            if !SegmentTracker::wait_for_exit(
                &tracker,
                POLL_EVERY,
                &shared.stop,
                crate::ship::wall_ns,
            ) {
                return;
            }
        }
    })
}

/// One poll of `dir` now, through the tracker the reader's own polls and the reads
/// before each flush share.
fn poll_shared(
    dir: &Path,
    tracker: &Mutex<SegmentTracker>,
    progress: &Progress,
) -> io::Result<PollStats> {
    let mut t = tracker.lock().unwrap_or_else(PoisonError::into_inner);
    poll_segments(dir, &mut t, progress, crate::ship::wall_ns())
}

/// The read of `dir` that the shipper makes just before each flush. An unreadable
/// directory is reported by the reader's own polls.
fn reader(dir: PathBuf, tracker: Arc<Mutex<SegmentTracker>>) -> crate::progress::Reader {
    Arc::new(move |p: &Progress| {
        let _ = poll_shared(&dir, &tracker, p);
    })
}

/// Whether `name` is a segment file name (`nccl-*.seg`).
fn is_segment_name(name: &str) -> bool {
    name.starts_with("nccl-") && name.ends_with(".seg")
}

/// Read every segment in `dir` and report what is new since the last poll to
/// `progress`; `now_ns` is the agent's wall clock. A missing directory is not an
/// error (no job on this node has used the plugin yet).
pub fn poll_segments(
    dir: &Path,
    tracker: &mut SegmentTracker,
    progress: &Progress,
    now_ns: i64,
) -> io::Result<PollStats> {
    let mut stats = PollStats::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            tracker.segments.clear();
            tracker.processes.clear();
            return Ok(stats);
        }
        Err(e) => return Err(e),
    };
    let mut present = HashSet::new();
    // Processes with at least one live (not finalized) segment this poll.
    let mut live: HashSet<(u32, u64)> = HashSet::new();
    // Whether a process's segments are reported this poll (it is alive), decided once.
    let mut looked: HashMap<(u32, u64), bool> = HashMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_segment_name) {
            continue;
        }
        let path = entry.path();
        if !tracker.segments.contains_key(&path) && tracker.segments.len() >= MAX_SEGMENTS {
            stats.skipped += 1;
            continue;
        }
        let snap = match segment::read_retrying(|| std::fs::read(&path), segment::READ_ATTEMPTS) {
            Ok(Ok(s)) => s,
            // Removed by finalize since the listing, or still being set up.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Ok(Err(SegmentError::NotReady)) => continue,
            Ok(Err(e)) => {
                tracing::debug!(path = %path.display(), error = %e, "nccl: unreadable segment");
                stats.unreadable += 1;
                continue;
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "nccl: cannot read segment");
                stats.unreadable += 1;
                continue;
            }
        };
        present.insert(path.clone());
        let (Some(rank), false) = (snap.global_rank, snap.job.is_empty()) else {
            stats.unattributed += 1;
            continue;
        };
        let key = (snap.pid, snap.proc_start_ticks);
        if !snap.finished {
            live.insert(key);
        }
        let report = *looked.entry(key).or_insert_with(|| {
            let (report, exited) = look_at(tracker, key, &snap, rank, progress, now_ns);
            stats.exits += usize::from(exited);
            report
        });
        if !report {
            continue;
        }
        stats.segments += 1;
        let identity = (snap.pid, snap.proc_start_ticks, snap.comm_hash);
        let fresh = || Seen {
            identity,
            started: 0,
            completed: 0,
            in_flight: None,
            p2p: P2pSeen::default(),
            links: HashMap::new(),
        };
        let seen = tracker.segments.entry(path).or_insert_with(fresh);
        if seen.identity != identity {
            *seen = fresh();
        }
        register(&snap, rank, progress);
        stats.collectives += report_collectives(seen, &snap, rank, progress);
        stats.collectives += report_p2p(&mut seen.p2p, &snap, rank, progress);
        stats.links += report_links(&mut seen.links, &snap, rank, progress, now_ns);
    }
    tracker.segments.retain(|p, _| present.contains(p));
    // Processes whose segments are all gone or finalized are done with NCCL.
    tracker.processes.retain(|key, _| live.contains(key));
    Ok(stats)
}

/// Decide about the process `key` (pid, start time) that wrote `snap`: whether its
/// segments are to be reported (it is alive, or its liveness cannot be judged from
/// here), and whether its exit was reported just now.
fn look_at(
    tracker: &mut SegmentTracker,
    key: (u32, u64),
    snap: &Snapshot,
    rank: u32,
    progress: &Progress,
    now_ns: i64,
) -> (bool, bool) {
    let (pid, ticks) = key;
    let judge = tracker.same_pid_namespace(snap.pid_ns);
    let state = if judge {
        match liveness(&tracker.proc_root, pid) {
            Liveness::Alive
                if ticks != 0
                    && start_ticks(&tracker.proc_root, pid).is_some_and(|t| t != ticks) =>
            {
                // The pid belongs to another process now.
                Liveness::Gone
            }
            state => state,
        }
    } else {
        Liveness::Alive
    };
    let watch_exits = tracker.watch_exits && judge;
    let proc_root = tracker.proc_root.clone();
    let p = tracker.processes.entry(key).or_insert_with(|| Process {
        job: snap.job.clone(),
        rank,
        alive_at_ns: 0,
        exited: false,
        stopped: false,
        pidfd: None,
        exited_at_ns: None,
    });
    if p.exited {
        return (false, false);
    }
    // A pidfd that fired is the exit, whatever /proc still shows (a zombie not yet
    // reaped reads as gone too).
    let state = match (p.exited_at_ns, state) {
        (Some(_), Liveness::Alive | Liveness::Stopped) => Liveness::Gone,
        (_, state) => state,
    };
    if matches!(state, Liveness::Alive | Liveness::Stopped) {
        if watch_exits && p.pidfd.is_none() && p.exited_at_ns.is_none() {
            p.pidfd = watch(&proc_root, pid, ticks);
        }
        // A stopped process is alive: it makes no progress, which is what a hang is.
        p.alive_at_ns = now_ns;
        let seen = LiveProcess {
            job: &p.job,
            rank: p.rank,
            pid,
            now_ns,
        };
        report_stopped(progress, seen, state, &mut p.stopped);
        return (true, false);
    }
    p.exited = true;
    if snap.finished || p.alive_at_ns == 0 {
        // Finalized before it went (a clean end), or dead before this agent ever saw it
        // alive (an old file): not news.
        return (false, false);
    }
    p.pidfd = None;
    // Its pidfd said when; else it died between the last look and this one: halfway
    // is the best guess.
    let at_ns = p
        .exited_at_ns
        .unwrap_or(p.alive_at_ns + (now_ns - p.alive_at_ns) / 2);
    let (exit_code, signal) = state.exit_status();
    tracing::warn!(job = %p.job, rank = p.rank, pid, ?exit_code, ?signal, "nccl: training process died with live NCCL segments");
    // Fields added to the wire record later (a stop flag is on its way) keep defaults.
    #[allow(clippy::needless_update)]
    progress.process(
        &p.job,
        ProcessState {
            rank: p.rank,
            pid,
            at_ns,
            alive: false,
            exit_code,
            signal,
            ..ProcessState::default()
        },
    );
    (false, true)
}

/// Register the rank, and the communicator once it has carried a collective: one
/// that only carries point-to-point operations (torch makes one per pair of ranks)
/// has nothing on its own sequence, and a member that never completes anything there
/// would look like a rank that never arrives.
fn register(snap: &Snapshot, rank: u32, progress: &Progress) {
    progress.rank(
        &snap.job,
        RankInfo {
            rank,
            world_size: snap.world_size.unwrap_or(0),
            pid: snap.pid,
            gpu_index: None,
            gpu_uuid: String::new(),
        },
    );
    if snap.counters.coll_started == 0 {
        return;
    }
    progress.comm(
        &snap.job,
        CommInfo {
            comm: snap.comm_hash,
            name: snap.comm_name.clone(),
            size: snap.nranks,
            rank,
            comm_rank: snap.comm_rank,
        },
    );
}

/// A segment record as a wire collective; `end_ns` 0 for in flight.
fn wire(snap: &Snapshot, rank: u32, e: &Event, end_ns: i64) -> CollectiveEvent {
    CollectiveEvent {
        comm: snap.comm_hash,
        rank,
        seq: e.seq,
        op: if e.op <= MAX_WIRE_OP {
            i32::from(e.op)
        } else {
            0
        },
        bytes: e.bytes,
        start_ns: e.start_ns,
        end_ns,
        xfer_ns: e.xfer_ns,
    }
}

/// Operations of `kind` (collectives or p2p, each with its own sequence) completed
/// after sequence number `after`, oldest first, each once with its end time: where the
/// segment shows child events, the completed records of the ring and the last completed
/// record; where it shows none, the last enqueued one stands in.
fn completions_after(snap: &Snapshot, kind: Kind, after: u64) -> Vec<(Event, i64)> {
    let progress = if kind == Kind::P2p {
        &snap.p2p
    } else {
        &snap.coll
    };
    let mut done: Vec<(Event, i64)> = if snap.completion_observed() {
        snap.recent
            .iter()
            .chain(progress.completed.iter())
            .filter(|e| e.kind == kind && e.phase == Phase::Completed)
            .map(|e| (*e, e.end_ns))
            .collect()
    } else {
        // Nothing shows completion on this communicator: the enqueue stands in.
        progress
            .enqueued
            .iter()
            .map(|e| (*e, e.enqueued_ns))
            .collect()
    };
    done.retain(|(e, end)| e.seq > after && *end > 0);
    // An operation can complete twice (a late child); the later end wins.
    done.sort_by_key(|(e, end)| (e.seq, *end));
    done.dedup_by(|later, earlier| {
        if later.0.seq == earlier.0.seq {
            *earlier = *later;
            true
        } else {
            false
        }
    });
    done
}

/// Report the collectives of one segment that are new since the last poll; returns how
/// many records went to `progress`.
fn report_collectives(seen: &mut Seen, snap: &Snapshot, rank: u32, progress: &Progress) -> usize {
    let job = &snap.job;
    let mut sent = 0;
    // Completions since the last poll, oldest first, with their end time.
    let done = completions_after(snap, Kind::Coll, seen.completed);

    for (e, end) in &done {
        progress.completed(job, wire(snap, rank, e, *end));
        seen.completed = e.seq;
        sent += 1;
    }
    if let Some(ev) = seen.in_flight.take() {
        match done.iter().find(|(e, _)| e.seq >= ev.seq) {
            Some((e, _)) if e.seq == ev.seq => {}
            Some((_, end)) => {
                // Its own completion fell out of the ring; a later one covers it. Sent
                // after that later one, so the controller takes it as already known
                // (stale) and only the agent's in-flight entry is settled.
                progress.completed(
                    job,
                    CollectiveEvent {
                        end_ns: *end,
                        xfer_ns: 0,
                        ..ev
                    },
                );
                sent += 1;
            }
            None => seen.in_flight = Some(ev),
        }
    }
    seen.started = seen.started.max(seen.completed);

    if let Some(s) = snap.coll.started
        && s.seq > seen.started
    {
        let ev = wire(snap, rank, &s, 0);
        progress.started(job, ev.clone());
        seen.started = s.seq;
        seen.in_flight = Some(ev);
        sent += 1;
    }
    sent
}

/// Report the per-peer send totals of one segment that moved since the last poll (the
/// plugin keeps them only under the `proxystep` mask); returns how many went out.
fn report_links(
    sent: &mut HashMap<u32, u64>,
    snap: &Snapshot,
    rank: u32,
    progress: &Progress,
    now_ns: i64,
) -> usize {
    let mut n = 0;
    for l in &snap.links {
        let sane = l.peer < snap.nranks.min(MAX_WORLD_SIZE)
            && l.peer != snap.comm_rank
            && snap.comm_rank < MAX_WORLD_SIZE
            && [l.steps, l.bytes, l.busy_ns]
                .iter()
                .all(|&v| v <= MAX_LINK_TOTAL);
        if !sane || l.steps == 0 || sent.get(&l.peer) == Some(&l.steps) {
            continue;
        }
        sent.insert(l.peer, l.steps);
        progress.link(
            &snap.job,
            LinkSample {
                comm: snap.comm_hash,
                rank,
                comm_rank: snap.comm_rank,
                peer: l.peer,
                at_ns: now_ns,
                steps: l.steps,
                bytes: l.bytes,
                busy_ns: l.busy_ns,
            },
        );
        n += 1;
    }
    n
}

/// The pair communicator of a point-to-point operation: its id, name and this rank's
/// rank in it (the sender is 0); `None` for an operation that names no other rank or
/// that the plugin did not number.
fn pair_of(snap: &Snapshot, e: &Event) -> Option<(u64, String, u32)> {
    use warden_nccl_profiler::layout::op;
    let me = i32::try_from(snap.comm_rank).ok()?;
    if e.nccl_seq == 0 || e.peer < 0 || e.peer == me {
        return None;
    }
    let (src, dst, mine) = match e.op {
        op::SEND => (me, e.peer, 0),
        op::RECV => (e.peer, me, 1),
        _ => return None,
    };
    let name = format!("nccl:{:016x}:p2p:{src}>{dst}", snap.comm_hash);
    Some((warden_model::ids::fnv1a(name.as_bytes()), name, mine))
}

/// A point-to-point record on its pair communicator (registered on first use); `None`
/// when it has none (see [`pair_of`]).
fn p2p_wire(
    seen: &mut P2pSeen,
    snap: &Snapshot,
    rank: u32,
    e: &Event,
    end_ns: i64,
    progress: &Progress,
) -> Option<CollectiveEvent> {
    let (comm, name, comm_rank) = pair_of(snap, e)?;
    if seen.pairs.insert(comm) {
        progress.comm(
            &snap.job,
            CommInfo {
                comm,
                name,
                size: 2,
                rank,
                comm_rank,
            },
        );
    }
    Some(CollectiveEvent {
        comm,
        rank,
        seq: e.nccl_seq,
        op: i32::from(e.op),
        bytes: e.bytes,
        start_ns: e.start_ns,
        end_ns,
        xfer_ns: if end_ns > 0 { e.xfer_ns } else { 0 },
    })
}

/// Report the point-to-point operations of one segment that are new since the last
/// poll, each on its pair communicator; returns how many records went to `progress`.
fn report_p2p(seen: &mut P2pSeen, snap: &Snapshot, rank: u32, progress: &Progress) -> usize {
    let job = &snap.job;
    let mut sent = 0;
    let observed = snap.completion_observed();
    let done = completions_after(snap, Kind::P2p, seen.completed);
    let mut started: Vec<Event> = snap
        .recent
        .iter()
        .chain(snap.p2p.started.iter())
        .filter(|e| e.kind == Kind::P2p && e.phase == Phase::Started && e.seq > seen.started)
        .copied()
        .collect();
    started.sort_by_key(|e| e.seq);
    started.dedup_by_key(|e| e.seq);

    // Without completions of its own, an operation is covered by the completion of any
    // operation of this communicator that started after it.
    let completions: Vec<(i64, i64)> = snap
        .recent
        .iter()
        .chain(snap.coll.completed.iter())
        .chain(snap.p2p.completed.iter())
        .filter(|e| e.phase == Phase::Completed && e.end_ns > 0)
        .map(|e| (e.start_ns, e.end_ns))
        .collect();
    let covered = |seq: u64, start_ns: i64| -> Option<i64> {
        if let Some((_, end)) = done.iter().find(|(e, _)| e.seq == seq) {
            return Some(*end);
        }
        if !observed {
            return done.iter().find(|(e, _)| e.seq >= seq).map(|(_, end)| *end);
        }
        completions
            .iter()
            .filter(|(s, _)| *s > start_ns)
            .map(|(_, end)| *end)
            .min()
    };

    for e in &started {
        seen.started = seen.started.max(e.seq);
        if done.iter().any(|(d, _)| d.seq == e.seq) {
            continue; // its completion goes out below
        }
        if let Some(end_ns) = covered(e.seq, e.start_ns) {
            if let Some(ev) = p2p_wire(seen, snap, rank, e, end_ns.max(e.start_ns), progress) {
                progress.completed(job, CollectiveEvent { xfer_ns: 0, ..ev });
                sent += 1;
            }
            continue;
        }
        if let Some(ev) = p2p_wire(seen, snap, rank, e, 0, progress) {
            progress.started(job, ev.clone());
            sent += 1;
            if seen.in_flight.len() >= MAX_P2P_IN_FLIGHT {
                seen.in_flight.remove(0);
            }
            seen.in_flight.push((e.seq, e.start_ns, ev));
        }
    }
    for (e, end) in &done {
        seen.completed = seen.completed.max(e.seq);
        seen.started = seen.started.max(e.seq);
        if let Some(ev) = p2p_wire(seen, snap, rank, e, *end, progress) {
            progress.completed(job, ev);
            sent += 1;
        }
    }
    let mut still = Vec::new();
    for (seq, start_ns, ev) in std::mem::take(&mut seen.in_flight) {
        if done.iter().any(|(e, _)| e.seq == seq) {
            continue;
        }
        match covered(seq, start_ns) {
            Some(end_ns) => {
                progress.completed(
                    job,
                    CollectiveEvent {
                        end_ns: end_ns.max(ev.start_ns),
                        xfer_ns: 0,
                        ..ev
                    },
                );
                sent += 1;
            }
            None => still.push((seq, start_ns, ev)),
        }
    }
    seen.in_flight = still;
    sent
}

/// Start time (field 22 of `/proc/<pid>/stat`), if the pid exists.
fn start_ticks(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ship::Pending;
    use warden_model::wire::JobSignals;
    use warden_nccl_profiler::config::{Config, DEFAULT_MASK};
    use warden_nccl_profiler::layout::{KIND_COLL, op};
    use warden_nccl_profiler::shm::{self, CommIdentity, Context, TaskStart};

    /// A segment directory, a fake `/proc` and the segments written into them by the
    /// plugin's own code, as this test process.
    struct Node {
        shm: tempfile::TempDir,
        proc: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Node {
            let node = Node {
                shm: tempfile::tempdir().expect("segment directory"),
                proc: tempfile::tempdir().expect("fake /proc"),
            };
            node.set_stat(|fields| fields);
            node
        }

        /// Write `/proc/<our pid>/stat`: ours, with `edit` applied to the fields after
        /// the command name (index 0 is the state).
        fn set_stat(&self, edit: impl FnOnce(Vec<String>) -> Vec<String>) {
            let real = std::fs::read_to_string("/proc/self/stat").expect("own stat");
            let cut = real.rfind(')').expect("stat has a command name") + 1;
            let fields: Vec<String> = real[cut..]
                .split_ascii_whitespace()
                .map(str::to_owned)
                .collect();
            let dir = self.proc.path().join(std::process::id().to_string());
            std::fs::create_dir_all(&dir).expect("pid directory");
            let text = format!("{} {}\n", &real[..cut], edit(fields).join(" "));
            std::fs::write(dir.join("stat"), text).expect("write stat");
        }

        fn kill(&self) {
            let dir = self.proc.path().join(std::process::id().to_string());
            std::fs::remove_dir_all(dir).expect("remove the pid");
        }

        fn open(&self, comm: u64, rank: Option<u32>) -> &'static Context {
            self.open_with_mask(comm, rank, DEFAULT_MASK)
        }

        fn open_with_mask(&self, comm: u64, rank: Option<u32>, mask: u64) -> &'static Context {
            let cfg = Config {
                shm_dir: self.shm.path().to_owned(),
                mask,
                mask_problem: None,
                global_rank: rank,
                local_rank: Some(1),
                world_size: Some(8),
                job: "job-a".to_owned(),
            };
            let id = CommIdentity {
                comm_hash: comm,
                name: "dp".to_owned(),
                n_nodes: 2,
                nranks: 4,
                rank: 1,
                abi_version: 5,
                event_mask: mask,
            };
            shm::open(&cfg, &id).expect("open a segment")
        }

        fn tracker(&self) -> SegmentTracker {
            SegmentTracker::with_pid_namespace(self.proc.path(), None)
        }

        fn poll(&self, t: &mut SegmentTracker, p: &Progress, now: i64) -> PollStats {
            poll_segments(self.shm.path(), t, p, now).expect("poll")
        }
    }

    fn allreduce(n: u64) -> TaskStart {
        TaskStart {
            kind: KIND_COLL,
            op: op::ALL_REDUCE,
            nccl_seq: n,
            bytes: 4096,
            channels: 2,
            peer: -1,
        }
    }

    /// One collective completed through a proxy op, as NCCL orders it.
    fn complete_one(ctx: &'static Context, n: u64) {
        let slot = ctx.start_task(&allreduce(n)).expect("a slot");
        shm::stop_task(slot);
        shm::start_child(slot, true);
        shm::stop_child(slot, true);
    }

    fn cut(p: &Progress) -> Vec<JobSignals> {
        let mut pending = Pending::default();
        p.flush(1, &mut pending);
        pending.take_jobs()
    }

    /// One collective whose send to `peer` takes one timed step of `bytes`.
    fn send_step(ctx: &'static Context, n: u64, peer: i32, bytes: usize) {
        use warden_nccl_profiler::abi::state;
        let slot = ctx.start_task(&allreduce(n)).expect("a slot");
        shm::stop_task(slot);
        let rec = ctx.start_op(slot, peer).expect("a step record");
        let i = shm::start_step(rec, 0);
        shm::record_step(rec, i, state::PROXY_STEP_SEND_WAIT, bytes);
        shm::stop_step(rec, i);
        shm::stop_op(rec);
    }

    #[test]
    fn per_peer_totals_go_out_when_they_move() {
        use warden_nccl_profiler::abi::event;
        let node = Node::new();
        let ctx = node.open_with_mask(0xabc, Some(3), DEFAULT_MASK | event::PROXY_STEP);
        let p = Progress::default();
        let mut t = node.tracker();
        send_step(ctx, 1, 2, 1 << 20);
        let stats = node.poll(&mut t, &p, 1_000);
        assert_eq!(stats.links, 1);
        let jobs = cut(&p);
        let links = &jobs[0].links;
        assert_eq!(links.len(), 1, "{links:?}");
        let l = &links[0];
        assert_eq!(
            (
                l.comm,
                l.rank,
                l.comm_rank,
                l.peer,
                l.at_ns,
                l.steps,
                l.bytes
            ),
            (0xabc, 3, 1, 2, 1_000, 1, 1 << 20)
        );
        // Nothing moved: nothing goes out.
        assert_eq!(node.poll(&mut t, &p, 2_000).links, 0);
        assert!(cut(&p).iter().all(|j| j.links.is_empty()));
        // Another step: the new totals.
        send_step(ctx, 2, 2, 1 << 19);
        assert_eq!(node.poll(&mut t, &p, 3_000).links, 1);
        let jobs = cut(&p);
        let l = &jobs[0].links[0];
        assert_eq!((l.steps, l.bytes, l.at_ns), (2, 3 << 19, 3_000));
        shm::close(ctx);
    }

    #[test]
    fn the_running_reader_is_read_again_before_each_flush() {
        let node = Node::new();
        let ctx = node.open(0xabc, Some(3));
        let slot = ctx.start_task(&allreduce(0)).expect("a slot");
        let cfg = crate::config::CaptureConfig {
            enabled: true,
            proc_root: node.proc.path().to_owned(),
            shm_dir: node.shm.path().to_owned(),
            ..crate::config::CaptureConfig::default()
        };
        let registry = prometheus::Registry::new();
        let shared = crate::runtime::Shared {
            pending: crate::ship::SharedPending::default(),
            metrics: Arc::new(crate::metrics::AgentMetrics::register(&registry).expect("metrics")),
            window: Arc::new(Mutex::new(crate::window::LogWindow::new(1 << 16))),
            collectors_down: Arc::default(),
            stop: Arc::new(crate::runtime::StopFlag::default()),
            gpu_map: Arc::default(),
        };
        let p = Progress::default();
        let thread = start(&cfg, &shared, &p).expect("the reader runs");
        // Its first poll registered the rank; its next is 0.5 s away. The collective
        // completes now, and a flush straight after holds it.
        warden_testkit::wait_for("the reader's first poll", warden_testkit::PATIENCE, || {
            (p.ranks() == 1).then_some(())
        });
        shm::stop_task(slot);
        shm::start_child(slot, true);
        shm::stop_child(slot, true);
        p.read_sources();
        let done = cut(&p)
            .iter()
            .flat_map(|j| &j.collectives)
            .any(|e| e.seq == 1 && !e.in_flight());
        shared.stop.raise();
        thread.join().expect("the reader ends");
        assert!(done, "the completion is in the batch cut right after it");
        shm::close(ctx);
    }

    #[test]
    fn a_live_rank_is_registered_and_its_collectives_reported() {
        let node = Node::new();
        let ctx = node.open(0xabc, Some(3));
        for n in 0..3 {
            complete_one(ctx, n);
        }
        ctx.start_task(&allreduce(3)).expect("a slot");
        let (mut t, p) = (node.tracker(), Progress::default());
        let stats = node.poll(&mut t, &p, 1_000);
        assert_eq!((stats.segments, stats.collectives, stats.exits), (1, 4, 0));
        let jobs = cut(&p);
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        assert_eq!(j.job, "job-a");
        assert_eq!(j.ranks.len(), 1);
        assert_eq!((j.ranks[0].rank, j.ranks[0].world_size), (3, 8));
        assert_eq!(j.ranks[0].pid, std::process::id());
        assert_eq!(j.comms.len(), 1);
        let c = &j.comms[0];
        assert_eq!(
            (c.comm, c.rank, c.comm_rank, c.size, c.name.as_str()),
            (0xabc, 3, 1, 4, "dp")
        );
        let seqs: Vec<(u64, bool)> = j
            .collectives
            .iter()
            .map(|e| (e.seq, e.in_flight()))
            .collect();
        assert_eq!(seqs, vec![(1, false), (2, false), (3, false), (4, true)]);
        for e in &j.collectives {
            assert_eq!((e.comm, e.rank, e.op, e.bytes), (0xabc, 3, 1, 4096));
            assert!(e.start_ns > 0);
            assert!(e.in_flight() || e.end_ns >= e.start_ns);
        }

        // Nothing new: nothing new is handed over.
        assert_eq!(node.poll(&mut t, &p, 2_000).collectives, 0);
        shm::close(ctx);
        assert_eq!(node.poll(&mut t, &p, 3_000).segments, 0);
        assert_eq!(t.segments(), 0, "a finalized segment is forgotten");
    }

    #[test]
    fn an_in_flight_collective_completes_when_a_later_one_does() {
        let node = Node::new();
        let ctx = node.open(0xabd, Some(0));
        let slot = ctx.start_task(&allreduce(0)).expect("a slot");
        let (mut t, p) = (node.tracker(), Progress::default());
        node.poll(&mut t, &p, 1_000);
        assert!(cut(&p)[0].collectives[0].in_flight());
        // It completes, and more than a ring's worth of collectives follow.
        shm::stop_task(slot);
        shm::start_child(slot, true);
        shm::stop_child(slot, true);
        for n in 1..200 {
            complete_one(ctx, n);
        }
        node.poll(&mut t, &p, 2_000);
        let coll = &cut(&p)[0].collectives;
        assert!(
            coll.iter().all(|e| !e.in_flight()),
            "nothing left in flight: {coll:?}"
        );
        assert_eq!(
            coll.last().map(|e| e.seq),
            Some(1),
            "the settled one goes last"
        );
        assert_eq!(coll.iter().filter(|e| e.seq == 200).count(), 1);
        shm::close(ctx);
    }

    #[test]
    fn without_child_events_the_enqueue_stands_in_for_completion() {
        let node = Node::new();
        let ctx = node.open(0xabe, Some(0));
        for n in 0..5 {
            shm::stop_task(ctx.start_task(&allreduce(n)).expect("a slot"));
        }
        let (mut t, p) = (node.tracker(), Progress::default());
        node.poll(&mut t, &p, 1_000);
        let coll = &cut(&p)[0].collectives;
        assert_eq!(coll.len(), 1);
        assert_eq!(coll[0].seq, 5);
        assert!(coll[0].end_ns >= coll[0].start_ns && !coll[0].in_flight());
        shm::close(ctx);
    }

    #[test]
    fn a_dead_process_is_reported_once_and_its_segments_go_quiet() {
        let node = Node::new();
        let a = node.open(0xac0, Some(5));
        let b = node.open(0xac1, Some(5));
        a.start_task(&allreduce(0)).expect("a slot");
        let (mut t, p) = (node.tracker(), Progress::default());
        assert_eq!(node.poll(&mut t, &p, 1_000_000).exits, 0);
        cut(&p);
        node.kill();
        let stats = node.poll(&mut t, &p, 3_000_000);
        assert_eq!(
            (stats.exits, stats.segments),
            (1, 0),
            "one exit for two segments"
        );
        let jobs = cut(&p);
        let exit = &jobs[0].processes[0];
        assert_eq!((exit.rank, exit.alive, exit.at_ns), (5, false, 2_000_000));
        assert_eq!((exit.exit_code, exit.signal), (None, None));
        assert!(jobs[0].collectives.is_empty(), "its flight ends with it");
        let again = node.poll(&mut t, &p, 4_000_000);
        assert_eq!((again.exits, again.segments, again.collectives), (0, 0, 0));
        shm::close(a);
        shm::close(b);
    }

    #[test]
    fn a_zombie_tells_its_signal_and_a_reused_pid_is_an_exit() {
        let node = Node::new();
        let ctx = node.open(0xac2, Some(1));
        let (mut t, p) = (node.tracker(), Progress::default());
        node.poll(&mut t, &p, 1_000);
        // Killed by SIGKILL, not reaped yet: state Z, exit_code field 52 = 9, shown to
        // the agent (wchan, field 35, reads 1).
        node.set_stat(|mut f| {
            f[0] = "Z".to_owned();
            f.resize(50, "0".to_owned());
            f[32] = "1".to_owned();
            f[49] = "9".to_owned();
            f
        });
        assert_eq!(node.poll(&mut t, &p, 2_000).exits, 1);
        let exit = cut(&p)[0].processes[0].clone();
        assert_eq!((exit.signal, exit.exit_code), (Some(9), None));
        shm::close(ctx);

        let node = Node::new();
        let ctx = node.open(0xac3, Some(1));
        let (mut t, p) = (node.tracker(), Progress::default());
        node.poll(&mut t, &p, 1_000);
        node.set_stat(|mut f| {
            f[19] = "1".to_owned(); // another start time: another process
            f
        });
        assert_eq!(node.poll(&mut t, &p, 2_000).exits, 1);
        shm::close(ctx);
    }

    #[test]
    fn a_stopped_process_is_alive_and_said_to_be_stopped_until_it_continues() {
        let node = Node::new();
        let ctx = node.open(0xac6, Some(2));
        ctx.start_task(&allreduce(0)).expect("a slot");
        let (mut t, p) = (node.tracker(), Progress::default());
        node.poll(&mut t, &p, 1_000);
        cut(&p);
        // SIGSTOP: state T. Alive, in flight, stopped: the hang's culprit, not a crash.
        node.set_stat(|mut f| {
            f[0] = "T".to_owned();
            f
        });
        for now in [2_000, 3_000] {
            let stats = node.poll(&mut t, &p, now);
            assert_eq!((stats.exits, stats.segments), (0, 1));
            let jobs = cut(&p);
            let state = &jobs[0].processes[0];
            assert_eq!((state.rank, state.alive, state.stopped), (2, true, true));
            assert!(
                jobs[0].collectives.iter().any(|c| c.in_flight()),
                "its flight is still reported"
            );
        }
        // SIGCONT: said once, then nothing more about the process.
        node.set_stat(|f| f);
        node.poll(&mut t, &p, 4_000);
        let state = cut(&p)[0].processes[0].clone();
        assert_eq!((state.alive, state.stopped), (true, false));
        node.poll(&mut t, &p, 5_000);
        assert!(cut(&p).iter().all(|j| j.processes.is_empty()));
        shm::close(ctx);
    }

    #[test]
    fn segments_of_processes_dead_before_the_agent_are_not_news() {
        let node = Node::new();
        let ctx = node.open(0xac4, Some(2));
        ctx.start_task(&allreduce(0)).expect("a slot");
        node.kill();
        let (mut t, p) = (node.tracker(), Progress::default());
        let stats = node.poll(&mut t, &p, 1_000);
        assert_eq!((stats.exits, stats.segments, stats.collectives), (0, 0, 0));
        assert!(cut(&p).is_empty(), "no rank, no flight, no exit");
        shm::close(ctx);
    }

    #[test]
    fn pids_of_another_namespace_are_not_judged() {
        let node = Node::new();
        let ctx = node.open(0xac5, Some(2));
        node.kill();
        let mut t = SegmentTracker::with_pid_namespace(node.proc.path(), Some(1));
        let p = Progress::default();
        let stats = node.poll(&mut t, &p, 1_000);
        assert_eq!(
            (stats.exits, stats.segments),
            (0, 1),
            "reported, never judged dead"
        );
        shm::close(ctx);
    }

    #[test]
    fn segments_without_rank_are_counted_and_a_missing_directory_is_fine() {
        let node = Node::new();
        let ctx = node.open(0xac6, None);
        std::fs::write(node.shm.path().join("nccl-1-2-3.seg"), b"garbage").expect("write");
        std::fs::write(node.shm.path().join("other.txt"), b"not a segment").expect("write");
        let (mut t, p) = (node.tracker(), Progress::default());
        let stats = node.poll(&mut t, &p, 1_000);
        assert_eq!(
            (stats.unattributed, stats.unreadable, stats.segments),
            (1, 1, 0)
        );
        shm::close(ctx);
        let gone = node.shm.path().join("not-there");
        assert_eq!(
            poll_segments(&gone, &mut t, &p, 2_000).expect("poll"),
            PollStats::default()
        );
    }

    fn p2p(send: bool, peer: i32) -> TaskStart {
        TaskStart {
            kind: warden_nccl_profiler::layout::KIND_P2P,
            op: if send { op::SEND } else { op::RECV },
            nccl_seq: 0,
            bytes: 256,
            channels: 1,
            peer,
        }
    }

    /// (comm name, seq, op, in flight) of each p2p record, sorted; `names` holds the
    /// communicators registered so far (a communicator is registered once).
    fn p2p_view(
        jobs: &[JobSignals],
        names: &mut HashMap<u64, String>,
    ) -> Vec<(String, u64, i32, bool)> {
        for c in jobs.iter().flat_map(|j| j.comms.iter()) {
            names.insert(c.comm, c.name.clone());
        }
        let mut view: Vec<_> = jobs
            .iter()
            .flat_map(|j| j.collectives.iter())
            .filter(|e| e.op == 7 || e.op == 8)
            .map(|e| {
                let name = names.get(&e.comm).cloned().unwrap_or_default();
                (name, e.seq, e.op, e.in_flight())
            })
            .collect();
        view.sort();
        view
    }

    #[test]
    fn point_to_point_goes_on_a_communicator_per_pair_and_direction() {
        let node = Node::new();
        // This process is rank 1 of a 4-rank communicator (a pipeline's middle stage).
        let ctx = node.open(0xb01, Some(5));
        for _ in 0..2 {
            for (send, peer) in [(false, 0), (true, 2)] {
                let slot = ctx.start_task(&p2p(send, peer)).expect("a slot");
                shm::stop_task(slot);
                shm::start_child(slot, true);
                shm::stop_child(slot, true);
            }
        }
        // The third receive from rank 0 is posted and never arrives.
        let _waiting = ctx.start_task(&p2p(false, 0)).expect("a slot");
        let (mut t, p) = (node.tracker(), Progress::default());
        let stats = node.poll(&mut t, &p, 1_000);
        assert_eq!(stats.collectives, 5);
        let jobs = cut(&p);
        let recv = "nccl:0000000000000b01:p2p:0>1".to_owned();
        let send = "nccl:0000000000000b01:p2p:1>2".to_owned();
        assert_eq!(
            p2p_view(&jobs, &mut HashMap::new()),
            vec![
                (recv.clone(), 1, 8, false),
                (recv.clone(), 2, 8, false),
                (recv.clone(), 3, 8, true),
                (send.clone(), 1, 7, false),
                (send.clone(), 2, 7, false),
            ]
        );
        let pairs: Vec<(String, u32, u32, u32)> = jobs[0]
            .comms
            .iter()
            .filter(|c| c.size == 2)
            .map(|c| (c.name.clone(), c.rank, c.comm_rank, c.size))
            .collect();
        assert_eq!(
            pairs,
            vec![(recv.clone(), 5, 1, 2), (send.clone(), 5, 0, 2)],
            "the receiver is member 1, the sender member 0; the global rank is the rank"
        );
        // The same id on every rank: the name's FNV-1a, as warden_torch makes them.
        assert!(
            jobs[0]
                .comms
                .iter()
                .any(|c| c.comm == warden_model::ids::fnv1a(send.as_bytes()))
        );
        assert_eq!(node.poll(&mut t, &p, 2_000).collectives, 0, "nothing new");
        shm::close(ctx);
    }

    #[test]
    fn a_transfer_inside_the_node_completes_when_a_later_operation_does() {
        let node = Node::new();
        let ctx = node.open(0xb02, Some(1));
        // Completions show on this communicator (a collective over the network) ...
        complete_one(ctx, 0);
        // ... but not for a send with no child events (shared memory inside the node):
        // in flight ...
        let slot = ctx.start_task(&p2p(true, 3)).expect("a slot");
        shm::stop_task(slot);
        let (mut t, p) = (node.tracker(), Progress::default());
        node.poll(&mut t, &p, 1_000);
        let name = "nccl:0000000000000b02:p2p:1>3".to_owned();
        let names = &mut HashMap::new();
        assert_eq!(p2p_view(&cut(&p), names), vec![(name.clone(), 1, 7, true)]);
        // ... until a collective started after it completes, so it ran before.
        complete_one(ctx, 1);
        node.poll(&mut t, &p, 2_000);
        assert_eq!(p2p_view(&cut(&p), names), vec![(name.clone(), 1, 7, false)]);
        cut(&p); // completions are carried once more in the next batch
        // An operation with no peer or no number, or to itself, is not reported: the
        // batch holds only the send's repeat (its member's newest completion).
        for peer in [-1, 1] {
            let s = ctx.start_task(&p2p(true, peer)).expect("a slot");
            shm::stop_task(s);
        }
        complete_one(ctx, 2);
        node.poll(&mut t, &p, 3_000);
        let view = p2p_view(&cut(&p), names);
        assert_eq!(view, vec![(name.clone(), 1, 7, false)]);
        shm::close(ctx);
    }

    #[test]
    fn a_watched_process_wakes_the_reader_the_moment_it_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let ticks = start_ticks(Path::new("/proc"), pid).expect("its start time");
        let mut t = SegmentTracker::with_pid_namespace("/proc", None);
        t.watch_exits = true;
        let Some(fd) = watch(Path::new("/proc"), pid, ticks) else {
            // No pidfds on this kernel: the poll interval decides, as documented.
            let _ = child.kill();
            let _ = child.wait();
            return;
        };
        assert!(
            watch(Path::new("/proc"), pid, ticks + 1).is_none(),
            "a pid whose start time differs is another process"
        );
        t.processes.insert(
            (pid, ticks),
            Process {
                job: "j".to_owned(),
                rank: 0,
                alive_at_ns: 1,
                exited: false,
                stopped: false,
                pidfd: Some(fd),
                exited_at_ns: None,
            },
        );
        let stop = crate::runtime::StopFlag::default();
        let before = std::time::Instant::now();
        let t = Mutex::new(t);
        assert!(SegmentTracker::wait_for_exit(
            &t,
            Duration::from_millis(300),
            &stop,
            || 7
        ));
        assert!(
            before.elapsed() >= Duration::from_millis(290),
            "no exit: it waited"
        );
        assert_eq!(
            t.lock().expect("tracker").processes[&(pid, ticks)].exited_at_ns,
            None
        );
        child.kill().expect("kill");
        let before = std::time::Instant::now();
        assert!(SegmentTracker::wait_for_exit(
            &t,
            Duration::from_secs(20),
            &stop,
            || 42
        ));
        assert!(
            before.elapsed() < Duration::from_secs(5),
            "the exit woke it: {:?}",
            before.elapsed()
        );
        assert_eq!(
            t.lock().expect("tracker").processes[&(pid, ticks)].exited_at_ns,
            Some(42)
        );
        let _ = child.wait();
        // Nothing watched: it sleeps, and a raised stop flag ends the wait.
        stop.raise();
        assert!(!SegmentTracker::wait_for_exit(
            &t,
            Duration::from_secs(20),
            &stop,
            || 0
        ));
    }
}
