"""A reader's place in one partition, and the one policy for what can happen under it.

A ``Cursor`` holds a ``Position`` (an offset, and how many messages of the compressed
batch there were already read), reads the valid messages from it and steps on after
them.  Three events meet a reader, and each has one answer here:

- the place fell out of the log (retention deleted it, or the log was cut shorter):
  ``OffsetOutOfRange`` is raised, or per ``reset`` the cursor goes on from the log start
  or end, telling ``on_loss`` (which may raise instead);
- damage: the valid messages before it are read first; ``damaged`` then raises it, or
  with ``skip_corrupt`` steps over it to where valid messages start again, telling
  ``on_skip``;
- a place inside a compressed batch: the batch is read whole and its first ``skip``
  messages left out.

The log is anything with ``read`` and ``skip_corrupt`` (a ``Log``, or a remote one).
A cursor is not thread-safe.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

from kl.errors import CorruptMessage, OffsetOutOfRange
from kl.log.log import Position
from kl.log.message import Message
from kl.log.messageset import MessageSet

T = TypeVar("T")
Reset = Literal["fail", "earliest", "latest"]
Messages = list[Message] | list[bytes | None]


class Readable(Protocol):
    """What a cursor reads: ``Log``'s read interface."""

    def read(self, offset: int, max_bytes: int) -> MessageSet: ...

    def skip_corrupt(self, offset: int) -> int: ...


class Cursor:
    """A place in one partition of ``log``, read on from ``position``.

    ``on_skip(offset, next_offset, reason)`` hears of damage stepped over;
    ``on_loss(error, to)`` of a place out of the log before the cursor goes on at ``to``.
    """

    __slots__ = ("log", "position", "reset", "skip_corrupt", "on_skip", "on_loss")

    def __init__(
        self,
        log: Readable,
        position: Position,
        *,
        reset: Reset = "fail",
        skip_corrupt: bool = False,
        on_skip: Callable[[int, int, str], None] | None = None,
        on_loss: Callable[[OffsetOutOfRange, int], None] | None = None,
    ):
        self.log = log
        self.position = position
        self.reset = reset
        self.skip_corrupt = skip_corrupt
        self.on_skip = on_skip
        self.on_loss = on_loss

    def read(
        self, max_bytes: int, *, values_only: bool = False, limit: int | None = None
    ) -> tuple[Messages, CorruptMessage | None]:
        """The valid messages (their values, with ``values_only``; at most ``limit``) of one
        fetch of ``max_bytes`` after the position's skipped ones, and the damage that ended
        them early (the position is then at it; see ``damaged``).  The position moves after
        what was read.  Raises ``OffsetOutOfRange`` per ``reset``."""
        start = self.position
        got, damage = self.read_with(max_bytes, lambda found: _take(found, start, values_only, limit))
        return got or [], damage

    def read_with(
        self, max_bytes: int, take: Callable[[MessageSet], tuple[T, Position | int]]
    ) -> tuple[T | None, CorruptMessage | None]:
        """``take`` of the set one fetch of ``max_bytes`` gives (what it makes of the set, and
        where to go on); at damage, of the valid messages before it, with the damage (None
        where nothing comes before it).  Raises ``OffsetOutOfRange`` per ``reset``."""
        offset = self.position.offset
        damage = None
        try:
            try:
                got, after = take(self.log.read(offset, max_bytes))
            except CorruptMessage as e:
                if e.offset is None or e.offset < offset:
                    raise
                damage = e
                if e.offset == offset:
                    return None, damage
                got, after = take(self.log.read(offset, e.offset - offset))[0], e.offset
        except OffsetOutOfRange as e:
            self._lost(e)
            return None, None
        self.position = after if isinstance(after, Position) else Position(after)
        return got, damage

    def damaged(self, damage: CorruptMessage) -> None:
        """Raise ``damage``, found where the position is; or with ``skip_corrupt`` step over
        it to where valid messages start again (``Log.skip_corrupt``), telling ``on_skip``."""
        if not self.skip_corrupt:
            raise damage
        offset = self.position.offset
        resume = self.log.skip_corrupt(offset)
        if self.on_skip is not None:
            self.on_skip(offset, resume, damage.reason)
        self.position = Position(resume)

    def _lost(self, error: OffsetOutOfRange) -> None:
        if self.reset == "fail":
            raise error
        to = error.log_start_offset if self.reset == "earliest" else error.log_end_offset
        if self.on_loss is not None:
            self.on_loss(error, to)
        self.position = Position(to)


def advance(position: Position, message: Message) -> Position:
    """Where to resume after ``message``, read on from ``position``: after it, or, inside a
    compressed batch (all but its last message resume at the batch), after one more of
    the batch's messages."""
    if message.next_offset != message.offset:
        return Position(message.next_offset)
    return Position(message.offset, position.skip + 1 if position.offset == message.offset else 1)


def _take(found: MessageSet, start: Position, values_only: bool, limit: int | None) -> tuple[Messages, Position]:
    """Up to ``limit`` messages (or values) of a set read at ``start``, after its skipped
    ones, and where to go on after them."""
    if not start.skip:
        if values_only:
            values, next_offset = found.values()
            if limit is None or len(values) <= limit:
                return values, Position(next_offset)
        if limit is None:
            return list(found), Position(found.next_offset)
    wanted = None if limit is None else limit + start.skip
    got = list(itertools.islice(found, wanted))
    skipped = 0
    while skipped < min(start.skip, len(got)) and got[skipped].offset == start.offset:
        skipped += 1
    cut = len(got) == wanted
    del got[:skipped]
    after = _after(start, got) if cut else Position(found.next_offset)
    if not got and after.offset == start.offset:
        after = start  # nothing read
    return ([msg.value for msg in got] if values_only else got), after


def _after(start: Position, messages: list[Message]) -> Position:
    """The position after ``messages``, read on from ``start`` (a limit may end them
    inside a compressed batch)."""
    if not messages:
        return start
    last = messages[-1]
    if last.next_offset != last.offset:
        return Position(last.next_offset)
    inside = 0
    for msg in reversed(messages):
        if msg.offset != last.offset:
            break
        inside += 1
    return Position(last.offset, inside + start.skip if inside == len(messages) and last.offset == start.offset else inside)
