//! The shipped policy against the one XID catalog (`rules/xid.yaml`): every code the
//! catalog lists, reported as the agent reports it and folded by the engine into a
//! `gpu_fault` incident, is decided by `rules/policy.yaml`, and the decision agrees
//! with what the catalog says of the code. A fatal XID takes the node out and restarts
//! the job; no other XID drains a node, however often it repeats; an XID the catalog
//! rates information (the application's own: 13, 31, 43, 45) opens no incident at all. (The alert rules' side of the
//! agreement is `observability.rs`, `fatal_xid_alert_covers_exactly_the_fatal_codes_of_the_xid_catalog`.)

use warden_controller::remedy::policy::{ActionName, Decision, History, NoHistory, Policy, Rule};
use warden_engine::{Engine, EngineConfig};
use warden_model::wire::{
    Batch, EventSeverity, Heartbeat, JobSignals, NodeEvent, NodeEventKind, RankInfo,
};
use warden_model::xid::{Cause, XidCatalog};
use warden_model::{Incident, IncidentKind, Timestamp};

const T0: i64 = 1_800_000_000_000_000_000;

/// The `gpu_fault` incident the engine opens for one kernel-log line of XID `code` on
/// GPU 2 of node-5, where rank 1 of job `train` runs (`None`: it opens none).
fn incident_for(code: u32, detail: &str) -> Option<Incident> {
    let mut engine = Engine::new(EngineConfig::default(), Timestamp(T0));
    let message = format!("NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python, {detail}");
    let batch = Batch {
        version: 0,
        node: "node-5".into(),
        agent_id: "agent-node-5".into(),
        boot_id: "boot-1".into(),
        seq: 1,
        sent_at_ns: T0,
        jobs: vec![JobSignals {
            job: "train".into(),
            ranks: vec![RankInfo {
                rank: 1,
                world_size: 2,
                pid: 4242,
                gpu_index: Some(2),
                gpu_uuid: String::new(),
            }],
            ..JobSignals::default()
        }],
        gpus: vec![],
        events: vec![NodeEvent {
            id: 1,
            at_ns: T0,
            kind: NodeEventKind::Xid as i32,
            // What the agent sends: the catalog's grade, or what the line states.
            severity: XidCatalog::builtin().severity_in(code, detail) as i32,
            gpu_index: Some(2),
            pci_bus_id: "0000:3b:00".into(),
            code: Some(code),
            message,
            count: 1,
        }],
        heartbeat: Some(Heartbeat::default()),
    };
    assert!(
        engine.apply(batch, Timestamp(T0)) > 0,
        "XID {code}: batch applied"
    );
    engine.tick(Timestamp(T0).plus_secs(1.0));
    let found: Vec<&Incident> = engine
        .incidents()
        .iter()
        .filter(|i| i.kind == IncidentKind::GpuFault)
        .collect();
    assert!(
        found.len() <= 1,
        "XID {code}: one gpu_fault incident at most"
    );
    found.first().map(|i| (*i).clone())
}

/// Every earlier occurrence any repeat rule asks for: the GPU has done it before.
struct Often;

impl History for Often {
    fn occurrences(&self, _: &str, _: &str, _: Timestamp, _: &str) -> u32 {
        10
    }
}

fn decide<'p>(policy: &'p Policy, inc: &Incident, history: &dyn History) -> &'p Rule {
    let now = inc.detected_at.plus_secs(1.0);
    match policy.decide(inc, history, now, false) {
        Decision::Act(rule) => rule,
        other => panic!(
            "{}: the policy should decide at once, not {other:?}",
            inc.summary
        ),
    }
}

fn drains(rule: &Rule) -> bool {
    rule.then
        .iter()
        .any(|a| matches!(a, ActionName::Drain | ActionName::IsolateGroup))
}

#[test]
fn the_shipped_policy_acts_on_every_xid_as_the_catalog_rates_it() {
    let policy = Policy::shipped().expect("the shipped policy loads");
    let catalog = XidCatalog::builtin();
    assert!(
        XidCatalog::builtin_error().is_none(),
        "rules/xid.yaml loads"
    );
    let mut disagreements = Vec::new();
    let mut fatal = 0;
    for x in catalog.entries() {
        let Some(inc) = incident_for(x.code, &x.name) else {
            if x.severity != EventSeverity::Info {
                disagreements.push(format!(
                    "XID {} ({}) is {} in the catalog, yet the engine opened no incident",
                    x.code,
                    x.name,
                    x.severity.as_str()
                ));
            }
            continue;
        };
        if x.severity == EventSeverity::Info {
            disagreements.push(format!(
                "XID {} ({}) is information in the catalog, yet the engine opened {}",
                x.code, x.name, inc.summary
            ));
        }
        let once = decide(&policy, &inc, &NoHistory);
        let often = decide(&policy, &inc, &Often);
        let is_fatal = x.severity == EventSeverity::Fatal;
        fatal += usize::from(is_fatal);
        let restarts = once.then.contains(&ActionName::RestartJob);
        if is_fatal != (drains(once) && restarts) {
            disagreements.push(format!(
                "XID {} ({}) is {} in the catalog; once, rule {} does {:?}",
                x.code,
                x.name,
                x.severity.as_str(),
                once.name,
                once.then
            ));
        }
        if !is_fatal && once.then.iter().any(|a| a.isolates()) {
            disagreements.push(format!(
                "XID {} ({}) is {} in the catalog, yet one occurrence isolates ({})",
                x.code,
                x.name,
                x.severity.as_str(),
                once.name
            ));
        }
        if !is_fatal && drains(often) {
            disagreements.push(format!(
                "XID {} ({}) is {} in the catalog, yet repeated it drains ({})",
                x.code,
                x.name,
                x.severity.as_str(),
                often.name
            ));
        }
        if x.cause == Cause::Application && often.then.contains(&ActionName::RestartJob) {
            disagreements.push(format!(
                "XID {} ({}) is the application's in the catalog, yet repeated it restarts the job ({})",
                x.code, x.name, often.name
            ));
        }
    }
    assert!(fatal >= 20, "the catalog holds {fatal} codes fatal");
    assert!(
        disagreements.is_empty(),
        "rules/policy.yaml disagrees with rules/xid.yaml:\n{}",
        disagreements.join("\n")
    );
}

#[test]
fn an_xid_whose_message_states_a_reset_is_acted_on_as_fatal() {
    let policy = Policy::shipped().expect("policy");
    let plain = incident_for(
        154,
        "GPU recovery action changed from 0x0 (None) to 0x0 (None)",
    )
    .expect("a warning opens an incident");
    assert!(!drains(decide(&policy, &plain, &NoHistory)));
    let reset = incident_for(
        154,
        "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    )
    .expect("a fatal XID opens an incident");
    let rule = decide(&policy, &reset, &NoHistory);
    assert!(drains(rule), "{}: {:?}", rule.name, rule.then);
}

#[test]
fn the_applications_own_xids_open_no_incident() {
    let catalog = XidCatalog::builtin();
    for code in [13, 31, 43, 45] {
        let x = catalog.get(code).expect("in the catalog");
        assert_eq!(x.cause, Cause::Application, "XID {code}");
        assert!(
            incident_for(code, "").is_none(),
            "XID {code} opened an incident"
        );
    }
}
