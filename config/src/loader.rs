//! [`Loader`]: reads the file once, hands each top-level section out typed (an ill-typed
//! value is reported under its full path, `controller.flush_interval_ms`), layers a
//! setting over file, environment and flag, checks bounds, and collects every mistake
//! and the origin of every setting given.

use std::fmt;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::{ConfigError, ConfigErrors};

/// Where each setting in force came from, in the order they were given: a file path,
/// `environment WARDEN_X` or `flag --x`. Settings no layer gave keep their defaults and
/// are not listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance(Vec<(String, String)>);

impl Provenance {
    /// The origin of `field`, when a layer gave it.
    pub fn origin(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(f, _)| f == field)
            .map(|(_, o)| o.as_str())
    }

    /// Every (field, origin), each field once, in the order first given.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .enumerate()
            .filter(|(i, (f, _))| !self.0[i + 1..].iter().any(|(g, _)| g == f))
            .map(|(_, (f, o))| (f.as_str(), o.as_str()))
    }

    fn set(&mut self, field: &str, origin: &str) {
        self.0.push((field.to_owned(), origin.to_owned()));
    }
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (field, origin) in self.entries() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{field} from {origin}")?;
        }
        if first {
            f.write_str("defaults only")?;
        }
        Ok(())
    }
}

/// The dotted path of every value under `path` in `value` (a map is entered, a list
/// or a scalar is one value; an empty map is `path` itself).
fn leaves(path: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(&format!("{path}.{k}"), v, out);
            }
        }
        _ => out.push(path.to_owned()),
    }
}

/// A YAML document of the effective settings (block style, as `serde-saphyr` writes
/// it) with `# from ORIGIN` after each value a layer gave, and every other value marked
/// `# default`. The values inside a list that a layer gave are not marked one by one.
pub fn annotated_yaml(yaml: &str, provenance: &Provenance) -> String {
    let mut out = String::with_capacity(yaml.len() * 2);
    // (indent, key, its lines below are not marked: a list, or a value given whole)
    let mut stack: Vec<(usize, String, bool)> = Vec::new();
    let lines: Vec<&str> = yaml.lines().collect();
    let indent_of = |l: &str| l.len() - l.trim_start().len();
    for (i, line) in lines.iter().enumerate() {
        let indent = indent_of(line);
        let rest = line.trim_start();
        let item = rest.starts_with('-');
        // A list's items may sit at their key's own indent.
        while stack
            .last()
            .is_some_and(|(d, ..)| *d > indent || (*d == indent && !item))
        {
            stack.pop();
        }
        if item && let Some(top) = stack.last_mut() {
            top.2 = true;
        }
        let key = rest.split_once(':').map(|(k, _)| k).filter(|k| {
            !item && !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        let (Some(key), false) = (key, stack.last().is_some_and(|(.., w)| *w)) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let path = stack
            .iter()
            .map(|(_, k, _)| k.as_str())
            .chain([key])
            .collect::<Vec<_>>()
            .join(".");
        let origin = provenance.origin(&path);
        let has_children = rest.trim_end().ends_with(':')
            && lines.get(i + 1).is_some_and(|next| {
                let d = indent_of(next);
                d > indent || (d == indent && next.trim_start().starts_with('-'))
            });
        out.push_str(line);
        match origin {
            Some(o) => {
                out.push_str("  # from ");
                out.push_str(o);
            }
            None if !has_children => out.push_str("  # default"),
            None => {}
        }
        out.push('\n');
        stack.push((indent, key.to_owned(), origin.is_some()));
    }
    out
}

/// A configuration put together, with where each setting came from.
#[derive(Debug, Clone)]
pub struct Loaded<T> {
    /// The effective configuration.
    pub config: T,
    /// The origin of each setting a layer gave.
    pub provenance: Provenance,
}

/// Looks an environment variable up.
type EnvLookup<'e> = Box<dyn Fn(&str) -> Option<String> + 'e>;

/// Puts one binary's configuration together from its layers; see the module docs.
pub struct Loader<'e> {
    origin: String,
    doc: Map<String, Value>,
    env: EnvLookup<'e>,
    errors: Vec<ConfigError>,
    provenance: Provenance,
}

impl fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets: the keys only.
        f.debug_struct("Loader")
            .field("origin", &self.origin)
            .field("sections", &self.doc.keys().collect::<Vec<_>>())
            .field("errors", &self.errors.len())
            .finish_non_exhaustive()
    }
}

impl<'e> Loader<'e> {
    /// Read the file at `file` (when given) and look environment variables up through
    /// `env` (`|k| std::env::var(k).ok()` in a binary, a map in tests). An unreadable
    /// file or one that is not a YAML mapping is a mistake; the other layers are still
    /// read, so that every mistake is reported at once.
    pub fn new(file: Option<&Path>, env: impl Fn(&str) -> Option<String> + 'e) -> Self {
        let Some(path) = file else {
            return Self::with_origin(String::new(), Map::new(), Vec::new(), env);
        };
        let origin = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_text(&text, &origin, env),
            Err(e) => {
                let err = ConfigError {
                    origin: origin.clone(),
                    field: String::new(),
                    message: format!("cannot read the file: {e}"),
                };
                Self::with_origin(origin, Map::new(), vec![err], env)
            }
        }
    }

    /// The file's text as read from `origin`.
    pub fn from_text(text: &str, origin: &str, env: impl Fn(&str) -> Option<String> + 'e) -> Self {
        let err = |message: String| ConfigError {
            origin: origin.to_owned(),
            field: String::new(),
            message,
        };
        let (doc, errors) = match warden_model::yaml::from_str::<Value>(text) {
            Ok(Value::Null) => (Map::new(), vec![]),
            Ok(Value::Object(m)) => (m, vec![]),
            Ok(_) => (
                Map::new(),
                vec![err("expected a mapping of settings at the top level".into())],
            ),
            Err(e) => (Map::new(), vec![err(format!("not valid YAML: {e}"))]),
        };
        Self::with_origin(origin.to_owned(), doc, errors, env)
    }

    /// The file's text alone, read by `read` (which takes its sections): what `read`
    /// returns, or every mistake in the text. For checking a file without the other layers.
    pub fn read_text<T>(
        text: &str,
        origin: &str,
        read: impl FnOnce(&mut Loader<'_>) -> T,
    ) -> Result<T, ConfigErrors> {
        let mut loader = Loader::from_text(text, origin, |_| None);
        let out = read(&mut loader);
        if loader.errors.is_empty() {
            Ok(out)
        } else {
            Err(ConfigErrors(loader.errors))
        }
    }

    fn with_origin(
        origin: String,
        doc: Map<String, Value>,
        errors: Vec<ConfigError>,
        env: impl Fn(&str) -> Option<String> + 'e,
    ) -> Self {
        Loader {
            origin,
            doc,
            env: Box::new(env),
            errors,
            provenance: Provenance::default(),
        }
    }

    /// The file's origin (its path), or empty without a file.
    pub fn file_origin(&self) -> &str {
        &self.origin
    }

    /// The environment variable `name`; an empty or blank value counts as unset.
    pub fn env(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }

    /// The file's top-level section `key` as `T`, taken out of the file (so
    /// [`Loader::unknown_keys`] does not name it); `None` when absent or ill-typed (then
    /// a mistake naming `key.path.of.the.value` is recorded). The origin is recorded
    /// for each value the section sets (`controller.url`; a list as a whole:
    /// `logs.sources`), or under `key` for a scalar or an empty section.
    pub fn section<T: DeserializeOwned>(&mut self, key: &str) -> Option<T> {
        let value = self.doc.remove(key)?;
        let mut given = Vec::new();
        leaves(key, &value, &mut given);
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(v) => {
                let origin = self.origin.clone();
                for field in given {
                    self.provenance.set(&field, &origin);
                }
                Some(v)
            }
            Err(e) => {
                let path = e.path().to_string();
                let field = if path == "." || path.is_empty() {
                    key.to_owned()
                } else {
                    format!("{key}.{path}")
                };
                let origin = self.origin.clone();
                self.push(&origin, &field, e.into_inner().to_string());
                None
            }
        }
    }

    /// Record a mistake for each top-level key no [`Loader::section`] took, naming the
    /// keys `known` as the choices.
    pub fn unknown_keys(&mut self, known: &[&str]) {
        let left: Vec<String> = self.doc.keys().cloned().collect();
        for key in left {
            self.doc.remove(&key);
            let origin = self.origin.clone();
            self.push(
                &origin,
                &key,
                format!("unknown field, expected one of {}", known.join(", ")),
            );
        }
    }

    /// Record a mistake: `origin` (a path, `environment WARDEN_X`, `flag --x`), the field
    /// concerned, what is wrong.
    pub fn push(&mut self, origin: &str, field: &str, message: impl Into<String>) {
        self.errors.push(ConfigError {
            origin: origin.to_owned(),
            field: field.to_owned(),
            message: message.into(),
        });
    }

    /// One setting over its layers, lowest first (`(origin, raw value)`: the file's
    /// value, then the environment's, then the flag's). Each value given is checked by
    /// `parse`; a mistake is recorded for each one refused, naming its origin; the last
    /// one accepted wins and its origin is recorded.
    pub fn layer<R, T>(
        &mut self,
        field: &str,
        sources: impl IntoIterator<Item = (String, Option<R>)>,
        parse: impl Fn(&R) -> Result<T, String>,
    ) -> Option<T> {
        let mut out = None;
        for (origin, raw) in sources {
            let Some(raw) = raw else { continue };
            match parse(&raw) {
                Ok(v) => {
                    self.provenance.set(field, &origin);
                    out = Some(v);
                }
                Err(message) => self.push(&origin, field, message),
            }
        }
        out
    }

    /// The file's value of a setting, then the environment variable `var`'s, then the
    /// flag's (`(name, value)`), as layers for [`Loader::layer`], each named by its origin.
    pub fn sources<R: From<String>>(
        &self,
        file: Option<R>,
        var: Option<&str>,
        flag: Option<(&str, Option<R>)>,
    ) -> Vec<(String, Option<R>)> {
        let mut out = vec![(self.origin.clone(), file)];
        if let Some(var) = var {
            out.push((format!("environment {var}"), self.env(var).map(R::from)));
        }
        if let Some((name, value)) = flag {
            out.push((format!("flag {name}"), value));
        }
        out
    }

    /// `value` when it lies in `lo..=hi`; otherwise a mistake for `field` from `origin`.
    pub fn bounded<T: PartialOrd + fmt::Display + Copy>(
        &mut self,
        origin: &str,
        field: &str,
        value: T,
        lo: T,
        hi: T,
    ) -> Option<T> {
        if value >= lo && value <= hi {
            Some(value)
        } else {
            self.push(origin, field, format!("{value} is outside {lo}..={hi}"));
            None
        }
    }

    /// The configuration `make` builds, with its provenance, when no mistake was
    /// recorded; otherwise every mistake.
    pub fn finish<T>(self, make: impl FnOnce() -> Option<T>) -> Result<Loaded<T>, ConfigErrors> {
        if !self.errors.is_empty() {
            return Err(ConfigErrors(self.errors));
        }
        match make() {
            Some(config) => Ok(Loaded {
                config,
                provenance: self.provenance,
            }),
            None => Err(ConfigErrors(vec![ConfigError {
                origin: "defaults".into(),
                field: String::new(),
                message: "the configuration is incomplete".into(),
            }])),
        }
    }
}

/// A whole number of a setting given as text (an environment variable or a flag).
pub fn whole(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .map_err(|e| format!("{text:?} is not a whole number ({e})"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Section {
        interval_ms: Option<u64>,
        url: Option<String>,
    }

    fn env(pairs: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        move |k| map.get(k).map(|v| (*v).to_owned())
    }

    #[test]
    fn sections_are_typed_and_every_mistake_names_its_path_and_origin() {
        let text = "a:\n  interval_ms: lots\nb:\n  url: http://x\n  bogus: 1\nc:\n  interval_ms: 5\nzz: 1\n";
        let mut l = Loader::from_text(text, "w.yaml", env(&[]));
        assert_eq!(l.section::<Section>("a"), None);
        assert_eq!(l.section::<Section>("b"), None);
        let c: Option<Section> = l.section("c");
        assert_eq!(c.and_then(|c| c.interval_ms), Some(5));
        assert_eq!(l.section::<Section>("absent"), None);
        l.unknown_keys(&["a", "b", "c"]);
        let errs = l.finish(|| Some(())).expect_err("mistakes");
        let fields: Vec<_> = errs.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["a.interval_ms", "b.bogus", "zz"], "{errs}");
        assert!(errs.0.iter().all(|e| e.origin == "w.yaml"), "{errs}");
        assert!(errs.to_string().contains("bogus"), "{errs}");
    }

    #[test]
    fn file_then_environment_then_flag_and_the_winner_is_remembered() {
        let mut l = Loader::from_text("port: 1\n", "w.yaml", env(&[("WARDEN_PORT", "2")]));
        let file: Option<u64> = l.section("port");
        let sources = l.sources(
            file.map(|p| p.to_string()),
            Some("WARDEN_PORT"),
            Some(("--port", None)),
        );
        let port = l.layer("port", sources, |s| whole(s));
        assert_eq!(port, Some(2));
        let sources = l.sources(
            None,
            Some("WARDEN_NONE"),
            Some(("--x", Some(String::from("7")))),
        );
        let x = l.layer("x", sources, |s| whole(s));
        let loaded = l.finish(|| Some((port, x))).expect("fine");
        assert_eq!(loaded.config, (Some(2), Some(7)));
        assert_eq!(
            loaded.provenance.origin("port"),
            Some("environment WARDEN_PORT")
        );
        assert_eq!(loaded.provenance.origin("x"), Some("flag --x"));
        assert_eq!(
            loaded.provenance.to_string(),
            "port from environment WARDEN_PORT, x from flag --x"
        );
    }

    #[test]
    fn a_section_records_each_value_it_sets_and_a_list_as_a_whole() {
        let text = "c:\n  interval_ms: 5\nl:\n  - 1\n  - 2\ne: {}\n";
        let mut l = Loader::from_text(text, "w.yaml", env(&[]));
        let _: Option<Section> = l.section("c");
        let _: Option<Vec<u64>> = l.section("l");
        let _: Option<Section> = l.section("e");
        let p = l.finish(|| Some(())).expect("fine").provenance;
        assert_eq!(p.origin("c.interval_ms"), Some("w.yaml"));
        assert_eq!(p.origin("c.url"), None);
        assert_eq!(p.origin("l"), Some("w.yaml"));
        assert_eq!(p.origin("e"), Some("w.yaml"));
    }

    #[test]
    fn annotated_yaml_names_each_given_value_and_marks_the_rest_default() {
        let mut p = Provenance::default();
        p.set("listen", "flag --listen");
        p.set("controller.url", "a.yaml");
        p.set("logs.sources", "a.yaml");
        let yaml = "listen: 127.0.0.1:1\ncontroller:\n  url: http://c:9460\n  flush_interval_ms: 1000\n\
                    logs:\n  sources:\n  - paths:\n    - /x/*.log\n    format: cri\n  presets: []\n\
                    nvml:\n  enabled: true\n";
        let got = annotated_yaml(yaml, &p);
        let want = "listen: 127.0.0.1:1  # from flag --listen\ncontroller:\n\
                    \x20 url: http://c:9460  # from a.yaml\n\
                    \x20 flush_interval_ms: 1000  # default\nlogs:\n\
                    \x20 sources:  # from a.yaml\n  - paths:\n    - /x/*.log\n    format: cri\n\
                    \x20 presets: []  # default\nnvml:\n  enabled: true  # default\n";
        assert_eq!(got, want, "{got}");
        // Indented list items are the key's too.
        p.set("l", "b.yaml");
        let got = annotated_yaml("l:\n    - a: 1\n      b: 2\nm: 3\n", &p);
        assert_eq!(
            got,
            "l:  # from b.yaml\n    - a: 1\n      b: 2\nm: 3  # default\n"
        );
    }

    #[test]
    fn a_refused_layer_is_named_and_a_lower_one_still_counts() {
        let mut l = Loader::new(None, env(&[("WARDEN_N", "many")]));
        let sources = l.sources(Some(String::from("3")), Some("WARDEN_N"), None);
        assert_eq!(l.layer("n", sources, |s| whole(s)), Some(3));
        assert_eq!(l.bounded("flag --m", "m", 0u64, 1, 10), None);
        let errs = l.finish(|| Some(())).expect_err("two mistakes");
        let msg = errs.to_string();
        assert!(
            msg.contains("environment WARDEN_N: field `n`: \"many\" is not a whole number"),
            "{msg}"
        );
        assert!(
            msg.contains("flag --m: field `m`: 0 is outside 1..=10"),
            "{msg}"
        );
    }

    #[test]
    fn unreadable_or_odd_files_are_mistakes_without_their_text() {
        let errs = Loader::new(Some(Path::new("/nonexistent/w.yaml")), env(&[]))
            .finish(|| Some(()))
            .expect_err("unreadable");
        assert!(
            errs.to_string()
                .contains("/nonexistent/w.yaml: cannot read the file"),
            "{errs}"
        );
        let errs = Loader::from_text("- a\n- b\n", "w.yaml", env(&[]))
            .finish(|| Some(()))
            .expect_err("a list");
        assert!(errs.to_string().contains("expected a mapping"), "{errs}");
        let errs = Loader::from_text("password: hunter2: x\n", "w.yaml", env(&[]))
            .finish(|| Some(()))
            .expect_err("bad YAML");
        let msg = errs.to_string();
        assert!(
            msg.contains("not valid YAML") && msg.contains("line 1"),
            "{msg}"
        );
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(
            Loader::from_text("", "w.yaml", env(&[]))
                .finish(|| Some(()))
                .is_ok()
        );
    }
}
