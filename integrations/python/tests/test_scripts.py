"""The script checks of this directory, run as agent/tests/torch_job.rs runs them: each
in an interpreter of its own, with the same arguments and environment (gloo on the
loopback, one thread), passing when it exits 0 and prints what the Rust test looks for.

Those that start two gloo ranks are marked ``ranks``; ``-m "not ranks"`` leaves them
out."""

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from conftest import TESTS

# (script, arguments, what its output says when it passed), as torch_job.rs has them.
# check_device_work.py alone runs without torch.
SCRIPTS = [
    pytest.param("check_device_work.py", [], "device work check: passed", id="check_device_work"),
    pytest.param("check_goodbye.py", [], "goodbye check: passed", id="check_goodbye"),
    pytest.param("check_ddp_hook.py", [], "every all-reduce reported", marks=pytest.mark.ranks, id="check_ddp_hook"),
    pytest.param(
        "check_capture.py", ["hooks"], "every operation reported", marks=pytest.mark.ranks, id="check_capture-hooks"
    ),
    pytest.param(
        "check_capture.py", ["methods"], "every operation reported", marks=pytest.mark.ranks, id="check_capture-methods"
    ),
    pytest.param("check_input_nan.py", ["hooks"], "passed", marks=pytest.mark.ranks, id="check_input_nan-hooks"),
    pytest.param("check_input_nan.py", ["methods"], "passed", marks=pytest.mark.ranks, id="check_input_nan-methods"),
]
WITHOUT_TORCH = {"check_device_work.py"}

# Longest a script may take, seconds (they take seconds, tens on a loaded machine).
TIMEOUT_S = 300


@pytest.mark.parametrize("script, args, passed", SCRIPTS)
def test_script(request: pytest.FixtureRequest, tmp_path: Path, script: str, args: List[str], passed: str) -> None:
    if script not in WITHOUT_TORCH:
        request.getfixturevalue("torch_gloo")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    # The scripts set these themselves where they need them.
    for name in ("WARDEN_TORCH_CAPTURE", "WARDEN_TORCH_CHECK_INPUTS", "WARDEN_AGENT_SOCKET", "WARDEN_JOB"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, str(TESTS / script), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert out.returncode == 0, "%s %s exited %d:\n%s" % (script, args, out.returncode, out.stdout)
    assert passed in out.stdout, "%s %s:\n%s" % (script, args, out.stdout)
