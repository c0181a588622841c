//! Emulated node agents: they hold what their ranks produced, and at each flush cut a
//! wire batch with exactly what an agent could have seen by then, in its own clock.

use std::collections::BTreeMap;
use warden_model::Timestamp;

use warden_model::wire::{
    Batch, CollOp, CollectiveEvent, CommInfo, EventSeverity, Heartbeat, JobSignals, LinkSample,
    LogRecord, NewestCompletions, NodeEvent, ProcessState, RankInfo, TrainingMetric,
};

use crate::scenario::Capture;
use crate::topology::{Topology, fnv1a};

/// The simulation's time zero: 2026-01-01T00:00:00Z.
pub const SIM_EPOCH: Timestamp = Timestamp::from_nanos(1_767_225_600 * 1_000_000_000);

/// Agents re-register their ranks and communicators this often, seconds.
pub const REGISTRATION_SECS: f64 = 10.0;

/// How many later batches repeat a critical record.
const CRITICAL_REPEATS: u8 = 2;

/// The agent reads the NCCL plugin's segments this often, seconds, and again just before
/// it cuts each batch, so a batch holds every record stamped before its cut.
pub const SEGMENT_POLL_SECS: f64 = 0.5;
/// The agent reads `warden_torch`'s socket this often while processes are connected,
/// seconds; `warden_torch`'s own thread asks device works whether they ran as often.
pub const TORCH_READ_SECS: f64 = 0.02;
/// From the host's call to NCCL's enqueue of the work (the plugin's Coll stop), seconds.
pub const ENQUEUE_SECS: f64 = 30e-6;
/// From the enqueue to the proxy thread's first ProxyOp start, seconds.
pub const PROXY_PICKUP_SECS: f64 = 20e-6;

/// Virtual seconds since the run start → virtual ns since the run start (infinite and
/// out-of-range times saturate to `i64::MAX`, "never").
pub fn virtual_ns(t: f64) -> i64 {
    if t.is_finite() && t < 9.0e9 {
        (t * 1e9).round() as i64
    } else {
        i64::MAX
    }
}

/// Virtual seconds since the run start → true wall time in ns.
pub fn true_ns(t: f64) -> i64 {
    SIM_EPOCH.nanos() + (t * 1e9).round() as i64
}

/// One operation of one rank, in true virtual time; `end` is infinite while it can
/// never complete. What the agent reports of it depends on the capture path
/// ([`Agent::flush`]).
#[derive(Debug, Clone, Copy)]
pub struct PendingColl {
    /// Global rank.
    pub rank: u32,
    /// Communicator id (a pipeline pair's for point-to-point).
    pub comm: u64,
    /// Sequence number in the communicator.
    pub seq: u64,
    /// Operation.
    pub op: CollOp,
    /// Payload, bytes.
    pub bytes: u64,
    /// The host's call, seconds: what both paths stamp as the start.
    pub call: f64,
    /// When the GPU reached it, seconds.
    pub start: f64,
    /// Completion on the GPU, seconds (infinite: never).
    pub end: f64,
    /// Whether its communicator crosses nodes (network transfers, proxy operations).
    pub spans_nodes: bool,
}

/// One rank's sends to one peer over the network, in true virtual time: what the
/// plugin's proxy steps add to its per-peer totals (`nccl_proxy` only).
#[derive(Debug, Clone, Copy)]
pub struct PendingLink {
    /// Global rank of the sender.
    pub rank: u32,
    /// Communicator id.
    pub comm: u64,
    /// The sender's rank in the communicator.
    pub comm_rank: u32,
    /// The receiver's rank in the communicator.
    pub peer: u32,
    /// When the last of these steps completed, seconds.
    pub at: f64,
    /// Steps.
    pub steps: u64,
    /// Bytes.
    pub bytes: u64,
    /// Time on the wire, summed over the steps, seconds.
    pub busy: f64,
}

/// (communicator, sender, receiver's rank in the communicator).
type LinkKey = (u64, u32, u32);
/// Steps, bytes and wire ns so far, and the sender's rank in the communicator.
type LinkTotals = (u64, u64, u64, u32);

/// A record other than a collective; times inside are true time (skew is added at
/// flush).
#[derive(Debug, Clone)]
pub enum Record {
    /// Training metric.
    Metric(TrainingMetric),
    /// Process start or exit.
    Process(ProcessState),
    /// Log line.
    Log(LogRecord),
    /// Kernel / hardware event.
    Event(NodeEvent),
}

impl Record {
    fn critical(&self) -> bool {
        match self {
            Record::Metric(m) => {
                m.loss.is_some_and(|x| !x.is_finite())
                    || m.grad_norm.is_some_and(|x| !x.is_finite())
            }
            Record::Process(p) => !p.alive,
            Record::Log(_) => false,
            Record::Event(e) => e.severity >= EventSeverity::Error as i32,
        }
    }

    /// Whether the agent flushes at once when it sees this record.
    pub fn urgent(&self) -> bool {
        self.critical()
    }

    fn skewed(&self, offset_ns: i64) -> Record {
        let mut r = self.clone();
        match &mut r {
            Record::Metric(m) => m.at_ns += offset_ns,
            Record::Process(p) => p.at_ns += offset_ns,
            Record::Log(l) => l.at_ns += offset_ns,
            Record::Event(e) => e.at_ns += offset_ns,
        }
        r
    }
}

/// A record waiting for the flush that may carry it.
#[derive(Debug, Clone)]
pub struct PendingRecord {
    /// True time it happens, seconds.
    pub at: f64,
    /// Rank it is about (its death hides later records).
    pub rank: Option<u32>,
    /// The record.
    pub record: Record,
}

/// What one flush produced.
#[derive(Debug, Default, Clone, Copy)]
pub struct FlushStats {
    /// Collective records in the batch (completed and in flight).
    pub collectives: u64,
}

/// One node's agent.
#[derive(Debug)]
pub struct Agent {
    /// Node index.
    pub node: u32,
    name: String,
    agent_id: String,
    boot_id: String,
    /// Clock offset of this node, ns.
    pub offset_ns: i64,
    seq: u64,
    next_event_id: u64,
    next_registration: f64,
    /// Collectives not yet reported as completed.
    pub colls: Vec<PendingColl>,
    /// Other records not yet reported.
    pub records: Vec<PendingRecord>,
    /// Per-peer sends not yet read (`nccl_proxy`).
    pub links: Vec<PendingLink>,
    /// Per-peer totals as the plugin keeps them, by (comm, rank, peer): steps, bytes,
    /// ns, and the sender's rank in the communicator.
    link_totals: BTreeMap<LinkKey, LinkTotals>,
    repeats: Vec<(u8, Record)>,
    /// Collectives completed in the previous batch, carried again in the next one.
    last_completed: Vec<CollectiveEvent>,
    /// Each member's newest completion, repeated while it has nothing newer.
    newest: NewestCompletions,
    /// Batches built but lost on the way.
    pub failed_batches: u64,
    /// The capture path this agent reads.
    capture: Capture,
    /// Phase of this agent's reads of `warden_torch`'s socket, seconds.
    read_phase: f64,
}

impl Agent {
    /// The agent of node `node`, reading `capture`.
    pub fn new(node: u32, name: String, offset_ns: i64, seed: u64, capture: Capture) -> Self {
        let h = fnv1a(format!("{seed}/{name}").as_bytes());
        let read_phase = (h >> 11) as f64 / (1u64 << 53) as f64 * TORCH_READ_SECS;
        Agent {
            node,
            agent_id: format!("agent-{name}-{:08x}", h as u32),
            boot_id: format!("{:016x}", h),
            name,
            offset_ns,
            seq: 0,
            next_event_id: 1,
            next_registration: 0.0,
            colls: vec![],
            records: vec![],
            links: vec![],
            link_totals: BTreeMap::new(),
            repeats: vec![],
            last_completed: vec![],
            newest: NewestCompletions::default(),
            failed_batches: 0,
            capture,
            read_phase,
        }
    }

    /// When a batch cut at `t` holds a capture record stamped at `x` (seconds) from the
    /// agent's point of view: the plugin's segments are read just before every cut, so
    /// any `x` up to it; `warden_torch`'s socket at the agent's next read of it.
    fn read_at(&self, x: f64) -> f64 {
        if !x.is_finite() {
            return x;
        }
        match self.capture {
            Capture::Nccl | Capture::NcclProxy => x,
            Capture::Torch => {
                let period = TORCH_READ_SECS;
                self.read_phase + ((x - self.read_phase) / period).ceil().max(0.0) * period
            }
        }
    }

    /// The end the path reports for `c`, seconds (infinite: none).
    /// - NCCL plugin: across nodes, the last ProxyOp's stop, which is the completion;
    ///   inside a node there are no proxy operations, and the enqueue stands in.
    /// - `warden_torch`: the first poll of `work.is_completed()` after the GPU ran it,
    ///   on the rank's own 20 ms clock.
    fn reported_end(&self, c: &PendingColl) -> f64 {
        match self.capture {
            Capture::Nccl | Capture::NcclProxy if c.spans_nodes => c.end,
            Capture::Nccl | Capture::NcclProxy => c.call + ENQUEUE_SECS,
            Capture::Torch => {
                if !c.end.is_finite() {
                    return c.end;
                }
                let phase = f64::from(c.rank % 50) * (TORCH_READ_SECS / 50.0);
                phase + ((c.end - phase) / TORCH_READ_SECS).ceil() * TORCH_READ_SECS
            }
        }
    }

    /// The transfer time the path reports for a completed `c` ending at `end`, seconds:
    /// the plugin's first ProxyOp start to its last stop, across nodes only (in a ring,
    /// paced by the slowest link and the latest arrival for every member); none from
    /// `warden_torch`.
    fn reported_xfer(&self, c: &PendingColl, end: f64) -> f64 {
        match self.capture {
            Capture::Nccl | Capture::NcclProxy if c.spans_nodes => {
                (end - (c.call + ENQUEUE_SECS + PROXY_PICKUP_SECS)).max(0.0)
            }
            _ => 0.0,
        }
    }

    /// Node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A fresh per-boot node-event id.
    pub fn event_id(&mut self) -> u64 {
        let id = self.next_event_id;
        self.next_event_id += 1;
        id
    }

    /// Cut the batch of a flush at true time `t_ns` (virtual ns since the run start).
    /// `death[r]` is when rank `r` died or exited (infinite while it lives).
    pub fn flush(
        &mut self,
        t_ns: i64,
        death: &[f64],
        topo: &Topology,
        job: &str,
    ) -> (Batch, FlushStats) {
        self.seq += 1;
        let t = t_ns as f64 / 1e9;
        let off = self.offset_ns;
        let ns = |x: f64| true_ns(x) + off;
        let mut sig = JobSignals {
            job: job.to_owned(),
            ..JobSignals::default()
        };
        let mut stats = FlushStats::default();

        let first = topo.gpus_per_node * self.node;
        let ranks = first..first + topo.gpus_per_node;
        if t >= self.next_registration {
            self.next_registration = t + REGISTRATION_SECS;
            for r in ranks.clone() {
                if virtual_ns(death[r as usize]) <= t_ns {
                    continue;
                }
                let gpu = topo.gpu_of(r);
                sig.ranks.push(RankInfo {
                    rank: r,
                    world_size: topo.world,
                    pid: pid_of(r, topo),
                    gpu_index: Some(gpu),
                    gpu_uuid: gpu_uuid(&self.name, gpu),
                });
                for (comm, name, size, k) in topo.registered_comms_of(r) {
                    sig.comms.push(CommInfo {
                        comm,
                        name: name.to_owned(),
                        size,
                        rank: r,
                        comm_rank: k,
                    });
                }
            }
        }

        let mut colls = std::mem::take(&mut self.colls);
        colls.retain(|c| {
            let death = death[c.rank as usize];
            let d = virtual_ns(death);
            if virtual_ns(c.call) > d {
                return false; // the host never called it
            }
            if virtual_ns(self.read_at(c.call)) > t_ns {
                return true; // not read yet
            }
            let end = self.reported_end(c);
            let may_complete = end.is_finite() && virtual_ns(end) <= d;
            let completed = may_complete && virtual_ns(self.read_at(end)) <= t_ns;
            let record = CollectiveEvent {
                comm: c.comm,
                rank: c.rank,
                seq: c.seq,
                op: c.op as i32,
                bytes: c.bytes,
                start_ns: ns(c.call),
                end_ns: if completed { ns(end) } else { 0 },
                xfer_ns: if completed {
                    (self.reported_xfer(c, end) * 1e9).round() as u64
                } else {
                    0
                },
            };
            if completed {
                sig.collectives.push(record);
                return false;
            }
            if t_ns < d {
                sig.collectives.push(record);
                return true;
            }
            // Dead: only a completion stamped before the death may still be read.
            may_complete
        });
        self.colls = colls;
        self.read_links(t, t_ns, death, ns(t), &mut sig);
        // Completions are carried twice (this batch and the next) so that one lost
        // batch loses none; the controller drops the repeats as stale.
        let fresh: Vec<CollectiveEvent> = sig
            .collectives
            .iter()
            .filter(|c| c.end_ns != 0)
            .cloned()
            .collect();
        for c in &fresh {
            self.newest.saw(c);
        }
        stats.collectives = sig.collectives.len() as u64;
        // Older records first: each rank's records stay in the order they happened.
        let mut carried = std::mem::replace(&mut self.last_completed, fresh);
        carried.append(&mut sig.collectives);
        // Members with nothing newer here repeat their newest completion (a dead rank's
        // exit ended its repeats).
        let mut repeats = self
            .newest
            .repeats(&carried, |r| virtual_ns(death[r as usize]) > t_ns);
        repeats.append(&mut carried);
        sig.collectives = repeats;

        let mut events = vec![];
        let mut sent_critical = vec![];
        for (left, rec) in &mut self.repeats {
            *left -= 1;
            push_record(rec.clone(), &mut sig, &mut events);
        }
        self.repeats.retain(|(left, _)| *left > 0);
        self.records.retain(|p| {
            let d = p.rank.map_or(i64::MAX, |r| virtual_ns(death[r as usize]));
            let at = virtual_ns(p.at);
            if at > d {
                return d > t_ns;
            }
            if at > t_ns {
                return true;
            }
            let rec = p.record.skewed(off);
            if rec.critical() {
                sent_critical.push(rec.clone());
            }
            push_record(rec, &mut sig, &mut events);
            false
        });
        self.repeats
            .extend(sent_critical.into_iter().map(|r| (CRITICAL_REPEATS, r)));

        let has_job = !(sig.ranks.is_empty()
            && sig.links.is_empty()
            && sig.comms.is_empty()
            && sig.collectives.is_empty()
            && sig.metrics.is_empty()
            && sig.processes.is_empty()
            && sig.logs.is_empty());
        let batch = Batch {
            version: 0,
            node: self.name.clone(),
            agent_id: self.agent_id.clone(),
            boot_id: self.boot_id.clone(),
            seq: self.seq,
            sent_at_ns: SIM_EPOCH.nanos() + t_ns + off,
            jobs: if has_job { vec![sig] } else { vec![] },
            gpus: vec![],
            events,
            heartbeat: Some(Heartbeat {
                dropped_records: 0,
                failed_batches: self.failed_batches,
                collectors_down: vec![],
            }),
        };
        (batch, stats)
    }
}

impl Agent {
    /// Fold the per-peer sends the agent has read by true time `t` into the totals the
    /// plugin keeps, and report each total that moved, stamped `at_ns` (agent clock). A
    /// send after its rank's death never happened.
    fn read_links(&mut self, t: f64, t_ns: i64, death: &[f64], at_ns: i64, sig: &mut JobSignals) {
        if self.links.is_empty() {
            return;
        }
        let mut moved = Vec::new();
        let mut links = std::mem::take(&mut self.links);
        links.retain(|l| {
            let d = virtual_ns(death[l.rank as usize]);
            if virtual_ns(l.at) > d {
                return false;
            }
            if virtual_ns(self.read_at(l.at)) > t_ns || l.at > t {
                return true;
            }
            let key = (l.comm, l.rank, l.peer);
            let tot = self
                .link_totals
                .entry(key)
                .or_insert((0, 0, 0, l.comm_rank));
            tot.0 += l.steps;
            tot.1 += l.bytes;
            tot.2 += (l.busy * 1e9).round() as u64;
            moved.push(key);
            false
        });
        self.links = links;
        moved.sort_unstable();
        moved.dedup();
        for key in moved {
            let (steps, bytes, busy_ns, comm_rank) = self.link_totals[&key];
            sig.links.push(LinkSample {
                comm: key.0,
                rank: key.1,
                comm_rank,
                peer: key.2,
                at_ns,
                steps,
                bytes,
                busy_ns,
            });
        }
    }
}

fn push_record(rec: Record, sig: &mut JobSignals, events: &mut Vec<NodeEvent>) {
    match rec {
        Record::Metric(m) => sig.metrics.push(m),
        Record::Process(p) => sig.processes.push(p),
        Record::Log(l) => sig.logs.push(l),
        Record::Event(e) => events.push(e),
    }
}

/// Process id of rank `r` on its node.
pub fn pid_of(r: u32, topo: &Topology) -> u32 {
    4000 + 17 * topo.gpu_of(r) + (r / topo.gpus_per_node) % 7
}

/// The UUID NVML would report for GPU `gpu` of node `node`.
pub fn gpu_uuid(node: &str, gpu: u32) -> String {
    let h = fnv1a(format!("{node}/gpu/{gpu}").as_bytes());
    let l = fnv1a(format!("{gpu}/{node}").as_bytes());
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (h >> 32) as u32,
        (h >> 16) as u16,
        h as u16,
        (l >> 48) as u16,
        l & 0xffff_ffff_ffff
    )
}

/// The PCI bus id the kernel prints for GPU `gpu` (`0000:18:00` style).
pub fn pci_bus_id(gpu: u32) -> String {
    const BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    let bus = BUSES
        .get(gpu as usize)
        .copied()
        .unwrap_or(0xe0 + gpu % 0x1f);
    format!("0000:{bus:02x}:00")
}
