//! Warden's domain model: identities, signals agents send, findings and incidents, and
//! the versioned agent-to-controller wire format.
//!
//! This crate does no IO and knows no runtime: every other crate speaks through it.

pub mod config;
pub mod ids;
pub mod incident;
pub mod time;
pub mod view;
pub mod wire;
pub mod xid;
pub mod yaml;

pub use ids::{CommId, GpuRef, JobId, NodeName, Rank};
pub use incident::{
    DiagnosisEvidence, Evidence, Finding, Incident, IncidentDiagnosis, IncidentKind, IncidentState,
    Severity, TimelineEntry,
};
pub use time::Timestamp;
