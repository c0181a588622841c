//! The public driving API: incremental advance, shared engines, and the report contract.

use warden_controller::SharedEngine;
use warden_engine::{Engine, EngineConfig, IncidentChange};
use warden_model::Timestamp;
use warden_sim::{RunOptions, SIM_EPOCH, Scenario, Simulation, Sink, run};

const YAML: &str = "
seed: 5
job: {name: api, nodes: 4, gpus_per_node: 4, parallelism: {tp: 4, pp: 1, dp: 4}, iteration_secs: 0.5}
noise: {clock_skew_ms: 20, batch_drop_prob: 0.05}
steps: 80
faults:
  - {step: 20, kind: nan, rank: 6}
  - {step: 60, kind: hang, rank: 9}
";

#[derive(Default)]
struct Log {
    deliveries: Vec<(Timestamp, Vec<u8>)>,
    ticks: Vec<Timestamp>,
}

impl Sink for Log {
    fn deliver(&mut self, body: &[u8], now: Timestamp) {
        self.deliveries.push((now, body.to_vec()));
    }

    fn tick(&mut self, now: Timestamp) -> Vec<IncidentChange> {
        self.ticks.push(now);
        vec![]
    }
}

fn scenario() -> Scenario {
    Scenario::from_yaml(YAML, "api").expect("valid")
}

#[test]
fn advancing_in_slices_delivers_exactly_what_one_run_does() {
    let mut whole = Log::default();
    let mut a = Simulation::new(&scenario(), RunOptions::default());
    a.run_to_end(&mut whole);

    let mut sliced = Log::default();
    let mut b = Simulation::new(&scenario(), RunOptions::default());
    let mut last = b.progress();
    let mut t = 0.0;
    while !b.done() {
        t += 0.37;
        b.advance(&mut sliced, t);
        let p = b.progress();
        assert!(
            p.sim_seconds >= last.sim_seconds && p.batches >= last.batches && p.step >= last.step
        );
        assert!(p.sim_seconds <= t + 1e-9);
        last = p;
    }
    assert_eq!(whole.deliveries, sliced.deliveries);
    assert_eq!(whole.ticks, sliced.ticks);
    assert_eq!(a.faults(), b.faults());
    // Deliveries and ticks are in time order, ticks on the tick grid.
    assert!(whole.deliveries.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(
        whole
            .ticks
            .windows(2)
            .all(|w| (w[1].secs_since(w[0]) - 0.25).abs() < 1e-6)
    );
    assert!(whole.ticks.iter().all(|t| *t > SIM_EPOCH));
}

#[test]
fn faults_appear_once_they_take_effect() {
    let mut sim = Simulation::new(&scenario(), RunOptions::default());
    let mut log = Log::default();
    sim.advance(&mut log, 5.0);
    assert!(sim.faults().is_empty());
    assert_eq!(sim.progress().ranks, 16);
    assert_eq!(sim.progress().steps, 80);
    sim.run_to_end(&mut log);
    let f = sim.faults();
    assert_eq!(f.len(), 2);
    assert_eq!(
        (f[0].kind.as_str(), f[0].rank, f[0].node.as_str()),
        ("nan", Some(6), "node-01")
    );
    assert_eq!(
        (f[1].kind.as_str(), f[1].rank, f[1].gpu),
        ("hang", Some(9), Some(1))
    );
    assert!(f[0].onset_s < f[1].onset_s);
    assert!(f[1].last_progress_s.is_some() && f[0].last_progress_s.is_none());
    assert!(sim.progress().sim_seconds >= f[1].onset_s + 30.0 - 1e-3);
}

#[test]
fn a_shared_engine_is_driven_like_an_owned_one() {
    let shared = SharedEngine::new(Engine::new(EngineConfig::default(), SIM_EPOCH));
    let mut sink = shared.engine();
    let mut sim = Simulation::new(&scenario(), RunOptions::default());
    sim.run_to_end(&mut sink);
    let engine = shared.lock();
    let stats = engine.stats();
    assert_eq!(stats.batches, sim.progress().batches);
    assert!(stats.rejected.is_empty(), "{:?}", stats.rejected);
    assert!(stats.ticks > 0);
}

#[test]
fn the_report_has_the_documented_shape() {
    let report = run(&scenario(), RunOptions::default());
    let json = serde_json::to_value(&report).expect("serializes");
    for key in [
        "scenario",
        "ranks",
        "sim_seconds",
        "wall_seconds",
        "faults",
        "incidents",
        "iteration_secs",
        "step_ends_s",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["scenario"], "api");
    assert_eq!(json["ranks"], 16);
    let fault = &json["faults"][1];
    for key in ["kind", "rank", "node", "step", "onset_s", "last_progress_s"] {
        assert!(fault.get(key).is_some(), "fault lacks {key}: {fault}");
    }
    assert_eq!(
        report.step_ends_s.len(),
        60,
        "steps 0..59 completed before the hang"
    );
    assert!(report.step_ends_s.windows(2).all(|w| w[0] < w[1]));
    let back: warden_sim::Report = serde_json::from_value(json).expect("round trips");
    assert_eq!(back.faults, report.faults);
}
