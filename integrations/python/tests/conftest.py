"""What the tests share: ``warden_torch`` from this checkout, and the rule for torch.

The package under test is the one next to this directory, ahead of any installed copy.
Tests that need torch with gloo ask for the ``torch_gloo`` fixture: without it they are
skipped, except under CI (``CI`` set), where a missing torch fails them, as it fails the
Rust tests that run the same scripts (agent/tests/torch_job.rs).
"""

import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = TESTS.parent
# The repository holding this package (the Rust sources the format comes from), when
# the tests run from a checkout of it.
REPO = PACKAGE_ROOT.parent.parent

sys.path.insert(0, str(PACKAGE_ROOT))
sys.path.insert(0, str(TESTS))

import warden_torch  # noqa: E402

if Path(warden_torch.__file__).resolve().parent != PACKAGE_ROOT / "warden_torch":
    raise RuntimeError("warden_torch was imported from %s, not from %s" % (warden_torch.__file__, PACKAGE_ROOT))


def missing(what: str) -> None:
    """Skip the calling test for want of ``what``; under CI, fail it."""
    if "CI" in os.environ:
        pytest.fail("%s is missing (CI is set, so this is a failure)" % what)
    pytest.skip("%s is missing" % what)


_gloo: Optional[bool] = None


@pytest.fixture
def torch_gloo() -> None:
    """torch with gloo in this interpreter, or the test is skipped (failed under CI)."""
    global _gloo
    if _gloo is None:
        try:
            import torch.distributed as dist

            _gloo = bool(dist.is_available() and dist.is_gloo_available())
        except ImportError:
            _gloo = False
    if not _gloo:
        missing("torch with gloo (pip install torch)")


@pytest.fixture
def sock_dir() -> Iterator[str]:
    """A fresh directory for Unix sockets; short, unlike pytest's ``tmp_path``, since a
    socket's path may not exceed 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="wt-") as d:
        yield d
