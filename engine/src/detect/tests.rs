//! Table tests for the detectors: tiny jobs built record by record with explicit
//! timestamps, one `check` helper per detector.

use warden_model::wire::{
    Batch, CollOp, CollectiveEvent, EventSeverity, JobSignals, LogRecord, NodeEvent, NodeEventKind,
    ProcessState, RankInfo, TrainingMetric,
};
use warden_model::{Finding, IncidentKind, Timestamp};

use super::{DetectConfig, Verdict, Window};
use crate::engine::EngineStats;
use crate::state::{Cluster, ComputeSample};

const T0: i64 = 1_767_225_600_000_000_000;

fn at(s: f64) -> Timestamp {
    Timestamp(T0 + (s * 1e9) as i64)
}

fn ns(s: f64) -> i64 {
    T0 + (s * 1e9) as i64
}

/// A job of `nodes` × `per_node` ranks, fed through the real apply path.
struct Job {
    cluster: Cluster,
    per_node: u32,
    /// Each node's agent numbers its own batches.
    seq: std::collections::HashMap<u32, u64>,
    stats: EngineStats,
    /// In-flight records, re-sent with every heartbeat as real agents do.
    in_flight: Vec<CollectiveEvent>,
}

impl Job {
    fn new(nodes: u32, per_node: u32) -> Job {
        let mut j = Job {
            cluster: Cluster::default(),
            per_node,
            seq: Default::default(),
            stats: EngineStats::default(),
            in_flight: Vec::new(),
        };
        for n in 0..nodes {
            let ranks = (n * per_node..(n + 1) * per_node)
                .map(|r| RankInfo {
                    rank: r,
                    world_size: nodes * per_node,
                    pid: 100 + r,
                    gpu_index: Some(r % per_node),
                    gpu_uuid: String::new(),
                })
                .collect();
            j.send(
                n,
                0.0,
                JobSignals {
                    job: "j".into(),
                    ranks,
                    ..Default::default()
                },
                vec![],
            );
        }
        j
    }

    fn node_of(&self, r: u32) -> u32 {
        r / self.per_node
    }

    fn send(&mut self, node: u32, t: f64, js: JobSignals, events: Vec<NodeEvent>) {
        let seq = self.seq.entry(node).or_default();
        *seq += 1;
        let b = Batch {
            node: format!("node-{node:02}"),
            agent_id: "a".into(),
            boot_id: "b".into(),
            seq: *seq,
            sent_at_ns: ns(t),
            jobs: vec![js],
            events,
            ..Default::default()
        };
        self.cluster.apply(b, at(t), &mut self.stats);
    }

    /// Rank `r` entered `seq` of `comm` at `start` and (if `end`) completed it.
    fn coll(&mut self, comm: u64, r: u32, seq: u64, start: f64, end: Option<f64>) {
        self.coll_op(comm, r, seq, start, end, CollOp::AllReduce);
    }

    /// [`Job::coll`] of operation `op`.
    fn coll_op(&mut self, comm: u64, r: u32, seq: u64, start: f64, end: Option<f64>, op: CollOp) {
        let ev = CollectiveEvent {
            comm,
            rank: r,
            seq,
            op: op as i32,
            bytes: 1 << 20,
            start_ns: ns(start),
            end_ns: end.map_or(0, ns),
            xfer_ns: 1_000_000,
        };
        let t = end.unwrap_or(start);
        self.in_flight.retain(|e| (e.comm, e.rank) != (comm, r));
        if end.is_none() {
            self.in_flight.push(ev.clone());
        }
        self.send(
            self.node_of(r),
            t,
            JobSignals {
                job: "j".into(),
                collectives: vec![ev],
                ..Default::default()
            },
            vec![],
        );
    }

    fn exit(
        &mut self,
        r: u32,
        t: f64,
        code: Option<i32>,
        signal: Option<i32>,
        last_words: Option<&str>,
    ) {
        let logs = last_words
            .map(|l| {
                vec![LogRecord {
                    rank: Some(r),
                    at_ns: ns(t),
                    stream: 1,
                    line: l.into(),
                }]
            })
            .unwrap_or_default();
        let p = ProcessState {
            rank: r,
            pid: 100 + r,
            at_ns: ns(t),
            alive: false,
            exit_code: code,
            signal,
            stopped: false,
            from_log: false,
        };
        self.send(
            self.node_of(r),
            t,
            JobSignals {
                job: "j".into(),
                processes: vec![p],
                logs,
                ..Default::default()
            },
            vec![],
        );
    }

    /// Rank `p.rank`'s node reports its process state `p` at `t`.
    fn process(&mut self, p: ProcessState, t: f64) {
        self.send(
            self.node_of(p.rank),
            t,
            JobSignals {
                job: "j".into(),
                processes: vec![p],
                ..Default::default()
            },
            vec![],
        );
    }

    fn metric(&mut self, r: u32, step: u64, t: f64, loss: f64, grad: f64) {
        self.checked_metric(r, step, t, loss, grad, None);
    }

    /// [`Job::metric`] from a rank running warden_torch's input check, which found its
    /// `op`-th collective input of the step non-finite (`None`: every input finite).
    fn checked_metric(&mut self, r: u32, step: u64, t: f64, loss: f64, grad: f64, op: Option<u32>) {
        let m = TrainingMetric {
            rank: r,
            step,
            at_ns: ns(t),
            loss: Some(loss),
            grad_norm: Some(grad),
            tokens_per_s: None,
            first_nonfinite_op: op,
        };
        self.send(
            self.node_of(r),
            t,
            JobSignals {
                job: "j".into(),
                metrics: vec![m],
                ..Default::default()
            },
            vec![],
        );
    }

    fn compute(&mut self, r: u32, samples: &[f64]) {
        let job = self.cluster.jobs.get_mut("j").expect("job exists");
        for (i, &s) in samples.iter().enumerate() {
            job.ranks[r].compute.push(ComputeSample {
                secs: s as f32,
                period: 1.2,
                at: at(i as f64),
            });
        }
    }

    /// Every node's agent reports at `t`: nothing new, but what is still in flight.
    fn heartbeats(&mut self, t: f64) {
        let nodes = self.cluster.nodes.len() as u32;
        for n in 0..nodes {
            let collectives = self
                .in_flight
                .iter()
                .filter(|e| self.node_of(e.rank) == n)
                .cloned()
                .collect();
            self.send(
                n,
                t,
                JobSignals {
                    job: "j".into(),
                    collectives,
                    ..Default::default()
                },
                vec![],
            );
        }
    }

    fn findings(&self, kind: IncidentKind, now: f64) -> Vec<Finding> {
        let cfg = DetectConfig::default();
        let w = Window {
            job: &self.cluster.jobs["j"],
            cluster: &self.cluster,
        };
        let now = at(now);
        let verdicts = match kind {
            IncidentKind::Hang => super::hang::check(&cfg.hang, w, now),
            IncidentKind::Crash => super::crash::check(&cfg.crash, w, now),
            IncidentKind::Nan => super::nan::check(&cfg.nan, w, now),
            IncidentKind::Straggler => super::straggler::check(&cfg.straggler, w, now),
            IncidentKind::SlowLink => super::slow_link::check(&cfg.slow_link, w, now),
            IncidentKind::GpuFault => super::gpu::check(&cfg.gpu, &self.cluster, now),
        };
        verdicts
            .into_iter()
            .filter_map(|v| match v {
                Verdict::Finding(f) => Some(f.normalize()),
                _ => None,
            })
            .collect()
    }

    fn need_more_data(&self, kind: IncidentKind, now: f64) -> bool {
        let cfg = DetectConfig::default();
        let w = Window {
            job: &self.cluster.jobs["j"],
            cluster: &self.cluster,
        };
        let v = match kind {
            IncidentKind::Crash => super::crash::check(&cfg.crash, w, at(now)),
            IncidentKind::Nan => super::nan::check(&cfg.nan, w, at(now)),
            _ => vec![],
        };
        v == vec![Verdict::NeedMoreData]
    }
}

/// Expect exactly one finding of `kind` naming `ranks` (or nothing when `None`).
fn check(job: &Job, kind: IncidentKind, now: f64, expect: Option<&[u32]>) {
    let f = job.findings(kind, now);
    match expect {
        None => assert!(f.is_empty(), "expected no {kind}, got {f:#?}"),
        Some(ranks) => {
            assert_eq!(f.len(), 1, "expected one {kind}, got {f:#?}");
            assert_eq!(f[0].ranks, ranks, "{}", f[0].summary);
        }
    }
}

/// `nranks` ranks in one communicator, seq 1..=9 completed together every second,
/// after 60 earlier collectives (so the learned bound is trusted).
/// Rank `r`'s process, alive and stopped (SIGSTOP) since `t`.
fn stopped_at(r: u32, t: f64) -> ProcessState {
    ProcessState {
        rank: r,
        pid: 100 + r,
        at_ns: ns(t),
        alive: true,
        exit_code: None,
        signal: None,
        stopped: true,
        from_log: false,
    }
}

fn steady(nranks: u32) -> Job {
    steady_history(Job::new(nranks, 1), nranks)
}

/// [`steady`], with every rank on one node (a tensor-parallel group).
fn steady_on_one_node(nranks: u32) -> Job {
    steady_history(Job::new(1, nranks), nranks)
}

/// The history of [`steady`] for ranks `0..nranks` of `j`.
fn steady_history(mut j: Job, nranks: u32) -> Job {
    // A long quiet history in a communicator of the same kind.
    for k in 1..=60u64 {
        let t = k as f64 * 0.1 - 6.5;
        for r in 0..nranks {
            j.coll(8, r, k, t, Some(t + 0.05));
        }
    }
    for seq in 1..=9u64 {
        let t = seq as f64;
        for r in 0..nranks {
            j.coll(7, r, seq, t - 0.1, Some(t));
        }
    }
    j
}

#[test]
fn hang_culprit_is_the_rank_that_never_entered() {
    let mut j = steady(4);
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, None);
    }
    j.heartbeats(10.5);
    check(&j, IncidentKind::Hang, 10.5, None); // within the bound
    j.heartbeats(12.0);
    check(&j, IncidentKind::Hang, 12.0, Some(&[3]));
    let f = &j.findings(IncidentKind::Hang, 12.0)[0];
    assert!(
        f.summary
            .starts_with("rank 3 never entered allreduce seq 10"),
        "{}",
        f.summary
    );
    assert_eq!(f.onset, at(9.0), "onset is the culprit's last completion");
}

#[test]
fn hang_waits_for_the_laggards_agent_to_report() {
    // Rank 3's agent last reported at 9.0: it may well have entered seq 10 since.
    let mut j = steady(4);
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, None);
    }
    check(&j, IncidentKind::Hang, 12.0, None);
    j.heartbeats(12.0);
    check(&j, IncidentKind::Hang, 12.0, Some(&[3]));
}

#[test]
fn a_wait_nobody_reports_any_more_is_not_a_hang() {
    // The waiters' completions were lost with a batch and they went quiet (a
    // checkpoint): their old in-flight records alone confirm nothing.
    let mut j = steady(4);
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, None);
    }
    j.in_flight.clear();
    j.heartbeats(40.0);
    check(&j, IncidentKind::Hang, 40.0, None);
}

#[test]
fn a_wait_inside_a_node_nobody_reports_any_more_is_not_a_hang() {
    // Inside one node: ranks 0-2 were seen inside seq 10, then the batches holding
    // rank 3's entry and everyone's completion were lost, and the job went quiet (a
    // checkpoint). The node's agent keeps reporting, but no longer that anyone is
    // inside: rank 3's missing entry confirms nothing.
    let mut j = steady_on_one_node(4);
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, None);
    }
    j.in_flight.clear();
    for t in 11..=40 {
        j.heartbeats(f64::from(t));
    }
    check(&j, IncidentKind::Hang, 40.0, None);
}

#[test]
fn a_wait_inside_a_node_its_agent_keeps_reporting_names_the_rank_that_never_entered() {
    let mut j = steady_on_one_node(4);
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, None);
    }
    for t in 11..=40 {
        j.heartbeats(f64::from(t));
    }
    check(&j, IncidentKind::Hang, 40.0, Some(&[3]));
}

#[test]
fn uneven_return_from_a_checkpoint_is_not_a_hang() {
    // Everyone paused 30 s; rank 3 comes back 1.5 s after the others.
    let mut j = steady(4);
    for r in 0..3 {
        j.coll(7, r, 10, 39.0, None);
    }
    j.heartbeats(40.5);
    check(&j, IncidentKind::Hang, 40.5, None);
}

#[test]
fn hang_is_never_fooled_by_a_pause_outside_collectives() {
    let mut j = steady(4);
    j.heartbeats(60.0);
    check(&j, IncidentKind::Hang, 60.0, None);
}

#[test]
fn hang_culprit_is_found_through_blocked_ranks() {
    // TP {0,1}: 0 waits in seq 10, 1 idle. DP {0,2}: 2 waits in seq 10 for 0, which is
    // blocked in TP, so only rank 1 is a root.
    let mut j = Job::new(3, 1);
    for k in 1..=80u64 {
        let t = k as f64 * 0.1 - 8.5;
        j.coll(3, 0, 100 + k, t, Some(t + 0.05));
        j.coll(3, 1, 100 + k, t, Some(t + 0.05));
    }
    for seq in 1..=9u64 {
        j.coll(1, 0, seq, seq as f64 - 0.1, Some(seq as f64));
        j.coll(1, 1, seq, seq as f64 - 0.1, Some(seq as f64));
        j.coll(3, 0, seq, seq as f64 - 0.5, Some(seq as f64 - 0.4));
        j.coll(3, 1, seq, seq as f64 - 0.5, Some(seq as f64 - 0.4));
    }
    for seq in 1..=9u64 {
        j.coll(2, 0, seq, seq as f64 + 0.1, Some(seq as f64 + 0.2));
        j.coll(2, 2, seq, seq as f64 + 0.1, Some(seq as f64 + 0.2));
    }
    j.coll(1, 0, 10, 10.0, None);
    j.coll(2, 2, 10, 10.0, None);
    j.heartbeats(13.0);
    check(&j, IncidentKind::Hang, 13.0, Some(&[1]));
}

#[test]
fn hang_with_everyone_inside_names_the_nodes_not_a_rank() {
    let mut j = steady(4);
    for r in 0..4 {
        j.coll(7, r, 10, 10.0, None);
    }
    j.heartbeats(13.0);
    let f = j.findings(IncidentKind::Hang, 13.0);
    assert_eq!(f.len(), 1);
    assert!(f[0].ranks.is_empty());
    assert_eq!(f[0].nodes.len(), 4);
    assert!(f[0].confidence < 0.5);
}

#[test]
fn a_straggler_s_first_slow_step_with_everyone_inside_is_no_hang() {
    // Iterations of 4 s, each ending in an all-reduce that every rank enters (its host
    // enqueues it) 0.1 s before it completes. Then every rank has entered seq 41 and
    // it has not completed for 3 s: more than twice any wait seen, less than an
    // iteration (a rank whose GPU began computing 1.75x slower holds it that long).
    let mut j = Job::new(4, 1);
    for seq in 1..=40u64 {
        let t = 4.0 * seq as f64;
        for r in 0..4 {
            j.coll(7, r, seq, t - 0.1, Some(t));
        }
    }
    for r in 0..4 {
        j.coll(7, r, 41, 163.9, None);
    }
    j.heartbeats(166.9);
    let p = j.cluster.jobs["j"].iteration_secs();
    assert!(p.is_some_and(|p| p > 3.5), "{p:?}");
    check(&j, IncidentKind::Hang, 166.9, None);
    // Past an iteration it is one.
    j.heartbeats(168.5);
    let f = j.findings(IncidentKind::Hang, 168.5);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert!(f[0].ranks.is_empty() && f[0].nodes.len() == 4, "{f:#?}");
}

#[test]
fn a_collective_everyone_entered_is_timed_from_the_last_entry_not_the_first() {
    // Back from a 30 s checkpoint, ranks 0-2 enter seq 10 at 39.0 and rank 3 only at
    // 40.45; at 40.5 every agent still reports all four inside (a torch capture sees
    // the completion on its next poll). The 1.5 s since the first entry is a wait for
    // the laggard, not a fault inside the collective: it could not complete before
    // 40.45.
    let mut j = steady(4);
    for r in 0..3 {
        j.coll(7, r, 10, 39.0, None);
    }
    j.coll(7, 3, 10, 40.45, None);
    j.heartbeats(40.5);
    check(&j, IncidentKind::Hang, 40.5, None);
    j.heartbeats(41.0);
    check(&j, IncidentKind::Hang, 41.0, None);
    // Still nobody completed it past the bound (and an iteration) after the last
    // entry: that is a hang inside it.
    j.heartbeats(41.6);
    let f = j.findings(IncidentKind::Hang, 41.6);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert!(f[0].ranks.is_empty() && f[0].nodes.len() == 4, "{f:#?}");
    assert!(
        f[0].summary.contains("after the last of them entered"),
        "{}",
        f[0].summary
    );
}

#[test]
fn hang_with_everyone_inside_names_a_stopped_process() {
    let mut j = steady(4);
    for r in 0..4 {
        j.coll(7, r, 10, 10.0, None);
    }
    let stopped = stopped_at(2, 10.2);
    j.process(stopped.clone(), 10.5);
    j.heartbeats(13.0);
    let f = j.findings(IncidentKind::Hang, 13.0);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].ranks, [2]);
    assert!(f[0].confidence > 0.9);
    assert!(f[0].summary.contains("stopped"), "{}", f[0].summary);

    // Continued: the stopped process no longer explains the hang.
    j.process(
        ProcessState {
            stopped: false,
            at_ns: ns(13.5),
            ..stopped
        },
        13.5,
    );
    j.heartbeats(14.0);
    let f = j.findings(IncidentKind::Hang, 14.0);
    assert!(f[0].ranks.is_empty(), "{f:?}");
}

/// A two-stage pipeline of four ranks: stages {0, 1} and {2, 3} all-reduce their
/// gradients in comms 5 and 6; activations go 0 → 2 and 1 → 3 (comms 20 and 21) and
/// their gradients come back, by send and recv. Forty steps of 0.5 s end at 0.5.
fn pipeline() -> Job {
    let mut j = Job::new(4, 1);
    for step in 1..=40u64 {
        let t = step as f64 * 0.5 - 19.5;
        for (c, first, last) in [(20, 0, 2), (21, 1, 3)] {
            j.coll_op(c, first, 2 * step - 1, t, Some(t + 0.01), CollOp::Send);
            j.coll_op(c, last, 2 * step - 1, t, Some(t + 0.01), CollOp::Recv);
            j.coll_op(c, last, 2 * step, t + 0.2, Some(t + 0.21), CollOp::Send);
            j.coll_op(c, first, 2 * step, t + 0.02, Some(t + 0.21), CollOp::Recv);
        }
        for (c, ranks) in [(5, [0, 1]), (6, [2, 3])] {
            for r in ranks {
                j.coll(c, r, step, t + 0.3, Some(t + 0.35));
            }
        }
    }
    j
}

#[test]
fn a_stopped_stage_stays_the_hang_once_the_other_stage_waits_on_its_receives() {
    // Step 41: rank 3 stops inside its stage's all-reduce, which rank 2 entered too.
    // Stage 0 finishes the step and, in step 42, sends and then waits to receive the
    // gradients that neither rank 2 nor rank 3 will ever send.
    let mut j = pipeline();
    let t = 20.5;
    for (c, first, last) in [(20, 0, 2), (21, 1, 3)] {
        j.coll_op(c, first, 81, t, Some(t + 0.01), CollOp::Send);
        j.coll_op(c, last, 81, t, Some(t + 0.01), CollOp::Recv);
        j.coll_op(c, last, 82, t + 0.2, Some(t + 0.21), CollOp::Send);
        j.coll_op(c, first, 82, t + 0.02, Some(t + 0.21), CollOp::Recv);
    }
    for r in [0, 1] {
        j.coll(5, r, 41, t + 0.3, Some(t + 0.35));
    }
    for r in [2, 3] {
        j.coll(6, r, 41, t + 0.3, None);
    }
    j.process(stopped_at(3, t + 0.35), t + 0.4);
    for (c, first) in [(20, 0), (21, 1)] {
        j.coll_op(c, first, 83, t + 0.5, Some(t + 0.51), CollOp::Send);
        j.coll_op(c, first, 84, t + 0.52, None, CollOp::Recv);
    }
    // Named while only the all-reduce has outlasted its bound, and still named, the
    // same way, once the receives have too.
    for now in [24.0, 40.0] {
        j.heartbeats(now);
        let f = j.findings(IncidentKind::Hang, now);
        assert_eq!(f.len(), 1, "at {now}: {f:#?}");
        assert_eq!(f[0].ranks, [3], "at {now}: {}", f[0].summary);
        assert!(
            f[0].summary.contains("stopped") && f[0].summary.contains("seq 41"),
            "at {now}: {}",
            f[0].summary
        );
    }
}

/// Eight ranks enter seq 10; it completes on ranks 0 and 1 only, which enter seq 11 and
/// wait there, while ranks 2..=7 stay inside seq 10 (a ring whose member stopped
/// halfway through).
fn completed_on_two_of_eight() -> Job {
    let mut j = steady(8);
    for r in 0..8 {
        j.coll(7, r, 10, 10.0, None);
    }
    for r in 0..2 {
        j.coll(7, r, 10, 10.0, Some(10.05));
        j.coll(7, r, 11, 10.1, None);
    }
    j
}

#[test]
fn hang_inside_a_collective_that_completed_on_some_names_the_stopped_process() {
    let mut j = completed_on_two_of_eight();
    j.process(stopped_at(5, 10.3), 10.3);
    j.heartbeats(10.5);
    check(&j, IncidentKind::Hang, 10.5, None); // within the bound
    j.heartbeats(12.0);
    let f = j.findings(IncidentKind::Hang, 12.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, [5], "{}", f[0].summary);
    assert!(f[0].confidence > 0.9);
    assert!(
        f[0].summary.contains("stopped") && f[0].summary.contains("seq 10"),
        "{}",
        f[0].summary
    );
}

#[test]
fn hang_inside_a_collective_that_completed_on_some_names_those_stuck_in_it() {
    let mut j = completed_on_two_of_eight();
    j.heartbeats(12.0);
    let f = j.findings(IncidentKind::Hang, 12.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, [2, 3, 4, 5, 6, 7], "{}", f[0].summary);
    assert!(f[0].confidence < 0.5);
    assert!(
        f[0].summary
            .contains("never completed it, which 2 other members did"),
        "{}",
        f[0].summary
    );
}

#[test]
fn a_lost_completion_is_not_taken_for_a_member_stuck_inside() {
    // Seq 10 completed everywhere, but rank 3's completion record was lost (its agent
    // no longer reports it inside); ranks 0..=2 wait in seq 11, rank 3 never comes.
    let mut j = steady(4);
    for r in 0..4 {
        j.coll(7, r, 10, 10.0, None);
    }
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, Some(10.05));
        j.coll(7, r, 11, 10.1, None);
    }
    j.in_flight.retain(|e| e.rank != 3);
    j.heartbeats(12.0);
    check(&j, IncidentKind::Hang, 12.0, Some(&[3]));
}

#[test]
fn hang_ignores_a_dead_rank() {
    let mut j = steady(8);
    for r in 0..7 {
        j.coll(7, r, 10, 10.0, None);
    }
    j.exit(7, 9.5, Some(1), None, None);
    j.heartbeats(13.0);
    check(&j, IncidentKind::Hang, 13.0, None);
}

#[test]
fn hang_bound_learns_long_waits() {
    let mut j = Job::new(4, 1);
    for seq in 1..=40u64 {
        let t = seq as f64 * 2.5;
        for r in 0..4 {
            // Rank 0 arrives 2 s before the others every time.
            let start = if r == 0 { t - 2.0 } else { t - 0.1 };
            j.coll(7, r, seq, start, Some(t));
        }
    }
    for r in 0..3 {
        j.coll(7, r, 41, 100.0, None);
    }
    j.heartbeats(103.5);
    check(&j, IncidentKind::Hang, 103.5, None); // inside 2 x the 2 s waits seen
    j.heartbeats(107.5);
    check(&j, IncidentKind::Hang, 107.5, Some(&[3]));
}

#[test]
fn crash_culprit_is_the_first_exit_that_blames_nobody() {
    let mut j = Job::new(4, 2);
    j.exit(
        5,
        10.0,
        None,
        Some(11),
        Some("Fatal Python error: Segmentation fault"),
    );
    for r in [0, 1, 2, 3, 4, 6, 7] {
        j.exit(
            r,
            10.1 + f64::from(r) * 0.05,
            Some(1),
            None,
            Some("RuntimeError: Connection closed by peer [10.0.0.5]:29500"),
        );
    }
    check(&j, IncidentKind::Crash, 11.5, Some(&[5]));
    let f = &j.findings(IncidentKind::Crash, 11.5)[0];
    assert!(f.summary.contains("signal 11 (SIGSEGV)"), "{}", f.summary);
    assert!(f.summary.contains("7 peers"), "{}", f.summary);
}

#[test]
fn crash_culprit_by_time_when_nobody_left_last_words() {
    let mut j = Job::new(4, 1);
    j.exit(2, 10.00, Some(1), None, None);
    j.exit(0, 10.20, Some(1), None, None);
    j.exit(1, 10.30, Some(1), None, None);
    check(&j, IncidentKind::Crash, 12.0, Some(&[2]));
}

#[test]
fn a_clean_exit_is_not_a_crash() {
    let mut j = Job::new(2, 2);
    for r in 0..4 {
        j.exit(r, 10.0, Some(0), None, None);
    }
    check(&j, IncidentKind::Crash, 20.0, None);
}

#[test]
fn nan_culprit_is_the_rank_whose_loss_went_first() {
    let mut j = Job::new(4, 2);
    for r in 0..8 {
        j.metric(r, 9, 9.0, 2.0, 1.0);
    }
    for r in 0..8 {
        let (loss, grad) = if r == 6 {
            (f64::NAN, f64::NAN)
        } else {
            (2.0, f64::NAN)
        };
        j.metric(r, 10, 10.0 + f64::from(r) * 0.001, loss, grad);
        if r == 0 {
            assert!(
                j.need_more_data(IncidentKind::Nan, 10.1),
                "rank 6's report may still come"
            );
        }
    }
    check(&j, IncidentKind::Nan, 10.6, Some(&[6]));
}

#[test]
fn a_nan_every_rank_showed_at_the_same_step_names_no_rank_by_arrival_time() {
    let mut j = Job::new(4, 1);
    j.metric(1, 10, 10.0, 2.0, f64::INFINITY);
    for r in [0, 2, 3] {
        j.metric(r, 10, 10.3, 2.0, f64::NAN);
    }
    check(&j, IncidentKind::Nan, 11.0, Some(&[]));
}

#[test]
fn the_input_check_names_the_rank_that_fed_the_nan_over_a_tp_peer_that_fed_it_later() {
    // Two tensor-parallel pairs, {0, 1} on node 0 and {2, 3} on node 1, each reporting
    // its pair's reduced loss. Rank 1 fed the NaN into operation 3 of step 10; its peer
    // rank 0 got it from that reduction and fed it into operation 5, and reported
    // first; the other pair saw it only at step 11.
    let mut j = Job::new(2, 2);
    for r in 0..4 {
        j.checked_metric(r, 9, 9.0, 2.0, 1.0, None);
    }
    j.checked_metric(0, 10, 10.0, f64::NAN, f64::NAN, Some(5));
    j.checked_metric(1, 10, 10.02, f64::NAN, f64::NAN, Some(3));
    for r in [2, 3] {
        j.checked_metric(r, 10, 10.0, 2.0, f64::NAN, None);
        j.checked_metric(r, 11, 11.0, f64::NAN, f64::NAN, Some(0));
    }
    check(&j, IncidentKind::Nan, 11.5, Some(&[1]));
    let f = &j.findings(IncidentKind::Nan, 11.5)[0];
    assert_eq!(f.confidence, 0.95);
    assert_eq!(f.nodes, ["node-00"]);
    assert!(f.summary.contains("input check"), "{}", f.summary);
    assert!(
        f.evidence[0].text.contains("operation 3 of step 10"),
        "{:#?}",
        f.evidence
    );
    assert!(
        f.evidence[1]
            .text
            .contains("rank 0 at operation 5 of step 10"),
        "{:#?}",
        f.evidence
    );
}

#[test]
fn an_input_blip_the_job_recovered_from_is_not_the_culprit() {
    // Rank 0 overflowed into a reduction at step 3 (a loss-scaled fp16 step the
    // optimizer skipped) and trained on; rank 2 fed the NaN that stayed, at step 10.
    let mut j = Job::new(4, 1);
    j.checked_metric(0, 3, 3.0, 2.0, 1.0, Some(0));
    for r in 0..4 {
        j.checked_metric(r, 9, 9.0, 2.0, 1.0, None);
    }
    for r in 0..4 {
        let op = (r == 2).then_some(7);
        j.checked_metric(r, 10, 10.0, f64::NAN, f64::NAN, op);
    }
    check(&j, IncidentKind::Nan, 11.0, Some(&[2]));
}

#[test]
fn a_reduced_loss_on_every_rank_names_the_job_and_the_step_but_no_rank() {
    // Megatron logs the loss averaged over data parallel: every rank reports the same
    // NaN, rank 5's a moment before the others.
    let mut j = Job::new(2, 4);
    for r in 0..8 {
        j.metric(r, 9, 9.0, 2.0, 1.0);
    }
    j.metric(5, 10, 10.0, f64::NAN, f64::NAN);
    for r in (0..8).filter(|&r| r != 5) {
        j.metric(r, 10, 10.2, f64::NAN, f64::NAN);
    }
    check(&j, IncidentKind::Nan, 11.0, Some(&[]));
    let f = &j.findings(IncidentKind::Nan, 11.0)[0];
    assert_eq!(f.job.as_deref(), Some("j"));
    assert!(f.nodes.is_empty() && f.gpus.is_empty(), "{f:#?}");
    assert!(f.confidence < 0.5, "{}", f.confidence);
    assert!(
        f.summary.contains("step 10") && f.summary.contains("rank is unknown"),
        "{}",
        f.summary
    );
}

#[test]
fn a_local_loss_on_one_replica_names_every_rank_of_that_replica() {
    // Two replicas of four ranks (tensor and pipeline parallel inside each), each
    // reporting its own loss; replica {4..7} went NaN at step 10, its ranks reporting
    // up to 0.3 s apart; replica {0..3} saw only the gradient norm spread by the
    // data-parallel reduction.
    let mut j = Job::new(2, 4);
    for r in 0..8 {
        j.metric(r, 9, 9.0, 2.0, 1.0);
    }
    for r in 4..8 {
        j.metric(r, 10, 10.0 + 0.1 * f64::from(r - 4), f64::NAN, f64::NAN);
    }
    for r in 0..4 {
        j.metric(r, 10, 10.0, 2.0, f64::NAN);
    }
    check(&j, IncidentKind::Nan, 11.0, Some(&[4, 5, 6, 7]));
    let f = &j.findings(IncidentKind::Nan, 11.0)[0];
    assert_eq!(f.nodes, ["node-01"]);
}

#[test]
fn a_rank_alone_first_is_named_alone() {
    let mut j = Job::new(4, 1);
    for r in 0..4 {
        let loss = if r == 2 { f64::NAN } else { 2.0 };
        j.metric(r, 10, 10.0 + 0.01 * f64::from(r), loss, f64::NAN);
    }
    check(&j, IncidentKind::Nan, 11.0, Some(&[2]));
    assert_eq!(j.findings(IncidentKind::Nan, 11.0)[0].confidence, 0.95);
}

fn noisy(i: u32, k: usize) -> f64 {
    // Deterministic jitter in ±3%.
    let x = ((i as usize * 7919 + k * 104_729) % 1000) as f64 / 1000.0;
    1.0 + 0.06 * (x - 0.5)
}

#[test]
fn straggler_node_is_found_and_hiccups_are_not() {
    let mut j = Job::new(16, 4);
    for r in 0..64u32 {
        let mut s: Vec<f64> = (0..16).map(|k| noisy(r, k)).collect();
        if r % 9 == 0 {
            s[(r as usize) % 16] += 0.6; // a one-off hiccup, different iteration per rank
        }
        j.compute(r, &s);
    }
    check(&j, IncidentKind::Straggler, 20.0, None);
    for r in 20..24u32 {
        j.compute(r, &[1.3, 1.31, 1.29]);
    }
    let f = j.findings(IncidentKind::Straggler, 20.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-05".to_string()]);
    assert_eq!(f[0].ranks, vec![20, 21, 22, 23]);
}

/// Two nodes of two ranks, 20 iterations of noisy compute; `slow(rank, k)` is the
/// factor of iteration `k` of `rank`.
fn two_nodes(slow: impl Fn(u32, usize) -> f64) -> Job {
    let mut j = Job::new(2, 2);
    for r in 0..4u32 {
        let s: Vec<f64> = (0..20).map(|k| noisy(r, k) * slow(r, k)).collect();
        j.compute(r, &s);
    }
    j
}

#[test]
fn in_a_two_node_job_the_node_that_slowed_down_is_named() {
    // Both ranks of node 1 compute 1.5x from iteration 14: half the job, so the job
    // median sits between the halves; node 1 rose against its own earlier iterations.
    let j = two_nodes(|r, k| if r >= 2 && k >= 14 { 1.5 } else { 1.0 });
    let f = j.findings(IncidentKind::Straggler, 20.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
    assert_eq!(f[0].ranks, vec![2, 3]);
    assert!(f[0].summary.contains("than node-00"), "{}", f[0].summary);
    // Not yet when only two iterations are slow.
    let early = two_nodes(|r, k| if r >= 2 && k >= 18 { 1.5 } else { 1.0 });
    check(&early, IncidentKind::Straggler, 20.0, None);
}

#[test]
fn in_a_two_node_job_a_slow_rank_is_a_rank_and_a_slower_job_is_nothing() {
    // One rank of node 1: the rank, not its node.
    let j = two_nodes(|r, k| if r == 3 && k >= 10 { 1.5 } else { 1.0 });
    check(&j, IncidentKind::Straggler, 20.0, Some(&[3]));
    // Every rank slower together (a longer phase of the job): nobody's fault.
    let j = two_nodes(|_, k| if k >= 10 { 1.5 } else { 1.0 });
    check(&j, IncidentKind::Straggler, 20.0, None);
    // Noise alone.
    check(&two_nodes(|_, _| 1.0), IncidentKind::Straggler, 20.0, None);
}

/// Two nodes of two ranks whose samples swing by `swing` either way, every other
/// iteration (CPUs shared with other work): each rank's median is its own speed, so
/// the ranks' medians agree and only the samples say how noisy the job is. Rank 3
/// computes `factor` times the others.
fn swinging(swing: f64, factor: f64) -> Job {
    let mut j = Job::new(2, 2);
    for r in 0..4u32 {
        let own = if r == 3 { factor } else { 1.0 };
        let s: Vec<f64> = (0..20)
            .map(|k| {
                own * if (k + r as usize).is_multiple_of(2) {
                    1.0 - swing
                } else {
                    1.0 + swing
                }
            })
            .collect();
        j.compute(r, &s);
    }
    j
}

#[test]
fn a_rank_slower_than_the_floor_but_within_its_noise_is_no_straggler() {
    // Samples ±25%: 16 of them cannot tell a rank 1.12x slow from chance.
    check(&swinging(0.25, 1.12), IncidentKind::Straggler, 20.0, None);
    // Steadier samples (±10%) name a rank 1.3x slow all the same, and so does a
    // steady job a rank 1.12x slow.
    check(
        &swinging(0.10, 1.3),
        IncidentKind::Straggler,
        20.0,
        Some(&[3]),
    );
    check(
        &swinging(0.01, 1.12),
        IncidentKind::Straggler,
        20.0,
        Some(&[3]),
    );
}

#[test]
fn small_straggler_needs_the_long_window() {
    let mut j = Job::new(16, 4);
    for r in 0..64u32 {
        let slow = (36..40).contains(&r);
        let s: Vec<f64> = (0..16)
            .map(|k| noisy(r, k) * if slow && k >= 6 { 1.1 } else { 1.0 })
            .collect();
        j.compute(r, &s);
    }
    let f = j.findings(IncidentKind::Straggler, 20.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-09".to_string()]);
}

/// Ring traffic for `samples` reads: communicators `100 + c` for `c` in `0..per_node`,
/// each a ring over every node's `c`-th rank; each rank sends 1 MiB per read to the
/// next member, taking `ns_per_byte(src node, dst node)` per byte on the wire (with a
/// little noise). Collectives complete alongside, as the plugin reports them.
fn ring_links(j: &mut Job, nodes: u32, samples: u64, ns_per_byte: impl Fn(u32, u32) -> f64) {
    let per_node = j.per_node;
    let mut totals: std::collections::HashMap<(u32, u32), (u64, u64, u64)> = Default::default();
    for k in 1..=samples {
        let t = k as f64;
        for n in 0..nodes {
            let mut links = vec![];
            let mut collectives = vec![];
            for c in 0..per_node {
                let r = n * per_node + c;
                let next = (n + 1) % nodes;
                let noise = 1.0 + 0.02 * f64::from((r + k as u32) % 5);
                let tot = totals.entry((r, next)).or_default();
                tot.0 += 64;
                tot.1 += 1 << 20;
                tot.2 += ((1u64 << 20) as f64 * ns_per_byte(n, next) * noise) as u64;
                links.push(warden_model::wire::LinkSample {
                    comm: 100 + u64::from(c),
                    rank: r,
                    comm_rank: n,
                    peer: next,
                    at_ns: ns(t),
                    steps: tot.0,
                    bytes: tot.1,
                    busy_ns: tot.2,
                });
                collectives.push(CollectiveEvent {
                    comm: 100 + u64::from(c),
                    rank: r,
                    seq: k,
                    op: CollOp::AllReduce as i32,
                    bytes: 1 << 20,
                    start_ns: ns(t - 0.5),
                    end_ns: ns(t - 0.1),
                    xfer_ns: 300_000_000,
                });
            }
            j.send(
                n,
                t,
                JobSignals {
                    job: "j".into(),
                    collectives,
                    links,
                    ..Default::default()
                },
                vec![],
            );
        }
    }
}

#[test]
fn slow_link_names_the_node_every_slow_edge_passes_through() {
    // Four rings across 8 nodes; node 3's NIC takes twice as long per byte, in and out.
    let mut j = Job::new(8, 4);
    ring_links(
        &mut j,
        8,
        10,
        |s, d| if s == 3 || d == 3 { 0.2 } else { 0.1 },
    );
    let f = j.findings(IncidentKind::SlowLink, 10.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-03".to_string()]);
    assert_eq!(f[0].ranks, vec![12, 13, 14, 15]);
    assert!(f[0].summary.contains("8 of its 8"), "{}", f[0].summary);
    check(&j, IncidentKind::Straggler, 10.0, None);
}

#[test]
fn two_slow_nodes_are_both_named_and_their_neighbours_are_not() {
    let mut j = Job::new(8, 2);
    ring_links(&mut j, 8, 10, |s, d| {
        if [2, 5].contains(&s) || [2, 5].contains(&d) {
            0.3
        } else {
            0.1
        }
    });
    let f = j.findings(IncidentKind::SlowLink, 10.0);
    let nodes: Vec<&str> = f.iter().map(|f| f.nodes[0].as_str()).collect();
    assert_eq!(nodes, vec!["node-02", "node-05"], "{f:#?}");
}

#[test]
fn slow_link_says_nothing_it_cannot_localize() {
    // Uniform links: nothing.
    let mut j = Job::new(8, 2);
    ring_links(&mut j, 8, 10, |_, _| 0.1);
    assert!(j.findings(IncidentKind::SlowLink, 10.0).is_empty());
    // One slow edge alone: the sender's port or the receiver's? Nothing.
    let mut j = Job::new(8, 1);
    ring_links(&mut j, 8, 10, |s, _| if s == 4 { 0.3 } else { 0.1 });
    assert!(j.findings(IncidentKind::SlowLink, 10.0).is_empty());
    // Two nodes: both edges pass through both.
    let mut j = Job::new(2, 4);
    ring_links(&mut j, 2, 10, |s, _| if s == 1 { 0.3 } else { 0.1 });
    assert!(j.findings(IncidentKind::SlowLink, 10.0).is_empty());
    // Too few samples yet.
    let mut j = Job::new(8, 4);
    ring_links(
        &mut j,
        8,
        4,
        |s, d| if s == 3 || d == 3 { 0.2 } else { 0.1 },
    );
    assert!(j.findings(IncidentKind::SlowLink, 10.0).is_empty());
}

#[test]
fn without_per_peer_timing_no_slow_link_is_judged() {
    // Transfer times of whole collectives, node 3's twice the others': a ring's pace is
    // its slowest link's for every member, so this says nothing about links.
    let mut j = Job::new(8, 4);
    for seq in 1..=8u64 {
        for c in 0..4u32 {
            for n in 0..8u32 {
                let r = n * 4 + c;
                let xfer = if n == 3 { 0.02 } else { 0.01 };
                let t = seq as f64;
                let ev = CollectiveEvent {
                    comm: 100 + u64::from(c),
                    rank: r,
                    seq,
                    op: CollOp::AllReduce as i32,
                    bytes: 1 << 29,
                    start_ns: ns(t),
                    end_ns: ns(t + 0.03),
                    xfer_ns: (xfer * 1e9) as u64,
                };
                j.send(
                    n,
                    t + 0.03,
                    JobSignals {
                        job: "j".into(),
                        collectives: vec![ev],
                        ..Default::default()
                    },
                    vec![],
                );
            }
        }
    }
    assert!(j.findings(IncidentKind::SlowLink, 10.0).is_empty());
}

#[test]
fn gpu_fault_names_node_gpu_and_rank_once_per_gpu() {
    let mut j = Job::new(4, 8);
    let xid = |id: u64, code: u32, sev: EventSeverity| NodeEvent {
        id,
        at_ns: ns(5.0),
        kind: NodeEventKind::Xid as i32,
        severity: sev as i32,
        gpu_index: Some(3),
        pci_bus_id: "0000:3b:00".into(),
        code: Some(code),
        message: format!("NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=python"),
        count: 1,
    };
    let js = || JobSignals {
        job: "j".into(),
        ..Default::default()
    };
    j.send(2, 5.0, js(), vec![xid(1, 79, EventSeverity::Fatal)]);
    j.send(
        2,
        5.5,
        js(),
        vec![
            xid(1, 79, EventSeverity::Fatal),
            xid(2, 79, EventSeverity::Fatal),
        ],
    );
    let f = j.findings(IncidentKind::GpuFault, 6.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, vec![19]);
    assert_eq!(f[0].gpus[0].to_string(), "node-02 gpu 3");
    assert!(
        f[0].summary.contains("XID 79 (GPU has fallen off the bus)"),
        "{}",
        f[0].summary
    );
    assert!(
        f[0].summary.contains("(2 events)"),
        "duplicate id 1 counted once: {}",
        f[0].summary
    );
}

/// Findings of every detector over the whole cluster at `now`, as a tick runs them.
fn all_findings(job: &Job, now: f64) -> Vec<Finding> {
    super::Detectors::new(DetectConfig::default())
        .run(&job.cluster, at(now))
        .findings
}

impl Job {
    /// The scheduler reports the job's start (`end == false`) or end at `t`.
    fn lifecycle(&mut self, end: bool, t: f64) {
        let event = if end { "end" } else { "start" };
        let report = crate::lifecycle::parse(
            format!(
                r#"{{"event":"{event}","scheduler":"slurm","scheduler_job_id":"7","nodes":["node-00"]}}"#
            )
            .as_bytes(),
        )
        .expect("valid report");
        self.cluster.apply_lifecycle("j", &report, at(t));
    }
}

/// Ranks 0..=2 enter seq 10 at 10.0; rank 3 never does, and nothing moves after.
fn silent_after_seq_9() -> Job {
    let mut j = steady(4);
    j.lifecycle(false, 0.0);
    for r in 0..3 {
        j.coll(7, r, 10, 10.0, None);
    }
    j
}

#[test]
fn a_job_that_ended_and_went_silent_is_not_a_hang() {
    // Without an end, the same silence is a hang on rank 3.
    let mut running = silent_after_seq_9();
    running.heartbeats(12.0);
    running.heartbeats(30.0);
    let f = all_findings(&running, 30.0);
    assert!(
        f.iter()
            .any(|f| f.kind == IncidentKind::Hang && f.ranks == [3]),
        "{f:#?}"
    );

    let mut ended = silent_after_seq_9();
    ended.lifecycle(true, 10.2);
    ended.heartbeats(12.0);
    ended.heartbeats(30.0);
    let f = all_findings(&ended, 30.0);
    assert!(f.is_empty(), "an ended job raises nothing: {f:#?}");
    // The end only counts once it has happened.
    assert!(
        all_findings(&ended, 10.1)
            .iter()
            .all(|f| f.kind != IncidentKind::Hang)
    );
}

#[test]
fn after_the_end_a_crash_from_before_still_counts_and_teardown_does_not() {
    // Teardown: rank 2 is killed after the scheduler said the job ended.
    let mut j = steady(4);
    j.lifecycle(true, 10.0);
    j.exit(2, 10.5, None, Some(9), None);
    j.heartbeats(13.0);
    check(&j, IncidentKind::Crash, 13.0, Some(&[2])); // the detector alone sees it
    assert!(all_findings(&j, 13.0).is_empty(), "teardown is no crash");

    // A crash that ended the job: found although the end came before the tick.
    let mut j = steady(4);
    j.exit(
        1,
        9.5,
        Some(1),
        None,
        Some("Traceback (most recent call last):"),
    );
    j.lifecycle(true, 10.0);
    j.heartbeats(13.0);
    let f = all_findings(&j, 13.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        (f[0].kind, f[0].ranks.as_slice()),
        (IncidentKind::Crash, &[1][..])
    );
}

#[test]
fn the_run_remediation_restarts_is_no_crash_and_the_next_run_starts_clean() {
    // Rank 3 holds the others at seq 10; remediation asks Slurm to requeue the job,
    // which kills every rank.
    let mut j = silent_after_seq_9();
    j.heartbeats(12.0);
    j.heartbeats(30.0);
    assert!(
        all_findings(&j, 30.0)
            .iter()
            .any(|f| f.kind == IncidentKind::Hang && f.ranks == [3])
    );
    j.cluster
        .jobs
        .get_mut("j")
        .expect("job")
        .restart_requested_at = Some(at(30.5));
    for r in 0..4 {
        j.exit(r, 31.0 + f64::from(r) * 0.01, None, Some(15), None);
    }
    j.heartbeats(33.0);
    check(&j, IncidentKind::Crash, 33.0, None);

    // Slurm ends the run and starts the job again: the last run's stall, exits and
    // communicators are gone, so the new run is judged on its own.
    j.lifecycle(true, 33.5);
    j.lifecycle(false, 40.0);
    let job = &j.cluster.jobs["j"];
    assert!(job.ranks.is_empty() && job.comms.is_empty(), "{job:?}");
    assert_eq!(job.restart_requested_at, None);
    assert!(all_findings(&j, 41.0).is_empty());

    // A crash of the new run is a crash again.
    let mut j = silent_after_seq_9();
    j.cluster
        .jobs
        .get_mut("j")
        .expect("job")
        .restart_requested_at = Some(at(30.5));
    j.exit(
        1,
        29.0,
        Some(1),
        None,
        Some("Traceback (most recent call last):"),
    );
    j.heartbeats(31.5);
    check(&j, IncidentKind::Crash, 31.5, Some(&[1]));
}

/// A DDP-like job on one node: each step a forward, a backward in `buckets` chunks
/// with each chunk's gradient all-reduce issued asynchronously as it is ready (all on
/// the one process group), an optimizer step, then the step mark. Rank `slow` (if any)
/// computes `factor` times as long from step `from` on. With `marks` false the job
/// reports no steps (a capture path that sees only collectives).
fn multi_bucket(
    nranks: u32,
    buckets: u64,
    steps: u64,
    slow: Option<(u32, f64, u64)>,
    marks: bool,
) -> Job {
    let mut j = Job::new(1, nranks);
    let mut seq = 0u64;
    let mut begin = vec![0.0f64; nranks as usize];
    for step in 1..=steps {
        let speed = |r: u32| match slow {
            Some((s, f, from)) if s == r && step >= from => f,
            _ => 1.0,
        };
        // Issue times of each bucket on each rank.
        let mut issued = vec![vec![0.0f64; buckets as usize]; nranks as usize];
        for r in 0..nranks {
            let mut t = begin[r as usize] + 0.1 * speed(r);
            for at in issued[r as usize].iter_mut() {
                t += 0.06 * speed(r);
                *at = t;
            }
        }
        let mut ends = vec![0.0f64; buckets as usize];
        let mut prev = 0.0f64;
        for b in 0..buckets as usize {
            let last_in = (0..nranks as usize)
                .map(|r| issued[r][b])
                .fold(0.0, f64::max);
            ends[b] = (last_in + 0.004).max(prev + 0.001);
            prev = ends[b];
        }
        for b in 0..buckets as usize {
            seq += 1;
            for r in 0..nranks {
                j.coll(1, r, seq, issued[r as usize][b], Some(ends[b]));
            }
        }
        for r in 0..nranks {
            let mark = ends[buckets as usize - 1] + 0.02 * speed(r);
            if marks {
                j.metric(r, step, mark, 1.0, 1.0);
            }
            begin[r as usize] = mark;
        }
    }
    j
}

#[test]
fn iterations_run_from_step_mark_to_step_mark_whatever_the_collectives_in_between() {
    // Three buckets a step: compute per step is 0.1 + 3 × 0.06 + 0.02 = 0.3 s, with
    // overlapping asynchronous all-reduces counted once.
    let j = multi_bucket(4, 3, 12, None, true);
    let r = &j.cluster.jobs["j"].ranks[1];
    assert_eq!(r.iterations(), crate::state::IterationSource::Steps);
    let secs: Vec<f32> = r.compute.recent(8).map(|s| s.secs).collect();
    assert_eq!(secs.len(), 8);
    for s in secs {
        assert!((s - 0.3).abs() < 0.01, "compute per step {s}");
    }
}

#[test]
fn a_slow_rank_in_a_multi_bucket_job_on_one_node_is_named_within_twenty_steps() {
    for buckets in [1u64, 2, 4] {
        let j = multi_bucket(4, buckets, 40, Some((2, 1.5, 20)), true);
        let f = j.findings(IncidentKind::Straggler, 100.0);
        assert_eq!(f.len(), 1, "{buckets} buckets: {f:#?}");
        assert_eq!(f[0].ranks, vec![2], "{}", f[0].summary);
        let clean = multi_bucket(4, buckets, 40, None, true);
        check(&clean, IncidentKind::Straggler, 100.0, None);
    }
}

#[test]
fn without_step_marks_iterations_fall_back_to_the_collectives_and_say_so() {
    let j = multi_bucket(4, 1, 12, None, false);
    let r = &j.cluster.jobs["j"].ranks[0];
    assert_eq!(r.iterations(), crate::state::IterationSource::Collectives);
    assert!(!r.compute.is_empty());
}

#[test]
fn a_receive_whose_sender_never_sends_is_a_hang_naming_the_sender_and_its_send() {
    // A two-stage pipeline: rank 0 sends activations to rank 1 on their own
    // point-to-point communicator (rank 0 is member 0), 60 times, then stops sending.
    let mut j = Job::new(2, 1);
    for k in 1..=60u64 {
        let t = k as f64 * 0.2;
        j.coll_op(9, 0, k, t, Some(t + 0.01), CollOp::Send);
        j.coll_op(9, 1, k, t - 0.05, Some(t + 0.01), CollOp::Recv);
    }
    // Rank 1 then waits in receive 61, and a broadcast on another communicator ran
    // last.
    j.coll_op(8, 0, 1, 12.1, Some(12.15), CollOp::Broadcast);
    j.coll_op(8, 1, 1, 12.1, Some(12.15), CollOp::Broadcast);
    j.coll_op(9, 1, 61, 12.2, None, CollOp::Recv);
    j.heartbeats(13.0);
    j.heartbeats(20.0);
    let f = j.findings(IncidentKind::Hang, 20.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, vec![0], "{}", f[0].summary);
    assert!(
        f[0].summary.starts_with("rank 0 never entered send seq 61"),
        "{}",
        f[0].summary
    );
}

#[test]
fn a_hang_in_a_jobs_first_steps_is_called_within_a_few_iterations_not_the_warm_up_bound() {
    // Four ranks, one all-reduce and a step mark every 0.5 s; rank 3 stops before the
    // sixth all-reduce.
    let mut j = Job::new(4, 1);
    for step in 1..=5u64 {
        let t = step as f64 * 0.5;
        for r in 0..4 {
            j.coll(1, r, step, t - 0.1 + 0.01 * f64::from(r), Some(t));
            j.metric(r, step, t + 0.02, 1.0, 1.0);
        }
    }
    for r in 0..3 {
        j.coll(1, r, 6, 2.9, None);
    }
    j.heartbeats(3.5);
    check(&j, IncidentKind::Hang, 3.5, None); // within three iterations
    j.heartbeats(5.0);
    check(&j, IncidentKind::Hang, 5.0, Some(&[3]));
}

#[test]
fn on_a_device_path_a_hang_is_called_though_earlier_collectives_complete_after_later_ones_began() {
    // NCCL as warden_torch or the plugin see it: the host enqueues a step's three
    // all-gathers at once and goes on; each completes on the device later. A step every
    // 0.5 s with step marks; rank 3 is stopped at the end of step 5: its last three
    // collectives ran on the device (the others' completions show it) but its own
    // completions are never reported, while the others enqueue step 6 before step 5's
    // collectives have finished on their devices.
    let mut j = Job::new(4, 1);
    let mut seq = 0;
    for step in 1..=5u64 {
        let t = step as f64 * 0.5;
        for k in 0..3u64 {
            for r in 0..4 {
                let (start, end) = (t - 0.4 + 0.001 * k as f64, t - 0.3 + 0.1 * k as f64);
                let stopped = r == 3 && step == 5;
                j.coll(1, r, seq + k + 1, start, (!stopped).then_some(end));
            }
        }
        seq += 3;
        for r in 0..3 {
            j.metric(r, step, t + 0.02, 1.0, 1.0);
        }
        if step < 5 {
            j.metric(3, step, t + 0.02, 1.0, 1.0);
        }
    }
    // Step 6: ranks 0-2 enqueue 16, 17, 18 at 2.11 s, before 13-15 completed (2.2-2.4 s).
    let mut ahead = Vec::new();
    for r in 0..3 {
        for k in 16..=18u64 {
            j.coll(1, r, k, 2.11 + 0.001 * (k - 16) as f64, None);
        }
        ahead.push(j.in_flight.pop().expect("in flight"));
    }
    for r in 0..3 {
        for (k, end) in [(13u64, 2.2), (14, 2.3), (15, 2.4)] {
            j.coll(1, r, k, 2.1 + 0.001 * (k - 13) as f64, Some(end));
        }
    }
    j.in_flight.extend(ahead);
    j.heartbeats(3.0);
    check(&j, IncidentKind::Hang, 3.0, None); // within a few iterations of 0.5 s
    j.heartbeats(6.0);
    check(&j, IncidentKind::Hang, 6.0, Some(&[3]));
}

#[test]
fn a_communicator_with_fewer_than_four_collectives_keeps_the_warm_up_bound() {
    // Three steps seen: too few waits to learn from (a job's first collectives wait
    // for its slowest starter).
    let mut j = Job::new(4, 1);
    for step in 1..=3u64 {
        let t = step as f64 * 0.5;
        for r in 0..4 {
            j.coll(1, r, step, t - 0.1, Some(t));
            j.metric(r, step, t + 0.02, 1.0, 1.0);
        }
    }
    for r in 0..3 {
        j.coll(1, r, 4, 1.9, None);
    }
    j.heartbeats(8.0);
    check(&j, IncidentKind::Hang, 8.0, None);
    j.heartbeats(12.5);
    check(&j, IncidentKind::Hang, 12.5, Some(&[3]));
}

#[test]
fn step_marks_every_few_steps_give_the_mean_step() {
    // A program that reports every fourth step: four steps of 0.3 s compute, each with
    // one all-reduce of 0.1 s, between two marks.
    let mut j = Job::new(1, 1);
    let mut t = 0.0;
    let mut seq = 0;
    // Eleven marks: the first opens the count, the iteration after it gives only its
    // length, and the last waits for a collective entered after it.
    for step in 1..=44u64 {
        t += 0.3;
        seq += 1;
        j.coll(1, 0, seq, t, Some(t + 0.1));
        t += 0.1;
        if step % 4 == 0 {
            j.metric(0, step, t, 1.0, 1.0);
        }
    }
    let r = &j.cluster.jobs["j"].ranks[0];
    let samples: Vec<(f32, f32)> = r.compute.recent(8).map(|s| (s.secs, s.period)).collect();
    assert_eq!(samples.len(), 8, "{samples:?}");
    for (secs, period) in samples {
        assert!(
            (secs - 0.3).abs() < 0.01 && (period - 0.4).abs() < 0.01,
            "{secs} {period}"
        );
    }
}

// ---- Jobs nothing captures: what their logs and their launcher say ----

impl Job {
    /// A job of `per_node` ranks a node that registers nothing: no capture, only
    /// what each node's agent reads from the logs.
    fn bare(per_node: u32) -> Job {
        Job {
            cluster: Cluster::default(),
            per_node,
            seq: Default::default(),
            stats: EngineStats::default(),
            in_flight: Vec::new(),
        }
    }

    /// Rank `r`'s log says `line` at `t`.
    fn log(&mut self, r: u32, t: f64, line: &str) {
        let l = LogRecord {
            rank: Some(r),
            at_ns: ns(t),
            stream: 2,
            line: line.into(),
        };
        self.send(
            self.node_of(r),
            t,
            JobSignals {
                job: "j".into(),
                logs: vec![l],
                ..Default::default()
            },
            vec![],
        );
    }

    /// The launcher's failure report on `r`'s node names its death, read at `t`.
    fn reported_exit(&mut self, r: u32, t: f64, code: Option<i32>, signal: Option<i32>) {
        let p = ProcessState {
            rank: r,
            pid: 100 + r,
            at_ns: ns(t),
            alive: false,
            exit_code: code,
            signal,
            stopped: false,
            from_log: true,
        };
        self.process(p, t);
    }

    fn timeout_verdicts(&self, now: f64) -> Vec<Verdict> {
        let w = Window {
            job: &self.cluster.jobs["j"],
            cluster: &self.cluster,
        };
        super::timeout::check(&DetectConfig::default().timeout, w, at(now))
    }

    fn timeout_findings(&self, now: f64) -> Vec<Finding> {
        self.timeout_verdicts(now)
            .into_iter()
            .filter_map(|v| match v {
                Verdict::Finding(f) => Some(f.normalize()),
                _ => None,
            })
            .collect()
    }
}

const GLOO_TIMEOUT: &str = "[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/\
unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete";

/// Four ranks on two nodes that printed their loss for ten steps.
fn logging_job() -> Job {
    let mut j = Job::bare(2);
    for step in 1..=10u64 {
        for r in 0..4 {
            j.metric(r, step, step as f64, 2.0, 1.0);
        }
    }
    j
}

#[test]
fn the_lines_that_say_a_collective_timed_out_and_how_long_it_waited() {
    use crate::state::collective_timeout;
    let low = |s: &str| collective_timeout(&s.to_ascii_lowercase());
    assert_eq!(low(GLOO_TIMEOUT), Some(Some(10.0)));
    assert_eq!(
        low(
            "[rank1]: RuntimeError: ... Timed out waiting 1800000ms for send operation to complete"
        ),
        Some(Some(1800.0))
    );
    assert_eq!(
        low(
            "[Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=312774, \
             OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1801487 milliseconds before timing out."
        ),
        Some(Some(1801.487))
    );
    assert_eq!(
        low(
            "[PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work \
             sequence id: 1284 PG status: last enqueued work: 1315, last completed work: 1283"
        ),
        Some(None)
    );
    assert_eq!(low("Connection closed by peer [127.0.0.1]:4505"), None);
    assert_eq!(
        low("step 10 loss 0.25 (timed out waiting for nothing)"),
        None
    );
}

#[test]
fn a_log_only_hang_names_the_rank_that_logged_no_timeout_and_its_node() {
    let mut j = logging_job();
    // Rank 3 stopped after step 10; the others give up 10 s into their wait.
    for r in 0..3 {
        j.log(r, 21.0 + f64::from(r) * 0.3, GLOO_TIMEOUT);
    }
    assert_eq!(
        j.timeout_verdicts(22.0),
        vec![Verdict::NeedMoreData],
        "the others' lines may still come"
    );
    let f = j.timeout_findings(25.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, IncidentKind::Hang);
    assert_eq!(f[0].ranks, vec![3]);
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
    assert_eq!(
        f[0].onset,
        at(11.0),
        "onset: the first timeout less its wait"
    );
    assert!(f[0].confidence < 0.9, "a log-only hang is less certain");
    assert!(f[0].summary.contains("from the logs"), "{}", f[0].summary);
    // The exits that follow are the hang's victims: their crash waits until the hang
    // is named (the incident book then folds it into the hang).
    for r in 0..3 {
        j.reported_exit(r, 22.0 + f64::from(r) * 0.3, Some(1), None);
    }
    assert!(j.need_more_data(IncidentKind::Crash, 26.0));
    assert!(j.need_more_data(IncidentKind::Crash, 36.0));
    assert_eq!(j.findings(IncidentKind::Crash, 37.5).len(), 1);
    assert_eq!(j.timeout_findings(37.5)[0].ranks, vec![3]);
}

#[test]
fn a_rank_whose_partner_timed_out_first_and_left_is_a_waiter_too() {
    let mut j = logging_job();
    for r in 1..3 {
        j.log(r, 21.0, GLOO_TIMEOUT);
    }
    // Rank 0 waited on rank 2, which gave up first and exited.
    j.log(
        0,
        21.2,
        "[rank0]: RuntimeError: ... Connection closed by peer [127.0.0.1]:4505",
    );
    let f = j.timeout_findings(25.0);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].ranks, vec![3], "{}", f[0].summary);
}

#[test]
fn silent_ranks_all_on_one_node_name_the_node_and_the_teardown_is_no_crash() {
    // A pipeline: rank 1 timed out sending to the stopped rank 3; rank 0 lost rank 1
    // and was torn down (SIGTERM); rank 2 waits on rank 3 with no timeout of its own.
    let mut j = logging_job();
    j.log(1, 21.0, GLOO_TIMEOUT);
    j.log(
        0,
        21.1,
        "[rank0]: RuntimeError: ... Connection closed by peer [127.0.0.1]:435",
    );
    j.reported_exit(1, 21.2, Some(1), None);
    j.reported_exit(0, 21.2, None, Some(15));
    assert!(j.need_more_data(IncidentKind::Crash, 23.0));
    let f = j.timeout_findings(25.0);
    assert_eq!(f.len(), 1);
    assert!(f[0].ranks.is_empty(), "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
    assert!(
        f[0].summary.contains("ranks 2, 3 on node-01"),
        "{}",
        f[0].summary
    );
}

#[test]
fn a_rank_its_launcher_cut_short_before_its_last_words_does_not_hide_the_stuck_node() {
    // The pipeline again, under load: torchrun terminated rank 0 (SIGTERM) once rank 1
    // failed, before rank 0 could log that rank 1 had closed the connection. Its
    // silence says nothing; ranks 2 and 3 on node-01 are still the ones to look at.
    let mut j = logging_job();
    j.log(1, 21.0, GLOO_TIMEOUT);
    j.reported_exit(1, 21.2, Some(1), None);
    j.reported_exit(0, 21.2, None, Some(15));
    let f = j.timeout_findings(25.0);
    assert_eq!(f.len(), 1);
    assert!(f[0].ranks.is_empty(), "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-01".to_string()], "{f:#?}");
    assert!(
        f[0].evidence
            .iter()
            .any(|e| e.text.starts_with("rank 0: terminated by the launcher")),
        "{f:#?}"
    );
}

#[test]
fn a_stuck_rank_its_launcher_terminated_is_still_the_one_named() {
    // DDP: rank 3 deadlocked (alive); the others timed out, and rank 2's failure made
    // node-01's launcher terminate rank 3. It alone logged nothing: it is named.
    let mut j = logging_job();
    for r in 0..3 {
        j.log(r, 21.0 + f64::from(r) * 0.1, GLOO_TIMEOUT);
    }
    for r in 0..3 {
        j.reported_exit(r, 21.4, Some(1), None);
    }
    j.reported_exit(3, 21.5, None, Some(15));
    let f = j.timeout_findings(25.0);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].ranks, vec![3], "{f:#?}");
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
}

#[test]
fn a_log_only_hang_singles_out_nobody_when_too_many_ranks_are_silent() {
    // Ranks 1 and 3 are silent, on different nodes.
    let mut j = logging_job();
    for r in [0, 2] {
        j.log(r, 21.0, GLOO_TIMEOUT);
    }
    assert_eq!(
        j.timeout_verdicts(25.0),
        vec![Verdict::NeedMoreData],
        "the lines that would single out a rank may still come"
    );
    let f = j.timeout_findings(33.5);
    assert_eq!(f.len(), 1);
    assert!(f[0].ranks.is_empty() && f[0].nodes.is_empty(), "{f:#?}");
    assert!(
        f[0].summary.contains("do not single out"),
        "{}",
        f[0].summary
    );
}

#[test]
fn one_early_timeout_line_waits_for_the_others_and_they_name_the_culprit() {
    // Under load rank 1's line arrives first; ranks 0 and 2 follow 6 s later. Deciding
    // on rank 1's line alone would single out nobody.
    let mut j = logging_job();
    j.log(1, 21.0, GLOO_TIMEOUT);
    for t in [24.5, 26.0, 30.0] {
        assert_eq!(
            j.timeout_verdicts(t),
            vec![Verdict::NeedMoreData],
            "at {t} s: the others' lines may still come"
        );
    }
    j.log(0, 27.0, GLOO_TIMEOUT);
    j.log(2, 27.2, GLOO_TIMEOUT);
    assert_eq!(
        j.timeout_verdicts(29.0),
        vec![Verdict::NeedMoreData],
        "lines are still arriving"
    );
    let f = j.timeout_findings(30.5);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, vec![3], "{}", f[0].summary);
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
}

#[test]
fn the_crash_of_a_hangs_victims_waits_as_long_as_the_timeout_lines_may() {
    let c = DetectConfig::default();
    assert!(
        c.crash.log_victims_secs > c.timeout.patience_secs,
        "the victims' exits must not be named before the hang they gave up on"
    );
    assert!(
        c.crash.victims_secs < crate::incidents::BookConfig::default().hang_quiet_secs,
        "a captured hang's victims must be named before the hang resolves without them"
    );
    // One line, the waiter's exit right after it, and nothing more for a long time:
    // the hang singles out nobody at the end of the patience, and the crash is held
    // until then.
    let mut j = logging_job();
    j.log(1, 21.0, GLOO_TIMEOUT);
    j.reported_exit(1, 21.2, Some(1), None);
    assert!(j.need_more_data(IncidentKind::Crash, 32.0));
    assert_eq!(j.timeout_verdicts(32.0), vec![Verdict::NeedMoreData]);
    let f = j.timeout_findings(33.5);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert!(f[0].ranks.is_empty() && f[0].nodes.is_empty(), "{f:#?}");
}

#[test]
fn a_silent_rank_that_died_is_a_crash_not_a_log_only_hang() {
    let mut j = logging_job();
    j.reported_exit(3, 11.0, None, Some(9));
    for r in 0..3 {
        j.log(r, 21.0, GLOO_TIMEOUT);
    }
    assert!(j.timeout_findings(30.0).is_empty());
    check(&j, IncidentKind::Crash, 30.0, Some(&[3]));
}

#[test]
fn a_captured_job_gets_its_hang_from_the_collectives_not_the_logs() {
    let mut j = steady(4);
    for r in 0..3 {
        j.log(r, 21.0, GLOO_TIMEOUT);
    }
    assert!(j.timeout_verdicts(30.0).is_empty());
}

#[test]
fn a_log_only_crash_names_the_killed_rank_not_a_launchers_root_cause() {
    let mut j = logging_job();
    // Rank 3's launcher reports it killed; the others' launchers each report their own
    // rank, which failed later because its peer went away, as their "root cause".
    j.reported_exit(3, 10.5, None, Some(9));
    for r in 0..3 {
        j.log(
            r,
            12.0,
            "[rank0]: RuntimeError: ... Connection closed by peer [127.0.0.1]:4505",
        );
        j.reported_exit(r, 12.1, Some(1), None);
    }
    let f = j.findings(IncidentKind::Crash, 13.5);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, vec![3]);
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
    assert!(f[0].confidence < 0.9, "read from a report, not observed");
    assert!(
        f[0].evidence[0].text.contains("launcher's failure report"),
        "{:#?}",
        f[0].evidence
    );
}

#[test]
fn while_every_exit_blames_a_peer_the_peers_own_exit_is_waited_for() {
    let mut j = logging_job();
    for r in 0..3 {
        j.log(
            r,
            10.2,
            "[rank0]: RuntimeError: ... Connection closed by peer [127.0.0.1]:4505",
        );
        j.reported_exit(r, 10.2, Some(1), None);
    }
    j.heartbeats(10.5);
    assert!(
        j.need_more_data(IncidentKind::Crash, 10.5),
        "every node reported, but the one they blame may still come"
    );
    j.reported_exit(3, 10.6, None, Some(9));
    check(&j, IncidentKind::Crash, 10.7, Some(&[3]));
}

#[test]
fn a_log_only_nan_names_the_rank_and_the_node_that_read_it() {
    let mut j = logging_job();
    j.metric(3, 11, 11.0, f64::NAN, f64::NAN);
    for r in 0..3 {
        j.metric(r, 11, 11.0, 2.0, 1.0);
        j.metric(r, 12, 12.0, f64::NAN, f64::NAN);
    }
    j.metric(3, 12, 12.0, f64::NAN, f64::NAN);
    let f = j.findings(IncidentKind::Nan, 13.0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].ranks, vec![3]);
    assert_eq!(f[0].nodes, vec!["node-01".to_string()]);
}

#[test]
fn a_rank_whose_pair_closed_on_a_timeout_and_was_terminated_is_a_victim() {
    // What gloo and torchrun print in a DDP job after rank 3 stopped: rank 1's own wait
    // ended in "Application timeout caused pair closure" and its launcher terminated it
    // (SIGTERM) once rank 0 failed.
    let mut j = logging_job();
    j.log(0, 21.0, GLOO_TIMEOUT);
    j.log(2, 21.1, GLOO_TIMEOUT);
    j.log(
        1,
        21.1,
        "[rank1]: RuntimeError: Application timeout caused pair closure",
    );
    j.reported_exit(1, 21.3, None, Some(15));
    j.reported_exit(0, 21.3, Some(1), None);
    j.reported_exit(2, 21.4, Some(1), None);
    assert!(j.need_more_data(IncidentKind::Crash, 25.0));
    let f = j.timeout_findings(25.0);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].ranks, vec![3], "{}", f[0].summary);
}

#[test]
fn a_terminated_rank_is_not_the_crash_when_another_died_first_by_itself() {
    let mut j = logging_job();
    j.reported_exit(0, 10.0, None, Some(15));
    j.reported_exit(3, 10.2, None, Some(11));
    check(&j, IncidentKind::Crash, 12.0, Some(&[3]));
}

#[test]
fn inside_a_node_an_enqueue_that_stands_in_for_a_completion_does_not_hide_the_hang() {
    // Two nodes of four ranks: communicator 1 inside node 0 (the NCCL plugin's default
    // mask shows its enqueues as completions), data-parallel pairs 10 + r across nodes.
    let mut j = Job::new(2, 4);
    let enqueue = 30e-6;
    for step in 1..=6u64 {
        let t = step as f64 * 0.5;
        for r in 0..4 {
            j.coll(1, r, step, t, Some(t + enqueue));
        }
        for r in 0..4 {
            for m in [r, r + 4] {
                j.coll(10 + u64::from(r), m, step, t + 0.2, Some(t + 0.3));
                j.metric(m, step, t + 0.31, 1.0, 1.0);
            }
        }
    }
    // Step 7: rank 2 never enters; its peers enqueue (and so "complete") and then stay
    // on their GPUs; node 1 enters the data-parallel all-reduces and waits there.
    for r in [0, 1, 3] {
        j.coll(1, r, 7, 3.5, Some(3.5 + enqueue));
    }
    for r in 4..8 {
        j.coll(10 + u64::from(r - 4), r, 7, 3.7, None);
    }
    j.heartbeats(4.0);
    check(&j, IncidentKind::Hang, 4.0, None);
    j.heartbeats(7.0);
    check(&j, IncidentKind::Hang, 7.0, Some(&[2]));
}

#[test]
fn a_step_mark_that_arrives_before_the_collectives_it_closes_waits_for_them() {
    // The plugin's segments are read every 0.5 s, warden_torch.step() goes out at once:
    // each step's mark arrives before the completion of the all-reduce that ends it.
    let mut j = Job::new(1, 1);
    for step in 1..=12u64 {
        let t = step as f64 * 0.5;
        j.metric(0, step, t + 0.5, 1.0, 1.0);
        j.coll(1, 0, step, t + 0.3, Some(t + 0.5));
    }
    let r = &j.cluster.jobs["j"].ranks[0];
    let samples: Vec<f32> = r.compute.recent(8).map(|s| s.secs).collect();
    assert!(samples.len() >= 8, "{samples:?}");
    assert!(
        samples.iter().all(|s| (s - 0.3).abs() < 0.01),
        "{samples:?}"
    );
}
