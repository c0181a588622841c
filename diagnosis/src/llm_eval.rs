//! Scoring an LLM endpoint on a labelled corpus: for each case, the rules' answer, then
//! the model's refinement of it, side by side with the expected labels.
//!
//! The caller supplies the corpus ([`EvalCase`]: id, expected category and fault locus,
//! log excerpt) and a function that runs the deterministic path on an excerpt and
//! returns the rules' answer and its evidence. [`evaluate_corpus`] asks the model about
//! every case (as many at once as the client's `max_concurrency` allows) and returns an
//! [`EvalReport`] with per-case answers and [`EvalSummary`] counts, for a command such
//! as `warden diagnose --eval CORPUS --llm-url URL --llm-model M` to print:
//!
//! ```no_run
//! # async fn example(cases: Vec<warden_diagnosis::llm_eval::EvalCase>,
//! #                  rules: impl FnMut(&str) -> (warden_diagnosis::Diagnosis,
//! #                                              Vec<warden_diagnosis::EvidenceLine>)) {
//! use warden_diagnosis::llm::{LlmConfig, LlmDiagnoser};
//! use warden_diagnosis::llm_eval::evaluate_corpus;
//!
//! let llm = LlmDiagnoser::new(LlmConfig::new("http://127.0.0.1:8000/v1", "qwen2.5-7b"))
//!     .expect("config");
//! let report = evaluate_corpus(&llm, &cases, rules).await;
//! let s = report.summary();
//! println!("category: rules {}/{}, llm {}/{}", s.rules_category_correct, s.cases,
//!          s.llm_category_correct, s.cases);
//! # }
//! ```
//!
//! Every case gets an answer: when the model fails, its "llm" answer is the rules'
//! answer and the case's outcome says why, so accuracy counts are never short of cases.
//! Caching is per client: evaluate with a fresh client to measure the model, not the
//! cache.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::llm::{LlmDiagnoser, LlmError, Outcome, TransportError};
use crate::model::{Category, Diagnosis, EvidenceLine, FaultLocus};

/// One labelled case of a corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalCase {
    /// The case's name.
    pub id: String,
    /// The expected category (`None`: nothing should be claimed).
    pub category: Option<Category>,
    /// The expected fault locus.
    pub fault_locus: Option<FaultLocus>,
    /// The log excerpt.
    pub excerpt: String,
}

/// One case's answers.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case's id.
    pub id: String,
    /// The expected category.
    pub expected_category: Option<Category>,
    /// The expected fault locus.
    pub expected_locus: Option<FaultLocus>,
    /// The rules' answer.
    pub rules: Diagnosis,
    /// The model's answer (the rules' answer, noted, when the model failed).
    pub llm: Diagnosis,
    /// What the client did.
    pub outcome: Outcome,
}

impl CaseResult {
    /// Whether the rules named the expected category.
    pub fn rules_category_correct(&self) -> bool {
        self.rules.category == self.expected_category
    }

    /// Whether the model's answer named the expected category.
    pub fn llm_category_correct(&self) -> bool {
        self.llm.category == self.expected_category
    }

    /// Whether the rules named the expected fault locus.
    pub fn rules_locus_correct(&self) -> bool {
        self.rules.fault_locus == self.expected_locus
    }

    /// Whether the model's answer named the expected fault locus.
    pub fn llm_locus_correct(&self) -> bool {
        self.llm.fault_locus == self.expected_locus
    }
}

/// Counts over a report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EvalSummary {
    /// Cases evaluated.
    pub cases: usize,
    /// Cases where the rules' category was right.
    pub rules_category_correct: usize,
    /// Cases where the model's category was right.
    pub llm_category_correct: usize,
    /// Cases where the rules' fault locus was right.
    pub rules_locus_correct: usize,
    /// Cases where the model's fault locus was right.
    pub llm_locus_correct: usize,
    /// Cases the model answered (fresh or cached).
    pub refined: usize,
    /// Cases the model did not answer, by [`Outcome::label`].
    pub fallbacks: BTreeMap<&'static str, usize>,
}

/// Per-case answers, in corpus order.
#[derive(Debug, Clone, Default)]
pub struct EvalReport {
    /// One entry per case.
    pub cases: Vec<CaseResult>,
}

impl EvalReport {
    /// The counts.
    pub fn summary(&self) -> EvalSummary {
        let mut s = EvalSummary {
            cases: self.cases.len(),
            ..EvalSummary::default()
        };
        for c in &self.cases {
            s.rules_category_correct += usize::from(c.rules_category_correct());
            s.llm_category_correct += usize::from(c.llm_category_correct());
            s.rules_locus_correct += usize::from(c.rules_locus_correct());
            s.llm_locus_correct += usize::from(c.llm_locus_correct());
            match &c.outcome {
                Outcome::Refined { .. } => s.refined += 1,
                Outcome::Fallback(e) => *s.fallbacks.entry(e.label()).or_default() += 1,
            }
        }
        s
    }
}

/// Runs the rules on every case, then asks the model about each (concurrently, within
/// the client's limits). `rules` maps an excerpt to the rules' answer and the evidence
/// to send. Never fails; see the module docs.
pub async fn evaluate_corpus<F>(llm: &LlmDiagnoser, cases: &[EvalCase], mut rules: F) -> EvalReport
where
    F: FnMut(&str) -> (Diagnosis, Vec<EvidenceLine>),
{
    let mut tasks = tokio::task::JoinSet::new();
    let mut answers: Vec<Option<(Diagnosis, Outcome)>> = vec![None; cases.len()];
    let mut rules_answers = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        let (answer, evidence) = rules(&case.excerpt);
        rules_answers.push(answer.clone());
        let llm = llm.clone();
        tasks.spawn(async move { (i, llm.refine(&answer, &evidence).await) });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((i, answer)) => {
                if let Some(slot) = answers.get_mut(i) {
                    *slot = Some(answer);
                }
            }
            Err(e) => tracing::warn!(error = %e, "evaluation task ended without an answer"),
        }
    }
    let cases = cases
        .iter()
        .zip(rules_answers)
        .zip(answers)
        .map(|((case, rules), answer)| {
            let (llm, outcome) = answer.unwrap_or_else(|| {
                let why = TransportError::Connection("evaluation task ended early".to_owned());
                (rules.clone(), Outcome::Fallback(LlmError::Transport(why)))
            });
            CaseResult {
                id: case.id.clone(),
                expected_category: case.category,
                expected_locus: case.fault_locus,
                rules,
                llm,
                outcome,
            }
        })
        .collect();
    EvalReport { cases }
}
