//! The server's limits ([`Limits`]), the `server` section of the controller's and the
//! agent's configuration files that sets them ([`ServerConfig`]), and fitting the
//! connection cap under the process's open-file limit.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default time a client has to send a whole request head.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a keep-alive connection may wait for its next request.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default cap on connections held at once (the controller's; the agent sets its own).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Accepted `header_timeout_secs`.
pub const HEADER_TIMEOUT_SECS: (u64, u64) = (1, 300);
/// Accepted `idle_timeout_secs`.
pub const IDLE_TIMEOUT_SECS: (u64, u64) = (1, 3600);
/// Accepted `max_connections` (and `max_connections_per_peer`, which is also at most
/// `max_connections`).
pub const MAX_CONNECTIONS: (u64, u64) = (1, 1 << 20);

/// Descriptors kept out of the connection cap when it is fitted under the open-file
/// limit: a quarter of the limit, at least this many (the store, log files, outgoing
/// connections, the listener).
const RESERVED_FDS_MIN: u64 = 64;

/// What the server allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time from accepting a connection (its TLS handshake included) to the end of its
    /// first request head, and from the first byte of each later request head to its end.
    pub header_timeout: Duration,
    /// Time a keep-alive connection may wait, without a byte, for its next request.
    pub idle_timeout: Duration,
    /// Most connections held at once. When all are taken, the longest-idle connection
    /// of the peer holding the most makes room for a new one; when none is idle, the new
    /// one is closed.
    pub max_connections: usize,
    /// Most connections from one IP address; at its share, a peer's new connection
    /// replaces its own longest-idle one.
    pub max_connections_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::with_max_connections(DEFAULT_MAX_CONNECTIONS)
    }
}

impl Limits {
    /// The default timeouts, at most `max` connections and half of them per peer.
    pub fn with_max_connections(max: usize) -> Limits {
        let max = max.max(1);
        Limits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: max,
            max_connections_per_peer: half(max),
        }
    }

    /// These limits with the connection cap lowered, when needed, to leave a quarter of
    /// `open_files` (the process's open-file limit; at least 64) to everything else,
    /// and the per-peer share lowered in proportion: a cap the process cannot hold only
    /// trades evictions for failed accepts.
    pub fn fitted(self, open_files: Option<u64>) -> Limits {
        let Some(limit) = open_files else {
            return self;
        };
        let budget = limit
            .saturating_sub((limit / 4).max(RESERVED_FDS_MIN))
            .max(1);
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        if self.max_connections <= budget {
            return self;
        }
        // The per-peer share shrinks in proportion.
        let per_peer = self.max_connections_per_peer as u128 * budget as u128
            / (self.max_connections as u128).max(1);
        Limits {
            max_connections: budget,
            max_connections_per_peer: usize::try_from(per_peer).unwrap_or(budget).clamp(1, budget),
            ..self
        }
    }
}

/// Half of `n`, at least 1.
fn half(n: usize) -> usize {
    (n / 2).max(1)
}

/// The process's soft limit on open files, where the platform tells it.
pub fn open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The `server` section of a configuration file, as written: every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Seconds a client has for a request head: from connecting (TLS handshake
    /// included) for its first request, from the head's first byte for later ones.
    pub header_timeout_secs: Option<u64>,
    /// Seconds a keep-alive connection may wait for its next request.
    pub idle_timeout_secs: Option<u64>,
    /// Most connections held at once (lowered to fit the open-file limit).
    pub max_connections: Option<u64>,
    /// Most connections from one IP address (default: half of `max_connections`).
    pub max_connections_per_peer: Option<u64>,
}

impl From<Limits> for ServerConfig {
    /// Limits in force, written as a configuration section (every field given).
    fn from(l: Limits) -> Self {
        ServerConfig {
            header_timeout_secs: Some(l.header_timeout.as_secs()),
            idle_timeout_secs: Some(l.idle_timeout.as_secs()),
            max_connections: Some(l.max_connections as u64),
            max_connections_per_peer: Some(l.max_connections_per_peer as u64),
        }
    }
}

impl ServerConfig {
    /// Every value out of bounds, as `(field, message)`, fields named under `section`
    /// (`server.max_connections`).
    pub fn problems(&self, section: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bounds = |field: &str, value: Option<u64>, (lo, hi): (u64, u64)| {
            if let Some(v) = value
                && !(lo..=hi).contains(&v)
            {
                out.push((
                    format!("{section}.{field}"),
                    format!("{v} is outside {lo}..={hi}"),
                ));
            }
        };
        bounds(
            "header_timeout_secs",
            self.header_timeout_secs,
            HEADER_TIMEOUT_SECS,
        );
        bounds(
            "idle_timeout_secs",
            self.idle_timeout_secs,
            IDLE_TIMEOUT_SECS,
        );
        bounds("max_connections", self.max_connections, MAX_CONNECTIONS);
        bounds(
            "max_connections_per_peer",
            self.max_connections_per_peer,
            MAX_CONNECTIONS,
        );
        if let (Some(per_peer), Some(max)) = (self.max_connections_per_peer, self.max_connections)
            && per_peer > max
        {
            out.push((
                format!("{section}.max_connections_per_peer"),
                format!("{per_peer} is more than max_connections ({max})"),
            ));
        }
        out
    }

    /// `defaults` with the values given here (clamped into bounds: call
    /// [`ServerConfig::problems`] first to report them). A `max_connections` given
    /// without `max_connections_per_peer` allows half of it per peer.
    pub fn limits(&self, defaults: Limits) -> Limits {
        let secs = |v: Option<u64>, (lo, hi): (u64, u64), d: Duration| {
            v.map_or(d, |s| Duration::from_secs(s.clamp(lo, hi)))
        };
        let count = |v: u64| {
            usize::try_from(v.clamp(MAX_CONNECTIONS.0, MAX_CONNECTIONS.1)).unwrap_or(usize::MAX)
        };
        let max_connections = self.max_connections.map_or(defaults.max_connections, count);
        let max_connections_per_peer = match (self.max_connections_per_peer, self.max_connections) {
            (Some(n), _) => count(n),
            (None, Some(_)) => half(max_connections),
            (None, None) => defaults.max_connections_per_peer,
        };
        Limits {
            header_timeout: secs(
                self.header_timeout_secs,
                HEADER_TIMEOUT_SECS,
                defaults.header_timeout,
            ),
            idle_timeout: secs(
                self.idle_timeout_secs,
                IDLE_TIMEOUT_SECS,
                defaults.idle_timeout,
            ),
            max_connections,
            max_connections_per_peer: max_connections_per_peer.min(max_connections),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_under_the_open_file_limit() {
        let l = Limits::default();
        assert_eq!(
            (l.max_connections, l.max_connections_per_peer),
            (4096, 2048)
        );
        // `ulimit -n 1024`: a quarter stays free.
        let f = l.fitted(Some(1024));
        assert_eq!((f.max_connections, f.max_connections_per_peer), (768, 384));
        // At least 64 stay free; never below one connection.
        assert_eq!(l.fitted(Some(200)).max_connections, 136);
        assert_eq!(l.fitted(Some(10)).max_connections, 1);
        // Enough descriptors, or none known: unchanged.
        assert_eq!(l.fitted(Some(65536)), l);
        assert_eq!(l.fitted(None), l);
        assert_eq!(l.fitted(Some(u64::MAX)), l);
    }

    #[test]
    fn the_section_is_bounded_and_fills_in_defaults() {
        let none = ServerConfig::default();
        assert!(none.problems("server").is_empty());
        assert_eq!(none.limits(Limits::default()), Limits::default());

        let bad = ServerConfig {
            header_timeout_secs: Some(0),
            idle_timeout_secs: Some(3601),
            max_connections: Some(10),
            max_connections_per_peer: Some(11),
        };
        let fields: Vec<String> = bad.problems("server").into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "server.header_timeout_secs",
                "server.idle_timeout_secs",
                "server.max_connections_per_peer"
            ]
        );
        let zero = ServerConfig {
            max_connections: Some(0),
            ..ServerConfig::default()
        };
        assert_eq!(zero.problems("server")[0].1, "0 is outside 1..=1048576");

        let some = ServerConfig {
            header_timeout_secs: Some(5),
            max_connections: Some(100),
            ..ServerConfig::default()
        };
        let l = some.limits(Limits::with_max_connections(256));
        assert_eq!(l.header_timeout, Duration::from_secs(5));
        assert_eq!(l.idle_timeout, DEFAULT_IDLE_TIMEOUT);
        assert_eq!((l.max_connections, l.max_connections_per_peer), (100, 50));
        let per_peer = ServerConfig {
            max_connections_per_peer: Some(300),
            ..ServerConfig::default()
        };
        let l = per_peer.limits(Limits::with_max_connections(256));
        assert_eq!((l.max_connections, l.max_connections_per_peer), (256, 256));
    }
}
