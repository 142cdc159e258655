"""Log lines that would repeat (a client retrying what is refused every few milliseconds)
told at most once an interval per key, with how many times they were not."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

INTERVAL = 60.0
"""How often one key's line is told at most."""
MOST_KEYS = 100_000
"""Keys remembered before forgetting them all (a bound on memory, not a policy)."""


class Repeats:
    """Which lines to tell: the first of a key, then the first after each ``interval``."""

    def __init__(self, interval: float = INTERVAL):
        self.interval = interval
        self._seen: dict[Hashable, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def due(self, key: Hashable) -> int | None:
        """None when this line is not to be told; else how many of its key were not since
        the last one told."""
        now = time.monotonic()
        with self._lock:
            last, untold = self._seen.get(key, (float("-inf"), 0))
            if now - last < self.interval:
                self._seen[key] = (last, untold + 1)
                return None
            if len(self._seen) >= MOST_KEYS:
                self._seen.clear()
            self._seen[key] = (now, 0)
        return untold


def more(untold: int) -> str:
    """What a line told says of the repeats not told before it."""
    return f" ({untold} more times since it was last logged)" if untold else ""
