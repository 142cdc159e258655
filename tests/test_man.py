"""The man pages: they lint clean, and they cannot drift from ``--help``.

Every command has a page (``kl-COMMAND.1``), every subcommand is named in its command's
page, and every long option that ``--help`` shows appears in the page.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kl_cli.common import ROOT_OPTIONS
from kl_cli.main import cli

from conftest import command_paths

MAN = Path(__file__).resolve().parents[1] / "man"
PAGES = sorted(MAN.glob("*.[1-9]"))


def page_of(path: tuple[str, ...]) -> Path:
    return MAN / ("-".join(("kl",) + path[:1]) + ".1")


def long_options(path: tuple[str, ...]) -> set[str]:
    """The long options ``--help`` shows; those every command takes only for the top page, kl(1)."""
    result = CliRunner().invoke(cli, [*path, "--help"], env={"KL_ROOT": None})
    assert result.exit_code == 0, result.output
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", result.stdout.split("Options:", 1)[1]))
    return shown if not path else shown - set(ROOT_OPTIONS)


def plain_text(page: Path) -> str:
    """The page as man renders it, without formatting."""
    env = {**os.environ, "LC_ALL": "C.UTF-8", "MANWIDTH": "2000", "MAN_KEEP_FORMATTING": ""}
    done = subprocess.run(["man", "-l", str(page)], env=env, capture_output=True, check=True)
    return re.sub(r".\x08", "", done.stdout.decode())


def test_there_are_pages():
    assert {p.name for p in PAGES} >= {"kl.1", "kl-topics.1", "kl-produce.1", "kl-consume.1"}


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_lints_clean(page):
    env = {**os.environ, "LC_ALL": "C.UTF-8", "MANROFFSEQ": "", "MANWIDTH": "80"}
    done = subprocess.run(
        ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(page)], env=env, capture_output=True
    )
    assert (done.returncode, done.stderr.decode()) == (0, "")


COMMAND_PAGES = sorted(MAN.glob("*.1"))
REQUIRED_SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"]
SECTION_ORDER = [
    "NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO",
]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=[p.name for p in COMMAND_PAGES])
def test_command_page_sections_in_order(page):
    found = [line[4:].strip('"') for line in page.read_text().splitlines() if line.startswith(".SH ")]
    assert set(REQUIRED_SECTIONS) <= set(found)
    assert [s for s in SECTION_ORDER if s in found] == found, "unknown or misordered sections"


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(("kl",) + p))
def test_every_command_has_a_page_naming_it(path):
    page = page_of(path)
    assert page.exists(), f"no man page for 'kl {' '.join(path)}': expected {page.name}"
    if path:
        assert re.search(rf"\\fB{path[-1]}\\fR|^\.B[A-Z]* .*\b{path[-1]}\b", page.read_text(), re.M)


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(("kl",) + p))
def test_every_long_option_is_documented(path):
    text = plain_text(page_of(path))
    missing = sorted(option for option in long_options(path) if not re.search(rf"{option}(?![\w-])", text))
    assert not missing, f"{page_of(path).name} does not document {', '.join(missing)}"


def test_top_page_lists_every_command():
    text = plain_text(MAN / "kl.1") if shutil.which("man") else (MAN / "kl.1").read_text()
    for (name,) in [path for path in command_paths() if len(path) == 1]:
        assert f"kl-{name}(1)" in text


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_every_option_of_the_spark_source_is_documented():
    from kl.spark.options import KNOWN_OPTIONS

    text = plain_text(MAN / "kl-spark.7")
    options = set(re.findall(r"^ {7}(\w+)", text, re.M))
    assert set(KNOWN_OPTIONS) <= options, sorted(set(KNOWN_OPTIONS) - options)
