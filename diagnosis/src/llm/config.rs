//! The LLM client's configuration (`diagnosis.llm` in YAML) and its API key, which is
//! read once, never logged and never printed by `Debug`.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

/// Where and how to reach an OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Base URL of the API, up to and including the version: `http://127.0.0.1:8000/v1`
    /// (vLLM), `http://127.0.0.1:11434/v1` (Ollama), `https://api.example.com/v1`. A URL
    /// that already ends in `/chat/completions` is used as it is.
    pub base_url: String,
    /// Model name sent in every request.
    pub model: String,
    /// File holding the API key (first line, whitespace trimmed). At most one of
    /// `api_key_file` and `api_key_env`; neither means no `Authorization` header.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Time allowed for one attempt (connect, send, whole answer), in milliseconds.
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    /// Further attempts after a timeout, a connection error, a 429 or a 5xx.
    #[serde(default = "defaults::max_retries")]
    pub max_retries: u32,
    /// First wait between attempts, in milliseconds; doubled each time (capped at 10 s),
    /// with jitter; a `Retry-After` header is honoured up to the same cap.
    #[serde(default = "defaults::retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// Requests in flight at once, across all callers of one client.
    #[serde(default = "defaults::max_concurrency")]
    pub max_concurrency: usize,
    /// Upper bound on one request's tokens (estimated prompt + `max_answer_tokens`);
    /// evidence lines are dropped, least telling first, until the prompt fits.
    #[serde(default = "defaults::max_tokens_per_request")]
    pub max_tokens_per_request: u64,
    /// `max_tokens` asked of the model for its answer.
    #[serde(default = "defaults::max_answer_tokens")]
    pub max_answer_tokens: u64,
    /// Tokens this client may spend in total per window (per process when
    /// `budget_window_secs` is not set); a request that would exceed it is refused.
    #[serde(default = "defaults::token_budget")]
    pub token_budget: u64,
    /// Length of the budget window in seconds; unset: the budget is for the process.
    #[serde(default)]
    pub budget_window_secs: Option<u64>,
    /// Sampling temperature, 0 to 2.
    #[serde(default)]
    pub temperature: f64,
    /// Replace host names by `host-N` before sending.
    #[serde(default = "defaults::yes")]
    pub redact_hosts: bool,
    /// Replace IP addresses by `ip-N` before sending.
    #[serde(default = "defaults::yes")]
    pub redact_ips: bool,
    /// Most evidence lines sent.
    #[serde(default = "defaults::max_evidence_lines")]
    pub max_evidence_lines: usize,
    /// Most characters of one evidence line sent (the rest is cut).
    #[serde(default = "defaults::max_line_chars")]
    pub max_line_chars: usize,
    /// Answers remembered, keyed by model, redacted evidence and rules answer; 0: none.
    #[serde(default = "defaults::cache_entries")]
    pub cache_entries: usize,
}

mod defaults {
    pub fn timeout_ms() -> u64 {
        30_000
    }
    pub fn max_retries() -> u32 {
        2
    }
    pub fn retry_backoff_ms() -> u64 {
        500
    }
    pub fn max_concurrency() -> usize {
        2
    }
    pub fn max_tokens_per_request() -> u64 {
        8_000
    }
    pub fn max_answer_tokens() -> u64 {
        800
    }
    pub fn token_budget() -> u64 {
        1_000_000
    }
    pub fn yes() -> bool {
        true
    }
    pub fn max_evidence_lines() -> usize {
        40
    }
    pub fn max_line_chars() -> usize {
        400
    }
    pub fn cache_entries() -> usize {
        256
    }
}

impl LlmConfig {
    /// A configuration with every default, for this endpoint and model.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        LlmConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key_file: None,
            api_key_env: None,
            timeout_ms: defaults::timeout_ms(),
            max_retries: defaults::max_retries(),
            retry_backoff_ms: defaults::retry_backoff_ms(),
            max_concurrency: defaults::max_concurrency(),
            max_tokens_per_request: defaults::max_tokens_per_request(),
            max_answer_tokens: defaults::max_answer_tokens(),
            token_budget: defaults::token_budget(),
            budget_window_secs: None,
            temperature: 0.0,
            redact_hosts: true,
            redact_ips: true,
            max_evidence_lines: defaults::max_evidence_lines(),
            max_line_chars: defaults::max_line_chars(),
            cache_entries: defaults::cache_entries(),
        }
    }

    /// Every problem with the configuration, each naming its field.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut errs = Vec::new();
        let mut bad =
            |field: &'static str, problem: String| errs.push(ConfigError { field, problem });
        match self.base_url.parse::<hyper::Uri>() {
            Ok(u) => {
                if !matches!(u.scheme_str(), Some("http" | "https")) {
                    bad("base_url", "must start with http:// or https://".to_owned());
                }
                if u.host().is_none() {
                    bad("base_url", "has no host".to_owned());
                }
            }
            Err(e) => bad("base_url", format!("not a URL: {e}")),
        }
        if self.model.trim().is_empty() {
            bad("model", "must not be empty".to_owned());
        }
        if self.api_key_file.is_some() && self.api_key_env.is_some() {
            bad(
                "api_key_file",
                "give at most one of api_key_file and api_key_env".to_owned(),
            );
        }
        if self.timeout_ms == 0 {
            bad("timeout_ms", "must be positive".to_owned());
        }
        if self.max_concurrency == 0 {
            bad("max_concurrency", "must be at least 1".to_owned());
        }
        if self.max_answer_tokens == 0 {
            bad("max_answer_tokens", "must be positive".to_owned());
        }
        if self.max_tokens_per_request <= self.max_answer_tokens {
            bad(
                "max_tokens_per_request",
                "must exceed max_answer_tokens, to leave room for the prompt".to_owned(),
            );
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            bad("temperature", "must be within 0..=2".to_owned());
        }
        if self.budget_window_secs == Some(0) {
            bad("budget_window_secs", "must be positive when set".to_owned());
        }
        if self.max_evidence_lines == 0 {
            bad("max_evidence_lines", "must be at least 1".to_owned());
        }
        if self.max_line_chars < 40 {
            bad("max_line_chars", "must be at least 40".to_owned());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errs))
        }
    }

    /// The API key named by the configuration, if any.
    pub fn load_api_key(&self) -> Result<Option<ApiKey>, ConfigErrors> {
        let one = |field, problem| ConfigErrors(vec![ConfigError { field, problem }]);
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| one("api_key_file", format!("{}: {e}", path.display())))?;
            let key = text.lines().next().unwrap_or("").trim();
            if key.is_empty() {
                return Err(one("api_key_file", format!("{} is empty", path.display())));
            }
            return Ok(Some(ApiKey(key.to_owned())));
        }
        if let Some(var) = &self.api_key_env {
            let key = std::env::var(var).map_err(|e| one("api_key_env", format!("{var}: {e}")))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(one("api_key_env", format!("{var} is empty")));
            }
            return Ok(Some(ApiKey(key.to_owned())));
        }
        Ok(None)
    }
}

/// An API key. `Debug` and `Display` print `***`; only the request builder reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The field, as spelled in the configuration.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// All problems found, reported at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|e| format!("llm.{}: {}", e.field, e.problem)).collect::<Vec<_>>().join("; "))]
pub struct ConfigErrors(pub Vec<ConfigError>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_rejected_and_defaults_filled() {
        let ok: LlmConfig =
            serde_json::from_str(r#"{"base_url":"http://127.0.0.1:8000/v1","model":"m"}"#)
                .expect("minimal config");
        assert_eq!(ok, LlmConfig::new("http://127.0.0.1:8000/v1", "m"));
        assert!(ok.validate().is_ok());
        let err = serde_json::from_str::<LlmConfig>(
            r#"{"base_url":"http://x/v1","model":"m","api_kye":"sk-x"}"#,
        )
        .expect_err("typo");
        assert!(err.to_string().contains("api_kye"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut c = LlmConfig::new("ftp://x", " ");
        c.max_concurrency = 0;
        c.temperature = 3.0;
        c.api_key_env = Some("A".into());
        c.api_key_file = Some("/k".into());
        let errs = c.validate().expect_err("bad config").0;
        let fields: Vec<_> = errs.iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "base_url",
                "model",
                "api_key_file",
                "max_concurrency",
                "temperature"
            ]
        );
    }

    #[test]
    fn the_key_is_never_printed() {
        let k = ApiKey::new("sk-very-secret-value-123");
        assert_eq!(format!("{k:?} {k}"), "ApiKey(***) ***");
    }
}
