//! The job-side capture socket: training processes (through the `warden_torch` Python
//! package) connect to a Unix stream socket of the agent and send small messages — who
//! they are, the communicators they use, each collective they enter and complete, each
//! step's loss and grad norm, their own exit — and the agent turns them into
//! [`Progress`]. One thread serves every connection, reading them all on a short tick,
//! so the agent wakes at a fixed rate however often processes report. A connection
//! that closes without an exit message is a death (kill -9, the OOM killer, a
//! segfault): it is reported at once, with the wait status when the kernel still holds
//! it; the pids are also looked at now and then.
//!
//! A stream, not datagrams: a Unix datagram socket queues only
//! `net.unix.max_dgram_qlen` (10) messages, which eight ranks finishing the same
//! all-reduce overflow at once; a stream buffers hundreds of kilobytes and tells the
//! agent when its peer dies.
//!
//! Framing (little-endian; docs/CAPTURE.md is the reference): each message is a `u16`
//! length and the message, whose 12-byte header is `b"WT"`, version `1`, kind, pid
//! `u32`, rank `u32`, followed by the kind's body.
//!
//! | kind | body |
//! |------|------|
//! | 1 hello | world `u32`, local rank `i32`, GPU index `i32` (-1: none), pid namespace `u64` (inode of `/proc/self/ns/pid`, 0: unknown), job: `u16` length + UTF-8 |
//! | 2 comm  | comm `u64`, size `u32`, rank in comm `u32`, name: `u16` length + UTF-8 |
//! | 3 start | comm `u64`, seq `u64`, op `u32` (wire `CollOp`), bytes `u64`, at `i64` ns |
//! | 4 end   | comm `u64`, seq `u64`, at `i64` ns |
//! | 5 step  | step `u64`, at `i64` ns, flags `u32` (1 loss, 2 grad norm, 4 tokens/s, 8 op index), loss `f64`, grad norm `f64`, tokens/s `f64`; with flag 8, op index `u32` |
//! | 6 exit  | code `i32`, at `i64` ns, message: `u16` length + UTF-8 |
//!
//! Times are the sender's `CLOCK_REALTIME`, the same clock the agent stamps with. Bytes
//! after a message's body and flags this agent does not know are ignored, so a sender
//! may append fields behind a new flag: an agent that predates flag 8 reads such a step
//! as before and drops the op index.

use std::collections::HashMap;
use std::io;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warden_model::wire::{
    CollectiveEvent, CommInfo, LogRecord, LogStream, MAX_OP_INDEX, ProcessState, RankInfo,
    TrainingMetric,
};

use crate::progress::Progress;
use crate::ship::wall_ns;

/// Datagram magic.
pub const MAGIC: &[u8; 2] = b"WT";
/// Datagram format version.
pub const VERSION: u8 = 1;
/// Header length, bytes.
pub const HEADER_LEN: usize = 12;
/// Most processes tracked at once; hellos beyond are refused.
const MAX_PROCESSES: usize = 4096;
/// Longest job id accepted, bytes.
const MAX_JOB_LEN: usize = 253;
/// Step flag: an op index `u32` follows the step's three numbers.
pub const STEP_OP_INDEX: u32 = 8;

/// One decoded message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A process introduces itself.
    Hello {
        /// Ranks in the job.
        world: u32,
        /// Rank on this node, when known.
        local_rank: Option<u32>,
        /// GPU index, when it uses one.
        gpu: Option<u32>,
        /// The sender's pid namespace (0: unknown); its pid means something to the
        /// agent only in the agent's own namespace.
        pidns: u64,
        /// Job id.
        job: String,
    },
    /// The process is a member of a communicator.
    Comm {
        /// Communicator id.
        comm: u64,
        /// Members.
        size: u32,
        /// The process's rank within it.
        comm_rank: u32,
        /// Name (process group name or description).
        name: String,
    },
    /// The process entered a collective.
    Start {
        /// Communicator id.
        comm: u64,
        /// Sequence number within the communicator (1, 2, ...).
        seq: u64,
        /// Wire `CollOp`.
        op: u32,
        /// Payload bytes.
        bytes: u64,
        /// When, ns.
        at_ns: i64,
    },
    /// The collective completed on this process.
    End {
        /// Communicator id.
        comm: u64,
        /// Sequence number.
        seq: u64,
        /// When, ns.
        at_ns: i64,
    },
    /// A training step's numbers.
    Step {
        /// Step.
        step: u64,
        /// When, ns.
        at_ns: i64,
        /// Loss.
        loss: Option<f64>,
        /// Gradient norm.
        grad_norm: Option<f64>,
        /// Throughput.
        tokens_per_s: Option<f64>,
        /// With warden_torch's input check: the index, from 0, among the process's
        /// collective operations since its previous step, of the first whose input held
        /// a NaN or infinity (not yet bounded: [`Capture::handle`] checks it).
        first_nonfinite_op: Option<u32>,
    },
    /// The process is exiting.
    Exit {
        /// Exit code it expects (1 after an uncaught exception).
        code: i32,
        /// When, ns.
        at_ns: i64,
        /// The exception's last line, if any.
        message: String,
    },
}

impl Message {
    /// The `kind` label of the message metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Comm { .. } => "comm",
            Message::Start { .. } => "start",
            Message::End { .. } => "end",
            Message::Step { .. } => "step",
            Message::Exit { .. } => "exit",
        }
    }
}

/// Why a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not ours, or a version this agent does not speak.
    #[error("not a capture datagram (bad magic or version)")]
    Header,
    /// Shorter than its kind needs.
    #[error("datagram truncated")]
    Truncated,
    /// A kind this agent does not know.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// A string is not UTF-8 or too long.
    #[error("bad string field")]
    Text,
}

/// A little-endian reader over one datagram.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self.0.split_at_checked(N).ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        head.try_into().map_err(|_| DecodeError::Truncated)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.take().map(u32::from_le_bytes)
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        self.take().map(i32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.take().map(u64::from_le_bytes)
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        self.take().map(i64::from_le_bytes)
    }
    fn f64(&mut self) -> Result<f64, DecodeError> {
        self.take().map(f64::from_le_bytes)
    }
    fn text(&mut self, max: usize) -> Result<String, DecodeError> {
        let n = u16::from_le_bytes(self.take()?) as usize;
        let (head, rest) = self.0.split_at_checked(n).ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        if n > max {
            return Err(DecodeError::Text);
        }
        std::str::from_utf8(head)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Text)
    }
}

/// Decode one datagram into (pid, rank, message).
pub fn decode(d: &[u8]) -> Result<(u32, u32, Message), DecodeError> {
    if d.len() < HEADER_LEN || &d[0..2] != MAGIC || d[2] != VERSION {
        return Err(DecodeError::Header);
    }
    let kind = d[3];
    let mut f = Fields(&d[4..]);
    let pid = f.u32()?;
    let rank = f.u32()?;
    let opt = |v: i32| u32::try_from(v).ok();
    let msg = match kind {
        1 => Message::Hello {
            world: f.u32()?,
            local_rank: opt(f.i32()?),
            gpu: opt(f.i32()?),
            pidns: f.u64()?,
            job: f.text(MAX_JOB_LEN)?,
        },
        2 => Message::Comm {
            comm: f.u64()?,
            size: f.u32()?,
            comm_rank: f.u32()?,
            name: f.text(256)?,
        },
        3 => Message::Start {
            comm: f.u64()?,
            seq: f.u64()?,
            op: f.u32()?,
            bytes: f.u64()?,
            at_ns: f.i64()?,
        },
        4 => Message::End {
            comm: f.u64()?,
            seq: f.u64()?,
            at_ns: f.i64()?,
        },
        5 => {
            let step = f.u64()?;
            let at_ns = f.i64()?;
            let flags = f.u32()?;
            let (loss, grad, tps) = (f.f64()?, f.f64()?, f.f64()?);
            let pick = |bit: u32, v: f64| (flags & bit != 0).then_some(v);
            let first_nonfinite_op = if flags & STEP_OP_INDEX != 0 {
                Some(f.u32()?)
            } else {
                None
            };
            Message::Step {
                step,
                at_ns,
                loss: pick(1, loss),
                grad_norm: pick(2, grad),
                tokens_per_s: pick(4, tps),
                first_nonfinite_op,
            }
        }
        6 => Message::Exit {
            code: f.i32()?,
            at_ns: f.i64()?,
            message: f.text(4096)?,
        },
        k => return Err(DecodeError::Kind(k)),
    };
    if rank >= warden_model::wire::MAX_RANK {
        return Err(DecodeError::Truncated);
    }
    Ok((pid, rank, msg))
}

/// What became of a process the agent watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running (or waiting).
    Alive,
    /// Alive but stopped (SIGSTOP, a debugger): it makes no progress by itself.
    Stopped,
    /// Dead but not yet reaped: its wait status, when the agent may read it.
    Zombie(Option<i32>),
    /// Gone.
    Gone,
}

impl Liveness {
    /// Exit code and terminating signal of a dead process, each when known.
    pub fn exit_status(self) -> (Option<i32>, Option<i32>) {
        match self {
            Liveness::Zombie(Some(status)) if status & 0x7f != 0 => (None, Some(status & 0x7f)),
            Liveness::Zombie(Some(status)) => (Some((status >> 8) & 0xff), None),
            _ => (None, None),
        }
    }
}

/// A live training process as one look found it.
#[derive(Debug, Clone, Copy)]
pub struct LiveProcess<'a> {
    /// Its job.
    pub job: &'a str,
    /// Its global rank.
    pub rank: u32,
    /// Its pid.
    pub pid: u32,
    /// When it was looked at (agent clock, ns).
    pub now_ns: i64,
}

/// Tell the controller a live process is stopped (SIGSTOP, a debugger): in every look
/// while it lasts (a lost batch must not hide it) and once when it continues.
/// `was_stopped` is what the last look found; it is updated.
pub fn report_stopped(
    progress: &Progress,
    seen: LiveProcess<'_>,
    state: Liveness,
    was_stopped: &mut bool,
) {
    let stopped = state == Liveness::Stopped;
    if !stopped && !*was_stopped {
        return;
    }
    if stopped != *was_stopped {
        tracing::warn!(job = %seen.job, rank = seen.rank, pid = seen.pid, stopped, "training process stopped or continued");
    }
    *was_stopped = stopped;
    progress.process(
        seen.job,
        ProcessState {
            rank: seen.rank,
            pid: seen.pid,
            at_ns: seen.now_ns,
            alive: true,
            exit_code: None,
            signal: None,
            stopped,
            from_log: false,
        },
    );
}

/// Look a pid up in `proc_root` (normally `/proc`).
pub fn liveness(proc_root: &Path, pid: u32) -> Liveness {
    let stat = match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        Ok(s) => s,
        Err(_) => return Liveness::Gone,
    };
    // Fields after the command name (which may hold spaces and parentheses): state is
    // field 3, exit_code field 52.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Liveness::Alive;
    };
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    match fields.first() {
        Some(&"T") | Some(&"t") => Liveness::Stopped,
        Some(&"Z") | Some(&"X") => {
            // The kernel shows exit_code (field 52) only to those who may ptrace-read
            // the process (the same user, holding every capability it holds, or
            // CAP_SYS_PTRACE) and 0 to everyone else. wchan (field 35) has the same
            // gate and reads 1 for any task not running (Linux 5.16 and later), so a
            // zombie's status is believed only next to a wchan of 1. (Older kernels
            // show an address there, 0 for a zombie: there the status stays unknown.)
            let readable = fields.get(32) == Some(&"1");
            let status = fields.get(49).and_then(|s| s.parse().ok());
            Liveness::Zombie(if readable { status } else { None })
        }
        _ => Liveness::Alive,
    }
}

/// The inode of the agent's pid namespace, which names it.
pub fn own_pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// A process the capture heard from.
#[derive(Debug, Clone)]
struct Member {
    job: String,
    rank: u32,
    /// Last time it was seen alive (agent clock, ns).
    alive_at_ns: i64,
    /// It said goodbye (its exit is already reported).
    said_exit: bool,
    /// Its process was stopped at the last look.
    stopped: bool,
    /// Its pid is in the agent's pid namespace, so `/proc` tells about it.
    pid_visible: bool,
    /// When its connection closed without a goodbye while it still looked alive.
    hung_up_at_ns: Option<i64>,
}

/// The receiving end: turns datagrams into progress and watches the senders' pids.
#[derive(Debug)]
pub struct Capture {
    progress: Progress,
    proc_root: PathBuf,
    /// The agent's own pid namespace.
    own_pidns: Option<u64>,
    members: HashMap<u32, Member>,
}

impl Capture {
    /// A capture feeding `progress`, looking pids up under `proc_root`.
    pub fn new(progress: Progress, proc_root: impl Into<PathBuf>) -> Capture {
        Capture {
            progress,
            proc_root: proc_root.into(),
            own_pidns: own_pid_namespace(),
            members: HashMap::new(),
        }
    }

    /// Ranks known now.
    pub fn ranks(&self) -> usize {
        self.members.len()
    }

    /// Handle one datagram received at `now_ns`; returns the metric kind it counted as.
    pub fn handle(&mut self, datagram: &[u8], now_ns: i64) -> &'static str {
        let (pid, rank, msg) = match decode(datagram) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "capture: refused a datagram");
                return "invalid";
            }
        };
        let kind = msg.kind();
        if let Message::Hello {
            world,
            local_rank: _,
            gpu,
            pidns,
            job,
        } = &msg
        {
            if job.is_empty()
                || (!self.members.contains_key(&pid) && self.members.len() >= MAX_PROCESSES)
            {
                return "invalid";
            }
            let fresh = self
                .members
                .get(&pid)
                .is_none_or(|m| m.job != *job || m.rank != rank);
            self.members.insert(
                pid,
                Member {
                    job: job.clone(),
                    rank,
                    alive_at_ns: now_ns,
                    said_exit: false,
                    stopped: false,
                    pid_visible: *pidns != 0 && Some(*pidns) == self.own_pidns,
                    hung_up_at_ns: None,
                },
            );
            self.progress.rank(
                job,
                RankInfo {
                    rank,
                    world_size: *world,
                    pid,
                    gpu_index: *gpu,
                    gpu_uuid: String::new(),
                },
            );
            if fresh {
                tracing::info!(job = %job, rank, pid, "training process registered");
                self.progress.process(
                    job,
                    ProcessState {
                        rank,
                        pid,
                        at_ns: now_ns,
                        alive: true,
                        exit_code: None,
                        signal: None,
                        stopped: false,
                        from_log: false,
                    },
                );
            }
            return kind;
        }
        let Some(member) = self.members.get_mut(&pid).filter(|m| m.rank == rank) else {
            return "unknown_sender";
        };
        member.alive_at_ns = now_ns;
        let job = member.job.clone();
        match msg {
            Message::Hello { .. } => {}
            Message::Comm {
                comm,
                size,
                comm_rank,
                name,
            } => self.progress.comm(
                &job,
                CommInfo {
                    comm,
                    name,
                    size,
                    rank,
                    comm_rank,
                },
            ),
            Message::Start {
                comm,
                seq,
                op,
                bytes,
                at_ns,
            } => self.progress.started(
                &job,
                CollectiveEvent {
                    comm,
                    rank,
                    seq,
                    op: i32::try_from(op).unwrap_or(0),
                    bytes,
                    start_ns: at_ns,
                    end_ns: 0,
                    xfer_ns: 0,
                },
            ),
            Message::End { comm, seq, at_ns } => self.progress.completed(
                &job,
                CollectiveEvent {
                    comm,
                    rank,
                    seq,
                    end_ns: at_ns.max(1),
                    ..CollectiveEvent::default()
                },
            ),
            Message::Step {
                step,
                at_ns,
                loss,
                grad_norm,
                tokens_per_s,
                first_nonfinite_op,
            } => {
                // An op index past the bound is no index: the step's numbers go on
                // without it, and the message counts as invalid.
                let bounded = first_nonfinite_op.filter(|&op| op <= MAX_OP_INDEX);
                self.progress.metric(
                    &job,
                    TrainingMetric {
                        rank,
                        step,
                        at_ns,
                        loss,
                        grad_norm,
                        tokens_per_s,
                        first_nonfinite_op: bounded,
                    },
                );
                if bounded != first_nonfinite_op {
                    tracing::debug!(job = %job, rank, ?first_nonfinite_op, "capture: op index out of bounds, dropped");
                    return "invalid";
                }
            }
            Message::Exit {
                code,
                at_ns,
                message,
            } => {
                member.said_exit = true;
                if !message.is_empty() {
                    self.progress.log(
                        &job,
                        LogRecord {
                            rank: Some(rank),
                            at_ns,
                            stream: LogStream::Stderr as i32,
                            line: message,
                        },
                    );
                }
                self.progress.process(
                    &job,
                    ProcessState {
                        rank,
                        pid,
                        at_ns,
                        alive: false,
                        exit_code: Some(code),
                        signal: None,
                        stopped: false,
                        from_log: false,
                    },
                );
            }
        }
        kind
    }

    /// The process `pid` closed its connection, seen at `now_ns`. Without an exit
    /// message first that is its death (the kernel closes a dying process's sockets):
    /// it is reported at once, at `now_ns`, with its wait status when the kernel still
    /// holds it. A process that still looks alive is left to the pid checks, which date
    /// its death by this hang-up if they find it gone at their next look.
    pub fn hung_up(&mut self, pid: u32, now_ns: i64) {
        let Some(m) = self.members.get(&pid) else {
            return;
        };
        if m.said_exit {
            self.members.remove(&pid);
            return;
        }
        if !m.pid_visible {
            // Its pid means nothing here: the closed connection is all there is.
            self.report_gone(pid, Liveness::Gone, now_ns);
            return;
        }
        // The socket closes in the middle of the exit: give the kernel a moment to
        // finish it, so the wait status can be read.
        let mut state = liveness(&self.proc_root, pid);
        for _ in 0..10 {
            if !matches!(state, Liveness::Alive | Liveness::Stopped) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
            state = liveness(&self.proc_root, pid);
        }
        if matches!(state, Liveness::Alive | Liveness::Stopped) {
            // Still exiting (a loaded machine), or it lives on: the pid checks decide.
            if let Some(m) = self.members.get_mut(&pid) {
                m.hung_up_at_ns = Some(now_ns);
            }
            return;
        }
        self.report_gone(pid, state, now_ns);
    }

    fn report_gone(&mut self, pid: u32, state: Liveness, at_ns: i64) {
        let Some(m) = self.members.remove(&pid) else {
            return;
        };
        if m.said_exit {
            return;
        }
        let (exit_code, signal) = state.exit_status();
        tracing::warn!(job = %m.job, rank = m.rank, pid, ?exit_code, ?signal, "training process died without an exit report");
        self.progress.process(
            &m.job,
            ProcessState {
                rank: m.rank,
                pid,
                at_ns,
                alive: false,
                exit_code,
                signal,
                stopped: false,
                from_log: false,
            },
        );
    }

    /// Look at every known pid; report those that vanished without saying goodbye.
    pub fn check_pids(&mut self, now_ns: i64) {
        let gone = self.look_at_pids(now_ns);
        self.report_deaths(gone);
    }

    /// Look at every known pid: note the living, and return the dead with their state
    /// and when each died. Report them with [`Capture::report_deaths`] only once their
    /// connections have been read: a process that said goodbye and died since the
    /// last read has its exit message waiting there, and is no death.
    pub fn look_at_pids(&mut self, now_ns: i64) -> Vec<(u32, Liveness, i64)> {
        let mut gone = vec![];
        for (&pid, m) in &mut self.members {
            if !m.pid_visible {
                continue;
            }
            let state = liveness(&self.proc_root, pid);
            match state {
                Liveness::Alive | Liveness::Stopped => {
                    m.alive_at_ns = now_ns;
                    let seen = LiveProcess {
                        job: &m.job,
                        rank: m.rank,
                        pid,
                        now_ns,
                    };
                    report_stopped(&self.progress, seen, state, &mut m.stopped);
                }
                _ => gone.push((pid, state)),
            }
        }
        gone.into_iter()
            .filter_map(|(pid, state)| {
                let m = self.members.get(&pid)?;
                // It died between the last look and this one. A hang-up after the last
                // look is when it died (the kernel closes a dying process's sockets);
                // without one, halfway is the best guess. (Two deaths stamped halfway
                // between the same looks would tie, and a crash's culprit is the first
                // to die.)
                let at_ns = match m.hung_up_at_ns {
                    Some(t) if t >= m.alive_at_ns => t,
                    _ => m.alive_at_ns + (now_ns - m.alive_at_ns) / 2,
                };
                Some((pid, state, at_ns))
            })
            .collect()
    }

    /// Report the deaths [`Capture::look_at_pids`] found, but those that said goodbye
    /// or were reported since.
    pub fn report_deaths(&mut self, gone: Vec<(u32, Liveness, i64)>) {
        for (pid, state, at_ns) in gone {
            self.report_gone(pid, state, at_ns);
        }
    }
}

/// Bind the capture socket at `path`: its directory is created, a stale socket left
/// by an earlier agent is replaced (a live one is not), and the socket is made
/// writable by every local user (training processes run as any user; see
/// docs/CAPTURE.md for what that trusts).
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            // A socket someone still listens on belongs to a running agent: leave it.
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by another process", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// How often pids are looked at while processes are connected.
pub const PID_CHECK_EVERY: Duration = Duration::from_millis(500);
/// How often connections are read while processes are connected: one wake-up per tick
/// for every process on the node, however often they report (a message waits in its
/// socket meanwhile, at most this long).
pub const READ_EVERY: Duration = Duration::from_millis(20);
/// How long the loop waits for a connection when nobody is connected (a connection
/// wakes it at once; the wait bounds how late it sees the agent stopping).
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// Most connections at once; more are closed at once.
const MAX_CONNECTIONS: usize = 1024;
/// Most bytes held for one connection's unfinished message (a message is at most
/// 2 + 65535 bytes).
const MAX_PARTIAL: usize = 1 << 17;

/// One connected process: its socket, the bytes of an unfinished message, and its pid
/// once it said hello.
#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    buf: Vec<u8>,
    pid: Option<u32>,
}

impl Connection {
    /// Read what is waiting and handle every whole message; false once the peer hung up.
    fn pump(
        &mut self,
        capture: &mut Capture,
        chunk: &mut [u8],
        on_message: &mut dyn FnMut(&'static str),
    ) -> bool {
        loop {
            match self.stream.read(chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.frames(capture, on_message);
                    if self.buf.len() > MAX_PARTIAL {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    fn frames(&mut self, capture: &mut Capture, on_message: &mut dyn FnMut(&'static str)) {
        let mut at = 0;
        while let Some(len) = self
            .buf
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        {
            let Some(frame) = self.buf.get(at + 2..at + 2 + len) else {
                break;
            };
            let kind = capture.handle(frame, wall_ns());
            if kind == "hello" {
                self.pid = decode(frame).ok().map(|(p, ..)| p);
            }
            on_message(kind);
            at += 2 + len;
        }
        self.buf.drain(..at);
    }
}

/// Serve training processes on `listener` from this one thread until `stop` says so:
/// accept, read every connection each [`READ_EVERY`] (a connection that closes without
/// an exit message is a death), and look at the pids each [`PID_CHECK_EVERY`].
pub fn serve(
    listener: &UnixListener,
    capture: &mut Capture,
    stop: &mut dyn FnMut(&Capture) -> bool,
    on_message: &mut dyn FnMut(&'static str),
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut conns: Vec<Connection> = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    let mut checked = Instant::now();
    while !stop(capture) {
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if conns.len() < MAX_CONNECTIONS && stream.set_nonblocking(true).is_ok() {
                        conns.push(Connection {
                            stream,
                            buf: Vec::new(),
                            pid: None,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Pids are looked at before the connections are read, and their deaths
        // reported after: all a dead process wrote is in its socket by then, so one
        // that said goodbye just before it died is read as such.
        let dead = if checked.elapsed() >= PID_CHECK_EVERY {
            checked = Instant::now();
            capture.look_at_pids(wall_ns())
        } else {
            vec![]
        };
        // Every hang-up this pass sees gets the pass's time: their order within it is
        // unknown, and stamping each as it is reached would invent one (a crash's
        // culprit is the first to die). They are handled once every connection has
        // been read, so that the wait for a zombie in one cannot make a later death
        // look as early as it.
        let seen_at = wall_ns();
        let mut closed = vec![];
        conns.retain_mut(|c| {
            let open = c.pump(capture, &mut chunk, on_message);
            if !open && let Some(pid) = c.pid {
                closed.push(pid);
            }
            open
        });
        for pid in closed {
            capture.hung_up(pid, seen_at);
        }
        capture.report_deaths(dead);
        let limit = if conns.is_empty() {
            IDLE_WAIT
        } else {
            READ_EVERY
        };
        wait_for_news(listener, &conns, limit);
    }
    Ok(())
}

/// Block until a connection is waiting on `listener`, a connected process hangs up,
/// or `limit` has passed. Messages do not wake it (they wait for the next tick), but a
/// hang-up does: a death is stamped within a scheduling delay of the socket closing,
/// so two deaths a few milliseconds apart are told apart.
fn wait_for_news(listener: &UnixListener, conns: &[Connection], limit: Duration) {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let timeout = Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    let mut fds = Vec::with_capacity(conns.len() + 1);
    fds.push(PollFd::new(listener, PollFlags::IN));
    fds.extend(
        conns
            .iter()
            .map(|c| PollFd::new(&c.stream, PollFlags::RDHUP)),
    );
    if poll(&mut fds, Some(&timeout)).is_err() {
        // EINTR or a kernel without poll on sockets: fall back to sleeping.
        std::thread::sleep(limit);
    }
}

/// Start the capture thread when enabled: it binds the socket unless `bound` holds
/// the result of an earlier [`bind`] (a failure marks the `capture` collector down and
/// leaves the rest of the agent running) and feeds
/// `progress` until the agent stops.
pub fn start(
    cfg: &crate::config::CaptureConfig,
    bound: Option<io::Result<UnixListener>>,
    shared: &crate::runtime::Shared,
    progress: &Progress,
) -> Option<std::thread::JoinHandle<()>> {
    if !cfg.enabled {
        return None;
    }
    let listener = match bound.unwrap_or_else(|| bind(&cfg.socket)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(socket = %cfg.socket.display(), error = %e, "job-side capture is down: cannot bind its socket");
            shared.set_up("capture", false);
            return None;
        }
    };
    shared.set_up("capture", true);
    tracing::info!(socket = %cfg.socket.display(), "job-side capture listening");
    let mut capture = Capture::new(progress.clone(), cfg.proc_root.clone());
    let (shared, path) = (shared.clone(), cfg.socket.clone());
    crate::collectors::spawn("capture", move || {
        let metrics = shared.metrics.clone();
        let dropped = metrics.records_dropped.with_label_values(&["capture_full"]);
        let result = serve(
            &listener,
            &mut capture,
            &mut |c| {
                metrics.capture_ranks.set(c.ranks() as i64);
                crate::metrics::advance(&dropped, c.progress.dropped());
                shared.stop.is_raised()
            },
            &mut |kind| metrics.capture_messages.with_label_values(&[kind]).inc(),
        );
        if let Err(e) = result {
            tracing::error!(error = %e, "job-side capture stopped");
            shared.set_up("capture", false);
        }
        let _ = std::fs::remove_file(&path);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ship::Pending;

    fn header(kind: u8, pid: u32, rank: u32) -> Vec<u8> {
        let mut d = b"WT".to_vec();
        d.push(VERSION);
        d.push(kind);
        d.extend(pid.to_le_bytes());
        d.extend(rank.to_le_bytes());
        d
    }

    fn text(d: &mut Vec<u8>, s: &str) {
        d.extend((s.len() as u16).to_le_bytes());
        d.extend(s.as_bytes());
    }

    fn hello(pid: u32, rank: u32, job: &str) -> Vec<u8> {
        let mut d = header(1, pid, rank);
        d.extend(8u32.to_le_bytes());
        d.extend(1i32.to_le_bytes());
        d.extend((-1i32).to_le_bytes());
        d.extend(own_pid_namespace().unwrap_or(0).to_le_bytes());
        text(&mut d, job);
        d
    }

    fn start(pid: u32, rank: u32, seq: u64, at: i64) -> Vec<u8> {
        let mut d = header(3, pid, rank);
        d.extend(9u64.to_le_bytes());
        d.extend(seq.to_le_bytes());
        d.extend(1u32.to_le_bytes());
        d.extend(4096u64.to_le_bytes());
        d.extend(at.to_le_bytes());
        d
    }

    /// An exit message: `code` at `at`, with last words `message`.
    fn bye(pid: u32, rank: u32, code: i32, at: i64, message: &str) -> Vec<u8> {
        let mut d = header(6, pid, rank);
        d.extend(code.to_le_bytes());
        d.extend(at.to_le_bytes());
        text(&mut d, message);
        d
    }

    fn end(pid: u32, rank: u32, seq: u64, at: i64) -> Vec<u8> {
        let mut d = header(4, pid, rank);
        d.extend(9u64.to_le_bytes());
        d.extend(seq.to_le_bytes());
        d.extend(at.to_le_bytes());
        d
    }

    fn fake_proc(pids: &[(u32, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (pid, stat) in pids {
            let p = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&p).expect("pid dir");
            std::fs::write(p.join("stat"), stat).expect("stat");
        }
        dir
    }

    #[test]
    fn every_kind_decodes_and_truncation_is_refused() {
        let h = hello(42, 3, "job-1");
        assert_eq!(
            decode(&h),
            Ok((
                42,
                3,
                Message::Hello {
                    world: 8,
                    local_rank: Some(1),
                    gpu: None,
                    pidns: own_pid_namespace().unwrap_or(0),
                    job: "job-1".into()
                }
            ))
        );
        for n in 0..h.len() {
            assert!(
                decode(&h[..n]).is_err(),
                "a {n}-byte prefix must be refused"
            );
        }
        let mut step = header(5, 42, 3);
        step.extend(7u64.to_le_bytes());
        step.extend(5i64.to_le_bytes());
        step.extend(3u32.to_le_bytes());
        step.extend(f64::NAN.to_le_bytes());
        step.extend(2.5f64.to_le_bytes());
        step.extend(99f64.to_le_bytes());
        let Ok((
            _,
            _,
            Message::Step {
                loss,
                grad_norm,
                tokens_per_s,
                ..
            },
        )) = decode(&step)
        else {
            panic!("step does not decode");
        };
        assert!(loss.is_some_and(f64::is_nan));
        assert_eq!((grad_norm, tokens_per_s), (Some(2.5), None));
        assert_eq!(decode(&header(99, 1, 1)), Err(DecodeError::Kind(99)));
        let mut bad = hello(1, 1, "j");
        bad[2] = 2;
        assert_eq!(decode(&bad), Err(DecodeError::Header));
        let mut utf = header(6, 1, 1);
        utf.extend(1i32.to_le_bytes());
        utf.extend(0i64.to_le_bytes());
        utf.extend(2u16.to_le_bytes());
        utf.extend([0xff, 0xfe]);
        assert_eq!(decode(&utf), Err(DecodeError::Text));
    }

    fn step_msg(pid: u32, rank: u32, step_no: u64, flags: u32, tail: &[u8]) -> Vec<u8> {
        let mut d = header(5, pid, rank);
        d.extend(step_no.to_le_bytes());
        d.extend(5i64.to_le_bytes());
        d.extend(flags.to_le_bytes());
        d.extend(2.0f64.to_le_bytes());
        d.extend(f64::NAN.to_le_bytes());
        d.extend(0f64.to_le_bytes());
        d.extend(tail);
        d
    }

    fn op_of(d: &[u8]) -> Result<Option<u32>, DecodeError> {
        match decode(d)? {
            (
                _,
                _,
                Message::Step {
                    first_nonfinite_op, ..
                },
            ) => Ok(first_nonfinite_op),
            (_, _, m) => panic!("not a step: {m:?}"),
        }
    }

    #[test]
    fn a_step_carries_its_op_index_behind_flag_8_and_refuses_it_cut_short() {
        assert_eq!(
            op_of(&step_msg(1, 1, 7, 3 | 8, &12u32.to_le_bytes())),
            Ok(Some(12))
        );
        assert_eq!(
            op_of(&step_msg(1, 1, 7, 3, &[])),
            Ok(None),
            "a step of before"
        );
        let cut = step_msg(1, 1, 7, 3 | 8, &12u32.to_le_bytes());
        for n in cut.len() - 4..cut.len() {
            assert_eq!(op_of(&cut[..n]), Err(DecodeError::Truncated), "{n} bytes");
        }
    }

    #[test]
    fn unknown_step_flags_and_trailing_bytes_are_ignored() {
        // What lets a sender add a field behind a new flag: an agent that does not
        // know the flag reads the rest as before (as one predating flag 8 reads it).
        let later = step_msg(1, 1, 7, 3 | 16 | 32, &[0xAB; 12]);
        assert_eq!(op_of(&later), Ok(None));
        let with_op = step_msg(1, 1, 7, 3 | 8 | 16, &[9, 0, 0, 0, 0xAB, 0xAB]);
        assert_eq!(op_of(&with_op), Ok(Some(9)));
    }

    #[test]
    fn an_op_index_past_the_bound_is_dropped_and_counted_invalid_but_the_step_stays() {
        let procs = fake_proc(&[(42, "42 (python3) S 1 2 3")]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        cap.handle(&hello(42, 3, "job-1"), 1);
        let fine = step_msg(42, 3, 7, 3 | 8, &MAX_OP_INDEX.to_le_bytes());
        assert_eq!(cap.handle(&fine, 2), "step");
        let wild = step_msg(42, 3, 8, 3 | 8, &(MAX_OP_INDEX + 1).to_le_bytes());
        assert_eq!(cap.handle(&wild, 3), "invalid");
        let mut pending = Pending::default();
        progress.flush(1_000, &mut pending);
        let jobs = pending.take_jobs();
        let got: Vec<_> = jobs[0]
            .metrics
            .iter()
            .map(|m| {
                (
                    m.step,
                    m.grad_norm.is_some_and(f64::is_nan),
                    m.first_nonfinite_op,
                )
            })
            .collect();
        assert_eq!(got, [(7, true, Some(MAX_OP_INDEX)), (8, true, None)]);
    }

    #[test]
    fn messages_become_progress_and_strangers_are_ignored() {
        let procs = fake_proc(&[(42, "42 (python3) S 1 2 3")]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        assert_eq!(cap.handle(&start(42, 3, 1, 100), 1), "unknown_sender");
        assert_eq!(cap.handle(&hello(42, 3, "job-1"), 1), "hello");
        assert_eq!(cap.handle(&start(42, 3, 1, 100), 2), "start");
        assert_eq!(
            cap.handle(&start(42, 4, 1, 100), 2),
            "unknown_sender",
            "rank must match"
        );
        let mut pending = Pending::default();
        progress.flush(1_000, &mut pending);
        let jobs = pending.take_jobs();
        assert_eq!(jobs[0].job, "job-1");
        assert_eq!(jobs[0].ranks[0].pid, 42);
        assert_eq!(jobs[0].processes.len(), 1, "process start");
        assert_eq!(jobs[0].collectives[0].start_ns, 100);
        assert!(jobs[0].collectives[0].in_flight());

        assert_eq!(cap.handle(&end(42, 3, 1, 300), 3), "end");
        progress.flush(2_000, &mut pending);
        let jobs = pending.take_jobs();
        let c = &jobs[0].collectives[0];
        assert_eq!((c.start_ns, c.end_ns, c.bytes, c.op), (100, 300, 4096, 1));
        assert_eq!(cap.handle(b"garbage", 4), "invalid");
    }

    #[test]
    fn a_vanished_process_is_an_exit_and_a_zombie_tells_its_signal() {
        // pid 7: gone; pid 8: zombie killed by SIGKILL (status 9); pid 9: said goodbye.
        // wchan (field 35) 1: the agent may read its exit status.
        let mut zombie = "8 (python3) Z".to_owned();
        for i in 0..48 {
            zombie.push_str(if i == 31 { " 1" } else { " 0" });
        }
        zombie.push_str(" 9");
        let procs = fake_proc(&[(8, &zombie)]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        for (pid, rank) in [(7, 0), (8, 1), (9, 2)] {
            cap.handle(&hello(pid, rank, "j"), 1_000);
        }
        cap.handle(
            &bye(9, 2, 1, 1_500, "RuntimeError: Connection closed by peer"),
            1_500,
        );
        cap.check_pids(3_000);
        assert_eq!(cap.ranks(), 0);
        let mut pending = Pending::default();
        progress.flush(4_000, &mut pending);
        let jobs = pending.take_jobs();
        let exits: Vec<_> = jobs[0].processes.iter().filter(|p| !p.alive).collect();
        assert_eq!(exits.len(), 3, "{exits:?}");
        let by_rank = |r| exits.iter().find(|p| p.rank == r).expect("exit of rank");
        assert_eq!(
            (by_rank(0).exit_code, by_rank(0).signal, by_rank(0).at_ns),
            (None, None, 2_000)
        );
        assert_eq!((by_rank(1).exit_code, by_rank(1).signal), (None, Some(9)));
        assert_eq!((by_rank(2).exit_code, by_rank(2).at_ns), (Some(1), 1_500));
        assert_eq!(
            jobs[0].logs[0].line,
            "RuntimeError: Connection closed by peer"
        );
    }

    #[test]
    fn a_goodbye_waiting_when_the_pid_was_found_gone_is_no_death() {
        // Rank 0 sends its exit message and dies between two reads of its connection;
        // the pid check finds it gone before the message is read. The serving loop
        // looks at pids, then reads, then reports: the exit is the goodbye's.
        let running = format!("9 (python3) R{}", " 0".repeat(49));
        let procs = fake_proc(&[(9, &running)]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        cap.handle(&hello(9, 0, "j"), 1_000);
        std::fs::remove_dir_all(procs.path().join("9")).expect("remove pid 9");
        let dead = cap.look_at_pids(3_000);
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(cap.handle(&bye(9, 0, 0, 2_000, ""), 3_010), "exit");
        cap.report_deaths(dead);
        cap.hung_up(9, 3_020);
        assert_eq!(cap.ranks(), 0);
        let mut pending = Pending::default();
        progress.flush(4_000, &mut pending);
        let jobs = pending.take_jobs();
        let exits: Vec<_> = jobs[0].processes.iter().filter(|p| !p.alive).collect();
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert_eq!((exits[0].exit_code, exits[0].at_ns), (Some(0), 2_000));
    }

    #[test]
    fn a_death_the_pid_checks_find_after_a_hang_up_is_dated_by_the_hang_up() {
        // Each hangs up while /proc still shows it running (an exit still under way on
        // a loaded machine); the pid checks find 7 and 8 gone at the next look, 9 still
        // alive, and gone only at the look after.
        let running = |pid: u32| format!("{pid} (python3) R{}", " 0".repeat(49));
        let procs = fake_proc(&[(7, &running(7)), (8, &running(8)), (9, &running(9))]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        for (pid, rank) in [(7, 0), (8, 1), (9, 2)] {
            cap.handle(&hello(pid, rank, "j"), 1_000);
        }
        cap.hung_up(7, 2_000);
        cap.hung_up(8, 2_500);
        cap.hung_up(9, 2_000);
        assert_eq!(cap.ranks(), 3, "alive at the hang-up: not reported yet");
        for pid in [7, 8] {
            std::fs::remove_dir_all(procs.path().join(pid.to_string())).expect("rm");
        }
        cap.check_pids(2_800);
        std::fs::remove_dir_all(procs.path().join("9")).expect("rm");
        cap.check_pids(3_000);
        let mut pending = Pending::default();
        progress.flush(4_000, &mut pending);
        let jobs = pending.take_jobs();
        let at = |r| {
            jobs[0]
                .processes
                .iter()
                .find(|p| p.rank == r && !p.alive)
                .map(|p| p.at_ns)
        };
        // 7 and 8 died at their hang-ups, in that order, not together halfway between
        // two looks; 9 lived past its hang-up, so halfway it is.
        assert_eq!(
            (at(0), at(1), at(2)),
            (Some(2_000), Some(2_500), Some(2_900))
        );
    }

    #[test]
    fn a_zombie_status_the_agent_may_not_read_is_unknown_not_zero() {
        // What a process without ptrace access to pid 8 reads: wchan and exit_code 0.
        let stat = |wchan: &str, status: &str| {
            let mut f = vec!["0"; 50];
            f[0] = "Z";
            f[32] = wchan;
            f[49] = status;
            format!("8 (python3) {}", f.join(" "))
        };
        let hidden = fake_proc(&[(8, &stat("0", "0"))]);
        assert_eq!(liveness(hidden.path(), 8), Liveness::Zombie(None));
        assert_eq!(Liveness::Zombie(None).exit_status(), (None, None));
        // With access: exit(0), exit(3) and SIGKILL.
        for (status, want) in [
            ("0", (Some(0), None)),
            ("768", (Some(3), None)),
            ("9", (None, Some(9))),
        ] {
            let shown = fake_proc(&[(8, &stat("1", status))]);
            let l = liveness(shown.path(), 8);
            assert_eq!(l.exit_status(), want, "{status}: {l:?}");
        }
    }

    #[test]
    fn a_pid_from_another_namespace_is_never_looked_up() {
        let procs = fake_proc(&[]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        let mut h = hello(1, 0, "j");
        let at = HEADER_LEN + 12;
        h[at..at + 8].copy_from_slice(&12345u64.to_le_bytes());
        assert_eq!(cap.handle(&h, 1), "hello");
        cap.check_pids(10);
        assert_eq!(
            cap.ranks(),
            1,
            "pid 1 of a container is not the agent's pid 1"
        );
        cap.hung_up(1, 20);
        assert_eq!(
            cap.ranks(),
            0,
            "a closed connection is a death all the same"
        );
    }

    #[test]
    fn a_stopped_process_is_said_while_it_lasts_and_once_when_it_ends() {
        let procs = fake_proc(&[(5, "5 (python3) T 1 2 3")]);
        let progress = Progress::default();
        let mut cap = Capture::new(progress.clone(), procs.path());
        cap.handle(&hello(5, 1, "j"), 1);
        let mut pending = Pending::default();
        progress.flush(2, &mut pending);
        pending.take_jobs();
        let stopped_records = |cap: &mut Capture, now| {
            cap.check_pids(now);
            let mut pending = Pending::default();
            progress.flush(now, &mut pending);
            let jobs = pending.take_jobs();
            jobs.first()
                .map(|j| {
                    j.processes
                        .iter()
                        .map(|p| (p.alive, p.stopped))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        assert_eq!(stopped_records(&mut cap, 10), [(true, true)]);
        assert_eq!(stopped_records(&mut cap, 20), [(true, true)], "repeated");
        std::fs::write(procs.path().join("5/stat"), "5 (python3) S 1 2 3").expect("stat");
        assert_eq!(stopped_records(&mut cap, 30), [(true, false)], "continued");
        assert!(stopped_records(&mut cap, 40).is_empty());
    }

    #[test]
    fn a_connection_that_closes_without_goodbye_is_a_death() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sub/capture.sock");
        let first = bind(&path).expect("bind");
        let err = bind(&path).expect_err("a live socket is not taken over");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        drop(first);
        let listener = bind(&path).expect("rebind over a stale socket");

        // pid 7 is not in this fake /proc: once it hangs up, it is dead.
        let procs = fake_proc(&[]);
        let progress = Progress::default();
        let mut capture = Capture::new(progress.clone(), procs.path());
        let server = std::thread::spawn(move || {
            let mut seen = vec![];
            let mut hello_seen = false;
            // A bound for a reader that never sees the hang-up; a working one stops at it.
            let deadline = Instant::now() + warden_testkit::scaled(warden_testkit::PATIENCE);
            serve(
                &listener,
                &mut capture,
                &mut |c| {
                    hello_seen |= c.ranks() > 0;
                    (hello_seen && c.ranks() == 0) || Instant::now() > deadline
                },
                &mut |k| seen.push(k),
            )
            .expect("serve");
            seen
        });
        let mut client = UnixStream::connect(&path).expect("connect");
        let mut frames = vec![];
        for m in [hello(7, 0, "j"), start(7, 0, 1, 100)] {
            frames.extend((m.len() as u16).to_le_bytes());
            frames.extend(m);
        }
        // Split mid-frame: the reader must put frames back together. The pauses make
        // separate reads likely; the assertions hold whichever reads the reader makes.
        use std::io::Write;
        client.write_all(&frames[..5]).expect("write");
        std::thread::sleep(Duration::from_millis(100));
        client.write_all(&frames[5..]).expect("write");
        std::thread::sleep(Duration::from_millis(100));
        drop(client);
        assert_eq!(server.join().expect("server"), vec!["hello", "start"]);
        let mut pending = Pending::default();
        progress.flush(wall_ns(), &mut pending);
        let jobs = pending.take_jobs();
        let exit = jobs[0]
            .processes
            .iter()
            .find(|p| !p.alive)
            .expect("an exit");
        assert_eq!(
            (exit.rank, exit.pid, exit.exit_code, exit.signal),
            (0, 7, None, None)
        );
        assert!(
            jobs[0].collectives.is_empty(),
            "a dead rank is not in flight"
        );

        let file = dir.path().join("plain");
        std::fs::write(&file, "x").expect("file");
        assert!(bind(&file).is_err(), "a regular file is never removed");
    }

    #[test]
    fn a_hang_up_wakes_the_reader_and_a_message_does_not() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("capture.sock");
        let listener = bind(&path).expect("bind");
        let mut client = UnixStream::connect(&path).expect("connect");
        let (stream, _) = listener.accept().expect("accept");
        let conns = [Connection {
            stream,
            buf: Vec::new(),
            pid: None,
        }];

        client.write_all(b"\x01\x00x").expect("write");
        let waited = Instant::now();
        wait_for_news(&listener, &conns, Duration::from_millis(300));
        assert!(
            waited.elapsed() >= Duration::from_millis(250),
            "a message woke the reader after {:?}",
            waited.elapsed()
        );

        drop(client);
        // Woken, the wait ends at once; not woken, it lasts twice the patience.
        let patience = warden_testkit::scaled(warden_testkit::PATIENCE);
        let waited = Instant::now();
        wait_for_news(&listener, &conns, 2 * patience);
        assert!(
            waited.elapsed() < patience,
            "a hang-up did not wake the reader (waited {:?})",
            waited.elapsed()
        );
    }
}
