//! Cost of a collective's start and stop events, called through the v5 entry points the
//! way NCCL calls them (one thread, real descriptors, a live segment), and proof that
//! the path allocates nothing.
//!
//! `cargo bench -p warden-nccl-profiler --bench startstop`. Prints the median and
//! percentiles of ns per start+stop pair over batches of 1,000 pairs; also the cost with
//! two ProxyOp children per collective (the default mask's completion path), a p2p
//! send's start+stop (numbered per peer and direction: sends to eight peers in turn), and, for
//! reading the numbers against the machine's state, one CLOCK_REALTIME read (a pair
//! takes two) measured the same way in the same run. Then, on a second communicator
//! under `default+proxystep`, one timed send ProxyStep: its start, the three state
//! records NCCL makes (SendGPUWait, SendPeerWait, SendWait with the bytes) and its
//! stop, per step, under send ProxyOps to four peers in turn.
#![allow(unsafe_code)] // the entry points are C function pointers

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/counting.rs"]
mod counting;

use std::time::Instant;

use common::{
    Comm, allreduce, my_pid, proxy_op, proxy_op_to, proxy_step, record, record_trans, send, stop,
};
use warden_nccl_profiler::abi::state;
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

    // ProxySteps under `default+proxystep`: one collective holds send ops to four peers
    // (a batch of steps per op, then a new op), as a ring's proxy thread does.
    let t = Comm::init_with_mask(0x3002, 0, Some("default+proxystep"));
    let mut tcoll = allreduce(0, 1 << 20);
    let parent = t.start(&mut tcoll);
    stop(parent);
    let mut timed = Vec::with_capacity(BATCHES);
    let mut steps_done = 0u64;
    let before_steps = counting::allocations();
    for b in 0..BATCHES + BATCHES / 10 {
        // One op per batch, opened and closed outside the timed loop.
        let op = t.start(&mut proxy_op_to(parent, pid, true, (b % 4) as i32 + 1));
        let begin = Instant::now();
        for i in 0..BATCH {
            let h = t.start(&mut proxy_step(op, i as i32));
            record(h, state::PROXY_STEP_SEND_GPU_WAIT);
            record(h, state::PROXY_STEP_SEND_PEER_WAIT);
            record_trans(h, state::PROXY_STEP_SEND_WAIT, 1 << 19);
            stop(h);
        }
        let per_step = begin.elapsed().as_nanos() as f64 / BATCH as f64;
        stop(op);
        steps_done += BATCH;
        // The first tenth warms up.
        if b >= BATCHES / 10 {
            timed.push(per_step);
        }
    }
    let allocs_steps = counting::allocations() - before_steps;

    let median = report("Coll start+stop", plain);
    report("Coll start+stop with 2 ProxyOp children", children);
    report("P2p send start+stop (8 peers in turn)", p2p);
    report("reference: one CLOCK_REALTIME read", clock);
    report("ProxyStep start+3 states+stop (proxystep)", timed);
    println!(
        "allocations during the measured loops: {allocs} (plain), {allocs_children} (with children), {allocs_p2p} (p2p), {allocs_steps} (proxy steps)"
    );
    let ts = t.read();
    let timed_steps: u64 = ts.links.iter().map(|l| l.steps).sum();
    println!(
        "proxystep segment: {} links, {timed_steps} of {steps_done} steps timed, {} overflow",
        ts.links.len(),
        ts.counters.link_overflow
    );
    assert_eq!(timed_steps, steps_done, "every step was timed");
    t.finalize();
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
        allocs + allocs_children + allocs_p2p + allocs_steps,
        0,
        "the event path allocated"
    );
    if median > 100.0 {
        println!("note: median above the 100 ns target");
    }
}
