//! Checks of what operators install next to Warden: the Prometheus alert rules
//! (rules/prometheus/) and the Grafana dashboards (dashboards/). Every PromQL expression
//! they hold must parse, every alert must have a firing and a quiet unit test that
//! passes, every metric they name must be documented, every alert's `runbook_url` must
//! lead to its section of docs/OBSERVABILITY.md, and the dashboards must be wired to
//! their `datasource` variable. (agent/tests/deploy checks that the Helm chart's
//! PrometheusRule renders to the same rules.)
//!
//! The syntax and unit-test checks run `promtool` (Debian's `prometheus` package;
//! `scripts/test` installs it). Under `CI=true` a missing promtool fails these tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

#[path = "common/dashboard_queries.rs"]
mod dashboard_queries;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace")
        .to_path_buf()
}

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no *.{ext} in {dir}");
    v
}

fn yaml(path: &Path) -> Json {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    warden_model::yaml::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn rule_files() -> Vec<PathBuf> {
    files("rules/prometheus", "yaml")
}

fn rule_test_files() -> Vec<PathBuf> {
    files("rules/prometheus/tests", "yaml")
}

fn dashboards() -> Vec<(PathBuf, Json)> {
    files("dashboards", "json")
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            (p, json)
        })
        .collect()
}

/// Every alerting rule: (name, expression).
fn alerts() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for path in rule_files() {
        let doc = yaml(&path);
        let groups = doc["groups"]
            .as_array()
            .unwrap_or_else(|| panic!("{path:?}: no groups"));
        for g in groups {
            for r in g["rules"].as_array().expect("rules of a group") {
                if let (Some(name), Some(expr)) = (r["alert"].as_str(), r["expr"].as_str()) {
                    out.push((name.to_owned(), expr.to_owned()));
                }
            }
        }
    }
    assert!(!out.is_empty(), "no alerts found");
    out
}

/// Every alerting rule: (name, the rule).
fn alert_rules() -> Vec<(String, Json)> {
    let mut out = Vec::new();
    for path in rule_files() {
        let doc = yaml(&path);
        for g in doc["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().expect("rules of a group") {
                if let Some(name) = r["alert"].as_str() {
                    out.push((name.to_owned(), r.clone()));
                }
            }
        }
    }
    assert!(!out.is_empty(), "no alerts found");
    out
}

fn observability_doc() -> String {
    let path = repo().join("docs/OBSERVABILITY.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The page the alerts' `runbook_url` annotations point into: docs/OBSERVABILITY.md on
/// the main branch of the project's repository (the workspace's `repository`).
fn runbook_page() -> String {
    let path = repo().join("Cargo.toml");
    let cargo = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let url = cargo
        .lines()
        .find_map(|l| l.trim().strip_prefix("repository = \"")?.strip_suffix('"'))
        .expect("the workspace's Cargo.toml names its repository");
    format!(
        "{}/blob/main/docs/OBSERVABILITY.md",
        url.trim_end_matches('/')
    )
}

/// The link targets of a Markdown page as GitHub makes them: one per heading (its text
/// in lower case, without punctuation, spaces as hyphens, `-1`, `-2`, ... on repeats)
/// and one per explicit `<a id="..">` or `<a name="..">`. Lines in code fences are not
/// headings.
fn markdown_anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(marker) = ["```", "~~~"].into_iter().find(|m| t.starts_with(m)) {
            match fence {
                None => fence = Some(marker),
                Some(f) if f == marker => fence = None,
                Some(_) => {}
            }
            continue;
        }
        if fence.is_some() {
            continue;
        }
        let level = t.len() - t.trim_start_matches('#').len();
        if (1..=6).contains(&level) && t[level..].starts_with(' ') && line.len() - t.len() < 4 {
            let title = t[level..].trim().trim_end_matches('#').trim();
            let slug: String = title
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect();
            let n = seen.entry(slug.clone()).or_insert(0);
            out.insert(if *n == 0 {
                slug.clone()
            } else {
                format!("{slug}-{n}")
            });
            *n += 1;
        }
        for attr in ["<a id=\"", "<a name=\""] {
            for part in line.split(attr).skip(1) {
                if let Some(id) = part.split('"').next() {
                    out.insert(id.to_owned());
                }
            }
        }
    }
    out
}

/// Where an expression came from, and the expression with Grafana's variables replaced
/// by values PromQL accepts.
struct Expr {
    origin: String,
    promql: String,
}

/// Grafana's variables as they appear in queries, and what stands in for each.
const GRAFANA_VARS: &[(&str, &str)] = &[
    ("${datasource}", "prometheus"),
    ("$__rate_interval", "1m"),
    ("$__interval", "1m"),
    ("$__range", "1h"),
    ("$job", "job-0"),
    ("$node", "node-0:9461"),
    ("$gpu", "0"),
    ("$agent_job", "warden-agent"),
];

fn substitute(expr: &str) -> String {
    let mut s = expr.to_owned();
    for (var, value) in GRAFANA_VARS {
        s = s.replace(var, value);
    }
    assert!(
        !s.contains('$'),
        "a Grafana variable without a stand-in in the check: {expr}"
    );
    s
}

/// The PromQL inside a template variable's query: `label_values(EXPR, label)` and
/// `query_result(EXPR)` hold one; `label_values(label)` and `metrics(..)` do not.
fn variable_promql(query: &str) -> Option<String> {
    let q = query.trim();
    if let Some(inner) = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        let (expr, _label) = inner.rsplit_once(',')?;
        return Some(expr.trim().to_owned());
    }
    if let Some(inner) = q
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return Some(inner.to_owned());
    }
    None
}

fn dashboard_exprs() -> Vec<Expr> {
    let mut out = Vec::new();
    for (path, d) in dashboards() {
        let file = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        for q in dashboard_queries::queries(&file, &d) {
            out.push(Expr {
                origin: format!("{}: panel {} {:?} {}", q.dashboard, q.id, q.panel, q.ref_id),
                promql: substitute(&q.expr),
            });
        }
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] != "query" {
                continue;
            }
            let q = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .expect("a query variable without a query");
            let promql = variable_promql(q)
                .unwrap_or_else(|| panic!("{file}: variable {:?}: no PromQL in {q}", v["name"]));
            out.push(Expr {
                origin: format!("{file}: variable {:?}", v["name"]),
                promql: substitute(&promql),
            });
        }
    }
    out
}

fn rule_exprs() -> Vec<Expr> {
    alerts()
        .into_iter()
        .map(|(name, expr)| Expr {
            origin: format!("alert {name}"),
            promql: expr,
        })
        .collect()
}

#[test]
fn every_promql_expression_in_rules_and_dashboards_parses() {
    let Some(promtool) = warden_testkit::tools::promtool() else {
        return;
    };
    let exprs: Vec<Expr> = rule_exprs().into_iter().chain(dashboard_exprs()).collect();
    assert!(exprs.len() > 50, "only {} expressions found", exprs.len());
    // Each expression becomes a recording rule; `promtool check rules` parses them all
    // and names the failing rule.
    let mut rules = Vec::new();
    for (i, e) in exprs.iter().enumerate() {
        rules.push(serde_json::json!({
            "record": format!("check:expr_{i}"),
            "expr": e.promql,
        }));
    }
    let doc = serde_json::json!({"groups": [{"name": "expressions", "rules": rules}]});
    let dir = std::env::temp_dir().join(format!("warden-promql-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("expressions.yaml");
    std::fs::write(&file, serde_saphyr::to_string(&doc).expect("yaml"))
        .expect("write the expressions");
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("run promtool");
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        let index: String = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| format!("check:expr_{i} = {}: {}\n", e.origin, e.promql))
            .collect();
        panic!(
            "promtool rejects an expression:\n{}{}\n{index}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn alert_rule_files_pass_promtool_check() {
    let Some(promtool) = warden_testkit::tools::promtool() else {
        return;
    };
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .args(rule_files())
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_unit_tests_pass() {
    let Some(promtool) = warden_testkit::tools::promtool() else {
        return;
    };
    let out = Command::new(promtool)
        .args(["test", "rules"])
        .args(rule_test_files())
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool test rules:\n{text}");
    assert!(text.contains("SUCCESS"), "promtool test rules:\n{text}");
}

/// For every alert name in the test files: (cases where it is expected to fire, cases
/// where it is expected to stay quiet).
fn alert_cases() -> BTreeMap<String, (usize, usize)> {
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for path in rule_test_files() {
        let doc = yaml(&path);
        for t in doc["tests"].as_array().expect("tests") {
            for a in t["alert_rule_test"].as_array().into_iter().flatten() {
                let name = a["alertname"].as_str().expect("alertname").to_owned();
                let fires = a["exp_alerts"].as_array().is_some_and(|s| !s.is_empty());
                let c = cases.entry(name).or_default();
                if fires {
                    c.0 += 1;
                } else {
                    c.1 += 1;
                }
            }
        }
    }
    cases
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_test_case() {
    let cases = alert_cases();
    let names: BTreeSet<String> = alerts().into_iter().map(|(n, _)| n).collect();
    let mut missing = Vec::new();
    for name in &names {
        match cases.get(name) {
            None => missing.push(format!("{name}: no test")),
            Some((0, _)) => missing.push(format!("{name}: no case where it fires")),
            Some((_, 0)) => missing.push(format!("{name}: no case where it stays quiet")),
            Some(_) => {}
        }
    }
    for name in cases.keys().filter(|n| !names.contains(*n)) {
        missing.push(format!("{name}: tested but no such alert"));
    }
    assert!(missing.is_empty(), "alert tests:\n{}", missing.join("\n"));
}

const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    // Aggregations may be followed by `by (..)` instead of their argument.
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];

/// Metric names an expression selects: identifiers outside strings, label matchers,
/// ranges and grouping clauses that are neither functions nor keywords.
fn metric_names(promql: &str) -> BTreeSet<String> {
    // Drop string literals, then everything inside {...} and [...].
    let mut plain = String::with_capacity(promql.len());
    let mut quote = None;
    let mut depth = 0usize;
    for c in promql.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth = depth.saturating_sub(1),
            (None, c) if depth == 0 => plain.push(c),
            (None, _) => {}
        }
    }
    let chars: Vec<char> = plain.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            // The word right after `by`, `on`, ... is a label list.
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            {
                skip_group = true;
                continue;
            }
            if next == Some(&'(') || PROMQL_WORDS.contains(&word.as_str()) {
                continue;
            }
            names.insert(word);
        } else if c == '(' && skip_group {
            // Skip the label list.
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            skip_group = false;
            i += 1;
        } else {
            if c.is_ascii_digit() || c == '.' {
                // A number (or a duration after offset): skip it whole.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
                continue;
            }
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_found_in_expressions() {
    let names = metric_names(
        r#"sum by (instance, code) (increase(warden_gpu_xid_errors_total{code=~"48|79"}[1h])) > 0
           or (up{job="a"} unless warden_agents offset 10m) and on (instance) foo_bar * 2.5e3"#,
    );
    let want: BTreeSet<String> = [
        "warden_gpu_xid_errors_total",
        "up",
        "warden_agents",
        "foo_bar",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, want);
}

#[test]
fn every_metric_in_rules_and_dashboards_is_documented() {
    let doc = std::fs::read_to_string(repo().join("docs/METRICS.md")).expect("docs/METRICS.md");
    // Prometheus's own series, not Warden's.
    let builtin = ["up"];
    let mut unknown = BTreeSet::new();
    let exprs: Vec<Expr> = rule_exprs().into_iter().chain(dashboard_exprs()).collect();
    for e in &exprs {
        for name in metric_names(&e.promql) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| doc.contains(&format!("`{b}`")))
                .unwrap_or(&name);
            if !builtin.contains(&base) && !doc.contains(&format!("`{base}`")) {
                unknown.insert(format!("{name} ({})", e.origin));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics not documented in docs/METRICS.md (a typo, or document them):\n{}",
        unknown.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn fatal_xid_alert_covers_exactly_the_fatal_codes_of_the_xid_catalog() {
    let catalog = yaml(&repo().join("rules/xid.yaml"));
    let fatal: BTreeSet<u64> = catalog
        .as_array()
        .expect("xid.yaml is a list")
        .iter()
        .filter(|e| e["severity"].as_str() == Some("fatal"))
        .map(|e| e["code"].as_u64().expect("code"))
        .collect();
    assert!(fatal.contains(&79), "the catalog lost XID 79");
    let (_, expr) = alerts()
        .into_iter()
        .find(|(n, _)| n == "WardenGpuFatalXid")
        .expect("the WardenGpuFatalXid alert");
    let mut matchers = 0;
    for part in expr.split("code=~\"").skip(1) {
        let list = part.split('"').next().expect("closing quote");
        let codes: BTreeSet<u64> = list
            .split('|')
            .map(|c| c.parse().expect("a numeric code"))
            .collect();
        assert_eq!(codes, fatal, "WardenGpuFatalXid codes vs rules/xid.yaml");
        matchers += 1;
    }
    assert!(matchers > 0, "WardenGpuFatalXid selects no codes: {expr}");
}

#[test]
fn dashboards_use_their_datasource_variable_and_define_their_variables() {
    for (path, d) in dashboards() {
        let vars = d["templating"]["list"].as_array().expect("templating");
        let ds = vars
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{path:?}: no datasource variable"));
        assert_eq!(ds["type"], "datasource", "{path:?}");
        assert_eq!(ds["query"], "prometheus", "{path:?}");
        let defined: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        let mut ids = BTreeSet::new();
        let mut panels: Vec<&Json> = Vec::new();
        for p in d["panels"].as_array().expect("panels") {
            panels.push(p);
            panels.extend(p["panels"].as_array().into_iter().flatten());
        }
        for p in panels {
            let id = p["id"].as_u64().expect("panel id");
            assert!(ids.insert(id), "{path:?}: panel id {id} twice");
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{path:?}: panel {:?}",
                p["title"]
            );
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{path:?}: panel {:?}", p["title"]);
            for t in targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{path:?}");
                let expr = t["expr"].as_str().expect("expr");
                for word in expr.split('$').skip(1) {
                    let name: String = word
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        name.starts_with("__") || defined.contains(name.as_str()),
                        "{path:?}: panel {:?} uses ${name}, which is not defined",
                        p["title"]
                    );
                }
            }
        }
    }
}

#[test]
fn markdown_anchors_are_the_ones_github_makes() {
    let text = "# Top\n\n## `WardenX` alert\n\n```sh\n# not a heading\n```\n\n### Top\n\
                <a id=\"custom-1\"></a>\n#### Runbooks: what to do?\n    # indented code\n#x\n";
    let want: BTreeSet<String> = [
        "top",
        "wardenx-alert",
        "top-1",
        "custom-1",
        "runbooks-what-to-do",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(markdown_anchors(text), want);
}

#[test]
fn every_alert_has_a_severity_a_summary_a_description_and_a_runbook_url_into_the_docs() {
    let page = runbook_page();
    let anchors = markdown_anchors(&observability_doc());
    let mut problems = Vec::new();
    for (name, rule) in alert_rules() {
        let severity = rule["labels"]["severity"].as_str();
        if !matches!(severity, Some("critical" | "warning")) {
            problems.push(format!(
                "{name}: severity {severity:?}, not critical or warning"
            ));
        }
        let keys: Vec<&str> = rule["annotations"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        if keys != ["description", "runbook_url", "summary"] {
            problems.push(format!(
                "{name}: annotations {keys:?}, not summary, description and runbook_url"
            ));
        }
        let Some(url) = rule["annotations"]["runbook_url"].as_str() else {
            continue;
        };
        let want = format!("{page}#{}", name.to_lowercase());
        if url != want {
            problems.push(format!("{name}: runbook_url {url}, not {want}"));
        }
        match url.split_once('#') {
            Some((_, anchor)) if anchors.contains(anchor) => {}
            Some((_, anchor)) => problems.push(format!(
                "{name}: runbook_url {url}: docs/OBSERVABILITY.md has no heading or anchor \
                 #{anchor} (add a `#### {name}` runbook section)"
            )),
            None => problems.push(format!("{name}: runbook_url {url} has no #anchor")),
        }
    }
    assert!(
        problems.is_empty(),
        "alert annotations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn docs_alert_table_lists_every_alert_with_its_severity() {
    let doc = observability_doc();
    let mut table = BTreeMap::new();
    for line in doc.lines().filter(|l| l.starts_with("| [`Warden")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let link = cells[1];
        let name = link
            .strip_prefix("[`")
            .and_then(|r| r.split_once("`]("))
            .map(|(n, _)| n.to_owned())
            .unwrap_or_else(|| panic!("alert table row {line:?}: not [`Name`](#anchor)"));
        assert_eq!(
            link,
            format!("[`{name}`](#{})", name.to_lowercase()),
            "the table links each alert to its runbook"
        );
        assert!(
            table.insert(name.clone(), cells[2].to_owned()).is_none(),
            "{name} is in the alert table twice"
        );
    }
    let rules: BTreeMap<String, String> = alert_rules()
        .into_iter()
        .map(|(name, r)| {
            let sev = r["labels"]["severity"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (name, sev)
        })
        .collect();
    assert_eq!(
        table, rules,
        "docs/OBSERVABILITY.md's alert table (alert, severity) vs the rules"
    );
}

#[test]
fn every_firing_alert_test_checks_the_annotations_and_the_runbook_url() {
    let urls: BTreeMap<String, String> = alert_rules()
        .into_iter()
        .map(|(name, r)| {
            let url = r["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (name, url)
        })
        .collect();
    let mut problems = Vec::new();
    for path in rule_test_files() {
        let doc = yaml(&path);
        for t in doc["tests"].as_array().expect("tests") {
            for a in t["alert_rule_test"].as_array().into_iter().flatten() {
                let name = a["alertname"].as_str().expect("alertname");
                for e in a["exp_alerts"].as_array().into_iter().flatten() {
                    let got = e["exp_annotations"]["runbook_url"].as_str();
                    if got != urls.get(name).map(String::as_str) {
                        problems.push(format!(
                            "{}: {name}: exp_annotations runbook_url {got:?}, the rule's is {:?}",
                            t["name"],
                            urls.get(name)
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "alert tests:\n{}", problems.join("\n"));
}
