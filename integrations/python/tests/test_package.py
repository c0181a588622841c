"""The package itself: its version, single-sourced with pyproject.toml, and its PEP 561
marker, in the source tree and in the wheel pip builds from it."""

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import warden_torch
from conftest import PACKAGE_ROOT, missing

# PEP 440 release versions, with optional pre-, post- and dev-release parts.
VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def test_version_is_a_release_number() -> None:
    assert isinstance(warden_torch.__version__, str)
    assert VERSION.match(warden_torch.__version__), warden_torch.__version__


def test_pyproject_takes_its_version_from_the_package() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    with open(PACKAGE_ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "warden_torch.__version__"}
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["warden_torch"]
    assert project["project"]["optional-dependencies"]["test"]


def test_the_package_is_marked_typed() -> None:
    marker = Path(warden_torch.__file__).parent / "py.typed"
    assert marker.is_file()


def test_the_public_functions_have_type_hints() -> None:
    for name in ("init", "step", "stats", "shutdown", "capture_mode", "checking_inputs"):
        fn = getattr(warden_torch, name)
        hints = fn.__annotations__
        assert "return" in hints, name
        params = fn.__code__.co_varnames[: fn.__code__.co_argcount]
        assert set(params) <= set(hints), "%s: %s without hints" % (name, sorted(set(params) - set(hints)))


def test_the_wheel_carries_the_version_and_py_typed(tmp_path: Path) -> None:
    """pip builds a wheel from a copy of the package (without build isolation: with
    this interpreter's setuptools, no network) whose metadata has ``__version__`` and
    which holds ``py.typed``. torch 2.15 requires setuptools 77 or later, so the
    virtualenv scripts/test makes has it."""
    try:
        import setuptools
    except ImportError:
        missing("setuptools (pip install 'setuptools>=70.1')")
    have = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2])
    # pyproject.toml's build requirement; before 70.1, bdist_wheel is the wheel package's.
    if have < (61, 0) or (have < (70, 1) and importlib.util.find_spec("wheel") is None):
        missing("setuptools 70.1 or later (this is %s)" % setuptools.__version__)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PACKAGE_ROOT / name, src / name)
    shutil.copytree(PACKAGE_ROOT / "warden_torch", src / "warden_torch", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = dist.glob("warden_torch-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = z.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "Version: %s" % warden_torch.__version__ in fields
    assert "Name: warden-torch" in fields
    assert "warden_torch/py.typed" in names
    assert "warden_torch/_wire.py" in names
