//! The training-log collector thread: polls the [`Tailer`], extracts metrics and
//! watchdog reports, keeps every line in the local window and ships training metrics
//! and the notable lines (tracebacks, errors, watchdog reports), rate-limited, and the
//! worker deaths of launcher failure reports as exits (never rate-limited).

use std::thread::JoinHandle;

use std::time::{Duration, Instant};

use crate::config::AgentConfig;
use crate::logs::{Extractor, LauncherReports, LogLine, PresetCatalog, Tailer};
use crate::metrics::advance;
use crate::runtime::Shared;
use crate::ship::{self, wall_ns};
use crate::window::WindowLine;
use warden_model::wire::ProcessState;

/// Interval between tailer polls.
const POLL: Duration = Duration::from_millis(500);

/// At most `per_sec` lines a second, refilled continuously.
#[derive(Debug)]
struct RateLimit {
    per_sec: f64,
    tokens: f64,
    last: Instant,
    /// Lines refused since start.
    refused: u64,
}

impl RateLimit {
    fn new(per_sec: u32) -> RateLimit {
        RateLimit {
            per_sec: f64::from(per_sec),
            tokens: f64::from(per_sec),
            last: Instant::now(),
            refused: 0,
        }
    }

    fn allow(&mut self) -> bool {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_sec).min(self.per_sec);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.refused += 1;
            false
        }
    }
}

/// Start the log collector when sources are configured.
pub fn start(cfg: &AgentConfig, shared: &Shared) -> Option<JoinHandle<()>> {
    if cfg.logs.sources.is_empty() {
        return None;
    }
    let catalog = PresetCatalog::builtin();
    let (tailer, extractor) = match (
        Tailer::new(cfg.logs.clone()),
        Extractor::new(&cfg.logs, catalog),
    ) {
        (Ok(t), Ok(e)) => (t, e),
        (Err(e), _) | (_, Err(e)) => {
            // Validated at start-up; only a broken build gets here.
            tracing::error!(error = %e, "log collector is down");
            shared.set_up("logs", false);
            return None;
        }
    };
    shared.set_up("logs", true);
    tracing::info!(sources = cfg.logs.sources.len(), "log collector started");
    let s = shared.clone();
    let per_sec = cfg.ship.max_log_lines_per_sec;
    crate::collectors::spawn("logs", move || run(&s, tailer, extractor, per_sec))
}

fn run(shared: &Shared, mut tailer: Tailer, mut extractor: Extractor, per_sec: u32) {
    let mut limit = RateLimit::new(per_sec);
    let mut reports = LauncherReports::new();
    let m = &shared.metrics;
    loop {
        let now = wall_ns();
        {
            // Each line is handled as the tailer finishes it, while its text is still
            // in cache. The window stays locked for the poll (the API's window queries
            // wait at most that long); the shipping buffer is locked only for the few
            // lines that go into it, never across the tailer's reads.
            let mut w = shared.window.lock().unwrap_or_else(|e| e.into_inner());
            tailer.poll_with(now, &mut |line: LogLine| {
                let found = extractor.extract(&line);
                if let (Some(job), Some(metric)) = (line.job.as_deref(), &found.metric)
                    && let Some(tm) = metric.to_wire(line.rank)
                {
                    ship::lock(&shared.pending).metric(job, tm);
                    m.log_metrics.inc();
                }
                if let Some(job) = line.job.as_deref()
                    && (found.watchdog.is_some() || found.notable)
                    && limit.allow()
                {
                    ship::lock(&shared.pending).log(job, line.to_record());
                }
                if let Some(job) = line.job.as_deref() {
                    for e in reports.push(&line) {
                        ship::lock(&shared.pending).process(job, launcher_exit(&line, e));
                    }
                }
                w.push(window_line(line));
            });
        }
        let c = tailer.counters();
        advance(&m.log_lines, c.lines_read);
        advance(&m.log_bytes, c.bytes_read);
        advance(&m.log_truncated, c.lines_truncated);
        advance(&m.log_rotations, c.rotations);
        m.log_files_open.set(c.files_open as i64);
        if limit.refused > 0 {
            m.records_dropped
                .with_label_values(&["log_rate"])
                .inc_by(limit.refused);
            limit.refused = 0;
        }
        if !shared.sleep(POLL) {
            let mut w = shared.window.lock().unwrap_or_else(|e| e.into_inner());
            tailer.flush(wall_ns(), &mut |line| w.push(window_line(line)));
            return;
        }
    }
}

/// A death from the launcher's report as the exit the controller takes it for.
fn launcher_exit(line: &LogLine, e: crate::logs::LauncherExit) -> ProcessState {
    ProcessState {
        rank: e.rank,
        pid: e.pid,
        at_ns: line.at_ns,
        alive: false,
        exit_code: e.exit_code,
        signal: e.signal,
        stopped: false,
        from_log: true,
    }
}

fn window_line(line: LogLine) -> WindowLine {
    WindowLine {
        at_ns: line.at_ns,
        job: line.job,
        rank: line.rank,
        source: line.source,
        stream: line.stream.as_str(),
        text: line.text,
    }
}
