//! The controller's notion of "now": real in production, virtual in simulation, so
//! detection runs on event time and a simulated hour replays in seconds.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use warden_model::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        Timestamp(ns)
    }
}

/// A clock that only moves when told to (simulation, tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `t`.
    pub fn new(t: Timestamp) -> Self {
        ManualClock(AtomicI64::new(t.0))
    }

    /// Move the clock to `t` (never backwards).
    pub fn set(&self, t: Timestamp) {
        self.0.fetch_max(t.0, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_never_goes_back() {
        let c = ManualClock::new(Timestamp(10));
        c.set(Timestamp(20));
        c.set(Timestamp(15));
        assert_eq!(c.now(), Timestamp(20));
        assert!(SystemClock.now().0 > 1_600_000_000_000_000_000);
    }
}
