"""A rank's goodbye reaches a busy agent.

The agent takes a connection that closes without an exit message for a death. A rank
that reports faster than a loaded agent reads fills its socket and then its backlog;
its exit message must still go out, last and whole, once the agent reads again. Here a
stand-in agent stops reading for 2 s (longer than a scheduling stall on a busy machine,
shorter than the 5 s an exit waits at most) while the rank reports 20,000 steps and
then shuts down. Checks: the connection's last frame is the exit, with code 0, and
every frame before it is whole. No process group needed.

    python3 check_goodbye.py      # exit 0: the check passed
"""

import os
import socket
import struct
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import warden_torch  # noqa: E402
from warden_torch import _wire  # noqa: E402

HEADER = struct.Struct("<2sBBII")
STALL_S = 2.0


def slow_agent(path, frames, done, listening):
    """Accept one connection, read nothing for STALL_S, then keep every frame's body
    until the connection closes."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    listening.set()
    conn, _ = srv.accept()
    time.sleep(STALL_S)
    buf = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    at = 0
    while at + 2 <= len(buf):
        (n,) = struct.unpack_from("<H", buf, at)
        if at + 2 + n > len(buf):
            break
        frames.append(buf[at + 2 : at + 2 + n])
        at += 2 + n
    frames.append(len(buf) - at)  # bytes of an unfinished frame at the end
    done.set()


def main():
    failed = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "agent.sock")
        frames, done, listening = [], threading.Event(), threading.Event()
        threading.Thread(target=slow_agent, args=(path, frames, done, listening), daemon=True).start()
        listening.wait()
        if not warden_torch.init(job="goodbye", socket_path=path, rank=0, world_size=1):
            print("warden_torch.init failed")
            return 1
        for step in range(20000):
            warden_torch.step(step, loss=1.0)
        dropped = warden_torch.stats()["dropped"]
        began = time.monotonic()
        warden_torch.shutdown(0, "")
        waited = time.monotonic() - began
        if not done.wait(30):
            print("the stand-in agent never saw the connection close")
            return 1
    tail = frames.pop()
    if tail:
        failed.append("%d bytes of an unfinished frame at the end" % tail)
    if not frames:
        failed.append("no frame arrived")
    else:
        _, _, kind, _, _ = HEADER.unpack_from(frames[-1])
        if kind != _wire.EXIT:
            failed.append("the last frame is of kind %d, not the exit (%d)" % (kind, _wire.EXIT))
        else:
            (code,) = struct.unpack_from("<i", frames[-1], HEADER.size)
            if code != 0:
                failed.append("exit code %d, not 0" % code)
        exits = sum(1 for f in frames if HEADER.unpack_from(f)[2] == _wire.EXIT)
        if exits != 1:
            failed.append("%d exit frames" % exits)
    steps = sum(1 for f in frames if HEADER.unpack_from(f)[2] == _wire.STEP)
    print("goodbye check: %d frames, %d steps, %d dropped by the rank, shutdown waited %.2f s"
          % (len(frames), steps, dropped, waited))
    if failed:
        for f in failed:
            print("FAILED:", f)
        return 1
    print("goodbye check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
