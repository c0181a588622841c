"""A small training job (gloo on CPU, or NCCL on GPUs) that reports to Warden, in one of
four shapes (DDP, gradients all-reduced by hand, FSDP2, a pipeline), with faults on demand.

Run under torchrun (one launch per node):

    WARDEN_JOB=demo WARDEN_AGENT_SOCKET=/run/warden/capture.sock \\
    torchrun --nnodes=1 --nproc-per-node=4 train_ddp.py --steps 200

``--backend nccl`` trains on the GPU ``LOCAL_RANK`` (modulo the GPUs there are), so
that NCCL's own path runs: with ``NCCL_PROFILER_PLUGIN`` set, Warden's NCCL profiler
plugin sees the collectives, and ``--no-warden`` leaves them to it alone.

Shapes (``--shape``): ``ddp`` (the default: DistributedDataParallel, one gradient
bucket a step or ``--buckets`` of them); ``manual`` (no DDP: each gradient all-reduced by
hand after backward, one collective per parameter); ``fsdp2`` (``fully_shard`` on each
linear layer and the model: all-gathers before compute, reduce-scatters after); and
``pipeline`` (two stages of half the ranks each, ranks ``0..W/2-1`` the first; each step
sends two micro-batches' activations forward and their gradients back by ``send`` and
``recv``, GPipe order, then each stage all-reduces its gradients by hand over its
data-parallel group; only the last stage has a loss).

Faults (``--fault``) hit rank ``--fault-rank`` at step ``--fault-step``:
``--fault-ranks 2,3`` hits several ranks at once (a whole node).
``nan`` multiplies that rank's loss by NaN before backward (on a pipeline's first
stage, its activations); ``slow`` makes that rank's
compute take ``--slow-factor`` times as long from that step on; ``raise`` raises an
exception in user code; ``stall`` makes that rank wait forever before the step's
compute (alive and running, as in a deadlock or a stuck data loader). SIGSTOP and SIGKILL come from outside (the rank writes its pid
to ``--pid-dir``, and under Slurm its node's name beside it).

The process group's timeout is ``--pg-timeout-s`` (120 s unless given);
``--pg-default-timeout`` passes none, so PyTorch's default applies.

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

SHAPES = ["ddp", "manual", "fsdp2", "pipeline"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--compute-ms", type=float, default=50.0, help="simulated compute per step")
    p.add_argument("--fault", choices=["none", "nan", "slow", "raise", "stall"], default="none")
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-ranks", default=None,
                   help="ranks the fault hits, joined by commas (instead of --fault-rank): a whole node")
    p.add_argument("--fault-step", type=int, default=0)
    p.add_argument("--slow-factor", type=float, default=1.5)
    p.add_argument("--pid-dir", default=None, help="write rank<N>.pid and steps.log here")
    p.add_argument("--pg-timeout-s", type=float, default=None,
                   help="the process group's timeout, seconds (default 120)")
    p.add_argument(
        "--pg-default-timeout",
        action="store_true",
        help="pass no timeout to init_process_group: PyTorch's default (30 minutes for gloo, "
        "10 for NCCL, in torch 2.15.0)",
    )
    p.add_argument("--no-warden", action="store_true", help="train without reporting (overhead baseline)")
    p.add_argument(
        "--print-loss",
        action="store_true",
        help="every rank with a loss prints 'step N loss X' as each step ends, as plain "
        "training scripts do (what a log-only Warden reads)",
    )
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
    p.add_argument(
        "--shape",
        choices=SHAPES,
        default="ddp",
        help="how the job parallelizes (see the module docstring); --buckets and "
        "--checkpoint-dir are for ddp",
    )
    args = p.parse_args()
    if args.shape != "ddp" and args.checkpoint_dir:
        p.error("--checkpoint-dir is for --shape ddp")
    if args.pg_default_timeout and args.pg_timeout_s is not None:
        p.error("--pg-default-timeout and --pg-timeout-s exclude each other")

    device = torch.device("cpu")
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if args.pg_default_timeout:
        dist.init_process_group(args.backend)
    else:
        timeout = 120.0 if args.pg_timeout_s is None else args.pg_timeout_s
        dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if not args.no_warden:
        warden_torch.init()
    torch.manual_seed(0)
    if args.shape != "ddp":
        return train_shape(args, device, rank, world)
    if args.buckets <= 1:
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
        ddp = nn.parallel.DistributedDataParallel(model)
    else:
        model = mlp(64, args.buckets).to(device)
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

    steps_log = announce(args, rank)
    started = time.perf_counter()
    loss = None
    for step in range(first, args.steps + 1):
        x = torch.randn(16, 32, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        compute = faults_before_compute(args, rank, step, compute)
        time.sleep(compute)  # the rest of a real model's forward and backward
        loss = faults_on_loss(args, rank, step, nn.functional.mse_loss(ddp(x), y))
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1e9)
        opt.step()
        warden_torch.step(step, loss=loss, grad_norm=grad_norm)
        print_loss(args, step, loss)
        if args.checkpoint_dir and rank == 0 and step % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint_dir, step, model, opt)
        if steps_log is not None:
            steps_log.write("%d %d\n" % (step, time.time_ns()))
            steps_log.flush()
    finish(args, rank, started, first, loss)


def finish(args, rank, started, first, loss):
    """Say the run is done and leave (every shape ends here)."""
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


def print_loss(args, step, loss):
    """With --print-loss, this rank's loss of the step just ended (none on a pipeline's
    first stage, which has no loss)."""
    if args.print_loss and loss is not None:
        print("step %d loss %.6f" % (step, float(loss.item())), flush=True)


def announce(args, rank):
    """Write this rank's pid (and Slurm node) to --pid-dir; rank 0's steps log, or None.

    Rank 0 logs "step wall_ns" as each step ends, for whoever watches the run."""
    if not args.pid_dir:
        return None
    write_whole(os.path.join(args.pid_dir, "rank%d.pid" % rank), str(os.getpid()))
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        write_whole(os.path.join(args.pid_dir, "rank%d.node" % rank), node)
    return open(os.path.join(args.pid_dir, "steps.log"), "a") if rank == 0 else None


def fault_ranks(args):
    """The ranks the fault hits: ``--fault-ranks``, else ``--fault-rank``."""
    if args.fault_ranks:
        return {int(r) for r in args.fault_ranks.split(",") if r.strip()}
    return {args.fault_rank}


def faults_before_compute(args, rank, step, compute):
    """The slow and stall faults, where they strike: before the step's compute. Returns
    the compute time from this step on."""
    if args.fault == "slow" and rank in fault_ranks(args) and step == args.fault_step:
        compute *= args.slow_factor
    if args.fault == "stall" and rank in fault_ranks(args) and step == args.fault_step:
        threading.Event().wait()
    return compute


def faults_on_loss(args, rank, step, value):
    """The nan and raise faults, on this rank's loss (or, for a pipeline's first stage,
    its activations)."""
    if args.fault == "nan" and rank in fault_ranks(args) and step == args.fault_step:
        value = value * float("nan")
    if args.fault == "raise" and rank in fault_ranks(args) and step == args.fault_step:
        raise ValueError("bad batch shape in user code at step %d" % step)
    return value


def mlp(width, layers):
    """Linear(32, width), then layers - 2 hidden Linear(width, width), then Linear(width, 1)."""
    mods = [nn.Linear(32, width), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 1))
    return nn.Sequential(*mods)


def train_shape(args, device, rank, world):
    """The shapes other than DDP: gradients all-reduced by hand, FSDP2, and a 2-stage
    pipeline with data parallel. Each step ends with ``warden_torch.step``."""
    compute = args.compute_ms / 1000.0
    steps_log = announce(args, rank)
    loss = None
    if args.shape == "pipeline":
        if world % 2:
            raise SystemExit("--shape pipeline needs an even number of ranks, not %d" % world)
        dp = world // 2
        stage, replica = divmod(rank, dp)
        # Every rank makes every group, in the same order.
        groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in (0, 1)]
        group = groups[stage]
        peer = rank + dp if stage == 0 else rank - dp
        full = mlp(64, 4)
        model = (full[:4] if stage == 0 else full[4:]).to(device)
        # Both stages of a replica draw the same batches: the last stage makes the labels.
        gen = torch.Generator().manual_seed(1000 + replica)
    else:
        model = mlp(64, 4).to(device)
        if args.shape == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
        gen = torch.Generator().manual_seed(1000 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 32, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        compute = faults_before_compute(args, rank, step, compute)
        time.sleep(compute)  # the rest of a real model's forward and backward
        opt.zero_grad()
        if args.shape == "pipeline":
            loss = pipeline_step(args, model, x, y, stage, peer, rank, step)
            # Data parallel within the stage: each gradient all-reduced by hand.
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
                p.grad /= dp
        else:
            loss = faults_on_loss(args, rank, step, nn.functional.mse_loss(model(x), y))
            loss.backward()
            if args.shape == "manual":
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= world
        opt.step()
        warden_torch.step(step, loss=loss)
        print_loss(args, step, loss)
        if steps_log is not None:
            steps_log.write("%d %d\n" % (step, time.time_ns()))
            steps_log.flush()
    finish(args, rank, started, 1, loss)


def pipeline_step(args, model, x, y, stage, peer, rank, step, micro=2):
    """One step of a 2-stage pipeline, GPipe order: every micro-batch forward, then every
    one backward; activations and their gradients go by send and recv. The last stage's
    loss (mean over micro-batches), or None on the first stage."""
    xs, ys = x.chunk(micro), y.chunk(micro)
    if stage == 0:
        outs = []
        for mb in xs:
            h = faults_on_loss(args, rank, step, model(mb))
            dist.send(h.detach().contiguous(), peer)
            outs.append(h)
        for h in outs:
            g = torch.empty_like(h)
            dist.recv(g, peer)
            h.backward(g)
        return None
    ins, losses = [], []
    for mb in ys:
        h = torch.empty(mb.shape[0], 64, device=mb.device)
        dist.recv(h, peer)
        h.requires_grad_(True)
        ins.append(h)
        losses.append(nn.functional.mse_loss(model(h), mb))
    losses = [faults_on_loss(args, rank, step, l) for l in losses]
    for h, l in zip(ins, losses):
        (l / micro).backward()
        dist.send(h.grad.contiguous(), peer)
    return torch.stack([l.detach() for l in losses]).mean()


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
