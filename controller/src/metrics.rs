//! Prometheus metrics of the controller: the engine's own counters and incident gauges,
//! brought up to date from the engine on each scrape and rendered as Prometheus text.

use std::sync::Mutex;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use rustc_hash::FxHashMap;
use warden_model::{IncidentKind, IncidentState, Timestamp};

use warden_engine::Engine;

/// An agent counts as alive when it was heard from within this many seconds.
pub const AGENT_ALIVE_SECS: f64 = 30.0;

/// Buckets of `warden_detection_latency_seconds`.
pub const DETECTION_LATENCY_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Per-rank series (`warden_rank_*`) are exported for ranks below this number only, so
/// one job adds at most this many series per metric; per-job aggregates cover every rank.
pub const RANK_SERIES_MAX: u32 = 1024;

/// The `Content-Type` of the rendered text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why the metrics could not be set up or rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A metric could not be created or registered.
    #[error("registering metrics: {0}")]
    Register(#[from] prometheus::Error),
    /// The text encoder produced something that is not UTF-8.
    #[error("rendering metrics: {0}")]
    Utf8(#[from] std::string::FromUtf8Error),
}

/// Engine totals seen at the previous scrape, so counters advance by the difference.
#[derive(Debug, Default)]
struct Seen {
    batches: u64,
    bytes: u64,
    collective_events: u64,
    other_records: u64,
    stale_records: u64,
    batch_gaps: u64,
    ticks: u64,
    rejected: FxHashMap<&'static str, u64>,
    refused: FxHashMap<&'static str, u64>,
    lifecycle: FxHashMap<(&'static str, &'static str), u64>,
    findings: FxHashMap<IncidentKind, u64>,
    incidents: FxHashMap<IncidentKind, u64>,
    latencies: usize,
}

/// The controller's metrics and the registry they live in.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    seen: Mutex<Seen>,
    batches: IntCounter,
    bytes: IntCounter,
    rejected: IntCounterVec,
    refused: IntCounterVec,
    lifecycle: IntCounterVec,
    collective_events: IntCounter,
    records: IntCounter,
    stale_records: IntCounter,
    batch_gaps: IntCounter,
    lag: Gauge,
    ticks: IntCounter,
    findings: IntCounterVec,
    incidents_open: IntGaugeVec,
    incidents_total: IntCounterVec,
    detection_latency: HistogramVec,
    agents: IntGauge,
    /// Ranks held over all jobs and the engine's count of the bytes of state they
    /// take: against the process's RSS, what the state costs a rank.
    held_ranks: IntGauge,
    held_state_bytes: IntGauge,
    jobs: JobMetrics,
    /// Diagnoses attached to incidents, by source (`rules`, `llm`) and whether the logs
    /// gave a category (`category`, `none`).
    pub diagnoses: IntCounterVec,
    /// Seconds from a diagnosis request to its answer (log pulls, rules, LLM).
    pub diagnosis_seconds: Histogram,
    /// Log-window pulls from agents, by result (`ok`, `error`).
    pub diagnosis_fetches: IntCounterVec,
    /// Diagnosis requests dropped because the queue was full.
    pub diagnosis_dropped: IntCounter,
    /// LLM refinements by outcome (`refined`, `cached`, or the fallback reason).
    pub llm_outcomes: IntCounterVec,
    /// Incident alerts by sink (`alertmanager`, `webhook`) and result (`ok`, `error`,
    /// `dropped`, `suppressed`); see `crate::alerts`.
    pub alerts_sent: IntCounterVec,
    /// 1 while this controller leads (acts), 0 while it follows.
    pub leader: IntGauge,
    /// Actions finished, by kind (`drain`, `undrain`, `acknowledge`, `resolve`) and
    /// result (`done`, `failed`).
    pub actions: IntCounterVec,
    /// 1 while the remediation circuit breaker is tripped.
    pub breaker_tripped: IntGauge,
    /// Nodes remediation isolated within the breaker's window.
    pub isolated_in_window: IntGauge,
    /// Seconds from an incident's detection to its job's restart being requested.
    pub restart_latency: Histogram,
    /// 1 while remediation only records what it would do (dry run), 0 while it acts.
    pub remediation_dry_run: IntGauge,
    /// 1 per drained node, by node and owner (see [`Metrics::set_drained`]).
    drained: IntGaugeVec,
    /// 1 per node the node-health ledger holds in a state other than healthy.
    node_health: IntGaugeVec,
    /// Incidents the ledger holds against each node that has any.
    node_incidents: IntGaugeVec,
    /// Mean seconds between the incidents held against each node with two or more.
    node_incident_interval: GaugeVec,
}

/// Per-job and per-rank gauges, rebuilt from the engine's jobs on each scrape (a job the
/// engine forgot loses its series). The label is `job_name`, not `job`, which Prometheus
/// reserves for the scrape job.
#[derive(Debug)]
struct JobMetrics {
    ranks: GaugeVec,
    exited: GaugeVec,
    step: GaugeVec,
    step_spread: GaugeVec,
    iteration: GaugeVec,
    compute_ratio_max: GaugeVec,
    incidents_open: GaugeVec,
    rank_step: GaugeVec,
    rank_step_lag: GaugeVec,
    rank_loss: GaugeVec,
    rank_grad_norm: GaugeVec,
    rank_compute_ratio: GaugeVec,
}

fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<GaugeVec, MetricsError> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl JobMetrics {
    fn new(r: &Registry) -> Result<Self, MetricsError> {
        const JOB: &[&str] = &["job_name"];
        const RANK: &[&str] = &["job_name", "rank"];
        Ok(JobMetrics {
            ranks: gauge_vec(r, "warden_job_ranks", "Ranks known, by job.", JOB)?,
            exited: gauge_vec(
                r,
                "warden_job_ranks_exited",
                "Ranks whose process exited, by job.",
                JOB,
            )?,
            step: gauge_vec(
                r,
                "warden_job_step",
                "Highest optimizer step reported by any rank, by job.",
                JOB,
            )?,
            step_spread: gauge_vec(
                r,
                "warden_job_step_spread",
                "Highest minus lowest step among live ranks that reported one, by job.",
                JOB,
            )?,
            iteration: gauge_vec(
                r,
                "warden_job_iteration_seconds",
                "Median iteration time, by job.",
                JOB,
            )?,
            compute_ratio_max: gauge_vec(
                r,
                "warden_job_compute_ratio_max",
                "Slowest rank's compute time relative to the job's median, by job.",
                JOB,
            )?,
            incidents_open: gauge_vec(
                r,
                "warden_job_incidents_open",
                "Incidents of the job not yet resolved, by kind.",
                &["job_name", "kind"],
            )?,
            rank_step: gauge_vec(
                r,
                "warden_rank_step",
                "Last optimizer step a rank reported.",
                RANK,
            )?,
            rank_step_lag: gauge_vec(
                r,
                "warden_rank_step_lag",
                "Steps a rank is behind the job's highest step.",
                RANK,
            )?,
            rank_loss: gauge_vec(r, "warden_rank_loss", "Last finite loss of a rank.", RANK)?,
            rank_grad_norm: gauge_vec(
                r,
                "warden_rank_grad_norm",
                "Last finite gradient norm of a rank.",
                RANK,
            )?,
            rank_compute_ratio: gauge_vec(
                r,
                "warden_rank_compute_ratio",
                "A rank's median compute time relative to the job's median (1 = typical).",
                RANK,
            )?,
        })
    }

    fn update(&self, engine: &Engine) {
        for g in [
            &self.ranks,
            &self.exited,
            &self.step,
            &self.step_spread,
            &self.iteration,
            &self.compute_ratio_max,
            &self.incidents_open,
            &self.rank_step,
            &self.rank_step_lag,
            &self.rank_loss,
            &self.rank_grad_norm,
            &self.rank_compute_ratio,
        ] {
            g.reset();
        }
        let mut open: FxHashMap<(&str, IncidentKind), u32> = FxHashMap::default();
        for inc in engine.incidents() {
            if inc.state != IncidentState::Resolved
                && let Some(job) = inc.job.as_deref()
            {
                *open.entry((job, inc.kind)).or_default() += 1;
            }
        }
        for j in engine.job_views() {
            let job = j.job.as_str();
            self.ranks.with_label_values(&[job]).set(f64::from(j.ranks));
            self.exited
                .with_label_values(&[job])
                .set(f64::from(j.exited));
            if let Some(step) = j.step {
                self.step.with_label_values(&[job]).set(step as f64);
            }
            if let Some(secs) = j.iteration_s {
                self.iteration.with_label_values(&[job]).set(secs);
            }
            for kind in IncidentKind::ALL {
                let n = open.get(&(job, kind)).copied().unwrap_or(0);
                self.incidents_open
                    .with_label_values(&[job, kind.as_str()])
                    .set(f64::from(n));
            }
            let Some(ranks) = engine.rank_progress(job) else {
                continue;
            };
            let live_steps = ranks.iter().filter(|r| r.alive).filter_map(|r| r.step);
            if let (Some(lo), Some(hi)) = (live_steps.clone().min(), live_steps.max()) {
                self.step_spread
                    .with_label_values(&[job])
                    .set((hi - lo) as f64);
            }
            if let Some(worst) = ranks
                .iter()
                .filter_map(|r| r.compute_ratio)
                .max_by(f64::total_cmp)
            {
                self.compute_ratio_max.with_label_values(&[job]).set(worst);
            }
            for r in ranks.iter().filter(|r| r.rank < RANK_SERIES_MAX) {
                let rank = r.rank.to_string();
                let l = [job, rank.as_str()];
                if let Some(step) = r.step {
                    self.rank_step.with_label_values(&l).set(step as f64);
                    if let Some(top) = j.step {
                        self.rank_step_lag
                            .with_label_values(&l)
                            .set(top.saturating_sub(step) as f64);
                    }
                }
                if let Some(x) = r.loss {
                    self.rank_loss.with_label_values(&l).set(x);
                }
                if let Some(x) = r.grad_norm {
                    self.rank_grad_norm.with_label_values(&l).set(x);
                }
                if let Some(x) = r.compute_ratio {
                    self.rank_compute_ratio.with_label_values(&l).set(x);
                }
            }
        }
    }
}

/// Buckets of `warden_diagnosis_duration_seconds`.
pub const DIAGNOSIS_BUCKETS: &[f64] =
    &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter, MetricsError> {
    let c = IntCounter::new(name, help)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
) -> Result<IntCounterVec, MetricsError> {
    let c = IntCounterVec::new(Opts::new(name, help), &[label])?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

/// Advance `c` to `now` given the total `before` it was last brought to; a total that
/// went down (a new engine) starts over from zero.
fn advance(c: &IntCounter, before: &mut u64, now: u64) {
    if now >= *before {
        c.inc_by(now - *before);
    } else {
        c.inc_by(now);
    }
    *before = now;
}

impl Metrics {
    /// Create and register every metric; `version` is the build's version label.
    pub fn new(version: &str) -> Result<Self, MetricsError> {
        let r = Registry::new();
        // `process_*`: CPU seconds, resident and virtual memory, open and most file
        // descriptors, start time, as every Prometheus client library exports them.
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let build = IntGaugeVec::new(
            Opts::new(
                "warden_controller_build_info",
                "Always 1; the version label names the build.",
            ),
            &["version"],
        )?;
        r.register(Box::new(build.clone()))?;
        build.with_label_values(&[version]).set(1);

        let m = Metrics {
            batches: counter(&r, "warden_ingest_batches_total", "Batches accepted.")?,
            bytes: counter(
                &r,
                "warden_ingest_bytes_total",
                "Body bytes of accepted batches.",
            )?,
            rejected: counter_vec(
                &r,
                "warden_ingest_rejected_total",
                "Batches rejected, by reason.",
                "reason",
            )?,
            refused: counter_vec(
                &r,
                "warden_ingest_refused_records_total",
                "Records of accepted batches dropped because a bound on what the controller \
                 holds was reached (jobs, ranks, comms, nodes, gpu_codes).",
                "bound",
            )?,
            lifecycle: {
                let c = IntCounterVec::new(
                    Opts::new(
                        "warden_job_lifecycle_events_total",
                        "Job start and end reports accepted from schedulers, by event and scheduler.",
                    ),
                    &["event", "scheduler"],
                )?;
                r.register(Box::new(c.clone()))?;
                c
            },
            collective_events: counter(
                &r,
                "warden_ingest_collective_events_total",
                "Collective progress events applied.",
            )?,
            records: counter(
                &r,
                "warden_ingest_records_total",
                "Other records applied (metrics, processes, logs, node events, registrations).",
            )?,
            stale_records: counter(
                &r,
                "warden_ingest_stale_records_total",
                "Records ignored as duplicates or stale.",
            )?,
            batch_gaps: counter(
                &r,
                "warden_ingest_batch_gaps_total",
                "Batches whose sequence number showed earlier batches of the agent missing.",
            )?,
            lag: {
                let g = Gauge::new(
                    "warden_ingest_lag_seconds",
                    "Lag between agent send time (corrected for clock offset) and receipt, last batch.",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            ticks: counter(&r, "warden_detector_ticks_total", "Detector passes run.")?,
            findings: counter_vec(
                &r,
                "warden_findings_total",
                "Findings produced by the detectors, by kind.",
                "kind",
            )?,
            incidents_open: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "warden_incidents_open",
                        "Incidents not yet resolved, by kind.",
                    ),
                    &["kind"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            incidents_total: counter_vec(
                &r,
                "warden_incidents_total",
                "Incidents opened, by kind.",
                "kind",
            )?,
            detection_latency: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "warden_detection_latency_seconds",
                        "Seconds from the onset of a problem to the incident opening, by kind.",
                    )
                    .buckets(DETECTION_LATENCY_BUCKETS.to_vec()),
                    &["kind"],
                )?;
                r.register(Box::new(h.clone()))?;
                h
            },
            agents: {
                let g =
                    IntGauge::new("warden_agents", "Agents heard from in the last 30 seconds.")?;
                r.register(Box::new(g.clone()))?;
                g
            },
            held_ranks: {
                let g = IntGauge::new("warden_engine_ranks", "Ranks held, over all jobs.")?;
                r.register(Box::new(g.clone()))?;
                g
            },
            held_state_bytes: {
                let g = IntGauge::new(
                    "warden_engine_state_bytes",
                    "Bytes of job and node state held, as the engine's limits count them \
                     (each record at its largest; `limits.max_state_bytes` caps it).",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            diagnoses: {
                let c = IntCounterVec::new(
                    Opts::new(
                        "warden_diagnoses_total",
                        "Log diagnoses attached to incidents, by source and whether the logs gave a category.",
                    ),
                    &["source", "result"],
                )?;
                r.register(Box::new(c.clone()))?;
                c
            },
            diagnosis_seconds: {
                let h = Histogram::with_opts(
                    HistogramOpts::new(
                        "warden_diagnosis_duration_seconds",
                        "Seconds from a diagnosis request to its answer (log pulls, rules, LLM).",
                    )
                    .buckets(DIAGNOSIS_BUCKETS.to_vec()),
                )?;
                r.register(Box::new(h.clone()))?;
                h
            },
            diagnosis_fetches: counter_vec(
                &r,
                "warden_diagnosis_log_fetches_total",
                "Log-window pulls from agents for diagnosis, by result.",
                "result",
            )?,
            diagnosis_dropped: counter(
                &r,
                "warden_diagnosis_dropped_total",
                "Diagnosis requests dropped because the queue was full.",
            )?,
            llm_outcomes: counter_vec(
                &r,
                "warden_llm_requests_total",
                "LLM refinements of a diagnosis, by outcome.",
                "outcome",
            )?,
            alerts_sent: {
                let c = IntCounterVec::new(
                    Opts::new(
                        "warden_alerts_sent_total",
                        "Incident alerts by sink and result.",
                    ),
                    &["sink", "result"],
                )?;
                r.register(Box::new(c.clone()))?;
                c
            },
            leader: {
                let g = IntGauge::new(
                    "warden_controller_leader",
                    "1 while this controller leads (detects, acts, alerts), 0 while it follows.",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            actions: {
                let c = IntCounterVec::new(
                    Opts::new(
                        "warden_actions_total",
                        "Actions finished (people's and policy's), by kind and result.",
                    ),
                    &["kind", "result"],
                )?;
                r.register(Box::new(c.clone()))?;
                c
            },
            breaker_tripped: {
                let g = IntGauge::new(
                    "warden_remediation_breaker_tripped",
                    "1 while the remediation circuit breaker is tripped (nothing is done \
                     until a person resets it).",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            isolated_in_window: {
                let g = IntGauge::new(
                    "warden_remediation_isolated_nodes",
                    "Nodes remediation isolated within the circuit breaker's window.",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            restart_latency: {
                let h = Histogram::with_opts(
                    HistogramOpts::new(
                        "warden_remediation_restart_latency_seconds",
                        "Seconds from an incident's detection to the restart of its job \
                         being requested.",
                    )
                    .buckets(vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0]),
                )?;
                r.register(Box::new(h.clone()))?;
                h
            },
            remediation_dry_run: {
                let g = IntGauge::new(
                    "warden_remediation_dry_run",
                    "1 while remediation only records what it would do (dry run), 0 while \
                     it acts.",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            drained: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "warden_node_drained",
                        "1 per node Warden holds drained (cordoned), by node and owner: \
                         the person's token name or warden-policy.",
                    ),
                    &["node", "owner"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            node_health: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "warden_node_health",
                        "1 per node the node-health ledger holds in a state other than \
                         healthy, by node and state (suspect, quarantined, verifying, \
                         returned, bad).",
                    ),
                    &["node", "state"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            node_incidents: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "warden_node_incidents",
                        "Incidents the node-health ledger ever held against the node (above \
                         the job's own), for each node with any.",
                    ),
                    &["node"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            node_incident_interval: gauge_vec(
                &r,
                "warden_node_incident_interval_seconds",
                "Mean seconds between the incidents the node-health ledger holds against the \
                 node, for each node with two or more.",
                &["node"],
            )?,
            jobs: JobMetrics::new(&r)?,
            registry: r,
            seen: Mutex::new(Seen::default()),
        };
        // Every kind is present from the start, so dashboards and alerts see zeros.
        for scheduler in warden_engine::lifecycle::METRIC_SCHEDULERS {
            for event in ["start", "end"] {
                m.lifecycle.with_label_values(&[event, scheduler]);
            }
        }
        for kind in ["drain", "undrain", "acknowledge", "resolve"] {
            for result in ["done", "failed"] {
                m.actions.with_label_values(&[kind, result]);
            }
        }
        for sink in ["alertmanager", "webhook"] {
            for result in ["ok", "error", "dropped", "suppressed"] {
                m.alerts_sent.with_label_values(&[sink, result]);
            }
        }
        for kind in IncidentKind::ALL {
            let k = kind.as_str();
            m.findings.with_label_values(&[k]);
            m.incidents_open.with_label_values(&[k]).set(0);
            m.incidents_total.with_label_values(&[k]);
            m.detection_latency.with_label_values(&[k]);
        }
        Ok(m)
    }

    /// Bring every metric up to date from `engine` at `now`. Cheap: call it with the
    /// engine locked, then [`Metrics::render`] after releasing the lock.
    pub fn update(&self, engine: &Engine, now: Timestamp) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let s = engine.stats();
        advance(&self.batches, &mut seen.batches, s.batches);
        advance(&self.bytes, &mut seen.bytes, s.bytes);
        advance(
            &self.collective_events,
            &mut seen.collective_events,
            s.collective_events,
        );
        advance(&self.records, &mut seen.other_records, s.other_records);
        advance(
            &self.stale_records,
            &mut seen.stale_records,
            s.stale_records,
        );
        advance(&self.batch_gaps, &mut seen.batch_gaps, s.batch_gaps);
        advance(&self.ticks, &mut seen.ticks, s.ticks);
        self.lag.set(s.ingest_lag_s);
        for (reason, n) in &s.rejected {
            let before = seen.rejected.entry(reason).or_default();
            advance(&self.rejected.with_label_values(&[reason]), before, *n);
        }
        for (bound, n) in &s.refused {
            let before = seen.refused.entry(bound).or_default();
            advance(&self.refused.with_label_values(&[bound]), before, *n);
        }
        for (&(event, scheduler), n) in &s.lifecycle_events {
            let before = seen.lifecycle.entry((event, scheduler)).or_default();
            advance(
                &self.lifecycle.with_label_values(&[event, scheduler]),
                before,
                *n,
            );
        }
        for (kind, n) in &s.findings {
            let before = seen.findings.entry(*kind).or_default();
            advance(
                &self.findings.with_label_values(&[kind.as_str()]),
                before,
                *n,
            );
        }

        let mut open = [0i64; IncidentKind::ALL.len()];
        let mut total = [0u64; IncidentKind::ALL.len()];
        for inc in engine.incidents() {
            if let Some(i) = IncidentKind::ALL.iter().position(|k| *k == inc.kind) {
                total[i] += 1;
                if inc.state != IncidentState::Resolved {
                    open[i] += 1;
                }
            }
        }
        for (i, kind) in IncidentKind::ALL.into_iter().enumerate() {
            let k = kind.as_str();
            self.incidents_open.with_label_values(&[k]).set(open[i]);
            let before = seen.incidents.entry(kind).or_default();
            advance(
                &self.incidents_total.with_label_values(&[k]),
                before,
                total[i],
            );
        }

        let latencies = &s.detection_latency_s;
        if latencies.len() < seen.latencies {
            seen.latencies = 0;
        }
        for (kind, secs) in &latencies[seen.latencies..] {
            self.detection_latency
                .with_label_values(&[kind.as_str()])
                .observe(*secs);
        }
        seen.latencies = latencies.len();

        let alive = engine
            .agents(now)
            .iter()
            .filter(|(_, ago)| *ago <= AGENT_ALIVE_SECS)
            .count();
        self.agents.set(i64::try_from(alive).unwrap_or(i64::MAX));
        let held = engine.held();
        self.held_ranks
            .set(i64::try_from(held.ranks).unwrap_or(i64::MAX));
        self.held_state_bytes
            .set(i64::try_from(held.state_bytes).unwrap_or(i64::MAX));
        self.jobs.update(engine);
        self.node_health.reset();
        self.node_incidents.reset();
        self.node_incident_interval.reset();
        for n in engine.ledger().nodes() {
            if n.state != warden_engine::ledger::HealthState::Healthy {
                self.node_health
                    .with_label_values(&[n.node.as_str(), n.state.as_str()])
                    .set(1);
            }
            if n.incidents > 0 {
                self.node_incidents
                    .with_label_values(&[n.node.as_str()])
                    .set(i64::try_from(n.incidents).unwrap_or(i64::MAX));
            }
            if let Some(secs) = n.mean_secs_between() {
                self.node_incident_interval
                    .with_label_values(&[n.node.as_str()])
                    .set(secs);
            }
        }
    }

    /// The drained nodes as `(node, owner)` pairs, replacing the last set (read from
    /// the store's node table on each scrape).
    pub fn set_drained<'a>(&self, nodes: impl IntoIterator<Item = (&'a str, &'a str)>) {
        // Under the scrape lock, so that a concurrent render never sees the set half
        // refilled.
        let _seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        self.drained.reset();
        for (node, owner) in nodes {
            self.drained.with_label_values(&[node, owner]).set(1);
        }
    }

    /// Every metric in the Prometheus text format.
    pub fn render(&self) -> Result<String, MetricsError> {
        // Per-job series are reset and refilled by `update`; holding its lock keeps a
        // concurrent scrape from rendering them half-filled.
        let _seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut buf = Vec::with_capacity(8 * 1024);
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8(buf)?)
    }

    /// The registry, for callers that add metrics of their own.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_engine::{Encoding, EngineConfig};

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l[series.len()..].trim().parse().ok())
    }

    #[test]
    fn counters_advance_by_the_difference_between_scrapes() {
        let m = Metrics::new("9.9.9").expect("metrics");
        let mut e = Engine::new(EngineConfig::default(), Timestamp::ZERO);
        let _ = e.ingest(b"nope", Encoding::Binary, Timestamp(1));
        m.update(&e, Timestamp(1));
        m.update(&e, Timestamp(1));
        let text = m.render().expect("render");
        assert_eq!(
            value(&text, r#"warden_ingest_rejected_total{reason="truncated"}"#),
            Some(1.0)
        );
        let _ = e.ingest(b"nope", Encoding::Binary, Timestamp(2));
        e.count_rejection("too_large");
        m.update(&e, Timestamp(2));
        let text = m.render().expect("render");
        assert_eq!(
            value(&text, r#"warden_ingest_rejected_total{reason="truncated"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"warden_ingest_rejected_total{reason="too_large"}"#),
            Some(1.0)
        );
        assert_eq!(
            value(&text, r#"warden_controller_build_info{version="9.9.9"}"#),
            Some(1.0)
        );
    }

    #[test]
    fn every_incident_kind_is_exported_when_none_exist() {
        let m = Metrics::new("0").expect("metrics");
        let e = Engine::new(EngineConfig::default(), Timestamp::ZERO);
        m.update(&e, Timestamp::ZERO);
        let text = m.render().expect("render");
        for kind in IncidentKind::ALL {
            let series = format!("warden_incidents_open{{kind=\"{kind}\"}}");
            assert_eq!(
                value(&text, &series),
                Some(0.0),
                "{series} missing:\n{text}"
            );
            let series = format!("warden_detection_latency_seconds_count{{kind=\"{kind}\"}}");
            assert_eq!(value(&text, &series), Some(0.0), "{series} missing");
        }
        assert_eq!(value(&text, "warden_agents"), Some(0.0));
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                value(&text, name).is_some_and(|v| v > 0.0),
                "{name} missing:\n{text}"
            );
        }
    }

    #[test]
    fn the_state_held_is_exported_with_the_ranks_it_holds() {
        let m = Metrics::new("0").expect("metrics");
        let mut e = Engine::new(EngineConfig::default(), Timestamp::ZERO);
        m.update(&e, Timestamp(1));
        let text = m.render().expect("render");
        assert_eq!(value(&text, "warden_engine_ranks"), Some(0.0), "{text}");
        let batch = br#"{"version": 1, "node": "node-1", "agent_id": "a", "seq": 1,
            "sent_at_ns": 1700000000000000000,
            "jobs": [{"job": "j", "ranks": [{"rank": 0, "world_size": 2, "pid": 10},
                                             {"rank": 1, "world_size": 2, "pid": 11}]}]}"#;
        e.ingest(batch, Encoding::Json, Timestamp(2))
            .expect("a valid batch");
        m.update(&e, Timestamp(2));
        let text = m.render().expect("render");
        assert_eq!(value(&text, "warden_engine_ranks"), Some(2.0), "{text}");
        let bytes = value(&text, "warden_engine_state_bytes").unwrap_or_default();
        assert_eq!(bytes, e.held().state_bytes as f64, "{text}");
        assert!(bytes > 0.0, "{text}");
    }

    #[test]
    fn drained_nodes_are_replaced_as_a_set() {
        let m = Metrics::new("0").expect("metrics");
        m.set_drained([("node-1", "alice"), ("node-2", "warden-policy")]);
        let text = m.render().expect("render");
        let alice = r#"warden_node_drained{node="node-1",owner="alice"}"#;
        let policy = r#"warden_node_drained{node="node-2",owner="warden-policy"}"#;
        assert_eq!(value(&text, alice), Some(1.0), "{text}");
        assert_eq!(value(&text, policy), Some(1.0), "{text}");
        // node-1 undrained: its series goes, not to 0 (a table of drained nodes).
        m.set_drained([("node-2", "warden-policy")]);
        let text = m.render().expect("render");
        assert_eq!(value(&text, alice), None, "{text}");
        assert_eq!(value(&text, policy), Some(1.0), "{text}");
    }
}
