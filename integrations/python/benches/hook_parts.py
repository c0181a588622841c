"""What each part of warden_torch's per-operation work costs a synchronous all_reduce.

One gloo rank, a one-float ``dist.all_reduce`` timed with nothing attached,
then with process-group hooks that do one part of what ``warden_torch`` does each:
no-op pre- and post-hooks (the hook mechanism), a pre-hook that reads the operation's
name, inputs and id, and a post-hook that attaches a no-op completion callback to the
work's future (with ``add_done_callback`` and with ``then``), which gloo's worker thread
runs, taking the GIL from the training thread and giving it back. Prints the median
time per call of each over 7 blocks, less the bare call.

    python benches/hook_parts.py [--calls 3000]
"""

import argparse
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

HOOK_ID = 77


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    # A file rendezvous: one rank needs no port.
    store = tempfile.NamedTemporaryFile(prefix="hook-parts-")
    dist.init_process_group("gloo", init_method="file://" + store.name, rank=0, world_size=1)
    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(1)

    def per_call():
        blocks = []
        for _ in range(7):
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                dist.all_reduce(t)
            blocks.append((time.perf_counter_ns() - t0) / args.calls / 1000.0)
        return statistics.median(blocks)

    def read_parts(a):
        a.name.name
        a.input_tensors
        a.op_id

    def noop(a):
        return None

    def callback(a):
        a.work.get_future().add_done_callback(noop)

    def chained(a):
        a.work.get_future().then(noop)

    bare = per_call()
    print("bare all_reduce of one float     %8.2f us" % bare)
    for name, pre, post in (
        ("no-op pre- and post-hooks", noop, noop),
        ("pre-hook reads name, inputs, id", read_parts, noop),
        ("completion callback (add_done)", noop, callback),
        ("completion callback (then)", noop, chained),
    ):
        pg.register_pre_hook(HOOK_ID, pre)
        pg.register_post_hook(HOOK_ID, post)
        print("%-32s %+8.2f us" % (name, per_call() - bare), flush=True)
        pg.unregister_pre_hook(HOOK_ID)
        pg.unregister_post_hook(HOOK_ID)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
