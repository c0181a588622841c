"""The capture messages the Warden agent reads (agent/src/capture.rs, docs/CAPTURE.md).

Little-endian; on the stream each message follows its u16 length. A 12-byte header (b"WT",
version, kind, pid u32, rank u32) and a body per kind. Times are CLOCK_REALTIME
nanoseconds, the clock the agent stamps with. Every function here returns the whole frame,
length first; the fixed-size ones pack it in the same call, since they run on the training
thread once or twice per collective.
"""

import struct

VERSION = 1
HELLO, COMM, START, END, STEP, EXIT = 1, 2, 3, 4, 5, 6

# Wire CollOp values (model/src/wire.rs).
OPS = {
    "all_reduce": 1,
    "all_gather": 2,
    "all_gather_into_tensor": 2,
    "reduce_scatter": 3,
    "reduce_scatter_tensor": 3,
    "broadcast": 4,
    "reduce": 5,
    "all_to_all_single": 6,
    "all_to_all": 6,
    "send": 7,
    "recv": 8,
    "barrier": 10,
    "gather": 0,
    "scatter": 0,
}

_HEADER = "<2sBBII"
_HELLO = struct.Struct(_HEADER + "IiiQ")
_COMM = struct.Struct(_HEADER + "QII")
_EXIT = struct.Struct(_HEADER + "iq")
_LEN = struct.Struct("<H")
# Fixed-size messages, with their length in front.
_START = struct.Struct("<H2sBBIIQQIQq")
_END = struct.Struct("<H2sBBIIQQq")
_STEP = struct.Struct("<H2sBBIIQqIddd")
# A step with flag 8: the op index follows the three numbers.
_STEP_OP = struct.Struct("<H2sBBIIQqIdddI")
STEP_LOSS, STEP_GRAD_NORM, STEP_TOKENS, STEP_OP_INDEX = 1, 2, 4, 8
# The largest op index the agent accepts (model/src/wire.rs MAX_OP_INDEX).
MAX_OP_INDEX = 1 << 20


def frame(message):
    """A message on the stream: its u16 length, then the message."""
    return _LEN.pack(len(message)) + message


def _text(s, limit):
    b = s.encode("utf-8", "replace")[:limit]
    # Never cut a UTF-8 sequence in half.
    b = b.decode("utf-8", "ignore").encode("utf-8")
    return _LEN.pack(len(b)) + b


def hello(pid, rank, world, local_rank, gpu, pidns, job):
    return frame(_HELLO.pack(b"WT", VERSION, HELLO, pid, rank, world, local_rank, gpu, pidns) + _text(job, 253))


def comm(pid, rank, comm_id, size, comm_rank, name):
    return frame(_COMM.pack(b"WT", VERSION, COMM, pid, rank, comm_id, size, comm_rank) + _text(name, 256))


def start(pid, rank, comm_id, seq, op, nbytes, at_ns):
    return _START.pack(_START.size - 2, b"WT", VERSION, START, pid, rank, comm_id, seq, op, nbytes, at_ns)


def end(pid, rank, comm_id, seq, at_ns):
    return _END.pack(_END.size - 2, b"WT", VERSION, END, pid, rank, comm_id, seq, at_ns)


def step(pid, rank, step_no, at_ns, loss, grad_norm, tokens_per_s, first_nonfinite_op=None):
    """A step message; with ``first_nonfinite_op`` (the input check's op index, at most
    ``MAX_OP_INDEX``) flag 8 and the index after the three numbers. An agent that does
    not know flag 8 ignores both."""
    flags = 0
    if loss is not None:
        flags |= STEP_LOSS
    if grad_norm is not None:
        flags |= STEP_GRAD_NORM
    if tokens_per_s is not None:
        flags |= STEP_TOKENS
    numbers = (
        0.0 if loss is None else loss,
        0.0 if grad_norm is None else grad_norm,
        0.0 if tokens_per_s is None else tokens_per_s,
    )
    if first_nonfinite_op is None:
        return _STEP.pack(_STEP.size - 2, b"WT", VERSION, STEP, pid, rank, step_no, at_ns, flags, *numbers)
    return _STEP_OP.pack(
        _STEP_OP.size - 2,
        b"WT",
        VERSION,
        STEP,
        pid,
        rank,
        step_no,
        at_ns,
        flags | STEP_OP_INDEX,
        *numbers,
        first_nonfinite_op,
    )


def exit_(pid, rank, code, at_ns, message):
    return frame(_EXIT.pack(b"WT", VERSION, EXIT, pid, rank, code, at_ns) + _text(message, 4096))
