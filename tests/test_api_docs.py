"""kl(3) is what the docstrings give (scripts/api-docs), and names every public name."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_kl_3_is_up_to_date_with_the_docstrings():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "api-docs"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


@pytest.mark.parametrize("module", ["kl", "kl.aio", "kl.serde"])
def test_kl_3_names_every_public_name(module):
    page = (REPO / "man" / "kl.3").read_text().replace("\\-", "-")
    missing = [name for name in importlib.import_module(module).__all__ if f".B {module}.{name}" not in page
               and f".B exception {module}.{name}" not in page]  # fmt: skip
    assert not missing
