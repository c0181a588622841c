//! Leadership among controllers that share one database: a lease row renewed by the
//! leader every second and taken over by a follower once it has lapsed, so exactly one
//! controller detects, acts and alerts, and another takes over within
//! [`LEASE_SECS`] + [`RENEW_SECS`] of the leader's death.
//!
//! A lease is taken or renewed by one compare-and-set UPDATE (holder is me, or the
//! lease expired), so two controllers can never both hold it. The leader stops acting
//! as soon as it has not renewed for [`LEASE_SECS`] − 1 s, before any follower may take
//! over; times are the controllers' own clocks, which must agree to well under a second
//! (NTP). A leader cut off from the database that finds the lease still its own when
//! the database answers again leads again by itself. On an embedded SQLite store there
//! is only ever one controller: it leads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sqlx::Row;
use warden_model::Timestamp;

use crate::store::{Backend, Store, StoreError};
use warden_engine::clock::Clock;

/// How long a lease lasts without renewal, seconds.
pub const LEASE_SECS: i64 = 5;
/// How often the leader renews and a follower tries, seconds.
pub const RENEW_SECS: u64 = 1;
/// How long one round may take: a round that has not answered by the next one counts
/// as failed, so a leader stops acting before its lease can lapse even when the
/// database hangs instead of refusing.
const ROUND_TIMEOUT: Duration = Duration::from_secs(RENEW_SECS);

const LEASE_NAME: &str = "leader";

/// This controller's view of who leads.
#[derive(Debug)]
pub struct Leadership {
    me: String,
    advertise: String,
    leading: AtomicBool,
    leader_url: RwLock<Option<String>>,
    /// Another holder of the lease and its expiry, as the last round read them.
    last_seen: Mutex<Option<(String, i64)>>,
}

impl Leadership {
    /// A controller identified by `me` that others reach at `advertise` (a base URL).
    pub fn new(me: String, advertise: String) -> Arc<Self> {
        Arc::new(Leadership {
            me,
            advertise,
            leading: AtomicBool::new(false),
            leader_url: RwLock::new(None),
            last_seen: Mutex::new(None),
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

    /// One round: renew the lease, or take it once it has lapsed, at `now`. Says whether
    /// this controller holds it afterwards, and whether it held it without a break
    /// since its last round (nobody else took it in between), and records who holds it.
    pub async fn round(&self, store: &Store, now: Timestamp) -> Result<Held, StoreError> {
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
        // The holder names this process (its id carries a random salt), so a row that
        // still names it was held by nobody else since this controller last wrote it.
        let renewed =
            sqlx::query("UPDATE leases SET expires_at = $1 WHERE name = $2 AND holder = $3")
                .bind(until)
                .bind(LEASE_NAME)
                .bind(self.holder())
                .execute(store.pool())
                .await
                .map_err(q("renewing the leader lease"))?;
        if renewed.rows_affected() > 0 {
            self.set_leader_url(None);
            return Ok(Held::Kept);
        }
        let taken = sqlx::query(
            "UPDATE leases SET holder = $1, expires_at = $2 WHERE name = $3 AND expires_at < $4",
        )
        .bind(self.holder())
        .bind(until)
        .bind(LEASE_NAME)
        .bind(now.0)
        .execute(store.pool())
        .await
        .map_err(q("taking the leader lease"))?;
        if taken.rows_affected() > 0 {
            self.set_leader_url(None);
            return Ok(Held::Taken);
        }
        let row = sqlx::query("SELECT holder, expires_at FROM leases WHERE name = $1")
            .bind(LEASE_NAME)
            .fetch_one(store.pool())
            .await
            .map_err(q("reading the leader lease"))?;
        let holder: String = row
            .try_get("holder")
            .map_err(q("reading the leader lease"))?;
        let expires: i64 = row
            .try_get("expires_at")
            .map_err(q("reading the leader lease"))?;
        // Writes are relayed only to a leader seen renewing its lease since the last
        // round: a dead leader's address (its port may serve something else by now)
        // gets nothing; the answer is 503 until the lease lapses and a new leader
        // renews, and agents send again.
        let renewing = {
            let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
            let renewing = last
                .as_ref()
                .is_some_and(|(h, e)| *h == holder && *e != expires)
                && expires >= now.0;
            *last = Some((holder.clone(), expires));
            renewing
        };
        self.set_leader_url(
            holder
                .split_once(' ')
                .filter(|_| renewing)
                .map(|(_, url)| url.to_owned()),
        );
        Ok(Held::Other)
    }

    fn set_leader_url(&self, url: Option<String>) {
        if let Ok(mut u) = self.leader_url.write() {
            *u = url;
        }
    }

    /// Keep the lease: renew while leading, try while following, and tell `changes`
    /// when this controller starts or stops leading ([`Change`]).
    ///
    /// A leader that cannot renew for [`LEASE_SECS`] − 1 s (the database is
    /// unreachable) stops acting ([`Change::Pause`]) and keeps trying; when the lease
    /// row still names it once the database answers again, nobody led in between and
    /// it leads again ([`Change::Lead`]) with the state it kept. A controller that has
    /// led and finds another holder, or a lease another controller held in between,
    /// stops for good ([`Change::Lost`]): its state may be older than the store's, so
    /// the caller exits and is restarted as a follower.
    pub async fn run(
        self: Arc<Self>,
        store: Store,
        clock: Arc<dyn Clock>,
        changes: tokio::sync::mpsc::UnboundedSender<Change>,
    ) {
        if store.backend() == Backend::Sqlite {
            self.leading.store(true, Ordering::SeqCst);
            let _ = changes.send(Change::Lead);
            return;
        }
        let mut has_led = false;
        let mut last_renewed: Option<Timestamp> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(RENEW_SECS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = clock.now();
            // A round stuck on an unreachable database must not keep a leader acting
            // past its lease: it is given until the next round.
            let round = tokio::time::timeout(ROUND_TIMEOUT, self.round(&store, now)).await;
            let failed = match round {
                Ok(Ok(held)) => {
                    let lost = match held {
                        Held::Other if !has_led => continue,
                        Held::Other => Some("another controller holds the leader lease"),
                        Held::Taken if has_led => Some(
                            "another controller held the leader lease while this one could \
                             not renew it",
                        ),
                        Held::Kept | Held::Taken => None,
                    };
                    if let Some(why) = lost {
                        self.leading.store(false, Ordering::SeqCst);
                        let _ = changes.send(Change::Lost(why.to_owned()));
                        return;
                    }
                    last_renewed = Some(now);
                    if !self.is_leader() {
                        self.leading.store(true, Ordering::SeqCst);
                        tracing::info!(id = %self.me, again = has_led, "took the leader lease");
                        has_led = true;
                        if changes.send(Change::Lead).is_err() {
                            return;
                        }
                    }
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!(
                    "the database did not answer within {} s",
                    ROUND_TIMEOUT.as_secs()
                )),
            };
            if let Some(e) = failed {
                tracing::warn!(error = %e, "leader lease round failed");
                let lapsing = last_renewed
                    .is_some_and(|t| clock.now().secs_since(t) >= (LEASE_SECS - 1) as f64);
                if self.is_leader() && lapsing {
                    self.leading.store(false, Ordering::SeqCst);
                    self.set_leader_url(None);
                    let why = format!("could not renew the leader lease: {e}");
                    if changes.send(Change::Pause(why)).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// What a lease round found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The lease names this controller, as it did after its last round.
    Kept,
    /// This controller took a lapsed lease another controller held.
    Taken,
    /// Another controller holds it.
    Other,
}

/// A change of leadership, for the caller to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The lease is this controller's: take the incidents back, finish unfinished
    /// actions and act.
    Lead,
    /// The lease could not be renewed in time: stop acting, keep serving; the lease
    /// may come back ([`Change::Lead`]).
    Pause(String),
    /// Another controller leads, or led meanwhile: stop acting for good.
    Lost(String),
}
