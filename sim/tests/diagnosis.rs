//! Incidents found in a simulated run are diagnosed by the controller's diagnosis worker:
//! logs pulled from the culprit node's agent where one answers, the controller's held
//! lines where none does; the answer lands on the incident without touching its culprit.

use std::path::Path;
use std::sync::Arc;

use warden_controller::SharedEngine;
use warden_controller::diagnosis::{
    self, AgentLine, Diagnoser, DiagnosisConfig, FetchError, FetchFuture, LogSource, WindowRequest,
};
use warden_diagnosis::rules::RuleSet;
use warden_engine::{Engine, EngineConfig, IncidentChange, ManualClock};
use warden_model::{IncidentKind, IncidentState};
use warden_sim::{RunOptions, SIM_EPOCH, Scenario, Simulation};
use warden_testkit::{PATIENCE, wait_for_async};

/// Agents that answer for some nodes only; the others are unreachable.
#[derive(Debug)]
struct Agents {
    answering: Vec<(String, Vec<String>)>,
    asked: std::sync::Mutex<Vec<String>>,
}

impl LogSource for Agents {
    fn window<'a>(&'a self, node: &'a str, req: &'a WindowRequest) -> FetchFuture<'a> {
        Box::pin(async move {
            self.asked.lock().expect("lock").push(node.to_owned());
            match self.answering.iter().find(|(n, _)| n == node) {
                Some((_, lines)) => Ok(lines
                    .iter()
                    .enumerate()
                    .map(|(i, text)| AgentLine {
                        at_ns: req.around_ns - 1_000_000_000 + i as i64,
                        rank: None,
                        text: text.clone(),
                    })
                    .collect()),
                None => Err(FetchError::Transport("connection refused".into())),
            }
        })
    }
}

/// Run a shipped scenario into a shared engine; every change it produced.
fn run(file: &str) -> (SharedEngine, Vec<IncidentChange>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(file);
    let scenario = Scenario::load(&path).expect("shipped scenario loads");
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), SIM_EPOCH));
    let mut sink = engine.engine();
    let mut sim = Simulation::new(&scenario, RunOptions::default());
    let changes = sim.run_to_end(&mut sink);
    (engine, changes)
}

/// Queue every opened incident and wait until each carries a diagnosis.
fn diagnose_all(engine: &SharedEngine, changes: &[IncidentChange], agents: Arc<Agents>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rules = Arc::new(RuleSet::builtin().expect("shipped rules"));
    let diagnoser = Arc::new(Diagnoser::new(
        DiagnosisConfig::default(),
        rules,
        agents,
        None,
    ));
    let clock = Arc::new(ManualClock::new(SIM_EPOCH));
    runtime.block_on(async {
        let queue = diagnosis::start(diagnoser, engine.clone(), clock, None);
        queue.submit_opened(changes);
        wait_for_async("every incident diagnosed", PATIENCE, || {
            let done = engine
                .lock()
                .incidents()
                .iter()
                .all(|i| i.diagnosis.is_some());
            async move { done.then_some(()) }
        })
        .await;
    });
}

#[test]
fn gpu_faults_are_diagnosed_from_the_culprit_nodes_agent_and_held_lines() {
    let (engine, changes) = run("mixed-xid-fatal.yaml");
    let agents = Arc::new(Agents {
        answering: vec![(
            "node-100".to_owned(),
            vec![
                "[INFO] iteration 299 done".to_owned(),
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
                    .to_owned(),
            ],
        )],
        asked: std::sync::Mutex::new(Vec::new()),
    });
    diagnose_all(&engine, &changes, agents.clone());
    let e = engine.lock();
    let faults: Vec<_> = e
        .incidents()
        .iter()
        .filter(|i| i.kind == IncidentKind::GpuFault)
        .collect();
    assert_eq!(faults.len(), 2, "{:#?}", e.incidents());
    for inc in faults {
        let d = inc.diagnosis.as_ref().expect("diagnosed");
        let node = inc.nodes.first().expect("a culprit node");
        // The detectors' culprit stays; the logs agree on the node.
        assert_eq!(inc.gpus.len(), 1);
        assert!(
            d.evidence.iter().any(|e| e.node.as_ref() == Some(node)),
            "{d:#?}"
        );
        match node.as_str() {
            // Its agent answered: the window was read.
            "node-100" => {
                assert_eq!(d.nodes_read, vec!["node-100".to_owned()]);
                assert_eq!(d.category.as_deref(), Some("gpu_hardware_xid"), "{d:#?}");
            }
            // No agent: the kernel-log line of the event the controller holds.
            "node-003" => {
                assert!(d.nodes_read.is_empty());
                assert_eq!(d.category.as_deref(), Some("ecc_memory_error"), "{d:#?}");
            }
            other => panic!("unexpected culprit node {other}"),
        }
        assert!(
            inc.timeline
                .iter()
                .any(|t| t.what.starts_with("diagnosed (rules)")),
            "{:?}",
            inc.timeline
        );
        assert!(matches!(
            inc.state,
            IncidentState::Diagnosed | IncidentState::Resolved
        ));
    }
    assert!(
        agents
            .asked
            .lock()
            .expect("lock")
            .iter()
            .any(|n| n == "node-003"),
        "the unreachable culprit node was asked"
    );
}

#[test]
fn a_crash_is_diagnosed_from_the_lines_its_rank_shipped() {
    let (engine, changes) = run("crash-small-fast.yaml");
    let agents = Arc::new(Agents {
        answering: vec![],
        asked: std::sync::Mutex::new(Vec::new()),
    });
    diagnose_all(&engine, &changes, agents);
    let e = engine.lock();
    let crash = e
        .incidents()
        .iter()
        .find(|i| i.kind == IncidentKind::Crash)
        .expect("a crash incident");
    let d = crash.diagnosis.as_ref().expect("diagnosed");
    assert!(
        matches!(
            d.category.as_deref(),
            Some("segfault_native_crash" | "cuda_runtime_error")
        ),
        "{d:#?}"
    );
    assert!(
        d.ranks.contains(&7) || d.evidence.iter().any(|e| e.rank == Some(7)),
        "{d:#?}"
    );
}
