//! Warden controller: ingest of agent batches, per-job state, pure detectors for hangs,
//! stragglers, slow links, NaNs, crashes and GPU faults, and incidents built from their
//! findings; plus the HTTP API that serves them.

pub mod alerts;
pub mod api;
pub mod auth;
pub mod clock;
pub mod config;
pub mod detect;
pub mod diagnosis;
pub mod engine;
pub mod forward;
pub mod incidents;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod openapi;
pub mod operate;
pub mod persist;
pub mod remedy;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod view;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{
    Change, Encoding, Engine, EngineConfig, EngineStats, IncidentChange, SharedEngine,
};
