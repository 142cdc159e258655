"""Shell completion of values: topic names, group names, partitions and offset keywords.

click completes commands and options itself (``_KL_COMPLETE=bash_source kl`` prints
the script to source; zsh and fish likewise); these complete the values, given as
``shell_complete=`` to the parameters that take them.  They read the root named on the
command line so far (``--root``) or by ``KL_ROOT`` (topics: of the ``kl serve`` of
``--server`` when given), and offer nothing, quietly, when there is none or it cannot be
read: a completion never prints an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import click
from click.shell_completion import CompletionItem

import kl
from kl_cli.common import get_root

if TYPE_CHECKING:
    from kl.net.remote import RemoteRoot

Complete = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]
SERVER_TIMEOUT = 2.0
"""Seconds a completion waits for a ``kl serve``: a shell must not hang on a tab."""

FROM_OFFSET_KEYWORDS = {
    "earliest": "the first message",
    "latest": "after the last message",
    "beginning": "kcat's earliest",
    "end": "kcat's latest",
}
"""The words ``kl consume --from-offset`` takes, besides numbers."""
RESET_KEYWORDS = {"earliest": "the log start", "latest": "the log end"}
"""The words ``kl groups reset --to`` takes, besides times and offsets."""


def _root(ctx: click.Context) -> kl.Root | None:
    """The root given so far (``--root``, else ``KL_ROOT``), if any."""
    try:
        return get_root(ctx)
    except click.UsageError:
        return None


@contextlib.contextmanager
def _topics_source(ctx: click.Context) -> Iterator[kl.Root | RemoteRoot | None]:
    """Where the topics are: the ``kl serve`` of ``--server`` when one was given
    (``kl consume --server HOST:PORT <TAB>``), else the root."""
    server = ctx.params.get("server")
    if not server:
        yield _root(ctx)
        return
    from kl.net.remote import RemoteRoot  # here: a command's start-up does not load the client

    try:
        remote = RemoteRoot(server, timeout=SERVER_TIMEOUT)
    except kl.KlError:
        yield None
        return
    try:
        yield remote
    finally:
        remote.close()


def _matching(incomplete: str, names: Callable[[], Iterable[str]]) -> list[CompletionItem]:
    """``names()`` starting with ``incomplete``; none when they cannot be read."""
    try:
        return [CompletionItem(name) for name in names() if name.startswith(incomplete)]
    except (kl.KlError, OSError):
        return []


def topics(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The topics starting with ``incomplete``."""
    with _topics_source(ctx) as source:
        return [] if source is None else _matching(incomplete, source.topics)


def groups(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The root's consumer groups starting with ``incomplete``."""
    from kl import groups as admin  # here: a command's start-up does not load it

    root = _root(ctx)
    return [] if root is None else _matching(incomplete, lambda: admin.list_groups(root))


def partitions(topic_param: str) -> Complete:
    """The partitions of the topic already given as ``topic_param`` (one topic name, or a
    tuple of them holding one), starting with ``incomplete``."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        names = _given(ctx, topic_param)
        if len(names) != 1:
            return []
        with _topics_source(ctx) as source:
            if source is None:
                return []
            return _matching(incomplete, lambda: map(str, range(source.config(names[0]).partitions)))

    return complete


def _given(ctx: click.Context, name: str) -> list[str]:
    """The values given so far to parameter ``name``.  An option left waiting for the
    value being completed stops click's parse before the arguments are assigned: they
    are then the words left over (``kl consume events -p <TAB>``)."""
    given = ctx.params.get(name)
    if given:
        return [given] if isinstance(given, str) else list(dict.fromkeys(given))
    param = next((p for p in ctx.command.params if p.name == name), None)
    if not isinstance(param, click.Argument):
        return []
    return list(dict.fromkeys(ctx.args if param.nargs == -1 else ctx.args[: param.nargs]))


def keywords(words: dict[str, str]) -> Complete:
    """The ``words`` starting with ``incomplete``, each with its meaning as help."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(word, help=text) for word, text in words.items() if word.startswith(incomplete)]

    return complete
