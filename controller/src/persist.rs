//! Keeps the store in step with the engine: after each detector pass (and after every
//! change a person makes) the incidents that changed are written with the timeline
//! entries not yet stored; at start the live incidents of the previous run are taken
//! back, so grouping and deduplication carry across restarts. The node-health ledger's
//! changed nodes are written the same way, and the whole ledger is taken back at start.
//!
//! The engine is only locked to copy what changed; writing happens outside the lock.

use rustc_hash::FxHashMap;
use warden_engine::ledger::NodeHealth;
use warden_model::{Incident, IncidentDiagnosis, TimelineEntry, Timestamp};

use crate::shared::SharedEngine;
use crate::store::{Store, StoreError};

/// How often job views are written, seconds.
const JOB_SYNC_SECS: f64 = 5.0;

/// What the store holds of one incident.
#[derive(Debug, Clone)]
struct Stored {
    updated_at: Timestamp,
    last_entry: Option<TimelineEntry>,
    next_seq: i64,
    diagnosis: Option<IncidentDiagnosis>,
}

/// The engine → store writer.
#[derive(Debug)]
pub struct Persister {
    store: Store,
    stored: FxHashMap<String, Stored>,
    jobs: FxHashMap<String, String>,
    last_jobs: Option<Timestamp>,
    /// Ledger nodes whose write failed, tried again on the next call.
    health_due: FxHashMap<String, NodeHealth>,
}

/// The timeline entries of `inc` after `last` (all of them when `last` is gone).
fn new_entries<'a>(inc: &'a Incident, last: Option<&TimelineEntry>) -> &'a [TimelineEntry] {
    let Some(last) = last else {
        return &inc.timeline;
    };
    match inc.timeline.iter().rposition(|e| e == last) {
        Some(p) => &inc.timeline[p + 1..],
        // The bounded in-memory timeline dropped it: whatever is newer is new.
        None => {
            let from = inc.timeline.partition_point(|e| e.at <= last.at);
            &inc.timeline[from..]
        }
    }
}

impl Persister {
    /// A writer for `store` that knows nothing stored yet.
    pub fn new(store: Store) -> Self {
        Persister {
            store,
            stored: FxHashMap::default(),
            jobs: FxHashMap::default(),
            last_jobs: None,
            health_due: FxHashMap::default(),
        }
    }

    /// The store written to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Load the incidents still live at `now` (unresolved, or resolved within
    /// `reopen_secs`) into `engine`. Returns how many were taken back.
    pub async fn restore(
        &mut self,
        engine: &SharedEngine,
        now: Timestamp,
        reopen_secs: f64,
    ) -> Result<usize, StoreError> {
        let since = Timestamp(now.0.saturating_sub((reopen_secs * 1e9) as i64));
        let live = self.store.live_incidents(since).await?;
        for inc in &live {
            let next_seq = self.store.timeline_len(&inc.id).await?;
            self.stored.insert(
                inc.id.clone(),
                Stored {
                    updated_at: inc.updated_at,
                    last_entry: inc.timeline.last().cloned(),
                    next_seq,
                    diagnosis: inc.diagnosis.clone(),
                },
            );
        }
        Ok(engine.lock().restore_incidents(live, now))
    }

    /// Load the node-health ledger the store holds into `engine`. Returns how many
    /// nodes were taken back; a document that does not parse is an error naming it.
    pub async fn restore_ledger(&mut self, engine: &SharedEngine) -> Result<usize, StoreError> {
        let docs = self.store.node_health().await?;
        let mut nodes = Vec::with_capacity(docs.len());
        for (node, doc) in docs {
            let n: NodeHealth = serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
                what: "node health",
                id: node.clone(),
                detail: e.to_string(),
            })?;
            nodes.push(n);
        }
        let n = nodes.len();
        engine.lock().ledger_mut().restore(nodes);
        Ok(n)
    }

    /// Write every incident that changed since the last call, and (every few seconds)
    /// the job views that changed. Returns how many incidents were written. An incident
    /// whose write fails stays due and is tried again on the next call.
    pub async fn sync(
        &mut self,
        engine: &SharedEngine,
        now: Timestamp,
    ) -> Result<usize, StoreError> {
        let (due, jobs) = {
            let e = engine.lock();
            let due: Vec<Incident> = e
                .incidents()
                .iter()
                .filter(|inc| {
                    // The time alone can miss a change: remediation notes an incident
                    // (and may resolve it) at the same instant as the pass that
                    // refreshed it and was written just before.
                    self.stored.get(&inc.id).is_none_or(|s| {
                        s.updated_at != inc.updated_at
                            || s.last_entry.as_ref() != inc.timeline.last()
                    })
                })
                .cloned()
                .collect();
            let jobs_due = self
                .last_jobs
                .is_none_or(|t| now.secs_since(t) >= JOB_SYNC_SECS);
            (due, jobs_due.then(|| e.job_views()))
        };
        let health = engine.lock().ledger_mut().take_dirty();
        for n in health {
            self.health_due.insert(n.node.clone(), n);
        }
        let mut written = 0;
        let mut first_error = None;
        for inc in &due {
            let prev = self.stored.get(&inc.id);
            let entries = new_entries(inc, prev.and_then(|s| s.last_entry.as_ref()));
            let first_seq = prev.map_or(0, |s| s.next_seq);
            let new_diagnosis =
                inc.diagnosis.is_some() && prev.is_none_or(|s| s.diagnosis != inc.diagnosis);
            match self
                .store
                .save_incident(inc, entries, first_seq, new_diagnosis)
                .await
            {
                Ok(()) => {
                    let next_seq = first_seq + entries.len() as i64;
                    self.stored.insert(
                        inc.id.clone(),
                        Stored {
                            updated_at: inc.updated_at,
                            last_entry: inc.timeline.last().cloned(),
                            next_seq,
                            diagnosis: inc.diagnosis.clone(),
                        },
                    );
                    written += 1;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(jobs) = jobs {
            self.last_jobs = Some(now);
            for j in jobs {
                let Ok(doc) = serde_json::to_string(&j) else {
                    continue;
                };
                if self.jobs.get(&j.job) == Some(&doc) {
                    continue;
                }
                let phase = match j.phase {
                    Some(warden_engine::lifecycle::Phase::Running) => "running",
                    Some(warden_engine::lifecycle::Phase::Ended) => "ended",
                    None => "unknown",
                };
                match self.store.save_job(&j.job, phase, &doc, now).await {
                    Ok(()) => {
                        self.jobs.insert(j.job.clone(), doc);
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        let mut health: Vec<NodeHealth> = self.health_due.drain().map(|(_, n)| n).collect();
        health.sort_by(|a, b| a.node.cmp(&b.node));
        for n in health {
            let Ok(doc) = serde_json::to_string(&n) else {
                continue;
            };
            if let Err(e) = self
                .store
                .put_node_health(&n.node, n.state.as_str(), n.since, &doc)
                .await
            {
                first_error.get_or_insert(e);
                self.health_due.insert(n.node.clone(), n);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(at: i64, what: &str) -> TimelineEntry {
        TimelineEntry {
            at: Timestamp(at),
            what: what.into(),
        }
    }

    #[test]
    fn new_entries_follow_the_last_stored_one() {
        let mut inc: Incident = serde_json::from_value(serde_json::json!({
            "id": "i", "kind": "hang", "job": null, "state": "open", "acknowledged": false,
            "severity": "critical", "ranks": [], "nodes": [], "gpus": [], "onset": 0,
            "detected_at": 0, "updated_at": 0, "resolved_at": null, "confidence": 1.0,
            "summary": "", "evidence": [], "finding_count": 1, "timeline": []
        }))
        .expect("incident");
        inc.timeline = vec![e(1, "a"), e(2, "b"), e(3, "c")];
        assert_eq!(new_entries(&inc, None).len(), 3);
        assert_eq!(new_entries(&inc, Some(&e(2, "b"))), &[e(3, "c")]);
        assert!(new_entries(&inc, Some(&e(3, "c"))).is_empty());
        // Dropped from memory: newer entries are the new ones.
        inc.timeline = vec![e(1, "a"), e(5, "x"), e(6, "y")];
        assert_eq!(
            new_entries(&inc, Some(&e(4, "gone"))),
            &[e(5, "x"), e(6, "y")]
        );
    }
}
