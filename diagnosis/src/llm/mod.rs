//! The LLM client: asks an OpenAI-compatible chat-completions endpoint (vLLM, Ollama,
//! llama.cpp server, a hosted API) to refine the rules' answer, and never fails.
//!
//! [`LlmDiagnoser::refine`] takes the rules' [`Diagnosis`] and the evidence lines and
//! returns a `Diagnosis` in every case, with an [`Outcome`] saying what happened. Every
//! string sent is redacted first ([`crate::redact`]); the answer is validated strictly
//! ([`answer`]) and translated back from pseudonyms. Any failure (no budget, timeout,
//! HTTP error, malformed, truncated or invalid answer) returns the rules' answer with a
//! note in its explanation.
//!
//! The model only ever recommends: its answer is data (labels and words), no field of
//! it is executed or mapped to an action here, and an answer's `source` is always
//! `llm:<model>` so policy can tell it from a rules answer.
//!
//! Diagnosis runs beside mitigation and must never delay it. `refine` is async and
//! cancellable (drop the future and the request is abandoned); callers spawn it:
//!
//! ```no_run
//! # async fn example(llm: warden_diagnosis::llm::LlmDiagnoser,
//! #                  rules: warden_diagnosis::Diagnosis) {
//! let evidence = rules.evidence.clone();
//! let task = tokio::spawn(async move { llm.refine(&rules, &evidence).await });
//! // ... mitigation goes on; later, or never:
//! if let Ok((diagnosis, outcome)) = task.await {
//!     println!("{} ({})", diagnosis.explanation, outcome.label());
//! }
//! # }
//! ```
//!
//! Limits, all per client (clones share them): at most `max_concurrency` requests in
//! flight, a token budget per process or per window, a per-request token cap that trims
//! evidence, bounded retries with backoff on 429 / 5xx / timeouts, and a bounded cache
//! keyed by a hash of (model, redacted evidence, rules' answer).

pub mod answer;
pub mod config;
pub mod http;
pub mod prompt;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::model::{Diagnosis, EvidenceLine};
use crate::redact::{Pseudonyms, RedactOptions, Redactor};

pub use answer::{Answer, AnswerError};
pub use config::{ApiKey, ConfigError, ConfigErrors, LlmConfig};
pub use http::{ChatTransport, HttpResponse, HyperTransport, TransportError};
pub use prompt::ResponseMode;

/// Longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Longest server error text kept in an [`LlmError`].
const MAX_ERROR_TEXT: usize = 200;

/// Why the model's answer was not used. Each has a bounded metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// The token budget cannot pay for this request.
    #[error("token budget spent ({used} of {limit} used, this request needs about {needed})")]
    Budget {
        /// Tokens used in the current window.
        used: u64,
        /// The budget.
        limit: u64,
        /// The estimate for this request.
        needed: u64,
    },
    /// Even one evidence line does not fit `max_tokens_per_request`.
    #[error("prompt does not fit max_tokens_per_request")]
    PromptTooLarge,
    /// The last attempt took longer than `timeout_ms`.
    #[error("timed out after {attempts} attempt(s)")]
    Timeout {
        /// Attempts made.
        attempts: u32,
    },
    /// Connecting or reading failed on the last attempt.
    #[error("transport: {0}")]
    Transport(TransportError),
    /// The server answered with an error status.
    #[error("HTTP {status}: {text}")]
    Status {
        /// The status.
        status: u16,
        /// The start of the body, for the operator.
        text: String,
    },
    /// The answer was unusable.
    #[error(transparent)]
    Answer(AnswerError),
}

impl LlmError {
    /// A label for metrics (bounded: one per variant).
    pub fn label(&self) -> &'static str {
        match self {
            LlmError::Budget { .. } => "budget",
            LlmError::PromptTooLarge => "prompt_too_large",
            LlmError::Timeout { .. } => "timeout",
            LlmError::Transport(_) => "transport",
            LlmError::Status { .. } => "http_status",
            LlmError::Answer(AnswerError::Malformed(_)) => "malformed",
            LlmError::Answer(AnswerError::Truncated) => "truncated",
            LlmError::Answer(AnswerError::Invalid(_)) => "invalid",
        }
    }
}

/// What `refine` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The model's answer was used.
    Refined {
        /// It came from the cache; no request was made.
        cached: bool,
        /// Culprit names the model gave that the evidence does not show (dropped).
        dropped_culprits: Vec<String>,
    },
    /// The rules' answer was returned; why.
    Fallback(LlmError),
}

impl Outcome {
    /// A label for metrics: "refined", "cached", or the error's label.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Refined { cached: false, .. } => "refined",
            Outcome::Refined { cached: true, .. } => "cached",
            Outcome::Fallback(e) => e.label(),
        }
    }
}

/// Why a client could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The configuration is wrong or the key cannot be read.
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

#[derive(Debug)]
struct Budget {
    limit: u64,
    window: Option<Duration>,
    used: u64,
    started: Instant,
}

impl Budget {
    fn roll(&mut self) {
        if let Some(w) = self.window {
            let now = Instant::now();
            if now.duration_since(self.started) >= w {
                self.started = now;
                self.used = 0;
            }
        }
    }

    fn reserve(&mut self, needed: u64) -> Result<(), LlmError> {
        self.roll();
        if self.used.saturating_add(needed) > self.limit {
            return Err(LlmError::Budget {
                used: self.used,
                limit: self.limit,
                needed,
            });
        }
        self.used += needed;
        Ok(())
    }

    /// Replaces a reservation by what was actually spent (0 when nothing was).
    fn settle(&mut self, reserved: u64, spent: u64) {
        self.used = self.used.saturating_sub(reserved).saturating_add(spent);
    }
}

#[derive(Debug, Default)]
struct Cache {
    capacity: usize,
    map: HashMap<u64, (String, Answer)>,
    order: VecDeque<u64>,
}

impl Cache {
    fn get(&self, key: u64, text: &str) -> Option<Answer> {
        self.map
            .get(&key)
            .filter(|(k, _)| k == text)
            .map(|(_, a)| a.clone())
    }

    fn put(&mut self, key: u64, text: String, answer: Answer) {
        if self.capacity == 0 {
            return;
        }
        if self.map.insert(key, (text, answer)).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

#[derive(Debug)]
struct Inner {
    config: LlmConfig,
    redactor: Redactor,
    transport: Arc<dyn ChatTransport>,
    permits: Semaphore,
    budget: Mutex<Budget>,
    cache: Mutex<Cache>,
    /// The response mode that last worked (see [`ResponseMode`]).
    mode: AtomicU8,
    /// The API key the transport sends, to cut out of error bodies that echo it.
    key: Option<ApiKey>,
}

/// The LLM client. Cheap to clone; clones share limits, budget and cache.
#[derive(Debug, Clone)]
pub struct LlmDiagnoser {
    inner: Arc<Inner>,
}

fn mode_from(v: u8) -> ResponseMode {
    match v {
        0 => ResponseMode::JsonSchema,
        1 => ResponseMode::JsonObject,
        _ => ResponseMode::Plain,
    }
}

fn mode_to(m: ResponseMode) -> u8 {
    match m {
        ResponseMode::JsonSchema => 0,
        ResponseMode::JsonObject => 1,
        ResponseMode::Plain => 2,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves consistent data (plain counters/maps).
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LlmDiagnoser {
    /// A client over HTTP(S) for this configuration: validated, API key loaded.
    pub fn new(config: LlmConfig) -> Result<Self, SetupError> {
        config.validate()?;
        let key = config.load_api_key()?;
        let transport = HyperTransport::new(
            &config.base_url,
            key.clone(),
            Duration::from_millis(config.timeout_ms),
        )?;
        Ok(Self::build(config, Arc::new(transport), key)?)
    }

    /// A client over another transport (the key, if any, is the transport's business).
    pub fn with_transport(
        config: LlmConfig,
        transport: Arc<dyn ChatTransport>,
    ) -> Result<Self, ConfigErrors> {
        Self::build(config, transport, None)
    }

    fn build(
        config: LlmConfig,
        transport: Arc<dyn ChatTransport>,
        key: Option<ApiKey>,
    ) -> Result<Self, ConfigErrors> {
        config.validate()?;
        let redactor = Redactor::new(RedactOptions {
            hosts: config.redact_hosts,
            ips: config.redact_ips,
        });
        let budget = Budget {
            limit: config.token_budget,
            window: config.budget_window_secs.map(Duration::from_secs),
            used: 0,
            started: Instant::now(),
        };
        let cache = Cache {
            capacity: config.cache_entries,
            ..Cache::default()
        };
        Ok(LlmDiagnoser {
            inner: Arc::new(Inner {
                permits: Semaphore::new(config.max_concurrency),
                redactor,
                transport,
                budget: Mutex::new(budget),
                cache: Mutex::new(cache),
                mode: AtomicU8::new(0),
                key,
                config,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlmConfig {
        &self.inner.config
    }

    /// Tokens spent (or reserved by requests in flight) in the current budget window.
    pub fn tokens_used(&self) -> u64 {
        let mut b = lock(&self.inner.budget);
        b.roll();
        b.used
    }

    /// The model's refinement of `rules`, or `rules` itself with a note when the model
    /// cannot help. Never fails and never panics on the server's answer; cancel it by
    /// dropping the future. `evidence` is what the model sees, most telling first.
    #[tracing::instrument(skip_all, fields(model = %self.inner.config.model, lines = evidence.len()))]
    pub async fn refine(
        &self,
        rules: &Diagnosis,
        evidence: &[EvidenceLine],
    ) -> (Diagnosis, Outcome) {
        match self.ask(rules, evidence).await {
            Ok((answer, map, cached)) => {
                let outcome = Outcome::Refined {
                    cached,
                    dropped_culprits: answer.dropped.iter().map(|d| map.reveal(d)).collect(),
                };
                (self.merge(rules, evidence, answer, &map), outcome)
            }
            Err(e) => {
                tracing::debug!(reason = e.label(), error = %e, "LLM answer not used");
                let mut d = rules.clone();
                let note = format!("(LLM not used: {})", e.label());
                if d.explanation.is_empty() {
                    d.explanation = note;
                } else {
                    d.explanation = format!("{} {note}", d.explanation);
                }
                (d, Outcome::Fallback(e))
            }
        }
    }

    fn merge(
        &self,
        rules: &Diagnosis,
        evidence: &[EvidenceLine],
        a: Answer,
        map: &Pseudonyms,
    ) -> Diagnosis {
        let culprit = if a.culprit.is_empty() {
            rules.culprit.clone()
        } else {
            crate::model::Culprit {
                ranks: a.culprit.ranks,
                nodes: a.culprit.nodes.iter().map(|n| map.reveal(n)).collect(),
                gpus: a.culprit.gpus.iter().map(|g| map.reveal(g)).collect(),
                text: map.reveal(&a.culprit.text),
                ..crate::model::Culprit::default()
            }
        };
        Diagnosis {
            category: a.category,
            fault_locus: a.fault_locus,
            culprit,
            confidence: a.confidence,
            rule_ids: rules.rule_ids.clone(),
            evidence: if rules.evidence.is_empty() {
                evidence.to_vec()
            } else {
                rules.evidence.clone()
            },
            explanation: map.reveal(&a.explanation),
            source: format!("llm:{}", self.inner.config.model),
            recommended_action: a.recommended_action.map(|r| map.reveal(&r)),
        }
    }

    async fn ask(
        &self,
        rules: &Diagnosis,
        evidence: &[EvidenceLine],
    ) -> Result<(Answer, Pseudonyms, bool), LlmError> {
        let inner = &*self.inner;
        let cfg = &inner.config;
        let prompt = prompt::build(cfg, &inner.redactor, rules, evidence)
            .map_err(|_| LlmError::PromptTooLarge)?;
        let cache_text = format!("{}\n{}", cfg.model, prompt.user);
        let key = {
            let mut h = DefaultHasher::new();
            cache_text.hash(&mut h);
            h.finish()
        };
        if let Some(hit) = lock(&inner.cache).get(key, &cache_text) {
            let map = prompt.pseudonyms.clone();
            return Ok((hit, map, true));
        }
        let needed = prompt.prompt_tokens + cfg.max_answer_tokens;
        let mut mode = mode_from(inner.mode.load(Ordering::Relaxed));
        let mut attempt: u32 = 0;
        loop {
            lock(&inner.budget).reserve(needed)?;
            let body = Bytes::from(prompt::body(cfg, &prompt, mode).to_string());
            let sent = {
                let _permit = inner.permits.acquire().await;
                tokio::time::timeout(
                    Duration::from_millis(cfg.timeout_ms),
                    inner.transport.post(body),
                )
                .await
            };
            let (err, retry_after) = match sent {
                Err(_) => (
                    LlmError::Timeout {
                        attempts: attempt + 1,
                    },
                    None,
                ),
                Ok(Err(e)) => {
                    lock(&inner.budget).settle(needed, 0);
                    (LlmError::Transport(e), None)
                }
                Ok(Ok(resp)) if (200..300).contains(&resp.status) => {
                    let done = answer::parse_envelope(&resp.body);
                    let spent = done
                        .as_ref()
                        .ok()
                        .and_then(|c| c.total_tokens)
                        .unwrap_or(needed);
                    lock(&inner.budget).settle(needed, spent);
                    if mode_to(mode) != inner.mode.load(Ordering::Relaxed) {
                        inner.mode.store(mode_to(mode), Ordering::Relaxed);
                    }
                    let completion = done.map_err(LlmError::Answer)?;
                    let answer =
                        answer::validate(&completion.content, &prompt).map_err(LlmError::Answer)?;
                    lock(&inner.cache).put(key, cache_text, answer.clone());
                    return Ok((answer, prompt.pseudonyms, false));
                }
                Ok(Ok(resp)) => {
                    lock(&inner.budget).settle(needed, 0);
                    let text = error_text(&resp.body, &inner.redactor, inner.key.as_ref());
                    if matches!(resp.status, 400 | 422)
                        && let Some(next) = mode.fallback()
                    {
                        tracing::debug!(
                            status = resp.status,
                            ?next,
                            "response format rejected; trying the next"
                        );
                        mode = next;
                        continue;
                    }
                    let err = LlmError::Status {
                        status: resp.status,
                        text,
                    };
                    if !matches!(resp.status, 408 | 429 | 500..=599) {
                        return Err(err);
                    }
                    (err, resp.retry_after_secs)
                }
            };
            if attempt >= cfg.max_retries {
                return Err(err);
            }
            let wait = backoff(cfg.retry_backoff_ms, attempt, key, retry_after);
            tracing::debug!(
                attempt,
                reason = err.label(),
                wait_ms = wait.as_millis() as u64,
                "retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// The wait before attempt `attempt + 1`: `base · 2^attempt` (at most
/// [`MAX_BACKOFF`]) with jitter in [50 %, 100 %] derived from the request, or the
/// server's `Retry-After` if longer; capped at [`MAX_BACKOFF`].
fn backoff(base_ms: u64, attempt: u32, key: u64, retry_after_secs: Option<u64>) -> Duration {
    let mut h = DefaultHasher::new();
    (key, attempt).hash(&mut h);
    let unit = (h.finish() % 51) as f64 / 50.0;
    warden_http::Backoff::new(Duration::from_millis(base_ms), MAX_BACKOFF).delay(
        attempt,
        unit,
        retry_after_secs.map(Duration::from_secs),
    )
}

/// Shortest API key cut out of error bodies by value (a shorter one would cut words).
const MIN_ECHOED_KEY: usize = 8;

/// The start of an error body, redacted (servers echo prompts and keys back): our own
/// API key is cut out by value first, whatever its shape, then secrets by shape.
fn error_text(body: &[u8], redactor: &Redactor, key: Option<&ApiKey>) -> String {
    let mut text = String::from_utf8_lossy(body).into_owned();
    if let Some(k) = key
        .map(ApiKey::expose)
        .filter(|k| k.len() >= MIN_ECHOED_KEY)
    {
        text = text.replace(k, "[REDACTED:api-key]");
    }
    let short: String = text.chars().take(MAX_ERROR_TEXT).collect();
    redactor.redact_secrets(&short)
}

#[cfg(test)]
mod tests;
