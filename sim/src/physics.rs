//! The training job's physics: one step at a time for all ranks at once, compute and
//! collectives in a synchronous 3D-parallel schedule, with noise and the scenario's
//! faults, handing each record to the agent of the node it happened on.

use warden_model::wire::{
    CollOp, EventSeverity, LogRecord, LogStream, NodeEvent, NodeEventKind, ProcessState,
    TrainingMetric,
};

use crate::agent::{
    Agent, PendingColl, PendingLink, PendingRecord, Record, pci_bus_id, pid_of, true_ns,
};
use crate::rng::Draw;
use crate::scenario::{FaultKind, Metrics, Scenario, is_fatal_xid};
use crate::topology::{CommKind, Pair, Topology};

const INF: f64 = f64::INFINITY;

/// Start of step 0, seconds after the run start (process launch and setup).
const LAUNCH_SECS: f64 = 1.0;

/// Where in its step's compute a stopping rank stops.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// In the first half, at this time: it never reaches TP allreduce #1.
    A(f64),
    /// This long into the second half: it never reaches TP allreduce #2.
    B(f64),
}

/// When and how the injected faults took effect.
#[derive(Debug, Clone, Default)]
pub struct Onset {
    /// Virtual time it took effect, seconds.
    pub at: Option<f64>,
    /// Rank concerned (for an XID, the rank on that GPU).
    pub rank: Option<u32>,
}

/// Step-by-step state of the job.
#[derive(Debug)]
pub struct Physics {
    scenario: Scenario,
    topo: Topology,
    draw: Draw,
    /// Per-peer wire times of `nccl_proxy` (their own stream, so that the job's
    /// physics draws the same under every capture path).
    net: Draw,
    /// How far ahead of the GPU each host call comes (its own stream, so that the
    /// job's physics draws the same with any lead).
    host: Draw,
    /// Node index of each fault's node (by fault index), if it names one.
    fault_nodes: Vec<Option<u32>>,
    /// Start of the next step per rank (infinite: it never starts).
    start: Vec<f64>,
    /// Death or exit time per rank (infinite: alive).
    pub death: Vec<f64>,
    /// Next step to generate.
    pub next_step: u64,
    /// Max end time of each completed step (all ranks finished it).
    pub step_ends: Vec<f64>,
    /// Each checkpoint every rank finished saving: the steps it holds and when the
    /// last rank's save ended, seconds.
    pub checkpoints: Vec<(u64, f64)>,
    /// Latest completion of any collective anywhere, seconds.
    pub last_completion: f64,
    /// Onset of each fault, by fault index.
    pub onsets: Vec<Onset>,
    /// When the run ends, once known.
    pub end_time: Option<f64>,
    /// Extra time after the last exit before the run ends.
    drain_secs: f64,
    /// Earliest start of the next step (cached).
    next_start: Option<f64>,
    // Per-step scratch, by rank.
    compute_a: Vec<f64>,
    compute_b: Vec<f64>,
    arrive: Vec<f64>,
    end: Vec<f64>,
    /// Start of this step per rank (the host waited for the previous one).
    began: Vec<f64>,
    /// The host's last call per rank: it calls operations in program order.
    last_call: Vec<f64>,
}

impl Physics {
    /// The job of `scenario`, before its first step. `drain_secs`: how long the run
    /// goes on after the last rank exited normally.
    pub fn new(scenario: &Scenario, topo: &Topology, drain_secs: f64) -> Self {
        let world = topo.world as usize;
        let mut draw = Draw::new(scenario.seed, 1);
        let start = (0..world)
            .map(|_| LAUNCH_SECS + draw.uniform(0.0, 0.05))
            .collect();
        let mut physics = Physics {
            fault_nodes: scenario
                .faults
                .iter()
                .map(|f| match &f.kind {
                    FaultKind::Straggler { node, .. }
                    | FaultKind::SlowLink { node, .. }
                    | FaultKind::Xid { node, .. } => scenario.node_index(node),
                    _ => None,
                })
                .collect(),
            onsets: vec![Onset::default(); scenario.faults.len()],
            scenario: scenario.clone(),
            topo: topo.clone(),
            draw,
            host: Draw::new(scenario.seed, 7),
            net: Draw::new(scenario.seed, 11),
            start,
            death: vec![INF; world],
            next_step: 0,
            step_ends: vec![],
            checkpoints: vec![],
            last_completion: 0.0,
            end_time: None,
            drain_secs,
            compute_a: vec![0.0; world],
            compute_b: vec![0.0; world],
            arrive: vec![0.0; world],
            end: vec![0.0; world],
            began: vec![0.0; world],
            last_call: vec![0.0; world],
            next_start: None,
        };
        physics.refresh_next_start();
        physics
    }

    /// Process-start records of every rank, at time 0.
    pub fn launch(&mut self, agents: &mut [Agent]) {
        for r in 0..self.topo.world {
            let node = self.topo.node_of(r) as usize;
            agents[node].records.push(PendingRecord {
                at: 0.0,
                rank: Some(r),
                record: Record::Process(ProcessState {
                    rank: r,
                    pid: pid_of(r, &self.topo),
                    at_ns: true_ns(0.0),
                    alive: true,
                    exit_code: None,
                    signal: None,
                    stopped: false,
                    from_log: false,
                }),
            });
        }
    }

    /// Earliest start of the next step, if it will ever start before the run ends.
    pub fn next_start(&self) -> Option<f64> {
        self.next_start
    }

    fn refresh_next_start(&mut self) {
        self.next_start = None;
        if self.next_step >= self.scenario.steps {
            return;
        }
        let t = self
            .start
            .iter()
            .zip(&self.death)
            .filter(|(s, d)| s.is_finite() && s <= d)
            .map(|(s, _)| *s)
            .fold(INF, f64::min);
        if t.is_finite() && self.end_time.is_none_or(|e| t <= e) {
            self.next_start = Some(t);
        }
    }

    fn emit(
        &self,
        agents: &mut [Agent],
        urgent: &mut Vec<(f64, u32)>,
        rank: Option<u32>,
        node: u32,
        at: f64,
        record: Record,
    ) {
        if record.urgent() {
            urgent.push((at, node));
        }
        agents[node as usize]
            .records
            .push(PendingRecord { at, rank, record });
    }

    /// Generate the next step for every rank. Records go to the agents' queues; agents
    /// that must flush at once are listed in `urgent` with the time.
    pub fn step(&mut self, agents: &mut [Agent], urgent: &mut Vec<(f64, u32)>) {
        let k = self.next_step;
        self.next_step += 1;
        let world = self.topo.world as usize;
        let gpn = self.topo.gpus_per_node;
        let iter = self.scenario.job.iteration_secs;
        let jitter = self.scenario.job.jitter;
        let noise = self.scenario.noise.clone();

        // Per-node compute and link factors at this step.
        let nodes = self.topo.node_names.len();
        let mut slow = vec![1.0; nodes];
        let mut link = vec![1.0; nodes];
        for (i, f) in self.scenario.faults.iter().enumerate() {
            let Some(n) = self.fault_nodes[i] else {
                continue;
            };
            if !f.active_at(k) {
                continue;
            }
            match f.kind {
                FaultKind::Straggler { slowdown, .. } => slow[n as usize] *= slowdown,
                FaultKind::SlowLink { slowdown, .. } => link[n as usize] *= slowdown,
                _ => {}
            }
            if f.step == k
                && matches!(
                    f.kind,
                    FaultKind::Straggler { .. } | FaultKind::SlowLink { .. }
                )
            {
                let first = self
                    .start
                    .iter()
                    .copied()
                    .filter(|s| s.is_finite())
                    .fold(INF, f64::min);
                self.onsets[i].at = first.is_finite().then_some(first);
            }
        }

        // Compute times, with hiccups.
        for r in 0..world {
            let s = self.start[r];
            if !(s.is_finite() && s <= self.death[r]) {
                self.compute_a[r] = INF;
                self.compute_b[r] = INF;
                self.start[r] = INF;
                continue;
            }
            let node = r / gpn as usize;
            let c = iter * slow[node] * (1.0 + jitter * self.draw.normal()).max(0.2);
            let (mut a, mut b) = (0.4 * c, 0.6 * c);
            if self.draw.chance(noise.hiccup_prob) {
                let h = noise.hiccup_secs * self.draw.uniform(0.5, 1.5);
                if self.draw.unit() < 0.5 {
                    a += h;
                } else {
                    b += h;
                }
            }
            self.compute_a[r] = a;
            self.compute_b[r] = b;
        }

        // Faults that act at a point inside this step's compute.
        let mut stop: Option<(usize, u32, Stop)> = None;
        for i in 0..self.scenario.faults.len() {
            let f = self.scenario.faults[i].clone();
            match f.kind {
                FaultKind::Hang { rank } if f.step == k => {
                    let s = self.start[rank as usize];
                    if s.is_finite() {
                        stop = Some((i, rank, Stop::A(s)));
                    }
                }
                FaultKind::Crash { rank } if f.step == k => {
                    stop = self.stop_point(rank).map(|p| (i, rank, p));
                }
                FaultKind::Xid { code, .. } if f.step == k && is_fatal_xid(code) => {
                    let Some(rank) = self.xid_rank(i) else {
                        continue;
                    };
                    stop = self.stop_point(rank).map(|p| (i, rank, p));
                }
                FaultKind::Xid { code, .. }
                    if f.active_at(k) && (k - f.step).is_multiple_of(50) && !is_fatal_xid(code) =>
                {
                    let Some(rank) = self.xid_rank(i) else {
                        continue;
                    };
                    let r = rank as usize;
                    let s = self.start[r];
                    let c = self.compute_a[r] + self.compute_b[r];
                    if s.is_finite() && c.is_finite() {
                        let at = s + self.draw.unit() * c;
                        self.xid_event(i, rank, at, agents, urgent);
                    }
                }
                _ => {}
            }
        }

        // Compute A, TP allreduce #1, PP exchange, compute B, TP allreduce #2, DP allreduce;
        // with `layers` L, each compute half is L slices, each ending in its layer's TP
        // allreduce (TP sequence numbers 2Lk + 1 ..= 2Lk + 2L).
        let layers = u64::from(self.scenario.job.layers.max(1));
        let slices = layers as f64;
        self.began.copy_from_slice(&self.start);
        // A stop inside a half takes effect at the first layer's all-reduce the rank
        // would have entered after it.
        let mut stop_a = match stop {
            Some((i, rank, Stop::A(at))) => Some((i, rank, at)),
            _ => None,
        };
        for l in 0..layers {
            for r in 0..world {
                let from = if l == 0 { self.start[r] } else { self.end[r] };
                self.arrive[r] = from + self.compute_a[r] / slices;
            }
            if let Some((i, rank, at)) = stop_a
                && at < self.arrive[rank as usize]
            {
                self.arrive[rank as usize] = INF;
                self.apply_stop(i, rank, at, agents, urgent);
                stop_a = None;
            }
            self.collective(CommKind::Tp, 2 * layers * k + l + 1, &link, agents);
        }
        self.arrive.copy_from_slice(&self.end);
        self.pipeline(k + 1, &link, agents);
        let mut stop_b = match stop {
            Some((i, rank, Stop::B(offset))) => Some((i, rank, self.end[rank as usize] + offset)),
            _ => None,
        };
        for l in 0..layers {
            for r in 0..world {
                self.arrive[r] = self.end[r] + self.compute_b[r] / slices;
            }
            if let Some((i, rank, at)) = stop_b
                && (at < self.arrive[rank as usize] || !at.is_finite())
            {
                self.arrive[rank as usize] = INF;
                if at.is_finite() {
                    self.apply_stop(i, rank, at, agents, urgent);
                }
                stop_b = None;
            }
            self.collective(CommKind::Tp, 2 * layers * k + layers + l + 1, &link, agents);
        }
        self.arrive.copy_from_slice(&self.end);
        self.collective(CommKind::Dp, k + 1, &link, agents);

        // End of step: metrics, then a checkpoint or the next step.
        let nan_faults: Vec<(u64, Option<u64>, u32)> = self
            .scenario
            .faults
            .iter()
            .filter_map(|f| match f.kind {
                FaultKind::Nan { rank } => Some((f.step, f.until_step, rank)),
                _ => None,
            })
            .collect();
        let active_nan = nan_faults
            .iter()
            .find(|(s, u, _)| k >= *s && u.is_none_or(|u| k < u))
            .copied();
        let tokens_per_rank = 4096.0 * 8.0;
        let mut all_done = true;
        let mut step_end = 0.0_f64;
        let checkpoint = noise.checkpoint_every_steps > 0
            && (k + 1).is_multiple_of(noise.checkpoint_every_steps);
        let last = k + 1 == self.scenario.steps;
        for r in 0..world {
            let e = self.end[r];
            let began = self.start[r];
            if !(e.is_finite() && e <= self.death[r]) {
                all_done = false;
                self.start[r] = INF;
                continue;
            }
            step_end = step_end.max(e);
            let mut loss = 2.5 * (-(k as f64) / 2000.0).exp() + 0.01 * self.draw.normal();
            let mut grad = (1.0 + 0.1 * self.draw.normal()).abs();
            // The input check: the culprit fed the NaN into its first reduction of the
            // step; the rest of its replica got it from there and fed it on later;
            // other replicas reduce their own finite gradients until the next step.
            let mut first_nonfinite_op = None;
            if let Some((s, _, culprit)) = active_nan
                && self.scenario.grad_check
            {
                let replica = self.topo.coords(r as u32).1 == self.topo.coords(culprit).1;
                first_nonfinite_op = match (k == s, r as u32 == culprit) {
                    (false, _) => Some(0),
                    (true, true) => Some(0),
                    (true, false) if replica => Some(1),
                    (true, false) => None,
                };
            }
            if let Some((s, _, culprit)) = active_nan {
                if k == s {
                    // The gradient norm is taken after the data-parallel reduction,
                    // which spread the NaN to every rank; the loss is the replica's
                    // own, or the reduced one that every rank shares.
                    grad = f64::NAN;
                    let replica = self.topo.coords(r as u32).1 == self.topo.coords(culprit).1;
                    if replica || self.scenario.metrics == Metrics::Reduced {
                        loss = f64::NAN;
                    }
                } else {
                    loss = f64::NAN;
                    grad = f64::NAN;
                }
            }
            let rank = r as u32;
            let node = rank / gpn;
            if let Some((s, _, culprit)) = active_nan
                && k == s
                && rank == culprit
                && let Some(i) = self.scenario.faults.iter().position(|f| {
                    f.step == s && matches!(f.kind, FaultKind::Nan { rank } if rank == culprit)
                })
            {
                self.onsets[i] = Onset {
                    at: Some(e),
                    rank: Some(rank),
                };
            }
            self.emit(
                agents,
                urgent,
                Some(rank),
                node,
                e,
                Record::Metric(TrainingMetric {
                    rank,
                    step: k,
                    at_ns: true_ns(e),
                    loss: Some(loss),
                    grad_norm: Some(grad),
                    tokens_per_s: Some(tokens_per_rank / (e - began).max(1e-6)),
                    first_nonfinite_op,
                }),
            );
            if last {
                let exit = e + self.draw.uniform(0.1, 0.5);
                self.death[r] = exit;
                self.start[r] = INF;
                self.end_time = Some(self.end_time.unwrap_or(0.0).max(exit + self.drain_secs));
                self.emit(
                    agents,
                    urgent,
                    Some(rank),
                    node,
                    exit,
                    Record::Process(ProcessState {
                        rank,
                        pid: pid_of(rank, &self.topo),
                        at_ns: true_ns(exit),
                        alive: false,
                        exit_code: Some(0),
                        signal: None,
                        stopped: false,
                        from_log: false,
                    }),
                );
            } else if checkpoint {
                self.start[r] =
                    e + noise.checkpoint_secs * (1.0 + 0.01 * self.draw.normal()).max(0.0);
            } else {
                self.start[r] = e;
            }
        }
        if all_done && step_end > 0.0 {
            self.step_ends.push(step_end);
            // A checkpoint is complete once every rank has saved its part, and only
            // if none of them died first.
            if checkpoint && !last {
                let saved = self.start.iter().copied().fold(0.0_f64, f64::max);
                if saved.is_finite() && self.death.iter().all(|&d| d > saved) {
                    self.checkpoints.push((k + 1, saved));
                }
            }
        }
        self.refresh_next_start();
        if self.next_start.is_none() && self.end_time.is_none() {
            // Nothing will ever happen again and no fault set an end: stop soon.
            let t = self.last_completion.max(step_end);
            self.end_time = Some(t + self.tail_secs());
        }
    }

    fn tail_secs(&self) -> f64 {
        (10.0 * self.scenario.job.iteration_secs).max(30.0)
    }

    /// Pick a random point in `rank`'s compute of this step where it stops.
    fn stop_point(&mut self, rank: u32) -> Option<Stop> {
        let r = rank as usize;
        let (s, a, b) = (self.start[r], self.compute_a[r], self.compute_b[r]);
        if !(s.is_finite() && a.is_finite()) {
            return None;
        }
        let u = self.draw.unit() * (a + b);
        Some(if u < a {
            Stop::A(s + u)
        } else {
            Stop::B(u - a)
        })
    }

    /// The rank on the GPU named by XID fault `i`.
    fn xid_rank(&self, i: usize) -> Option<u32> {
        match self.scenario.faults[i].kind {
            FaultKind::Xid { gpu, .. } => {
                self.fault_nodes[i].map(|n| n * self.topo.gpus_per_node + gpu)
            }
            _ => None,
        }
    }

    /// A stopping fault takes effect: `rank` stops (or dies) at `at`.
    fn apply_stop(
        &mut self,
        i: usize,
        rank: u32,
        at: f64,
        agents: &mut [Agent],
        urgent: &mut Vec<(f64, u32)>,
    ) {
        self.onsets[i] = Onset {
            at: Some(at),
            rank: Some(rank),
        };
        self.end_time = Some(at + self.tail_secs());
        match self.scenario.faults[i].kind {
            FaultKind::Crash { .. } => self.crash(rank, at, agents, urgent),
            FaultKind::Xid { .. } => self.xid_event(i, rank, at, agents, urgent),
            _ => {}
        }
    }

    /// The kernel log line and node event of XID fault `i` on `rank`'s GPU at `at`.
    fn xid_event(
        &mut self,
        i: usize,
        rank: u32,
        at: f64,
        agents: &mut [Agent],
        urgent: &mut Vec<(f64, u32)>,
    ) {
        let FaultKind::Xid { gpu, code, .. } = self.scenario.faults[i].kind else {
            return;
        };
        let node = rank / self.topo.gpus_per_node;
        if self.onsets[i].at.is_none() {
            self.onsets[i] = Onset {
                at: Some(at),
                rank: Some(rank),
            };
        }
        let id = agents[node as usize].event_id();
        let bus = pci_bus_id(gpu);
        let message = format!(
            "NVRM: Xid (PCI:{bus}): {code}, pid={}, name=python, {}",
            pid_of(rank, &self.topo),
            xid_text(code)
        );
        let line = Record::Log(LogRecord {
            rank: None,
            at_ns: true_ns(at),
            stream: LogStream::Kernel as i32,
            line: message.clone(),
        });
        self.emit(agents, urgent, None, node, at, line);
        let event = Record::Event(NodeEvent {
            id,
            at_ns: true_ns(at),
            kind: NodeEventKind::Xid as i32,
            severity: xid_severity(code) as i32,
            gpu_index: Some(gpu),
            pci_bus_id: bus,
            code: Some(code),
            message,
            count: 1,
        });
        self.emit(agents, urgent, None, node, at, event);
    }

    fn crash(&mut self, culprit: u32, at: f64, agents: &mut [Agent], urgent: &mut Vec<(f64, u32)>) {
        let gpn = self.topo.gpus_per_node;
        let node = culprit / gpn;
        let segfault = self.draw.unit() < 0.5;
        let (lines, exit_code, signal): (Vec<String>, Option<i32>, Option<i32>) = if segfault {
            (
                vec![
                    format!("[rank{culprit}]: Fatal Python error: Segmentation fault"),
                    format!(
                        "[rank{culprit}]: Current thread 0x00007f3a2c1ff640 (most recent call first):"
                    ),
                ],
                None,
                Some(11),
            )
        } else {
            (
                vec![
                    format!("[rank{culprit}]: Traceback (most recent call last):"),
                    format!("[rank{culprit}]:   File \"train.py\", line 412, in train_step"),
                    format!(
                        "[rank{culprit}]: RuntimeError: CUDA error: an illegal memory access was encountered"
                    ),
                ],
                Some(1),
                None,
            )
        };
        self.death[culprit as usize] = at;
        for line in lines {
            self.emit(
                agents,
                urgent,
                Some(culprit),
                node,
                at,
                Record::Log(LogRecord {
                    rank: Some(culprit),
                    at_ns: true_ns(at),
                    stream: LogStream::Stderr as i32,
                    line,
                }),
            );
        }
        self.emit(
            agents,
            urgent,
            Some(culprit),
            node,
            at,
            Record::Process(ProcessState {
                rank: culprit,
                pid: pid_of(culprit, &self.topo),
                at_ns: true_ns(at),
                alive: false,
                exit_code,
                signal,
                stopped: false,
                from_log: false,
            }),
        );
        let peer_ip = format!("10.0.{}.{}", node / 250, node % 250 + 2);
        for r in 0..self.topo.world {
            if r == culprit || self.death[r as usize].is_finite() {
                continue;
            }
            let d = at + self.draw.uniform(0.05, 0.6);
            self.death[r as usize] = d;
            let n = r / gpn;
            let line = format!(
                "[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [{peer_ip}]:29500"
            );
            self.emit(
                agents,
                urgent,
                Some(r),
                n,
                d,
                Record::Log(LogRecord {
                    rank: Some(r),
                    at_ns: true_ns(d),
                    stream: LogStream::Stderr as i32,
                    line,
                }),
            );
            self.emit(
                agents,
                urgent,
                Some(r),
                n,
                d,
                Record::Process(ProcessState {
                    rank: r,
                    pid: pid_of(r, &self.topo),
                    at_ns: true_ns(d),
                    alive: false,
                    exit_code: Some(1),
                    signal: None,
                    stopped: false,
                    from_log: false,
                }),
            );
        }
    }

    /// Queue rank `src`'s sends to its peer on `comm` (`ranks`: both in the
    /// communicator) for its node's agent, `nccl_proxy` only: `bytes` in chunks of
    /// [`CHUNK_BYTES`], done by `end`, taking `wire` on the wire in all (the bytes at
    /// [`NET_BYTES_PER_SEC`], at the pace of the slower end of the link) with a few
    /// percent of noise,
    /// and now and then congestion on the fabric (a step queued behind other traffic).
    #[allow(clippy::too_many_arguments)]
    fn send_link(
        &mut self,
        agents: &mut [Agent],
        src: u32,
        comm: u64,
        (comm_rank, peer): (u32, u32),
        end: f64,
        bytes: u64,
        wire: f64,
    ) {
        let mut busy = wire * (1.0 + 0.05 * self.net.normal().abs());
        if self
            .net
            .chance((3.0 * self.scenario.noise.hiccup_prob).min(0.5))
        {
            busy *= self.net.uniform(1.5, 4.0);
        }
        agents[(src / self.topo.gpus_per_node) as usize]
            .links
            .push(PendingLink {
                rank: src,
                comm,
                comm_rank,
                peer,
                at: end,
                steps: bytes.div_ceil(CHUNK_BYTES).max(1),
                bytes,
                busy,
            });
    }

    /// When the host of rank `r` called an operation its GPU reaches at `at`: up to
    /// `job.host_lead_secs` before, never before the step began nor before its previous
    /// call (program order).
    fn host_call(&mut self, r: usize, at: f64) -> f64 {
        let lead = self.scenario.job.host_lead_secs * self.host.uniform(0.5, 1.5);
        let call = (at - lead)
            .max(self.began[r].min(at))
            .max(self.last_call[r].min(at));
        self.last_call[r] = call;
        call
    }

    /// Queue rank `m`'s part of an operation for its node's agent, if its host called it.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        agents: &mut [Agent],
        m: u32,
        comm: u64,
        seq: u64,
        op: CollOp,
        bytes: u64,
        start: f64,
        end: f64,
        spans_nodes: bool,
    ) {
        let mu = m as usize;
        if !(start.is_finite() && start <= self.death[mu]) {
            return;
        }
        let call = self.host_call(mu, start);
        agents[(m / self.topo.gpus_per_node) as usize]
            .colls
            .push(PendingColl {
                rank: m,
                comm,
                seq,
                op,
                bytes,
                call,
                start,
                end,
                spans_nodes,
            });
    }

    /// Run one collective on every communicator of `kind` (TP or DP): arrivals in
    /// `self.arrive`, completion in `self.end`. Ranks outside any such communicator
    /// pass through.
    fn collective(&mut self, kind: CommKind, seq: u64, link: &[f64], agents: &mut [Agent]) {
        let comms = self.topo.comms(kind).to_vec();
        if comms.is_empty() {
            self.end.copy_from_slice(&self.arrive);
            return;
        }
        let mut base = kind.base_fraction() * self.scenario.job.iteration_secs;
        if kind == CommKind::Tp {
            // A step's TP time is shared by its layers' all-reduces.
            base /= f64::from(self.scenario.job.layers.max(1));
        }
        let gpn = self.topo.gpus_per_node;
        for c in &comms {
            let mut latest = 0.0_f64;
            let mut first_death = INF;
            let mut x_max = 0.0_f64;
            for m in c.members() {
                let m = m as usize;
                let a = self.arrive[m];
                let d = self.death[m];
                latest = if a <= d { latest.max(a) } else { INF };
                first_death = first_death.min(d);
                let lf = if c.spans_nodes {
                    link[m / gpn as usize]
                } else {
                    1.0
                };
                let x = base * (1.0 + 0.03 * self.draw.normal().abs()) * lf;
                x_max = x_max.max(x);
            }
            // A ring moves at the pace of its slowest link, for every member.
            let mut end = latest + x_max;
            if end > first_death {
                end = INF;
            }
            if end.is_finite() {
                self.last_completion = self.last_completion.max(end);
            }
            if end.is_finite() && c.spans_nodes && self.scenario.capture.sees_links() {
                let ring: Vec<u32> = c.members().collect();
                let n = ring.len();
                // A ring all-reduce sends 2 (n - 1) / n of the payload to the next member.
                let bytes = (2 * (n as u64 - 1) * kind.bytes()) / n as u64;
                for (k, &m) in ring.iter().enumerate() {
                    let next = ring[(k + 1) % n];
                    let (from, to) = (m / gpn, next / gpn);
                    if from != to {
                        let lf = link[from as usize].max(link[to as usize]);
                        let wire = bytes as f64 / NET_BYTES_PER_SEC * lf;
                        let ranks = (k as u32, ((k + 1) % n) as u32);
                        self.send_link(agents, m, c.hash, ranks, end, bytes, wire);
                    }
                }
            }
            for m in c.members() {
                self.end[m as usize] = end;
                let a = self.arrive[m as usize];
                self.record(
                    agents,
                    m,
                    c.hash,
                    seq,
                    kind.op(),
                    kind.bytes(),
                    a,
                    end,
                    c.spans_nodes,
                );
            }
        }
    }

    /// Queue both sides of one point-to-point transfer on `pr`: the send posted at
    /// `send_at`, the receive at `recv_at`, both ending at `end`.
    fn transfer_records(
        &mut self,
        agents: &mut [Agent],
        pr: &Pair,
        seq: u64,
        send_at: f64,
        recv_at: f64,
        end: f64,
    ) {
        let (bytes, sp) = (CommKind::Pp.bytes(), pr.spans_nodes);
        self.record(
            agents,
            pr.src,
            pr.hash,
            seq,
            CollOp::Send,
            bytes,
            send_at,
            end,
            sp,
        );
        self.record(
            agents,
            pr.dst,
            pr.hash,
            seq,
            CollOp::Recv,
            bytes,
            recv_at,
            end,
            sp,
        );
    }

    /// The pipeline exchange of one step, as point-to-point traffic between adjacent
    /// stages: forward, stage `s` sends to `s + 1` once it has its input (stage 0 at
    /// once); backward, the last stage sends to the one before once its forward input
    /// came, each stage passing it on once it received it. A receive is posted when the
    /// rank arrives (forward) or once its own forward send is done (backward). Each
    /// transfer ends when both sides are there plus its transfer time. A rank's
    /// exchange ends with the last of its operations; ranks outside any pipeline group
    /// pass through.
    fn pipeline(&mut self, seq: u64, link: &[f64], agents: &mut [Agent]) {
        self.end.copy_from_slice(&self.arrive);
        let pp = self.topo.pp as usize;
        if pp < 2 {
            return;
        }
        let base = CommKind::Pp.base_fraction() * self.scenario.job.iteration_secs;
        let gpn = self.topo.gpus_per_node as usize;
        let groups = self.topo.pp_comms.len();
        for g in 0..groups {
            let pairs = self.topo.pairs_of_group(g as u32).to_vec();
            let (fwd, bwd) = pairs.split_at(pp - 1);
            let mut fwd_end = vec![INF; pp - 1];
            let mut bwd_end = vec![INF; pp - 1];
            let transfer = |this: &mut Self, src: u32, dst: u32, send_at: f64, recv_at: f64| {
                let x = base
                    * (1.0 + 0.03 * this.draw.normal().abs())
                    * if src as usize / gpn != dst as usize / gpn {
                        link[src as usize / gpn].max(link[dst as usize / gpn])
                    } else {
                        1.0
                    };
                let dies = this.death[src as usize].min(this.death[dst as usize]);
                let end = send_at.max(recv_at) + x;
                if end.is_finite() && end <= dies {
                    this.last_completion = this.last_completion.max(end);
                    end
                } else {
                    INF
                }
            };
            let group = self.topo.pp_comms[g].hash;
            let sends_link = |this: &mut Self, agents: &mut [Agent], pr: &Pair, end: f64| {
                if end.is_finite() && pr.spans_nodes && this.scenario.capture.sees_links() {
                    let lf = link[pr.src as usize / gpn].max(link[pr.dst as usize / gpn]);
                    let stages = (pr.src_stage, pr.dst_stage);
                    let bytes = CommKind::Pp.bytes();
                    let wire = bytes as f64 / NET_BYTES_PER_SEC * lf;
                    this.send_link(agents, pr.src, group, stages, end, bytes, wire);
                }
            };
            for (s, pr) in fwd.iter().enumerate() {
                let sender_ready = if s == 0 {
                    self.arrive[pr.src as usize]
                } else {
                    self.arrive[pr.src as usize].max(fwd_end[s - 1])
                };
                let recv_at = self.arrive[pr.dst as usize];
                let end = transfer(self, pr.src, pr.dst, sender_ready, recv_at);
                sends_link(self, agents, pr, end);
                fwd_end[s] = end;
                self.transfer_records(agents, pr, seq, sender_ready, recv_at, end);
            }
            // bwd[i] runs from stage i + 1 to stage i; the last stage's goes first.
            for s in (0..pp - 1).rev() {
                let pr = &bwd[s];
                let sender_ready = if s + 1 == pp - 1 {
                    fwd_end[s]
                } else {
                    bwd_end[s + 1]
                };
                let recv_at = fwd_end[s];
                let end = transfer(self, pr.src, pr.dst, sender_ready, recv_at);
                sends_link(self, agents, pr, end);
                bwd_end[s] = end;
                self.transfer_records(agents, pr, seq, sender_ready, recv_at, end);
            }
            // A rank's exchange ends with its last operation.
            for s in 0..pp {
                let rank = fwd.get(s).map_or_else(|| fwd[s - 1].dst, |p| p.src) as usize;
                let mut e = if s + 1 < pp { bwd_end[s] } else { INF };
                if s > 0 {
                    let own_send = bwd_end[s - 1];
                    e = if s + 1 < pp {
                        e.max(own_send)
                    } else {
                        own_send
                    };
                }
                self.end[rank] = e;
            }
        }
    }
}

/// What one rank's network link moves when healthy, bytes per second (200 Gb/s): the
/// wire time of a send is its bytes at this pace, times the slower end's slowdown.
pub const NET_BYTES_PER_SEC: f64 = 25e9;

/// Bytes one proxy step moves (NCCL's default chunk on the network, 512 KiB).
pub const CHUNK_BYTES: u64 = 512 << 10;

/// Severity the agent gives an XID: its catalog's (`rules/xid.yaml`).
pub fn xid_severity(code: u32) -> EventSeverity {
    warden_model::xid::XidCatalog::builtin().severity(code)
}

/// The text the driver prints after an XID's code.
pub fn xid_text(code: u32) -> &'static str {
    match code {
        13 => "Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address",
        31 => {
            "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ"
        }
        43 => "Ch 00000008, engmask 00000101",
        48 => {
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0."
        }
        63 => {
            "Row Remapper: New row (0x00000000000b1a2c) was marked for remapping, reset gpu to activate."
        }
        64 => "Row Remapper: Failed to remap row, the row remapper table is full.",
        74 => "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        79 => "GPU has fallen off the bus.",
        92 => "High single-bit ECC error rate detected.",
        94 => "Contained ECC error.",
        95 => "Uncontained ECC error.",
        119 => {
            "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)."
        }
        120 => "GSP task exception: Error in GSP task.",
        _ => "Graphics Exception.",
    }
}
