"""How a request family declares what it serves (as franz-go's kfake registers each
request with its versions): ``Api(request class, response class, lowest, highest,
handler)``, a handler being ``handler(broker, conn, version, request, wait)`` and giving
the response (None: none is sent, or the request is parked until ``wait`` comes back)."""

from __future__ import annotations

from collections.abc import Callable
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
