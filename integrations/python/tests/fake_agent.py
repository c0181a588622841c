"""What the two-rank checks share: a Unix socket standing in for the agent, and a
rank's way out.

``listen`` starts, for one rank, a thread that accepts one connection on a socket of
the rank's own and keeps every frame's body (the bytes after the u16 length) until the
connection closes. ``leave`` ends a rank's process without the interpreter's teardown,
where PyTorch's gloo threads can abort the process (see examples/train_ddp.py), once
what it put on its queue is flushed.
"""

import os
import socket
import struct
import sys
import threading


# The header every frame body starts with: magic, version, kind, pid, rank.
HEADER = struct.Struct("<2sBBII")


def take_frames(buf, frames):
    """Append the body of every whole frame at the start of ``buf`` (a u16 length, then
    that many bytes) to ``frames``; return the bytes left, an unfinished frame."""
    at = 0
    while at + 2 <= len(buf):
        (n,) = struct.unpack_from("<H", buf, at)
        if at + 2 + n > len(buf):
            break
        frames.append(buf[at + 2 : at + 2 + n])
        at += 2 + n
    return buf[at:]


def serve(path, frames, done, listening, go=None):
    """Accept one connection, read nothing until the event ``go`` is set, when one is
    given (an agent that fell behind), then keep every frame's body until it closes."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    listening.set()
    conn, _ = srv.accept()
    if go is not None:
        go.wait()
    buf = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf = take_frames(buf + chunk, frames)
    done.set()


def listen(sock_dir, rank):
    """(socket path, the frames received so far, an event set when the connection
    closed) of rank ``rank``'s stand-in agent, once it listens."""
    path = os.path.join(sock_dir, "rank%d.sock" % rank)
    frames, closed, listening = [], threading.Event(), threading.Event()
    threading.Thread(target=serve, args=(path, frames, closed, listening), daemon=True).start()
    # Not once the path exists: a connection between bind() and listen() is refused.
    listening.wait()
    return path, frames, closed


def leave(queue, code):
    """Flush ``queue`` and the standard streams, then end the process with ``code``."""
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank_entry(rank_main, failed, rank, world, port, sock_dir, mode, out):
    """One spawned rank: `rank_main` under capture `mode`; an exception it raises is put
    on the queue as `(rank, [what it raised], *failed)`."""
    import os

    code = 0
    os.environ["WARDEN_TORCH_CAPTURE"] = mode
    try:
        rank_main(rank, world, port, sock_dir, mode, out)
    except BaseException as e:
        out.put((rank, ["raised %s: %s" % (type(e).__name__, e)], *failed))
        code = 1
    leave(out, code)


def run_ranks(rank_main, mode, failed, world=2, timeout=180):
    """Run `rank_main(rank, world, port, tmpdir, mode, queue)` under capture `mode` in
    `world` spawned processes (one gloo job on a free port) and return what they put on
    the queue; a rank that raises puts `(rank, [what it raised], *failed)`."""
    import multiprocessing
    import socket
    import tempfile
    import time

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = []
    with tempfile.TemporaryDirectory() as d:
        procs = [
            ctx.Process(target=_rank_entry, args=(rank_main, failed, r, world, port, d, mode, out))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(results) < world and time.monotonic() < deadline:
            try:
                results.append(out.get(timeout=1))
            except Exception:
                if all(p.exitcode is not None for p in procs):
                    break
        for p in procs:
            p.join(30)
    return results
