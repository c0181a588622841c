//! The engine shared between the ingest path, the detector timer and API readers, and
//! how far the store has caught up with it (acknowledgements that wait for a write).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use warden_engine::{Encoding, Engine};
use warden_model::Timestamp;
use warden_model::wire::DecodeError;

/// An engine shared between the ingest path, the detector timer and API readers, and
/// how far the store has caught up with it.
#[derive(Debug, Clone)]
pub struct SharedEngine(Arc<Mutex<Engine>>, Arc<Stored>);

/// How far the store has caught up with the engine, for acknowledgements that wait
/// for it.
#[derive(Debug)]
struct Stored {
    /// Whether a writer reports ([`SharedEngine::stored_through`]); without one, nothing
    /// waits.
    on: AtomicBool,
    /// [`Engine::event_batches`] as seen by the last pass whose store write succeeded.
    through: tokio::sync::watch::Sender<u64>,
}

impl SharedEngine {
    /// Share `engine`.
    pub fn new(engine: Engine) -> Self {
        SharedEngine(
            Arc::new(Mutex::new(engine)),
            Arc::new(Stored {
                on: AtomicBool::new(false),
                through: tokio::sync::watch::channel(0).0,
            }),
        )
    }

    /// Decode one encoded batch and apply it ([`Engine::ingest`]). Besides the records
    /// applied, returns the mark to pass to [`SharedEngine::wait_stored`]: non-zero when
    /// the batch carried node events.
    pub fn ingest(
        &self,
        body: &[u8],
        encoding: Encoding,
        received_at: Timestamp,
    ) -> Result<(usize, u64), DecodeError> {
        let mut e = self.lock();
        let before = e.event_batches();
        let applied = e.ingest(body, encoding, received_at)?;
        let mark = if e.event_batches() > before {
            e.event_batches()
        } else {
            0
        };
        Ok((applied, mark))
    }

    /// From now on batches with node events are acknowledged only once stored: the
    /// writer (the binary's detector loop) reports each successful write with
    /// [`SharedEngine::stored_through`]. An agent sends such an event once, so a batch
    /// acknowledged before its incident is stored would be lost to a crash.
    pub fn ack_when_stored(&self) {
        self.1.on.store(true, Ordering::SeqCst);
    }

    /// The pass that saw `event_batches` ([`Engine::event_batches`]) has written what
    /// it found to the store.
    pub fn stored_through(&self, event_batches: u64) {
        self.1.through.send_if_modified(|t| {
            let newer = event_batches > *t;
            if newer {
                *t = event_batches;
            }
            newer
        });
    }

    /// Wait, at most `limit`, until a pass that saw the batch marked `mark` (from
    /// [`SharedEngine::ingest`]) has written to the store. True at once for a mark of 0
    /// or when acknowledgements do not wait; false when `limit` passed first.
    pub async fn wait_stored(&self, mark: u64, limit: std::time::Duration) -> bool {
        if mark == 0 || !self.1.on.load(Ordering::SeqCst) {
            return true;
        }
        let mut rx = self.1.through.subscribe();
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|t| *t >= mark)).await,
            Ok(Ok(_))
        )
    }

    /// The engine itself, for a caller that drives it directly (the simulator).
    pub fn engine(&self) -> Arc<Mutex<Engine>> {
        self.0.clone()
    }

    /// Lock it. A panic while locked poisons nothing of value: the state is plain data,
    /// so a poisoned lock is taken over rather than propagated.
    pub fn lock(&self) -> MutexGuard<'_, Engine> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
