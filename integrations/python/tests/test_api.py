"""The public API in a process without a process group (``torch.distributed`` never
initialised): nothing raises, ``init()`` says whether reporting is on, and what is
reported reaches a stand-in agent as the agent decodes it. ``shutdown()`` undoes what
``init()`` patched, so the tests run one after another in this process."""

import logging
import math
import os
import sys
import threading
from typing import Dict, Iterator, List, Tuple

import pytest

import capture_format as cf
import warden_torch
from fake_agent import listen

# What init() reads from the environment.
ENV = (
    "WARDEN_JOB",
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "WARDEN_AGENT_SOCKET",
    "WARDEN_TORCH_CAPTURE",
    "WARDEN_TORCH_CHECK_INPUTS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No reporting and none of init()'s variables before each test; reporting
    stopped after it."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    warden_torch.shutdown()
    assert warden_torch._state is None
    yield
    warden_torch.shutdown()
    assert warden_torch._state is None


def messages(frames: List[bytes]) -> List[Tuple[int, int, Dict]]:
    """The stand-in agent's frames, decoded as the agent decodes them."""
    return [cf.decode(f) for f in frames]


def agent(sock_dir: str) -> Tuple[str, List[bytes], threading.Event]:
    """(socket path, frames received, closed event) of a stand-in agent."""
    return listen(sock_dir, 0)


def test_before_init_every_call_is_a_quiet_no_op() -> None:
    assert warden_torch.capture_mode() is None
    assert warden_torch.checking_inputs() is False
    assert warden_torch.stats() == {"sent": 0, "dropped": 0}
    warden_torch.step(1, loss=1.0, grad_norm=2.0, tokens_per_s=3.0)
    warden_torch.shutdown(1, "never started")
    assert warden_torch._state is None


def test_without_torch_init_says_no_and_does_not_raise(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    # As if torch were not installed: importing torch.distributed fails.
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with caplog.at_level(logging.WARNING, logger="warden_torch"):
        assert warden_torch.init(job="no-torch") is False
    assert warden_torch._state is None
    assert "not reporting" in caplog.text
    warden_torch.step(1, loss=1.0)
    assert warden_torch.stats() == {"sent": 0, "dropped": 0}


@pytest.mark.parametrize("run_id", ["none", "None", " "])
def test_without_a_job_id_init_says_no(torch_gloo, monkeypatch: pytest.MonkeyPatch, caplog, run_id: str) -> None:
    # Plain torchrun's id ("none") names no job, nor does an empty one.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    from torch._C._distributed_c10d import ProcessGroup

    before = dict(vars(ProcessGroup))
    with caplog.at_level(logging.WARNING, logger="warden_torch"):
        assert warden_torch.init() is False
    assert "no job id" in caplog.text
    assert warden_torch.capture_mode() is None
    assert dict(vars(ProcessGroup)) == before


def test_reports_reach_the_agent_without_a_process_group(
    torch_gloo, sock_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("LOCAL_RANK", "2")
    path, frames, closed = agent(sock_dir)
    assert warden_torch.init(job="api", socket_path=path, rank=3, world_size=4) is True
    assert warden_torch.capture_mode() in ("hooks", "methods")
    assert warden_torch.checking_inputs() is False
    warden_torch.step(1, loss=torch.tensor(2.5), grad_norm=0.5)
    warden_torch.step(2)
    warden_torch.step(3, loss=float("nan"), tokens_per_s=torch.tensor([1000.0]))
    # What cannot be a number is left out, not raised.
    warden_torch.step(4, loss="not a number", grad_norm=torch.ones(3))  # type: ignore[arg-type]
    assert warden_torch.stats() == {"sent": 5, "dropped": 0}
    warden_torch.shutdown(3, "ValueError: boom")
    assert closed.wait(10)
    assert warden_torch.capture_mode() is None

    got = messages(frames)
    assert {(pid, rank) for pid, rank, _ in got} == {(os.getpid(), 3)}
    hello = got[0][2]
    assert hello == {
        "kind": "hello",
        "world": 4,
        "local_rank": 2,
        "gpu": None,
        "pidns": os.stat("/proc/self/ns/pid").st_ino,
        "job": "api",
    }
    steps = [(m["step"], m["loss"], m["grad_norm"], m["tokens_per_s"], m["first_nonfinite_op"]) for _, _, m in got[1:-1]]
    assert steps[0] == (1, 2.5, 0.5, None, None)
    assert steps[1] == (2, None, None, None, None)
    assert steps[2][0] == 3 and math.isnan(steps[2][1]) and steps[2][2:] == (None, 1000.0, None)
    assert steps[3] == (4, None, None, None, None)
    assert len(steps) == 4
    assert [m["at_ns"] for _, _, m in got[1:]] == sorted(m["at_ns"] for _, _, m in got[1:])
    bye = got[-1][2]
    assert (bye["kind"], bye["code"], bye["message"]) == ("exit", 3, "ValueError: boom")


def test_without_an_agent_reports_are_dropped_and_counted(torch_gloo, sock_dir: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="warden_torch"):
        assert warden_torch.init(job="alone", socket_path=os.path.join(sock_dir, "nobody.sock"), rank=0, world_size=1)
    assert "cannot reach the agent" in caplog.text
    for n in range(3):
        warden_torch.step(n, loss=1.0)
    assert warden_torch.stats() == {"sent": 0, "dropped": 3}
    warden_torch.shutdown()
    assert warden_torch.stats() == {"sent": 0, "dropped": 0}


@pytest.mark.parametrize(
    "env, job, want",
    [
        ({"WARDEN_JOB": "w", "SLURM_JOB_ID": "s", "TORCHELASTIC_RUN_ID": "t"}, None, "w"),
        ({"SLURM_JOB_ID": "s", "TORCHELASTIC_RUN_ID": "t"}, None, "s"),
        ({"TORCHELASTIC_RUN_ID": "t"}, None, "t"),
        ({"WARDEN_JOB": " ", "SLURM_JOB_ID": "s"}, None, "s"),
        ({"WARDEN_JOB": "w"}, "given", "given"),
    ],
)
def test_the_job_id_comes_from_the_argument_then_the_environment(
    torch_gloo, sock_dir: str, monkeypatch: pytest.MonkeyPatch, env: Dict[str, str], job, want: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path, frames, closed = agent(sock_dir)
    assert warden_torch.init(job=job, socket_path=path) is True
    warden_torch.shutdown()
    assert closed.wait(10)
    assert messages(frames)[0][2]["job"] == want


def test_the_socket_comes_from_the_environment(torch_gloo, sock_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path, frames, closed = agent(sock_dir)
    monkeypatch.setenv("WARDEN_AGENT_SOCKET", path)
    assert warden_torch.init(job="env-socket") is True
    warden_torch.shutdown()
    assert closed.wait(10)
    assert [m["kind"] for _, _, m in messages(frames)] == ["hello", "exit"]


def test_a_second_init_keeps_the_first(torch_gloo, sock_dir: str) -> None:
    path, frames, closed = agent(sock_dir)
    assert warden_torch.init(job="first", socket_path=path) is True
    assert warden_torch.init(job="second", socket_path=path, check_inputs=True) is True
    assert warden_torch.checking_inputs() is False
    warden_torch.shutdown()
    assert closed.wait(10)
    hellos = [m for _, _, m in messages(frames) if m["kind"] == "hello"]
    assert [h["job"] for h in hellos] == ["first"]


def test_shutdown_twice_and_steps_after_it_are_no_ops(torch_gloo, sock_dir: str) -> None:
    path, frames, closed = agent(sock_dir)
    assert warden_torch.init(job="twice", socket_path=path) is True
    warden_torch.shutdown()
    warden_torch.shutdown(1, "again")
    warden_torch.step(9, loss=1.0)
    assert closed.wait(10)
    assert [m["kind"] for _, _, m in messages(frames)] == ["hello", "exit"]


@pytest.mark.parametrize(
    "env, arg, want",
    [
        (None, None, False),
        ("1", None, True),
        ("yes", None, True),
        ("0", None, False),
        ("1", False, False),
        (None, True, True),
    ],
)
def test_the_input_check_is_off_unless_asked_for(
    torch_gloo, sock_dir: str, monkeypatch: pytest.MonkeyPatch, env, arg, want: bool
) -> None:
    if env is not None:
        monkeypatch.setenv("WARDEN_TORCH_CHECK_INPUTS", env)
    path, frames, closed = agent(sock_dir)
    assert warden_torch.init(job="check", socket_path=path, check_inputs=arg) is True
    assert warden_torch.checking_inputs() is want
    # No operation ran, so no step names one, checked or not.
    warden_torch.step(1, loss=1.0)
    warden_torch.shutdown()
    assert closed.wait(10)
    (step,) = [m for _, _, m in messages(frames) if m["kind"] == "step"]
    assert step["first_nonfinite_op"] is None


def test_method_capture_patches_and_shutdown_restores(torch_gloo, sock_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._C._distributed_c10d import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel as DDP

    monkeypatch.setenv("WARDEN_TORCH_CAPTURE", "methods")
    pg_before = dict(vars(ProcessGroup))
    ddp_before = dict(vars(DDP))
    path, _, closed = agent(sock_dir)
    assert warden_torch.init(job="methods", socket_path=path) is True
    assert warden_torch.capture_mode() == "methods"
    assert getattr(ProcessGroup.allreduce, "_warden_wrapped", False)
    assert getattr(DDP.forward, "_warden_wrapped", False)
    warden_torch.shutdown()
    assert closed.wait(10)
    assert dict(vars(ProcessGroup)) == pg_before
    assert dict(vars(DDP)) == ddp_before


def test_hook_capture_follows_new_groups_until_shutdown(torch_gloo, sock_dir: str) -> None:
    import torch.distributed.distributed_c10d as c10d
    from torch._C._distributed_c10d import ProcessGroup

    if not (hasattr(ProcessGroup, "register_pre_hook") and hasattr(ProcessGroup, "register_post_hook")):
        pytest.skip("this torch has no process-group hooks")
    register = c10d._register_process_group
    path, _, closed = agent(sock_dir)
    assert warden_torch.init(job="hooks", socket_path=path) is True
    assert warden_torch.capture_mode() == "hooks"
    assert getattr(c10d._register_process_group, "_warden_wrapped", False)
    warden_torch.shutdown()
    assert closed.wait(10)
    assert c10d._register_process_group is register
