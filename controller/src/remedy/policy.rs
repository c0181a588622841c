//! Remediation policy as data (`rules/policy.yaml`): ordered rules, each a set of
//! conditions on an incident — kind, diagnosis category and fault locus, severity,
//! confidence, XID codes, repetition — and the actions to take. The first rule that
//! matches decides; an incident no rule matches gets nothing done. What an XID means
//! (its severity and cause) comes from the one catalog, `rules/xid.yaml`
//! ([`warden_model::xid`]), never from a list of codes kept here.
//!
//! Evaluation is pure: what happened before (for repetition) comes in through
//! [`History`], so the same incident and history always give the same decision.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, de::Error as _};
use warden_diagnosis::model::{Category, FaultLocus};
use warden_model::wire::EventSeverity;
use warden_model::xid::{Cause, XidCatalog};
use warden_model::{Incident, IncidentKind, Severity, Timestamp};

/// The policy shipped with Warden (`rules/policy.yaml`).
pub const SHIPPED: &str = include_str!("../../../rules/policy.yaml");

/// Largest policy file read, bytes.
const MAX_POLICY_BYTES: u64 = 1 << 20;

/// What a rule can call for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionName {
    /// Tell people (the incident's alerts, plus a timeline note); no change anywhere.
    Notify,
    /// Stop new work landing on the culprit nodes (cordon + taint; Slurm drain).
    Cordon,
    /// Cordon the culprit nodes and move their workload off (evict).
    Drain,
    /// Restart the job from its last complete checkpoint without the isolated nodes.
    RestartJob,
    /// Isolate the whole suspect group when the culprit is uncertain: every node the
    /// incident names, up to `max_group_nodes`.
    IsolateGroup,
}

impl ActionName {
    /// The label used in the policy, the audit log and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            ActionName::Notify => "notify",
            ActionName::Cordon => "cordon",
            ActionName::Drain => "drain",
            ActionName::RestartJob => "restart_job",
            ActionName::IsolateGroup => "isolate_group",
        }
    }

    /// Whether it takes nodes out of service.
    pub const fn isolates(self) -> bool {
        matches!(
            self,
            ActionName::Cordon | ActionName::Drain | ActionName::IsolateGroup
        )
    }
}

/// What repetition is counted per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// One GPU.
    Gpu,
    /// One node.
    Node,
    /// One job.
    Job,
}

/// "At least `count` times on one `per` within `within`".
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repeat {
    /// Occurrences needed, this one included (≥ 2).
    pub count: u32,
    /// The window, e.g. `1h`, `30m`.
    #[serde(with = "super::duration_text")]
    pub within: Duration,
    /// What is counted per.
    pub per: Per,
}

/// The conditions of a rule; every one given must hold (an empty list is "any").
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conditions {
    /// Incident kinds.
    #[serde(default)]
    pub kind: Vec<IncidentKind>,
    /// Diagnosis categories; the rule waits for the diagnosis (up to the configured
    /// wait) and does not match an incident the logs did not categorise.
    #[serde(default)]
    pub category: Vec<Category>,
    /// Fault loci from the diagnosis.
    #[serde(default)]
    pub locus: Vec<FaultLocus>,
    /// Lowest severity.
    pub min_severity: Option<Severity>,
    /// Lowest confidence of the root-cause finding, 0..=1.
    pub min_confidence: Option<f64>,
    /// Highest confidence (for rules about uncertain culprits), 0..=1.
    pub max_confidence: Option<f64>,
    /// XID codes, any of which the incident's evidence must name.
    #[serde(default)]
    pub xid: Vec<u32>,
    /// XID severities in the catalog (`info`, `warning`, `error`, `fatal`): the
    /// incident's evidence must name an XID the catalog rates one of these (a code the
    /// catalog does not list is rated `warning`, as the agent rates it).
    #[serde(default, deserialize_with = "severity_labels")]
    pub xid_severity: Vec<EventSeverity>,
    /// XID causes in the catalog (`hardware`, `driver`, `application`, `thermal`,
    /// `power`, `nvlink`, `memory`): the incident's evidence must name an XID the
    /// catalog gives one of these causes.
    #[serde(default)]
    pub xid_cause: Vec<Cause>,
    /// Repetition needed before the rule matches.
    pub repeat: Option<Repeat>,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Unique name (audit log, timeline, metrics).
    pub name: String,
    /// Why the rule exists.
    #[serde(default)]
    pub description: String,
    /// When it applies.
    #[serde(default)]
    pub when: Conditions,
    /// What to do, in order.
    pub then: Vec<ActionName>,
}

/// A policy file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Format version; 1.
    pub version: u32,
    /// Most nodes `isolate_group` takes out at once (default 8).
    #[serde(default = "default_group_nodes")]
    pub max_group_nodes: usize,
    /// The rules, first match wins.
    pub rules: Vec<Rule>,
}

fn default_group_nodes() -> usize {
    8
}

/// `xid_severity`: the catalog's labels, a wrong one named with the ones there are.
fn severity_labels<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<EventSeverity>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|label| {
            EventSeverity::from_label(label).ok_or_else(|| {
                D::Error::custom(format!(
                    "{label:?} is not an XID severity (info, warning, error or fatal)"
                ))
            })
        })
        .collect()
}

impl Conditions {
    /// Whether the rule has any XID condition.
    fn on_xids(&self) -> bool {
        !self.xid.is_empty() || !self.xid_severity.is_empty() || !self.xid_cause.is_empty()
    }

    /// Whether XID `code`, as `inc` reports it, meets every XID condition given, read
    /// in the catalog (the severity as the agent grades it: the catalog's, or what the
    /// message itself states, `XidCatalog::severity_in`).
    fn xid_holds(&self, code: u32, inc: &Incident) -> bool {
        let catalog = XidCatalog::builtin();
        (self.xid.is_empty() || self.xid.contains(&code))
            && (self.xid_severity.is_empty()
                || texts(inc).any(|t| self.xid_severity.contains(&catalog.severity_in(code, t))))
            && (self.xid_cause.is_empty()
                || catalog
                    .get(code)
                    .is_some_and(|i| self.xid_cause.contains(&i.cause)))
    }
}

/// Why a policy was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read, or is larger than a policy can be.
    #[error("the policy: {0}")]
    File(#[from] warden_config::file::FileError),
    /// Not a policy: the field path and the problem.
    #[error("{origin}: {field}: {message}")]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// The field (`rules[2].when.kind[0]`).
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl Policy {
    /// Parse and check a policy; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let policy: Policy =
            warden_model::yaml::from_str(text).map_err(|e| PolicyError::Invalid {
                origin: origin.to_owned(),
                field: e.path,
                message: e.message,
            })?;
        policy.check(origin)?;
        Ok(policy)
    }

    /// Read and check a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = warden_config::file::read_bounded(path, MAX_POLICY_BYTES)?;
        Policy::parse(&text, &path.display().to_string())
    }

    /// The shipped policy.
    pub fn shipped() -> Result<Policy, PolicyError> {
        Policy::parse(SHIPPED, "rules/policy.yaml")
    }

    fn check(&self, origin: &str) -> Result<(), PolicyError> {
        let bad = |field: String, message: String| PolicyError::Invalid {
            origin: origin.to_owned(),
            field,
            message,
        };
        if self.version != 1 {
            return Err(bad(
                "version".into(),
                format!("version {} is not supported (expected 1)", self.version),
            ));
        }
        if self.max_group_nodes == 0 {
            return Err(bad("max_group_nodes".into(), "must be at least 1".into()));
        }
        let mut names = BTreeSet::new();
        for (i, r) in self.rules.iter().enumerate() {
            let at = |f: &str| format!("rules[{i}].{f}");
            if r.name.trim().is_empty() || r.name.len() > 100 {
                return Err(bad(at("name"), "a name of 1 to 100 characters".into()));
            }
            if !names.insert(r.name.as_str()) {
                return Err(bad(at("name"), format!("{:?} is used twice", r.name)));
            }
            if r.then.is_empty() {
                return Err(bad(at("then"), "at least one action".into()));
            }
            let w = &r.when;
            for (f, v) in [
                ("when.min_confidence", w.min_confidence),
                ("when.max_confidence", w.max_confidence),
            ] {
                if v.is_some_and(|c| !(0.0..=1.0).contains(&c)) {
                    return Err(bad(at(f), "a confidence between 0 and 1".into()));
                }
            }
            if let Some(rep) = &w.repeat {
                if rep.count < 2 {
                    return Err(bad(
                        at("when.repeat.count"),
                        "at least 2 (1 is no repetition)".into(),
                    ));
                }
                if rep.within.is_zero() {
                    return Err(bad(at("when.repeat.within"), "a window above zero".into()));
                }
            }
        }
        Ok(())
    }

    /// The rule that decides for `incident`, if any. `history` answers how often the
    /// rule's conditions held before, for rules with `repeat`. Once `waited_out` (the
    /// diagnosis is not coming), rules on the diagnosis no longer match an incident
    /// without one.
    pub fn decide<'p>(
        &'p self,
        incident: &Incident,
        history: &dyn History,
        now: Timestamp,
        waited_out: bool,
    ) -> Decision<'p> {
        for rule in &self.rules {
            match rule.matches(incident, history, now) {
                Match::Yes => return Decision::Act(rule),
                Match::WaitForDiagnosis if !waited_out => return Decision::Wait(rule),
                Match::WaitForDiagnosis | Match::No => {}
            }
        }
        Decision::Nothing
    }
}

/// What the policy says about an incident.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision<'p> {
    /// This rule matched: take its actions.
    Act(&'p Rule),
    /// This rule may match once the diagnosis is in; ask again later.
    Wait(&'p Rule),
    /// No rule matches.
    Nothing,
}

/// Earlier occurrences, for `repeat`.
pub trait History {
    /// How many times rule `rule` matched (repetition aside) on `key` at or after
    /// `since`, not counting incident `except`.
    fn occurrences(&self, rule: &str, key: &str, since: Timestamp, except: &str) -> u32;
}

/// No history (every `repeat` counts only the incident itself).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHistory;

impl History for NoHistory {
    fn occurrences(&self, _: &str, _: &str, _: Timestamp, _: &str) -> u32 {
        0
    }
}

enum Match {
    Yes,
    No,
    WaitForDiagnosis,
}

impl Rule {
    /// Whether the conditions other than `repeat` hold.
    fn matches_once(&self, inc: &Incident) -> Match {
        let w = &self.when;
        if !w.kind.is_empty() && !w.kind.contains(&inc.kind) {
            return Match::No;
        }
        if w.min_severity.is_some_and(|s| inc.severity < s) {
            return Match::No;
        }
        if w.min_confidence.is_some_and(|c| inc.confidence < c) {
            return Match::No;
        }
        if w.max_confidence.is_some_and(|c| inc.confidence > c) {
            return Match::No;
        }
        if w.on_xids() && !xid_codes(inc).iter().any(|(c, _)| w.xid_holds(*c, inc)) {
            return Match::No;
        }
        if w.category.is_empty() && w.locus.is_empty() {
            return Match::Yes;
        }
        let Some(d) = &inc.diagnosis else {
            return Match::WaitForDiagnosis;
        };
        let category = d
            .category
            .as_deref()
            .and_then(|c| c.parse::<Category>().ok());
        if !w.category.is_empty() && !category.is_some_and(|c| w.category.contains(&c)) {
            return Match::No;
        }
        let locus = d.fault_locus.as_deref().and_then(parse_locus);
        if !w.locus.is_empty() && !locus.is_some_and(|l| w.locus.contains(&l)) {
            return Match::No;
        }
        Match::Yes
    }

    fn matches(&self, inc: &Incident, history: &dyn History, now: Timestamp) -> Match {
        match self.matches_once(inc) {
            Match::Yes => {}
            other => return other,
        }
        let Some(rep) = &self.when.repeat else {
            return Match::Yes;
        };
        let since = now.plus_secs(-rep.within.as_secs_f64());
        let here = self.occurrences_in(inc);
        let enough = repeat_keys(inc, rep.per).iter().any(|key| {
            let before = history.occurrences(&self.name, key, since, &inc.id);
            here.saturating_add(before) >= rep.count
        });
        if enough { Match::Yes } else { Match::No }
    }

    /// Occurrences inside the incident itself: for XID rules, how often its evidence
    /// says the codes were seen; otherwise one.
    pub fn occurrences_in(&self, inc: &Incident) -> u32 {
        if !self.when.on_xids() {
            return 1;
        }
        let n: u32 = xid_codes(inc)
            .iter()
            .filter(|(c, _)| self.when.xid_holds(*c, inc))
            .map(|(_, n)| *n)
            .sum();
        n.max(1)
    }
}

fn parse_locus(s: &str) -> Option<FaultLocus> {
    FaultLocus::ALL.into_iter().find(|l| l.as_str() == s)
}

/// The keys repetition is counted on for `inc`: its GPUs, nodes or job.
pub fn repeat_keys(inc: &Incident, per: Per) -> Vec<String> {
    match per {
        Per::Gpu => inc
            .gpus
            .iter()
            .map(|g| format!("{}/gpu{}", g.node, g.index))
            .collect(),
        Per::Node => {
            let mut n: Vec<String> = inc.nodes.clone();
            n.extend(inc.gpus.iter().map(|g| g.node.clone()));
            n.sort();
            n.dedup();
            n
        }
        Per::Job => inc.job.iter().cloned().collect(),
    }
}

/// An incident's summary, then its evidence.
fn texts(inc: &Incident) -> impl Iterator<Item = &str> {
    std::iter::once(inc.summary.as_str()).chain(inc.evidence.iter().map(|e| e.text.as_str()))
}

/// The XID codes an incident's summary and evidence name (`XID 79`), with how many
/// times the evidence says each was seen (`seen 3 time(s)`; 1 when it does not say).
pub fn xid_codes(inc: &Incident) -> Vec<(u32, u32)> {
    warden_model::xid::named_codes(texts(inc))
}

#[cfg(test)]
mod tests;
