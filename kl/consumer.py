"""The stateless consumer (the seed's low-level API): fetch by offset, find offsets, follow.

A consumer keeps no position of its own: every call names the offset to read from, and
the caller stores ``next_offset`` wherever suits it (with its output, for exactly-once).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import Literal

from kl.errors import CorruptMessage, InvalidConfig, OffsetOutOfRange
from kl.log import EARLIEST, LATEST
from kl.message import Message
from kl.messageset import MessageSet
from kl.topic import Root

DEFAULT_MAX_BYTES = 1 << 20
ResetPolicy = Literal["fail", "earliest", "latest"]

log = logging.getLogger(__name__)

__all__ = ["Consumer", "EARLIEST", "LATEST", "DEFAULT_MAX_BYTES"]


class Consumer:
    """Reads topics under a root without taking any lock.  Safe to share between threads."""

    def __init__(self, root: Root | str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = root if isinstance(root, Root) else Root(root)
        self.max_bytes = max_bytes

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int | None = None) -> MessageSet:
        """The complete messages from ``offset`` within ``max_bytes`` (at least one whole
        message if any is there).  Raises ``OffsetOutOfRange`` and ``InvalidOffset``."""
        return self.root.log(topic, partition).read(offset, max_bytes or self.max_bytes)

    def multifetch(self, requests: Iterable[tuple[str, int, int, int | None]]) -> list[MessageSet]:
        """``fetch`` for each (topic, partition, offset, max_bytes), in order."""
        return [self.fetch(*request) for request in requests]

    def check_offset(self, topic: str, partition: int, offset: int) -> None:
        """Raise ``InvalidOffset`` unless a message starts at ``offset`` (a full check by
        scanning its segment; use it for offsets that come from a person)."""
        self.root.log(topic, partition).check_offset(offset)

    def earliest_offset(self, topic: str, partition: int) -> int:
        return self.root.log(topic, partition).log_start_offset

    def latest_offset(self, topic: str, partition: int) -> int:
        return self.root.log(topic, partition).log_end_offset

    def offsets_before(self, topic: str, partition: int, time_ms: int, max_offsets: int) -> list[int]:
        """Segment start offsets at or before ``time_ms``, newest first (the seed's
        ``getOffsetsBefore``); ``LATEST`` and ``EARLIEST`` give the log end and start."""
        return self.root.log(topic, partition).offsets_before(time_ms, max_offsets)

    def offset_for_time(self, topic: str, partition: int, time_ms: int) -> int:
        """The offset of the first message stamped at or after ``time_ms``."""
        return self.root.log(topic, partition).offset_for_time(time_ms)

    def offset_back(self, topic: str, partition: int, count: int) -> int:
        """The offset from which the last ``count`` messages can be read."""
        return self.root.log(topic, partition).offset_back(count)

    def stream(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        idle_timeout: float | None = None,
        poll_interval: float = 0.1,
        reset: ResetPolicy = "fail",
        max_bytes: int | None = None,
        skip_corrupt: bool = False,
    ) -> Iterator[Message]:
        """Follow a partition from ``offset``, waiting for new messages as they come.

        Stops after ``idle_timeout`` seconds without a new message (never, if None).  When
        the position falls out of the log (retention deleted it), ``reset`` says what to do:
        raise ``OffsetOutOfRange`` ("fail"), or go on from the log start or end.  A damaged
        message raises ``CorruptMessage`` unless ``skip_corrupt``, which logs it and goes on
        from the next valid message.
        """
        if reset not in ("fail", "earliest", "latest"):
            raise InvalidConfig(f"reset must be fail, earliest or latest, not {reset!r}")
        idle_since = time.monotonic()
        while True:
            try:
                messages = self.fetch(topic, partition, offset, max_bytes)
            except OffsetOutOfRange as e:
                if reset == "fail":
                    raise
                offset = e.log_start_offset if reset == "earliest" else e.log_end_offset
                continue
            got = False
            try:
                for message in messages:
                    yield message
                    offset, got = message.next_offset, True
            except CorruptMessage as e:
                if not skip_corrupt or e.offset is None:
                    raise
                offset = self.root.log(topic, partition).skip_corrupt(e.offset)
                log.warning("skipped damaged data of %s/%d from offset %d to %d: %s", topic, partition, e.offset, offset, e.reason)
                idle_since = time.monotonic()
                continue
            got = got or messages.next_offset > offset  # stepped over padding
            offset = max(offset, messages.next_offset)
            if got:
                idle_since = time.monotonic()
                continue
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return
            time.sleep(poll_interval)
