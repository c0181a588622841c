//! The engine: decode → job state → detectors → incidents, driven by an injected clock.
//!
//! One `Engine` holds the whole controller brain. The HTTP ingest endpoint and the
//! simulator's in-process transport both call [`Engine::ingest`] with the encoded batch,
//! so the same decode and state code runs in both; [`Engine::tick`] runs the detectors
//! at a time the caller chooses (a timer in production, virtual time in simulation).

use std::collections::BTreeMap;

use warden_model::wire::{Batch, DecodeError};
use warden_model::{
    Incident, IncidentDiagnosis, IncidentKind, IncidentState, JobId, NodeName, Timestamp,
};

use crate::detect::{DetectConfig, Detectors};
use crate::incidents::{IncidentBook, ManualError};
use crate::ledger::{JobContext, JobPhase, Ledger, LedgerConfig};
use crate::lifecycle::{Applied, LifecycleEvent, LifecycleReport};
use crate::state::{Cluster, GpuTrouble, JobState, NO_NODE, RankProgress};
use warden_model::view::{IncidentView, JobView, RankView};

/// How an ingest body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Envelope + protobuf (`application/vnd.warden.batch`).
    Binary,
    /// JSON (`application/json`), for debugging.
    Json,
}

/// Engine settings.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Detector settings.
    pub detect: DetectConfig,
    /// Bounds on what the engine holds, whatever clients send.
    pub limits: crate::state::Limits,
    /// The node-health ledger's thresholds.
    pub ledger: LedgerConfig,
}

/// Counters the engine keeps about itself; `/metrics` exports them.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    /// Batches accepted.
    pub batches: u64,
    /// Batches rejected, by reason label (`truncated`, `malformed`, ...).
    pub rejected: BTreeMap<&'static str, u64>,
    /// Body bytes accepted.
    pub bytes: u64,
    /// Collective events applied.
    pub collective_events: u64,
    /// Other records applied (metrics, processes, logs, node events, registrations).
    pub other_records: u64,
    /// Records ignored as duplicates or stale.
    pub stale_records: u64,
    /// Records dropped because a bound of [`crate::state::Limits`] was reached, by
    /// bound (`jobs`, `ranks`, `comms`, `nodes`, `gpu_codes`).
    pub refused: BTreeMap<&'static str, u64>,
    /// Batches whose agent sequence number showed earlier batches missing.
    pub batch_gaps: u64,
    /// Detector passes run.
    pub ticks: u64,
    /// Findings produced, by kind.
    pub findings: BTreeMap<IncidentKind, u64>,
    /// Seconds between an event and its detection, per incident opened, by kind.
    pub detection_latency_s: Vec<(IncidentKind, f64)>,
    /// Lag between agent send time (corrected for clock offset) and receipt, last batch.
    pub ingest_lag_s: f64,
    /// Scheduler lifecycle reports accepted (repeats included), by event and scheduler
    /// label ([`LifecycleReport::metric_scheduler`]).
    pub lifecycle_events: BTreeMap<(&'static str, &'static str), u64>,
}

/// What changed about an incident during a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A new incident.
    Opened,
    /// New evidence or a wider culprit set on an existing one.
    Updated,
    /// Its root cause was re-attributed (e.g. a hang turned out to follow a GPU fault).
    Reclassified,
    /// The condition cleared.
    Resolved,
    /// A log diagnosis was attached.
    Diagnosed,
    /// A person acknowledged it.
    Acknowledged,
    /// Remediation acted on it (or, in a dry run, said what it would do).
    Remediated,
}

/// A change to one incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentChange {
    /// Incident id.
    pub id: String,
    /// What happened to it.
    pub change: Change,
}

/// Decode → state → detect → incidents.
#[derive(Debug)]
pub struct Engine {
    origin: Timestamp,
    cluster: Cluster,
    detectors: Detectors,
    book: IncidentBook,
    ledger: Ledger,
    stats: EngineStats,
    last_forget: Timestamp,
    event_batches: u64,
}

/// Jobs and hardware trouble silent this long are forgotten, seconds (their incidents
/// stay).
const RETENTION_SECS: f64 = 3600.0;

impl Engine {
    /// A fresh engine. `origin` is time zero for the `*_s` fields of views.
    pub fn new(config: EngineConfig, origin: Timestamp) -> Self {
        Engine {
            origin,
            cluster: Cluster::with_limits(config.limits),
            detectors: Detectors::new(config.detect),
            book: IncidentBook::default(),
            ledger: Ledger::new(config.ledger),
            stats: EngineStats::default(),
            last_forget: origin,
            event_batches: 0,
        }
    }

    /// How many batches carrying node events (kernel-log XIDs and the like, which an
    /// agent sends once) were applied so far, repeats included.
    pub fn event_batches(&self) -> u64 {
        self.event_batches
    }

    /// Time zero of views.
    pub fn origin(&self) -> Timestamp {
        self.origin
    }

    /// Decode one encoded batch and apply it. On error nothing is applied and the
    /// rejection is counted by reason.
    pub fn ingest(
        &mut self,
        body: &[u8],
        encoding: Encoding,
        received_at: Timestamp,
    ) -> Result<usize, DecodeError> {
        let decoded = match encoding {
            Encoding::Binary => Batch::decode_binary(body),
            Encoding::Json => Batch::decode_json(body),
        };
        match decoded {
            Ok(batch) => {
                self.stats.bytes += body.len() as u64;
                Ok(self.apply(batch, received_at))
            }
            Err(e) => {
                *self.stats.rejected.entry(e.reason()).or_default() += 1;
                Err(e)
            }
        }
    }

    /// Count a rejection decided outside the engine (e.g. `too_large` at the HTTP layer).
    pub fn count_rejection(&mut self, reason: &'static str) {
        *self.stats.rejected.entry(reason).or_default() += 1;
    }

    /// Apply an already decoded batch; returns the number of records applied.
    pub fn apply(&mut self, batch: Batch, received_at: Timestamp) -> usize {
        self.stats.batches += 1;
        if !batch.events.is_empty() {
            self.event_batches += 1;
        }
        self.cluster.apply(batch, received_at, &mut self.stats)
    }

    /// Apply a scheduler's report that `job` started or ended, received at `now`
    /// (`POST /api/v1/jobs/{job}/lifecycle`). Creates the job's state when no agent
    /// reported it yet; a repeat changes nothing. An end stops new hang, straggler and
    /// slow-link findings for the job, and crash and NaN findings whose onset is after
    /// it (its teardown), and is noted on the timeline of its open incidents.
    /// How an end says the job ended is kept for the job's view and written in the
    /// end's timeline note, so a person sees whether the job failed, was killed or
    /// finished.
    pub fn lifecycle(&mut self, job: &str, report: &LifecycleReport, now: Timestamp) -> Applied {
        let applied = self.cluster.apply_lifecycle(job, report, now);
        *self
            .stats
            .lifecycle_events
            .entry((report.event.as_str(), report.metric_scheduler()))
            .or_default() += 1;
        if applied == Applied::Changed {
            let what = match report.event {
                LifecycleEvent::Start => format!(
                    "{} job {} started on {} node(s)",
                    report.scheduler,
                    report.scheduler_job_id,
                    report.nodes.len()
                ),
                LifecycleEvent::End => format!(
                    "{} job {} ended: {}no new hang, straggler or slow-link findings for it",
                    report.scheduler,
                    report.scheduler_job_id,
                    report.end.describe().map(|d| d + "; ").unwrap_or_default()
                ),
            };
            self.book.note_job(job, &what, now);
        }
        applied
    }

    /// The phase a scheduler reported for `job` (`None`: unknown job, or no report).
    pub fn job_phase(&self, job: &str) -> Option<crate::lifecycle::Phase> {
        self.cluster
            .jobs
            .get(job)
            .and_then(|j| j.lifecycle.as_ref())
            .map(crate::lifecycle::JobLifecycle::phase)
    }

    /// What the scheduler last said about job `job`, when it said anything.
    pub fn job_lifecycle(&self, job: &str) -> Option<crate::lifecycle::JobLifecycle> {
        self.cluster.jobs.get(job).and_then(|j| j.lifecycle.clone())
    }

    /// Remediation is about to restart job `job` (at `at`, controller clock): the
    /// exits of its ranks from now until it starts again are the restart, not a crash.
    /// `None`: the restart did not happen after all, and exits are crashes again.
    pub fn restart_requested(&mut self, job: &str, at: Option<Timestamp>) {
        if let Some(j) = self.cluster.jobs.get_mut(job) {
            j.restart_requested_at = at;
        }
    }

    /// The nodes job `job` runs on: those its ranks were reported from and those its
    /// scheduler allocated. Empty for an unknown job.
    pub fn job_nodes(&self, job: &str) -> Vec<String> {
        let Some(j) = self.cluster.jobs.get(job) else {
            return Vec::new();
        };
        let mut nodes: Vec<String> = j
            .ranks
            .values()
            .filter(|r| r.known && r.node != crate::state::NO_NODE)
            .map(|r| self.cluster.node_name(r.node).to_owned())
            .chain(j.lifecycle.iter().flat_map(|l| l.nodes.iter().cloned()))
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Run every detector at `now` and fold their findings into incidents.
    pub fn tick(&mut self, now: Timestamp) -> Vec<IncidentChange> {
        self.stats.ticks += 1;
        if now.secs_since(self.last_forget) >= 60.0 {
            self.cluster.forget_older_than(now, RETENTION_SECS);
            self.ledger.tick(now);
            self.last_forget = now;
        }
        let verdicts = self.detectors.run(&self.cluster, now);
        for f in &verdicts.findings {
            *self.stats.findings.entry(f.kind).or_default() += 1;
        }
        let changes = self.book.fold(verdicts, now);
        for c in &changes {
            if c.change == Change::Opened
                && let Some(inc) = self.book.get(&c.id)
            {
                self.stats
                    .detection_latency_s
                    .push((inc.kind, inc.detected_at.secs_since(inc.onset).max(0.0)));
            }
        }
        self.fold_into_ledger(&changes, now);
        changes
    }

    /// Fold incidents that opened or whose evidence, culprit or diagnosis changed into
    /// the node-health ledger, each with its job's context.
    fn fold_into_ledger(&mut self, changes: &[IncidentChange], now: Timestamp) {
        for c in changes {
            if !matches!(
                c.change,
                Change::Opened | Change::Updated | Change::Reclassified | Change::Diagnosed
            ) {
                continue;
            }
            let Some(inc) = self.book.get(&c.id) else {
                continue;
            };
            let ctx = self.job_context(inc);
            self.ledger.observe(inc, &ctx, now);
        }
    }

    /// The job an incident came from and what it was doing at the incident's onset:
    /// tearing down once the scheduler reported its end, remediation asked for its
    /// restart, or one of its ranks exited before the onset; starting in its first
    /// [`LedgerConfig::starting_secs`] after the scheduler reported its start.
    pub fn job_context(&self, inc: &Incident) -> JobContext {
        let Some(name) = inc.job.clone() else {
            return JobContext {
                job: None,
                phase: JobPhase::Unknown,
            };
        };
        let Some(j) = self.cluster.jobs.get(&name) else {
            return JobContext {
                job: Some(name),
                phase: JobPhase::Unknown,
            };
        };
        let onset = inc.onset;
        let life = j.lifecycle.as_ref();
        let ended = life.and_then(|l| l.ended_at).is_some_and(|e| e <= onset);
        let restarting = j.restart_requested_at.is_some_and(|r| r <= onset);
        let exited = j
            .ranks
            .values()
            .any(|r| r.exit.as_ref().is_some_and(|e| e.at < onset));
        let phase = if ended || restarting || exited {
            JobPhase::TearingDown
        } else if life
            .and_then(|l| l.started_at)
            .is_some_and(|s| onset.secs_since(s) < self.ledger.config().starting_secs)
        {
            JobPhase::Starting
        } else {
            JobPhase::Running
        };
        JobContext {
            job: Some(name),
            phase,
        }
    }

    /// The node-health ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The node-health ledger, for verification results, people's decisions and
    /// restoring what the store held.
    pub fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Take back stored incidents (see [`IncidentBook::restore`]).
    pub fn restore_incidents(&mut self, incidents: Vec<Incident>, now: Timestamp) -> usize {
        self.book.restore(incidents, now)
    }

    /// A person acknowledged an incident (see [`IncidentBook::acknowledge`]).
    pub fn acknowledge(
        &mut self,
        id: &str,
        actor: &str,
        note: &str,
        now: Timestamp,
    ) -> Result<Option<IncidentChange>, ManualError> {
        self.book.acknowledge(id, actor, note, now)
    }

    /// Note what remediation did on an incident's timeline; `mitigating` moves a live
    /// incident to `mitigating`. `None` for an unknown incident.
    pub fn remediation_note(
        &mut self,
        id: &str,
        what: &str,
        mitigating: bool,
        now: Timestamp,
    ) -> Option<IncidentChange> {
        self.book.note(id, what, mitigating, now)
    }

    /// A person resolved an incident (see [`IncidentBook::resolve_by`]).
    pub fn resolve_incident(
        &mut self,
        id: &str,
        actor: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<IncidentChange, ManualError> {
        self.book.resolve_by(id, actor, reason, now)
    }

    /// Attach a log diagnosis to an incident (see [`IncidentBook::attach_diagnosis`]).
    pub fn attach_diagnosis(
        &mut self,
        id: &str,
        d: IncidentDiagnosis,
        now: Timestamp,
    ) -> Option<IncidentChange> {
        self.book.attach_diagnosis(id, d, now)
    }

    /// What diagnosing incident `id` needs: its job, onset and culprit nodes, the other
    /// nodes of its job (for contrast), and the error lines the agents already shipped,
    /// by rank. `None` for an unknown incident.
    pub fn diagnosis_request(&self, id: &str) -> Option<DiagnosisRequest> {
        let inc = self.book.get(id)?;
        let mut req = DiagnosisRequest {
            incident: inc.id.clone(),
            job: inc.job.clone(),
            onset: inc.onset,
            culprit_nodes: inc.nodes.clone(),
            peer_nodes: Vec::new(),
            world_size: None,
            held: Vec::new(),
            first_failed: if inc.kind == IncidentKind::Crash {
                inc.ranks.clone()
            } else {
                Vec::new()
            },
        };
        for g in &inc.gpus {
            if !req.culprit_nodes.contains(&g.node) {
                req.culprit_nodes.push(g.node.clone());
            }
        }
        let job = inc.job.as_deref().and_then(|j| self.cluster.jobs.get(j));
        if let Some(job) = job {
            self.add_job_lines(inc, job, &mut req);
        }
        // The kernel-log lines of hardware trouble on the culprit nodes.
        let mut trouble: Vec<&GpuTrouble> = self
            .cluster
            .gpu_trouble
            .values()
            .filter(|t| {
                req.culprit_nodes
                    .iter()
                    .any(|n| n == self.cluster.node_name(t.node))
            })
            .collect();
        trouble.sort_by_key(|t| (t.first_at, t.node, t.gpu));
        for t in trouble {
            req.held.push(HeldLine {
                rank: None,
                node: Some(self.cluster.node_name(t.node).to_owned()),
                text: t.message.clone(),
            });
        }
        Some(req)
    }

    fn add_job_lines(&self, inc: &Incident, job: &JobState, req: &mut DiagnosisRequest) {
        req.world_size = (job.world_size > 0).then_some(job.world_size);
        for (rank, r) in job.ranks.iter() {
            if !r.known {
                continue;
            }
            let node = (r.node != NO_NODE).then(|| self.cluster.node_name(r.node).to_owned());
            if let Some(n) = &node {
                if inc.ranks.contains(&{ rank }) && !req.culprit_nodes.contains(n) {
                    req.culprit_nodes.push(n.clone());
                }
                if !req.peer_nodes.contains(n) {
                    req.peer_nodes.push(n.clone());
                }
            }
            for line in &r.last_errors {
                req.held.push(HeldLine {
                    rank: Some(rank),
                    node: node.clone(),
                    text: line.clone(),
                });
            }
        }
        req.peer_nodes.retain(|n| !req.culprit_nodes.contains(n));
        req.peer_nodes.sort();
    }

    /// Every incident, oldest first.
    pub fn incidents(&self) -> &[Incident] {
        self.book.all()
    }

    /// One incident.
    pub fn incident(&self, id: &str) -> Option<&Incident> {
        self.book.get(id)
    }

    /// Incidents as the API shows them, filtered by state, kind and job.
    pub fn incident_views(
        &self,
        state: Option<IncidentState>,
        kind: Option<IncidentKind>,
        job: Option<&str>,
    ) -> Vec<IncidentView> {
        self.book
            .all()
            .iter()
            .filter(|i| state.is_none_or(|s| i.state == s))
            .filter(|i| kind.is_none_or(|k| i.kind == k))
            .filter(|i| job.is_none_or(|j| i.job.as_deref() == Some(j)))
            .map(|i| IncidentView::new(i, self.origin))
            .collect()
    }

    /// Live per-rank progress of a job, or `None` for an unknown job.
    pub fn rank_views(&self, job: &str, now: Timestamp) -> Option<Vec<RankView>> {
        self.cluster.rank_views(job, now, self.origin)
    }

    /// Per-rank numbers of a job for `/metrics`, or `None` for an unknown job.
    pub fn rank_progress(&self, job: &str) -> Option<Vec<RankProgress>> {
        self.cluster.rank_progress(job)
    }

    /// Jobs known to the engine.
    pub fn job_views(&self) -> Vec<JobView> {
        let mut v = self.cluster.job_views(self.origin);
        for j in &mut v {
            j.open_incidents = self
                .book
                .all()
                .iter()
                .filter(|i| i.state != IncidentState::Resolved && i.job.as_deref() == Some(&j.job))
                .count() as u32;
        }
        v
    }

    /// What the engine holds now (see [`crate::state::Limits`]).
    pub fn held(&self) -> crate::state::Held {
        self.cluster.held()
    }

    /// The bounds it holds to.
    pub fn limits(&self) -> &crate::state::Limits {
        &self.cluster.limits
    }

    /// The engine's own counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Nodes whose agent has been heard from, with the seconds since it was last heard.
    pub fn agents(&self, now: Timestamp) -> Vec<(String, f64)> {
        self.cluster.agents(now)
    }
}

/// What diagnosing one incident needs from the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct DiagnosisRequest {
    /// The incident.
    pub incident: String,
    /// Its job.
    pub job: Option<JobId>,
    /// When it started (controller clock): log windows are pulled around it.
    pub onset: Timestamp,
    /// Nodes of its culprit ranks and GPUs: their logs are read first.
    pub culprit_nodes: Vec<NodeName>,
    /// The job's other nodes, sorted: a few are read for contrast.
    pub peer_nodes: Vec<NodeName>,
    /// The job's world size, when registered.
    pub world_size: Option<u32>,
    /// Error lines the agents already shipped, by rank (used for nodes whose agent
    /// cannot be reached).
    pub held: Vec<HeldLine>,
    /// For a crash: the ranks that failed first (its culprits, from the exits). The
    /// others' lines often only say they lost a peer.
    pub first_failed: Vec<u32>,
}

/// An error line the controller holds from a shipped batch, or the kernel-log line of
/// a hardware event.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldLine {
    /// Rank that printed it (`None` for a kernel-log line).
    pub rank: Option<u32>,
    /// Its node, when known.
    pub node: Option<NodeName>,
    /// The line.
    pub text: String,
}

#[cfg(test)]
mod tests {
    use warden_model::wire::{Batch, JobSignals, RankInfo};

    use super::*;

    fn batch(at: Timestamp) -> Vec<u8> {
        Batch {
            node: "node-00".into(),
            agent_id: "a".into(),
            boot_id: "b".into(),
            seq: 1,
            sent_at_ns: at.0,
            jobs: vec![JobSignals {
                job: "j".into(),
                ranks: vec![RankInfo {
                    rank: 0,
                    world_size: 1,
                    pid: 7,
                    gpu_index: Some(0),
                    gpu_uuid: String::new(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_binary()
    }

    #[test]
    fn a_rejected_batch_changes_nothing_but_a_counter() {
        let t = Timestamp::from_secs_f64(1e9);
        let mut e = Engine::new(EngineConfig::default(), t);
        let mut body = batch(t);
        body.truncate(body.len() - 3);
        assert!(e.ingest(&body, Encoding::Binary, t).is_err());
        assert!(e.job_views().is_empty());
        assert_eq!(e.stats().rejected.get("truncated"), Some(&1));
        assert_eq!(e.stats().batches, 0);
    }

    #[test]
    fn jobs_silent_for_an_hour_are_forgotten() {
        let t = Timestamp::from_secs_f64(1e9);
        let mut e = Engine::new(EngineConfig::default(), t);
        e.ingest(&batch(t), Encoding::Binary, t)
            .expect("valid batch");
        e.tick(t.plus_secs(120.0));
        assert_eq!(e.job_views().len(), 1);
        e.tick(t.plus_secs(RETENTION_SECS + 60.0));
        assert!(e.job_views().is_empty());
    }

    /// Job `j`'s two ranks report a NaN loss at once, just before `t`.
    fn nan_batch(t: Timestamp) -> Vec<u8> {
        use warden_model::wire::TrainingMetric;
        let ranks = (0..2)
            .map(|rank| RankInfo {
                rank,
                world_size: 2,
                pid: 7 + rank,
                gpu_index: Some(rank),
                gpu_uuid: String::new(),
            })
            .collect();
        let metrics = (0..2)
            .map(|rank| TrainingMetric {
                rank,
                step: 10,
                at_ns: t.0 - 1_000_000,
                loss: Some(f64::NAN),
                grad_norm: Some(f64::NAN),
                ..TrainingMetric::default()
            })
            .collect();
        Batch {
            node: "node-00".into(),
            agent_id: "a".into(),
            boot_id: "b".into(),
            seq: 1,
            sent_at_ns: t.0,
            jobs: vec![JobSignals {
                job: "j".into(),
                ranks,
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_binary()
    }

    #[test]
    fn a_nan_every_rank_reported_at_once_opens_an_incident_naming_the_job_and_no_rank() {
        let t = Timestamp::from_secs_f64(1e9);
        let mut e = Engine::new(EngineConfig::default(), t);
        e.ingest(&nan_batch(t), Encoding::Binary, t)
            .expect("valid batch");
        let changes = e.tick(t.plus_secs(1.0));
        assert_eq!(changes.len(), 1, "{changes:?}");
        let views = e.incident_views(None, Some(IncidentKind::Nan), Some("j"));
        assert_eq!(views.len(), 1);
        let inc = e.incident(&changes[0].id).expect("incident");
        assert_eq!(inc.job.as_deref(), Some("j"));
        assert!(inc.ranks.is_empty() && inc.nodes.is_empty(), "{inc:?}");
        assert!(inc.summary.contains("rank is unknown"), "{}", inc.summary);
        let req = e.diagnosis_request(&inc.id).expect("request");
        assert!(req.culprit_nodes.is_empty());
        assert_eq!(
            req.peer_nodes,
            ["node-00"],
            "the job's nodes are read instead"
        );
    }

    fn report(event: &str) -> crate::lifecycle::LifecycleReport {
        crate::lifecycle::parse(
            format!(
                r#"{{"event":"{event}","scheduler":"slurm","scheduler_job_id":"4242",
                    "name":"llama","nodes":["gpu01","gpu02"],"ranks":16}}"#
            )
            .as_bytes(),
        )
        .expect("valid report")
    }

    #[test]
    fn a_scheduler_report_creates_the_job_and_its_end_is_shown() {
        use crate::lifecycle::{Applied, Phase};
        let t = Timestamp::from_secs_f64(1e9);
        let mut e = Engine::new(EngineConfig::default(), t);
        assert_eq!(
            e.lifecycle("4242", &report("start"), t.plus_secs(1.0)),
            Applied::Changed
        );
        assert_eq!(
            e.lifecycle("4242", &report("start"), t.plus_secs(2.0)),
            Applied::Repeat
        );
        let v = e.job_views();
        assert_eq!(v.len(), 1);
        let j = &v[0];
        assert_eq!((j.job.as_str(), j.ranks, j.nodes), ("4242", 0, 0));
        assert_eq!(j.scheduler.as_deref(), Some("slurm"));
        assert_eq!(j.scheduler_job_id.as_deref(), Some("4242"));
        assert_eq!(j.scheduler_job_name.as_deref(), Some("llama"));
        assert_eq!(j.phase, Some(Phase::Running));
        assert_eq!((j.started_s, j.ended_s), (Some(1.0), None));
        assert_eq!(j.expected_nodes, ["gpu01", "gpu02"]);
        assert_eq!(j.expected_ranks, Some(16));

        // A running job outlives the usual retention without any agent report.
        e.tick(t.plus_secs(RETENTION_SECS + 120.0));
        assert_eq!(e.job_phase("4242"), Some(Phase::Running));

        let end = t.plus_secs(RETENTION_SECS + 130.0);
        assert_eq!(e.lifecycle("4242", &report("end"), end), Applied::Changed);
        let j = &e.job_views()[0];
        assert_eq!(j.phase, Some(Phase::Ended));
        assert_eq!(j.ended_s, Some(RETENTION_SECS + 130.0));
        assert_eq!(
            e.stats().lifecycle_events.get(&("start", "slurm")),
            Some(&2),
            "repeats are counted"
        );
        // An ended job is forgotten like any other.
        e.tick(end.plus_secs(RETENTION_SECS + 60.0));
        assert!(e.job_views().is_empty());

        // An end for a job nobody reported records the end alone.
        e.lifecycle("99", &report("end"), end);
        assert_eq!(e.job_phase("99"), Some(Phase::Ended));
        assert_eq!(e.job_views()[0].started_s, None);
    }

    /// Job `j`'s end as the Slurm hook sends it, with `exit` (JSON fields) added.
    fn end_with(exit: &str) -> LifecycleReport {
        crate::lifecycle::parse(
            format!(r#"{{"event":"end","scheduler":"slurm","scheduler_job_id":"4242"{exit}}}"#)
                .as_bytes(),
        )
        .expect("valid report")
    }

    #[test]
    fn the_exit_state_of_an_end_reaches_open_incidents_and_the_job_view() {
        let t = Timestamp::from_secs_f64(1e9);
        let mut e = Engine::new(EngineConfig::default(), t);
        e.ingest(&nan_batch(t), Encoding::Binary, t)
            .expect("valid batch");
        let changes = e.tick(t.plus_secs(1.0));
        assert_eq!(changes.len(), 1, "{changes:?}");
        let id = changes[0].id.clone();

        let r = end_with(r#","signal":9,"derived_exit_code":1"#);
        assert_eq!(e.lifecycle("j", &r, t.plus_secs(2.0)), Applied::Changed);
        let inc = e.incident(&id).expect("incident");
        let last = &inc.timeline.last().expect("a timeline").what;
        assert_eq!(
            last,
            "slurm job 4242 ended: killed by signal 9 (SIGKILL), worst step: exit code 1; \
             no new hang, straggler or slow-link findings for it"
        );
        let j = &e.job_views()[0];
        assert_eq!(
            (j.exit_code, j.signal, j.derived_exit_code, j.derived_signal),
            (None, Some(9), Some(1), None)
        );

        // A repeat adds no note; a requeue forgets how the last run ended.
        let notes = e.incident(&id).expect("incident").timeline.len();
        e.lifecycle("j", &r, t.plus_secs(3.0));
        assert_eq!(e.incident(&id).expect("incident").timeline.len(), notes);
        e.lifecycle("j", &report("start"), t.plus_secs(4.0));
        let j = &e.job_views()[0];
        assert_eq!(
            (j.exit_code, j.signal, j.derived_exit_code),
            (None, None, None)
        );

        // An end that says nothing of the exit reads as before.
        let r = end_with("");
        e.lifecycle("j", &r, t.plus_secs(5.0));
        let inc = e.incident(&id).expect("incident");
        assert_eq!(
            inc.timeline.last().expect("a timeline").what,
            "slurm job 4242 ended: no new hang, straggler or slow-link findings for it"
        );
    }
}
