//! Warden's detection engine: decoding of agent batches into per-job state, pure
//! detectors for hangs, stragglers, slow links, NaNs, crashes and GPU faults, the
//! incident book built from their findings, and job lifecycle, all driven by an
//! injected clock. It does no IO: the controller service feeds it and stores, serves
//! and acts on what it decides; the simulator drives it in virtual time.

pub mod clock;
pub mod detect;
pub mod engine;
pub mod incidents;
pub mod ledger;
pub mod lifecycle;
pub mod links;
pub mod state;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{
    Change, DiagnosisRequest, Encoding, Engine, EngineConfig, EngineStats, HeldLine, IncidentChange,
};
