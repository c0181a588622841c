//! A real Prometheus scrapes a running `warden demo` and a real `warden-agent` on 8 fake
//! GPUs, and every query of every Grafana dashboard (panel targets, including panels
//! nested in rows, and annotation queries) must return data; the few that show nothing
//! without a fault are listed in [`QUIET`] with the reason, and the test injects that
//! fault and checks that they then return data.
//!
//! Phases: (1) Prometheus (Debian's `prometheus`, scrape interval 1 s, the job names and
//! relabelling of `dashboards/provisioning/prometheus-scrape.yaml`, the alert rules
//! loaded) scrapes both; every query not in [`QUIET`] must return data, and every query
//! listed for an agent fault must not. (2) Faults on the agent's node: NVML reports
//! thermal throttling, the kernel log gets XID 13 and XID 79, the controller a
//! malformed batch, then NVML hangs (its collector goes down). The demo injects its own
//! (straggler, slow link, NaN, XID 63, XID 79). Every listed query must then return
//! data, and every alert rule must evaluate without error. Grafana's variables are
//! resolved as Grafana does: `label_values(..)` queries against the same Prometheus,
//! `$__interval` 1 s, `$__rate_interval` 4 s (scrape interval 1 s).
//! "Data" means a sample with a finite value: Grafana draws nothing for NaN.
//!
//! Where it lives: here, in `warden-agent`, because the fake NVML library and the agent
//! process helpers are this package's (`tests/fake_nvml`, `tests/support`) and
//! `CARGO_BIN_EXE_warden-agent` is always freshly built for it. The `warden` binary
//! belongs to another package, which Cargo cannot build for this one, so the test takes
//! it from `WARDEN_BIN`, else from next to the agent binary (same target directory and
//! profile): `cargo test --workspace` (and `--release`) builds it there because the
//! `warden` package's own tests need it. Its Cargo dep-info (that of the `deps/` file it
//! is a hard link of, else `warden.d` beside it) is checked so
//! that a binary older than its sources is never tested, nor one built from another
//! checkout sharing the target directory where the dep-info names sources by absolute
//! path (`warden.d`). Building it from here is no
//! option: a nested `cargo build` resolves features differently from `cargo test` and
//! would rebuild (and replace) what the outer build made.
//!
//! Under `CI=true` a missing `prometheus` (or a missing or stale `warden`) fails the
//! test; elsewhere the test is skipped with a loud message. `PROMETHEUS` names another
//! Prometheus binary.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value as Json;
use warden_agent::nvml::throttle;
use warden_testkit::{PATIENCE, poll, scaled};

#[path = "../../controller/tests/common/dashboard_queries.rs"]
mod dashboard_queries;
#[path = "fake_nvml/mod.rs"]
mod fake_nvml;
mod support;
use support::{AgentProc, free_port, http_get};

/// What a query in [`QUIET`] needs before it shows anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// A fault this test injects on the agent's node (or at the controller's ingest).
    /// Checked empty before the injection and with data after it.
    AgentFault,
    /// A fault of the demo's own scripted mix (incidents). Checked with data by the end.
    DemoFault,
    /// Something this setup cannot produce (checked empty, so that the entry goes when
    /// the setup learns to produce it).
    NotHere,
}

/// A query that legitimately returns nothing on a healthy cluster.
struct Quiet {
    dashboard: &'static str,
    /// The panel's id (0 for annotations): titles repeat (a stat and a graph).
    id: u64,
    panel: &'static str,
    ref_id: &'static str,
    needs: Needs,
    why: &'static str,
}

/// Every query that shows nothing without a fault, and why. Annotations are listed as
/// panel `annotation: NAME`, id 0, ref `A`.
static QUIET: &[Quiet] = &[
    Quiet {
        dashboard: "cluster-overview.json",
        id: 15,
        panel: "XID rate by code",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "XID counters appear with the first XID (kernel log: XID 13 and 79)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 16,
        panel: "Fatal XIDs by node (last hour)",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "only fatal XIDs (kernel log: XID 79)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 17,
        panel: "Hardware and kernel events by kind",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "event counters appear with the first event (XIDs, thermal)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 21,
        panel: "GPUs throttling for heat per node",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "only throttling GPUs (NVML: sw_thermal_slowdown on GPU 2)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 22,
        panel: "Collectors down",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "the time series shows down collectors only (NVML hangs past its call timeout)",
    },
    Quiet {
        dashboard: "node.json",
        id: 11,
        panel: "Throttle reasons active",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "only active reasons (NVML: sw_thermal_slowdown on GPU 2)",
    },
    Quiet {
        dashboard: "node.json",
        id: 21,
        panel: "XIDs by GPU and code",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "XID counters appear with the first XID (kernel log: XID 13 and 79)",
    },
    Quiet {
        dashboard: "node.json",
        id: 22,
        panel: "Hardware and kernel events",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "event counters appear with the first event (XIDs, thermal)",
    },
    Quiet {
        dashboard: "warden.json",
        id: 6,
        panel: "Rejected batches and gaps",
        ref_id: "A",
        needs: Needs::AgentFault,
        why: "rejection counters appear with the first rejection (a malformed batch posted)",
    },
    Quiet {
        dashboard: "warden.json",
        id: 13,
        panel: "Detection latency p50 / p95 by kind",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "a quantile of nothing is NaN until incidents open",
    },
    Quiet {
        dashboard: "warden.json",
        id: 13,
        panel: "Detection latency p50 / p95 by kind",
        ref_id: "B",
        needs: Needs::DemoFault,
        why: "a quantile of nothing is NaN until incidents open",
    },
    Quiet {
        dashboard: "warden.json",
        id: 18,
        panel: "Diagnoses by source and result",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "diagnoses follow incidents with log lines (the demo's XIDs, the agent's XID 79)",
    },
    Quiet {
        dashboard: "warden.json",
        id: 19,
        panel: "Diagnosis duration p95",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "a quantile of nothing is NaN until an incident is diagnosed",
    },
    Quiet {
        dashboard: "job.json",
        id: 0,
        panel: "annotation: Incidents",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "marks open incidents",
    },
    Quiet {
        dashboard: "job.json",
        id: 0,
        panel: "annotation: NaN/Inf",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "marks open NaN incidents (the demo's NaN on rank 12)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 27,
        panel: "Drained nodes and owner",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "only drained nodes (the policy drains node-20 on the demo's fatal XID 79)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 28,
        panel: "Drained nodes by owner",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "only drained nodes (the policy drains node-20 on the demo's fatal XID 79)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 30,
        panel: "Nodes by health state",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "only nodes the ledger holds something against (the demo's straggler, XIDs)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 31,
        panel: "Repeat offenders",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "only nodes with incidents held against them (the demo's straggler, XIDs)",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 32,
        panel: "Mean time between incidents",
        ref_id: "A",
        needs: Needs::NotHere,
        why: "needs two incidents against one node; the demo has one per node",
    },
    Quiet {
        dashboard: "cluster-overview.json",
        id: 32,
        panel: "Mean time between incidents",
        ref_id: "B",
        needs: Needs::NotHere,
        why: "needs two incidents against one node; the demo has one per node",
    },
    Quiet {
        dashboard: "warden.json",
        id: 28,
        panel: "Job restart requested after detection p50 / p95",
        ref_id: "A",
        needs: Needs::DemoFault,
        why: "a quantile of nothing is NaN until the policy restarts a job (the demo's \
              fatal XIDs)",
    },
    Quiet {
        dashboard: "warden.json",
        id: 28,
        panel: "Job restart requested after detection p50 / p95",
        ref_id: "B",
        needs: Needs::DemoFault,
        why: "a quantile of nothing is NaN until the policy restarts a job (the demo's \
              fatal XIDs)",
    },
    Quiet {
        dashboard: "warden.json",
        id: 20,
        panel: "Log-window pulls and drops",
        ref_id: "A",
        needs: Needs::NotHere,
        why: "the demo diagnoses from the lines it holds and pulls no agent log windows \
              (the controller binary does)",
    },
    Quiet {
        dashboard: "warden.json",
        id: 21,
        panel: "LLM requests by outcome",
        ref_id: "A",
        needs: Needs::NotHere,
        why: "no LLM is configured",
    },
];

/// Prometheus's scrape interval here, and Grafana's `$__interval` and
/// `$__rate_interval` for it (max(interval + scrape, 4 x scrape)).
const SCRAPE_SECS: u64 = 1;
const GRAFANA_INTERVAL: &str = "1s";
const GRAFANA_RATE_INTERVAL: &str = "4s";

/// Virtual seconds per wall second for the demo. Its run lasts about 75 s at this speed
/// (the last of its faults ends the run a few seconds later), and its controller ticks
/// only while the run lasts (the API stays up after it, until the demo is stopped):
/// phase 2 posts to it after phase 1, which a loaded machine may stretch by tens of
/// seconds.
const DEMO_SPEED: &str = "6";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace")
        .to_path_buf()
}

fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Under CI a missing prerequisite fails the test; elsewhere it is skipped, loudly.
fn missing(what: &str) {
    assert!(!in_ci(), "{what}");
    eprintln!(
        "\n*** SKIPPING prometheus_live: {what} ***\n*** (under CI=true this is a failure) ***\n"
    );
}

/// `prometheus`, or why not.
fn prometheus_bin() -> Result<PathBuf, String> {
    let bin =
        std::env::var_os("PROMETHEUS").map_or_else(|| PathBuf::from("prometheus"), PathBuf::from);
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(bin),
        _ => Err(format!(
            "{} is not installed: apt-get install --no-install-recommends prometheus \
             (scripts/test installs it), or set PROMETHEUS to its path",
            bin.display()
        )),
    }
}

/// The `warden` binary: `WARDEN_BIN`, else the one next to this package's agent binary,
/// provided Cargo's dep-info shows it is not older than any of its sources.
fn warden_bin() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("WARDEN_BIN") {
        return Ok(bin.into());
    }
    let agent = Path::new(env!("CARGO_BIN_EXE_warden-agent"));
    let dir = agent.parent().expect("the agent binary's directory");
    let bin = dir.join(format!("warden{}", std::env::consts::EXE_SUFFIX));
    let build = "build it with `cargo build -p warden` (the profile of this test), run \
                 `cargo test --workspace`, or set WARDEN_BIN";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{} is missing ({e}): {build}", bin.display()))?;
    let deps = dep_info(&bin, dir)
        .map_err(|e| format!("{}: no dep-info ({e}): {build}", bin.display()))?;
    // First line `target: dep dep ...`, spaces in paths escaped with a backslash;
    // rustc's own dep-info names sources relative to the workspace root.
    let deps = deps.replace("\\ ", "\u{0}");
    let (_, list) = deps
        .lines()
        .next()
        .and_then(|l| l.split_once(": "))
        .ok_or_else(|| format!("{}: unreadable dep-info: {build}", bin.display()))?;
    let deps: Vec<PathBuf> = list
        .split_whitespace()
        .map(|d| repo().join(d.replace('\u{0}', " ")))
        .collect();
    // A target directory shared by several checkouts holds whichever built last.
    let main = repo().join("cli/src/main.rs");
    if !deps.contains(&main) {
        return Err(format!(
            "{} was built from another checkout (its sources do not include {}): {build}",
            bin.display(),
            main.display()
        ));
    }
    for dep in deps {
        let newer = std::fs::metadata(&dep)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > built);
        if newer {
            return Err(format!(
                "{} is older than {}: {build}",
                bin.display(),
                dep.display()
            ));
        }
    }
    Ok(bin)
}

/// Cargo's dep-info of `bin` in the target directory `dir`: that of the file in `deps/`
/// that `bin` is a hard link of (`cargo test` uplifts a binary so, without a dep-info
/// of its own beside it), else `warden.d` beside it (`cargo build` writes one).
fn dep_info(bin: &Path, dir: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata(bin)?;
    let stem = format!(
        "{}-",
        bin.file_name().and_then(|n| n.to_str()).unwrap_or("warden")
    );
    for entry in std::fs::read_dir(dir.join("deps"))?.flatten() {
        let path = entry.path();
        let linked = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&stem) && !n.contains('.'))
            && entry
                .metadata()
                .is_ok_and(|m| m.dev() == me.dev() && m.ino() == me.ino());
        if linked {
            return std::fs::read_to_string(path.with_extension("d"));
        }
    }
    std::fs::read_to_string(dir.join("warden.d"))
}

/// A child process whose output is kept (for failure messages) and which is killed
/// when dropped, also when the test panics.
struct Proc {
    name: &'static str,
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// Start `cmd` with its stdout and stderr read line by line into `output`; `watch`
    /// gets every stdout line.
    fn spawn(name: &'static str, mut cmd: Command, watch: Option<mpsc::Sender<String>>) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let output: Arc<Mutex<Vec<String>>> = Arc::default();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        Self::drain(stdout, output.clone(), watch);
        Self::drain(stderr, output.clone(), None);
        Proc {
            name,
            child,
            output,
        }
    }

    fn drain(
        from: impl Read + Send + 'static,
        into: Arc<Mutex<Vec<String>>>,
        watch: Option<mpsc::Sender<String>>,
    ) {
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { return };
                if let Some(w) = &watch {
                    let _ = w.send(line.clone());
                }
                let mut out = into.lock().unwrap_or_else(|p| p.into_inner());
                out.push(line);
                // Keep the tail only.
                if out.len() > 400 {
                    out.drain(..200);
                }
            }
        });
    }

    /// The last lines it printed.
    fn tail(&self) -> String {
        let out = self.output.lock().unwrap_or_else(|p| p.into_inner());
        let from = out.len().saturating_sub(40);
        format!(
            "--- {} (last lines) ---\n{}",
            self.name,
            out[from..].join("\n")
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encoding for a query-string value.
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// A span of time to evaluate queries over (unix seconds).
#[derive(Debug, Clone, Copy)]
struct Window {
    start: f64,
    end: f64,
}

/// The Prometheus HTTP API.
struct Prom {
    port: u16,
}

impl Prom {
    /// `data` of a successful API answer, or the error.
    fn api(&self, path: &str) -> Result<Json, String> {
        let body = http_get(self.port, path).ok_or_else(|| format!("no answer to {path}"))?;
        let json: Json = serde_json::from_str(&body).map_err(|e| format!("{path}: {e}: {body}"))?;
        if json["status"] != "success" {
            return Err(format!("{path}: {body}"));
        }
        Ok(json["data"].clone())
    }

    /// Whether `promql` has a sample with a finite value anywhere in `w`.
    fn has_data(&self, promql: &str, w: Window) -> Result<bool, String> {
        let path = format!(
            "/api/v1/query_range?query={}&start={:.3}&end={:.3}&step={SCRAPE_SECS}",
            enc(promql),
            w.start,
            w.end
        );
        let data = self.api(&path)?;
        let series = data["result"]
            .as_array()
            .ok_or_else(|| format!("{promql}: no result list: {data}"))?;
        Ok(series.iter().any(|s| {
            s["values"].as_array().into_iter().flatten().any(|v| {
                v[1].as_str()
                    .and_then(|x| x.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            })
        }))
    }

    /// `label_values(selector, label)` as Grafana asks for it.
    fn label_values(&self, label: &str, selector: Option<&str>, w: Window) -> Vec<String> {
        let mut path = format!(
            "/api/v1/label/{label}/values?start={:.3}&end={:.3}",
            w.start, w.end
        );
        if let Some(sel) = selector {
            path.push_str(&format!("&match[]={}", enc(sel)));
        }
        let data = self
            .api(&path)
            .unwrap_or_else(|e| panic!("label_values({selector:?}, {label}): {e}"));
        data.as_array()
            .expect("label values are a list")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }
}

/// One query of a dashboard (shared with the promtool checks).
use dashboard_queries::Query as Target;

impl Target {
    fn name(&self) -> String {
        format!(
            "{}: panel {} {:?} ({}): {}",
            self.dashboard, self.id, self.panel, self.ref_id, self.expr
        )
    }

    fn quiet(&self) -> Option<&'static Quiet> {
        QUIET.iter().find(|q| {
            q.dashboard == self.dashboard
                && q.id == self.id
                && q.panel == self.panel
                && q.ref_id == self.ref_id
        })
    }
}

/// A query variable of a dashboard.
#[derive(Debug, Clone)]
struct Variable {
    name: String,
    query: String,
    include_all: bool,
    all_value: Option<String>,
}

struct Dashboard {
    file: String,
    targets: Vec<Target>,
    variables: Vec<Variable>,
    /// Text box, constant and custom variables, at their defaults.
    fixed: BTreeMap<String, String>,
}

fn dashboards() -> Vec<Dashboard> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("dashboards"))
        .expect("dashboards/")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards");
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read a dashboard");
            let d: Json = serde_json::from_str(&text).expect("a dashboard is JSON");
            let file = path
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let targets = dashboard_queries::queries(&file, &d);
            let variables = d["templating"]["list"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| v["type"] == "query")
                .map(|v| Variable {
                    name: v["name"].as_str().expect("variable name").to_owned(),
                    query: v["query"]["query"]
                        .as_str()
                        .or_else(|| v["query"].as_str())
                        .expect("variable query")
                        .to_owned(),
                    include_all: v["includeAll"].as_bool().unwrap_or(false),
                    all_value: v["allValue"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                })
                .collect();
            let fixed = d["templating"]["list"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| matches!(v["type"].as_str(), Some("textbox" | "constant" | "custom")))
                .map(|v| {
                    let name = v["name"].as_str().expect("variable name").to_owned();
                    let value = v["current"]["value"]
                        .as_str()
                        .or_else(|| v["query"].as_str())
                        .unwrap_or_else(|| panic!("{file}: variable {name} has no default"))
                        .to_owned();
                    (name, value)
                })
                .collect();
            Dashboard {
                file,
                targets,
                variables,
                fixed,
            }
        })
        .collect()
}

/// `text` with Grafana's variables (`$name`, `${name}`) replaced from `values`.
fn substitute(text: &str, values: &BTreeMap<String, String>, w: Window) -> String {
    let range = format!("{}s", (w.end - w.start).ceil().max(1.0));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(inner) => {
                let end = inner.find('}').expect("`${` without `}`");
                (&inner[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let value = match name {
            "__interval" => GRAFANA_INTERVAL.to_owned(),
            "__rate_interval" => GRAFANA_RATE_INTERVAL.to_owned(),
            "__range" => range.clone(),
            _ => values
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("variable ${name} has no value here: {text}")),
        };
        out.push_str(&value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Every assignment of the dashboard's query variables Grafana offers, resolved in
/// order (a variable's query may use the ones before it). A variable with "All" takes
/// "All" (the regex of every value, or its `allValue`), as Grafana selects it first.
fn assignments(prom: &Prom, d: &Dashboard, w: Window) -> Vec<BTreeMap<String, String>> {
    let mut out = vec![d.fixed.clone()];
    for v in &d.variables {
        let mut next = Vec::new();
        for a in &out {
            let q = substitute(&v.query, a, w);
            let inner = q
                .trim()
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{}: variable {}: {q}", d.file, v.name));
            let values = match inner.rsplit_once(',') {
                Some((sel, label)) => prom.label_values(label.trim(), Some(sel.trim()), w),
                None => prom.label_values(inner.trim(), None, w),
            };
            if v.include_all && !values.is_empty() {
                let all = v.all_value.clone().unwrap_or_else(|| {
                    let escaped: Vec<String> = values.iter().map(|s| regex_escape(s)).collect();
                    format!("({})", escaped.join("|"))
                });
                let mut a = a.clone();
                a.insert(v.name.clone(), all);
                next.push(a);
            } else {
                for value in values {
                    let mut a = a.clone();
                    a.insert(v.name.clone(), value);
                    next.push(a);
                }
            }
        }
        out = next;
    }
    out
}

fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push_str("\\\\");
        }
        out.push(c);
    }
    out
}

/// Whether `t` returns data in `w` for some assignment of its dashboard's variables;
/// `Err` names what was tried.
fn evaluate(prom: &Prom, d: &Dashboard, t: &Target, w: Window) -> Result<(), String> {
    let mut tried = Vec::new();
    let assignments = assignments(prom, d, w);
    if assignments.is_empty() {
        return Err(format!("{}: a variable has no values", t.name()));
    }
    for a in &assignments {
        let q = substitute(&t.expr, a, w);
        match prom.has_data(&q, w) {
            Ok(true) => return Ok(()),
            Ok(false) => tried.push(q),
            Err(e) => return Err(format!("{}: {e}", t.name())),
        }
    }
    Err(format!(
        "{}\n      evaluated as: {}",
        t.name(),
        tried.join(" | ")
    ))
}

/// The targets among `which` that have no data in `w`.
fn without_data<'a>(
    prom: &Prom,
    all: &'a [Dashboard],
    which: impl Fn(&Target) -> bool,
    w: Window,
) -> Vec<(&'a Target, String)> {
    let mut out = Vec::new();
    for d in all {
        for t in d.targets.iter().filter(|t| which(t)) {
            if let Err(e) = evaluate(prom, d, t, w) {
                out.push((t, e));
            }
        }
    }
    out
}

/// Poll until every target in `which` has data in [start, now], or `limit` passes;
/// what still has none. A round asks Prometheus hundreds of queries: at most one round
/// a second.
fn wait_for_data<'a>(
    prom: &Prom,
    all: &'a [Dashboard],
    which: impl Fn(&Target) -> bool + Copy,
    start: f64,
    limit: Duration,
) -> Vec<(&'a Target, String)> {
    let mut left = Vec::new();
    let mut last_round: Option<Instant> = None;
    poll(limit, || {
        if last_round.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        last_round = Some(Instant::now());
        let w = Window {
            start,
            end: unix_now(),
        };
        left = without_data(prom, all, which, w);
        left.is_empty().then_some(())
    });
    left
}

/// The Prometheus configuration: the shipped scrape excerpt with its targets pointed at
/// the demo and the agent, a 1 s scrape interval and the shipped alert rules.
fn prometheus_config(controller: &str, agent: &str) -> String {
    let path = repo().join("dashboards/provisioning/prometheus-scrape.yaml");
    let text = std::fs::read_to_string(&path).expect("the scrape excerpt");
    let mut doc: Json = warden_model::yaml::from_str(&text).expect("the scrape excerpt is YAML");
    let jobs = doc["scrape_configs"]
        .as_array_mut()
        .expect("scrape_configs in the excerpt");
    let mut names = Vec::new();
    for job in jobs.iter_mut() {
        let name = job["job_name"].as_str().expect("job_name").to_owned();
        let target = match name.as_str() {
            "warden-controller" => controller,
            "warden-agent" => agent,
            other => panic!("the excerpt has a job the test does not know: {other}"),
        };
        job["static_configs"] = serde_json::json!([{"targets": [target]}]);
        names.push(name);
    }
    names.sort();
    assert_eq!(names, ["warden-agent", "warden-controller"], "scrape jobs");
    let rules = repo().join("rules/prometheus/warden-alerts.yaml");
    doc["rule_files"] = serde_json::json!([rules.display().to_string()]);
    let every = format!("{SCRAPE_SECS}s");
    doc.as_object_mut()
        .expect("the excerpt is a mapping")
        .insert(
            "global".into(),
            serde_json::json!({
                "scrape_interval": every,
                "scrape_timeout": every,
                "evaluation_interval": every,
            }),
        );
    serde_saphyr::to_string(&doc).expect("yaml")
}

/// `POST /api/v1/ingest` with a body that is no batch; the HTTP status line.
fn post_garbage(addr: &str) -> Result<String, String> {
    let mut s = std::net::TcpStream::connect(addr)
        .map_err(|e| format!("cannot reach the demo's API at {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "POST /api/v1/ingest HTTP/1.0\r\nHost: x\r\n\
         Content-Type: application/vnd.warden.batch\r\nContent-Length: 4\r\n\r\nnope"
    )
    .map_err(|e| format!("posting to the demo: {e}"))?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.lines().next().unwrap_or_default().to_owned();
    if status.contains(" 400 ") {
        Ok(status)
    } else {
        Err(format!(
            "the demo answered a malformed batch with {status:?}"
        ))
    }
}

fn agent_config(dir: &Path, lib: &Path, port: u16, controller: &str) -> PathBuf {
    let kmsg = dir.join("kern.log");
    std::fs::write(
        &kmsg,
        "[    1.000000] Linux version 6.1.0 (test)\n[    2.000000] nvidia: loading out-of-tree module\n",
    )
    .expect("kernel log");
    let boot = dir.join("boot_id");
    std::fs::write(&boot, "boot-live\n").expect("boot id");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let path = dir.join("agent.yaml");
    std::fs::write(
        &path,
        format!(
            "node_name: gpu-node-live\nlisten: 127.0.0.1:{port}\n\
             controller:\n  url: http://{controller}\n  flush_interval_ms: 500\n\
             nvml:\n  library: {}\n  interval_ms: 500\n\
             kmsg:\n  path: {}\n  boot_id_path: {}\n\
             capture:\n  socket: {}\n\
             logs:\n  sources:\n    - paths: [\"{}/*.log\"]\n      job: live-train\n      rank: 0\n  \
             start_at: beginning\n  rescan_interval_ms: 500\n  partial_flush_ms: 200\n",
            lib.display(),
            kmsg.display(),
            boot.display(),
            dir.join("capture.sock").display(),
            logs.display()
        ),
    )
    .expect("agent config");
    path
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn megatron_line(step: u32) -> String {
    format!(
        " iteration {step:>8}/  500000 | consumed samples: {:>12} | elapsed time per iteration (ms): 412.3 | \
         learning rate: 2.999E-04 | global batch size:  1024 | lm loss: 2.534100E+00 | loss scale: 1.0 | \
         grad norm: 0.912 | number of skipped iterations:   0 | number of nan iterations:   0 |\n",
        step * 1024
    )
}

#[test]
fn every_dashboard_query_returns_data_from_a_live_prometheus() {
    let began = Instant::now();
    let prometheus = match prometheus_bin() {
        Ok(p) => p,
        Err(e) => return missing(&e),
    };
    let warden = match warden_bin() {
        Ok(p) => p,
        Err(e) => return missing(&e),
    };
    let all = dashboards();
    // Every listed query exists.
    for q in QUIET {
        assert!(
            all.iter()
                .flat_map(|d| &d.targets)
                .any(|t| t.quiet().is_some_and(|found| std::ptr::eq(found, q))),
            "QUIET lists {} panel {} {:?} ({}), which no dashboard has",
            q.dashboard,
            q.id,
            q.panel,
            q.ref_id
        );
    }
    let dir = tempfile::tempdir().expect("temporary directory");

    // The demo, on a port of its choosing, read from its banner.
    let (tx, rx) = mpsc::channel();
    let mut cmd = Command::new(&warden);
    cmd.args(["demo", "--listen", "127.0.0.1:0", "--speed", DEMO_SPEED]);
    let demo = Proc::spawn("warden demo", cmd, Some(tx));
    let demo_addr = {
        let deadline = Instant::now() + scaled(PATIENCE);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.split("served on http://").nth(1) {
                        break rest
                            .split_whitespace()
                            .next()
                            .expect("an address after `served on`")
                            .to_owned();
                    }
                }
                Err(_) => panic!("the demo did not say where it serves\n{}", demo.tail()),
            }
        }
    };

    // The agent on 8 fake GPUs, shipping to the demo.
    let node = fake_nvml::FakeNode::new(&[]);
    node.set("gpus", 8);
    node.set("gpu.*.temp", 55);
    node.set("gpu.*.util_gpu", 93);
    node.set("gpu.*.util_mem", 41);
    node.set("gpu.*.power_mw", 610_000);
    node.set("gpu.*.mem_used", 60u64 << 30);
    let agent_port = free_port();
    let cfg = agent_config(dir.path(), node.lib_path(), agent_port, &demo_addr);
    let train_log = dir.path().join("logs/rank_0.log");
    append(&train_log, &(1..=3).map(megatron_line).collect::<String>());
    let agent = AgentProc::start(&cfg, agent_port);

    // Prometheus.
    let prom_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        prometheus_config(&demo_addr, &format!("127.0.0.1:{agent_port}")),
    )
    .expect("prometheus config");
    let mut cmd = Command::new(&prometheus);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .arg("--log.level=warn");
    let prom_proc = Proc::spawn("prometheus", cmd, None);
    let prom = Prom { port: prom_port };
    let context = |what: &str| {
        format!(
            "{what}\n{}\n{}\nPrometheus config:\n{}",
            demo.tail(),
            prom_proc.tail(),
            std::fs::read_to_string(&config).unwrap_or_default()
        )
    };
    let ready = poll(PATIENCE, || {
        http_get(prom_port, "/-/ready")
            .is_some_and(|b| b.contains("Ready"))
            .then_some(())
    });
    assert!(
        ready.is_some(),
        "{}",
        context("Prometheus did not get ready")
    );
    let start = unix_now();

    // Both targets up: each scraped once at least.
    let mut health: Vec<(String, String)> = Vec::new();
    let up = poll(PATIENCE, || {
        let targets = prom.api("/api/v1/targets?state=active").unwrap_or_default();
        health = targets["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["labels"]["job"].as_str().unwrap_or_default().to_owned(),
                    t["health"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        (health.len() == 2 && health.iter().all(|(_, h)| h == "up")).then_some(())
    });
    assert!(
        up.is_some(),
        "{}",
        context(&format!("targets not up: {health:?}"))
    );

    // Phase 1: a healthy node. Every query not listed returns data (rate windows fill
    // after a few scrapes: wait for it); the queries listed for agent faults return
    // none, checked once every other query has data.
    let healthy = |t: &Target| t.quiet().is_none();
    let no_data = wait_for_data(&prom, &all, healthy, start, PATIENCE);
    let fault_at = unix_now();
    let before = Window {
        start,
        end: fault_at,
    };
    let mut failures: Vec<String> = no_data
        .iter()
        .map(|(_, e)| format!("no data on a healthy node: {e}"))
        .collect();
    for d in &all {
        for t in &d.targets {
            if t.quiet().is_some_and(|q| q.needs == Needs::AgentFault)
                && evaluate(&prom, d, t, before).is_ok()
            {
                failures.push(format!(
                    "listed in QUIET as needing a fault, but returns data on a healthy node: {}",
                    t.name()
                ));
            }
        }
    }
    // What follows would only add noise (and the demo may have ended meanwhile).
    assert!(
        failures.is_empty(),
        "{}",
        context(&format!(
            "{} dashboard queries fail on a healthy node:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    );

    // Phase 2: faults on the node and at the ingest.
    node.set("gpu.2.throttle", throttle::SW_THERMAL_SLOWDOWN);
    node.set("gpu.2.temp", 96);
    append(
        &dir.path().join("kern.log"),
        "[ 5000.000001] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics SM \
         Warp Exception on (GPC 1, TPC 0, SM 1): Illegal Instruction Encoding\n\
         [ 5000.000002] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, \
         GPU has fallen off the bus.\n",
    );
    if let Err(e) = post_garbage(&demo_addr) {
        panic!("{}", context(&e));
    }
    // The NVML collector goes down once the throttling GPU has been scraped: NVML then
    // takes longer than the agent's call timeout (5 s).
    let throttled = |t: &Target| t.panel == "GPUs throttling for heat per node";
    let left = wait_for_data(&prom, &all, throttled, fault_at, PATIENCE);
    assert!(
        left.is_empty(),
        "{}",
        context("the throttling GPU never showed")
    );
    node.set("delay_ms", 6000);
    if let Err(e) = post_garbage(&demo_addr) {
        panic!("{}", context(&e));
    }

    let agent_fault = |t: &Target| t.quiet().is_some_and(|q| q.needs == Needs::AgentFault);
    for (_, e) in wait_for_data(&prom, &all, agent_fault, fault_at, PATIENCE) {
        failures.push(format!("no data after the fault was injected: {e}"));
    }
    // The demo's faults come on its own clock, the last about 70 s after its start.
    let demo_fault = |t: &Target| t.quiet().is_some_and(|q| q.needs == Needs::DemoFault);
    for (_, e) in wait_for_data(&prom, &all, demo_fault, start, PATIENCE * 2) {
        failures.push(format!("no data after the demo's faults: {e}"));
    }
    let whole = Window {
        start,
        end: unix_now(),
    };
    for d in &all {
        for t in &d.targets {
            if let Some(q) = t.quiet().filter(|q| q.needs == Needs::NotHere)
                && evaluate(&prom, d, t, whole).is_ok()
            {
                failures.push(format!(
                    "listed in QUIET as impossible here ({}), but returns data: {}",
                    q.why,
                    t.name()
                ));
            }
        }
    }

    // The shipped alert rules evaluate without errors against live data, once each has
    // been evaluated (a rule not yet evaluated has health "unknown").
    let mut rules = Json::Null;
    let evaluated = poll(PATIENCE, || {
        rules = prom.api("/api/v1/rules").ok()?;
        let pending = rules["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .any(|r| r["health"] == "unknown");
        (!pending).then_some(())
    });
    assert!(
        evaluated.is_some(),
        "{}",
        context(&format!("alert rules never all evaluated: {rules}"))
    );
    let mut rule_count = 0;
    for g in rules["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            rule_count += 1;
            if r["health"] != "ok" {
                failures.push(format!(
                    "alert rule {} evaluates with {}: {}",
                    r["name"], r["health"], r["lastError"]
                ));
            }
        }
    }
    assert!(rule_count > 10, "only {rule_count} rules loaded");

    assert!(
        failures.is_empty(),
        "{}",
        context(&format!(
            "{} dashboard queries fail (a query in QUIET needs a reason and a fault):\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    );
    drop(agent);
    eprintln!(
        "prometheus_live: {} queries in {} dashboards checked in {:.1} s",
        all.iter().map(|d| d.targets.len()).sum::<usize>(),
        all.len(),
        began.elapsed().as_secs_f64()
    );
}
