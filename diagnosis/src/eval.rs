//! Scoring the rules against a labelled corpus (JSON lines of `id`, `category`,
//! `fault_locus`, `culprit`, `excerpt`): category, locus and culprit accuracy and a
//! confusion matrix.
//!
//! Culprit scoring: the label's culprit text and our culprit are both reduced to typed
//! entities — rank, local rank, host (short name, lower case), GPU index, PCI bus id
//! (normalised), GPU UUID, device minor number, pid, address (IP with an optional port),
//! network device (mlx5_N with an optional port), DataLoader worker. A case is right when
//! at least one of our entities equals one of the label's, and none of ours contradicts
//! the label: every entity we name of a kind the label also names must be among the
//! label's. Addresses and devices match when one side leaves the port out. Cases whose
//! label names no culprit (null) are not scored, nor are labels with no entity we can
//! read (counted as `unparsed`). Job ids and serial numbers are not scored.

use std::collections::BTreeMap;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::classify::{Classifier, normalize_pci};
use crate::input::{LineReader, for_each_line};
use crate::model::{Category, Culprit, Diagnosis, FaultLocus, LogLine};
use crate::rules::RuleSet;

/// One labelled case.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    /// Case id.
    pub id: String,
    /// Expected category.
    pub category: Category,
    /// Expected locus.
    pub fault_locus: FaultLocus,
    /// Expected culprit, in words; `None` when the excerpt does not show one.
    #[serde(default)]
    pub culprit: Option<String>,
    /// The log excerpt.
    pub excerpt: String,
    /// Where the case came from.
    #[serde(default)]
    pub source: Option<String>,
    /// The message family the case stands for (docs/DIAGNOSIS.md lists them).
    #[serde(default)]
    pub family: Option<String>,
}

/// Why a corpus could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Lines that are not valid cases; every one is listed.
    #[error("{} bad case(s) in the corpus:\n{}", .0.len(), .0.join("\n"))]
    BadCases(Vec<String>),
    /// No case at all.
    #[error("the corpus has no cases")]
    Empty,
    /// A built-in pattern failed to compile.
    #[error("internal pattern error: {0}")]
    Pattern(#[from] regex::Error),
}

/// Parse a JSON-lines corpus; blank lines are skipped, every bad line is reported.
pub fn parse_corpus(text: &str) -> Result<Vec<Case>, EvalError> {
    let mut cases = Vec::new();
    let mut bad = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Case>(line) {
            Ok(c) => cases.push(c),
            Err(e) => bad.push(format!("  line {}: {e}", n + 1)),
        }
    }
    if !bad.is_empty() {
        return Err(EvalError::BadCases(bad));
    }
    if cases.is_empty() {
        return Err(EvalError::Empty);
    }
    Ok(cases)
}

/// The first case id that appears twice in `cases`, if any.
pub fn duplicate_id(cases: &[Case]) -> Option<&str> {
    let mut seen = std::collections::BTreeSet::new();
    cases
        .iter()
        .map(|c| c.id.as_str())
        .find(|id| !seen.insert(*id))
}

/// What the rules answered for one case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseResult {
    /// Case id.
    pub id: String,
    /// Labelled category.
    pub expected: Category,
    /// Our category.
    pub got: Option<Category>,
    /// Labelled locus.
    pub expected_locus: FaultLocus,
    /// Our locus.
    pub got_locus: Option<FaultLocus>,
    /// Labelled culprit.
    pub expected_culprit: Option<String>,
    /// Our culprit, in words.
    pub got_culprit: String,
    /// Culprit verdict; `None` when not scored.
    pub culprit_correct: Option<bool>,
    /// Our confidence.
    pub confidence: f64,
    /// Rules behind our answer.
    pub rule_ids: Vec<String>,
}

/// The evaluation of a rule set on a corpus.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Cases evaluated.
    pub cases: usize,
    /// Right category.
    pub category_correct: usize,
    /// Right locus.
    pub locus_correct: usize,
    /// Cases whose label names a culprit we can read.
    pub culprit_scored: usize,
    /// Of those, right culprit.
    pub culprit_correct: usize,
    /// Cases whose label names a culprit with no entity we can read.
    pub culprit_unparsed: usize,
    /// Per case.
    pub results: Vec<CaseResult>,
}

impl Evaluation {
    /// Share of cases with the right category.
    pub fn category_accuracy(&self) -> f64 {
        ratio(self.category_correct, self.cases)
    }

    /// Share of cases with the right locus.
    pub fn locus_accuracy(&self) -> f64 {
        ratio(self.locus_correct, self.cases)
    }

    /// Share of scored culprits that are right.
    pub fn culprit_accuracy(&self) -> f64 {
        ratio(self.culprit_correct, self.culprit_scored)
    }

    /// (label, answer) → count.
    pub fn confusion(&self) -> BTreeMap<(Category, Option<Category>), usize> {
        let mut m = BTreeMap::new();
        for r in &self.results {
            *m.entry((r.expected, r.got)).or_insert(0) += 1;
        }
        m
    }

    /// The report as Markdown: summary, confusion matrix, misses.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "Rule-only evaluation, {} cases\n\n| metric | value |\n|---|---|\n",
            self.cases
        ));
        out.push_str(&format!(
            "| category accuracy | {:.3} ({}/{}) |\n",
            self.category_accuracy(),
            self.category_correct,
            self.cases
        ));
        out.push_str(&format!(
            "| fault locus accuracy | {:.3} ({}/{}) |\n",
            self.locus_accuracy(),
            self.locus_correct,
            self.cases
        ));
        out.push_str(&format!(
            "| culprit accuracy | {:.3} ({}/{} cases whose label names a culprit; {} unparsed) |\n\n",
            self.culprit_accuracy(),
            self.culprit_correct,
            self.culprit_scored,
            self.culprit_unparsed
        ));
        out.push_str("Confusion matrix (rows: label, columns: answer; `-`: no answer)\n\n");
        out.push_str("| label \\ answer |");
        for c in Category::ALL {
            out.push_str(&format!(" {} |", short(c)));
        }
        out.push_str(" - |\n|---|");
        out.push_str(&"---:|".repeat(Category::ALL.len() + 1));
        out.push('\n');
        let confusion = self.confusion();
        for label in Category::ALL {
            if !self.results.iter().any(|r| r.expected == label) {
                continue;
            }
            out.push_str(&format!("| {label} |"));
            let answers = Category::ALL.map(Some).into_iter().chain([None]);
            for answer in answers {
                let n = confusion.get(&(label, answer)).copied().unwrap_or(0);
                let cell = match n {
                    0 => String::new(),
                    n if answer == Some(label) => format!("**{n}**"),
                    n => n.to_string(),
                };
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
        out.push_str("\nColumns: ");
        let legend: Vec<String> = Category::ALL
            .iter()
            .map(|c| format!("{} = {c}", short(*c)))
            .collect();
        out.push_str(&legend.join(", "));
        out.push('\n');
        let misses: Vec<&CaseResult> = self
            .results
            .iter()
            .filter(|r| {
                r.got != Some(r.expected)
                    || r.got_locus != Some(r.expected_locus)
                    || r.culprit_correct == Some(false)
            })
            .collect();
        if !misses.is_empty() {
            out.push_str("\nMisses\n\n| case | category | locus | culprit (label → ours) |\n|---|---|---|---|\n");
            for r in misses {
                let cat = if r.got == Some(r.expected) {
                    "ok".to_owned()
                } else {
                    format!("{} → {}", r.expected, label_or_dash(r.got))
                };
                let locus = if r.got_locus == Some(r.expected_locus) {
                    "ok".to_owned()
                } else {
                    format!("{} → {}", r.expected_locus, label_or_dash(r.got_locus))
                };
                let culprit = if r.culprit_correct == Some(false) {
                    format!(
                        "{} → {}",
                        r.expected_culprit.as_deref().unwrap_or("-"),
                        r.got_culprit
                    )
                } else {
                    "ok".to_owned()
                };
                out.push_str(&format!("| {} | {cat} | {locus} | {culprit} |\n", r.id));
            }
        }
        out
    }
}

fn label_or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn short(c: Category) -> &'static str {
    match c {
        Category::NcclTimeoutHang => "hang",
        Category::NetworkIbError => "net",
        Category::GpuHardwareXid => "xid",
        Category::EccMemoryError => "ecc",
        Category::CudaRuntimeError => "cuda",
        Category::GpuOom => "gpu-oom",
        Category::NanInfLoss => "nan",
        Category::HostOomKilled => "host-oom",
        Category::StorageIoError => "io",
        Category::DataloaderError => "data",
        Category::UserCodeError => "user",
        Category::SegfaultNativeCrash => "crash",
        Category::RendezvousLauncherError => "launch",
    }
}

fn ratio(n: usize, d: usize) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// Run the rules on every case and score the answers.
pub fn evaluate(rules: &RuleSet, cases: &[Case]) -> Result<Evaluation, EvalError> {
    evaluate_with(cases, |lines| {
        let mut classifier = Classifier::new(rules);
        for line in lines {
            classifier.push(line);
        }
        classifier.diagnosis()
    })
}

/// Score the answers of `diagnose` (for example the whole pipeline) on every case.
/// `diagnose` gets a case's excerpt as lines; an excerpt that reads as binary gets the
/// lines read before the refusal.
pub fn evaluate_with<F>(cases: &[Case], mut diagnose: F) -> Result<Evaluation, EvalError>
where
    F: FnMut(&[LogLine]) -> Diagnosis,
{
    let parser = EntityParser::new()?;
    let mut eval = Evaluation {
        cases: cases.len(),
        category_correct: 0,
        locus_correct: 0,
        culprit_scored: 0,
        culprit_correct: 0,
        culprit_unparsed: 0,
        results: Vec::with_capacity(cases.len()),
    };
    for case in cases {
        let mut lines = Vec::new();
        let mut reader = LineReader::new(case.excerpt.as_bytes());
        // An excerpt is text already; a case that reads as binary gets no more lines.
        let _ = for_each_line(&mut reader, |l| lines.push(l.clone()));
        let d = diagnose(&lines);
        let culprit_correct = match &case.culprit {
            None => None,
            Some(label) => {
                let expected = parser.parse_label(label);
                if expected.is_empty() {
                    eval.culprit_unparsed += 1;
                    None
                } else {
                    Some(culprit_matches(&expected, &parser.from_culprit(&d.culprit)))
                }
            }
        };
        if d.category == Some(case.category) {
            eval.category_correct += 1;
        }
        if d.fault_locus == Some(case.fault_locus) {
            eval.locus_correct += 1;
        }
        if let Some(ok) = culprit_correct {
            eval.culprit_scored += 1;
            if ok {
                eval.culprit_correct += 1;
            }
        }
        eval.results.push(CaseResult {
            id: case.id.clone(),
            expected: case.category,
            got: d.category,
            expected_locus: case.fault_locus,
            got_locus: d.fault_locus,
            expected_culprit: case.culprit.clone(),
            got_culprit: d.culprit.text.clone(),
            culprit_correct,
            confidence: d.confidence,
            rule_ids: d.rule_ids,
        });
    }
    Ok(eval)
}

/// A typed name of who is at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entity {
    /// Global rank.
    Rank(u32),
    /// Local rank.
    LocalRank(u32),
    /// Host short name, lower case.
    Host(String),
    /// GPU index.
    Gpu(u32),
    /// PCI bus id, normalised.
    Pci(String),
    /// GPU UUID, lower case.
    Uuid(String),
    /// Device minor number.
    Minor(u32),
    /// Process id.
    Pid(u32),
    /// IP address (v4, or v6 in lower case without its zone) and optional port.
    Addr(String, Option<u16>),
    /// Network device and optional port.
    Device(String, Option<u16>),
    /// DataLoader worker id.
    Worker(u32),
    /// A peer named by host name (never in labels; scored as neither right nor wrong).
    PeerHost(String),
}

impl Entity {
    fn kind(&self) -> u8 {
        match self {
            Entity::Rank(_) => 0,
            Entity::LocalRank(_) => 1,
            Entity::Host(_) => 2,
            Entity::Gpu(_) => 3,
            Entity::Pci(_) => 4,
            Entity::Uuid(_) => 5,
            Entity::Minor(_) => 6,
            Entity::Pid(_) => 7,
            Entity::Addr(..) => 8,
            Entity::Device(..) => 9,
            Entity::Worker(_) => 10,
            Entity::PeerHost(_) => 11,
        }
    }

    fn same(&self, other: &Entity) -> bool {
        let port_ok = |a: &Option<u16>, b: &Option<u16>| a.is_none() || b.is_none() || a == b;
        match (self, other) {
            (Entity::Addr(a, p), Entity::Addr(b, q))
            | (Entity::Device(a, p), Entity::Device(b, q)) => a == b && port_ok(p, q),
            _ => self == other,
        }
    }
}

/// Whether `ours` names the label's culprit (see the module docs).
pub fn culprit_matches(label: &[Entity], ours: &[Entity]) -> bool {
    let names_one = ours.iter().any(|o| label.iter().any(|l| l.same(o)));
    let contradicts = ours
        .iter()
        .any(|o| label.iter().any(|l| l.kind() == o.kind()) && !label.iter().any(|l| l.same(o)));
    names_one && !contradicts
}

/// Reads entities out of culprit labels and answers.
#[derive(Debug)]
pub struct EntityParser {
    steps: Vec<(Regex, Step)>,
    addr: Regex,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Uuid,
    Pci,
    Addr,
    Device,
    Minor,
    LocalRank,
    Worker,
    Pid,
    Rank,
    Gpu,
    Host,
    Ignore,
}

impl EntityParser {
    /// Compile the patterns.
    pub fn new() -> Result<Self, regex::Error> {
        let steps = [
            (
                r"(?i)\bGPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",
                Step::Uuid,
            ),
            (
                r"(?i)(?:PCI:)?\b([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?)\b",
                Step::Pci,
            ),
            (r"\b(\d{1,3}(?:\.\d{1,3}){3})(?::(\d{1,5}))?\b", Step::Addr),
            (
                r"(?i)\b((?:[0-9a-f]{1,4}:){1,7}:(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4})*)?|(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4})(?:%[\w.]+)?(?:<(\d{1,5})>)?",
                Step::Addr,
            ),
            (r"\b(mlx\d+_\d+)(?::(\d+))?\b", Step::Device),
            (r"(?i)\bminor(?: number)?\s*(\d+)", Step::Minor),
            (r"(?i)\blocal[_ ]rank[\s:=]*(\d+)", Step::LocalRank),
            (r"(?i)\bworker(?: process)?\s+(\d+)\b", Step::Worker),
            (r"(?i)\bpid[\s:=]*(\d+)", Step::Pid),
            (r"(?i)\b(?:slurm )?job\s+\d+|\bserial\s+\d+", Step::Ignore),
            (r"(?i)\branks?[\s:=]*(\d+)", Step::Rank),
            // A host named as one ("host gpu014") before GPU indexes, which would read
            // its name as GPU 14.
            (r"(?i)\b(?:host|node)\s+([a-z][\w.-]*)", Step::Host),
            (r"(?i)\b(?:local )?GPU\s*(\d+)\b", Step::Gpu),
            (r"\b([a-z][a-z0-9]*(?:-[a-z0-9]+)*-\d+)\b", Step::Host),
        ];
        Ok(EntityParser {
            steps: steps
                .into_iter()
                .map(|(p, s)| Regex::new(p).map(|r| (r, s)))
                .collect::<Result<_, _>>()?,
            addr: Regex::new(
                r"(?i)^(?:(\d{1,3}(?:\.\d{1,3}){3})(?::(\d{1,5}))?|([0-9a-f:]*:[0-9a-f:]*:[0-9a-f:]*)(?:%[\w.]+)?(?:<(\d{1,5})>)?)$",
            )?,
        })
    }

    /// The entities a culprit label names.
    pub fn parse_label(&self, text: &str) -> Vec<Entity> {
        let mut text = text.to_owned();
        let mut out = Vec::new();
        for (re, step) in &self.steps {
            let mut spans = Vec::new();
            for caps in re.captures_iter(&text) {
                let Some(whole) = caps.get(0) else { continue };
                spans.push(whole.range());
                let first = caps.get(1).map(|m| m.as_str());
                let second = caps.get(2).map(|m| m.as_str());
                let number = first.and_then(|s| s.parse::<u32>().ok());
                let entity = match step {
                    Step::Uuid => Some(Entity::Uuid(whole.as_str().to_ascii_lowercase())),
                    Step::Pci => first.and_then(normalize_pci).map(Entity::Pci),
                    Step::Addr => first.map(|ip| {
                        Entity::Addr(ip.to_ascii_lowercase(), second.and_then(|p| p.parse().ok()))
                    }),
                    Step::Device => first
                        .map(|d| Entity::Device(d.to_owned(), second.and_then(|p| p.parse().ok()))),
                    Step::Minor => number.map(Entity::Minor),
                    Step::LocalRank => number.map(Entity::LocalRank),
                    Step::Worker => number.map(Entity::Worker),
                    Step::Pid => number.map(Entity::Pid),
                    Step::Rank => number.map(Entity::Rank),
                    Step::Gpu => number.map(Entity::Gpu),
                    Step::Host => first.map(|h| Entity::Host(short_host(h))),
                    Step::Ignore => None,
                };
                if let Some(e) = entity
                    && !out.contains(&e)
                {
                    out.push(e);
                }
            }
            for span in spans {
                text.replace_range(span.clone(), &" ".repeat(span.len()));
            }
        }
        out
    }

    /// The entities our culprit names.
    pub fn from_culprit(&self, c: &Culprit) -> Vec<Entity> {
        let mut out = Vec::new();
        out.extend(c.ranks.iter().map(|r| Entity::Rank(*r)));
        out.extend(c.local_ranks.iter().map(|r| Entity::LocalRank(*r)));
        out.extend(c.pids.iter().map(|p| Entity::Pid(*p)));
        out.extend(c.workers.iter().map(|w| Entity::Worker(*w)));
        for node in &c.nodes {
            out.push(
                self.as_addr(node)
                    .unwrap_or_else(|| Entity::Host(short_host(node))),
            );
        }
        for peer in &c.peers {
            out.push(
                self.as_addr(peer)
                    .unwrap_or_else(|| Entity::PeerHost(short_host(peer))),
            );
        }
        for gpu in &c.gpus {
            let e = if let Ok(i) = gpu.parse::<u32>() {
                Entity::Gpu(i)
            } else if let Some(m) = gpu.strip_prefix("minor ").and_then(|m| m.parse().ok()) {
                Entity::Minor(m)
            } else if gpu.to_ascii_lowercase().starts_with("gpu-") {
                Entity::Uuid(gpu.to_ascii_lowercase())
            } else if let Some(p) = normalize_pci(gpu) {
                Entity::Pci(p)
            } else {
                continue;
            };
            out.push(e);
        }
        for device in &c.devices {
            let (name, port) = match device.split_once(':') {
                Some((n, p)) => (n, p.parse().ok()),
                None => (device.as_str(), None),
            };
            out.push(Entity::Device(name.to_owned(), port));
        }
        out
    }

    fn as_addr(&self, s: &str) -> Option<Entity> {
        let caps = self.addr.captures(s)?;
        let (ip, port) = match caps.get(1) {
            Some(v4) => (v4, caps.get(2)),
            None => (caps.get(3)?, caps.get(4)),
        };
        Some(Entity::Addr(
            ip.as_str().to_ascii_lowercase(),
            port.and_then(|p| p.as_str().parse().ok()),
        ))
    }
}

fn short_host(h: &str) -> String {
    let lower = h.to_ascii_lowercase();
    lower.split('.').next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> EntityParser {
        EntityParser::new().expect("patterns compile")
    }

    #[test]
    fn labels_are_read_into_typed_entities() {
        let p = parser();
        assert_eq!(
            p.parse_label(
                "host gpu-node-15 GPU PCI:0000:41:00 (DBE); GPU 0000:45:00.0 also failing init"
            ),
            vec![
                Entity::Pci("0000:41:00.0".into()),
                Entity::Pci("0000:45:00.0".into()),
                Entity::Host("gpu-node-15".into()),
            ]
        );
        assert_eq!(
            p.parse_label("rank 2 (local_rank 2) on host gpu-node-09, pid 284117"),
            vec![
                Entity::LocalRank(2),
                Entity::Pid(284117),
                Entity::Rank(2),
                Entity::Host("gpu-node-09".into()),
            ]
        );
        assert_eq!(
            p.parse_label("host gpu-node-04 (GPU 2) <-> peer 10.12.8.3"),
            vec![
                Entity::Addr("10.12.8.3".into(), None),
                Entity::Host("gpu-node-04".into()),
                Entity::Gpu(2),
            ]
        );
        assert_eq!(
            p.parse_label("host gpu-node-31 (slurm job 4471829)"),
            vec![Entity::Host("gpu-node-31".into())]
        );
        assert_eq!(
            p.parse_label("DataLoader worker process 2"),
            vec![Entity::Worker(2)]
        );
        assert_eq!(p.parse_label("GPU minor number 2"), vec![Entity::Minor(2)]);
        assert_eq!(
            p.parse_label("host gpu-node-17 (mlx5_3:1)"),
            vec![
                Entity::Device("mlx5_3".into(), Some(1)),
                Entity::Host("gpu-node-17".into()),
            ]
        );
        assert!(p.parse_label("the storage backend").is_empty());
    }

    #[test]
    fn a_host_named_like_a_gpu_is_read_as_the_host() {
        let p = EntityParser::new().expect("patterns");
        assert_eq!(
            p.parse_label("host gpu014"),
            vec![Entity::Host("gpu014".into())]
        );
        assert_eq!(
            p.parse_label("node gpu3, GPU 2"),
            vec![Entity::Host("gpu3".into()), Entity::Gpu(2)]
        );
        assert_eq!(p.parse_label("GPU 14"), vec![Entity::Gpu(14)]);
    }

    #[test]
    fn a_culprit_is_right_when_it_names_the_label_and_contradicts_nothing() {
        let label = [Entity::Host("a".into()), Entity::Gpu(2)];
        assert!(culprit_matches(&label, &[Entity::Host("a".into())]));
        // An extra kind the label does not name is no contradiction.
        assert!(culprit_matches(
            &label,
            &[Entity::Host("a".into()), Entity::Pid(7)]
        ));
        // A second host is.
        assert!(!culprit_matches(
            &label,
            &[Entity::Host("a".into()), Entity::Host("b".into())]
        ));
        // Naming nothing of the label is wrong.
        assert!(!culprit_matches(&label, &[Entity::Pid(7)]));
        assert!(!culprit_matches(&label, &[]));
        // Ports: one side without a port matches.
        assert!(culprit_matches(
            &[Entity::Addr("10.0.0.1".into(), Some(29400))],
            &[Entity::Addr("10.0.0.1".into(), None)]
        ));
        assert!(!culprit_matches(
            &[Entity::Addr("10.0.0.1".into(), Some(29400))],
            &[Entity::Addr("10.0.0.1".into(), Some(1))]
        ));
    }

    #[test]
    fn bad_corpus_lines_are_all_reported() {
        let text = "{\"id\":\"a\"}\n\n{not json}\n";
        let err = parse_corpus(text).expect_err("bad corpus");
        let msg = err.to_string();
        assert!(msg.contains("line 1") && msg.contains("line 3"), "{msg}");
        assert!(matches!(parse_corpus("\n \n"), Err(EvalError::Empty)));
    }
}
