//! Warden's cluster and job simulator: node agents of a synchronous 3D-parallel training
//! job, in virtual time, with injected faults, feeding the controller through the same
//! wire path real agents use; plus the report of a run and the scorer that grades the
//! controller's incidents against the injected faults.

pub mod agent;
pub mod physics;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod score;
pub mod sim;
pub mod topology;

pub use agent::SIM_EPOCH;
pub use report::{Report, ReportError};
pub use scenario::{Capture, Fault, FaultKind, Job, Metrics, Noise, Scenario, ScenarioError};
pub use score::{Scorecard, score};
pub use sim::{FaultRecord, Progress, RunOptions, Simulation, Sink, run};
