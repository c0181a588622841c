//! Which connections the server holds: admission under a total and a per-peer cap, and,
//! when a cap is reached, the choice of the idle connection that makes room. Pure: no
//! socket, task or clock of its own (the caller passes `now`).

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Instant;

/// One held connection.
#[derive(Debug)]
struct Entry<T> {
    peer: IpAddr,
    /// Requests in flight on it (HTTP/1.1: zero or one).
    busy: u32,
    /// When it last became idle (accepted, or its last answer was sent).
    idle_since: Instant,
    /// What the caller gets back when this connection is evicted (its close signal).
    payload: T,
}

/// The connections of one peer address.
#[derive(Debug, Default)]
struct Peer {
    open: usize,
    /// Its idle connections, longest idle first.
    idle: BTreeSet<(Instant, u64)>,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every slot is taken by a connection with a request in flight.
    Full,
    /// Its peer holds its whole share, each with a request in flight.
    PeerFull,
}

/// The answer to [`Admission::admit`].
#[derive(Debug)]
pub(crate) enum Admit<T> {
    /// Admitted as connection `id`; `evicted` is the payload of the idle connection that
    /// was closed to make room for it, if one was.
    Admitted { id: u64, evicted: Option<T> },
    /// Not admitted: the caller closes it.
    Refused(Refusal),
}

/// The held connections, by id and by peer.
#[derive(Debug)]
pub(crate) struct Admission<T> {
    max: usize,
    max_per_peer: usize,
    next_id: u64,
    conns: HashMap<u64, Entry<T>>,
    peers: HashMap<IpAddr, Peer>,
}

impl<T> Admission<T> {
    /// At most `max` connections, at most `max_per_peer` from one address (both at
    /// least 1).
    pub(crate) fn new(max: usize, max_per_peer: usize) -> Self {
        Admission {
            max: max.max(1),
            max_per_peer: max_per_peer.max(1),
            next_id: 0,
            conns: HashMap::new(),
            peers: HashMap::new(),
        }
    }

    /// Connections held.
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    /// Admit a new connection from `peer`. Under the caps it is simply taken. When its
    /// peer holds its whole share, that peer's longest-idle connection makes room; when
    /// every slot is taken, the longest-idle connection of the peer holding the most
    /// connections does. A connection with a request in flight is never chosen: when no
    /// idle one is left, the new connection is refused.
    pub(crate) fn admit(&mut self, peer: IpAddr, now: Instant, payload: T) -> Admit<T> {
        let peer_open = self.peers.get(&peer).map_or(0, |p| p.open);
        let victim = if peer_open >= self.max_per_peer {
            match self.peers.get(&peer).and_then(|p| p.idle.first()) {
                Some(&(_, id)) => Some(id),
                None => return Admit::Refused(Refusal::PeerFull),
            }
        } else if self.conns.len() >= self.max {
            match self.victim() {
                Some(id) => Some(id),
                None => return Admit::Refused(Refusal::Full),
            }
        } else {
            None
        };
        let evicted = victim.and_then(|id| self.remove(id));
        let id = self.next_id;
        self.next_id += 1;
        self.conns.insert(
            id,
            Entry {
                peer,
                busy: 0,
                idle_since: now,
                payload,
            },
        );
        let p = self.peers.entry(peer).or_default();
        p.open += 1;
        p.idle.insert((now, id));
        Admit::Admitted { id, evicted }
    }

    /// The idle connection to close when every slot is taken: the longest-idle one of the
    /// peer with the most connections (of those peers with an idle one); between peers
    /// holding as many, the one whose idle connection waited longest.
    fn victim(&self) -> Option<u64> {
        self.peers
            .values()
            .filter_map(|p| p.idle.first().map(|&(since, id)| (p.open, since, id)))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, _, id)| id)
    }

    /// Close one idle connection, chosen as when every slot is taken (the process ran out
    /// of file descriptors); its payload, if one was idle.
    pub(crate) fn evict_one(&mut self) -> Option<T> {
        let id = self.victim()?;
        self.remove(id)
    }

    /// Connection `id` started a request. False when it is no longer held (evicted).
    pub(crate) fn busy(&mut self, id: u64) -> bool {
        let Some(e) = self.conns.get_mut(&id) else {
            return false;
        };
        if e.busy == 0
            && let Some(p) = self.peers.get_mut(&e.peer)
        {
            p.idle.remove(&(e.idle_since, id));
        }
        e.busy += 1;
        true
    }

    /// Connection `id` finished a request at `now`.
    pub(crate) fn idle(&mut self, id: u64, now: Instant) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        e.busy = e.busy.saturating_sub(1);
        if e.busy == 0 {
            e.idle_since = now;
            if let Some(p) = self.peers.get_mut(&e.peer) {
                p.idle.insert((now, id));
            }
        }
    }

    /// Forget connection `id` (closed, or evicted); its payload if it was held.
    pub(crate) fn remove(&mut self, id: u64) -> Option<T> {
        let e = self.conns.remove(&id)?;
        if let Some(p) = self.peers.get_mut(&e.peer) {
            p.idle.remove(&(e.idle_since, id));
            p.open = p.open.saturating_sub(1);
            if p.open == 0 {
                self.peers.remove(&e.peer);
            }
        }
        Some(e.payload)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// Admit and return the id, panicking on a refusal or an eviction.
    fn take(a: &mut Admission<&'static str>, peer: u8, at: Instant, name: &'static str) -> u64 {
        match a.admit(ip(peer), at, name) {
            Admit::Admitted { id, evicted: None } => id,
            other => panic!("{name}: expected a free slot, got {other:?}"),
        }
    }

    /// One case: connections `(peer, name, busy)` taken one second apart, then a new
    /// connection from `newcomer`; `expect` names the evicted one, `Err` the refusal.
    fn check(
        max: usize,
        per_peer: usize,
        held: &[(u8, &'static str, bool)],
        newcomer: u8,
        expect: Result<Option<&str>, Refusal>,
    ) {
        let t0 = Instant::now();
        let mut a = Admission::new(max, per_peer);
        for (i, &(peer, name, busy)) in held.iter().enumerate() {
            let id = take(&mut a, peer, t0 + Duration::from_secs(i as u64), name);
            if busy {
                assert!(a.busy(id));
            }
        }
        let got = match a.admit(ip(newcomer), t0 + Duration::from_secs(99), "new") {
            Admit::Admitted { evicted, .. } => Ok(evicted),
            Admit::Refused(r) => Err(r),
        };
        assert_eq!(
            got.map(|e| e.map(str::to_owned)),
            expect.map(|e| e.map(str::to_owned))
        );
        assert!(a.len() <= max, "never more than the cap");
    }

    #[test]
    fn a_full_table_makes_room_by_closing_the_right_idle_connection() {
        // Under the cap: nothing is closed.
        check(3, 3, &[(1, "a", false)], 2, Ok(None));
        // Full, one peer: its longest-idle connection goes.
        check(2, 2, &[(1, "a", false), (1, "b", false)], 2, Ok(Some("a")));
        // The peer holding the most connections pays, even when another's is older.
        check(
            4,
            4,
            &[
                (1, "old", false),
                (2, "b", false),
                (2, "c", false),
                (2, "d", false),
            ],
            3,
            Ok(Some("b")),
        );
        // Busy connections are never chosen; the busiest peer's idle one is.
        check(
            3,
            3,
            &[(1, "a", true), (1, "b", true), (2, "c", false)],
            3,
            Ok(Some("c")),
        );
        // Every connection busy: the newcomer is refused.
        check(
            2,
            2,
            &[(1, "a", true), (2, "b", true)],
            3,
            Err(Refusal::Full),
        );
        // Equal counts: the longest idle across peers.
        check(2, 2, &[(1, "a", false), (2, "b", false)], 3, Ok(Some("a")));
    }

    #[test]
    fn a_peer_at_its_share_makes_room_from_its_own_connections() {
        // Peer 1 at its share of 2: its own oldest idle goes, not peer 2's older one.
        check(
            10,
            2,
            &[(2, "other", false), (1, "a", false), (1, "b", false)],
            1,
            Ok(Some("a")),
        );
        // Its share all busy: refused, though slots are free.
        check(10, 1, &[(1, "a", true)], 1, Err(Refusal::PeerFull));
    }

    #[test]
    fn a_connection_idle_again_is_judged_by_when_it_became_idle() {
        let t0 = Instant::now();
        let mut a = Admission::new(2, 2);
        let first = take(&mut a, 1, t0, "first");
        let second = take(&mut a, 1, t0 + Duration::from_secs(1), "second");
        // `first` serves a request that ends after `second` was accepted.
        assert!(a.busy(first));
        a.idle(first, t0 + Duration::from_secs(2));
        match a.admit(ip(1), t0 + Duration::from_secs(3), "third") {
            Admit::Admitted { evicted, .. } => assert_eq!(evicted, Some("second")),
            other => panic!("{other:?}"),
        }
        // Evicted: a request it still reads changes nothing.
        assert!(!a.busy(second));
        a.idle(second, t0 + Duration::from_secs(4));
        assert_eq!(a.len(), 2);
        assert!(a.remove(first).is_some());
        assert_eq!(a.evict_one(), Some("third"));
        assert_eq!(a.len(), 0);
        assert!(a.evict_one().is_none());
    }
}
