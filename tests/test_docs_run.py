"""Every documented command runs: the shell and Python blocks of README.md and the
EXAMPLES of every man page, in order, one document at a time, in a fresh directory.

What is run:

- README.md: every ```` ```sh ```` block (one bash process for the document) and every
  ```` ```python ```` block (one interpreter for the document, blocks in order).
- man/*: every ``.EX``/``.EE`` block under ``.SH EXAMPLES``.  A block with ``$ `` prompts
  shows output: the lines after a prompt, up to the next one, are what the command
  prints (stdout and stderr together).  A block without prompts is commands only.

Markers in the documents (hidden from readers):

- README: ``<!-- doc-test: skip REASON -->`` before a block;
  ``<!-- doc-test: setup: COMMAND -->`` (one or more lines of commands) runs before the
  next block, unseen.
- roff: ``.\\" doc-test: skip REASON`` and ``.\\" doc-test: setup: COMMAND`` before ``.EX``;
  ``.\\" doc-test: python`` before a block of Python.
- both: ``doc-test: spark`` before a block that starts Spark: those run in
  ``test_spark_examples_run``, every document's in one Spark JVM (``spark_gateway``).

A line that starts with a crontab schedule (``*/10 * * * *``) runs its command.

Shown output is compared strictly, line by line, except that ``...`` in a line matches
any text there, and a line that is only ``...`` matches any number of lines (offsets
that depend on time, timestamps, pids, random suffixes).  A command whose shown output
starts with ``Error:`` must exit 1 or 2; every other command must exit 0.

The documents' absolute paths are moved under the test's directory by :data:`PATHS`
(and moved back in the output before comparing); commands that never end by themselves
are run under ``timeout`` (:data:`FOREVER`).  The directory holds ``samples/`` (the
repository's), as the README's "run from the top of the repository" asks.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = sorted((REPO / "man").glob("kl*.[157]"))

PATHS = ("/data", "/backup", "/var/kafka-logs", "/var/log", "/tmp/kl", "/mnt")
"""The documents' absolute paths, each run as ``$DOC_TMP`` + the path."""

FOREVER = (r"(?<!\S)(--follow|-f)(?!\S)", r"^tail -F ", r"\bkl\b.* serve\b(?!.*--list)", r"\bkl\b.* metrics\b(?!.*--count)")
"""Commands that wait for more (a follower, ``tail -F``, a daemon in the foreground,
``kl metrics`` without ``--count``):
each runs under ``timeout``, and being stopped by it counts as success."""

FOREVER_SECONDS = 1

SCRIPT_SECONDS = 300
"""How long one document's shell examples may take together."""

TOOLS = ("jq", "xxd", "less", "duckdb", "kcat")
"""Programs the examples use besides kl and coreutils (a document using one that is
missing is skipped, naming it)."""

DAEMON = r"\bserve\b[^|]*&\s*(#.*)?$"
"""A daemon started in the background: the next command waits until it listens, as a
reader typing the next line would (its ``--port`` and ``--kafka`` ports, or 9092)."""


@dataclass
class Command:
    text: str
    where: str
    shown: list[str] | None = None  # the output the document shows, None when it shows none


@dataclass
class Block:
    language: str  # "sh" or "python"
    where: str
    lines: list[str]
    setup: list[str] = field(default_factory=list)
    skip: str | None = None
    spark: bool = False  # starts Spark: run by test_spark_examples_run only


# ------------------------------------------------------------------ extraction


def readme_blocks(text: str) -> list[Block]:
    """README's sh and python fences, with the markers before each."""
    blocks: list[Block] = []
    setup: list[str] = []
    skip: str | None = None
    spark = False
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- doc-test:"):
            marker = [line]
            while not marker[-1].rstrip().endswith("-->"):
                i += 1
                marker.append(lines[i])
            body = "\n".join(marker).removeprefix("<!-- doc-test:").rstrip().removesuffix("-->").strip()
            if body.startswith("skip "):
                skip = body.removeprefix("skip ").strip()
            elif body == "spark":
                spark = True
            elif body.startswith("setup:"):
                setup += [c.strip() for c in body.removeprefix("setup:").splitlines() if c.strip()]
            else:
                raise AssertionError(f"README.md:{i + 1}: unknown doc-test marker {body!r}")
        elif line.startswith("```"):
            language, start, body_lines = line[3:].strip(), i + 1, []
            i += 1
            while not lines[i].startswith("```"):
                body_lines.append(lines[i])
                i += 1
            if language in ("sh", "python"):
                blocks.append(Block(language, f"README.md:{start}", body_lines, setup, skip, spark))
            setup, skip, spark = [], None, False
        i += 1
    return blocks


ROFF = [(r"\-", "-"), (r"\(aq", "'"), (r"\(dq", '"'), (r"\e", "\\"), (r"\&", ""), (r"\(em", "—")]


def unroff(line: str) -> str:
    for escape, char in ROFF:
        line = line.replace(escape, char)
    return line


def man_blocks(page: Path) -> list[Block]:
    """The ``.EX`` blocks of the page's EXAMPLES, with the markers before each."""
    blocks: list[Block] = []
    setup: list[str] = []
    skip: str | None = None
    marks: set[str] = set()
    inside = False
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(".SH"):
            inside = line.strip() == ".SH EXAMPLES"
        elif inside and line.startswith('.\\" doc-test:'):
            body = line.removeprefix('.\\" doc-test:').strip()
            if body.startswith("skip "):
                skip = body.removeprefix("skip ").strip()
            elif body in ("spark", "python"):
                marks.add(body)
            elif body.startswith("setup:"):
                setup.append(body.removeprefix("setup:").strip())
            else:
                raise AssertionError(f"{page.name}:{i + 1}: unknown doc-test marker {body!r}")
        elif inside and line.strip() == ".EX":
            start, body_lines = i + 1, []
            i += 1
            while lines[i].strip() not in (".EE", ".RE"):
                if not lines[i].startswith('.\\"'):
                    body_lines.append(unroff(lines[i]))
                i += 1
            language = "python" if "python" in marks else "sh"
            blocks.append(Block(language, f"{page.name}:{start}", body_lines, setup, skip, "spark" in marks))
            setup, skip, marks = [], None, set()
        i += 1
    return blocks


def commands(block: Block) -> list[Command]:
    """A sh block's commands: with ``$ `` prompts, each with the output shown after it;
    without, every line (``\\`` continuations joined); a quote left open goes on on the
    next line, in both."""
    found: list[Command] = [Command(c, f"{block.where} (setup)") for c in block.setup]
    prompts = any(line.startswith("$ ") for line in block.lines)
    pending = ""
    for n, line in enumerate(block.lines):
        where = f"{block.where.split(':')[0]}:{int(block.where.split(':')[1]) + n + 1}"
        if found and found[-1].shown in ([] if prompts else None,) and not complete(found[-1].text):
            found[-1].text += "\n" + line  # a quoted argument over several lines
            continue
        if prompts and not line.startswith("$ "):
            assert found and found[-1].shown is not None, f"{where}: output before any prompt"
            found[-1].shown.append(line)
            continue
        text = line.removeprefix("$ ") if prompts else line
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        text, pending = re.sub(CRON, "", pending + text), ""
        if text.strip():
            found.append(Command(text, where, [] if prompts else None))
    return found


CRON = r"^([*/0-9,-]+\s+){5}(?=\S)"
"""A crontab schedule at the start of a line: five fields of digits, ``*``, ``/``, ``,``, ``-``."""


def complete(text: str) -> bool:
    """Whether ``text`` is a whole command (no quote left open; an apostrophe in a
    comment opens none)."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ running


def moved(text: str) -> str:
    """``text`` with the documents' absolute paths under ``$DOC_TMP``."""
    for path in PATHS:
        text = re.sub(rf"(?<![\w./$-]){re.escape(path)}(?![\w-])", lambda m: "$DOC_TMP" + m.group(0), text)
    return text


def forever(text: str) -> bool:
    background = re.search(r"&\s*(#.*)?$", text) is not None
    return not background and any(re.search(pattern, text) for pattern in FOREVER)


def script(cmds: list[Command], out: Path) -> str:
    """One bash script running ``cmds`` in order, each one's output and status to files
    in ``out``; it stops at the first unexpected status, and stops its background jobs."""
    parts = [
        "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT",
        "shopt -s expand_aliases; alias ls='ls -C'",  # in columns, as on a terminal
        "wait_for_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }",
    ]
    for n, cmd in enumerate(cmds):
        text = moved(cmd.text)
        if forever(text):
            text = f"timeout -s INT {FOREVER_SECONDS} bash -c {shlex.quote(text)}; s=$?; [ $s = 124 ] || (exit $s)"
        if re.search(DAEMON, text):
            ports = re.findall(r"--(?:port|kafka)[ =](?:\S+:)?(\d+)", text) or ["9092"]
            text += "".join(f"\nwait_for_port {port}" for port in ports)
        fails = bool(cmd.shown) and cmd.shown[0].startswith("Error:")
        check = "[ $s = 1 ] || [ $s = 2 ]" if fails else "[ $s = 0 ]"
        parts.append(
            f"t=$EPOCHREALTIME; {{ {text}\n}} > {out}/{n}.out 2>&1 < /dev/null; s=$?; echo $s > {out}/{n}.rc; "
            f"echo $t $EPOCHREALTIME > {out}/{n}.time; {check} || exit 0"
        )
    return "\n".join(parts) + "\n"


def matches(shown: list[str], actual: list[str]) -> bool:
    """``actual`` lines are those shown, with ``...`` as a wildcard."""
    if not shown:
        return not actual
    head, rest = shown[0], shown[1:]
    if head.strip() == "...":
        return any(matches(rest, actual[k:]) for k in range(len(actual) + 1))
    pattern = ".*?".join(re.escape(part) for part in head.rstrip().split("..."))
    return bool(actual) and re.fullmatch(pattern, actual[0].rstrip()) is not None and matches(rest, actual[1:])


def environment(tmp: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KL_")} | extra
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        HOME=str(tmp / "home"),
        DOC_TMP=str(tmp),
        DOC_DATA=str(REPO / "tests" / "data"),  # tests/data, for setups that need a Kafka 0.7 segment
        PATH=f"{bin_dir}:{env.get('PATH', '')}",
        KL_ROOT=str(tmp / "data" / "kl"),  # the documents' root, moved as PATHS moves it
        LC_ALL="C.UTF-8",
        PYTHONFAULTHANDLER="1",  # a hung one prints its stacks on SIGABRT
        TZ="UTC",
        COLUMNS="200",
    )
    return env


def workdir(tmp: Path) -> Path:
    (tmp / "home").mkdir()
    (tmp / "samples").symlink_to(REPO / "samples")
    return tmp


def run_shell(cmds: list[Command], tmp: Path, env: dict[str, str]) -> None:
    out = tmp / ".doc-test"
    out.mkdir()
    (out / "script.sh").write_text(script(cmds, out))
    bash = subprocess.Popen(
        ["bash", str(out / "script.sh")], cwd=tmp, env=environment(tmp, env), stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        bash.wait(timeout=SCRIPT_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(hung(cmds, out, bash.pid, tmp))
    finally:  # whatever the script left running, gone before the next script binds its ports
        wait_for_death(signal_session(bash.pid, signal.SIGKILL), 20)
        bash.wait()
    assert bash.returncode == 0
    for n, cmd in enumerate(cmds):
        rc_file = out / f"{n}.rc"
        assert rc_file.exists(), f"{cmd.where}: not run (an earlier command failed)"
        output = (out / f"{n}.out").read_text(errors="replace").replace(str(tmp), "")
        shown_output = output if len(output) < 4000 else output[:4000] + "\n[...]"
        rc = int(rc_file.read_text())
        fails = bool(cmd.shown) and cmd.shown[0].startswith("Error:")
        assert (rc in (1, 2)) if fails else rc == 0, f"{cmd.where}: `{cmd.text}` exited {rc}:\n{shown_output}"
        if cmd.shown is not None and not re.search(r"&\s*(#.*)?$", cmd.text):  # a background job's is not its own
            assert matches(cmd.shown, output.splitlines()), (
                f"{cmd.where}: `{cmd.text}` printed:\n{shown_output}\nthe document shows:\n" + "\n".join(cmd.shown)
            )


def signal_session(session: int, signum: int, *, leader: bool = True) -> list[int]:
    """Send ``signum`` to every process of ``session`` (a ``timeout`` runs its command in a
    process group of its own, out of reach of ``killpg``), the session's leader too unless
    told otherwise; their pids."""
    signalled = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            pid, (state, session_of) = int(stat.parent.name), process_state(stat)
            if session_of == session and state != "Z" and (leader or pid != session):
                os.kill(pid, signum)
                signalled.append(pid)
    return signalled


def process_state(stat: Path) -> tuple[str, int]:
    """A process's state letter and session, from its ``/proc/PID/stat`` (OSError once it is gone)."""
    fields = stat.read_text().rpartition(")")[2].split()  # after the command name, which may hold anything
    return fields[0], int(fields[3])


def wait_for_death(pids: list[int], seconds: float) -> None:
    """Wait until none of ``pids`` runs (a zombie has ended), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if process_state(Path(f"/proc/{pid}/stat"))[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)


def hung(cmds: list[Command], out: Path, session: int, tmp: Path) -> str:
    """What to say of a script that ran out of time: the command it was in (or its
    background jobs, that outlived it), with its output and the stacks of the Python
    processes still running (SIGABRT makes them print those: PYTHONFAULTHANDLER).  The
    script (the session's leader) is stopped first: on a fatal signal bash runs its EXIT
    trap, whose SIGTERM would end them before they print, and once they are gone it
    would go on to its next command."""
    running = next((n for n in range(len(cmds)) if not (out / f"{n}.rc").exists()), None)
    os.kill(session, signal.SIGSTOP)
    wait_for_death(signal_session(session, signal.SIGABRT, leader=False), 20)  # each Python has printed its stacks
    if running is None:
        outputs = "".join((out / f"{n}.out").read_text(errors="replace") for n in range(len(cmds)))
        return f"every command ran, but their background jobs did not end on SIGTERM:\n{outputs}".replace(str(tmp), "")
    cmd, output = cmds[running], (out / f"{running}.out").read_text(errors="replace")
    return f"{cmd.where}: `{cmd.text}` ran for {SCRIPT_SECONDS} s; it printed:\n{output[-8000:]}".replace(str(tmp), "")


def run_python(blocks: list[Block], tmp: Path, env: dict[str, str]) -> None:
    program = ["import sys", "ns = {'__name__': '__main__'}"]
    for block in blocks:
        source = moved("\n".join(block.lines)).replace("$DOC_TMP", str(tmp))
        program.append(f"exec(compile({source!r}, {block.where!r}, 'exec'), ns)")
    python = [sys.executable, "-c", "\n".join(program)]
    done = subprocess.run(python, cwd=tmp, env=environment(tmp, env), timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.replace(str(tmp), "")


DOCUMENTS = {"README.md": README, **{page.name: page for page in PAGES}}


def blocks_of(name: str) -> list[Block]:
    path = DOCUMENTS[name]
    return readme_blocks(path.read_text()) if name == "README.md" else man_blocks(path)


def run_document(name: str, blocks: list[Block], tmp: Path, env: dict[str, str] | None = None) -> None:
    """``blocks`` of document ``name`` in order: the shell ones (and every block's setup)
    in one bash, then the Python ones in one interpreter; ``env`` added to the
    environment.  Skips, naming it, when the blocks use a program of :data:`TOOLS` that is
    missing."""
    used = " ".join(line for b in blocks for line in b.lines + b.setup)
    path = environment(tmp, {})["PATH"]
    missing = [tool for tool in TOOLS if re.search(rf"\b{tool}\b", used) and shutil.which(tool, path=path) is None]
    if missing:
        pytest.skip(f"{name}: its examples use {', '.join(missing)}, not installed here")
    sh = [c for b in blocks for c in (commands(b) if b.language == "sh" else commands(Block("sh", b.where, [], b.setup)))]
    python = [b for b in blocks if b.language == "python"]
    tmp = workdir(tmp)
    if sh:
        run_shell(sh, tmp, env or {})
    if python:
        run_python(python, tmp, env or {})


def runnable(name: str) -> list[Block]:
    """The blocks of ``name`` this test runs (not marked skip, nor Spark's)."""
    return [b for b in blocks_of(name) if b.skip is None and not b.spark]


@pytest.mark.parametrize("name", sorted(name for name in DOCUMENTS if runnable(name)))  # (the rest: every skip says why)
def test_every_example_runs_as_documented(name, tmp_path):
    run_document(name, runnable(name), tmp_path)


def sparks(name: str) -> list[Block]:
    """The blocks of ``name`` marked as starting Spark (and not skipped)."""
    return [b for b in blocks_of(name) if b.skip is None and b.spark]


@pytest.mark.spark
@pytest.mark.parametrize("name", sorted(name for name in DOCUMENTS if sparks(name)))
def test_spark_examples_run(name, tmp_path, spark_gateway):
    """The Spark blocks (``kl load`` runs, DataFrame reads), as the others but with every
    document's ``kl load`` and Python in one Spark JVM, as under ``spark-submit``."""
    try:
        run_document(name, sparks(name), tmp_path, spark_gateway.env)
    finally:
        spark_gateway.stop_context()


def test_the_spark_pages_run_their_examples():
    assert {name for name in DOCUMENTS if sparks(name)} == {"README.md", "kl-load.1", "kl-spark.7"}


def test_every_skip_says_why():
    for name in DOCUMENTS:
        for block in blocks_of(name):
            assert block.skip is None or len(block.skip.split()) >= 3, f"{block.where}: skip without a reason"


def test_markers_and_prompts_are_read():
    page = (
        '.SH EXAMPLES\n.\\" doc-test: setup: kl topics create t\n.EX\n$ kl topics list\nt\n'
        "$ kl topics create t\nError: topic \\(aqt\\(aq ...\n.EE\n"
        '.\\" doc-test: skip needs a second host\n.EX\nkl consume t \\-\\-server logs1:9092\n.EE\n'
        '.\\" doc-test: spark\n.EX\n*/10 * * * *  kl load t \\e\n    -o /d\nduckdb -c "SELECT\n    1"\n.EE\n'
        '.\\" doc-test: spark\n.\\" doc-test: python\n.EX\nspark.read.format("kl")\n.EE\n'
    )
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kl-doctest-{os.getpid()}.1"
    path.write_text(page)
    try:
        first, second, cron, python = man_blocks(path)
    finally:
        path.unlink()
    assert [(c.text, c.shown) for c in commands(first)] == [
        ("kl topics create t", None),
        ("kl topics list", ["t"]),
        ("kl topics create t", ["Error: topic 't' ..."]),
    ]
    assert second.skip == "needs a second host" and second.lines == ["kl consume t --server logs1:9092"]
    assert cron.spark and cron.language == "sh" and python.spark and python.language == "python"
    assert [c.text for c in commands(cron)] == ["kl load t      -o /d", 'duckdb -c "SELECT\n    1"']
    commented = Block("sh", "x.md:1", ["kl a   # a message's offset", "kl b -f", "echo 'x # y'"])
    assert [c.text for c in commands(commented)] == ["kl a   # a message's offset", "kl b -f", "echo 'x # y'"]
    assert matches(["a ... c", "..."], ["a b c", "x", "y"]) and not matches(["a"], ["a", "b"])
    assert moved("kl --root /data/kl x /tmp/kl2 ./data/x") == "kl --root $DOC_TMP/data/kl x /tmp/kl2 ./data/x"
    assert forever("kl consume t -f") and not forever("kl consume t -f > x &") and forever("kl --root r serve # x")
    assert forever("kl serve --bind 0.0.0.0 2>> log") and not forever("kl serve --list") and not forever("kl serve & # x")


def test_a_hung_example_is_named_with_what_it_printed_and_its_stacks(tmp_path, monkeypatch):
    """Even one deaf to the Ctrl-C of the ``timeout`` a follower runs under (from its
    start: an ignored signal stays ignored across exec); nothing of it is left running.
    The script gets 8 s: Python must be running when its stacks are asked for, and on a
    loaded machine it can take seconds to start."""
    monkeypatch.setattr(sys.modules[__name__], "SCRIPT_SECONDS", 8)
    deaf = f"import time; time.sleep(60)  # {tmp_path}"
    hangs = Command(f"echo started; trap '' INT; exec {sys.executable} -c {shlex.quote(deaf)} -f", "kl-x.1:7")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_shell([Command("true", "kl-x.1:6"), hangs], workdir(tmp_path), {})
    said = str(failed.value)
    assert said.startswith("kl-x.1:7: `echo started;") and "ran for 8 s; it printed:\nstarted\n" in said
    assert "Fatal Python error: Aborted" in said and "in <module>" in said
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(tmp_path).encode() in cmdline(p)]


def cmdline(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # ended meanwhile
        return b""
