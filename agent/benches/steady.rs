//! Steady-state cost of the agent process: 8 fake GPUs (the fake `libnvidia-ml.so.1`
//! through the real NVML path) sampled at 1 Hz, 1 MB/s of Megatron-LM style training
//! log tailed with metric extraction, the kernel log followed, and batches shipped to
//! a controller stand-in. Reports the agent's CPU (user + system, from
//! `/proc/<pid>/stat`) as a share of one core, and its resident memory.
//!
//! `cargo bench -p warden-agent --bench steady`; `WARDEN_BENCH_SECS` sets the measured
//! span (default 60 s, after 10 s of warm-up), `WARDEN_BENCH_LOG_BPS` the log rate.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/fake_nvml/mod.rs"]
mod fake_nvml;
#[path = "../tests/support/mod.rs"]
mod support;
use support::{AgentProc, Sink, free_port, metric, status_kib};

/// CPU time per thread name, ns (threads of one name summed), from
/// `/proc/<pid>/task/<tid>/schedstat`: nanosecond resolution, where `stat`'s ticks
/// would be 10 ms.
fn thread_cpu_ns(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        *out.entry(name.trim().to_owned()).or_default() += ns;
    }
    out
}

/// Write `bps` bytes a second of training log to `path` until `stop`, in 10 slices a
/// second: one Megatron iteration line in a hundred, among ordinary INFO lines.
fn write_logs(path: &Path, bps: u64, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("log file");
    let start = Instant::now();
    let mut iter = 0u64;
    let mut total = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * bps as f64) as u64;
        let mut chunk = String::new();
        while total + (chunk.len() as u64) < due {
            iter += 1;
            if iter.is_multiple_of(100) {
                chunk.push_str(&format!(
                    " [2026-11-22 10:{:02}:{:02}] iteration {:>8}/ 500000 | consumed samples: {:>12} | elapsed time per iteration (ms): 412.3 | learning rate: 2.999E-04 | global batch size:  1024 | lm loss: {:.6E} | loss scale: 1.0 | grad norm: {:.3} | number of skipped iterations:   0 | number of nan iterations:   0 |\n",
                    (iter / 60) % 60,
                    iter % 60,
                    iter / 100,
                    iter / 100 * 1024,
                    2.5 + (iter % 97) as f64 / 1000.0,
                    0.8 + (iter % 13) as f64 / 100.0
                ));
            } else {
                chunk.push_str(&format!(
                    "[INFO] rank 0: dataloader worker {} prefetched shard {:06} of /data/tokens/train-{:05}.bin ({} sequences)\n",
                    iter % 8,
                    iter % 100_000,
                    iter % 4096,
                    iter % 977
                ));
            }
        }
        if !chunk.is_empty() {
            f.write_all(chunk.as_bytes()).expect("write log");
            total += chunk.len() as u64;
            written.store(total, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test` of benches passes nothing.
    let secs: u64 = std::env::var("WARDEN_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let bps: u64 = std::env::var("WARDEN_BENCH_LOG_BPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let node = fake_nvml::FakeNode::new(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train-rank0.log");
    std::fs::write(&log, "").expect("log");
    let kmsg = dir.path().join("kern.log");
    std::fs::write(&kmsg, "").expect("kernel log");
    let (agent_port, controller_port) = (free_port(), free_port());
    let sink = Sink::start(controller_port);
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "node_name: bench-node\nlisten: 127.0.0.1:{agent_port}\n\
             controller:\n  url: http://127.0.0.1:{controller_port}\n\
             nvml:\n  library: {}\n  interval_ms: 1000\n\
             kmsg:\n  path: {}\n\
             logs:\n  sources:\n    - paths: [\"{}/train-*.log\"]\n      job: bench\n      rank: 0\n",
            node.lib_path().display(),
            kmsg.display(),
            dir.path().display()
        ),
    )
    .expect("config");
    let agent = AgentProc::start(&config, agent_port);
    let pid = agent.pid();

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written, log) = (stop.clone(), written.clone(), log.clone());
        std::thread::spawn(move || write_logs(&log, bps, stop, written))
    };
    let warmup = Duration::from_secs(10);
    std::thread::sleep(warmup);

    let (t0, w0) = (Instant::now(), written.load(Ordering::Relaxed));
    let m0 = agent.scrape().unwrap_or_default();
    let th0 = thread_cpu_ns(pid);
    let mut rss_max = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        rss_max = rss_max.max(status_kib(pid, "VmRSS:"));
    }
    let (wall, w1) = (t0.elapsed().as_secs_f64(), written.load(Ordering::Relaxed));
    let m1 = agent.scrape().unwrap_or_default();
    let th1 = thread_cpu_ns(pid);
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();

    let delta = |name: &str| metric(&m1, name).unwrap_or(0.0) - metric(&m0, name).unwrap_or(0.0);
    let per_thread: Vec<(String, f64)> = th1
        .iter()
        .map(|(name, ns)| {
            let d = ns.saturating_sub(th0.get(name).copied().unwrap_or(0));
            (name.clone(), d as f64 / 1e9 / wall * 100.0)
        })
        .collect();
    let cpu_pct: f64 = per_thread.iter().map(|(_, p)| p).sum();
    let rss_end = status_kib(pid, "VmRSS:");
    let hwm = status_kib(pid, "VmHWM:");
    let shipped = *sink.bytes.lock().expect("lock");
    println!("agent steady state over {wall:.0} s (after {warmup:?} warm-up):");
    println!(
        "  log written        {:.3} MB/s",
        (w1 - w0) as f64 / wall / 1e6
    );
    println!(
        "  log read           {:.3} MB/s",
        delta("warden_agent_log_bytes_total") / wall / 1e6
    );
    println!(
        "  metrics extracted  {:.1} /s",
        delta("warden_agent_log_metrics_total") / wall
    );
    println!(
        "  batches sent       {:.2} /s",
        delta("warden_agent_batches_sent_total") / wall
    );
    println!("  shipped            {:.1} kB in all", shipped as f64 / 1e3);
    println!("  CPU                {cpu_pct:.3} % of one core (user + system, all threads)");
    println!(
        "  RSS                {:.1} MB now, {:.1} MB max sampled, {:.1} MB high-water",
        rss_end as f64 / 1024.0,
        rss_max as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    for (name, p) in &per_thread {
        println!("    thread {name:<18} {p:.3} %");
    }
    let ok = cpu_pct <= 0.5 && hwm as f64 / 1024.0 <= 25.0;
    println!(
        "  target (CPU <= 0.5 %, RSS <= 25 MB): {}",
        if ok { "met" } else { "MISSED" }
    );
    drop(agent);
}
