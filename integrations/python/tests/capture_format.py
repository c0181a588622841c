"""The capture format as the agent reads it, written apart from ``warden_torch._wire``.

``decode`` follows ``decode`` in agent/src/capture.rs field by field (little-endian
readers, a ``u16``-prefixed UTF-8 text with a byte limit, flags that pick the step's
numbers, the op index behind flag 8, a rank below ``MAX_RANK``), and the builders follow
that file's test helpers (``header``, ``text``), so the tests check ``_wire`` against the
format and not against itself. docs/CAPTURE.md, "Protocol", is the reference for both.
"""

import struct
from typing import Any, Dict, List, Optional, Tuple

MAGIC = b"WT"
VERSION = 1
HEADER_LEN = 12
HELLO, COMM, START, END, STEP, EXIT = 1, 2, 3, 4, 5, 6
# Longest texts the agent accepts, bytes: job, communicator name, exit message.
MAX_JOB_LEN = 253
MAX_NAME_LEN = 256
MAX_MESSAGE_LEN = 4096
STEP_LOSS, STEP_GRAD_NORM, STEP_TOKENS, STEP_OP_INDEX = 1, 2, 4, 8
# model/src/wire.rs: MAX_RANK (= MAX_WORLD_SIZE) and MAX_OP_INDEX.
MAX_RANK = 1 << 20
MAX_OP_INDEX = 1 << 20


class DecodeError(ValueError):
    """A message the agent refuses; ``reason`` is the Rust ``DecodeError`` variant."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def u16(v: int) -> bytes:
    return v.to_bytes(2, "little")


def u32(v: int) -> bytes:
    return v.to_bytes(4, "little")


def i32(v: int) -> bytes:
    return v.to_bytes(4, "little", signed=True)


def u64(v: int) -> bytes:
    return v.to_bytes(8, "little")


def i64(v: int) -> bytes:
    return v.to_bytes(8, "little", signed=True)


def f64(v: float) -> bytes:
    return struct.pack("<d", v)


def header(kind: int, pid: int, rank: int) -> bytes:
    """The 12 bytes every message starts with."""
    return MAGIC + bytes([VERSION, kind]) + u32(pid) + u32(rank)


def text(s: str) -> bytes:
    """A text field: its ``u16`` byte length, then its UTF-8."""
    b = s.encode()
    return u16(len(b)) + b


def frame(message: bytes) -> bytes:
    """A message on the stream: its ``u16`` length, then the message."""
    return u16(len(message)) + message


class _Fields:
    """A little-endian reader over one message (capture.rs ``Fields``)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise DecodeError("Truncated")
        b = self.data[self.at : self.at + n]
        self.at += n
        return b

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def sint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little", signed=True)

    def float(self) -> float:
        return struct.unpack("<d", self.take(8))[0]

    def text(self, limit: int) -> str:
        n = self.uint(2)
        b = self.take(n)
        if n > limit:
            raise DecodeError("Text")
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("Text") from None


def decode(d: bytes) -> Tuple[int, int, Dict[str, Any]]:
    """(pid, rank, message) of one message (without its frame length), as the agent
    decodes it; raises ``DecodeError`` where the agent refuses it. The message is a dict
    with ``kind`` (``hello`` ... ``exit``) and the fields of capture.rs ``Message``;
    ``None`` stands for Rust's ``None``."""
    if len(d) < HEADER_LEN or d[0:2] != MAGIC or d[2] != VERSION:
        raise DecodeError("Header")
    kind = d[3]
    f = _Fields(d)
    f.take(4)
    pid = f.uint(4)
    rank = f.uint(4)

    def opt(v: int) -> Optional[int]:
        return v if v >= 0 else None

    msg: Dict[str, Any]
    if kind == HELLO:
        msg = {
            "kind": "hello",
            "world": f.uint(4),
            "local_rank": opt(f.sint(4)),
            "gpu": opt(f.sint(4)),
            "pidns": f.uint(8),
            "job": f.text(MAX_JOB_LEN),
        }
    elif kind == COMM:
        msg = {
            "kind": "comm",
            "comm": f.uint(8),
            "size": f.uint(4),
            "comm_rank": f.uint(4),
            "name": f.text(MAX_NAME_LEN),
        }
    elif kind == START:
        msg = {
            "kind": "start",
            "comm": f.uint(8),
            "seq": f.uint(8),
            "op": f.uint(4),
            "bytes": f.uint(8),
            "at_ns": f.sint(8),
        }
    elif kind == END:
        msg = {"kind": "end", "comm": f.uint(8), "seq": f.uint(8), "at_ns": f.sint(8)}
    elif kind == STEP:
        step, at_ns, flags = f.uint(8), f.sint(8), f.uint(4)
        loss, grad, tps = f.float(), f.float(), f.float()
        msg = {
            "kind": "step",
            "step": step,
            "at_ns": at_ns,
            "loss": loss if flags & STEP_LOSS else None,
            "grad_norm": grad if flags & STEP_GRAD_NORM else None,
            "tokens_per_s": tps if flags & STEP_TOKENS else None,
            "first_nonfinite_op": f.uint(4) if flags & STEP_OP_INDEX else None,
        }
    elif kind == EXIT:
        msg = {"kind": "exit", "code": f.sint(4), "at_ns": f.sint(8), "message": f.text(MAX_MESSAGE_LEN)}
    else:
        raise DecodeError("Kind")
    if rank >= MAX_RANK:
        raise DecodeError("Truncated")
    return pid, rank, msg


def unframe(stream: bytes) -> List[bytes]:
    """The messages of a byte stream of whole frames; raises ``ValueError`` when the
    stream ends inside a frame."""
    out: List[bytes] = []
    at = 0
    while at < len(stream):
        if at + 2 > len(stream):
            raise ValueError("a frame length cut short at byte %d" % at)
        n = int.from_bytes(stream[at : at + 2], "little")
        if at + 2 + n > len(stream):
            raise ValueError("a frame of %d bytes cut short at byte %d" % (n, at))
        out.append(stream[at + 2 : at + 2 + n])
        at += 2 + n
    return out
