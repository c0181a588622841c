//! Plain-words rendering of incidents and summaries for the terminal.

use std::fmt::Write as _;

#[cfg(feature = "demo")]
use warden_engine::Change;
#[cfg(feature = "demo")]
use warden_model::Timestamp;
#[cfg(feature = "demo")]
use warden_model::view::ActionRecord;
use warden_model::view::{FleetHealthView, IncidentView, NodeHealthView, NodeView, RemedyStatus};

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
#[cfg(feature = "demo")]
pub fn verb(change: Change) -> &'static str {
    match change {
        Change::Opened => "OPENED",
        Change::Updated => "UPDATED",
        Change::Reclassified => "RECLASSIFIED",
        Change::Resolved => "RESOLVED",
        Change::Diagnosed => "DIAGNOSED",
        Change::Acknowledged => "ACKNOWLEDGED",
        Change::Remediated => "REMEDIATED",
    }
}

/// When `change` happened to `inc`, seconds since the origin: the time its line shows.
#[cfg(feature = "demo")]
pub fn change_at(change: Change, inc: &IncidentView) -> f64 {
    match change {
        Change::Opened => inc.detected_s,
        Change::Resolved => inc.resolved_s.unwrap_or(inc.detected_s),
        Change::Updated
        | Change::Reclassified
        | Change::Diagnosed
        | Change::Acknowledged
        | Change::Remediated => inc.timeline.last().map_or(inc.detected_s, |t| t.at_s),
    }
}

/// A multi-line description of an incident change, ending in a newline. `acted`: for
/// [`Change::Remediated`], whether remediation carried out an action for it (an
/// isolation or a restart: `REMEDIATED`) or only noted a decision (`NOTIFIED`).
#[cfg(feature = "demo")]
pub fn incident(change: Change, inc: &IncidentView, acted: bool) -> String {
    if change == Change::Diagnosed {
        return diagnosis(inc);
    }
    if change == Change::Remediated {
        return remediated(inc, acted);
    }
    let at = change_at(change, inc);
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
#[cfg(feature = "demo")]
fn diagnosis(inc: &IncidentView) -> String {
    let mut s = String::new();
    let at = inc.timeline.last().map_or(inc.detected_s, |t| t.at_s);
    let Some(d) = &inc.diagnosis else {
        return s;
    };
    let what = diagnosis_label(d);
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

/// What remediation did in its last pass over an incident: the timeline entries of
/// that moment, ending in a newline; headed `REMEDIATED` where it `acted`, else
/// `NOTIFIED` (a decision to notify, or an action it did not take, and why).
#[cfg(feature = "demo")]
fn remediated(inc: &IncidentView, acted: bool) -> String {
    let mut s = String::new();
    let Some(last) = inc.timeline.last() else {
        return s;
    };
    let _ = writeln!(
        s,
        "[{:>7.1}s] {} {} {} — {}",
        last.at_s,
        if acted {
            verb(Change::Remediated)
        } else {
            "NOTIFIED"
        },
        inc.kind,
        inc.id,
        culprit(inc)
    );
    // One pass notes at one time; entries share the rounded time exactly.
    let first = inc
        .timeline
        .iter()
        .rposition(|t| t.at_s < last.at_s)
        .map_or(0, |i| i + 1);
    for t in &inc.timeline[first..] {
        let _ = writeln!(s, "             · {}", t.what);
    }
    s
}

/// Remediation's state in a few lines, ending in a newline.
pub fn remediation(r: &RemedyStatus) -> String {
    let mut s = String::new();
    let mode = if r.dry_run {
        "dry run (records what it would do)"
    } else {
        "acting"
    };
    let _ = writeln!(s, "remediation: {mode}, actuator {}", r.actuator);
    let breaker = match (r.tripped, r.dry_run_tripped) {
        (true, _) => "TRIPPED: nothing is isolated or restarted until an admin resets it",
        (false, true) => "tripped in the dry run (a real run would have stopped acting)",
        (false, false) => "closed",
    };
    let _ = writeln!(s, "circuit breaker: {breaker}");
    if let Some(why) = &r.tripped_reason {
        let at = r.tripped_at.as_deref().unwrap_or("?");
        let _ = writeln!(s, "  tripped at {at}: {why}");
    }
    let _ = writeln!(
        s,
        "nodes isolated in the breaker's window: {} of {} allowed",
        r.isolated_in_window, r.breaker_cap
    );
    s
}

/// The actions taken, one line each under a heading, ending in a newline.
#[cfg(feature = "demo")]
pub fn actions(actions: &[ActionRecord], origin: Timestamp) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Actions ({}):", actions.len());
    if actions.is_empty() {
        s.push_str("  (none)\n");
    }
    for a in actions {
        let _ = writeln!(
            s,
            "  [{:>7.1}s] {:<13} {:<12} by {:<14} {}",
            a.intended_at.secs_since(origin),
            a.kind.as_str(),
            a.target,
            a.actor,
            a.result.as_deref().unwrap_or("(not finished)")
        );
    }
    s
}

/// A summary table of incidents (`warden demo`'s last word), one line each, indented
/// two spaces, ending in a newline.
#[cfg(feature = "demo")]
pub fn table(incidents: &[IncidentView]) -> String {
    if incidents.is_empty() {
        return "  (no incidents)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = incidents
        .iter()
        .map(|i| {
            vec![
                i.kind.as_str().to_owned(),
                i.id.clone(),
                i.state.as_str().to_owned(),
                format!("{:.1}", i.detected_s),
                format!("{:.0}%", i.confidence * 100.0),
                culprit(i),
            ]
        })
        .collect();
    columns(
        &["KIND", "ID", "STATE", "DETECTED_S", "CONF", "CULPRIT"],
        &rows,
    )
    .lines()
    .map(|l| format!("  {l}\n"))
    .collect()
}

/// Times below this (seconds) are offsets from a run's start, not epoch times: `warden
/// demo` counts from zero.
const EPOCH_FLOOR_S: f64 = 1_000_000_000.0;

/// A length of time in one or two units: `42s`, `3m`, `2h 5m`, `4d 1h`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 if s % 3600 / 60 == 0 => format!("{}h", s / 3600),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ if s % 86_400 / 3600 == 0 => format!("{}d", s / 86_400),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Time `t` (seconds since the epoch) relative to `now`: `3m ago`, `in 5s` (a clock
/// ahead), `just now`; a run's offset (`warden demo`) as `t+323.1s`.
pub fn ago(t: f64, now: f64) -> String {
    if t < EPOCH_FLOOR_S {
        return format!("t+{t:.1}s");
    }
    let d = now - t;
    if d.abs() < 1.0 {
        "just now".to_owned()
    } else if d > 0.0 {
        format!("{} ago", duration(d))
    } else {
        format!("in {}", duration(-d))
    }
}

/// Time `t` as a UTC date and its distance from `now`: `2026-01-01 12:03:04 UTC (3m
/// ago)`; a run's offset (`warden demo`) as `t+323.1s`.
pub fn when(t: f64, now: f64) -> String {
    if t < EPOCH_FLOOR_S {
        return ago(t, now);
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(t);
    let stamp = humantime::format_rfc3339_seconds(at).to_string();
    let stamp = stamp.replacen('T', " ", 1).replace('Z', " UTC");
    format!("{stamp} ({})", ago(t, now))
}

/// `s` on one line and at most `max` characters, ending in `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut out: String = one_line.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Rows under a header in aligned columns (two spaces apart; the last column is not
/// padded), ending in a newline. The one table layout of the CLI; [`fit`] cuts it to a
/// terminal's width.
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let ncols = rows.iter().map(Vec::len).fold(header.len(), usize::max);
    let mut widths = vec![0; ncols];
    for (i, h) in header.iter().enumerate() {
        widths[i] = h.chars().count();
    }
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut s = String::new();
    let head: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths.get(i).copied().unwrap_or(0);
                let len = cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad.saturating_sub(len)));
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

/// Incidents as a table with times relative to `now` (seconds since the epoch), ending
/// in a newline.
pub fn incident_rows(incidents: &[IncidentView], now: f64) -> String {
    if incidents.is_empty() {
        return "no incidents\n".to_owned();
    }
    let rows: Vec<Vec<String>> = incidents
        .iter()
        .map(|i| {
            vec![
                i.id.clone(),
                i.kind.as_str().to_owned(),
                i.state.as_str().to_owned(),
                if i.acknowledged { "yes" } else { "no" }.to_owned(),
                i.job.clone().unwrap_or_else(|| "-".to_owned()),
                ago(i.detected_s, now),
                truncate(&culprit(i), 40),
                // The last column: whole, cut only with the row to the terminal.
                i.summary.replace('\n', " "),
            ]
        })
        .collect();
    columns(
        &[
            "ID", "KIND", "STATE", "ACK", "JOB", "DETECTED", "CULPRIT", "SUMMARY",
        ],
        &rows,
    )
}

/// One incident in full (evidence, timeline, diagnosis), times as dates and relative to
/// `now`, ending in a newline.
pub fn incident_detail(inc: &IncidentView, now: f64) -> String {
    let mut s = String::new();
    let ack = if inc.acknowledged {
        "acknowledged"
    } else {
        "not acknowledged"
    };
    let _ = writeln!(
        s,
        "{} — {} {}, {ack}",
        inc.id,
        inc.kind.as_str(),
        inc.state.as_str()
    );
    let _ = writeln!(s, "  summary     {}", inc.summary);
    let _ = writeln!(
        s,
        "  job         {}",
        inc.job.as_deref().unwrap_or("(none)")
    );
    let _ = writeln!(s, "  culprit     {}", culprit(inc));
    let _ = writeln!(
        s,
        "  severity    {}, confidence {:.0}%",
        inc.severity.as_str(),
        inc.confidence * 100.0
    );
    let _ = writeln!(s, "  onset       {}", when(inc.onset_s, now));
    let lag = inc.detected_s - inc.onset_s;
    let lag = if lag >= 0.0 {
        format!(", {lag:.1}s after onset")
    } else {
        String::new()
    };
    let _ = writeln!(s, "  detected    {}{lag}", when(inc.detected_s, now));
    if let Some(r) = inc.resolved_s {
        let _ = writeln!(s, "  resolved    {}", when(r, now));
    }
    let _ = writeln!(s, "\nevidence:");
    if inc.evidence.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    let evidence: Vec<Vec<String>> = inc
        .evidence
        .iter()
        .map(|e| vec![format!("  {}", ago(e.at_s, now)), e.text.clone()])
        .collect();
    s.push_str(columns_body(&evidence).as_str());
    let _ = writeln!(s, "\ntimeline:");
    let timeline: Vec<Vec<String>> = inc
        .timeline
        .iter()
        .map(|t| vec![format!("  {}", ago(t.at_s, now)), t.what.clone()])
        .collect();
    s.push_str(columns_body(&timeline).as_str());
    match &inc.diagnosis {
        None => {
            let _ = writeln!(s, "\ndiagnosis: (not yet)");
        }
        Some(d) => {
            let _ = writeln!(
                s,
                "\ndiagnosis: {}, confidence {:.0}% ({})",
                diagnosis_label(d),
                d.confidence * 100.0,
                d.source
            );
            if !d.culprit.is_empty() {
                let _ = writeln!(s, "  culprit in the logs: {}", d.culprit);
            }
            if !d.explanation.is_empty() {
                let _ = writeln!(s, "  {}", d.explanation);
            }
            for e in &d.evidence {
                let node = e
                    .node
                    .as_deref()
                    .map_or(String::new(), |n| format!("{n}: "));
                let _ = writeln!(s, "  · [line {}] {node}{}", e.id, e.text);
            }
        }
    }
    s
}

/// Columns of a terminal on standard output: `COLUMNS` when set, else the terminal's
/// own width; `None` when standard output is not a terminal (a pipe or a file gets
/// whole lines).
pub fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let from_env = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|w| *w > 0);
    from_env.or_else(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
}

/// `text` with every line longer than `width` characters cut to it, ending in `…`
/// (table rows keep their leading columns and lose the end of the last one). `None`:
/// unchanged.
pub fn fit(text: &str, width: Option<usize>) -> String {
    let Some(width) = width.filter(|w| *w > 1) else {
        return text.to_owned();
    };
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if body.chars().count() > width {
            out.extend(body.chars().take(width - 1));
            out.push('…');
        } else {
            out.push_str(body);
        }
        out.push_str(nl);
    }
    out
}

/// Rows in aligned columns without a header.
fn columns_body(rows: &[Vec<String>]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let text = columns(&[], rows);
    text.split_once('\n')
        .map_or(text.clone(), |(_, rest)| rest.to_owned())
}

/// Nodes as a table: name, state, owner, reason, incident, since (relative to `now`),
/// and when their agent was last heard from. Ends in a newline.
pub fn node_rows(nodes: &[NodeView], now: f64) -> String {
    if nodes.is_empty() {
        return "no nodes\n".to_owned();
    }
    let dash = || "-".to_owned();
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                n.state.clone(),
                n.owner.clone().unwrap_or_else(dash),
                n.reason.as_deref().map_or_else(dash, |r| truncate(r, 40)),
                n.incident.clone().unwrap_or_else(dash),
                n.drained_s.map_or_else(dash, |t| ago(t, now)),
                n.agent_silent_s
                    .map_or_else(|| "no agent".to_owned(), |s| format!("{} ago", duration(s))),
            ]
        })
        .collect();
    columns(
        &[
            "NODE",
            "STATE",
            "OWNER",
            "REASON",
            "INCIDENT",
            "SINCE",
            "AGENT SEEN",
        ],
        &rows,
    )
}

/// The fleet's health: nodes per state, those held out, the top repeat offenders.
pub fn fleet_health(f: &FleetHealthView) -> String {
    let states: Vec<String> = f
        .by_state
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    let mut out = format!(
        "nodes in the ledger: {}\n",
        if states.is_empty() {
            "none (every node healthy)".to_owned()
        } else {
            states.join(", ")
        }
    );
    out.push_str(&format!(
        "held out of placement: {}\n",
        if f.held_out.is_empty() {
            "none".to_owned()
        } else {
            f.held_out.join(", ")
        }
    ));
    if let Some(h) = f.mean_hours_between_incidents {
        out.push_str(&format!("fleet mean time between incidents: {h:.1} h\n"));
    }
    if !f.top_offenders.is_empty() {
        let dash = || "-".to_owned();
        let rows: Vec<Vec<String>> = f
            .top_offenders
            .iter()
            .map(|o| {
                vec![
                    o.node.clone(),
                    o.state.clone(),
                    o.incidents.to_string(),
                    o.jobs.to_string(),
                    o.mean_hours_between_incidents
                        .map_or_else(dash, |h| format!("{h:.1} h")),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&columns(
            &["NODE", "STATE", "INCIDENTS", "JOBS", "MEAN BETWEEN"],
            &rows,
        ));
    }
    out
}

/// One node's health: state and why, then its history and evidence.
pub fn node_health(n: &NodeHealthView, now: f64) -> String {
    let mut out = format!(
        "{}: {} since {}{}\n",
        n.node,
        n.state,
        when(n.since_s, now),
        if n.held_out {
            " (held out of placement)"
        } else {
            ""
        }
    );
    if let Some(r) = &n.reason {
        out.push_str(&format!("  why: {r}\n"));
    }
    out.push_str(&format!("  incidents held against it: {}", n.incidents));
    if let Some(h) = n.mean_hours_between_incidents {
        out.push_str(&format!(", one every {h:.1} h on average"));
    }
    out.push('\n');
    if !n.jobs.is_empty() {
        out.push_str(&format!("  jobs: {}\n", n.jobs.join(", ")));
    }
    if !n.history.is_empty() {
        out.push_str("\nhistory:\n");
        for t in &n.history {
            out.push_str(&format!(
                "  {}  {} -> {}: {}\n",
                when(t.at_s, now),
                t.from,
                t.to,
                t.reason
            ));
        }
    }
    if !n.evidence.is_empty() {
        out.push_str("\nevidence:\n");
        for e in &n.evidence {
            let gpu = e.gpu.map_or_else(String::new, |g| format!(" GPU {g}"));
            let job = e
                .job
                .as_deref()
                .map_or_else(String::new, |j| format!(", job {j} {}", e.phase));
            out.push_str(&format!(
                "  {}  {} {}{gpu}{job}: {} [{}]\n",
                when(e.at_s, now),
                e.incident,
                e.kind.as_str(),
                e.why,
                e.weight
            ));
        }
    }
    out
}

/// What a diagnosis says, in a few words: `category (locus)`.
fn diagnosis_label(d: &warden_model::IncidentDiagnosis) -> String {
    match (&d.category, &d.fault_locus) {
        (Some(c), Some(l)) => format!("{c} ({l})"),
        (Some(c), None) => c.clone(),
        _ => "no known failure in the logs".to_owned(),
    }
}

/// What an injected fault hits, in one line.
#[cfg(feature = "demo")]
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
    fn fit_cuts_long_lines_to_the_width_and_leaves_the_rest() {
        let text = "NODE  REASON\nn1    a reason far too long for the terminal\nn2    ok\n";
        let cut = fit(text, Some(20));
        let lines: Vec<&str> = cut.lines().collect();
        assert_eq!(lines[0], "NODE  REASON");
        assert_eq!(lines[1], "n1    a reason far …");
        assert_eq!(lines[1].chars().count(), 20);
        assert_eq!(lines[2], "n2    ok");
        assert!(cut.ends_with('\n'));
        assert_eq!(fit(text, None), text, "a pipe gets whole lines");
    }

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

    #[test]
    fn times_read_as_distances_from_now() {
        let now = 1_767_225_600.0;
        assert_eq!(ago(now - 42.0, now), "42s ago");
        assert_eq!(ago(now - 190.0, now), "3m ago");
        assert_eq!(ago(now - 7500.0, now), "2h 5m ago");
        assert_eq!(ago(now - 7200.0, now), "2h ago");
        assert_eq!(ago(now - 3.0 * 86_400.0 - 3600.0, now), "3d 1h ago");
        assert_eq!(ago(now + 4.0, now), "in 4s");
        assert_eq!(ago(now - 0.2, now), "just now");
        assert_eq!(ago(323.14, now), "t+323.1s");
        assert_eq!(when(now - 60.0, now), "2025-12-31 23:59:00 UTC (1m ago)");
    }

    #[test]
    fn long_text_is_cut_to_one_line() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdefghijk", 5), "abcd…");
        assert_eq!(truncate("a\nb", 5), "a b");
        assert_eq!(truncate("ééééé", 5), "ééééé");
    }

    #[test]
    fn columns_line_up_whatever_the_width() {
        let rows = vec![
            vec!["a".to_owned(), "bb".to_owned(), "c".to_owned()],
            vec!["dddd".to_owned(), "é".to_owned(), "".to_owned()],
        ];
        assert_eq!(
            columns(&["X", "Y", "Z"], &rows),
            "X     Y   Z\na     bb  c\ndddd  é\n"
        );
    }
}
