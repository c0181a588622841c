//! Per-job state built from agent batches: ranks, communicators and their progress,
//! per-rank compute and transfer statistics, process exits, training metrics, and GPU
//! faults per node. Applying a record is idempotent; stale and duplicate records change
//! nothing. Times are corrected for each agent's clock offset on the way in, so
//! everything stored is on the controller's clock, except durations, which are measured
//! on one agent's clock and need no correction.

use rustc_hash::{FxHashMap, FxHashSet};
use warden_model::wire::{
    Batch, CollectiveEvent, CommInfo, EventSeverity, JobSignals, LogRecord, NodeEvent,
    NodeEventKind, ProcessState, RankInfo, TrainingMetric,
};
use warden_model::{CommId, Timestamp};

use crate::engine::EngineStats;
use crate::lifecycle::{Applied, JobLifecycle, LifecycleReport, Phase};
use crate::links::Links;
use warden_model::view::{CommProgressView, JobView, RankView, rel};

/// "No node" in [`RankState::node`].
pub const NO_NODE: u32 = u32::MAX;

/// Samples of compute time kept per rank.
pub const COMPUTE_RING: usize = 32;
/// Gaps between collectives kept per rank.
pub const GAP_RING: usize = 32;
/// Per-collective maximum waits kept per communicator (for the adaptive hang bound).
pub const WAIT_RING: usize = 64;
/// How long after a collective first completed a member's agent must still report the
/// member inside it for the member to count as stuck there, seconds: longer than
/// members of a healthy collective finish apart.
pub const PARTIAL_CONFIRM_SECS: f64 = 0.1;
/// Clock-offset samples kept per agent.
const OFFSET_SAMPLES: usize = 32;
/// Node events remembered per boot for deduplication before the set is reset.
const MAX_SEEN_EVENTS: usize = 256;
/// A job its scheduler says is running is forgotten only after this long without any
/// report, seconds (a lost end must not keep it forever).
pub const RUNNING_RETENTION_SECS: f64 = 7.0 * 86_400.0;

/// A fixed-size ring of the most recent samples.
#[derive(Debug, Clone)]
pub struct Ring<T: Copy + Default, const N: usize> {
    buf: [T; N],
    len: usize,
    next: usize,
}

impl<T: Copy + Default, const N: usize> Default for Ring<T, N> {
    fn default() -> Self {
        Ring {
            buf: [T::default(); N],
            len: 0,
            next: 0,
        }
    }
}

impl<T: Copy + Default, const N: usize> Ring<T, N> {
    /// Add a sample, evicting the oldest when full.
    pub fn push(&mut self, v: T) {
        self.buf[self.next] = v;
        self.next = (self.next + 1) % N;
        self.len = (self.len + 1).min(N);
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most recent `k` samples (fewer if it holds fewer), newest first.
    pub fn recent(&self, k: usize) -> impl Iterator<Item = T> + '_ {
        let k = k.min(self.len);
        (1..=k).map(move |i| self.buf[(self.next + N - i) % N])
    }
}

/// Median of a slice (reordered in place, linear time); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    let (left, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let upper = *mid;
    if n % 2 == 1 {
        return Some(upper);
    }
    let lower = left.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((lower + upper) / 2.0)
}

/// What the controller knows about one node's agent.
#[derive(Debug, Clone)]
pub struct AgentState {
    /// Node name.
    pub node: String,
    /// Agent instance id.
    pub agent_id: String,
    /// Boot id of the node.
    pub boot_id: String,
    /// Last batch sequence number seen from this agent instance.
    pub last_seq: u64,
    /// When the last batch arrived (controller clock).
    pub last_heard: Timestamp,
    /// Estimated agent clock minus controller clock, ns.
    pub offset_ns: i64,
    offset_samples: Ring<i64, OFFSET_SAMPLES>,
    seen_events: FxHashSet<u64>,
    /// Collectors the agent reports down.
    pub collectors_down: Vec<String>,
}

impl AgentState {
    fn new(node: &str) -> Self {
        AgentState {
            node: node.to_owned(),
            agent_id: String::new(),
            boot_id: String::new(),
            last_seq: 0,
            last_heard: Timestamp::ZERO,
            offset_ns: 0,
            offset_samples: Ring::default(),
            seen_events: FxHashSet::default(),
            collectors_down: Vec::new(),
        }
    }

    /// Agent time → controller time.
    #[inline]
    pub fn correct(&self, agent_ns: i64) -> Timestamp {
        Timestamp(agent_ns.saturating_sub(self.offset_ns))
    }
}

/// A process exit.
#[derive(Debug, Clone, PartialEq)]
pub struct ExitRecord {
    /// When it exited (controller clock).
    pub at: Timestamp,
    /// When the controller learned of it.
    pub received_at: Timestamp,
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal, if it was killed.
    pub signal: Option<i32>,
    /// Whether its last words blame a peer ("connection closed by peer", ...).
    pub peer_symptom: bool,
    /// Process id.
    pub pid: u32,
    /// Read from the launcher's failure report in a log, not observed (its time is
    /// when the report was read).
    pub from_log: bool,
}

impl ExitRecord {
    /// Whether the exit is a failure: a non-zero code, a signal, or no status at all
    /// (the process vanished: SIGKILL, the OOM killer, a crash the agent saw only as a
    /// missing pid).
    pub fn abnormal(&self) -> bool {
        self.code != Some(0) || self.signal.is_some()
    }

    /// Whether it went down with others rather than first: its last words blame a peer,
    /// or it was terminated (SIGTERM: what a launcher or a scheduler sends the workers
    /// it tears down once another has failed).
    pub fn torn_down(&self) -> bool {
        self.peer_symptom || self.signal == Some(15)
    }

    /// "signal 11 (SIGSEGV)" or "exit code 1".
    pub fn describe(&self) -> String {
        match (self.signal, self.code) {
            (Some(s), _) => format!("signal {s} ({})", signal_name(s)),
            (None, Some(c)) => format!("exit code {c}"),
            (None, None) => "vanished without an exit status".to_owned(),
        }
    }
}

/// Conventional name of a Unix signal.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// A rank's own log said one of its collectives timed out waiting for its peers
/// (PyTorch's NCCL watchdog, gloo's "Timed out waiting ...").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedOut {
    /// When the line was read (controller clock).
    pub at: Timestamp,
    /// When the controller learned of it.
    pub received_at: Timestamp,
    /// How long it had waited, seconds, when the line says.
    pub waited_secs: Option<f64>,
}

/// The first non-finite training metric a rank reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    /// Step at which it appeared.
    pub step: u64,
    /// 0 when the loss was non-finite (forward pass), 1 when only the gradient norm was.
    pub stage: u8,
    /// When it was measured (controller clock).
    pub at: Timestamp,
    /// When the controller learned of it.
    pub received_at: Timestamp,
}

/// The first collective input a rank found non-finite before the reduction
/// (warden_torch's input check, `TrainingMetric::first_nonfinite_op`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFiniteInput {
    /// Step whose operations it was among.
    pub step: u64,
    /// Index, from 0, among the rank's collective operations since its previous step
    /// mark.
    pub op: u32,
    /// When the step was marked (controller clock).
    pub at: Timestamp,
}

/// One compute-time sample: the rank's time outside collectives over one iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ComputeSample {
    /// Seconds of compute in the iteration.
    pub secs: f32,
    /// Length of the iteration in seconds (its own clock).
    pub period: f32,
    /// When the iteration ended (controller clock).
    pub at: Timestamp,
}

/// Everything known about one rank.
#[derive(Debug, Clone)]
pub struct RankState {
    /// Whether any record has mentioned it.
    pub known: bool,
    /// Index of its node in [`Cluster::nodes`], or [`NO_NODE`].
    pub node: u32,
    /// GPU index on the node.
    pub gpu: Option<u32>,
    /// Process id.
    pub pid: u32,
    /// Its communicators: (index into [`JobState::comms`], member slot there).
    pub comms: Vec<(u32, u32)>,
    /// Exit, once it exited.
    pub exit: Option<ExitRecord>,
    /// Whether a log line of its blamed a peer.
    pub peer_symptom: bool,
    /// Its first collective timeout, from its log: it waited for someone else.
    pub timed_out: Option<TimedOut>,
    /// Since when its process is stopped (SIGSTOP, a debugger), while it is.
    pub stopped_since: Option<Timestamp>,
    /// Its last few error-looking log lines (for evidence).
    pub last_errors: Vec<String>,
    /// When anything was last heard about it (controller clock).
    pub last_seen: Timestamp,
    /// Last step reported.
    pub step: Option<u64>,
    /// Last loss reported.
    pub loss: Option<f64>,
    /// Last gradient norm reported.
    pub grad_norm: Option<f64>,
    /// First non-finite metric.
    pub nonfinite: Option<NonFinite>,
    /// First non-finite collective input of the current non-finite episode (an earlier
    /// one that no non-finite metric followed is replaced by a later one).
    pub nonfinite_input: Option<NonFiniteInput>,
    /// Compute time per iteration, most recent last.
    pub compute: Ring<ComputeSample, COMPUTE_RING>,
    /// Which of `comms` closes an iteration (the least frequent one), once known: the
    /// fallback for ranks that report no step marks.
    pub anchor: Option<u32>,
    /// The last step mark (step, when on the rank's own clock), once the rank reports
    /// steps: its iterations then run from one step mark to the next, whatever number
    /// of collectives, buckets, micro-batches or shards a step holds.
    pub last_mark: Option<(u64, i64)>,
    /// A step mark whose iteration is not measured yet: (step, when on the rank's own
    /// clock, when on the controller's). The mark can arrive before the completions of
    /// the collectives it closes (the NCCL plugin's segments are read every 0.5 s,
    /// `warden_torch.step()` goes out at once), so the iteration is measured once a
    /// collective entered after the mark has completed, or at the next mark.
    pending_mark: Option<(u64, i64, Timestamp)>,
    /// Length of the first iteration after the first step mark, seconds (its compute is
    /// not measured).
    pub first_period: Option<f32>,
    /// Collectives completed since the last step mark: (start, end) on its own clock,
    /// communicator and sequence number.
    spans: Vec<Span>,
    /// Recent gaps between finishing one collective and entering the next, seconds: how
    /// long this rank is normally away from collectives.
    pub gaps: Ring<f32, GAP_RING>,
    period_start_ns: i64,
    period_wait_ns: i64,
    period_dirty: bool,
}

impl Default for RankState {
    fn default() -> Self {
        RankState {
            known: false,
            node: NO_NODE,
            gpu: None,
            pid: 0,
            stopped_since: None,
            comms: Vec::new(),
            exit: None,
            peer_symptom: false,
            timed_out: None,
            last_errors: Vec::new(),
            last_seen: Timestamp::ZERO,
            step: None,
            loss: None,
            grad_norm: None,
            nonfinite: None,
            nonfinite_input: None,
            compute: Ring::default(),
            anchor: None,
            last_mark: None,
            pending_mark: None,
            first_period: None,
            spans: Vec::new(),
            gaps: Ring::default(),
            period_start_ns: 0,
            period_wait_ns: 0,
            period_dirty: true,
        }
    }
}

impl RankState {
    /// Whether its process is (as far as we know) running.
    pub fn alive(&self) -> bool {
        self.exit.is_none()
    }

    /// What its iterations are measured from.
    pub fn iterations(&self) -> IterationSource {
        if self.last_mark.is_some() {
            IterationSource::Steps
        } else {
            IterationSource::Collectives
        }
    }

    /// A step mark: it closes the iteration that began at the previous one, measured
    /// once the collectives it holds have been read ([`RankState::pending_mark`]).
    fn mark_step(&mut self, step: u64, at_ns: i64, at: Timestamp) {
        let newest = self
            .pending_mark
            .map(|(s, _, _)| s)
            .or(self.last_mark.map(|(s, _)| s));
        if newest.is_some_and(|prev| step <= prev) {
            return; // a repeat (non-finite metrics are sent twice) or a stale record
        }
        self.settle_mark();
        if self.last_mark.is_none() {
            self.close_iteration(step, at_ns, at);
        } else {
            self.pending_mark = Some((step, at_ns, at));
        }
    }

    /// Measure the iteration of the pending step mark, if there is one.
    fn settle_mark(&mut self) {
        if let Some((step, at_ns, at)) = self.pending_mark.take() {
            self.close_iteration(step, at_ns, at);
        }
    }

    /// A collective entered at `start_ns` (own clock) completed: if it was entered after
    /// the pending step mark, every collective of the mark's iteration has been read.
    fn entered_after_mark(&mut self, start_ns: i64) {
        if self
            .pending_mark
            .is_some_and(|(_, at_ns, _)| start_ns > at_ns)
        {
            self.settle_mark();
        }
    }

    /// Close the iteration up to the mark at `at_ns`. Its compute is the time between
    /// the marks not covered by any collective (the union of the collectives' spans, so
    /// overlapping asynchronous ones count once).
    fn close_iteration(&mut self, step: u64, at_ns: i64, at: Timestamp) {
        match self.last_mark {
            // A repeat (non-finite metrics are sent twice) or a stale record.
            Some((prev, _)) if step <= prev => return,
            Some((prev, from)) => {
                // Marks further apart than one step (a program that reports every few
                // steps, a lost batch) give the mean of the steps between them.
                let steps = step - prev;
                let period = at_ns - from;
                // The first iteration after the first mark may lack spans whose records
                // were applied before that mark (not kept yet): its compute is not
                // measured, only its length.
                let first = self.compute.is_empty() && self.first_period.is_none();
                if first && period > 0 && steps <= MAX_STEPS_PER_MARK {
                    self.first_period = Some(period as f32 / 1e9 / steps as f32);
                } else if steps <= MAX_STEPS_PER_MARK && !self.period_dirty && period > 0 {
                    let steps = steps as f32;
                    let busy = covered(&mut self.spans, from, at_ns);
                    self.compute.push(ComputeSample {
                        secs: (period - busy).max(0) as f32 / 1e9 / steps,
                        period: period as f32 / 1e9 / steps,
                        at,
                    });
                }
            }
            None => {
                // Iterations from here on come from the marks; samples taken between
                // completions of the anchor communicator measured something else.
                self.compute = Ring::default();
                self.anchor = None;
            }
        }
        self.spans.retain(|&(_, end, _, _)| end > at_ns);
        self.last_mark = Some((step, at_ns));
        self.period_dirty = false;
        self.period_wait_ns = 0;
    }

    /// A new process for this rank (an in-place restart): its steps start over,
    /// perhaps from a checkpoint's.
    fn steps_start_over(&mut self) {
        self.last_mark = None;
        self.pending_mark = None;
        self.first_period = None;
        self.spans.clear();
    }
}

/// How a rank's iterations are delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IterationSource {
    /// By the job's own step marks (`warden_torch.step()`).
    Steps,
    /// No step marks: by completions of the rank's least frequent communicator, which
    /// is one iteration only when that communicator runs once per step.
    Collectives,
}

impl IterationSource {
    /// Its name in the API.
    pub fn name(self) -> &'static str {
        match self {
            IterationSource::Steps => "steps",
            IterationSource::Collectives => "collectives",
        }
    }
}

/// Step marks further apart than this many steps measure nothing (a restart from a
/// checkpoint, a counter that is not the step).
pub const MAX_STEPS_PER_MARK: u64 = 100;

/// Spans of collectives kept per rank between two step marks (32 bytes each); more, and
/// the iteration is not measured.
pub const MAX_SPANS: usize = 1024;

/// A completed collective in a rank's open step: start and end on its own clock, its
/// communicator and sequence number.
type Span = (i64, i64, u32, u64);

/// Nanoseconds of `[from, to)` covered by the union of `spans` (sorted in place).
fn covered(spans: &mut [Span], from: i64, to: i64) -> i64 {
    spans.sort_unstable();
    let mut total = 0;
    let mut reach = from;
    for &(s, e, _, _) in spans.iter() {
        let s = s.max(reach);
        let e = e.min(to);
        if e > s {
            total += e - s;
            reach = e;
        }
    }
    total
}

/// One member of a communicator.
#[derive(Debug, Clone, Default)]
pub struct Member {
    /// Global rank.
    pub rank: u32,
    /// Last sequence number it entered.
    pub last_started_seq: u64,
    /// When it entered it (controller clock).
    pub last_started_at: Timestamp,
    /// The operation it entered (wire `CollOp`).
    pub last_started_op: i32,
    /// Last sequence number that completed on it.
    pub last_completed_seq: u64,
    /// When that completed (controller clock).
    pub last_completed_at: Timestamp,
    /// When the member entered the collective that completed last (controller clock):
    /// on a device path the host enqueues ahead of the device, so a collective can
    /// complete after later ones were entered.
    pub last_completed_entered_at: Timestamp,
    /// Completed collectives seen.
    pub completions: u32,
    /// When (controller clock) its agent last reported it still inside
    /// `last_started_seq`: a wait is confirmed only as long as agents keep saying so.
    pub inflight_seen: Timestamp,
}

/// One communicator.
#[derive(Debug, Clone)]
pub struct CommState {
    /// Hash.
    pub id: CommId,
    /// Name, when registered.
    pub name: String,
    /// Registered size (0 when unknown).
    pub size: u32,
    /// Members, in the order they became known.
    pub members: Vec<Member>,
    /// Highest sequence number completed by any member.
    pub max_completed_seq: u64,
    /// When it completed (controller clock).
    pub max_completed_at: Timestamp,
    /// Operation of the last collective seen.
    pub op: i32,
    /// Payload of the last collective seen.
    pub bytes: u64,
    /// Oldest start of an in-flight record for a sequence number nobody completed yet;
    /// [`Timestamp::MAX`] when none. A hint: detectors confirm by scanning members.
    pub inflight_since: Timestamp,
    /// Maximum wait per recent collective, seconds.
    pub waits: Ring<f32, WAIT_RING>,
    block_max: f32,
    block_n: u32,
    /// Highest sequence number any member entered.
    pub max_started_seq: u64,
    /// Members that entered `max_started_seq`: fewer than all means some lag behind.
    pub at_max_started: u32,
    /// Earliest entry into `max_started_seq` among its members (controller clock).
    pub max_started_first_at: Timestamp,
    /// [`JobState::inside_one_node`] as last computed, for the job's placements
    /// generation and member count it was computed at.
    one_node: std::cell::Cell<OneNode>,
}

/// A communicator's cached answer to whether its members sit on one node.
#[derive(Debug, Clone, Copy)]
struct OneNode {
    placements: u64,
    members: usize,
    value: bool,
}

impl Default for OneNode {
    fn default() -> Self {
        OneNode {
            placements: u64::MAX,
            members: 0,
            value: false,
        }
    }
}

impl CommState {
    /// Whether member `m` is still inside the collective this communicator completed
    /// last, which completed on other members: its agent said it was inside in a batch
    /// cut more than [`PARTIAL_CONFIRM_SECS`] after the first completion. An agent
    /// stops saying so once the member completes, so a lost completion record ages out
    /// of this instead of looking like a wait.
    pub fn partially_completed(&self, m: &Member) -> bool {
        m.last_started_seq == self.max_completed_seq
            && m.last_completed_seq < m.last_started_seq
            && m.inflight_seen > self.max_completed_at.plus_secs(PARTIAL_CONFIRM_SECS)
    }

    fn new(id: CommId) -> Self {
        CommState {
            id,
            name: String::new(),
            size: 0,
            members: Vec::new(),
            max_completed_seq: 0,
            max_completed_at: Timestamp::ZERO,
            op: 0,
            bytes: 0,
            inflight_since: Timestamp::MAX,
            waits: Ring::default(),
            block_max: 0.0,
            block_n: 0,
            max_started_seq: 0,
            at_max_started: 0,
            max_started_first_at: Timestamp::MAX,
            one_node: Default::default(),
        }
    }

    /// The operation of sequence number `seq`, as a member that entered it reported it
    /// (the communicator's last operation seen when none did).
    pub fn op_of(&self, seq: u64) -> i32 {
        self.members
            .iter()
            .find(|m| m.last_started_seq == seq && m.last_started_op != 0)
            .map_or(self.op, |m| m.last_started_op)
    }

    /// Name for people: the registered name, or the hash.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            format!("comm {}", self.id)
        } else {
            format!("comm {}", self.name)
        }
    }

    fn record_wait(&mut self, secs: f32) {
        self.block_max = self.block_max.max(secs);
        self.block_n += 1;
        if self.block_n >= self.members.len().max(1) as u32 {
            self.waits.push(self.block_max);
            self.block_max = 0.0;
            self.block_n = 0;
        }
    }
}

/// A GPU's hardware trouble, folded over its events.
#[derive(Debug, Clone)]
pub struct GpuTrouble {
    /// Node index.
    pub node: u32,
    /// GPU index; `None` when the events named no GPU.
    pub gpu: Option<u32>,
    /// First event (controller clock).
    pub first_at: Timestamp,
    /// Last event.
    pub last_at: Timestamp,
    /// When the first event was received.
    pub received_at: Timestamp,
    /// Worst severity seen.
    pub severity: EventSeverity,
    /// (kind, code, count) per distinct event.
    pub codes: Vec<(NodeEventKind, Option<u32>, u32)>,
    /// The first line of the worst event.
    pub message: String,
}

/// The rank states of one job by global rank, sparse: a slot for each rank heard of,
/// so a rank number a client sends sizes nothing. Iteration is in rank order.
#[derive(Debug, Default)]
pub struct RankTable {
    slots: Vec<RankState>,
    ids: Vec<u32>,
    index: FxHashMap<u32, u32>,
    /// Slots in ascending rank order, built when first iterated after a rank was added.
    order: std::sync::OnceLock<Vec<u32>>,
}

impl RankTable {
    /// Rank `rank`, if heard of.
    pub fn get(&self, rank: u32) -> Option<&RankState> {
        self.index.get(&rank).map(|&s| &self.slots[s as usize])
    }

    /// Rank `rank`, if heard of, to change.
    pub fn get_mut(&mut self, rank: u32) -> Option<&mut RankState> {
        self.index.get(&rank).map(|&s| &mut self.slots[s as usize])
    }

    /// Whether rank `rank` was heard of.
    pub fn contains(&self, rank: u32) -> bool {
        self.index.contains_key(&rank)
    }

    /// Ranks heard of.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no rank was heard of.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// (rank, state) in ascending rank order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &RankState)> {
        let order = self.order.get_or_init(|| {
            let mut v: Vec<u32> = (0..self.slots.len() as u32).collect();
            v.sort_unstable_by_key(|&s| self.ids[s as usize]);
            v
        });
        order
            .iter()
            .map(|&s| (self.ids[s as usize], &self.slots[s as usize]))
    }

    /// Every rank's state, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &RankState> {
        self.slots.iter()
    }

    /// Every rank's state to change, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut RankState> {
        self.slots.iter_mut()
    }

    /// Rank `rank`, added if new.
    fn entry(&mut self, rank: u32) -> &mut RankState {
        let s = match self.index.get(&rank) {
            Some(&s) => s,
            None => {
                let s = self.slots.len() as u32;
                self.slots.push(RankState::default());
                self.ids.push(rank);
                self.index.insert(rank, s);
                self.order.take();
                s
            }
        };
        &mut self.slots[s as usize]
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.ids.clear();
        self.index.clear();
        self.order.take();
    }
}

impl std::ops::Index<u32> for RankTable {
    type Output = RankState;

    /// Rank `rank`; panics when it was never heard of (callers index only ranks they
    /// just added or found).
    fn index(&self, rank: u32) -> &RankState {
        self.get(rank).expect("rank heard of")
    }
}

impl std::ops::IndexMut<u32> for RankTable {
    fn index_mut(&mut self, rank: u32) -> &mut RankState {
        self.get_mut(rank).expect("rank heard of")
    }
}

/// Everything known about one job.
#[derive(Debug, Default)]
pub struct JobState {
    /// Name.
    pub name: String,
    /// World size, when registered.
    pub world_size: u32,
    /// Ranks by global rank.
    pub ranks: RankTable,
    /// Communicators.
    pub comms: Vec<CommState>,
    comm_index: FxHashMap<u64, u32>,
    /// When a batch or a scheduler's report last carried anything about this job
    /// (controller clock).
    pub last_heard: Timestamp,
    /// What its scheduler said about its start and end, if anything.
    pub lifecycle: Option<JobLifecycle>,
    /// When remediation asked for this run to be restarted (controller clock): the
    /// exits that follow are the restart tearing the run down, not a crash. Cleared
    /// when the next run starts.
    pub restart_requested_at: Option<Timestamp>,
    /// Per-peer network timing (the NCCL plugin's proxy steps).
    pub links: Links,
    /// The node of the first rank placed, and whether a rank was placed on another: a
    /// job on several nodes closes its ranks' iterations on a communicator that spans
    /// nodes ([`choose_anchor`]).
    first_node: Option<u32>,
    multi_node: bool,
    /// Bumped whenever a rank's node changes: the generation of cached placements.
    placements: u64,
    /// While a batch is applied: ranks it may still add, the bounds, and what it could
    /// not add.
    budget: Budget,
}

/// What the batch being applied may still add to a job, and what it could not.
#[derive(Debug, Default, Clone, Copy)]
struct Budget {
    new_ranks: usize,
    bytes: usize,
    max_comms: usize,
    max_comms_per_rank: usize,
    refused_ranks: u64,
    refused_comms: u64,
    refused_links: u64,
}

impl JobState {
    /// When its scheduler said it ended (`None` while running or when no scheduler
    /// reported).
    pub fn ended_at(&self) -> Option<Timestamp> {
        self.lifecycle.as_ref().and_then(|l| l.ended_at)
    }

    /// The scheduler started the job again (a requeue): what the last run's processes
    /// did (progress, collectives, exits, a stopped process) is no evidence about the
    /// new one, whose ranks and communicators start over.
    fn new_run(&mut self) {
        self.ranks.clear();
        self.comms.clear();
        self.comm_index.clear();
        self.links.clear();
        self.first_node = None;
        self.multi_node = false;
        self.restart_requested_at = None;
    }

    /// Rank `rank`, added if new and the budget allows; `None` (and counted) if not.
    fn rank_mut(&mut self, rank: u32) -> Option<&mut RankState> {
        if !self.ranks.contains(rank) {
            if self.budget.new_ranks == 0 || self.budget.bytes < RANK_COST {
                self.budget.refused_ranks += 1;
                return None;
            }
            self.budget.new_ranks -= 1;
            self.budget.bytes -= RANK_COST;
        }
        let r = self.ranks.entry(rank);
        r.known = true;
        Some(r)
    }

    /// Communicator `comm`'s index, added if new and under the bound.
    fn comm_idx(&mut self, comm: u64) -> Option<u32> {
        if let Some(&i) = self.comm_index.get(&comm) {
            return Some(i);
        }
        if self.comms.len() >= self.budget.max_comms || self.budget.bytes < COMM_COST {
            self.budget.refused_comms += 1;
            return None;
        }
        self.budget.bytes -= COMM_COST;
        let i = self.comms.len() as u32;
        self.comms.push(CommState::new(CommId(comm)));
        self.comm_index.insert(comm, i);
        Some(i)
    }

    /// The member slot of `rank` in communicator `ci`, creating it if needed and under
    /// the bounds.
    fn slot(&mut self, ci: u32, rank: u32) -> Option<u32> {
        let max_per_rank = self.budget.max_comms_per_rank;
        let r = self.rank_mut(rank)?;
        if let Some(&(_, s)) = r.comms.iter().find(|(c, _)| *c == ci) {
            return Some(s);
        }
        if r.comms.len() >= max_per_rank || self.budget.bytes < MEMBER_COST {
            self.budget.refused_comms += 1;
            return None;
        }
        self.budget.bytes -= MEMBER_COST;
        let comm = &mut self.comms[ci as usize];
        let s = comm.members.len() as u32;
        comm.members.push(Member {
            rank,
            ..Member::default()
        });
        self.ranks[rank].comms.push((ci, s));
        Some(s)
    }

    /// Look up a communicator by hash.
    pub fn comm(&self, id: u64) -> Option<&CommState> {
        self.comm_index.get(&id).map(|&i| &self.comms[i as usize])
    }

    /// Whether rank `r` is inside a collective that has not completed on it (it is
    /// blocked there), as opposed to computing or idle. A rank does one thing at a time:
    /// an in-flight record older than the rank's latest completion is stale (its
    /// completion was lost), not a wait. A collective can complete on some members and
    /// not on others (a ring whose member stopped halfway through): a member inside a
    /// sequence number that others completed is blocked there only while its agent
    /// keeps saying so after they did (see [`CommState::partially_completed`]).
    pub fn blocked_in(&self, r: u32) -> Option<(u32, u64)> {
        let rank = self.ranks.get(r)?;
        let progress = self.moved_on_at(r);
        rank.comms.iter().find_map(|&(ci, s)| {
            let c = &self.comms[ci as usize];
            let m = &c.members[s as usize];
            (m.last_started_seq > m.last_completed_seq
                && m.last_started_at >= progress
                && (m.last_started_seq > c.max_completed_seq || c.partially_completed(m)))
            .then_some((ci, m.last_started_seq))
        })
    }

    /// Rank `rank` (held) runs on `node`: a move invalidates cached placements
    /// ([`JobState::inside_one_node`]).
    fn put_on_node(&mut self, rank: u32, node: u32) {
        if let Some(r) = self.ranks.get_mut(rank)
            && r.node != node
        {
            r.node = node;
            self.placements = self.placements.wrapping_add(1);
        }
        self.saw_node(node);
    }

    /// A rank was placed on `node`.
    fn saw_node(&mut self, node: u32) {
        if node == NO_NODE {
            return;
        }
        match self.first_node {
            None => self.first_node = Some(node),
            Some(first) => self.multi_node |= first != node,
        }
    }

    /// Whether every member of `c` is known to be on one node. Cached per communicator
    /// until a member joins or a rank of the job moves.
    pub fn inside_one_node(&self, c: &CommState) -> bool {
        let cached = c.one_node.get();
        if cached.placements == self.placements && cached.members == c.members.len() {
            return cached.value;
        }
        let node = |r: u32| self.ranks.get(r).map_or(NO_NODE, |x| x.node);
        let value = c
            .members
            .first()
            .map(|m| node(m.rank))
            .is_some_and(|first| {
                first != NO_NODE
                    && c.members.len() > 1
                    && c.members.iter().all(|m| node(m.rank) == first)
            });
        c.one_node.set(OneNode {
            placements: self.placements,
            members: c.members.len(),
            value,
        });
        value
    }

    /// Whether rank `r` entered, in a communicator it shares with rank `p`, an
    /// operation that `p` never entered.
    pub fn entered_what_peer_never_did(&self, r: u32, p: u32) -> bool {
        let (Some(rank), Some(peer)) = (self.ranks.get(r), self.ranks.get(p)) else {
            return false;
        };
        rank.comms.iter().any(|&(ci, s)| {
            peer.comms.iter().any(|&(pci, ps)| {
                pci == ci && {
                    let c = &self.comms[ci as usize];
                    c.members[s as usize].last_started_seq > c.members[ps as usize].last_started_seq
                }
            })
        })
    }

    /// A high quantile (the 90th percentile) of rank `r`'s recent gaps between
    /// collectives, seconds; `None` until it has a few.
    pub fn usual_gap(&self, r: u32) -> Option<f64> {
        let rank = self.ranks.get(r)?;
        if rank.gaps.len() < 4 {
            return None;
        }
        let mut v: Vec<f32> = rank.gaps.recent(GAP_RING).collect();
        v.sort_unstable_by(f32::total_cmp);
        Some(f64::from(v[(v.len() * 9 / 10).min(v.len() - 1)]))
    }

    /// When rank `r` last completed any collective ([`Timestamp::ZERO`] if never).
    pub fn last_progress(&self, r: u32) -> Timestamp {
        self.ranks.get(r).map_or(Timestamp::ZERO, |rank| {
            rank.comms
                .iter()
                .map(|&(ci, s)| self.comms[ci as usize].members[s as usize].last_completed_at)
                .max()
                .unwrap_or(Timestamp::ZERO)
        })
    }

    /// When rank `r` entered the latest-entered collective that has completed on it
    /// ([`Timestamp::ZERO`] if none): a record of a collective it entered before that
    /// is not where the rank is now. Entry times, not completion times: a device path
    /// (NCCL) enqueues several collectives ahead and they complete later, one by one,
    /// while the rank is already inside the last one.
    pub fn moved_on_at(&self, r: u32) -> Timestamp {
        self.ranks.get(r).map_or(Timestamp::ZERO, |rank| {
            rank.comms
                .iter()
                .map(|&(ci, s)| {
                    self.comms[ci as usize].members[s as usize].last_completed_entered_at
                })
                .max()
                .unwrap_or(Timestamp::ZERO)
        })
    }

    /// Ranks whose process exited.
    pub fn exited(&self) -> usize {
        self.ranks.values().filter(|r| r.exit.is_some()).count()
    }

    /// Ranks known.
    pub fn known_ranks(&self) -> usize {
        self.ranks.values().filter(|r| r.known).count()
    }

    /// Typical iteration length, seconds: per rank the median of its last few
    /// iterations (so a checkpoint pause does not count), then the median over ranks.
    pub fn iteration_secs(&self) -> Option<f64> {
        // Called several times a pass over every rank of the job: no allocation per rank.
        let mut v: Vec<f64> = Vec::with_capacity(self.ranks.len());
        v.extend(self.ranks.values().filter_map(|r| {
            let mut p = [0.0_f64; 5];
            let mut n = 0;
            for s in r.compute.recent(5) {
                p[n] = f64::from(s.period);
                n += 1;
            }
            median(&mut p[..n]).or(r.first_period.map(f64::from))
        }));
        median(&mut v)
    }

    /// Distinct node indices of the job's ranks.
    pub fn node_indices(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .ranks
            .values()
            .map(|r| r.node)
            .filter(|&n| n != NO_NODE)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// What one controller holds at most, whatever its clients send: each bound caps memory
/// that a client's names and numbers would otherwise size. Records past a bound are
/// dropped and counted ([`EngineStats::refused`]); nothing already held is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Jobs held at once.
    pub max_jobs: usize,
    /// Ranks held at once, over all jobs (about 1 KiB each).
    pub max_ranks: usize,
    /// Nodes (agents) held at once.
    pub max_nodes: usize,
    /// Communicators per job.
    pub max_comms_per_job: usize,
    /// Communicators one rank is a member of.
    pub max_comms_per_rank: usize,
    /// Distinct (kind, code) pairs kept per GPU's trouble record.
    pub max_codes_per_gpu: usize,
    /// Bytes of job state (ranks, communicators, memberships, spans of the open step)
    /// held at once, over all jobs, as the engine counts them.
    pub max_state_bytes: usize,
}

/// What a rank's state costs, bytes: itself and its place in the table.
const RANK_COST: usize = std::mem::size_of::<RankState>() + 48;
/// What one kept error line costs at most.
const ERROR_LINE_COST: usize = MAX_ERROR_LINE_BYTES + 24;
/// What a node (its agent's state) costs at most: the state, its name, its recent event
/// ids, its collectors.
const NODE_COST: usize = std::mem::size_of::<AgentState>()
    + 2 * warden_model::wire::MAX_NAME_LEN
    + MAX_SEEN_EVENTS * 12
    + 8 * 88;
/// What a communicator costs at most: itself, its name, its place in the index.
const COMM_COST: usize = std::mem::size_of::<CommState>() + warden_model::wire::MAX_ID_LEN + 32;
/// What one rank's membership of a communicator costs.
const MEMBER_COST: usize = std::mem::size_of::<Member>() + 8;
/// What one kept span of the open step costs.
const SPAN_COST: usize = 32;

/// Bytes of a job's state as the budget counts them.
fn job_bytes(j: &JobState) -> usize {
    j.ranks.len() * RANK_COST
        + j.ranks.values().map(|r| r.spans.len()).sum::<usize>() * SPAN_COST
        + j.comms.len() * COMM_COST
        + j.comms.iter().map(|c| c.members.len()).sum::<usize>() * MEMBER_COST
        + j.ranks.values().map(|r| r.last_errors.len()).sum::<usize>() * ERROR_LINE_COST
        + j.links.bytes()
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_jobs: 4_096,
            max_ranks: 131_072,
            max_nodes: 65_536,
            max_comms_per_job: 65_536,
            max_comms_per_rank: 128,
            max_codes_per_gpu: 32,
            max_state_bytes: 128 << 20,
        }
    }
}

/// What a [`Cluster`] holds, bound by bound of [`Limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Jobs.
    pub jobs: usize,
    /// Ranks over all jobs.
    pub ranks: usize,
    /// Nodes.
    pub nodes: usize,
    /// Communicators of the job with the most.
    pub comms_per_job: usize,
    /// Communicators of the rank in the most.
    pub comms_per_rank: usize,
    /// Distinct codes of the GPU with the most.
    pub codes_per_gpu: usize,
    /// Bytes of job state, as the budget counts them.
    pub state_bytes: usize,
}

impl Held {
    /// Whether everything held is within `l`.
    pub fn within(&self, l: &Limits) -> bool {
        self.jobs <= l.max_jobs
            && self.ranks <= l.max_ranks
            && self.nodes <= l.max_nodes
            && self.comms_per_job <= l.max_comms_per_job
            && self.comms_per_rank <= l.max_comms_per_rank
            && self.codes_per_gpu <= l.max_codes_per_gpu
            && self.state_bytes <= l.max_state_bytes
    }
}

/// Everything the controller knows about jobs and nodes.
#[derive(Debug, Default)]
pub struct Cluster {
    /// Bounds on what is held.
    pub limits: Limits,
    /// Ranks held over all jobs (kept with [`Limits::max_ranks`]).
    ranks_held: usize,
    /// Bytes of job state held, as [`job_bytes`] counts them (kept with
    /// [`Limits::max_state_bytes`]).
    state_bytes: usize,
    /// Jobs by name.
    pub jobs: FxHashMap<String, JobState>,
    /// Agents by node name.
    pub agents: FxHashMap<String, AgentState>,
    /// Node names; ranks refer to nodes by index here.
    pub nodes: Vec<String>,
    node_index: FxHashMap<String, u32>,
    /// Hardware trouble per (node index, GPU index).
    pub gpu_trouble: FxHashMap<(u32, Option<u32>), GpuTrouble>,
    /// Per node index: the moment (controller clock) its agent last cut a batch. What
    /// we know about a node's ranks is true as of then, not as of now.
    pub node_cut: Vec<Timestamp>,
    /// Per node index: when lost records from its agent were last noticed.
    node_gap: Vec<Timestamp>,
}

/// Log lines that mean "a peer went away", which make an exit a symptom, not a cause.
const PEER_FAILURE_MARKERS: [&str; 7] = [
    "connection closed by peer",
    "connection reset by peer",
    "remote process exited",
    "peer closed",
    "broken pipe",
    "communicator was aborted",
    "sigterm",
];

/// Whether a (lowercased) log line reports one of the rank's own collectives timing
/// out, and how long it waited (seconds) where it says: gloo's `Timed out waiting
/// 1800000ms for recv operation to complete`, ProcessGroupNCCL's `Watchdog caught
/// collective operation timeout: WorkNCCL(... Timeout(ms)=600000) ran for 600010
/// milliseconds`, its later `Timeout at NCCL work` / `failure detected by watchdog`.
pub fn collective_timeout(lower: &str) -> Option<Option<f64>> {
    let ms_after = |key: &str| -> Option<f64> {
        let at = lower.find(key)? + key.len();
        let digits: String = lower[at..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .take(12)
            .collect();
        digits.parse::<f64>().ok().map(|ms| ms / 1000.0)
    };
    if lower.contains("timed out waiting") && lower.contains("operation to complete") {
        return Some(ms_after("timed out waiting"));
    }
    if lower.contains("watchdog caught collective operation timeout") {
        return Some(ms_after("ran for"));
    }
    // gloo, on a rank whose own wait timed out on another thread's pair.
    if lower.contains("timeout at nccl work")
        || lower.contains("failure detected by watchdog")
        || lower.contains("application timeout caused pair closure")
    {
        return Some(None);
    }
    None
}

/// Log lines worth keeping as crash evidence.
const ERROR_MARKERS: [&str; 8] = [
    "error",
    "exception",
    "traceback",
    "segmentation fault",
    "fatal",
    "abort",
    "killed",
    "core dumped",
];

impl Cluster {
    /// What is held now, to hold against [`Limits`].
    pub fn held(&self) -> Held {
        Held {
            jobs: self.jobs.len(),
            ranks: self.jobs.values().map(|j| j.ranks.len()).sum(),
            nodes: self.nodes.len(),
            comms_per_job: self.jobs.values().map(|j| j.comms.len()).max().unwrap_or(0),
            comms_per_rank: self
                .jobs
                .values()
                .flat_map(|j| j.ranks.values().map(|r| r.comms.len()))
                .max()
                .unwrap_or(0),
            codes_per_gpu: self
                .gpu_trouble
                .values()
                .map(|t| t.codes.len())
                .max()
                .unwrap_or(0),
            state_bytes: self.jobs.values().map(job_bytes).sum::<usize>()
                + self.nodes.len() * NODE_COST,
        }
    }

    /// An empty cluster held within `limits`.
    pub fn with_limits(limits: Limits) -> Self {
        Cluster {
            limits,
            ..Cluster::default()
        }
    }

    /// Count the ranks and bytes held again, after jobs were forgotten or started over.
    fn recount_ranks(&mut self) {
        self.ranks_held = self.jobs.values().map(|j| j.ranks.len()).sum();
        self.state_bytes =
            self.jobs.values().map(job_bytes).sum::<usize>() + self.nodes.len() * NODE_COST;
    }

    /// Index of a node name, adding it if new.
    pub fn node_idx(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.node_index.get(name) {
            return i;
        }
        let i = self.nodes.len() as u32;
        self.nodes.push(name.to_owned());
        self.node_index.insert(name.to_owned(), i);
        i
    }

    /// When node index `i`'s agent last cut a batch ([`Timestamp::ZERO`] if never).
    pub fn cut_of(&self, i: u32) -> Timestamp {
        self.node_cut
            .get(i as usize)
            .copied()
            .unwrap_or(Timestamp::ZERO)
    }

    /// Name of node index `i`.
    pub fn node_name(&self, i: u32) -> &str {
        self.nodes
            .get(i as usize)
            .map(String::as_str)
            .unwrap_or("?")
    }

    /// Apply one decoded batch received at `now`; returns records applied.
    pub fn apply(&mut self, batch: Batch, now: Timestamp, stats: &mut EngineStats) -> usize {
        if !self.node_index.contains_key(&batch.node)
            && (self.nodes.len() >= self.limits.max_nodes
                || self.state_bytes + NODE_COST > self.limits.max_state_bytes)
        {
            let n = batch.events.len() as u64 + batch.jobs.iter().map(records).sum::<u64>();
            *stats.refused.entry("nodes").or_default() += n.max(1);
            return 0;
        }
        if !self.node_index.contains_key(&batch.node) {
            self.state_bytes += NODE_COST;
        }
        let node = self.node_idx(&batch.node);
        let agent = self
            .agents
            .entry(batch.node.clone())
            .or_insert_with(|| AgentState::new(&batch.node));
        if agent.agent_id != batch.agent_id || agent.boot_id != batch.boot_id {
            if agent.boot_id != batch.boot_id {
                agent.seen_events.clear();
            }
            agent.agent_id.clone_from(&batch.agent_id);
            agent.boot_id.clone_from(&batch.boot_id);
            agent.last_seq = 0;
        }
        if batch.seq > agent.last_seq + 1 && agent.last_seq != 0 {
            stats.batch_gaps += 1;
        }
        // Agents carry each batch's completions again in the next batch: only two or
        // more lost in a row lose records.
        let gap = batch.seq > agent.last_seq + 2 && agent.last_seq != 0;
        agent.last_seq = agent.last_seq.max(batch.seq);
        agent.last_heard = now;
        // The agent's clock minus ours, less the (positive) transit time: the largest
        // recent sample is the best estimate of the offset.
        agent.offset_samples.push(batch.sent_at_ns - now.0);
        agent.offset_ns = agent
            .offset_samples
            .recent(OFFSET_SAMPLES)
            .max()
            .unwrap_or(0);
        if let Some(hb) = &batch.heartbeat {
            // Collectors are a handful of short names: keep at most 8, cut to 64 bytes.
            agent.collectors_down = hb
                .collectors_down
                .iter()
                .take(8)
                .map(|c| prefix(c, 64).to_owned())
                .collect();
        }
        stats.ingest_lag_s = now.secs_since(agent.correct(batch.sent_at_ns));
        let offset = agent.offset_ns;
        let cut = agent.correct(batch.sent_at_ns).min(now);
        if self.node_cut.len() <= node as usize {
            self.node_cut.resize(node as usize + 1, Timestamp::ZERO);
        }
        let slot = &mut self.node_cut[node as usize];
        *slot = (*slot).max(cut);
        if self.node_gap.len() <= node as usize {
            self.node_gap.resize(node as usize + 1, Timestamp::ZERO);
        }
        if gap {
            self.node_gap[node as usize] = now;
        }
        let gap_at = self.node_gap[node as usize];
        let mut applied = 0;
        if gap {
            // Records of the lost batches are missing from whatever iteration is open
            // on this node's ranks: do not let it become a compute sample.
            for job in self.jobs.values_mut() {
                for r in job.ranks.values_mut().filter(|r| r.node == node) {
                    r.period_dirty = true;
                }
            }
        }

        for ev in &batch.events {
            applied += self.apply_node_event(node, &batch.node, ev, offset, now, stats);
        }
        for js in batch.jobs {
            applied += self.apply_job(node, js, offset, (cut, gap_at), now, stats);
        }
        applied
    }

    fn apply_node_event(
        &mut self,
        node: u32,
        node_name: &str,
        ev: &NodeEvent,
        offset: i64,
        now: Timestamp,
        stats: &mut EngineStats,
    ) -> usize {
        let Some(agent) = self.agents.get_mut(node_name) else {
            return 0;
        };
        if !agent.seen_events.insert(ev.id) {
            return 0;
        }
        if agent.seen_events.len() > MAX_SEEN_EVENTS {
            agent.seen_events.clear();
            agent.seen_events.insert(ev.id);
        }
        let kind = NodeEventKind::from_wire(ev.kind);
        let severity = EventSeverity::from_wire(ev.severity);
        let gpu_scoped = matches!(
            kind,
            NodeEventKind::Xid
                | NodeEventKind::Ecc
                | NodeEventKind::Nvlink
                | NodeEventKind::Pcie
                | NodeEventKind::FallenOffBus
        );
        if !gpu_scoped || severity < EventSeverity::Warning {
            return 1;
        }
        let at = Timestamp(ev.at_ns.saturating_sub(offset));
        let t = self
            .gpu_trouble
            .entry((node, ev.gpu_index))
            .or_insert_with(|| GpuTrouble {
                node,
                gpu: ev.gpu_index,
                first_at: at,
                last_at: at,
                received_at: now,
                severity,
                codes: Vec::new(),
                message: kept_error_line(&ev.message),
            });
        t.last_at = t.last_at.max(at);
        if severity > t.severity {
            t.severity = severity;
            t.message = kept_error_line(&ev.message);
        }
        let count = ev.count.max(1);
        let room = t.codes.len() < self.limits.max_codes_per_gpu;
        match t
            .codes
            .iter_mut()
            .find(|(k, c, _)| *k == kind && *c == ev.code)
        {
            Some(e) => e.2 = e.2.saturating_add(count),
            None if room => {
                t.codes.push((kind, ev.code, count));
            }
            None => *stats.refused.entry("gpu_codes").or_default() += 1,
        }
        1
    }

    fn apply_job(
        &mut self,
        node: u32,
        js: JobSignals,
        offset: i64,
        (cut, gap_at): (Timestamp, Timestamp),
        now: Timestamp,
        stats: &mut EngineStats,
    ) -> usize {
        if !self.jobs.contains_key(&js.job) && self.jobs.len() >= self.limits.max_jobs {
            *stats.refused.entry("jobs").or_default() += records(&js);
            return 0;
        }
        let job = self.jobs.entry(js.job.clone()).or_insert_with(|| JobState {
            name: js.job.clone(),
            ..JobState::default()
        });
        job.last_heard = now;
        let held_before = job.ranks.len();
        let bytes = self.limits.max_state_bytes.saturating_sub(self.state_bytes);
        job.budget = Budget {
            new_ranks: self.limits.max_ranks.saturating_sub(self.ranks_held),
            bytes,
            max_comms: self.limits.max_comms_per_job,
            max_comms_per_rank: self.limits.max_comms_per_rank,
            refused_ranks: 0,
            refused_comms: 0,
            refused_links: 0,
        };
        let n = apply_job_signals(job, node, &js, offset, (cut, gap_at), now, stats);
        self.ranks_held += job.ranks.len() - held_before;
        self.state_bytes += bytes - job.budget.bytes;
        if job.budget.refused_ranks > 0 {
            *stats.refused.entry("ranks").or_default() += job.budget.refused_ranks;
        }
        if job.budget.refused_comms > 0 {
            *stats.refused.entry("comms").or_default() += job.budget.refused_comms;
        }
        if job.budget.refused_links > 0 {
            *stats.refused.entry("links").or_default() += job.budget.refused_links;
        }
        n
    }
}

/// Records a job's signals carry.
fn records(js: &JobSignals) -> u64 {
    (js.ranks.len()
        + js.comms.len()
        + js.collectives.len()
        + js.metrics.len()
        + js.processes.len()
        + js.logs.len()
        + js.links.len()) as u64
}

fn apply_job_signals(
    job: &mut JobState,
    node: u32,
    js: &JobSignals,
    offset: i64,
    (cut, gap_at): (Timestamp, Timestamp),
    now: Timestamp,
    stats: &mut EngineStats,
) -> usize {
    {
        let mut n = 0;
        for r in &js.ranks {
            apply_rank_info(job, node, r, now);
            n += 1;
        }
        for c in &js.comms {
            apply_comm_info(job, c);
            n += 1;
        }
        for l in &js.links {
            if !job.links.apply(l, now, &mut job.budget.bytes) {
                job.budget.refused_links += 1;
            }
            n += 1;
        }
        for ev in &js.collectives {
            if apply_collective(job, ev, offset, (cut, gap_at), now) {
                stats.collective_events += 1;
            } else {
                stats.stale_records += 1;
            }
        }
        for l in &js.logs {
            apply_log(job, l, offset, now);
            if let Some(r) = l.rank {
                place(job, r, node);
            }
            n += 1;
        }
        for m in &js.metrics {
            apply_metric(job, m, offset, now);
            place(job, m.rank, node);
            n += 1;
        }
        for p in &js.processes {
            apply_process(job, p, offset, now);
            place(job, p.rank, node);
            n += 1;
        }
        stats.other_records += n as u64;
        n + js.collectives.len()
    }
}

impl Cluster {
    /// Apply a scheduler's report about `job` received at `now`, creating the job's
    /// state when no agent reported it yet.
    pub fn apply_lifecycle(
        &mut self,
        job: &str,
        report: &LifecycleReport,
        now: Timestamp,
    ) -> Applied {
        let js = self.jobs.entry(job.to_owned()).or_insert_with(|| JobState {
            name: job.to_owned(),
            ..JobState::default()
        });
        js.last_heard = js.last_heard.max(now);
        if js.world_size == 0 {
            js.world_size = report.ranks.unwrap_or(0);
        }
        match &mut js.lifecycle {
            Some(l) => {
                let restarts = l.restarts;
                let applied = l.apply(report, now);
                if l.restarts > restarts {
                    js.new_run();
                    self.recount_ranks();
                }
                applied
            }
            None => {
                js.lifecycle = Some(JobLifecycle::new(report, now));
                Applied::Changed
            }
        }
    }

    /// Forget jobs nobody reported on, and hardware trouble nothing was seen of, for
    /// `retention_secs`: a controller runs for months while jobs come and go. A job its
    /// scheduler said is running is kept for [`RUNNING_RETENTION_SECS`] (a job with no
    /// agent reporting, or a quiet one, is still running until its end comes).
    pub fn forget_older_than(&mut self, now: Timestamp, retention_secs: f64) {
        self.jobs.retain(|_, j| {
            let keep = match &j.lifecycle {
                Some(l) if l.phase() == Phase::Running => {
                    retention_secs.max(RUNNING_RETENTION_SECS)
                }
                _ => retention_secs,
            };
            now.secs_since(j.last_heard) < keep
        });
        self.recount_ranks();
        self.gpu_trouble
            .retain(|_, t| now.secs_since(t.last_at) < retention_secs);
    }

    /// Live progress of a job's ranks.
    pub fn rank_views(
        &self,
        job: &str,
        now: Timestamp,
        origin: Timestamp,
    ) -> Option<Vec<RankView>> {
        let js = self.jobs.get(job)?;
        let compute_med = job_compute_median(js);
        let mut out = Vec::with_capacity(js.ranks.len());
        for (i, r) in js.ranks.iter() {
            if !r.known {
                continue;
            }
            let comms = r
                .comms
                .iter()
                .map(|&(ci, s)| {
                    let c = &js.comms[ci as usize];
                    let m = &c.members[s as usize];
                    CommProgressView {
                        comm: c.id.to_string(),
                        name: c.name.clone(),
                        last_started_seq: m.last_started_seq,
                        last_completed_seq: m.last_completed_seq,
                        in_flight_s: (m.last_started_seq > m.last_completed_seq)
                            .then(|| now.secs_since(m.last_started_at).max(0.0)),
                    }
                })
                .collect();
            let own = rank_compute_median(r, 8);
            out.push(RankView {
                rank: i,
                node: (r.node != NO_NODE).then(|| self.node_name(r.node).to_owned()),
                gpu: r.gpu,
                alive: r.alive(),
                exit: r.exit.as_ref().map(ExitRecord::describe),
                step: r.step,
                loss: r.loss.filter(|x| x.is_finite()),
                grad_norm: r.grad_norm.filter(|x| x.is_finite()),
                compute_ratio: own
                    .zip(compute_med)
                    .map(|(a, b)| if b > 0.0 { a / b } else { 1.0 }),
                iterations: Some(r.iterations().name().to_owned()),
                transfer_ratio: None,
                comms,
                last_seen_s: (r.last_seen > Timestamp::ZERO)
                    .then(|| r.last_seen.secs_since(origin)),
            });
        }
        Some(out)
    }

    /// Per-rank numbers of a job for `/metrics`: what [`Cluster::rank_views`] gives
    /// without the communicator detail, so a scrape of a 16,384-rank job stays cheap.
    pub fn rank_progress(&self, job: &str) -> Option<Vec<RankProgress>> {
        let js = self.jobs.get(job)?;
        let compute_med = job_compute_median(js);
        let out = js
            .ranks
            .iter()
            .filter(|(_, r)| r.known)
            .map(|(i, r)| RankProgress {
                rank: i,
                alive: r.alive(),
                step: r.step,
                loss: r.loss.filter(|x| x.is_finite()),
                grad_norm: r.grad_norm.filter(|x| x.is_finite()),
                compute_ratio: rank_compute_median(r, 8)
                    .zip(compute_med)
                    .map(|(a, b)| if b > 0.0 { a / b } else { 1.0 }),
            })
            .collect();
        Some(out)
    }

    /// Summaries of all jobs, times relative to `origin`.
    pub fn job_views(&self, origin: Timestamp) -> Vec<JobView> {
        let mut v: Vec<JobView> = self
            .jobs
            .values()
            .map(|j| {
                let mut nodes: Vec<u32> = j
                    .ranks
                    .values()
                    .map(|r| r.node)
                    .filter(|&n| n != NO_NODE)
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                let l = j.lifecycle.as_ref();
                let at = |t: Option<Timestamp>| t.map(|t| rel(t, origin));
                JobView {
                    job: j.name.clone(),
                    ranks: j.known_ranks() as u32,
                    nodes: nodes.len() as u32,
                    comms: j.comms.len() as u32,
                    exited: j.exited() as u32,
                    step: j.ranks.values().filter_map(|r| r.step).max(),
                    iteration_s: j.iteration_secs(),
                    open_incidents: 0,
                    scheduler: l.map(|l| l.scheduler.clone()),
                    scheduler_job_id: l.map(|l| l.scheduler_job_id.clone()),
                    scheduler_job_name: l.map(|l| l.name.clone()).filter(|n| !n.is_empty()),
                    phase: l.map(JobLifecycle::phase),
                    started_s: at(l.and_then(|l| l.started_at)),
                    ended_s: at(l.and_then(|l| l.ended_at)),
                    expected_nodes: l.map(|l| l.nodes.clone()).unwrap_or_default(),
                    expected_ranks: l.and_then(|l| l.ranks),
                    restarts: l.map_or(0, |l| l.restarts),
                    exit_code: l.and_then(|l| l.end.exit).and_then(|e| e.code),
                    signal: l.and_then(|l| l.end.exit).and_then(|e| e.signal),
                    derived_exit_code: l.and_then(|l| l.end.derived).and_then(|e| e.code),
                    derived_signal: l.and_then(|l| l.end.derived).and_then(|e| e.signal),
                }
            })
            .collect();
        v.sort_by(|a, b| a.job.cmp(&b.job));
        v
    }

    /// (node, seconds since last heard) per agent.
    pub fn agents(&self, now: Timestamp) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self
            .agents
            .values()
            .map(|a| (a.node.clone(), now.secs_since(a.last_heard)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// One rank's progress as `/metrics` exports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankProgress {
    /// Global rank.
    pub rank: u32,
    /// Whether its process is alive (as last reported).
    pub alive: bool,
    /// Last optimizer step reported.
    pub step: Option<u64>,
    /// Last loss reported, when finite.
    pub loss: Option<f64>,
    /// Last gradient norm reported, when finite.
    pub grad_norm: Option<f64>,
    /// Median compute time per iteration relative to the job's median (1.0 = typical).
    pub compute_ratio: Option<f64>,
}

/// Median of a rank's last `k` compute samples.
pub fn rank_compute_median(r: &RankState, k: usize) -> Option<f64> {
    let mut v: Vec<f64> = r.compute.recent(k).map(|s| f64::from(s.secs)).collect();
    median(&mut v)
}

fn job_compute_median(js: &JobState) -> Option<f64> {
    let mut v: Vec<f64> = js
        .ranks
        .values()
        .filter_map(|r| rank_compute_median(r, 8))
        .collect();
    median(&mut v)
}

fn apply_rank_info(job: &mut JobState, node: u32, info: &RankInfo, now: Timestamp) {
    if info.world_size > 0 {
        job.world_size = info.world_size;
    }
    let Some(r) = job.rank_mut(info.rank) else {
        return;
    };
    r.gpu = info.gpu_index;
    job.put_on_node(info.rank, node);
    let Some(r) = job.ranks.get_mut(info.rank) else {
        return;
    };
    if info.pid != 0 && info.pid != r.pid {
        // A new process for this rank (a restart) starts a new life.
        if r.pid != 0 {
            r.steps_start_over();
        }
        if r.pid != 0 && r.exit.is_some() {
            r.exit = None;
            r.peer_symptom = false;
            r.timed_out = None;
            r.nonfinite = None;
            r.nonfinite_input = None;
        }
        r.pid = info.pid;
    }
    r.last_seen = r.last_seen.max(now);
}

fn apply_comm_info(job: &mut JobState, info: &CommInfo) {
    let Some(ci) = job.comm_idx(info.comm) else {
        return;
    };
    {
        let c = &mut job.comms[ci as usize];
        if c.name.is_empty() && !info.name.is_empty() {
            c.name.clone_from(&info.name);
        }
        if info.size > 0 {
            c.size = info.size;
        }
    }
    if !job
        .links
        .name(info.comm, info.comm_rank, info.rank, &mut job.budget.bytes)
    {
        job.budget.refused_links += 1;
    }
    job.slot(ci, info.rank);
}

/// Largest communicator whose members' entries correct each other's spans.
const MAX_INSIDE_NODE_MEMBERS: usize = 16;

/// A collective cannot complete before its last member entered it. Inside one node the
/// NCCL plugin's default mask reports the enqueue as the completion (no proxy
/// operations there), so in a communicator whose members share a node (and so a clock),
/// a member's first record of `ev.seq` (`entered`) extends the other members' spans of
/// it, and the latest entry of it seen so far is returned to extend this one's (0 where
/// there is none or the communicator spans nodes).
fn waited_inside_node(
    job: &mut JobState,
    ci: u32,
    slot: u32,
    ev: &CollectiveEvent,
    offset: i64,
    entered: bool,
) -> i64 {
    let c = &job.comms[ci as usize];
    if c.members.len() > MAX_INSIDE_NODE_MEMBERS || !job.inside_one_node(c) {
        return 0;
    }
    let mut peers: [u32; MAX_INSIDE_NODE_MEMBERS] = [0; MAX_INSIDE_NODE_MEMBERS];
    let mut n = 0;
    let mut latest = 0;
    for (k, m) in c.members.iter().enumerate() {
        if k as u32 == slot {
            continue;
        }
        peers[n] = m.rank;
        n += 1;
        if m.last_started_seq == ev.seq {
            // Same node, same agent: back to the agent's clock.
            latest = latest.max(m.last_started_at.0.saturating_add(offset));
        }
    }
    if entered {
        for &p in &peers[..n] {
            if let Some(r) = job.ranks.get_mut(p) {
                for span in r.spans.iter_mut().rev().take(32) {
                    if span.2 == ci && span.3 == ev.seq && span.1 < ev.start_ns {
                        span.1 = ev.start_ns;
                    }
                }
            }
        }
    }
    latest
}

/// Apply one collective record; false when it was stale or a duplicate.
fn apply_collective(
    job: &mut JobState,
    ev: &CollectiveEvent,
    offset: i64,
    (cut, gap_at): (Timestamp, Timestamp),
    now: Timestamp,
) -> bool {
    let Some(ci) = job.comm_idx(ev.comm) else {
        return false;
    };
    let Some(slot) = job.slot(ci, ev.rank) else {
        return false;
    };
    if !ev.in_flight() && ev.seq <= job.comms[ci as usize].members[slot as usize].last_completed_seq
    {
        // A completion already known: agents repeat each member's newest on purpose.
        return false;
    }
    let start = Timestamp(ev.start_ns.saturating_sub(offset));
    let entered = ev.seq > job.comms[ci as usize].members[slot as usize].last_started_seq;
    if entered {
        let before = job.last_progress(ev.rank);
        if before > Timestamp::ZERO && start > before {
            job.ranks[ev.rank]
                .gaps
                .push(start.secs_since(before) as f32);
        }
    }
    let last_peer_entry = waited_inside_node(job, ci, slot, ev, offset, entered);
    let comm = &mut job.comms[ci as usize];
    comm.op = ev.op;
    comm.bytes = ev.bytes;
    let max_completed = comm.max_completed_seq;
    let m = &mut comm.members[slot as usize];
    let mut fresh = false;
    if ev.seq > m.last_started_seq {
        m.last_started_seq = ev.seq;
        m.last_started_at = start;
        m.last_started_op = ev.op;
        fresh = true;
        if ev.seq > comm.max_started_seq {
            comm.max_started_seq = ev.seq;
            comm.at_max_started = 1;
            comm.max_started_first_at = start;
        } else if ev.seq == comm.max_started_seq {
            comm.at_max_started += 1;
            comm.max_started_first_at = comm.max_started_first_at.min(start);
        }
    }
    if ev.in_flight() {
        if ev.seq == m.last_started_seq {
            m.inflight_seen = m.inflight_seen.max(cut);
        }
        if ev.seq > m.last_completed_seq && ev.seq > max_completed {
            comm.inflight_since = comm.inflight_since.min(start);
        }
        job.ranks[ev.rank].last_seen = now;
        return fresh || ev.seq == m.last_started_seq;
    }
    if ev.seq <= m.last_completed_seq {
        return false;
    }
    // Collectives missing between the last one seen and this one make the open
    // iteration's accounting wrong, unless a lost batch noticed since the last one seen
    // explains them (its iteration was already discarded when the loss was noticed).
    let gap = m.last_completed_seq != 0
        && ev.seq != m.last_completed_seq + 1
        && m.last_completed_at >= gap_at;
    m.last_completed_seq = ev.seq;
    m.last_completed_at = Timestamp(ev.end_ns.saturating_sub(offset));
    m.last_completed_entered_at = start;
    m.completions = m.completions.saturating_add(1);
    let completions = m.completions;
    let end_at = m.last_completed_at;
    let wait_ns = ev.end_ns - ev.start_ns;
    if ev.seq > comm.max_completed_seq {
        comm.max_completed_seq = ev.seq;
        comm.max_completed_at = end_at;
        comm.inflight_since = Timestamp::MAX;
    }
    comm.record_wait(wait_ns as f32 / 1e9);

    // Compute-time accounting without step marks: an iteration runs from one completion
    // of the rank's anchor communicator to the next; compute = its length minus time spent waiting
    // inside collectives. Both are durations on the rank's own clock.
    let rank = &mut job.ranks[ev.rank];
    rank.last_seen = now;
    rank.period_dirty |= gap;
    if rank.last_mark.is_some() {
        rank.entered_after_mark(ev.start_ns);
        // Iterations come from step marks: keep the span for the step it falls in.
        if rank.spans.len() < MAX_SPANS && job.budget.bytes >= SPAN_COST {
            rank.spans
                .push((ev.start_ns, ev.end_ns.max(last_peer_entry), ci, ev.seq));
            job.budget.bytes -= SPAN_COST;
        } else {
            rank.period_dirty = true;
        }
        return true;
    }
    rank.period_wait_ns += wait_ns;
    if rank.anchor.is_none() && completions >= 4 {
        let anchor = choose_anchor(job, &job.ranks[ev.rank].comms);
        job.ranks[ev.rank].anchor = anchor;
    }
    let rank = &mut job.ranks[ev.rank];
    let pos = rank
        .comms
        .iter()
        .position(|&(c, _)| c == ci)
        .map(|p| p as u32);
    if pos.is_some() && pos == rank.anchor {
        let period = ev.end_ns - rank.period_start_ns;
        if !rank.period_dirty && rank.period_start_ns > 0 && period > 0 {
            let compute = (period - rank.period_wait_ns).max(0);
            rank.compute.push(ComputeSample {
                secs: compute as f32 / 1e9,
                period: period as f32 / 1e9,
                at: end_at,
            });
        }
        rank.period_start_ns = ev.end_ns;
        rank.period_wait_ns = 0;
        rank.period_dirty = false;
    }
    true
}

/// Completions of the least frequent communicator with two or more after which one
/// that has completed fewer than two collectives is taken as idle (used once at start,
/// or never: a process group made for a barrier, a communicator that only carries
/// point-to-point traffic) and no longer holds the anchor back. Counted on the least
/// frequent, not the busiest: a deep model's per-layer communicator (tensor
/// parallelism) completes dozens of collectives in its first step, before the
/// once-a-step one has completed twice, and would otherwise cut iterations into layers.
const IDLE_AFTER: u32 = 8;

/// Completions a communicator inside one node may reach, in a job on several nodes,
/// before it closes a rank's iterations for want of one that spans nodes.
const INSIDE_NODE_PATIENCE: u32 = 512;

/// The rank's least frequent communicator, once every one has a few completions, or
/// once the least frequent of those with a few has [`IDLE_AFTER`], among those.
///
/// In a job on several nodes it is one that spans nodes: inside a node the NCCL
/// plugin's default mask reports enqueues as completions, and a communicator is
/// created lazily, at its first collective, so a deep model's per-layer one (tensor
/// parallelism, inside a node) may be a rank's only communicator for its whole first
/// step. One inside a node closes iterations there only after
/// [`INSIDE_NODE_PATIENCE`] completions with none spanning nodes in sight.
fn choose_anchor(job: &JobState, mine: &[(u32, u32)]) -> Option<u32> {
    let comms = &job.comms;
    let counts: Vec<u32> = mine
        .iter()
        .map(|&(ci, s)| comms[ci as usize].members[s as usize].completions)
        .collect();
    let least_counted = counts
        .iter()
        .copied()
        .filter(|&c| c >= 2)
        .min()
        .unwrap_or(0);
    if counts.iter().any(|&c| c < 2) && least_counted < IDLE_AFTER {
        return None;
    }
    // The least frequent with a few completions, of those that span nodes only, or all.
    let least = |spanning_only: bool| {
        counts
            .iter()
            .enumerate()
            .filter(|&(_, c)| *c >= 2)
            .filter(|&(i, _)| !spanning_only || !job.inside_one_node(&comms[mine[i].0 as usize]))
            .min_by_key(|&(_, c)| *c)
            .map(|(i, _)| i as u32)
    };
    if !job.multi_node {
        return least(false);
    }
    let busiest = counts.iter().copied().max().unwrap_or(0);
    least(true).or_else(|| {
        (busiest >= INSIDE_NODE_PATIENCE)
            .then(|| least(false))
            .flatten()
    })
}

fn apply_metric(job: &mut JobState, m: &TrainingMetric, offset: i64, now: Timestamp) {
    let Some(r) = job.rank_mut(m.rank) else {
        return;
    };
    r.last_seen = now;
    r.mark_step(m.step, m.at_ns, Timestamp(m.at_ns.saturating_sub(offset)));
    if r.step.is_none_or(|s| m.step >= s) {
        r.step = Some(m.step);
        r.loss = m.loss;
        r.grad_norm = m.grad_norm;
    }
    let stage = if m.loss.is_some_and(|x| !x.is_finite()) {
        Some(0)
    } else if m.grad_norm.is_some_and(|x| !x.is_finite()) {
        Some(1)
    } else {
        None
    };
    if let Some(stage) = stage {
        let nf = NonFinite {
            step: m.step,
            stage,
            at: Timestamp(m.at_ns.saturating_sub(offset)),
            received_at: now,
        };
        let earlier = r
            .nonfinite
            .is_none_or(|old| (nf.step, nf.stage) < (old.step, old.stage));
        if earlier {
            r.nonfinite = Some(nf);
        }
    }
    if let Some(op) = m.first_nonfinite_op {
        let input = NonFiniteInput {
            step: m.step,
            op,
            at: Timestamp(m.at_ns.saturating_sub(offset)),
        };
        let keep = match r.nonfinite_input {
            None => true,
            // A non-finite input that no non-finite loss or gradient norm followed
            // within a step was a blip (a loss-scaled fp16 overflow the optimizer
            // skipped): a later one starts a new episode.
            Some(old)
                if input.step > old.step.saturating_add(1)
                    && r.nonfinite
                        .is_none_or(|n| n.step > old.step.saturating_add(1)) =>
            {
                true
            }
            Some(old) => (input.step, input.op) < (old.step, old.op),
        };
        if keep {
            r.nonfinite_input = Some(input);
        }
    }
}

fn apply_process(job: &mut JobState, p: &ProcessState, offset: i64, now: Timestamp) {
    let Some(r) = job.rank_mut(p.rank) else {
        return;
    };
    r.last_seen = now;
    if p.alive {
        r.stopped_since = if p.stopped {
            r.stopped_since
                .or(Some(Timestamp(p.at_ns.saturating_sub(offset))))
        } else {
            None
        };
        if r.exit
            .as_ref()
            .is_some_and(|e| e.pid != p.pid && p.pid != 0)
        {
            r.exit = None;
            r.peer_symptom = false;
            r.timed_out = None;
        }
        if p.pid != 0 {
            if r.pid != 0 && r.pid != p.pid {
                r.steps_start_over();
            }
            r.pid = p.pid;
        }
        return;
    }
    if r.exit.is_some() {
        return;
    }
    r.exit = Some(ExitRecord {
        at: Timestamp(p.at_ns.saturating_sub(offset)),
        received_at: now,
        code: p.exit_code,
        signal: p.signal,
        peer_symptom: r.peer_symptom,
        pid: p.pid,
        from_log: p.from_log,
    });
}

/// A rank heard of only through what its node's agent read (logs, metrics, exits)
/// runs on that node until a registration says where exactly.
fn place(job: &mut JobState, rank: u32, node: u32) {
    if let Some(r) = job.ranks.get_mut(rank)
        && r.node == NO_NODE
    {
        job.put_on_node(rank, node);
    }
}

fn apply_log(job: &mut JobState, l: &LogRecord, offset: i64, now: Timestamp) {
    let Some(rank) = l.rank else { return };
    let lower = l.line.to_ascii_lowercase();
    let room = job.budget.bytes >= ERROR_LINE_COST;
    let Some(r) = job.rank_mut(rank) else {
        return;
    };
    let mut charged = false;
    if r.timed_out.is_none()
        && let Some(waited_secs) = collective_timeout(&lower)
    {
        r.timed_out = Some(TimedOut {
            at: Timestamp(l.at_ns.saturating_sub(offset)),
            received_at: now,
            waited_secs,
        });
    }
    if PEER_FAILURE_MARKERS.iter().any(|m| lower.contains(m)) {
        r.peer_symptom = true;
        if let Some(e) = r.exit.as_mut() {
            e.peer_symptom = true;
        }
    }
    if ERROR_MARKERS.iter().any(|m| lower.contains(m)) {
        if r.last_errors.len() >= 4 {
            r.last_errors.remove(0);
            r.last_errors.push(kept_error_line(&l.line));
        } else if room {
            charged = true;
            r.last_errors.push(kept_error_line(&l.line));
        }
    }
    if charged {
        job.budget.bytes = job.budget.bytes.saturating_sub(ERROR_LINE_COST);
    }
}

/// Longest error line kept per rank, bytes.
const MAX_ERROR_LINE_BYTES: usize = 300;
/// How much of a line is read for secrets before it is cut (a secret that starts in
/// the kept part and runs past this is still caught by its beginning).
const REDACT_WINDOW_BYTES: usize = 1024;

/// An error line as the controller keeps it (crash evidence, the API, the store, the
/// diagnosis): secrets removed (log lines can carry passwords and tokens, and incidents
/// are readable by every viewer), then cut at a character boundary.
fn kept_error_line(line: &str) -> String {
    let clean = warden_diagnosis::redact::Redactor::default()
        .redact_secrets(prefix(line, REDACT_WINDOW_BYTES));
    prefix(&clean, MAX_ERROR_LINE_BYTES).to_owned()
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_model::wire::{CollOp, JobSignals, RankInfo};

    const T0: i64 = 1_767_225_600_000_000_000;

    fn coll(comm: u64, rank: u32, seq: u64, start: f64, end: Option<f64>) -> CollectiveEvent {
        CollectiveEvent {
            comm,
            rank,
            seq,
            op: CollOp::AllReduce as i32,
            bytes: 1,
            start_ns: T0 + (start * 1e9) as i64,
            end_ns: end.map_or(0, |e| T0 + (e * 1e9) as i64),
            xfer_ns: 1_000_000,
        }
    }

    fn batch(node: &str, seq: u64, sent: f64, colls: Vec<CollectiveEvent>) -> Batch {
        Batch {
            node: node.into(),
            agent_id: "a".into(),
            boot_id: "b".into(),
            seq,
            sent_at_ns: T0 + (sent * 1e9) as i64,
            jobs: vec![JobSignals {
                job: "j".into(),
                collectives: colls,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn at(s: f64) -> Timestamp {
        Timestamp(T0 + (s * 1e9) as i64)
    }

    #[test]
    fn a_rank_number_a_client_sends_sizes_nothing() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let top = warden_model::wire::MAX_RANK - 1;
        c.apply(
            batch("n0", 1, 1.0, vec![coll(1, top, 1, 0.5, None)]),
            at(1.0),
            &mut st,
        );
        let j = &c.jobs["j"];
        assert_eq!(j.ranks.len(), 1, "one slot for the one rank heard of");
        assert!(j.ranks.get(top).is_some() && j.ranks.get(0).is_none());
        assert_eq!(j.ranks.iter().map(|(r, _)| r).collect::<Vec<_>>(), [top]);
    }

    #[test]
    fn ranks_are_iterated_in_rank_order_whatever_order_they_came_in() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let evs = [7, 2, 9, 0, 5].map(|r| coll(1, r, 1, 0.5, None)).to_vec();
        c.apply(batch("n0", 1, 1.0, evs), at(1.0), &mut st);
        let order: Vec<u32> = c.jobs["j"].ranks.iter().map(|(r, _)| r).collect();
        assert_eq!(order, [0, 2, 5, 7, 9]);
    }

    #[test]
    fn past_a_bound_new_records_are_refused_and_counted_and_held_ones_still_apply() {
        let limits = Limits {
            max_jobs: 2,
            max_ranks: 4,
            max_nodes: 2,
            max_comms_per_job: 2,
            max_comms_per_rank: 1,
            max_codes_per_gpu: 1,
            max_state_bytes: 1 << 30,
        };
        let mut c = Cluster::with_limits(limits);
        let mut st = EngineStats::default();
        let evs = (0..6).map(|r| coll(1, r, 1, 0.5, None)).collect();
        c.apply(batch("n0", 1, 1.0, evs), at(1.0), &mut st);
        assert_eq!(c.jobs["j"].ranks.len(), 4);
        assert_eq!(st.refused.get("ranks"), Some(&2));
        // A held rank still makes progress; a second communicator for it is refused.
        let evs = vec![coll(1, 0, 1, 0.5, Some(0.6)), coll(2, 0, 1, 0.5, None)];
        c.apply(batch("n0", 2, 2.0, evs), at(2.0), &mut st);
        assert_eq!(c.jobs["j"].comms[0].members[0].last_completed_seq, 1);
        assert_eq!(st.refused.get("comms"), Some(&1));
        // Jobs and nodes past their bounds.
        for (i, job) in ["k", "l"].iter().enumerate() {
            let mut b = batch("n0", 3 + i as u64, 3.0, vec![]);
            b.jobs[0].job = (*job).into();
            b.jobs[0].processes.push(ProcessState {
                rank: 0,
                alive: true,
                ..Default::default()
            });
            c.apply(b, at(3.0), &mut st);
        }
        assert_eq!(c.jobs.len(), 2);
        assert_eq!(st.refused.get("jobs"), Some(&1));
        c.apply(batch("n1", 1, 4.0, vec![]), at(4.0), &mut st);
        c.apply(batch("n2", 1, 4.0, vec![]), at(4.0), &mut st);
        assert_eq!(c.nodes.len(), 2);
        assert!(st.refused.contains_key("nodes"));
        // Forgetting gives the budget back.
        c.forget_older_than(at(10_000.0), 60.0);
        c.apply(
            batch("n0", 9, 10_001.0, vec![coll(1, 5, 1, 0.5, None)]),
            at(10_001.0),
            &mut st,
        );
        assert!(c.jobs["j"].ranks.get(5).is_some());
    }

    #[test]
    fn event_counts_a_client_sends_add_up_without_overflow() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let mut b = batch("n0", 1, 1.0, vec![]);
        b.events = [79, 48]
            .map(|code| NodeEvent {
                id: u64::from(code),
                at_ns: T0,
                kind: NodeEventKind::Xid as i32,
                severity: EventSeverity::Fatal as i32,
                gpu_index: Some(1),
                code: Some(code),
                message: "Xid".into(),
                count: u32::MAX,
                ..Default::default()
            })
            .to_vec();
        c.apply(b, at(1.0), &mut st);
        let found = crate::detect::gpu::check(&Default::default(), &c, at(2.0));
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn ring_keeps_the_most_recent_samples() {
        let mut r: Ring<u32, 3> = Ring::default();
        for i in 0..5 {
            r.push(i);
        }
        assert_eq!(r.recent(10).collect::<Vec<_>>(), vec![4, 3, 2]);
        assert_eq!(r.len(), 3);
        assert_eq!(median(&mut [3.0, 1.0, 2.0, 10.0]), Some(2.5));
    }

    #[test]
    fn duplicate_and_stale_collectives_change_nothing() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let b = batch(
            "n0",
            1,
            2.0,
            vec![coll(1, 0, 1, 0.0, Some(1.0)), coll(1, 0, 2, 1.5, Some(1.9))],
        );
        c.apply(b.clone(), at(2.0), &mut st);
        assert_eq!(st.collective_events, 2);
        c.apply(b, at(2.1), &mut st);
        let b = batch("n0", 2, 3.0, vec![coll(1, 0, 1, 0.0, Some(1.0))]);
        c.apply(b, at(3.0), &mut st);
        assert_eq!(st.collective_events, 2);
        assert_eq!(st.stale_records, 3);
        let m = &c.jobs["j"].comms[0].members[0];
        assert_eq!((m.last_started_seq, m.last_completed_seq), (2, 2));
    }

    #[test]
    fn a_communicators_entry_summary_is_what_walking_its_members_says() {
        // Records arrive out of order, twice, in flight and completed, with members
        // joining late: the summary kept per record equals a walk of the members.
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for b in 0..400u64 {
            let mut colls = Vec::new();
            for _ in 0..1 + next(6) {
                let rank = next(8) as u32;
                let seq = 1 + next(12);
                let start = seq as f64 + next(100) as f64 / 100.0;
                let end = (next(3) > 0).then_some(start + 0.5);
                colls.push(coll(1, rank, seq, start, end));
            }
            c.apply(batch("n0", b + 1, 20.0, colls), at(20.0), &mut st);
            let cm = &c.jobs["j"].comms[0];
            let max = cm.members.iter().map(|m| m.last_started_seq).max();
            assert_eq!(Some(cm.max_started_seq), max);
            let at_max: Vec<&Member> = cm
                .members
                .iter()
                .filter(|m| m.last_started_seq == cm.max_started_seq)
                .collect();
            assert_eq!(cm.at_max_started as usize, at_max.len());
            let first = at_max.iter().map(|m| m.last_started_at).min();
            assert_eq!(Some(cm.max_started_first_at), first);
        }
    }

    #[test]
    fn whether_a_communicator_sits_inside_one_node_follows_its_members_moves() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let register = |c: &mut Cluster, st: &mut EngineStats, node: &str, seq, rank| {
            let mut b = batch(node, seq, 1.0, vec![coll(1, rank, 1, 0.0, Some(0.5))]);
            b.jobs[0].ranks.push(RankInfo {
                rank,
                world_size: 3,
                pid: 10 + rank,
                ..Default::default()
            });
            c.apply(b, at(1.0), st);
        };
        let one_node = |c: &Cluster| {
            let j = &c.jobs["j"];
            j.inside_one_node(&j.comms[0])
        };
        register(&mut c, &mut st, "n0", 1, 0);
        register(&mut c, &mut st, "n0", 2, 1);
        assert!(one_node(&c));
        // A member joins from another node.
        register(&mut c, &mut st, "n1", 1, 2);
        assert!(!one_node(&c));
        // It moves (a restart placed it elsewhere): the answer follows.
        register(&mut c, &mut st, "n0", 3, 2);
        assert!(one_node(&c));
        register(&mut c, &mut st, "n1", 2, 1);
        assert!(!one_node(&c));
    }

    #[test]
    fn clock_offset_is_learned_and_removed() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        // Agent clock runs 0.5 s ahead; transit takes 1 ms.
        let b = batch("n0", 1, 10.5, vec![coll(1, 0, 1, 10.4, None)]);
        c.apply(b, at(10.001), &mut st);
        let comm = &c.jobs["j"].comms[0];
        let started = comm.members[0].last_started_at;
        assert!((started.secs_since(at(9.9))).abs() < 0.005, "{started:?}");
    }

    /// `iterations` iterations of rank 0 after `evs` (ending at `t`): 1 s of compute
    /// and three collectives of 0.1 s each, two on comm 1 and one on comm 2. Returns
    /// the cluster they were applied to.
    fn twice_and_once(mut evs: Vec<CollectiveEvent>, mut t: f64, iterations: u64) -> Cluster {
        let (mut c, mut st) = (Cluster::default(), EngineStats::default());
        let mut s1 = 0;
        for it in 1..=iterations {
            for _ in 0..2 {
                t += 0.5;
                s1 += 1;
                evs.push(coll(1, 0, s1, t, Some(t + 0.1)));
                t += 0.1;
            }
            evs.push(coll(2, 0, it, t, Some(t + 0.1)));
            t += 0.1;
        }
        c.apply(batch("n0", 1, t + 0.1, evs), at(t + 0.1), &mut st);
        c
    }

    #[test]
    fn a_communicator_used_once_at_start_does_not_hold_iterations_back() {
        // A barrier on comm 3 at start, then comm 1 twice and comm 2 once per iteration.
        let c = twice_and_once(vec![coll(3, 0, 1, 0.0, Some(0.1))], 0.1, 20);
        let r = &c.jobs["j"].ranks[0];
        assert_eq!(r.anchor, Some(2), "comm 2, once an iteration, closes them");
        let med = rank_compute_median(r, 4).expect("samples");
        assert!((med - 1.0).abs() < 1e-3, "compute {med}");
    }

    #[test]
    fn a_deep_models_per_layer_communicator_never_closes_iterations() {
        // Ranks 0 and 1 on n0, rank 2 on n1. Per iteration: 1 s of compute in 40 slices,
        // each ending in an all-reduce on comm 1 (a layer's, tensor parallel, ranks 0
        // and 1), then one on comm 2 (data parallel, ranks 0 and 2, across nodes). Comm
        // 1 completes 40 times before comm 2 is even seen.
        let (mut c, mut st) = (Cluster::default(), EngineStats::default());
        for (seq, node, rank) in [(1, "n0", 0), (2, "n0", 1), (1, "n1", 2)] {
            let mut b = batch(node, seq, 0.0, vec![]);
            b.jobs[0].ranks.push(RankInfo {
                rank,
                world_size: 3,
                pid: 10 + rank,
                ..Default::default()
            });
            c.apply(b, at(0.0), &mut st);
        }
        let (mut t, mut s1) = (0.0, 0);
        let mut anchors = vec![];
        for it in 1..=12u64 {
            let mut evs = vec![];
            for _ in 0..40 {
                t += 0.025;
                s1 += 1;
                for r in [0, 1] {
                    evs.push(coll(1, r, s1, t, Some(t + 0.001)));
                }
                t += 0.001;
            }
            for r in [0, 2] {
                evs.push(coll(2, r, it, t, Some(t + 0.1)));
            }
            t += 0.1;
            c.apply(batch("n0", it + 2, t + 0.01, evs), at(t + 0.01), &mut st);
            anchors.push(c.jobs["j"].ranks[0].anchor);
        }
        assert!(
            anchors.iter().all(|a| *a != Some(0)),
            "the per-layer communicator never anchors: {anchors:?}"
        );
        let r = &c.jobs["j"].ranks[0];
        assert_eq!(r.anchor, Some(1), "comm 2, once an iteration, closes them");
        let med = rank_compute_median(r, 4).expect("samples");
        assert!((med - 1.0).abs() < 0.01, "compute {med}");
    }

    #[test]
    fn compute_time_is_iteration_minus_waits() {
        // Rank 0 in comms 1 (twice per iteration) and 2 (once): computes 1 s, waits 0.1 s
        // in each collective.
        let c = twice_and_once(vec![], 0.0, 8);
        let r = &c.jobs["j"].ranks[0];
        assert_eq!(
            r.anchor,
            Some(1),
            "the once-per-iteration comm closes iterations"
        );
        let med = rank_compute_median(r, 8).expect("samples");
        assert!((med - 1.0).abs() < 1e-3, "compute {med}");
    }

    #[test]
    fn a_gap_in_sequence_numbers_discards_that_iteration() {
        let mut c = Cluster::default();
        let mut st = EngineStats::default();
        let mut evs = vec![];
        for it in 1..=6u64 {
            let t = it as f64;
            if it != 4 {
                evs.push(coll(1, 0, it, t, Some(t + 0.2)));
            }
            evs.push(coll(2, 0, it, t + 0.5, Some(t + 0.6)));
        }
        c.apply(batch("n0", 1, 7.0, evs), at(7.0), &mut st);
        let r = &c.jobs["j"].ranks[0];
        assert!(
            r.compute.recent(32).all(|s| (s.secs - 0.7).abs() < 1e-3),
            "{:?}",
            r.compute
        );
    }

    #[test]
    fn a_kept_error_line_is_cut_on_a_character_and_holds_no_secret() {
        // A two-byte character across the cut: the cut goes before it.
        let line = format!("{}é and the rest", "e".repeat(MAX_ERROR_LINE_BYTES - 1));
        let kept = kept_error_line(&line);
        assert_eq!(kept.len(), MAX_ERROR_LINE_BYTES - 1);
        let kept = kept_error_line("RuntimeError: login failed password=hunter2-horse");
        assert!(!kept.contains("hunter2-horse"), "{kept}");
        assert!(kept.starts_with("RuntimeError: login failed"), "{kept}");
    }
}
