//! Physics and agent invariants on small runs, checked on the decoded batches exactly as
//! the controller would receive them.

use std::collections::{BTreeMap, HashMap};

use warden_engine::IncidentChange;
use warden_model::Timestamp;
use warden_model::wire::{Batch, CollectiveEvent, EventSeverity};
use warden_sim::{RunOptions, SIM_EPOCH, Scenario, Simulation, Sink};

/// A sink that keeps every batch it receives.
#[derive(Default)]
struct Recorder {
    batches: Vec<(Timestamp, Batch)>,
    raw: Vec<u8>,
}

impl Sink for Recorder {
    fn deliver(&mut self, body: &[u8], now: Timestamp) {
        self.raw.extend_from_slice(body);
        let batch = Batch::decode_binary(body).expect("the simulator emits valid batches");
        self.batches.push((now, batch));
    }

    fn tick(&mut self, _now: Timestamp) -> Vec<IncidentChange> {
        vec![]
    }
}

fn record(yaml: &str) -> (Simulation, Recorder) {
    let scenario = Scenario::from_yaml(yaml, "test").expect("valid scenario");
    let mut sim = Simulation::new(&scenario, RunOptions::default());
    let mut rec = Recorder::default();
    sim.run_to_end(&mut rec);
    assert!(sim.done());
    (sim, rec)
}

fn secs(ns: i64) -> f64 {
    Timestamp(ns).secs_since(SIM_EPOCH)
}

fn collectives(rec: &Recorder) -> impl Iterator<Item = (&Batch, &CollectiveEvent)> {
    rec.batches.iter().flat_map(|(_, b)| {
        b.jobs
            .iter()
            .flat_map(move |j| j.collectives.iter().map(move |c| (b, c)))
    })
}

const SMALL: &str = "
seed: 11
job: {name: small, nodes: 4, gpus_per_node: 4, parallelism: {tp: 2, pp: 2, dp: 4}, iteration_secs: 0.5}
noise: {clock_skew_ms: 0, hiccup_prob: 0.05, checkpoint_every_steps: 20, checkpoint_secs: 5}
steps: 60
";

#[test]
fn no_record_is_newer_than_its_batch() {
    let skewed = SMALL.replace("clock_skew_ms: 0", "clock_skew_ms: 150");
    let (_, rec) = record(&skewed);
    assert!(rec.batches.len() > 100);
    for (received, b) in &rec.batches {
        // Agent clock vs controller clock: within the skew plus the delivery delay.
        let lag = received.secs_since(Timestamp(b.sent_at_ns));
        assert!((-0.16..=0.16).contains(&lag), "lag {lag}");
        let t = b.sent_at_ns;
        for j in &b.jobs {
            for c in &j.collectives {
                assert!(c.start_ns <= t && c.end_ns <= t, "{c:?} after batch at {t}");
            }
            for m in &j.metrics {
                assert!(m.at_ns <= t);
            }
            for p in &j.processes {
                assert!(p.at_ns <= t);
            }
            for l in &j.logs {
                assert!(l.at_ns <= t);
            }
        }
        for e in &b.events {
            assert!(e.at_ns <= t);
        }
    }
}

#[test]
fn members_of_a_collective_complete_together_and_all_report_it() {
    let (sim, rec) = record(&format!("{SMALL}capture: torch\n"));
    let mut by_key: HashMap<(u64, u64), Vec<&CollectiveEvent>> = HashMap::new();
    let mut sizes: HashMap<u64, u32> = HashMap::new();
    for (_, b) in &rec.batches {
        for j in &b.jobs {
            for c in &j.comms {
                sizes.insert(c.comm, c.size);
            }
        }
    }
    for (_, c) in collectives(&rec) {
        if !c.in_flight() {
            let evs = by_key.entry((c.comm, c.seq)).or_default();
            // Completions are carried twice (their batch and the next): same record.
            match evs.iter().find(|e| e.rank == c.rank) {
                Some(seen) => assert_eq!(*seen, c, "a repeated completion is identical"),
                None => evs.push(c),
            }
        }
    }
    // TP and DP communicators, and two pairs per pipeline group (one each way).
    assert_eq!(
        sizes.len(),
        8 + 16 + 4,
        "tp, pair and dp comms are registered"
    );
    assert!(by_key.len() > 1000);
    for ((comm, seq), evs) in &by_key {
        assert_eq!(
            evs.len() as u32,
            sizes[comm],
            "comm {comm:x} seq {seq}: every member reports it"
        );
        // warden_torch: each member's end is its first poll after the common completion.
        let first = evs.iter().map(|c| c.end_ns).min().unwrap_or(0);
        let last = evs.iter().map(|c| c.end_ns).max().unwrap_or(0);
        assert!(
            last - first < 20_000_000,
            "comm {comm:x} seq {seq} ends differ"
        );
        let last_call = evs.iter().map(|c| c.start_ns).max().unwrap_or(0);
        assert!(first >= last_call, "no end before the last member entered");
        assert!(
            evs.iter().all(|c| c.xfer_ns == 0),
            "warden_torch has no transfer time"
        );
    }
    assert_eq!(sim.progress().step, 60);
    // Normal end: every rank exits 0.
    let exits: Vec<_> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.processes.iter()))
        .filter(|p| !p.alive)
        .collect();
    let mut ranks: Vec<u32> = exits.iter().map(|p| p.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    assert_eq!(ranks.len(), 16);
    assert!(exits.iter().all(|p| p.exit_code == Some(0)));
}

#[test]
fn a_hang_leaves_peers_in_flight_and_the_culprit_idle() {
    // warden_torch: inside a node, too, an operation stays in flight until it completes.
    let (sim, rec) = record(&format!(
        "{SMALL}capture: torch\nfaults: [{{step: 30, kind: hang, rank: 5}}]\n"
    ));
    let fault = &sim.faults()[0];
    assert_eq!(fault.rank, Some(5));
    assert!(fault.last_progress_s.is_some_and(|p| p >= fault.onset_s));
    // The last batch of every node shows who is stuck where.
    let mut last: BTreeMap<&str, &Batch> = BTreeMap::new();
    for (_, b) in &rec.batches {
        last.insert(b.node.as_str(), b);
    }
    let in_flight: Vec<&CollectiveEvent> = last
        .values()
        .flat_map(|b| b.jobs.iter().flat_map(|j| j.collectives.iter()))
        .filter(|c| c.in_flight())
        .collect();
    assert!(!in_flight.is_empty());
    assert!(
        in_flight.iter().all(|c| c.rank != 5),
        "the culprit never entered a collective after the hang"
    );
    // Rank 5's TP peer (rank 4) waits in the first TP allreduce of step 30: seq 61.
    assert!(
        in_flight.iter().any(|c| c.rank == 4 && c.seq == 61),
        "{in_flight:?}"
    );
    // The culprit's last completed collective came before that.
    let culprit_last_seq = collectives(&rec)
        .filter(|(_, c)| c.rank == 5 && !c.in_flight())
        .map(|(_, c)| (c.comm, c.seq))
        .filter(|(comm, _)| in_flight.iter().any(|p| p.comm == *comm))
        .map(|(_, s)| s)
        .max()
        .unwrap_or(0);
    assert_eq!(culprit_last_seq, 60);
    // Nobody exits and the run ends a tail after the hang.
    assert!(
        rec.batches
            .iter()
            .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.processes.iter()))
            .all(|p| p.alive)
    );
    assert!(sim.progress().sim_seconds >= fault.onset_s + 30.0);
    assert!(sim.progress().step <= 30);
}

#[test]
fn a_crash_is_exited_first_by_its_culprit() {
    let (sim, rec) = record(&format!(
        "{SMALL}faults: [{{step: 25, kind: crash, rank: 9}}]\n"
    ));
    let onset = sim.faults()[0].onset_s;
    let mut first_exit: HashMap<u32, (i64, Option<i32>, Option<i32>)> = HashMap::new();
    for (_, b) in &rec.batches {
        for j in &b.jobs {
            for p in j.processes.iter().filter(|p| !p.alive) {
                first_exit
                    .entry(p.rank)
                    .or_insert((p.at_ns, p.exit_code, p.signal));
            }
        }
    }
    assert_eq!(first_exit.len(), 16, "every rank dies");
    let (culprit_at, code, signal) = first_exit[&9];
    assert!(code == Some(1) || signal == Some(11));
    assert!((secs(culprit_at) - onset).abs() < 0.001);
    for (r, (at, code, _)) in &first_exit {
        if *r != 9 {
            let after = secs(*at) - onset;
            assert!(
                (0.05..=0.6).contains(&after),
                "rank {r} died {after} s after the culprit"
            );
            assert_eq!(*code, Some(1));
        }
    }
    // Dead ranks report nothing newer than their death.
    for (_, c) in collectives(&rec) {
        let died = first_exit[&c.rank].0;
        assert!(c.start_ns <= died && (c.in_flight() || c.end_ns <= died));
    }
    // The crash traceback and the peers' connection errors are logged.
    let logs: Vec<&str> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.logs.iter()))
        .map(|l| l.line.as_str())
        .collect();
    assert!(logs.iter().any(|l| l.starts_with("[rank9]:")));
    assert!(logs.iter().any(|l| l.contains("Connection closed by peer")));
}

#[test]
fn the_nan_culprit_is_the_only_nan_loss_at_the_fault_step() {
    let (sim, rec) = record(&format!(
        "{SMALL}faults: [{{step: 40, kind: nan, rank: 13}}]\n"
    ));
    let metrics: Vec<_> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.metrics.iter()))
        .collect();
    let nan = |x: Option<f64>| x.is_some_and(f64::is_nan);
    let at40: Vec<_> = metrics.iter().filter(|m| m.step == 40).collect();
    let mut nan_loss: Vec<u32> = at40
        .iter()
        .filter(|m| nan(m.loss))
        .map(|m| m.rank)
        .collect();
    nan_loss.sort_unstable();
    nan_loss.dedup();
    // Each replica reports its own loss, the same on its four ranks (tp 2 x pp 2):
    // rank 13's replica is the data-parallel index 2.
    assert_eq!(nan_loss, vec![4, 5, 12, 13]);
    assert!(
        at40.iter().all(|m| m.first_nonfinite_op.is_none()),
        "no input check"
    );
    assert!(at40.iter().all(|m| nan(m.grad_norm)));
    assert!(
        metrics
            .iter()
            .filter(|m| m.step < 40)
            .all(|m| !nan(m.loss) && !nan(m.grad_norm))
    );
    assert!(
        metrics
            .iter()
            .filter(|m| m.step > 40)
            .all(|m| nan(m.loss) && nan(m.grad_norm))
    );
    assert_eq!(sim.progress().step, 60, "NaN does not stop the job");
    let onset = sim.faults()[0].onset_s;
    let culprit = at40
        .iter()
        .find(|m| m.rank == 13)
        .map(|m| secs(m.at_ns))
        .unwrap_or(0.0);
    assert!((culprit - onset).abs() < 0.001);
}

#[test]
fn the_nan_loss_is_everyones_when_reduced_and_the_input_check_names_the_rank() {
    let reduced = record(&format!(
        "{SMALL}metrics: reduced\nfaults: [{{step: 40, kind: nan, rank: 13}}]\n"
    ))
    .1;
    let nan = |x: Option<f64>| x.is_some_and(f64::is_nan);
    let at40: Vec<_> = reduced
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.metrics.iter()))
        .filter(|m| m.step == 40)
        .collect();
    assert!(!at40.is_empty() && at40.iter().all(|m| nan(m.loss)));
    let checked = record(&format!(
        "{SMALL}metrics: reduced\ngrad_check: true\nfaults: [{{step: 40, kind: nan, rank: 13}}]\n"
    ))
    .1;
    let mut first: Vec<(u32, u32)> = checked
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.metrics.iter()))
        .filter(|m| m.step == 40)
        .filter_map(|m| m.first_nonfinite_op.map(|op| (m.rank, op)))
        .collect();
    first.sort_unstable();
    first.dedup();
    // The culprit fed it into its first reduction; the rest of its replica later.
    assert_eq!(first, vec![(4, 1), (5, 1), (12, 1), (13, 0)]);
}

#[test]
fn transfer_times_are_what_each_path_measures() {
    let fault = "faults: [{step: 20, kind: slow_link, node: node-02, slowdown: 2.0}]\n";
    let dp_bytes = 512 << 20;
    // warden_torch measures none.
    let (_, torch) = record(&format!("{SMALL}capture: torch\n{fault}"));
    assert!(collectives(&torch).all(|(_, c)| c.xfer_ns == 0));
    // The plugin: across nodes, from just after the enqueue to the completion, which holds
    // the wait; inside a node, none.
    let (_, nccl) = record(&format!("{SMALL}{fault}"));
    let mut slow = vec![];
    let mut others = vec![];
    for (b, c) in collectives(&nccl) {
        if c.in_flight() || c.bytes != dp_bytes {
            continue;
        }
        let held = c.end_ns - c.start_ns - c.xfer_ns as i64;
        assert!(
            (0..=100_000).contains(&held),
            "xfer is the whole time inside: {held} ns"
        );
        if c.seq > 20 {
            if b.node == "node-02" {
                slow.push(c.xfer_ns as f64);
            } else {
                others.push(c.xfer_ns as f64);
            }
        }
    }
    // A ring is paced by its slowest link for every member: node-02 does not stand out.
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ratio = mean(&slow) / mean(&others);
    assert!((0.6..1.6).contains(&ratio), "slow/other xfer ratio {ratio}");
    assert!(
        collectives(&nccl)
            .filter(|(_, c)| !c.in_flight() && c.bytes == 64 << 20)
            .all(|(_, c)| c.xfer_ns == 0),
        "no transfer time inside a node"
    );
}

#[test]
fn a_straggler_arrives_last() {
    let quiet = SMALL.replace("hiccup_prob: 0.05", "hiccup_prob: 0");
    let (_, rec) = record(&format!(
        "{quiet}faults: [{{step: 10, kind: straggler, node: node-01, slowdown: 1.3}}]\n"
    ));
    let mut last_by_node: HashMap<String, u32> = HashMap::new();
    let mut groups: HashMap<(u64, u64), Vec<(&str, i64)>> = HashMap::new();
    for (b, c) in collectives(&rec) {
        if !c.in_flight() && c.bytes == 512 << 20 && c.seq > 12 {
            groups
                .entry((c.comm, c.seq))
                .or_default()
                .push((b.node.as_str(), c.start_ns));
        }
    }
    // Pipeline stage 1 (nodes 02 and 03) waits for node-01 in the PP exchange, so only
    // the data-parallel groups of stage 0 show who computes slowly.
    for g in groups
        .values()
        .filter(|g| g.iter().any(|(n, _)| *n == "node-01"))
    {
        if let Some((node, _)) = g.iter().max_by_key(|(_, s)| *s) {
            *last_by_node.entry((*node).to_owned()).or_default() += 1;
        }
    }
    let total: u32 = last_by_node.values().sum();
    assert!(
        last_by_node.get("node-01").copied().unwrap_or(0) as f64 > 0.97 * total as f64,
        "{last_by_node:?}"
    );
}

#[test]
fn xids_are_reported_as_node_events_with_the_right_severity() {
    let yaml = format!(
        "{SMALL}faults: [{{step: 5, kind: xid, node: node-03, gpu: 2, code: 63}}, {{step: 50, kind: xid, node: node-01, gpu: 1, code: 79}}]\n"
    );
    let (sim, rec) = record(&yaml);
    let events: Vec<_> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.events.iter().map(move |e| (b.node.as_str(), e)))
        .collect();
    let warn: Vec<_> = events.iter().filter(|(_, e)| e.code == Some(63)).collect();
    let mut ids: Vec<u64> = warn.iter().map(|(_, e)| e.id).collect();
    ids.dedup();
    assert_eq!(
        ids.len(),
        1,
        "63 at step 5 only: the job stops at step 50 before it repeats at 55"
    );
    assert!(warn.iter().all(|(n, e)| *n == "node-03"
        && e.gpu_index == Some(2)
        && e.severity == EventSeverity::Warning as i32));
    let fatal: Vec<_> = events.iter().filter(|(_, e)| e.code == Some(79)).collect();
    assert_eq!(
        fatal.len(),
        3,
        "a fatal event is sent and repeated in the next two batches"
    );
    let (node, e) = fatal[0];
    assert_eq!(*node, "node-01");
    assert_eq!(e.severity, EventSeverity::Fatal as i32);
    assert!(
        e.message
            .starts_with(&format!("NVRM: Xid (PCI:{}): 79, pid=", e.pci_bus_id)),
        "{}",
        e.message
    );
    let f = &sim.faults()[1];
    assert_eq!((f.rank, f.gpu), (Some(5), Some(1)));
    // The GPU's rank stops: nothing it started completes after the XID.
    let xid_at = e.at_ns;
    assert!(
        collectives(&rec)
            .filter(|(_, c)| c.rank == 5)
            .all(|(_, c)| c.start_ns <= xid_at)
    );
}

#[test]
fn non_fatal_xids_repeat_every_fifty_steps() {
    let (_, rec) = record(&format!(
        "{SMALL}faults: [{{step: 2, kind: xid, node: node-00, gpu: 0, code: 92}}]\n"
    ));
    let mut ids: Vec<u64> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.events.iter())
        .filter(|e| e.code == Some(92))
        .map(|e| e.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2, "steps 2 and 52");
}

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let yaml = format!("{SMALL}faults: [{{step: 30, kind: crash, rank: 3}}]\n").replace(
        "clock_skew_ms: 0",
        "clock_skew_ms: 40, batch_drop_prob: 0.05",
    );
    let (_, a) = record(&yaml);
    let (_, b) = record(&yaml);
    assert_eq!(a.raw, b.raw);
    let (_, c) = record(&yaml.replace("seed: 11", "seed: 12"));
    assert_ne!(a.raw, c.raw);
}

#[test]
fn lost_batches_are_counted_and_critical_records_repeat() {
    let yaml = format!("{SMALL}faults: [{{step: 30, kind: crash, rank: 3}}]\n")
        .replace("clock_skew_ms: 0", "batch_drop_prob: 0.2");
    let (sim, rec) = record(&yaml);
    assert!(sim.dropped_batches() > 10);
    let gaps = rec
        .batches
        .iter()
        .filter(|(_, b)| b.heartbeat.as_ref().is_some_and(|h| h.failed_batches > 0))
        .count();
    assert!(gaps > 0);
    // Even with a fifth of batches lost, every rank's exit arrives.
    let mut dead: Vec<u32> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.processes.iter()))
        .filter(|p| !p.alive)
        .map(|p| p.rank)
        .collect();
    dead.sort_unstable();
    dead.dedup();
    // An exit is sent three times; two ranks of one node die together and share their
    // batches, so losing all three (0.8 % a node) loses both.
    assert!(dead.len() >= 14, "{} exits arrived: {dead:?}", dead.len());
}

#[test]
fn every_batch_that_arrives_says_where_each_member_stands() {
    // A third of the batches lost, checkpoints where everyone goes quiet: every batch a
    // node's agent delivers while the job runs holds a completion of each member it has
    // ever reported completing, as new as the newest reported, so no run of losses
    // hides where a quiet member stands, under each capture path.
    for capture in ["nccl", "torch"] {
        let yaml = format!("{SMALL}capture: {capture}\n")
            .replace("clock_skew_ms: 0", "batch_drop_prob: 0.33");
        let (sim, rec) = record(&yaml);
        assert!(sim.dropped_batches() > 50, "{capture}");
        // The ranks exit at the end (an exit ends its rank's repeats).
        let end = rec
            .batches
            .iter()
            .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.processes.iter()))
            .filter(|p| !p.alive)
            .map(|p| p.at_ns)
            .min()
            .unwrap_or(i64::MAX);
        let mut members: BTreeMap<&str, BTreeMap<(u64, u32), u64>> = BTreeMap::new();
        let mut checked = 0;
        for (_, b) in rec.batches.iter().filter(|(_, b)| b.sent_at_ns < end) {
            let Some(j) = b.jobs.first() else { continue };
            let known = members.entry(b.node.as_str()).or_default();
            for (&(comm, rank), &seq) in known.iter() {
                let newest = j
                    .collectives
                    .iter()
                    .filter(|c| c.comm == comm && c.rank == rank && !c.in_flight())
                    .map(|c| c.seq)
                    .max();
                assert!(
                    newest.is_some_and(|n| n >= seq),
                    "{capture}: {} at {:.2} s: rank {rank} of comm {comm:x} reported up to seq {seq} before, not in this batch",
                    b.node,
                    secs(b.sent_at_ns)
                );
                checked += 1;
            }
            for c in j.collectives.iter().filter(|c| !c.in_flight()) {
                let e = known.entry((c.comm, c.rank)).or_default();
                *e = (*e).max(c.seq);
            }
        }
        assert!(checked > 1000, "{capture}: {checked}");
    }
}

#[test]
fn during_a_checkpoint_nobody_is_inside_a_collective() {
    let (_, rec) = record(&SMALL.replace("hiccup_prob: 0.05", "hiccup_prob: 0"));
    let metrics: Vec<_> = rec
        .batches
        .iter()
        .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.metrics.iter()))
        .collect();
    // Checkpoints follow steps 19 and 39 (every 20 steps) and last about 5 s.
    for step in [19, 39] {
        let done = metrics
            .iter()
            .filter(|m| m.step == step)
            .map(|m| secs(m.at_ns))
            .fold(0.0, f64::max);
        let next = metrics
            .iter()
            .filter(|m| m.step == step + 1)
            .map(|m| secs(m.at_ns))
            .fold(f64::INFINITY, f64::min);
        assert!(
            next - done > 4.9,
            "step {} follows the checkpoint after {step}",
            step + 1
        );
        let inside: Vec<_> = rec
            .batches
            .iter()
            .filter(|(_, b)| {
                let t = secs(b.sent_at_ns);
                t > done + 0.01 && t < done + 4.5
            })
            .collect();
        assert!(inside.len() >= 8, "every agent flushes during the pause");
        for (_, b) in inside {
            assert!(
                b.jobs
                    .iter()
                    .all(|j| j.collectives.iter().all(|c| !c.in_flight())),
                "in-flight collective during the checkpoint after step {step}"
            );
        }
    }
}

#[test]
fn urgent_records_leave_at_once() {
    let (_, rec) = record(&format!(
        "{SMALL}faults: [{{step: 20, kind: nan, rank: 3}}, {{step: 40, kind: crash, rank: 9}}]\n"
    ));
    let mut first_sent: HashMap<(u32, i64, bool), i64> = HashMap::new();
    for (_, b) in &rec.batches {
        for j in &b.jobs {
            for m in &j.metrics {
                if m.loss.is_some_and(f64::is_nan) || m.grad_norm.is_some_and(f64::is_nan) {
                    first_sent
                        .entry((m.rank, m.at_ns, true))
                        .or_insert(b.sent_at_ns);
                }
            }
            for p in j.processes.iter().filter(|p| !p.alive) {
                first_sent
                    .entry((p.rank, p.at_ns, false))
                    .or_insert(b.sent_at_ns);
            }
        }
    }
    assert!(first_sent.len() > 16 * 20);
    for ((rank, at, _), sent) in &first_sent {
        let delay = secs(*sent) - secs(*at);
        assert!(
            (0.0..=0.021).contains(&delay),
            "rank {rank}: urgent record sent {delay} s late"
        );
    }
}

#[test]
fn a_checkpoint_is_complete_once_every_rank_saved_it_and_none_after_a_crash() {
    // A save every 20 steps; rank 5 dies in step 30, so the save after step 40 never
    // comes.
    let yaml = format!("{SMALL}faults: [{{step: 30, kind: crash, rank: 5}}]\n");
    let (sim, _) = record(&yaml);
    let checkpoints = sim.checkpoints();
    let steps: Vec<u64> = checkpoints.iter().map(|&(s, _)| s).collect();
    assert_eq!(steps, [20], "{checkpoints:?}");
    let ends = sim.step_ends();
    for &(step, saved) in &checkpoints {
        // The save starts once every rank finished the step and takes about 5 s.
        let ended = ends[step as usize - 1];
        assert!(
            (4.5..6.0).contains(&(saved - ended)),
            "checkpoint {step} saved {saved} after its step ended at {ended}"
        );
        // And the job goes on after it: the next step ends after the save.
        assert!(ends[step as usize] > saved);
    }
    // Without a fault, every save before the last step (60, where the job ends)
    // completes.
    let (clean, _) = record(SMALL);
    let steps: Vec<u64> = clean.checkpoints().iter().map(|&(s, _)| s).collect();
    assert_eq!(steps, [20, 40]);
}

#[test]
fn layers_split_a_step_into_as_many_tp_all_reduces_in_the_same_time() {
    let one = SMALL.replace("steps: 60", "steps: 12");
    let deep = one.replace("iteration_secs: 0.5}", "iteration_secs: 0.5, layers: 4}");
    assert_ne!(one, deep);
    let tp_seqs = |rec: &Recorder| {
        let tp: std::collections::HashSet<u64> = rec
            .batches
            .iter()
            .flat_map(|(_, b)| b.jobs.iter().flat_map(|j| j.comms.iter()))
            .filter(|c| c.name.contains("tp"))
            .map(|c| c.comm)
            .collect();
        assert_eq!(tp.len(), 8, "one TP communicator per TP group");
        let mut per_comm: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
        for (_, c) in collectives(rec) {
            if tp.contains(&c.comm) && !c.in_flight() {
                per_comm.entry(c.comm).or_default().insert(c.seq);
            }
        }
        per_comm
    };
    let last_end = |rec: &Recorder| collectives(rec).map(|(_, c)| c.end_ns).max().unwrap_or(0);
    let (_, shallow) = record(&one);
    let (_, layered) = record(&deep);
    for (layers, rec) in [(1u64, &shallow), (4, &layered)] {
        for (comm, seqs) in tp_seqs(rec) {
            let want: std::collections::BTreeSet<u64> = (1..=2 * layers * 12).collect();
            assert_eq!(seqs, want, "comm {comm:x} with {layers} layers");
        }
    }
    // The same compute and TP time, cut finer: the run ends at about the same moment.
    let (a, b) = (secs(last_end(&shallow)), secs(last_end(&layered)));
    assert!((b - a).abs() < 0.05 * a, "{a} s against {b} s");
}
