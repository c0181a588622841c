//! Evidence selection: from the mined templates, pick the few lines that tell a failure
//! apart from the millions that do not.
//!
//! # Tiers
//!
//! Every template falls in one tier; a tier's scores never overlap the next one's, so a
//! cause always outranks a symptom, and a symptom always outranks chatter:
//!
//! | tier | when | score |
//! |---|---|---|
//! | cause (`rare-template`) | seen on few ranks (at most an eighth of them, at least one) or, without rank or node data (or with one rank and one node), at most 5 times | 0.50 ..= 1.00 |
//! | symptom (`symptom`) | seen on most ranks (half or more of at least 4) and first near the onset, like every rank's watchdog timeout | 0.25 .. 0.50 |
//! | background (`common`) | everything else | 0.10 .. 0.25 |
//! | noise (`noise`) | at least `noise_min_count` lines and first seen long before the onset, like iteration logs | 0.00 .. 0.10 |
//!
//! Within a tier, a template scores higher when it is rarer (fewer ranks or lines), first
//! appears near the onset (`onset`), appears only on the culprit node (`only-on-node`),
//! and says error-like words (`error-words`). The reason of an evidence line lists the
//! tags that applied, strongest first, separated by `+`.
//!
//! The onset is the time or line id given; without one, the end of the log (failures
//! end logs). A template is near the onset when its first line lies within the window
//! around it (time when both sides have times, else line ids).
//!
//! One line per template is cited: its first occurrence. Pure: no I/O, no clock.

use crate::drain::Template;
use crate::model::EvidenceLine;

/// What evidence to look for.
#[derive(Debug, Clone, PartialEq)]
pub struct EvidenceQuery {
    /// When the failure began, milliseconds since the Unix epoch.
    pub onset_at_ms: Option<i64>,
    /// The line where the failure began (used when times are missing).
    pub onset_line: Option<u64>,
    /// How far from the onset a template's first line may be to count as near it.
    /// Default 15 minutes: a watchdog fires 10 minutes after a hang begins.
    pub onset_window_ms: i64,
    /// The same in lines, when times are missing. Default 20,000.
    pub onset_window_lines: u64,
    /// The node already suspected, if any.
    pub culprit_node: Option<String>,
    /// Ranks in the job; default: the most distinct ranks any template saw.
    pub total_ranks: Option<u64>,
    /// Nodes in the job; default: the most distinct nodes any template saw.
    pub total_nodes: Option<u64>,
    /// Evidence lines returned at most. Default 20.
    pub max_lines: usize,
    /// Lines from which a template that predates the onset is noise. Default 100.
    pub noise_min_count: u64,
}

impl Default for EvidenceQuery {
    fn default() -> Self {
        EvidenceQuery {
            onset_at_ms: None,
            onset_line: None,
            onset_window_ms: 15 * 60 * 1_000,
            onset_window_lines: 20_000,
            culprit_node: None,
            total_ranks: None,
            total_nodes: None,
            max_lines: 20,
            noise_min_count: 100,
        }
    }
}

/// Templates seen at most this many times count as rare when nothing says where they
/// came from.
const RARE_COUNT: u64 = 5;

/// Words that make a line more telling, lower case.
const ERROR_WORDS: [&str; 14] = [
    "error",
    "fail",
    "xid",
    "warn",
    "traceback",
    "exception",
    "fatal",
    "timeout",
    "timed out",
    "abort",
    "killed",
    "fallen off",
    "out of memory",
    "segmentation fault",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Cause,
    Symptom,
    Background,
    Noise,
}

/// Where the onset is, resolved.
#[derive(Debug, Clone, Copy)]
struct Onset {
    at_ms: Option<i64>,
    line: u64,
}

/// Scores the templates and returns one evidence line per template, best first, at most
/// `query.max_lines`.
pub fn select_evidence(templates: &[Template], query: &EvidenceQuery) -> Vec<EvidenceLine> {
    if templates.is_empty() || query.max_lines == 0 {
        return Vec::new();
    }
    let onset = Onset {
        at_ms: query
            .onset_at_ms
            .or_else(|| templates.iter().filter_map(|t| t.last_at_ms).max()),
        line: query
            .onset_line
            .unwrap_or_else(|| templates.iter().map(|t| t.last_line).max().unwrap_or(0)),
    };
    let total_ranks = query.total_ranks.unwrap_or_else(|| {
        templates
            .iter()
            .map(|t| t.distinct_ranks)
            .max()
            .unwrap_or(0)
    });
    let total_nodes = query.total_nodes.unwrap_or_else(|| {
        templates
            .iter()
            .map(|t| t.distinct_nodes)
            .max()
            .unwrap_or(0)
    });

    let mut scored: Vec<(f64, u64, EvidenceLine)> = templates
        .iter()
        .filter(|t| !says_nothing(&t.sample_text))
        .map(|t| {
            let (score, reason) = score(t, query, onset, total_ranks, total_nodes);
            let line = EvidenceLine {
                id: t.sample_line,
                text: t.sample_text.clone(),
                rule_id: None,
                reason,
                score,
            };
            (score, t.first_line, line)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored
        .into_iter()
        .take(query.max_lines)
        .map(|(_, _, line)| line)
        .collect()
}

/// Whether a line carries no evidence of its own: blank or punctuation only (rules,
/// carets, separators), a bare stack frame (Python `File "...", line N, in f`, C++
/// `frame #N:`, gdb `#N 0x... in`, Java `at pkg.Class(File.java:N)`), or a traceback
/// header. Such lines are never offered as evidence: the line they belong to is.
pub fn says_nothing(text: &str) -> bool {
    let t = text.trim();
    if !t.chars().any(char::is_alphanumeric) {
        return true;
    }
    // A `[rankN]:` or `host:pid:` style prefix does not make a frame say more.
    let body = t
        .strip_prefix('[')
        .and_then(|r| r.split_once("]:"))
        .map_or(t, |(_, rest)| rest.trim_start());
    let frame_number = |r: &str| {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && r[digits..].starts_with([':', ' '])
    };
    (body.starts_with("File \"") && body.contains("\", line "))
        || body.strip_prefix("frame #").is_some_and(frame_number)
        || body
            .strip_prefix('#')
            .is_some_and(|r| frame_number(r) && r.contains(" in "))
        || body
            .strip_prefix("at ")
            .is_some_and(|r| r.ends_with(')') && r.split_whitespace().count() == 1)
        || body.starts_with("Traceback (most recent call last)")
}

/// Share of the job's ranks (or, for lines without ranks, nodes) a template was seen on.
/// With a single rank (or node) every template is on "all" of them and on "few" of
/// them at once: the spread says nothing, and `None` lets the count decide.
fn spread(t: &Template, total_ranks: u64, total_nodes: u64) -> Option<(f64, u64, u64)> {
    if t.distinct_ranks > 0 && total_ranks > 1 {
        let seen = t.distinct_ranks.min(total_ranks);
        Some((seen as f64 / total_ranks as f64, seen, total_ranks))
    } else if t.distinct_nodes > 0 && total_nodes > 1 {
        let seen = t.distinct_nodes.min(total_nodes);
        Some((seen as f64 / total_nodes as f64, seen, total_nodes))
    } else {
        None
    }
}

fn near_onset(t: &Template, q: &EvidenceQuery, onset: Onset) -> bool {
    match (t.first_at_ms, onset.at_ms) {
        (Some(first), Some(at)) => (first - at).abs() <= q.onset_window_ms,
        _ => t.first_line.abs_diff(onset.line) <= q.onset_window_lines,
    }
}

fn has_error_words(t: &Template) -> bool {
    let lower = t.text.to_ascii_lowercase();
    ERROR_WORDS.iter().any(|w| lower.contains(w))
}

fn score(
    t: &Template,
    q: &EvidenceQuery,
    onset: Onset,
    total_ranks: u64,
    total_nodes: u64,
) -> (f64, String) {
    let near = near_onset(t, q, onset);
    let errorish = has_error_words(t);
    let on_node = q.culprit_node.as_deref().is_some_and(|node| {
        t.distinct_nodes > 0
            && t.distinct_nodes as usize == t.nodes.len()
            && t.nodes.iter().all(|n| n == node)
    });
    let spread = spread(t, total_ranks, total_nodes);
    // 1 for a single line, falling towards 0 with many.
    let count_rarity = 1.0 / (1.0 + (t.count as f64).log10());

    let tier = if t.count >= q.noise_min_count && !near {
        Tier::Noise
    } else {
        match spread {
            Some((share, _, total)) if total >= 4 && share >= 0.5 => {
                if near {
                    Tier::Symptom
                } else {
                    Tier::Background
                }
            }
            Some((_, seen, total)) if seen <= (total / 8).max(1) => Tier::Cause,
            Some(_) => Tier::Background,
            None if t.count <= RARE_COUNT => Tier::Cause,
            None => Tier::Background,
        }
    };
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let mut tags: Vec<&str> = Vec::new();
    let score = match tier {
        Tier::Cause => {
            tags.push("rare-template");
            let rarity = spread.map_or(count_rarity, |(share, _, _)| 1.0 - share);
            0.5 + 0.5
                * (0.35 * rarity
                    + 0.1 * count_rarity
                    + 0.25 * flag(near)
                    + 0.15 * flag(on_node)
                    + 0.15 * flag(errorish))
        }
        Tier::Symptom => {
            tags.push("symptom");
            0.25 + 0.2499 * (0.5 * flag(errorish) + 0.3 * count_rarity + 0.2 * flag(on_node))
        }
        Tier::Background => {
            tags.push("common");
            0.1 + 0.1499
                * (0.4 * flag(near)
                    + 0.3 * flag(errorish)
                    + 0.2 * flag(on_node)
                    + 0.1 * count_rarity)
        }
        Tier::Noise => {
            tags.push("noise");
            0.0999 * count_rarity
        }
    };
    if near && tier != Tier::Noise {
        tags.push("onset");
    }
    if on_node {
        tags.push("only-on-node");
    }
    if errorish && tier != Tier::Noise {
        tags.push("error-words");
    }
    (score, tags.join("+"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::{ClusterId, DrainConfig, LineRef, Miner};

    /// A template seen `count` times on `ranks`, first at `first` (ms), on `nodes`.
    fn tpl(id: u64, text: &str, count: u64, ranks: &[u32], nodes: &[&str], first: i64) -> Template {
        Template {
            id: ClusterId(id),
            text: text.to_owned(),
            count,
            first_line: first as u64,
            last_line: first as u64 + count,
            first_at_ms: Some(first),
            last_at_ms: Some(first + count as i64),
            ranks: ranks.to_vec(),
            distinct_ranks: ranks.len() as u64,
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            distinct_nodes: nodes.len() as u64,
            sample_line: first as u64,
            sample_text: text.to_owned(),
        }
    }

    const MIN: i64 = 60_000;
    const END: i64 = 100 * MIN;

    fn all_ranks() -> Vec<u32> {
        (0..16).collect()
    }

    fn reasons(out: &[EvidenceLine]) -> Vec<(String, String)> {
        out.iter()
            .map(|e| (e.text.clone(), e.reason.clone()))
            .collect()
    }

    #[test]
    fn causes_outrank_symptoms_which_outrank_noise() {
        let ranks = all_ranks();
        let templates = vec![
            tpl(0, "iteration <*> | lm loss: <*>", 50_000, &[15], &["n1"], 0),
            tpl(
                1,
                "data_loader worker <*> prefetched shard",
                80_000,
                &ranks,
                &["n0", "n1"],
                0,
            ),
            tpl(
                2,
                "NCCL INFO Connected all rings",
                16,
                &ranks,
                &["n0", "n1"],
                MIN,
            ),
            tpl(
                3,
                "[Rank <*>] Watchdog caught collective operation timeout",
                15,
                &ranks[1..],
                &["n0", "n1"],
                END - MIN,
            ),
            tpl(
                4,
                "NVRM: Xid (PCI:<*>): 79, GPU has fallen off the bus.",
                1,
                &[],
                &["n0"],
                END - 11 * MIN,
            ),
            tpl(
                5,
                "NCCL WARN NET/IB : Got completion from peer with status=12",
                2,
                &[1, 3],
                &["n0"],
                END - 10 * MIN,
            ),
        ];
        let q = EvidenceQuery {
            onset_at_ms: Some(END - 11 * MIN),
            total_ranks: Some(16),
            ..EvidenceQuery::default()
        };
        let out = select_evidence(&templates, &q);
        let order: Vec<&str> = out.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(order.len(), 6);
        assert!(
            order[0].starts_with("NCCL WARN") || order[0].starts_with("NVRM"),
            "{order:?}"
        );
        assert!(
            order[1].starts_with("NCCL WARN") || order[1].starts_with("NVRM"),
            "{order:?}"
        );
        assert!(order[2].contains("Watchdog"), "{order:?}");
        assert!(order[3].contains("Connected all rings"), "{order:?}");
        let last_two: Vec<&str> = order[4..].to_vec();
        assert!(
            last_two.iter().any(|t| t.starts_with("iteration")),
            "{order:?}"
        );
        assert!(
            last_two.iter().any(|t| t.starts_with("data_loader")),
            "{order:?}"
        );
        let r = reasons(&out);
        assert!(r[2].1.starts_with("symptom+onset"), "{r:?}");
        assert!(r[0].1.starts_with("rare-template+onset"), "{r:?}");
        assert!(
            out[4].reason == "noise" && out[5].reason == "noise",
            "{r:?}"
        );
        for pair in out.windows(2) {
            assert!(pair[0].score >= pair[1].score);
        }
    }

    #[test]
    fn blank_lines_separators_and_bare_frames_say_nothing() {
        for quiet in [
            "",
            "   ",
            "====================================================",
            "    ^^^^^^^^^^",
            "  File \"/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py\", line 1511, in _wrapped_call_impl",
            "[rank3]:   File \"/workspace/train.py\", line 88, in <module>",
            "frame #4: <unknown function> + 0x1d8b2 (0x7f3c in /usr/lib/libc10_cuda.so)",
            "#7  0x00007f1b2c3d in ncclProxyProgress () from /usr/lib/libnccl.so.2",
            "\tat org.apache.spark.Executor.run(Executor.java:512)",
            "Traceback (most recent call last):",
        ] {
            assert!(says_nothing(quiet), "{quiet:?}");
        }
        for telling in [
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "[rank3]: torch.OutOfMemoryError: CUDA out of memory.",
            "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent call first):",
            "at least one rank failed",
            "#3 rank 2 failed",
        ] {
            assert!(!says_nothing(telling), "{telling:?}");
        }
    }

    #[test]
    fn tier_table() {
        // (template, expected first tag)
        let ranks = all_ranks();
        let q = EvidenceQuery {
            onset_at_ms: Some(END),
            total_ranks: Some(16),
            ..EvidenceQuery::default()
        };
        let cases = vec![
            (
                tpl(0, "rank-local oddity", 3, &[4], &["n0"], 10 * MIN),
                "rare-template",
            ),
            (
                tpl(1, "on two of sixteen ranks", 2, &[4, 9], &["n0", "n1"], END),
                "rare-template",
            ),
            (
                tpl(2, "on three of sixteen ranks", 3, &[1, 2, 3], &["n0"], END),
                "common",
            ),
            (
                tpl(3, "every rank at the end", 16, &ranks, &["n0", "n1"], END),
                "symptom",
            ),
            (
                tpl(4, "every rank at start-up", 16, &ranks, &["n0", "n1"], 0),
                "common",
            ),
            (
                tpl(5, "chatter since start-up", 500, &[0], &["n0"], 0),
                "noise",
            ),
            (
                tpl(6, "a burst at the end", 500, &[0], &["n0"], END),
                "rare-template",
            ),
            (
                tpl(7, "no rank or node, twice", 2, &[], &[], END),
                "rare-template",
            ),
            (
                tpl(8, "no rank or node, often", 40, &[], &[], END),
                "common",
            ),
        ];
        for (t, want) in cases {
            check_tier(&t, &q, want);
        }
        // A single-rank, single-node job: the count decides, not the spread.
        let q = EvidenceQuery {
            onset_at_ms: Some(END),
            total_ranks: Some(1),
            total_nodes: Some(1),
            ..EvidenceQuery::default()
        };
        let cases = vec![
            (tpl(9, "the whole log", 300, &[0], &["n0"], END), "common"),
            (
                tpl(10, "once on the only rank", 1, &[0], &["n0"], END),
                "rare-template",
            ),
        ];
        for (t, want) in cases {
            check_tier(&t, &q, want);
        }
    }

    /// One template alone: its first tag and that its score lies in the tier's range.
    fn check_tier(t: &Template, q: &EvidenceQuery, want: &str) {
        let out = select_evidence(std::slice::from_ref(t), q);
        assert_eq!(out.len(), 1);
        let first = out[0].reason.split('+').next().unwrap_or_default();
        assert_eq!(first, want, "{}: {}", t.text, out[0].reason);
        let range = match want {
            "rare-template" => 0.5..=1.0,
            "symptom" => 0.25..=0.4999,
            "common" => 0.1..=0.2499,
            _ => 0.0..=0.0999,
        };
        assert!(
            range.contains(&out[0].score),
            "{}: {}",
            t.text,
            out[0].score
        );
    }

    #[test]
    fn only_on_the_culprit_node_scores_higher() {
        let a = tpl(0, "pcie link retrained", 2, &[3], &["n7"], END);
        let b = tpl(1, "pcie link degraded", 2, &[4], &["n2"], END);
        let q = EvidenceQuery {
            culprit_node: Some("n7".to_owned()),
            total_ranks: Some(16),
            ..EvidenceQuery::default()
        };
        let out = select_evidence(&[b, a], &q);
        assert_eq!(out[0].text, "pcie link retrained");
        assert!(out[0].reason.contains("only-on-node"));
        assert!(!out[1].reason.contains("only-on-node"));
    }

    #[test]
    fn onset_by_line_when_times_are_missing_and_the_cap_holds() {
        let mut templates: Vec<Template> = (0..30)
            .map(|i| {
                let mut t = tpl(i, &format!("odd line {i}"), 1, &[], &[], 0);
                t.first_at_ms = None;
                t.last_at_ms = None;
                t.first_line = i * 1_000;
                t.last_line = i * 1_000;
                t.sample_line = i * 1_000;
                t
            })
            .collect();
        templates.reverse();
        let q = EvidenceQuery {
            onset_line: Some(29_000),
            onset_window_lines: 2_500,
            max_lines: 5,
            ..EvidenceQuery::default()
        };
        let out = select_evidence(&templates, &q);
        assert_eq!(out.len(), 5);
        let near: Vec<u64> = out
            .iter()
            .filter(|e| e.reason.contains("onset"))
            .map(|e| e.id)
            .collect();
        assert_eq!(near, vec![27_000, 28_000, 29_000]);
    }

    #[test]
    fn mined_generated_log_puts_the_fault_lines_first() {
        use crate::loggen::{GenConfig, LogGen};
        let mut generator = LogGen::new(GenConfig {
            nodes: 4,
            gpus_per_node: 8,
            target_bytes: 3_000_000,
            ..GenConfig::default()
        });
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        let mut text = String::new();
        while let Some(g) = generator.next_line(&mut text) {
            let node = format!("gpu-node-{:03}", g.node);
            miner.add(LineRef {
                id: g.id,
                text: &text,
                rank: g.rank,
                node: Some(&node),
                at_ms: Some(g.at_ms),
            });
        }
        let s = generator.summary().clone();
        let out = select_evidence(
            &miner.templates(),
            &EvidenceQuery {
                onset_at_ms: s.onset_ms,
                culprit_node: s.culprit_node.clone(),
                total_ranks: Some(u64::from(s.world_size)),
                ..EvidenceQuery::default()
            },
        );
        let top: Vec<&str> = out.iter().take(4).map(|e| e.text.as_str()).collect();
        assert!(top.iter().any(|t| t.contains("Xid")), "{top:#?}");
        assert!(
            top.iter().any(|t| t.contains("NCCL WARN NET/IB")),
            "{top:#?}"
        );
        let pos = |needle: &str| out.iter().position(|e| e.text.contains(needle));
        let watchdog = pos("Watchdog caught").expect("watchdog line cited");
        let xid = pos("Xid").expect("xid cited");
        assert!(xid < watchdog);
        assert!(
            out[watchdog].reason.starts_with("symptom"),
            "{}",
            out[watchdog].reason
        );
        if let Some(it) = pos("lm loss") {
            assert!(watchdog < it);
            assert_eq!(out[it].reason, "noise");
        }
    }
}
