//! The agent process through a controller outage while a job logs errors: it keeps
//! running, holds no more than its buffer bound, stays under a peak-memory bound
//! (`VmHWM` of the process), counts what it had to drop, and delivers what it kept once
//! the controller is back.
//!
//! The outage is ten minutes of a job writing 500 error lines a second: 300,000 lines.
//! `WARDEN_OUTAGE_SECS` sets how long the test takes to write them (default 20 s, 30×
//! faster; 600 runs it in real time, as for the figure in BENCHMARKS.md). What the agent
//! holds is bounded by bytes (outbox, log window), not by time, and its retries reach
//! their 2 s cap within seconds, so the compressed run holds the same state a real
//! ten-minute outage does, with the same lines to drop and count.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

mod support;
use support::{AgentProc, Sink, free_port, metric, rss_kib, status_kib};
use warden_testkit::{PATIENCE, poll};

/// Lines a job writes in a ten-minute outage at 500 lines a second.
const OUTAGE_LINES: u64 = 600 * 500;
/// Peak resident memory the agent may reach, KiB (it measured 19.2 MB over a real
/// ten-minute outage).
const PEAK_RSS_KIB: u64 = 48 << 10;

fn append_lines(path: &Path, from: u64, n: u64) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the training log");
    let mut text = String::new();
    for i in from..from + n {
        // Every line is notable, so each one is shipped, or dropped and counted.
        text.push_str(&format!("RuntimeError: step {i} failed on rank 0\n"));
    }
    f.write_all(text.as_bytes()).expect("append");
}

#[test]
fn controller_outage_is_survived_within_the_buffer_bound() {
    let outage = Duration::from_secs(
        std::env::var("WARDEN_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let kmsg = dir.path().join("kern.log");
    std::fs::write(&kmsg, "").expect("kernel log");
    let log = dir.path().join("train.log");
    let boot = dir.path().join("boot_id");
    std::fs::write(&boot, "boot-1\n").expect("boot id");
    let controller_port = free_port();
    let agent_port = free_port();
    let bound: u64 = 64 << 10;
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "node_name: outage-node\nlisten: 127.0.0.1:{agent_port}\n\
             controller:\n  url: http://127.0.0.1:{controller_port}\n  flush_interval_ms: 200\n  \
             buffer_max_bytes: {bound}\n  backoff_initial_ms: 100\n  backoff_max_ms: 2000\n\
             nvml:\n  library: /nonexistent/libnvidia-ml.so.1\n\
             kmsg:\n  path: {}\n  boot_id_path: {}\n\
             capture:\n  socket: {}\n\
             logs:\n  sources:\n    - paths: [\"{}\"]\n      job: outage-job\n      rank: 0\n",
            kmsg.display(),
            boot.display(),
            dir.path().join("capture.sock").display(),
            log.display()
        ),
    )
    .expect("config");
    let mut agent = AgentProc::start(&config, agent_port);
    let pid = agent.pid();

    // The outage: events keep coming, nobody listens. Ten minutes of lines, written
    // over `outage` in steps of 100 ms.
    let steps = (outage.as_millis() / 100).max(1) as u64;
    let mut produced = 0u64;
    let mut max_buffer = 0.0f64;
    let mut max_rss = 0u64;
    let t0 = Instant::now();
    for step in 0..steps {
        let due = OUTAGE_LINES * (step + 1) / steps;
        append_lines(&log, produced, due - produced);
        produced = due;
        let next = Duration::from_millis(100 * (step + 1));
        // Paces the writer; nothing is asserted on the strength of it.
        std::thread::sleep(next.saturating_sub(t0.elapsed()));
        assert!(agent.alive(), "the agent exited during the outage");
        if let Some(m) = agent.scrape() {
            max_buffer = max_buffer.max(metric(&m, "warden_agent_buffer_bytes").unwrap_or(0.0));
        }
        max_rss = max_rss.max(rss_kib(pid));
    }
    let peak = status_kib(pid, "VmHWM:");
    assert!(
        peak <= PEAK_RSS_KIB,
        "peak RSS {peak} KiB over the outage (bound {PEAK_RSS_KIB})"
    );
    // Deliveries were tried.
    agent.wait_metric("warden_agent_batches_failed_total", |n| n > 0.0);
    assert!(
        max_buffer <= bound as f64,
        "buffer {max_buffer} > bound {bound}"
    );
    assert!(max_buffer > 0.0);

    // The controller comes back.
    let sink = Sink::start(controller_port);
    let got = sink.got.clone();

    // Everything kept arrives; every line written was shipped or counted as dropped.
    let mut last = String::from("(no answer from /metrics)");
    let done = poll(PATIENCE, || {
        let m = agent.scrape()?;
        let buffered = metric(&m, "warden_agent_buffer_bytes").unwrap_or(-1.0);
        let read = metric(&m, "warden_agent_log_lines_total").unwrap_or(0.0) as u64;
        let dropped = metric(
            &m,
            "warden_agent_records_dropped_total{reason=\"buffer_full\"}",
        )
        .unwrap_or(0.0) as u64;
        let rated = metric(
            &m,
            "warden_agent_records_dropped_total{reason=\"log_rate\"}",
        )
        .unwrap_or(0.0) as u64;
        let lines: u64 = got
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|b| b.jobs.iter())
            .map(|j| j.logs.len() as u64)
            .sum();
        if read >= produced && buffered == 0.0 && lines + dropped + rated >= produced {
            return Some((lines, dropped, rated));
        }
        last = format!(
            "read {read}, buffered {buffered}, lines {lines}, dropped {dropped} + {rated}, produced {produced}"
        );
        None
    });
    let Some((delivered, dropped, rated)) = done else {
        panic!("not delivered: {last}");
    };
    assert_eq!(
        delivered + dropped + rated,
        produced,
        "every line delivered or counted"
    );
    assert!(dropped > 0, "the outage overflowed the buffer");
    let batches = got.lock().expect("lock");
    let seqs: Vec<u64> = batches
        .iter()
        .filter(|b| !b.jobs.is_empty())
        .map(|b| b.seq)
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first");
    let hb = batches
        .iter()
        .find_map(|b| b.heartbeat.as_ref())
        .expect("heartbeat");
    assert!(hb.collectors_down.iter().any(|c| c == "nvml"), "{hb:?}");
    eprintln!(
        "outage of ten minutes' lines in {outage:?}: {produced} log lines written, {delivered} \
         delivered, {dropped} dropped for the buffer bound, {rated} over the shipping rate; \
         max buffer {max_buffer} B (bound {bound}), max RSS {max_rss} KiB, peak RSS (VmHWM) \
         {peak} KiB (bound {PEAK_RSS_KIB})"
    );
}
