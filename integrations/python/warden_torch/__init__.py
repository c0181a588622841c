"""Report a PyTorch job's collective progress, steps, loss and grad norm to the Warden agent.

Call ``warden_torch.init()`` once in each training process, after
``torch.distributed.init_process_group``, and ``warden_torch.step(n, loss=..., grad_norm=...)``
once per step. From then on every collective the process issues through
``torch.distributed`` (``all_reduce``, ``broadcast``, ``all_gather``, ``barrier``, ...) is
reported when it starts and when it completes on this rank, and so are the gradient
all-reduces of ``DistributedDataParallel`` (which registers a communication hook that
reports them), for gloo and NCCL alike.

Reports are length-prefixed messages on a Unix stream connection to the agent
(``WARDEN_AGENT_SOCKET``, default ``/run/warden/capture.sock``), written without
blocking: what the socket cannot take at once waits in a bounded local backlog that the
next report pushes on; when the agent is missing, reports are dropped and counted and
the connection is tried again every few seconds. The training loop always goes on, and
nothing here raises into it. The agent learns of the process's death from the
connection closing.

The job id is ``WARDEN_JOB``, else ``SLURM_JOB_ID``, else ``TORCHELASTIC_RUN_ID``; the rank is
the process group's, else ``RANK``.
"""

import atexit
import itertools
import logging
import os
import socket
import sys
import threading
import time

from . import _wire

__all__ = ["init", "step", "stats", "shutdown", "DEFAULT_SOCKET"]

DEFAULT_SOCKET = "/run/warden/capture.sock"
_HELLO_EVERY_S = 5.0
_MAX_BACKLOG = 1 << 20
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)

_log = logging.getLogger("warden_torch")
_state = None
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
        self.sent = 0
        self.dropped = 0
        self.next_hello = 0.0
        self.exception = None
        self.exited = False
        self.patched = []

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
        for c in list(self.comms.values()):
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
        v = os.environ.get(var)
        if v:
            return v
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


def _comm_of(st, dist, group):
    pg = group if group is not None else dist.group.WORLD
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
        c = _Comm(_comm_id("pg:" + str(name)), dist.get_world_size(pg), dist.get_rank(pg), "pg:" + str(name))
        st.comms[pg] = c
    st.send(_wire.comm(st.pid, st.rank, c.id, c.size, c.rank, c.name))
    return c


def _nbytes(x):
    try:
        if isinstance(x, (list, tuple)):
            return sum(_nbytes(t) for t in x)
        return int(x.numel()) * int(x.element_size())
    except Exception:
        return 0


def _wrap(dist, fname):
    orig = getattr(dist, fname)
    if getattr(orig, "_warden_wrapped", False):
        return None
    import inspect

    params = list(inspect.signature(orig).parameters)
    g_at = params.index("group") if "group" in params else None
    a_at = params.index("async_op") if "async_op" in params else None
    op = _wire.OPS.get(fname, 0)

    def wrapper(*args, **kwargs):
        st = _state
        if st is None or st.exited:
            return orig(*args, **kwargs)
        try:
            group = kwargs.get("group") if "group" in kwargs else (args[g_at] if g_at is not None and len(args) > g_at else None)
            is_async = kwargs.get("async_op") if "async_op" in kwargs else (args[a_at] if a_at is not None and len(args) > a_at else False)
            c = _comm_of(st, dist, group)
            seq = next(c.seq)
            payload = args[0] if args else next(iter(kwargs.values()), None)
            st.send(_wire.start(st.pid, st.rank, c.id, seq, op, _nbytes(payload), time.time_ns()))
        except Exception:
            return orig(*args, **kwargs)
        result = orig(*args, **kwargs)
        try:
            if is_async and result is not None:
                fut = result.get_future()

                def done(f, c=c, seq=seq):
                    try:
                        f.value()
                    except Exception:
                        return None  # failed: it did not complete
                    try:
                        st.send(_wire.end(st.pid, st.rank, c.id, seq, time.time_ns()))
                    except Exception:
                        pass
                    return None

                fut.then(done)
            else:
                st.send(_wire.end(st.pid, st.rank, c.id, seq, time.time_ns()))
        except Exception:
            pass
        return result

    wrapper._warden_wrapped = True
    wrapper.__wrapped__ = orig
    wrapper.__name__ = orig.__name__
    wrapper.__doc__ = orig.__doc__
    return orig, wrapper


_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "barrier",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
)


def _patch_collectives(st, dist):
    c10d = dist.distributed_c10d
    for fname in _COLLECTIVES:
        if not hasattr(dist, fname):
            continue
        pair = _wrap(dist, fname)
        if pair is None:
            continue
        orig, wrapper = pair
        for mod in (dist, c10d):
            if getattr(mod, fname, None) is orig:
                setattr(mod, fname, wrapper)
                st.patched.append((mod, fname, orig))


def _allreduce_hook(dist):
    """DDP's gradient all-reduce, reported: the arithmetic of PyTorch's own
    ``default_hooks.allreduce_hook`` (divide by the group size, sum), issued on the process
    group directly, with the end reported from the one completion callback that hands DDP
    its tensor. Every reported step pays for this, so it is kept lean: no
    ``torch.distributed`` wrapper in between, one Python callback per bucket."""

    op = _wire.OPS["all_reduce"]

    def unwrap(fut):
        return fut.value()[0]

    def hook(pg, bucket):
        tensor = bucket.buffer()
        st = _state
        c = None
        if st is not None and not st.exited:
            try:
                c = st.comms.get(pg) or _comm_of(st, dist, pg)
                seq = next(c.seq)
                st.send(_wire.start(st.pid, st.rank, c.id, seq, op, tensor.numel() * tensor.element_size(), time.time_ns()))
            except Exception:
                c = None
        tensor.div_(pg.size())
        fut = pg.allreduce([tensor]).get_future()
        if c is None:
            return fut.then(unwrap)

        def done(f):
            result = f.value()[0]  # a failed all-reduce raises to DDP, unreported
            try:
                st.send(_wire.end(st.pid, st.rank, c.id, seq, time.time_ns()))
            except Exception:
                pass
            return result

        return fut.then(done)

    return hook


def _patch_ddp(st):
    """Report DDP's gradient all-reduces, which never pass through torch.distributed.

    A DDP model gets ``_allreduce_hook`` (the same arithmetic as DDP's built-in path)
    before its first forward, unless the program registers a hook of its own first; a
    program's hook calls torch.distributed, where it is seen.
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


def init(job=None, socket_path=None, rank=None, world_size=None, local_rank=None, ddp=True):
    """Start reporting. Returns True when reporting is on, False when it could not be
    (no job id, no torch.distributed); it never raises. Safe to call twice."""
    global _state
    try:
        if _state is not None:
            return True
        import torch.distributed as dist

        job = job or _job_id()
        if not job:
            _log.warning("warden_torch: no job id (set WARDEN_JOB); not reporting")
            return False
        initialized = dist.is_available() and dist.is_initialized()
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
        st.next_hello = time.monotonic() + _HELLO_EVERY_S
        connected = st.connect()
        _state = st
        if dist.is_available():
            _patch_collectives(st, dist)
            if ddp:
                _patch_ddp(st)
        _install_exit_hooks()
        if not connected:
            _log.warning("warden_torch: cannot reach the agent at %s; trying again every %.0f s", path, _HELLO_EVERY_S)
        return True
    except Exception as e:
        _log.warning("warden_torch: not reporting: %s", e)
        return False


def step(step_no, loss=None, grad_norm=None, tokens_per_s=None):
    """Report one training step's numbers (floats or one-element tensors). Never raises."""
    st = _state
    if st is None:
        return
    try:
        st.send(
            _wire.step(
                st.pid,
                st.rank,
                int(step_no),
                time.time_ns(),
                _float(loss),
                _float(grad_norm),
                _float(tokens_per_s),
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


def stats():
    """Datagrams sent and dropped so far."""
    st = _state
    return {"sent": st.sent, "dropped": st.dropped} if st else {"sent": 0, "dropped": 0}


def shutdown(code=0, message=""):
    """Say goodbye (exit code, last words) and stop reporting; undoes the patches."""
    global _state
    st = _state
    if st is None or st.exited:
        return
    try:
        st.exited = True
        st._send(_wire.exit_(st.pid, st.rank, int(code), time.time_ns(), message))
        for obj, name, orig in reversed(st.patched):
            setattr(obj, name, orig)
        if st.sock is not None:
            # Push out what is still waiting (briefly: the process is exiting).
            if st.backlog:
                st.sock.settimeout(0.5)
                st.sock.sendall(st.backlog)
            st.sock.close()
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
