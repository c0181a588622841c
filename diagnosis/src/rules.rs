//! Log rules as data (`rules/logs/*.yaml`): loading with every problem reported at once,
//! each rule's own test lines run at load, and a compiled matcher that runs a rule's
//! regexes only on lines that contain one of its literal needles.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use aho_corasick::{AhoCorasick, AhoCorasickKind};
use regex::Regex;
use regex_syntax::hir::{Class, Hir, HirKind};
use serde::Deserialize;

use crate::model::{Category, FaultLocus};

/// The shipped rule files, embedded so the binary works without the repository.
pub const BUILTIN: &[(&str, &str)] = &[
    ("crash.yaml", include_str!("../../rules/logs/crash.yaml")),
    ("cuda.yaml", include_str!("../../rules/logs/cuda.yaml")),
    (
        "dataloader.yaml",
        include_str!("../../rules/logs/dataloader.yaml"),
    ),
    ("ecc.yaml", include_str!("../../rules/logs/ecc.yaml")),
    ("gpu.yaml", include_str!("../../rules/logs/gpu.yaml")),
    (
        "launcher.yaml",
        include_str!("../../rules/logs/launcher.yaml"),
    ),
    ("memory.yaml", include_str!("../../rules/logs/memory.yaml")),
    ("nan.yaml", include_str!("../../rules/logs/nan.yaml")),
    ("nccl.yaml", include_str!("../../rules/logs/nccl.yaml")),
    (
        "network.yaml",
        include_str!("../../rules/logs/network.yaml"),
    ),
    ("python.yaml", include_str!("../../rules/logs/python.yaml")),
    (
        "storage.yaml",
        include_str!("../../rules/logs/storage.yaml"),
    ),
];

/// Shortest literal needle accepted: shorter ones would let most lines through.
pub const MIN_NEEDLE_LEN: usize = 3;

/// Placeholders a pattern may use, expanded before compiling.
const PLACEHOLDERS: &[(&str, &str)] = &[
    (
        "%PCI%",
        r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?",
    ),
    ("%IP%", r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"),
];

/// A named capture a rule may extract from a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// Global rank.
    Rank,
    /// Rank within the node.
    LocalRank,
    /// Host name or address of the node the line is about.
    Host,
    /// GPU index.
    Gpu,
    /// GPU PCI bus id.
    Pci,
    /// GPU UUID.
    Uuid,
    /// GPU device minor number (/dev/nvidiaN).
    Minor,
    /// Remote end of a connection.
    Peer,
    /// Process id.
    Pid,
    /// Network device, e.g. mlx5_3:1.
    Device,
    /// DataLoader worker id.
    Worker,
    /// NVIDIA XID code.
    Xid,
    /// Scheduler job id.
    Job,
    /// Signal name or number.
    Signal,
    /// An exit or error code.
    Code,
}

impl Field {
    /// Every field, in a stable order.
    pub const ALL: [Field; 15] = [
        Field::Rank,
        Field::LocalRank,
        Field::Host,
        Field::Gpu,
        Field::Pci,
        Field::Uuid,
        Field::Minor,
        Field::Peer,
        Field::Pid,
        Field::Device,
        Field::Worker,
        Field::Xid,
        Field::Job,
        Field::Signal,
        Field::Code,
    ];

    /// The capture-group name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Field::Rank => "rank",
            Field::LocalRank => "local_rank",
            Field::Host => "host",
            Field::Gpu => "gpu",
            Field::Pci => "pci",
            Field::Uuid => "uuid",
            Field::Minor => "minor",
            Field::Peer => "peer",
            Field::Pid => "pid",
            Field::Device => "device",
            Field::Worker => "worker",
            Field::Xid => "xid",
            Field::Job => "job",
            Field::Signal => "signal",
            Field::Code => "code",
        }
    }

    fn parse(s: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How bad the matched condition is on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Informational.
    Info,
    /// Needs attention; the job may survive it.
    Warning,
    /// The job is impaired.
    Error,
    /// The job (or the device) is lost.
    Fatal,
}

impl Severity {
    fn factor(self) -> f64 {
        match self {
            Severity::Info => 0.4,
            Severity::Warning => 0.7,
            Severity::Error => 1.0,
            Severity::Fatal => 1.2,
        }
    }
}

/// What a match says about the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The line shows what went wrong (an XID, an IB error, a CUDA error, an OOM).
    Cause,
    /// The line shows a consequence (every rank's watchdog timeout, ChildFailedError).
    Symptom,
    /// The line votes for no category; its captures name who is involved (a
    /// launcher's failure summary, a slurm cancel line) and fill the culprit near
    /// the winning hits.
    Context,
}

impl Role {
    fn base_weight(self) -> f64 {
        match self {
            Role::Cause => 1.0,
            Role::Symptom => 0.3,
            Role::Context => 0.0,
        }
    }
}

/// One rule as written in a rule file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique id, `area.name`.
    pub id: String,
    /// What the rule recognises, in words.
    pub description: String,
    /// Bumped when the rule's meaning changes.
    pub version: u32,
    /// Disabled rules are validated but never run.
    #[serde(default = "enabled_default")]
    pub enabled: bool,
    /// Regexes; the first that matches gives the captures.
    pub patterns: Vec<String>,
    /// Literals (ASCII case-insensitive), one of which every match contains; derived
    /// from the patterns when left out.
    #[serde(default)]
    pub needles: Vec<String>,
    /// The category a match votes for (not for `context` rules).
    #[serde(default)]
    pub category: Option<String>,
    /// Who has to fix it (not for `context` rules).
    #[serde(default)]
    pub fault_locus: Option<String>,
    /// How bad the condition is.
    pub severity: Severity,
    /// Cause, symptom or context.
    pub role: Role,
    /// Vote weight; defaults to the role's (cause 1, symptom 0.3) times the severity's
    /// factor (info 0.4, warning 0.7, error 1, fatal 1.2).
    #[serde(default)]
    pub weight: Option<f64>,
    /// A catch-all: it loses the line to any non-generic rule that also matches it.
    #[serde(default)]
    pub generic: bool,
    /// Whether the captures name the culprit (default: yes for cause and context, no
    /// for symptom — every rank reporting a timeout is a victim, not a culprit).
    #[serde(default)]
    pub blame: Option<bool>,
    /// Categories whose faults lead to this rule's lines (a watchdog's SIGABRT after its
    /// collective timed out): when a line of one of them came first, this rule's vote
    /// counts a quarter.
    #[serde(default)]
    pub follows: Vec<String>,
    /// What to do about it (a recommendation; actions come from policy).
    #[serde(default)]
    pub action: Option<String>,
    /// Example lines, run at load.
    #[serde(default)]
    pub tests: Vec<RuleTest>,
}

fn enabled_default() -> bool {
    true
}

/// A rule's test: a line and what the rule must capture from it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleTest {
    /// The line.
    pub line: String,
    /// Whether the rule must match it (false: must not).
    #[serde(default = "enabled_default")]
    pub matches: bool,
    /// Exactly the captures expected (names from [`Field`]).
    #[serde(default)]
    pub captures: BTreeMap<String, String>,
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Unique id.
    pub id: String,
    /// What it recognises.
    pub description: String,
    /// Version.
    pub version: u32,
    /// Category voted for; `None` for context rules.
    pub category: Option<Category>,
    /// Locus; `None` for context rules.
    pub fault_locus: Option<FaultLocus>,
    /// Severity.
    pub severity: Severity,
    /// Role.
    pub role: Role,
    /// Effective vote weight.
    pub weight: f64,
    /// Loses a line to any non-generic rule.
    pub generic: bool,
    /// Whether its captures name the culprit.
    pub blame: bool,
    /// Categories whose earlier lines make this rule's a consequence.
    pub follows: Vec<Category>,
    /// Recommended action.
    pub action: Option<String>,
    /// File the rule came from.
    pub file: String,
    regexes: Vec<Regex>,
    needles: Vec<String>,
}

impl Rule {
    /// The literal needles the prefilter looks for.
    pub fn needles(&self) -> &[String] {
        &self.needles
    }

    /// The rule's regexes as compiled (placeholders such as `%PCI%` expanded).
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.regexes.iter().map(Regex::as_str)
    }
}

/// One rule's match on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Index of the rule in [`RuleSet::rules`].
    pub rule: usize,
    /// Named captures that matched, in pattern order.
    pub captures: Vec<(Field, String)>,
}

/// Something wrong in a rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// File name.
    pub file: String,
    /// Rule id, when the problem is in one rule.
    pub rule: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Some(id) => write!(f, "{}: rule {id}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// Why rules could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The files were read, but rules in them are wrong; every problem is listed.
    #[error("{} problem(s) in the log rules:\n{}", .0.len(), list(.0))]
    Invalid(Vec<Problem>),
    /// A file or directory could not be read.
    #[error("cannot read rules at {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The directory has no `*.yaml` file.
    #[error("no *.yaml rule file in {0}")]
    NoFiles(PathBuf),
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reusable per-thread buffers for [`RuleSet::scan`].
#[derive(Debug, Default)]
pub struct Scratch {
    stamp: Vec<u32>,
    generation: u32,
    candidates: Vec<usize>,
}

/// The compiled rules and their literal prefilter.
#[derive(Debug, Clone)]
pub struct RuleSet {
    rules: Vec<Rule>,
    prefilter: AhoCorasick,
    /// For each prefilter pattern, the rules that own that needle.
    needle_rules: Vec<Vec<usize>>,
}

impl RuleSet {
    /// The shipped rules.
    pub fn builtin() -> Result<RuleSet, RulesError> {
        RuleSet::from_sources(
            BUILTIN
                .iter()
                .map(|(n, t)| ((*n).to_owned(), (*t).to_owned())),
        )
    }

    /// The shipped rules, with the `*.yaml` files of `dir` replacing shipped files of
    /// the same name and adding the others.
    pub fn builtin_with_dir(dir: &Path) -> Result<RuleSet, RulesError> {
        let mut files: BTreeMap<String, String> = BUILTIN
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        files.extend(read_dir(dir)?);
        RuleSet::from_sources(files)
    }

    /// Only the `*.yaml` files of `dir`.
    pub fn load_dir(dir: &Path) -> Result<RuleSet, RulesError> {
        RuleSet::from_sources(read_dir(dir)?)
    }

    /// Parse, validate, compile and self-test rules given as (file name, text).
    pub fn from_sources(
        sources: impl IntoIterator<Item = (String, String)>,
    ) -> Result<RuleSet, RulesError> {
        let mut problems = Vec::new();
        let mut rules = Vec::new();
        let mut tests = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        for (file, text) in sources {
            let specs: Option<Vec<RuleSpec>> = match warden_model::yaml::from_str(&text) {
                Ok(s) => s,
                Err(e) => {
                    problems.push(Problem {
                        file: file.clone(),
                        rule: None,
                        message: e.to_string(),
                    });
                    continue;
                }
            };
            for spec in specs.unwrap_or_default() {
                if let Some(other) = seen.insert(spec.id.clone(), file.clone()) {
                    problems.push(Problem {
                        file: file.clone(),
                        rule: Some(spec.id.clone()),
                        message: format!("duplicate id (also in {other})"),
                    });
                    continue;
                }
                match compile(&file, &spec) {
                    Ok(rule) => {
                        if rule_enabled(&spec) {
                            tests.push((rules.len(), spec.tests.clone()));
                            rules.push(rule);
                        }
                    }
                    Err(mut p) => problems.append(&mut p),
                }
            }
        }
        if !problems.is_empty() {
            return Err(RulesError::Invalid(problems));
        }
        let set = RuleSet::assemble(rules).map_err(|message| {
            RulesError::Invalid(vec![Problem {
                file: "(all)".to_owned(),
                rule: None,
                message,
            }])
        })?;
        let problems = set.run_tests(&tests);
        if !problems.is_empty() {
            return Err(RulesError::Invalid(problems));
        }
        Ok(set)
    }

    fn assemble(rules: Vec<Rule>) -> Result<RuleSet, String> {
        let mut index: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, rule) in rules.iter().enumerate() {
            for needle in &rule.needles {
                let owners = index.entry(needle.to_ascii_lowercase()).or_default();
                if owners.last() != Some(&i) {
                    owners.push(i);
                }
            }
        }
        let (needles, needle_rules): (Vec<String>, Vec<Vec<usize>>) = index.into_iter().unzip();
        // A DFA: the prefilter walks every byte of every line (hundreds of needles leave
        // no rare byte to skip to), and a DFA takes one table step per byte.
        let prefilter = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .kind(Some(AhoCorasickKind::DFA))
            .prefilter(false)
            .build(&needles)
            .map_err(|e| format!("cannot build the needle prefilter: {e}"))?;
        Ok(RuleSet {
            rules,
            prefilter,
            needle_rules,
        })
    }

    fn run_tests(&self, tests: &[(usize, Vec<RuleTest>)]) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut scratch = Scratch::default();
        let mut hits = Vec::new();
        for (index, cases) in tests {
            let rule = &self.rules[*index];
            let problem = |message: String| Problem {
                file: rule.file.clone(),
                rule: Some(rule.id.clone()),
                message,
            };
            for case in cases {
                hits.clear();
                self.scan(&case.line, &mut scratch, &mut hits);
                let hit = hits.iter().find(|h| h.rule == *index);
                match (hit, case.matches) {
                    (None, true) => problems.push(problem(format!(
                        "test line does not match: {:?}",
                        case.line
                    ))),
                    (Some(_), false) => problems.push(problem(format!(
                        "test line must not match but does: {:?}",
                        case.line
                    ))),
                    (Some(hit), true) => {
                        let got: BTreeMap<String, String> = hit
                            .captures
                            .iter()
                            .map(|(f, v)| (f.as_str().to_owned(), v.clone()))
                            .collect();
                        if got != case.captures {
                            problems.push(problem(format!(
                                "test line {:?}: captures {got:?}, expected {:?}",
                                case.line, case.captures
                            )));
                        }
                    }
                    (None, false) => {}
                }
            }
        }
        problems
    }

    /// The compiled (enabled) rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Append to `out` the hits of every rule on `text`. Only rules whose needle occurs
    /// in the line run their regexes.
    pub fn scan(&self, text: &str, scratch: &mut Scratch, out: &mut Vec<Hit>) {
        if scratch.stamp.len() != self.rules.len() {
            scratch.stamp = vec![0; self.rules.len()];
            scratch.generation = 0;
        }
        scratch.generation = scratch.generation.wrapping_add(1);
        if scratch.generation == 0 {
            scratch.stamp.iter_mut().for_each(|s| *s = 0);
            scratch.generation = 1;
        }
        scratch.candidates.clear();
        // Most lines hold no needle: one leftmost search says so, without the
        // bookkeeping of an overlapping one.
        if !self.prefilter.is_match(text) {
            return;
        }
        for m in self.prefilter.find_overlapping_iter(text) {
            for &r in &self.needle_rules[m.pattern().as_usize()] {
                if scratch.stamp[r] != scratch.generation {
                    scratch.stamp[r] = scratch.generation;
                    scratch.candidates.push(r);
                }
            }
        }
        scratch.candidates.sort_unstable();
        for &r in &scratch.candidates {
            let rule = &self.rules[r];
            for re in &rule.regexes {
                if let Some(caps) = re.captures(text) {
                    let captures = re
                        .capture_names()
                        .flatten()
                        .filter_map(|name| {
                            let value = caps.name(name)?.as_str().trim();
                            let field = Field::parse(name)?;
                            (!value.is_empty()).then(|| (field, value.to_owned()))
                        })
                        .collect();
                    out.push(Hit { rule: r, captures });
                    break;
                }
            }
        }
    }
}

fn rule_enabled(spec: &RuleSpec) -> bool {
    spec.enabled
}

fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, RulesError> {
    let io = |source| RulesError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|source| RulesError::Io {
            path: path.clone(),
            source,
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        files.push((name, text));
    }
    if files.is_empty() {
        return Err(RulesError::NoFiles(dir.to_owned()));
    }
    files.sort();
    Ok(files)
}

fn expand(pattern: &str) -> String {
    PLACEHOLDERS
        .iter()
        .fold(pattern.to_owned(), |p, (name, re)| p.replace(name, re))
}

/// Validate one rule spec and compile it; every problem is returned.
fn compile(file: &str, spec: &RuleSpec) -> Result<Rule, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut bad = |message: String| {
        problems.push(Problem {
            file: file.to_owned(),
            rule: Some(spec.id.clone()),
            message,
        });
    };
    if spec.id.trim().is_empty() {
        bad("empty id".to_owned());
    }
    if spec.patterns.is_empty() {
        bad("no patterns".to_owned());
    }
    if spec.tests.iter().all(|t| !t.matches) {
        bad("no test line that the rule must match (add `tests:`)".to_owned());
    }
    let category = match (&spec.category, spec.role) {
        (Some(_), Role::Context) => {
            bad("a context rule has no category".to_owned());
            None
        }
        (None, Role::Context) => None,
        (None, _) => {
            bad("missing category".to_owned());
            None
        }
        (Some(c), _) => match Category::from_str(c) {
            Ok(c) => Some(c),
            Err(e) => {
                bad(e.to_string());
                None
            }
        },
    };
    let mut follows = Vec::new();
    for c in &spec.follows {
        match Category::from_str(c) {
            Ok(c) => follows.push(c),
            Err(e) => bad(format!("follows: {e}")),
        }
    }
    let fault_locus = match (&spec.fault_locus, spec.role) {
        (Some(_), Role::Context) => {
            bad("a context rule has no fault_locus".to_owned());
            None
        }
        (None, Role::Context) => None,
        (None, _) => {
            bad("missing fault_locus".to_owned());
            None
        }
        (Some(l), _) => match FaultLocus::from_str(l) {
            Ok(l) => Some(l),
            Err(e) => {
                bad(e.to_string());
                None
            }
        },
    };
    let weight = spec
        .weight
        .unwrap_or(spec.role.base_weight() * spec.severity.factor());
    if !(weight.is_finite() && (0.0..=10.0).contains(&weight)) {
        bad(format!("weight {weight} is not within 0..=10"));
    }
    let mut regexes = Vec::new();
    let mut derived: Vec<Option<Vec<String>>> = Vec::new();
    for (i, pattern) in spec.patterns.iter().enumerate() {
        let expanded = expand(pattern);
        match Regex::new(&expanded) {
            Ok(re) => {
                for name in re.capture_names().flatten() {
                    if Field::parse(name).is_none() {
                        bad(format!(
                            "pattern {}: unknown capture name {name:?} (known: {})",
                            i + 1,
                            Field::ALL.map(Field::as_str).join(", ")
                        ));
                    }
                }
                regexes.push(re);
                derived.push(
                    regex_syntax::Parser::new()
                        .parse(&expanded)
                        .ok()
                        .and_then(|hir| required_literals(&hir))
                        .filter(|set| quality(set) >= MIN_NEEDLE_LEN),
                );
            }
            Err(e) => bad(format!(
                "pattern {}: bad regex: {}",
                i + 1,
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        }
    }
    for test in &spec.tests {
        for name in test.captures.keys() {
            if Field::parse(name).is_none() {
                bad(format!("test: unknown capture name {name:?}"));
            }
        }
    }
    let needles = if spec.needles.is_empty() {
        let mut all = Vec::new();
        for (i, d) in derived.iter().enumerate() {
            match d {
                Some(set) => all.extend(set.iter().cloned()),
                None if regexes.len() == spec.patterns.len() => bad(format!(
                    "pattern {}: no literal of {MIN_NEEDLE_LEN}+ characters that every match \
                     contains; add `needles:`",
                    i + 1
                )),
                None => {}
            }
        }
        all
    } else {
        if spec.needles.iter().any(String::is_empty) {
            bad("empty needle".to_owned());
        }
        spec.needles.clone()
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Rule {
        id: spec.id.clone(),
        description: spec.description.clone(),
        version: spec.version,
        category,
        fault_locus,
        severity: spec.severity,
        role: spec.role,
        weight,
        generic: spec.generic,
        blame: spec.blame.unwrap_or(spec.role != Role::Symptom),
        follows,
        action: spec.action.clone(),
        file: file.to_owned(),
        regexes,
        needles,
    })
}

/// The shortest string of a literal set: what the prefilter can rely on.
fn quality(set: &[String]) -> usize {
    set.iter().map(String::len).min().unwrap_or(0)
}

fn better(best: &mut Option<Vec<String>>, candidate: Option<Vec<String>>) {
    let Some(candidate) = candidate else { return };
    if candidate.is_empty() || quality(&candidate) == 0 {
        return;
    }
    let replace = match best {
        None => true,
        Some(b) => quality(&candidate) > quality(b),
    };
    if replace {
        *best = Some(candidate);
    }
}

/// A set of literals one of which every match of `hir` contains (compared ASCII
/// case-insensitively), or `None` when there is none worth using.
fn required_literals(hir: &Hir) -> Option<Vec<String>> {
    if let Some(s) = char_like(hir) {
        return (!s.is_empty()).then(|| vec![s]);
    }
    match hir.kind() {
        HirKind::Capture(c) => required_literals(&c.sub),
        HirKind::Repetition(r) if r.min >= 1 => required_literals(&r.sub),
        HirKind::Concat(subs) => {
            let mut best = None;
            let mut run = String::new();
            for sub in subs {
                match char_like(sub) {
                    Some(s) => run.push_str(&s),
                    None => {
                        better(&mut best, Some(vec![std::mem::take(&mut run)]));
                        better(&mut best, required_literals(sub));
                    }
                }
            }
            better(&mut best, Some(vec![run]));
            best
        }
        HirKind::Alternation(subs) => {
            let mut all = Vec::new();
            for sub in subs {
                all.extend(required_literals(sub)?);
            }
            Some(all)
        }
        _ => None,
    }
}

/// The text a node matches when it matches exactly one string up to ASCII case
/// (a literal, a case-folded letter, a zero-width assertion as "").
fn char_like(hir: &Hir) -> Option<String> {
    match hir.kind() {
        HirKind::Literal(lit) => std::str::from_utf8(&lit.0)
            .ok()
            .map(|s| s.to_ascii_lowercase()),
        HirKind::Look(_) => Some(String::new()),
        HirKind::Class(Class::Unicode(class)) => {
            let mut chars = Vec::new();
            for range in class.ranges() {
                let (start, end) = (range.start() as u32, range.end() as u32);
                if end - start > 2 || chars.len() > 4 {
                    return None;
                }
                chars.extend((start..=end).filter_map(char::from_u32));
            }
            single_folded(&chars)
        }
        HirKind::Class(Class::Bytes(class)) => {
            let mut chars = Vec::new();
            for range in class.ranges() {
                if range.end() - range.start() > 2 || chars.len() > 4 {
                    return None;
                }
                chars.extend((range.start()..=range.end()).map(char::from));
            }
            single_folded(&chars)
        }
        _ => None,
    }
}

fn single_folded(chars: &[char]) -> Option<String> {
    let ascii: Vec<char> = chars
        .iter()
        .filter(|c| c.is_ascii())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let first = *ascii.first()?;
    ascii.iter().all(|&c| c == first).then(|| first.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literals(pattern: &str) -> Option<Vec<String>> {
        let hir = regex_syntax::Parser::new()
            .parse(pattern)
            .expect("valid pattern");
        required_literals(&hir)
    }

    #[test]
    fn needles_are_derived_from_the_longest_required_literal() {
        assert_eq!(
            literals(r"NVRM: Xid \(PCI:(?P<pci>\S+)\): 79"),
            Some(vec!["nvrm: xid (pci:".to_owned()])
        );
        assert_eq!(
            literals(r"(?i)loss is nan"),
            Some(vec!["loss is nan".to_owned()])
        );
        assert_eq!(
            literals(r"(?:No space left|Disk quota exceeded)"),
            Some(vec![
                "no space left".to_owned(),
                "disk quota exceeded".to_owned()
            ])
        );
        let weak = literals(r"\d+ \w+").unwrap_or_default();
        assert!(quality(&weak) < MIN_NEEDLE_LEN, "{weak:?}");
    }

    #[test]
    fn shipped_rules_load_and_pass_their_tests() {
        let set = RuleSet::builtin().unwrap_or_else(|e| panic!("shipped rules: {e}"));
        assert!(set.rules().len() >= 60, "{} rules", set.rules().len());
        let categories: std::collections::BTreeSet<_> =
            set.rules().iter().filter_map(|r| r.category).collect();
        assert_eq!(categories.len(), Category::ALL.len(), "{categories:?}");
    }

    const GOOD: &str = r#"
- id: t.ok
  description: ok
  version: 1
  patterns: ['CUDA out of memory. .*GPU (?P<gpu>\d+)']
  category: gpu_oom
  fault_locus: user-code
  severity: error
  role: cause
  tests:
    - line: "CUDA out of memory. Tried: GPU 3"
      captures: {gpu: "3"}
"#;

    #[test]
    fn every_problem_in_every_file_is_reported_with_file_and_rule() {
        let bad = r#"
- id: t.regex
  description: bad regex
  version: 1
  patterns: ['unclosed (group']
  category: gpu_oom
  fault_locus: user-code
  severity: error
  role: cause
  tests: [{line: "x"}]
- id: t.category
  description: unknown category and capture, no tests
  version: 1
  patterns: ['disk (?P<disk>\w+) on fire']
  category: disk_on_fire
  fault_locus: hardware
  severity: error
  role: cause
- id: t.test
  description: test that fails
  version: 1
  patterns: ['Segmentation fault']
  category: segfault_native_crash
  fault_locus: software-framework
  severity: error
  role: cause
  tests: [{line: "all good"}]
"#;
        let unknown_field = "- id: t.field\n  descripton: typo\n";
        let err = RuleSet::from_sources([
            ("a.yaml".to_owned(), GOOD.to_owned()),
            ("b.yaml".to_owned(), bad.to_owned()),
            ("c.yaml".to_owned(), unknown_field.to_owned()),
        ])
        .expect_err("bad rules");
        let text = err.to_string();
        for needle in [
            "b.yaml: rule t.regex: pattern 1: bad regex",
            "b.yaml: rule t.category: unknown category \"disk_on_fire\"",
            "unknown capture name \"disk\"",
            "rule t.category: no test line",
            "unknown field `descripton`",
            "c.yaml: ",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        // Self-tests only run once the files are otherwise valid.
        let err = RuleSet::from_sources([
            ("a.yaml".to_owned(), GOOD.to_owned()),
            (
                "d.yaml".to_owned(),
                bad.split("- id: t.test")
                    .nth(1)
                    .map(|s| format!("- id: t.test{s}"))
                    .expect("split"),
            ),
        ])
        .expect_err("failing test line");
        assert!(
            err.to_string()
                .contains("d.yaml: rule t.test: test line does not match: \"all good\""),
            "{err}"
        );
    }

    #[test]
    fn scan_runs_only_rules_whose_needle_is_present_and_extracts_captures() {
        let set = RuleSet::from_sources([("a.yaml".to_owned(), GOOD.to_owned())]).expect("loads");
        let mut scratch = Scratch::default();
        let mut hits = Vec::new();
        set.scan("cuda OUT of memory. x GPU 7", &mut scratch, &mut hits);
        assert!(hits.is_empty(), "regex is case-sensitive: {hits:?}");
        set.scan("CUDA out of memory. x GPU 7", &mut scratch, &mut hits);
        assert_eq!(
            hits,
            vec![Hit {
                rule: 0,
                captures: vec![(Field::Gpu, "7".to_owned())]
            }]
        );
    }
}
