//! Fuzz target: the remediation policy loader and its decision
//! (`warden_controller::remedy::policy`, `rules/policy.yaml`).
//!
//! The input up to the first `0xff` byte is the policy; what follows (or a default)
//! is the text of an incident's summary, evidence and diagnosis labels, which
//! `decide` reads for XID codes, repeat counts, category and locus. Every policy that
//! loads decides for incidents of every kind, with and without a diagnosis, with no
//! history and with a history that has seen everything many times. Checked: nothing
//! panics; a decision names a rule of the policy; without a diagnosis a rule on the
//! diagnosis waits, and once waited out it no longer matches; an empty policy does
//! nothing.

use warden_controller::remedy::policy::{Decision, History, NoHistory, Policy, Rule};
use warden_model::incident::{
    Evidence, Incident, IncidentDiagnosis, IncidentKind, IncidentState, Severity,
};
use warden_model::{GpuRef, Timestamp};

/// A history that has seen every rule's conditions `n` times on every key.
struct Seen(u32);

impl History for Seen {
    fn occurrences(&self, _: &str, _: &str, _: Timestamp, _: &str) -> u32 {
        self.0
    }
}

fn incident(kind: IncidentKind, text: &str, diagnosis: Option<(&str, &str)>) -> Incident {
    let t = Timestamp::from_secs_f64(1_700_000_000.0);
    Incident {
        id: "inc-1".into(),
        kind,
        job: Some("job-1".into()),
        state: IncidentState::Open,
        acknowledged: false,
        severity: Severity::Critical,
        ranks: vec![3],
        nodes: vec!["node-7".into()],
        gpus: vec![GpuRef {
            node: "node-7".into(),
            index: 3,
        }],
        onset: t,
        detected_at: t,
        updated_at: t,
        resolved_at: None,
        confidence: 0.9,
        summary: text.to_owned(),
        evidence: text
            .split('\n')
            .take(8)
            .map(|l| Evidence {
                at: t,
                text: l.to_owned(),
            })
            .collect(),
        finding_count: 1,
        timeline: vec![],
        diagnosis: diagnosis.map(|(category, locus)| IncidentDiagnosis {
            category: Some(category.to_owned()),
            fault_locus: Some(locus.to_owned()),
            source: "rules".into(),
            ..IncidentDiagnosis::default()
        }),
    }
}

fn is_rule_of(policy: &Policy, rule: &Rule) -> bool {
    policy.rules.iter().any(|r| std::ptr::eq(r, rule))
}

/// One input, as libFuzzer passes it (`fuzz_targets/policy.rs`).
pub fn run(input: &[u8]) {
    let (policy_bytes, rest) = match input.iter().position(|&b| b == 0xff) {
        Some(i) => (&input[..i], &input[i + 1..]),
        None => (
            input,
            &b"GPU 3 on node-7: XID 79 (fallen off the bus), seen 3 time(s)"[..],
        ),
    };
    let text = String::from_utf8_lossy(policy_bytes);
    let Ok(policy) = Policy::parse(&text, "fuzz.yaml") else {
        return;
    };
    let detail = String::from_utf8_lossy(rest);
    let mut labels = detail.split('\n').rev();
    let fuzzed = (labels.next().unwrap_or(""), labels.next().unwrap_or(""));
    let now = Timestamp::from_secs_f64(1_700_000_100.0);
    for kind in IncidentKind::ALL {
        for diagnosis in [
            None,
            Some(("gpu_hardware_xid", "hardware")),
            Some(("nccl_timeout_hang", "network")),
            Some(fuzzed),
        ] {
            let inc = incident(kind, &detail, diagnosis);
            for history in [&NoHistory as &dyn History, &Seen(1_000), &Seen(u32::MAX)] {
                for waited_out in [false, true] {
                    match policy.decide(&inc, history, now, waited_out) {
                        Decision::Act(rule) => {
                            assert!(is_rule_of(&policy, rule), "decided by a rule it has");
                            assert!(!rule.then.is_empty(), "a rule that acts has actions");
                        }
                        Decision::Wait(rule) => {
                            assert!(is_rule_of(&policy, rule));
                            assert!(
                                inc.diagnosis.is_none() && !waited_out,
                                "only an undiagnosed incident waits, until waited out"
                            );
                        }
                        Decision::Nothing => {}
                    }
                    if policy.rules.is_empty() {
                        assert!(matches!(
                            policy.decide(&inc, history, now, waited_out),
                            Decision::Nothing
                        ));
                    }
                }
            }
            for rule in &policy.rules {
                assert!(rule.occurrences_in(&inc) >= 1);
            }
        }
    }
}
