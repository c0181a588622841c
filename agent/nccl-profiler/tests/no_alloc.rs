//! The event path allocates nothing: collective start/stop, with and without proxy
//! children, and p2p, counted by a per-thread counting allocator.

mod common;
#[path = "common/counting.rs"]
mod counting;

use common::{Comm, allreduce, my_pid, proxy_op, record, send, stop};

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
