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
        parts.push(format!("{word} {}", inc.nodes.join(", ")));
    }
    if !inc.gpus.is_empty() {
        let gpus: Vec<_> = inc.gpus.iter().map(ToString::to_string).collect();
        parts.push(format!("GPU {}", gpus.join(", ")));
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
    }
}

/// A multi-line description of an incident change, ending in a newline.
pub fn incident(change: Change, inc: &IncidentView) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "[{:>7.1}s] {} {} {} — {}",
        inc.detected_s.max(inc.resolved_s.unwrap_or(0.0)),
        verb(change),
        inc.kind,
        inc.id,
        culprit(inc)
    );
    let _ = writeln!(
        s,
        "           confidence {:.0}%, onset {:.1}s, detected {:.1}s ({:.1}s later)",
        inc.confidence * 100.0,
        inc.onset_s,
        inc.detected_s,
        (inc.detected_s - inc.onset_s).max(0.0)
    );
    let _ = writeln!(s, "           {}", inc.summary);
    for e in inc.evidence.iter().take(3) {
        let _ = writeln!(s, "             · [{:.1}s] {}", e.at_s, e.text);
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
        "  {:<12} {:<10} {:<9} {:>10} {:>6}  culprit",
        "kind", "id", "state", "detected_s", "conf"
    );
    for i in incidents {
        let id: String = i.id.chars().take(10).collect();
        let _ = writeln!(
            s,
            "  {:<12} {:<10} {:<9} {:>10.1} {:>5.0}%  {}",
            i.kind.as_str(),
            id,
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
}
