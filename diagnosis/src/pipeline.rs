//! The whole deterministic diagnosis in one streaming pass: every line goes to the rule
//! classifier, the template miner and the watchdog scan; [`Pipeline::finish`] joins
//! their findings into one [`Diagnosis`].
//!
//! - **Category, locus, action** are the rules' ([`Classifier`]); nothing else votes.
//! - **Culprit**: the rules' culprit. When the category is `nccl_timeout_hang` and the
//!   rules name no rank, the watchdog analysis ([`WatchdogScan`]) names the rank(s) the
//!   others waited for; the explanation says so and cites its lines.
//! - **Evidence**, at most [`PipelineOptions::max_evidence`] lines: the rule-hit lines
//!   first (the winner's causes, then its symptoms, then the context lines that named
//!   the culprit, then the best line of other categories), then the watchdog analysis's
//!   lines, then the best mined templates ([`select_evidence`]: rare templates first
//!   seen near the onset, higher when seen only on the suspect node) that no cited line
//!   already stands for.
//! - **Nothing matched**: the category stays unknown with confidence 0, and the rare
//!   templates alone are the evidence, for a person or a model to read.
//!
//! The onset, for evidence, is the one given in the options, else the first line of the
//! winning rules' hits, else the end of the log. Memory is bounded whatever the input
//! length: the classifier keeps a bounded number of hits per rule, the miner a bounded
//! number of templates, the watchdog scan and this module one small state per rank
//! (capped). The caller's numbers (world size, first deaths) size nothing: a world size
//! is compared, never expanded into ranks, and texts list a bounded number of ranks.
//! Pure: no I/O, no clock.

use std::collections::BTreeMap;

use crate::classify::Classifier;
use crate::drain::{DrainConfig, LineRef, Miner, Template, mask_token};
use crate::evidence::{EvidenceQuery, select_evidence};
use crate::model::{Category, Diagnosis, EvidenceLine, LogLine};
use crate::rules::{Role, RuleSet};
use crate::watchdog::{self, LaggingRanks, WatchdogEvent, WatchdogScan};

/// Default cap on evidence lines in an answer.
pub const DEFAULT_MAX_EVIDENCE: usize = 20;
/// Watchdog lines cited at most for the lagging ranks.
const MAX_LAGGING_EVIDENCE: usize = 4;
/// Watchdog line texts kept at most (one timeout and one status line per rank).
const MAX_WATCHDOG_TEXTS: usize = 16_384;
/// Desync-report line texts kept at most.
const MAX_DESYNC_TEXTS: usize = 16;
/// Longest watchdog line text kept, in bytes.
const TEXT_BYTES: usize = 400;
/// Ranks named in a culprit at most.
const MAX_CULPRIT_RANKS: usize = 8;
/// How far into a line a `[rankN]` tag is looked for, in bytes.
const RANK_TAG_SPAN: usize = 128;
/// Score of a watchdog line cited for the lagging ranks: above a symptom rule's weight
/// (0.3 to 0.4), below a cause's (1.0 and up).
const LAGGING_SCORE: f64 = 0.5;

/// What is known about the job beyond its log lines. Everything is optional.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOptions {
    /// Ranks in the job (ranks `0..world_size`). Unset, 0 or above
    /// [`watchdog::MAX_WORLD_SIZE`]: the ranks seen in the lines stand for the job, so a
    /// rank that never printed anything cannot be named silent. A client's number: it
    /// is only compared with counts, never sizes the work.
    pub world_size: Option<u32>,
    /// When the failure began, milliseconds since the Unix epoch (e.g. when a detector
    /// fired). Unset: the time of the first winning rule hit, else the end of the log.
    pub onset_at_ms: Option<i64>,
    /// The line id where the failure began, for logs without times. Unset: the first
    /// winning rule hit, else the last line.
    pub onset_line: Option<u64>,
    /// A node already suspected (by telemetry, a health check); its own templates rank
    /// higher as evidence. It does not enter the culprit. Unset: the node the rules
    /// blame, when they blame exactly one.
    pub suspect_node: Option<String>,
    /// Evidence lines in the answer at most. Default [`DEFAULT_MAX_EVIDENCE`].
    pub max_evidence: usize,
    /// Ranks whose processes are known to have failed first (a crash detector's first
    /// deaths, from the exits). When no line names a culprit (the others only report
    /// losing a peer, which no rule blames), these are the culprit's ranks; when the
    /// lines name other ranks, the explanation says so. Empty: nothing known.
    pub first_failed: Vec<u32>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            world_size: None,
            onset_at_ms: None,
            onset_line: None,
            suspect_node: None,
            max_evidence: DEFAULT_MAX_EVIDENCE,
            first_failed: Vec::new(),
        }
    }
}

/// Texts of the watchdog lines the analysis may cite: per (process group, rank) the
/// first timeout and the latest status line, and the first desync-report lines.
#[derive(Debug, Default)]
struct WatchdogTexts {
    /// (pg, rank, is status) → (line id, text).
    per_rank: BTreeMap<(String, u32, bool), (u64, String)>,
    desync: Vec<(u64, String)>,
}

impl WatchdogTexts {
    fn keep(&mut self, line: &LogLine) {
        let Some(record) = watchdog::parse(line) else {
            return;
        };
        let status = match record.event {
            WatchdogEvent::DesyncLagging { .. } => {
                if self.desync.len() < MAX_DESYNC_TEXTS {
                    self.desync.push((line.id, shorten(&line.text)));
                }
                return;
            }
            WatchdogEvent::CollectiveTimeout { .. } => false,
            WatchdogEvent::WorkStatus { .. } => true,
        };
        let Some(rank) = record.rank else {
            return;
        };
        let key = (record.pg, rank, status);
        if let Some(slot) = self.per_rank.get_mut(&key) {
            // The scan keeps a rank's first timeout and its latest status.
            if status {
                *slot = (line.id, shorten(&line.text));
            }
        } else if self.per_rank.len() < MAX_WATCHDOG_TEXTS {
            self.per_rank.insert(key, (line.id, shorten(&line.text)));
        }
    }

    fn text(&self, id: u64) -> Option<&str> {
        self.per_rank
            .values()
            .chain(self.desync.iter())
            .find(|(line, _)| *line == id)
            .map(|(_, text)| text.as_str())
    }
}

/// The deterministic diagnosis, streaming: [`Pipeline::push`] every line in order, then
/// [`Pipeline::finish`]. See the module docs.
#[derive(Debug)]
pub struct Pipeline<'r> {
    rules: &'r RuleSet,
    opts: PipelineOptions,
    classifier: Classifier<'r>,
    /// `None` only if the default miner settings were invalid, which a test rules out.
    miner: Option<Miner>,
    watchdog: WatchdogScan,
    watchdog_texts: WatchdogTexts,
}

impl<'r> Pipeline<'r> {
    /// A pipeline over `rules`.
    pub fn new(rules: &'r RuleSet, opts: PipelineOptions) -> Self {
        Pipeline {
            rules,
            opts,
            classifier: Classifier::new(rules),
            miner: Miner::new(DrainConfig::default()).ok(),
            watchdog: WatchdogScan::new(),
            watchdog_texts: WatchdogTexts::default(),
        }
    }

    /// Lines pushed so far (the next line's id when ids start at 0).
    pub fn lines(&self) -> u64 {
        self.classifier.lines()
    }

    /// Reads one line. A line without a rank takes it, for template mining, from a
    /// `[rankN]` tag near its start.
    pub fn push(&mut self, line: &LogLine) {
        self.classifier.push(line);
        if self.watchdog.push(line) {
            self.watchdog_texts.keep(line);
        }
        if let Some(miner) = &mut self.miner {
            miner.add(LineRef {
                id: line.id,
                text: &line.text,
                rank: line.rank.or_else(|| rank_tag(&line.text)),
                node: line.node.as_deref(),
                at_ms: line.at_ms,
            });
        }
    }

    /// The answer (see the module docs).
    pub fn finish(self) -> Diagnosis {
        let lines = self.classifier.lines();
        let mut d = self.classifier.diagnosis();
        let templates = self.miner.map(|m| m.templates()).unwrap_or_default();
        let lagging = self.watchdog.finish(self.opts.world_size);

        order_rule_evidence(self.rules, &mut d.evidence);
        let mut notes: Vec<String> = Vec::new();

        if let Some(lag) = &lagging {
            let cited = cite_lagging(lag, &self.watchdog_texts, &mut d.evidence);
            let fills = d.category == Some(Category::NcclTimeoutHang) && d.culprit.ranks.is_empty();
            let lines_said = if cited.is_empty() {
                String::new()
            } else {
                format!(" ({})", line_list(&cited))
            };
            if fills {
                d.culprit.ranks = lag.ranks.iter().copied().take(MAX_CULPRIT_RANKS).collect();
                d.culprit.text = with_ranks(&d.culprit.ranks, &d.culprit.text);
                d.explanation = d.explanation.replace(
                    ". The lines name no culprit",
                    ". The rule lines name no culprit",
                );
                notes.push(format!(
                    "Watchdog analysis: {}{lines_said}; the culprit's rank comes from it.",
                    lag.explanation
                ));
            } else {
                let differs = !d.culprit.ranks.is_empty()
                    && !lag.ranks.iter().all(|r| d.culprit.ranks.contains(r));
                let aside = if differs {
                    let named: Vec<String> = d.culprit.ranks.iter().map(u32::to_string).collect();
                    format!(" (the rules name rank {})", named.join(", "))
                } else {
                    String::new()
                };
                notes.push(format!(
                    "Watchdog analysis: {}{lines_said}{aside}.",
                    lag.explanation
                ));
            }
        }

        if !self.opts.first_failed.is_empty() {
            let first = &self.opts.first_failed;
            let named = rank_list(first);
            if d.culprit.ranks.is_empty() {
                d.culprit.ranks = first.iter().copied().take(MAX_CULPRIT_RANKS).collect();
                d.culprit.text = with_ranks(&d.culprit.ranks, &d.culprit.text);
                d.explanation = d.explanation.replace(
                    ". The lines name no culprit",
                    ". The rule lines name no culprit",
                );
                notes.push(format!(
                    "Rank {named} failed first (process exits); the culprit's rank comes from \
                     the exits, the others' lines are what they saw of it."
                ));
            } else if !d.culprit.ranks.iter().any(|r| first.contains(r)) {
                notes.push(format!(
                    "Rank {named} failed first (process exits), before the rank(s) the lines name."
                ));
            }
        }

        let onset_line = self
            .opts
            .onset_line
            .or_else(|| first_winning_line(self.rules, &d.evidence));
        let onset_at_ms = self
            .opts
            .onset_at_ms
            .or_else(|| onset_line.and_then(|line| time_near_line(&templates, line)));
        let suspect_node = match (&self.opts.suspect_node, d.culprit.nodes.as_slice()) {
            (Some(node), _) => Some(node.clone()),
            (None, [only]) => Some(only.clone()),
            (None, _) => None,
        };
        let query = EvidenceQuery {
            onset_at_ms,
            onset_line,
            culprit_node: suspect_node,
            total_ranks: watchdog::believed_world_size(self.opts.world_size).map(u64::from),
            max_lines: templates.len(),
            ..EvidenceQuery::default()
        };
        let matched = d.category.is_some();
        let room = self.opts.max_evidence.saturating_sub(d.evidence.len());
        let picked = pick_templates(&templates, &query, &d.evidence, matched, room);
        let picked_ids: Vec<u64> = picked.iter().map(|e| e.id).collect();
        d.evidence.extend(picked);
        d.evidence.truncate(self.opts.max_evidence);

        if matched {
            if !picked_ids.is_empty() {
                notes.push(format!(
                    "Template mining adds {} rare line(s) no rule matched: {}.",
                    picked_ids.len(),
                    line_list(&picked_ids)
                ));
            }
        } else if picked_ids.is_empty() {
            d.explanation =
                format!("no rule matched any of the {lines} line(s) and no template stood out");
        } else {
            let near = if self.opts.onset_at_ms.is_some() || self.opts.onset_line.is_some() {
                "near the given onset"
            } else {
                "towards the end of the log"
            };
            d.explanation = format!(
                "no rule matched any of the {lines} line(s), so the category is unknown. \
                 The evidence is the {} rarest template(s), {near}: {}; read them to \
                 judge the failure",
                picked_ids.len(),
                line_list(&picked_ids)
            );
            d.confidence = 0.0;
        }
        for note in notes {
            if !d.explanation.ends_with('.') {
                d.explanation.push('.');
            }
            d.explanation.push(' ');
            d.explanation.push_str(&note);
        }
        d
    }
}

/// The ranks as words, at most [`watchdog::MAX_LISTED_RANKS`] of them by number (the
/// first deaths are a caller's list, as long as it likes).
fn rank_list(ranks: &[u32]) -> String {
    let mut out = ranks
        .iter()
        .take(watchdog::MAX_LISTED_RANKS)
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(more) = ranks
        .len()
        .checked_sub(watchdog::MAX_LISTED_RANKS)
        .filter(|&m| m > 0)
    {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

/// Runs the pipeline over `lines` (see the module docs).
pub fn diagnose_lines(rules: &RuleSet, lines: &[LogLine], opts: &PipelineOptions) -> Diagnosis {
    let mut pipeline = Pipeline::new(rules, opts.clone());
    for line in lines {
        pipeline.push(line);
    }
    pipeline.finish()
}

/// Rank of a rule's role for evidence order: causes, symptoms, context.
fn role_rank(rules: &RuleSet, rule_id: Option<&str>) -> u8 {
    let role = rule_id.and_then(|id| rules.rules().iter().find(|r| r.id == id).map(|r| r.role));
    match role {
        Some(Role::Cause) => 0,
        Some(Role::Symptom) => 1,
        Some(Role::Context) | None => 2,
    }
}

/// Whether a classifier evidence line is one of another category's.
fn other_category(e: &EvidenceLine) -> bool {
    e.reason.starts_with("rule (other")
}

/// The winner's lines first, causes before symptoms before context; then the other
/// categories' lines. Stable within each group.
fn order_rule_evidence(rules: &RuleSet, evidence: &mut [EvidenceLine]) {
    evidence.sort_by_cached_key(|e| (other_category(e), role_rank(rules, e.rule_id.as_deref())));
}

/// The first line of the winning category's hits cited, causes preferred.
fn first_winning_line(rules: &RuleSet, evidence: &[EvidenceLine]) -> Option<u64> {
    let winners = || {
        evidence
            .iter()
            .filter(|e| e.reason == "rule")
            .map(|e| (role_rank(rules, e.rule_id.as_deref()), e.id))
    };
    let best_role = winners().map(|(role, _)| role).min()?;
    winners()
        .filter(|(role, _)| *role == best_role)
        .map(|(_, id)| id)
        .min()
}

/// The time of `line`, read off the templates' first and last lines: the nearest known
/// time at or before it, else the nearest after it.
fn time_near_line(templates: &[Template], line: u64) -> Option<i64> {
    let points = templates.iter().flat_map(|t| {
        [
            t.first_at_ms.map(|at| (t.first_line, at)),
            t.last_at_ms.map(|at| (t.last_line, at)),
        ]
        .into_iter()
        .flatten()
    });
    let mut before: Option<(u64, i64)> = None;
    let mut after: Option<(u64, i64)> = None;
    for (l, at) in points {
        if l <= line {
            if before.is_none_or(|(b, _)| l > b) {
                before = Some((l, at));
            }
        } else if after.is_none_or(|(a, _)| l < a) {
            after = Some((l, at));
        }
    }
    before.or(after).map(|(_, at)| at)
}

/// Adds the watchdog lines that show the lagging ranks (laggards first, then one rank
/// that was ahead) to the evidence; returns the ids cited.
fn cite_lagging(
    lag: &LaggingRanks,
    texts: &WatchdogTexts,
    evidence: &mut Vec<EvidenceLine>,
) -> Vec<u64> {
    let ids = &lag.evidence;
    let chosen: Vec<u64> = if ids.len() > MAX_LAGGING_EVIDENCE {
        ids.iter()
            .take(MAX_LAGGING_EVIDENCE - 1)
            .chain(ids.last())
            .copied()
            .collect()
    } else {
        ids.clone()
    };
    let mut cited = Vec::new();
    for id in chosen {
        if evidence.iter().any(|e| e.id == id) {
            cited.push(id);
            continue;
        }
        if let Some(text) = texts.text(id) {
            evidence.push(EvidenceLine {
                id,
                text: text.to_owned(),
                rule_id: None,
                reason: format!("lagging-rank ({})", lag.reason.as_str()),
                score: LAGGING_SCORE,
            });
            cited.push(id);
        }
    }
    cited
}

/// The best rare-template lines not already cited, at most `room`; with `near_only`,
/// only templates first seen near the onset.
fn pick_templates(
    templates: &[Template],
    query: &EvidenceQuery,
    cited: &[EvidenceLine],
    near_only: bool,
    room: usize,
) -> Vec<EvidenceLine> {
    if room == 0 {
        return Vec::new();
    }
    let by_id: BTreeMap<u64, &Template> = templates.iter().map(|t| (t.sample_line, t)).collect();
    let mut masked = String::new();
    let cited_tokens: Vec<Vec<String>> = cited
        .iter()
        .map(|e| {
            e.text
                .split_whitespace()
                .map(|tok| {
                    mask_token(tok, &mut masked);
                    masked.clone()
                })
                .collect()
        })
        .collect();
    select_evidence(templates, query)
        .into_iter()
        .filter(|e| {
            e.reason.starts_with("rare-template") && (!near_only || e.reason.contains("+onset"))
        })
        .filter(|e| !cited.iter().any(|c| c.id == e.id))
        .filter(|e| {
            by_id
                .get(&e.id)
                .is_none_or(|t| !cited_tokens.iter().any(|line| fits(&t.text, line)))
        })
        .take(room)
        .collect()
}

/// Whether a line (its masked tokens) is an instance of a template's text.
fn fits(template: &str, line: &[String]) -> bool {
    // A shortened line ("…" at its end) is compared up to its last whole word.
    let shortened = line.last().is_some_and(|w| w.ends_with('…'));
    let whole = if shortened {
        &line[..line.len() - 1]
    } else {
        line
    };
    let mut tokens = template.split_whitespace();
    let mut words = whole.iter();
    loop {
        match (tokens.next(), words.next()) {
            (None, None) => return true,
            (Some(t), Some(w)) => {
                if t != "<*>" && t != w {
                    return false;
                }
            }
            (Some(_), None) => return shortened,
            (None, Some(_)) => return false,
        }
    }
}

/// The culprit text with the ranks put first ("rank 6, host n1").
fn with_ranks(ranks: &[u32], text: &str) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    let word = if ranks.len() > 1 { "ranks" } else { "rank" };
    let lead = format!("{word} {}", list.join(", "));
    if text.is_empty() || text == "not named in the logs" {
        lead
    } else {
        format!("{lead}, {text}")
    }
}

fn line_list(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!("line {}", list.join(", "))
}

/// The global rank of a `[rankN]` tag near the start of a line.
fn rank_tag(text: &str) -> Option<u32> {
    let bytes = text.as_bytes();
    let head = &bytes[..bytes.len().min(RANK_TAG_SPAN)];
    let at = head.windows(5).position(|w| w == b"[rank")?;
    let rest = &bytes[at + 5..];
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 9 || rest.get(digits) != Some(&b']') {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

fn shorten(text: &str) -> String {
    if text.len() <= TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loggen::{GenConfig, GenSummary, LogGen};

    fn rules() -> RuleSet {
        RuleSet::builtin().expect("shipped rules load")
    }

    /// Lines without origin fields, ids from 0.
    fn plain(texts: &[String]) -> Vec<LogLine> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| LogLine {
                id: i as u64,
                text: t.clone(),
                ..LogLine::default()
            })
            .collect()
    }

    /// A generated log with node, rank and time on every line, and its ground truth.
    fn generated(nodes: u32, inject_failure: bool) -> (Vec<LogLine>, GenSummary) {
        let mut generator = LogGen::new(GenConfig {
            nodes,
            gpus_per_node: 8,
            target_bytes: 1_500_000,
            inject_failure,
            ..GenConfig::default()
        });
        let mut lines = Vec::new();
        let mut text = String::new();
        while let Some(g) = generator.next_line(&mut text) {
            lines.push(LogLine {
                id: g.id,
                node: Some(format!("gpu-node-{:03}", g.node)),
                rank: g.rank,
                at_ms: Some(g.at_ms),
                text: text.clone(),
            });
        }
        (lines, generator.summary().clone())
    }

    fn timeout(rank: u32, seq: u64) -> String {
        format!(
            "[rank{rank}]:[E1003 18:37:01.833 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out."
        )
    }

    fn iteration(rank: u32, step: u32) -> String {
        format!(
            "[rank{rank}]: iteration {step:>6}/ 100000 | consumed samples: {} | elapsed time per iteration (ms): {} | lm loss: 2.{:04}",
            step * 512,
            900 + (step * 7 + rank) % 50,
            (step * 31 + rank * 7) % 10_000
        )
    }

    /// What an answer must show.
    #[derive(Debug, Default)]
    struct Expect {
        category: Option<Category>,
        ranks: Vec<u32>,
        nodes: Vec<String>,
        /// Words the explanation must contain.
        explains: Vec<&'static str>,
        /// The first evidence line's reason starts with this.
        first_reason: &'static str,
        /// Every evidence line's id must be one of these, when given.
        evidence_within: Option<Vec<u64>>,
    }

    fn check(name: &str, lines: &[LogLine], opts: &PipelineOptions, want: &Expect) -> Diagnosis {
        let d = diagnose_lines(&rules(), lines, opts);
        let ctx = format!("{name}: {d:#?}");
        assert_eq!(d.category, want.category, "{ctx}");
        assert_eq!(d.culprit.ranks, want.ranks, "{ctx}");
        for node in &want.nodes {
            assert!(d.culprit.nodes.contains(node), "{ctx}");
        }
        for words in &want.explains {
            assert!(d.explanation.contains(words), "{words:?} missing; {ctx}");
        }
        assert!(!d.evidence.is_empty(), "{ctx}");
        assert!(d.evidence.len() <= opts.max_evidence, "{ctx}");
        assert!(d.evidence[0].reason.starts_with(want.first_reason), "{ctx}");
        let mut ids: Vec<u64> = d.evidence.iter().map(|e| e.id).collect();
        for e in &d.evidence {
            let line = lines
                .iter()
                .find(|l| l.id == e.id)
                .expect("cited line exists");
            let stem = e.text.trim_end_matches('…');
            assert!(
                line.text.starts_with(stem),
                "{name}: {} is not line {}",
                e.text,
                e.id
            );
            if let Some(within) = &want.evidence_within {
                assert!(
                    within.contains(&e.id),
                    "{name}: line {} cited: {}",
                    e.id,
                    e.text
                );
            }
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), d.evidence.len(), "a line is cited once; {ctx}");
        d
    }

    #[test]
    fn default_miner_settings_are_valid() {
        assert_eq!(DrainConfig::default().validate(), Ok(()));
        let rules = rules();
        assert!(
            Pipeline::new(&rules, PipelineOptions::default())
                .miner
                .is_some()
        );
    }

    /// Invariant: the world size and the first deaths are a client's numbers; neither
    /// sizes the work nor the answer. A hang and a crash with `world_size` 2^32 - 1 and
    /// ranks near the top of the range answer at once, with bounded text.
    #[test]
    fn a_client_world_size_never_sizes_the_diagnosis() {
        let top = u32::MAX;
        let mut lines: Vec<LogLine> = (0..7u32)
            .map(|i| timeout(top - i, 100))
            .chain([format!("[rank{}]: iteration 99 | lm loss 2.1", top - 7)])
            .enumerate()
            .map(|(i, text)| LogLine {
                id: i as u64,
                text,
                ..LogLine::default()
            })
            .collect();
        lines.rotate_right(1);
        for (i, l) in lines.iter_mut().enumerate() {
            l.id = i as u64;
        }
        let rules = rules();
        for first_failed in [Vec::new(), (8..5008u32).map(|i| top - i).collect()] {
            let opts = PipelineOptions {
                world_size: Some(u32::MAX),
                first_failed,
                ..PipelineOptions::default()
            };
            let d = diagnose_lines(&rules, &lines, &opts);
            assert!(d.evidence.len() <= opts.max_evidence, "{d:#?}");
            assert!(d.culprit.ranks.len() <= MAX_CULPRIT_RANKS, "{d:#?}");
            assert!(
                d.explanation.len() < 2000,
                "{} bytes: {}",
                d.explanation.len(),
                d.explanation
            );
            assert!(d.culprit.ranks.iter().all(|&r| r > top - 5008), "{d:#?}");
        }
    }

    #[test]
    fn a_crash_names_the_rank_that_died_first_not_the_peers_that_lost_it() {
        // Rank 3 was killed (no line of its own); ranks 0 and 2 fail in gloo when their
        // connection to it breaks, with a Python exception on each.
        let gloo = |rank: u32, port: u32| {
            format!(
                "[rank{rank}]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:{port}: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. Check the logs of the remote worker before reporting an error."
            )
        };
        let lines: Vec<LogLine> = [(0, 13696), (2, 6284)]
            .iter()
            .enumerate()
            .map(|(i, &(rank, port))| LogLine {
                id: i as u64,
                node: Some(if rank < 2 { "node-a" } else { "node-b" }.to_owned()),
                rank: Some(rank),
                at_ms: None,
                text: gloo(rank, port),
            })
            .collect();
        let rules = rules();
        let without = diagnose_lines(&rules, &lines, &PipelineOptions::default());
        assert_ne!(
            without.category,
            Some(Category::UserCodeError),
            "{without:#?}"
        );
        assert!(without.culprit.ranks.is_empty(), "{without:#?}");
        let opts = PipelineOptions {
            world_size: Some(4),
            first_failed: vec![3],
            ..PipelineOptions::default()
        };
        let d = diagnose_lines(&rules, &lines, &opts);
        assert_eq!(d.culprit.ranks, vec![3], "{d:#?}");
        assert!(
            d.explanation.contains("Rank 3 failed first"),
            "{}",
            d.explanation
        );
        assert!(
            d.rule_ids.iter().any(|r| r == "network.gloo_peer_lost"),
            "{d:#?}"
        );
    }

    #[test]
    fn generated_fault_gets_the_right_category_and_culprit() {
        let (lines, truth) = generated(4, true);
        let node = truth.culprit_node.clone().expect("failure injected");
        let rank = truth.culprit_rank.expect("failure injected");
        let opts = PipelineOptions {
            world_size: Some(truth.world_size),
            ..PipelineOptions::default()
        };
        let d = check(
            "generated xid",
            &lines,
            &opts,
            &Expect {
                category: Some(Category::GpuHardwareXid),
                nodes: vec![node.clone()],
                explains: vec!["Watchdog analysis", "last enqueued collective"],
                first_reason: "rule",
                ..Expect::default()
            },
        );
        assert!(d.evidence[0].text.contains("Xid"), "{d:#?}");
        assert_eq!(d.culprit.nodes, vec![node], "one node is blamed");
        // The watchdog's finding is told (rank and lines) but, outside a hang, does
        // not enter the culprit.
        assert!(
            d.explanation.contains(&format!("rank(s) {rank} ")),
            "{}",
            d.explanation
        );
        let lagging: Vec<&EvidenceLine> = d
            .evidence
            .iter()
            .filter(|e| e.reason.starts_with("lagging-rank"))
            .collect();
        assert!(!lagging.is_empty(), "{d:#?}");
        assert!(lagging[0].text.contains(&format!("Rank {rank}]")), "{d:#?}");
        // Every fault line the generator injected that is cited is a real fault line,
        // and the fault lines lead the evidence.
        let fault = |id: u64| truth.fault_lines.contains(&id);
        assert!(d.evidence.iter().take(3).all(|e| fault(e.id)), "{d:#?}");
    }

    #[test]
    fn silent_rank_completes_a_hang_culprit() {
        // Ranks 0..8 except 6 time out on the same collective; rank 6 printed before.
        let mut texts: Vec<String> = (0..8).map(|r| iteration(r, 99)).collect();
        texts.extend((0..8u32).filter(|&r| r != 6).map(|r| timeout(r, 100)));
        let lines = plain(&texts);
        let timeouts: Vec<u64> = (8..15).collect();
        let d = check(
            "silent rank",
            &lines,
            &PipelineOptions {
                world_size: Some(8),
                ..PipelineOptions::default()
            },
            &Expect {
                category: Some(Category::NcclTimeoutHang),
                ranks: vec![6],
                explains: vec![
                    "Watchdog analysis",
                    "rank(s) 6 never reported",
                    "the culprit's rank comes from it",
                    "The rule lines name no culprit",
                ],
                first_reason: "rule",
                evidence_within: None,
                ..Expect::default()
            },
        );
        assert!(d.culprit.text.starts_with("rank 6"), "{}", d.culprit.text);
        for e in &d.evidence {
            assert!(
                timeouts.contains(&e.id) || e.reason.starts_with("rare-template"),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_rank_the_rules_name_is_not_replaced() {
        // Rank 3 is behind in enqueued work, but the rules already blame rank 5 (OOM).
        let mut texts: Vec<String> = (0..8u32)
            .filter(|&r| r != 3)
            .map(|r| timeout(r, 100))
            .collect();
        texts.push(timeout(3, 99));
        texts.push(
            "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.10 GiB of which 1.00 GiB is free.".to_owned(),
        );
        let lines = plain(&texts);
        check(
            "rules rank kept",
            &lines,
            &PipelineOptions::default(),
            &Expect {
                category: Some(Category::GpuOom),
                ranks: vec![5],
                explains: vec![
                    "Watchdog analysis",
                    "rank(s) 3 timed-out",
                    "the rules name rank 5",
                ],
                first_reason: "rule",
                ..Expect::default()
            },
        );
    }

    #[test]
    fn noise_only_log_has_no_category_but_template_evidence() {
        let mut texts = vec![
            "[rank0]: > building GPT2BPETokenizer tokenizer ...".to_owned(),
            "[rank0]: > initializing torch distributed ...".to_owned(),
        ];
        for step in 1..=200 {
            for rank in 0..4 {
                texts.push(iteration(rank, step));
            }
        }
        texts.push("[rank2]: saving checkpoint at iteration 200 to /ckpt/iter_0000200".to_owned());
        let lines = plain(&texts);
        let last = lines.len() as u64 - 1;
        let d = check(
            "noise only",
            &lines,
            &PipelineOptions::default(),
            &Expect {
                category: None,
                explains: vec!["no rule matched any of the 803 line(s)", "rarest template"],
                first_reason: "rare-template",
                evidence_within: Some(vec![0, 1, last]),
                ..Expect::default()
            },
        );
        assert_eq!(d.confidence, 0.0);
        assert_eq!(d.fault_locus, None);
        assert!(d.rule_ids.is_empty());
        // Nearest the end of the log ranks first.
        assert_eq!(d.evidence[0].id, last, "{d:#?}");
    }

    #[test]
    fn nothing_rare_and_nothing_matched_says_so() {
        let texts: Vec<String> = (1..=300).map(|s| iteration(0, s)).collect();
        let d = diagnose_lines(&rules(), &plain(&texts), &PipelineOptions::default());
        assert_eq!(d.category, None);
        assert!(d.evidence.is_empty(), "{d:#?}");
        assert_eq!(
            d.explanation,
            "no rule matched any of the 300 line(s) and no template stood out"
        );
    }

    #[test]
    fn rule_lines_come_first_causes_before_symptoms_and_the_cap_holds() {
        // A hang whose rules see a cause (an IB error) after many symptoms.
        let mut texts: Vec<String> = (0..16).map(|r| iteration(r, 1)).collect();
        texts.extend((0..16u32).map(|r| timeout(r, 100)));
        texts.push("gpu-node-003:4242:4300 [2] NCCL WARN NET/IB : Got completion from peer 10.0.0.7<45123> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.3 remoteGid ::ffff:10.0.0.7 hca mlx5_2".to_owned());
        let lines = plain(&texts);
        for max_evidence in [3, 20] {
            let opts = PipelineOptions {
                max_evidence,
                ..PipelineOptions::default()
            };
            let d = diagnose_lines(&rules(), &lines, &opts);
            assert!(d.evidence.len() <= max_evidence, "{d:#?}");
            assert_eq!(d.evidence[0].id, 32, "the cause leads: {d:#?}");
            let rules = rules();
            let roles: Vec<u8> = d
                .evidence
                .iter()
                .take_while(|e| e.reason == "rule")
                .map(|e| role_rank(&rules, e.rule_id.as_deref()))
                .collect();
            assert!(roles.windows(2).all(|w| w[0] <= w[1]), "{roles:?} {d:#?}");
        }
    }

    #[test]
    fn a_given_onset_moves_template_evidence() {
        // Two one-off lines, far apart; the onset picks which leads.
        let mut texts = vec!["pcie link retrained on slot 3".to_owned()];
        texts.extend((1..=30_000).map(|s| iteration(0, s)));
        texts.push("fan speed lowered to 40 percent".to_owned());
        let lines = plain(&texts);
        let end = lines.len() as u64 - 1;
        let at_start = PipelineOptions {
            onset_line: Some(0),
            ..PipelineOptions::default()
        };
        let d = diagnose_lines(&rules(), &lines, &at_start);
        assert_eq!(d.evidence[0].id, 0, "{d:#?}");
        assert!(
            d.explanation.contains("near the given onset"),
            "{}",
            d.explanation
        );
        let d = diagnose_lines(&rules(), &lines, &PipelineOptions::default());
        assert_eq!(d.evidence[0].id, end, "{d:#?}");
    }

    #[test]
    fn template_fit_and_rank_tags() {
        let mut s = String::new();
        let masked = |line: &str, s: &mut String| -> Vec<String> {
            line.split_whitespace()
                .map(|t| {
                    mask_token(t, s);
                    s.clone()
                })
                .collect()
        };
        let cases = [
            (
                "[Rank <*>] Watchdog caught <*>",
                "[Rank 7] Watchdog caught 12",
                true,
            ),
            (
                "[Rank <*>] Watchdog caught <*>",
                "[Rank 7] Watchdog caught",
                false,
            ),
            (
                "[Rank <*>] Watchdog caught <*>",
                "[Rank 7] Watchdog missed 12",
                false,
            ),
            ("a b c d", "a b…", true),
            ("a b", "a b c", false),
        ];
        for (template, line, want) in cases {
            assert_eq!(
                fits(template, &masked(line, &mut s)),
                want,
                "{template} / {line}"
            );
        }
        for (text, want) in [
            (
                "2024-05-14T03:00:00.000Z gpu-node-001 [rank12]: iteration 5",
                Some(12),
            ),
            ("[rank3]:[E ProcessGroupNCCL.cpp:632] ...", Some(3)),
            ("[rank]: nothing", None),
            ("[rank12 no bracket", None),
            ("rank 4 without a tag", None),
        ] {
            assert_eq!(rank_tag(text), want, "{text}");
        }
        assert_eq!(with_ranks(&[6], "not named in the logs"), "rank 6");
        assert_eq!(with_ranks(&[1, 2], "host n1"), "ranks 1, 2, host n1");
    }
}
