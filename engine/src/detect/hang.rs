//! Hang: a communicator whose members wait inside a sequence number that nobody has
//! completed, for longer than a bound learned from that communicator's own waits.
//! The culprit is the member the waiters wait for that is itself waiting for nobody:
//! following "waits for" edges through stalled communicators ends at ranks that are not
//! inside any collective. Checkpoint and evaluation pauses never trip it, because then
//! nobody is inside a collective. A collective can complete on some members and not on
//! others (a ring member stopped halfway through): when the chain ends inside such a
//! collective, the culprit is a stopped process among the members stuck there, else
//! the stuck members are named as suspects. When every member entered and none
//! completed, the wait must pass an iteration as well as the bound before it is a hang:
//! an entry is seen at enqueue, possibly while that rank's GPU still computes. That wait
//! runs from the last member's entry: until then the collective could not complete
//! (the members waited for a laggard, which the culprit rules judge, not a fault inside
//! it: after a checkpoint, ranks come back more than a second apart).

use warden_model::wire::CollOp;
use warden_model::{Evidence, Finding, IncidentKind, Severity, Timestamp};

use super::{Verdict, Window};
use crate::state::CommState;

/// Hang detection settings.
#[derive(Debug, Clone)]
pub struct HangConfig {
    /// Never call a wait shorter than this a hang, seconds.
    pub min_wait_secs: f64,
    /// Bound = this × the longest recent wait in communicators of the same class (same
    /// operation, size and payload), pooled over the job.
    pub wait_factor: f64,
    /// Bound while a kind of collective is young (fewer than `warmup_collectives`
    /// completed per communicator) and the job's iteration time is not known yet, and
    /// the most a young kind's bound may be, seconds.
    pub warmup_secs: f64,
    /// Collectives per communicator completed before the learned bound is trusted.
    pub warmup_collectives: usize,
    /// Collectives per communicator completed before a young kind's bound may come
    /// below `warmup_secs`, from its own waits and the job's iteration time.
    pub prior_collectives: usize,
    /// A young kind's bound is at least this many iterations of the job.
    pub prior_iterations: f64,
    /// Upper limit of the learned bound, seconds.
    pub max_bound_secs: f64,
    /// Ignore a job once this fraction of its ranks has exited (it ended or crashed).
    pub exited_fraction: f64,
    /// A culprit must have been away from collectives this many times longer than it
    /// usually is (a slow rank is late; a hung one never comes back).
    pub culprit_gap_factor: f64,
    /// ... and longer than the waiters were away before they entered, by this fraction
    /// (after a checkpoint everyone was away long, and they come back unevenly).
    pub waiter_gap_slack: f64,
}

impl Default for HangConfig {
    fn default() -> Self {
        HangConfig {
            min_wait_secs: 1.0,
            wait_factor: 2.0,
            warmup_secs: 10.0,
            warmup_collectives: 32,
            prior_collectives: 4,
            prior_iterations: 3.0,
            max_bound_secs: 120.0,
            exited_fraction: 0.25,
            culprit_gap_factor: 2.0,
            waiter_gap_slack: 0.25,
        }
    }
}

/// Collectives of the same operation, size and payload (all TP allreduces of a job, all
/// its DP allreduces, ...) wait alike, so their waits are pooled.
type Class = (i32, usize, u64);

fn class_of(c: &CommState) -> Class {
    (c.op, c.members.len(), c.bytes)
}

/// Longest recent wait and collectives seen per communicator, per class.
fn learned_waits(job: &crate::state::JobState) -> rustc_hash::FxHashMap<Class, (f32, usize)> {
    let mut m: rustc_hash::FxHashMap<Class, (f32, usize, usize)> = Default::default();
    for c in &job.comms {
        let e = m.entry(class_of(c)).or_default();
        e.0 = c.waits.recent(c.waits.len()).fold(e.0, f32::max);
        e.1 += c.max_completed_seq.min(1 << 20) as usize;
        e.2 += 1;
    }
    m.into_iter()
        .map(|(k, (longest, seen, comms))| (k, (longest, seen / comms.max(1))))
        .collect()
}

/// How long a member of a communicator of this class may legitimately wait inside a
/// collective, seconds. `iteration` is the job's iteration time, when known.
///
/// A young kind of collective (fewer than `warmup_collectives` completed) has seen too
/// few waits to trust them alone: its bound is the larger of what they say and
/// `prior_iterations` iterations, never more than `warmup_secs`, so a hang in a job's
/// first steps is called about as fast as a later one. Before `prior_collectives`, or
/// without an iteration time, it is `warmup_secs`. The first waits of a job are its
/// longest (ranks start unevenly), which keeps the young bound on the safe side.
pub fn bound_secs(cfg: &HangConfig, learned: (f32, usize), iteration: Option<f64>) -> f64 {
    let (longest, seen) = learned;
    let waits = f64::from(longest) * cfg.wait_factor;
    if seen >= cfg.warmup_collectives {
        return waits.clamp(cfg.min_wait_secs, cfg.max_bound_secs.max(cfg.min_wait_secs));
    }
    match iteration.filter(|p| p.is_finite() && *p > 0.0) {
        Some(p) if seen >= cfg.prior_collectives => waits
            .max(cfg.prior_iterations * p)
            .clamp(cfg.min_wait_secs, cfg.warmup_secs.max(cfg.min_wait_secs)),
        _ => cfg.warmup_secs,
    }
}

struct Stall<'a> {
    comm: &'a CommState,
    seq: u64,
    waiting: usize,
    oldest: Timestamp,
    /// When the last of the members inside entered: with none missing, the moment the
    /// collective could first have completed.
    all_in: Timestamp,
    missing: Vec<u32>,
    bound: f64,
    /// How long the waiters were away from collectives before entering (median), s.
    waiter_gap: f64,
}

/// Tolerance for comparing times from different agents' (corrected) clocks, seconds.
const CLOCK_SLACK_SECS: f64 = 0.05;

/// Check one job.
pub fn check(cfg: &HangConfig, w: Window<'_>, now: Timestamp) -> Vec<Verdict> {
    let job = w.job;
    let known = job.known_ranks().max(1);
    if job.exited() as f64 / known as f64 >= cfg.exited_fraction {
        return vec![];
    }
    // Both walk the whole job: computed at the first communicator that needs them.
    let mut learned = None;
    let mut job_iteration = None;
    let mut stalls: Vec<Stall<'_>> = Vec::new();
    for c in &job.comms {
        let seq = c.max_started_seq;
        // Without walking the members: a wait runs from the in-flight hint, or, inside
        // one node with some members behind (maybe unconfirmed, below), from the first
        // entry into `seq`. Neither old enough, or `seq` completed where it cannot be
        // unconfirmed: no stall here (the walk below would find none either).
        let maybe_unconfirmed =
            (c.at_max_started as usize) < c.members.len() && job.inside_one_node(c);
        let earliest = if maybe_unconfirmed {
            c.inflight_since.min(c.max_started_first_at)
        } else {
            c.inflight_since
        };
        if seq == 0
            || earliest == Timestamp::MAX
            || now.secs_since(earliest) < cfg.min_wait_secs
            || (!maybe_unconfirmed && seq <= c.max_completed_seq)
        {
            continue;
        }
        let iteration = *job_iteration.get_or_insert_with(|| job.iteration_secs());
        let mut bound = bound_secs(
            cfg,
            learned
                .get_or_insert_with(|| learned_waits(job))
                .get(&class_of(c))
                .copied()
                .unwrap_or_default(),
            iteration,
        );
        // No wait confirmed below starts before `earliest` or ends after now, and an
        // unconfirmed one's bound only grows.
        if now.secs_since(earliest) < bound {
            continue;
        }
        let alive = |r: u32| job.ranks.get(r).is_some_and(|x| x.alive());
        // Inside one node the NCCL plugin's default mask shows the enqueue as the
        // completion (no proxy operations there); a collective that a live member never
        // entered has not completed, whatever the others reported.
        let unconfirmed = seq > 0
            && c.members
                .iter()
                .any(|m| m.last_started_seq < seq && alive(m.rank))
            && job.inside_one_node(c);
        let since = if unconfirmed {
            c.members
                .iter()
                .filter(|m| m.last_started_seq == seq)
                .map(|m| m.last_started_at)
                .min()
                .unwrap_or(Timestamp::MAX)
        } else {
            c.inflight_since
        };
        if since == Timestamp::MAX || now.secs_since(since) < cfg.min_wait_secs {
            continue;
        }
        if seq <= c.max_completed_seq && !unconfirmed {
            continue;
        }
        let mut waiting = 0;
        let mut oldest = Timestamp::MAX;
        let mut all_in = Timestamp::ZERO;
        let mut still_reported = Timestamp::ZERO;
        let mut waiter_gaps: Vec<f64> = Vec::new();
        let mut missing = Vec::new();
        let mut waits_on_dead = false;
        for m in &c.members {
            if !alive(m.rank) {
                // Waiting for a rank that died is the crash detector's business.
                waits_on_dead |= m.last_started_seq < seq;
                continue;
            }
            if m.last_started_seq == seq && (m.last_completed_seq < seq || unconfirmed) {
                // Still inside only if nothing it entered later has completed.
                if job.moved_on_at(m.rank) <= m.last_started_at {
                    waiting += 1;
                    oldest = oldest.min(m.last_started_at);
                    all_in = all_in.max(m.last_started_at);
                    still_reported =
                        still_reported.max(if unconfirmed && m.last_completed_seq >= seq {
                            // Its record says completed (an enqueue standing in for the
                            // completion); its agent has said nothing newer. A record still
                            // in flight is re-sent while the member is inside: confirmed
                            // only as far as that, so a lost completion (a dropped batch)
                            // followed by a pause in which nobody enters anything (a
                            // checkpoint) cannot look like a wait.
                            job.ranks
                                .get(m.rank)
                                .map_or(m.inflight_seen, |r| w.cluster.cut_of(r.node))
                        } else {
                            m.inflight_seen
                        });
                    let before = job.last_progress(m.rank);
                    if before > Timestamp::ZERO {
                        waiter_gaps.push(m.last_started_at.secs_since(before).max(0.0));
                    }
                }
            } else if m.last_started_seq < seq {
                missing.push(m.rank);
            }
        }
        if waiting == 0 || waits_on_dead {
            continue;
        }
        // A member that completed a collective it entered after the wait began is not
        // what anyone waits for: our view of it lost a record (a dropped batch).
        // Nothing is confirmed.
        if missing
            .iter()
            .any(|&r| job.moved_on_at(r) > oldest.plus_secs(CLOCK_SLACK_SECS))
        {
            continue;
        }
        if unconfirmed {
            // Its waits were never seen (enqueues stood in for completions): only the
            // job's iteration time says how late a member may legitimately be.
            bound = match iteration.filter(|p| p.is_finite() && *p > 0.0) {
                Some(p) => bound.max(cfg.prior_iterations * p),
                None => bound.max(cfg.warmup_secs),
            };
        }
        // A wait is only confirmed up to the moment the laggards' agents last reported
        // (a member that arrived after its agent's last batch looks missing until the
        // next one) and the waiters' agents last said they were still inside (when a
        // batch is lost, a completed collective can look in flight forever).
        let laggards: &mut dyn Iterator<Item = u32> = if missing.is_empty() {
            &mut c.members.iter().map(|m| m.rank)
        } else {
            &mut missing.iter().copied()
        };
        let known_until = laggards
            .filter_map(|r| job.ranks.get(r))
            .map(|r| w.cluster.cut_of(r.node))
            .min()
            .unwrap_or(now)
            .min(now)
            .min(still_reported);
        // With every member inside, the collective could not complete before the last
        // one entered: only the wait since then is one inside it.
        let since = if missing.is_empty() { all_in } else { oldest };
        if known_until.secs_since(since) < bound {
            continue;
        }
        let waiter_gap = crate::state::median(&mut waiter_gaps).unwrap_or(0.0);
        stalls.push(Stall {
            comm: c,
            seq,
            waiting,
            oldest,
            all_in,
            missing,
            bound,
            waiter_gap,
        });
    }
    if stalls.is_empty() {
        return vec![];
    }
    let iteration = job_iteration.unwrap_or_else(|| job.iteration_secs());

    // Roots: missing members that are not themselves blocked in some collective, and
    // have been away from collectives far longer than they usually are and than the
    // waiters were before entering.
    let mut culprits: Vec<u32> = stalls
        .iter()
        .flat_map(|s| s.missing.iter().map(move |&r| (s, r)))
        .filter(|&(_, r)| job.blocked_in(r).is_none())
        .filter(|&(s, r)| {
            let away = now.secs_since(job.last_progress(r));
            let usual = job.usual_gap(r).unwrap_or(0.0) * cfg.culprit_gap_factor;
            let theirs = s.waiter_gap * (1.0 + cfg.waiter_gap_slack) + s.bound;
            away >= usual.max(theirs)
        })
        .map(|(_, r)| r)
        .collect();
    culprits.sort_unstable();
    culprits.dedup();
    // A candidate that entered an operation another candidate never entered is held
    // by that one, whatever completion it reported: a collective cannot complete
    // without all its members, and on the NCCL plugin's default mask an operation
    // inside a node shows its enqueue as its completion (no proxy operations there).
    let held: Vec<u32> = culprits
        .iter()
        .copied()
        .filter(|&r| {
            culprits
                .iter()
                .any(|&p| p != r && job.entered_what_peer_never_did(r, p))
        })
        .collect();
    if held.len() < culprits.len() {
        culprits.retain(|r| !held.contains(r));
    }
    let blocked = job
        .ranks
        .iter()
        .filter(|(i, r)| r.alive() && job.blocked_in(*i).is_some())
        .count();

    if culprits.is_empty() && stalls.iter().any(|s| !s.missing.is_empty()) {
        // Those the waiters wait for may be stuck inside an earlier collective that
        // completed on other members.
        if let Some(v) = partial(w, &stalls) {
            return vec![v];
        }
        // Or the chain ends inside a collective that every member entered and none
        // completed (a pipeline stage all-reducing with a stopped peer, while the other
        // stage waits on a receive from it): that stall is the hang, judged below.
        // Otherwise someone is late but not (yet) away long enough to be called hung.
        let held_in: Vec<(u32, u64)> = stalls
            .iter()
            .flat_map(|s| &s.missing)
            .filter_map(|&r| job.blocked_in(r))
            .collect();
        stalls.retain(|s| {
            s.missing.is_empty()
                && held_in
                    .iter()
                    .any(|&(ci, seq)| seq == s.seq && std::ptr::eq(s.comm, &job.comms[ci as usize]))
        });
        if stalls.is_empty() {
            return vec![];
        }
    }
    if culprits.is_empty() {
        // Everyone entered, nobody finished: the fault is inside the collective (a GPU
        // or a link). Name the communicator's nodes as suspects, with low confidence.
        let Some(s) = stalls.iter().min_by_key(|s| s.oldest) else {
            return vec![];
        };
        let ranks: Vec<u32> = s.comm.members.iter().map(|m| m.rank).collect();
        let op = CollOp::from_wire(s.comm.op_of(s.seq)).as_str();
        // ... unless a member's process is stopped (SIGSTOP, a debugger): it stopped
        // inside the collective and holds everyone else there.
        let mut stopped: Vec<(u32, Timestamp)> = ranks
            .iter()
            .filter_map(|&r| {
                let rank = job.ranks.get(r)?;
                rank.stopped_since.filter(|_| rank.alive()).map(|t| (r, t))
            })
            .collect();
        stopped.sort_unstable();
        if !stopped.is_empty() {
            let others = match s.waiting.saturating_sub(stopped.len()) {
                0 => "its own records of it end there".to_owned(),
                1 => "the other member waits in it".to_owned(),
                n => format!("the other {n} members wait in it"),
            };
            let what = format!("inside {op} seq {} of {}; {others}", s.seq, s.comm.label());
            return vec![held_by_stopped(w, &stopped, s.oldest, &what)];
        }
        // Capture paths see an operation entered when the host enqueues it, which can
        // be while that rank's GPU still computes the step: a rank that began computing
        // slower (a straggler's first slow step) holds an entered collective for up to
        // an iteration more than any wait seen before, and then completes it. Without
        // a stopped member, only a wait past both the bound and an iteration is a hang,
        // counted from the last member's entry (before it, the collective could not
        // complete: the members waited for a laggard, such as a rank back late from a
        // checkpoint).
        let Some(s) = stalls
            .iter()
            .filter(|s| now.secs_since(s.all_in) >= s.bound.max(iteration.unwrap_or(0.0)))
            .min_by_key(|s| s.oldest)
        else {
            return vec![];
        };
        let ranks: Vec<u32> = s.comm.members.iter().map(|m| m.rank).collect();
        let op = CollOp::from_wire(s.comm.op_of(s.seq)).as_str();
        let (nodes, _) = w.places(&ranks);
        return vec![Verdict::Finding(Finding {
            kind: IncidentKind::Hang,
            job: Some(job.name.clone()),
            ranks: vec![],
            nodes,
            gpus: vec![],
            onset: s.oldest,
            confidence: 0.3,
            severity: Severity::Critical,
            summary: format!(
                "all {} members of {} entered {op} seq {} and none completed it for {:.1} s \
                 after the last of them entered; suspect the GPUs or links they share",
                s.waiting,
                s.comm.label(),
                s.seq,
                now.secs_since(s.all_in)
            ),
            evidence: vec![],
        })];
    }

    // The stall a culprit is directly missing from, for the summary.
    let direct = stalls
        .iter()
        .filter(|s| s.missing.iter().any(|r| culprits.contains(r)))
        .min_by_key(|s| s.oldest);
    let Some(direct) = direct else { return vec![] };
    // What the culprit never entered: the waiters' operation, or, on a point-to-point
    // communicator, its other half (a receiver waits for a send).
    let op = match CollOp::from_wire(direct.comm.op_of(direct.seq)) {
        CollOp::Recv => CollOp::Send,
        CollOp::Send => CollOp::Recv,
        op => op,
    }
    .as_str();
    let onset = culprits
        .iter()
        .filter_map(|&r| {
            let rank = job.ranks.get(r)?;
            rank.comms
                .iter()
                .map(|&(ci, s)| job.comms[ci as usize].members[s as usize].last_completed_at)
                .max()
        })
        .min()
        .filter(|t| *t > Timestamp::ZERO)
        .unwrap_or(direct.oldest);
    let who = if culprits.len() == 1 {
        format!("rank {}", culprits[0])
    } else {
        format!("ranks {}", list(&culprits))
    };
    let summary = format!(
        "{who} never entered {op} seq {} of {}; {blocked} ranks waiting",
        direct.seq,
        direct.comm.label()
    );
    let mut evidence = Vec::new();
    for &r in culprits.iter().take(4) {
        let rank = &job.ranks[r];
        let last = rank
            .comms
            .iter()
            .map(|&(ci, s)| {
                (
                    &job.comms[ci as usize],
                    &job.comms[ci as usize].members[s as usize],
                )
            })
            .max_by_key(|(_, m)| m.last_completed_at);
        if let Some((c, m)) = last {
            evidence.push(Evidence {
                at: m.last_completed_at,
                text: format!(
                    "{} last completed seq {} of {} and has been outside any collective for {:.1} s",
                    w.describe_rank(r),
                    m.last_completed_seq,
                    c.label(),
                    now.secs_since(m.last_completed_at)
                ),
            });
        }
    }
    for s in stalls.iter().take(3) {
        evidence.push(Evidence {
            at: s.oldest,
            text: format!(
                "{} of {} members of {} wait in seq {} for {:.1} s (bound {:.1} s learned from recent waits of its kind)",
                s.waiting,
                s.comm.members.len(),
                s.comm.label(),
                s.seq,
                now.secs_since(s.oldest),
                s.bound
            ),
        });
    }
    let (nodes, gpus) = w.places(&culprits);
    let confidence = if culprits.len() == 1 {
        0.97
    } else {
        (0.9 / culprits.len() as f64).max(0.3)
    };
    vec![Verdict::Finding(Finding {
        kind: IncidentKind::Hang,
        job: Some(job.name.clone()),
        ranks: culprits,
        nodes,
        gpus,
        onset,
        confidence,
        severity: Severity::Critical,
        summary,
        evidence,
    })]
}

/// A hang held by stopped processes (SIGSTOP, a debugger), `(rank, stopped since)`:
/// they are its culprits. `what` says where they stopped.
fn held_by_stopped(
    w: Window<'_>,
    stopped: &[(u32, Timestamp)],
    onset: Timestamp,
    what: &str,
) -> Verdict {
    let culprits: Vec<u32> = stopped.iter().map(|&(r, _)| r).collect();
    let (nodes, _) = w.places(&culprits);
    let who = if culprits.len() == 1 {
        w.describe_rank(culprits[0])
    } else {
        format!("ranks {}", list(&culprits))
    };
    let since = stopped.iter().map(|&(_, t)| t).min().unwrap_or(onset);
    Verdict::Finding(Finding {
        kind: IncidentKind::Hang,
        job: Some(w.job.name.clone()),
        ranks: culprits,
        nodes,
        gpus: vec![],
        onset: onset.min(since),
        confidence: 0.95,
        severity: Severity::Critical,
        summary: format!("{who} is stopped (SIGSTOP or a debugger) {what}"),
        evidence: vec![Evidence {
            at: since,
            text: format!("{who}: process state stopped, reported by its node's agent"),
        }],
    })
}

/// Every member the stalls miss is blocked, and some inside a collective that
/// completed on other members of its communicator (a ring member that stopped halfway
/// through holds the members downstream of it there, while those upstream finish and
/// move on to wait in the next one). The hang is inside that collective: its culprit
/// is a stopped process among the members stuck there, else one of them.
fn partial(w: Window<'_>, stalls: &[Stall<'_>]) -> Option<Verdict> {
    let job = w.job;
    let mut inside = None;
    for &r in stalls.iter().flat_map(|s| &s.missing) {
        // A missing member that is not blocked anywhere is merely late.
        let (ci, seq) = job.blocked_in(r)?;
        if seq == job.comms[ci as usize].max_completed_seq {
            inside = Some(inside.map_or((seq, ci), |first: (u64, u32)| first.min((seq, ci))));
        }
    }
    let (seq, ci) = inside?;
    let c = &job.comms[ci as usize];
    let alive = |r: u32| job.ranks.get(r).is_some_and(|x| x.alive());
    let stuck: Vec<&crate::state::Member> = c
        .members
        .iter()
        .filter(|m| alive(m.rank) && c.partially_completed(m))
        .collect();
    let done = c
        .members
        .iter()
        .filter(|m| m.last_completed_seq >= seq)
        .count();
    let onset = stuck
        .iter()
        .map(|m| m.last_started_at)
        .min()
        .unwrap_or(c.max_completed_at);
    let op = CollOp::from_wire(c.op_of(seq)).as_str();
    let mut stopped: Vec<(u32, Timestamp)> = stuck
        .iter()
        .filter_map(|m| Some((m.rank, job.ranks.get(m.rank)?.stopped_since?)))
        .collect();
    stopped.sort_unstable();
    if !stopped.is_empty() {
        let what = format!(
            "inside {op} seq {seq} of {}, which {done} members completed; {} members are \
             stuck in it and the others wait for them",
            c.label(),
            stuck.len()
        );
        return Some(held_by_stopped(w, &stopped, onset, &what));
    }
    let mut ranks: Vec<u32> = stuck.iter().map(|m| m.rank).collect();
    ranks.sort_unstable();
    let (nodes, gpus) = w.places(&ranks);
    let evidence = stuck
        .iter()
        .take(4)
        .map(|m| Evidence {
            at: m.last_started_at,
            text: format!(
                "{} entered seq {seq} of {} and its agent still reports it inside",
                w.describe_rank(m.rank),
                c.label()
            ),
        })
        .chain(std::iter::once(Evidence {
            at: c.max_completed_at,
            text: format!("{done} of {} members completed seq {seq}", c.members.len()),
        }))
        .collect();
    Some(Verdict::Finding(Finding {
        kind: IncidentKind::Hang,
        job: Some(job.name.clone()),
        summary: format!(
            "ranks {} entered {op} seq {seq} of {} and never completed it, which {done} \
             other members did: the fault is among them or their links",
            list(&ranks),
            c.label()
        ),
        confidence: (0.9 / ranks.len().max(1) as f64).max(0.3),
        ranks,
        nodes,
        gpus,
        onset,
        severity: Severity::Critical,
        evidence,
    }))
}

/// "1, 2, 3" (at most 8, then "and N more").
pub fn list(v: &[u32]) -> String {
    let mut s: Vec<String> = v.iter().take(8).map(u32::to_string).collect();
    if v.len() > 8 {
        s.push(format!("and {} more", v.len() - 8));
    }
    s.join(", ")
}
