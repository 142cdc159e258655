"""What README.md and the man pages say is true: their JSON parses as rendered, their
examples do what they say, file names are the ones kl makes, and the pages are where
``man kl`` and ``kl help`` find them after an install.

Pages are read as a reader sees them: rendered to text by ``kl help``'s own renderer, and
by ``man`` too where it is installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import kl
from kl_cli import manual
from kl_cli.main import cli

from conftest import flip_byte, segment_files, write

REPO = Path(__file__).resolve().parent.parent
MAN = REPO / "man"
PAGES = sorted(MAN.glob("kl*.[157]"))
HAVE_MAN = shutil.which("man") is not None


def man_text(page: Path) -> str:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "MANWIDTH": "80", "MAN_KEEP_FORMATTING": ""}
    done = subprocess.run(["man", "-l", str(page)], env=env, capture_output=True, check=True)
    return re.sub(r".\x08", "", done.stdout.decode())


def renderings(page: Path) -> list[str]:
    """``page`` as text: kl's renderer, and man's where man is installed."""
    texts = [manual.render(page.read_text())]
    return texts + [man_text(page)] if HAVE_MAN else texts


def one_line(text: str) -> str:
    """Rendered text with its lines joined (a value broken across lines made whole)."""
    return re.sub(r"\s*\n\s*", " ", text)


def examples(page: Path) -> list[str]:
    """The lines of the page's EXAMPLES, as rendered, continuation lines joined."""
    text = manual.render(page.read_text()).split("\nEXAMPLES\n", 1)[1].split("\nSEE ALSO\n", 1)[0]
    return re.sub(r"\\\n\s*", " ", text).splitlines()


def run_kl(*args: str, input: bytes | None = None):
    return CliRunner().invoke(cli, list(args), input=input, env={"KL_ROOT": None}, catch_exceptions=False)


# ------------------------------------------------------------------ kl-spark(7)


@pytest.mark.parametrize("rendering", ["kl", "man"])
def test_every_json_object_in_the_spark_page_parses_as_rendered(rendering):
    if rendering == "man" and not HAVE_MAN:
        pytest.skip("man is not installed")
    page = MAN / "kl-spark.7"
    text = one_line(manual.render(page.read_text()) if rendering == "kl" else man_text(page))
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find('{"', at)) >= 0:
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            raise AssertionError(f"not JSON as rendered: {text[at:at + 60]!r}: {e}") from None
        found.append(value)
    assert {"events": {"0": 23, "1": -2}} in found
    assert len(found) >= 4


def test_the_spark_slice_example_reads_only_the_slice_of_one_partition(root):
    pytest.importorskip("pyspark")
    from kl.spark.options import Options
    from kl.spark.ranges import Range

    lines = examples(MAN / "kl-spark.7")
    example = "".join(line.strip() for line in lines if line.lstrip().startswith((".option", "spark.read")))
    options = {k: a or b for k, a, b in re.findall(r"""\.option\("(\w+)", (?:"([^"]*)"|'([^']*)')\)""", example)}
    assert set(options) == {"root", "topics", "startingOffsets", "endingOffsets"}
    root.create_topic("events", kl.TopicConfig(partitions=2))
    size = write(root, "events", [b""], partition=1)[0].next_offset  # a message's overhead
    value = b"v" * (256 - size)  # 256-byte messages: 4096 and 65536 start one
    write(root, "events", [value] * 300, partition=0)
    write(root, "events", [value] * 10, partition=1)
    planned = Options.parse({**options, "root": str(root.path)}).plan()
    assert [r for r in planned if r.start < r.end] == [Range("events", 0, 4096, 65536)]


# ------------------------------------------------------------------ kl-load(1)


def test_the_load_examples_run_in_order_ask_each_output_for_one_set_of_settings():
    runs = {}
    load = cli.get_command(click.Context(cli), "load")
    assert load is not None
    for line in examples(MAN / "kl-load.1"):
        if "kl load " not in line:
            continue
        args = shlex.split(line.split("kl load ", 1)[1])
        params = load.make_context("load", args, resilient_parsing=True).params
        if params["output"] is None:
            continue
        settings = (params["granularity"], params["value_format"], params["schema"])
        runs.setdefault(params["output"], set()).add(settings)
    assert len(runs) >= 2
    assert all(len(settings) == 1 for settings in runs.values()), runs


# ------------------------------------------------------------------ damaged copies


def test_damaged_copy_names_in_the_docs_are_the_names_kl_recover_gives(root, topic):
    write(root, topic, [b"a" * 100, b"b" * 100, b"c" * 100])
    root.close()
    segment = segment_files(root, topic)[0]
    flip_byte(segment, 150)  # in the second message
    result = run_kl("--root", str(root.path), "recover", "--deep", "--repair")
    assert result.exit_code == 0, result.output
    copies = [p.name for p in segment.parent.iterdir() if ".damaged-" in p.name]
    real = r"\d{8}T\d{6}-[0-9a-f]{6}"
    assert len(copies) == 1 and re.fullmatch(rf"\d{{20}}\.kl\.damaged-{real}", copies[0]), copies
    texts = [manual.render(p.read_text()) for p in PAGES] + [(REPO / "README.md").read_text()]
    for text in texts:
        for match in re.finditer(r"\.damaged-(\S*)", text):
            suffix = match.group(1).strip("`.,;:)'")
            assert suffix == "" or re.fullmatch(rf"((YYYYMMDDTHHMMSS|TIMESTAMP)-XXXXXX|{real})(\.tmp)?", suffix), match.group(0)


# ------------------------------------------------------------------ kl topics import


@pytest.fixture
def source_dirs(root) -> list[str]:
    """Two partition directories of segment files, two messages each."""
    root.create_topic("src", kl.TopicConfig(partitions=2))
    for partition in (0, 1):
        write(root, "src", [b"x", b"y"], partition=partition)
    root.close()
    return [str(Path(root.path) / "src" / str(p)) for p in (0, 1)]


def test_import_with_more_partitions_than_dirs_leaves_the_others_empty(root, source_dirs):
    result = run_kl("--root", str(root.path), "topics", "import", "t", source_dirs[0], "--partitions", "3")
    assert result.exit_code == 0, result.output
    info = kl.Root(root.path).describe("t")
    assert [p.log_end_offset > 0 for p in info.partitions] == [True, False, False]


def test_import_with_fewer_partitions_than_dirs_is_a_usage_error(root, source_dirs):
    result = run_kl("--root", str(root.path), "topics", "import", "t", *source_dirs, "--partitions", "1")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--partitions': 1 partition cannot hold 2 DIRs (one partition each)"
    )
    assert "t" not in kl.Root(root.path).topics()


def test_import_help_and_page_say_what_partitions_does():
    help_text = " ".join(run_kl("topics", "import", "--help").stdout.split())
    assert "one partition per DIR, or --partitions N" in help_text
    page = one_line(manual.render((MAN / "kl-topics.1").read_text()))
    assert "one partition per DIR (or --partitions N partitions, those past the DIRs empty" in page


# ------------------------------------------------------------------ error texts


QUOTED_POSSESSIVE = re.compile(r"""!r\}'s\b|'\{[^}'"]*\}'s\b|''s\b""")


def test_no_message_puts_a_possessive_after_a_quoted_name():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "kl").rglob("*.py")) + sorted((REPO / "cli").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if QUOTED_POSSESSIVE.search(line)
    ]
    assert not found, found


def test_a_message_too_large_is_named_without_a_doubled_quote(tmp_path):
    path = str(tmp_path / "root")
    run_kl("--root", path, "topics", "create", "events", "--max-message-bytes", "100")
    result = run_kl("--root", path, "produce", "events", input=b"x" * 200 + b"\n")
    assert result.exit_code == 1
    line = result.stderr.splitlines()[-1]
    assert "max_message_bytes 100 of topic 'events'" in line and "''" not in line, line


# ------------------------------------------------------------------ kl produce is quiet in pipes


def test_produce_prints_nothing_in_a_pipe_and_its_page_says_so(tmp_path):
    path = str(tmp_path / "root")
    run_kl("--root", path, "topics", "create", "t")
    done = subprocess.run([sys.executable, "-m", "kl_cli", "--root", path, "produce", "t"], input=b"a\nb\n",
                          capture_output=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    page = one_line(manual.render((MAN / "kl-produce.1").read_text()))
    assert "only when standard error is a terminal. Otherwise (a pipe, a file, a script, cron) kl produce prints nothing" in page


# ------------------------------------------------------------------ README


def test_readme_names_as_missing_only_what_is_missing():
    readme = (REPO / "README.md").read_text()
    missing = one_line(readme.split("**Not there yet:**", 1)[1].split("\n- ", 1)[0])
    for exists in ("consumer groups, the TCP daemon", "mirroring", "Spark loads"):
        assert exists not in missing
    assert {"groups", "serve", "mirror", "load"} <= set(cli.list_commands(click.Context(cli)))


def test_readme_says_how_to_reach_kl_after_the_demo():
    readme = one_line((REPO / "README.md").read_text())
    assert "run `.venv/bin/kl`, or `source .venv/bin/activate`" in readme
    assert "Every command takes `--root DIR` (before or after the command" in readme


# ------------------------------------------------------------------ kl help


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_page_renders_to_plain_text_without_roff(page):
    text = manual.render(page.read_text())
    assert text.startswith(page.name.split(".")[0].upper() + "(")
    assert "\nNAME\n" in text
    left = [line for line in text.splitlines() if re.search(r"^\.|\\f[BIRP]|\\\([a-z<>=]{2}|\\[-&%e]", line)]
    assert not left, left  # (an example's own backslashes, "\\(.topic)" for jq, are not roff)


TOPICS_NAME = re.search(r"^\.SH NAME\n(.*)$", (REPO / "man" / "kl-topics.1").read_text(), re.M)[1].replace("\\", "")
"""kl-topics(1)'s NAME line as man and ``kl help`` show it ("kl-topics - create, ...")."""


def test_help_without_man_shows_the_page_as_plain_text(monkeypatch):
    monkeypatch.setattr(manual.shutil, "which", lambda name: None)
    result = run_kl("help", "topics")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("KL-TOPICS(1)\n")
    assert TOPICS_NAME in result.stdout
    assert run_kl("help", "spark.7").stdout.startswith("KL-SPARK(7)\n")
    assert run_kl("help", "kl-format").stdout.startswith("KL-FORMAT(5)\n")
    assert run_kl("help").stdout.startswith("KL(1)\n")


def test_help_for_an_unknown_topic_is_a_usage_error_naming_the_topics():
    result = run_kl("help", "nonsense")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].startswith("Error: no page for 'nonsense' (there are: acls, consume, dump, format,")


@pytest.mark.skipif(not HAVE_MAN, reason="man is not installed")
def test_help_with_man_shows_the_page_through_man(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kl_cli", "help", "topics"], capture_output=True, timeout=60,
                          env={**os.environ, "MANWIDTH": "80"})
    assert done.returncode == 0, done.stderr
    assert TOPICS_NAME.encode() in done.stdout


# ------------------------------------------------------------------ installs


def venv_with_kl(tmp_path: Path) -> Path:
    """A venv (seeing this one's packages) with kl installed from a copy of the checkout,
    not in editable mode."""
    src = tmp_path / "src"
    for name in ("kl", "cli", "man"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyspark_kl.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    (site,) = venv.glob("lib/python*/site-packages")  # this venv's packages after the new venv's own
    paths = dict.fromkeys(sysconfig.get_path(name) for name in ("purelib", "platlib"))
    (site / "this-venv.pth").write_text("".join(f"{path}\n" for path in paths))
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(src)],
        capture_output=True, text=True, timeout=300,
    )
    if installed.returncode != 0:
        pytest.skip(f"pip install could not run here: {installed.stderr.strip().splitlines()[-1:]}")
    return venv


def test_pip_install_puts_the_pages_where_man_and_kl_help_find_them(tmp_path):
    venv = venv_with_kl(tmp_path)
    for page in PAGES:
        installed = venv / "share" / "man" / f"man{page.suffix[1:]}" / page.name
        assert installed.read_bytes() == page.read_bytes(), installed
    if HAVE_MAN:  # man looks in ../share/man next to each directory of PATH
        env = {key: value for key, value in os.environ.items() if key != "MANPATH"}
        for name, section in (("kl", "man1/kl.1"), ("kl-topics", "man1/kl-topics.1"), ("kl-spark", "man7/kl-spark.7")):
            done = subprocess.run(["man", "-w", name], env={**env, "PATH": f"{venv / 'bin'}:/usr/bin:/bin"},
                                  capture_output=True, text=True, timeout=60)
            assert done.stdout.strip() == str(venv / "share" / "man" / section), done.stderr
    code = "import kl_cli.manual as m, sys; print(m.__file__); sys.argv[1:] = ['help', 'topics']; "
    code += "import kl_cli.main; kl_cli.main.main()"
    done = subprocess.run([venv / "bin" / "python", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATH": str(venv / "bin")}, timeout=60)  # no man on PATH
    assert done.returncode == 0, done.stderr
    where, text = done.stdout.split("\n", 1)
    assert Path(where).is_relative_to(venv)
    assert text.startswith("KL-TOPICS(1)\n")
    (unit,) = venv.glob("lib/python*/site-packages/kl_cli/data/kl-serve.service")  # what kl serve --print-unit prints
    assert unit.read_bytes() == (REPO / "cli" / "data" / "kl-serve.service").read_bytes()


def test_the_demo_says_how_to_reach_kl_and_man_finds_its_pages(tmp_path):
    """``bash scripts/demo`` in a copy of the checkout (its .venv made beforehand, seeing
    this venv's packages, so that the install fetches nothing but the build backend)."""
    clone = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files", "-z", "--", ":!tests"], cwd=REPO, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", clone / ".venv"], check=True, timeout=120)
    done = subprocess.run(["bash", "scripts/demo"], cwd=clone, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable})
    unreachable = ("Could not find a version", "No matching distribution", "Failed to establish", "name resolution")
    if done.returncode != 0 and any(reason in done.stderr for reason in unreachable):  # no package index here
        pytest.skip(f"the demo's pip install could not reach the package index: {done.stderr.strip().splitlines()[-1:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == [
        f"kl is {clone}/.venv/bin/kl: run it by that path, or put it on PATH in this shell",
        f"with 'source .venv/bin/activate' (or PATH=\"{clone}/.venv/bin:$PATH\"); then 'kl --help', 'man kl'.",
    ]
    assert (clone / ".venv/share/man/man1/kl.1").resolve() == clone / "man" / "kl.1"
    if HAVE_MAN:
        env = {key: value for key, value in os.environ.items() if key != "MANPATH"}
        done = subprocess.run(["man", "-w", "kl-topics"], env={**env, "PATH": f"{clone / '.venv/bin'}:/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=60)
        assert Path(done.stdout.strip()).resolve() == clone / "man" / "kl-topics.1", done.stderr


def test_the_streaming_examples_say_where_a_new_query_starts():
    """A new stream starts at latest: an availableNow example without startingOffsets
    reads nothing of the data already there on its first run."""
    page = (REPO / "man" / "kl-spark.7").read_text()
    examples = re.findall(r"\(spark\.readStream.*?\n\.fi", page, re.S)
    assert examples and all('"startingOffsets"' in example for example in examples)
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "a new query starts at `latest`" in readme and "unless `startingOffsets` is `earliest`" in readme
