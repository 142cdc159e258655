"""Serializers: how a producer turns keys and values into bytes, and a consumer turns
them back (``key_serializer``/``value_serializer``, ``key_deserializer``/
``value_deserializer``, named as kafka-python and aiokafka name them).

Bytes pass as they are by default.  None is never handed to a serializer or a
deserializer: a null value stays a null value (Kafka's tombstone), whatever the codec
(kafka-python hands it over, so that ``json.dumps`` makes it ``b"null"``; here
``send(topic, None)`` with a JSON serializer still deletes the key).  Anything else that
is not bytes without a serializer is a ``TypeError`` naming the argument and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = [
    "Deserializer",
    "Serializer",
    "deserialize",
    "json_deserializer",
    "json_serializer",
    "serialize",
    "string_deserializer",
    "string_serializer",
]

Serializer = Callable[[Any], bytes]
"""A key's or value's bytes."""

Deserializer = Callable[[bytes], Any]
"""A key or value from its bytes."""

BYTES = (bytes, bytearray, memoryview)


def serialize(serializer: Serializer | None, data: object, argument: str) -> bytes | None:
    """``data`` (the ``argument``, ``"key"`` or ``"value"``) as bytes: as it is without a
    ``serializer``, or what the serializer gives.  Raises ``TypeError`` naming the
    argument and the fix when that is not bytes."""
    if data is None:
        return None
    if serializer is not None:
        data = serializer(data)
        if isinstance(data, BYTES):
            return bytes(data)
        raise TypeError(f"{argument}_serializer returned {type(data).__name__}, not bytes")
    if isinstance(data, BYTES):
        return bytes(data)
    fix = "kl.serde.string_serializer" if isinstance(data, str) else "kl.serde.json_serializer, or a function of yours"
    raise TypeError(f"{argument} must be bytes, not {type(data).__name__}: pass {argument}_serializer= ({fix})")


def deserialize(deserializer: Deserializer | None, data: bytes | None) -> Any:
    """``data`` through ``deserializer`` (None stays None; bytes stay bytes without one)."""
    return data if deserializer is None or data is None else deserializer(data)


def string_serializer(text: str) -> bytes:
    """UTF-8."""
    return text.encode()


def string_deserializer(data: bytes) -> str:
    """UTF-8 (``UnicodeDecodeError`` for bytes that are not)."""
    return data.decode()


def json_serializer(value: object) -> bytes:
    """JSON in UTF-8, compact."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def json_deserializer(data: bytes) -> Any:
    """JSON (``ValueError`` for bytes that are not)."""
    return json.loads(data)
