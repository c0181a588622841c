//! Detectors (placeholder while the real ones land).

use warden_model::{Finding, Timestamp};

use crate::state::Cluster;

/// Detector settings.
#[derive(Debug, Clone, Default)]
pub struct DetectConfig {}

/// All detectors.
#[derive(Debug)]
pub struct Detectors {}

/// Output of one pass.
#[derive(Debug, Default)]
pub struct Verdicts {
    /// Findings.
    pub findings: Vec<Finding>,
}

impl Detectors {
    /// New.
    pub fn new(_c: DetectConfig) -> Self {
        Detectors {}
    }
    /// Run.
    pub fn run(&mut self, _c: &mut Cluster, _now: Timestamp) -> Verdicts {
        Verdicts::default()
    }
}
