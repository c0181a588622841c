//! The per-node cooldown and the rate limit of remediation, in process with a manual
//! clock: the engine opens incidents from real batches, the remediation loop decides
//! them, and the rails hold where they should, saying so on the incidents' timelines.

use std::sync::Arc;
use std::time::Duration;

use warden_controller::remedy::run::{BreakerConfig, Remediator, RemedyConfig};
use warden_controller::store::Store;
use warden_controller::{Engine, EngineConfig, ManualClock, SharedEngine};
use warden_model::Timestamp;
use warden_model::wire::{Batch, EventSeverity, Heartbeat, NodeEvent, NodeEventKind};

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
    clock: Arc<ManualClock>,
    seq: u64,
}

impl World {
    async fn new(config: RemedyConfig) -> World {
        let engine = SharedEngine::new(Engine::new(EngineConfig::default(), Timestamp(T0)));
        let clock = Arc::new(ManualClock::new(Timestamp(T0)));
        let store = Store::memory().await.expect("store");
        let remedy = Remediator::new(config, engine.clone(), store, None, clock.clone())
            .await
            .expect("remediation");
        let mut w = World {
            engine,
            remedy,
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
        let applied = self
            .engine
            .lock()
            .apply(batch(node, self.seq, now.0, xid), now);
        assert!(applied > 0 || !xid, "the batch was applied");
    }

    /// A fatal XID on `node`, a detector pass, a remediation pass; the timeline of the
    /// incident it opened or updated.
    async fn fault(&mut self, node: &str) -> Vec<String> {
        self.send(node, true);
        let now = self.clock.now_ts();
        self.engine.lock().tick(now);
        self.remedy.pass(now).await.expect("pass");
        let e = self.engine.lock();
        let inc = e
            .incidents()
            .iter()
            .rev()
            .find(|i| i.nodes.iter().any(|n| n == node))
            .expect("an incident on the node");
        inc.timeline.iter().map(|t| t.what.clone()).collect()
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
        use warden_controller::Clock;
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
    assert!(
        first.iter().any(|l| l == "drain node-3: already so"),
        "{first:?}"
    );
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
    assert!(
        other.iter().any(|l| l == "drain node-4: already so"),
        "{other:?}"
    );
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
            t.iter().any(|l| *l == format!("drain {node}: already so")),
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
