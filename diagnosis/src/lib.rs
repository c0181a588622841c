//! Log diagnosis: classify a failure from its logs into one of Warden's categories, name
//! the culprit rank / node / GPU, and pick the evidence lines that show it.
//!
//! The deterministic path (rules, template mining, evidence selection) answers on its
//! own; an LLM may refine the answer where rules run out, but only ever recommends.
//! Nothing here opens a socket except the LLM client, and nothing reads the wall clock.

pub mod classify;
pub mod drain;
pub mod eval;
pub mod evidence;
pub mod input;
#[cfg(feature = "llm")]
pub mod llm;
#[cfg(feature = "llm")]
pub mod llm_eval;
pub mod loggen;
pub mod model;
pub mod pipeline;
pub mod redact;
pub mod rules;
pub mod watchdog;

pub use model::{Category, Culprit, Diagnosis, EvidenceLine, FaultLocus, LogLine};
pub use pipeline::{Pipeline, PipelineOptions, diagnose_lines};
