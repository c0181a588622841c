//! Plain-words rendering of incidents and summaries for the terminal.

use std::fmt::Write as _;

use warden_controller::Change;
use warden_controller::view::IncidentView;

/// `[0, 1, 2, 3, 7]` as `0-3, 7`.
pub fn ranges(v: &[u32]) -> String {
    let mut sorted = v.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = vec![];
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if end == start {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(", ")
}

/// Longest list of names shown in one line before the rest is counted.
const MAX_LISTED: usize = 6;

/// `a, b, c` or, for long lists, `a, b, c, ... and 7 more`.
fn capped(items: &[String]) -> String {
    if items.len() <= MAX_LISTED {
        return items.join(", ");
    }
    let shown = MAX_LISTED - 1;
    format!(
        "{} and {} more",
        items[..shown].join(", "),
        items.len() - shown
    )
}

/// Everything an incident blames, in one line: ranks, nodes and GPUs.
pub fn culprit(inc: &IncidentView) -> String {
    let mut parts = vec![];
    if !inc.ranks.is_empty() {
        let word = if inc.ranks.len() == 1 {
            "rank"
        } else {
            "ranks"
        };
        parts.push(format!("{word} {}", ranges(&inc.ranks)));
    }
    if !inc.nodes.is_empty() {
        let word = if inc.nodes.len() == 1 {
            "node"
        } else {
            "nodes"
        };
        parts.push(format!("{word} {}", capped(&inc.nodes)));
    }
    if !inc.gpus.is_empty() {
        let gpus: Vec<_> = inc.gpus.iter().map(ToString::to_string).collect();
        let word = if gpus.len() == 1 { "GPU" } else { "GPUs" };
        parts.push(format!("{word} {}", capped(&gpus)));
    }
    if parts.is_empty() {
        "(not localised)".to_owned()
    } else {
        parts.join("; ")
    }
}

/// The verb for a change.
pub fn verb(change: Change) -> &'static str {
    match change {
        Change::Opened => "OPENED",
        Change::Updated => "UPDATED",
        Change::Reclassified => "RECLASSIFIED",
        Change::Resolved => "RESOLVED",
        Change::Diagnosed => "DIAGNOSED",
        Change::Acknowledged => "ACKNOWLEDGED",
    }
}

/// A multi-line description of an incident change, ending in a newline.
pub fn incident(change: Change, inc: &IncidentView) -> String {
    if change == Change::Diagnosed {
        return diagnosis(inc);
    }
    let at = match change {
        Change::Opened => inc.detected_s,
        Change::Resolved => inc.resolved_s.unwrap_or(inc.detected_s),
        Change::Updated | Change::Reclassified | Change::Diagnosed | Change::Acknowledged => {
            inc.timeline.last().map_or(inc.detected_s, |t| t.at_s)
        }
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "[{at:>7.1}s] {} {} {} — {}",
        verb(change),
        inc.kind,
        inc.id,
        culprit(inc)
    );
    let timing = if inc.onset_s >= 0.0 && inc.onset_s <= inc.detected_s {
        format!(
            "onset {:.1}s, detected {:.1}s ({:.1}s later)",
            inc.onset_s,
            inc.detected_s,
            inc.detected_s - inc.onset_s
        )
    } else {
        format!("detected {:.1}s", inc.detected_s)
    };
    let _ = writeln!(
        s,
        "           confidence {:.0}%, {timing}",
        inc.confidence * 100.0
    );
    let _ = writeln!(s, "           {}", inc.summary);
    for e in inc.evidence.iter().take(3) {
        let _ = writeln!(s, "             · [{:.1}s] {}", e.at_s, e.text);
    }
    s
}

/// The diagnosis of an incident in a few lines, ending in a newline.
fn diagnosis(inc: &IncidentView) -> String {
    let mut s = String::new();
    let at = inc.timeline.last().map_or(inc.detected_s, |t| t.at_s);
    let Some(d) = &inc.diagnosis else {
        return s;
    };
    let what = match (&d.category, &d.fault_locus) {
        (Some(c), Some(l)) => format!("{c} ({l})"),
        (Some(c), None) => c.clone(),
        _ => "no known failure in the logs".to_owned(),
    };
    let _ = writeln!(
        s,
        "[{at:>7.1}s] {} {} {} — {what}, confidence {:.0}% ({})",
        verb(Change::Diagnosed),
        inc.kind,
        inc.id,
        d.confidence * 100.0,
        d.source
    );
    if !d.culprit.is_empty() {
        let _ = writeln!(s, "           culprit in the logs: {}", d.culprit);
    }
    for e in d.evidence.iter().take(2) {
        let _ = writeln!(s, "             · [line {}] {}", e.id, e.text);
    }
    s
}

/// A table of incidents, one line each, ending in a newline.
pub fn table(incidents: &[IncidentView]) -> String {
    let mut s = String::new();
    if incidents.is_empty() {
        s.push_str("  (no incidents)\n");
        return s;
    }
    let _ = writeln!(
        s,
        "  {:<10} {:<24} {:<9} {:>10} {:>6}  culprit",
        "kind", "id", "state", "detected_s", "conf"
    );
    for i in incidents {
        let _ = writeln!(
            s,
            "  {:<10} {:<24} {:<9} {:>10.1} {:>5.0}%  {}",
            i.kind.as_str(),
            i.id,
            i.state.as_str(),
            i.detected_s,
            i.confidence * 100.0,
            culprit(i)
        );
    }
    s
}

/// What an injected fault hits, in one line.
pub fn fault_target(f: &warden_sim::FaultRecord) -> String {
    let mut parts = vec![];
    if let Some(r) = f.rank {
        parts.push(format!("rank {r}"));
    }
    if !f.node.is_empty() {
        parts.push(f.node.clone());
    }
    if let Some(g) = f.gpu {
        parts.push(format!("gpu {g}"));
    }
    if let Some(c) = f.code {
        parts.push(format!("xid {c}"));
    }
    if let Some(s) = f.slowdown {
        parts.push(format!("{s}x"));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_fold_runs_and_keep_singletons() {
        assert_eq!(ranges(&[7, 0, 1, 2, 3, 9, 10]), "0-3, 7, 9-10");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[2, 2, 3]), "2-3");
    }

    #[test]
    fn long_name_lists_are_counted_not_listed() {
        let names: Vec<String> = (0..9).map(|i| format!("node-{i:02}")).collect();
        let s = capped(&names);
        assert!(s.starts_with("node-00, node-01"), "{s}");
        assert!(s.ends_with("node-04 and 4 more"), "{s}");
        assert_eq!(capped(&names[..2]), "node-00, node-01");
    }
}
