//! Collective progress of the training processes on this node, as the job-side
//! sources report it (the `warden_torch` capture socket, NCCL profiler segments), kept
//! per job and cut into wire records once per flush with the redundancy the wire
//! contract asks for: collectives still in flight are re-sent every batch, completions
//! are carried once more in the next batch, each member's newest completion is repeated
//! in every batch that holds nothing newer of it, exits and non-finite metrics are
//! repeated, and rank and communicator registrations are re-sent every
//! [`REGISTRATION_EVERY_NS`] so that a restarted controller learns them again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use warden_model::wire::{
    CollectiveEvent, CommInfo, JobSignals, LinkSample, LogRecord, NewestCompletions, ProcessState,
    RankInfo, TrainingMetric,
};

use tokio::sync::Notify;

use crate::ship::{Pending, urgent_metric, urgent_process};

/// How often registrations are re-sent, ns.
pub const REGISTRATION_EVERY_NS: i64 = 10_000_000_000;
/// How many later batches repeat an exit or a non-finite metric.
const CRITICAL_REPEATS: u8 = 2;
/// Most collectives of one rank in one communicator held in flight; older ones are
/// dropped (an asynchronous job that never waits on its work would grow without end).
const MAX_IN_FLIGHT_PER_MEMBER: usize = 64;
/// Most completed collectives held for one job between flushes; more are dropped and
/// counted.
const MAX_COMPLETED_PER_FLUSH: usize = 100_000;
/// Most metrics and log records held for one job between flushes.
const MAX_OTHER_PER_FLUSH: usize = 20_000;

/// Progress of every job on this node; cheap to clone and share between sources.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<Mutex<Book>>);

#[derive(Debug, Default)]
struct Book {
    jobs: BTreeMap<String, JobBook>,
    dropped: u64,
    /// Wakes the shipper for a record detection needs at once (`ship::URGENT_GAP`).
    wake: Arc<Notify>,
    /// Sources read just before every flush.
    readers: Readers,
}

/// A source that the shipper reads just before each flush, besides its own schedule.
pub type Reader = Arc<dyn Fn(&Progress) + Send + Sync>;

/// The sources read before every flush.
#[derive(Default)]
struct Readers(Vec<Reader>);

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} reader(s)", self.0.len())
    }
}

#[derive(Debug, Default)]
struct JobBook {
    ranks: BTreeMap<u32, RankInfo>,
    comms: BTreeMap<(u64, u32), CommInfo>,
    /// Registrations not sent yet.
    new_ranks: Vec<RankInfo>,
    new_comms: Vec<CommInfo>,
    registered_at_ns: i64,
    /// (comm, rank) → in-flight collectives by sequence number.
    in_flight: BTreeMap<(u64, u32), BTreeMap<u64, CollectiveEvent>>,
    completed: Vec<CollectiveEvent>,
    /// Completions of the previous flush, sent once more.
    carried: Vec<CollectiveEvent>,
    /// (comm, rank) → its newest completion, repeated in every batch that holds nothing
    /// newer of that member: however many batches are lost in a row, the next one that
    /// arrives says where each member stands (a rank quiet through a checkpoint looks
    /// exactly like one stuck before its next collective otherwise).
    newest: NewestCompletions,
    metrics: Vec<TrainingMetric>,
    logs: Vec<LogRecord>,
    processes: Vec<ProcessState>,
    /// Critical records and the number of later batches that repeat them.
    repeats: Vec<(u8, Critical)>,
    /// Latest per-peer network totals not sent yet, by (comm, rank, peer): totals, so
    /// only the newest of a flush matters.
    links: BTreeMap<(u64, u32, u32), LinkSample>,
}

#[derive(Debug, Clone)]
enum Critical {
    Metric(TrainingMetric),
    Process(ProcessState),
}

impl JobBook {
    fn idle(&self) -> bool {
        self.ranks.is_empty()
            && self.in_flight.is_empty()
            && self.completed.is_empty()
            && self.carried.is_empty()
            && self.newest.is_empty()
            && self.metrics.is_empty()
            && self.logs.is_empty()
            && self.processes.is_empty()
            && self.repeats.is_empty()
            && self.new_ranks.is_empty()
            && self.new_comms.is_empty()
            && self.links.is_empty()
    }
}

impl Progress {
    fn lock(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register (or refresh) a rank of `job` on this node. A rank seen for the first
    /// time, or with a new pid, is sent with the next batch.
    pub fn rank(&self, job: &str, info: RankInfo) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        if j.ranks.get(&info.rank) != Some(&info) {
            j.new_ranks.push(info.clone());
            j.ranks.insert(info.rank, info);
        }
    }

    /// Register a rank's membership in a communicator.
    pub fn comm(&self, job: &str, info: CommInfo) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        let key = (info.comm, info.rank);
        if j.comms.get(&key) != Some(&info) {
            j.new_comms.push(info.clone());
            j.comms.insert(key, info);
        }
    }

    /// A rank entered a collective (`end_ns` is ignored and sent as 0 until it
    /// completes).
    pub fn started(&self, job: &str, mut ev: CollectiveEvent) {
        ev.end_ns = 0;
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        let member = j.in_flight.entry((ev.comm, ev.rank)).or_default();
        member.insert(ev.seq, ev);
        let mut dropped = 0;
        while member.len() > MAX_IN_FLIGHT_PER_MEMBER {
            member.pop_first();
            dropped += 1;
        }
        book.dropped += dropped;
    }

    /// A rank completed a collective. `ev` carries its start as well; when the start
    /// was reported separately, the start recorded then wins.
    pub fn completed(&self, job: &str, mut ev: CollectiveEvent) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        if let Some(member) = j.in_flight.get_mut(&(ev.comm, ev.rank)) {
            if let Some(started) = member.remove(&ev.seq) {
                ev.start_ns = started.start_ns;
                if ev.bytes == 0 {
                    ev.bytes = started.bytes;
                }
                if ev.op == 0 {
                    ev.op = started.op;
                }
            }
            if member.is_empty() {
                j.in_flight.remove(&(ev.comm, ev.rank));
            }
        }
        if ev.start_ns <= 0 || ev.start_ns > ev.end_ns {
            // Its start was never heard of (a dropped datagram): a completion with no
            // wait is still progress, and the wire needs a start no later than the end.
            ev.start_ns = ev.end_ns;
        }
        if ev.seq == 0 || ev.end_ns <= 0 {
            book.dropped += 1;
            return;
        }
        if j.completed.len() >= MAX_COMPLETED_PER_FLUSH {
            book.dropped += 1;
            return;
        }
        j.newest.saw(&ev);
        j.completed.push(ev);
    }

    /// A rank's per-peer network totals as read now; a later read in the same flush
    /// replaces it.
    pub fn link(&self, job: &str, l: LinkSample) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        let key = (l.comm, l.rank, l.peer);
        if j.links.len() >= MAX_OTHER_PER_FLUSH && !j.links.contains_key(&key) {
            book.dropped += 1;
            return;
        }
        j.links.insert(key, l);
    }

    /// A training metric of a rank.
    pub fn metric(&self, job: &str, m: TrainingMetric) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        if j.metrics.len() >= MAX_OTHER_PER_FLUSH {
            book.dropped += 1;
            return;
        }
        let urgent = urgent_metric(&m);
        j.metrics.push(m);
        if urgent {
            book.wake.notify_one();
        }
    }

    /// What wakes the shipper when a record detection needs at once arrives: a
    /// non-finite metric, an exit or a stop.
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.lock().wake)
    }

    /// A line a rank said about itself (its last exception, say).
    pub fn log(&self, job: &str, r: LogRecord) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        if j.logs.len() >= MAX_OTHER_PER_FLUSH {
            book.dropped += 1;
            return;
        }
        j.logs.push(r);
    }

    /// A rank's process started (`alive`) or exited. An exit ends the rank's life on
    /// this node: its collectives in flight are no longer sent and it is no longer
    /// registered.
    pub fn process(&self, job: &str, p: ProcessState) {
        let mut book = self.lock();
        let j = book.jobs.entry(job.to_owned()).or_default();
        if !p.alive {
            j.in_flight.retain(|&(_, rank), _| rank != p.rank);
            j.newest.forget_rank(p.rank);
            if j.ranks
                .get(&p.rank)
                .is_some_and(|r| r.pid == p.pid || p.pid == 0)
            {
                j.ranks.remove(&p.rank);
                j.comms.retain(|&(_, rank), _| rank != p.rank);
            }
        }
        let urgent = urgent_process(&p);
        j.processes.push(p);
        if urgent {
            book.wake.notify_one();
        }
    }

    /// Records dropped to stay within the bounds, since start.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Ranks registered now, over all jobs.
    pub fn ranks(&self) -> usize {
        self.lock().jobs.values().map(|j| j.ranks.len()).sum()
    }

    /// Have `read` called just before every flush (by [`Progress::read_sources`]). A
    /// source that polls on its own schedule (the NCCL profiler's segments) would
    /// otherwise leave a batch up to one poll behind the moment it is cut, while the
    /// controller takes a batch as complete up to that moment.
    pub fn read_before_flush(&self, read: Reader) {
        self.lock().readers.0.push(read);
    }

    /// Read every source registered with [`Progress::read_before_flush`] (outside the
    /// book's lock: each reports into this same book).
    pub fn read_sources(&self) {
        let readers = self.lock().readers.0.clone();
        for read in readers {
            read(self);
        }
    }

    /// Cut this flush's records at `now_ns` (agent wall clock) into `pending`.
    pub fn flush(&self, now_ns: i64, pending: &mut Pending) {
        let mut book = self.lock();
        for (name, j) in &mut book.jobs {
            let mut sig = JobSignals {
                job: name.clone(),
                ..JobSignals::default()
            };
            if now_ns - j.registered_at_ns >= REGISTRATION_EVERY_NS {
                j.registered_at_ns = now_ns;
                j.new_ranks.clear();
                j.new_comms.clear();
                sig.ranks = j.ranks.values().cloned().collect();
                sig.comms = j.comms.values().cloned().collect();
            } else {
                sig.ranks = std::mem::take(&mut j.new_ranks);
                sig.comms = std::mem::take(&mut j.new_comms);
            }

            // Older records first, so each rank's records keep the order they happened
            // in: the newest completions of members with nothing newer here, last
            // flush's completions, this flush's, then what is in flight.
            let fresh = std::mem::take(&mut j.completed);
            let mut completions = std::mem::replace(&mut j.carried, fresh.clone());
            completions.extend(fresh);
            let mut collectives = j.newest.repeats(&completions, |_| true);
            collectives.append(&mut completions);
            collectives.extend(j.in_flight.values().flat_map(|m| m.values().cloned()));
            sig.collectives = collectives;

            for (left, rec) in &mut j.repeats {
                *left -= 1;
                match rec {
                    Critical::Metric(m) => sig.metrics.push(m.clone()),
                    Critical::Process(p) => sig.processes.push(p.clone()),
                }
            }
            j.repeats.retain(|(left, _)| *left > 0);
            for m in std::mem::take(&mut j.metrics) {
                if urgent_metric(&m) {
                    j.repeats
                        .push((CRITICAL_REPEATS, Critical::Metric(m.clone())));
                }
                sig.metrics.push(m);
            }
            for p in std::mem::take(&mut j.processes) {
                if !p.alive {
                    j.repeats
                        .push((CRITICAL_REPEATS, Critical::Process(p.clone())));
                }
                sig.processes.push(p);
            }
            sig.logs = std::mem::take(&mut j.logs);
            sig.links = std::mem::take(&mut j.links).into_values().collect();
            pending.job_signals(sig);
        }
        book.jobs.retain(|_, j| !j.idle());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coll(rank: u32, seq: u64, start: i64, end: i64) -> CollectiveEvent {
        CollectiveEvent {
            comm: 7,
            rank,
            seq,
            op: 1,
            bytes: 64,
            start_ns: start,
            end_ns: end,
            xfer_ns: 0,
        }
    }

    fn cut(p: &Progress, now: i64) -> Vec<JobSignals> {
        let mut pending = Pending::default();
        p.flush(now, &mut pending);
        pending.take_jobs()
    }

    #[test]
    fn in_flight_is_resent_and_completions_are_carried_once() {
        let p = Progress::default();
        p.rank(
            "j",
            RankInfo {
                rank: 0,
                world_size: 2,
                pid: 10,
                ..RankInfo::default()
            },
        );
        p.started("j", coll(0, 1, 100, 0));
        let first = cut(&p, 1_000);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].ranks.len(), 1, "new rank registered at once");
        assert_eq!(first[0].collectives, vec![coll(0, 1, 100, 0)]);

        let second = cut(&p, 2_000);
        assert_eq!(second[0].collectives, vec![coll(0, 1, 100, 0)], "re-sent");
        assert!(second[0].ranks.is_empty(), "registration not repeated yet");

        p.completed("j", coll(0, 1, 0, 300));
        let third = cut(&p, 3_000);
        assert_eq!(third[0].collectives, vec![coll(0, 1, 100, 300)]);
        let fourth = cut(&p, 4_000);
        assert_eq!(fourth[0].collectives, vec![coll(0, 1, 100, 300)], "carried");
        let fifth = cut(&p, 5_000);
        assert_eq!(
            fifth[0].collectives,
            vec![coll(0, 1, 100, 300)],
            "the member's newest, not carried twice more"
        );

        let later = cut(&p, REGISTRATION_EVERY_NS + 6_000);
        assert_eq!(later[0].ranks.len(), 1, "registrations re-sent");
    }

    #[test]
    fn however_many_batches_are_lost_the_next_one_says_where_each_member_stands() {
        let p = Progress::default();
        let other = |rank, seq, end| CollectiveEvent {
            comm: 9,
            ..coll(rank, seq, end - 10, end)
        };
        p.completed("j", coll(0, 1, 10, 20));
        p.completed("j", coll(1, 1, 10, 20));
        p.completed("j", other(0, 1, 30));
        let _lost = cut(&p, 100);
        p.completed("j", coll(0, 2, 110, 120));
        p.completed("j", coll(0, 3, 130, 140));
        let _lost = cut(&p, 200);
        let _lost = cut(&p, 300);
        p.completed("j", coll(0, 4, 310, 320));
        // Rank 1 went quiet after seq 1 on comm 7, rank 0 after seq 1 on comm 9: both
        // are said again, ahead of the newer records, while rank 0's seq 4 on comm 7
        // needs no repeat of its seq 3.
        let sig = cut(&p, 400);
        assert_eq!(
            sig[0].collectives,
            vec![coll(1, 1, 10, 20), other(0, 1, 30), coll(0, 4, 310, 320)]
        );
        // An exit ends the repeats of the rank's members.
        p.process(
            "j",
            ProcessState {
                rank: 1,
                pid: 11,
                at_ns: 450,
                alive: false,
                exit_code: Some(0),
                signal: None,
                stopped: false,
                from_log: false,
            },
        );
        let sig = cut(&p, 500);
        assert!(sig[0].collectives.iter().all(|c| c.rank == 0));
        assert!(sig[0].collectives.contains(&other(0, 1, 30)));
    }

    #[test]
    fn an_exit_is_repeated_and_ends_the_ranks_flight() {
        let p = Progress::default();
        p.rank(
            "j",
            RankInfo {
                rank: 3,
                pid: 33,
                ..RankInfo::default()
            },
        );
        p.started("j", coll(3, 5, 100, 0));
        p.process(
            "j",
            ProcessState {
                rank: 3,
                pid: 33,
                at_ns: 200,
                alive: false,
                exit_code: Some(1),
                signal: None,
                stopped: false,
                from_log: false,
            },
        );
        let first = cut(&p, 1_000);
        assert_eq!(first[0].processes.len(), 1);
        assert!(
            first[0].collectives.is_empty(),
            "a dead rank is not in flight"
        );
        assert_eq!(cut(&p, 2_000)[0].processes.len(), 1);
        assert_eq!(cut(&p, 3_000)[0].processes.len(), 1);
        assert!(cut(&p, 4_000).is_empty(), "the job is forgotten once said");
        assert_eq!(p.ranks(), 0);
    }

    #[test]
    fn non_finite_metrics_are_repeated_finite_ones_are_not() {
        let p = Progress::default();
        let m = |step, loss| TrainingMetric {
            rank: 0,
            step,
            at_ns: 1,
            loss: Some(loss),
            ..TrainingMetric::default()
        };
        p.metric("j", m(1, 1.0));
        p.metric("j", m(2, f64::NAN));
        assert_eq!(cut(&p, 1)[0].metrics.len(), 2);
        let again = cut(&p, 2);
        assert_eq!(again[0].metrics.len(), 1);
        assert!(again[0].metrics[0].loss.is_some_and(f64::is_nan));
    }

    #[test]
    fn a_completion_without_its_start_is_still_a_valid_record() {
        let p = Progress::default();
        p.completed("j", coll(0, 4, 0, 500));
        p.completed("j", coll(0, 0, 0, 500));
        let sig = cut(&p, 1);
        assert_eq!(sig[0].collectives, vec![coll(0, 4, 500, 500)]);
        assert_eq!(p.dropped(), 1, "seq 0 is not a collective");
    }

    #[test]
    fn in_flight_per_member_is_bounded() {
        let p = Progress::default();
        for seq in 1..=(MAX_IN_FLIGHT_PER_MEMBER as u64 + 10) {
            p.started("j", coll(0, seq, seq as i64, 0));
        }
        let sig = cut(&p, 1);
        assert_eq!(sig[0].collectives.len(), MAX_IN_FLIGHT_PER_MEMBER);
        assert_eq!(sig[0].collectives[0].seq, 11, "the oldest went first");
        assert_eq!(p.dropped(), 10);
    }
}
