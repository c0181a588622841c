//! From lines to an answer with rules only: every line is scanned, each line gives its
//! vote to its most specific rule, votes are weighed per category (causes outrank
//! symptoms, repeats add with diminishing returns), and the winner's hits name the
//! culprit. Pure: no I/O, no clock; memory stays bounded however long the input.

use std::collections::{BTreeMap, VecDeque};

use crate::model::{Category, Culprit, Diagnosis, EvidenceLine, LogLine};
use crate::rules::{Field, Hit, Role, RuleSet, Scratch};

/// Hits kept per rule at the start and at the end of the input (the count is exact).
const KEEP_PER_RULE: usize = 32;
/// How far (in lines) a context line may be from the lines the culprit came from to fill
/// it (and a Ray task header from a line to overrule its prefix).
const CONTEXT_LINES: u64 = 16;
/// Longest line text kept for evidence, in bytes.
const EVIDENCE_TEXT_BYTES: usize = 400;
/// Most values of one kind named in a culprit.
const MAX_VALUES: usize = 8;
/// Most evidence lines in an answer.
const MAX_EVIDENCE: usize = 12;

/// A rule's match on an input line, with the line's origin folded into its captures.
#[derive(Debug, Clone, PartialEq)]
pub struct LineHit {
    /// The line's id.
    pub line: u64,
    /// Index of the rule in the rule set.
    pub rule: usize,
    /// The rule's captures, then what the line's origin says (rank, host, pid, GPU)
    /// for fields the rule did not capture.
    pub fields: Vec<(Field, String)>,
    /// How many of `fields` are the rule's own captures (the rest are the origin's).
    pub captured: usize,
    /// Where the fields a Ray log prefix gave (`(Actor pid=N, ip=A)`) start: they name
    /// the process that printed the line, which a nearby Ray task header can overrule.
    pub ray_from: usize,
    /// The line, shortened.
    pub text: String,
}

impl LineHit {
    fn get(&self, field: Field) -> impl Iterator<Item = &str> {
        self.fields
            .iter()
            .filter(move |(f, _)| *f == field)
            .map(|(_, v)| v.as_str())
    }

    /// The values of `field` this hit puts on the culprit: a symptom line (a survivor
    /// reporting a lost peer, a timeout) blames only what it names, never the process
    /// that printed it; a cause line also blames where it came from.
    fn blamed(&self, field: Field, role: Role, skip_ray: bool) -> impl Iterator<Item = &str> {
        let end = if role == Role::Symptom {
            self.captured
        } else if skip_ray {
            self.ray_from
        } else {
            self.fields.len()
        };
        let fields = &self.fields[..end.min(self.fields.len())];
        fields
            .iter()
            .filter(move |(f, _)| *f == field)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Default)]
struct Kept {
    count: u64,
    first: Vec<LineHit>,
    last: VecDeque<LineHit>,
}

impl Kept {
    fn push(&mut self, hit: LineHit) {
        self.count += 1;
        if self.first.len() < KEEP_PER_RULE {
            self.first.push(hit);
        } else {
            if self.last.len() == KEEP_PER_RULE {
                self.last.pop_front();
            }
            self.last.push_back(hit);
        }
    }

    fn hits(&self) -> impl Iterator<Item = &LineHit> {
        self.first.iter().chain(self.last.iter())
    }
}

/// One category's standing.
#[derive(Debug, Clone, PartialEq)]
pub struct CategoryScore {
    /// The category.
    pub category: Category,
    /// Its weighed votes.
    pub score: f64,
    /// Its rules, strongest contribution first: (rule index, lines, contribution).
    pub rules: Vec<(usize, u64, f64)>,
    /// First line that voted for it.
    pub first_line: u64,
}

/// Streaming classifier: feed lines with [`Classifier::push`], then ask
/// [`Classifier::diagnosis`].
#[derive(Debug)]
pub struct Classifier<'r> {
    rules: &'r RuleSet,
    scratch: Scratch,
    buf: Vec<Hit>,
    kept: Vec<Kept>,
    lines: u64,
}

impl<'r> Classifier<'r> {
    /// A classifier over `rules`.
    pub fn new(rules: &'r RuleSet) -> Self {
        Classifier {
            rules,
            scratch: Scratch::default(),
            buf: Vec::new(),
            kept: (0..rules.rules().len()).map(|_| Kept::default()).collect(),
            lines: 0,
        }
    }

    /// Lines seen so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Scan one line. Of the rules that vote for a category, only the most specific
    /// one keeps the line (non-generic over generic, then the highest weight); context
    /// rules always keep it.
    pub fn push(&mut self, line: &LogLine) {
        self.lines += 1;
        self.buf.clear();
        self.rules
            .scan(&line.text, &mut self.scratch, &mut self.buf);
        if self.buf.is_empty() {
            return;
        }
        let rules = self.rules.rules();
        let specific = self
            .buf
            .iter()
            .any(|h| rules[h.rule].category.is_some() && !rules[h.rule].generic);
        let voter = self
            .buf
            .iter()
            .filter(|h| rules[h.rule].category.is_some() && !(specific && rules[h.rule].generic))
            .max_by(|a, b| {
                rules[a.rule]
                    .weight
                    .total_cmp(&rules[b.rule].weight)
                    .then(b.rule.cmp(&a.rule))
            })
            .map(|h| h.rule);
        let origin = origin(line);
        let ray = ray_origin(&line.text);
        for hit in self.buf.drain(..) {
            if Some(hit.rule) != voter && rules[hit.rule].role != Role::Context {
                continue;
            }
            let mut fields = hit.captures;
            let captured = fields.len();
            for (field, value) in &origin {
                if !fields.iter().any(|(f, _)| f == field) {
                    fields.push((*field, value.clone()));
                }
            }
            let ray_from = fields.len();
            for (field, value) in &ray {
                if !fields.iter().any(|(f, _)| f == field) {
                    fields.push((*field, value.clone()));
                }
            }
            self.kept[hit.rule].push(LineHit {
                line: line.id,
                rule: hit.rule,
                fields,
                captured,
                ray_from,
                text: shorten(&line.text, EVIDENCE_TEXT_BYTES),
            });
        }
    }

    /// Every kept hit (bounded per rule), in rule order.
    pub fn hits(&self) -> impl Iterator<Item = &LineHit> {
        self.kept.iter().flat_map(Kept::hits)
    }

    /// Categories that got votes, best first.
    pub fn scores(&self) -> Vec<CategoryScore> {
        let rules = self.rules.rules();
        // The first line each category got, for rules that follow another's fault.
        let mut first_of: BTreeMap<Category, u64> = BTreeMap::new();
        for (index, kept) in self.kept.iter().enumerate() {
            if let (Some(category), Some(hit)) = (rules[index].category, kept.first.first()) {
                let e = first_of.entry(category).or_insert(hit.line);
                *e = (*e).min(hit.line);
            }
        }
        let mut by_category: BTreeMap<Category, CategoryScore> = BTreeMap::new();
        for (index, kept) in self.kept.iter().enumerate() {
            let Some(category) = rules[index].category else {
                continue;
            };
            if kept.count == 0 {
                continue;
            }
            let repeat = (1.0 + 0.2 * (kept.count as f64).ln()).min(1.5);
            let first = kept.first.first().map_or(u64::MAX, |h| h.line);
            let consequence = rules[index]
                .follows
                .iter()
                .any(|c| first_of.get(c).is_some_and(|line| *line < first));
            let contribution = rules[index].weight * repeat * if consequence { 0.25 } else { 1.0 };
            let entry = by_category.entry(category).or_insert(CategoryScore {
                category,
                score: 0.0,
                rules: Vec::new(),
                first_line: first,
            });
            entry.rules.push((index, kept.count, contribution));
            entry.first_line = entry.first_line.min(first);
        }
        let mut scores: Vec<CategoryScore> = by_category
            .into_values()
            .map(|mut c| {
                c.rules
                    .sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
                c.score = c
                    .rules
                    .iter()
                    .zip(0..)
                    .map(|((_, _, w), i)| w * 0.5f64.powi(i))
                    .sum();
                c
            })
            .collect();
        scores.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.first_line.cmp(&b.first_line))
        });
        scores
    }

    /// The rules' answer.
    pub fn diagnosis(&self) -> Diagnosis {
        let scores = self.scores();
        let Some(top) = scores.first() else {
            let mut d = Diagnosis::unknown();
            d.explanation = format!("no rule matched any of the {} line(s)", self.lines);
            return d;
        };
        let rules = self.rules.rules();
        let total: f64 = scores.iter().map(|s| s.score).sum();
        let share = if total > 0.0 { top.score / total } else { 0.0 };
        let strength = 1.0 - (-1.5 * top.score).exp();
        let confidence = (share * strength * 100.0).round() / 100.0;
        let (lead, _, _) = top.rules[0];
        let winner_hits: Vec<&LineHit> = top
            .rules
            .iter()
            .flat_map(|(r, _, _)| self.kept[*r].hits())
            .collect();
        let (culprit, culprit_lines) = self.culprit(&winner_hits);

        let mut evidence: Vec<EvidenceLine> = Vec::new();
        let mut ordered = winner_hits.clone();
        ordered.sort_by(|a, b| {
            rules[b.rule]
                .weight
                .total_cmp(&rules[a.rule].weight)
                .then(a.line.cmp(&b.line))
        });
        for hit in ordered.iter().take(MAX_EVIDENCE / 2) {
            evidence.push(evidence_line(self.rules, hit, "rule"));
        }
        for line in &culprit_lines {
            if evidence.iter().any(|e| e.id == *line) {
                continue;
            }
            if let Some(hit) = self.hits().find(|h| h.line == *line) {
                evidence.push(evidence_line(self.rules, hit, "context"));
            }
        }
        for other in scores.iter().skip(1).take(3) {
            let (r, _, _) = other.rules[0];
            if let Some(hit) = self.kept[r].hits().next()
                && evidence.len() < MAX_EVIDENCE
                && !evidence.iter().any(|e| e.id == hit.line)
            {
                evidence.push(evidence_line(self.rules, hit, "rule (other category)"));
            }
        }
        evidence.truncate(MAX_EVIDENCE);

        let lead_rule = &rules[lead];
        let lead_hits: Vec<String> = self.kept[lead]
            .hits()
            .take(3)
            .map(|h| format!("line {}", h.line))
            .collect();
        let mut explanation = format!(
            "{} ({}): {} — {} line(s), first at {}",
            top.category,
            lead_rule
                .fault_locus
                .map_or("unknown locus", |l| l.as_str()),
            lead_rule.description,
            self.kept[lead].count,
            lead_hits.join(", "),
        );
        if top.rules.len() > 1 {
            let more: Vec<String> = top.rules[1..]
                .iter()
                .take(4)
                .map(|(r, n, _)| format!("{} ×{n}", rules[*r].id))
                .collect();
            explanation.push_str(&format!("; also {}", more.join(", ")));
        }
        if culprit.is_empty() {
            explanation.push_str(". The lines name no culprit");
        } else {
            let cited: Vec<String> = culprit_lines
                .iter()
                .take(4)
                .map(|l| format!("line {l}"))
                .collect();
            explanation.push_str(&format!(
                ". Culprit {} (from {})",
                culprit.text,
                cited.join(", ")
            ));
        }
        if let Some(second) = scores.get(1) {
            explanation.push_str(&format!(
                ". Outweighed: {} ({:.2} against {:.2})",
                second.category, second.score, top.score
            ));
        }
        explanation.push('.');

        Diagnosis {
            category: Some(top.category),
            fault_locus: lead_rule.fault_locus,
            culprit,
            confidence,
            rule_ids: top
                .rules
                .iter()
                .map(|(r, _, _)| rules[*r].id.clone())
                .collect(),
            evidence,
            explanation,
            source: "rules".to_owned(),
            recommended_action: self.xid_advice(lead).or_else(|| lead_rule.action.clone()),
        }
    }

    /// The XID catalog's advice for the first XID the rule `lead` captured, when it
    /// captured one the catalog lists: the catalog, not the rule, says whether the GPU,
    /// the driver or the program is at fault. Only an XID the hardware raises drains
    /// the node.
    fn xid_advice(&self, lead: usize) -> Option<String> {
        let code: u32 = self.kept[lead]
            .hits()
            .find_map(|h| h.get(Field::Xid).next().and_then(|v| v.parse().ok()))?;
        let catalog = warden_model::xid::XidCatalog::builtin();
        let advice = catalog.advice(code)?;
        let application = catalog
            .get(code)
            .is_some_and(|i| i.cause == warden_model::xid::Cause::Application);
        Some(if application {
            advice
        } else {
            format!("drain the node; {advice}")
        })
    }

    /// The culprit: per field, the values of the first of the strongest winning hits
    /// that name it; fields still missing are filled from context lines near those hits.
    fn culprit(&self, winner_hits: &[&LineHit]) -> (Culprit, Vec<u64>) {
        let rules = self.rules.rules();
        let blaming: Vec<&LineHit> = winner_hits
            .iter()
            .copied()
            .filter(|h| rules[h.rule].blame)
            .collect();
        let context: Vec<&LineHit> = self
            .hits()
            .filter(|h| rules[h.rule].role == Role::Context && rules[h.rule].blame)
            .collect();
        // A Ray task header (`ray::F() (pid=N, ip=A)`) near a line names the process
        // whose error it is; the line's own Ray prefix then only names who printed it.
        let task_lines: Vec<u64> = context
            .iter()
            .filter(|c| c.get(Field::Pid).next().is_some())
            .map(|c| c.line)
            .collect();
        let skip_ray = |h: &LineHit| {
            task_lines
                .iter()
                .any(|l| l.abs_diff(h.line) <= CONTEXT_LINES)
        };
        let blames = |h: &LineHit, field: Field| {
            h.blamed(field, rules[h.rule].role, skip_ray(h))
                .next()
                .is_some()
        };
        let mut values: BTreeMap<Field, Vec<String>> = BTreeMap::new();
        let mut lines: Vec<u64> = Vec::new();
        for field in CULPRIT_FIELDS {
            let Some(best) = blaming
                .iter()
                .filter(|h| blames(h, field))
                .map(|h| rules[h.rule].weight)
                .max_by(f64::total_cmp)
            else {
                continue;
            };
            // The first line that names the field: the first report is the fault, the
            // lines after it (other GPUs, other nodes, the same error again) its echo.
            let first = blaming
                .iter()
                .filter(|h| rules[h.rule].weight == best && blames(h, field))
                .min_by_key(|h| h.line);
            if let Some(hit) = first {
                for v in hit.blamed(field, rules[hit.rule].role, skip_ray(hit)) {
                    push_value(field, values.entry(field).or_default(), normalize(field, v));
                }
                if !lines.contains(&hit.line) {
                    lines.push(hit.line);
                }
            }
        }
        // Context is read near the lines the culprit came from (the first report), or
        // near every blaming line when none named anything.
        let anchors: Vec<u64> = if lines.is_empty() {
            blaming.iter().map(|h| h.line).collect()
        } else {
            lines.clone()
        };
        for field in CULPRIT_FIELDS {
            if values.contains_key(&field) {
                continue;
            }
            let nearest = context
                .iter()
                .filter(|c| c.get(field).next().is_some())
                .filter_map(|c| {
                    anchors
                        .iter()
                        .map(|l| l.abs_diff(c.line))
                        .min()
                        .filter(|d| *d <= CONTEXT_LINES)
                        .map(|d| (d, c.line, *c))
                })
                .min_by_key(|(d, line, _)| (*d, *line));
            if let Some((_, line, hit)) = nearest {
                for v in hit.get(field) {
                    push_value(field, values.entry(field).or_default(), normalize(field, v));
                }
                if !lines.contains(&line) {
                    lines.push(line);
                }
            }
        }
        lines.sort_unstable();
        let mut culprit = build_culprit(&values);
        self.add_peer_addresses(&mut culprit);
        (culprit, lines)
    }

    /// A peer named by host name is also named by its address where the log gives the
    /// mapping: a context rule that blames nothing is an address book, whose hits pair
    /// the line's host with the address it captured (`node3:...: NCCL INFO Bootstrap :
    /// Using eth0:10.0.0.3<0>`).
    fn add_peer_addresses(&self, culprit: &mut Culprit) {
        let rules = self.rules.rules();
        let books: Vec<&LineHit> = self
            .hits()
            .filter(|h| rules[h.rule].role == Role::Context && !rules[h.rule].blame)
            .collect();
        let mut added = Vec::new();
        for peer in &culprit.peers {
            let address = books.iter().find_map(|h| {
                let host = h.get(Field::Host).next()?;
                (host == peer || host.split('.').next() == Some(peer.as_str()))
                    .then(|| h.get(Field::Peer).next())
                    .flatten()
            });
            if let Some(address) = address
                && !culprit.peers.iter().any(|p| p == address)
                && !added.iter().any(|a: &String| a == address)
            {
                added.push(address.to_owned());
            }
        }
        if !added.is_empty() {
            culprit.peers.extend(added);
            culprit.text = culprit_text(culprit);
        }
    }
}

/// Classify a whole slice of lines.
pub fn classify(rules: &RuleSet, lines: &[LogLine]) -> Diagnosis {
    let mut c = Classifier::new(rules);
    for line in lines {
        c.push(line);
    }
    c.diagnosis()
}

const CULPRIT_FIELDS: [Field; 11] = [
    Field::Rank,
    Field::LocalRank,
    Field::Host,
    Field::Gpu,
    Field::Pci,
    Field::Uuid,
    Field::Minor,
    Field::Pid,
    Field::Peer,
    Field::Device,
    Field::Worker,
];

fn push_value(field: Field, list: &mut Vec<String>, value: String) {
    // An unspecified address (Ray's `ip=0.0.0.0`) names no place, nor does pid 0
    // (`mpirun noticed that process rank 3 with PID 0 on node ...`: Open MPI's report
    // when it does not know the pid).
    if value == "0.0.0.0" || value == "::" || (field == Field::Pid && value == "0") {
        return;
    }
    if list.len() < MAX_VALUES && !list.contains(&value) {
        list.push(value);
    }
}

fn normalize(field: Field, value: &str) -> String {
    match field {
        Field::Pci => normalize_pci(value).unwrap_or_else(|| value.to_owned()),
        Field::Uuid => value.to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
        // An IPv6 link-local peer's zone (`fe80::1%ib0`) names our interface, not the peer.
        Field::Peer => value
            .split_once('%')
            .map_or(value, |(addr, _)| addr)
            .to_owned(),
        _ => value.to_owned(),
    }
}

/// A PCI bus id as `dddd:bb:dd.f` in lower case ("PCI:0000:41:00" → "0000:41:00.0",
/// "00000000:3B:00.0" → "0000:3b:00.0"); `None` when it is not one.
pub fn normalize_pci(raw: &str) -> Option<String> {
    let s = raw.trim().trim_start_matches("PCI:").to_ascii_lowercase();
    let (addr, function) = match s.split_once('.') {
        Some((a, f)) => (a, f),
        None => (s.as_str(), "0"),
    };
    let parts: Vec<&str> = addr.split(':').collect();
    let hex = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit());
    let (domain, bus, device) = match parts.as_slice() {
        [d, b, v] => (*d, *b, *v),
        [b, v] => ("0000", *b, *v),
        _ => return None,
    };
    if !(hex(domain) && hex(bus) && hex(device) && function.len() == 1 && hex(function)) {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let device = u32::from_str_radix(device, 16).ok()?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function}"))
}

fn numbers(values: Option<&Vec<String>>) -> Vec<u32> {
    values
        .into_iter()
        .flatten()
        .filter_map(|v| v.parse().ok())
        .collect()
}

fn build_culprit(values: &BTreeMap<Field, Vec<String>>) -> Culprit {
    let get = |f: Field| values.get(&f).cloned().unwrap_or_default();
    let mut gpus = get(Field::Gpu);
    gpus.extend(get(Field::Pci));
    gpus.extend(get(Field::Uuid));
    gpus.extend(get(Field::Minor).into_iter().map(|m| format!("minor {m}")));
    let mut c = Culprit {
        ranks: numbers(values.get(&Field::Rank)),
        nodes: get(Field::Host),
        gpus,
        local_ranks: numbers(values.get(&Field::LocalRank)),
        pids: numbers(values.get(&Field::Pid)),
        peers: get(Field::Peer),
        devices: get(Field::Device),
        workers: numbers(values.get(&Field::Worker)),
        text: String::new(),
    };
    c.text = culprit_text(&c);
    c
}

fn culprit_text(c: &Culprit) -> String {
    fn join<T: ToString>(word: &str, items: &[T]) -> Option<String> {
        (!items.is_empty()).then(|| {
            let list: Vec<String> = items.iter().map(ToString::to_string).collect();
            format!("{word} {}", list.join(", "))
        })
    }
    let parts: Vec<String> = [
        join(if c.ranks.len() > 1 { "ranks" } else { "rank" }, &c.ranks),
        join("local_rank", &c.local_ranks),
        join("host", &c.nodes),
        join("GPU", &c.gpus),
        join("device", &c.devices),
        join("DataLoader worker", &c.workers),
        join("pid", &c.pids),
        join("peer", &c.peers),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "not named in the logs".to_owned()
    } else {
        parts.join(", ")
    }
}

fn evidence_line(rules: &RuleSet, hit: &LineHit, reason: &str) -> EvidenceLine {
    let rule = &rules.rules()[hit.rule];
    EvidenceLine {
        id: hit.line,
        text: hit.text.clone(),
        rule_id: Some(rule.id.clone()),
        reason: reason.to_owned(),
        score: rule.weight,
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What a line's own form says about where it came from: the source's node and rank,
/// a `[rankN]:` prefix (torchrun `--tee`/log prefixes), an NCCL `host:pid:tid [gpu]`
/// prefix (also behind a `[date time]` stamp), an Open MPI, Horovod or UCX
/// `[host:pid]` / `[host:pid:thread:tid]` prefix, a Ray `(Actor pid=N, ip=A)` prefix, a
/// syslog `Mon DD HH:MM:SS host kernel:` prefix; behind a launcher's prefix (pdsh, srun, TorchX,
/// Open MPI).
fn origin(line: &LogLine) -> Vec<(Field, String)> {
    let mut out = Vec::new();
    if let Some(node) = &line.node {
        out.push((Field::Host, node.clone()));
    }
    if let Some(rank) = line.rank {
        out.push((Field::Rank, rank.to_string()));
    }
    // Where the fields the line's text gives start (after the source's own).
    let from_text = out.len();
    let mut text = line.text.trim_start();
    // A launcher's own prefix ahead of everything else: pdsh's `host: ` (DeepSpeed's
    // multi-node launcher), srun's `--label` task number, and Open MPI's `--tag-output`
    // `[jobid,rank]<stream>:`. pdsh's host is the name it was given for the node; an
    // NCCL prefix after it names the host the process runs on, which wins.
    let mut launcher_host = None;
    if let Some((host, rest)) = pdsh_prefix(text) {
        launcher_host = Some(host);
        text = rest;
    }
    if let Some(rest) = srun_label(text).or_else(|| replica_tag(text)) {
        text = rest;
    }
    if let Some((rank, rest)) = mpi_tag(text) {
        out.push((Field::Rank, rank.to_owned()));
        text = rest;
    }
    // torchrun's `--tee` tags: `[rankN]:` names the global rank, `[default0]:` (the
    // role and the local rank) the local rank; they stack (`[default0]:[rank28]:`).
    while let Some((tag, rest)) = text
        .strip_prefix('[')
        .and_then(|r| r.split_once("]:"))
        .filter(|(tag, _)| tag.len() <= 32 && !tag.contains([' ', ':']))
    {
        let digits = tag.len() - tag.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (name, number) = tag.split_at(tag.len() - digits);
        if digits == 0 || name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphabetic()) {
            break;
        }
        if name == "rank" {
            out.push((Field::Rank, number.to_owned()));
        } else {
            out.push((Field::LocalRank, number.to_owned()));
        }
        text = rest.trim_start();
    }
    if let Some(rest) = text.strip_prefix("[rank") {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && rest[digits.len()..].starts_with(']') {
            out.push((Field::Rank, digits));
        }
    }
    // ProcessGroupNCCL's and DeepSpeed's own tag: `[Rank 3]`, `[PG 0 (default_pg) Rank
    // 3]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]` (the rank in that process group).
    if !out.iter().any(|(f, _)| *f == Field::Rank)
        && let Some(rank) = rank_tag(text)
    {
        out.push((Field::Rank, rank.to_owned()));
    }
    if let Some((host, pid, gpu)) = nccl_prefix(strip_stamp(text)) {
        out.push((Field::Host, host.to_owned()));
        out.push((Field::Pid, pid.to_owned()));
        out.push((Field::Gpu, gpu.to_owned()));
    }
    // Open MPI's, Horovod's and UCX's `[host:pid]` prefix (`[gpu-node-3:48211] ***
    // Process received signal ***`, `[gpu-node-3:48211:0:48290] Caught signal 11`).
    if let Some((host, rest)) = text
        .strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .and_then(|(inside, _)| inside.split_once(':'))
    {
        let pid: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
        let after = &rest[pid.len()..];
        if is_hostname(host)
            && host.chars().any(|c| c.is_ascii_alphabetic())
            && !host.starts_with("rank")
            && !pid.is_empty()
            && (after.is_empty() || after.starts_with([' ', ':']))
        {
            out.push((Field::Host, host.to_owned()));
            out.push((Field::Pid, pid.to_owned()));
        }
    }
    let tokens: Vec<&str> = text.split_whitespace().take(6).collect();
    let syslog_host = match tokens.as_slice() {
        [month, _, time, host, kernel, ..]
            if month.len() == 3 && time.contains(':') && kernel.starts_with("kernel") =>
        {
            Some(*host)
        }
        [stamp, host, kernel, ..]
            if stamp.contains('T') && stamp.contains(':') && kernel.starts_with("kernel") =>
        {
            Some(*host)
        }
        _ => None,
    };
    if let Some(host) = syslog_host.filter(|h| is_hostname(h)) {
        out.push((Field::Host, host.to_owned()));
    }
    if let Some(host) = launcher_host
        && !out[from_text..].iter().any(|(f, _)| *f == Field::Host)
    {
        out.push((Field::Host, host.to_owned()));
    }
    out
}

/// NCCL's `host:pid:tid [cuda-device]` prefix: the host, pid and device. It may follow
/// time stamps (`kubectl logs --timestamps`, a log viewer's `| 2024-11-28T07:42:11Z |`
/// columns) and be glued to a launcher's `[N]` (`[15]worker-23:83:2526 [0]`).
fn nccl_prefix(text: &str) -> Option<(&str, &str, &str)> {
    let mut tokens = text.split_whitespace().peekable();
    // Skip at most four stamp tokens: digits and the punctuation of dates and times.
    for _ in 0..4 {
        let stamp = tokens.peek().is_some_and(|t| {
            t.bytes()
                .all(|b| b.is_ascii_digit() || b"|-:.,TZ/+".contains(&b))
        });
        if !stamp {
            break;
        }
        tokens.next();
    }
    let first = tokens.next()?;
    let second = tokens.next()?;
    // A launcher's `[N]` glued to the host.
    let first = match first.strip_prefix('[').and_then(|r| r.split_once(']')) {
        Some((n, rest)) if numeric(n) && !rest.is_empty() => rest,
        _ => first,
    };
    let gpu = second
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .filter(|g| numeric(g))?;
    let mut parts = first.split(':');
    let (host, pid, tid) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && numeric(pid) && numeric(tid) && is_hostname(host))
        .then_some((host, pid, gpu))
}

/// TorchX's `role/replica ` prefix (NeMo-Run's jobs: `i.pretrain/0 [default2]:[rank2]:
/// ...`) ahead of a bracketed tag: the text after it. The replica numbers a node's
/// worker group, not a rank.
fn replica_tag(text: &str) -> Option<&str> {
    let (tag, rest) = text.split_once(' ')?;
    let (role, replica) = tag.rsplit_once('/')?;
    (numeric(replica)
        && !role.is_empty()
        && role.len() <= 64
        && role
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && rest.starts_with('['))
    .then_some(rest)
}

/// srun's `--label` prefix, `12: ` (the task number), ahead of a bracketed tag
/// (`0: [rank0]: Traceback ...`): the text after it. The task number is not taken as a
/// rank: under torchrun it numbers nodes, and the tag after it names the rank.
fn srun_label(text: &str) -> Option<&str> {
    let (task, rest) = text.split_once(": ")?;
    (numeric(task) && task.len() <= 6 && rest.starts_with('[')).then_some(rest)
}

/// What a Ray log prefix says about where a line came from: the printer's pid and
/// node. A `ray.exceptions` or "Unhandled error" line there reports another process's
/// failure (the actor that died, the task the raylet killed): the printer is only a
/// witness, and nothing is returned.
fn ray_origin(text: &str) -> Vec<(Field, String)> {
    match ray_prefix(text.trim_start()) {
        Some((fields, rest))
            if !rest.contains("ray.exceptions.") && !rest.contains("Unhandled error") =>
        {
            fields
        }
        _ => Vec::new(),
    }
}

/// pdsh's `host: ` prefix (`worker-3: [rank14]: Traceback ...`, `sx4kq27: E0912
/// 09:06:17.402615 1942455 file.cc:414] ...`, `node01: gpu-vm-14:106:196 [0] NCCL
/// WARN ...`): a host name with a digit or a dash, in lower case, then `: ` and a
/// bracket, a glog header or an NCCL prefix, so that an exception's `Name: ` never
/// passes for one. The host and the text after the prefix.
fn pdsh_prefix(text: &str) -> Option<(&str, &str)> {
    let (host, rest) = text.split_once(": ")?;
    let glog = rest.len() > 6
        && matches!(rest.as_bytes()[0], b'I' | b'W' | b'E' | b'F')
        && rest.as_bytes()[1..5].iter().all(u8::is_ascii_digit)
        && rest.as_bytes()[5] == b' ';
    (host.len() <= 64
        && is_hostname(host)
        && host.bytes().any(|b| b.is_ascii_digit() || b == b'-')
        && host.bytes().any(|b| b.is_ascii_lowercase())
        && !host.bytes().any(|b| b.is_ascii_uppercase())
        && (rest.starts_with('[') || glog || nccl_prefix(rest).is_some()))
    .then_some((host, rest))
}

/// Open MPI's `--tag-output` prefix, `[1,12]<stderr>:` (job id, rank, stream): the rank
/// and the text after the prefix.
fn mpi_tag(text: &str) -> Option<(&str, &str)> {
    let (inside, rest) = text.strip_prefix('[')?.split_once(']')?;
    let (job, rank) = inside.split_once(',')?;
    let rest = rest
        .strip_prefix("<stdout>:")
        .or_else(|| rest.strip_prefix("<stderr>:"))
        .or_else(|| rest.strip_prefix(':'))?;
    (numeric(job) && numeric(rank) && rank.len() <= 9).then_some((rank, rest))
}

/// The rank of a `[Rank N]` or `[PG ... Rank N]` tag in `text`.
fn rank_tag(text: &str) -> Option<&str> {
    let at = text
        .find(" Rank ")
        .map(|i| i + 1)
        .or_else(|| text.find("[Rank ").map(|i| i + 1))?;
    let open = text[..at].rfind('[')?;
    let inside = &text[open + 1..at];
    if !(inside.is_empty() || inside.starts_with("PG ")) || inside.contains(']') {
        return None;
    }
    let rest = &text[at + "Rank ".len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0 && rest[digits..].starts_with(']')).then(|| &rest[..digits])
}

fn numeric(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

/// The text after a leading `[date time]` stamp (`[2025-05-21 14:02:18] host:pid:tid
/// [0] NCCL WARN ...`), or the text itself.
fn strip_stamp(text: &str) -> &str {
    text.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .filter(|(inside, _)| {
            inside.len() <= 40
                && inside.contains(':')
                && inside.bytes().next().is_some_and(|b| b.is_ascii_digit())
                && inside
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b" -:.,T/".contains(&b))
        })
        .map_or(text, |(_, rest)| rest.trim_start())
}

/// A Ray log prefix, `(WorkerDict pid=30517)` or `(TaskRunner pid=88, ip=10.0.0.7)`:
/// the pid and the node's address, and the text after it.
fn ray_prefix(text: &str) -> Option<(Vec<(Field, String)>, &str)> {
    let (inside, rest) = text.strip_prefix('(')?.split_once(')')?;
    if inside.len() > 120 {
        return None;
    }
    let mut fields = Vec::new();
    for part in inside.split([' ', ',']) {
        if let Some(pid) = part.strip_prefix("pid=").filter(|p| numeric(p)) {
            fields.push((Field::Pid, pid.to_owned()));
        } else if let Some(ip) = part.strip_prefix("ip=").filter(|h| is_hostname(h)) {
            fields.push((Field::Host, ip.to_owned()));
        }
    }
    fields
        .iter()
        .any(|(f, _)| *f == Field::Pid)
        .then_some((fields, rest))
}

fn is_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<LogLine> {
        text.lines()
            .enumerate()
            .map(|(i, t)| LogLine {
                id: i as u64,
                text: t.to_owned(),
                ..LogLine::default()
            })
            .collect()
    }

    fn check(text: &str, category: Category, culprit: &str) -> Diagnosis {
        let rules = RuleSet::builtin().expect("shipped rules load");
        let d = classify(&rules, &lines(text));
        assert_eq!(d.category, Some(category), "{text}\n{d:#?}");
        assert_eq!(d.culprit.text, culprit, "{text}\n{d:#?}");
        d
    }

    #[test]
    fn nothing_matched_is_unknown_with_zero_confidence() {
        let rules = RuleSet::builtin().expect("shipped rules load");
        let d = classify(&rules, &lines("epoch 1 loss 0.3\nepoch 2 loss 0.2"));
        assert_eq!(d.category, None);
        assert_eq!(d.confidence, 0.0);
        assert!(d.explanation.contains("2 line(s)"), "{}", d.explanation);
    }

    #[test]
    fn a_specific_xid_outranks_a_failing_init_and_names_the_pci_bus() {
        let d = check(
            "Mar 14 04:52:22 node-a kernel: NVRM: GPU 0000:45:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n\
             Mar 14 04:52:22 node-a kernel: NVRM: GPU 0000:45:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n\
             Mar 14 04:52:22 node-a kernel: NVRM: GPU 0000:45:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n\
             Mar 14 04:52:23 node-a kernel: NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU",
            Category::EccMemoryError,
            "host node-a, GPU 0000:41:00.0",
        );
        assert_eq!(d.fault_locus, Some(crate::FaultLocus::Hardware));
        assert_eq!(d.evidence[0].id, 3, "cause first: {:?}", d.evidence);
        assert!(d.explanation.contains("line 3"), "{}", d.explanation);
    }

    #[test]
    fn fallen_off_the_bus_is_a_hardware_xid_not_ecc() {
        check(
            "[2419087.1] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            Category::GpuHardwareXid,
            "GPU 0000:3b:00.0",
        );
    }

    #[test]
    fn cuda_oom_beats_the_traceback_that_follows_it() {
        check(
            "[rank3]: Traceback (most recent call last):\n\
             [rank3]:   File \"train.py\", line 10, in <module>\n\
             [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB of which 1.00 GiB is free.\n\
             [rank3]: RuntimeError: something generic",
            Category::GpuOom,
            "rank 3, GPU 3",
        );
    }

    #[test]
    fn a_nan_loss_beats_the_generic_runtime_error() {
        check(
            " iteration      120/ 1000 | lm loss: nan | grad norm: nan |\n\
             RuntimeError: training stopped",
            Category::NanInfLoss,
            "not named in the logs",
        );
    }

    #[test]
    fn watchdog_timeouts_after_an_ib_error_are_a_network_error() {
        let mut text = String::from(
            "node-7:1234:1300 [5] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.9<4312> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.0.0.7 remoteGids::ffff:10.0.0.9\n",
        );
        for r in 0..64 {
            text.push_str(&format!(
                "[rank{r}]:[E1109 14:37:52.603317482 ProcessGroupNCCL.cpp:629] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=96, NumelOut=96, Timeout(ms)=600000) ran for 600017 milliseconds before timing out.\n"
            ));
        }
        let d = check(
            &text,
            Category::NetworkIbError,
            "host node-7, GPU 5, pid 1234, peer 10.0.0.9",
        );
        assert_eq!(d.fault_locus, Some(crate::FaultLocus::Network));
        assert!(
            d.explanation.contains("nccl_timeout_hang"),
            "{}",
            d.explanation
        );
    }

    #[test]
    fn timeouts_alone_are_a_hang_without_a_culprit() {
        let d = check(
            "[rank1]:[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1801487 milliseconds before timing out.\n\
             [rank2]:[E ProcessGroupNCCL.cpp:737] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1801487 milliseconds before timing out.",
            Category::NcclTimeoutHang,
            "not named in the logs",
        );
        assert!(d.confidence > 0.0 && d.confidence < 1.0, "{}", d.confidence);
    }

    #[test]
    fn a_launcher_summary_near_the_crash_fills_host_and_rank() {
        check(
            "Root Cause (first observed failure):\n[0]:\n  time      : 2025-01-22_08:17:46\n  host      : node-9\n  rank      : 12 (local_rank: 4)\n  exitcode  : -11 (pid: 2841)\n  error_file: <N/A>\n  traceback : Signal 11 (SIGSEGV) received by PID 2841",
            Category::SegfaultNativeCrash,
            "rank 12, local_rank 4, host node-9, pid 2841",
        );
    }

    #[test]
    fn origin_prefixes_are_read() {
        let line = |t: &str| LogLine {
            text: t.to_owned(),
            ..LogLine::default()
        };
        assert_eq!(
            origin(&line("gpu-node-04:18833:19540 [2] NCCL WARN x")),
            vec![
                (Field::Host, "gpu-node-04".to_owned()),
                (Field::Pid, "18833".to_owned()),
                (Field::Gpu, "2".to_owned())
            ]
        );
        assert_eq!(
            origin(&line("[rank17]: Traceback")),
            vec![(Field::Rank, "17".to_owned())]
        );
        assert_eq!(
            origin(&line(
                "Mar 14 04:52:03 gpu-node-15 kernel: [ 292.35] NVRM: x"
            )),
            vec![(Field::Host, "gpu-node-15".to_owned())]
        );
        assert!(origin(&line("2025-02-11 09:03:52 DEBUG:filelock:x")).is_empty());
        // A launcher's prefix ahead of the other forms: Open MPI's `--tag-output`, pdsh's
        // host (before a bracket, a glog header or an NCCL prefix, whose host wins),
        // srun's task label; NCCL's prefix behind time stamps or a glued `[N]`.
        let launcher_prefixed: [(&str, &[(Field, &str)]); 10] = [
            (
                "[1,12]<stderr>:[spark-exec-07:30926] Signal: Segmentation fault (11)",
                &[
                    (Field::Rank, "12"),
                    (Field::Host, "spark-exec-07"),
                    (Field::Pid, "30926"),
                ],
            ),
            (
                "[1,19]<stdout>:ip-10-2-7-8:7331:7415 [3] NCCL WARN x",
                &[
                    (Field::Rank, "19"),
                    (Field::Host, "ip-10-2-7-8"),
                    (Field::Pid, "7331"),
                    (Field::Gpu, "3"),
                ],
            ),
            (
                "worker-3: [rank14]: torch.OutOfMemoryError: CUDA out of memory",
                &[(Field::Rank, "14"), (Field::Host, "worker-3")],
            ),
            (
                "sx4kq27: E0912 09:06:17.402615 1942455 alloc.cc:414] x",
                &[(Field::Host, "sx4kq27")],
            ),
            (
                "node01: gpu-vm-0-14:108:593 [0] transport/net_ib.cc:816 NCCL WARN x",
                &[
                    (Field::Host, "gpu-vm-0-14"),
                    (Field::Pid, "108"),
                    (Field::Gpu, "0"),
                ],
            ),
            (
                "[15]worker-23:83:2526 [0] misc/socket.cc:503 NCCL WARN x",
                &[
                    (Field::Host, "worker-23"),
                    (Field::Pid, "83"),
                    (Field::Gpu, "0"),
                ],
            ),
            (
                "  | 2024-11-28T07:42:11.527Z | algo-1:24118:24188 [5] NCCL WARN x",
                &[
                    (Field::Host, "algo-1"),
                    (Field::Pid, "24118"),
                    (Field::Gpu, "5"),
                ],
            ),
            (
                "2025-03-01T10:00:02.123456789Z node-3:41:42 [1] NCCL WARN x",
                &[
                    (Field::Host, "node-3"),
                    (Field::Pid, "41"),
                    (Field::Gpu, "1"),
                ],
            ),
            (
                "0: [rank0]: RuntimeError: CUDA error",
                &[(Field::Rank, "0")],
            ),
            (
                "i.pretrain/0 [default2]:[rank2]: torch.OutOfMemoryError: x",
                &[(Field::LocalRank, "2"), (Field::Rank, "2")],
            ),
        ];
        for (text, want) in launcher_prefixed {
            let want: Vec<(Field, String)> =
                want.iter().map(|(f, v)| (*f, (*v).to_owned())).collect();
            assert_eq!(origin(&line(text)), want, "{text}");
        }
        // An exception's name is no host.
        assert!(origin(&line("RuntimeError: [/opt/gloo/pair.cc:589] Read error")).is_empty());
        assert!(origin(&line("error: [Errno 2] No such file or directory")).is_empty());
        // pdsh's host yields only to a host the text names, not to the source's node.
        let tailed = LogLine {
            text: "worker-3: [rank14]: x".to_owned(),
            node: Some("launcher-0".to_owned()),
            ..LogLine::default()
        };
        assert_eq!(
            origin(&tailed),
            vec![
                (Field::Host, "launcher-0".to_owned()),
                (Field::Rank, "14".to_owned()),
                (Field::Host, "worker-3".to_owned())
            ]
        );
        // A task number before other text, and a time before a colon, are no prefixes.
        assert!(origin(&line("0: Traceback (most recent call last):")).is_empty());
        assert!(origin(&line("12:00:01 [3] step 40 loss 2.1")).is_empty());
    }

    #[test]
    fn pci_ids_normalize() {
        assert_eq!(
            normalize_pci("PCI:0000:41:00").as_deref(),
            Some("0000:41:00.0")
        );
        assert_eq!(
            normalize_pci("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(normalize_pci("3b:00.1").as_deref(), Some("0000:3b:00.1"));
        assert_eq!(normalize_pci("gpu-node-1"), None);
    }

    #[test]
    fn a_survivors_report_of_a_lost_peer_blames_the_peer_not_the_survivor() {
        let rules = RuleSet::builtin().expect("shipped rules load");
        let line = LogLine {
            id: 1,
            node: Some("node-a".to_owned()),
            rank: Some(0),
            at_ms: None,
            text: "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [10.20.3.41]:31877: Connection reset by peer".to_owned(),
        };
        let d = classify(&rules, &[line]);
        assert_eq!(d.culprit.peers, vec!["10.20.3.41".to_owned()], "{d:#?}");
        assert!(
            d.culprit.ranks.is_empty(),
            "the survivor is not blamed: {d:#?}"
        );
        assert!(d.culprit.nodes.is_empty(), "{d:#?}");
    }

    #[test]
    fn the_first_report_names_the_culprit_not_its_echoes() {
        let d = check(
            "dgx-07:2841166:2842207 [4] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed\n\
             dgx-07:2841166:2842208 [5] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed\n\
             dgx-07:2841166:2842209 [6] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed",
            Category::NetworkIbError,
            "host dgx-07, GPU 4, pid 2841166",
        );
        assert_eq!(d.fault_locus, Some(crate::FaultLocus::Network));
    }

    #[test]
    fn a_watchdog_abort_after_a_timeout_is_the_hang_not_a_crash() {
        check(
            "[rank1]:[E311 09:27:40.58 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7342, OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for 1800083 milliseconds before timing out.\n\
             [rank1]:[E311 09:27:40.58 ProcessGroupNCCL.cpp:636] [Rank 1] To avoid data inconsistency, we are taking the entire process down.\n\
             terminate called after throwing an instance of 'c10::DistBackendError'\n\
             Fatal Python error: Aborted",
            Category::NcclTimeoutHang,
            "not named in the logs",
        );
        // Without the timeout first, the same abort is a crash.
        check(
            "terminate called after throwing an instance of 'c10::Error'\n\
             Fatal Python error: Aborted",
            Category::SegfaultNativeCrash,
            "not named in the logs",
        );
    }

    #[test]
    fn a_ray_task_header_overrules_the_printers_prefix() {
        // The driver (main_task) prints the remote actor's traceback under its own
        // prefix; the task header names the actor whose error it is.
        check(
            "(main_task pid=2207361) Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::WorkerDict.generate() (pid=2209518, ip=10.31.72.14, actor_id=7c41)\n\
             (main_task pid=2207361)   File \"/opt/verl/workers/fsdp_workers.py\", line 463, in generate_sequences\n\
             (main_task pid=2207361) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.86 GiB. GPU 0 has a total capacity of 23.69 GiB of which 1.04 GiB is free.",
            Category::GpuOom,
            "host 10.31.72.14, GPU 0, pid 2209518",
        );
        // An actor that prints its own crash is named by its prefix.
        check(
            "(WorkerDict pid=30517) *** SIGFPE received at time=1760342211 on cpu 27 ***\n\
             (WorkerDict pid=30517) Fatal Python error: Floating point exception",
            Category::SegfaultNativeCrash,
            "pid 30517",
        );
    }
}
