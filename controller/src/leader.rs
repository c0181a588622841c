//! Leadership among controllers that share one database: a lease row renewed by the
//! leader every second and taken over by a follower once it has lapsed, so exactly one
//! controller detects, acts and alerts, and another takes over within
//! [`LEASE_SECS`] + [`RENEW_SECS`] of the leader's death.
//!
//! A lease is taken or renewed by one compare-and-set UPDATE (holder is me, or the
//! lease expired), so two controllers can never both hold it. The leader stops acting
//! as soon as it has not renewed for [`LEASE_SECS`] − 1 s, before any follower may take
//! over; times are the controllers' own clocks, which must agree to well under a second
//! (NTP). On an embedded SQLite store there is only ever one controller: it leads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sqlx::Row;
use warden_model::Timestamp;

use crate::clock::Clock;
use crate::store::{Backend, Store, StoreError};

/// How long a lease lasts without renewal, seconds.
pub const LEASE_SECS: i64 = 5;
/// How often the leader renews and a follower tries, seconds.
pub const RENEW_SECS: u64 = 1;

const LEASE_NAME: &str = "leader";

/// This controller's view of who leads.
#[derive(Debug)]
pub struct Leadership {
    me: String,
    advertise: String,
    leading: AtomicBool,
    leader_url: RwLock<Option<String>>,
}

impl Leadership {
    /// A controller identified by `me` that others reach at `advertise` (a base URL).
    pub fn new(me: String, advertise: String) -> Arc<Self> {
        Arc::new(Leadership {
            me,
            advertise,
            leading: AtomicBool::new(false),
            leader_url: RwLock::new(None),
        })
    }

    /// Leadership of a single controller (embedded store, tests): it always leads.
    pub fn solo() -> Arc<Self> {
        let l = Leadership::new("solo".into(), String::new());
        l.leading.store(true, Ordering::SeqCst);
        l
    }

    /// Whether this controller leads now.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// This controller's id.
    pub fn id(&self) -> &str {
        &self.me
    }

    /// The leader's base URL, when another controller leads.
    pub fn leader_url(&self) -> Option<String> {
        if self.is_leader() {
            return None;
        }
        self.leader_url.read().ok().and_then(|u| u.clone())
    }

    /// The holder value written to the lease: id and URL.
    fn holder(&self) -> String {
        format!("{} {}", self.me, self.advertise)
    }

    /// One round: take or renew the lease at `now`. Returns whether this controller
    /// holds it afterwards, and records who does.
    pub async fn round(&self, store: &Store, now: Timestamp) -> Result<bool, StoreError> {
        let until = now.0.saturating_add(LEASE_SECS * 1_000_000_000);
        let q = |what| move |source| StoreError::Query { what, source };
        sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(LEASE_NAME)
        .bind(self.holder())
        .bind(until)
        .execute(store.pool())
        .await
        .map_err(q("creating the leader lease"))?;
        sqlx::query(
            "UPDATE leases SET holder = $1, expires_at = $2 \
             WHERE name = $3 AND (holder = $1 OR expires_at < $4)",
        )
        .bind(self.holder())
        .bind(until)
        .bind(LEASE_NAME)
        .bind(now.0)
        .execute(store.pool())
        .await
        .map_err(q("renewing the leader lease"))?;
        let row = sqlx::query("SELECT holder FROM leases WHERE name = $1")
            .bind(LEASE_NAME)
            .fetch_one(store.pool())
            .await
            .map_err(q("reading the leader lease"))?;
        let holder: String = row
            .try_get("holder")
            .map_err(q("reading the leader lease"))?;
        let mine = holder == self.holder();
        if let Ok(mut u) = self.leader_url.write() {
            *u = holder.split_once(' ').map(|(_, url)| url.to_owned());
        }
        Ok(mine)
    }

    /// Keep the lease: renew while leading, try while following. `became_leader` runs
    /// once, when this controller first takes the lease; a leader that loses it (the
    /// database unreachable past the lease, or another holder) stops leading and
    /// `lost` runs — the caller exits, so that nothing acts on a lapsed lease.
    pub async fn run(
        self: Arc<Self>,
        store: Store,
        clock: Arc<dyn Clock>,
        became_leader: tokio::sync::oneshot::Sender<()>,
        lost: tokio::sync::oneshot::Sender<String>,
    ) {
        if store.backend() == Backend::Sqlite {
            self.leading.store(true, Ordering::SeqCst);
            let _ = became_leader.send(());
            return;
        }
        let mut became_leader = Some(became_leader);
        let mut last_renewed: Option<Timestamp> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(RENEW_SECS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = clock.now();
            match self.round(&store, now).await {
                Ok(true) => {
                    last_renewed = Some(now);
                    if !self.is_leader() {
                        self.leading.store(true, Ordering::SeqCst);
                        tracing::info!(id = %self.me, "took the leader lease");
                        if let Some(tx) = became_leader.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                Ok(false) => {
                    if self.is_leader() {
                        self.leading.store(false, Ordering::SeqCst);
                        let _ = lost.send("another controller holds the leader lease".into());
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader lease round failed");
                    let lapsing =
                        last_renewed.is_some_and(|t| now.secs_since(t) >= (LEASE_SECS - 1) as f64);
                    if self.is_leader() && lapsing {
                        self.leading.store(false, Ordering::SeqCst);
                        let _ = lost.send(format!("could not renew the leader lease: {e}"));
                        return;
                    }
                }
            }
        }
    }
}
