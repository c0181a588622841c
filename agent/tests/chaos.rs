//! Chaos on the real `warden-agent` process: a flood of a million XID lines in the
//! kernel log it follows. Its CPU time (`/proc/<pid>/stat`, all threads) and peak RSS
//! (`VmHWM` in `/proc/<pid>/status`) stay within stated bounds, and what it ships is
//! deduplicated: one event per distinct (code, GPU), repeats folded into counts, every
//! line counted.

use std::io::Write;
use std::time::Instant;

mod support;
use support::{AgentProc, Sink, agent_config, free_port, metric, status_kib};
use warden_model::wire::{Batch, NodeEventKind};
use warden_testkit::{PATIENCE, wait_until};

/// Lines in the flood.
const LINES: u64 = 1_000_000;
/// Distinct (code, GPU) pairs the flood cycles through.
const DISTINCT: u64 = 29;
/// CPU seconds the agent may spend on the flood, per million lines (all threads: read,
/// parse, deduplicate, ship). It measured 1.05 s on the 2-vCPU development machine; the
/// bound leaves room for a loaded one.
const CPU_SECS_PER_MILLION: f64 = 4.0;
/// Peak resident memory the agent may reach, KiB (it measured 11 MB through the flood;
/// steady state with 8 GPUs and a busy log is about 20 MB).
const PEAK_RSS_KIB: u64 = 32 << 10;

/// CPU time of `pid` so far (user + system, every thread), seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / clock_ticks() as f64
}

/// The XID counters of `/metrics` text, summed over codes and GPUs.
fn xid_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("warden_gpu_xid_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The distinct (PCI address, code) pairs of the XID events in `batches`.
fn distinct_xids(batches: &[Batch]) -> std::collections::BTreeSet<(String, Option<u32>)> {
    batches
        .iter()
        .flat_map(|b| b.events.iter())
        .filter(|e| NodeEventKind::from_wire(e.kind) == NodeEventKind::Xid)
        .map(|e| (e.pci_bus_id.clone(), e.code))
        .collect()
}

/// `sysconf(_SC_CLK_TCK)`, through `getconf`.
fn clock_ticks() -> u64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK")
}

/// Line `i` of the flood: dmesg form, one of `DISTINCT` (code, GPU) pairs, with the
/// varying pids, channels and addresses real floods have.
fn flood_line(i: u64, out: &mut String) {
    use std::fmt::Write as _;
    let k = i % DISTINCT;
    let code = [
        13u32, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94,
    ][(k % 15) as usize];
    let bus = 0x18 + (k / 15) as u32 * 0x20;
    let _ = writeln!(
        out,
        "[{}.{:06}] NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, pid={}, name=python3, Ch 0000{:04x}, MMU Fault @ 0x7f_{:08x}",
        i / 1000,
        i % 1_000_000,
        1000 + i % 977,
        i % 4096,
        i.wrapping_mul(2_654_435_761) & 0xffff_ffff
    );
}

#[test]
fn a_million_line_xid_flood_keeps_the_agent_within_cpu_and_memory_bounds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let controller = free_port();
    let (config, port) = agent_config(
        dir.path(),
        "flood-node",
        &format!("http://127.0.0.1:{controller}"),
        "",
    );
    let kern = dir.path().join("flood-node").join("kern.log");
    let sink = Sink::start(controller);
    let mut agent = AgentProc::start(&config, port);
    let pid = agent.pid();
    // Start-up is over once the first batch (a heartbeat) is delivered: its CPU time
    // is not the flood's.
    sink.wait_for("the agent's first batch", |b| !b.is_empty());
    let cpu_before = cpu_secs(pid);
    let rss_before = status_kib(pid, "VmRSS:");

    // The flood, appended in blocks while the agent follows the file.
    let started = Instant::now();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&kern)
        .expect("kernel log");
    let mut block = String::new();
    for i in 0..LINES {
        flood_line(i, &mut block);
        if block.len() >= 1 << 20 {
            file.write_all(block.as_bytes()).expect("append");
            block.clear();
        }
    }
    file.write_all(block.as_bytes()).expect("append");
    drop(file);
    let written = started.elapsed();

    // Every line read.
    wait_until("the agent to read the whole flood", PATIENCE * 2, || {
        assert!(agent.alive(), "the agent exited during the flood");
        agent
            .scrape()
            .and_then(|m| metric(&m, "warden_agent_kmsg_lines_total"))
            .is_some_and(|n| n as u64 >= LINES)
    });
    let read = started.elapsed();
    // The collector counts a poll's lines before its XIDs, and both before it queues
    // the poll's events, which a flush later reach the controller: wait for each.
    let m = agent.wait_metrics("the XID counters to add up to the flood", |m| {
        xid_total(m) >= LINES
    });
    let batches = sink.wait_for("an event for every distinct XID", |b| {
        distinct_xids(b).len() as u64 >= DISTINCT
    });
    let shipped_by = started.elapsed();
    let cpu = cpu_secs(pid) - cpu_before;
    let peak = status_kib(pid, "VmHWM:");
    assert!(agent.alive());

    // Deduplicated: one event per (code, GPU) first seen, no matter how many lines.
    let xids: Vec<_> = batches
        .iter()
        .flat_map(|b| b.events.iter())
        .filter(|e| NodeEventKind::from_wire(e.kind) == NodeEventKind::Xid)
        .collect();
    let firsts = distinct_xids(&batches);
    assert_eq!(firsts.len() as u64, DISTINCT, "{firsts:?}");
    // First sightings, plus a repeat count per key every 10 s at most while the batches
    // were shipped (from the flood's start to the copy of them).
    let bound = DISTINCT as usize * (2 + shipped_by.as_secs() as usize / 10);
    assert!(
        xids.len() <= bound,
        "{} XID events shipped for {LINES} lines (bound {bound})",
        xids.len()
    );
    // Every line is counted: the per-code XID counters add up to the flood.
    assert_eq!(xid_total(&m), LINES, "XID counters");

    let per_million = cpu / (LINES as f64 / 1e6);
    eprintln!(
        "flood (agent process): {LINES} lines written in {:.1} s, read by {:.1} s; agent CPU \
         {cpu:.2} s ({per_million:.2} s per million lines, bound {CPU_SECS_PER_MILLION}); \
         peak RSS {peak} KiB (bound {PEAK_RSS_KIB}; {rss_before} KiB before the flood); \
         {} XID events shipped ({} distinct)",
        written.as_secs_f64(),
        read.as_secs_f64(),
        xids.len(),
        firsts.len()
    );
    assert!(
        per_million <= CPU_SECS_PER_MILLION,
        "{per_million:.2} CPU s per million lines (bound {CPU_SECS_PER_MILLION})"
    );
    assert!(
        peak <= PEAK_RSS_KIB,
        "peak RSS {peak} KiB (bound {PEAK_RSS_KIB})"
    );
}
