//! Metric presets as data: named regexes for the log lines of Megatron-LM, DeepSpeed,
//! the Hugging Face Trainer, PyTorch Lightning and mmengine, shipped as
//! `rules/log-presets.yaml` (the file's header documents its fields), plus the user's
//! own patterns from the tailer config.

use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;

use super::config::{CustomPattern, ThroughputUnitName};
use super::numfield::{LiteralNumber, Scan};

/// The presets shipped with the agent.
const BUILTIN: &str = include_str!("../../../rules/log-presets.yaml");

/// What `%NUM%` stands for in a preset regex: a number as Python or C prints it, with
/// `nan`, `inf` and `-inf` (any case).
pub const NUM: &str = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))";

/// A value a preset can read from a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(usize)]
pub(crate) enum Field {
    Step,
    Loss,
    GradNorm,
    Lr,
    TokensPerS,
    SamplesPerS,
    ItersPerS,
    SecsPerIter,
    Throughput,
    Epoch,
    Batch,
    Batches,
    NanIterations,
    GlobalBatchSize,
    IterMs,
    Rank,
}

/// Number of [`Field`]s.
pub(crate) const FIELDS: usize = 16;

impl Field {
    fn from_name(s: &str) -> Option<Field> {
        Some(match s {
            "step" => Field::Step,
            "loss" => Field::Loss,
            "grad_norm" => Field::GradNorm,
            "lr" => Field::Lr,
            "tokens_per_s" => Field::TokensPerS,
            "samples_per_s" => Field::SamplesPerS,
            "iters_per_s" => Field::ItersPerS,
            "secs_per_iter" => Field::SecsPerIter,
            "throughput" => Field::Throughput,
            "epoch" => Field::Epoch,
            "batch" => Field::Batch,
            "batches" => Field::Batches,
            "nan_iterations" => Field::NanIterations,
            "global_batch_size" => Field::GlobalBatchSize,
            "iter_ms" => Field::IterMs,
            "rank" => Field::Rank,
            _ => return None,
        })
    }
}

/// Where a preset's step comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    /// From the line (a `step` value, or epoch / batch / batches).
    #[default]
    Match,
    /// The number of matching lines seen from the same file and rank.
    Count,
}

/// One compiled preset or custom pattern.
#[derive(Debug, Clone)]
pub struct Preset {
    /// Unique name.
    pub name: String,
    /// Version of its meaning.
    pub version: u32,
    /// Used by sources that do not list presets.
    pub enabled: bool,
    /// What it reads.
    pub description: String,
    /// Literals one of which a line must contain (empty: no prefilter).
    pub(crate) needles: Vec<String>,
    pub(crate) pattern: Regex,
    /// Named groups of `pattern`: (group index, field).
    pub(crate) groups: Vec<(usize, Field)>,
    pub(crate) fields: Vec<(Field, Regex)>,
    /// Per field, its fast form when it has one (see [`LiteralNumber`]).
    pub(crate) fast_fields: Vec<Option<LiteralNumber>>,
    pub(crate) step: StepSource,
    pub(crate) epoch_base: u64,
    /// Unit of a `throughput` group (custom patterns).
    pub(crate) throughput_unit: ThroughputUnitName,
}

impl Preset {
    /// Where its step comes from.
    pub fn step_source(&self) -> StepSource {
        self.step
    }

    /// Whether the line passes the literal prefilter.
    pub(crate) fn wants(&self, line: &str) -> bool {
        self.needles.is_empty() || self.needles.iter().any(|n| line.contains(n.as_str()))
    }

    /// Compile a user's pattern from the config.
    pub fn custom(p: &CustomPattern) -> Result<Preset, String> {
        if p.name.trim().is_empty() {
            return Err("name: empty".to_string());
        }
        let pattern = Regex::new(&p.regex.replace("%NUM%", NUM))
            .map_err(|e| format!("regex: {}", one_line(&e.to_string())))?;
        let groups = named_groups(&pattern, true).map_err(|e| format!("regex: {e}"))?;
        if groups.is_empty() {
            return Err("regex: no named group (step, loss, grad_norm, ...)".to_string());
        }
        let has_step = groups.iter().any(|(_, f)| *f == Field::Step);
        let needles = match &p.needle {
            Some(n) if n.is_empty() => return Err("needle: empty".to_string()),
            Some(n) => vec![n.clone()],
            None => Vec::new(),
        };
        Ok(Preset {
            name: p.name.clone(),
            version: 1,
            enabled: true,
            description: format!("custom pattern {}", p.name),
            needles,
            pattern,
            groups,
            fields: Vec::new(),
            fast_fields: Vec::new(),
            step: if has_step {
                StepSource::Match
            } else {
                StepSource::Count
            },
            epoch_base: 0,
            throughput_unit: p.throughput_unit,
        })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The named groups of a regex as fields; an unknown name is an error.
fn named_groups(re: &Regex, allow_throughput: bool) -> Result<Vec<(usize, Field)>, String> {
    let mut out = Vec::new();
    for (i, name) in re.capture_names().enumerate() {
        let Some(name) = name else { continue };
        match Field::from_name(name) {
            Some(Field::Throughput) if !allow_throughput => {
                return Err(
                    "group `throughput` needs a unit: use tokens_per_s, samples_per_s or iters_per_s"
                        .to_string(),
                );
            }
            Some(f) => out.push((i, f)),
            None => return Err(format!("unknown group name `{name}`")),
        }
    }
    Ok(out)
}

/// Why a preset file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    /// Not valid YAML, or not a list of presets with known fields.
    #[error("log presets are not a valid list: {0}")]
    Yaml(#[from] warden_model::yaml::Error),
    /// A preset is wrong.
    #[error("log preset {index} ({name}): {problem}")]
    Invalid {
        /// Position in the list, from 0.
        index: usize,
        /// Its name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

/// One preset as written, `fields` in file order.
struct RawPreset {
    name: String,
    version: u32,
    enabled: bool,
    description: String,
    needles: Vec<String>,
    pattern: String,
    fields: Vec<(String, String)>,
    step: StepSource,
    epoch_base: u64,
}

fn yes() -> bool {
    true
}

/// A set of presets, in file order (the order they are tried in).
#[derive(Debug, Clone, Default)]
pub struct PresetCatalog {
    presets: Vec<Preset>,
}

impl PresetCatalog {
    /// Parse presets in the format of `rules/log-presets.yaml`.
    pub fn parse(yaml: &str) -> Result<Self, PresetError> {
        let raw: Vec<RawPresetMap> = warden_model::yaml::from_str(yaml)?;
        let mut presets: Vec<Preset> = Vec::with_capacity(raw.len());
        for (index, r) in raw.into_iter().enumerate() {
            let r = r.0;
            let bad = |problem: String| PresetError::Invalid {
                index,
                name: r.name.clone(),
                problem,
            };
            if r.name.trim().is_empty() {
                return Err(bad("empty name".to_string()));
            }
            if presets.iter().any(|p| p.name == r.name) {
                return Err(bad("name is used twice".to_string()));
            }
            if r.description.trim().is_empty() {
                return Err(bad("empty description".to_string()));
            }
            if r.needles.is_empty() || r.needles.iter().any(String::is_empty) {
                return Err(bad("needles: at least one, none empty".to_string()));
            }
            let pattern = Regex::new(&r.pattern.replace("%NUM%", NUM))
                .map_err(|e| bad(format!("pattern: {}", one_line(&e.to_string()))))?;
            let groups = named_groups(&pattern, false).map_err(|e| bad(format!("pattern: {e}")))?;
            let mut fields = Vec::new();
            let mut fast_fields = Vec::new();
            for (fname, fre) in &r.fields {
                let field = Field::from_name(fname)
                    .filter(|f| *f != Field::Throughput)
                    .ok_or_else(|| bad(format!("fields: unknown field `{fname}`")))?;
                let re = Regex::new(&fre.replace("%NUM%", NUM))
                    .map_err(|e| bad(format!("fields.{fname}: {}", one_line(&e.to_string()))))?;
                if re.capture_names().flatten().ne(["v"]) {
                    return Err(bad(format!(
                        "fields.{fname}: needs exactly one named group, `v`"
                    )));
                }
                fields.push((field, re));
                fast_fields.push(LiteralNumber::parse(fre));
            }
            if r.step == StepSource::Match {
                let has = |f: Field| {
                    groups.iter().any(|(_, g)| *g == f) || fields.iter().any(|(g, _)| *g == f)
                };
                let epoch_batch = has(Field::Epoch) && has(Field::Batch);
                if !(has(Field::Step) || epoch_batch) {
                    return Err(bad(
                        "step: match needs a `step` value or `epoch` and `batch`".to_string(),
                    ));
                }
            }
            presets.push(Preset {
                name: r.name.clone(),
                version: r.version,
                enabled: r.enabled,
                description: r.description.clone(),
                needles: r.needles.clone(),
                pattern,
                groups,
                fields,
                fast_fields,
                step: r.step,
                epoch_base: r.epoch_base,
                throughput_unit: ThroughputUnitName::Tokens,
            });
        }
        Ok(PresetCatalog { presets })
    }

    /// The presets shipped with the agent, parsed once. Should the shipped file fail to
    /// parse (the tests make sure it does not), this is empty and
    /// [`PresetCatalog::builtin_error`] says why.
    pub fn builtin() -> &'static PresetCatalog {
        static EMPTY: OnceLock<PresetCatalog> = OnceLock::new();
        match builtin_result() {
            Ok(c) => c,
            Err(_) => EMPTY.get_or_init(PresetCatalog::default),
        }
    }

    /// Why the shipped presets failed to load, if they did.
    pub fn builtin_error() -> Option<&'static PresetError> {
        builtin_result().as_ref().err()
    }

    /// The preset with this name.
    pub fn get(&self, name: &str) -> Option<&Preset> {
        self.presets.iter().find(|p| p.name == name)
    }

    /// All presets, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Preset> {
        self.presets.iter()
    }

    /// Names of all presets, in order.
    pub fn names(&self) -> Vec<&str> {
        self.presets.iter().map(|p| p.name.as_str()).collect()
    }

    /// Number of presets.
    pub fn len(&self) -> usize {
        self.presets.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.presets.is_empty()
    }

    /// Every field whose fast reader ([`LiteralNumber`]) answers differently from its
    /// regex on `text`, described; the fast path must give the regex's answer, and may
    /// only be unsure on non-ASCII text. For the fuzz target and tests.
    #[doc(hidden)]
    pub fn fast_path_disagreements(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.presets {
            for ((field, re), fast) in p.fields.iter().zip(&p.fast_fields) {
                let Some(fast) = fast else { continue };
                let by_regex = re
                    .captures(text)
                    .and_then(|c| c.name("v"))
                    .map(|m| (m.start(), m.end()));
                let by_fast = fast.find(text);
                let agree = match by_fast {
                    Scan::Found(a, b) => by_regex == Some((a, b)),
                    Scan::Absent => by_regex.is_none(),
                    Scan::Unsure => !text.is_ascii(),
                };
                if !agree {
                    out.push(format!(
                        "{} {field:?}: fast path {by_fast:?}, regex {by_regex:?}",
                        p.name
                    ));
                }
            }
        }
        out
    }
}

/// Deserializes a [`RawPreset`], reading `fields` as a YAML mapping in file order.
struct RawPresetMap(RawPreset);

impl<'de> Deserialize<'de> for RawPresetMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Shape {
            name: String,
            version: u32,
            #[serde(default = "yes")]
            enabled: bool,
            description: String,
            needles: Vec<String>,
            pattern: String,
            #[serde(default)]
            fields: FieldMap,
            #[serde(default)]
            step: StepSource,
            #[serde(default)]
            epoch_base: u64,
        }
        let s = Shape::deserialize(d)?;
        let mut fields = Vec::new();
        for (k, v) in s.fields.0 {
            match (k, v) {
                (serde_json::Value::String(k), serde_json::Value::String(v)) => fields.push((k, v)),
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "preset {}: fields must map names to regex strings",
                        s.name
                    )));
                }
            }
        }
        Ok(RawPresetMap(RawPreset {
            name: s.name,
            version: s.version,
            enabled: s.enabled,
            description: s.description,
            needles: s.needles,
            pattern: s.pattern,
            fields,
            step: s.step,
            epoch_base: s.epoch_base,
        }))
    }
}

/// A `fields` mapping as written: its entries in file order, keys and values as read
/// (checked to be strings by [`RawPresetMap`], which can name the preset).
#[derive(Default)]
struct FieldMap(Vec<(serde_json::Value, serde_json::Value)>);

impl<'de> Deserialize<'de> for FieldMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = FieldMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping of field names to regex strings")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<FieldMap, E> {
                Ok(FieldMap::default())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<FieldMap, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    out.push(entry);
                }
                Ok(FieldMap(out))
            }
        }
        d.deserialize_map(Entries)
    }
}

fn builtin_result() -> &'static Result<PresetCatalog, PresetError> {
    static BUILTIN_CATALOG: OnceLock<Result<PresetCatalog, PresetError>> = OnceLock::new();
    BUILTIN_CATALOG.get_or_init(|| PresetCatalog::parse(BUILTIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_presets_load() {
        if let Some(e) = PresetCatalog::builtin_error() {
            panic!("rules/log-presets.yaml fails to load: {e}");
        }
        let c = PresetCatalog::builtin();
        for name in ["megatron", "deepspeed", "hf-trainer", "lightning"] {
            let p = c
                .get(name)
                .unwrap_or_else(|| panic!("preset {name} missing"));
            assert!(p.enabled, "{name}");
            assert!(!p.needles.is_empty(), "{name}");
        }
    }

    #[test]
    fn num_matches_what_frameworks_print() {
        let re = Regex::new(&format!("^{NUM}$")).expect("NUM compiles");
        for ok in [
            "1",
            "2.345E+00",
            "5e-05",
            "0.9",
            ".5",
            "-1.5",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "Infinity",
            "1.",
            "+3",
        ] {
            assert!(re.is_match(ok), "{ok}");
            assert!(ok.parse::<f64>().is_ok(), "Rust parses {ok}");
        }
        for bad in ["", "e5", "n/a", "1.2.3", "--1"] {
            assert!(!re.is_match(bad), "{bad}");
        }
    }

    #[test]
    fn loader_errors_name_the_preset_and_problem() {
        let base =
            "- {name: a, version: 1, description: d, needles: [x], pattern: 'step (?P<step>\\d+)'";
        let cases = [
            (format!("{base}, colour: red}}"), "unknown field `colour`"),
            (format!("{base}}}\n{base}}}"), "name is used twice"),
            (
                "- {name: a, version: 1, description: d, needles: [x], pattern: '(?P<stpe>\\d+)'}"
                    .to_string(),
                "unknown group name `stpe`",
            ),
            (
                "- {name: a, version: 1, description: d, needles: [x], pattern: '(', step: count}"
                    .to_string(),
                "pattern:",
            ),
            (
                format!("{base}, fields: {{loss: 'loss (\\d+)'}}}}"),
                "fields.loss: needs exactly one named group",
            ),
            (
                "- {name: a, version: 1, description: d, needles: [x], pattern: 'loss (?P<loss>\\d+)'}"
                    .to_string(),
                "step: match needs",
            ),
            (
                "- {name: a, version: 1, description: d, needles: [], pattern: 'x', step: count}"
                    .to_string(),
                "needles",
            ),
        ];
        for (yaml, want) in cases {
            match PresetCatalog::parse(&yaml) {
                Ok(_) => panic!("{yaml} should fail"),
                Err(e) => assert!(e.to_string().contains(want), "{yaml}: {e}"),
            }
        }
    }

    #[test]
    fn custom_patterns_are_checked() {
        let mk = |regex: &str| CustomPattern {
            name: "mine".into(),
            regex: regex.into(),
            needle: None,
            throughput_unit: ThroughputUnitName::Tokens,
        };
        let p = Preset::custom(&mk(r"step (?P<step>\d+) loss (?P<loss>%NUM%)")).expect("valid");
        assert_eq!(p.step, StepSource::Match);
        let p = Preset::custom(&mk(r"loss (?P<loss>%NUM%) (?P<throughput>%NUM%) tok/s"))
            .expect("valid");
        assert_eq!(p.step, StepSource::Count);
        for (bad, want) in [
            (r"step (\d+)", "no named group"),
            (r"(?P<los>\d)", "unknown group name `los`"),
            (r"(", "regex:"),
        ] {
            let e = Preset::custom(&mk(bad)).expect_err(bad);
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
