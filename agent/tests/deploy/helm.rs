//! A renderer for the small subset of Helm's template language that deploy/helm/warden
//! is written in, so the chart can be checked without a helm binary (and is, where helm
//! runs, against it: the deploy tests compare the two outputs object by object, the
//! YAML documents inside ConfigMaps by what they mean). Anything outside the subset is
//! an error, never a silent guess, so templates cannot drift outside it.
//!
//! The subset:
//! - text, `{{- ` and ` -}}` whitespace trimming, comments `{{/* ... */}}`;
//! - `{{ define "name" }}...{{ end }}` (in `_*.tpl` files) and `{{ include "name" . }}`;
//! - `{{ if P }}...{{ else }}...{{ end }}`, `{{ range P }}...{{ end }}` over a list (the
//!   dot becomes the item);
//! - operands: `.Values.a.b`, `.Release.Name`, `.Release.Namespace`, `.`, `$`, `$.x`,
//!   `"string"`, integers, `true`, `false`;
//! - pipelines `P | quote`, `P | default X`, `P | toYaml`, `P | indent N`,
//!   `P | nindent N` (never the function-call form `toYaml P`).
//!
//! Stricter than Helm where Helm is forgiving: a value path that is not in the values is
//! an error (Helm prints `<no value>` or treats it as false), except as the input of
//! `default`; printing a map or list without `toYaml` is an error; so are numbers Helm
//! would print in exponent form (1e6 and above: Helm reads values as float64). Like
//! Helm's, `toYaml` prints a map's keys sorted.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map as Mapping, Number, Value};

/// A parsed chart: its helpers and its templates, by file name.
#[derive(Debug)]
pub struct Chart {
    defines: BTreeMap<String, Vec<Node>>,
    templates: Vec<(String, Vec<Node>)>,
    /// `NOTES.txt`: rendered for the user after an install, never applied.
    notes: Option<Vec<Node>>,
}

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Out(Pipeline),
    If(Pipeline, Vec<Node>, Vec<Node>),
    Range(Pipeline, Vec<Node>),
}

#[derive(Debug, Clone)]
struct Pipeline {
    source: String,
    head: Head,
    funcs: Vec<Func>,
}

#[derive(Debug, Clone)]
enum Head {
    Operand(Operand),
    Include(String, Operand),
}

#[derive(Debug, Clone)]
enum Operand {
    /// `.a.b` (from the dot) or `$.a.b` (from the root); no fields is the dot itself.
    Path {
        from_root: bool,
        fields: Vec<String>,
    },
    Str(String),
    Int(i64),
    Bool(bool),
}

#[derive(Debug, Clone)]
enum Func {
    Quote,
    Default(Operand),
    ToYaml,
    Indent(usize),
    Nindent(usize),
}

#[derive(Debug)]
enum Tok {
    Text(String),
    Action(String),
}

/// Split a template into text and actions, applying `{{-` / `-}}` trimming.
fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(open) = rest.find("{{") {
        let mut text = rest[..open].to_owned();
        let after = &rest[open + 2..];
        let trim_left = after.starts_with('-') && after[1..].starts_with([' ', '\t', '\n']);
        let after = if trim_left { &after[1..] } else { after };
        let close = after
            .find("}}")
            .ok_or_else(|| format!("unclosed action after {:?}", &text))?;
        let mut body = &after[..close];
        let trim_right = body.ends_with('-') && body[..body.len() - 1].ends_with([' ', '\t', '\n']);
        if trim_right {
            body = &body[..body.len() - 1];
        }
        if trim_left {
            text.truncate(text.trim_end().len());
        }
        out.push(Tok::Text(text));
        let body = body.trim();
        if body.starts_with("/*") {
            if !body.ends_with("*/") {
                return Err(format!("comment {body:?} must end with */ before }}}}"));
            }
        } else {
            out.push(Tok::Action(body.to_owned()));
        }
        rest = &after[close + 2..];
        if trim_right {
            rest = rest.trim_start();
        }
    }
    out.push(Tok::Text(rest.to_owned()));
    Ok(out)
}

/// Words Go templates know that the subset does not.
const UNSUPPORTED: &[&str] = &[
    "with", "template", "block", "break", "continue", "tpl", "required", "printf", "toJson",
    "lookup", "tuple", "list", "dict", "not", "and", "or", "eq", "ne", "len", "index",
];

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    defines: BTreeMap<String, Vec<Node>>,
}

impl Parser {
    /// Nodes up to one of `stops` (returned) or the end of input (`None`).
    fn list(&mut self, stops: &[&str], top: bool) -> Result<(Vec<Node>, Option<String>), String> {
        let mut nodes = Vec::new();
        while self.pos < self.toks.len() {
            let i = self.pos;
            self.pos += 1;
            let action = match &self.toks[i] {
                Tok::Text(t) => {
                    if !t.is_empty() {
                        nodes.push(Node::Text(t.clone()));
                    }
                    continue;
                }
                Tok::Action(a) => a.clone(),
            };
            let (word, rest) = match action.split_once(char::is_whitespace) {
                Some((w, r)) => (w, r.trim()),
                None => (action.as_str(), ""),
            };
            match word {
                "else" | "end" => {
                    if !rest.is_empty() {
                        return Err(format!("{{{{ {action} }}}} is not in the subset"));
                    }
                    if stops.contains(&word) {
                        return Ok((nodes, Some(word.to_owned())));
                    }
                    return Err(format!("unexpected {{{{ {word} }}}}"));
                }
                "if" => {
                    let cond = pipeline(rest)?;
                    let (then, stop) = self.list(&["else", "end"], false)?;
                    let otherwise = match stop.as_deref() {
                        Some("else") => match self.list(&["end"], false)? {
                            (n, Some(_)) => n,
                            (_, None) => return Err(format!("{{{{ if {rest} }}}} has no end")),
                        },
                        Some(_) => Vec::new(),
                        None => return Err(format!("{{{{ if {rest} }}}} has no end")),
                    };
                    nodes.push(Node::If(cond, then, otherwise));
                }
                "range" => {
                    let over = pipeline(rest)?;
                    match self.list(&["end"], false)? {
                        (body, Some(_)) => nodes.push(Node::Range(over, body)),
                        (_, None) => return Err(format!("{{{{ range {rest} }}}} has no end")),
                    }
                }
                "define" => {
                    if !top {
                        return Err("define must be at the top level".into());
                    }
                    let name = string_literal(rest)?;
                    match self.list(&["end"], false)? {
                        (body, Some(_)) => {
                            if self.defines.insert(name.clone(), body).is_some() {
                                return Err(format!("{name:?} is defined twice"));
                            }
                        }
                        (_, None) => return Err(format!("define {name:?} has no end")),
                    }
                }
                w if UNSUPPORTED.contains(&w) || (w.starts_with('$') && rest.starts_with(":=")) => {
                    return Err(format!("{{{{ {action} }}}} is not in the subset"));
                }
                _ => nodes.push(Node::Out(pipeline(&action)?)),
            }
        }
        if stops.is_empty() {
            Ok((nodes, None))
        } else {
            Err(format!("missing {{{{ {} }}}}", stops.join(" or ")))
        }
    }
}

/// Split on `sep` outside double-quoted strings.
fn split_outside_quotes(s: &str, sep: fn(char) -> bool) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut quoted = false;
    let mut escaped = false;
    for c in s.chars() {
        if quoted {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                quoted = false;
            }
        } else if c == '"' {
            quoted = true;
        } else if sep(c) {
            parts.push(String::new());
            continue;
        }
        if let Some(last) = parts.last_mut() {
            last.push(c);
        }
    }
    parts
}

fn words(s: &str) -> Vec<String> {
    split_outside_quotes(s.trim(), char::is_whitespace)
        .into_iter()
        .filter(|w| !w.is_empty())
        .collect()
}

fn string_literal(s: &str) -> Result<String, String> {
    if s.starts_with('"') && s.ends_with('"') && s.len() >= 2 {
        serde_json::from_str(s).map_err(|e| format!("bad string literal {s}: {e}"))
    } else {
        Err(format!("expected a \"string\", found {s:?}"))
    }
}

fn operand(s: &str) -> Result<Operand, String> {
    let ident = |f: &str| {
        !f.is_empty()
            && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !f.starts_with(|c: char| c.is_ascii_digit())
    };
    let path = |from_root: bool, rest: &str| -> Result<Operand, String> {
        let fields: Vec<String> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.strip_prefix('.')
                .ok_or_else(|| format!("bad path {s:?}"))?
                .split('.')
                .map(str::to_owned)
                .collect()
        };
        if fields.iter().all(|f| ident(f)) {
            Ok(Operand::Path { from_root, fields })
        } else {
            Err(format!("bad path {s:?}"))
        }
    };
    if s.starts_with('"') {
        Ok(Operand::Str(string_literal(s)?))
    } else if s == "." {
        Ok(Operand::Path {
            from_root: false,
            fields: Vec::new(),
        })
    } else if let Some(rest) = s.strip_prefix('$') {
        path(true, rest)
    } else if s.starts_with('.') {
        path(false, s)
    } else if s == "true" || s == "false" {
        Ok(Operand::Bool(s == "true"))
    } else if let Ok(n) = s.parse::<i64>() {
        Ok(Operand::Int(n))
    } else {
        Err(format!("{s:?} is not an operand of the subset"))
    }
}

fn pipeline(src: &str) -> Result<Pipeline, String> {
    let cmds = split_outside_quotes(src, |c| c == '|');
    let first = words(&cmds[0]);
    let head = match first.as_slice() {
        [inc, name, arg] if inc == "include" => Head::Include(string_literal(name)?, operand(arg)?),
        [one] => Head::Operand(operand(one)?),
        [] => return Err(format!("empty pipeline in {{{{ {src} }}}}")),
        _ => {
            return Err(format!(
                "{{{{ {src} }}}}: only `include \"name\" ARG` and single operands may start \
                 a pipeline (write `X | fn`, not `fn X`)"
            ));
        }
    };
    let mut funcs = Vec::new();
    for cmd in &cmds[1..] {
        let w = words(cmd);
        let int = |s: &String| -> Result<usize, String> {
            s.parse().map_err(|_| format!("{s:?} is not a width"))
        };
        let f = match w.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["quote"] => Func::Quote,
            ["toYaml"] => Func::ToYaml,
            ["default", x] => Func::Default(operand(x)?),
            ["indent", _] => Func::Indent(int(&w[1])?),
            ["nindent", _] => Func::Nindent(int(&w[1])?),
            _ => {
                return Err(format!(
                    "{cmd:?} in {{{{ {src} }}}} is not a function of the subset"
                ));
            }
        };
        funcs.push(f);
    }
    Ok(Pipeline {
        source: src.to_owned(),
        head,
        funcs,
    })
}

fn parse(src: &str, defines: &mut BTreeMap<String, Vec<Node>>) -> Result<Vec<Node>, String> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
        defines: std::mem::take(defines),
    };
    let result = p.list(&[], true);
    *defines = p.defines;
    Ok(result?.0)
}

/// What a pipeline yields: a value, or a path the values do not have.
enum V {
    Val(Value),
    Missing(String),
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
    }
}

/// A number as Helm prints it, or an error where Helm would print an exponent.
fn number(n: &Number) -> Result<String, String> {
    if let Some(i) = n.as_i64() {
        if i.unsigned_abs() < 1_000_000 {
            return Ok(i.to_string());
        }
    } else if let Some(f) = n.as_f64()
        && f.fract() != 0.0
        && (1e-4..1e6).contains(&f.abs())
    {
        return Ok(format!("{f}"));
    }
    Err(format!(
        "number {n} would not print as written (Helm reads values as float64: quote it in values.yaml)"
    ))
}

/// Whether `toYaml` prints every number in `v` as written. Helm's goes through JSON
/// (sigs.k8s.io/yaml): a float64 prints whole up to 1e21, and in exponent form below
/// 1e-6; an integer past 2^53 is not a float64 any more.
fn check_numbers(v: &Value) -> Result<(), String> {
    match v {
        Value::Number(n) => {
            let exact = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), ..) => i.unsigned_abs() <= 1 << 53,
                (None, Some(u), _) => u <= 1 << 53,
                (.., Some(f)) => f == 0.0 || (1e-6..1e21).contains(&f.abs()),
                _ => false,
            };
            if exact {
                Ok(())
            } else {
                Err(format!(
                    "number {n} would not print as written (Helm reads values as float64: quote it in values.yaml)"
                ))
            }
        }
        Value::Array(s) => s.iter().try_for_each(check_numbers),
        Value::Object(m) => m.values().try_for_each(check_numbers),
        _ => Ok(()),
    }
}

fn scalar_text(v: &V, what: &str) -> Result<String, String> {
    match v {
        V::Missing(p) => Err(format!(
            "{what}: no value at {p} (every value must be in values.yaml)"
        )),
        V::Val(Value::String(s)) => Ok(s.clone()),
        V::Val(Value::Bool(b)) => Ok(b.to_string()),
        V::Val(Value::Number(n)) => number(n).map_err(|e| format!("{what}: {e}")),
        V::Val(Value::Null) => Err(format!("{what}: the value is null")),
        V::Val(_) => Err(format!(
            "{what}: a map or list prints only through `| toYaml`"
        )),
    }
}

impl Chart {
    /// Parse every `*.yaml`, `_*.tpl` and `NOTES.txt` under `dir/templates`.
    pub fn load(dir: &Path) -> Result<Chart, String> {
        let mut defines = BTreeMap::new();
        let mut templates = Vec::new();
        let mut notes = None;
        let tdir = dir.join("templates");
        let mut entries: Vec<_> = std::fs::read_dir(&tdir)
            .map_err(|e| format!("{}: {e}", tdir.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| format!("odd file name {}", path.display()))?
                .to_owned();
            let src = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
            let nodes = parse(&src, &mut defines).map_err(|e| format!("{name}: {e}"))?;
            if name.starts_with('_') {
                if nodes
                    .iter()
                    .any(|n| !matches!(n, Node::Text(t) if t.trim().is_empty()))
                {
                    return Err(format!("{name}: helper files may only hold defines"));
                }
            } else if name.ends_with(".yaml") {
                templates.push((name, nodes));
            } else if name == "NOTES.txt" {
                notes = Some(nodes);
            } else {
                return Err(format!("{name}: not a template this renderer knows"));
            }
        }
        Ok(Chart {
            defines,
            templates,
            notes,
        })
    }

    /// Parse one template given as text (for tests of the renderer itself).
    pub fn from_source(helpers: &str, template: &str) -> Result<Chart, String> {
        let mut defines = BTreeMap::new();
        parse(helpers, &mut defines)?;
        let nodes = parse(template, &mut defines)?;
        Ok(Chart {
            defines,
            templates: vec![("t.yaml".into(), nodes)],
            notes: None,
        })
    }

    /// The root object templates see: `.Values` and `.Release`.
    fn root(values: &Value, release: &str, namespace: &str) -> Value {
        let mut root = Mapping::new();
        root.insert("Values".into(), values.clone());
        let mut rel = Mapping::new();
        rel.insert("Name".into(), release.into());
        rel.insert("Namespace".into(), namespace.into());
        root.insert("Release".into(), Value::Object(rel));
        Value::Object(root)
    }

    /// `NOTES.txt` rendered as Helm shows it after an install; `None` without one.
    pub fn notes(
        &self,
        values: &Value,
        release: &str,
        namespace: &str,
    ) -> Option<Result<String, String>> {
        let root = Self::root(values, release, namespace);
        self.notes.as_ref().map(|nodes| {
            let mut out = String::new();
            self.nodes(nodes, &root, &root, &mut out, 0)
                .map_err(|e| format!("NOTES.txt: {e}"))?;
            Ok(out)
        })
    }

    /// Render every template with `values` as `.Values`; returns (file name, output).
    pub fn render(
        &self,
        values: &Value,
        release: &str,
        namespace: &str,
    ) -> Result<Vec<(String, String)>, String> {
        let root = Self::root(values, release, namespace);
        self.templates
            .iter()
            .map(|(name, nodes)| {
                let mut out = String::new();
                self.nodes(nodes, &root, &root, &mut out, 0)
                    .map_err(|e| format!("{name}: {e}"))?;
                Ok((name.clone(), out))
            })
            .collect()
    }

    fn nodes(
        &self,
        nodes: &[Node],
        dot: &Value,
        root: &Value,
        out: &mut String,
        depth: usize,
    ) -> Result<(), String> {
        if depth > 16 {
            return Err("includes nest deeper than 16".into());
        }
        for n in nodes {
            match n {
                Node::Text(t) => out.push_str(t),
                Node::Out(p) => {
                    let v = self.pipeline(p, dot, root, depth)?;
                    out.push_str(&scalar_text(&v, &format!("{{{{ {} }}}}", p.source))?);
                }
                Node::If(p, then, otherwise) => {
                    let v = match self.pipeline(p, dot, root, depth)? {
                        V::Val(v) => v,
                        V::Missing(path) => {
                            return Err(format!(
                                "{{{{ if {} }}}}: no value at {path} (every value must be in values.yaml)",
                                p.source
                            ));
                        }
                    };
                    let branch = if is_empty(&v) { otherwise } else { then };
                    self.nodes(branch, dot, root, out, depth)?;
                }
                Node::Range(p, body) => match self.pipeline(p, dot, root, depth)? {
                    V::Val(Value::Array(items)) => {
                        for item in &items {
                            self.nodes(body, item, root, out, depth)?;
                        }
                    }
                    _ => return Err(format!("{{{{ range {} }}}}: only lists", p.source)),
                },
            }
        }
        Ok(())
    }

    fn operand(&self, op: &Operand, dot: &Value, root: &Value) -> Result<V, String> {
        Ok(match op {
            Operand::Str(s) => V::Val(Value::String(s.clone())),
            Operand::Int(i) => V::Val(Value::Number((*i).into())),
            Operand::Bool(b) => V::Val(Value::Bool(*b)),
            Operand::Path { from_root, fields } => {
                let mut cur = if *from_root { root } else { dot };
                let shown =
                    || format!("{}.{}", if *from_root { "$" } else { "" }, fields.join("."));
                for f in fields {
                    match cur {
                        Value::Object(m) => match m.get(f.as_str()) {
                            Some(v) => cur = v,
                            None => return Ok(V::Missing(shown())),
                        },
                        _ => {
                            return Err(format!("{}: cannot take field {f} of a non-map", shown()));
                        }
                    }
                }
                V::Val(cur.clone())
            }
        })
    }

    fn pipeline(&self, p: &Pipeline, dot: &Value, root: &Value, depth: usize) -> Result<V, String> {
        let what = format!("{{{{ {} }}}}", p.source);
        let mut v = match &p.head {
            Head::Operand(op) => self.operand(op, dot, root)?,
            Head::Include(name, arg) => {
                let body = self
                    .defines
                    .get(name)
                    .ok_or_else(|| format!("{what}: no define {name:?}"))?;
                let arg = match self.operand(arg, dot, root)? {
                    V::Val(v) => v,
                    V::Missing(path) => return Err(format!("{what}: no value at {path}")),
                };
                let mut out = String::new();
                self.nodes(body, &arg, root, &mut out, depth + 1)?;
                V::Val(Value::String(out))
            }
        };
        for f in &p.funcs {
            v = match f {
                Func::Quote => {
                    let text = scalar_text(&v, &what)?;
                    V::Val(Value::String(
                        serde_json::to_string(&text).map_err(|e| e.to_string())?,
                    ))
                }
                Func::Default(d) => match &v {
                    V::Missing(_) => self.operand(d, dot, root)?,
                    V::Val(x) if is_empty(x) => self.operand(d, dot, root)?,
                    V::Val(_) => v,
                },
                Func::ToYaml => match v {
                    V::Missing(path) => return Err(format!("{what}: no value at {path}")),
                    V::Val(x) => {
                        check_numbers(&x).map_err(|e| format!("{what}: {e}"))?;
                        let text = serde_saphyr::to_string(&x).map_err(|e| e.to_string())?;
                        let text = text.strip_suffix('\n').unwrap_or(&text).to_owned();
                        V::Val(Value::String(text))
                    }
                },
                Func::Indent(n) | Func::Nindent(n) => {
                    let text = scalar_text(&v, &what)?;
                    let pad = " ".repeat(*n);
                    let indented = format!("{pad}{}", text.replace('\n', &format!("\n{pad}")));
                    let s = if matches!(f, Func::Nindent(_)) {
                        format!("\n{indented}")
                    } else {
                        indented
                    };
                    V::Val(Value::String(s))
                }
            };
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(text: &str) -> Value {
        warden_model::yaml::from_str(text).expect("test values parse")
    }

    fn render(helpers: &str, template: &str, vals: &str) -> Result<String, String> {
        let chart = Chart::from_source(helpers, template)?;
        let mut out = chart.render(&values(vals), "rel", "ns")?;
        Ok(out.remove(0).1)
    }

    #[test]
    fn renderer_follows_helm_for_trimming_pipelines_and_blocks() {
        let helpers =
            "{{- define \"labels\" -}}\napp: x\ninstance: {{ .Release.Name }}\n{{- end }}\n";
        let template = "\
metadata:
  labels:
    {{- include \"labels\" . | nindent 4 }}
  {{- if .Values.extra }}
  extra: {{ .Values.extra | quote }}
  {{- else }}
  extra: none
  {{- end }}
  tag: {{ .Values.missing | default \"v1\" }}
  port: {{ .Values.port }}
items:
{{- range .Values.items }}
  - {{ .name }}
{{- end }}
res:
  {{- .Values.res | toYaml | nindent 2 }}
{{/* a comment */}}
text: |
  {{- .Values.text | nindent 2 }}
";
        let vals = "extra: 'a \"b\"'\nport: 9460\nitems: [{name: one}, {name: two}]\nres: {cpu: 1m, mem: [1, 2]}\ntext: \"l1\\nl2\\n\"\n";
        let out = render(helpers, template, vals).expect("renders");
        let expected = "\
metadata:
  labels:
    app: x
    instance: rel
  extra: \"a \\\"b\\\"\"
  tag: v1
  port: 9460
items:
  - one
  - two
res:
  cpu: 1m
  mem:
  - 1
  - 2

text: |
  l1
  l2
  
";
        assert_eq!(out, expected);
        let out = render(
            helpers,
            template,
            "extra: ''\nport: 1\nitems: []\nres: {}\ntext: x\n",
        )
        .expect("renders");
        assert!(out.contains("extra: none"), "{out}");
        assert!(out.contains("res:\n  {}"), "{out}");
    }

    #[test]
    fn renderer_refuses_what_is_outside_the_subset() {
        let v = "a: 1\nbig: 8388608\nm: {x: 1}\nl: [1]\n";
        for (template, needle) in [
            ("{{ with .Values.a }}x{{ end }}", "not in the subset"),
            ("{{ printf \"%d\" .Values.a }}", "not in the subset"),
            ("{{ toYaml .Values.m }}", "write `X | fn`"),
            ("{{ .Values.a | upper }}", "not a function of the subset"),
            ("{{ .Values.b }}", "no value at .Values.b"),
            (
                "{{ if .Values.typo }}x{{ end }}",
                "no value at .Values.typo",
            ),
            ("{{ .Values.m }}", "only through `| toYaml`"),
            ("{{ .Values.big }}", "would not print as written"),
            (
                "{{ .Values.l | toYaml }}{{ .Values.big | quote }}",
                "would not print",
            ),
            ("{{ .Chart.Name }}", "no value at .Chart.Name"),
            ("{{ include \"nope\" . }}", "no define"),
            ("{{ range .Values.m }}x{{ end }}", "only lists"),
            (
                "{{ if .Values.a }}x{{ else if .Values.a }}y{{ end }}",
                "not in the subset",
            ),
            ("{{ if .Values.a }}x", "missing {{ else or end }}"),
            ("x{{ end }}", "unexpected"),
            ("{{ $x := .Values.a }}", "not in the subset"),
            ("{{ .Values.a }", "unclosed"),
            ("{{ (.Values.a) }}", "not an operand"),
            ("{{ .Values.a | indent }}", "not a function of the subset"),
        ] {
            let err = render("", template, v).expect_err(template);
            assert!(err.contains(needle), "{template}: {err}");
        }
    }
}
