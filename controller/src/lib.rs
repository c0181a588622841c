//! Warden controller: the service around the detection engine (`warden-engine`). It
//! takes agent batches and scheduler reports over its HTTP API, runs the engine's
//! detectors on a timer, stores incidents and actions, sends alerts, diagnoses logs,
//! drives remediation under leader election, and exports metrics and traces.

pub mod alerts;
pub mod api;
pub mod auth;
pub mod config;
pub mod diagnosis;
pub mod forward;
pub mod leader;
pub mod metrics;
pub mod openapi;
pub mod operate;
pub mod persist;
pub mod remedy;
pub mod shared;
pub mod store;
pub mod telemetry;
pub mod tls;

pub use shared::SharedEngine;
