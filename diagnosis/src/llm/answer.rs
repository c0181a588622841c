//! Reading the model's answer: the completion envelope, then the answer object,
//! checked strictly against the schema and the evidence. The answer is outside input:
//! nothing in it is trusted, nothing in it is executed, and a culprit it names that the
//! evidence does not show is dropped.

use std::collections::HashSet;
use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;

use crate::model::{Category, Culprit, FaultLocus};

use super::prompt::{
    MAX_ACTION_CHARS, MAX_CULPRIT_ITEMS, MAX_CULPRIT_TEXT_CHARS, MAX_EXPLANATION_CHARS,
    MAX_NAME_CHARS, Prompt,
};

/// Largest answer content accepted, in bytes (the schema's bounds add up to less).
pub const MAX_CONTENT_BYTES: usize = 16 * 1024;

/// Why an answer was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The body or the content is not the JSON expected.
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The model stopped at its token limit; the answer is cut.
    #[error("answer truncated at the token limit")]
    Truncated,
    /// Well-formed, but breaks the schema or cites what was not sent.
    #[error("invalid answer: {0}")]
    Invalid(String),
}

#[derive(Deserialize)]
struct Envelope {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    total_tokens: Option<u64>,
}

/// The completion's content and the tokens the server says it used.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The first choice's message content.
    pub content: String,
    /// `usage.total_tokens`, when given.
    pub total_tokens: Option<u64>,
}

/// Reads the chat-completions envelope.
pub fn parse_envelope(body: &[u8]) -> Result<Completion, AnswerError> {
    let env: Envelope = serde_json::from_slice(body)
        .map_err(|e| AnswerError::Malformed(format!("response body: {e}")))?;
    let total_tokens = env.usage.and_then(|u| u.total_tokens);
    let choice = env
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| AnswerError::Malformed("no choices".to_owned()))?;
    if choice.finish_reason.as_deref() == Some("length") {
        return Err(AnswerError::Truncated);
    }
    let content = choice
        .message
        .content
        .ok_or_else(|| AnswerError::Malformed("no message content".to_owned()))?;
    Ok(Completion {
        content,
        total_tokens,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnswer {
    category: Option<String>,
    fault_locus: Option<String>,
    culprit: RawCulprit,
    confidence: f64,
    #[serde(default)]
    evidence_ids: Vec<u64>,
    explanation: String,
    #[serde(default)]
    recommended_action: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCulprit {
    #[serde(default)]
    ranks: Vec<u32>,
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    gpus: Vec<String>,
    #[serde(default)]
    text: String,
}

/// A checked answer, still in redacted form (pseudonyms not yet translated back).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The category.
    pub category: Option<Category>,
    /// The fault locus.
    pub fault_locus: Option<FaultLocus>,
    /// The culprit, only what the evidence shows; empty if nothing survived.
    pub culprit: Culprit,
    /// 0..=1.
    pub confidence: f64,
    /// One paragraph citing evidence ids.
    pub explanation: String,
    /// Advice in words, never acted on.
    pub recommended_action: Option<String>,
    /// Culprit names dropped because the evidence does not show them.
    pub dropped: Vec<String>,
}

/// Removes a Markdown code fence around the content, if there is one.
pub fn strip_fences(content: &str) -> &str {
    let t = content.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    // Skip the info string ("json") up to the end of the first line.
    let rest = match rest.find('\n') {
        Some(i) => &rest[i + 1..],
        None => rest,
    };
    rest.trim_end().strip_suffix("```").unwrap_or(rest).trim()
}

/// Text from the model made safe to show: control characters removed, whitespace
/// collapsed, and within `max` characters (else an error naming `field`).
fn clean(field: &str, text: &str, max: usize) -> Result<String, AnswerError> {
    let collapsed: String = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if collapsed.chars().count() > max {
        return Err(AnswerError::Invalid(format!(
            "{field} longer than {max} characters"
        )));
    }
    Ok(collapsed)
}

fn citation_re() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\[([0-9]{1,19}(?:\s*,\s*[0-9]{1,19})*)\]").ok())
        .as_ref()
}

/// The ids an explanation cites as `[12]` or `[12, 14]`.
pub fn cited_ids(explanation: &str) -> Vec<u64> {
    let Some(re) = citation_re() else {
        return Vec::new();
    };
    re.captures_iter(explanation)
        .flat_map(|c| {
            c.get(1)
                .map(|m| m.as_str())
                .unwrap_or("")
                .split(',')
                .filter_map(|n| n.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether `needle` occurs in `hay` as a whole token (ASCII case-insensitive; the
/// characters around it are not letters, digits, `_`, `-` or `.` followed by more).
pub fn contains_token(hay: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let (h, n) = (hay.to_ascii_lowercase(), needle.to_ascii_lowercase());
    let word =
        |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let mut from = 0;
    while let Some(i) = h[from..].find(&n) {
        let start = from + i;
        let end = start + n.len();
        let before = h[..start].chars().next_back();
        let after = h[end..].chars().next();
        let dotted_on = after == Some('.')
            && h[end + 1..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric());
        if !word(before) && !word(after) && !dotted_on {
            return true;
        }
        from = start + n.chars().next().map_or(1, char::len_utf8);
    }
    false
}

/// Whether a line names global rank `r` ("rank 7", "rank=7", "[rank7]", "Rank: 7").
fn names_rank(text: &str, r: u32) -> bool {
    let t = text.to_ascii_lowercase();
    let digits = r.to_string();
    let mut from = 0;
    while let Some(i) = t[from..].find("rank") {
        let mut rest = &t[from + i + 4..];
        rest = rest.trim_start_matches(['s', ' ', '=', ':', '#', '[', '(']);
        if let Some(after) = rest.strip_prefix(digits.as_str())
            && !after.starts_with(|c: char| c.is_ascii_digit())
        {
            return true;
        }
        from += i + 4;
    }
    false
}

/// Whether a line names GPU `g`: the name itself (a PCI id, a UUID) as a token, or an
/// index as "GPU 3", "cuda:3", "device 3".
fn names_gpu(text: &str, g: &str) -> bool {
    if g.bytes().all(|b| b.is_ascii_digit()) {
        let t = text.to_ascii_lowercase();
        ["gpu", "cuda", "device"].iter().any(|word| {
            let mut from = 0;
            while let Some(i) = t[from..].find(word) {
                let rest = t[from + i + word.len()..].trim_start_matches([' ', ':', '#', '=']);
                if let Some(after) = rest.strip_prefix(g)
                    && !after.starts_with(|c: char| c.is_ascii_digit())
                {
                    return true;
                }
                from += i + word.len();
            }
            false
        })
    } else {
        contains_token(text, g)
    }
}

/// Parses and checks the content against the schema and the prompt it answers.
pub fn validate(content: &str, prompt: &Prompt) -> Result<Answer, AnswerError> {
    if content.len() > MAX_CONTENT_BYTES {
        return Err(AnswerError::Invalid(format!(
            "content over {MAX_CONTENT_BYTES} bytes"
        )));
    }
    let json = strip_fences(content);
    let raw: RawAnswer =
        serde_json::from_str(json).map_err(|e| AnswerError::Malformed(e.to_string()))?;
    let category = raw
        .category
        .as_deref()
        .map(str::parse::<Category>)
        .transpose()
        .map_err(|e| AnswerError::Invalid(e.to_string()))?;
    let fault_locus = raw
        .fault_locus
        .as_deref()
        .map(str::parse::<FaultLocus>)
        .transpose()
        .map_err(|e| AnswerError::Invalid(e.to_string()))?;
    if !(raw.confidence.is_finite() && (0.0..=1.0).contains(&raw.confidence)) {
        return Err(AnswerError::Invalid(format!(
            "confidence {} outside 0..=1",
            raw.confidence
        )));
    }
    let explanation = clean("explanation", &raw.explanation, MAX_EXPLANATION_CHARS)?;
    if explanation.is_empty() {
        return Err(AnswerError::Invalid("empty explanation".to_owned()));
    }
    let sent: HashSet<u64> = prompt.sent_ids.iter().copied().collect();
    let cited: Vec<u64> = cited_ids(&explanation)
        .into_iter()
        .chain(raw.evidence_ids.iter().copied())
        .collect();
    if let Some(bad) = cited.iter().find(|id| !sent.contains(id)) {
        return Err(AnswerError::Invalid(format!(
            "cites evidence line {bad}, which was not sent"
        )));
    }
    if !sent.is_empty() && cited.is_empty() {
        return Err(AnswerError::Invalid("cites no evidence line".to_owned()));
    }
    let recommended_action = match raw.recommended_action.as_deref() {
        Some(a) => {
            Some(clean("recommended_action", a, MAX_ACTION_CHARS)?).filter(|a| !a.is_empty())
        }
        None => None,
    };
    let c = raw.culprit;
    if c.ranks.len() > MAX_CULPRIT_ITEMS
        || c.nodes.len() > MAX_CULPRIT_ITEMS
        || c.gpus.len() > MAX_CULPRIT_ITEMS
    {
        return Err(AnswerError::Invalid(format!(
            "culprit names more than {MAX_CULPRIT_ITEMS} items"
        )));
    }
    let culprit_text = clean("culprit.text", &c.text, MAX_CULPRIT_TEXT_CHARS)?;
    let mut dropped = Vec::new();
    let texts = &prompt.sent_texts;
    let mut ranks = Vec::new();
    for r in c.ranks {
        if prompt.hint_ranks.contains(&r) || texts.iter().any(|t| names_rank(t, r)) {
            if !ranks.contains(&r) {
                ranks.push(r);
            }
        } else {
            dropped.push(format!("rank {r}"));
        }
    }
    let mut nodes = Vec::new();
    for n in c.nodes {
        let n = n.trim().to_owned();
        let shown = n.chars().count() <= MAX_NAME_CHARS
            && (prompt.hint_nodes.iter().any(|h| h.eq_ignore_ascii_case(&n))
                || texts.iter().any(|t| contains_token(t, &n)));
        if shown && !nodes.contains(&n) {
            nodes.push(n);
        } else if !shown {
            dropped.push(format!("node {n}"));
        }
    }
    let mut gpus = Vec::new();
    for g in c.gpus {
        let g = g.trim().to_owned();
        let shown = g.chars().count() <= MAX_NAME_CHARS
            && (prompt.hint_gpus.iter().any(|h| h.eq_ignore_ascii_case(&g))
                || texts.iter().any(|t| names_gpu(t, &g)));
        if shown && !gpus.contains(&g) {
            gpus.push(g);
        } else if !shown {
            dropped.push(format!("GPU {g}"));
        }
    }
    let mut culprit = Culprit {
        ranks,
        nodes,
        gpus,
        text: culprit_text,
        ..Culprit::default()
    };
    if !dropped.is_empty() || culprit.is_empty() {
        // The model's words may name what was dropped: say only what survived.
        culprit.text = describe(&culprit);
    }
    Ok(Answer {
        category,
        fault_locus,
        culprit,
        confidence: raw.confidence,
        explanation,
        recommended_action,
        dropped,
    })
}

/// The culprit in plain words, from its lists.
pub fn describe(c: &Culprit) -> String {
    let mut parts = Vec::new();
    if !c.ranks.is_empty() {
        let r: Vec<String> = c.ranks.iter().map(u32::to_string).collect();
        parts.push(format!("rank {}", r.join(", ")));
    }
    if !c.nodes.is_empty() {
        parts.push(format!("node {}", c.nodes.join(", ")));
    }
    if !c.gpus.is_empty() {
        parts.push(format!("GPU {}", c.gpus.join(", ")));
    }
    parts.join("; ")
}
