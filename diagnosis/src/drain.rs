//! Streaming log-template mining: shrink millions of lines into the few hundred
//! templates they were printed from, with per-template counts, ranks, nodes and times.
//!
//! # Algorithm
//!
//! A fixed-depth prefix tree in the manner of Drain (He et al., ICWS 2017), as Drain3
//! also does it:
//!
//! 1. Split the line on whitespace (borrowed slices, no copies) and **mask** each token:
//!    an ASCII alphanumeric run that contains a digit and is all hex digits (`42`,
//!    `0x7f3a`, `3b`, `E703`), or that is a UUID, becomes `<*>`; in other runs (`rank3`,
//!    `node-026`) only the digit runs become `<*>`. A token that is then nothing but
//!    `<*>` and `.:/+,-` (timestamps, IPs, PCI ids like `0000:3b:00.0`, `12/500`)
//!    collapses to a single `<*>`. Tokens without a digit are never copied.
//! 2. **Intern** every masked token as a `u32`; templates and comparisons work on ids.
//! 3. Descend the tree: first by token count, then by the first `depth - 2` tokens.
//!    A node has at most `max_children` children; once full, further tokens share its
//!    `<*>` child, and `<*>` tokens always go there.
//! 4. In the leaf, take the cluster whose template is most similar (share of positions
//!    with the same token, `<*>` positions not counted; ties go to the template with more
//!    `<*>`). At or above `sim_threshold` the line joins it and positions that differ
//!    become `<*>`; below, the line starts a new cluster.
//!
//! # The shape cache
//!
//! Steps 1 and 2 are most of the work, and their result depends on little of the line:
//! which bytes are digits, not which digits they are (with one exception: a `0` before
//! `x`/`X` can start a `0x` literal). So the miner first writes the line's **shape**, the
//! line with every digit turned into `1` except such a `0`, and looks it up in a small
//! two-way set-associative cache of recent shapes and their token ids. Two lines with the
//! same shape mask to the same tokens (every masking rule reads only byte classes, the
//! positions of `-` and the `0x` prefix), and an id, once given, never changes; so a hit
//! skips splitting, masking and interning with the same result, and the cache is checked
//! byte for byte, never trusted on a hash. Training logs repeat a few hundred shapes
//! (603 in the first 200,000 lines of the benchmark log), so most lines hit. Lines with a
//! token over the vocabulary cap are not cached (their count must go on), nor lines over
//! `SHAPE_MAX_BYTES`; when fewer than a quarter of lookups hit, the cache steps aside for
//! a while so that logs without repetition do not pay for it.
//!
//! # Bounded memory
//!
//! - At most `max_clusters` live clusters. When a new one does not fit, the least
//!   recently used sixteenth is evicted at once (a partial selection over last-use ticks,
//!   so eviction costs O(1) amortized per new cluster). Failures sit at the end of a log,
//!   so what is evicted is old, one-off chatter.
//! - At most `max_tokens` distinct tokens; a token first seen after that is treated as a
//!   variable (`<*>`), which is what an unbounded vocabulary usually is.
//! - At most `max_nodes` tree nodes; once spent, lines share the nearest `<*>` child
//!   or the deepest node reached.
//! - Lines are cut at `max_line_tokens` tokens; samples at `max_sample_bytes`.
//! - Per cluster, ranks and nodes are kept exactly up to 64 distinct values, and counted
//!   beyond that by a 1024-bit linear-counting sketch (accurate to a few percent up to a
//!   few thousand distinct values), so "seen on 1,000 of 1,024 ranks" stays knowable.
//!
//! The miner is pure: no I/O, no clock. Times are whatever the lines carry.

use std::fmt;
use std::io::{self, ErrorKind, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use rustc_hash::FxHashMap;

use crate::model::LogLine;

/// Token id of the wildcard `<*>`.
const WILDCARD: u32 = 0;
/// The text of the wildcard.
const WILDCARD_TEXT: &str = "<*>";
/// Values kept exactly per cluster (ranks, nodes).
const EXACT_VALUES: usize = 64;
/// Bits in the per-cluster distinct-count sketch.
const SKETCH_BITS: usize = 1024;

/// Settings of the miner. `Default` matches Drain3's defaults where Drain3 has one.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainConfig {
    /// Depth of the prefix tree counting the root and the token-count level (Drain3's
    /// `depth`); the first `depth - 2` tokens route a line. At least 3.
    pub depth: usize,
    /// Share of non-wildcard positions that must agree for a line to join a cluster,
    /// in `0.0..=1.0`.
    pub sim_threshold: f64,
    /// Children per tree node before tokens share the `<*>` child. At least 2.
    pub max_children: usize,
    /// Live clusters kept; the least recently used are evicted beyond this. At least 1.
    pub max_clusters: usize,
    /// Distinct tokens interned; later new tokens are treated as `<*>`. At least 16.
    pub max_tokens: usize,
    /// Tree nodes created at most. At least 16.
    pub max_nodes: usize,
    /// Tokens of a line that are looked at; the rest are ignored. At least 1.
    pub max_line_tokens: usize,
    /// Bytes of a cluster's sample line kept (cut at a character boundary).
    pub max_sample_bytes: usize,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            depth: 4,
            sim_threshold: 0.4,
            max_children: 100,
            max_clusters: 20_000,
            max_tokens: 200_000,
            max_nodes: 200_000,
            max_line_tokens: 256,
            max_sample_bytes: 512,
        }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("drain config: {field} {reason}")]
pub struct DrainConfigError {
    /// The field, as named in [`DrainConfig`].
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl DrainConfig {
    /// Checks every field; the first bad one is reported.
    pub fn validate(&self) -> Result<(), DrainConfigError> {
        let bad = |field: &'static str, reason: String| Err(DrainConfigError { field, reason });
        if self.depth < 3 {
            return bad("depth", format!("is {}, must be at least 3", self.depth));
        }
        if !(0.0..=1.0).contains(&self.sim_threshold) {
            return bad(
                "sim_threshold",
                format!("is {}, must be within 0..=1", self.sim_threshold),
            );
        }
        for (field, value, min) in [
            ("max_children", self.max_children, 2),
            ("max_clusters", self.max_clusters, 1),
            ("max_tokens", self.max_tokens, 16),
            ("max_nodes", self.max_nodes, 16),
            ("max_line_tokens", self.max_line_tokens, 1),
        ] {
            if value < min {
                return bad(field, format!("is {value}, must be at least {min}"));
            }
        }
        Ok(())
    }
}

/// Stable identity of a cluster (never reused, even after eviction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(pub u64);

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}", self.0)
    }
}

/// A line as the miner reads it: borrowed, so feeding the miner copies nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineRef<'a> {
    /// The line id (position in the input).
    pub id: u64,
    /// The text, without the line terminator.
    pub text: &'a str,
    /// Global rank, when known.
    pub rank: Option<u32>,
    /// Node name, when known.
    pub node: Option<&'a str>,
    /// Milliseconds since the Unix epoch, when known.
    pub at_ms: Option<i64>,
}

impl<'a> From<&'a LogLine> for LineRef<'a> {
    fn from(line: &'a LogLine) -> Self {
        LineRef {
            id: line.id,
            text: &line.text,
            rank: line.rank,
            node: line.node.as_deref(),
            at_ms: line.at_ms,
        }
    }
}

/// A line as raw bytes, for callers that frame lines themselves and skip UTF-8
/// validation: the miner works on bytes and only checks what it stores (new tokens and
/// sample lines, invalid sequences replaced with U+FFFD there).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteLineRef<'a> {
    /// The line id (position in the input).
    pub id: u64,
    /// The text, without the line terminator.
    pub text: &'a [u8],
    /// Global rank, when known.
    pub rank: Option<u32>,
    /// Node name, when known.
    pub node: Option<&'a str>,
    /// Milliseconds since the Unix epoch, when known.
    pub at_ms: Option<i64>,
}

impl<'a> From<LineRef<'a>> for ByteLineRef<'a> {
    fn from(line: LineRef<'a>) -> Self {
        ByteLineRef {
            id: line.id,
            text: line.text.as_bytes(),
            rank: line.rank,
            node: line.node,
            at_ms: line.at_ms,
        }
    }
}

/// A template and what is known of the lines it covers: the miner's output.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// Stable cluster id.
    pub id: ClusterId,
    /// The template, tokens joined by one space, variables as `<*>`.
    pub text: String,
    /// Lines that joined it.
    pub count: u64,
    /// Id of the first and of the last line that joined it.
    pub first_line: u64,
    /// Id of the last line that joined it.
    pub last_line: u64,
    /// Earliest time among its lines that carried one.
    pub first_at_ms: Option<i64>,
    /// Latest time among its lines that carried one.
    pub last_at_ms: Option<i64>,
    /// Ranks seen, ascending: all of them when `distinct_ranks` is at most 64, else
    /// the first 64.
    pub ranks: Vec<u32>,
    /// Distinct ranks seen: exact up to 64, estimated beyond.
    pub distinct_ranks: u64,
    /// Nodes seen, sorted, with the same rule as `ranks`.
    pub nodes: Vec<String>,
    /// Distinct nodes seen: exact up to 64, estimated beyond.
    pub distinct_nodes: u64,
    /// Id of the sample line (the first one).
    pub sample_line: u64,
    /// Text of the sample line, cut at `max_sample_bytes`.
    pub sample_text: String,
}

/// Counters of the miner's work and its bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MinerStats {
    /// Lines mined.
    pub lines: u64,
    /// Clusters alive now.
    pub clusters: usize,
    /// Clusters ever created.
    pub clusters_created: u64,
    /// Clusters evicted to stay within `max_clusters`.
    pub clusters_evicted: u64,
    /// Distinct tokens interned.
    pub tokens: usize,
    /// Tokens treated as `<*>` because the vocabulary was full.
    pub tokens_over_cap: u64,
    /// Tree nodes.
    pub nodes: usize,
    /// Lines cut at `max_line_tokens`.
    pub lines_cut: u64,
    /// Lines whose tokens came from the shape cache (see the module docs).
    pub shape_hits: u64,
    /// Lines looked up in the shape cache and not found.
    pub shape_misses: u64,
}

/// Distinct values of a cluster: exact up to [`EXACT_VALUES`], sketched always.
#[derive(Debug, Clone)]
struct ValueSet {
    exact: Vec<u32>,
    /// Whether a value did not fit in `exact`.
    spilled: bool,
    sketch: Box<[u64; SKETCH_BITS / 64]>,
}

impl ValueSet {
    fn new() -> Self {
        ValueSet {
            exact: Vec::new(),
            spilled: false,
            sketch: Box::new([0; SKETCH_BITS / 64]),
        }
    }

    fn insert(&mut self, value: u32) {
        let bit = (mix64(u64::from(value)) % SKETCH_BITS as u64) as usize;
        self.sketch[bit / 64] |= 1 << (bit % 64);
        // Once a value did not fit, the exact list is frozen: only the sketch counts.
        if self.spilled || self.exact.contains(&value) {
            return;
        }
        if self.exact.len() < EXACT_VALUES {
            self.exact.push(value);
        } else {
            self.spilled = true;
        }
    }

    /// Exact count while everything fit, else the linear-counting estimate (never
    /// below what is known exactly).
    fn distinct(&self) -> u64 {
        if !self.spilled {
            return self.exact.len() as u64;
        }
        let set: u32 = self.sketch.iter().map(|w| w.count_ones()).sum();
        let zeros = (SKETCH_BITS as u32).saturating_sub(set).max(1);
        let m = SKETCH_BITS as f64;
        let estimate = (m * (m / f64::from(zeros)).ln()).round() as u64;
        estimate.max(EXACT_VALUES as u64 + 1)
    }
}

#[derive(Debug, Clone)]
struct Cluster {
    id: ClusterId,
    tokens: Vec<u32>,
    /// Tree node whose cluster list holds this cluster's slot.
    node: u32,
    count: u64,
    first_line: u64,
    last_line: u64,
    first_at_ms: Option<i64>,
    last_at_ms: Option<i64>,
    ranks: ValueSet,
    nodes: ValueSet,
    sample_line: u64,
    sample_text: String,
    last_used: u64,
}

#[derive(Debug, Default, Clone)]
struct Node {
    children: FxHashMap<u32, u32>,
    /// Slots of the clusters that live here.
    clusters: Vec<u32>,
}

/// The streaming template miner. Feed lines with [`Miner::add`]; read templates with
/// [`Miner::templates`].
#[derive(Debug)]
pub struct Miner {
    config: DrainConfig,
    prefix_levels: usize,
    token_ids: FxHashMap<Box<str>, u32>,
    token_text: Vec<Box<str>>,
    /// Hash of a token's masked pieces → its id: a cache in front of `token_ids`, hit
    /// when the token's masked form equals the stored text (checked piece by piece, so
    /// a collision only costs a trip to `token_ids`). At most `2 * max_tokens` entries.
    by_hash: FxHashMap<u64, u32>,
    node_ids: FxHashMap<Box<str>, u32>,
    node_text: Vec<Box<str>>,
    last_node: Option<u32>,
    /// Tree root: token count → node.
    roots: FxHashMap<u32, u32>,
    nodes: Vec<Node>,
    slots: Vec<Option<Cluster>>,
    free_slots: Vec<u32>,
    live: usize,
    next_id: u64,
    stats: MinerStats,
    /// Reused per line: the line's token ids.
    line_tokens: Vec<u32>,
    /// Reused per line by [`Miner::add_bytes`]: the line's tokens before interning.
    toks: Vec<Tok>,
    /// Reused per new token: its masked form.
    masked: Vec<u8>,
    /// Recent line shapes and their token ids.
    shapes: ShapeCache,
    /// Reused per line by [`Miner::add_bytes`]: the line's shape.
    shape_buf: Vec<u8>,
}

impl Miner {
    /// A miner with the given settings.
    pub fn new(config: DrainConfig) -> Result<Miner, DrainConfigError> {
        config.validate()?;
        let mut token_ids = FxHashMap::default();
        token_ids.insert(Box::from(WILDCARD_TEXT), WILDCARD);
        Ok(Miner {
            prefix_levels: config.depth - 2,
            config,
            token_ids,
            token_text: vec![Box::from(WILDCARD_TEXT)],
            by_hash: FxHashMap::default(),
            node_ids: FxHashMap::default(),
            node_text: Vec::new(),
            last_node: None,
            roots: FxHashMap::default(),
            nodes: Vec::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: 0,
            next_id: 0,
            stats: MinerStats::default(),
            line_tokens: Vec::new(),
            toks: Vec::new(),
            masked: Vec::new(),
            shapes: ShapeCache::new(),
            shape_buf: Vec::new(),
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &DrainConfig {
        &self.config
    }

    /// Mines one line; returns the cluster it joined or started.
    pub fn add(&mut self, line: LineRef<'_>) -> ClusterId {
        self.add_bytes(ByteLineRef::from(line))
    }

    /// Mines one line given as bytes; the same as [`Miner::add`] on its UTF-8 text.
    pub fn add_bytes(&mut self, line: ByteLineRef<'_>) -> ClusterId {
        if !self.shapes.wanted(line.text.len(), self.stats.lines) {
            return self.add_prepared(line, line.text, 0, None, None);
        }
        let mut shape = std::mem::take(&mut self.shape_buf);
        shape_of(line.text, &mut shape);
        let key = (shape.as_slice(), shape_hash(&shape));
        let id = self.add_prepared(line, line.text, 0, None, Some(key));
        self.shape_buf = shape;
        id
    }

    /// Turns the shape cache on (the default) or off. Off, every line is split, masked
    /// and interned; the templates are the same either way (a test holds it to that).
    pub fn set_shape_cache(&mut self, on: bool) {
        self.shapes.enabled = on;
    }

    /// Whether shapes are worth computing for the next lines: the cache is on, and not
    /// stepped aside for want of hits.
    fn shapes_wanted(&self) -> bool {
        self.shapes.wanted(0, self.stats.lines)
    }

    /// Mines a line whose text lies at `base` in `block`. `toks` (with whether the line
    /// was cut) is the line split by [`prepare`], when a reading thread did that
    /// already; `shape` is its shape and the shape's hash, when computed.
    fn add_prepared(
        &mut self,
        line: ByteLineRef<'_>,
        block: &[u8],
        base: usize,
        toks: Option<(&[Tok], bool)>,
        shape: Option<(&[u8], u64)>,
    ) -> ClusterId {
        let shape = shape.filter(|(bytes, _)| self.shapes.wanted(bytes.len(), self.stats.lines));
        self.stats.lines += 1;
        let tick = self.stats.lines;
        let cached = match shape {
            Some((bytes, hash)) => self.shapes.get(hash, bytes, tick, &mut self.line_tokens),
            None => None,
        };
        let cut = match cached {
            Some(cut) => {
                self.stats.shape_hits += 1;
                cut
            }
            None => {
                if shape.is_some() {
                    self.stats.shape_misses += 1;
                }
                let over_cap = self.stats.tokens_over_cap;
                let cut = match toks {
                    Some((toks, cut)) => {
                        self.intern_all(block, toks);
                        cut
                    }
                    None => {
                        let mut toks = std::mem::take(&mut self.toks);
                        toks.clear();
                        let cut = prepare(line.text, base, self.config.max_line_tokens, &mut toks);
                        self.intern_all(block, &toks);
                        self.toks = toks;
                        cut
                    }
                };
                if let Some((bytes, hash)) = shape
                    && self.stats.tokens_over_cap == over_cap
                {
                    self.shapes
                        .insert(hash, bytes, &self.line_tokens, cut, tick);
                }
                cut
            }
        };
        if cut {
            self.stats.lines_cut += 1;
        }
        let slot = match self.find(&self.line_tokens) {
            Some(slot) => {
                self.merge_into(slot);
                slot
            }
            None => self.create(line),
        };
        self.observe(slot, line)
    }

    /// Mines a [`LogLine`].
    pub fn add_line(&mut self, line: &LogLine) -> ClusterId {
        self.add(LineRef::from(line))
    }

    /// Counters so far.
    pub fn stats(&self) -> MinerStats {
        MinerStats {
            clusters: self.live,
            tokens: self.token_text.len(),
            nodes: self.nodes.len(),
            ..self.stats
        }
    }

    /// The live templates, in order of their first line.
    pub fn templates(&self) -> Vec<Template> {
        let mut out: Vec<Template> = self
            .slots
            .iter()
            .flatten()
            .map(|c| self.template_of(c))
            .collect();
        out.sort_by_key(|t| (t.first_line, t.id));
        out
    }

    /// One live template by id.
    pub fn template(&self, id: ClusterId) -> Option<Template> {
        self.slots
            .iter()
            .flatten()
            .find(|c| c.id == id)
            .map(|c| self.template_of(c))
    }

    fn template_of(&self, c: &Cluster) -> Template {
        let mut text = String::new();
        for (i, &t) in c.tokens.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(self.token_text.get(t as usize).map_or(WILDCARD_TEXT, |s| s));
        }
        let mut ranks = c.ranks.exact.clone();
        ranks.sort_unstable();
        let mut nodes: Vec<String> = c
            .nodes
            .exact
            .iter()
            .filter_map(|&n| self.node_text.get(n as usize).map(|s| s.to_string()))
            .collect();
        nodes.sort_unstable();
        Template {
            id: c.id,
            text,
            count: c.count,
            first_line: c.first_line,
            last_line: c.last_line,
            first_at_ms: c.first_at_ms,
            last_at_ms: c.last_at_ms,
            ranks,
            distinct_ranks: c.ranks.distinct(),
            nodes,
            distinct_nodes: c.nodes.distinct(),
            sample_line: c.sample_line,
            sample_text: c.sample_text.clone(),
        }
    }

    /// Fills `line_tokens` with the interned ids of `toks`, whose spans lie in `block`.
    fn intern_all(&mut self, block: &[u8], toks: &[Tok]) {
        self.line_tokens.clear();
        for tok in toks {
            let raw = block
                .get(tok.start as usize..tok.end as usize)
                .unwrap_or(&[]);
            let id = match tok.kind {
                TokKind::Wild => WILDCARD,
                TokKind::Raw => self.intern_raw(raw, tok.key),
                TokKind::Masked => self.intern_masked(raw, tok.key),
            };
            self.line_tokens.push(id);
        }
    }

    /// Id of a token without digits (its masked form is itself).
    fn intern_raw(&mut self, raw: &[u8], key: u64) -> u32 {
        if let Some(&id) = self.by_hash.get(&key)
            && self
                .token_text
                .get(id as usize)
                .is_some_and(|t| t.as_bytes() == raw)
        {
            return id;
        }
        let interned = match std::str::from_utf8(raw) {
            Ok(text) => self.intern_new(text),
            Err(_) => self.intern_new(&String::from_utf8_lossy(raw)),
        };
        self.remember(key, interned)
    }

    /// Id of a token with digits, by its masked form.
    fn intern_masked(&mut self, raw: &[u8], key: u64) -> u32 {
        if let Some(&id) = self.by_hash.get(&key)
            && let Some(text) = self.token_text.get(id as usize)
        {
            let mut same = PieceEq::new(text.as_bytes());
            mask_pieces(raw, &mut same);
            if same.matched() {
                return id;
            }
        }
        let mut masked = std::mem::take(&mut self.masked);
        masked.clear();
        mask_pieces(raw, &mut masked);
        let interned = match std::str::from_utf8(&masked) {
            Ok(text) => self.intern_new(text),
            Err(_) => self.intern_new(&String::from_utf8_lossy(&masked)),
        };
        self.masked = masked;
        self.remember(key, interned)
    }

    /// Caches `key` → the interned id (not the over-cap `<*>`, which is counted each
    /// time); returns the id.
    fn remember(&mut self, key: u64, interned: Option<u32>) -> u32 {
        let Some(id) = interned else {
            return WILDCARD;
        };
        if self.by_hash.len() < self.config.max_tokens.saturating_mul(2) {
            self.by_hash.entry(key).or_insert(id);
        }
        id
    }

    /// The id of `token` by its text; `None` (counted) when it is new and the
    /// vocabulary is full.
    fn intern_new(&mut self, token: &str) -> Option<u32> {
        if let Some(&id) = self.token_ids.get(token) {
            return Some(id);
        }
        if self.token_text.len() >= self.config.max_tokens {
            self.stats.tokens_over_cap += 1;
            return None;
        }
        let id = self.token_text.len() as u32;
        self.token_ids.insert(Box::from(token), id);
        self.token_text.push(Box::from(token));
        Some(id)
    }

    fn intern_node(&mut self, node: &str) -> Option<u32> {
        // Lines come in runs from one node; one remembered entry saves most lookups.
        if let Some(last) = self.last_node
            && self
                .node_text
                .get(last as usize)
                .is_some_and(|n| &**n == node)
        {
            return Some(last);
        }
        let id = self.intern_node_slow(node)?;
        self.last_node = Some(id);
        Some(id)
    }

    fn intern_node_slow(&mut self, node: &str) -> Option<u32> {
        if let Some(&id) = self.node_ids.get(node) {
            return Some(id);
        }
        if self.node_text.len() >= self.config.max_tokens {
            return None;
        }
        let id = self.node_text.len() as u32;
        self.node_ids.insert(Box::from(node), id);
        self.node_text.push(Box::from(node));
        Some(id)
    }

    /// The slot of the best matching cluster, if one is similar enough.
    fn find(&self, tokens: &[u32]) -> Option<u32> {
        let mut node = *self.roots.get(&(tokens.len() as u32))?;
        for &token in tokens.iter().take(self.prefix_levels) {
            let children = &self.nodes[node as usize].children;
            match children.get(&token).or_else(|| children.get(&WILDCARD)) {
                Some(&child) => node = child,
                None => break,
            }
        }
        let mut best: Option<(u32, f64, usize)> = None;
        for &slot in &self.nodes[node as usize].clusters {
            let Some(cluster) = self.slots[slot as usize].as_ref() else {
                continue;
            };
            let (sim, params) = similarity(&cluster.tokens, tokens);
            let better = match best {
                None => true,
                Some((_, s, p)) => sim > s || (sim == s && params > p),
            };
            if better {
                best = Some((slot, sim, params));
            }
        }
        best.filter(|&(_, sim, _)| sim >= self.config.sim_threshold)
            .map(|(slot, _, _)| slot)
    }

    fn merge_into(&mut self, slot: u32) {
        if let Some(cluster) = self.slots[slot as usize].as_mut() {
            for (t, &l) in cluster.tokens.iter_mut().zip(&self.line_tokens) {
                if *t != l {
                    *t = WILDCARD;
                }
            }
        }
    }

    /// Starts a cluster for the current line, evicting old ones if needed.
    fn create(&mut self, line: ByteLineRef<'_>) -> u32 {
        if self.live >= self.config.max_clusters {
            self.evict();
        }
        let tokens = self.line_tokens.clone();
        let node = self.leaf_for_new(&tokens);
        let id = ClusterId(self.next_id);
        self.next_id += 1;
        self.stats.clusters_created += 1;
        let cluster = Cluster {
            id,
            tokens,
            node,
            count: 0,
            first_line: line.id,
            last_line: line.id,
            first_at_ms: None,
            last_at_ms: None,
            ranks: ValueSet::new(),
            nodes: ValueSet::new(),
            sample_line: line.id,
            sample_text: String::from_utf8_lossy(cut(line.text, self.config.max_sample_bytes))
                .into_owned(),
            last_used: 0,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(cluster);
                slot
            }
            None => {
                self.slots.push(Some(cluster));
                (self.slots.len() - 1) as u32
            }
        };
        self.nodes[node as usize].clusters.push(slot);
        self.live += 1;
        slot
    }

    fn new_node(&mut self) -> Option<u32> {
        if self.nodes.len() >= self.config.max_nodes + self.roots.len() {
            return None;
        }
        self.nodes.push(Node::default());
        Some((self.nodes.len() - 1) as u32)
    }

    /// Walks (and grows) the tree for a new cluster's tokens; returns the node that
    /// will hold it. Mirrors the routing of [`Miner::find`].
    fn leaf_for_new(&mut self, tokens: &[u32]) -> u32 {
        let len = tokens.len() as u32;
        let mut node = match self.roots.get(&len) {
            Some(&n) => n,
            None => {
                // Roots are bounded by `max_line_tokens + 1`, so they do not count
                // against `max_nodes`.
                self.nodes.push(Node::default());
                let n = (self.nodes.len() - 1) as u32;
                self.roots.insert(len, n);
                n
            }
        };
        for &token in tokens.iter().take(self.prefix_levels) {
            let children = &self.nodes[node as usize].children;
            if let Some(&child) = children.get(&token) {
                node = child;
                continue;
            }
            let has_wild = children.contains_key(&WILDCARD);
            let room = self.config.max_children;
            let len = children.len();
            let key = if token == WILDCARD {
                WILDCARD
            } else if (has_wild && len < room) || (!has_wild && len + 1 < room) {
                token
            } else {
                WILDCARD
            };
            if let Some(&child) = self.nodes[node as usize].children.get(&key) {
                node = child;
                continue;
            }
            match self.new_node() {
                Some(child) => {
                    self.nodes[node as usize].children.insert(key, child);
                    node = child;
                }
                None => break,
            }
        }
        node
    }

    /// Evicts the least recently used sixteenth of the live clusters.
    fn evict(&mut self) {
        let mut by_use: Vec<(u64, u32)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().map(|c| (c.last_used, slot as u32)))
            .collect();
        let n = (self.config.max_clusters / 16).max(1).min(by_use.len());
        if n == 0 {
            return;
        }
        by_use.select_nth_unstable(n - 1);
        for &(_, slot) in &by_use[..n] {
            if let Some(cluster) = self.slots[slot as usize].take() {
                let list = &mut self.nodes[cluster.node as usize].clusters;
                if let Some(pos) = list.iter().position(|&s| s == slot) {
                    list.swap_remove(pos);
                }
                self.free_slots.push(slot);
                self.live -= 1;
                self.stats.clusters_evicted += 1;
            }
        }
    }

    /// Records the line in the cluster's counters.
    fn observe(&mut self, slot: u32, line: ByteLineRef<'_>) -> ClusterId {
        let node = line.node.and_then(|n| self.intern_node(n));
        let tick = self.stats.lines;
        let Some(c) = self.slots[slot as usize].as_mut() else {
            return ClusterId(u64::MAX);
        };
        c.count += 1;
        c.last_used = tick;
        c.first_line = c.first_line.min(line.id);
        c.last_line = c.last_line.max(line.id);
        if let Some(at) = line.at_ms {
            c.first_at_ms = Some(c.first_at_ms.map_or(at, |f| f.min(at)));
            c.last_at_ms = Some(c.last_at_ms.map_or(at, |l| l.max(at)));
        }
        if let Some(rank) = line.rank {
            c.ranks.insert(rank);
        }
        if let Some(node) = node {
            c.nodes.insert(node);
        }
        c.id
    }
}

/// Sets of the shape cache; each holds two lines.
const SHAPE_SETS: usize = 1024;
/// Longest line whose shape is cached, in bytes (bounds the cache at about 1 MiB of
/// shapes plus their ids).
const SHAPE_MAX_BYTES: usize = 512;
/// Lookups per verdict on whether the cache pays.
const SHAPE_PROBATION: u64 = 16_384;
/// Lines the cache stays aside after a verdict that it does not pay.
const SHAPE_REST: u64 = 1 << 18;

/// A line shape and its token ids.
#[derive(Debug, Clone)]
struct ShapeEntry {
    hash: u64,
    shape: Box<[u8]>,
    ids: Box<[u32]>,
    /// The line had more tokens than `max_line_tokens`.
    cut: bool,
    /// Line tick of its last hit, for replacement within its set.
    used: u64,
}

/// Recent line shapes → token ids; see the module docs.
#[derive(Debug)]
struct ShapeCache {
    /// `2 * SHAPE_SETS` ways, set `s` in `2s` and `2s + 1`.
    ways: Vec<Option<ShapeEntry>>,
    /// Turned off by [`Miner::set_shape_cache`].
    enabled: bool,
    lookups: u64,
    hits: u64,
    /// Stepped aside until this line tick.
    resting_until: u64,
}

impl ShapeCache {
    fn new() -> Self {
        ShapeCache {
            ways: Vec::new(),
            enabled: true,
            lookups: 0,
            hits: 0,
            resting_until: 0,
        }
    }

    /// Whether a line of `len` bytes, at line tick `tick`, is to be looked up.
    fn wanted(&self, len: usize, tick: u64) -> bool {
        self.enabled && len <= SHAPE_MAX_BYTES && tick >= self.resting_until
    }

    fn set_of(hash: u64) -> usize {
        // The hash's high bits are its best mixed.
        2 * ((hash >> 40) as usize % SHAPE_SETS)
    }

    /// On a hit, the ids go into `ids` and whether the line was cut is returned.
    fn get(&mut self, hash: u64, shape: &[u8], tick: u64, ids: &mut Vec<u32>) -> Option<bool> {
        self.lookups += 1;
        if self.lookups == SHAPE_PROBATION {
            if self.hits * 4 < self.lookups {
                self.resting_until = tick + SHAPE_REST;
            }
            self.lookups = 0;
            self.hits = 0;
        }
        let set = Self::set_of(hash);
        let ways = self.ways.get_mut(set..set + 2)?;
        for entry in ways.iter_mut().flatten() {
            if entry.hash == hash && *entry.shape == *shape {
                entry.used = tick;
                self.hits += 1;
                ids.clear();
                ids.extend_from_slice(&entry.ids);
                return Some(entry.cut);
            }
        }
        None
    }

    /// Remembers a line's shape and ids, in place of the less recently used of its set.
    fn insert(&mut self, hash: u64, shape: &[u8], ids: &[u32], cut: bool, tick: u64) {
        if self.ways.is_empty() {
            self.ways.resize(2 * SHAPE_SETS, None);
        }
        let set = Self::set_of(hash);
        let used = |w: &Option<ShapeEntry>| w.as_ref().map_or(0, |e| e.used);
        let way = if used(&self.ways[set]) <= used(&self.ways[set + 1]) {
            set
        } else {
            set + 1
        };
        self.ways[way] = Some(ShapeEntry {
            hash,
            shape: shape.into(),
            ids: ids.into(),
            cut,
            used: tick,
        });
    }
}

/// Replaces `out` with the shape of `text` (as long as `text`): every ASCII digit
/// becomes `1`, except a `0` right before `x` or `X`, which stays `0`. Masking reads
/// nothing else of a digit (see the module docs).
fn shape_of(text: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend(
        text.iter()
            .map(|&b| if b.wrapping_sub(b'0') < 10 { b'1' } else { b }),
    );
    for i in memchr::memchr2_iter(b'x', b'X', text) {
        if i > 0 && text[i - 1] == b'0' {
            out[i - 1] = b'0';
        }
    }
}

/// Hash of a shape.
fn shape_hash(shape: &[u8]) -> u64 {
    let mut hash = PieceHash::new();
    hash.literal(shape);
    hash.finish()
}

/// A 64-bit finalizer (MurmurHash3's `fmix64`): neighbouring ranks land on unrelated
/// bits, as linear counting assumes.
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Similarity of a line to a template of the same length: the share of positions with
/// equal tokens, wildcard positions counted as neither; and the number of wildcards.
fn similarity(template: &[u32], line: &[u32]) -> (f64, usize) {
    if template.len() != line.len() {
        return (0.0, 0);
    }
    if template.is_empty() {
        return (1.0, 0);
    }
    let mut same = 0usize;
    let mut params = 0usize;
    for (&t, &l) in template.iter().zip(line) {
        if t == WILDCARD {
            params += 1;
        } else if t == l {
            same += 1;
        }
    }
    (same as f64 / template.len() as f64, params)
}

/// `text` cut to at most `max` bytes, not inside a UTF-8 sequence.
fn cut(text: &[u8], max: usize) -> &[u8] {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    // Back off continuation bytes (0b10xx_xxxx): `end` then starts a character.
    while end > 0 && (text[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    &text[..end]
}

/// [`CLASS`] bit: ASCII whitespace (as `u8::is_ascii_whitespace`).
const SPACE: u8 = 1;
/// [`CLASS`] bit: ASCII digit.
const DIGIT: u8 = 2;
/// [`CLASS`] bit: hex letter `a-f`, `A-F`.
const HEX_LETTER: u8 = 4;
/// [`CLASS`] bit: any other ASCII letter (`x` and `X` too).
const LETTER: u8 = 8;
/// [`CLASS`] bit: a separator that a collapsing token may contain, `.:/+,-`.
const SEP: u8 = 16;
/// [`CLASS`] bit: anything else (other punctuation, bytes of multi-byte characters).
const OTHER: u8 = 32;
/// Alphanumeric: any of these bits.
const ALNUM: u8 = DIGIT | HEX_LETTER | LETTER;
/// Byte classes for splitting and masking: one table lookup per byte.
const CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = if byte.is_ascii_whitespace() {
            SPACE
        } else if byte.is_ascii_digit() {
            DIGIT
        } else if byte.is_ascii_hexdigit() {
            HEX_LETTER
        } else if byte.is_ascii_alphabetic() {
            LETTER
        } else if matches!(byte, b'.' | b':' | b'/' | b'+' | b',' | b'-') {
            SEP
        } else {
            OTHER
        };
        b += 1;
    }
    table
};

fn class(b: u8) -> u8 {
    CLASS[b as usize]
}

/// How a token is interned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokKind {
    /// The token masks to a single `<*>`.
    Wild,
    /// No digits: the token is its own masked form.
    Raw,
    /// Digits: interned by its masked form.
    Masked,
}

/// A token of a line, split and hashed but not interned yet: work that needs no miner
/// state, so another thread may do it.
#[derive(Debug, Clone, Copy)]
struct Tok {
    start: u32,
    end: u32,
    key: u64,
    kind: TokKind,
}

/// Splits `text`, which starts at `base` in its block, on ASCII whitespace into at
/// most `max_tokens` tokens, appending them to `out` with the hash of their masked
/// pieces. One pass over the bytes notes digits on the way: a token without digits is
/// its own masked form; one with digits is masked piece by piece into the hash, so its
/// masked text is only built later when it is new. Returns whether the line had more
/// tokens than `max_tokens`.
fn prepare(text: &[u8], base: usize, max_tokens: usize, out: &mut Vec<Tok>) -> bool {
    let first = out.len();
    let mut i = 0;
    while i < text.len() {
        while i < text.len() && CLASS[text[i] as usize] == SPACE {
            i += 1;
        }
        if i == text.len() {
            break;
        }
        let start = i;
        let mut seen = 0u8;
        while i < text.len() {
            let class = CLASS[text[i] as usize];
            if class == SPACE {
                break;
            }
            seen |= class;
            i += 1;
        }
        let digits = seen & DIGIT != 0;
        // Only hex digits, `x` and separators can make a token that is all variable.
        let maybe_plain = seen & OTHER == 0 && (seen & LETTER == 0 || has_x(&text[start..i]));
        if out.len() - first == max_tokens {
            return true;
        }
        let raw = &text[start..i];
        let mut hash = PieceHash::new();
        let kind = if !digits {
            hash.literal(raw);
            TokKind::Raw
        } else if (maybe_plain && is_plain_variable(raw)) || mask_pieces(raw, &mut hash) {
            TokKind::Wild
        } else {
            TokKind::Masked
        };
        out.push(Tok {
            start: (base + start) as u32,
            end: (base + i) as u32,
            key: hash.finish(),
            kind,
        });
    }
    false
}

/// Receives the pieces of a token's masked form, in order.
trait MaskSink {
    /// Bytes kept as they are.
    fn literal(&mut self, bytes: &[u8]);
    /// A variable, written `<*>`.
    fn wildcard(&mut self);
}

/// Builds the masked form.
impl MaskSink for Vec<u8> {
    fn literal(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn wildcard(&mut self) {
        self.extend_from_slice(WILDCARD_TEXT.as_bytes());
    }
}

/// Hashes the pieces (not the masked text: two tokens with the same masked form may
/// hash apart, which only costs a lookup by text).
#[derive(Debug)]
struct PieceHash(u64);

impl PieceHash {
    const K: u64 = 0xf135_7aea_2e62_a9c5;

    fn new() -> Self {
        PieceHash(0)
    }

    fn word(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(Self::K);
    }

    /// The product's high bits are the well mixed ones; the map indexes by low bits.
    fn finish(&self) -> u64 {
        self.0.rotate_left(32)
    }
}

impl MaskSink for PieceHash {
    fn literal(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        let mut word = [0u8; 8];
        for chunk in &mut chunks {
            word.copy_from_slice(chunk);
            self.word(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        // Up to 7 bytes read as two overlapping halves (no copy loop), then the length
        // with a high bit: it marks a literal's end, which a wildcard's word lacks.
        let n = rest.len();
        let (lo, hi) = match n {
            4..=7 => (le32(&rest[..4]), le32(&rest[n - 4..])),
            2..=3 => (le16(&rest[..2]), le16(&rest[n - 2..])),
            1 => (u64::from(rest[0]), 0),
            _ => (0, 0),
        };
        self.word(lo ^ (hi << 24) ^ ((0x80 | n as u64) << 56));
    }

    fn wildcard(&mut self) {
        self.word(0x3e2a3c);
    }
}

fn le32(b: &[u8]) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    u64::from(u32::from_le_bytes(w))
}

fn le16(b: &[u8]) -> u64 {
    let mut w = [0u8; 2];
    w.copy_from_slice(b);
    u64::from(u16::from_le_bytes(w))
}

/// Compares the pieces with a stored masked form, without building it.
#[derive(Debug)]
struct PieceEq<'a> {
    stored: &'a [u8],
    at: usize,
    same: bool,
}

impl<'a> PieceEq<'a> {
    fn new(stored: &'a [u8]) -> Self {
        PieceEq {
            stored,
            at: 0,
            same: true,
        }
    }

    /// Whether the pieces spelled exactly the stored text.
    fn matched(&self) -> bool {
        self.same && self.at == self.stored.len()
    }
}

impl MaskSink for PieceEq<'_> {
    fn literal(&mut self, bytes: &[u8]) {
        if self.same {
            let end = self.at + bytes.len();
            self.same = self.stored.get(self.at..end) == Some(bytes);
            self.at = end;
        }
    }

    fn wildcard(&mut self) {
        self.literal(WILDCARD_TEXT.as_bytes());
    }
}

/// Walks the masked form of `token` (see the module docs for the rules), handing its
/// pieces to `sink`. Returns whether the token collapses to a single `<*>` (nothing but
/// variables and `.:/+,-`); the pieces are then moot. Works on bytes: bytes of
/// multi-byte characters are never alphanumeric, so they stay literal and whole.
fn mask_pieces(token: &[u8], sink: &mut impl MaskSink) -> bool {
    // Whether everything so far is a variable or a separator, and whether any variable
    // was seen: together, whether the token collapses to one `<*>`.
    let mut only_vars = true;
    let mut any_var = false;
    let mut i = 0;
    while i < token.len() {
        if class(token[i]) & ALNUM == 0 {
            let start = i;
            while i < token.len() && class(token[i]) & ALNUM == 0 {
                only_vars &= class(token[i]) == SEP;
                i += 1;
            }
            sink.literal(&token[start..i]);
            continue;
        }
        if is_uuid_at(token, i) {
            sink.wildcard();
            any_var = true;
            i += 36;
            continue;
        }
        let start = i;
        let mut seen = 0;
        while i < token.len() && class(token[i]) & ALNUM != 0 {
            seen |= class(token[i]);
            i += 1;
        }
        let digits = seen & DIGIT != 0;
        let hex = seen & LETTER == 0;
        let run = &token[start..i];
        if !digits {
            sink.literal(run);
            only_vars = false;
        } else if hex || is_hex_literal(run) {
            sink.wildcard();
            any_var = true;
        } else {
            let mut j = start;
            while j < i {
                let k = j;
                let digit_run = token[j].is_ascii_digit();
                while j < i && token[j].is_ascii_digit() == digit_run {
                    j += 1;
                }
                if digit_run {
                    sink.wildcard();
                } else {
                    sink.literal(&token[k..j]);
                }
            }
            any_var = true;
            only_vars = false;
        }
    }
    only_vars && any_var
}

/// Writes the masked form of `token` into `out` (see the module docs for the rules).
pub fn mask_token(token: &str, out: &mut String) {
    let mut bytes = std::mem::take(out).into_bytes();
    bytes.clear();
    if mask_pieces(token.as_bytes(), &mut bytes) {
        bytes.clear();
        bytes.wildcard();
    }
    // Pieces of a `str` split only at ASCII bytes, so this is valid UTF-8.
    *out = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
}

/// Whether `token` is nothing but numbers in the masking sense (hex-digit runs with a
/// digit, `0x` literals) and separators `.:/+,-`: then its masked form is a single `<*>`,
/// known without hashing it. A fast path only: `false` leaves the answer to
/// [`mask_pieces`].
fn is_plain_variable(token: &[u8]) -> bool {
    let mut i = 0;
    let mut any = false;
    while i < token.len() {
        let c = class(token[i]);
        if c & ALNUM == 0 {
            if c != SEP {
                return false;
            }
            i += 1;
            continue;
        }
        let start = i;
        let mut seen = 0;
        while i < token.len() && class(token[i]) & ALNUM != 0 {
            seen |= class(token[i]);
            i += 1;
        }
        let digits = seen & DIGIT != 0;
        let hex = seen & LETTER == 0;
        if !digits || !(hex || is_hex_literal(&token[start..i])) {
            return false;
        }
        any = true;
    }
    any
}

/// Whether `token` has an `x` or `X` (of a `0x` literal).
fn has_x(token: &[u8]) -> bool {
    token.iter().any(|&b| b | 0x20 == b'x')
}

/// `0x` followed by at least one hex digit.
fn is_hex_literal(run: &[u8]) -> bool {
    run.len() > 2
        && run[0] == b'0'
        && (run[1] == b'x' || run[1] == b'X')
        && run[2..].iter().all(u8::is_ascii_hexdigit)
}

/// A UUID (8-4-4-4-12 hex) starts at `i` and is not followed by an alphanumeric.
fn is_uuid_at(bytes: &[u8], i: usize) -> bool {
    let Some(s) = bytes.get(i..i + 36) else {
        return false;
    };
    let shape_ok = s.iter().enumerate().all(|(k, &b)| match k {
        8 | 13 | 18 | 23 => b == b'-',
        _ => b.is_ascii_hexdigit(),
    });
    shape_ok && !bytes.get(i + 36).is_some_and(u8::is_ascii_alphanumeric)
}

/// Bytes read from the input per batch of lines.
const BLOCK_BYTES: usize = 1 << 20;
/// Longest line mined, in bytes; the rest of a longer line is skipped (as
/// [`crate::input::MAX_LINE_BYTES`]).
const MAX_LINE_BYTES: usize = crate::input::MAX_LINE_BYTES;

/// How [`mine_reader`] spreads its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Threads {
    /// Everything on the calling thread.
    #[default]
    One,
    /// A second thread reads, splits and hashes lines while the calling thread interns
    /// them and walks the tree. The miner's state lives on the calling thread only, so
    /// the result is the same as with [`Threads::One`], line for line.
    Two,
}

/// What a line's prefix says about where it came from; see [`mine_reader`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineMeta<'a> {
    /// Global rank.
    pub rank: Option<u32>,
    /// Node name.
    pub node: Option<&'a str>,
    /// Milliseconds since the Unix epoch.
    pub at_ms: Option<i64>,
}

/// What [`mine_reader`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadSummary {
    /// Lines mined.
    pub lines: u64,
    /// Bytes of those lines, terminators included.
    pub bytes: u64,
    /// Lines longer than the line cap (64 KiB), cut.
    pub truncated_lines: u64,
}

/// Lines of one block of input, with their shapes or split and hashed.
#[derive(Debug, Default)]
struct Batch {
    block: Vec<u8>,
    /// The shape of `block` (see [`shape_of`]), when shapes are computed.
    shape: Vec<u8>,
    lines: Vec<BatchLine>,
    /// Whether the lines were split into `toks`.
    split: bool,
    toks: Vec<Tok>,
}

/// A line of a [`Batch`].
#[derive(Debug, Clone, Copy)]
struct BatchLine {
    /// Its span in `block`.
    start: u32,
    end: u32,
    /// The end of its tokens in `toks`, when split.
    toks_end: u32,
    /// Whether it had more tokens than the miner looks at, when split.
    cut: bool,
    /// The hash of its shape, when shapes are computed.
    shape_hash: u64,
}

/// Cuts input into lines in blocks of [`BLOCK_BYTES`]: `\n` ends a line, a `\r` before
/// it is dropped, a last line without `\n` counts, a line longer than
/// [`MAX_LINE_BYTES`] is cut there and the rest of it skipped.
#[derive(Debug)]
struct Framer<R> {
    input: R,
    /// Start of a line that did not end in the last block.
    carry: Vec<u8>,
    /// Inside the skipped rest of an overlong line.
    skipping: bool,
    eof: bool,
    max_lines: u64,
    max_tokens: usize,
    /// Compute shapes (for the miner's shape cache).
    shapes: bool,
    /// Split lines into tokens ([`prepare`]) here rather than leave it to the miner.
    split: bool,
    summary: ReadSummary,
}

impl<R: Read> Framer<R> {
    /// Fills `batch` with the next lines; `false` when there are none.
    fn next_batch(&mut self, batch: &mut Batch) -> io::Result<bool> {
        batch.block.clear();
        batch.shape.clear();
        batch.lines.clear();
        batch.toks.clear();
        batch.split = self.split;
        while batch.lines.is_empty() {
            if self.eof || self.summary.lines >= self.max_lines {
                return Ok(false);
            }
            batch.block.clear();
            batch.block.append(&mut self.carry);
            let have = batch.block.len();
            batch.block.resize(have + BLOCK_BYTES, 0);
            let got = loop {
                match self.input.read(&mut batch.block[have..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            batch.block.truncate(have + got);
            self.eof = got == 0;
            if self.shapes {
                shape_of(&batch.block, &mut batch.shape);
            }
            self.frame(batch);
        }
        Ok(true)
    }

    /// Splits the block into lines; keeps an unfinished last line for the next block.
    fn frame(&mut self, batch: &mut Batch) {
        let block = std::mem::take(&mut batch.block);
        let mut start = 0;
        while start < block.len() && self.summary.lines < self.max_lines {
            let Some(nl) = memchr::memchr(b'\n', &block[start..]) else {
                break;
            };
            let end = start + nl;
            if self.skipping {
                self.skipping = false;
                self.summary.bytes += (nl + 1) as u64;
            } else {
                self.line(batch, &block, start, end, end + 1 - start);
            }
            start = end + 1;
        }
        let rest = &block[start.min(block.len())..];
        if self.summary.lines >= self.max_lines {
            self.eof = true;
        } else if self.skipping {
            self.summary.bytes += rest.len() as u64;
        } else if self.eof {
            if !rest.is_empty() {
                self.line(batch, &block, start, block.len(), rest.len());
            }
        } else if rest.len() > MAX_LINE_BYTES {
            self.line(batch, &block, start, block.len(), rest.len());
            self.skipping = true;
        } else {
            self.carry.extend_from_slice(rest);
        }
        batch.block = block;
    }

    fn line(&mut self, batch: &mut Batch, block: &[u8], start: usize, end: usize, bytes: usize) {
        let mut end = end;
        if end - start > MAX_LINE_BYTES {
            end = start + MAX_LINE_BYTES;
            self.summary.truncated_lines += 1;
        } else if end > start && block[end - 1] == b'\r' {
            end -= 1;
        }
        let cut =
            self.split && prepare(&block[start..end], start, self.max_tokens, &mut batch.toks);
        let shape_hash = match batch.shape.get(start..end) {
            Some(shape) if self.shapes && end - start <= SHAPE_MAX_BYTES => shape_hash(shape),
            _ => 0,
        };
        batch.lines.push(BatchLine {
            start: start as u32,
            end: end as u32,
            toks_end: batch.toks.len() as u32,
            cut,
            shape_hash,
        });
        self.summary.lines += 1;
        self.summary.bytes += bytes as u64;
    }
}

/// Mines every line of `input` with `miner`, reading it in blocks, numbering lines
/// from `first_id`, stopping after `max_lines`. `meta` tells each line's rank, node
/// and time from its bytes (return `LineMeta::default()` when unknown). The bytes are
/// not checked for UTF-8 except where the miner stores them (see [`ByteLineRef`]).
/// With [`Threads::Two`] the reading, splitting and hashing run on a second thread;
/// the templates, counts and ids are the same as with [`Threads::One`].
pub fn mine_reader<R, M>(
    miner: &mut Miner,
    input: R,
    first_id: u64,
    max_lines: u64,
    threads: Threads,
    meta: M,
) -> io::Result<ReadSummary>
where
    R: Read + Send,
    M: for<'a> Fn(&'a [u8]) -> LineMeta<'a>,
{
    let mut framer = Framer {
        input,
        carry: Vec::new(),
        skipping: false,
        eof: false,
        max_lines,
        max_tokens: miner.config.max_line_tokens,
        shapes: true,
        split: false,
        summary: ReadSummary::default(),
    };
    let mut next_id = first_id;
    match threads {
        Threads::One => {
            let mut batch = Batch::default();
            loop {
                // Split lines here only when the miner will not look shapes up.
                framer.shapes = miner.shapes_wanted();
                framer.split = !framer.shapes;
                if !framer.next_batch(&mut batch)? {
                    break;
                }
                mine_batch(miner, &batch, &mut next_id, &meta);
            }
            Ok(framer.summary)
        }
        Threads::Two => {
            // With the shape cache in use, the reading thread only frames lines and
            // computes shapes (the miner splits the few lines it misses); without, it
            // splits and hashes every line.
            let shapes_on = AtomicBool::new(miner.shapes_wanted());
            let shapes_on = &shapes_on;
            std::thread::scope(|scope| {
                let (full_tx, full_rx) = mpsc::sync_channel::<Batch>(2);
                let (empty_tx, empty_rx) = mpsc::sync_channel::<Batch>(4);
                for _ in 0..3 {
                    let _ = empty_tx.send(Batch::default());
                }
                let reader = scope.spawn(move || -> io::Result<ReadSummary> {
                    while let Ok(mut batch) = empty_rx.recv() {
                        framer.shapes = shapes_on.load(Ordering::Relaxed);
                        framer.split = !framer.shapes;
                        if !framer.next_batch(&mut batch)? || full_tx.send(batch).is_err() {
                            break;
                        }
                    }
                    Ok(framer.summary)
                });
                for batch in full_rx.iter() {
                    mine_batch(miner, &batch, &mut next_id, &meta);
                    shapes_on.store(miner.shapes_wanted(), Ordering::Relaxed);
                    // The reader may have stopped already; then the batch is just dropped.
                    let _ = empty_tx.send(batch);
                }
                drop(empty_tx);
                reader
                    .join()
                    .map_err(|_| io::Error::other("the reading thread panicked"))?
            })
        }
    }
}

fn mine_batch<M>(miner: &mut Miner, batch: &Batch, next_id: &mut u64, meta: &M)
where
    M: for<'a> Fn(&'a [u8]) -> LineMeta<'a>,
{
    let mut toks_start = 0usize;
    for l in &batch.lines {
        let span = l.start as usize..l.end as usize;
        let text = batch.block.get(span.clone()).unwrap_or(&[]);
        let toks = batch
            .toks
            .get(toks_start..l.toks_end as usize)
            .filter(|_| batch.split)
            .map(|t| (t, l.cut));
        toks_start = l.toks_end as usize;
        let shape = batch
            .shape
            .get(span)
            .filter(|s| s.len() <= SHAPE_MAX_BYTES)
            .map(|s| (s, l.shape_hash));
        let m = meta(text);
        let line = ByteLineRef {
            id: *next_id,
            text,
            rank: m.rank,
            node: m.node,
            at_ms: m.at_ms,
        };
        *next_id += 1;
        miner.add_prepared(line, &batch.block, l.start as usize, toks, shape);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(token: &str) -> String {
        let mut out = String::new();
        mask_token(token, &mut out);
        out
    }

    #[test]
    fn masking_table() {
        let cases = [
            ("iteration", "iteration"),
            ("42", "<*>"),
            ("-3.5e-4", "<*>"),
            ("1.234E+00", "<*>"),
            ("0x7f3a0000beef", "<*>"),
            ("0xdead", "<*>"),
            ("rank3", "rank<*>"),
            ("[rank131]:", "[rank<*>]:"),
            ("[E703", "[<*>"),
            ("gpu-node-026", "gpu-node-<*>"),
            ("10.0.3.17:45123", "<*>"),
            ("10.0.3.17<45123>", "<*>.<*>.<*>.<*><<*>>"),
            ("0000:3b:00.0", "<*>"),
            ("(PCI:0000:3b:00):", "(PCI:<*>:<*>:<*>):"),
            ("2024-05-14T03:12:45.123Z", "<*>-<*>-<*>T<*>:<*>:<*>.<*>Z"),
            ("15:37:17.178057290", "<*>"),
            ("GPU-8c1d2e3f-aaaa-bbbb-cccc-0123456789ab", "GPU-<*>"),
            ("8c1d2e3f-aaaa-bbbb-cccc-0123456789ab,", "<*>"),
            ("/data/shard_00042.bin", "/data/shard_<*>.bin"),
            ("ProcessGroupNCCL.cpp:1922]", "ProcessGroupNCCL.cpp:<*>]"),
            ("SeqNum=1234,", "SeqNum=<*>,"),
            ("12/500", "<*>"),
            ("bf16", "<*>"),
            ("fp16", "fp<*>"),
            ("naïve7", "naïve<*>"),
        ];
        for (input, want) in cases {
            assert_eq!(masked(input), want, "masking {input:?}");
            let mut pieces = Vec::new();
            let collapses = mask_pieces(input.as_bytes(), &mut pieces);
            if !collapses {
                assert_eq!(pieces, want.as_bytes(), "pieces of {input:?}");
                let mut eq = PieceEq::new(want.as_bytes());
                mask_pieces(input.as_bytes(), &mut eq);
                assert!(eq.matched(), "pieces of {input:?} compare equal");
                let mut other = PieceEq::new(b"iteration<*>");
                mask_pieces(input.as_bytes(), &mut other);
                assert!(!other.matched(), "{input:?} is not iteration<*>");
            } else {
                assert_eq!(want, "<*>", "{input:?} collapses");
            }
            if is_plain_variable(input.as_bytes()) {
                assert!(collapses, "fast path agrees on {input:?}");
            }
        }
        for plain in [
            "42",
            "0.912",
            "1.234E+00",
            "0x7f",
            "10.0.3.17:45123",
            "12/500",
        ] {
            assert!(mask_pieces(plain.as_bytes(), &mut Vec::new()), "{plain:?}");
            assert!(is_plain_variable(plain.as_bytes()), "{plain:?}");
        }
    }

    fn mine(lines: &[&str]) -> (Miner, Vec<ClusterId>) {
        let mut miner = Miner::new(DrainConfig::default()).expect("default config is valid");
        let ids = lines
            .iter()
            .enumerate()
            .map(|(i, text)| {
                miner.add(LineRef {
                    id: i as u64,
                    text,
                    ..LineRef::default()
                })
            })
            .collect();
        (miner, ids)
    }

    #[test]
    fn lines_differing_in_variables_share_a_template() {
        let (miner, ids) = mine(&[
            "iteration 100/ 5000 | lm loss: 2.345E+00 | grad norm: 0.912",
            "iteration 101/ 5000 | lm loss: 2.301E+00 | grad norm: 0.877",
            "Loading checkpoint from /ckpt/iter_0000100",
            "iteration 102/ 5000 | lm loss: 2.299E+00 | grad norm: 1.001",
        ]);
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[0], ids[3]);
        assert_ne!(ids[0], ids[2]);
        let t = miner.template(ids[0]).expect("template is live");
        assert_eq!(t.text, "iteration <*> <*> | lm loss: <*> | grad norm: <*>");
        assert_eq!(t.count, 3);
        assert_eq!((t.first_line, t.last_line), (0, 3));
        assert_eq!(miner.stats().clusters, 2);
    }

    #[test]
    fn differing_constant_tokens_become_wildcards_above_threshold() {
        let (miner, ids) = mine(&[
            "NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC",
            "NCCL INFO Channel 01 : 1[1] -> 2[2] via SHM/direct",
        ]);
        assert_eq!(ids[0], ids[1]);
        let t = miner.template(ids[0]).expect("template is live");
        assert_eq!(
            t.text,
            "NCCL INFO Channel <*> : <*>[<*>] -> <*>[<*>] via <*>"
        );
    }

    #[test]
    fn dissimilar_lines_of_equal_length_stay_apart() {
        let (_, ids) = mine(&["alpha beta gamma delta", "alpha one two three"]);
        // 1 of 4 positions agree: 0.25 < 0.4.
        assert_ne!(ids[0], ids[1]);
    }

    #[test]
    fn ranks_nodes_and_times_are_tracked_per_template() {
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        for rank in 0..8u32 {
            let node = format!("node-{}", rank / 4);
            miner.add(LineRef {
                id: u64::from(rank),
                text: "watchdog timeout at work 77",
                rank: Some(rank),
                node: Some(&node),
                at_ms: Some(1_000 + i64::from(rank)),
            });
        }
        let t = &miner.templates()[0];
        assert_eq!(t.ranks, (0..8).collect::<Vec<_>>());
        assert_eq!(t.distinct_ranks, 8);
        assert_eq!(t.nodes, vec!["node-0".to_owned(), "node-1".to_owned()]);
        assert_eq!(t.distinct_nodes, 2);
        assert_eq!((t.first_at_ms, t.last_at_ms), (Some(1_000), Some(1_007)));
    }

    #[test]
    fn distinct_ranks_beyond_the_exact_set_are_estimated() {
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        for rank in 0..1024u32 {
            miner.add(LineRef {
                id: u64::from(rank),
                text: "heartbeat ok",
                rank: Some(rank),
                ..LineRef::default()
            });
        }
        let t = &miner.templates()[0];
        assert_eq!(t.ranks.len(), EXACT_VALUES);
        let est = t.distinct_ranks as f64;
        assert!((900.0..1150.0).contains(&est), "estimate {est}");
    }

    #[test]
    fn cluster_cap_evicts_least_recently_used() {
        let config = DrainConfig {
            max_clusters: 16,
            ..DrainConfig::default()
        };
        let mut miner = Miner::new(config).expect("valid");
        let words = [
            "apple", "brick", "cloud", "drum", "eagle", "flute", "grape", "harp", "iris", "jade",
            "kite", "lemon", "mango", "nectar", "olive", "pear", "quill", "rose",
        ];
        let mut id = 0u64;
        let mut add = |m: &mut Miner, text: &str| {
            id += 1;
            m.add(LineRef {
                id,
                text,
                ..LineRef::default()
            })
        };
        let keep = add(&mut miner, "steady periodic line");
        for w in &words[..15] {
            add(&mut miner, &format!("{w} {w} {w}"));
            add(&mut miner, "steady periodic line");
        }
        // 16 live; the next new template evicts the oldest unused one ("apple").
        add(&mut miner, "zebra zebra zebra");
        let stats = miner.stats();
        assert_eq!(stats.clusters_evicted, 1);
        assert_eq!(stats.clusters, 16);
        let texts: Vec<String> = miner.templates().into_iter().map(|t| t.text).collect();
        assert!(!texts.iter().any(|t| t.starts_with("apple")), "{texts:?}");
        assert!(texts.iter().any(|t| t.starts_with("zebra")));
        assert!(miner.template(keep).is_some(), "recently used survives");
    }

    #[test]
    fn vocabulary_cap_treats_new_tokens_as_variables() {
        let config = DrainConfig {
            max_tokens: 16,
            ..DrainConfig::default()
        };
        let mut miner = Miner::new(config).expect("valid");
        for i in 0..100u64 {
            let text = format!("user {} logged in", ["a", "b", "c", "d"][(i % 4) as usize])
                + &"x".repeat(i as usize % 50);
            miner.add(LineRef {
                id: i,
                text: &text,
                ..LineRef::default()
            });
        }
        let stats = miner.stats();
        assert!(stats.tokens <= 16);
        assert!(stats.tokens_over_cap > 0);
    }

    #[test]
    fn bad_config_names_the_field() {
        let err = Miner::new(DrainConfig {
            depth: 2,
            ..DrainConfig::default()
        })
        .expect_err("depth 2 is rejected");
        assert_eq!(err.field, "depth");
        let err = DrainConfig {
            sim_threshold: 1.5,
            ..DrainConfig::default()
        }
        .validate()
        .expect_err("threshold above 1 is rejected");
        assert_eq!(err.field, "sim_threshold");
    }

    #[test]
    fn long_lines_are_cut_and_empty_lines_have_a_template() {
        let config = DrainConfig {
            max_line_tokens: 4,
            max_sample_bytes: 8,
            ..DrainConfig::default()
        };
        let mut miner = Miner::new(config).expect("valid");
        let a = miner.add(LineRef {
            id: 0,
            text: "a b c d e f g",
            ..LineRef::default()
        });
        let b = miner.add(LineRef {
            id: 1,
            text: "",
            ..LineRef::default()
        });
        assert_ne!(a, b);
        let t = miner.template(a).expect("live");
        assert_eq!(t.text, "a b c d");
        assert_eq!(t.sample_text, "a b c d ");
        assert_eq!(miner.stats().lines_cut, 1);
        assert_eq!(miner.template(b).expect("live").text, "");
    }

    /// `(rank, node)` from the generator's `<ts> <host> [rankN]: ...` prefix.
    fn gen_meta(line: &[u8]) -> LineMeta<'_> {
        let mut parts = line.splitn(3, |&b| b == b' ');
        let _ts = parts.next();
        let node = parts.next().and_then(|n| std::str::from_utf8(n).ok());
        let rank = parts
            .next()
            .and_then(|rest| rest.strip_prefix(b"[rank"))
            .and_then(|rest| rest.split(|&b| b == b']').next())
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| d.parse().ok());
        LineMeta {
            rank,
            node,
            at_ms: None,
        }
    }

    fn generated(lines: u64) -> Vec<u8> {
        let cfg = crate::loggen::GenConfig {
            max_lines: lines,
            target_bytes: u64::MAX,
            ..crate::loggen::GenConfig::default()
        };
        let mut out = Vec::new();
        crate::loggen::write_log(&cfg, &mut out).expect("writing to memory");
        out
    }

    fn mine_all(input: &[u8], threads: Threads, config: DrainConfig) -> (Miner, ReadSummary) {
        let mut miner = Miner::new(config).expect("valid");
        let summary =
            mine_reader(&mut miner, input, 0, u64::MAX, threads, gen_meta).expect("reads");
        (miner, summary)
    }

    #[test]
    fn reading_in_blocks_on_two_threads_gives_what_adding_lines_one_by_one_gives() {
        let input = generated(40_000);
        // Small caps so that eviction and the vocabulary cap take part.
        let config = DrainConfig {
            max_clusters: 16,
            max_tokens: 300,
            ..DrainConfig::default()
        };
        let mut by_line = Miner::new(config.clone()).expect("valid");
        let body = input.strip_suffix(b"\n").unwrap_or(&input);
        let mut n = 0u64;
        for text in body.split(|&b| b == b'\n') {
            let meta = gen_meta(text);
            by_line.add_bytes(ByteLineRef {
                id: n,
                text,
                rank: meta.rank,
                node: meta.node,
                at_ms: None,
            });
            n += 1;
        }
        let (one, summary_one) = mine_all(&input, Threads::One, config.clone());
        let (two, summary_two) = mine_all(&input, Threads::Two, config);
        assert_eq!(summary_one, summary_two);
        assert_eq!(summary_one.lines, n);
        assert_eq!(summary_one.bytes, input.len() as u64);
        assert!(one.stats().clusters_evicted > 0, "{:?}", one.stats());
        assert!(one.stats().tokens_over_cap > 0, "{:?}", one.stats());
        assert_eq!(one.stats(), by_line.stats());
        assert_eq!(one.templates(), by_line.templates());
        assert_eq!(two.stats(), one.stats());
        assert_eq!(two.templates(), one.templates());
    }

    /// Stats without the shape cache's own counters.
    fn core_stats(miner: &Miner) -> MinerStats {
        MinerStats {
            shape_hits: 0,
            shape_misses: 0,
            ..miner.stats()
        }
    }

    #[test]
    fn the_shape_cache_changes_nothing_but_the_work() {
        let input = generated(30_000);
        for config in [
            DrainConfig::default(),
            DrainConfig {
                max_clusters: 16,
                max_tokens: 300,
                max_line_tokens: 12,
                ..DrainConfig::default()
            },
        ] {
            for threads in [Threads::One, Threads::Two] {
                let mut plain = Miner::new(config.clone()).expect("valid");
                plain.set_shape_cache(false);
                mine_reader(&mut plain, &input[..], 0, u64::MAX, threads, gen_meta).expect("reads");
                let (cached, _) = mine_all(&input, threads, config.clone());
                assert_eq!(plain.stats().shape_hits + plain.stats().shape_misses, 0);
                assert_eq!(core_stats(&cached), core_stats(&plain), "{threads:?}");
                assert_eq!(cached.templates(), plain.templates(), "{threads:?}");
                let s = cached.stats();
                assert!(
                    s.shape_hits > 9 * s.shape_misses,
                    "a training log repeats its shapes: {s:?}"
                );
            }
        }
    }

    #[test]
    fn lines_of_one_shape_mask_alike() {
        // Every pair has the same shape; their digits differ in every way masking could
        // notice if it read digits: zeros, `0x` prefixes, UUIDs, run lengths kept.
        let pairs = [
            (
                "load 0x7f3a at 10.0.3.17:45123",
                "load 0x1f3a at 99.9.1.99:10000",
            ),
            ("dev 1x7f 00x3 a0x5", "dev 9x1f 10x8 a0x1"),
            (
                "job 8c1d2e3f-aaaa-bbbb-cccc-0123456789ab done",
                "job 1c9d9e9f-aaaa-bbbb-cccc-9999999999ab done",
            ),
            (
                "[rank07]: step 0009 fp16 bf16",
                "[rank10]: step 1234 fp32 bf99",
            ),
            (
                "loaded shard_0000.bin E703 3b ok",
                "loaded shard_1000.bin E100 9b ok",
            ),
        ];
        for (a, b) in pairs {
            let (mut sa, mut sb) = (Vec::new(), Vec::new());
            shape_of(a.as_bytes(), &mut sa);
            shape_of(b.as_bytes(), &mut sb);
            assert_eq!(sa, sb, "{a:?} and {b:?} have one shape");
            let masked_line =
                |line: &str| -> Vec<String> { line.split_whitespace().map(masked).collect() };
            assert_eq!(masked_line(a), masked_line(b), "{a:?} and {b:?}");
        }
        let mut s = Vec::new();
        shape_of(b"0x1f 0X 90x 05", &mut s);
        assert_eq!(&s, b"0x1f 0X 10x 11");
        // Each first line is cached, its partner hits and gets the same template.
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        for (i, (a, b)) in pairs.iter().enumerate() {
            let ta = miner.add(LineRef {
                id: 2 * i as u64,
                text: a,
                ..LineRef::default()
            });
            let tb = miner.add(LineRef {
                id: 2 * i as u64 + 1,
                text: b,
                ..LineRef::default()
            });
            assert_eq!(ta, tb, "{a:?} and {b:?}");
        }
        assert_eq!(miner.stats().shape_hits, pairs.len() as u64);
    }

    #[test]
    fn the_shape_cache_steps_aside_when_lines_do_not_repeat() {
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        let mut text = String::new();
        for i in 0..(SHAPE_PROBATION + 100) {
            text.clear();
            // A different word each line: no two shapes are alike.
            let word: String = format!("{i:x}")
                .chars()
                .filter_map(|c| c.to_digit(16))
                .map(|v| char::from(b'g' + v as u8))
                .collect();
            text.push_str("event ");
            text.push_str(&word);
            miner.add(LineRef {
                id: i,
                text: &text,
                ..LineRef::default()
            });
        }
        let s = miner.stats();
        assert_eq!(s.shape_hits, 0);
        assert_eq!(
            s.shape_misses, SHAPE_PROBATION,
            "no lookups once it stepped aside"
        );
    }

    #[test]
    fn block_reading_frames_lines_like_the_line_reader() {
        let mut input = b"alpha 1\r\nbeta 2\n\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + BLOCK_BYTES + 10));
        input.extend_from_slice(b" tail\nlast line 7");
        for threads in [Threads::One, Threads::Two] {
            let (miner, summary) = mine_all(&input, threads, DrainConfig::default());
            assert_eq!(summary.lines, 5, "{threads:?}");
            assert_eq!(summary.bytes, input.len() as u64);
            assert_eq!(summary.truncated_lines, 1);
            let texts: Vec<String> = miner.templates().into_iter().map(|t| t.text).collect();
            assert_eq!(texts[0], "alpha <*>");
            assert_eq!(texts[1], "beta <*>");
            assert_eq!(texts[2], "");
            assert_eq!(texts[3].len(), MAX_LINE_BYTES, "cut, the rest skipped");
            assert_eq!(texts[4], "last line <*>");
        }
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        let summary =
            mine_reader(&mut miner, &input[..], 10, 2, Threads::Two, gen_meta).expect("reads");
        assert_eq!(summary.lines, 2);
        let t = miner.templates();
        assert_eq!((t[0].first_line, t[1].first_line), (10, 11));
    }

    #[test]
    fn hash_collisions_fall_back_to_the_text() {
        let lines = [
            "rank3 loaded shard_0001.bin in 12ms",
            "rank4 loaded shard_0002.bin in 15ms",
            "iteration 7 loss 2.5",
        ];
        let (reference, _) = mine(&lines);
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        for (i, text) in lines.iter().enumerate() {
            miner.add(LineRef {
                id: i as u64,
                text,
                ..LineRef::default()
            });
            // Point every cached hash at the wrong token, as colliding hashes would.
            let n = miner.token_text.len() as u32;
            for id in miner.by_hash.values_mut() {
                *id = (*id + 1) % n;
            }
        }
        assert_eq!(miner.templates(), reference.templates());
        assert_eq!(miner.stats(), reference.stats());
    }

    #[test]
    fn invalid_utf8_mines_like_its_replacement() {
        let mut miner = Miner::new(DrainConfig::default()).expect("valid");
        let a = miner.add_bytes(ByteLineRef {
            id: 0,
            text: b"bad \xff byte in shard_17 \xfe",
            ..ByteLineRef::default()
        });
        let b = miner.add(LineRef {
            id: 1,
            text: "bad \u{fffd} byte in shard_99 \u{fffd}",
            ..LineRef::default()
        });
        assert_eq!(a, b);
        let t = miner.template(a).expect("live");
        assert_eq!(t.text, "bad \u{fffd} byte in shard_<*> \u{fffd}");
        assert_eq!(t.sample_text, "bad \u{fffd} byte in shard_17 \u{fffd}");
        assert_eq!(
            miner.stats().tokens,
            6,
            "no duplicate of the replaced token"
        );
    }
}
