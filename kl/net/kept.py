"""A document ``kl serve`` keeps in the root for every daemon over it: the users'
credentials (``kl.net.credentials``) and the ACLs (``kl.net.acls``).

One JSON file in a directory of its own (mode 0700), replaced whole (``write_atomic``,
mode 0600), changed under a lock in ``ROOT/.locks``, and read again by each daemon once
its inode, modification time or size changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from kl.errors import KlError
from kl.log import locks
from kl.log.fsutil import ensure_dir, storage_error, write_atomic

T = TypeVar("T")


class Kept(Generic[T]):
    """``ROOT/DIRECTORY/NAME``, read with ``parse`` (JSON to ``T``: raises ValueError,
    KeyError, TypeError or AttributeError on what it cannot take) and written with
    ``encode``; ``empty`` makes the document of a root that has none; ``damaged`` is the
    error class of a file that does not parse."""

    def __init__(
        self,
        root: str,
        directory: str,
        name: str,
        parse: Callable[[Any], T],
        encode: Callable[[T], Any],
        empty: Callable[[], T],
        damaged: type[KlError],
        *,
        lock_timeout: float = 10.0,
    ):
        self.root = root
        self.path = os.path.join(root, directory, name)
        self.lock = os.path.join(root, ".locks", f"{directory.lstrip('.')}.lock")
        self.lock_timeout = lock_timeout
        self._parse, self._encode, self._empty, self._damaged = parse, encode, empty, damaged
        self._cache: tuple[tuple[int, int, int] | None, T] = (None, empty())
        self._cache_lock = threading.Lock()

    def get(self) -> T:
        """The document (not to be changed), read again once the file changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._empty()
        except OSError as e:
            raise storage_error(e, "read", self.path) from None
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._cache_lock:
            seen, document = self._cache
            if seen != identity:
                document = self._read()
                self._cache = (identity, document)
            return document

    @contextlib.contextmanager
    def changing(self) -> Iterator[T]:
        """The document, read afresh under the lock, to change in the ``with`` block:
        written back at its end (not when the block raises)."""
        with locks.locked(self.lock, self.lock_timeout):
            document = self._read()
            yield document
            self._write(document)

    def _read(self) -> T:
        try:
            with open(self.path, "rb") as f:
                return self._parse(json.loads(f.read()))
        except FileNotFoundError:
            return self._empty()
        except OSError as e:
            raise storage_error(e, "read", self.path) from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise self._damaged(f"{self.path} is damaged ({type(e).__name__}: {e})") from None

    def _write(self, document: T) -> None:
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            ensure_dir(os.path.dirname(directory))
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass
            except OSError as e:
                raise storage_error(e, "create directory", directory) from None
        write_atomic(self.path, json.dumps(self._encode(document), indent=1).encode() + b"\n", mode=0o600)
