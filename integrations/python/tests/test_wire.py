"""The capture messages ``warden_torch._wire`` writes, against the format the agent reads.

Exact bytes for one message of each kind, written out by hand from docs/CAPTURE.md; the
same messages and edge values built by ``capture_format`` (after the helpers of
agent/src/capture.rs's tests) and decoded as the agent decodes them; every proper prefix
refused; texts cut to the agent's limits on a UTF-8 boundary; and the constants and op
numbers read from the Rust sources when the tests run in the repository. No torch needed.
"""

import math
import re
from typing import Dict, List

import pytest

import capture_format as cf
from conftest import REPO
from fake_agent import take_frames
from warden_torch import _comm_id, _HOOK_OPS, _METHOD_OPS, _wire

PID, RANK = 42, 3

# One frame of each kind, byte for byte: length, b"WT", version 1, kind, pid 42, rank 3,
# body (docs/CAPTURE.md, "Protocol").
EXACT = {
    "hello": (
        lambda: _wire.hello(PID, RANK, 8, 1, -1, 0x1122334455667788, "job-1"),
        "2700" "5754" "01" "01" "2a000000" "03000000"
        "08000000" "01000000" "ffffffff" "8877665544332211" "0500" "6a6f622d31",
    ),
    "comm": (
        lambda: _wire.comm(PID, RANK, 0x0102030405060708, 2, 1, "pg:0"),
        "2200" "5754" "01" "02" "2a000000" "03000000"
        "0807060504030201" "02000000" "01000000" "0400" "70673a30",
    ),
    "start": (
        lambda: _wire.start(PID, RANK, 9, 7, 1, 4096, 5),
        "3000" "5754" "01" "03" "2a000000" "03000000"
        "0900000000000000" "0700000000000000" "01000000" "0010000000000000" "0500000000000000",
    ),
    "end": (
        lambda: _wire.end(PID, RANK, 9, 7, -1),
        "2400" "5754" "01" "04" "2a000000" "03000000"
        "0900000000000000" "0700000000000000" "ffffffffffffffff",
    ),
    "step": (
        lambda: _wire.step(PID, RANK, 7, 5, 2.0, None, None),
        "3800" "5754" "01" "05" "2a000000" "03000000"
        "0700000000000000" "0500000000000000" "01000000"
        "0000000000000040" "0000000000000000" "0000000000000000",
    ),
    "step with op index": (
        lambda: _wire.step(PID, RANK, 7, 5, 2.0, None, None, 12),
        "3c00" "5754" "01" "05" "2a000000" "03000000"
        "0700000000000000" "0500000000000000" "09000000"
        "0000000000000040" "0000000000000000" "0000000000000000" "0c000000",
    ),
    "exit": (
        lambda: _wire.exit_(PID, RANK, 1, 5, "boom"),
        "1e00" "5754" "01" "06" "2a000000" "03000000" "01000000" "0500000000000000" "0400" "626f6f6d",
    ),
}


@pytest.mark.parametrize("name", list(EXACT))
def test_each_kind_has_the_documented_bytes(name: str) -> None:
    build, hexed = EXACT[name]
    assert build().hex() == hexed


# The same shapes with edge values, against capture_format's builder and decoder.
CASES = {
    "hello": (
        lambda: _wire.hello(0xFFFFFFFF, cf.MAX_RANK - 1, cf.MAX_RANK, -1, 7, 0, "j"),
        cf.header(cf.HELLO, 0xFFFFFFFF, cf.MAX_RANK - 1)
        + cf.u32(cf.MAX_RANK) + cf.i32(-1) + cf.i32(7) + cf.u64(0) + cf.text("j"),
        {"kind": "hello", "world": cf.MAX_RANK, "local_rank": None, "gpu": 7, "pidns": 0, "job": "j"},
    ),
    "comm": (
        lambda: _wire.comm(1, 0, 2**64 - 1, 2, 0, "pg:0:p2p:0>1"),
        cf.header(cf.COMM, 1, 0) + cf.u64(2**64 - 1) + cf.u32(2) + cf.u32(0) + cf.text("pg:0:p2p:0>1"),
        {"kind": "comm", "comm": 2**64 - 1, "size": 2, "comm_rank": 0, "name": "pg:0:p2p:0>1"},
    ),
    "start": (
        lambda: _wire.start(1, 0, 5, 2**64 - 1, 10, 0, -(2**63)),
        cf.header(cf.START, 1, 0) + cf.u64(5) + cf.u64(2**64 - 1) + cf.u32(10) + cf.u64(0) + cf.i64(-(2**63)),
        {"kind": "start", "comm": 5, "seq": 2**64 - 1, "op": 10, "bytes": 0, "at_ns": -(2**63)},
    ),
    "end": (
        lambda: _wire.end(1, 0, 5, 1, 2**63 - 1),
        cf.header(cf.END, 1, 0) + cf.u64(5) + cf.u64(1) + cf.i64(2**63 - 1),
        {"kind": "end", "comm": 5, "seq": 1, "at_ns": 2**63 - 1},
    ),
    "step": (
        lambda: _wire.step(1, 0, 0, 1_700_000_000_000_000_000, 0.25, 3.5, 1e6, cf.MAX_OP_INDEX),
        cf.header(cf.STEP, 1, 0) + cf.u64(0) + cf.i64(1_700_000_000_000_000_000) + cf.u32(1 | 2 | 4 | 8)
        + cf.f64(0.25) + cf.f64(3.5) + cf.f64(1e6) + cf.u32(cf.MAX_OP_INDEX),
        {
            "kind": "step",
            "step": 0,
            "at_ns": 1_700_000_000_000_000_000,
            "loss": 0.25,
            "grad_norm": 3.5,
            "tokens_per_s": 1e6,
            "first_nonfinite_op": cf.MAX_OP_INDEX,
        },
    ),
    "exit": (
        lambda: _wire.exit_(1, 0, -9, 0, ""),
        cf.header(cf.EXIT, 1, 0) + cf.i32(-9) + cf.i64(0) + cf.text(""),
        {"kind": "exit", "code": -9, "at_ns": 0, "message": ""},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_matches_the_reference_and_decodes_as_the_agent_reads_it(name: str) -> None:
    build, message, want = CASES[name]
    got = build()
    assert got == cf.frame(message)
    (body,) = cf.unframe(got)
    pid, rank, decoded = cf.decode(body)
    assert (pid, rank) == (int.from_bytes(message[4:8], "little"), int.from_bytes(message[8:12], "little"))
    assert decoded == want


@pytest.mark.parametrize("name", list(CASES))
def test_every_proper_prefix_is_refused(name: str) -> None:
    body = cf.unframe(CASES[name][0]())[0]
    for n in range(len(body)):
        with pytest.raises(cf.DecodeError):
            cf.decode(body[:n])


@pytest.mark.parametrize(
    "loss, grad_norm, tokens_per_s, flags",
    [
        (None, None, None, 0),
        (1.5, None, None, 1),
        (None, 2.5, None, 2),
        (None, None, 3.5, 4),
        (1.5, 2.5, 3.5, 7),
        (0.0, 0.0, 0.0, 7),
    ],
)
def test_a_step_says_which_numbers_it_carries(loss, grad_norm, tokens_per_s, flags) -> None:
    body = cf.unframe(_wire.step(PID, RANK, 11, 5, loss, grad_norm, tokens_per_s))[0]
    assert int.from_bytes(body[28:32], "little") == flags
    assert len(body) == cf.HEADER_LEN + 8 + 8 + 4 + 3 * 8
    _, _, msg = cf.decode(body)
    assert (msg["loss"], msg["grad_norm"], msg["tokens_per_s"]) == (loss, grad_norm, tokens_per_s)
    assert msg["first_nonfinite_op"] is None


@pytest.mark.parametrize("op_index", [0, 1, 5, cf.MAX_OP_INDEX])
def test_an_op_index_rides_behind_flag_8(op_index: int) -> None:
    body = cf.unframe(_wire.step(PID, RANK, 3, 5, 1.0, None, None, op_index))[0]
    assert len(body) == cf.HEADER_LEN + 8 + 8 + 4 + 3 * 8 + 4
    _, _, msg = cf.decode(body)
    assert msg["first_nonfinite_op"] == op_index
    assert msg["loss"] == 1.0 and msg["grad_norm"] is None


def test_non_finite_numbers_go_through_as_they_are() -> None:
    _, _, msg = cf.decode(cf.unframe(_wire.step(PID, RANK, 3, 5, math.nan, math.inf, -math.inf))[0])
    assert math.isnan(msg["loss"])
    assert msg["grad_norm"] == math.inf and msg["tokens_per_s"] == -math.inf


@pytest.mark.parametrize(
    "build, limit",
    [
        (lambda s: _wire.hello(PID, RANK, 1, 0, -1, 0, s), cf.MAX_JOB_LEN),
        (lambda s: _wire.comm(PID, RANK, 1, 1, 0, s), cf.MAX_NAME_LEN),
        (lambda s: _wire.exit_(PID, RANK, 1, 0, s), cf.MAX_MESSAGE_LEN),
    ],
    ids=["job", "comm name", "exit message"],
)
def test_texts_are_cut_to_the_agents_limit_on_a_character_boundary(build, limit: int) -> None:
    field = {cf.MAX_JOB_LEN: "job", cf.MAX_NAME_LEN: "name", cf.MAX_MESSAGE_LEN: "message"}[limit]
    for s, want in [
        ("x" * limit, "x" * limit),
        ("x" * (limit + 1), "x" * limit),
        # Two-byte characters: the last whole one that fits.
        ("é" * limit, "é" * (limit // 2)),
        # A three-byte character straddling the limit is left out whole.
        ("x" * (limit - 1) + "€", "x" * (limit - 1)),
        # What UTF-8 cannot hold (a lone surrogate) becomes "?".
        ("a\ud800b", "a?b"),
    ]:
        _, _, msg = cf.decode(cf.unframe(build(s))[0])
        assert msg[field] == want


def test_frames_split_back_out_of_a_stream_in_any_chunks() -> None:
    messages = [build() for build, _ in EXACT.values()]
    stream = b"".join(messages)
    for chunk in (1, 2, 3, 7, len(stream)):
        frames: List[bytes] = []
        rest = b""
        for at in range(0, len(stream), chunk):
            rest = take_frames(rest + stream[at : at + chunk], frames)
        assert rest == b""
        assert [cf.frame(f) for f in frames] == messages


def test_communicator_ids_are_fnv1a_64_and_the_same_in_every_process() -> None:
    # The published FNV-1a 64-bit test vectors: no per-process salt (as hash() has).
    assert _comm_id("") == 0xCBF29CE484222325
    assert _comm_id("a") == 0xAF63DC4C8601EC8C
    assert _comm_id("foobar") == 0x85944171F73967E8
    assert _comm_id("pg:0") != _comm_id("pg:0:p2p:0>1")


# The Rust side: the constants and op numbers of the format, where this package sits in
# the repository that defines them.
CAPTURE_RS = REPO / "agent" / "src" / "capture.rs"
WIRE_RS = REPO / "model" / "src" / "wire.rs"


def rust_source(path) -> str:
    if not path.is_file():
        pytest.skip("%s is not here (the package is not in its repository)" % path)
    return path.read_text()


def rust_coll_ops() -> Dict[str, int]:
    """The wire ``CollOp`` values of model/src/wire.rs, by variant name."""
    src = rust_source(WIRE_RS)
    block = re.search(r"\bCollOp\s*\{(.*?)\n\s*\}", src, re.S)
    assert block, "no CollOp in %s" % WIRE_RS
    ops = {name: int(v) for name, v in re.findall(r"(\w+)\s*=\s*(\d+)\s*=>", block.group(1))}
    assert ops, "no CollOp values in %s" % WIRE_RS
    return ops


def test_op_numbers_are_the_agents_coll_op() -> None:
    rust = rust_coll_ops()
    want = {
        "all_reduce": "AllReduce",
        "all_gather": "AllGather",
        "all_gather_into_tensor": "AllGather",
        "reduce_scatter": "ReduceScatter",
        "reduce_scatter_tensor": "ReduceScatter",
        "broadcast": "Broadcast",
        "reduce": "Reduce",
        "all_to_all_single": "AllToAll",
        "all_to_all": "AllToAll",
        "send": "Send",
        "recv": "Recv",
        "barrier": "Barrier",
        "gather": "Unknown",
        "scatter": "Unknown",
    }
    assert {name: rust[variant] for name, variant in want.items()} == _wire.OPS
    # What the capture reports comes from these tables: every value a CollOp.
    assert set(_HOOK_OPS.values()) <= set(rust.values())
    assert set(_METHOD_OPS.values()) <= set(rust.values())
    assert _HOOK_OPS["ALLREDUCE"] == _METHOD_OPS["allreduce"] == rust["AllReduce"]
    assert _HOOK_OPS["SEND"] == _METHOD_OPS["send"] == rust["Send"]
    assert _HOOK_OPS["RECV"] == _METHOD_OPS["recv"] == rust["Recv"]


def test_constants_are_the_agents() -> None:
    capture = rust_source(CAPTURE_RS)
    wire = rust_source(WIRE_RS)

    def const(src: str, name: str) -> str:
        m = re.search(r"const %s: [^=]+= ([^;]+);" % name, src)
        assert m, "no const %s" % name
        return m.group(1).strip()

    assert const(capture, "MAGIC") == 'b"WT"'
    assert int(const(capture, "VERSION")) == _wire.VERSION == cf.VERSION
    assert int(const(capture, "HEADER_LEN")) == cf.HEADER_LEN
    assert int(const(capture, "STEP_OP_INDEX")) == _wire.STEP_OP_INDEX
    assert int(const(capture, "MAX_JOB_LEN")) == cf.MAX_JOB_LEN
    assert const(wire, "MAX_OP_INDEX") == "1 << 20" and _wire.MAX_OP_INDEX == cf.MAX_OP_INDEX == 1 << 20
    assert const(wire, "MAX_WORLD_SIZE") == "1 << 20" and const(wire, "MAX_RANK") == "MAX_WORLD_SIZE"
    # decode(): the number of each kind, the text limits of comm names and exit messages.
    start = capture.index("pub fn decode(")
    body = capture[start : capture.index("\n}\n", start)]
    kinds: Dict[str, int] = {}
    for arm in re.finditer(r"\n\s*(\d+) => ", body):
        variant = re.compile(r"Message::(\w+)").search(body, arm.end())
        assert variant, "no message after %r in decode()" % arm.group(0)
        kinds[variant.group(1)] = int(arm.group(1))
    assert kinds == {"Hello": 1, "Comm": 2, "Start": 3, "End": 4, "Step": 5, "Exit": 6}
    assert (_wire.HELLO, _wire.COMM, _wire.START, _wire.END, _wire.STEP, _wire.EXIT) == (1, 2, 3, 4, 5, 6)
    assert "name: f.text(%d)" % cf.MAX_NAME_LEN in capture
    assert "message: f.text(%d)" % cf.MAX_MESSAGE_LEN in capture
