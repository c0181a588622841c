//! `warden demo`: a simulated job with a scripted fault mix, paced in virtual time,
//! feeding an in-process controller whose API is served while it runs and after, until
//! Ctrl-C (`--exit-when-done`: not after); incidents are printed as they open, change
//! and resolve, and each node the node-health ledger takes out is followed through its
//! health check (answered by the simulator, which knows whether the node's GPUs
//! recover) until it returns or is marked bad. The job's checkpoints are written as
//! PyTorch DCP directories as each save completes, and a restart resumes from the
//! latest.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use warden_controller::SharedEngine;
use warden_controller::api::{self, ApiState, DEFAULT_MAX_BATCH_BYTES};
use warden_controller::auth::Auth;
use warden_controller::diagnosis;
use warden_controller::metrics::Metrics;
use warden_controller::operate::Operator;
use warden_controller::persist::Persister;
use warden_controller::remedy::CheckOutcome;
use warden_controller::remedy::run::{Remediator, RemedyConfig};
use warden_controller::remedy::verify::{SimulatedCheck, VerifyConfig};
use warden_controller::store::Store;
use warden_diagnosis::rules::RuleSet;
use warden_engine::{Change, Clock, Engine, EngineConfig, ManualClock};
use warden_model::view::IncidentView;
use warden_model::{IncidentState, Timestamp};
use warden_sim::{Progress, RunOptions, SIM_EPOCH, Scenario, Simulation};

use crate::{DemoArgs, EXIT_USAGE, show};

/// `print!` for the demo, which must not end before its data directory is removed: when
/// stdout cannot be written (its reader went away), the demo stops at its next step and
/// exits 0 (`warden_config::stdout::print_or_mark`).
macro_rules! demo_out {
    ($($arg:tt)*) => {
        warden_config::stdout::print_or_mark(format_args!($($arg)*), false)
    };
}

/// `println!` for the demo (see `demo_out!`).
macro_rules! demo_outln {
    () => {
        warden_config::stdout::print_or_mark(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        warden_config::stdout::print_or_mark(format_args!($($arg)*), true)
    };
}

/// The built-in scenario.
const DEMO_SCENARIO: &str = include_str!("demo.yaml");

/// Wall-clock time between two advances of the simulation.
const STEP_WALL: Duration = Duration::from_millis(100);

/// How long a quarantined node waits for its health check, virtual time.
const VERIFY_AFTER: Duration = Duration::from_secs(60);

/// The most virtual time the demo runs on after the job stops, for health checks.
const TAIL_SECS: f64 = 600.0;

/// How long the API server gets to finish in-flight requests at the end.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Run `warden demo`.
pub fn main(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if !(args.speed.is_finite() && args.speed > 0.0) {
        eprintln!(
            "warden demo: --speed must be a positive number, got {}",
            args.speed
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let loaded = match &args.scenario {
        Some(path) => Scenario::load(path),
        None => Scenario::from_yaml(DEMO_SCENARIO, "demo"),
    };
    let scenario = match loaded {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warden demo: invalid scenario: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(args, scenario))
}

/// The API server while it runs.
struct Server {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn run(args: DemoArgs, scenario: Scenario) -> anyhow::Result<ExitCode> {
    let engine = SharedEngine::new(Engine::new(EngineConfig::default(), SIM_EPOCH));
    let clock = Arc::new(ManualClock::new(SIM_EPOCH));
    // The embedded store, in a directory of this run's own, removed at the end.
    let data = tempfile::Builder::new()
        .prefix("warden-demo-")
        .tempdir()
        .context("making the demo's data directory")?;
    let store = Store::open_dir(data.path())
        .await
        .context("opening the demo's SQLite store")?;
    let metrics = Arc::new(Metrics::new(env!("CARGO_PKG_VERSION")).context("setting up metrics")?);
    // The job saves its checkpoints here, one directory per job, as a real one would;
    // a restart resumes from the latest complete one.
    let checkpoints = data.path().join("checkpoints");
    // Remediation acts under the shipped policy and its rails; the simulated cluster has
    // no scheduler, so Warden's own node table is where its drains show.
    // A quarantined node's health check is answered by the simulator: it knows
    // whether the node's GPUs come back after a reset.
    let truth = scenario.clone();
    let check = SimulatedCheck(Arc::new(move |node: &str| {
        if truth.passes_health_check(node) {
            CheckOutcome::Passed("every GPU answers after a reset".to_owned())
        } else {
            CheckOutcome::Failed("a GPU does not answer after a reset".to_owned())
        }
    }));
    let remedy = Remediator::new(
        RemedyConfig {
            dry_run: false,
            checkpoint_dir: Some(format!("{}/{{job}}", checkpoints.display())),
            verify: VerifyConfig {
                enabled: true,
                after: VERIFY_AFTER,
                ..VerifyConfig::default()
            },
            ..RemedyConfig::default()
        },
        engine.clone(),
        store.clone(),
        Some(metrics.clone()),
        clock.clone(),
    )
    .await
    .context("setting up remediation")?
    .with_simulated_check(check);
    let mut health = HealthShown::default();
    let operator = Operator {
        remedy: Some(remedy.clone()),
        engine: engine.clone(),
        persister: Arc::new(tokio::sync::Mutex::new(Persister::new(store.clone()))),
        store,
        alerts: None,
        leadership: warden_controller::leader::Leadership::solo(),
        metrics: None,
    };

    let mut server = None;
    let mut api_addr = None;
    if !args.no_api {
        let listener = match TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "warden demo: cannot serve the API on {}: {e}.\n\
                     Another process (perhaps another warden) may hold the port. Pass \
                     --listen 127.0.0.1:0 to use any free port, or --no-api to run without \
                     the API.",
                    args.listen
                );
                return Ok(ExitCode::FAILURE);
            }
        };
        let addr = listener.local_addr().context("reading the bound address")?;
        let state = ApiState {
            engine: engine.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            auth: Arc::new(Auth::Open),
            operator: operator.clone(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, api::router(state))
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        server = Some(Server { stop, task });
        api_addr = Some(addr);
    }

    print_banner(&scenario, args.speed, api_addr);

    let rules = RuleSet::builtin().context("loading the shipped log rules")?;
    let mut sim = Simulation::new(&scenario, RunOptions::default());
    let mut saver = CheckpointSaver::new(checkpoints.join(&scenario.job.name));
    let mut sink = engine.engine();
    let mut status = Status::new(std::io::stderr().is_terminal());
    let started = Instant::now();
    let mut pace = tokio::time::interval(STEP_WALL);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut interrupted = false;

    while !sim.done() {
        tokio::select! {
            _ = pace.tick() => {}
            _ = &mut ctrl_c => {
                interrupted = true;
                break;
            }
        }
        let target = started.elapsed().as_secs_f64() * args.speed;
        let mut changes = sim.advance(&mut sink, target);
        clock.set(SIM_EPOCH.plus_secs(sim.now()));
        diagnose_opened(&engine, &rules, &metrics, &mut changes, clock.now());
        // What happened in this advance, in the order it happened.
        let mut lines = saver.save(&sim);
        let mut acted = Vec::new();
        match remedy.pass(clock.now()).await {
            Ok(report) => {
                changes.extend(report.changes);
                acted = report.acted;
            }
            Err(e) => eprintln!("warden demo: remediation failed: {e}"),
        }
        if let Err(e) = operator
            .persister
            .lock()
            .await
            .sync(&engine, clock.now())
            .await
        {
            eprintln!("warden demo: cannot write incidents to the store: {e}");
        }

        let (shown, open) = {
            let e = engine.lock();
            let shown: Vec<(Change, IncidentView)> = changes
                .iter()
                // Updates (new evidence) are frequent; show what a person acts on.
                .filter(|c| c.change != Change::Updated)
                .filter_map(|c| {
                    e.incident(&c.id)
                        .map(|inc| (c.change, IncidentView::new(inc, e.origin())))
                })
                .collect();
            (shown, open_incidents(&e))
        };
        for (change, view) in &shown {
            let did = acted.contains(&view.id);
            lines.push((
                show::change_at(*change, view),
                show::incident(*change, view, did),
            ));
        }
        lines.extend(health.lines(&engine));
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (_, text) in lines {
            status.clear();
            demo_out!("{text}");
        }
        let _ = std::io::stdout().flush();
        if warden_config::stdout::gone() {
            // Nobody reads the incidents any more: stop as if finished.
            break;
        }
        status.update(&sim.progress(), open);
    }
    status.finish(&sim.progress(), open_incidents(&engine.lock()));
    if !interrupted && !warden_config::stdout::gone() {
        interrupted = follow_checks(
            &engine,
            &remedy,
            &operator,
            &clock,
            &mut health,
            &mut status,
            args.speed,
        )
        .await;
    }

    let wall = started.elapsed().as_secs_f64();
    print_summary(&sim, &engine, wall, interrupted);
    match operator.store.actions(None, None, 0).await {
        Ok(actions) => demo_out!("{}", show::actions(&actions, engine.lock().origin())),
        Err(e) => eprintln!("warden demo: cannot read the actions taken: {e}"),
    }

    if let (Some(addr), false) = (api_addr, interrupted || args.exit_when_done) {
        serve_until_ctrl_c(addr).await;
    }
    if let Some(Server { stop, task }) = server {
        let _ = stop.send(());
        match tokio::time::timeout(SHUTDOWN_GRACE, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("warden demo: the API server failed: {e}"),
            Ok(Err(e)) => eprintln!("warden demo: the API server task failed: {e}"),
            Err(_) => eprintln!("warden demo: the API server did not stop within 5 s"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// After the run: say where the API is and wait for Ctrl-C (or for stdout to go, which
/// says nobody is there to press it).
async fn serve_until_ctrl_c(addr: std::net::SocketAddr) {
    let base = format!("http://{addr}");
    demo_outln!();
    demo_outln!(
        "The run is over; the controller API stays up on {base} until Ctrl-C \
         (--exit-when-done: exit here). Try:"
    );
    demo_outln!("  curl -s {base}/api/v1/incidents");
    demo_outln!("  warden incidents list --server {base}");
    let _ = std::io::stdout().flush();
    if warden_config::stdout::gone() {
        return;
    }
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("warden demo: cannot wait for Ctrl-C ({e}); stopping now");
    }
}

/// Writes the simulated job's checkpoints as they complete: PyTorch Distributed
/// Checkpoint directories (`step_N/` with a data file and `.metadata`, written last), as
/// the controller's checkpoint reader finds a real job's.
struct CheckpointSaver {
    dir: PathBuf,
    saved: usize,
}

impl CheckpointSaver {
    fn new(dir: PathBuf) -> Self {
        CheckpointSaver { dir, saved: 0 }
    }

    /// Write the checkpoints completed since the last call; a line for each (its time,
    /// seconds since the start, and its text ending in a newline).
    fn save(&mut self, sim: &Simulation) -> Vec<(f64, String)> {
        let done = sim.checkpoints();
        let mut lines = Vec::new();
        for &(step, at) in done.iter().skip(self.saved) {
            let path = self.dir.join(format!("step_{step}"));
            match write_dcp(&path, step) {
                Ok(()) => lines.push((
                    at,
                    format!(
                        "[{at:>7.1}s] CHECKPOINT step {step} saved by every rank ({})\n",
                        path.display()
                    ),
                )),
                Err(e) => eprintln!(
                    "warden demo: cannot write checkpoint {}: {e}",
                    path.display()
                ),
            }
        }
        self.saved = done.len();
        lines
    }
}

/// A small DCP checkpoint of `step` at `path`: the data file first, `.metadata` last.
fn write_dcp(path: &Path, step: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::write(
        path.join("__0_0.distcp"),
        format!("warden demo checkpoint, step {step}\n"),
    )?;
    std::fs::write(path.join(".metadata"), format!("step {step}\n"))
}

/// The node-health ledger's state changes printed so far, per node.
#[derive(Default)]
struct HealthShown {
    seen: std::collections::BTreeMap<String, usize>,
}

impl HealthShown {
    /// The ledger's state changes not shown yet: each one's time (seconds since the
    /// start) and its line, ending in a newline.
    fn lines(&mut self, engine: &SharedEngine) -> Vec<(f64, String)> {
        let e = engine.lock();
        let origin = e.origin();
        let mut lines = Vec::new();
        for n in e.ledger().nodes() {
            let seen = self.seen.entry(n.node.clone()).or_default();
            for t in n.history.iter().skip(*seen) {
                let at = warden_model::view::rel(t.at, origin);
                lines.push((
                    at,
                    format!(
                        "[{at:>7.1}s] NODE {} {} -> {}: {}\n",
                        n.node,
                        t.from.as_str(),
                        t.to.as_str(),
                        t.reason
                    ),
                ));
            }
            *seen = n.history.len();
        }
        lines
    }

    /// Print the ledger's state changes not printed yet.
    fn print(&mut self, engine: &SharedEngine, status: &mut Status) {
        for (_, line) in self.lines(engine) {
            status.clear();
            demo_out!("{line}");
        }
    }
}

/// After the job stopped: run remediation on in virtual time until no node waits for
/// or runs a health check (at most [`TAIL_SECS`]), printing the ledger's changes.
/// Returns whether Ctrl-C interrupted it.
async fn follow_checks(
    engine: &SharedEngine,
    remedy: &Remediator,
    operator: &Operator,
    clock: &ManualClock,
    health: &mut HealthShown,
    status: &mut Status,
    speed: f64,
) -> bool {
    let pending = || {
        engine.lock().ledger().nodes().any(|n| {
            matches!(
                n.state,
                warden_engine::ledger::HealthState::Quarantined
                    | warden_engine::ledger::HealthState::Verifying
            )
        })
    };
    if !pending() {
        return false;
    }
    demo_outln!(
        "The job stopped; remediation goes on: the nodes taken out wait for their health check."
    );
    let start = clock.now();
    let started = Instant::now();
    let mut pace = tokio::time::interval(STEP_WALL);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while pending() {
        tokio::select! {
            _ = pace.tick() => {}
            _ = &mut ctrl_c => return true,
        }
        let ahead = (started.elapsed().as_secs_f64() * speed).min(TAIL_SECS);
        clock.set(start.plus_secs(ahead));
        if let Err(e) = remedy.pass(clock.now()).await {
            eprintln!("warden demo: remediation failed: {e}");
        }
        if let Err(e) = operator
            .persister
            .lock()
            .await
            .sync(engine, clock.now())
            .await
        {
            eprintln!("warden demo: cannot write to the store: {e}");
        }
        health.print(engine, status);
        if ahead >= TAIL_SECS || warden_config::stdout::gone() {
            break;
        }
    }
    false
}

/// Diagnose each newly opened incident from the log lines the controller holds (the
/// simulated cluster has no agents to pull windows from) and note the diagnosis as a
/// change of its own. Counted in `metrics` as the controller's diagnosis worker counts
/// its own (`warden_diagnoses_total`, `warden_diagnosis_duration_seconds`).
fn diagnose_opened(
    engine: &SharedEngine,
    rules: &RuleSet,
    metrics: &Metrics,
    changes: &mut Vec<warden_engine::IncidentChange>,
    now: Timestamp,
) {
    let opened: Vec<String> = changes
        .iter()
        .filter(|c| c.change == Change::Opened)
        .map(|c| c.id.clone())
        .collect();
    let mut e = engine.lock();
    for id in opened {
        let Some(req) = e.diagnosis_request(&id) else {
            continue;
        };
        if req.held.is_empty() {
            continue;
        }
        let started = Instant::now();
        let d = diagnosis::diagnose_held(rules, &req);
        metrics
            .diagnosis_seconds
            .observe(started.elapsed().as_secs_f64());
        let result = if d.category.is_some() {
            "category"
        } else {
            "none"
        };
        metrics
            .diagnoses
            .with_label_values(&["rules", result])
            .inc();
        if let Some(c) = e.attach_diagnosis(&id, d, now) {
            changes.push(c);
        }
    }
}

fn open_incidents(e: &Engine) -> usize {
    e.incidents()
        .iter()
        .filter(|i| i.state != IncidentState::Resolved)
        .count()
}

fn print_banner(scenario: &Scenario, speed: f64, api: Option<std::net::SocketAddr>) {
    let j = &scenario.job;
    demo_outln!(
        "Warden demo: scenario {:?}, job {:?}: {} ranks on {} nodes x {} GPUs \
         (tp {}, pp {}, dp {}), {} steps of ~{} s.",
        scenario.name,
        j.name,
        scenario.ranks(),
        j.nodes,
        j.gpus_per_node,
        j.tp,
        j.pp,
        j.dp,
        scenario.steps,
        j.iteration_secs
    );
    demo_outln!(
        "{} scripted fault(s); simulating {speed} virtual seconds per wall second. \
         Incidents are printed as they are found.",
        scenario.faults.len()
    );
    demo_outln!(
        "Remediation acts under the shipped policy and its safety rails; the simulated \
         cluster has no scheduler, so drains show in Warden's own node table."
    );
    match api {
        Some(addr) => {
            let base = format!("http://{addr}");
            demo_outln!(
                "The controller API is served on {base} while the demo runs and after it, \
                 until Ctrl-C. Try:"
            );
            demo_outln!("  curl -s {base}/api/v1/incidents");
            demo_outln!("  curl -s '{base}/api/v1/incidents?state=open&kind=straggler'");
            demo_outln!("  curl -s {base}/api/v1/jobs");
            demo_outln!("  curl -s {base}/api/v1/jobs/{}/ranks", j.name);
            demo_outln!("  curl -s {base}/api/v1/nodes       # drained by the policy");
            demo_outln!("  curl -s {base}/api/v1/actions     # what remediation did");
            demo_outln!("  curl -s {base}/api/v1/remediation # the circuit breaker");
            demo_outln!("  curl -s {base}/metrics | grep '^warden_'");
        }
        None => demo_outln!("The API is off (--no-api)."),
    }
    demo_outln!("Press Ctrl-C to stop early.\n");
}

fn print_summary(sim: &Simulation, engine: &SharedEngine, wall: f64, interrupted: bool) {
    let p = sim.progress();
    let incidents = engine.lock().incident_views(None, None, None);
    demo_outln!();
    if interrupted {
        demo_outln!(
            "Interrupted at step {} of {} ({:.1} virtual s).",
            p.step,
            p.steps,
            p.sim_seconds
        );
    }
    demo_outln!(
        "Summary: {} ranks, {} of {} steps, {:.1} virtual s in {:.1} wall s, {} batches, {} \
         collective events.",
        p.ranks,
        p.step,
        p.steps,
        p.sim_seconds,
        wall,
        p.batches,
        p.collective_events
    );
    let faults = sim.faults();
    demo_outln!("Injected faults that took effect ({}):", faults.len());
    for f in &faults {
        demo_outln!(
            "  {:<10} at {:>7.1}s  {}",
            f.kind,
            f.onset_s,
            show::fault_target(f)
        );
    }
    demo_outln!("Incidents ({}):", incidents.len());
    demo_out!(
        "{}",
        show::fit(&show::table(&incidents), show::terminal_width())
    );
}

/// The progress display on stderr: one line rewritten in place on a terminal, a line
/// every 10% of the steps otherwise.
struct Status {
    tty: bool,
    shown: bool,
    last_decile: Option<u64>,
    last_line: String,
}

impl Status {
    fn new(tty: bool) -> Self {
        Status {
            tty,
            shown: false,
            last_decile: None,
            last_line: String::new(),
        }
    }

    fn line(p: &Progress, open: usize) -> String {
        let pct = (p.step * 100).checked_div(p.steps).unwrap_or(100);
        format!(
            "step {}/{} ({pct}%), virtual {:.1}s, {} batches, {} collective events ingested, \
             {open} open incident(s)",
            p.step, p.steps, p.sim_seconds, p.batches, p.collective_events
        )
    }

    /// Take the status line off the screen before other output.
    fn clear(&mut self) {
        if self.tty && self.shown {
            eprint!("\r\x1b[2K");
            self.shown = false;
        }
    }

    fn update(&mut self, p: &Progress, open: usize) {
        if self.tty {
            eprint!("\r\x1b[2K{}", Self::line(p, open));
            let _ = std::io::stderr().flush();
            self.shown = true;
            return;
        }
        let decile = (p.step * 10).checked_div(p.steps).unwrap_or(10);
        if self.last_decile.is_none_or(|d| decile > d) {
            self.last_line = Self::line(p, open);
            eprintln!("{}", self.last_line);
            self.last_decile = Some(decile);
        }
    }

    fn finish(&mut self, p: &Progress, open: usize) {
        if self.tty {
            eprintln!("\r\x1b[2K{}", Self::line(p, open));
        } else {
            let line = Self::line(p, open);
            if line != self.last_line {
                eprintln!("{line}");
            }
        }
        self.shown = false;
    }
}
