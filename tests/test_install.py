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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


LENIENT_READ = """
import kl, kl.spark.session
root = kl.Root({root!r})
root.create_topic("t")
kl.Producer(root).send_batch("t", [b"a", b"b", b"c"], partition=0)
spark = kl.spark.session.session("local[1]", conf={{"spark.ui.enabled": "false"}})
print(spark.read.format("kl").option("root", {root!r}).option("topics", "t").load().count())
"""


@pytest.mark.spark
def test_after_a_lenient_editable_install_the_session_has_the_kl_source(tmp_path):
    """pip's default editable install provides ``pyspark_kl`` through an import hook,
    which pyspark's search of ``sys.path`` does not see: ``session()`` registers it then."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java, and no java is on PATH")
    src = tmp_path / "src"
    for name in ("kl", "cli"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyspark_kl.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "-e", str(src)],
        capture_output=True, text=True, timeout=300,
    )
    if installed.returncode != 0:
        pytest.skip(f"pip install -e could not run here: {installed.stderr.strip().splitlines()[-1:]}")
    assert (Path(site) / "__editable___kl_0_1_0_finder.py").exists()  # the lenient mode's import hook
    outer = [p for p in sys.path if Path(p).is_dir() and not any((Path(p) / name).exists() for name in ("kl", "pyspark_kl.py"))]
    Path(site, "outer.pth").write_text("\n".join(outer) + "\n")  # pyspark and the rest, not this checkout's kl
    done = subprocess.run([python, "-c", LENIENT_READ.format(root=str(tmp_path / "root"))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "3"
