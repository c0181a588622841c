"""Report a PyTorch job's collective progress, steps, loss and grad norm to the Warden agent.

Call ``warden_torch.init()`` once in each training process, after
``torch.distributed.init_process_group``, and ``warden_torch.step(n, loss=..., grad_norm=...)``
once per step. From then on every operation of every process group is reported when it
starts and when it completes on this rank (for NCCL, when it ran on the GPU, not when
it was enqueued): collectives (all-reduce, all-gather,
reduce-scatter in all their spellings, all-to-all, broadcast, reduce, gather, scatter,
barrier, the coalesced forms) and point-to-point sends and receives, with their peer,
for gloo and NCCL alike. Where ``ProcessGroup`` has pre- and post-hooks (torch 2.15),
they are the one place every operation passes, whoever issues it: ``torch.distributed``,
DDP's reducer, FSDP2, functional collectives. Elsewhere the ``ProcessGroup`` methods are
wrapped, which sees everything issued from Python, and DDP gets a communication hook
that issues its gradient all-reduces from Python; functional collectives are then
unseen. The steps delimit iterations: everything between two ``step()`` calls belongs
to that step.

Reports are length-prefixed messages on a Unix stream connection to the agent
(``WARDEN_AGENT_SOCKET``, default ``/run/warden/capture.sock``), written without
blocking: what the socket cannot take at once waits in a bounded local backlog that the
next report pushes on; when the agent is missing, reports are dropped and counted and
the connection is tried again every few seconds. The training loop always goes on, and
nothing here raises into it. The agent learns of the process's death from the
connection closing.

With ``init(check_inputs=True)`` (or ``WARDEN_TORCH_CHECK_INPUTS=1``; off by default)
every reducing operation (all-reduce, reduce-scatter, reduce) also checks its input
tensors for a NaN or infinity before the reduction, and ``step()`` reports the index,
from 0, of the first such operation among this rank's operations since the previous
``step()``: the rank that fed a NaN into a reduction is then told apart from the peers
that got it from the reduction. On CPU tensors the check is a plain one; on device
tensors it stays on the device (a few small kernels on the current stream) and is read
once, in ``step()``, with ``.item()``.

The job id is ``WARDEN_JOB``, else ``SLURM_JOB_ID``, else ``TORCHELASTIC_RUN_ID`` unless it
is ``none`` (plain ``torchrun`` sets that for every job), else one rank 0 makes up and
shares through the process group's store (``torch-<date>-<time>-<random>``); the rank is
the process group's, else ``RANK``.
"""

import atexit
import itertools
import logging
import math
import os
import socket
import sys
import threading
import time
from typing import Optional, SupportsFloat

from . import _wire

__all__ = ["init", "step", "stats", "shutdown", "capture_mode", "checking_inputs", "DEFAULT_SOCKET"]

# The package's version; pyproject.toml reads it from here.
__version__ = "0.1.0"

DEFAULT_SOCKET: str = "/run/warden/capture.sock"
_HELLO_EVERY_S = 5.0
_MAX_BACKLOG = 1 << 20
# Longest a process's exit waits for the agent to take its goodbye (seconds).
_GOODBYE_S = 5.0
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)

_log = logging.getLogger("warden_torch")
_state: Optional["_State"] = None
_lock = threading.Lock()


class _Comm:
    __slots__ = ("id", "seq", "size", "rank", "name")

    def __init__(self, comm_id, size, rank, name):
        self.id = comm_id
        self.seq = itertools.count(1)
        self.size = size
        self.rank = rank
        self.name = name


class _State:
    def __init__(self, path, job, rank, world, local_rank, gpu):
        self.path = path
        self.job = job
        self.rank = rank
        self.world = world
        self.local_rank = local_rank
        self.gpu = gpu
        self.pid = os.getpid()
        try:
            # The agent judges our pid only when it lives in the same pid namespace.
            self.pidns = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            self.pidns = 0
        self.sock = None
        self.backlog = b""
        self.send_lock = threading.Lock()
        self.comms = {}
        self.p2p = {}
        self.hooked = set()
        self.unwaited = {}
        self.wait_patched = False
        # Works whose ends our thread watches: host works by id, device works in order.
        self.host_works = {}
        self.device_works = []
        self.poll_cv = threading.Condition()
        self.poll_thread = None
        self.poll_idle = False
        self.mode = None
        self.sent = 0
        self.dropped = 0
        self.next_hello = 0.0
        self.exception = None
        self.exited = False
        self.patched = []
        # The input check: whether it is on, operations begun since the last step(),
        # the first with a non-finite input among those on the CPU, and per device a
        # 0-d int64 tensor holding the smallest such index (_UNSEEN while none).
        self.check_inputs = False
        self.op_count = 0
        self.nf_host = None
        self.nf_dev = {}
        self.torch = None

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(0.5)
            s.connect(self.path)
            s.setblocking(False)
        except OSError:
            s.close()
            return False
        self.sock = s
        self.backlog = b""
        self._send(self.hello())
        for c in list(self.comms.values()) + list(self.p2p.values()):
            self._send(_wire.comm(self.pid, self.rank, c.id, c.size, c.rank, c.name))
        return True

    def send(self, message):
        if self.sock is None:
            now = time.monotonic()
            if now < self.next_hello:
                self.dropped += 1
                return
            # Try the agent again now and then (it may have restarted).
            self.next_hello = now + _HELLO_EVERY_S
            if not self.connect():
                self.dropped += 1
                return
        self._send(message)

    def _send(self, frame):
        sock = self.sock
        if sock is None:
            self.dropped += 1
            return
        with self.send_lock:
            if self.backlog:
                if len(self.backlog) + len(frame) > _MAX_BACKLOG:
                    self.dropped += 1
                    return
                self.backlog += frame
                frame, self.backlog = self.backlog, b""
            try:
                n = sock.send(frame, _NOSIGNAL)
            except BlockingIOError:
                n = 0
            except OSError:
                # The agent went away: start over with a new connection later.
                self.sock = None
                self.backlog = b""
                self.dropped += 1
                try:
                    sock.close()
                except OSError:
                    pass
                return
            if n < len(frame):
                self.backlog = frame[n:]
            self.sent += 1

    def hello(self):
        return _wire.hello(self.pid, self.rank, self.world, self.local_rank, self.gpu, self.pidns, self.job)


def _job_id():
    for var in ("WARDEN_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        v = os.environ.get(var, "").strip()
        if v and v.lower() != "none":
            return v
    return None


_STORE_KEY = "warden_torch/job"


def _shared_job_id(dist):
    """A name for a job that has none: rank 0 makes one up and every rank reads it from
    the process group's store, so all ranks of the job, and only they, share it."""
    try:
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            import secrets

            store.set(_STORE_KEY, "torch-%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), secrets.token_hex(3)))
        else:
            import datetime

            store.wait([_STORE_KEY], datetime.timedelta(seconds=60))
        return store.get(_STORE_KEY).decode("utf-8", "replace")
    except Exception as e:
        _log.debug("warden_torch: no job id from the store: %s", e)
        return None


def _int_env(name, default):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _comm_id(name):
    # Stable across ranks and processes (Python's hash() is salted per process).
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _pg_comm(st, dist, pg):
    """The communicator of process group ``pg``, registered with the agent on first use."""
    c = st.comms.get(pg)
    if c is not None:
        return c
    with _lock:
        c = st.comms.get(pg)
        if c is not None:
            return c
        try:
            name = dist.distributed_c10d._get_process_group_name(pg)
        except Exception:
            name = getattr(pg, "group_name", "default")
        c = _Comm(_comm_id("pg:" + str(name)), pg.size(), pg.rank(), "pg:" + str(name))
        st.comms[pg] = c
    st.send(_wire.comm(st.pid, st.rank, c.id, c.size, c.rank, c.name))
    return c


def _p2p_comm(st, dist, pg, src, dst):
    """The communicator of point-to-point traffic from group rank ``src`` to ``dst`` of
    ``pg``: two members (the sender is 0), numbered in the order the pair's messages
    match, so the sender's n-th send and the receiver's n-th receive share a sequence
    number whatever else either rank does."""
    key = (pg, src, dst)
    c = st.p2p.get(key)
    if c is not None:
        return c
    base = _pg_comm(st, dist, pg)
    with _lock:
        c = st.p2p.get(key)
        if c is not None:
            return c
        name = "%s:p2p:%d>%d" % (base.name, src, dst)
        me = 0 if base.rank == src else 1
        c = _Comm(_comm_id(name), 2, me, name)
        st.p2p[key] = c
    st.send(_wire.comm(st.pid, st.rank, c.id, c.size, c.rank, c.name))
    return c


def _nbytes(x):
    try:
        if isinstance(x, (list, tuple)):
            return sum(_nbytes(t) for t in x)
        return int(x.numel()) * int(x.element_size())
    except Exception:
        return 0


# Wire op of each operation, by the name ProcessGroup hooks give it and by the name of
# the ProcessGroup method that runs it (torch 2.4 to 2.15 spell some differently).
_HOOK_OPS = {
    "ALLREDUCE": 1,
    "ALLREDUCE_COALESCED": 1,
    "ALLGATHER": 2,
    "ALLGATHER_BASE": 2,
    "ALLGATHER_COALESCED": 2,
    "ALLGATHER_INTO_TENSOR_COALESCED": 2,
    "REDUCE_SCATTER": 3,
    "REDUCE_SCATTER_BASE": 3,
    "REDUCE_SCATTER_TENSOR_COALESCED": 3,
    "BROADCAST": 4,
    "REDUCE": 5,
    "ALLTOALL": 6,
    "ALLTOALL_BASE": 6,
    "SEND": 7,
    "RECV": 8,
    "BARRIER": 10,
    "GATHER": 0,
    "SCATTER": 0,
}
_METHOD_OPS = {
    "allreduce": 1,
    "allreduce_coalesced": 1,
    "allgather": 2,
    "_allgather_base": 2,
    "all_gather_single": 2,
    "allgather_coalesced": 2,
    "allgather_into_tensor_coalesced": 2,
    "all_gather_single_coalesced": 2,
    "reduce_scatter": 3,
    "_reduce_scatter_base": 3,
    "reduce_scatter_single": 3,
    "reduce_scatter_tensor_coalesced": 3,
    "reduce_scatter_single_coalesced": 3,
    "broadcast": 4,
    "reduce": 5,
    "alltoall": 6,
    "alltoall_base": 6,
    "all_to_all_single": 6,
    "barrier": 10,
    "gather": 0,
    "gather_single": 0,
    "gather_into_tensor": 0,
    "scatter": 0,
    "send": 7,
    "recv": 8,
}
_SEND, _RECV = 7, 8
# Operations that reduce their inputs: all-reduce, reduce-scatter, reduce.
_REDUCING = (1, 3, 5)
# Which positional argument of a ProcessGroup method holds the inputs of a reducing
# operation: the first, but the second for reduce-scatter (outputs come first).
_INPUT_ARG = {1: 0, 3: 1, 5: 0}
# A device accumulator's value while it saw no non-finite input.
_UNSEEN = 1 << 62
# Point-to-point works whose backend gives no future (gloo's send and recv) end when
# they are waited for; at most this many wait at once.
_MAX_UNWAITED = 4096


def _begin(st, dist, pg, op, peer, nbytes):
    """Report the start of an operation on ``pg``; its (communicator, sequence number),
    or None when it is not reported (a receive from any source)."""
    if op == _SEND or op == _RECV:
        if peer is None or peer < 0:
            return None
        me = _pg_comm(st, dist, pg).rank
        c = _p2p_comm(st, dist, pg, me, peer) if op == _SEND else _p2p_comm(st, dist, pg, peer, me)
    else:
        c = _pg_comm(st, dist, pg)
    seq = next(c.seq)
    if st.host_works:
        # What ended before this operation began is reported before it: each rank's
        # reports stay in the order things happened.
        _poll_host(st)
    st.send(_wire.start(st.pid, st.rank, c.id, seq, op, nbytes, time.time_ns()))
    return c, seq


def _tensors(x):
    """The tensors of ``x``: a tensor, or nested lists and tuples of them."""
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif x is not None:
        yield x


def _defer(t):
    """Whether ``t``'s check stays on its device, read only in ``step()``: everything
    not on the CPU, where reading a result would wait for the device."""
    return t.device.type != "cpu"


def _can_hold_nan(t):
    return t.numel() > 0 and (t.is_floating_point() or t.is_complex())


def _host_finite(torch, t):
    """Whether CPU tensor ``t`` holds no NaN or infinity; None for one that cannot hold
    one (integers, empty). One reduction, its minimum and maximum (a NaN makes both NaN,
    an infinity shows in one), and no tensor of ``t``'s size."""
    if not _can_hold_nan(t):
        return None
    if t.is_complex():
        t = torch.view_as_real(t)
    try:
        lo, hi = torch.aminmax(t)
    except Exception:  # a dtype without aminmax
        return bool(torch.isfinite(t).all())
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def _device_finite(torch, t):
    """A 0-d bool tensor on ``t``'s device, true when ``t`` holds no NaN or infinity,
    queued and not read; None for a tensor that cannot hold one. For the usual training
    dtypes one reduction and one test: their sum in float64 cannot overflow, so it is
    NaN or infinite exactly when an element is."""
    if not _can_hold_nan(t):
        return None
    try:
        if t.dtype in (torch.float32, torch.bfloat16, torch.float16):
            return torch.isfinite(t.sum(dtype=torch.float64))
        if t.dtype == torch.complex64:
            return torch.isfinite(t.sum(dtype=torch.complex128))
        lo, hi = torch.aminmax(torch.view_as_real(t) if t.is_complex() else t)
        return torch.isfinite(lo) & torch.isfinite(hi)
    except Exception:  # a dtype without these
        return torch.isfinite(t).all()


def _check_inputs(st, inputs, index):
    """Note operation ``index`` when one of its ``inputs`` holds a NaN or infinity.
    CPU tensors are checked at once; for device tensors the check is queued on the
    device, folded into that device's accumulator, and read in ``step()``."""
    torch = st.torch
    flags = {}
    for t in _tensors(inputs):
        try:
            if _defer(t):
                ok = _device_finite(torch, t)
                if ok is not None:
                    prev = flags.get(t.device)
                    flags[t.device] = ok if prev is None else prev & ok
            elif st.nf_host is None and _host_finite(torch, t) is False:
                st.nf_host = index
        except Exception:
            pass
    for device, ok in flags.items():
        try:
            acc = st.nf_dev.get(device)
            if acc is None:
                acc = torch.full((), _UNSEEN, dtype=torch.int64, device=device)
                st.nf_dev[device] = acc
            torch.minimum(acc, torch.where(ok, _UNSEEN, index), out=acc)
        except Exception:
            pass


def _take_first_nonfinite(st):
    """The index of the first operation since the last ``step()`` whose input held a
    NaN or infinity, or None, and clears it. Reads each device's accumulator
    (``.item()`` waits for the work queued before it on the current stream)."""
    first = st.nf_host
    st.nf_host = None
    for acc in list(st.nf_dev.values()):
        try:
            seen = int(acc.item())
            acc.fill_(_UNSEEN)
        except Exception:
            continue
        if seen < _UNSEEN and (first is None or seen < first):
            first = seen
    if first is not None and first > _wire.MAX_OP_INDEX:
        return None
    return first


def _on_device(x):
    """Whether ``x`` (a tensor or a list of them) lives on an accelerator: its work is
    then a device work, enqueued on a stream."""
    try:
        if isinstance(x, (list, tuple)):
            return any(_on_device(t) for t in x)
        return x.device.type != "cpu"
    except Exception:
        return False


def _finish(st, work, key, device=False):
    """Report the end of ``work`` when it completes on this rank. A device work
    (``device``, or a future already done while the work has not run: NCCL completes its
    future at enqueue) ends when the work says it ran. A host work (gloo) ends when its
    future is done: seen when the work is waited for, when the next operation begins,
    or by the next poll, whichever comes first. Where the backend gives no future, when
    it is waited for.

    Nothing is hung on the future itself: its callback would run on the backend's
    worker thread, which must take the GIL from the training thread for every
    operation (``benches/hook_parts.py``), inside a synchronous call's own time."""
    c, seq = key
    try:
        if device:
            # Its future may complete at enqueue, whether or not it has yet: only the
            # work's own events say when it ran.
            _watch(st, work, None, c, seq)
            return
        fut = work.get_future()
        if fut.done():
            if not work.is_completed():
                # A device work (NCCL): its future completes when the work is enqueued
                # on the stream, not when it ran; the work itself says when it did.
                _watch(st, work, None, c, seq)
            elif _succeeded(fut):
                st.send(_wire.end(st.pid, st.rank, c.id, seq, time.time_ns()))
            return
        _watch_wait(st)
        _watch(st, work, fut, c, seq)
        return
    except Exception:
        pass
    _watch_wait(st)
    if len(st.unwaited) < _MAX_UNWAITED:
        st.unwaited[id(work)] = (work, c, seq)


def _succeeded(fut):
    """Whether done future ``fut`` holds a value (a failed operation did not complete)."""
    try:
        fut.value()
        return True
    except Exception:
        return False


# How often works not yet seen to end are asked whether they have, seconds: a wake of
# our own thread per interval, whatever the number of operations.
_POLL_S = 0.02
# Empty polls after which the thread sleeps until a work comes: it keeps its pace
# through a job's steps, and costs nothing in a process that stopped communicating.
_IDLE_POLLS = 50


def _watch(st, work, fut, c, seq):
    """Have our thread report the end of ``work``: a host work (``fut``, its future)
    when the future is done (unless a ``wait()`` reported it first), a device work
    (``fut`` None) when ``work.is_completed()``, which queries its CUDA events without
    blocking, says it ran."""
    if fut is None:
        with st.poll_cv:
            if len(st.device_works) >= _MAX_UNWAITED:
                return
            st.device_works.append((work, c, seq))
    elif len(st.host_works) < _MAX_UNWAITED:
        st.host_works[id(work)] = (work, c, seq, fut)
    else:
        return
    if st.poll_idle or st.poll_thread is None:
        with st.poll_cv:
            if st.poll_thread is None:
                t = threading.Thread(target=_poll_loop, args=(st,), name="warden-torch-poll", daemon=True)
                st.poll_thread = t
                t.start()
            st.poll_cv.notify()


def _poll_loop(st):
    empty = 0
    while not st.exited:
        if empty >= _IDLE_POLLS:
            with st.poll_cv:
                # Idle is set before the works are looked at: a work added after the
                # look finds it set and wakes us.
                st.poll_idle = True
                while not st.device_works and not st.host_works and not st.exited:
                    st.poll_cv.wait(1.0)
                st.poll_idle = False
            empty = 0
        empty = 0 if _poll(st) else empty + 1
        time.sleep(_POLL_S)


def _poll(st):
    """Report the end of every watched work that has ended; whether any was watched."""
    with st.poll_cv:
        pending = st.device_works
        st.device_works = []
    keep = []
    for entry in pending:
        work, c, seq = entry
        try:
            ran = work.is_completed()
        except Exception:
            continue  # failed or gone: it did not complete
        if ran:
            if not st.exited:
                st.send(_wire.end(st.pid, st.rank, c.id, seq, time.time_ns()))
        else:
            keep.append(entry)
    if keep:
        with st.poll_cv:
            st.device_works[:0] = keep
    _poll_host(st)
    return bool(pending or st.host_works)


def _poll_host(st):
    """Report the end of every watched host work whose future is done."""
    for k, (work, c, seq, fut) in list(st.host_works.items()):
        try:
            if not fut.done():
                continue
        except Exception:
            pass
        # Whoever takes it off reports it: the poll, the next operation, or the wait().
        if st.host_works.pop(k, None) is not None and _succeeded(fut) and not st.exited:
            st.send(_wire.end(st.pid, st.rank, c.id, seq, time.time_ns()))


def _watch_wait(st):
    """Patch ``Work.wait`` once, to report the end of a work when a wait for it
    returns: at once for a synchronous operation, which waits for its own work."""
    if st.wait_patched:
        return
    st.wait_patched = True
    try:
        from torch._C._distributed_c10d import Work
    except Exception:
        return
    orig = Work.wait

    def wait(self, *args, **kwargs):
        result = orig(self, *args, **kwargs)
        s = _state
        if s is None or result is False:
            return result
        # Both hold (work, communicator, seq, ...): a host work, or one without a future.
        entry = s.host_works.pop(id(self), None) if s.host_works else None
        if entry is None and s.unwaited:
            entry = s.unwaited.pop(id(self), None)
        if entry is not None and not s.exited:
            try:
                s.send(_wire.end(s.pid, s.rank, entry[1].id, entry[2], time.time_ns()))
            except Exception:
                pass
        return result

    raw = vars(Work).get("wait", orig)
    Work.wait = wait
    st.patched.append((Work, "wait", raw))


def _hook_pg(st, dist, pg):
    """Report every operation ``pg`` runs, whoever issues it (Python, DDP's reducer in
    C++, functional collectives), through the process group's own pre- and post-hooks."""
    if pg in st.hooked:
        return
    st.hooked.add(pg)
    begun = {}

    def pre(a):
        s = _state
        if s is None or s.exited:
            return
        if len(begun) > _MAX_UNWAITED:
            begun.clear()  # posts that never came (operations that raised)
        try:
            op = _HOOK_OPS.get(a.name.name)
            if op is None:
                return
            index = s.op_count
            s.op_count = index + 1
            if s.check_inputs and op in _REDUCING:
                _check_inputs(s, a.input_tensors, index)
            peer = a.root if op in (_SEND, _RECV) else None
            key = _begin(s, dist, pg, op, peer, _nbytes(a.input_tensors))
            if key is not None:
                begun[a.op_id] = (key, _on_device(a.input_tensors))
        except Exception:
            pass

    def post(a):
        s = _state
        begun_as = begun.pop(a.op_id, None)
        if begun_as is None or s is None or s.exited:
            return
        key, device = begun_as
        try:
            if a.work is None:
                s.send(_wire.end(s.pid, s.rank, key[0].id, key[1], time.time_ns()))
            else:
                _finish(s, a.work, key, device)
        except Exception:
            pass

    try:
        pg.register_pre_hook(_HOOK_ID, pre)
        pg.register_post_hook(_HOOK_ID, post)
        st.patched.append((pg, _HOOK_ID, None))
    except Exception as e:
        _log.debug("warden_torch: hooks not registered on %s: %s", pg, e)


_HOOK_ID = 0x5741524445  # "WARDE"


def _hook_groups(st, dist):
    """Hook every process group this process has, now and when one is created."""
    c10d = dist.distributed_c10d
    try:
        for pg in list(c10d._world.pg_map):
            _hook_pg(st, dist, pg)
    except Exception as e:
        _log.debug("warden_torch: cannot list process groups: %s", e)
    orig = getattr(c10d, "_register_process_group", None)
    if orig is None or getattr(orig, "_warden_wrapped", False):
        return

    def register(name, pg, *args, **kwargs):
        result = orig(name, pg, *args, **kwargs)
        s = _state
        if s is not None and not s.exited:
            try:
                _hook_pg(s, dist, pg)
            except Exception:
                pass
        return result

    register._warden_wrapped = True
    c10d._register_process_group = register
    st.patched.append((c10d, "_register_process_group", orig))


def _patch_methods(st, dist):
    """Report every operation issued through a ``ProcessGroup`` method from Python: all
    of ``torch.distributed`` (collectives, point-to-point, coalesced, object
    collectives) and the DDP hook below. For torch releases without process-group
    hooks; collectives issued from C++ (functional collectives) stay unseen."""
    try:
        from torch._C._distributed_c10d import ProcessGroup
    except Exception:
        return
    for mname, op in _METHOD_OPS.items():
        orig = getattr(ProcessGroup, mname, None)
        if orig is None or getattr(orig, "_warden_wrapped", False):
            continue
        wrapper = _method_wrapper(dist, orig, op)
        # Restore the class's own entry (pybind keeps methods there as instance-method
        # descriptors; the function getattr gives would not bind self).
        raw = vars(ProcessGroup).get(mname, orig)
        setattr(ProcessGroup, mname, wrapper)
        st.patched.append((ProcessGroup, mname, raw))


def _method_wrapper(dist, orig, op):
    p2p = op in (_SEND, _RECV)
    inputs_at = _INPUT_ARG.get(op)

    def method(self, *args, **kwargs):
        st = _state
        if st is None or st.exited:
            return orig(self, *args, **kwargs)
        try:
            index = st.op_count
            st.op_count = index + 1
            if st.check_inputs and inputs_at is not None and len(args) > inputs_at:
                _check_inputs(st, args[inputs_at], index)
            peer = None
            if p2p:
                peer = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank"))
            first = args[0] if args else None
            key = _begin(st, dist, self, op, peer, _nbytes(first))
            device = _on_device(first)
        except Exception:
            key = None
        work = orig(self, *args, **kwargs)
        if key is not None:
            try:
                _finish(st, work, key, device)
            except Exception:
                pass
        return work

    method._warden_wrapped = True
    method.__wrapped__ = orig
    method.__name__ = getattr(orig, "__name__", "method")
    method.__doc__ = getattr(orig, "__doc__", None)
    return method


def _has_pg_hooks():
    try:
        from torch._C._distributed_c10d import ProcessGroup
    except Exception:
        return False
    return hasattr(ProcessGroup, "register_pre_hook") and hasattr(ProcessGroup, "register_post_hook")


def _capture_mode():
    """``hooks`` where ProcessGroup has pre- and post-hooks, else ``methods``;
    ``WARDEN_TORCH_CAPTURE`` may ask for ``methods``."""
    want = os.environ.get("WARDEN_TORCH_CAPTURE", "").strip().lower()
    if want == "methods" or not _has_pg_hooks():
        return "methods"
    return "hooks"


def _allreduce_hook(dist):
    """DDP's gradient all-reduce in Python, so that the ProcessGroup method wrappers see
    it: the arithmetic of PyTorch's own ``default_hooks.allreduce_hook`` and of DDP's
    built-in path (divide by the group size, sum). Only where process groups have no
    hooks of their own."""

    def unwrap(fut):
        return fut.value()[0]

    def hook(pg, bucket):
        tensor = bucket.buffer()
        tensor.div_(pg.size())
        return pg.allreduce([tensor]).get_future().then(unwrap)

    return hook


def _patch_ddp(st):
    """Route DDP's gradient all-reduces through Python, where the ProcessGroup method
    wrappers see them (only where process groups have no hooks).

    A DDP model gets ``_allreduce_hook`` (the same arithmetic as DDP's built-in path)
    before its first forward, unless the program registers a hook of its own first; a
    program's hook calls ProcessGroup methods, where it is seen.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if getattr(DDP.forward, "_warden_wrapped", False):
        return
    orig_forward = DDP.forward
    orig_register = DDP.register_comm_hook
    orig_builtin = getattr(DDP, "_register_builtin_comm_hook", None)

    def forward(self, *args, **kwargs):
        if not getattr(self, "_warden_hooked", False):
            self._warden_hooked = True
            try:
                orig_register(self, self.process_group, _allreduce_hook(dist))
            except Exception as e:  # a hook of the program's own, or an old torch
                _log.debug("warden_torch: DDP hook not registered: %s", e)
        return orig_forward(self, *args, **kwargs)

    def register_comm_hook(self, state, hook):
        self._warden_hooked = True
        return orig_register(self, state, hook)

    def register_builtin(self, comm_hook_type):
        self._warden_hooked = True
        return orig_builtin(self, comm_hook_type)

    forward._warden_wrapped = True
    DDP.forward = forward
    DDP.register_comm_hook = register_comm_hook
    st.patched.append((DDP, "forward", orig_forward))
    st.patched.append((DDP, "register_comm_hook", orig_register))
    if orig_builtin is not None:
        DDP._register_builtin_comm_hook = register_builtin
        st.patched.append((DDP, "_register_builtin_comm_hook", orig_builtin))


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def init(
    job: Optional[str] = None,
    socket_path: Optional[str] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    local_rank: Optional[int] = None,
    ddp: bool = True,
    check_inputs: Optional[bool] = None,
) -> bool:
    """Start reporting. Returns True when reporting is on, False when it could not be
    (no job id, no torch.distributed); it never raises. Safe to call twice.

    ``check_inputs``: check the inputs of every reducing operation for a NaN or
    infinity before the reduction and report the first such operation of each step
    (see the module's documentation); None (the default) takes
    ``WARDEN_TORCH_CHECK_INPUTS`` (``1`` turns it on), else off."""
    global _state
    try:
        if _state is not None:
            return True
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        job = job or _job_id() or (_shared_job_id(dist) if initialized else None)
        if not job:
            _log.warning("warden_torch: no job id (set WARDEN_JOB); not reporting")
            return False
        if rank is None:
            rank = dist.get_rank() if initialized else _int_env("RANK", 0)
        if world_size is None:
            world_size = dist.get_world_size() if initialized else _int_env("WORLD_SIZE", 1)
        if local_rank is None:
            local_rank = _int_env("LOCAL_RANK", -1)
        gpu = -1
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                gpu = torch.cuda.current_device()
        except Exception:
            pass
        path = socket_path or os.environ.get("WARDEN_AGENT_SOCKET") or DEFAULT_SOCKET
        st = _State(path, str(job), int(rank), int(world_size), int(local_rank), int(gpu))
        if check_inputs is None:
            check_inputs = _env_flag("WARDEN_TORCH_CHECK_INPUTS")
        if check_inputs:
            import torch

            st.torch = torch
            st.check_inputs = True
        st.next_hello = time.monotonic() + _HELLO_EVERY_S
        connected = st.connect()
        _state = st
        if dist.is_available():
            st.mode = _capture_mode()
            if st.mode == "hooks":
                _hook_groups(st, dist)
            else:
                _patch_methods(st, dist)
                if ddp:
                    _patch_ddp(st)
        _install_exit_hooks()
        if not connected:
            _log.warning("warden_torch: cannot reach the agent at %s; trying again every %.0f s", path, _HELLO_EVERY_S)
        return True
    except Exception as e:
        _log.warning("warden_torch: not reporting: %s", e)
        return False


def step(
    step_no: int,
    loss: Optional[SupportsFloat] = None,
    grad_norm: Optional[SupportsFloat] = None,
    tokens_per_s: Optional[SupportsFloat] = None,
) -> None:
    """Report one training step's numbers (floats or one-element tensors), and with the
    input check on, the first operation since the last ``step()`` whose input held a
    NaN or infinity. Never raises."""
    st = _state
    if st is None:
        return
    try:
        first = _take_first_nonfinite(st) if st.check_inputs else None
        st.op_count = 0
        st.send(
            _wire.step(
                st.pid,
                st.rank,
                int(step_no),
                time.time_ns(),
                _float(loss),
                _float(grad_norm),
                _float(tokens_per_s),
                first,
            )
        )
    except Exception:
        pass


def _float(x):
    if x is None:
        return None
    try:
        return float(x.item()) if hasattr(x, "item") else float(x)
    except Exception:
        return None


def capture_mode() -> Optional[str]:
    """How operations are captured: ``hooks`` (process-group hooks: everything),
    ``methods`` (ProcessGroup methods: everything issued from Python), or None before
    ``init()``."""
    st = _state
    return st.mode if st else None


def checking_inputs() -> bool:
    """Whether reducing operations' inputs are checked for NaN and infinity
    (``init(check_inputs=True)`` or ``WARDEN_TORCH_CHECK_INPUTS=1``)."""
    st = _state
    return bool(st and st.check_inputs)


def stats() -> dict[str, int]:
    """Messages sent and dropped so far: ``{"sent": n, "dropped": n}``."""
    st = _state
    return {"sent": st.sent, "dropped": st.dropped} if st else {"sent": 0, "dropped": 0}


def shutdown(code: int = 0, message: str = "") -> None:
    """Say goodbye (exit code, last words) and stop reporting; undoes the patches."""
    global _state
    st = _state
    if st is None or st.exited:
        return
    try:
        # Ends that happened since the last poll are reported before the goodbye.
        _poll(st)
        st.exited = True
        with st.poll_cv:
            st.poll_cv.notify_all()
        goodbye = _wire.exit_(st.pid, st.rank, int(code), time.time_ns(), message)
        for obj, name, orig in reversed(st.patched):
            if orig is None:
                # A process group's hooks (name is their id).
                try:
                    obj.unregister_pre_hook(name)
                    obj.unregister_post_hook(name)
                except Exception:
                    pass
            else:
                setattr(obj, name, orig)
        with st.send_lock:
            sock, rest = st.sock, st.backlog + goodbye
            st.sock, st.backlog = None, b""
        if sock is not None:
            # The goodbye goes out whole, after what is still waiting, however full the
            # backlog: without it the agent takes the exit for a death. The process is
            # leaving, so it may wait for a busy agent, but not for ever.
            try:
                sock.settimeout(_GOODBYE_S)
                sock.sendall(rest)
            finally:
                sock.close()
    except Exception:
        pass
    _state = None


_hooks_installed = False


def _install_exit_hooks():
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        st = _state
        if st is not None:
            first = str(value).strip().splitlines()
            st.exception = "%s: %s" % (kind.__name__, first[0] if first else "")
        previous(kind, value, tb)

    sys.excepthook = excepthook

    def at_exit():
        st = _state
        if st is None:
            return
        if st.exception is not None:
            shutdown(1, st.exception)
        else:
            shutdown(0, "")

    atexit.register(at_exit)
