//! Event time: nanoseconds since the Unix epoch on some clock (an agent's or the
//! controller's), with the few conversions detectors need.

use serde::{Deserialize, Serialize};

/// A point in time, nanoseconds since the Unix epoch.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The Unix epoch itself.
    pub const ZERO: Timestamp = Timestamp(0);
    /// Later than any real time; used for "never".
    pub const MAX: Timestamp = Timestamp(i64::MAX);

    /// From whole nanoseconds.
    pub const fn from_nanos(ns: i64) -> Self {
        Timestamp(ns)
    }

    /// From fractional seconds (saturating).
    pub fn from_secs_f64(secs: f64) -> Self {
        Timestamp((secs * 1e9) as i64)
    }

    /// Nanoseconds since the epoch.
    pub const fn nanos(self) -> i64 {
        self.0
    }

    /// Seconds since the epoch, as a float.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self - earlier` in seconds (negative when `earlier` is later).
    pub fn secs_since(self, earlier: Timestamp) -> f64 {
        (self.0.saturating_sub(earlier.0)) as f64 / 1e9
    }

    /// This time shifted by `secs` seconds.
    pub fn plus_secs(self, secs: f64) -> Timestamp {
        Timestamp(self.0.saturating_add((secs * 1e9) as i64))
    }

    /// This time shifted by `ns` nanoseconds.
    pub fn plus_nanos(self, ns: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_trip_and_differences() {
        let t = Timestamp::from_secs_f64(1.5);
        assert_eq!(t.nanos(), 1_500_000_000);
        assert!((t.plus_secs(2.25).secs_since(t) - 2.25).abs() < 1e-9);
        assert!(Timestamp::ZERO.secs_since(t) < 0.0);
        assert_eq!(Timestamp::MAX.plus_nanos(5), Timestamp::MAX);
    }
}
