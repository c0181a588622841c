"""warden_torch's DDP hook: the gradients of DDP's built-in all-reduce, and a report of each.

The hook is how gradient all-reduces are seen where process groups have no hooks of
their own (torch before 2.15, or ``WARDEN_TORCH_CAPTURE=methods``, which this check
sets); with process-group hooks DDP keeps its built-in path and tests/check_capture.py
covers it.

Two gloo ranks on 127.0.0.1 train two copies of one model side by side: one with DDP's
built-in all-reduce (its first forward runs before ``warden_torch.init()``), one with the
hook ``warden_torch`` installs. Each rank listens on a Unix socket of its own in place of
the agent. Checks, on every rank:

- the two models' gradients are equal after every step, with reporting on and after
  ``shutdown()`` (the hook stays registered and must keep working);
- every gradient all-reduce was reported: a START (op all_reduce, the bucket's bytes) and
  an END with the same sequence number, in order, ends after starts;
- the frames decode as the agent reads them (length, b"WT", version, kind).

Exits 0 when every check holds; prints what failed otherwise.

    python tests/check_ddp_hook.py
"""

import multiprocessing
import os
import socket
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from fake_agent import leave, listen  # noqa: E402

STEPS = 4


def rank_main(rank, world, port, sock_dir, failures):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import warden_torch
    from warden_torch import _wire

    def fail(msg):
        failures.put("rank %d: %s" % (rank, msg))

    path, frames, closed = listen(sock_dir, rank)

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)

    def model():
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.1)

    gen = torch.Generator().manual_seed(100 + rank)

    def train(ddp, opt, x, y):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        grads = [p.grad.clone() for p in ddp.parameters()]
        opt.step()
        return grads

    plain = model()
    x0 = torch.randn(8, 32, generator=gen)
    train(*plain, x0, x0.sum(dim=1, keepdim=True))
    # As if the program had a hook of its own: warden_torch leaves this model on DDP's
    # built-in all-reduce.
    plain[0]._warden_hooked = True
    if not warden_torch.init(job="check", socket_path=path):
        fail("init() returned False")
    hooked = model()
    hooked[1].load_state_dict(plain[1].state_dict())
    hooked[0].load_state_dict(plain[0].state_dict())
    nbytes = sum(p.numel() * p.element_size() for p in hooked[0].parameters())

    def step_both(n):
        x = torch.randn(16, 32, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        a, b = train(*plain, x, y), train(*hooked, x, y)
        if not all(torch.equal(g, h) for g, h in zip(a, b)):
            fail("step %d: gradients differ from DDP's built-in all-reduce" % n)

    for n in range(STEPS):
        step_both(n)
    warden_torch.shutdown()
    if not closed.wait(10):
        fail("the report connection did not close after shutdown()")
    step_both(STEPS)  # the hook stays; without reporting it must still all-reduce

    header = struct.Struct("<2sBBII")
    starts, ends, order = {}, {}, []
    for f in frames:
        magic, version, kind, pid, r = header.unpack_from(f)
        if magic != b"WT" or version != _wire.VERSION or r != rank or pid != os.getpid():
            fail("bad header %r" % (f[:12],))
            continue
        if kind == _wire.START:
            comm, seq, op, size, at = struct.unpack_from("<QQIQq", f, 12)
            starts[seq] = (op, size, at)
            order.append(("start", seq))
        elif kind == _wire.END:
            comm, seq, at = struct.unpack_from("<QQq", f, 12)
            ends[seq] = at
            order.append(("end", seq))
    if sorted(starts) != list(range(1, STEPS + 1)):
        fail("started all-reduces %s, expected 1..%d" % (sorted(starts), STEPS))
    if sorted(ends) != sorted(starts):
        fail("ended %s, started %s" % (sorted(ends), sorted(starts)))
    for seq, (op, size, at) in starts.items():
        if op != _wire.OPS["all_reduce"]:
            fail("all-reduce %d reported as op %d" % (seq, op))
        if size != nbytes:
            fail("all-reduce %d reported %d bytes, the bucket holds %d" % (seq, size, nbytes))
        if seq in ends and ends[seq] < at:
            fail("all-reduce %d ended before it started" % seq)
    expected = [e for seq in range(1, STEPS + 1) for e in (("start", seq), ("end", seq))]
    if order != expected:
        fail("reports out of order: %s" % order)
    dist.destroy_process_group()


def rank_entry(rank, world, port, sock_dir, failures):
    """One rank, leaving without the interpreter's teardown, where PyTorch's gloo
    threads can abort the process (see examples/train_ddp.py)."""
    code = 0
    try:
        rank_main(rank, world, port, sock_dir, failures)
    except BaseException as e:
        failures.put("rank %d raised %s: %s" % (rank, type(e).__name__, e))
        code = 1
    leave(failures, code)


def main():
    os.environ["WARDEN_TORCH_CAPTURE"] = "methods"
    ctx = multiprocessing.get_context("spawn")
    failures = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=rank_entry, args=(r, 2, port, d, failures)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        codes = [p.exitcode for p in procs]
    problems = []
    while not failures.empty():
        problems.append(failures.get())
    if any(c != 0 for c in codes):
        problems.append("rank exit codes %s" % codes)
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print("DDP hook: %d steps on 2 ranks, gradients equal to the built-in all-reduce, every all-reduce reported" % STEPS)


if __name__ == "__main__":
    main()
