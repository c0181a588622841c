//! Ingest throughput on one thread: realistic binary batches of a 1,024-rank job (128
//! nodes x 8 ranks, 4 communicators per rank, one batch per node per second, each
//! carrying the previous batch's completions again as agents do) through
//! `Engine::ingest` (decode + state), then through the decoder alone. Rates count new
//! collective events; the repeats are decoded and dropped as stale on top.
//!
//! `cargo bench -p warden-engine --bench ingest`; set `WARDEN_BENCH_EVENTS` to
//! change the number of collective events (default 6,000,000).

use std::hint::black_box;
use std::time::{Duration, Instant};

use warden_engine::{Encoding, Engine, EngineConfig};
use warden_model::Timestamp;
use warden_model::wire::{
    Batch, CollOp, CollectiveEvent, CommInfo, Heartbeat, JobSignals, RankInfo, TrainingMetric,
};

const NODES: u32 = 128;
const GPUS_PER_NODE: u32 = 8;
const WORLD: u32 = NODES * GPUS_PER_NODE;
const TP: u32 = 8;
const PP: u32 = 4;
const DP: u32 = WORLD / (TP * PP);
/// Seconds of batches built before each timed block (bounds memory).
const BLOCK_SECS: u64 = 8;
/// Registrations are repeated this often, seconds (as agents do).
const REGISTER_EVERY_SECS: u64 = 10;
const T0: i64 = 1_767_225_600_000_000_000;
const SEC: i64 = 1_000_000_000;

/// The four communicators of a rank and the collectives each runs per second:
/// (kind id, name prefix, operations per second, operation, payload bytes).
const COMMS: [(u64, &str, u64, CollOp, u64); 4] = [
    (1, "tp", 6, CollOp::AllReduce, 32 << 20),
    (2, "pp", 2, CollOp::SendRecv, 16 << 20),
    (3, "dp", 3, CollOp::ReduceScatter, 256 << 20),
    (4, "mp", 1, CollOp::AllGather, 4 << 20),
];

/// Rank `r` = ((stage * DP) + dp_index) * TP + tp_index.
fn group_of(kind: u64, r: u32) -> (u32, u32, u32) {
    let tp_i = r % TP;
    let dp_i = (r / TP) % DP;
    let stage = r / (TP * DP);
    // (group index, group size, rank within the group)
    match kind {
        1 => (r / TP, TP, tp_i),
        2 => (dp_i * TP + tp_i, PP, stage),
        3 => (stage * TP + tp_i, DP, dp_i),
        _ => (dp_i, TP * PP, stage * TP + tp_i),
    }
}

fn comm_hash(kind: u64, group: u32) -> u64 {
    // A fixed odd multiplier spreads the ids like NCCL's hashes.
    (kind << 56 | u64::from(group)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// One node's batch for second `sec` of the job.
fn node_batch(node: u32, sec: u64, seq: u64) -> Batch {
    let base = T0 + sec as i64 * SEC;
    let register = sec.is_multiple_of(REGISTER_EVERY_SECS);
    let ranks = node * GPUS_PER_NODE..(node + 1) * GPUS_PER_NODE;
    let mut job = JobSignals {
        job: "bench-llama".into(),
        ..Default::default()
    };
    for r in ranks {
        if register {
            job.ranks.push(RankInfo {
                rank: r,
                world_size: WORLD,
                pid: 10_000 + r,
                gpu_index: Some(r % GPUS_PER_NODE),
                gpu_uuid: format!("GPU-{node:04}-{}", r % GPUS_PER_NODE),
            });
        }
        // Ranks skew slightly and deterministically, as real ones do.
        let skew = i64::from((r * 7919) % 1000) * 1_000;
        for (kind, name, per_sec, op, bytes) in COMMS {
            let (group, size, comm_rank) = group_of(kind, r);
            let comm = comm_hash(kind, group);
            if register {
                job.comms.push(CommInfo {
                    comm,
                    name: format!("{name}-{group}"),
                    size,
                    rank: r,
                    comm_rank,
                });
            }
            let slot = SEC / per_sec as i64;
            for j in 0..per_sec {
                let start = base + j as i64 * slot + kind as i64 * 10_000_000 + skew;
                let dur = slot / 3;
                job.collectives.push(CollectiveEvent {
                    comm,
                    rank: r,
                    seq: sec * per_sec + j + 1,
                    op: op as i32,
                    bytes,
                    start_ns: start,
                    end_ns: start + dur,
                    xfer_ns: (dur / 2) as u64,
                });
            }
        }
        job.metrics.push(TrainingMetric {
            rank: r,
            step: sec,
            at_ns: base + SEC - 1_000_000,
            loss: Some(2.0 + 1.0 / (1.0 + sec as f64)),
            grad_norm: Some(1.0),
            tokens_per_s: Some(4096.0),
            first_nonfinite_op: None,
        });
    }
    Batch {
        version: 0,
        node: format!("node-{node:03}"),
        agent_id: format!("agent-{node:03}"),
        boot_id: format!("boot-{node:03}"),
        seq,
        sent_at_ns: base + SEC,
        jobs: vec![job],
        gpus: vec![],
        events: vec![],
        heartbeat: Some(Heartbeat::default()),
    }
}

/// Batches of seconds `from..from + n`, every node, in arrival order. As the agent
/// contract requires, each batch also carries the previous batch's completed
/// collectives (ahead of its own); the count returned is of new events only.
fn block(from: u64, n: u64) -> (Vec<Vec<u8>>, u64) {
    let mut out = Vec::with_capacity((n * u64::from(NODES)) as usize);
    let mut events = 0u64;
    for sec in from..from + n {
        for node in 0..NODES {
            let mut b = node_batch(node, sec, sec + 1);
            if sec > 0 {
                let prev = node_batch(node, sec - 1, sec);
                for (j, p) in b.jobs.iter_mut().zip(prev.jobs) {
                    let mut carried: Vec<_> = p
                        .collectives
                        .into_iter()
                        .filter(|c| c.end_ns != 0)
                        .collect();
                    events += j.collectives.len() as u64;
                    carried.append(&mut j.collectives);
                    j.collectives = carried;
                }
            } else {
                events += b
                    .jobs
                    .iter()
                    .map(|j| j.collectives.len() as u64)
                    .sum::<u64>();
            }
            out.push(b.encode_binary());
        }
    }
    (out, events)
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let target: u64 = std::env::var("WARDEN_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6_000_000);
    let per_sec = u64::from(WORLD) * COMMS.iter().map(|c| c.2).sum::<u64>();
    let secs = target.div_ceil(per_sec).max(BLOCK_SECS);
    println!(
        "ingest benchmark: {NODES} nodes x {GPUS_PER_NODE} ranks (tp {TP}, pp {PP}, dp {DP}), \
         4 comms per rank, {per_sec} collective events per job-second, {secs} job-seconds"
    );

    let mut engine = Engine::new(EngineConfig::default(), Timestamp(T0));
    let (mut ingest_time, mut decode_time, mut tick_time) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut events, mut batches, mut bytes, mut ticks) = (0u64, 0u64, 0u64, 0u64);
    let mut sec = 0;
    while sec < secs {
        let n = BLOCK_SECS.min(secs - sec);
        let (bodies, block_events) = block(sec, n);

        let started = Instant::now();
        for (i, body) in bodies.iter().enumerate() {
            let now = Timestamp(T0 + (sec + i as u64 / u64::from(NODES) + 1) as i64 * SEC);
            if let Err(e) = engine.ingest(body, Encoding::Binary, now) {
                eprintln!("batch rejected: {e}");
                std::process::exit(1);
            }
        }
        ingest_time += started.elapsed();

        // The controller runs its detectors a few times a second; time them apart.
        let started = Instant::now();
        for s in sec..sec + n {
            black_box(engine.tick(Timestamp(T0 + (s as i64 + 1) * SEC + SEC / 2)));
            ticks += 1;
        }
        tick_time += started.elapsed();

        let started = Instant::now();
        for body in &bodies {
            match Batch::decode_binary(black_box(body)) {
                Ok(b) => {
                    black_box(&b);
                }
                Err(e) => {
                    eprintln!("batch does not decode: {e}");
                    std::process::exit(1);
                }
            }
        }
        decode_time += started.elapsed();

        events += block_events;
        batches += bodies.len() as u64;
        bytes += bodies.iter().map(|b| b.len() as u64).sum::<u64>();
        sec += n;
    }

    let stats = engine.stats();
    println!(
        "{batches} batches, {events} new collective events (each also carried once more), {:.1} MiB, {:.0} bytes per new event",
        bytes as f64 / f64::from(1 << 20),
        bytes as f64 / events as f64
    );
    println!(
        "decode + state: {:>12.0} collective events/s  ({:.0} batches/s, {:.0} MiB/s, {:.2} s)",
        rate(events, ingest_time),
        rate(batches, ingest_time),
        rate(bytes, ingest_time) / f64::from(1 << 20),
        ingest_time.as_secs_f64()
    );
    println!(
        "decode only:    {:>12.0} collective events/s  ({:.0} batches/s, {:.0} MiB/s, {:.2} s)",
        rate(events, decode_time),
        rate(batches, decode_time),
        rate(bytes, decode_time) / f64::from(1 << 20),
        decode_time.as_secs_f64()
    );
    println!(
        "detector tick:  {:>12.2} ms per pass ({ticks} passes over {WORLD} ranks)",
        tick_time.as_secs_f64() * 1e3 / ticks.max(1) as f64
    );
    println!(
        "engine counted {} collective events applied, {} stale, {} other records, {} incidents",
        stats.collective_events,
        stats.stale_records,
        stats.other_records,
        engine.incidents().len()
    );
}
