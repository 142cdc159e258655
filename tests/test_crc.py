"""CRC-32C's implementations: the pure core's by google-crc32c (any buffer, continued from a
crc), the compiled core's ARMv8 path (kl/log/_crc32c_arm.h, run under qemu-aarch64), and
``kl.log.core.describe()`` naming the one that runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from array import array
from pathlib import Path

import google_crc32c
import pytest

from kl.log import core, pycore

HARNESS = Path(__file__).with_name("crc32c_arm.c")


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, lambda data: array("B", data)])
def test_the_pure_crc32c_takes_any_buffer_and_continues_from_a_crc(kind):
    data = b"123456789"
    assert pycore.crc32c(kind(data)) == 0xE3069283
    assert pycore.crc32c(kind(data[4:]), pycore.crc32c(kind(data[:4]))) == 0xE3069283


@pytest.mark.parametrize("bad", [-1, 1 << 32])
def test_the_pure_crc32c_refuses_a_crc_wider_than_32_bits(bad):
    with pytest.raises(ValueError, match=f"crc must be a 32-bit value, not {bad}"):
        pycore.crc32c(b"x", bad)


def test_describe_names_the_core_and_its_crc32c():
    description = core.describe()
    assert description.core == core.NAME
    if core.NAME == "compiled":
        assert description.crc32c in ("SSE4.2", "ARMv8 CRC", "table")
    else:
        assert description.crc32c == f"google-crc32c ({'C' if google_crc32c.implementation == 'c' else 'python'})"
    assert str(description) == f"{description.why}, crc32c: {description.crc32c}"


@pytest.mark.parametrize("pure", ["1", "0"])
def test_kl_pure_switches_describe_to_the_pure_core(pure):
    program = "from kl.log import core; print(core.describe())"
    env = {**os.environ, "KL_PURE": pure}
    said = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True)
    if pure == "1" or core.compiled() is None:
        assert said.stdout.startswith("pure-Python core (")
        assert said.stdout.endswith(f"crc32c: google-crc32c ({'C' if google_crc32c.implementation == 'c' else 'python'})\n")
    else:
        assert said.stdout == f"compiled core (C), crc32c: {core.compiled().CRC32C}\n"  # type: ignore[union-attr]


def test_the_armv8_crc32c_path_gives_the_check_value_and_the_bitwise_crc(tmp_path):
    for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)")
    program = tmp_path / "crc32c_arm"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O2", "-Wall", "-Werror", "-static", "-o", program, HARNESS], check=True)
    ran = subprocess.run(["qemu-aarch64", program], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "ok\n")
