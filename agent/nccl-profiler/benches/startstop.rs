//! Cost of a collective's start and stop events, called through the v5 entry points the
//! way NCCL calls them (one thread, real descriptors, a live segment), and proof that
//! the path allocates nothing.
//!
//! `cargo bench -p warden-nccl-profiler --bench startstop`. Prints the median and
//! percentiles of ns per start+stop pair over batches of 1,000 pairs; also the cost with
//! two ProxyOp children per collective (the default mask's completion path), a p2p
//! send's start+stop (numbered per peer and direction: sends to eight peers in turn), and, for
//! reading the numbers against the machine's state, one CLOCK_REALTIME read (a pair
//! takes two) measured the same way in the same run.
#![allow(unsafe_code)] // the entry points are C function pointers

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/counting.rs"]
mod counting;

use std::time::Instant;

use common::{Comm, allreduce, my_pid, proxy_op, send, stop};
use warden_nccl_profiler::shm::now_ns;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

const BATCH: u64 = 1_000;
const BATCHES: usize = 2_000;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut per_pair: Vec<f64>) -> f64 {
    per_pair.sort_by(f64::total_cmp);
    let median = percentile(&per_pair, 0.5);
    println!(
        "{name:<44} median {median:>6.1} ns   p10 {:>6.1}   p90 {:>6.1}   p99 {:>6.1}   ({BATCHES} batches of {BATCH})",
        percentile(&per_pair, 0.1),
        percentile(&per_pair, 0.9),
        percentile(&per_pair, 0.99),
    );
    median
}

fn main() {
    let c = Comm::init(0x3001, 0);
    let mut coll = allreduce(0, 1 << 20);
    let pid = my_pid();

    // Warm-up.
    for _ in 0..100_000 {
        stop(c.start(&mut coll));
    }

    let mut plain = Vec::with_capacity(BATCHES);
    let mut children = Vec::with_capacity(BATCHES);
    let before = counting::allocations();
    for b in 0..BATCHES {
        let t = Instant::now();
        for i in 0..BATCH {
            coll.u.coll.seqNumber = b as u64 * BATCH + i;
            let h = c.start(&mut coll);
            stop(h);
        }
        plain.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    let allocs = counting::allocations() - before;

    let before_children = counting::allocations();
    for _ in 0..BATCHES {
        let t = Instant::now();
        for _ in 0..BATCH {
            let h = c.start(&mut coll);
            let send = c.start(&mut proxy_op(h, pid, true));
            let recv = c.start(&mut proxy_op(h, pid, false));
            stop(h);
            stop(send);
            stop(recv);
        }
        children.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    let allocs_children = counting::allocations() - before_children;

    let mut sends: Vec<_> = (1..=8).map(|peer| send(1 << 20, peer)).collect();
    let mut p2p = Vec::with_capacity(BATCHES);
    let before_p2p = counting::allocations();
    for _ in 0..BATCHES {
        let t = Instant::now();
        for i in 0..BATCH {
            let h = c.start(&mut sends[(i % 8) as usize]);
            stop(h);
        }
        p2p.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    let allocs_p2p = counting::allocations() - before_p2p;

    let mut clock = Vec::with_capacity(BATCHES);
    let mut sink = 0i64;
    for _ in 0..BATCHES {
        let t = Instant::now();
        for _ in 0..BATCH {
            sink = sink.wrapping_add(now_ns());
        }
        clock.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    std::hint::black_box(sink);

    let median = report("Coll start+stop", plain);
    report("Coll start+stop with 2 ProxyOp children", children);
    report("P2p send start+stop (8 peers in turn)", p2p);
    report("reference: one CLOCK_REALTIME read", clock);
    println!(
        "allocations during the measured loops: {allocs} (plain), {allocs_children} (with children), {allocs_p2p} (p2p)"
    );
    let s = c.read();
    println!(
        "segment: {} started, {} completed, {} dropped events, {} dropped writes",
        s.counters.coll_started,
        s.counters.coll_completed,
        s.counters.dropped_events,
        s.counters.dropped_writes
    );
    c.finalize();
    assert_eq!(
        allocs + allocs_children + allocs_p2p,
        0,
        "the event path allocated"
    );
    if median > 100.0 {
        println!("note: median above the 100 ns target");
    }
}
