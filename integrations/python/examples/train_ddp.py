"""A small DDP training job on gloo that reports to Warden, with faults on demand.

Run under torchrun (one launch per node):

    WARDEN_JOB=demo WARDEN_AGENT_SOCKET=/run/warden/capture.sock \\
    torchrun --nnodes=1 --nproc-per-node=4 train_ddp.py --steps 200

Faults (``--fault``) hit rank ``--fault-rank`` at step ``--fault-step``:
``nan`` multiplies that rank's loss by NaN before backward; ``slow`` makes that rank's
compute take ``--slow-factor`` times as long from that step on; ``raise`` raises an
exception in user code. SIGSTOP and SIGKILL come from outside (the rank writes its pid
to ``--pid-dir``).
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import warden_torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--compute-ms", type=float, default=50.0, help="simulated compute per step")
    p.add_argument("--fault", choices=["none", "nan", "slow", "raise"], default="none")
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-step", type=int, default=0)
    p.add_argument("--slow-factor", type=float, default=1.5)
    p.add_argument("--pid-dir", default=None, help="write rank<N>.pid and steps.log here")
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    p.add_argument("--no-warden", action="store_true", help="train without reporting (overhead baseline)")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if not args.no_warden:
        warden_torch.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    compute = args.compute_ms / 1000.0

    if args.pid_dir:
        tmp = os.path.join(args.pid_dir, "rank%d.pid.tmp" % rank)
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, os.path.join(args.pid_dir, "rank%d.pid" % rank))
    # Rank 0 logs "step wall_ns" as each step ends, for whoever watches the run.
    steps_log = open(os.path.join(args.pid_dir, "steps.log"), "a") if args.pid_dir and rank == 0 else None
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 32, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        if args.fault == "slow" and rank == args.fault_rank and step == args.fault_step:
            compute *= args.slow_factor
        time.sleep(compute)  # the rest of a real model's forward and backward
        loss = nn.functional.mse_loss(ddp(x), y)
        if args.fault == "nan" and rank == args.fault_rank and step == args.fault_step:
            loss = loss * float("nan")
        if args.fault == "raise" and rank == args.fault_rank and step == args.fault_step:
            raise ValueError("bad batch shape in user code at step %d" % step)
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1e9)
        opt.step()
        warden_torch.step(step, loss=loss, grad_norm=grad_norm)
        if steps_log is not None:
            steps_log.write("%d %d\n" % (step, time.time_ns()))
            steps_log.flush()
    elapsed = time.perf_counter() - started
    dist.barrier()
    if rank == 0:
        print("done: %d steps, %.2f ms/step, warden %s" % (
            args.steps, 1000 * elapsed / args.steps, warden_torch.stats()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
