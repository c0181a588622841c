//! The plugin's v5 entry points called in-process (through the rlib) in the orders
//! NCCL produces, read back with `segment::parse`. Each test uses its own communicator
//! hash, so tests run in parallel on one segment directory.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use std::ffi::c_void;

use common::{
    Comm, allreduce, my_pid, proxy_op, proxy_op_to, proxy_step, record, record_trans, recv, send,
    stop,
};
use warden_nccl_profiler::abi::{event, state};
use warden_nccl_profiler::config::DEFAULT_MASK;
use warden_nccl_profiler::segment::{Kind, LinkTotals, Phase};
use warden_nccl_profiler::shm::{OP_RECORDS, SLOTS};

#[test]
fn init_asks_for_the_default_mask_and_writes_the_header() {
    let c = Comm::init(0x1001, 2);
    assert_eq!(c.mask as u64, DEFAULT_MASK);
    let s = c.read();
    assert_eq!(
        (s.comm_hash, s.comm_rank, s.nranks, s.n_nodes),
        (0x1001, 2, 4, 1)
    );
    assert_eq!(s.comm_name, "test");
    assert_eq!(s.abi_version, 5);
    assert_eq!(s.pid, std::process::id());
    assert!(s.start_ns > 0 && s.pid_ns > 0 && s.proc_start_ticks > 0);
    assert!(!s.finished);
    let path = c.path();
    c.finalize();
    assert!(!path.exists(), "finalize removes the file");
}

#[test]
fn completion_is_the_last_proxy_stop_after_the_enqueue() {
    let c = Comm::init(0x1002, 0);
    let coll = c.start(&mut allreduce(41, 1000));
    assert!(!coll.is_null());
    let s = c.read();
    let started = s.coll.started.expect("started");
    assert_eq!(
        (started.seq, started.nccl_seq, started.bytes),
        (1, 41, 4000)
    );
    assert_eq!((started.op, started.channels), (1, 2));
    assert!(s.coll.enqueued.is_none() && s.coll.completed.is_none());

    // NCCL: the stop event comes right after enqueueing, before the proxy thread
    // started anything. That is not completion.
    stop(coll);
    let s = c.read();
    assert_eq!(s.coll.enqueued.map(|e| e.seq), Some(1));
    assert!(s.coll.completed.is_none());

    let send = c.start(&mut proxy_op(coll, my_pid(), true));
    let recv = c.start(&mut proxy_op(coll, my_pid(), false));
    assert!(!send.is_null() && !recv.is_null());
    record(send, 19);
    stop(send);
    assert!(c.read().coll.completed.is_none(), "one proxy op still runs");
    stop(recv);
    let s = c.read();
    let done = s.coll.completed.expect("completed");
    assert_eq!(
        (done.seq, done.phase, done.kind),
        (1, Phase::Completed, Kind::Coll)
    );
    assert!(done.end_ns >= done.enqueued_ns && done.enqueued_ns >= done.start_ns);
    assert!(done.xfer_ns > 0 && done.xfer_ns as i64 <= done.end_ns - done.start_ns);
    assert_eq!(s.counters.coll_completed, 1);
    assert_eq!(s.counters.child_events, 2);
    let phases: Vec<Phase> = s.recent.iter().map(|e| e.phase).collect();
    assert_eq!(phases, vec![Phase::Started, Phase::Completed]);
    c.finalize();
}

#[test]
fn children_that_finish_before_the_enqueue_complete_at_the_stop() {
    let c = Comm::init(0x1003, 0);
    let coll = c.start(&mut allreduce(0, 8));
    let op = c.start(&mut proxy_op(coll, my_pid(), true));
    stop(op);
    assert!(
        c.read().coll.completed.is_none(),
        "the collective is still open"
    );
    stop(coll);
    let s = c.read();
    assert_eq!(s.coll.completed.map(|e| e.seq), Some(1));
    assert_eq!(s.counters.coll_completed, 1);
    c.finalize();
}

#[test]
fn without_children_only_start_and_enqueue_are_known() {
    let c = Comm::init(0x1004, 0);
    for i in 0..5 {
        let h = c.start(&mut allreduce(i, 16));
        stop(h);
    }
    let s = c.read();
    assert_eq!(s.coll.started.map(|e| e.seq), Some(5));
    assert_eq!(s.coll.enqueued.map(|e| e.seq), Some(5));
    assert!(s.coll.completed.is_none());
    assert!(!s.completion_observed());
    c.finalize();
}

#[test]
fn p2p_operations_count_separately() {
    let c = Comm::init(0x1005, 0);
    let coll = c.start(&mut allreduce(0, 1));
    stop(coll);
    for _ in 0..3 {
        let p = c.start(&mut send(100, 3));
        let op = c.start(&mut proxy_op(p, my_pid(), true));
        stop(p);
        stop(op);
    }
    let s = c.read();
    assert_eq!(s.counters.coll_started, 1);
    assert_eq!(s.counters.p2p_started, 3);
    assert_eq!(s.counters.p2p_completed, 3);
    let last = s.p2p.completed.expect("p2p completed");
    assert_eq!(
        (last.seq, last.kind, last.op, last.bytes, last.peer),
        (3, Kind::P2p, 7, 200, 3)
    );
    c.finalize();
}

#[test]
fn p2p_operations_are_numbered_per_peer_and_direction() {
    let c = Comm::init(0x1007, 0);
    // Pipeline traffic: to and from two peers, interleaved, and one with no peer.
    let ops: [(bool, i32); 7] = [
        (true, 1),
        (false, 1),
        (true, 2),
        (true, 1),
        (false, 1),
        (false, 2),
        (true, -1),
    ];
    for (is_send, peer) in ops {
        let p = c.start(&mut if is_send {
            send(8, peer)
        } else {
            recv(8, peer)
        });
        stop(p);
    }
    let s = c.read();
    let numbered: Vec<(u8, i32, u64, u64)> = s
        .recent
        .iter()
        .filter(|e| e.kind == Kind::P2p && e.phase == Phase::Started)
        .map(|e| (e.op, e.peer, e.seq, e.nccl_seq))
        .collect();
    assert_eq!(
        numbered,
        vec![
            (7, 1, 1, 1),
            (8, 1, 2, 1),
            (7, 2, 3, 1),
            (7, 1, 4, 2),
            (8, 1, 5, 2),
            (8, 2, 6, 1),
            (7, -1, 7, 0),
        ]
    );
    c.finalize();
    // A context used again starts its counts afresh.
    let again = Comm::init(0x1008, 0);
    stop(again.start(&mut send(8, 1)));
    let s = again.read();
    assert_eq!(s.p2p.started.map(|e| e.nccl_seq), Some(1));
    again.finalize();
}

#[test]
fn pxn_proxy_ops_of_other_processes_are_counted_not_followed() {
    let c = Comm::init(0x1006, 0);
    let coll = c.start(&mut allreduce(0, 1));
    let foreign = c.start(&mut proxy_op(
        0xdead_0000usize as *mut _,
        my_pid() + 1,
        true,
    ));
    assert!(foreign.is_null());
    stop(coll);
    let s = c.read();
    assert_eq!(s.counters.foreign_events, 1);
    assert!(s.coll.completed.is_none());
    c.finalize();
}

#[test]
fn an_exhausted_pool_drops_with_a_count_and_recovers() {
    let c = Comm::init(0x100b, 0);
    let held: Vec<_> = (0..SLOTS as u64)
        .map(|i| c.start(&mut allreduce(i, 1)))
        .collect();
    assert!(held.iter().all(|h| !h.is_null()));
    let dropped = c.start(&mut allreduce(999, 1));
    assert!(dropped.is_null(), "no slot left: null handle");
    stop(dropped);
    let s = c.read();
    assert_eq!(s.counters.dropped_events, 1);
    assert_eq!(s.counters.coll_started, SLOTS as u64);
    for h in held {
        stop(h);
    }
    let again = c.start(&mut allreduce(1000, 1));
    assert!(!again.is_null(), "slots come back after their stop");
    stop(again);
    c.finalize();
}

#[test]
fn a_finalized_context_is_reused_with_a_fresh_segment() {
    let a = Comm::init(0x100c, 0);
    for i in 0..3 {
        stop(a.start(&mut allreduce(i, 1)));
    }
    a.finalize();
    let b = Comm::init(0x100d, 0);
    stop(b.start(&mut allreduce(0, 1)));
    let s = b.read();
    assert_eq!(s.comm_hash, 0x100d);
    assert_eq!(s.counters.coll_started, 1);
    assert_eq!(s.recent.len(), 1);
    b.finalize();
}

/// Writers on several threads (two host threads starting collectives on one
/// communicator, proxy threads completing them) while a reader copies the file as the
/// agent does: every record the reader accepts is internally consistent.
#[test]
fn readers_never_accept_a_torn_record() {
    let c = Arc::new(Comm::init(0x100a, 0));
    let done = Arc::new(AtomicBool::new(false));
    let go = Arc::new(Barrier::new(3));
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let (c, go) = (Arc::clone(&c), Arc::clone(&go));
            std::thread::spawn(move || {
                go.wait();
                for i in 0..200_000u64 {
                    let n = t * 1_000_000 + i;
                    // bytes = 4 × count, count = nccl_seq + 1: a torn record breaks it.
                    let h = c.start(&mut allreduce(n, n as usize + 1));
                    let p = c.start(&mut proxy_op(h, my_pid(), true));
                    stop(h);
                    stop(p);
                }
            })
        })
        .collect();
    let reader = {
        let (c, done, go) = (Arc::clone(&c), Arc::clone(&done), Arc::clone(&go));
        std::thread::spawn(move || {
            go.wait();
            let (mut copies, mut torn) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let path = c.path();
                let s = warden_nccl_profiler::segment::read_retrying(
                    || std::fs::read(&path),
                    warden_nccl_profiler::segment::READ_ATTEMPTS,
                )
                .expect("read")
                .expect("parse");
                torn += u64::from(s.torn);
                copies += 1;
                let last = [s.coll.started, s.coll.enqueued, s.coll.completed];
                for e in s.recent.iter().chain(last.iter().flatten()) {
                    assert_eq!(e.bytes, 4 * (e.nccl_seq + 1), "torn record accepted: {e:?}");
                }
            }
            (copies, torn)
        })
    };
    for w in writers {
        w.join().expect("writer");
    }
    done.store(true, Ordering::Relaxed);
    let (copies, torn) = reader.join().expect("reader");
    let s = c.read();
    assert_eq!(s.counters.coll_started, 400_000);
    assert_eq!(s.counters.coll_completed, 400_000);
    eprintln!("{copies} copies read, {torn} torn records seen and left out");
    match Arc::try_unwrap(c) {
        Ok(c) => c.finalize(),
        Err(_) => panic!("threads hold the communicator"),
    }
}

const STEPS: Option<&str> = Some("default+proxystep");

/// One send step as NCCL's send proxy runs it: start, SendGPUWait, SendPeerWait,
/// SendWait with the bytes, stop. The step's handle.
fn send_step(c: &Comm, op: *mut c_void, step: i32, bytes: usize) -> *mut c_void {
    let h = c.start(&mut proxy_step(op, step));
    record(h, state::PROXY_STEP_SEND_GPU_WAIT);
    record(h, state::PROXY_STEP_SEND_PEER_WAIT);
    record_trans(h, state::PROXY_STEP_SEND_WAIT, bytes);
    stop(h);
    h
}

#[test]
fn send_steps_are_timed_per_peer_and_completion_still_works() {
    let c = Comm::init_with_mask(0x1101, 0, STEPS);
    assert_eq!(c.mask as u64, DEFAULT_MASK | event::PROXY_STEP);
    let coll = c.start(&mut allreduce(1, 1024));
    stop(coll);
    let to1 = c.start(&mut proxy_op_to(coll, my_pid(), true, 1));
    let to2 = c.start(&mut proxy_op_to(coll, my_pid(), true, 2));
    assert!(!to1.is_null() && !to2.is_null());
    record(to1, state::PROXY_OP_IN_PROGRESS);
    for step in 0..10 {
        assert!(!send_step(&c, to1, step, 1000).is_null());
    }
    // Several steps in flight at once on one op, stopped out of order.
    let a = c.start(&mut proxy_step(to2, 0));
    let b = c.start(&mut proxy_step(to2, 1));
    assert_ne!(a, b);
    record_trans(a, state::PROXY_STEP_SEND_WAIT, 300);
    record_trans(b, state::PROXY_STEP_SEND_WAIT, 200);
    std::thread::sleep(std::time::Duration::from_millis(2));
    stop(b);
    stop(a);
    // SendWait with no arguments: the step counts, with no bytes.
    let n = c.start(&mut proxy_step(to2, 2));
    record(n, state::PROXY_STEP_SEND_WAIT);
    stop(n);
    assert!(c.read().coll.completed.is_none(), "the ops still run");
    stop(to1);
    stop(to2);
    let s = c.read();
    let mut links = s.links.clone();
    links.sort_by_key(|l| l.peer);
    assert_eq!(links.len(), 2, "{links:?}");
    assert_eq!(
        (links[0].peer, links[0].steps, links[0].bytes),
        (1, 10, 10_000)
    );
    assert_eq!((links[1].peer, links[1].steps, links[1].bytes), (2, 3, 500));
    assert!(
        links[1].busy_ns >= 2 * 2_000_000,
        "two steps waited 2 ms: {links:?}"
    );
    assert!(links[0].busy_ns < links[1].busy_ns);
    assert_eq!(s.counters.link_overflow, 0);
    let done = s.coll.completed.expect("completed through the timed ops");
    assert_eq!(done.seq, 1);
    assert!(done.xfer_ns > 0);
    assert_eq!(s.counters.coll_completed, 1);
    assert_eq!(s.counters.child_events, 2);
    c.finalize();
}

#[test]
fn an_exhausted_step_record_pool_falls_back_and_counts() {
    let c = Comm::init_with_mask(0x1102, 0, STEPS);
    let coll = c.start(&mut allreduce(0, 8));
    stop(coll);
    let held: Vec<_> = (0..OP_RECORDS)
        .map(|_| c.start(&mut proxy_op_to(coll, my_pid(), true, 1)))
        .collect();
    assert!(held.iter().all(|h| !h.is_null()));
    // Every record is busy: the next send op runs as without `proxystep`.
    let untimed = c.start(&mut proxy_op_to(coll, my_pid(), true, 3));
    assert!(!untimed.is_null(), "the op still gets a handle");
    let step = c.start(&mut proxy_step(untimed, 0));
    assert!(step.is_null(), "its steps are not followed");
    record_trans(step, state::PROXY_STEP_SEND_WAIT, 64);
    stop(step);
    let s = c.read();
    assert_eq!(s.counters.link_overflow, 1);
    assert_eq!(s.counters.child_events, OP_RECORDS as u64 + 1);
    assert!(s.links.is_empty());
    assert!(s.coll.completed.is_none());
    stop(untimed);
    assert!(c.read().coll.completed.is_none(), "timed ops still run");
    for h in held {
        stop(h);
    }
    let s = c.read();
    assert_eq!(s.coll.completed.map(|e| e.seq), Some(1));
    assert_eq!(s.counters.coll_completed, 1);
    // Records come back after their op's stop.
    let coll = c.start(&mut allreduce(1, 8));
    let op = c.start(&mut proxy_op_to(coll, my_pid(), true, 3));
    send_step(&c, op, 0, 64);
    stop(op);
    stop(coll);
    let s = c.read();
    assert_eq!(
        s.links
            .iter()
            .map(|l| (l.peer, l.steps))
            .collect::<Vec<_>>(),
        vec![(3, 1)]
    );
    assert_eq!(s.counters.link_overflow, 1);
    assert_eq!(s.counters.coll_completed, 2);
    c.finalize();
}

#[test]
fn receive_steps_add_nothing() {
    let c = Comm::init_with_mask(0x1103, 0, STEPS);
    let coll = c.start(&mut allreduce(0, 8));
    let op = c.start(&mut proxy_op_to(coll, my_pid(), false, 2));
    assert!(!op.is_null());
    for step in 0..4 {
        let h = c.start(&mut proxy_step(op, step));
        record(h, state::PROXY_STEP_RECV_WAIT);
        record_trans(h, state::PROXY_STEP_RECV_FLUSH_WAIT, 4096);
        record(h, state::PROXY_STEP_RECV_GPU_WAIT);
        // Not a receive state; still nothing for a receive op.
        record_trans(h, state::PROXY_STEP_SEND_WAIT, 4096);
        stop(h);
    }
    stop(op);
    stop(coll);
    let s = c.read();
    assert_eq!(s.links, Vec::<LinkTotals>::new());
    assert_eq!(s.counters.link_overflow, 0);
    assert_eq!(s.coll.completed.map(|e| e.seq), Some(1));
    c.finalize();
}

#[test]
fn a_step_stopped_without_send_wait_adds_nothing() {
    let c = Comm::init_with_mask(0x1104, 0, STEPS);
    let coll = c.start(&mut allreduce(0, 8));
    let op = c.start(&mut proxy_op_to(coll, my_pid(), true, 5));
    let h = c.start(&mut proxy_step(op, 0));
    assert!(!h.is_null());
    record(h, state::PROXY_STEP_SEND_GPU_WAIT);
    record(h, state::PROXY_STEP_SEND_PEER_WAIT);
    stop(h);
    assert!(c.read().links.is_empty(), "no SendWait, no sample");
    // The same step index again: its SendWait from a step before does not linger.
    send_step(&c, op, 8, 128);
    let h = c.start(&mut proxy_step(op, 16));
    stop(h);
    // A second stop of a step handle adds nothing either.
    let again = send_step(&c, op, 1, 128);
    stop(again);
    stop(op);
    stop(coll);
    let s = c.read();
    assert_eq!(
        s.links
            .iter()
            .map(|l| (l.peer, l.steps, l.bytes))
            .collect::<Vec<_>>(),
        vec![(5, 2, 256)]
    );
    c.finalize();
}

#[test]
fn the_default_mask_writes_no_links() {
    let c = Comm::init(0x1105, 0);
    assert_eq!(c.mask as u64 & event::PROXY_STEP, 0);
    let coll = c.start(&mut allreduce(0, 8));
    let op = c.start(&mut proxy_op_to(coll, my_pid(), true, 1));
    assert!(!op.is_null());
    // NCCL sends no steps without the bit; if it did, they would not be followed.
    let h = c.start(&mut proxy_step(op, 0));
    assert!(h.is_null());
    record_trans(h, state::PROXY_STEP_SEND_WAIT, 64);
    stop(h);
    stop(op);
    stop(coll);
    let s = c.read();
    assert!(s.links.is_empty());
    assert_eq!(s.counters.link_overflow, 0);
    assert_eq!(s.coll.completed.map(|e| e.seq), Some(1));
    let path = c.path();
    c.finalize();
    // A context used again with `proxystep` times steps; used again without, it stops.
    let timed = Comm::init_with_mask(0x1106, 0, STEPS);
    let coll = timed.start(&mut allreduce(0, 8));
    let op = timed.start(&mut proxy_op_to(coll, my_pid(), true, 1));
    send_step(&timed, op, 0, 64);
    stop(op);
    stop(coll);
    assert_eq!(timed.read().links.len(), 1);
    timed.finalize();
    let plain = Comm::init(0x1107, 0);
    let coll = plain.start(&mut allreduce(0, 8));
    let op = plain.start(&mut proxy_op_to(coll, my_pid(), true, 1));
    assert!(plain.start(&mut proxy_step(op, 0)).is_null());
    stop(op);
    stop(coll);
    assert!(plain.read().links.is_empty());
    plain.finalize();
    assert!(!path.exists());
}
