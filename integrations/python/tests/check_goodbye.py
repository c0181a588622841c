"""A rank's goodbye reaches a busy agent.

The agent takes a connection that closes without an exit message for a death. A rank
that reports faster than a loaded agent reads fills its socket and then its backlog;
its exit message must still go out, last and whole, once the agent reads again. Here a
stand-in agent reads nothing while the rank reports until 256 KiB wait in its backlog
and then shuts down; the agent starts reading 1 s into the shutdown (a scheduling
stall on a busy machine, well within the 5 s an exit waits at most). Checks: the
connection's last whole frame is the exit, with code 0, and it is the only one. No
process group needed.

    python3 check_goodbye.py      # exit 0: the check passed
"""

import os
import struct
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import warden_torch  # noqa: E402
from fake_agent import HEADER, serve  # noqa: E402
from warden_torch import _wire  # noqa: E402

STALL_S = 1.0
BACKLOG = 256 << 10


def main():
    failed = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "agent.sock")
        frames, done, listening, go = [], threading.Event(), threading.Event(), threading.Event()
        threading.Thread(target=serve, args=(path, frames, done, listening, go), daemon=True).start()
        listening.wait()
        if not warden_torch.init(job="goodbye", socket_path=path, rank=0, world_size=1):
            print("warden_torch.init failed")
            return 1
        step = 0
        while len(warden_torch._state.backlog) < BACKLOG and step < 10_000_000:
            warden_torch.step(step, loss=1.0)
            step += 1
        dropped = warden_torch.stats()["dropped"]
        threading.Timer(STALL_S, go.set).start()
        began = time.monotonic()
        warden_torch.shutdown(0, "")
        waited = time.monotonic() - began
        if not done.wait(30):
            print("the stand-in agent never saw the connection close")
            return 1
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
