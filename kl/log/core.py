"""The core kl runs: the compiled one (``kl.log._core``, C) where it was built, else the
pure-Python one (``kl.log.pycore``); ``KL_PURE=1`` in the environment picks the pure one.

Callers look the functions up here at each call (``core.walk(...)``), so ``use``
switches every caller at once (the tests run both cores through the same tests).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import ModuleType

import google_crc32c

from kl.log import pycore
from kl.log.pycore import (
    BAD_FIELD,
    BAD_KEY_LENGTH,
    BAD_LENGTH,
    CHECKSUM,
    HEADERS,
    HEADERS_JSON,
    INCOMPLETE,
    KEY,
    KEY_JSON,
    KEYED,
    NEXT_OFFSET,
    OFFSET,
    OK,
    TIMESTAMP,
    TIMESTAMP_ISO,
    TIMESTAMP_JSON,
    UNKNOWN_MAGIC,
    VALUE,
    VALUE_JSON,
)

__all__ = [
    "BAD_FIELD",
    "BAD_KEY_LENGTH",
    "BAD_LENGTH",
    "CHECKSUM",
    "INCOMPLETE",
    "OK",
    "UNKNOWN_MAGIC",
    "HEADERS",
    "HEADERS_JSON",
    "KEY",
    "KEY_JSON",
    "KEYED",
    "NEXT_OFFSET",
    "OFFSET",
    "TIMESTAMP",
    "TIMESTAMP_ISO",
    "TIMESTAMP_JSON",
    "VALUE",
    "VALUE_JSON",
    "describe",
    "use",
]
FUNCTIONS = (
    "check",
    "walk",
    "recent",
    "plain_values",
    "plain_columns",
    "plain_messages",
    "frame",
    "frame_values",
    "frame_records",
    "crc32c",
    "murmur2",
    "varint",
    "read_varint",
    "dump_lines",
    "render",
    "kafka_batch",
    "kafka_records",
    "Lane",
)
"""What a core provides, with the same answers from both."""

log = logging.getLogger(__name__)


def compiled() -> ModuleType | None:
    """``kl.log._core``, or None where it was not built (or does not load)."""
    try:
        from kl.log import _core
    except ImportError:
        return None
    return _core


NAME = "pure"
"""The core in use: ``compiled`` or ``pure``."""
check = pycore.check
walk = pycore.walk
recent = pycore.recent
plain_values = pycore.plain_values
plain_columns = pycore.plain_columns
plain_messages = pycore.plain_messages
frame = pycore.frame
frame_values = pycore.frame_values
frame_records = pycore.frame_records
crc32c = pycore.crc32c
murmur2 = pycore.murmur2
varint = pycore.varint
read_varint = pycore.read_varint
dump_lines = pycore.dump_lines
render = pycore.render
kafka_batch = pycore.kafka_batch
kafka_records = pycore.kafka_records
Lane = pycore.Lane


def use(name: str) -> None:
    """Run the ``compiled`` or the ``pure`` core from now on.  Raises ``ValueError`` for
    ``compiled`` where it was not built."""
    global NAME
    if name == "compiled":
        module = compiled()
        if module is None:
            raise ValueError("kl's compiled core was not built here (kl.log._core does not import)")
    elif name == "pure":
        module = pycore
    else:
        raise ValueError(f"no core named {name!r}: compiled or pure")
    globals().update({function: getattr(module, function) for function in FUNCTIONS})
    NAME = name


@dataclass(frozen=True)
class Description:
    """Which core runs, and which CRC-32C implementation it runs (``kl --version`` says it)."""

    core: str
    """``compiled`` or ``pure`` (as ``NAME``)."""
    why: str
    """The core in a few words, and why the pure one runs where it does."""
    crc32c: str
    """``SSE4.2``, ``ARMv8 CRC`` or ``table`` (the compiled core's), else ``google-crc32c (C)``
    or ``google-crc32c (python)`` (the pure core's: google-crc32c's extension or its fallback)."""

    def __str__(self) -> str:
        return f"{self.why}, crc32c: {self.crc32c}"


def describe() -> Description:
    """Which core runs, why, and its CRC-32C implementation."""
    if NAME == "compiled":
        from kl.log import _core

        return Description(NAME, "compiled core (C)", _core.CRC32C)
    why = "pure-Python core (KL_PURE is set)" if forced() else "pure-Python core (the compiled one was not built)"
    return Description(NAME, why, f"google-crc32c ({'C' if google_crc32c.implementation == 'c' else 'python'})")


def forced() -> bool:
    """Whether ``KL_PURE`` asks for the pure-Python core (set, and not 0)."""
    return os.environ.get("KL_PURE", "0") not in ("", "0")


use("pure" if forced() or compiled() is None else "compiled")
log.debug("kl runs its %s", describe())
