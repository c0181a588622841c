"""What warden_torch costs the training thread, call by call, in one process.

A gloo process group of one rank (127.0.0.1), reporting to a running Warden agent
(``WARDEN_AGENT_SOCKET``). Each measurement alternates blocks with and without
reporting in the same process, so that slow drift of the machine falls on both sides:

- ``all_reduce``: a synchronous ``dist.all_reduce`` of one float.
- ``all_reduce async``: ``dist.all_reduce(async_op=True)`` and ``wait()``.
- ``step()``: ``warden_torch.step(n, loss=..., grad_norm=...)`` with one-element tensors.
- ``DDP step``: one training step of the model in ``examples/train_ddp.py`` (forward,
  backward with DDP's gradient all-reduce, grad-norm clip, optimizer step, ``step()``).
  Without reporting, DDP's built-in all-reduce; with it, the report of every collective
  and of the step (and, in ``methods`` capture, the DDP hook ``warden_torch`` installs).
- ``DDP step, 4 buckets``: the same with ``train_ddp.py --buckets 4``'s model, which DDP
  reduces in four buckets a step.
- ``DDP hook alone`` (``methods`` capture only): the step with that hook but reporting
  off, which is what the Python hook itself costs next to DDP's built-in path.
- ``... input check``: the input check (``init(check_inputs=True)``) against reporting
  without it, both sides reporting: a synchronous ``all_reduce`` of one float and of
  1M floats (4 MB; a tenth as many calls a block), ``step()`` (which reads the check's
  result), and the four-bucket DDP step. On this CPU-only machine the tensors are on
  the CPU, so this is the host path (``torch.isfinite(t).all()`` read at once), not the
  device path.

Prints the median time per call of each side over the blocks and their difference.

    WARDEN_AGENT_SOCKET=/run/warden/capture.sock python benches/cost.py [--blocks 20] [--per-block 500]
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import warden_torch  # noqa: E402


def timed(fn, n):
    t0 = time.perf_counter_ns()
    for i in range(n):
        fn(i)
    return (time.perf_counter_ns() - t0) / n / 1000.0


def compare(name, off, on, blocks, per_block, report=True, sides=None):
    """Alternate blocks of ``off`` (reporting off) and ``on`` (reporting on, unless
    ``report`` is False). With ``sides``, a pair of ``init()`` keyword arguments, both
    report: ``off`` with the first, ``on`` with the second."""
    a, b = [], []
    for k in range(blocks):
        for side in ((0, 1) if k % 2 == 0 else (1, 0)):
            if sides is not None:
                warden_torch.shutdown()
                warden_torch.init(**sides[side])
                (a if side == 0 else b).append(timed(off if side == 0 else on, per_block))
            elif side == 0:
                warden_torch.shutdown()
                a.append(timed(off, per_block))
            else:
                if report:
                    warden_torch.init()
                b.append(timed(on, per_block))
    warden_torch.shutdown()
    ma, mb = statistics.median(a), statistics.median(b)
    print("%-32s without %8.2f us   with %8.2f us   cost %+7.2f us per call" % (name, ma, mb, mb - ma), flush=True)
    return mb - ma


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--per-block", type=int, default=500)
    args = p.parse_args()
    os.environ.setdefault("WARDEN_JOB", "cost-bench")
    if not os.path.exists(os.environ.get("WARDEN_AGENT_SOCKET", warden_torch.DEFAULT_SOCKET)):
        sys.exit("no agent socket at WARDEN_AGENT_SOCKET: start a warden-agent first")
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.manual_seed(0)
    t = torch.ones(1)
    loss, norm = torch.tensor(0.5), torch.tensor(1.5)

    def sync(i):
        dist.all_reduce(t)

    def asynchronous(i):
        dist.all_reduce(t, async_op=True).wait()

    def report(i):
        warden_torch.step(i, loss=loss, grad_norm=norm)

    # Two identical DDP models: the first runs its first forward before reporting is
    # ever on, so it keeps DDP's built-in all-reduce; the second gets warden_torch's hook.
    def model(buckets=1):
        torch.manual_seed(0)
        if buckets == 1:
            m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
            ddp = nn.parallel.DistributedDataParallel(m)
        else:
            layers = [nn.Linear(32, 64), nn.ReLU()]
            for _ in range(buckets - 2):
                layers += [nn.Linear(64, 64), nn.ReLU()]
            m = nn.Sequential(*layers, nn.Linear(64, 1))
            ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=16 / 1024)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(1000)
    x = torch.randn(16, 32, generator=gen)
    y = x.sum(dim=1, keepdim=True)

    def train_step(ddp, opt):
        def one(i):
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1e9)
            opt.step()
            warden_torch.step(i, loss=loss, grad_norm=grad_norm)

        return one

    plain, plain4 = model(), model(4)
    for m in (plain, plain4):
        train_step(*m)(0)
        train_step(*m)(1)  # DDP rebuilds its buckets after the first step
    warden_torch.init()
    mode = warden_torch.capture_mode()
    hooked, hooked4 = model(), model(4)
    for m in (hooked, hooked4):
        train_step(*m)(0)
        train_step(*m)(1)
    warden_torch.shutdown()

    print("torch %s, Python %s, capture %s, %d blocks of %d calls a side" % (
        torch.__version__, sys.version.split()[0], mode, args.blocks, args.per_block))
    compare("all_reduce", sync, sync, args.blocks, args.per_block)
    compare("all_reduce async", asynchronous, asynchronous, args.blocks, args.per_block)
    compare("step()", report, report, args.blocks, args.per_block)
    compare("DDP step", train_step(*plain), train_step(*hooked), args.blocks, args.per_block)
    compare("DDP step, 4 buckets", train_step(*plain4), train_step(*hooked4), args.blocks, args.per_block)
    if mode == "methods":
        compare("DDP hook alone", train_step(*plain), train_step(*hooked), args.blocks, args.per_block, report=False)

    check = ({"check_inputs": False}, {"check_inputs": True})
    big = torch.ones(1 << 20)

    def sync_big(i):
        dist.all_reduce(big)

    compare("all_reduce, input check", sync, sync, args.blocks, args.per_block, sides=check)
    compare("all_reduce 4 MB, input check", sync_big, sync_big, args.blocks, max(args.per_block // 10, 10), sides=check)
    compare("step(), input check", report, report, args.blocks, args.per_block, sides=check)
    compare("DDP step, 4 buckets, input check", train_step(*hooked4), train_step(*hooked4), args.blocks, args.per_block, sides=check)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
