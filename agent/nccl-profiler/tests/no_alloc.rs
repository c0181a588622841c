//! The event path allocates nothing: collective start/stop, with and without proxy
//! children, p2p, and (mask `proxystep`) timed send steps, counted by a per-thread
//! counting allocator.

mod common;
#[path = "common/counting.rs"]
mod counting;

use common::{
    Comm, allreduce, my_pid, proxy_op, proxy_op_to, proxy_step, record, record_trans, send, stop,
};
use warden_nccl_profiler::abi::state;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

#[test]
fn the_event_path_never_allocates() {
    let c = Comm::init(0x2001, 0);
    let mut coll = allreduce(0, 1024);
    let mut p2p = send(64, 1);
    let pid = my_pid();
    // Warm up once (first-use initialisation anywhere on the path would show here).
    stop(c.start(&mut coll));
    let before = counting::allocations();
    for i in 0..10_000u64 {
        coll.u.coll.seqNumber = i;
        let h = c.start(&mut coll);
        stop(h);
        let h = c.start(&mut coll);
        let mut op = proxy_op(h, pid, true);
        let p = c.start(&mut op);
        record(p, 19);
        stop(h);
        stop(p);
        let h = c.start(&mut p2p);
        stop(h);
    }
    let after = counting::allocations();
    assert_eq!(after - before, 0, "allocations on the event path");
    let s = c.read();
    assert_eq!(s.counters.coll_started, 20_001);
    assert_eq!(s.counters.coll_completed, 10_000);
    c.finalize();
}

#[test]
fn timed_proxy_steps_never_allocate() {
    let c = Comm::init_with_mask(0x2002, 0, Some("default+proxystep"));
    let mut coll = allreduce(0, 1024);
    let pid = my_pid();
    let one = |c: &Comm, coll: &mut warden_nccl_profiler::abi::DescrV5, i: u64| {
        coll.u.coll.seqNumber = i;
        let h = c.start(coll);
        stop(h);
        let mut send = proxy_op_to(h, pid, true, (i % 3) as i32);
        let mut recv = proxy_op_to(h, pid, false, 1);
        let s = c.start(&mut send);
        let r = c.start(&mut recv);
        record(s, 19);
        for step in 0..4 {
            let st = c.start(&mut proxy_step(s, step));
            record(st, state::PROXY_STEP_SEND_GPU_WAIT);
            record(st, state::PROXY_STEP_SEND_PEER_WAIT);
            record_trans(st, state::PROXY_STEP_SEND_WAIT, 4096);
            stop(st);
            let rt = c.start(&mut proxy_step(r, step));
            record(rt, state::PROXY_STEP_RECV_WAIT);
            stop(rt);
        }
        stop(s);
        stop(r);
    };
    one(&c, &mut coll, 0);
    let before = counting::allocations();
    for i in 1..=10_000u64 {
        one(&c, &mut coll, i);
    }
    let after = counting::allocations();
    assert_eq!(after - before, 0, "allocations on the step path");
    let s = c.read();
    assert_eq!(s.counters.coll_completed, 10_001);
    assert_eq!(s.links.iter().map(|l| l.steps).sum::<u64>(), 4 * 10_001);
    c.finalize();
}
