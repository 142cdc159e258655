"""kl's storage layer: the message format and the files that hold it.

``message`` and ``messageset`` frame and parse messages, ``validate`` makes a set fit to
append (``Checked``); ``segment`` and ``state`` are a partition's files, ``log``
(``Log``) the partition that appends to them under its ``locks``, with ``flusher``
fsyncing in the background; ``config`` is a topic's settings file; ``recovery``,
``retention``, ``importer``, ``dump`` and ``timeindex`` are the maintenance verbs and
their aids; ``fsutil`` the file-system helpers.  The per-message loops run in
``core``: the compiled ``_core`` (C) or its twin ``pycore``.

Nothing here imports anything above it in kl (only ``kl.errors``, at the bottom).
"""

from kl.log.log import EARLIEST, LATEST, Log, Position
from kl.log.validate import Checked

__all__ = ["EARLIEST", "LATEST", "Checked", "Log", "Position"]
