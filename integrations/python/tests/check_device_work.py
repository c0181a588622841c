"""A device work (NCCL) ends when it ran, not when it was enqueued.

ProcessGroupNCCL completes a work's future as soon as the work is enqueued on its CUDA
stream; only ``work.is_completed()`` (which queries the work's CUDA events) says when it
ran. A stand-in work of that shape goes through ``warden_torch._finish``: no end may be
reported while it has not run, one end once it has. A work on device tensors is watched
the same way even when its future is not yet done when the call returns (it completes
at enqueue a moment later). A work whose future completes with it (gloo) is reported
once its future is done, found by the same poll. No GPU and no process group needed.

    python3 check_device_work.py      # exit 0: the check passed
"""

import os
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE)))

import warden_torch  # noqa: E402
from warden_torch import _wire  # noqa: E402
from fake_agent import listen  # noqa: E402


class Future:
    def __init__(self, done):
        self._done = done
        self.callbacks = []

    def done(self):
        return self._done

    def then(self, cb):
        # As torch's: a callback on a done future runs at once.
        if self._done:
            cb(self)
        else:
            self.callbacks.append(cb)

    def value(self):
        return None

    def complete(self):
        self._done = True
        for cb in self.callbacks:
            cb(self)


class DeviceWork:
    """Enqueued: its future is done, the work has not run."""

    def __init__(self):
        self.ran = False
        self.fut = Future(True)

    def get_future(self):
        return self.fut

    def is_completed(self):
        return self.ran


class LateDeviceWork(DeviceWork):
    """Enqueued, and its future completes a moment after the call returns (at enqueue,
    from another thread): only the work's tensors say it is a device work."""

    def __init__(self):
        super().__init__()
        self.fut = Future(False)


class HostWork:
    """gloo's shape: the future completes when the work does."""

    def __init__(self):
        self.fut = Future(False)

    def get_future(self):
        return self.fut

    def is_completed(self):
        return self.fut.done()


def ends(frames):
    """(comm id, seq) of every END frame received."""
    out = []
    for body in frames:
        if len(body) >= 4 and body[3] == _wire.END:
            _, _, _, _, _, comm, seq, _ = struct.unpack("<2sBBIIQQq", body)
            out.append((comm, seq))
    return out


def main():
    tmp = tempfile.mkdtemp()
    path, frames, _ = listen(tmp, 0)
    st = warden_torch._State(path, "check-device-work", 0, 1, 0, -1)
    if not st.connect():
        print("FAIL: cannot reach the stand-in agent")
        return 1
    c = warden_torch._Comm(11, 1, 0, "pg:0")
    dev, host, late = DeviceWork(), HostWork(), LateDeviceWork()
    warden_torch._finish(st, dev, (c, 1))
    warden_torch._finish(st, host, (c, 2))
    warden_torch._finish(st, late, (c, 3), device=True)
    late.fut.complete()  # enqueued: its future completes, it has not run
    time.sleep(0.3)
    failures = []
    if ends(frames):
        failures.append("ends reported before any work ran: %s" % ends(frames))
    host.fut.complete()
    dev.ran = True
    late.ran = True
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(ends(frames)) < 3:
        time.sleep(0.02)
    got = sorted(ends(frames))
    if got != [(11, 1), (11, 2), (11, 3)]:
        failures.append("ends after all ran: %s, want [(11, 1), (11, 2), (11, 3)]" % got)
    st.exited = True
    for f in failures:
        print("FAIL:", f)
    print("device work check: %s" % ("failed" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
