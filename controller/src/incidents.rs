//! Incidents (placeholder while the real book lands).

use warden_model::{Incident, Timestamp};

use crate::detect::Verdicts;
use crate::engine::IncidentChange;
use crate::state::Cluster;

/// Incident book.
#[derive(Debug, Default)]
pub struct IncidentBook {
    all: Vec<Incident>,
}

impl IncidentBook {
    /// Fold.
    pub fn fold(&mut self, _v: Verdicts, _now: Timestamp, _c: &Cluster) -> Vec<IncidentChange> {
        vec![]
    }
    /// All.
    pub fn all(&self) -> &[Incident] {
        &self.all
    }
    /// Get.
    pub fn get(&self, id: &str) -> Option<&Incident> {
        self.all.iter().find(|i| i.id == id)
    }
}
