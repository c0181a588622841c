//! The per-node cooldown and the rate limit of remediation, in process with a manual
//! clock: the engine opens incidents from real batches, the remediation loop decides
//! them, and the rails hold where they should, saying so on the incidents' timelines;
//! the exits of a job remediation restarts are not a crash, unless the restart failed.

use std::sync::Arc;
use std::time::Duration;

use warden_controller::SharedEngine;
use warden_controller::remedy::run::{ActuatorKind, BreakerConfig, Remediator, RemedyConfig};
use warden_controller::remedy::script::ScriptConfig;
use warden_controller::store::Store;
use warden_engine::{Engine, EngineConfig, ManualClock};
use warden_model::wire::{
    Batch, EventSeverity, Heartbeat, JobSignals, NodeEvent, NodeEventKind, ProcessState, RankInfo,
};
use warden_model::{IncidentKind, Timestamp};

const T0: i64 = 1_800_000_000_000_000_000;

fn batch(node: &str, seq: u64, at: i64, xid: bool) -> Batch {
    Batch {
        version: 0,
        node: node.into(),
        agent_id: format!("agent-{node}"),
        boot_id: "boot-1".into(),
        seq,
        sent_at_ns: at,
        jobs: vec![],
        gpus: vec![],
        events: if xid {
            vec![NodeEvent {
                id: seq,
                at_ns: at,
                kind: NodeEventKind::Xid as i32,
                severity: EventSeverity::Fatal as i32,
                gpu_index: Some(0),
                pci_bus_id: "0000:3b:00".into(),
                code: Some(79),
                message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
                count: 1,
            }]
        } else {
            vec![]
        },
        heartbeat: Some(Heartbeat::default()),
    }
}

struct World {
    engine: SharedEngine,
    remedy: Remediator,
    store: Store,
    clock: Arc<ManualClock>,
    seq: u64,
}

impl World {
    async fn new(config: RemedyConfig) -> World {
        let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp(T0)));
        let clock = Arc::new(ManualClock::new(Timestamp(T0)));
        let store = Store::memory().await.expect("store");
        let remedy = Remediator::new(config, engine.clone(), store.clone(), None, clock.clone())
            .await
            .expect("remediation");
        let mut w = World {
            engine,
            remedy,
            store,
            clock,
            seq: 0,
        };
        for i in 0..20 {
            w.send(&format!("node-{i}"), false);
        }
        w
    }

    fn send(&mut self, node: &str, xid: bool) {
        self.seq += 1;
        let now = self.clock.now_ts();
        self.apply(batch(node, self.seq, now.0, xid), xid);
    }

    /// [`World::send`] from a node where rank `rank` of job `job` runs on GPU 0.
    fn send_rank(&mut self, node: &str, xid: bool, job: &str, rank: u32) {
        self.seq += 1;
        let now = self.clock.now_ts();
        let mut b = batch(node, self.seq, now.0, xid);
        b.jobs.push(JobSignals {
            job: job.into(),
            ranks: vec![RankInfo {
                rank,
                world_size: 2,
                pid: 1000 + rank,
                gpu_index: Some(0),
                gpu_uuid: String::new(),
            }],
            ..JobSignals::default()
        });
        self.apply(b, xid);
    }

    fn apply(&mut self, b: Batch, xid: bool) {
        let now = self.clock.now_ts();
        let applied = self.engine.lock().apply(b, now);
        assert!(applied > 0 || !xid, "the batch was applied");
    }

    fn timeline_of(&self, node: &str) -> Vec<String> {
        let e = self.engine.lock();
        let inc = e
            .incidents()
            .iter()
            .rev()
            .find(|i| i.nodes.iter().any(|n| n == node))
            .expect("an incident on the node");
        inc.timeline.iter().map(|t| t.what.clone()).collect()
    }

    /// A fatal XID on `node`, a detector pass, a remediation pass; the timeline of the
    /// incident it opened or updated.
    async fn fault(&mut self, node: &str) -> Vec<String> {
        self.send(node, true);
        let now = self.clock.now_ts();
        self.engine.lock().tick(now);
        self.remedy.pass(now).await.expect("pass");
        self.timeline_of(node)
    }

    fn advance(&self, secs: f64) {
        self.clock.set(self.clock.now_ts().plus_secs(secs));
    }
}

trait NowTs {
    fn now_ts(&self) -> Timestamp;
}

impl NowTs for ManualClock {
    fn now_ts(&self) -> Timestamp {
        use warden_engine::Clock;
        self.now()
    }
}

fn acting() -> RemedyConfig {
    RemedyConfig {
        dry_run: false,
        breaker: BreakerConfig {
            max_nodes: 100,
            max_percent: 100.0,
            window: Duration::from_secs(60),
        },
        ..RemedyConfig::default()
    }
}

#[tokio::test]
async fn a_node_is_not_isolated_again_within_its_cooldown() {
    let mut w = World::new(RemedyConfig {
        node_cooldown: Duration::from_secs(1800),
        ..acting()
    })
    .await;
    let first = w.fault("node-3").await;
    assert!(first.iter().any(|l| l == "drain node-3: done"), "{first:?}");
    // The first incident is over; past the breaker's window (the isolation no longer
    // counts there) and the reopen window, but within the cooldown: a new fault on the
    // same node is a new incident.
    let first_id = w.engine.lock().incidents()[0].id.clone();
    let now = w.clock.now_ts();
    w.engine
        .lock()
        .resolve_incident(&first_id, "test", "GPU reseated", now)
        .expect("resolve");
    w.advance(900.0);
    for i in 0..20 {
        w.send(&format!("node-{i}"), false);
    }
    w.engine.lock().tick(w.clock.now_ts());
    let second = w.fault("node-3").await;
    assert_ne!(
        w.engine.lock().incidents().last().map(|i| i.id.clone()),
        Some(first_id)
    );
    assert!(
        second
            .iter()
            .any(|l| l == "drain node-3 not done: the node is in its cooldown"),
        "{second:?}"
    );
    // Another node is not held back by node-3's cooldown.
    let other = w.fault("node-4").await;
    assert!(other.iter().any(|l| l == "drain node-4: done"), "{other:?}");
}

#[tokio::test]
async fn a_pass_that_only_decides_or_pretends_reports_no_incident_acted_on() {
    // A dry run records what it would do and does nothing: no incident is acted on.
    let mut w = World::new(RemedyConfig {
        dry_run: true,
        ..acting()
    })
    .await;
    w.send("node-5", true);
    let now = w.clock.now_ts();
    w.engine.lock().tick(now);
    let report = w.remedy.pass(now).await.expect("pass");
    assert!(report.actions > 0, "the dry run records its actions");
    assert!(!report.changes.is_empty(), "and notes them on the incident");
    assert_eq!(report.acted, Vec::<String>::new());
    // Acting, the same fault is acted on.
    let mut w = World::new(acting()).await;
    w.send("node-5", true);
    let now = w.clock.now_ts();
    w.engine.lock().tick(now);
    let report = w.remedy.pass(now).await.expect("pass");
    assert_eq!(report.acted.len(), 1, "{report:?}");
}

#[tokio::test]
async fn the_rate_limit_stops_isolations_past_the_hourly_budget() {
    let mut w = World::new(RemedyConfig {
        max_actions_per_hour: 2,
        ..acting()
    })
    .await;
    for node in ["node-1", "node-2"] {
        let t = w.fault(node).await;
        assert!(
            t.iter().any(|l| *l == format!("drain {node}: done")),
            "{t:?}"
        );
    }
    let third = w.fault("node-5").await;
    assert!(
        third
            .iter()
            .any(|l| l == "drain node-5 not done: the rate limit (2 actions per hour) is reached"),
        "{third:?}"
    );
    let status = w.remedy.status(w.clock.now_ts()).await;
    assert_eq!(status.isolated_in_window, 2);
    assert!(!status.tripped, "the rate limit is not the breaker");
}

#[tokio::test]
async fn faults_on_two_nodes_of_one_job_restart_it_once_without_both() {
    let mut w = World::new(acting()).await;
    for (node, rank) in [("node-1", 0), ("node-2", 1)] {
        w.send_rank(node, false, "train", rank);
    }
    w.engine.lock().tick(w.clock.now_ts());
    w.advance(1.0);
    // Both GPUs fall off the bus before the next pass.
    for (node, rank) in [("node-1", 0), ("node-2", 1)] {
        w.send_rank(node, true, "train", rank);
    }
    let now = w.clock.now_ts();
    w.engine.lock().tick(now);
    let report = w.remedy.pass(now).await.expect("pass");

    // Both incidents were acted on (one drain each, the restart on the first), which
    // the pass reports, so that a reader can tell an action from a notification.
    let mut acted = report.acted.clone();
    acted.sort();
    let mut ids: Vec<String> = w
        .engine
        .lock()
        .incidents()
        .iter()
        .map(|i| i.id.clone())
        .collect();
    ids.sort();
    assert_eq!(acted, ids);

    let jobs: Vec<Option<String>> = w
        .engine
        .lock()
        .incidents()
        .iter()
        .map(|i| i.job.clone())
        .collect();
    assert_eq!(jobs, [Some("train".to_owned()), Some("train".to_owned())]);
    let (first, second) = (w.timeline_of("node-1"), w.timeline_of("node-2"));
    let all: Vec<&String> = first.iter().chain(&second).collect();
    let restarted: Vec<&&String> = all
        .iter()
        .filter(|l| l.starts_with("restart of job train requested from"))
        .collect();
    assert_eq!(restarted.len(), 1, "{all:?}");
    assert!(restarted[0].ends_with("without node-1, node-2"), "{all:?}");
    assert!(
        all.iter()
            .any(|l| l.starts_with("restart of job train requested once, with incident ")),
        "{all:?}"
    );
    let actions = w.store.actions(None, None, 0).await.expect("actions");
    let kinds: Vec<&str> = actions.iter().map(|a| a.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "restart").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "isolate").count(),
        2,
        "{kinds:?}"
    );
}

/// A batch from `node` saying rank `rank` of `job` exited with SIGTERM at `at`.
fn exit_batch(node: &str, seq: u64, at: i64, job: &str, rank: u32) -> Batch {
    let mut b = batch(node, seq, at, false);
    b.jobs.push(JobSignals {
        job: job.into(),
        processes: vec![ProcessState {
            rank,
            pid: 1000 + rank,
            at_ns: at,
            alive: false,
            exit_code: None,
            signal: Some(15),
            stopped: false,
            from_log: false,
        }],
        ..JobSignals::default()
    });
    b
}

/// The ranks of `job` on node-1 and node-2, a fatal XID on node-1, and the remediation
/// pass that restarts the job; then the rank on node-2 exits with SIGTERM. Whether a
/// crash incident opens for that exit.
async fn exits_after_a_restart_are_a_crash(config: RemedyConfig) -> bool {
    let mut w = World::new(config).await;
    for (node, rank) in [("node-1", 0), ("node-2", 1)] {
        w.send_rank(node, false, "train", rank);
    }
    w.engine.lock().tick(w.clock.now_ts());
    w.advance(1.0);
    w.send_rank("node-1", true, "train", 0);
    let now = w.clock.now_ts();
    w.engine.lock().tick(now);
    w.remedy.pass(now).await.expect("pass");
    // The rank on the healthy node is stopped (a crash there would not be the GPU
    // fault's consequence).
    w.advance(0.5);
    w.seq += 1;
    let at = w.clock.now_ts();
    let b = exit_batch("node-2", w.seq, at.0, "train", 1);
    w.apply(b, false);
    w.advance(3.0);
    w.send("node-1", false);
    w.send("node-2", false);
    w.engine.lock().tick(w.clock.now_ts());
    let e = w.engine.lock();
    e.incidents().iter().any(|i| i.kind == IncidentKind::Crash)
}

#[tokio::test]
async fn the_exits_of_a_restart_are_no_crash_unless_the_restart_failed() {
    // Restart requested (actuator none records it): the exits that follow are it.
    assert!(!exits_after_a_restart_are_a_crash(acting()).await);
    // A restart the actuator could not do leaves the job running: its exits are a
    // crash again.
    let failing = RemedyConfig {
        actuator: ActuatorKind::Script,
        script: Some(ScriptConfig {
            program: "/bin/false".into(),
            args: vec![],
            timeout_secs: 10,
        }),
        ..acting()
    };
    assert!(exits_after_a_restart_are_a_crash(failing).await);
}
