"""How a request family declares what it serves (as franz-go's kfake registers each
request with its versions): ``Api(request class, response class, lowest, highest,
handler)``, a handler being ``handler(broker, conn, version, request, wait)`` and giving
the response (None: none is sent, or the request is parked until ``wait`` comes back)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Api(NamedTuple):
    """One request kind: its kafka-python classes, the versions advertised, its handler."""

    request: Any
    response: Any
    low: int
    high: int
    handler: Callable[..., Any]

    @property
    def key(self) -> int:
        return int(self.request.API_KEY)


@dataclass
class Spliced:
    """An answer whose large bytes fields go to the socket as pieces of their own, never
    copied into the encoded message (whose encoder keeps, per thread, a buffer as large
    as the largest message it made): ``message`` holds a ``mark`` in their place.  The
    room the builder ``reserve``d for it is given back once it is queued."""

    message: Any
    reserved: int = 0
    parts: dict[bytes, bytes] = field(default_factory=dict)
    """mark -> the bytes it stands for."""

    def mark(self, data: bytes) -> bytes:
        """What ``message`` holds in the place of ``data`` (itself when small)."""
        if len(data) < SPLICED:
            return data
        mark = os.urandom(16)  # in no field the client chose, but for one chance in 2^128
        self.parts[mark] = data
        return mark


SPLICED = 64 << 10
"""Bytes fields this long and longer are spliced in (``Spliced``), not encoded."""
