"""A small DDP training job (gloo on CPU, or NCCL on GPUs) that reports to Warden, with
faults on demand.

Run under torchrun (one launch per node):

    WARDEN_JOB=demo WARDEN_AGENT_SOCKET=/run/warden/capture.sock \\
    torchrun --nnodes=1 --nproc-per-node=4 train_ddp.py --steps 200

``--backend nccl`` trains on the GPU ``LOCAL_RANK`` (modulo the GPUs there are), so
that NCCL's own path runs: with ``NCCL_PROFILER_PLUGIN`` set, Warden's NCCL profiler
plugin sees the collectives, and ``--no-warden`` leaves them to it alone.

Faults (``--fault``) hit rank ``--fault-rank`` at step ``--fault-step``:
``nan`` multiplies that rank's loss by NaN before backward; ``slow`` makes that rank's
compute take ``--slow-factor`` times as long from that step on; ``raise`` raises an
exception in user code; ``stall`` makes that rank wait forever before the step's
compute (alive and running, as in a deadlock or a stuck data loader). SIGSTOP and SIGKILL come from outside (the rank writes its pid
to ``--pid-dir``, and under Slurm its node's name beside it).

With ``--checkpoint-dir`` rank 0 saves a checkpoint every ``--checkpoint-every`` steps in
Megatron-LM's layout (``iter_0000040/mp_rank_00/model_optim_rng.pt``, then the tracker
``latest_checkpointed_iteration.txt``, each written whole and renamed into place), and
every rank resumes from the checkpoint the tracker names when it starts.
"""

import argparse
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import warden_torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--compute-ms", type=float, default=50.0, help="simulated compute per step")
    p.add_argument("--fault", choices=["none", "nan", "slow", "raise", "stall"], default="none")
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-step", type=int, default=0)
    p.add_argument("--slow-factor", type=float, default=1.5)
    p.add_argument("--pid-dir", default=None, help="write rank<N>.pid and steps.log here")
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    p.add_argument("--no-warden", action="store_true", help="train without reporting (overhead baseline)")
    p.add_argument("--checkpoint-dir", default=None, help="save and resume here (Megatron-LM layout)")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument(
        "--buckets",
        type=int,
        default=1,
        help="gradient buckets per step (1: one all-reduce a step; N: a deeper model whose "
        "layers DDP reduces one bucket each, as real models with many buckets do)",
    )
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = p.parse_args()

    device = torch.device("cpu")
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.pg_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if not args.no_warden:
        warden_torch.init()
    torch.manual_seed(0)
    if args.buckets <= 1:
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
        ddp = nn.parallel.DistributedDataParallel(model)
    else:
        layers = [nn.Linear(32, 64), nn.ReLU()]
        for _ in range(args.buckets - 2):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        layers.append(nn.Linear(64, 1))
        model = nn.Sequential(*layers).to(device)
        # One 64x64 layer is 16.6 kB: a 16 kB cap gives each layer a bucket of its own
        # (from the second step on: DDP reduces one bucket in its first).
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=16 / 1024)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    first = 1
    if args.checkpoint_dir:
        resumed = load_checkpoint(args.checkpoint_dir, model, opt)
        if resumed is not None:
            first = resumed + 1
            if rank == 0:
                print("resumed from checkpoint step %d" % resumed, flush=True)
    gen = torch.Generator().manual_seed(1000 + rank + 100003 * first)
    compute = args.compute_ms / 1000.0

    if args.pid_dir:
        write_whole(os.path.join(args.pid_dir, "rank%d.pid" % rank), str(os.getpid()))
        node = os.environ.get("SLURMD_NODENAME")
        if node:
            write_whole(os.path.join(args.pid_dir, "rank%d.node" % rank), node)
    # Rank 0 logs "step wall_ns" as each step ends, for whoever watches the run.
    steps_log = open(os.path.join(args.pid_dir, "steps.log"), "a") if args.pid_dir and rank == 0 else None
    started = time.perf_counter()
    loss = None
    for step in range(first, args.steps + 1):
        x = torch.randn(16, 32, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        if args.fault == "slow" and rank == args.fault_rank and step == args.fault_step:
            compute *= args.slow_factor
        if args.fault == "stall" and rank == args.fault_rank and step == args.fault_step:
            threading.Event().wait()
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
        if args.checkpoint_dir and rank == 0 and step % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint_dir, step, model, opt)
        if steps_log is not None:
            steps_log.write("%d %d\n" % (step, time.time_ns()))
            steps_log.flush()
    elapsed = time.perf_counter() - started
    dist.barrier()
    if rank == 0:
        ran = max(args.steps - first + 1, 1)
        final = float(loss.item()) if loss is not None else float("nan")
        print("done: %d steps, %.2f ms/step, final loss %.6f, warden %s" % (
            args.steps, 1000 * elapsed / ran, final, warden_torch.stats()), flush=True)
    dist.destroy_process_group()
    # The run is over and said so. PyTorch's gloo threads can still abort the
    # interpreter's teardown ("terminate called without an active exception", SIGABRT)
    # after a clean run, which would fail the job: leave without that teardown.
    warden_torch.shutdown(0, "")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write_whole(path, text):
    """Write ``text`` to ``path`` so that no reader sees it half-written."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save_checkpoint(root, step, model, opt):
    """Save ``step`` in Megatron-LM's layout; the tracker moves only once it is whole."""
    shard = os.path.join(root, "iter_%07d" % step, "mp_rank_00")
    os.makedirs(shard, exist_ok=True)
    path = os.path.join(shard, "model_optim_rng.pt")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    write_whole(os.path.join(root, "latest_checkpointed_iteration.txt"), "%d\n" % step)


def load_checkpoint(root, model, opt):
    """Load the checkpoint the tracker names; its step, or None when there is none."""
    try:
        with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
            step = int(f.read().strip())
    except (OSError, ValueError):
        return None
    path = os.path.join(root, "iter_%07d" % step, "mp_rank_00", "model_optim_rng.pt")
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])


if __name__ == "__main__":
    sys.exit(main())
