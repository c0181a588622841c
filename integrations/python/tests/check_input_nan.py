"""warden_torch's input check: the rank that fed a NaN into a reduction, told by its step.

Two gloo ranks on 127.0.0.1 train a small model, a fresh copy per phase; at step 3 rank 1
puts a NaN into one of its gradients before they are reduced. Each phase reports to a
Unix socket of its own in place of the agent, and the step messages are decoded as the
agent reads them (docs/CAPTURE.md, "Protocol": flag 8 and a ``u32`` op index):

- ``off``: the check off (the default): no step carries flag 8.
- ``by hand`` (``WARDEN_TORCH_CHECK_INPUTS=1``): each step runs, in order, an
  all-gather into a NaN-filled buffer (not a reduction), a reduce-scatter of finite
  inputs into a NaN-filled output, a reduce, an all-reduce of the loss, then one
  all-reduce per gradient (operations 4 to 7); at step 3 rank 1 puts NaNs into its
  second and fourth gradients, and, as a loss scaler does, every rank skips the
  optimizer step whose reduced gradients are not finite. Rank 1 reports operation 5
  at step 3, and nothing else does, before or after.
- ``on the device path``: the same with the check forced onto its device-side path
  (an int64 accumulator updated with ``torch.where``, read in ``step()``), on CPU
  tensors, since no GPU is needed to check its arithmetic.
- the test for one tensor, in the parent process, host and device versions (the latter
  on CPU tensors): NaN, +inf and -inf in float32, bfloat16, float16, float64 and
  complex tensors are found, finite ones (float16 up to its largest value) and integer
  or empty tensors are not.
- ``DDP`` (``init(check_inputs=True)``): a DDP model, rank 1's gradient made NaN by a
  tensor hook at step 3, nothing skipped: rank 1 reports an operation at step 3, rank 0
  none there, and from step 4, where the reduced NaN reached every rank's weights, both
  report one at every step.

    python tests/check_input_nan.py [hooks|methods]

``methods`` forces the capture of torch releases without process-group hooks
(``WARDEN_TORCH_CAPTURE=methods``). Exits 0 when every check holds and prints
``input check (MODE): passed``; prints what failed otherwise.
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from fake_agent import HEADER, listen, run_ranks  # noqa: E402

STEP_BODY = struct.Struct("<QqIddd")
NAN_STEP = 3
STEPS = 6
PHASES = ["off", "by hand", "on the device path", "DDP"]


def steps_of(frames):
    """[(step, op index or None)] of the step messages in ``frames``, as the agent
    decodes them; raises on a malformed one."""
    from warden_torch import _wire

    out = []
    for f in frames:
        magic, version, kind, _, _ = HEADER.unpack_from(f)
        if magic != b"WT" or version != _wire.VERSION or kind != _wire.STEP:
            continue
        step, _, flags, _, _, _ = STEP_BODY.unpack_from(f, HEADER.size)
        end = HEADER.size + STEP_BODY.size
        if flags & _wire.STEP_OP_INDEX:
            if len(f) != end + 4:
                raise ValueError("a step with flag 8 of %d bytes" % len(f))
            out.append((step, struct.unpack_from("<I", f, end)[0]))
        else:
            if len(f) != end:
                raise ValueError("a step without flag 8 of %d bytes" % len(f))
            out.append((step, None))
    return out


def by_hand(rank, world, torch, dist, nn, warden_torch):
    """The loop with every operation issued by hand (see the module's documentation)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(10 + rank)
    warden_torch.step(0)
    for k in range(1, STEPS + 1):
        x = torch.randn(4, 8, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if rank == 1 and k == NAN_STEP:
            params = list(model.parameters())
            params[1].grad[0] = float("nan")
            params[3].grad[0] = float("inf")
        nan_buffer = torch.full((world,), float("nan"))
        dist.all_gather_into_tensor(nan_buffer, loss.detach().reshape(1))
        dist.reduce_scatter_tensor(torch.full((2,), float("nan")), torch.ones(2 * world))
        dist.reduce(torch.ones(3), dst=0)
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        finite = True
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
            finite = finite and bool(torch.isfinite(p.grad).all())
        if finite:
            opt.step()
        warden_torch.step(k, loss=reduced / world)


def with_ddp(rank, world, torch, dist, nn, warden_torch):
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(10 + rank)
    warden_torch.step(0)
    first = next(ddp.parameters())
    for k in range(1, STEPS + 1):
        hook = None
        if rank == 1 and k == NAN_STEP:
            hook = first.register_hook(lambda g: g * float("nan"))
        loss = ddp(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if hook is not None:
            hook.remove()
        opt.step()
        warden_torch.step(k, loss=loss)


def rank_main(rank, world, port, sock_dir, mode, out):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import warden_torch

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    problems, seen = [], {}
    for i, phase in enumerate(PHASES):
        path, frames, closed = listen(sock_dir, rank + 10 * i)
        if phase == "by hand":
            os.environ["WARDEN_TORCH_CHECK_INPUTS"] = "1"
            ok = warden_torch.init(job="check", socket_path=path)
            del os.environ["WARDEN_TORCH_CHECK_INPUTS"]
        else:
            ok = warden_torch.init(job="check", socket_path=path, check_inputs=phase != "off")
        if not ok:
            problems.append("%s: init() returned False" % phase)
        if warden_torch.checking_inputs() != (phase != "off"):
            problems.append("%s: checking_inputs() is %s" % (phase, warden_torch.checking_inputs()))
        if warden_torch.capture_mode() != mode:
            problems.append("%s: capture mode %s, expected %s" % (phase, warden_torch.capture_mode(), mode))
        host_defer = warden_torch._defer
        if phase == "on the device path":
            warden_torch._defer = lambda t: True
        try:
            (with_ddp if phase == "DDP" else by_hand)(rank, world, torch, dist, nn, warden_torch)
        finally:
            warden_torch._defer = host_defer
        dist.barrier()
        warden_torch.shutdown()
        if not closed.wait(10):
            problems.append("%s: the report connection did not close" % phase)
        try:
            seen[phase] = steps_of(frames)
        except ValueError as e:
            problems.append("%s: %s" % (phase, e))
    out.put((rank, problems, seen))
    dist.destroy_process_group()


def check(results):
    problems = []
    seen = {}
    for rank, probs, by_phase in results:
        problems += ["rank %d: %s" % (rank, p) for p in probs]
        seen[rank] = by_phase
    if sorted(seen) != [0, 1]:
        return problems + ["results from ranks %s" % sorted(seen)]
    for phase in PHASES:
        got = {r: dict(seen[r].get(phase, [])) for r in (0, 1)}
        for r in (0, 1):
            if sorted(got[r]) != list(range(STEPS + 1)):
                problems.append("%s, rank %d: steps %s reported" % (phase, r, sorted(got[r])))
        flagged = {r: {s: op for s, op in got[r].items() if op is not None} for r in (0, 1)}
        if phase == "off":
            if flagged[0] or flagged[1]:
                problems.append("off: op indices reported with the check off: %s" % flagged)
            continue
        for r in (0, 1):
            early = {s: op for s, op in flagged[r].items() if s < NAN_STEP}
            if early:
                problems.append("%s, rank %d: op indices before step %d: %s" % (phase, r, NAN_STEP, early))
        if NAN_STEP not in flagged[1]:
            problems.append("%s: rank 1 reported no op index at step %d (%s)" % (phase, NAN_STEP, flagged[1]))
        if NAN_STEP in flagged[0]:
            problems.append("%s: rank 0 reported op %d at step %d, fed only by rank 1" % (phase, flagged[0][NAN_STEP], NAN_STEP))
        if phase == "DDP":
            for r in (0, 1):
                later = [s for s in range(NAN_STEP + 1, STEPS + 1) if s not in flagged[r]]
                if later:
                    problems.append("DDP, rank %d: no op index at steps %s, after the NaN spread" % (r, later))
            continue
        want = {1: {NAN_STEP: 5}, 0: {}}
        for r in (0, 1):
            if flagged[r] != want[r]:
                problems.append("%s, rank %d: op indices %s, expected %s" % (phase, r, flagged[r], want[r]))
    return problems


def check_one_tensor():
    import torch

    import warden_torch

    problems = []
    tests = (("host", warden_torch._host_finite), ("device", lambda torch, t: warden_torch._device_finite(torch, t)))
    for where, finite in tests:
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64):
            for bad in (float("nan"), float("inf"), -float("inf"), None):
                t = torch.linspace(-3e3, 3e3, 1001).to(dtype)
                if dtype == torch.float16:
                    t[0], t[-1] = -65504.0, 65504.0  # the largest finite: no overflow
                if bad is not None:
                    t[517] = bad
                ok = finite(torch, t)
                if ok is None or bool(ok) != (bad is None):
                    problems.append("one tensor, %s: %s with %s read as finite=%s" % (where, dtype, bad, ok))
        for t in (torch.arange(5), torch.zeros(0)):
            if finite(torch, t) is not None:
                problems.append("one tensor, %s: %s %s checked" % (where, t.dtype, tuple(t.shape)))
    return problems


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "hooks"
    if mode not in ("hooks", "methods"):
        print("usage: check_input_nan.py [hooks|methods]")
        sys.exit(2)
    results = run_ranks(rank_main, mode, failed=({},))
    problems = check(results) if len(results) == 2 else ["results from %d ranks" % len(results)]
    problems += check_one_tensor()
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print("input check (%s): passed; rank 1 named at step %d, the check off reports nothing" % (mode, NAN_STEP))


if __name__ == "__main__":
    main()
