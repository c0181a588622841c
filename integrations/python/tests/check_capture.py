"""warden_torch's capture: every operation real training code issues, reported once.

Two gloo ranks on 127.0.0.1 run, one after another: every ``torch.distributed``
collective in each of its spellings, point-to-point traffic (send/recv, isend/irecv,
batch_isend_irecv), a coalesced all-reduce, a functional all-reduce (the path DTensor
takes), a DDP model with several gradient buckets, and an FSDP2 (``fully_shard``) model.
Each rank listens on a Unix socket of its own in place of the agent. Checks:

- every start has its end, on the same communicator and sequence number, after it;
- each communicator's sequence numbers run 1, 2, 3, ... on each rank, and the two ranks
  report the same operations in the same order on every communicator they share, so the
  controller sees them line up;
- point-to-point traffic is on a two-member communicator per direction
  (``...:p2p:0>1``), the sender's n-th send and the receiver's n-th receive sharing a
  sequence number;
- each phase (collectives, point-to-point, DDP with several buckets, FSDP2, functional)
  is seen with the operations it issues;
- DDP's gradients equal those of a model that nobody watches.

    python tests/check_capture.py [hooks|methods]

``methods`` forces the capture of torch releases without process-group hooks
(``WARDEN_TORCH_CAPTURE=methods``); there functional collectives are not seen. Exits 0
when every check holds; prints what failed otherwise.
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from fake_agent import HEADER, listen, run_ranks  # noqa: E402


def decode(frames):
    """(comm names by id, [(kind, comm, seq, op, at)] in order, [(phase, at)])."""
    from warden_torch import _wire

    names, ops, marks = {}, [], []
    for f in frames:
        _, _, kind, _, _ = HEADER.unpack_from(f)
        if kind == _wire.COMM:
            comm, size, crank, n = struct.unpack_from("<QIIH", f, 12)
            names[comm] = f[12 + 18 : 12 + 18 + n].decode()
        elif kind == _wire.START:
            comm, seq, op, size, at = struct.unpack_from("<QQIQq", f, 12)
            ops.append(("start", comm, seq, op, at))
        elif kind == _wire.END:
            comm, seq, at = struct.unpack_from("<QQq", f, 12)
            ops.append(("end", comm, seq, None, at))
        elif kind == _wire.STEP:
            step, at = struct.unpack_from("<Qq", f, 12)
            marks.append((step, at))
    return names, ops, marks


PHASES = ["collectives", "p2p", "ddp", "ddp_check", "fsdp2", "functional"]


def rank_main(rank, world, port, sock_dir, mode, out):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import warden_torch

    path, frames, closed = listen(sock_dir, rank)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    problems = []
    if not warden_torch.init(job="check", socket_path=path):
        problems.append("init() returned False")
    if warden_torch.capture_mode() != mode:
        problems.append("capture mode %s, expected %s" % (warden_torch.capture_mode(), mode))
    peer = 1 - rank

    # Each phase ends with a step mark, so the frames split by phase.
    phase = iter(range(1, len(PHASES) + 1))

    t = torch.arange(8, dtype=torch.float32) + rank
    dist.all_reduce(t)
    dist.all_gather([torch.zeros(8) for _ in range(world)], t)
    dist.all_gather_into_tensor(torch.zeros(8 * world), t)
    if hasattr(dist, "all_gather_single"):
        dist.all_gather_single(torch.zeros(8 * world), t)
    dist.reduce_scatter_tensor(torch.zeros(4), t)
    dist.all_to_all_single(torch.zeros(8), t)
    dist.broadcast(t, 0)
    dist.reduce(t, 0)
    dist.all_reduce(t, async_op=True).wait()
    with dist.distributed_c10d._coalescing_manager():
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4))
    dist.barrier()
    warden_torch.step(next(phase))

    x = torch.ones(16) * rank
    if rank == 0:
        dist.send(x, peer)
        dist.recv(x, peer)
    else:
        dist.recv(x, peer)
        dist.send(x, peer)
    reqs = [dist.isend(x, peer)] if rank == 0 else [dist.irecv(x, peer)]
    for r in reqs:
        r.wait()
    ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, torch.zeros(16), peer)]
    for r in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
        r.wait()
    warden_torch.step(next(phase))

    torch.manual_seed(0)
    layers = [nn.Linear(512, 512) for _ in range(4)]
    watched = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=1)
    torch.manual_seed(0)
    plain_model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
    gen = torch.Generator().manual_seed(10 + rank)
    data = torch.randn(8, 512, generator=gen)
    # DDP reduces one bucket in its first backward and rebuilds its buckets after it.
    for _ in range(2):
        watched.zero_grad()
        watched(data).sum().backward()
    warden_torch.step(next(phase))
    # The same gradients by hand: each rank's own, averaged over the ranks.
    plain_model(data).sum().backward()
    for p, q in zip(watched.parameters(), plain_model.parameters()):
        g = q.grad.clone()
        dist.all_reduce(g)
        g /= world
        if not torch.allclose(p.grad, g, atol=1e-5):
            problems.append("DDP gradients differ from the averaged ones")
            break
    warden_torch.step(next(phase))

    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    sharded = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    sharded(torch.randn(4, 64, generator=gen)).sum().backward()
    warden_torch.step(next(phase))

    import torch.distributed._functional_collectives as funcol

    y = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    y = y * 2
    float(y.sum())
    warden_torch.step(next(phase))

    dist.barrier()
    warden_torch.shutdown()
    if not closed.wait(10):
        problems.append("the report connection did not close after shutdown()")
    # What shutdown() restored still works.
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 0:
        dist.send(t, peer)
    else:
        dist.recv(t, peer)
    watched(data).sum().backward()
    names, ops, marks = decode(frames)
    out.put((rank, problems, names, ops, marks))
    dist.destroy_process_group()


def check(results, mode):
    from warden_torch import _wire

    problems = []
    by_rank = {}
    for rank, probs, names, ops, marks in results:
        problems += ["rank %d: %s" % (rank, p) for p in probs]
        by_rank[rank] = (names, ops, marks)
    if sorted(by_rank) != [0, 1]:
        return problems + ["results from ranks %s" % sorted(by_rank)]
    seen = {}
    for rank, (names, ops, marks) in by_rank.items():
        starts, ends = {}, {}
        for kind, comm, seq, op, at in ops:
            (starts if kind == "start" else ends)[(comm, seq)] = (op, at)
        for key, (op, at) in starts.items():
            if key not in ends:
                problems.append("rank %d: %s seq %d (op %d) never ended" % (rank, names.get(key[0], key[0]), key[1], op))
            elif ends[key][1] < at:
                problems.append("rank %d: %s seq %d ended before it started" % (rank, names.get(key[0], key[0]), key[1]))
        for key in ends:
            if key not in starts:
                problems.append("rank %d: an end without a start on %s seq %d" % (rank, names.get(key[0]), key[1]))
        per_comm = {}
        for (comm, seq), (op, at) in sorted(starts.items(), key=lambda kv: kv[1][1]):
            per_comm.setdefault(comm, []).append((seq, op))
        for comm, lst in per_comm.items():
            seqs = [s for s, _ in lst]
            if seqs != list(range(1, len(seqs) + 1)):
                problems.append("rank %d: %s sequence numbers %s" % (rank, names.get(comm), seqs[:20]))
            if comm not in names:
                problems.append("rank %d: communicator %x never registered" % (rank, comm))
        # Operations of each phase, split by the step marks' times.
        bounds = [at for _, at in sorted(marks)]
        if len(bounds) != len(PHASES):
            problems.append("rank %d: %d step marks, expected %d" % (rank, len(bounds), len(PHASES)))
            continue
        phase_ops = {p: [] for p in PHASES}
        for (comm, seq), (op, at) in starts.items():
            i = next((i for i, b in enumerate(bounds) if at <= b), len(PHASES) - 1)
            phase_ops[PHASES[i]].append((names.get(comm, ""), op))
        seen[rank] = (per_comm, phase_ops)

    if len(seen) == 2:
        (c0, p0), (c1, p1) = seen[0], seen[1]
        for comm in set(c0) & set(c1):
            name = by_rank[0][0].get(comm, "")
            if ":p2p:" in name:
                # One side sends, the other receives: the counts must match.
                if len(c0[comm]) != len(c1[comm]):
                    problems.append("%s: %d operations on rank 0, %d on rank 1" % (name, len(c0[comm]), len(c1[comm])))
            elif [op for _, op in c0[comm]] != [op for _, op in c1[comm]]:
                problems.append("the ranks disagree on the operations of %s" % name)
        for rank, (_, phases) in seen.items():
            ops_of = lambda p: sorted({op for _, op in phases[p]})  # noqa: E731
            want = {1, 2, 3, 4, 5, 6, 10}
            if not want <= set(ops_of("collectives")):
                problems.append("rank %d: collectives phase reported ops %s, expected at least %s" % (rank, ops_of("collectives"), sorted(want)))
            p2p = [(n, op) for n, op in phases["p2p"]]
            sends = [n for n, op in p2p if op == _wire.OPS["send"]]
            recvs = [n for n, op in p2p if op == _wire.OPS["recv"]]
            me, other = rank, 1 - rank
            # Rank 0: send, isend, batch isend; receive, batch irecv. Rank 1 the mirror.
            n_send, n_recv = (3, 2) if rank == 0 else (2, 3)
            if len(sends) != n_send or set(sends) != {"pg:0:p2p:%d>%d" % (me, other)}:
                problems.append("rank %d: sends %s" % (rank, sends))
            if len(recvs) != n_recv or set(recvs) != {"pg:0:p2p:%d>%d" % (other, me)}:
                problems.append("rank %d: receives %s" % (rank, recvs))
            ddp = [op for _, op in phases["ddp"] if op == 1]
            if len(ddp) != 5:  # one bucket in the first backward, four in the second
                problems.append("rank %d: DDP phase all-reduces %d, expected 1 + 4 buckets" % (rank, len(ddp)))
            fsdp = ops_of("fsdp2")
            if 2 not in fsdp or 3 not in fsdp:
                problems.append("rank %d: FSDP2 phase reported ops %s, expected all-gathers and reduce-scatters" % (rank, fsdp))
            if mode == "hooks" and 1 not in ops_of("functional"):
                problems.append("rank %d: the functional all-reduce was not reported" % rank)
    counts = {r: sum(1 for k, *_ in by_rank[r][1] if k == "start") for r in by_rank}
    return problems, counts


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "hooks"
    if mode not in ("hooks", "methods"):
        print("usage: check_capture.py [hooks|methods]")
        sys.exit(2)
    results = run_ranks(rank_main, mode, failed=({}, [], []))
    problems, counts = check(results, mode) if len(results) == 2 else (["results from %d ranks" % len(results)], {})
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print("capture (%s): every operation reported, start and end, lined up across ranks (%s operations per rank)" % (mode, counts))


if __name__ == "__main__":
    main()
