"""The process's budget of files kept open between uses.

kl keeps a few files open where opening them again would cost system calls (on NFS,
round trips) at every append: each lock file (``kl.log.locks``), a writer's state record
and active segment (``kl.log.log``), each topic's ``topic.json`` (``kl.log.config``).
Kept for every partition a process ever touched, they would run out of descriptors under
the usual ``ulimit -n 1024`` on a root of a thousand partitions.  So each holder of kept
files (a *keeper*) tells this module how many descriptors it keeps whenever it opens or
closes them, and past the budget the least recently used keepers are asked to close
theirs (they open them again at their next use).  Recency is a second chance (the clock
algorithm): a keeper sets its ``used`` flag at each use, which costs an attribute store
rather than a call here, and a keeper found used is passed over once.  A keeper in use
(its lock held or waited for) declines and is passed over: the budget is exceeded only
while that many keepers are busy at once.

The budget is half of ``RLIMIT_NOFILE``'s soft limit, the rest being the application's
(sockets, pipes, files being read).  ``raise_limit`` lifts the soft limit to the hard one,
as servers do at start; the ``kl`` command does so.  Safe across threads and ``fork()``.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from typing import Protocol

BUDGET_SHARE = 0.5
"""The share of the soft ``RLIMIT_NOFILE`` that kept files may use."""
MIN_BUDGET = 16
SHED_TO = 0.75
"""Past the budget, keepers are closed until this share of it is in use (not one per call)."""
MAX_RAISED = 1 << 20
"""``raise_limit`` stops here even where the hard limit is higher (or infinite)."""


class Keeper(Protocol):
    used: bool
    """Set by the keeper at each use; cleared here when it is given its second chance."""

    def close_idle(self) -> bool:
        """Close the kept descriptors unless they are in use; False when they are."""


_kept: OrderedDict[Keeper, int] = OrderedDict()
"""Keepers with the descriptors each keeps open, least recently used first."""
_total = 0
_budget = 0
_lock = threading.RLock()
"""Reentrant: a keeper letting go reports its descriptors closed from inside ``_shed``."""


def kept(keeper: Keeper, count: int) -> None:
    """``keeper`` keeps ``count`` descriptors open now (0: none); past the budget, the
    least recently used other keepers are asked to let theirs go."""
    global _total
    with _lock:
        _total += count - _kept.pop(keeper, 0)
        if count:
            _kept[keeper] = count
            if _total > _budget and _total > budget():
                _shed(keeper)


def in_use() -> int:
    """The descriptors kept open now."""
    return _total


def budget() -> int:
    """The number of descriptors kept files may use (read afresh from the limit)."""
    global _budget
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    _budget = max(MIN_BUDGET, int(min(soft, MAX_RAISED) * BUDGET_SHARE))
    return _budget


def raise_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (at most ``MAX_RAISED``);
    returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_RAISED if hard == resource.RLIM_INFINITY else min(hard, MAX_RAISED)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError):
        return soft
    with _lock:
        budget()
    return wanted


def _shed(current: Keeper) -> None:
    target = _budget * SHED_TO
    for _ in range(2):  # a second round for those given a second chance in the first
        for keeper in list(_kept):
            if _total <= target:
                return
            if keeper is current or keeper not in _kept:
                continue
            if keeper.used:
                keeper.used = False
                _kept.move_to_end(keeper)
            elif keeper.close_idle():
                _forget(keeper)


def _forget(keeper: Keeper) -> None:
    global _total
    _total -= _kept.pop(keeper, 0)


def _after_fork() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)
