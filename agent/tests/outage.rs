//! The agent process through a controller outage: it keeps running, holds no more than
//! its buffer bound, counts what it had to drop, and delivers what it kept once the
//! controller is back. `WARDEN_OUTAGE_SECS` sets the outage length (default 20 s; the
//! figure in BENCHMARKS.md comes from a 600 s run).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

mod support;
use support::{AgentProc, Sink, free_port, metric, rss_kib};

fn append_events(path: &Path, from: u64, n: u64) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open kernel log");
    let mut text = String::new();
    for i in from..from + n {
        // Distinct PCI addresses make distinct events.
        text.push_str(&format!(
            "NVRM: Xid (PCI:{:04x}:{:02x}:{:02x}): 31, pid=1, name=python, MMU Fault\n",
            i >> 16,
            (i >> 8) & 0xff,
            i & 0xff
        ));
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
             kmsg:\n  path: {}\n  boot_id_path: {}\n  max_distinct_events: 1000000\n",
            kmsg.display(),
            boot.display()
        ),
    )
    .expect("config");
    let mut agent = AgentProc::start(&config, agent_port);
    let pid = agent.pid();

    // The outage: events keep coming, nobody listens.
    let mut produced = 0u64;
    let mut max_buffer = 0.0f64;
    let mut max_rss = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < outage {
        append_events(&kmsg, produced, 100);
        produced += 100;
        std::thread::sleep(Duration::from_millis(100));
        assert!(agent.alive(), "the agent exited during the outage");
        if let Some(m) = agent.scrape() {
            max_buffer = max_buffer.max(metric(&m, "warden_agent_buffer_bytes").unwrap_or(0.0));
        }
        max_rss = max_rss.max(rss_kib(pid));
    }
    let during = agent.scrape().expect("metrics");
    let failed = metric(&during, "warden_agent_batches_failed_total").unwrap_or(0.0);
    assert!(failed > 0.0, "deliveries were tried");
    assert!(
        max_buffer <= bound as f64,
        "buffer {max_buffer} > bound {bound}"
    );
    assert!(max_buffer > 0.0);

    // The controller comes back.
    let sink = Sink::start(controller_port);
    let got = sink.got.clone();

    // Everything kept arrives.
    let t1 = Instant::now();
    let (delivered, dropped) = loop {
        std::thread::sleep(Duration::from_millis(200));
        let m = agent.scrape().expect("metrics");
        let buffered = metric(&m, "warden_agent_buffer_bytes").unwrap_or(-1.0);
        let dropped = metric(
            &m,
            "warden_agent_records_dropped_total{reason=\"buffer_full\"}",
        )
        .unwrap_or(0.0) as u64;
        let events: u64 = got
            .lock()
            .expect("lock")
            .iter()
            .map(|b| b.events.len() as u64)
            .sum();
        if buffered == 0.0 && events + dropped >= produced {
            break (events, dropped);
        }
        assert!(
            t1.elapsed() < Duration::from_secs(60),
            "not delivered: buffered {buffered}, events {events}, dropped {dropped}, produced {produced}"
        );
    };
    assert_eq!(
        delivered + dropped,
        produced,
        "every event delivered or counted"
    );
    assert!(dropped > 0, "the outage overflowed the buffer");
    let batches = got.lock().expect("lock");
    let seqs: Vec<u64> = batches
        .iter()
        .filter(|b| !b.events.is_empty())
        .map(|b| b.seq)
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first");
    let hb = batches
        .iter()
        .find_map(|b| b.heartbeat.as_ref())
        .expect("heartbeat");
    assert!(hb.collectors_down.iter().any(|c| c == "nvml"), "{hb:?}");
    eprintln!(
        "outage {outage:?}: produced {produced} events, delivered {delivered}, dropped {dropped}, \
         max buffer {max_buffer} B (bound {bound}), max RSS {max_rss} KiB"
    );
}
