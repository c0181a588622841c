//! Policy tests: every shipped policy loads; hardware faults isolate, the program's own
//! errors only notify; repetition, waiting for a diagnosis, and refused files.

use warden_model::{
    Evidence, GpuRef, Incident, IncidentDiagnosis, IncidentKind, IncidentState, Severity, Timestamp,
};

use super::*;

fn incident(kind: IncidentKind, summary: &str) -> Incident {
    Incident {
        id: "inc-1".into(),
        kind,
        job: Some("4242".into()),
        state: IncidentState::Open,
        acknowledged: false,
        severity: Severity::Critical,
        ranks: vec![3],
        nodes: vec!["node-7".into()],
        gpus: vec![GpuRef {
            node: "node-7".into(),
            index: 3,
        }],
        onset: Timestamp::from_secs_f64(100.0),
        detected_at: Timestamp::from_secs_f64(101.0),
        updated_at: Timestamp::from_secs_f64(101.0),
        resolved_at: None,
        confidence: 0.95,
        summary: summary.into(),
        evidence: vec![],
        finding_count: 1,
        timeline: vec![],
        diagnosis: None,
    }
}

fn diagnosed(mut inc: Incident, category: &str, locus: &str) -> Incident {
    inc.diagnosis = Some(IncidentDiagnosis {
        category: Some(category.into()),
        fault_locus: Some(locus.into()),
        source: "rules".into(),
        ..IncidentDiagnosis::default()
    });
    inc
}

fn now() -> Timestamp {
    Timestamp::from_secs_f64(200.0)
}

fn decided<'p>(p: &'p Policy, inc: &Incident) -> Option<&'p Rule> {
    match p.decide(inc, &NoHistory, now(), false) {
        Decision::Act(r) => Some(r),
        Decision::Wait(r) => panic!("waits for the diagnosis under {}", r.name),
        Decision::Nothing => None,
    }
}

#[test]
fn every_shipped_policy_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rules");
    let mut loaded = 0;
    for entry in std::fs::read_dir(&dir).expect("rules/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("policy") && name.ends_with(".yaml") {
            let p = Policy::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!p.rules.is_empty(), "{name} has rules");
            loaded += 1;
        }
    }
    assert!(loaded >= 1, "rules/policy.yaml is there");
    assert_eq!(
        Policy::shipped().expect("embedded copy"),
        Policy::load(&dir.join("policy.yaml")).expect("file")
    );
}

#[test]
fn a_hardware_fault_isolates() {
    let p = Policy::shipped().expect("policy");
    let inc = incident(
        IncidentKind::GpuFault,
        "GPU 3 on node-7 reported XID 79 (GPU has fallen off the bus), fatal",
    );
    let r = decided(&p, &inc).expect("a rule");
    assert_eq!(r.name, "gpu-fatal-xid");
    assert!(r.then.iter().any(|a| a.isolates()), "{:?}", r.then);
    assert!(r.then.contains(&ActionName::RestartJob));

    // A hang the logs put on the network, with a sure culprit: isolate and restart.
    let hang = diagnosed(
        incident(IncidentKind::Hang, "rank 3 never entered allreduce"),
        "network_ib_error",
        "network",
    );
    let r = decided(&p, &hang).expect("a rule");
    assert_eq!(r.name, "hang-hardware");
    assert!(r.then.contains(&ActionName::Drain));

    // The same hang with an unsure culprit: the whole suspect group.
    let mut unsure = hang.clone();
    unsure.confidence = 0.4;
    assert_eq!(
        decided(&p, &unsure).expect("a rule").name,
        "hang-uncertain-group"
    );
}

#[test]
fn a_user_code_error_only_notifies() {
    let p = Policy::shipped().expect("policy");
    for (kind, category) in [
        (IncidentKind::Crash, "user_code_error"),
        (IncidentKind::Hang, "dataloader_error"),
        (IncidentKind::Nan, "nan_inf_loss"),
    ] {
        let inc = diagnosed(incident(kind, "rank 3 exited"), category, "user-code");
        let r = decided(&p, &inc).expect("a rule");
        assert_eq!(
            r.then,
            vec![ActionName::Notify],
            "{kind:?}/{category}: {}",
            r.name
        );
    }
    // Whatever no rule claims is reported, never acted on (once the diagnosis is not
    // coming, the rule on the user-code locus no longer waits for it).
    let straggler = incident(IncidentKind::Straggler, "node-7 is 20% slower");
    match p.decide(&straggler, &NoHistory, now(), true) {
        Decision::Act(r) => {
            assert_eq!(r.name, "everything-else");
            assert_eq!(r.then, vec![ActionName::Notify]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_silent_hang_on_one_rank_isolates_unless_the_logs_blame_the_program() {
    let p = Policy::shipped().expect("policy");
    let mut hang = incident(
        IncidentKind::Hang,
        "rank 3 is stopped inside allreduce seq 90; the other 5 members wait in it",
    );
    hang.confidence = 0.95;
    // The logs are read first: a hang in the program's own code only notifies.
    match p.decide(&hang, &NoHistory, now(), false) {
        Decision::Wait(r) => assert_eq!(r.name, "hang-hardware"),
        other => panic!("{other:?}"),
    }
    let blamed = diagnosed(hang.clone(), "dataloader_error", "user-code");
    assert_eq!(decided(&p, &blamed).expect("a rule").name, "user-code");
    // Logs with nothing to say (or none in time): the culprit's node goes.
    let mut silent = hang.clone();
    silent.diagnosis = Some(IncidentDiagnosis {
        source: "rules".into(),
        ..IncidentDiagnosis::default()
    });
    for (inc, waited_out) in [(&silent, false), (&hang, true)] {
        match p.decide(inc, &NoHistory, now(), waited_out) {
            Decision::Act(r) => {
                assert_eq!(r.name, "hang-silent-culprit");
                assert_eq!(
                    r.then,
                    vec![
                        ActionName::Notify,
                        ActionName::Drain,
                        ActionName::RestartJob
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // An unsure culprit is not enough.
    let mut unsure = silent.clone();
    unsure.confidence = 0.5;
    assert_eq!(
        decided(&p, &unsure).expect("a rule").name,
        "everything-else"
    );
}

#[test]
fn a_rule_on_the_diagnosis_waits_for_it() {
    let p = Policy::shipped().expect("policy");
    let hang = incident(IncidentKind::Hang, "rank 3 never entered allreduce");
    match p.decide(&hang, &NoHistory, now(), false) {
        Decision::Wait(r) => assert_eq!(r.name, "hang-hardware"),
        other => panic!("{other:?}"),
    }
}

struct Seen(u32);

impl History for Seen {
    fn occurrences(&self, rule: &str, key: &str, _: Timestamp, except: &str) -> u32 {
        assert_eq!(rule, "xid-error-repeated");
        assert_eq!(key, "node-7/gpu3");
        assert_eq!(except, "inc-1");
        self.0
    }
}

#[test]
fn a_job_impairing_xid_cordons_only_the_third_time_on_one_gpu() {
    let p = Policy::shipped().expect("policy");
    let once = incident(
        IncidentKind::GpuFault,
        "GPU 3 on node-7 reported XID 8 (GPU stopped processing (channel idle timeout)), error",
    );
    let first = decided(&p, &once).expect("rule");
    assert_eq!(first.name, "xid-not-fatal");
    assert_eq!(first.then, vec![ActionName::Notify]);
    // Two earlier incidents on the same GPU within the hour.
    match p.decide(&once, &Seen(2), now(), false) {
        Decision::Act(r) => {
            assert_eq!(r.name, "xid-error-repeated");
            assert_eq!(r.then, vec![ActionName::Notify, ActionName::Cordon]);
        }
        other => panic!("{other:?}"),
    }
    // Or one incident whose evidence says it was seen three times.
    let mut grouped = once.clone();
    grouped.evidence.push(Evidence {
        at: now(),
        text: "XID 8 (GPU stopped processing (channel idle timeout)) seen 3 time(s)".into(),
    });
    assert_eq!(xid_codes(&grouped), vec![(8, 3)]);
    assert_eq!(
        decided(&p, &grouped).expect("rule").name,
        "xid-error-repeated"
    );
}

#[test]
fn bad_policies_are_refused_naming_the_field() {
    let cases = [
        ("version: 2\nrules: []\n", "version", "not supported"),
        (
            "version: 1\nrules:\n  - name: a\n    when: {kind: [melted]}\n    then: [notify]\n",
            "rules[0].when.kind[0]",
            "unknown variant",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    then: [reboot]\n",
            "rules[0].then[0]",
            "unknown variant",
        ),
        (
            "version: 1\nrules:\n  - {name: a, then: [notify]}\n  - {name: a, then: [notify]}\n",
            "rules[1].name",
            "used twice",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when: {repeat: {count: 1, within: 1h, per: gpu}}\n    then: [cordon]\n",
            "rules[0].when.repeat.count",
            "at least 2",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when: {repeat: {count: 2, within: soon, per: gpu}}\n    then: [cordon]\n",
            "rules[0].when.repeat.within",
            "not a duration",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when: {min_confidence: 2}\n    then: [cordon]\n",
            "rules[0].when.min_confidence",
            "between 0 and 1",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    then: []\n",
            "rules[0].then",
            "at least one",
        ),
        ("version: 1\nrule: []\n", "rule", "unknown field"),
        (
            "version: 1\nrules:\n  - name: a\n    when: {xid_severity: [dire]}\n    then: [notify]\n",
            "rules[0].when.xid_severity",
            "\"dire\" is not an XID severity (info, warning, error or fatal)",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when: {xid_cause: [cosmic]}\n    then: [notify]\n",
            "rules[0].when.xid_cause[0]",
            "unknown variant",
        ),
    ];
    for (text, field, message) in cases {
        match Policy::parse(text, "test.yaml") {
            Err(PolicyError::Invalid {
                origin,
                field: f,
                message: m,
            }) => {
                assert_eq!(origin, "test.yaml");
                assert_eq!(f, field, "{text}: {m}");
                assert!(m.contains(message), "{text}: {m}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn xid_conditions_read_the_catalog_and_what_the_message_states() {
    let p = Policy::parse(
        "version: 1\nrules:\n\
         \x20 - {name: fatal, when: {xid_severity: [fatal]}, then: [drain]}\n\
         \x20 - {name: memory-error, when: {xid_severity: [error], xid_cause: [memory]}, then: [cordon]}\n\
         \x20 - {name: memory-warning, when: {xid_severity: [warning], xid_cause: [memory]}, then: [cordon]}\n\
         \x20 - {name: named, when: {xid: [8], xid_severity: [error]}, then: [notify]}\n",
        "test.yaml",
    )
    .expect("policy");
    let rule = |summary: &str| {
        decided(&p, &incident(IncidentKind::GpuFault, summary)).map(|r| r.name.clone())
    };
    // rules/xid.yaml: 79 fatal; 63 a memory warning; 92 a memory warning; 8 an error
    // of the driver; 37 a driver warning; a code it does not list is a warning of no
    // known cause.
    assert_eq!(
        rule("GPU 3 on node-7 reported XID 79, fatal").as_deref(),
        Some("fatal")
    );
    assert_eq!(
        rule("GPU 3 reported XID 63").as_deref(),
        Some("memory-warning")
    );
    assert_eq!(
        rule("GPU 3 reported XID 92").as_deref(),
        Some("memory-warning")
    );
    assert_eq!(rule("GPU 3 reported XID 8").as_deref(), Some("named"));
    assert_eq!(rule("GPU 3 reported XID 37"), None);
    assert_eq!(rule("GPU 3 reported XID 9999"), None);
    // Both XID conditions of one rule hold for the same code: an error of the driver
    // beside a memory warning is not a memory error.
    assert_eq!(
        rule("GPU 3 reported XID 156").as_deref(),
        Some("memory-error")
    );
    assert_eq!(
        rule("GPU 3 reported XID 8 and XID 63").as_deref(),
        Some("memory-warning")
    );
    // XID 154 is a warning unless its message states a reset, as the agent grades it.
    let mut stated = incident(IncidentKind::GpuFault, "GPU 3 on node-7 reported XID 154");
    assert_eq!(decided(&p, &stated).map(|r| r.name.as_str()), None);
    stated.evidence.push(Evidence {
        at: now(),
        text: "node-7 kernel log: NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".into(),
    });
    assert_eq!(decided(&p, &stated).map(|r| r.name.as_str()), Some("fatal"));
}
