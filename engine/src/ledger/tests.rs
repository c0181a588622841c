//! Ledger tests: each attribution rule, the verification cycle, the window, bounds.

use warden_model::{
    Evidence, GpuRef, Incident, IncidentDiagnosis, IncidentKind, IncidentState, Severity, Timestamp,
};

use super::*;

const HOUR: f64 = 3_600.0;

fn at(hours: f64) -> Timestamp {
    Timestamp::from_secs_f64(1_000_000.0 + hours * HOUR)
}

fn incident(id: &str, kind: IncidentKind, node: &str, gpu: u32, summary: &str, h: f64) -> Incident {
    Incident {
        id: id.into(),
        kind,
        job: None,
        state: IncidentState::Open,
        acknowledged: false,
        severity: Severity::Critical,
        ranks: vec![1],
        nodes: vec![node.into()],
        gpus: vec![GpuRef {
            node: node.into(),
            index: gpu,
        }],
        onset: at(h),
        detected_at: at(h),
        updated_at: at(h),
        resolved_at: None,
        confidence: 0.95,
        summary: summary.into(),
        evidence: vec![],
        finding_count: 1,
        timeline: vec![],
        diagnosis: None,
    }
}

fn xid(id: &str, node: &str, gpu: u32, code: u32, h: f64) -> Incident {
    incident(
        id,
        IncidentKind::GpuFault,
        node,
        gpu,
        &format!("GPU {gpu} on {node} reported XID {code}"),
        h,
    )
}

fn running(job: &str) -> JobContext {
    JobContext {
        job: Some(job.into()),
        phase: JobPhase::Running,
    }
}

fn tearing_down(job: &str) -> JobContext {
    JobContext {
        job: Some(job.into()),
        phase: JobPhase::TearingDown,
    }
}

#[test]
fn a_fatal_xid_quarantines_its_node_at_once() {
    let mut l = Ledger::default();
    let t = l.observe(&xid("i1", "node-3", 2, 79, 0.0), &running("a"), at(0.0));
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].0, "node-3");
    assert_eq!(t[0].1.to, HealthState::Quarantined);
    assert!(t[0].1.reason.contains("XID 79"), "{}", t[0].1.reason);
    assert!(t[0].1.reason.contains("GPU 2"), "{}", t[0].1.reason);
    assert_eq!(t[0].1.incidents, vec!["i1".to_owned()]);
    assert_eq!(l.held_out(), ["node-3".to_owned()].into());
    assert_eq!(l.to_verify(), vec!["node-3".to_owned()]);
    // The same incident seen again changes nothing.
    assert!(
        l.observe(&xid("i1", "node-3", 2, 79, 0.0), &running("a"), at(0.1))
            .is_empty()
    );
    assert_eq!(l.node("node-3").map(|n| n.incidents), Some(1));
}

#[test]
fn application_xids_during_teardown_count_against_the_job() {
    let mut l = Ledger::default();
    for (i, code) in [45, 43, 13, 45, 31, 45].into_iter().enumerate() {
        let id = format!("i{i}");
        let t = l.observe(
            &xid(&id, "node-1", 0, code, i as f64),
            &tearing_down(&format!("job-{i}")),
            at(i as f64),
        );
        assert!(t.is_empty(), "XID {code} at teardown moved the node: {t:?}");
    }
    let n = l.node("node-1").expect("recorded");
    assert_eq!(n.state, HealthState::Healthy);
    assert_eq!(n.incidents, 0, "none held against the node");
    assert_eq!(n.marks.len(), 6, "all kept for the record");
    assert!(n.marks.iter().all(|m| m.weight == Weight::Job));
    assert!(
        n.marks[0].why.contains("tearing down"),
        "{}",
        n.marks[0].why
    );
}

#[test]
fn application_xids_mid_run_make_a_node_suspect_never_quarantined() {
    let mut l = Ledger::default();
    let mut moved = Vec::new();
    for i in 0..10 {
        let job = format!("job-{}", i % 3);
        moved.extend(l.observe(
            &xid(&format!("i{i}"), "node-1", 0, 13, f64::from(i)),
            &running(&job),
            at(f64::from(i)),
        ));
    }
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0].1.to, HealthState::Suspect);
    assert!(
        moved[0].1.reason.contains("application"),
        "{}",
        moved[0].1.reason
    );
    assert!(l.held_out().is_empty());
}

#[test]
fn a_fatal_xid_during_teardown_still_quarantines() {
    let mut l = Ledger::default();
    let t = l.observe(
        &xid("i1", "node-2", 5, 79, 0.0),
        &tearing_down("a"),
        at(0.0),
    );
    assert_eq!(t[0].1.to, HealthState::Quarantined);
}

#[test]
fn three_hardware_events_on_one_gpu_within_the_window_quarantine() {
    let mut l = Ledger::default();
    let job = running("pretrain-1");
    let t = l.observe(&xid("i1", "node-4", 1, 63, 0.0), &job, at(0.0));
    assert_eq!(t[0].1.to, HealthState::Suspect);
    // Another GPU of the node is another count.
    assert!(
        l.observe(&xid("i2", "node-4", 6, 63, 10.0), &job, at(10.0))
            .is_empty()
    );
    assert!(
        l.observe(&xid("i3", "node-4", 1, 92, 20.0), &job, at(20.0))
            .is_empty()
    );
    let t = l.observe(&xid("i4", "node-4", 1, 63, 30.0), &job, at(30.0));
    assert_eq!(t[0].1.to, HealthState::Quarantined);
    assert!(
        t[0].1.reason.contains("3 hardware events on GPU 1"),
        "{}",
        t[0].1.reason
    );
    assert_eq!(t[0].1.incidents, vec!["i1", "i3", "i4"]);
}

#[test]
fn one_incident_that_folds_three_events_counts_three() {
    let mut l = Ledger::default();
    let mut inc = xid("i1", "node-4", 1, 63, 0.0);
    let t = l.observe(&inc, &running("a"), at(0.0));
    assert_eq!(t[0].1.to, HealthState::Suspect);
    inc.evidence.push(Evidence {
        at: at(0.5),
        text: "XID 63 (row remapping or page retirement recorded) seen 3 time(s)".into(),
    });
    let t = l.observe(&inc, &running("a"), at(0.5));
    assert_eq!(t[0].1.to, HealthState::Quarantined);
}

#[test]
fn evidence_older_than_the_window_does_not_count() {
    let mut l = Ledger::default();
    let day = 24.0;
    l.observe(&xid("i1", "node-4", 1, 63, 0.0), &running("a"), at(0.0));
    l.observe(
        &xid("i2", "node-4", 1, 63, 3.0 * day),
        &running("b"),
        at(3.0 * day),
    );
    // Eight days after the first: two inside the window, not three.
    let t = l.observe(
        &xid("i3", "node-4", 1, 63, 8.0 * day),
        &running("c"),
        at(8.0 * day),
    );
    assert!(t.is_empty(), "{t:?}");
    assert_eq!(l.state("node-4"), HealthState::Suspect);
    // Quiet for a whole window: healthy again.
    let t = l.tick(at(16.0 * day));
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].1.to, HealthState::Healthy);
}

#[test]
fn hangs_pinned_on_one_gpu_quarantine_only_across_jobs() {
    let mut l = Ledger::default();
    let hang = |id: &str, h: f64| {
        incident(
            id,
            IncidentKind::Hang,
            "node-8",
            3,
            "rank 5 stopped inside allreduce",
            h,
        )
    };
    // One program hanging on the same GPU again and again is the program's pattern.
    for i in 0..5 {
        let h = f64::from(i);
        l.observe(&hang(&format!("h{i}"), h), &running("a"), at(h));
    }
    assert_eq!(l.state("node-8"), HealthState::Suspect);
    // The third job to hang there.
    let t = l.observe(&hang("h9", 9.0), &running("b"), at(9.0));
    assert_eq!(t[0].1.to, HealthState::Quarantined);
    assert!(
        t[0].1.reason.contains("2 different jobs"),
        "{}",
        t[0].1.reason
    );
}

#[test]
fn a_hang_the_logs_put_on_the_program_is_the_jobs() {
    let mut l = Ledger::default();
    let mut hang = incident("h1", IncidentKind::Hang, "node-8", 3, "rank 5 stopped", 0.0);
    hang.diagnosis = Some(IncidentDiagnosis {
        fault_locus: Some("user-code".into()),
        source: "rules".into(),
        ..IncidentDiagnosis::default()
    });
    assert!(l.observe(&hang, &running("a"), at(0.0)).is_empty());
    assert_eq!(
        l.node("node-8").map(|n| n.marks[0].weight),
        Some(Weight::Job)
    );
}

#[test]
fn nans_on_one_gpu_under_two_jobs_are_suspected_silent_data_corruption() {
    let mut l = Ledger::default();
    let nan =
        |id: &str, h: f64| incident(id, IncidentKind::Nan, "node-40", 1, "rank 9 NaN loss", h);
    let t = l.observe(&nan("n1", 0.0), &running("pretrain-1"), at(0.0));
    assert_eq!(t[0].1.to, HealthState::Suspect);
    // The same job again (its rerun before it moved) is still one job.
    assert!(
        l.observe(&nan("n2", 1.0), &running("pretrain-1"), at(1.0))
            .is_empty()
    );
    let t = l.observe(&nan("n3", 30.0), &running("ft-7"), at(30.0));
    assert_eq!(t[0].1.to, HealthState::Quarantined);
    assert!(
        t[0].1.reason.contains("silent data corruption"),
        "{}",
        t[0].1.reason
    );
    // A NaN every rank computed names no GPU and holds nothing against any node.
    let mut all = nan("n4", 31.0);
    all.gpus.clear();
    all.nodes.clear();
    assert!(l.observe(&all, &running("x"), at(31.0)).is_empty());
}

#[test]
fn verification_returns_a_healthy_node_and_marks_a_failing_one_bad() {
    let mut l = Ledger::default();
    for (node, id) in [("node-1", "a"), ("node-2", "b")] {
        l.observe(&xid(id, node, 0, 79, 0.0), &running("j"), at(0.0));
    }
    assert_eq!(
        l.verified("node-1", true, "too early", at(0.1)),
        Err(LedgerError::WrongState {
            node: "node-1".into(),
            state: "quarantined",
            wanted: "verifying",
        })
    );
    for n in ["node-1", "node-2"] {
        assert_eq!(
            l.verifying(n, "slurm job 77", at(0.2)).map(|t| t.to),
            Ok(HealthState::Verifying)
        );
    }
    assert!(l.held_out().contains("node-1"), "held out while verifying");
    let t = l
        .verified("node-1", true, "dcgmi diag -r 2 passed", at(0.5))
        .expect("ok");
    assert_eq!(t.to, HealthState::Returned);
    assert!(t.reason.contains("passed"), "{}", t.reason);
    let t = l.verified("node-2", false, "exit 1", at(0.5)).expect("ok");
    assert_eq!(t.to, HealthState::Bad);
    assert_eq!(l.held_out(), ["node-2".to_owned()].into());
    // A returned node's earlier evidence is cleared: one new warning makes it suspect,
    // not quarantined.
    let t = l.observe(&xid("c", "node-1", 0, 63, 1.0), &running("k"), at(1.0));
    assert_eq!(t[0].1.to, HealthState::Suspect);
    // Bad stays bad whatever comes, until a person decides.
    assert!(
        l.observe(&xid("d", "node-2", 0, 79, 2.0), &running("k"), at(2.0))
            .is_empty()
    );
    assert_eq!(l.state("node-2"), HealthState::Bad);
    let t = l.decide("node-2", false, "alice", "GPU replaced", at(3.0));
    assert_eq!(t.to, HealthState::Returned);
    assert!(t.reason.contains("alice"), "{}", t.reason);
    let hist: Vec<HealthState> = l
        .node("node-2")
        .expect("node")
        .history
        .iter()
        .map(|t| t.to)
        .collect();
    assert_eq!(
        hist,
        vec![
            HealthState::Quarantined,
            HealthState::Verifying,
            HealthState::Bad,
            HealthState::Returned
        ]
    );
    assert_eq!(
        l.verifying("node-9", "x", at(3.0)),
        Err(LedgerError::UnknownNode("node-9".into()))
    );
}

#[test]
fn changed_nodes_are_handed_out_once_for_the_store() {
    let mut l = Ledger::default();
    l.observe(&xid("a", "node-1", 0, 79, 0.0), &running("j"), at(0.0));
    l.observe(&xid("b", "node-2", 0, 13, 0.0), &tearing_down("j"), at(0.0));
    let dirty: Vec<String> = l.take_dirty().into_iter().map(|n| n.node).collect();
    assert_eq!(dirty, vec!["node-1", "node-2"]);
    assert!(l.take_dirty().is_empty());
    let mut again = Ledger::default();
    again.restore(l.nodes().cloned());
    assert_eq!(again.held_out(), l.held_out());
}

#[test]
fn the_ledger_holds_bounded_evidence() {
    let cfg = LedgerConfig {
        max_marks: 4,
        max_history: 3,
        max_nodes: 2,
        ..LedgerConfig::default()
    };
    let mut l = Ledger::new(cfg);
    for i in 0..20 {
        let h = f64::from(i);
        l.observe(
            &xid(&format!("i{i}"), "node-1", 0, 45, h),
            &tearing_down("j"),
            at(h),
        );
    }
    assert_eq!(l.node("node-1").map(|n| n.marks.len()), Some(4));
    for i in 0..10 {
        l.decide("node-1", i % 2 == 0, "bob", "test", at(30.0));
    }
    assert_eq!(l.node("node-1").map(|n| n.history.len()), Some(3));
    l.observe(
        &xid("x", "node-2", 0, 45, 40.0),
        &tearing_down("j"),
        at(40.0),
    );
    l.observe(
        &xid("y", "node-3", 0, 45, 41.0),
        &tearing_down("j"),
        at(41.0),
    );
    assert!(l.nodes().count() <= 2, "{}", l.nodes().count());
}

#[test]
fn mean_time_between_incidents() {
    let mut l = Ledger::default();
    for (i, h) in [0.0, 10.0, 30.0].into_iter().enumerate() {
        l.observe(
            &xid(&format!("i{i}"), "node-1", 0, 63, h),
            &running("j"),
            at(h),
        );
    }
    let mtbi = l.node("node-1").and_then(NodeHealth::mean_secs_between);
    assert_eq!(mtbi, Some(15.0 * HOUR));
}

mod through_the_engine {
    //! The engine gives each incident its job's phase: a driver's XID (154, a warning)
    //! after one of the job's ranks exited is the job's teardown, on whichever node; an
    //! XID 79 while it runs is the node's.

    use warden_model::Timestamp;
    use warden_model::wire::{
        Batch, EventSeverity, Heartbeat, JobSignals, NodeEvent, NodeEventKind, ProcessState,
        RankInfo,
    };
    use warden_model::xid::XidCatalog;

    use crate::ledger::{HealthState, JobPhase, Weight};
    use crate::{Engine, EngineConfig};

    const T0: i64 = 1_800_000_000_000_000_000;
    const S: i64 = 1_000_000_000;

    fn batch(node: &str, seq: u64, at: i64, rank: u32) -> Batch {
        Batch {
            version: 0,
            node: node.into(),
            agent_id: format!("agent-{node}"),
            boot_id: "boot-1".into(),
            seq,
            sent_at_ns: at,
            jobs: vec![JobSignals {
                job: "train".into(),
                ranks: vec![RankInfo {
                    rank,
                    world_size: 2,
                    pid: 100 + rank,
                    gpu_index: Some(0),
                    gpu_uuid: String::new(),
                }],
                ..JobSignals::default()
            }],
            gpus: vec![],
            events: vec![],
            heartbeat: Some(Heartbeat::default()),
        }
    }

    fn xid(code: u32, at: i64) -> NodeEvent {
        NodeEvent {
            id: at as u64,
            at_ns: at,
            kind: NodeEventKind::Xid as i32,
            severity: XidCatalog::builtin().severity(code) as i32,
            gpu_index: Some(0),
            pci_bus_id: "0000:3b:00".into(),
            code: Some(code),
            message: format!("NVRM: Xid (PCI:0000:3b:00): {code}, pid=101, name=python"),
            count: 1,
        }
    }

    fn engine() -> Engine {
        let mut e = Engine::new(EngineConfig::default(), Timestamp(T0));
        e.apply(batch("node-1", 1, T0, 0), Timestamp(T0));
        e.apply(batch("node-2", 1, T0, 1), Timestamp(T0));
        e.tick(Timestamp(T0 + S));
        e
    }

    #[test]
    fn an_xid_after_a_rank_exited_is_the_jobs_teardown() {
        let mut e = engine();
        let mut exit = batch("node-2", 2, T0 + 10 * S, 1);
        exit.jobs[0].processes.push(ProcessState {
            rank: 1,
            pid: 101,
            at_ns: T0 + 10 * S,
            alive: false,
            exit_code: Some(1),
            ..ProcessState::default()
        });
        e.apply(exit, Timestamp(T0 + 10 * S));
        e.tick(Timestamp(T0 + 11 * S));
        // The cleanup XID on the other node, whose rank is still there.
        let mut late = batch("node-1", 3, T0 + 12 * S, 0);
        late.events.push(xid(154, T0 + 12 * S));
        e.apply(late, Timestamp(T0 + 12 * S));
        e.tick(Timestamp(T0 + 13 * S));
        let n = e.ledger().node("node-1").expect("node-1 in the ledger");
        let m = n
            .marks
            .iter()
            .find(|m| m.kind == warden_model::IncidentKind::GpuFault);
        let m = m.expect("the XID's mark");
        assert_eq!(m.phase, JobPhase::TearingDown);
        assert_eq!(m.weight, Weight::Job);
        assert_eq!(m.job.as_deref(), Some("train"));
        assert_eq!(e.ledger().state("node-1"), HealthState::Healthy);
    }

    #[test]
    fn a_fatal_xid_while_the_job_runs_quarantines_its_node() {
        let mut e = engine();
        let mut b = batch("node-1", 2, T0 + 5 * S, 0);
        b.events.push(xid(79, T0 + 5 * S));
        assert_eq!(
            XidCatalog::builtin().severity(79),
            EventSeverity::Fatal,
            "the catalog holds 79 fatal"
        );
        e.apply(b, Timestamp(T0 + 5 * S));
        e.tick(Timestamp(T0 + 6 * S));
        assert_eq!(e.ledger().state("node-1"), HealthState::Quarantined);
        let n = e.ledger().node("node-1").expect("node-1");
        assert_eq!(n.marks[0].phase, JobPhase::Running);
        assert_eq!(n.marks[0].gpu, Some(0));
        assert_eq!(e.ledger().held_out(), ["node-1".to_owned()].into());
        assert_eq!(e.ledger().state("node-2"), HealthState::Healthy);
    }
}

#[test]
fn memory_xids_during_teardown_stay_the_hardwares() {
    let mut l = Ledger::default();
    let t = l.observe(
        &xid("i1", "node-6", 4, 63, 0.0),
        &tearing_down("a"),
        at(0.0),
    );
    assert_eq!(t[0].1.to, HealthState::Suspect);
    assert_eq!(
        l.node("node-6").map(|n| n.marks[0].weight),
        Some(Weight::Hardware)
    );
    // A driver's XID at teardown is the job's.
    assert!(
        l.observe(
            &xid("i2", "node-7", 0, 154, 0.0),
            &tearing_down("a"),
            at(0.0)
        )
        .is_empty()
    );
    assert_eq!(
        l.node("node-7").map(|n| n.marks[0].weight),
        Some(Weight::Job)
    );
}
