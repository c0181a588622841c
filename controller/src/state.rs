//! Per-job state built from agent batches (placeholder while the real one lands).

use warden_model::Timestamp;
use warden_model::wire::Batch;

use crate::engine::EngineStats;
use crate::view::{JobView, RankView};

/// Everything the controller knows about jobs and nodes.
#[derive(Debug, Default)]
pub struct Cluster {}

impl Cluster {
    /// Apply one batch.
    pub fn apply(&mut self, _b: Batch, _at: Timestamp, _stats: &mut EngineStats) -> usize {
        0
    }
    /// Rank views.
    pub fn rank_views(&self, _job: &str, _now: Timestamp, _origin: Timestamp) -> Option<Vec<RankView>> {
        None
    }
    /// Job views.
    pub fn job_views(&self) -> Vec<JobView> {
        vec![]
    }
    /// Agents.
    pub fn agents(&self, _now: Timestamp) -> Vec<(String, f64)> {
        vec![]
    }
}
