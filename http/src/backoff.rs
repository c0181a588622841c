//! The wait between retries, shared by every retrying client: exponential in the
//! attempt, jittered so that clients that failed together do not come back together,
//! never shorter than the server's `Retry-After`, never longer than a cap.

use std::time::Duration;

/// Highest doubling applied (`2^16`); later attempts wait as long as this one.
const MAX_DOUBLINGS: u32 = 16;

/// Exponential backoff with jitter: `base · 2^attempt`, capped at `max`, scaled by a
/// factor in [50 %, 100 %].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry, before jitter.
    pub base: Duration,
    /// The longest wait, `Retry-After` included.
    pub max: Duration,
}

impl Backoff {
    /// Backoff from `base`, never over `max`.
    pub const fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max }
    }

    /// The wait before retry number `attempt` (0 = the first retry).
    ///
    /// `base · 2^attempt` (at most `max`), times `0.5 + 0.5 · unit`, where `unit` is the
    /// caller's jitter in [0, 1] (a random number, or one derived from the request;
    /// values outside are clamped, a NaN counts as 1); then at least `retry_after`, the
    /// server's own wish; never over `max`.
    pub fn delay(&self, attempt: u32, unit: f64, retry_after: Option<Duration>) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << attempt.min(MAX_DOUBLINGS))
            .min(self.max);
        let unit = if unit.is_nan() {
            1.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        let ours = Duration::try_from_secs_f64(exp.as_secs_f64() * (0.5 + 0.5 * unit))
            .unwrap_or(exp)
            .min(exp);
        ours.max(retry_after.unwrap_or(Duration::ZERO))
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));

    #[test]
    fn doubles_with_jitter_in_the_upper_half_and_stays_bounded() {
        for attempt in 0..40 {
            let exp = B.base.saturating_mul(1 << attempt.min(16)).min(B.max);
            assert_eq!(B.delay(attempt, 0.0, None), exp / 2);
            assert_eq!(B.delay(attempt, 1.0, None), exp);
            let mid = B.delay(attempt, 0.37, None);
            assert!(mid >= exp / 2 && mid <= exp, "{attempt}: {mid:?}");
        }
        assert_eq!(B.delay(0, 1.0, None), Duration::from_millis(250));
        assert_eq!(B.delay(1, 1.0, None), Duration::from_millis(500));
        assert_eq!(B.delay(30, 0.0, None), Duration::from_secs(5));
        assert_eq!(B.delay(30, 1.0, None), Duration::from_secs(10));
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        assert_eq!(
            B.delay(0, 0.0, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(B.delay(0, 0.0, Some(Duration::from_secs(3600))), B.max);
        // A shorter Retry-After does not shorten our own wait.
        assert_eq!(
            B.delay(3, 1.0, Some(Duration::from_millis(1))),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn odd_jitter_and_odd_bounds_stay_in_range() {
        assert_eq!(B.delay(0, -3.0, None), Duration::from_millis(125));
        assert_eq!(B.delay(0, 7.0, None), Duration::from_millis(250));
        assert_eq!(B.delay(0, f64::NAN, None), Duration::from_millis(250));
        let zero = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.delay(5, 0.5, None), Duration::ZERO);
        let huge = Backoff::new(Duration::MAX, Duration::from_secs(30));
        assert_eq!(huge.delay(u32::MAX, 1.0, None), Duration::from_secs(30));
        let unbounded = Backoff::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(
            unbounded.delay(200, 1.0, None),
            Duration::from_secs(1 << 16)
        );
        let whole = Backoff::new(Duration::MAX, Duration::MAX);
        assert!(whole.delay(3, 1.0, None) <= Duration::MAX);
        // A base over the cap waits the cap (jittered), from the first retry on.
        let over = Backoff::new(Duration::from_secs(60), Duration::from_secs(30));
        assert_eq!(over.delay(0, 1.0, None), Duration::from_secs(30));
    }
}
