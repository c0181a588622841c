//! The incident book: folds the detectors' findings into incidents, one per root cause.
//!
//! A finding refreshes the open incident of the same kind and culprit; a hang or crash
//! whose culprit runs on a GPU with an open hardware fault is evidence on that fault,
//! not an incident of its own; when the root cause shows up after its symptom (a GPU
//! fault after the hang it caused, a crash after the hang it caused) the symptom's
//! incident is re-attributed. An incident resolves when its finding stops coming.

use rustc_hash::FxHashMap;
use warden_model::{
    Evidence, Finding, Incident, IncidentDiagnosis, IncidentKind, IncidentState, Severity,
    TimelineEntry, Timestamp,
};

use crate::detect::Verdicts;
use crate::engine::{Change, IncidentChange};

/// Evidence entries kept per incident.
const MAX_EVIDENCE: usize = 24;
/// How a person's resolve starts on the timeline; restoring a stored incident reads it
/// back to know the resolve was by hand.
const RESOLVED_BY: &str = "resolved by ";
/// Timeline entries kept per incident.
const MAX_TIMELINE: usize = 200;

/// Incident book settings.
#[derive(Debug, Clone)]
pub struct BookConfig {
    /// A hang resolves after its finding has been absent this long, seconds.
    pub hang_quiet_secs: f64,
    /// Other kinds resolve after this long without their finding, seconds.
    pub quiet_secs: f64,
    /// A resolved incident whose finding returns within this window reopens, seconds.
    pub reopen_secs: f64,
    /// A hang or crash is explained by a non-fatal GPU fault only this close in time, s.
    pub explain_window_secs: f64,
}

impl Default for BookConfig {
    fn default() -> Self {
        BookConfig {
            hang_quiet_secs: 15.0,
            quiet_secs: 60.0,
            reopen_secs: 300.0,
            explain_window_secs: 30.0,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Extra {
    last_refresh: Timestamp,
    root_evidence: Vec<Evidence>,
    attached: Vec<(String, Evidence)>,
    fatal: bool,
    /// When a person resolved it, if they did: the same finding (an onset no later
    /// than this) then keeps it resolved instead of reopening it.
    resolved_by_hand: Option<Timestamp>,
}

/// Why a person's step on an incident was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ManualError {
    /// The book does not hold it (unknown, or resolved before this controller started).
    #[error("no live incident with that id")]
    Unknown,
    /// It is resolved already.
    #[error("the incident is already resolved")]
    Resolved,
}

/// All incidents, oldest first, with their grouping state.
#[derive(Debug, Default)]
pub struct IncidentBook {
    config: BookConfig,
    incidents: Vec<Incident>,
    extra: Vec<Extra>,
    index: FxHashMap<String, usize>,
    counter: u64,
}

fn precedence(k: IncidentKind) -> u8 {
    match k {
        IncidentKind::GpuFault => 0,
        IncidentKind::Crash => 1,
        IncidentKind::Nan => 2,
        IncidentKind::Hang => 3,
        IncidentKind::SlowLink => 4,
        IncidentKind::Straggler => 5,
    }
}

fn intersects<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    a.iter().any(|x| b.contains(x))
}

fn culprit_text(f: &Finding) -> String {
    let mut parts = Vec::new();
    if !f.ranks.is_empty() {
        parts.push(format!("ranks {:?}", f.ranks));
    }
    if !f.nodes.is_empty() {
        parts.push(format!("nodes {:?}", f.nodes));
    }
    if !f.gpus.is_empty() {
        let g: Vec<String> = f.gpus.iter().map(ToString::to_string).collect();
        parts.push(format!("GPUs [{}]", g.join(", ")));
    }
    parts.join(", ")
}

impl IncidentBook {
    /// A book with these settings.
    pub fn new(config: BookConfig) -> Self {
        IncidentBook {
            config,
            ..IncidentBook::default()
        }
    }

    /// Every incident, oldest first.
    pub fn all(&self) -> &[Incident] {
        &self.incidents
    }

    /// One incident by id.
    pub fn get(&self, id: &str) -> Option<&Incident> {
        self.index.get(id).map(|&i| &self.incidents[i])
    }

    /// Attach a log diagnosis to incident `id` at `now`: an open incident becomes
    /// diagnosed, a later diagnosis replaces an earlier one, and the timeline says so.
    /// A diagnosis never changes the culprit the detectors named, nor any action.
    /// `None` for an unknown incident.
    pub fn attach_diagnosis(
        &mut self,
        id: &str,
        d: IncidentDiagnosis,
        now: Timestamp,
    ) -> Option<IncidentChange> {
        let &i = self.index.get(id)?;
        let inc = &mut self.incidents[i];
        if inc.state.can_become(IncidentState::Diagnosed) {
            inc.state = IncidentState::Diagnosed;
        }
        let what = match &d.category {
            Some(c) => format!(
                "diagnosed ({}): {c}, {} at fault{}; confidence {:.2}",
                d.source,
                d.fault_locus.as_deref().unwrap_or("unknown"),
                if d.culprit.is_empty() {
                    String::new()
                } else {
                    format!(", culprit {}", d.culprit)
                },
                d.confidence
            ),
            None => format!(
                "diagnosed ({}): the logs read ({} lines) name no known failure",
                d.source, d.lines_read
            ),
        };
        inc.diagnosis = Some(d);
        inc.updated_at = now;
        push_timeline(inc, now, what);
        Some(IncidentChange {
            id: id.to_owned(),
            change: Change::Diagnosed,
        })
    }

    /// Take back incidents a previous run of the controller stored (those still live):
    /// findings keep grouping into them, and they resolve like any other once their
    /// finding stays away, counting from `now`. Incidents already held are skipped.
    /// Returns how many were taken.
    pub fn restore(&mut self, incidents: Vec<Incident>, now: Timestamp) -> usize {
        let mut n = 0;
        for inc in incidents {
            if self.index.contains_key(&inc.id) {
                continue;
            }
            let fatal = inc.kind == IncidentKind::GpuFault && inc.confidence >= 0.99;
            self.index.insert(inc.id.clone(), self.incidents.len());
            self.extra.push(Extra {
                last_refresh: now,
                root_evidence: inc.evidence.clone(),
                attached: Vec::new(),
                fatal,
                resolved_by_hand: inc
                    .timeline
                    .iter()
                    .rev()
                    .find(|e| e.what.starts_with(RESOLVED_BY))
                    .filter(|_| inc.state == IncidentState::Resolved)
                    .map(|e| e.at),
            });
            self.incidents.push(inc);
            n += 1;
        }
        n
    }

    /// A person acknowledged incident `id`: it stays in its state, marked as seen.
    /// Acknowledging twice changes nothing (`Ok(None)`).
    pub fn acknowledge(
        &mut self,
        id: &str,
        actor: &str,
        note: &str,
        now: Timestamp,
    ) -> Result<Option<IncidentChange>, ManualError> {
        let &i = self.index.get(id).ok_or(ManualError::Unknown)?;
        let inc = &mut self.incidents[i];
        if inc.acknowledged {
            return Ok(None);
        }
        inc.acknowledged = true;
        inc.updated_at = now;
        let what = if note.is_empty() {
            format!("acknowledged by {actor}")
        } else {
            format!("acknowledged by {actor}: {note}")
        };
        push_timeline(inc, now, what);
        Ok(Some(IncidentChange {
            id: id.to_owned(),
            change: Change::Acknowledged,
        }))
    }

    /// A person resolved incident `id` by hand. Should its finding keep coming, it
    /// reopens as any resolved incident does, and the timeline says so.
    pub fn resolve_by(
        &mut self,
        id: &str,
        actor: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<IncidentChange, ManualError> {
        let &i = self.index.get(id).ok_or(ManualError::Unknown)?;
        let inc = &mut self.incidents[i];
        if inc.state == IncidentState::Resolved {
            return Err(ManualError::Resolved);
        }
        inc.state = IncidentState::Resolved;
        inc.resolved_at = Some(now);
        inc.updated_at = now;
        push_timeline(inc, now, format!("{RESOLVED_BY}{actor}: {reason}"));
        self.extra[i].resolved_by_hand = Some(now);
        Ok(IncidentChange {
            id: id.to_owned(),
            change: Change::Resolved,
        })
    }

    /// Note what remediation did on incident `id`'s timeline; `mitigating` moves a
    /// live incident to `mitigating`. `None` for an unknown incident.
    pub fn note(
        &mut self,
        id: &str,
        what: &str,
        mitigating: bool,
        now: Timestamp,
    ) -> Option<IncidentChange> {
        let &i = self.index.get(id)?;
        let inc = &mut self.incidents[i];
        if mitigating && inc.state.can_become(IncidentState::Mitigating) {
            inc.state = IncidentState::Mitigating;
        }
        inc.updated_at = now;
        push_timeline(inc, now, what.to_owned());
        Some(IncidentChange {
            id: id.to_owned(),
            change: Change::Remediated,
        })
    }

    /// Add `what` to the timeline of every live incident of `job` (a scheduler
    /// said the job started or ended). Returns how many incidents got the note.
    pub fn note_job(&mut self, job: &str, what: &str, now: Timestamp) -> usize {
        let mut n = 0;
        for inc in &mut self.incidents {
            if inc.state != IncidentState::Resolved && inc.job.as_deref() == Some(job) {
                inc.updated_at = now;
                push_timeline(inc, now, what.to_owned());
                n += 1;
            }
        }
        n
    }

    /// Fold one pass of findings in at `now`; returns what changed.
    pub fn fold(&mut self, verdicts: Verdicts, now: Timestamp) -> Vec<IncidentChange> {
        let mut findings = verdicts.findings;
        findings.sort_by_key(|f| precedence(f.kind));
        let mut changes: Vec<IncidentChange> = Vec::new();
        for f in findings {
            if let Some(c) = self.fold_one(f, now)
                && !changes.contains(&c)
            {
                changes.push(c);
            }
        }
        for i in 0..self.incidents.len() {
            let inc = &self.incidents[i];
            if inc.state == IncidentState::Resolved {
                continue;
            }
            let quiet = if inc.kind == IncidentKind::Hang {
                self.config.hang_quiet_secs
            } else {
                self.config.quiet_secs
            };
            if now.secs_since(self.extra[i].last_refresh) > quiet {
                let inc = &mut self.incidents[i];
                inc.state = IncidentState::Resolved;
                inc.resolved_at = Some(now);
                inc.updated_at = now;
                push_timeline(
                    inc,
                    now,
                    format!("resolved: no {} finding for {quiet:.0} s", inc.kind),
                );
                changes.push(IncidentChange {
                    id: inc.id.clone(),
                    change: Change::Resolved,
                });
            }
        }
        changes
    }

    fn is_live(&self, i: usize, now: Timestamp) -> bool {
        let inc = &self.incidents[i];
        inc.state != IncidentState::Resolved
            || inc
                .resolved_at
                .is_some_and(|t| now.secs_since(t) <= self.config.reopen_secs)
    }

    /// The live incident this finding refreshes, if any.
    fn same(&self, f: &Finding, now: Timestamp) -> Option<usize> {
        (0..self.incidents.len()).rev().find(|&i| {
            let inc = &self.incidents[i];
            // A GPU fault outlives the job that ran on the GPU (it was restarted
            // elsewhere): the same fault, now with no job there.
            let job_left = f.kind == IncidentKind::GpuFault && f.job.is_none();
            if inc.kind != f.kind || (inc.job != f.job && !job_left) || !self.is_live(i, now) {
                return false;
            }
            let resolved = inc.state == IncidentState::Resolved;
            match f.kind {
                // One job hangs, crashes or diverges once at a time; a resolved one
                // reopens only for the same culprit.
                IncidentKind::Hang | IncidentKind::Crash | IncidentKind::Nan => {
                    !resolved
                        || intersects(&inc.ranks, &f.ranks)
                        || intersects(&inc.nodes, &f.nodes)
                }
                IncidentKind::Straggler | IncidentKind::SlowLink => {
                    intersects(&inc.nodes, &f.nodes)
                }
                IncidentKind::GpuFault => {
                    if inc.gpus.is_empty() && f.gpus.is_empty() {
                        intersects(&inc.nodes, &f.nodes)
                    } else {
                        intersects(&inc.gpus, &f.gpus)
                    }
                }
            }
        })
    }

    /// Whether GPU-fault incident `i` explains a stop (hang or crash) with onset `onset`
    /// on these ranks/nodes.
    fn explains(&self, i: usize, f: &Finding) -> bool {
        let inc = &self.incidents[i];
        if inc.kind != IncidentKind::GpuFault || inc.state == IncidentState::Resolved {
            return false;
        }
        // Where the stop is pinned to ranks, they must run on the faulty GPU; where it
        // could only be pinned to nodes (everyone entered, nobody completed), the GPU's
        // node must be among them.
        let place = if inc.ranks.is_empty() || f.ranks.is_empty() {
            intersects(&inc.nodes, &f.nodes)
        } else {
            intersects(&inc.ranks, &f.ranks) && (inc.job == f.job || inc.job.is_none())
        };
        let close = (f.onset.secs_since(inc.onset)).abs() <= self.config.explain_window_secs;
        place && (self.extra[i].fatal || close)
    }

    fn fold_one(&mut self, f: Finding, now: Timestamp) -> Option<IncidentChange> {
        if let Some(i) = self.same(&f, now) {
            return self.refresh(i, f, now);
        }
        if matches!(f.kind, IncidentKind::Hang | IncidentKind::Crash) {
            // A stop on a GPU with a hardware fault is that fault's consequence.
            if let Some(i) = (0..self.incidents.len())
                .rev()
                .find(|&i| self.explains(i, &f))
            {
                return self.attach(i, f, now);
            }
        }
        if f.kind == IncidentKind::Hang {
            // A hang in a job that just crashed is the crash's consequence.
            if let Some(i) = self.unresolved_of(IncidentKind::Crash, &f, |_| true) {
                return self.attach(i, f, now);
            }
        }
        if f.kind == IncidentKind::Crash {
            // Ranks that give up waiting for a hung peer (the process group's own
            // timeout fires) or are torn down around it are the hang's victims: their
            // exits are evidence on the hang, which stays open naming the rank that
            // stopped. So is a teardown that takes the hung rank down with the others
            // (the job killed as a whole: a crash naming ranks beside the hang's), and
            // any crash after a hang that names no rank (from logs: only its node, or
            // nobody). A crash of the hang's own culprits alone is its root cause
            // (below).
            let victims = |inc: &Incident| {
                f.onset >= inc.onset
                    && (inc.ranks.is_empty() || f.ranks.iter().any(|r| !inc.ranks.contains(r)))
            };
            if let Some(i) = self.unresolved_of(IncidentKind::Hang, &f, victims) {
                self.extra[i].last_refresh = now;
                return self.attach(i, f, now);
            }
        }
        // A root cause that arrives after its symptom takes the symptom's incident over.
        let symptom = match f.kind {
            IncidentKind::GpuFault => (0..self.incidents.len()).rev().find(|&i| {
                let inc = &self.incidents[i];
                matches!(inc.kind, IncidentKind::Hang | IncidentKind::Crash)
                    && inc.state != IncidentState::Resolved
                    && intersects(&inc.ranks, &f.ranks)
                    && (f.severity == Severity::Critical && f.confidence >= 0.99
                        || inc.onset.secs_since(f.onset).abs() <= self.config.explain_window_secs)
            }),
            IncidentKind::Crash => self.unresolved_of(IncidentKind::Hang, &f, |inc| {
                intersects(&inc.ranks, &f.ranks)
            }),
            _ => None,
        };
        if let Some(i) = symptom {
            return self.reclassify(i, f, now);
        }
        Some(self.open(f, now))
    }

    /// The latest unresolved incident of `kind` in `f`'s job that `also` accepts.
    fn unresolved_of(
        &self,
        kind: IncidentKind,
        f: &Finding,
        also: impl Fn(&Incident) -> bool,
    ) -> Option<usize> {
        (0..self.incidents.len()).rev().find(|&i| {
            let inc = &self.incidents[i];
            inc.kind == kind
                && inc.job == f.job
                && inc.state != IncidentState::Resolved
                && also(inc)
        })
    }

    fn open(&mut self, f: Finding, now: Timestamp) -> IncidentChange {
        let mut id;
        loop {
            self.counter += 1;
            id = format!("inc-{:013}-{:04}", now.0 / 1_000_000, self.counter);
            if !self.index.contains_key(&id) {
                break;
            }
        }
        let fatal = f.kind == IncidentKind::GpuFault && f.confidence >= 0.99;
        let mut inc = Incident {
            id: id.clone(),
            kind: f.kind,
            job: f.job,
            state: IncidentState::Open,
            acknowledged: false,
            severity: f.severity,
            ranks: f.ranks,
            nodes: f.nodes,
            gpus: f.gpus,
            onset: f.onset.min(now),
            detected_at: now,
            updated_at: now,
            resolved_at: None,
            confidence: f.confidence,
            summary: f.summary,
            evidence: f.evidence.clone(),
            finding_count: 1,
            timeline: Vec::new(),
            diagnosis: None,
        };
        let opened = format!("opened: {}", inc.summary);
        push_timeline(&mut inc, now, opened);
        self.index.insert(id.clone(), self.incidents.len());
        self.incidents.push(inc);
        self.extra.push(Extra {
            last_refresh: now,
            root_evidence: f.evidence,
            attached: Vec::new(),
            fatal,
            resolved_by_hand: None,
        });
        IncidentChange {
            id,
            change: Change::Opened,
        }
    }

    fn refresh(&mut self, i: usize, mut f: Finding, now: Timestamp) -> Option<IncidentChange> {
        if f.job.is_none() && self.incidents[i].job.is_some() {
            // The job left the faulty GPU: the incident still tells of the ranks it hit.
            f.ranks.clone_from(&self.incidents[i].ranks);
            f.summary.clone_from(&self.incidents[i].summary);
        }
        let extra = &mut self.extra[i];
        if self.incidents[i].state == IncidentState::Resolved
            && extra.resolved_by_hand.is_some_and(|t| f.onset <= t)
        {
            // A person resolved it while this very condition was known: absorbed.
            extra.last_refresh = now;
            return None;
        }
        extra.last_refresh = now;
        if f.kind == IncidentKind::Hang
            && f.ranks.is_empty()
            && !self.incidents[i].ranks.is_empty()
            && f.confidence < self.incidents[i].confidence
            && self.incidents[i].state != IncidentState::Resolved
        {
            // A hang pinned on the ranks that never entered, now seen with everyone
            // inside: the culprit arrived late (a stopped process continued, as a
            // job's teardown does with SIGCONT before SIGTERM). The weaker guess
            // (suspect the shared GPUs or links) does not replace the named culprit.
            self.incidents[i].finding_count = self.incidents[i].finding_count.saturating_add(1);
            return None;
        }
        extra.fatal |= f.kind == IncidentKind::GpuFault && f.confidence >= 0.99;
        extra.root_evidence = f.evidence;
        let inc = &mut self.incidents[i];
        inc.finding_count = inc.finding_count.saturating_add(1);
        let mut change = None;
        if inc.state == IncidentState::Resolved {
            inc.state = IncidentState::Open;
            inc.resolved_at = None;
            push_timeline(inc, now, format!("reopened: {}", f.summary));
            change = Some(Change::Updated);
        }
        if inc.ranks != f.ranks || inc.nodes != f.nodes || inc.gpus != f.gpus {
            inc.ranks = f.ranks;
            inc.nodes = f.nodes;
            inc.gpus = f.gpus;
            push_timeline(inc, now, format!("culprit revised: {}", f.summary));
            change = Some(Change::Updated);
        }
        inc.severity = inc.severity.max(f.severity);
        inc.confidence = f.confidence;
        inc.summary = f.summary;
        inc.updated_at = now;
        self.rebuild_evidence(i);
        change.map(|change| IncidentChange {
            id: self.incidents[i].id.clone(),
            change,
        })
    }

    fn attach(&mut self, i: usize, f: Finding, now: Timestamp) -> Option<IncidentChange> {
        let key = format!("{}:{}", f.kind, culprit_text(&f));
        let note = Evidence {
            at: f.onset,
            text: format!("consequence ({}): {}", f.kind, f.summary),
        };
        let extra = &mut self.extra[i];
        let first = !extra.attached.iter().any(|(k, _)| *k == key);
        match extra.attached.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 = note,
            None => extra.attached.push((key, note)),
        }
        let inc = &mut self.incidents[i];
        inc.finding_count = inc.finding_count.saturating_add(1);
        inc.updated_at = now;
        if first {
            push_timeline(
                inc,
                now,
                format!("{} attached as a consequence: {}", f.kind, f.summary),
            );
        }
        self.rebuild_evidence(i);
        first.then(|| IncidentChange {
            id: self.incidents[i].id.clone(),
            change: Change::Updated,
        })
    }

    fn reclassify(&mut self, i: usize, f: Finding, now: Timestamp) -> Option<IncidentChange> {
        let old = {
            let inc = &self.incidents[i];
            Finding {
                kind: inc.kind,
                job: inc.job.clone(),
                ranks: inc.ranks.clone(),
                nodes: inc.nodes.clone(),
                gpus: inc.gpus.clone(),
                onset: inc.onset,
                confidence: inc.confidence,
                severity: inc.severity,
                summary: inc.summary.clone(),
                evidence: vec![],
            }
        };
        let from = old.kind;
        let extra = &mut self.extra[i];
        extra.last_refresh = now;
        extra.fatal = f.kind == IncidentKind::GpuFault && f.confidence >= 0.99;
        extra.root_evidence = f.evidence;
        extra.attached.push((
            format!("{}:{}", old.kind, culprit_text(&old)),
            Evidence {
                at: old.onset,
                text: format!("consequence ({}): {}", old.kind, old.summary),
            },
        ));
        let inc = &mut self.incidents[i];
        inc.kind = f.kind;
        if f.job.is_some() {
            inc.job = f.job;
        }
        inc.ranks = f.ranks;
        inc.nodes = f.nodes;
        inc.gpus = f.gpus;
        inc.onset = inc.onset.min(f.onset);
        inc.confidence = f.confidence;
        inc.severity = inc.severity.max(f.severity);
        inc.summary = f.summary;
        inc.updated_at = now;
        inc.finding_count = inc.finding_count.saturating_add(1);
        let what = format!(
            "root cause re-attributed from {from} to {}: {}",
            inc.kind, inc.summary
        );
        push_timeline(inc, now, what);
        self.rebuild_evidence(i);
        Some(IncidentChange {
            id: self.incidents[i].id.clone(),
            change: Change::Reclassified,
        })
    }

    fn rebuild_evidence(&mut self, i: usize) {
        let extra = &self.extra[i];
        let mut ev = extra.root_evidence.clone();
        ev.extend(extra.attached.iter().map(|(_, e)| e.clone()));
        ev.truncate(MAX_EVIDENCE);
        self.incidents[i].evidence = ev;
    }
}

fn push_timeline(inc: &mut Incident, at: Timestamp, what: String) {
    if inc.timeline.len() >= MAX_TIMELINE {
        inc.timeline.remove(1);
    }
    inc.timeline.push(TimelineEntry { at, what });
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_model::GpuRef;

    fn t(s: f64) -> Timestamp {
        Timestamp::from_secs_f64(1000.0 + s)
    }

    fn finding(
        kind: IncidentKind,
        ranks: &[u32],
        node: &str,
        gpu: Option<u32>,
        onset: f64,
        conf: f64,
    ) -> Finding {
        Finding {
            kind,
            job: Some("j".into()),
            ranks: ranks.to_vec(),
            nodes: vec![node.into()],
            gpus: gpu
                .map(|index| {
                    vec![GpuRef {
                        node: node.into(),
                        index,
                    }]
                })
                .unwrap_or_default(),
            onset: t(onset),
            confidence: conf,
            severity: Severity::Critical,
            summary: format!("{kind} on {node}"),
            evidence: vec![],
        }
    }

    fn fold(book: &mut IncidentBook, now: f64, fs: Vec<Finding>) -> Vec<IncidentChange> {
        book.fold(Verdicts { findings: fs }, t(now))
    }

    #[test]
    fn a_hand_resolved_incident_stays_resolved_until_the_fault_comes_back() {
        let mut b = IncidentBook::default();
        let f = finding(IncidentKind::GpuFault, &[7], "node-3", Some(3), 0.0, 0.99);
        let id = fold(&mut b, 1.0, vec![f.clone()])[0].id.clone();
        let c = b
            .resolve_by(&id, "alice", "GPU replaced", t(2.0))
            .expect("live");
        assert_eq!(c.change, Change::Resolved);
        assert_eq!(
            b.resolve_by(&id, "alice", "again", t(2.5)),
            Err(ManualError::Resolved)
        );
        // The detector still reports the same fault: absorbed, not reopened.
        assert!(fold(&mut b, 3.0, vec![f.clone()]).is_empty());
        assert_eq!(b.get(&id).map(|i| i.state), Some(IncidentState::Resolved));
        // A fault that began after the resolve reopens it.
        let again = finding(IncidentKind::GpuFault, &[7], "node-3", Some(3), 4.0, 0.99);
        let changes = fold(&mut b, 5.0, vec![again]);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(b.get(&id).map(|i| i.state), Some(IncidentState::Open));
        assert_eq!(b.all().len(), 1);
        // Acknowledging is idempotent.
        assert!(
            b.acknowledge(&id, "bob", "", t(6.0))
                .expect("live")
                .is_some()
        );
        assert!(
            b.acknowledge(&id, "bob", "", t(7.0))
                .expect("live")
                .is_none()
        );
        assert_eq!(
            b.acknowledge("nope", "bob", "", t(7.0)),
            Err(ManualError::Unknown)
        );
    }

    #[test]
    fn a_diagnosis_moves_an_open_incident_to_diagnosed_and_leaves_the_culprit() {
        let mut b = IncidentBook::default();
        let f = finding(IncidentKind::GpuFault, &[75], "node-09", Some(3), 0.0, 0.99);
        let id = fold(&mut b, 1.0, vec![f])[0].id.clone();
        let d = IncidentDiagnosis {
            category: Some("gpu_hardware_xid".into()),
            fault_locus: Some("hardware".into()),
            nodes: vec!["node-07".into()],
            culprit: "host node-07".into(),
            confidence: 0.9,
            source: "rules".into(),
            ..IncidentDiagnosis::default()
        };
        let change = b.attach_diagnosis(&id, d, t(2.0)).expect("known incident");
        assert_eq!(change.change, Change::Diagnosed);
        let inc = b.get(&id).expect("incident");
        assert_eq!(inc.state, IncidentState::Diagnosed);
        assert_eq!(inc.nodes, vec!["node-09".to_owned()], "culprit untouched");
        assert!(
            inc.timeline
                .last()
                .is_some_and(|e| e.what.contains("gpu_hardware_xid")),
            "{:?}",
            inc.timeline
        );
        assert!(
            b.attach_diagnosis("inc-none", IncidentDiagnosis::default(), t(3.0))
                .is_none()
        );
    }

    #[test]
    fn a_job_note_goes_on_the_jobs_unresolved_incidents_only() {
        let mut b = IncidentBook::default();
        let open = fold(
            &mut b,
            1.0,
            vec![finding(IncidentKind::Hang, &[3], "node-01", None, 0.0, 0.9)],
        )[0]
        .id
        .clone();
        let mut other = finding(IncidentKind::Straggler, &[1], "node-02", None, 0.0, 0.9);
        other.job = Some("k".into());
        fold(&mut b, 1.0, vec![other]);
        assert_eq!(b.note_job("j", "slurm job 7 ended", t(2.0)), 1);
        let inc = b.get(&open).expect("incident");
        assert_eq!(
            inc.timeline.last().map(|e| (e.what.as_str(), e.at)),
            Some(("slurm job 7 ended", t(2.0)))
        );
        fold(&mut b, 30.0, vec![]);
        assert_eq!(
            b.get(&open).expect("incident").state,
            IncidentState::Resolved
        );
        assert_eq!(
            b.note_job("j", "again", t(31.0)),
            0,
            "resolved ones are left alone"
        );
    }

    #[test]
    fn a_nan_that_names_no_rank_opens_an_incident_of_the_job_and_a_named_rank_revises_it() {
        let mut b = IncidentBook::default();
        let mut nobody = finding(IncidentKind::Nan, &[], "x", None, 0.0, 0.1);
        nobody.nodes.clear();
        nobody.summary = "job j reported a non-finite loss at step 10; the rank is unknown".into();
        let changes = fold(&mut b, 1.0, vec![nobody.clone()]);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].change, Change::Opened);
        let inc = &b.all()[0];
        assert_eq!(inc.job.as_deref(), Some("j"));
        assert!(inc.ranks.is_empty() && inc.nodes.is_empty() && inc.gpus.is_empty());
        assert_eq!(inc.state, IncidentState::Open);
        assert!(
            fold(&mut b, 2.0, vec![nobody]).is_empty(),
            "the same incident"
        );
        let named = finding(IncidentKind::Nan, &[3], "node-01", Some(3), 0.0, 0.95);
        let changes = fold(&mut b, 3.0, vec![named]);
        assert_eq!(changes.len(), 1);
        assert_eq!(b.all().len(), 1);
        assert_eq!(b.all()[0].ranks, [3]);
        assert!(
            b.all()[0]
                .timeline
                .iter()
                .any(|e| e.what.starts_with("culprit revised")),
            "{:?}",
            b.all()[0].timeline
        );
    }

    #[test]
    fn repeated_findings_make_one_incident() {
        let mut b = IncidentBook::default();
        let f = finding(IncidentKind::Straggler, &[40], "node-05", None, 0.0, 0.9);
        assert_eq!(fold(&mut b, 1.0, vec![f.clone()]).len(), 1);
        for s in 2..20 {
            assert!(fold(&mut b, f64::from(s), vec![f.clone()]).is_empty());
        }
        assert_eq!(b.all().len(), 1);
        assert_eq!(b.all()[0].finding_count, 19);
    }

    #[test]
    fn a_named_hang_culprit_is_not_replaced_by_everyone_inside() {
        let mut b = IncidentBook::default();
        let named = finding(IncidentKind::Hang, &[2], "node-02", None, 0.0, 0.8);
        assert_eq!(fold(&mut b, 1.0, vec![named]).len(), 1);
        // The stopped rank continued and entered: everyone is inside, nobody finished.
        let mut vague = finding(IncidentKind::Hang, &[], "node-01", None, 0.0, 0.3);
        vague.nodes = vec!["node-01".into(), "node-02".into(), "node-03".into()];
        vague.summary = "all 6 members entered and none completed".into();
        assert!(fold(&mut b, 2.0, vec![vague.clone()]).is_empty());
        let inc = &b.all()[0];
        assert_eq!(inc.ranks, [2]);
        assert_eq!(inc.nodes, ["node-02"]);
        assert!(
            inc.timeline
                .iter()
                .all(|e| !e.what.starts_with("culprit revised"))
        );
        // A stronger finding still revises: another rank is named with more confidence.
        let other = finding(IncidentKind::Hang, &[5], "node-03", None, 0.0, 0.9);
        assert_eq!(fold(&mut b, 3.0, vec![other]).len(), 1);
        assert_eq!(b.all()[0].ranks, [5]);
        // And a hang that named nobody takes a culprit when one is found.
        let mut b = IncidentBook::default();
        assert_eq!(fold(&mut b, 1.0, vec![vague]).len(), 1);
        let named = finding(IncidentKind::Hang, &[2], "node-02", None, 0.0, 0.8);
        assert_eq!(fold(&mut b, 2.0, vec![named]).len(), 1);
        assert_eq!(b.all()[0].ranks, [2]);
    }

    #[test]
    fn a_gpu_fault_the_job_left_stays_one_incident() {
        let mut b = IncidentBook::default();
        let hit = finding(IncidentKind::GpuFault, &[4, 5], "node-03", None, 0.0, 0.99);
        assert_eq!(fold(&mut b, 1.0, vec![hit]).len(), 1);
        // The job was restarted on other nodes; the node's fault is still there.
        let mut left = finding(IncidentKind::GpuFault, &[], "node-03", None, 0.0, 0.99);
        left.job = None;
        left.summary = "node-03 reported XID 79".into();
        for s in 2..10 {
            assert!(fold(&mut b, f64::from(s), vec![left.clone()]).is_empty());
        }
        assert_eq!(b.all().len(), 1, "{:#?}", b.all());
        let inc = &b.all()[0];
        assert_eq!(inc.job.as_deref(), Some("j"));
        assert_eq!(inc.ranks, [4, 5], "the ranks it hit are kept");
        assert_eq!(inc.finding_count, 9);
        assert!(
            inc.timeline
                .iter()
                .all(|e| !e.what.starts_with("culprit revised"))
        );
    }

    #[test]
    fn a_hang_after_a_fatal_xid_is_evidence_on_the_gpu_fault() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            1.0,
            vec![finding(
                IncidentKind::GpuFault,
                &[75],
                "node-09",
                Some(3),
                0.5,
                0.99,
            )],
        );
        let ch = fold(
            &mut b,
            5.0,
            vec![
                finding(IncidentKind::GpuFault, &[75], "node-09", Some(3), 0.5, 0.99),
                finding(IncidentKind::Hang, &[75], "node-09", Some(3), 0.0, 0.97),
            ],
        );
        assert_eq!(b.all().len(), 1, "{:?}", b.all());
        assert_eq!(b.all()[0].kind, IncidentKind::GpuFault);
        assert_eq!(ch.len(), 1);
        assert!(
            b.all()[0]
                .evidence
                .iter()
                .any(|e| e.text.contains("consequence (hang)"))
        );
    }

    #[test]
    fn a_gpu_fault_reported_after_the_hang_takes_the_incident_over() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            4.0,
            vec![finding(
                IncidentKind::Hang,
                &[75],
                "node-09",
                Some(3),
                0.0,
                0.97,
            )],
        );
        let ch = fold(
            &mut b,
            6.0,
            vec![
                finding(IncidentKind::Hang, &[75], "node-09", Some(3), 0.0, 0.97),
                finding(IncidentKind::GpuFault, &[75], "node-09", Some(3), 0.5, 0.99),
            ],
        );
        assert_eq!(b.all().len(), 1);
        assert_eq!(b.all()[0].kind, IncidentKind::GpuFault);
        assert!(ch.iter().any(|c| c.change == Change::Reclassified));
    }

    #[test]
    fn an_old_non_fatal_xid_does_not_swallow_a_later_hang() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            1.0,
            vec![finding(
                IncidentKind::GpuFault,
                &[75],
                "node-09",
                Some(3),
                0.5,
                0.9,
            )],
        );
        fold(
            &mut b,
            300.0,
            vec![
                finding(IncidentKind::GpuFault, &[75], "node-09", Some(3), 0.5, 0.9),
                finding(IncidentKind::Hang, &[75], "node-09", Some(3), 295.0, 0.97),
            ],
        );
        let kinds: Vec<IncidentKind> = b.all().iter().map(|i| i.kind).collect();
        assert_eq!(kinds, vec![IncidentKind::GpuFault, IncidentKind::Hang]);
    }

    #[test]
    fn a_hang_inside_a_collective_on_a_node_with_a_fatal_xid_is_that_fault() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            1.0,
            vec![finding(
                IncidentKind::GpuFault,
                &[75],
                "node-09",
                Some(3),
                0.5,
                0.99,
            )],
        );
        let mut hang = finding(IncidentKind::Hang, &[], "node-09", None, 0.4, 0.3);
        hang.nodes.push("node-10".into());
        fold(&mut b, 5.0, vec![hang]);
        assert_eq!(b.all().len(), 1, "{:?}", b.all());
        assert_eq!(b.all()[0].kind, IncidentKind::GpuFault);
    }

    #[test]
    fn a_hang_in_a_crashed_job_is_the_crash() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            2.0,
            vec![finding(
                IncidentKind::Crash,
                &[7],
                "node-00",
                None,
                1.0,
                0.97,
            )],
        );
        fold(
            &mut b,
            4.0,
            vec![finding(
                IncidentKind::Hang,
                &[3],
                "node-00",
                None,
                1.0,
                0.97,
            )],
        );
        assert_eq!(b.all().len(), 1);
        assert_eq!(b.all()[0].kind, IncidentKind::Crash);
    }

    #[test]
    fn the_waiters_timing_out_after_a_hang_are_evidence_on_the_hang_which_stays_open() {
        let mut b = IncidentBook::default();
        let hang = finding(IncidentKind::Hang, &[5], "node-01", None, 1.0, 0.97);
        for t in [4.0, 5.0, 6.0] {
            fold(&mut b, t, vec![hang.clone()]);
        }
        // 120 s later the process group's timeout fires on the waiters: rank 2 first.
        // The hang finding stops (most ranks exited); the crash finding names the
        // first waiter to give up, every pass from then on.
        for t in [126.0, 140.0, 160.0, 200.0] {
            fold(
                &mut b,
                t,
                vec![finding(
                    IncidentKind::Crash,
                    &[2],
                    "node-00",
                    None,
                    125.0,
                    0.85,
                )],
            );
        }
        assert_eq!(b.all().len(), 1, "{:#?}", b.all());
        let inc = &b.all()[0];
        assert_eq!(inc.kind, IncidentKind::Hang);
        assert_eq!(inc.ranks, vec![5]);
        assert_ne!(inc.state, IncidentState::Resolved);
        assert!(
            inc.evidence
                .iter()
                .any(|e| e.text.starts_with("consequence (crash)")),
            "{:#?}",
            inc.evidence
        );
    }

    #[test]
    fn a_crash_after_a_hang_from_the_logs_naming_only_its_node_is_evidence_on_it() {
        let mut b = IncidentBook::default();
        let hang = finding(IncidentKind::Hang, &[], "node-01", None, 1.0, 0.5);
        fold(&mut b, 24.0, vec![hang.clone()]);
        let crash = finding(IncidentKind::Crash, &[1], "node-00", None, 21.2, 0.5);
        for t in [27.0, 28.0, 40.0] {
            fold(&mut b, t, vec![hang.clone(), crash.clone()]);
        }
        assert_eq!(b.all().len(), 1, "{:#?}", b.all());
        assert_eq!(b.all()[0].kind, IncidentKind::Hang);
        assert_eq!(b.all()[0].nodes, vec!["node-01".to_string()]);
    }

    #[test]
    fn a_job_torn_down_as_a_whole_after_a_hang_keeps_the_hang_and_its_culprit() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            4.0,
            vec![finding(
                IncidentKind::Hang,
                &[2],
                "node-01",
                None,
                1.0,
                0.97,
            )],
        );
        // The job is killed as a whole (scheduler, operator): every rank at once, the
        // hung one among them.
        fold(
            &mut b,
            30.0,
            vec![finding(
                IncidentKind::Crash,
                &[0, 1, 2, 3],
                "node-00",
                None,
                29.0,
                0.85,
            )],
        );
        assert_eq!(b.all().len(), 1, "{:#?}", b.all());
        let inc = &b.all()[0];
        assert_eq!(
            (inc.kind, inc.ranks.as_slice()),
            (IncidentKind::Hang, &[2][..])
        );
        assert!(
            inc.evidence
                .iter()
                .any(|e| e.text.starts_with("consequence (crash)")),
            "{:#?}",
            inc.evidence
        );
    }

    #[test]
    fn a_crash_of_the_hung_rank_itself_is_the_root_cause() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            4.0,
            vec![finding(
                IncidentKind::Hang,
                &[5],
                "node-01",
                None,
                1.0,
                0.97,
            )],
        );
        fold(
            &mut b,
            6.0,
            vec![finding(
                IncidentKind::Crash,
                &[5],
                "node-01",
                None,
                5.0,
                0.97,
            )],
        );
        assert_eq!(b.all().len(), 1);
        assert_eq!(b.all()[0].kind, IncidentKind::Crash);
    }

    #[test]
    fn an_incident_resolves_when_its_finding_stops_and_reopens_if_it_returns() {
        let mut b = IncidentBook::default();
        let f = finding(IncidentKind::Hang, &[1], "node-00", None, 0.0, 0.9);
        fold(&mut b, 1.0, vec![f.clone()]);
        let ch = fold(&mut b, 20.0, vec![]);
        assert_eq!(ch[0].change, Change::Resolved);
        assert_eq!(b.all()[0].state, IncidentState::Resolved);
        fold(&mut b, 30.0, vec![f]);
        assert_eq!(b.all().len(), 1);
        assert_eq!(b.all()[0].state, IncidentState::Open);
        assert!(
            b.all()[0]
                .timeline
                .iter()
                .any(|e| e.what.starts_with("reopened"))
        );
    }

    #[test]
    fn stragglers_on_different_nodes_are_different_incidents() {
        let mut b = IncidentBook::default();
        fold(
            &mut b,
            1.0,
            vec![
                finding(IncidentKind::Straggler, &[8], "node-01", None, 0.0, 0.9),
                finding(IncidentKind::Straggler, &[40], "node-05", None, 0.0, 0.9),
            ],
        );
        assert_eq!(b.all().len(), 2);
    }
}
