//! Diagnosis of new incidents: pull the log windows around the onset from the agents of
//! the culprit nodes (and a few healthy peers of the job, for contrast), run the log
//! rules over them, let an LLM refine the answer when one is configured, and attach the
//! result to the incident.
//!
//! It runs beside detection and mitigation and never delays them: requests go through a
//! bounded queue (a full queue drops the request and counts it), each diagnosis is its
//! own task, and the engine is locked only to read the request and to attach the answer.
//! A diagnosis is a recommendation: nothing here acts on a node or a job.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc};
use tracing::Instrument;
use warden_diagnosis::llm::{LlmConfig, LlmDiagnoser};
use warden_diagnosis::redact::{Pseudonyms, Redactor};
use warden_diagnosis::rules::RuleSet;
use warden_diagnosis::{Diagnosis, LogLine, PipelineOptions};
use warden_http::HttpClient;
use warden_model::wire::MAX_NAME_LEN;
use warden_model::{DiagnosisEvidence, IncidentDiagnosis, NodeName, Timestamp};

use crate::metrics::Metrics;
use crate::shared::SharedEngine;
use warden_engine::clock::Clock;
use warden_engine::{DiagnosisRequest, IncidentChange};

/// Settings of incident diagnosis (the `diagnosis:` section of the controller config).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiagnosisConfig {
    /// Diagnose new incidents at all.
    pub enabled: bool,
    /// Base URL of a node's agent; `{node}` stands for the node name.
    pub agent_url: String,
    /// Base URLs of agents the template cannot give (several agents on one host, a
    /// node whose name does not resolve), by node name; they win over `agent_url`.
    pub agent_urls: BTreeMap<String, String>,
    /// File holding the bearer token the agents' log API requires, if any.
    pub agent_token_file: Option<PathBuf>,
    /// Seconds of log before the onset to pull.
    pub before_secs: f64,
    /// Seconds of log after the onset to pull.
    pub after_secs: f64,
    /// Most lines pulled from one node.
    pub max_lines_per_node: usize,
    /// Healthy nodes of the job read besides the culprit's, for contrast.
    pub peer_nodes: usize,
    /// Most nodes read for one incident.
    pub max_nodes: usize,
    /// Time allowed for one log pull, milliseconds.
    pub fetch_timeout_ms: u64,
    /// Diagnoses running at once.
    pub max_in_flight: usize,
    /// Requests waiting beyond those; more are dropped (and counted).
    pub queue: usize,
    /// A language model that may refine the rules' answer (never act on it).
    pub llm: Option<LlmConfig>,
}

impl Default for DiagnosisConfig {
    fn default() -> Self {
        DiagnosisConfig {
            enabled: true,
            agent_url: "http://{node}:9461".to_owned(),
            agent_urls: BTreeMap::new(),
            agent_token_file: None,
            before_secs: 300.0,
            after_secs: 30.0,
            max_lines_per_node: 5000,
            peer_nodes: 2,
            max_nodes: 8,
            fetch_timeout_ms: 5000,
            max_in_flight: 4,
            queue: 256,
            llm: None,
        }
    }
}

impl DiagnosisConfig {
    /// Every problem with the settings, as (field, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        let mut bad =
            |field: &str, message: String| p.push((format!("diagnosis.{field}"), message));
        if !self.agent_url.starts_with("http://") {
            bad(
                "agent_url",
                format!("{:?} must start with http://", self.agent_url),
            );
        }
        for (node, url) in &self.agent_urls {
            if node.is_empty() || node.len() > MAX_NAME_LEN {
                bad(
                    "agent_urls",
                    format!("{node:?}: a node name of 1 to {MAX_NAME_LEN} bytes"),
                );
            }
            if !url.starts_with("http://") {
                bad(
                    &format!("agent_urls.{node}"),
                    format!("{url:?} must start with http://"),
                );
            }
        }
        for (field, v) in [
            ("before_secs", self.before_secs),
            ("after_secs", self.after_secs),
        ] {
            if !(0.0..=3600.0).contains(&v) {
                bad(field, format!("{v} is outside 0..=3600"));
            }
        }
        if !(1..=10_000).contains(&self.max_lines_per_node) {
            bad(
                "max_lines_per_node",
                format!("{} is outside 1..=10000", self.max_lines_per_node),
            );
        }
        if !(1..=64).contains(&self.max_nodes) {
            bad("max_nodes", format!("{} is outside 1..=64", self.max_nodes));
        }
        if !(100..=60_000).contains(&self.fetch_timeout_ms) {
            bad(
                "fetch_timeout_ms",
                format!("{} is outside 100..=60000", self.fetch_timeout_ms),
            );
        }
        if !(1..=64).contains(&self.max_in_flight) {
            bad(
                "max_in_flight",
                format!("{} is outside 1..=64", self.max_in_flight),
            );
        }
        if self.queue == 0 {
            bad("queue", "must be at least 1".to_owned());
        }
        if let Some(llm) = &self.llm
            && let Err(errors) = llm.validate()
        {
            for e in errors.0 {
                p.push((format!("diagnosis.llm.{}", e.field), e.problem));
            }
        }
        p
    }
}

/// One line of an agent's log window (`GET /api/v1/logs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AgentLine {
    /// Agent time, ns since the Unix epoch.
    pub at_ns: i64,
    /// Global rank, when the agent knows it.
    #[serde(default)]
    pub rank: Option<u32>,
    /// The text (a traceback is one multi-line entry).
    pub text: String,
}

/// What to pull from one node.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRequest {
    /// Only this job's lines.
    pub job: Option<String>,
    /// Centre of the window (ns since the Unix epoch).
    pub around_ns: i64,
    /// Seconds before.
    pub before_secs: f64,
    /// Seconds after.
    pub after_secs: f64,
    /// Most lines.
    pub limit: usize,
}

/// Why a log window could not be pulled.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL made from the template is not valid.
    #[error("bad agent URL {0:?}")]
    Url(String),
    /// The node name is no DNS-1123 name, so no agent address is made from it.
    #[error("{0}")]
    NodeName(String),
    /// No answer in time.
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// Connection or protocol failure.
    #[error("request failed: {0}")]
    Transport(String),
    /// The agent answered with an error status.
    #[error("agent answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The body is not the agent's JSON.
    #[error("unreadable answer: {0}")]
    Body(String),
}

/// A future returned by a [`LogSource`].
pub type FetchFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<AgentLine>, FetchError>> + Send + 'a>>;

/// Where log windows come from: the agents' HTTP API, or a test double.
pub trait LogSource: Send + Sync + std::fmt::Debug {
    /// The lines of `node` that `req` selects, oldest first.
    fn window<'a>(&'a self, node: &'a str, req: &'a WindowRequest) -> FetchFuture<'a>;
}

/// Most bytes read of one agent answer.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// Pulls log windows from the agents' `GET /api/v1/logs`.
#[derive(Clone)]
pub struct HttpLogSource {
    /// `None` when the client could not be set up (its TLS settings); every fetch then
    /// fails, saying so.
    client: Option<HttpClient>,
    url_template: String,
    urls: Arc<BTreeMap<String, String>>,
    token: Option<Arc<str>>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpLogSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The agents' token is never printed, not even by a debug dump.
        f.debug_struct("HttpLogSource")
            .field("url_template", &self.url_template)
            .field("urls", &self.urls)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpLogSource {
    /// A source for agents at `url_template` (`{node}` replaced by the node name),
    /// sending `token` as a bearer token when given.
    pub fn new(url_template: &str, token: Option<String>, timeout: Duration) -> Self {
        HttpLogSource {
            client: HttpClient::builder().build().ok(),
            url_template: url_template.trim_end_matches('/').to_owned(),
            urls: Arc::default(),
            token: token.map(Arc::from),
            timeout,
        }
    }

    /// Use these base URLs for these nodes instead of the template.
    pub fn with_agent_urls(mut self, urls: &BTreeMap<String, String>) -> Self {
        let trimmed = urls
            .iter()
            .map(|(n, u)| (n.clone(), u.trim_end_matches('/').to_owned()))
            .collect();
        self.urls = Arc::new(trimmed);
        self
    }

    /// The agent's base URL for `node`: a configured one, or the template with the
    /// node's name, which must be a DNS-1123 name (ingest refuses any other, and this
    /// checks again, so no request goes anywhere but to an agent's address).
    pub fn base(&self, node: &str) -> Result<String, FetchError> {
        match self.urls.get(node) {
            Some(url) => Ok(url.clone()),
            None => {
                warden_model::ids::check_node_name(node).map_err(FetchError::NodeName)?;
                Ok(self.url_template.replace("{node}", node))
            }
        }
    }

    fn url(&self, node: &str, req: &WindowRequest) -> Result<String, FetchError> {
        let mut url = format!(
            "{}/api/v1/logs?around={}&before_secs={}&after_secs={}&limit={}",
            self.base(node)?,
            req.around_ns,
            req.before_secs,
            req.after_secs,
            req.limit
        );
        if let Some(job) = &req.job {
            url.push_str("&job=");
            url.push_str(&percent_encode(job));
        }
        Ok(url)
    }

    async fn fetch(&self, node: &str, req: &WindowRequest) -> Result<Vec<AgentLine>, FetchError> {
        #[derive(Deserialize)]
        struct Answer {
            lines: Vec<AgentLine>,
        }
        let url = self.url(node, req)?;
        let uri: hyper::Uri = url.parse().map_err(|_| FetchError::Url(url.clone()))?;
        let mut builder = hyper::Request::get(uri);
        if let Some(t) = &self.token {
            let mut value =
                hyper::header::HeaderValue::try_from(format!("Bearer {t}")).map_err(|_| {
                    FetchError::Transport("the agent token is not a valid header".into())
                })?;
            value.set_sensitive(true);
            builder = builder.header(hyper::header::AUTHORIZATION, value);
        }
        let request = builder
            .body(Full::new(Bytes::new()))
            .map_err(|e| FetchError::Transport(e.to_string()))?;
        let Some(client) = &self.client else {
            return Err(FetchError::Transport(
                "the HTTP client could not be set up".into(),
            ));
        };
        let ms = self.timeout.as_millis() as u64;
        let answer = tokio::time::timeout(self.timeout, client.fetch(request, MAX_ANSWER_BYTES))
            .await
            .map_err(|_| FetchError::Timeout(ms))?
            .map_err(|e| FetchError::Transport(e.to_string()))?;
        let (status, body) = (answer.status, answer.body);
        if !(200..300).contains(&status) {
            let text = String::from_utf8_lossy(&body);
            return Err(FetchError::Status {
                status,
                body: text.chars().take(200).collect(),
            });
        }
        serde_json::from_slice::<Answer>(&body)
            .map(|a| a.lines)
            .map_err(|e| FetchError::Body(e.to_string()))
    }
}

impl LogSource for HttpLogSource {
    fn window<'a>(&'a self, node: &'a str, req: &'a WindowRequest) -> FetchFuture<'a> {
        Box::pin(self.fetch(node, req))
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Diagnoses incidents: pulls logs, runs the rules, optionally asks an LLM.
#[derive(Debug)]
pub struct Diagnoser {
    config: DiagnosisConfig,
    rules: Arc<RuleSet>,
    source: Arc<dyn LogSource>,
    llm: Option<LlmDiagnoser>,
}

/// The lines read for one incident, with where they came from.
#[derive(Debug, Default)]
struct Gathered {
    lines: Vec<LogLine>,
    nodes_read: Vec<NodeName>,
}

impl Diagnoser {
    /// A diagnoser with the shipped log rules.
    pub fn new(
        config: DiagnosisConfig,
        rules: Arc<RuleSet>,
        source: Arc<dyn LogSource>,
        llm: Option<LlmDiagnoser>,
    ) -> Self {
        Diagnoser {
            config,
            rules,
            source,
            llm,
        }
    }

    /// Diagnose one incident. Never fails: unreachable agents leave their nodes to the
    /// lines the controller already holds, and a failing LLM leaves the rules' answer.
    pub async fn diagnose(
        &self,
        req: &DiagnosisRequest,
        metrics: Option<&Metrics>,
    ) -> IncidentDiagnosis {
        let gathered = self.gather(req, metrics).await;
        let rules = self.rules.clone();
        let onset_ms = Some(req.onset.nanos().div_euclid(1_000_000));
        let opts = pipeline_options(req, onset_ms);
        let lines = Arc::new(gathered.lines);
        let for_rules = lines.clone();
        let answer = tokio::task::spawn_blocking(move || {
            warden_diagnosis::diagnose_lines(&rules, &for_rules, &opts)
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "diagnosis task failed");
            Diagnosis::unknown()
        });
        let answer = match &self.llm {
            Some(llm) => {
                let (refined, outcome) = llm.refine(&answer, &answer.evidence).await;
                if let Some(m) = metrics {
                    m.llm_outcomes.with_label_values(&[outcome.label()]).inc();
                }
                refined
            }
            None => answer,
        };
        to_incident_diagnosis(&answer, &lines, gathered.nodes_read)
    }

    /// The lines to read: each chosen node's window from its agent, and the lines the
    /// controller already holds (error lines its ranks shipped, a process's last words,
    /// the kernel-log line of a hardware event) that the window does not have: those of
    /// a node whose agent cannot be reached, and those the agent has not read yet (a
    /// diagnosis starts moments after the onset) or never tails (the kernel log).
    async fn gather(&self, req: &DiagnosisRequest, metrics: Option<&Metrics>) -> Gathered {
        let mut nodes: Vec<NodeName> = req.culprit_nodes.clone();
        nodes.extend(req.peer_nodes.iter().take(self.config.peer_nodes).cloned());
        nodes.truncate(self.config.max_nodes);
        let window = WindowRequest {
            job: req.job.clone(),
            around_ns: req.onset.nanos(),
            before_secs: self.config.before_secs,
            after_secs: self.config.after_secs,
            limit: self.config.max_lines_per_node,
        };
        let mut tasks = tokio::task::JoinSet::new();
        for node in nodes {
            let source = self.source.clone();
            let window = window.clone();
            tasks.spawn(async move {
                let got = source.window(&node, &window).await;
                (node, got)
            });
        }
        let mut fetched: Vec<(NodeName, Vec<AgentLine>)> = Vec::new();
        while let Some(done) = tasks.join_next().await {
            let Ok((node, got)) = done else { continue };
            match got {
                Ok(lines) => {
                    if let Some(m) = metrics {
                        m.diagnosis_fetches.with_label_values(&["ok"]).inc();
                    }
                    fetched.push((node, lines));
                }
                Err(e) => {
                    if let Some(m) = metrics {
                        m.diagnosis_fetches.with_label_values(&["error"]).inc();
                    }
                    tracing::warn!(node = %node, error = %e, "cannot pull the log window");
                }
            }
        }
        fetched.sort_by(|a, b| a.0.cmp(&b.0));
        let mut g = Gathered::default();
        let mut timed: Vec<LogLine> = Vec::new();
        for (node, lines) in fetched {
            for l in lines {
                timed.push(LogLine {
                    id: 0,
                    node: Some(node.clone()),
                    rank: l.rank,
                    at_ms: Some(l.at_ns.div_euclid(1_000_000)),
                    text: l.text,
                });
            }
            g.nodes_read.push(node);
        }
        // Held lines the windows do not have.
        let seen: std::collections::HashSet<(Option<&str>, &str)> = timed
            .iter()
            .map(|l| (l.node.as_deref(), l.text.as_str()))
            .collect();
        let mut held: Vec<LogLine> = req
            .held
            .iter()
            .filter(|h| !seen.contains(&(h.node.as_deref(), h.text.as_str())))
            .map(|h| LogLine {
                id: 0,
                node: h.node.clone(),
                rank: h.rank,
                at_ms: None,
                text: h.text.clone(),
            })
            .collect();
        timed.sort_by_key(|l| l.at_ms);
        held.append(&mut timed);
        for (i, l) in held.iter_mut().enumerate() {
            l.id = i as u64 + 1;
        }
        g.lines = held;
        g
    }
}

/// The pipeline's options for `req`: what the controller knows beyond the lines (the
/// world size, the onset, the detectors' culprit node, which only ranks the evidence
/// and never becomes the culprit, and a crash's first deaths).
pub fn pipeline_options(req: &DiagnosisRequest, onset_at_ms: Option<i64>) -> PipelineOptions {
    PipelineOptions {
        world_size: req.world_size,
        onset_at_ms,
        suspect_node: req.culprit_nodes.first().cloned(),
        first_failed: req.first_failed.clone(),
        ..PipelineOptions::default()
    }
}

/// Diagnose from the lines the controller already holds, without pulling anything
/// (the simulated cluster of `warden demo` has no agents to pull from).
pub fn diagnose_held(rules: &RuleSet, req: &DiagnosisRequest) -> IncidentDiagnosis {
    let lines: Vec<LogLine> = req
        .held
        .iter()
        .enumerate()
        .map(|(i, h)| LogLine {
            id: i as u64 + 1,
            node: h.node.clone(),
            rank: h.rank,
            at_ms: None,
            text: h.text.clone(),
        })
        .collect();
    let answer = warden_diagnosis::diagnose_lines(rules, &lines, &pipeline_options(req, None));
    to_incident_diagnosis(&answer, &lines, Vec::new())
}

/// Most evidence lines kept on an incident.
const MAX_EVIDENCE: usize = 20;
/// Longest evidence line kept, characters.
const MAX_EVIDENCE_CHARS: usize = 1000;

/// The model's form of an answer, evidence lines tagged with their node and rank.
///
/// Every text on it (evidence lines, culprit, explanation) has its secrets removed
/// first, together, so a password seen in one line is also taken out where it recurs:
/// the diagnosis is stored, sent with alerts and shown to every viewer of the API,
/// while the logs it quotes can hold credentials.
pub fn to_incident_diagnosis(
    d: &Diagnosis,
    lines: &[LogLine],
    nodes_read: Vec<NodeName>,
) -> IncidentDiagnosis {
    let kept: Vec<&warden_diagnosis::EvidenceLine> = d.evidence.iter().take(MAX_EVIDENCE).collect();
    let mut texts: Vec<&str> = kept.iter().map(|e| e.text.as_str()).collect();
    texts.push(&d.culprit.text);
    texts.push(&d.explanation);
    let mut clean = Redactor::default()
        .redact_batch(&texts, &[], &mut Pseudonyms::new())
        .into_iter();
    let evidence = kept
        .iter()
        .map(|e| {
            // Line ids are line numbers, from 1.
            let line =
                e.id.checked_sub(1)
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| lines.get(i));
            let text = clean.next().unwrap_or_default();
            DiagnosisEvidence {
                id: e.id,
                node: line.and_then(|l| l.node.clone()),
                rank: line.and_then(|l| l.rank),
                text: text.chars().take(MAX_EVIDENCE_CHARS).collect(),
                reason: e.reason.clone(),
            }
        })
        .collect();
    let culprit = clean.next().unwrap_or_default();
    let explanation = clean.next().unwrap_or_default();
    IncidentDiagnosis {
        category: d.category.map(|c| c.as_str().to_owned()),
        fault_locus: d.fault_locus.map(|l| l.as_str().to_owned()),
        ranks: d.culprit.ranks.clone(),
        nodes: d.culprit.nodes.clone(),
        gpus: d.culprit.gpus.clone(),
        culprit,
        confidence: d.confidence.clamp(0.0, 1.0),
        rule_ids: d.rule_ids.clone(),
        evidence,
        explanation,
        source: d.source.clone(),
        lines_read: lines.len() as u64,
        nodes_read,
    }
}

/// Hands incidents to the diagnosis tasks.
#[derive(Debug, Clone)]
pub struct DiagnosisQueue {
    tx: mpsc::Sender<String>,
    metrics: Option<Arc<Metrics>>,
}

impl DiagnosisQueue {
    /// Queue incident `id` for diagnosis; `false` (and counted) when the queue is full.
    pub fn submit(&self, id: &str) -> bool {
        match self.tx.try_send(id.to_owned()) {
            Ok(()) => true,
            Err(_) => {
                if let Some(m) = &self.metrics {
                    m.diagnosis_dropped.inc();
                }
                tracing::warn!(incident = id, "diagnosis queue full; not diagnosed");
                false
            }
        }
    }

    /// Queue every newly opened incident among `changes`.
    pub fn submit_opened(&self, changes: &[IncidentChange]) {
        for c in changes {
            if c.change == warden_engine::Change::Opened {
                self.submit(&c.id);
            }
        }
    }
}

/// Start the diagnosis worker on the current tokio runtime: each queued incident is
/// read from `engine`, diagnosed in its own task (at most `max_in_flight` at once) and
/// the answer attached at the time `clock` gives.
pub fn start(
    diagnoser: Arc<Diagnoser>,
    engine: SharedEngine,
    clock: Arc<dyn Clock>,
    metrics: Option<Arc<Metrics>>,
) -> DiagnosisQueue {
    let (tx, mut rx) = mpsc::channel::<String>(diagnoser.config.queue);
    let permits = Arc::new(Semaphore::new(diagnoser.config.max_in_flight));
    let queue = DiagnosisQueue {
        tx,
        metrics: metrics.clone(),
    };
    tokio::spawn(async move {
        while let Some(id) = rx.recv().await {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let (diagnoser, engine, clock, metrics) = (
                diagnoser.clone(),
                engine.clone(),
                clock.clone(),
                metrics.clone(),
            );
            let span = tracing::info_span!(
                target: crate::telemetry::TARGET,
                "diagnose",
                incident = %id,
                category = tracing::field::Empty,
                locus = tracing::field::Empty,
                source = tracing::field::Empty,
                lines = tracing::field::Empty,
            );
            tokio::spawn(
                async move {
                    let _permit = permit;
                    let Some(req) = engine.lock().diagnosis_request(&id) else {
                        return;
                    };
                    let started = Instant::now();
                    let d = diagnoser.diagnose(&req, metrics.as_deref()).await;
                    if let Some(m) = &metrics {
                        m.diagnosis_seconds.observe(started.elapsed().as_secs_f64());
                        let source = if d.source == "rules" { "rules" } else { "llm" };
                        let result = if d.category.is_some() {
                            "category"
                        } else {
                            "none"
                        };
                        m.diagnoses.with_label_values(&[source, result]).inc();
                    }
                    tracing::info!(
                        incident = %id,
                        category = d.category.as_deref().unwrap_or("none"),
                        locus = d.fault_locus.as_deref().unwrap_or("none"),
                        culprit = %d.culprit,
                        source = %d.source,
                        lines = d.lines_read,
                        "incident diagnosed"
                    );
                    let span = tracing::Span::current();
                    span.record("category", d.category.as_deref().unwrap_or("none"));
                    span.record("locus", d.fault_locus.as_deref().unwrap_or("none"));
                    span.record("source", d.source.as_str());
                    span.record("lines", d.lines_read);
                    let now: Timestamp = clock.now();
                    engine.lock().attach_diagnosis(&id, d, now);
                }
                .instrument(span),
            );
        }
    });
    queue
}
