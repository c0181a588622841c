//! Per-peer network timing of a job: the agents' [`LinkSample`] totals (the NCCL
//! plugin's proxy steps, mask `proxystep`) turned into recent samples of time per byte
//! for each directed edge, sender → receiver, for the slow-link detector.
//!
//! Samples are totals since the sender's communicator began, so a repeated sample adds
//! nothing and a lost one only merges two intervals; totals that go down are a new
//! process and start over. The receiver is named by its rank in the communicator: the
//! global rank behind it comes from the communicator's registrations and from the
//! samples themselves (each names its sender both ways).

use rustc_hash::FxHashMap;
use warden_model::Timestamp;
use warden_model::wire::LinkSample;

use crate::state::Ring;

/// Recent samples kept per edge.
pub const EDGE_SAMPLES: usize = 16;
/// Bytes an interval must carry before it is a sample: below that a step's latency,
/// not the link's bandwidth, decides its time. Smaller intervals add up until then.
pub const MIN_SAMPLE_BYTES: u64 = 256 << 10;

/// One directed edge: what its sender's totals said last, and its recent samples.
#[derive(Debug, Clone, Default)]
pub struct Edge {
    steps: u64,
    bytes: u64,
    busy_ns: u64,
    /// Bytes and time of intervals too small to be a sample yet.
    pending_bytes: u64,
    pending_ns: u64,
    /// Time per byte of recent intervals, ns.
    pub samples: Ring<f32, EDGE_SAMPLES>,
    /// When (controller clock) a sample last moved it.
    pub last_at: Timestamp,
}

impl Edge {
    /// Average bytes per step so far (0 before any).
    pub fn step_bytes(&self) -> u64 {
        self.bytes.checked_div(self.steps).unwrap_or(0)
    }

    /// Fold the sender's totals `l` read at `now`.
    fn apply(&mut self, l: &LinkSample, now: Timestamp) {
        if l.steps < self.steps || l.bytes < self.bytes || l.busy_ns < self.busy_ns {
            // A new process under the same communicator and ranks: start over.
            *self = Edge {
                steps: l.steps,
                bytes: l.bytes,
                busy_ns: l.busy_ns,
                last_at: now,
                ..Edge::default()
            };
            return;
        }
        if l.steps == self.steps {
            return;
        }
        self.pending_bytes += l.bytes - self.bytes;
        self.pending_ns += l.busy_ns - self.busy_ns;
        self.steps = l.steps;
        self.bytes = l.bytes;
        self.busy_ns = l.busy_ns;
        self.last_at = now;
        if self.pending_bytes >= MIN_SAMPLE_BYTES {
            self.samples
                .push((self.pending_ns as f64 / self.pending_bytes as f64) as f32);
            self.pending_bytes = 0;
            self.pending_ns = 0;
        }
    }
}

/// Key of an edge: communicator, the sender's global rank, the receiver's rank in the
/// communicator.
pub type EdgeKey = (u64, u32, u32);

/// A job's edges and the communicator ranks that name their receivers.
#[derive(Debug, Clone, Default)]
pub struct Links {
    /// (communicator, rank in it) → global rank.
    ranks: FxHashMap<(u64, u32), u32>,
    /// Edges by key.
    pub edges: FxHashMap<EdgeKey, Edge>,
}

/// What one edge costs, bytes, as the job's state budget counts it.
pub const EDGE_COST: usize = std::mem::size_of::<Edge>() + std::mem::size_of::<EdgeKey>() + 16;
/// What one communicator rank's entry costs.
pub const RANK_ENTRY_COST: usize = 32;

impl Links {
    /// Global rank `rank` is rank `comm_rank` of `comm`; `false` when it is new and
    /// `budget` (bytes, reduced when taken) cannot hold it.
    pub fn name(&mut self, comm: u64, comm_rank: u32, rank: u32, budget: &mut usize) -> bool {
        if let Some(r) = self.ranks.get_mut(&(comm, comm_rank)) {
            *r = rank;
            return true;
        }
        if *budget < RANK_ENTRY_COST {
            return false;
        }
        *budget -= RANK_ENTRY_COST;
        self.ranks.insert((comm, comm_rank), rank);
        true
    }

    /// Fold one sample read at `now`; `false` when its edge is new and `budget` cannot
    /// hold it.
    pub fn apply(&mut self, l: &LinkSample, now: Timestamp, budget: &mut usize) -> bool {
        if !self.name(l.comm, l.comm_rank, l.rank, budget) {
            return false;
        }
        let key = (l.comm, l.rank, l.peer);
        if !self.edges.contains_key(&key) {
            if *budget < EDGE_COST {
                return false;
            }
            *budget -= EDGE_COST;
        }
        self.edges.entry(key).or_default().apply(l, now);
        true
    }

    /// The global rank of rank `comm_rank` of `comm`, when known.
    pub fn rank_of(&self, comm: u64, comm_rank: u32) -> Option<u32> {
        self.ranks.get(&(comm, comm_rank)).copied()
    }

    /// Bytes held, as the budget counts them.
    pub fn bytes(&self) -> usize {
        self.edges.len() * EDGE_COST + self.ranks.len() * RANK_ENTRY_COST
    }

    /// Forget everything (a new run of the job).
    pub fn clear(&mut self) {
        self.ranks.clear();
        self.edges.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(steps: u64, bytes: u64, busy_ns: u64) -> LinkSample {
        LinkSample {
            comm: 7,
            rank: 3,
            comm_rank: 1,
            peer: 2,
            at_ns: 1,
            steps,
            bytes,
            busy_ns,
        }
    }

    fn samples(l: &Links) -> Vec<f32> {
        l.edges[&(7, 3, 2)].samples.recent(EDGE_SAMPLES).collect()
    }

    #[test]
    fn totals_become_time_per_byte_of_each_interval_and_repeats_add_nothing() {
        let mut l = Links::default();
        let mut budget = usize::MAX;
        let mib = 1 << 20;
        assert!(l.apply(&sample(10, mib, 1_000_000), Timestamp(1), &mut budget));
        assert!(l.apply(&sample(10, mib, 1_000_000), Timestamp(2), &mut budget));
        assert!(l.apply(&sample(20, 2 * mib, 3_000_000), Timestamp(3), &mut budget));
        let s = samples(&l);
        assert_eq!(s.len(), 2, "{s:?}");
        assert!((s[0] - 2_000_000.0 / mib as f32).abs() < 1e-6, "{s:?}");
        assert!((s[1] - 1_000_000.0 / mib as f32).abs() < 1e-6, "{s:?}");
        assert_eq!(l.rank_of(7, 1), Some(3));
        assert_eq!(l.rank_of(7, 2), None);
    }

    #[test]
    fn small_intervals_add_up_and_totals_that_go_down_start_over() {
        let mut l = Links::default();
        let mut budget = usize::MAX;
        let small = MIN_SAMPLE_BYTES / 4;
        for i in 1..=3 {
            l.apply(
                &sample(i, i * small, i * 100),
                Timestamp(i as i64),
                &mut budget,
            );
        }
        assert!(samples(&l).is_empty(), "three quarters of a sample");
        l.apply(&sample(4, 4 * small, 400), Timestamp(4), &mut budget);
        assert_eq!(samples(&l).len(), 1);
        // A new process: its totals start below the old ones.
        l.apply(&sample(1, small, 50), Timestamp(5), &mut budget);
        assert!(samples(&l).is_empty());
    }

    #[test]
    fn a_new_edge_beyond_the_budget_is_refused() {
        let mut l = Links::default();
        let mut budget = RANK_ENTRY_COST + EDGE_COST - 1;
        assert!(!l.apply(&sample(1, 1, 1), Timestamp(1), &mut budget));
        assert!(l.edges.is_empty());
    }
}
