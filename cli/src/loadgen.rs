//! `warden loadgen`: the simulator's node agents against a running controller over
//! HTTP. A scenario (the `warden sim` format) runs in real time, or `--speed` times
//! faster; every batch an emulated agent flushes goes to the controller's ingest
//! endpoint through Warden's ingest client, the one the agent ships with. Each emulated
//! agent sends its own batches one at a time and in order, as a real agent does, from a
//! queue of `--queue` batches (a batch that finds it full is dropped and counted); the
//! agents share one connection pool, so the controller sees as many connections as
//! batches in flight, up to one per agent.
//!
//! At the end it prints, and writes with `--report`: batches and events per second (the
//! events as the controller counted them), batch latency p50/p99/max, the answers by
//! status (503s apart), how far the simulation fell behind the wall clock, the
//! controller's CPU seconds and resident memory over the run (from its `/metrics`), and
//! the scenario's grade: the job's incidents, moved onto the run's virtual clock (the
//! controller keeps Unix time), scored against the injected faults by the simulator's
//! own scorer (`warden_sim::score`). Detection latencies mean something only at
//! `--speed 1`: the controller's clock is the wall's.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::sync::mpsc;
use warden_config::outln;
use warden_engine::IncidentChange;
use warden_http::ingest::{IngestClient, SendError};
use warden_model::Timestamp;
use warden_model::view::IncidentView;
use warden_sim::{Report, RunOptions, Scenario, Scorecard, Simulation, Sink, score};

use crate::EXIT_USAGE;
use crate::client::{ApiClient, OpsError, encode};
use crate::settings::{FlagValues, Settings, token_file_line};

/// Fastest pace, virtual seconds per wall second.
const MAX_SPEED: f64 = 1000.0;
/// Longest run, wall seconds.
const MAX_SECONDS: f64 = 86_400.0;
/// Largest queue per emulated agent, batches.
const MAX_QUEUE: usize = 100_000;
/// Time allowed for one batch's POST (the agent's default request timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the queues to drain once the simulation stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Wall time between two advances of the simulation.
const PACE: Duration = Duration::from_millis(20);
/// Most incidents read back.
const MAX_INCIDENTS: u32 = 1000;

/// Options of `warden loadgen`.
#[derive(Debug, clap::Args)]
pub struct LoadgenArgs {
    /// The controller's URL (`http://host:port` or `https://...`).
    #[arg(long, value_name = "URL")]
    pub controller: String,
    /// Scenario file (YAML, the `warden sim` format): the job, its noise and faults.
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// File whose first line is a token of the `agent` role, sent with every batch
    /// (the controller's agent token); none for a controller without tokens.
    #[arg(long, value_name = "FILE")]
    pub agent_token_file: Option<PathBuf>,
    /// File whose first line is a token that may read incidents and `/metrics`
    /// (`viewer` or above) [env: WARDEN_TOKEN_FILE].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) to trust for an `https` controller, beside the public
    /// roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Virtual seconds simulated per wall-clock second (detection latencies hold at
    /// 1 only).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub speed: f64,
    /// Stop after this many wall-clock seconds [default: the scenario's end].
    #[arg(long, value_name = "SECS")]
    pub seconds: Option<f64>,
    /// Batches an emulated agent holds while one is in flight; a batch that finds the
    /// queue full is dropped and counted.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub queue: usize,
    /// Write the run's report (JSON) here.
    #[arg(long, value_name = "OUT.json")]
    pub report: Option<PathBuf>,
    /// Print the summary only.
    #[arg(long)]
    pub quiet: bool,
}

/// What one emulated agent's sender saw.
#[derive(Debug, Default)]
struct AgentStats {
    ok: u64,
    busy: u64,
    unreachable: u64,
    other: BTreeMap<u16, u64>,
    latency_us: Vec<u32>,
}

/// The simulation's batches, each to its agent's queue.
#[derive(Debug)]
struct HttpSink {
    queues: Vec<mpsc::Sender<Vec<u8>>>,
    offered: u64,
    bytes: u64,
    dropped: u64,
}

impl Sink for HttpSink {
    fn deliver(&mut self, body: &[u8], now: Timestamp) {
        self.deliver_from(0, body, now);
    }

    fn deliver_from(&mut self, node: u32, body: &[u8], _now: Timestamp) {
        self.offered += 1;
        self.bytes += body.len() as u64;
        let sent = self
            .queues
            .get(node as usize)
            .is_some_and(|q| q.try_send(body.to_vec()).is_ok());
        if !sent {
            self.dropped += 1;
        }
    }

    /// The controller ticks itself on its own clock.
    fn tick(&mut self, _now: Timestamp) -> Vec<IncidentChange> {
        Vec::new()
    }
}

/// The controller's own counters, read from its `/metrics`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ControllerSample {
    /// `process_cpu_seconds_total`.
    pub cpu_seconds: f64,
    /// `process_resident_memory_bytes`.
    pub rss_bytes: f64,
    /// `warden_ingest_collective_events_total` + `warden_ingest_records_total`.
    pub events: f64,
    /// `warden_ingest_batches_total`.
    pub batches: f64,
}

/// What `warden loadgen` measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// The scenario's name.
    pub scenario: String,
    /// Ranks in the job.
    pub ranks: u32,
    /// Emulated agents (nodes).
    pub agents: u32,
    /// Virtual seconds per wall second asked for.
    pub speed: f64,
    /// Wall seconds the simulation ran.
    pub wall_seconds: f64,
    /// Virtual seconds simulated.
    pub sim_seconds: f64,
    /// Most the simulation fell behind the wall clock at `speed`, virtual seconds.
    pub max_lag_s: f64,
    /// Batches the agents flushed.
    pub batches_offered: u64,
    /// Batches dropped at a full queue.
    pub batches_dropped: u64,
    /// Bytes the agents flushed.
    pub bytes_offered: u64,
    /// Batches accepted (2xx).
    pub batches_ok: u64,
    /// Answers 503 (the controller shedding load).
    pub busy_503: u64,
    /// No answer or no connection.
    pub unreachable: u64,
    /// Other error statuses, by status.
    pub other_statuses: BTreeMap<u16, u64>,
    /// Batch latency, milliseconds: p50, p99, max (of accepted batches).
    pub latency_ms: [f64; 3],
    /// Accepted batches per wall second.
    pub batches_per_s: f64,
    /// Events the controller counted per wall second.
    pub events_per_s: f64,
    /// Controller CPU seconds over the run.
    pub controller_cpu_seconds: f64,
    /// Events the controller counted per CPU second it used.
    pub events_per_cpu_second: f64,
    /// Controller samples before and after.
    pub before: ControllerSample,
    /// After the queues drained.
    pub after: ControllerSample,
    /// The job's incidents against the injected faults, as `warden sim` grades a run:
    /// faults missed, incidents matching none, detection latency by class.
    pub score: Scorecard,
}

/// Run `warden loadgen`.
pub fn main(args: &LoadgenArgs) -> anyhow::Result<ExitCode> {
    if let Err(msg) = check(args) {
        eprintln!("warden loadgen: {msg}");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let scenario = match Scenario::load(&args.scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warden loadgen: invalid scenario: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let agent_token = match args
        .agent_token_file
        .as_deref()
        .map(token_file_line)
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("warden loadgen: --agent-token-file: {}", e.0);
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let client = match IngestClient::new(
        &args.controller,
        agent_token.as_deref(),
        REQUEST_TIMEOUT,
        args.ca_file.as_deref(),
    ) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("warden loadgen: {msg}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let flags = FlagValues {
        server: Some(args.controller.clone()),
        token: None,
        token_file: args.token_file.clone(),
        config: None,
    };
    let api = match Settings::load(&flags, |name| std::env::var(name).ok())
        .map_err(|e| OpsError::Usage(e.0))
        .and_then(|s| ApiClient::new(&s))
    {
        Ok(a) => a,
        Err(e) => {
            eprintln!("warden loadgen: {e}");
            return Ok(ExitCode::from(e.exit_code()));
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let before = match rt.block_on(sample(&api)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warden loadgen: reading the controller's /metrics: {e}");
            return Ok(ExitCode::from(e.exit_code()));
        }
    };
    let agents = scenario.job.nodes;
    if !args.quiet {
        outln!(
            "Loading {} with {:?}: {} ranks, {} agents, {}x real time ...",
            api.server(),
            scenario.name,
            scenario.ranks(),
            agents,
            args.speed
        );
    }

    let mut queues = Vec::with_capacity(agents as usize);
    let mut senders = Vec::with_capacity(agents as usize);
    for _ in 0..agents {
        let (tx, rx) = mpsc::channel(args.queue);
        queues.push(tx);
        senders.push(rt.spawn(send_all(client.clone(), rx)));
    }
    let mut sink = HttpSink {
        queues,
        offered: 0,
        bytes: 0,
        dropped: 0,
    };
    let mut sim = Simulation::new(&scenario, RunOptions::default());
    let started = Instant::now();
    let started_unix = unix_now();
    let limit = args.seconds.unwrap_or(f64::INFINITY);
    let mut max_lag = 0.0_f64;
    while !sim.done() {
        let wall = started.elapsed().as_secs_f64();
        if wall >= limit {
            break;
        }
        let target = wall * args.speed;
        sim.advance(&mut sink, target);
        max_lag = max_lag.max(started.elapsed().as_secs_f64() * args.speed - target);
        std::thread::sleep(PACE);
    }
    let wall_seconds = started.elapsed().as_secs_f64();
    let (offered, bytes, dropped) = (sink.offered, sink.bytes, sink.dropped);
    // Closing the queues ends each sender once it has sent what it holds.
    drop(sink);
    let stats = rt.block_on(async {
        let mut out = Vec::with_capacity(senders.len());
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        for s in senders {
            match tokio::time::timeout_at(deadline, s).await {
                Ok(Ok(st)) => out.push(st),
                Ok(Err(e)) => tracing::warn!(error = %e, "an emulated agent's sender failed"),
                Err(_) => tracing::warn!("an emulated agent's queue did not drain in time"),
            }
        }
        out
    });
    let after = rt.block_on(sample(&api)).unwrap_or_else(|e| {
        eprintln!("warden loadgen: reading the controller's /metrics after the run: {e}");
        before
    });
    let incidents = rt
        .block_on(incidents(&api, &scenario.job.name))
        .unwrap_or_else(|e| {
            eprintln!("warden loadgen: reading the job's incidents: {e}");
            Vec::new()
        });
    let incidents = on_the_run_clock(incidents, started_unix, args.speed);
    let score = score(&[Report::new(&sim, incidents, wall_seconds)]);
    let report = summarize(
        &scenario,
        &sim,
        args.speed,
        wall_seconds,
        max_lag,
        (offered, bytes, dropped),
        &stats,
        (before, after),
        score,
    );
    print(&report, args.quiet);
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The options' bounds.
fn check(args: &LoadgenArgs) -> Result<(), String> {
    if !(args.speed > 0.0 && args.speed <= MAX_SPEED) {
        return Err(format!(
            "--speed {} is out of range: 0 < X <= {MAX_SPEED}",
            args.speed
        ));
    }
    if let Some(s) = args.seconds
        && !(s > 0.0 && s <= MAX_SECONDS)
    {
        return Err(format!(
            "--seconds {s} is out of range: 0 < SECS <= {MAX_SECONDS}"
        ));
    }
    if !(1..=MAX_QUEUE).contains(&args.queue) {
        return Err(format!(
            "--queue {} is out of range: 1 to {MAX_QUEUE}",
            args.queue
        ));
    }
    Ok(())
}

/// One emulated agent's sender: its batches, one at a time, in order.
async fn send_all(client: IngestClient, mut rx: mpsc::Receiver<Vec<u8>>) -> AgentStats {
    let mut s = AgentStats::default();
    while let Some(body) = rx.recv().await {
        let t = Instant::now();
        match client.send(body).await {
            Ok(()) => {
                s.ok += 1;
                let us = t.elapsed().as_micros();
                s.latency_us.push(u32::try_from(us).unwrap_or(u32::MAX));
            }
            Err(SendError::Retry { status: 503, .. }) => s.busy += 1,
            Err(SendError::Retry { status, .. } | SendError::Refused { status, .. }) => {
                *s.other.entry(status).or_default() += 1;
            }
            Err(SendError::Unreachable(_)) => s.unreachable += 1,
        }
    }
    s
}

/// The controller's counters now.
async fn sample(api: &ApiClient) -> Result<ControllerSample, OpsError> {
    let text = api.get_text("/metrics").await?;
    let mut s = ControllerSample::default();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        match name {
            "process_cpu_seconds_total" => s.cpu_seconds = v,
            "process_resident_memory_bytes" => s.rss_bytes = v,
            "warden_ingest_collective_events_total" | "warden_ingest_records_total" => {
                s.events += v;
            }
            "warden_ingest_batches_total" => s.batches = v,
            _ => {}
        }
    }
    Ok(s)
}

/// The job's incidents, newest first, up to [`MAX_INCIDENTS`].
async fn incidents(api: &ApiClient, job: &str) -> Result<Vec<IncidentView>, OpsError> {
    let a = api
        .get(&format!(
            "/api/v1/incidents?job={}&limit={MAX_INCIDENTS}",
            encode(job)
        ))
        .await?;
    serde_json::from_value(a.json).map_err(|e| OpsError::Answer {
        server: api.server().to_owned(),
        detail: format!("incidents that are not incident views: {e}"),
    })
}

/// `incidents` with their times moved from the controller's Unix seconds to seconds of
/// the simulation's clock, which started at `started_unix` and ran `speed` times the
/// wall's.
fn on_the_run_clock(
    mut incidents: Vec<IncidentView>,
    started_unix: f64,
    speed: f64,
) -> Vec<IncidentView> {
    let run = |t: f64| (t - started_unix) * speed;
    for i in &mut incidents {
        i.onset_s = run(i.onset_s);
        i.detected_s = run(i.detected_s);
        i.resolved_s = i.resolved_s.map(run);
        for t in &mut i.timeline {
            t.at_s = run(t.at_s);
        }
    }
    incidents
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The `q`-quantile of sorted `v`, in milliseconds.
fn quantile_ms(v: &[u32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    f64::from(v[i.min(v.len() - 1)]) / 1000.0
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    scenario: &Scenario,
    sim: &Simulation,
    speed: f64,
    wall_seconds: f64,
    max_lag_s: f64,
    (offered, bytes, dropped): (u64, u64, u64),
    stats: &[AgentStats],
    (before, after): (ControllerSample, ControllerSample),
    score: Scorecard,
) -> LoadReport {
    let mut latency: Vec<u32> = stats
        .iter()
        .flat_map(|s| s.latency_us.iter().copied())
        .collect();
    latency.sort_unstable();
    let mut other = BTreeMap::new();
    for s in stats {
        for (k, v) in &s.other {
            *other.entry(*k).or_default() += v;
        }
    }
    let ok: u64 = stats.iter().map(|s| s.ok).sum();
    let cpu = (after.cpu_seconds - before.cpu_seconds).max(0.0);
    let events = (after.events - before.events).max(0.0);
    let per = |n: f64| {
        if wall_seconds > 0.0 {
            n / wall_seconds
        } else {
            0.0
        }
    };
    LoadReport {
        scenario: scenario.name.clone(),
        ranks: scenario.ranks(),
        agents: scenario.job.nodes,
        speed,
        wall_seconds,
        sim_seconds: sim.progress().sim_seconds,
        max_lag_s,
        batches_offered: offered,
        batches_dropped: dropped,
        bytes_offered: bytes,
        batches_ok: ok,
        busy_503: stats.iter().map(|s| s.busy).sum(),
        unreachable: stats.iter().map(|s| s.unreachable).sum(),
        other_statuses: other,
        latency_ms: [
            quantile_ms(&latency, 0.5),
            quantile_ms(&latency, 0.99),
            quantile_ms(&latency, 1.0),
        ],
        batches_per_s: per(ok as f64),
        events_per_s: per(events),
        controller_cpu_seconds: cpu,
        events_per_cpu_second: if cpu > 0.0 { events / cpu } else { 0.0 },
        before,
        after,
        score,
    }
}

fn print(r: &LoadReport, quiet: bool) {
    outln!(
        "{} ranks, {} agents: {:.1} virtual s in {:.1} wall s (fell behind by at most {:.2} s)",
        r.ranks,
        r.agents,
        r.sim_seconds,
        r.wall_seconds,
        r.max_lag_s
    );
    outln!(
        "Batches: {} flushed, {} accepted ({:.0}/s), {} dropped at a full queue, {} answered 503, {} unreachable{}",
        r.batches_offered,
        r.batches_ok,
        r.batches_per_s,
        r.batches_dropped,
        r.busy_503,
        r.unreachable,
        if r.other_statuses.is_empty() {
            String::new()
        } else {
            format!(", other: {:?}", r.other_statuses)
        }
    );
    outln!(
        "Batch latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        r.latency_ms[0],
        r.latency_ms[1],
        r.latency_ms[2]
    );
    outln!(
        "Controller: {:.0} events/s, {:.2} CPU s ({:.0} events per CPU second), RSS {:.0} MiB (was {:.0} MiB)",
        r.events_per_s,
        r.controller_cpu_seconds,
        r.events_per_cpu_second,
        r.after.rss_bytes / (1024.0 * 1024.0),
        r.before.rss_bytes / (1024.0 * 1024.0)
    );
    if quiet {
        return;
    }
    let sc = &r.score;
    outln!(
        "Detection: {} of {} injected faults found, {} of {} incidents match a fault",
        sc.matched,
        sc.faults,
        sc.matched,
        sc.incidents
    );
    for c in &sc.classes {
        if let Some(max) = c.secs(1.0) {
            outln!(
                "  {:<22} {}/{} found, {:.2} s after the onset (the last progress, for a stop) at most",
                c.class,
                c.matched,
                c.faults,
                max
            );
        }
    }
    for m in &sc.missed {
        outln!("  MISSED {m}");
    }
    for f in &sc.false_positives {
        outln!("  matches no fault: {f}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn incidents_move_onto_the_runs_clock() {
        let view: IncidentView = serde_json::from_value(json!({
            "id": "inc-1", "kind": "hang", "job": "j", "state": "open", "acknowledged": false,
            "severity": "critical", "ranks": [5], "nodes": ["node-01"], "gpus": [],
            "onset_s": 1_000.5, "detected_s": 1_004.0, "resolved_s": null, "confidence": 0.9,
            "summary": "s", "evidence": [], "timeline": [{"at_s": 1_002.0, "what": "x"}]
        }))
        .expect("an incident view");
        let moved = on_the_run_clock(vec![view], 1_000.0, 2.0);
        assert_eq!(moved[0].onset_s, 1.0);
        assert_eq!(moved[0].detected_s, 8.0);
        assert_eq!(moved[0].resolved_s, None);
        assert_eq!(moved[0].timeline[0].at_s, 4.0);
    }

    #[test]
    fn quantiles_come_from_the_sorted_latencies() {
        let v: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(quantile_ms(&v, 0.5), 51.0);
        assert_eq!(quantile_ms(&v, 0.99), 99.0);
        assert_eq!(quantile_ms(&v, 1.0), 100.0);
        assert_eq!(quantile_ms(&[], 0.5), 0.0);
    }
}
