//! The simulation loop: virtual time advanced through step generation, agent flushes,
//! batch deliveries and controller ticks, feeding a [`Sink`] exactly what agents send.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use warden_engine::{Encoding, Engine, EngineConfig, IncidentChange};
use warden_model::Timestamp;

use crate::agent::{Agent, SIM_EPOCH, virtual_ns};
use crate::physics::Physics;
use crate::report::Report;
use crate::rng::Draw;
use crate::scenario::{FaultKind, Metrics, Scenario};
use crate::topology::Topology;

/// Urgent records of one node at most this far apart leave in the same urgent flush.
pub const URGENT_POLL_SECS: f64 = 0.02;

/// Delay between an agent's flush and the batch's arrival at the controller, seconds.
pub const DELIVERY_DELAY_SECS: f64 = 0.002;

/// Where batches go: the controller, or anything that wants to look at them.
pub trait Sink {
    /// One binary-encoded batch, received at `now`.
    fn deliver(&mut self, body: &[u8], now: Timestamp);
    /// One binary-encoded batch from the agent of node `node` (its index in the job's
    /// topology), received at `now`: [`Sink::deliver`] unless the sink keeps the agents
    /// apart (`warden loadgen` sends each agent's batches on its own, in order).
    fn deliver_from(&mut self, node: u32, body: &[u8], now: Timestamp) {
        let _ = node;
        self.deliver(body, now);
    }
    /// Run the detectors at `now`.
    fn tick(&mut self, now: Timestamp) -> Vec<IncidentChange>;
}

impl Sink for Engine {
    fn deliver(&mut self, body: &[u8], now: Timestamp) {
        // A rejected batch is counted by the engine itself (stats().rejected).
        let _ = self.ingest(body, Encoding::Binary, now);
    }

    fn tick(&mut self, now: Timestamp) -> Vec<IncidentChange> {
        Engine::tick(self, now)
    }
}

/// An engine shared with other readers (the controller's `SharedEngine::engine`, an API
/// served beside the simulation). A poisoned lock is taken over: the state is plain data.
impl Sink for Arc<Mutex<Engine>> {
    fn deliver(&mut self, body: &[u8], now: Timestamp) {
        let mut e = self.lock().unwrap_or_else(|p| p.into_inner());
        let _ = e.ingest(body, Encoding::Binary, now);
    }

    fn tick(&mut self, now: Timestamp) -> Vec<IncidentChange> {
        self.lock().unwrap_or_else(|p| p.into_inner()).tick(now)
    }
}

/// How the simulation runs (not what it simulates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunOptions {
    /// Controller tick period, virtual seconds.
    pub tick_secs: f64,
    /// Agent flush period, virtual seconds.
    pub flush_secs: f64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            tick_secs: 0.25,
            flush_secs: 1.0,
        }
    }
}

/// Where a simulation stands.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Steps completed by every rank.
    pub step: u64,
    /// Steps the scenario asks for.
    pub steps: u64,
    /// Virtual seconds simulated.
    pub sim_seconds: f64,
    /// Batches delivered.
    pub batches: u64,
    /// Collective records sent (completed and in flight).
    pub collective_events: u64,
    /// Ranks in the job.
    pub ranks: u32,
}

/// An injected fault as it took effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// Scenario kind: straggler, slow_link, nan, xid, hang, crash.
    pub kind: String,
    /// Rank concerned (for an XID, the rank on that GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Node concerned.
    pub node: String,
    /// GPU index on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// XID code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u32>,
    /// Slowdown factor (straggler, slow link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown: Option<f64>,
    /// Step it starts at.
    pub step: u64,
    /// Step it ends at (exclusive), if not the end of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_step: Option<u64>,
    /// Virtual time it took effect, seconds since the run start.
    pub onset_s: f64,
    /// For faults that stop the job: the last completion of any collective anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_s: Option<f64>,
    /// The ranks an incident must name, where they are not just `rank`: for a NaN
    /// without the input check, its data-parallel replica (each replica reports its own
    /// loss) or none at all (every rank reports the reduced loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub culprits: Option<Vec<u32>>,
    /// Whether the capture path can see this fault at all (a slow link is invisible to
    /// a path without per-link timing). An unseen fault is not counted against recall;
    /// an incident naming it rightly is no false positive.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub visible: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Heap entry: a flush of one agent (`regular` ones reschedule themselves).
type FlushAt = Reverse<(i64, u32, bool)>;

fn ns(t: f64) -> i64 {
    virtual_ns(t)
}

/// A running simulation of one scenario.
#[derive(Debug)]
pub struct Simulation {
    scenario: Scenario,
    options: RunOptions,
    topo: Topology,
    physics: Physics,
    agents: Vec<Agent>,
    flushes: BinaryHeap<FlushAt>,
    deliveries: VecDeque<(i64, u32, Vec<u8>)>,
    urgent: Vec<(f64, u32)>,
    net: Draw,
    tick_index: u64,
    now: f64,
    batches: u64,
    dropped: u64,
    collective_events: u64,
    buf: Vec<u8>,
}

impl Simulation {
    /// A simulation of `scenario`, at virtual time 0.
    pub fn new(scenario: &Scenario, options: RunOptions) -> Simulation {
        let options = RunOptions {
            tick_secs: if options.tick_secs > 0.0 {
                options.tick_secs
            } else {
                0.25
            },
            flush_secs: if options.flush_secs > 0.0 {
                options.flush_secs
            } else {
                1.0
            },
        };
        let topo = Topology::new(scenario);
        let mut agent_draw = Draw::new(scenario.seed, 2);
        let skew = scenario.noise.clock_skew_ms / 1000.0;
        let mut agents = Vec::with_capacity(topo.node_names.len());
        let mut flushes = BinaryHeap::new();
        for (i, name) in topo.node_names.iter().enumerate() {
            let offset = ns(agent_draw.uniform(-skew, skew));
            agents.push(Agent::new(
                i as u32,
                name.clone(),
                offset,
                scenario.seed,
                scenario.capture,
            ));
            let phase = agent_draw.unit() * options.flush_secs;
            flushes.push(Reverse((ns(phase), i as u32, true)));
        }
        let mut physics = Physics::new(scenario, &topo, 2.0 * options.flush_secs + 1.0);
        physics.launch(&mut agents);
        Simulation {
            scenario: scenario.clone(),
            options,
            topo,
            physics,
            agents,
            flushes,
            deliveries: VecDeque::new(),
            urgent: vec![],
            net: Draw::new(scenario.seed, 3),
            tick_index: 1,
            now: 0.0,
            batches: 0,
            dropped: 0,
            collective_events: 0,
            buf: vec![],
        }
    }

    /// The scenario being run.
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    /// Virtual time reached, seconds since the run start.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Advance virtual time up to `until_s` (seconds since run start), delivering
    /// batches and ticking the sink; returns incident changes from the ticks.
    pub fn advance<S: Sink>(&mut self, sink: &mut S, until_s: f64) -> Vec<IncidentChange> {
        let mut changes = vec![];
        let until = match self.physics.end_time {
            Some(e) => until_s.min(e),
            None => until_s,
        };
        loop {
            let limit = ns(self.physics.end_time.map_or(until, |e| until.min(e)));
            let t_gen = self.physics.next_start().map_or(i64::MAX, ns);
            let t_flush = self
                .flushes
                .peek()
                .map_or(i64::MAX, |Reverse((t, _, _))| *t);
            let t_deliver = self.deliveries.front().map_or(i64::MAX, |(t, _, _)| *t);
            let t_tick = ns(self.tick_index as f64 * self.options.tick_secs);
            let t = t_gen.min(t_flush).min(t_deliver).min(t_tick);
            if t > limit {
                break;
            }
            if t_gen == t {
                self.physics.step(&mut self.agents, &mut self.urgent);
                // An agent polls for urgent records every URGENT_POLL_SECS: urgent records
                // of one node that close together leave in one flush, at the last of them.
                let mut due: Vec<(u32, i64)> =
                    self.urgent.drain(..).map(|(at, n)| (n, ns(at))).collect();
                due.sort_unstable();
                let poll = ns(URGENT_POLL_SECS);
                let mut i = 0;
                while i < due.len() {
                    let (node, first) = due[i];
                    let mut last = first;
                    while i < due.len() && due[i].0 == node && due[i].1 - first <= poll {
                        last = due[i].1;
                        i += 1;
                    }
                    self.flushes.push(Reverse((last, node, false)));
                }
            } else if t_flush == t {
                if let Some(Reverse((_, node, regular))) = self.flushes.pop() {
                    self.flush(node, t, regular);
                }
            } else if t_deliver == t {
                if let Some((_, node, body)) = self.deliveries.pop_front() {
                    sink.deliver_from(node, &body, SIM_EPOCH.plus_nanos(t));
                    self.batches += 1;
                }
            } else {
                self.tick_index += 1;
                changes.extend(sink.tick(SIM_EPOCH.plus_nanos(t)));
            }
        }
        let reached = match self.physics.end_time {
            Some(e) => until_s.min(e),
            None => until_s,
        };
        self.now = self.now.max(reached);
        changes
    }

    fn flush(&mut self, node: u32, t_ns: i64, regular: bool) {
        let agent = &mut self.agents[node as usize];
        let (batch, stats) = agent.flush(
            t_ns,
            &self.physics.death,
            &self.topo,
            &self.scenario.job.name,
        );
        if regular {
            self.flushes
                .push(Reverse((t_ns + ns(self.options.flush_secs), node, true)));
        }
        if self.net.chance(self.scenario.noise.batch_drop_prob) {
            agent.failed_batches += 1;
            self.dropped += 1;
            return;
        }
        self.collective_events += stats.collectives;
        self.buf.clear();
        batch.encode_binary_into(&mut self.buf);
        self.deliveries
            .push_back((t_ns + ns(DELIVERY_DELAY_SECS), node, self.buf.clone()));
    }

    /// Run until the scenario ends.
    pub fn run_to_end<S: Sink>(&mut self, sink: &mut S) -> Vec<IncidentChange> {
        let mut changes = vec![];
        while !self.done() {
            let next = self.now + 60.0;
            changes.extend(self.advance(sink, next));
        }
        changes
    }

    /// Whether the run is over.
    pub fn done(&self) -> bool {
        self.physics.end_time.is_some_and(|e| self.now >= e)
    }

    /// Where the run stands.
    pub fn progress(&self) -> Progress {
        Progress {
            step: self
                .physics
                .step_ends
                .iter()
                .filter(|&&e| e <= self.now)
                .count() as u64,
            steps: self.scenario.steps,
            sim_seconds: self.now,
            batches: self.batches,
            collective_events: self.collective_events,
            ranks: self.topo.world,
        }
    }

    /// Batches built but lost on the way (the scenario's `batch_drop_prob`).
    pub fn dropped_batches(&self) -> u64 {
        self.dropped
    }

    /// End time of every step all ranks completed so far, seconds.
    pub fn step_ends(&self) -> Vec<f64> {
        self.physics
            .step_ends
            .iter()
            .copied()
            .filter(|&e| e <= self.now)
            .collect()
    }

    /// Every checkpoint the job finished saving so far: the steps it holds and when
    /// its last rank finished saving, seconds (the scenario's
    /// `noise.checkpoint_every_steps`; a save a rank died in is not complete).
    pub fn checkpoints(&self) -> Vec<(u64, f64)> {
        self.physics
            .checkpoints
            .iter()
            .copied()
            .filter(|&(_, at)| at <= self.now)
            .collect()
    }

    /// The injected faults that have taken effect so far, with their onsets.
    pub fn faults(&self) -> Vec<FaultRecord> {
        let mut out = vec![];
        for (i, f) in self.scenario.faults.iter().enumerate() {
            let onset = &self.physics.onsets[i];
            let Some(at) = onset.at.filter(|&a| a <= self.now) else {
                continue;
            };
            let gpn = self.topo.gpus_per_node;
            let mut rec = FaultRecord {
                kind: f.kind.label().to_owned(),
                rank: onset.rank,
                node: String::new(),
                gpu: onset.rank.map(|r| r % gpn),
                code: None,
                slowdown: None,
                step: f.step,
                until_step: f.until_step,
                onset_s: round_ms(at),
                last_progress_s: None,
                culprits: None,
                visible: true,
            };
            match &f.kind {
                FaultKind::Straggler { node, slowdown }
                | FaultKind::SlowLink { node, slowdown } => {
                    rec.node = node.clone();
                    rec.slowdown = Some(*slowdown);
                }
                FaultKind::Xid {
                    node, gpu, code, ..
                } => {
                    rec.node = node.clone();
                    rec.gpu = Some(*gpu);
                    rec.code = Some(*code);
                }
                FaultKind::Nan { rank } | FaultKind::Hang { rank } | FaultKind::Crash { rank } => {
                    rec.rank = Some(*rank);
                    rec.gpu = Some(rank % gpn);
                    rec.node = self.topo.node_names[(rank / gpn) as usize].clone();
                }
            }
            match &f.kind {
                FaultKind::SlowLink { .. } => rec.visible = self.scenario.capture.sees_links(),
                FaultKind::Nan { rank } if !self.scenario.grad_check => {
                    rec.culprits = Some(match self.scenario.metrics {
                        Metrics::Reduced => vec![],
                        Metrics::Local => {
                            let d = self.topo.coords(*rank).1;
                            (0..self.topo.world)
                                .filter(|&r| self.topo.coords(r).1 == d)
                                .collect()
                        }
                    });
                }
                _ => {}
            }
            if f.kind.stops_job() {
                rec.last_progress_s = Some(round_ms(self.physics.last_completion.max(at)));
            }
            out.push(rec);
        }
        out
    }
}

fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Run `scenario` to its end against a fresh engine, timing it on the wall clock.
pub fn run(scenario: &Scenario, options: RunOptions) -> Report {
    let wall = Instant::now();
    // The simulated fleet is trusted: the engine holds all of it, however large.
    let mut config = EngineConfig::default();
    config.limits.max_ranks = config.limits.max_ranks.max(2 * scenario.ranks() as usize);
    config.limits.max_state_bytes = usize::MAX;
    let mut engine = Engine::new(config, SIM_EPOCH);
    let mut sim = Simulation::new(scenario, options);
    sim.run_to_end(&mut engine);
    let incidents = engine.incident_views(None, None, None);
    Report::new(&sim, incidents, wall.elapsed().as_secs_f64())
}
