//! Template-mining throughput and peak memory.
//!
//! `cargo bench -p warden-diagnosis --bench drain`
//!
//! Environment:
//! - `DRAIN_BENCH_MODE`: `file` (mine a log file), `stream` (generate lines in memory and
//!   mine them, for runs longer than a file on disk), or `both` (default).
//! - `DRAIN_BENCH_FILE`: the log to mine; generated (1 GiB, default seed) when missing.
//!   Default `target/bench-data/train-1g.log`.
//! - `DRAIN_BENCH_LINES`: mine at most this many lines of the file (default: all).
//! - `DRAIN_BENCH_THREADS`: `1` (default) or `2`: the file mode reads, splits and
//!   hashes lines on a second thread (`drain::Threads::Two`; same result).
//! - `DRAIN_BENCH_STREAM_LINES`: lines for the stream mode (default 10,000,000).
//!
//! Prints one `RESULT key=value ...` line per run for scripts, after a readable summary.
//! Only the miner is timed (in the file mode, reading the file in 1 MiB blocks too, as a
//! real pass would; in the stream mode generation is excluded). Peak memory is the process's
//! `VmHWM` from /proc/self/status.

use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use warden_diagnosis::drain::{DrainConfig, LineMeta, LineRef, Miner, Threads, mine_reader};
use warden_diagnosis::loggen::{GenConfig, LogGen, write_log};

fn main() {
    let mode = std::env::var("DRAIN_BENCH_MODE").unwrap_or_else(|_| "both".to_owned());
    if (mode == "file" || mode == "both")
        && let Err(e) = bench_file()
    {
        eprintln!("drain bench (file): {e}");
        std::process::exit(1);
    }
    if mode == "stream" || mode == "both" {
        bench_stream();
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
}

/// Rank and node from `<ts> <host> [rankN]:...`, the generator's prefix.
fn prefix(line: &[u8]) -> LineMeta<'_> {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let _ts = parts.next();
    let node = parts.next().and_then(|n| std::str::from_utf8(n).ok());
    let rank = parts
        .next()
        .and_then(|rest| rest.strip_prefix(b"[rank"))
        .and_then(|rest| rest.split(|&b| b == b']').next())
        .and_then(|digits| std::str::from_utf8(digits).ok())
        .and_then(|digits| digits.parse().ok());
    LineMeta {
        rank,
        node,
        at_ms: None,
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn bench_file() -> Result<(), String> {
    let path = std::env::var("DRAIN_BENCH_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data/train-1g.log")
        });
    if !path.exists() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        eprintln!("generating {} (1 GiB) ...", path.display());
        let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        write_log(&GenConfig::default(), file).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let limit = env_u64("DRAIN_BENCH_LINES").unwrap_or(u64::MAX);
    let threads = match env_u64("DRAIN_BENCH_THREADS").unwrap_or(1) {
        1 => Threads::One,
        2 => Threads::Two,
        n => return Err(format!("DRAIN_BENCH_THREADS={n}: 1 or 2")),
    };
    let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut miner = Miner::new(DrainConfig::default()).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let read = mine_reader(&mut miner, file, 0, limit, threads, prefix)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let elapsed = start.elapsed();
    let mode = match threads {
        Threads::One => "file",
        Threads::Two => "file-2t",
    };
    report(mode, read.lines, read.bytes, elapsed, &miner);
    Ok(())
}

fn bench_stream() {
    let total = env_u64("DRAIN_BENCH_STREAM_LINES").unwrap_or(10_000_000);
    let cfg = GenConfig {
        target_bytes: u64::MAX,
        max_lines: total,
        ..GenConfig::default()
    };
    let hosts: Vec<String> = (0..cfg.nodes).map(|n| format!("gpu-node-{n:03}")).collect();
    let mut generator = LogGen::new(cfg);
    let mut miner = match Miner::new(DrainConfig::default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("drain bench (stream): {e}");
            std::process::exit(1);
        }
    };
    const CHUNK: usize = 65_536;
    let mut chunk: Vec<(String, Option<u32>, u32, i64)> =
        (0..CHUNK).map(|_| (String::new(), None, 0, 0)).collect();
    let mut mined = Duration::ZERO;
    let mut lines = 0u64;
    let mut bytes = 0u64;
    loop {
        let mut filled = 0;
        while filled < CHUNK {
            let slot = &mut chunk[filled];
            match generator.next_line(&mut slot.0) {
                Some(g) => {
                    slot.1 = g.rank;
                    slot.2 = g.node;
                    slot.3 = g.at_ms;
                    filled += 1;
                }
                None => break,
            }
        }
        if filled == 0 {
            break;
        }
        let start = Instant::now();
        for (text, rank, node, at) in &chunk[..filled] {
            miner.add(LineRef {
                id: lines,
                text,
                rank: *rank,
                node: hosts.get(*node as usize).map(String::as_str),
                at_ms: Some(*at),
            });
            lines += 1;
            bytes += text.len() as u64 + 1;
        }
        mined += start.elapsed();
    }
    report("stream", lines, bytes, mined, &miner);
}

fn report(mode: &str, lines: u64, bytes: u64, elapsed: Duration, miner: &Miner) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let stats = miner.stats();
    let rss = peak_rss_kib();
    println!(
        "drain {mode}: {lines} lines, {:.1} MiB in {secs:.2} s: {:.0} lines/s, {:.1} MiB/s; {} templates ({} created, {} evicted), {} tokens, peak RSS {:.1} MiB",
        bytes as f64 / (1 << 20) as f64,
        lines as f64 / secs,
        bytes as f64 / (1 << 20) as f64 / secs,
        stats.clusters,
        stats.clusters_created,
        stats.clusters_evicted,
        stats.tokens,
        rss as f64 / 1024.0
    );
    let mut templates = miner.templates();
    templates.sort_by_key(|t| std::cmp::Reverse(t.count));
    for t in templates.iter().take(5) {
        let text: String = t.text.chars().take(140).collect();
        println!("  {:>10}  {text}", t.count);
    }
    println!(
        "RESULT impl=warden mode={mode} lines={lines} bytes={bytes} secs={secs:.4} lines_per_sec={:.0} templates={} peak_rss_kib={rss}",
        lines as f64 / secs,
        stats.clusters
    );
}
