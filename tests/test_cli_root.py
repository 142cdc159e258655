"""``--root`` and ``--lock-timeout`` before or after the command, at any depth, as kcat
takes ``-b`` anywhere: the value given closest to the command wins, then the one before
it, then ``KL_ROOT`` / ``KL_LOCK_TIMEOUT``.

Every command of the click tree is walked, so a command added later is held to it too.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import kl
from kl_cli.common import root_option
from kl_cli.main import cli

from conftest import command_paths

PATHS = command_paths()


def leaf_context(argv: list[str], env: dict[str, str] | None = None) -> click.Context:
    """The context of the command ``argv`` names, parsed as ``kl`` parses it (arguments
    the command needs may be left out), with ``env`` as the environment."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("KL_ROOT", "KL_LOCK_TIMEOUT"):
            patch.delenv(name, raising=False)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        ctx = cli.make_context("kl", list(argv), resilient_parsing=True)
        while isinstance(ctx.command, click.Group) and (rest := [*getattr(ctx, "_protected_args", ()), *ctx.args]):
            name, command, rest = ctx.command.resolve_command(ctx, rest)
            assert command is not None and name is not None
            ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=True)
    return ctx


def run(*args: str, env: dict[str, str | None] | None = None, input: bytes | None = None) -> Result:
    env = {"KL_ROOT": None, "KL_LOCK_TIMEOUT": None, **(env or {})}
    return CliRunner().invoke(cli, list(args), env=env, input=input, catch_exceptions=False)


def ok(*args: str, env: dict[str, str | None] | None = None, input: bytes | None = None) -> str:
    result = run(*args, env=env, input=input)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout


@pytest.fixture
def roots(tmp_path: Path) -> tuple[str, str]:
    """Two roots: ``a`` holding topic ``in-a``, ``b`` holding topic ``in-b`` (one message)."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    kl.Root(a).create_topic("in-a")
    kl.Root(b).create_topic("in-b")
    with kl.Producer(kl.Root(b)) as producer:
        producer.send("in-b", b"hello")
    return a, b


# ------------------------------------------------------- every command of the tree

@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(("kl",) + p))
def test_every_command_takes_both_options_after_its_name(path):
    ctx = leaf_context([*path, "--root", "/r", "--lock-timeout", "7"])
    assert (root_option(ctx, "root"), root_option(ctx, "lock_timeout")) == ("/r", 7.0)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(("kl",) + p))
def test_every_command_shows_both_options_in_its_help(path):
    text = ok(*path, "--root", "/r", "--lock-timeout", "7", "--help")
    assert "--root DIR" in text and "--lock-timeout SECONDS" in text


@pytest.mark.parametrize("path", [p for p in PATHS if p], ids=lambda p: " ".join(("kl",) + p))
def test_the_value_closest_to_the_command_wins(path):
    argv = ["--root", "/outer", "--lock-timeout", "1"]
    for depth in range(len(path)):
        argv += [path[depth], "--root", f"/{depth}", "--lock-timeout", str(depth + 2)]
    ctx = leaf_context(argv, env={"KL_ROOT": "/env", "KL_LOCK_TIMEOUT": "9"})
    assert (root_option(ctx, "root"), root_option(ctx, "lock_timeout")) == (f"/{len(path) - 1}", float(len(path) + 1))


@pytest.mark.parametrize("path", [p for p in PATHS if p], ids=lambda p: " ".join(("kl",) + p))
def test_an_option_before_the_command_still_works_and_beats_the_environment(path):
    ctx = leaf_context(["--root", "/outer", "--lock-timeout", "1", *path], env={"KL_ROOT": "/env", "KL_LOCK_TIMEOUT": "9"})
    assert (root_option(ctx, "root"), root_option(ctx, "lock_timeout")) == ("/outer", 1.0)


@pytest.mark.parametrize("path", [p for p in PATHS if p], ids=lambda p: " ".join(("kl",) + p))
def test_the_environment_is_read_when_no_option_is_given(path):
    ctx = leaf_context(list(path), env={"KL_ROOT": "/env", "KL_LOCK_TIMEOUT": "9"})
    assert (root_option(ctx, "root"), root_option(ctx, "lock_timeout")) == ("/env", 9.0)
    assert root_option(leaf_context(list(path)), "root") is None


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(("kl",) + p))
def test_a_bad_lock_timeout_after_the_command_is_a_usage_error(path):
    result = run(*path, "--lock-timeout", "-1")
    assert result.exit_code == 2
    assert "Invalid value for '--lock-timeout'" in result.stderr


# ------------------------------------------------------------ commands, for real

def test_topics_list_with_root_after_the_subcommand(roots):
    a, b = roots
    assert ok("topics", "list", "--root", a) == "in-a\n"
    assert ok("topics", "--root", a, "list") == "in-a\n"
    assert ok("--root", a, "topics", "list", "--root", b) == "in-b\n"
    assert ok("topics", "list", "--root", b, env={"KL_ROOT": a}) == "in-b\n"
    assert ok("topics", "list", env={"KL_ROOT": a}) == "in-a\n"


def test_consume_and_produce_with_root_among_their_arguments(roots):
    a, b = roots
    assert ok("consume", "--root", b, "in-b") == "hello\n"
    assert ok("consume", "in-b", "--root", b) == "hello\n"
    ok("produce", "in-a", "--root", a, "--lock-timeout", "5", input=b"x\n")
    assert ok("--root", b, "consume", "in-a", "--root", a) == "x\n"


def test_the_other_commands_use_the_root_given_after_them(roots):
    a, b = roots
    assert ok("groups", "list", "--root", b) == ""
    assert "in-b" in ok("topics", "describe", "in-b", "--root", b, "--json")
    assert ok("recover", "--root", b).startswith("in-b/0: ok")
    assert ok("retain", "--root", b).startswith("in-b/0: nothing to delete")
    assert "offset: 0 position: 0 size: 27" in ok("dump", "--root", b, "in-b")


def test_no_root_anywhere_is_a_usage_error():
    result = run("topics", "list")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "Error: no root directory: pass --root or set KL_ROOT"


def test_mirror_refuses_a_root_other_than_its_target(roots, tmp_path):
    a, b = roots
    result = run("mirror", b, a, "--root", str(tmp_path / "elsewhere"))
    assert result.exit_code == 2
    assert "kl mirror copies into TARGET" in result.stderr
    ok("--root", a, "mirror", b, a)  # the same root: nothing to choose between
    assert ok("consume", "in-b", "--root", a) == "hello\n"
    ok("mirror", b, str(tmp_path / "c"), env={"KL_ROOT": a})  # KL_ROOT is not --root: TARGET is the root
    assert ok("topics", "list", "--root", str(tmp_path / "c")) == "in-b\n"
