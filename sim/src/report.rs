//! The run report `warden sim --report` writes: the injected faults with their onsets,
//! the incidents the controller opened, and what a scorer needs to compare them.

use std::path::Path;

use serde::{Deserialize, Serialize};
use warden_model::view::IncidentView;

use crate::sim::{FaultRecord, Simulation};

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a report.
    #[error("{}: {source}", path.display())]
    Json {
        /// The file.
        path: std::path::PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

/// The outcome of one simulated run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Ranks in the job.
    pub ranks: u32,
    /// Virtual seconds simulated.
    pub sim_seconds: f64,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
    /// Nominal iteration time of the job, seconds.
    pub iteration_secs: f64,
    /// Steps the scenario asked for.
    pub steps: u64,
    /// Batches delivered to the controller.
    #[serde(default)]
    pub batches: u64,
    /// Collective records delivered (completed and in flight).
    #[serde(default)]
    pub collective_events: u64,
    /// Injected faults, with their onsets.
    pub faults: Vec<FaultRecord>,
    /// Incidents the controller opened.
    pub incidents: Vec<IncidentView>,
    /// End time of each step every rank completed, seconds since the run start.
    pub step_ends_s: Vec<f64>,
}

impl Report {
    /// The report of a finished (or stopped) simulation.
    pub fn new(sim: &Simulation, incidents: Vec<IncidentView>, wall_seconds: f64) -> Report {
        let p = sim.progress();
        Report {
            scenario: sim.scenario().name.clone(),
            ranks: p.ranks,
            sim_seconds: (p.sim_seconds * 1000.0).round() / 1000.0,
            wall_seconds,
            iteration_secs: sim.scenario().job.iteration_secs,
            steps: p.steps,
            batches: p.batches,
            collective_events: p.collective_events,
            faults: sim.faults(),
            incidents,
            step_ends_s: sim
                .step_ends()
                .iter()
                .map(|t| (t * 1000.0).round() / 1000.0)
                .collect(),
        }
    }

    /// Virtual seconds per wall-clock second.
    pub fn speedup(&self) -> f64 {
        if self.wall_seconds > 0.0 {
            self.sim_seconds / self.wall_seconds
        } else {
            f64::INFINITY
        }
    }

    /// Read a report written as JSON.
    pub fn load(path: &Path) -> Result<Report, ReportError> {
        let text = std::fs::read(path).map_err(|source| ReportError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_slice(&text).map_err(|source| ReportError::Json {
            path: path.to_path_buf(),
            source,
        })
    }
}
