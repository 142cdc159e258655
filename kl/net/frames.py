"""What every protocol kl serves and speaks shares: a request or response is framed as an
int32 size and the bytes it counts."""

from __future__ import annotations

import struct

from kl.errors import KlError

SIZE = struct.Struct(">i")


class ProtocolError(KlError):
    """A peer sent bytes that are not this protocol (or closed the connection mid-way)."""
