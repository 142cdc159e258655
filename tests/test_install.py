"""How kl is installed: the interpreter running the tests imports this checkout's code,
from any working directory, even one holding a directory named ``kl``.

A clone of the repository named ``kl``, seen from its parent directory, is such a
directory: it has no ``__init__.py``, so Python takes it for a namespace package.  Under
pip's default (lenient) editable install, the package is found by an import hook that
runs only after Python's search of ``sys.path`` (the working directory first), and the
namespace package wins.  ``scripts/test`` and ``scripts/demo`` install in strict
editable mode, which puts the package on ``sys.path`` as a directory of links.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WHERE = """
import json, kl, kl_cli.main
print(json.dumps({"root": kl.Root.__name__, "kl": kl.__file__, "kl_cli": kl_cli.main.__file__}))
"""


def run_python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_directory_named_kl_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    clone = tmp_path / "kl"  # e.g. ``git clone ... kl``, then work from its parent
    clone.mkdir()
    (clone / "README.md").write_text("# kl\n")
    done = run_python(tmp_path, "-c", WHERE)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["root"] == "Root"
    done = run_python(tmp_path, "-m", "kl_cli", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: ")


def test_the_installed_package_is_the_code_of_this_checkout(tmp_path):
    """Tests run in subprocesses (the CLI, kill -9 producers) test these files, not a copy."""
    done = run_python(tmp_path, "-c", WHERE)
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)
    assert Path(where["kl"]).resolve() == REPO / "kl" / "__init__.py"
    assert Path(where["kl_cli"]).resolve() == REPO / "cli" / "main.py"
