//! Steady-state cost of the agent process: 8 fake GPUs (the fake `libnvidia-ml.so.1`
//! through the real NVML path) sampled at 1 Hz, 1 MB/s of Megatron-LM style training
//! log tailed with metric extraction, the kernel log followed, and batches shipped to
//! a controller stand-in. Reports the agent's CPU (user + system, from
//! `/proc/<pid>/task/*/schedstat`) as a share of one core, and its resident memory.
//!
//! `cargo bench -p warden-agent --bench steady`; `WARDEN_BENCH_SECS` sets the measured
//! span (default 60 s, after 10 s of warm-up), `WARDEN_BENCH_LOG_BPS` the log rate.
//!
//! `WARDEN_BENCH_PEERS=rsyslog,syslog-ng` (default none) also runs those log shippers,
//! side by side over the same window: each in the foreground with a generated config in
//! the bench's temp dir, tailing the same log and forwarding every line over TCP to a
//! counting sink. Each is measured as the agent is (CPU from `schedstat`, `VmHWM`), with
//! the lines it delivered against the lines written; a peer whose binary is missing
//! fails the bench, naming its Debian package.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/fake_nvml/mod.rs"]
mod fake_nvml;
#[path = "peers/mod.rs"]
mod peers;
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
/// `written` and `lines` count what is written.
fn write_logs(
    path: &Path,
    bps: u64,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    lines: Arc<AtomicU64>,
) {
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
        let first = iter;
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
            lines.fetch_add(iter - first, Ordering::Relaxed);
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
    let peer_kinds = peers::from_env();
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
    let peers: Vec<peers::Peer> = peer_kinds
        .iter()
        .map(|(kind, _)| peers::Peer::start(*kind, dir.path(), &log))
        .collect();
    let load_start = load_average();

    let stop = Arc::new(AtomicBool::new(false));
    let (written, lines) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, written, lines, log) =
            (stop.clone(), written.clone(), lines.clone(), log.clone());
        std::thread::spawn(move || write_logs(&log, bps, stop, written, lines))
    };
    let warmup = Duration::from_secs(10);
    std::thread::sleep(warmup);

    let (t0, w0) = (Instant::now(), written.load(Ordering::Relaxed));
    let l0 = lines.load(Ordering::Relaxed);
    let m0 = agent.scrape().unwrap_or_default();
    let th0 = thread_cpu_ns(pid);
    let p0: Vec<_> = peers
        .iter()
        .map(|p| (cpu_ns(p.pid()), p.delivered()))
        .collect();
    let s0 = *sink.bytes.lock().expect("lock");
    let mut rss_max = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        rss_max = rss_max.max(status_kib(pid, "VmRSS:"));
    }
    let (wall, w1) = (t0.elapsed().as_secs_f64(), written.load(Ordering::Relaxed));
    let l1 = lines.load(Ordering::Relaxed);
    let m1 = agent.scrape().unwrap_or_default();
    let th1 = thread_cpu_ns(pid);
    let p1: Vec<_> = peers
        .iter()
        .map(|p| (cpu_ns(p.pid()), p.delivered()))
        .collect();
    let s1 = *sink.bytes.lock().expect("lock");
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
    if !peers.is_empty() {
        let thread = |th: &std::collections::BTreeMap<String, u64>| {
            th.get("warden-logs").copied().unwrap_or(0)
        };
        let agent_cpu = (th1.values().sum::<u64>()).saturating_sub(th0.values().sum());
        let log_cpu = thread(&th1).saturating_sub(thread(&th0));
        compare(Compared {
            wall,
            load_start,
            written: (w1 - w0, l1 - l0),
            agent_cpu_ns: (agent_cpu, log_cpu),
            agent_hwm_kib: hwm,
            agent_read: delta("warden_agent_log_bytes_total") as u64,
            agent_shipped: s1 - s0,
            peers: &peers,
            versions: peer_kinds.iter().map(|(_, v)| v.as_str()).collect(),
            cpu: p0
                .iter()
                .zip(&p1)
                .map(|(a, b)| b.0.saturating_sub(a.0))
                .collect(),
            delivered: p0
                .iter()
                .zip(&p1)
                .map(|(a, b)| (b.1.0 - a.1.0, b.1.1 - a.1.1))
                .collect(),
            lines_total: lines.load(Ordering::Relaxed),
        });
    }
    drop(agent);
}

/// The 1, 5 and 15 minute load averages, from `/proc/loadavg`.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// CPU time of all of `pid`'s threads, ns.
fn cpu_ns(pid: u32) -> u64 {
    thread_cpu_ns(pid).values().sum()
}

/// What the agent and its peers did over one window.
struct Compared<'a> {
    wall: f64,
    load_start: String,
    /// Log bytes and lines written over the window.
    written: (u64, u64),
    /// The agent's CPU over the window, all threads and the log thread, ns.
    agent_cpu_ns: (u64, u64),
    agent_hwm_kib: u64,
    agent_read: u64,
    agent_shipped: u64,
    peers: &'a [peers::Peer],
    versions: Vec<&'a str>,
    /// Each peer's CPU over the window, ns, and the bytes and lines its sink received.
    cpu: Vec<u64>,
    delivered: Vec<(u64, u64)>,
    /// Lines written in all, warm-up and window.
    lines_total: u64,
}

/// Print the side-by-side table, then wait (up to 10 s) for the peers to deliver every
/// line written and say how far each got.
fn compare(c: Compared) {
    let load_end = load_average();
    let (wb, wl) = c.written;
    println!(
        "side by side over {:.0} s (load average {} at the start, {} at the end):",
        c.wall, c.load_start, load_end
    );
    println!(
        "  log written {:.3} MB, {wl} lines; the agent read {:.3} MB of it",
        wb as f64 / 1e6,
        c.agent_read as f64 / 1e6
    );
    println!(
        "  {:<22} {:>9} {:>9} {:>10} {:>9}  delivered over the window",
        "process", "CPU %", "CPU s", "RSS HWM", "vs agent"
    );
    let row = |name: &str, ns: u64, hwm: Option<u64>, what: &str| {
        let agent = c.agent_cpu_ns.0.max(1) as f64;
        println!(
            "  {name:<22} {:>8.3}% {:>9.3} {:>10} {:>8.2}x  {what}",
            ns as f64 / 1e9 / c.wall * 100.0,
            ns as f64 / 1e9,
            hwm.map_or(String::new(), |k| format!("{:.1} MB", k as f64 / 1024.0)),
            ns as f64 / agent,
        )
    };
    let (all, log) = c.agent_cpu_ns;
    let shipped = format!(
        "{:.1} kB of batches (metrics, notable lines)",
        c.agent_shipped as f64 / 1e3
    );
    row("warden-agent", all, Some(c.agent_hwm_kib), &shipped);
    row("  its log thread", log, None, "");
    for (i, p) in c.peers.iter().enumerate() {
        let (db, dl) = c.delivered[i];
        let what = format!(
            "{dl} of {wl} lines ({:+}), {:.3} MB",
            dl as i64 - wl as i64,
            db as f64 / 1e6
        );
        row(p.name, c.cpu[i], Some(status_kib(p.pid(), "VmHWM:")), &what);
    }
    for (p, v) in c.peers.iter().zip(&c.versions) {
        println!("  {}: {v}", p.name);
    }
    let all_in = || c.peers.iter().all(|p| p.delivered().1 >= c.lines_total);
    let _ = warden_testkit::poll(Duration::from_secs(10), || all_in().then_some(()));
    for p in c.peers {
        println!(
            "  {} delivered {} of {} lines written in all",
            p.name,
            p.delivered().1,
            c.lines_total
        );
    }
}
