//! Grades the controller's incidents against the injected faults: a match needs the
//! right kind and the exact culprit, detected no earlier than the fault; from the
//! matches come precision, recall and per-kind detection latency, checked against
//! Warden's targets.

use std::fmt;

use serde::Serialize;
use warden_model::IncidentKind;
use warden_model::view::IncidentView;

use crate::report::Report;
use crate::sim::FaultRecord;

/// Least acceptable precision (matched incidents / incidents).
pub const MIN_PRECISION: f64 = 0.98;
/// Least acceptable recall (matched faults / faults).
pub const MIN_RECALL: f64 = 0.97;
/// How much earlier than the fault's onset an incident may say it was detected and
/// still match (clock skew, rounding).
pub const EARLY_TOLERANCE_S: f64 = 1.0;

/// A latency budget: seconds or steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Budget {
    /// Wall of virtual seconds.
    Secs(f64),
    /// Training steps.
    Steps(f64),
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Secs(s) => write!(f, "{s} s"),
            Budget::Steps(s) => write!(f, "{s} steps"),
        }
    }
}

/// The latency class a fault is graded in, with its budget.
fn class_of(f: &FaultRecord, iteration_secs: f64) -> (&'static str, Budget) {
    match f.kind.as_str() {
        "hang" => {
            if iteration_secs <= 2.0 {
                ("hang", Budget::Secs(5.0))
            } else {
                ("hang (long iterations)", Budget::Steps(3.0))
            }
        }
        "crash" => ("crash", Budget::Secs(3.0)),
        "nan" => ("nan", Budget::Steps(1.0)),
        "xid" => ("gpu_fault", Budget::Secs(2.0)),
        "straggler" if f.slowdown.unwrap_or(1.3) >= 1.25 => {
            ("straggler >=1.25x", Budget::Steps(5.0))
        }
        "straggler" => ("straggler <1.25x", Budget::Steps(20.0)),
        "slow_link" => ("slow_link", Budget::Steps(10.0)),
        _ => ("other", Budget::Secs(f64::INFINITY)),
    }
}

/// The incident kind that answers a scenario fault kind.
pub fn incident_kind_for(fault_kind: &str) -> Option<IncidentKind> {
    Some(match fault_kind {
        "hang" => IncidentKind::Hang,
        "crash" => IncidentKind::Crash,
        "straggler" => IncidentKind::Straggler,
        "slow_link" => IncidentKind::SlowLink,
        "nan" => IncidentKind::Nan,
        "xid" => IncidentKind::GpuFault,
        _ => return None,
    })
}

/// Whether `inc` names exactly the culprit of `f`, with the right kind and not too early.
pub fn matches(f: &FaultRecord, inc: &IncidentView) -> bool {
    if incident_kind_for(&f.kind) != Some(inc.kind)
        || inc.detected_s < f.onset_s - EARLY_TOLERANCE_S
    {
        return false;
    }
    if let Some(c) = &f.culprits {
        return inc.ranks == *c && (!c.is_empty() || inc.job.is_some());
    }
    match f.kind.as_str() {
        "hang" | "crash" | "nan" => f.rank.is_some_and(|r| inc.ranks == [r]),
        "straggler" | "slow_link" => inc.nodes == [f.node.clone()],
        "xid" => {
            inc.nodes == [f.node.clone()]
                && inc.gpus.len() == 1
                && inc.gpus[0].node == f.node
                && Some(inc.gpus[0].index) == f.gpu
        }
        _ => false,
    }
}

/// Position of time `t` on the step axis (fractional steps since the first step).
fn step_position(t: f64, ends: &[f64], iteration_secs: f64) -> f64 {
    let iter = iteration_secs.max(1e-9);
    let Some(&first) = ends.first() else {
        return t / iter;
    };
    let i = ends.partition_point(|&e| e <= t);
    let prev = if i == 0 { first - iter } else { ends[i - 1] };
    let next = ends.get(i).copied().unwrap_or(prev + iter);
    i as f64 + (t - prev) / (next - prev).max(1e-9)
}

/// One matched fault's detection latency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// Scenario.
    pub scenario: String,
    /// Seconds from onset (from the last progress, for a hang) to detection.
    pub secs: f64,
    /// The same in training steps.
    pub steps: f64,
    /// Latency over budget (1.0 = exactly at the budget).
    pub ratio: f64,
}

/// Latency statistics of one class of faults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassStats {
    /// Class label (incident kind, split where budgets differ).
    pub class: String,
    /// Budget the class's p90 must meet.
    pub budget: Budget,
    /// Faults in the class.
    pub faults: usize,
    /// Faults matched by an incident.
    pub matched: usize,
    /// Latency of each match.
    pub latencies: Vec<Latency>,
}

fn percentile(xs: &[f64], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let idx = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[idx])
}

impl ClassStats {
    /// Percentile `q` (0..=1) of the latencies in seconds.
    pub fn secs(&self, q: f64) -> Option<f64> {
        percentile(
            &self.latencies.iter().map(|l| l.secs).collect::<Vec<_>>(),
            q,
        )
    }

    /// Percentile `q` of the latencies in steps.
    pub fn steps(&self, q: f64) -> Option<f64> {
        percentile(
            &self.latencies.iter().map(|l| l.steps).collect::<Vec<_>>(),
            q,
        )
    }

    /// Percentile `q` of latency over budget.
    pub fn ratio(&self, q: f64) -> Option<f64> {
        percentile(
            &self.latencies.iter().map(|l| l.ratio).collect::<Vec<_>>(),
            q,
        )
    }
}

/// The grade of a set of runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scorecard {
    /// Runs graded.
    pub scenarios: usize,
    /// Faults injected (that took effect).
    pub faults: usize,
    /// Incidents opened.
    pub incidents: usize,
    /// Faults matched by an incident (= incidents matching a fault).
    pub matched: usize,
    /// Matched incidents / incidents (1.0 when there are none).
    pub precision: f64,
    /// Matched faults / faults (1.0 when there are none).
    pub recall: f64,
    /// Latency by class.
    pub classes: Vec<ClassStats>,
    /// Faults no incident matched, described.
    pub missed: Vec<String>,
    /// Incidents that match no fault, described.
    pub false_positives: Vec<String>,
    /// Scenarios without faults in which incidents were opened, with their count.
    pub noisy_clean_runs: Vec<(String, usize)>,
}

fn describe_fault(scenario: &str, f: &FaultRecord) -> String {
    let who = match f.kind.as_str() {
        "hang" | "crash" | "nan" => format!("rank {}", f.rank.unwrap_or(0)),
        "xid" => format!(
            "{} gpu {} (xid {})",
            f.node,
            f.gpu.unwrap_or(0),
            f.code.unwrap_or(0)
        ),
        _ => format!("{} ({}x)", f.node, f.slowdown.unwrap_or(1.0)),
    };
    format!(
        "{scenario}: {} {who} at {:.1} s (step {})",
        f.kind, f.onset_s, f.step
    )
}

fn describe_incident(scenario: &str, i: &IncidentView) -> String {
    format!(
        "{scenario}: {} ranks {:?} nodes {:?} gpus {:?} detected at {:.1} s: {}",
        i.kind,
        i.ranks,
        i.nodes,
        i.gpus
            .iter()
            .map(|g| format!("{}/{}", g.node, g.index))
            .collect::<Vec<_>>(),
        i.detected_s,
        i.summary
    )
}

/// Grade `reports`: match incidents to faults, then measure.
pub fn score(reports: &[Report]) -> Scorecard {
    let mut card = Scorecard {
        scenarios: reports.len(),
        faults: 0,
        incidents: 0,
        matched: 0,
        precision: 1.0,
        recall: 1.0,
        classes: vec![],
        missed: vec![],
        false_positives: vec![],
        noisy_clean_runs: vec![],
    };
    for rep in reports {
        card.faults += rep.faults.iter().filter(|f| f.visible).count();
        card.incidents += rep.incidents.len();
        if rep.faults.is_empty() && !rep.incidents.is_empty() {
            card.noisy_clean_runs
                .push((rep.scenario.clone(), rep.incidents.len()));
        }
        let mut used = vec![false; rep.incidents.len()];
        let mut order: Vec<usize> = (0..rep.faults.len()).collect();
        order.sort_by(|&a, &b| rep.faults[a].onset_s.total_cmp(&rep.faults[b].onset_s));
        for fi in order {
            let f = &rep.faults[fi];
            if !f.visible {
                // Not counted; an incident that names it rightly is no false positive.
                if let Some(i) =
                    (0..rep.incidents.len()).find(|&i| !used[i] && matches(f, &rep.incidents[i]))
                {
                    used[i] = true;
                    card.incidents -= 1;
                }
                continue;
            }
            let (class, budget) = class_of(f, rep.iteration_secs);
            let idx = match card
                .classes
                .iter()
                .position(|c| c.class == class && c.budget == budget)
            {
                Some(i) => i,
                None => {
                    card.classes.push(ClassStats {
                        class: class.to_owned(),
                        budget,
                        faults: 0,
                        matched: 0,
                        latencies: vec![],
                    });
                    card.classes.len() - 1
                }
            };
            card.classes[idx].faults += 1;
            let best = rep
                .incidents
                .iter()
                .enumerate()
                .filter(|(i, inc)| !used[*i] && matches(f, inc))
                .min_by(|a, b| a.1.detected_s.total_cmp(&b.1.detected_s));
            let Some((ii, inc)) = best else {
                card.missed.push(describe_fault(&rep.scenario, f));
                continue;
            };
            used[ii] = true;
            card.matched += 1;
            let from = if f.kind == "hang" {
                f.last_progress_s.unwrap_or(f.onset_s)
            } else {
                f.onset_s
            };
            let secs = inc.detected_s - from;
            let steps = step_position(inc.detected_s, &rep.step_ends_s, rep.iteration_secs)
                - step_position(from, &rep.step_ends_s, rep.iteration_secs);
            let steps_as_secs = secs / rep.iteration_secs.max(1e-9);
            let ratio = match budget {
                Budget::Secs(b) => secs / b,
                // A hang makes no more steps: count its budget in iterations.
                Budget::Steps(b) if f.kind == "hang" => steps_as_secs / b,
                Budget::Steps(b) => steps / b,
            };
            let c = &mut card.classes[idx];
            c.matched += 1;
            c.latencies.push(Latency {
                scenario: rep.scenario.clone(),
                secs,
                steps,
                ratio,
            });
        }
        for (i, inc) in rep.incidents.iter().enumerate() {
            if !used[i] {
                card.false_positives
                    .push(describe_incident(&rep.scenario, inc));
            }
        }
    }
    if card.incidents > 0 {
        card.precision = card.matched as f64 / card.incidents as f64;
    }
    if card.faults > 0 {
        card.recall = card.matched as f64 / card.faults as f64;
    }
    card.classes.sort_by(|a, b| a.class.cmp(&b.class));
    card
}

impl Scorecard {
    /// Every unmet target, in words; empty when the controller meets them all.
    pub fn failures(&self) -> Vec<String> {
        let mut out = vec![];
        if self.precision < MIN_PRECISION {
            out.push(format!(
                "precision {:.3} < {MIN_PRECISION} ({} of {} incidents match a fault)",
                self.precision, self.matched, self.incidents
            ));
        }
        if self.recall < MIN_RECALL {
            out.push(format!(
                "recall {:.3} < {MIN_RECALL} ({} of {} faults found)",
                self.recall, self.matched, self.faults
            ));
        }
        for (s, n) in &self.noisy_clean_runs {
            out.push(format!("{s}: {n} incident(s) in a scenario without faults"));
        }
        for c in &self.classes {
            if let Some(r) = c.ratio(0.9).filter(|r| *r > 1.0) {
                out.push(format!(
                    "{}: p90 latency {:.2} s / {:.2} steps is {:.1}x the target of {}",
                    c.class,
                    c.secs(0.9).unwrap_or(f64::NAN),
                    c.steps(0.9).unwrap_or(f64::NAN),
                    r,
                    c.budget
                ));
            }
        }
        out.extend(self.missed.iter().map(|m| format!("missed: {m}")));
        out.extend(
            self.false_positives
                .iter()
                .map(|m| format!("false positive: {m}")),
        );
        out
    }
}

impl fmt::Display for Scorecard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} runs, {} faults, {} incidents, {} matched: precision {:.3}, recall {:.3}",
            self.scenarios, self.faults, self.incidents, self.matched, self.precision, self.recall
        )?;
        writeln!(
            f,
            "{:<22} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10}",
            "class", "faults", "found", "p50 s", "p90 s", "p50 step", "p90 step", "target"
        )?;
        let opt = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.2}"));
        for c in &self.classes {
            writeln!(
                f,
                "{:<22} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10}",
                c.class,
                c.faults,
                c.matched,
                opt(c.secs(0.5)),
                opt(c.secs(0.9)),
                opt(c.steps(0.5)),
                opt(c.steps(0.9)),
                c.budget.to_string()
            )?;
        }
        for (s, n) in &self.noisy_clean_runs {
            writeln!(f, "clean run with incidents: {s} ({n})")?;
        }
        for m in &self.missed {
            writeln!(f, "missed: {m}")?;
        }
        for m in &self.false_positives {
            writeln!(f, "false positive: {m}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use warden_model::{GpuRef, IncidentState, Severity};

    use super::*;

    fn fault(
        kind: &str,
        rank: Option<u32>,
        node: &str,
        gpu: Option<u32>,
        onset: f64,
    ) -> FaultRecord {
        FaultRecord {
            kind: kind.into(),
            rank,
            node: node.into(),
            gpu,
            code: (kind == "xid").then_some(79),
            slowdown: matches!(kind, "straggler" | "slow_link").then_some(if kind == "straggler" {
                1.3
            } else {
                2.0
            }),
            step: 50,
            until_step: None,
            onset_s: onset,
            last_progress_s: matches!(kind, "hang" | "crash").then_some(onset + 0.5),
            culprits: None,
            visible: true,
        }
    }

    fn incident(
        kind: IncidentKind,
        ranks: Vec<u32>,
        nodes: Vec<&str>,
        gpus: Vec<(&str, u32)>,
        detected: f64,
    ) -> IncidentView {
        IncidentView {
            id: format!("inc-{kind}-{detected}"),
            kind,
            job: Some("job".into()),
            state: IncidentState::Open,
            acknowledged: false,
            severity: Severity::Critical,
            ranks,
            nodes: nodes.into_iter().map(String::from).collect(),
            gpus: gpus
                .into_iter()
                .map(|(n, i)| GpuRef {
                    node: n.into(),
                    index: i,
                })
                .collect(),
            onset_s: detected - 1.0,
            detected_s: detected,
            resolved_s: None,
            confidence: 0.9,
            summary: "s".into(),
            evidence: vec![],
            timeline: vec![],
            diagnosis: None,
        }
    }

    fn report(name: &str, faults: Vec<FaultRecord>, incidents: Vec<IncidentView>) -> Report {
        Report {
            scenario: name.into(),
            ranks: 64,
            sim_seconds: 200.0,
            wall_seconds: 1.0,
            iteration_secs: 1.0,
            steps: 150,
            batches: 0,
            collective_events: 0,
            faults,
            incidents,
            step_ends_s: (1..=150).map(|i| f64::from(i) + 1.0).collect(),
        }
    }

    /// One report per kind, each detected well within its target.
    fn perfect() -> Vec<Report> {
        vec![
            report(
                "hang",
                vec![fault("hang", Some(12), "node-01", Some(4), 100.2)],
                vec![incident(
                    IncidentKind::Hang,
                    vec![12],
                    vec!["node-01"],
                    vec![],
                    103.0,
                )],
            ),
            report(
                "crash",
                vec![fault("crash", Some(3), "node-00", Some(3), 80.5)],
                vec![incident(
                    IncidentKind::Crash,
                    vec![3],
                    vec!["node-00"],
                    vec![],
                    81.0,
                )],
            ),
            report(
                "nan",
                vec![fault("nan", Some(7), "node-00", Some(7), 60.0)],
                vec![incident(IncidentKind::Nan, vec![7], vec![], vec![], 60.3)],
            ),
            report(
                "xid",
                vec![fault("xid", Some(9), "node-01", Some(1), 70.1)],
                vec![incident(
                    IncidentKind::GpuFault,
                    vec![9],
                    vec!["node-01"],
                    vec![("node-01", 1)],
                    70.6,
                )],
            ),
            report(
                "straggler",
                vec![fault("straggler", None, "node-02", None, 52.0)],
                vec![incident(
                    IncidentKind::Straggler,
                    vec![16, 17],
                    vec!["node-02"],
                    vec![],
                    55.5,
                )],
            ),
            report(
                "slow",
                vec![fault("slow_link", None, "node-03", None, 52.0)],
                vec![incident(
                    IncidentKind::SlowLink,
                    vec![],
                    vec!["node-03"],
                    vec![],
                    58.0,
                )],
            ),
            report("clean", vec![], vec![]),
        ]
    }

    fn assert_fails(reports: Vec<Report>, needle: &str) {
        let card = score(&reports);
        let f = card.failures();
        assert!(!f.is_empty(), "expected failures for {needle}\n{card}");
        assert!(
            f.iter().any(|l| l.contains(needle)),
            "no failure mentions {needle:?}: {f:#?}"
        );
    }

    #[test]
    fn perfect_detection_has_no_failures() {
        let card = score(&perfect());
        assert_eq!(card.failures(), Vec::<String>::new(), "{card}");
        assert_eq!((card.precision, card.recall), (1.0, 1.0));
        assert_eq!(card.matched, 6);
    }

    #[test]
    fn wrong_culprit_rank_fails() {
        let mut r = perfect();
        r[0].incidents[0].ranks = vec![13];
        assert_fails(r, "recall");
    }

    #[test]
    fn wrong_node_fails() {
        let mut r = perfect();
        r[4].incidents[0].nodes = vec!["node-03".into()];
        assert_fails(r, "precision");
        let mut r = perfect();
        r[3].incidents[0].gpus[0].index = 2;
        assert_fails(r, "missed: xid");
    }

    #[test]
    fn wrong_kind_fails() {
        let mut r = perfect();
        r[1].incidents[0].kind = IncidentKind::Hang;
        assert_fails(r, "missed: crash");
    }

    #[test]
    fn extra_incident_fails() {
        let mut r = perfect();
        r[6].incidents.push(incident(
            IncidentKind::Straggler,
            vec![1],
            vec!["node-00"],
            vec![],
            30.0,
        ));
        assert_fails(r, "without faults");
        let mut r = perfect();
        r[0].incidents.push(incident(
            IncidentKind::Crash,
            vec![12],
            vec!["node-01"],
            vec![],
            104.0,
        ));
        assert_fails(r, "false positive");
    }

    #[test]
    fn missing_incident_fails() {
        let mut r = perfect();
        r[2].incidents.clear();
        assert_fails(r, "missed: nan");
    }

    #[test]
    fn detection_before_the_fault_fails() {
        let mut r = perfect();
        r[0].incidents[0].detected_s = 50.0;
        assert_fails(r, "missed: hang");
    }

    #[test]
    fn late_detection_fails() {
        let mut r = perfect();
        r[2].incidents[0].detected_s = 63.5; // three steps after the NaN
        assert_fails(r, "nan: p90 latency");
        let mut r = perfect();
        r[0].incidents[0].detected_s = 100.7 + 6.0; // 6 s after the last progress
        assert_fails(r, "hang: p90 latency");
        let mut r = perfect();
        r[4].incidents[0].detected_s = 52.0 + 8.0;
        assert_fails(r, "straggler >=1.25x");
    }

    #[test]
    fn one_incident_matches_one_fault_only() {
        let mut r = perfect();
        let f = r[0].faults[0].clone();
        r[0].faults.push(f);
        assert_fails(r, "missed: hang");
    }

    #[test]
    fn step_positions_follow_step_ends() {
        let ends = [2.0, 3.0, 4.0, 30.0, 31.0];
        assert!((step_position(3.5, &ends, 1.0) - 2.5).abs() < 1e-9);
        assert!((step_position(17.0, &ends, 1.0) - 3.5).abs() < 1e-9);
        assert!((step_position(33.0, &ends, 1.0) - 7.0).abs() < 1e-9);
        assert!((step_position(1.5, &ends, 1.0) - 0.5).abs() < 1e-9);
    }
}
