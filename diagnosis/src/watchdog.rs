//! Rank-wise reading of PyTorch ProcessGroupNCCL watchdog lines: when every rank's
//! watchdog fires at once, find the rank(s) the others were waiting for.
//!
//! # What is read
//!
//! - Collective timeouts, current and old form: `[Rank 3] Watchdog caught collective
//!   operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, ..., Timeout(ms)=600000)
//!   ran for 600010 milliseconds before timing out.` and `Caught collective operation
//!   timeout: WorkNCCL(OpType=..., Timeout(ms)=...)` (no sequence number).
//! - Work status: `[PG 0 Rank 5] Timeout at NCCL work: W, last enqueued NCCL work: E,
//!   last completed NCCL work: C.`, the same after `Exception (either an error or
//!   timeout) detected by watchdog at work: W`, after a flight-recorder `Received a dump
//!   signal ...`, and the periodic `NCCL Work update periodically: ...`.
//! - The desync report (`TORCH_NCCL_DESYNC_DEBUG`): `ranks [1, 2] are the lagging ranks
//!   that caused this timeout`, `[3] joined but didn't finish collective #N`,
//!   `[4, 5] finished collective #N, but didn't join collective #N+1`.
//!
//! The rank of a line is, in order: the line's own rank, a `[rankN]:` prefix (global
//! rank), or the `[Rank N]` / `[PG p ... Rank N]` tag (rank within the process group).
//!
//! # Who lags
//!
//! Within one process group, in this order of strength:
//! 1. ranks the desync report names (unless it names every rank);
//! 2. ranks whose last *enqueued* sequence number is behind the others': they never
//!    issued the collective the rest are stuck in;
//! 3. ranks that timed out on an earlier sequence number than the others;
//! 4. with enqueued numbers equal, ranks whose last *completed* number is behind;
//! 5. ranks that never reported while at least two others timed out on the same
//!    collective (at most a quarter of the job, so a missing log file is not a culprit).
//!
//! "Behind" must be the smaller side (at most as many ranks as are ahead); otherwise the
//! lines do not single anyone out and the answer is `None`.
//!
//! Memory and time are bounded by the lines read, never by a number they or the caller
//! state: one small state per (process group, rank), capped; a world size is a count
//! that is compared, never a range of ranks that is built or walked (one above
//! [`MAX_WORLD_SIZE`] is not believed at all); an explanation lists at most
//! [`MAX_LISTED_RANKS`] ranks. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use regex::Regex;

use crate::model::LogLine;

/// Process-group ranks tracked at most (states beyond are dropped and counted).
const MAX_STATES: usize = 1 << 20;
/// Evidence line ids returned at most.
const MAX_EVIDENCE: usize = 16;
/// Largest world size believed. The wire refuses ranks at or above
/// [`warden_model::wire::MAX_RANK`], so no job has more ranks than that; a larger world
/// size is a client's mistake (or attack) and is treated as unknown: the ranks seen in
/// the lines stand for the job. Below it, a world size is still only ever compared
/// with counts, so it costs nothing either way.
pub const MAX_WORLD_SIZE: u32 = warden_model::wire::MAX_RANK;
/// Ranks an explanation lists by number at most; the rest are counted.
pub const MAX_LISTED_RANKS: usize = 32;
/// Process groups whose desync report is kept at most.
const MAX_DESYNC_GROUPS: usize = 1024;

/// The world size taken from a caller: `None` for 0 (no job has no ranks) and above
/// [`MAX_WORLD_SIZE`] (no job has that many).
pub fn believed_world_size(world_size: Option<u32>) -> Option<u32> {
    world_size.filter(|&n| (1..=MAX_WORLD_SIZE).contains(&n))
}

/// Why the ranks were named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LagReason {
    /// PyTorch's own desync report named them.
    DesyncReport,
    /// Their last enqueued collective is behind the other ranks'.
    BehindEnqueued,
    /// They timed out on an earlier collective than the other ranks.
    BehindTimedOut,
    /// Their last completed collective is behind, with the same last enqueued.
    BehindCompleted,
    /// They never reported while the others timed out on the same collective.
    Silent,
}

impl LagReason {
    /// Short label for evidence and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            LagReason::DesyncReport => "desync-report",
            LagReason::BehindEnqueued => "behind-enqueued",
            LagReason::BehindTimedOut => "behind-timed-out",
            LagReason::BehindCompleted => "behind-completed",
            LagReason::Silent => "silent-rank",
        }
    }
}

/// The answer: who lags, in which process group, and the lines that show it.
#[derive(Debug, Clone, PartialEq)]
pub struct LaggingRanks {
    /// The lagging ranks, ascending.
    pub ranks: Vec<u32>,
    /// Process group id as printed (`"0"` when the lines do not say).
    pub pg: String,
    /// Why these ranks.
    pub reason: LagReason,
    /// The sequence number the other ranks were stuck on, when known.
    pub seq: Option<i64>,
    /// Ids of the lines that show it, the laggards' first.
    pub evidence: Vec<u64>,
    /// The finding in words.
    pub explanation: String,
}

/// What one watchdog line says.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchdogEvent {
    /// A collective timed out.
    CollectiveTimeout {
        /// `SeqNum`, absent in old PyTorch versions.
        seq: Option<i64>,
        /// `OpType`.
        op: Option<String>,
        /// `Timeout(ms)`.
        timeout_ms: Option<u64>,
        /// `ran for N milliseconds`.
        ran_ms: Option<u64>,
    },
    /// Last enqueued / completed sequence numbers of the process group.
    WorkStatus {
        /// The work the watchdog stopped at (`Timeout at NCCL work: W`), if said.
        at_work: Option<i64>,
        /// `last enqueued NCCL work`.
        last_enqueued: i64,
        /// `last completed NCCL work`.
        last_completed: i64,
    },
    /// Ranks the desync report names as lagging.
    DesyncLagging {
        /// The ranks.
        ranks: Vec<u32>,
    },
}

/// A parsed watchdog line.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchdogRecord {
    /// The line id.
    pub line: u64,
    /// The rank it is about, when known.
    pub rank: Option<u32>,
    /// Process group id (`"0"` when not printed).
    pub pg: String,
    /// What it says.
    pub event: WatchdogEvent,
}

struct Patterns {
    pg_rank: Regex,
    plain_rank: Regex,
    seq: Regex,
    op: Regex,
    timeout_ms: Regex,
    ran_ms: Regex,
    status: Regex,
    at_work: Regex,
    desync_missing: Regex,
    desync_lagging: Regex,
}

/// The compiled patterns; `None` only if one failed to compile, which the tests rule out.
fn patterns() -> Option<&'static Patterns> {
    static P: OnceLock<Option<Patterns>> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(s).ok();
        Some(Patterns {
            pg_rank: re(r"\[PG (?:ID )?(\d+)[^\]]*? Rank (\d+)\]")?,
            plain_rank: re(r"\[Rank (\d+)\]")?,
            seq: re(r"SeqNum=(\d+)")?,
            op: re(r"OpType=([A-Za-z_]+)")?,
            timeout_ms: re(r"Timeout\(ms\)=(\d+)")?,
            ran_ms: re(r"ran for (\d+) milliseconds")?,
            status: re(r"(?i)last enqueued NCCL work: (-?\d+), last completed NCCL work: (-?\d+)")?,
            at_work: re(r"(?:Timeout at NCCL work|detected by watchdog at work): (-?\d+)")?,
            desync_missing: re(r"ranks \[([\d, ]+)\] are the lagging ranks")?,
            desync_lagging: re(
                r"\[([\d, ]+)\] (?:joined but didn't finish collective|finished collective #\d+, but didn't join collective)",
            )?,
        })
    })
    .as_ref()
}

fn rank_list(s: &str) -> Vec<u32> {
    s.split(',').filter_map(|r| r.trim().parse().ok()).collect()
}

/// Whether a line may be a watchdog line (a cheap test before any regex).
fn may_be_watchdog(text: &str) -> bool {
    text.contains("collective operation timeout")
        || text.contains("NCCL work")
        || text.contains("the lagging ranks")
        || text.contains("didn't finish collective")
        || text.contains("didn't join collective")
}

/// Parses one line; `None` when it is not a watchdog line this module reads.
pub fn parse(line: &LogLine) -> Option<WatchdogRecord> {
    let text = line.text.as_str();
    if !may_be_watchdog(text) {
        return None;
    }
    let p = patterns()?;
    let num = |re: &Regex| -> Option<i64> {
        re.captures(text)
            .and_then(|c| c.get(1))
            .and_then(|m| m.as_str().parse().ok())
    };
    let pg_caps = p.pg_rank.captures(text);
    let pg = pg_caps
        .as_ref()
        .and_then(|c| c.get(1))
        .map_or("0", |m| m.as_str())
        .to_owned();
    let tag_rank = pg_caps
        .as_ref()
        .and_then(|c| c.get(2))
        .or_else(|| p.plain_rank.captures(text).and_then(|c| c.get(1)))
        .and_then(|m| m.as_str().parse().ok());
    let rank = line.rank.or_else(|| global_rank(text)).or(tag_rank);

    let event = if text.contains("ollective operation timeout") && text.contains("WorkNCCL(") {
        WatchdogEvent::CollectiveTimeout {
            seq: num(&p.seq),
            op: p
                .op
                .captures(text)
                .and_then(|c| c.get(1))
                .map(|m| m.as_str().to_owned()),
            timeout_ms: num(&p.timeout_ms).and_then(|v| u64::try_from(v).ok()),
            ran_ms: num(&p.ran_ms).and_then(|v| u64::try_from(v).ok()),
        }
    } else if let Some(c) = p.status.captures(text) {
        let field = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<i64>().ok());
        WatchdogEvent::WorkStatus {
            at_work: num(&p.at_work),
            last_enqueued: field(1)?,
            last_completed: field(2)?,
        }
    } else if let Some(c) = p.desync_missing.captures(text) {
        WatchdogEvent::DesyncLagging {
            ranks: rank_list(c.get(1)?.as_str()),
        }
    } else if let Some(c) = p.desync_lagging.captures(text) {
        WatchdogEvent::DesyncLagging {
            ranks: rank_list(c.get(1)?.as_str()),
        }
    } else {
        return None;
    };
    Some(WatchdogRecord {
        line: line.id,
        rank,
        pg,
        event,
    })
}

/// The global rank of a `[rankN]:` prefix, without a regex.
fn global_rank(text: &str) -> Option<u32> {
    let at = text.find("[rank")?;
    let rest = &text[at + 5..];
    let end = rest.find(']')?;
    if !rest[end..].starts_with("]:") {
        return None;
    }
    rest[..end].parse().ok()
}

/// A rank's latest work status.
#[derive(Debug, Clone, Copy)]
struct Status {
    line: u64,
    enqueued: i64,
    completed: i64,
}

#[derive(Debug, Clone, Default)]
struct RankState {
    /// Latest status.
    status: Option<Status>,
    /// First timeout: (line, seq).
    timeout: Option<(u64, Option<i64>)>,
}

/// Streaming scan: push every line (watchdog or not), then ask [`WatchdogScan::finish`].
#[derive(Debug, Default)]
pub struct WatchdogScan {
    /// (pg, rank) → state.
    states: BTreeMap<(String, u32), RankState>,
    /// Desync-named ranks per pg, with the line ids.
    desync: BTreeMap<String, (BTreeSet<u32>, Vec<u64>)>,
    /// Every rank any line came from.
    ranks_seen: BTreeSet<u32>,
    /// Records parsed.
    records: u64,
    /// States dropped at the cap.
    dropped: u64,
}

impl WatchdogScan {
    /// An empty scan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Watchdog records read so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Reads one line; returns whether it was a watchdog line.
    pub fn push(&mut self, line: &LogLine) -> bool {
        if let Some(rank) = line.rank.or_else(|| global_rank(&line.text))
            && self.ranks_seen.len() < MAX_STATES
        {
            self.ranks_seen.insert(rank);
        }
        let Some(record) = parse(line) else {
            return false;
        };
        self.records += 1;
        self.apply(record);
        true
    }

    fn apply(&mut self, record: WatchdogRecord) {
        if let WatchdogEvent::DesyncLagging { ranks } = &record.event {
            if !self.desync.contains_key(&record.pg) && self.desync.len() >= MAX_DESYNC_GROUPS {
                self.dropped += 1;
                return;
            }
            let entry = self.desync.entry(record.pg.clone()).or_default();
            let room = MAX_STATES.saturating_sub(entry.0.len());
            entry.0.extend(ranks.iter().copied().take(room));
            if entry.1.len() < MAX_EVIDENCE {
                entry.1.push(record.line);
            }
            return;
        }
        let Some(rank) = record.rank else {
            return;
        };
        if self.ranks_seen.len() < MAX_STATES {
            self.ranks_seen.insert(rank);
        }
        let key = (record.pg, rank);
        if !self.states.contains_key(&key) && self.states.len() >= MAX_STATES {
            self.dropped += 1;
            return;
        }
        let state = self.states.entry(key).or_default();
        match record.event {
            WatchdogEvent::CollectiveTimeout { seq, .. } => {
                if state.timeout.is_none() {
                    state.timeout = Some((record.line, seq));
                }
            }
            WatchdogEvent::WorkStatus {
                at_work,
                last_enqueued,
                last_completed,
            } => {
                state.status = Some(Status {
                    line: record.line,
                    enqueued: last_enqueued,
                    completed: last_completed,
                });
                if let Some(work) = at_work {
                    match &mut state.timeout {
                        Some((_, seq @ None)) => *seq = Some(work),
                        None => state.timeout = Some((record.line, Some(work))),
                        _ => {}
                    }
                }
            }
            WatchdogEvent::DesyncLagging { .. } => {}
        }
    }

    /// Names the lagging ranks, or `None` when the lines do not single anyone out.
    /// `world_size`, when given, is the number of ranks in the job (ranks `0..world`);
    /// otherwise, and when it is not believed ([`believed_world_size`]), the ranks seen
    /// in any line stand for the job. Its cost depends on the lines read only.
    pub fn finish(&self, world_size: Option<u32>) -> Option<LaggingRanks> {
        let world = match believed_world_size(world_size) {
            Some(n) => World::Size(n),
            None => World::Seen(&self.ranks_seen),
        };
        let mut pgs: Vec<&String> = self
            .states
            .keys()
            .map(|(pg, _)| pg)
            .chain(self.desync.keys())
            .collect();
        pgs.sort_by_key(|pg| (pg.as_str() != "0", pg.parse::<u64>().unwrap_or(u64::MAX)));
        pgs.dedup();
        pgs.into_iter().find_map(|pg| self.finish_pg(pg, world))
    }

    fn finish_pg(&self, pg: &str, world: World<'_>) -> Option<LaggingRanks> {
        // This group's states only: a range of the map, not a pass over every group's.
        let group = (pg.to_owned(), 0)..=(pg.to_owned(), u32::MAX);
        let states: BTreeMap<u32, &RankState> = self
            .states
            .range(group)
            .map(|((_, r), s)| (*r, s))
            .collect();

        // 1. The desync report.
        if let Some((named, lines)) = self.desync.get(pg)
            && !named.is_empty()
            && !world.within(named)
        {
            return Some(LaggingRanks {
                ranks: named.iter().copied().collect(),
                pg: pg.to_owned(),
                reason: LagReason::DesyncReport,
                seq: None,
                evidence: lines.clone(),
                explanation: format!(
                    "PyTorch's desync report names rank(s) {} as lagging",
                    join(named.iter())
                ),
            });
        }

        // 2-4. Sequence numbers.
        let status: Vec<(u32, Status)> = states
            .iter()
            .filter_map(|(&r, s)| s.status.map(|st| (r, st)))
            .collect();
        let by_enqueued: Vec<(u32, u64, i64)> = status
            .iter()
            .map(|&(r, st)| (r, st.line, st.enqueued))
            .collect();
        if let Some(found) = behind(pg, &by_enqueued, LagReason::BehindEnqueued, "last enqueued") {
            return Some(found);
        }
        let by_timeout: Vec<(u32, u64, i64)> = states
            .iter()
            .filter_map(|(&r, s)| s.timeout.and_then(|(l, seq)| seq.map(|q| (r, l, q))))
            .collect();
        if let Some(found) = behind(pg, &by_timeout, LagReason::BehindTimedOut, "timed-out") {
            return Some(found);
        }
        let by_completed: Vec<(u32, u64, i64)> = status
            .iter()
            .map(|&(r, st)| (r, st.line, st.completed))
            .collect();
        if let Some(found) = behind(
            pg,
            &by_completed,
            LagReason::BehindCompleted,
            "last completed",
        ) {
            return Some(found);
        }

        // 5. Silent ranks.
        let reporters: Vec<(u32, u64, Option<i64>)> = states
            .iter()
            .filter_map(|(&r, s)| s.timeout.map(|(l, seq)| (r, l, seq)))
            .collect();
        if reporters.len() < 2 {
            return None;
        }
        let seqs: BTreeSet<Option<i64>> = reporters.iter().map(|&(_, _, q)| q).collect();
        if seqs.len() != 1 {
            return None;
        }
        let reported: BTreeSet<u32> = states.keys().copied().collect();
        // At most a quarter of the job may be silent; beyond, nothing is listed.
        let silent = world.missing(&reported, world.len() / 4)?;
        if silent.is_empty() {
            return None;
        }
        let seq = seqs.into_iter().next().flatten();
        Some(LaggingRanks {
            explanation: format!(
                "{} rank(s) timed out on the same collective{}; rank(s) {} never reported",
                reporters.len(),
                seq.map(|q| format!(" (#{q})")).unwrap_or_default(),
                join(silent.iter())
            ),
            ranks: silent,
            pg: pg.to_owned(),
            reason: LagReason::Silent,
            seq,
            evidence: reporters
                .iter()
                .map(|&(_, l, _)| l)
                .take(MAX_EVIDENCE)
                .collect(),
        })
    }
}

/// The ranks whose value is below the maximum, if they are the smaller side.
fn behind(
    pg: &str,
    values: &[(u32, u64, i64)],
    reason: LagReason,
    what: &str,
) -> Option<LaggingRanks> {
    let max = values.iter().map(|&(_, _, v)| v).max()?;
    let (lag, ahead): (Vec<_>, Vec<_>) = values.iter().partition(|&&(_, _, v)| v < max);
    if lag.is_empty() || lag.len() > ahead.len() {
        return None;
    }
    let ranks: Vec<u32> = lag.iter().map(|&&(r, _, _)| r).collect();
    let lowest = lag.iter().map(|&&(_, _, v)| v).min().unwrap_or(max);
    let mut evidence: Vec<u64> = lag
        .iter()
        .map(|&&(_, l, _)| l)
        .take(MAX_EVIDENCE - 1)
        .collect();
    if let Some(&&(_, l, _)) = ahead.first() {
        evidence.push(l);
    }
    Some(LaggingRanks {
        explanation: format!(
            "rank(s) {} {what} collective #{lowest}; the other {} rank(s) reached #{max}",
            join(ranks.iter()),
            ahead.len()
        ),
        ranks,
        pg: pg.to_owned(),
        reason,
        seq: Some(max),
        evidence,
    })
}

/// The ranks of a job as far as they are known. A world size stays a number: it is
/// compared with counts of the ranks read, never turned into the ranks `0..n`.
#[derive(Debug, Clone, Copy)]
enum World<'a> {
    /// Ranks `0..n`, `n` believed ([`believed_world_size`]).
    Size(u32),
    /// The ranks seen in any line.
    Seen(&'a BTreeSet<u32>),
}

impl World<'_> {
    /// Number of ranks.
    fn len(self) -> usize {
        match self {
            World::Size(n) => n as usize,
            World::Seen(seen) => seen.len(),
        }
    }

    /// Whether every rank of the world is in `set` (false for an empty world). Cost:
    /// the size of `set`.
    fn within(self, set: &BTreeSet<u32>) -> bool {
        match self {
            World::Size(n) => n > 0 && set.range(..n).count() == n as usize,
            World::Seen(seen) => {
                !seen.is_empty() && seen.len() <= set.len() && seen.iter().all(|r| set.contains(r))
            }
        }
    }

    /// The ranks of the world not in `reported`, ascending; `None` when there are more
    /// than `max`. Cost: the size of `reported` and of the answer, plus, for
    /// [`World::Seen`], its size (at most four times that of `reported` whenever an
    /// answer is built).
    fn missing(self, reported: &BTreeSet<u32>, max: usize) -> Option<Vec<u32>> {
        match self {
            World::Size(n) => {
                let present = reported.range(..n).count();
                let absent = (n as usize).saturating_sub(present);
                if absent > max {
                    return None;
                }
                // The gaps between the reported ranks, in order.
                let mut out = Vec::with_capacity(absent);
                let mut next = 0u32;
                for &r in reported.range(..n).chain(std::iter::once(&n)) {
                    out.extend(next..r);
                    next = r.saturating_add(1);
                }
                Some(out)
            }
            World::Seen(seen) => {
                let present = reported.iter().filter(|r| seen.contains(r)).count();
                if seen.len().saturating_sub(present) > max {
                    return None;
                }
                Some(seen.difference(reported).copied().collect())
            }
        }
    }
}

/// The ranks as a list, at most [`MAX_LISTED_RANKS`] of them by number.
fn join<'a>(ranks: impl ExactSizeIterator<Item = &'a u32>) -> String {
    let total = ranks.len();
    let mut out = ranks
        .take(MAX_LISTED_RANKS)
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if total > MAX_LISTED_RANKS {
        out.push_str(&format!(" and {} more", total - MAX_LISTED_RANKS));
    }
    out
}

/// Scans `lines` and names the lagging ranks (see the module docs).
pub fn lagging_ranks(lines: &[LogLine], world_size: Option<u32>) -> Option<LaggingRanks> {
    let mut scan = WatchdogScan::new();
    for line in lines {
        scan.push(line);
    }
    scan.finish(world_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(texts: &[&str]) -> Vec<LogLine> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| LogLine {
                id: i as u64,
                text: (*t).to_owned(),
                ..LogLine::default()
            })
            .collect()
    }

    fn timeout(rank: u32, seq: u64) -> String {
        format!(
            "[rank{rank}]:[E1003 18:37:01.833 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
        )
    }

    fn status(rank: u32, work: i64, enq: i64, done: i64) -> String {
        format!(
            "[rank{rank}]:[E1003 18:37:01.833 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank {rank}] Timeout at NCCL work: {work}, last enqueued NCCL work: {enq}, last completed NCCL work: {done}."
        )
    }

    /// One case: the lines, the world size, and the expected (ranks, reason).
    fn check(texts: &[String], world: Option<u32>, expect: Option<(&[u32], LagReason)>) {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let got = lagging_ranks(&lines(&refs), world);
        match (got, expect) {
            (None, None) => {}
            (Some(g), Some((ranks, reason))) => {
                assert_eq!(g.ranks, ranks, "{}", g.explanation);
                assert_eq!(g.reason, reason, "{}", g.explanation);
                assert!(!g.evidence.is_empty());
                for id in &g.evidence {
                    assert!((*id as usize) < texts.len());
                }
            }
            (got, want) => panic!("got {got:?}, want {want:?} for {texts:#?}"),
        }
    }

    #[test]
    fn parse_table() {
        assert!(patterns().is_some(), "every pattern compiles");
        let cases: Vec<(String, Option<u32>, &str, WatchdogEvent)> = vec![
            (
                timeout(3, 1234),
                Some(3),
                "0",
                WatchdogEvent::CollectiveTimeout {
                    seq: Some(1234),
                    op: Some("ALLREDUCE".to_owned()),
                    timeout_ms: Some(600_000),
                    ran_ms: Some(600_010),
                },
            ),
            (
                "[E ProcessGroupNCCL.cpp:1537] [PG 2 Rank 5] Timeout at NCCL work: 1234, last enqueued NCCL work: 1234, last completed NCCL work: 1233.".to_owned(),
                Some(5),
                "2",
                WatchdogEvent::WorkStatus { at_work: Some(1234), last_enqueued: 1234, last_completed: 1233 },
            ),
            (
                "[rank3]:[E227 16:30:43.52 ProcessGroupNCCL.cpp:1785] [PG ID 2 PG GUID 3 Rank 3] Exception (either an error or timeout) detected by watchdog at work: 32, last enqueued NCCL work: 32, last completed NCCL work: 31.".to_owned(),
                Some(3),
                "2",
                WatchdogEvent::WorkStatus { at_work: Some(32), last_enqueued: 32, last_completed: 31 },
            ),
            (
                "[rank4]:[E703 15:37:17.17 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 4] Received a dump signal due to a collective timeout from  rank 7 and we will try our best to dump the debug info. Last enqueued NCCL work: 56118, last completed NCCL work: 56118.This is most likely caused by ...".to_owned(),
                Some(4),
                "0",
                WatchdogEvent::WorkStatus { at_work: None, last_enqueued: 56118, last_completed: 56118 },
            ),
            (
                "[E ProcessGroupNCCL.cpp:475] [Rank 0] Caught collective operation timeout: WorkNCCL(OpType=BROADCAST, TensorShape=[1024], Timeout(ms)=1800000) ran for 1800614 milliseconds before timing out.".to_owned(),
                Some(0),
                "0",
                WatchdogEvent::CollectiveTimeout { seq: None, op: Some("BROADCAST".to_owned()), timeout_ms: Some(1_800_000), ran_ms: Some(1_800_614) },
            ),
            (
                "\t - To our best knowledge, ranks [1, 2] are the lagging ranks that caused this timeout. They never joined any collectives".to_owned(),
                None,
                "0",
                WatchdogEvent::DesyncLagging { ranks: vec![1, 2] },
            ),
            (
                "\t   - [3] joined but didn't finish collective #41 (count from 1)".to_owned(),
                None,
                "0",
                WatchdogEvent::DesyncLagging { ranks: vec![3] },
            ),
            (
                "\t     [4, 5] finished collective #40, but didn't join collective #41 (count from 1)".to_owned(),
                None,
                "0",
                WatchdogEvent::DesyncLagging { ranks: vec![4, 5] },
            ),
        ];
        for (text, rank, pg, event) in cases {
            let line = LogLine {
                text: text.clone(),
                ..LogLine::default()
            };
            let got = parse(&line).unwrap_or_else(|| panic!("parses: {text}"));
            assert_eq!(
                (got.rank, got.pg.as_str(), got.event),
                (rank, pg, event),
                "{text}"
            );
        }
        for text in [
            "iteration 100 | lm loss 2.3",
            "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
            "[Rank 3] Some NCCL operations have failed or timed out.",
        ] {
            let line = LogLine {
                text: text.to_owned(),
                ..LogLine::default()
            };
            assert_eq!(parse(&line), None, "{text}");
        }
    }

    #[test]
    fn rank_behind_in_enqueued_work_is_named() {
        let mut t: Vec<String> = (0..8u32)
            .filter(|&r| r != 5)
            .flat_map(|r| [timeout(r, 100), status(r, 100, 100, 99)])
            .collect();
        t.push(timeout(5, 99));
        t.push(status(5, 99, 99, 98));
        check(&t, Some(8), Some((&[5], LagReason::BehindEnqueued)));
    }

    #[test]
    fn every_rank_on_the_same_work_names_nobody() {
        let t: Vec<String> = (0..8u32)
            .flat_map(|r| [timeout(r, 100), status(r, 100, 100, 99)])
            .collect();
        check(&t, Some(8), None);
        check(&t, None, None);
    }

    #[test]
    fn silent_rank_is_named_when_the_rest_time_out_together() {
        let mut t: Vec<String> = (0..8u32)
            .filter(|&r| r != 6)
            .map(|r| timeout(r, 100))
            .collect();
        // Rank 6 printed ordinary lines before, so it is known even without a world size.
        t.insert(0, "[rank6]: iteration 99 | lm loss 2.1".to_owned());
        check(&t, None, Some((&[6], LagReason::Silent)));
        check(&t, Some(8), Some((&[6], LagReason::Silent)));
    }

    #[test]
    fn a_missing_node_is_not_a_culprit() {
        // 8 of 16 ranks never reported: more likely a missing log than 8 culprits.
        let t: Vec<String> = (0..8u32).map(|r| timeout(r, 100)).collect();
        check(&t, Some(16), None);
    }

    #[test]
    fn half_behind_is_not_singled_out() {
        let t: Vec<String> = (0..4u32)
            .map(|r| status(r, 100, if r < 2 { 99 } else { 100 }, 98))
            .collect();
        // 2 behind, 2 ahead: the laggards may be as many as the rest, not more.
        check(&t, Some(4), Some((&[0, 1], LagReason::BehindEnqueued)));
        let t: Vec<String> = (0..4u32)
            .map(|r| status(r, 100, if r < 3 { 99 } else { 100 }, 98))
            .collect();
        check(&t, Some(4), None);
    }

    #[test]
    fn earlier_timed_out_collective_without_status_lines() {
        let mut t: Vec<String> = (0..8u32)
            .filter(|&r| r != 2)
            .map(|r| timeout(r, 57))
            .collect();
        t.push(timeout(2, 56));
        check(&t, Some(8), Some((&[2], LagReason::BehindTimedOut)));
    }

    #[test]
    fn behind_in_completed_work_with_equal_enqueued() {
        let t: Vec<String> = (0..4u32)
            .map(|r| status(r, 11, 11, if r == 0 { 9 } else { 10 }))
            .collect();
        check(&t, Some(4), Some((&[0], LagReason::BehindCompleted)));
    }

    #[test]
    fn desync_report_wins_unless_it_names_everyone() {
        let mut t: Vec<String> = (0..4u32).map(|r| timeout(r, 39)).collect();
        t.push("\t   - [3] joined but didn't finish collective #39 (count from 1)".to_owned());
        check(&t, Some(4), Some((&[3], LagReason::DesyncReport)));
        let mut t: Vec<String> = (0..4u32).map(|r| timeout(r, 39)).collect();
        t.push(
            "\t   - [0, 1, 2, 3] joined but didn't finish collective #39 (count from 1)".to_owned(),
        );
        check(&t, Some(4), None);
    }

    #[test]
    fn process_groups_are_compared_separately() {
        // PG 1's ranks are on a different sequence than PG 0's; neither lags inside its
        // own group except rank 3 in PG 1.
        let t: Vec<String> = vec![
            "[PG 0 Rank 0] Timeout at NCCL work: 500, last enqueued NCCL work: 500, last completed NCCL work: 499.".to_owned(),
            "[PG 0 Rank 1] Timeout at NCCL work: 500, last enqueued NCCL work: 500, last completed NCCL work: 499.".to_owned(),
            "[PG 1 Rank 2] Timeout at NCCL work: 7, last enqueued NCCL work: 8, last completed NCCL work: 6.".to_owned(),
            "[PG 1 Rank 3] Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.".to_owned(),
            "[PG 1 Rank 4] Timeout at NCCL work: 7, last enqueued NCCL work: 8, last completed NCCL work: 6.".to_owned(),
        ];
        let refs: Vec<&str> = t.iter().map(String::as_str).collect();
        let got = lagging_ranks(&lines(&refs), None).expect("rank 3 of PG 1 lags");
        assert_eq!((got.ranks, got.pg.as_str()), (vec![3], "1"));
    }

    /// Invariant: a world size is a client's number (a rank registered with
    /// `world_size: 4294967295` once made the controller allocate 17 GB); it never sizes
    /// an allocation or a loop. Ranks near the top of the `u32` range are read like any.
    #[test]
    fn a_client_world_size_never_sizes_the_work() {
        let top = u32::MAX;
        // Seven ranks near the top time out together; the eighth printed only before.
        let mut t: Vec<String> = (0..7u32).map(|i| timeout(top - i, 100)).collect();
        t.insert(0, format!("[rank{}]: iteration 99 | lm loss 2.1", top - 7));
        // No job has 2^32 - 1 ranks: the ranks seen stand for the job.
        check(&t, Some(u32::MAX), Some((&[top - 7], LagReason::Silent)));
        // The largest world believed, 0..MAX_WORLD_SIZE, holds none of these ranks:
        // nobody is singled out, and nothing is counted rank by rank.
        check(&t, Some(MAX_WORLD_SIZE), None);
        check(&t, Some(MAX_WORLD_SIZE - 1), None);

        let mut t: Vec<String> = (0..4u32)
            .filter(|&i| i != 3)
            .flat_map(|i| [timeout(top - i, 100), status(top - i, 100, 100, 99)])
            .collect();
        t.push(status(top - 3, 99, 99, 98));
        check(
            &t,
            Some(u32::MAX),
            Some((&[top - 3], LagReason::BehindEnqueued)),
        );

        let mut t: Vec<String> = (0..4u32).map(|i| timeout(top - i, 39)).collect();
        t.push(format!(
            "\t   - [{top}] joined but didn't finish collective #39 (count from 1)"
        ));
        check(&t, Some(u32::MAX), Some((&[top], LagReason::DesyncReport)));
        check(
            &t,
            Some(MAX_WORLD_SIZE),
            Some((&[top], LagReason::DesyncReport)),
        );

        // A world of ranks 0..n with most of it present: the silent ones are found
        // between the reported ones, without walking 0..n.
        let n = 4096u32;
        let t: Vec<String> = (0..n)
            .filter(|r| r % 512 != 7)
            .map(|r| timeout(r, 5))
            .collect();
        let got = lagging_ranks(
            &lines(&t.iter().map(String::as_str).collect::<Vec<_>>()),
            Some(n),
        )
        .expect("the silent ranks are named");
        assert_eq!(got.reason, LagReason::Silent);
        assert_eq!(
            got.ranks,
            (0..n).filter(|r| r % 512 == 7).collect::<Vec<_>>()
        );
    }

    /// Invariant: the answer's text is bounded whatever the number of ranks it names
    /// (each rank is listed up to a cap, then counted).
    #[test]
    fn an_explanation_lists_a_bounded_number_of_ranks() {
        // 4000 ranks time out together; 1000 more printed only ordinary lines.
        let mut t: Vec<String> = (0..1000u32)
            .map(|r| format!("[rank{r}]: iteration 99 | lm loss 2.1"))
            .collect();
        t.extend((1000..5000u32).map(|r| timeout(r, 100)));
        let refs: Vec<&str> = t.iter().map(String::as_str).collect();
        let got = lagging_ranks(&lines(&refs), None).expect("the silent ranks are named");
        assert_eq!(got.reason, LagReason::Silent);
        assert_eq!(got.ranks.len(), 1000);
        assert!(got.evidence.len() <= MAX_EVIDENCE);
        assert!(
            got.explanation.len() < 600,
            "{} bytes: {}",
            got.explanation.len(),
            got.explanation
        );
        assert!(
            got.explanation.contains("and 968 more"),
            "{}",
            got.explanation
        );
    }

    #[test]
    fn generated_log_names_the_injected_culprit() {
        use crate::loggen::{GenConfig, LogGen};
        let mut generator = LogGen::new(GenConfig {
            nodes: 4,
            gpus_per_node: 8,
            target_bytes: 2_000_000,
            ..GenConfig::default()
        });
        let mut scan = WatchdogScan::new();
        let mut text = String::new();
        while let Some(g) = generator.next_line(&mut text) {
            scan.push(&LogLine {
                id: g.id,
                rank: g.rank,
                text: text.clone(),
                ..LogLine::default()
            });
        }
        let culprit = generator.summary().culprit_rank.expect("failure injected");
        let got = scan.finish(None).expect("culprit found");
        assert_eq!(got.ranks, vec![culprit]);
        assert_eq!(got.reason, LagReason::BehindEnqueued);
        assert!(
            got.evidence
                .iter()
                .all(|id| generator.summary().fault_lines.contains(id))
        );
    }
}
