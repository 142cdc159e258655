"""A consumer group member for the tests: ``python groupmember.py ROOT GROUP TOPICS OUT [options]``.

Writes one line per message to OUT: ``m TIME TOPIC PARTITION OFFSET VALUE`` (TIME: the
system-wide monotonic clock, so lines of several processes can be ordered), and ``lost
TOPIC PARTITION WHY`` / ``rejected WHY`` / ``busy WHY`` (a commit that found a lock held
for the session timeout) lines.  SIGTERM stops it cleanly.

``--stop-in OP`` (claim, commit, release or owns: a ``Registry`` method; claim includes
``claim_many`` and commit ``commit_many``, the member's own) makes the member SIGSTOP
itself the first time it holds a partition's lock (its record's bytes of the topic's
claims file) inside OP, after writing a ``stopping OP`` line: a member stopped while it
holds a group lock, deterministically.
With ``--arm-on-usr1`` that is the first time after it got SIGUSR1 (and wrote ``armed``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import IO

import kl
from kl.registry import Registry, _Claims


def stop_in(op: str, out: IO[str], armed_now: bool) -> None:
    """Make the first partition lock taken inside ``Registry.<op>`` SIGSTOP this process while
    held (once armed: now, or by SIGUSR1)."""
    lock = _Claims.lock
    names = {"claim": ["claim", "claim_many"], "commit": ["commit", "commit_many"]}.get(op, [op])
    codes = {getattr(Registry, name).__code__ for name in names}
    armed = [armed_now]

    def arm(*_: object) -> None:
        armed[0] = True
        out.write("armed now\n")

    signal.signal(signal.SIGUSR1, arm)

    def stopping(self: _Claims, partition: int, force: bool) -> bool:
        held = lock(self, partition, force)
        frame = sys._getframe()
        while frame is not None and frame.f_code not in codes:
            frame = frame.f_back
        if held and armed[0] and frame is not None:
            armed[0] = False
            out.write(f"stopping {op} {os.path.basename(self.path)} {partition}\n")
            # Sent to this thread, the stop takes it before it goes on (os.kill's may be
            # taken by another thread: this one would run on a moment, releasing the lock).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return held

    _Claims.lock = stopping  # type: ignore[method-assign]


def arguments() -> argparse.ArgumentParser:
    """The arguments of a member process (this one's and tests/aiomember.py's)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("group")
    parser.add_argument("topics")
    parser.add_argument("out")
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--session", type=float, default=3.0)
    parser.add_argument("--commit-every", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    return parser


def main() -> None:
    parser = arguments()
    parser.add_argument("--stop-in", choices=["claim", "commit", "release", "owns"])
    parser.add_argument("--arm-on-usr1", action="store_true")
    args = parser.parse_args()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    if args.stop_in:
        stop_in(args.stop_in, out, not args.arm_on_usr1)

    def lost(topic: str, partition: int, why: str) -> None:
        out.write(f"lost {topic} {partition} {why}\n")

    member = kl.GroupConsumer(
        args.root,
        args.group,
        args.topics.split(","),
        poll_interval=args.poll,
        session_timeout=args.session,
        auto_commit_interval=0.2,
        on_lost=lost,
    )
    signal.signal(signal.SIGTERM, lambda *_: member.stop())
    out.write(f"joined {member.member_id}\n")
    n = 0
    for record in member:
        out.write(f"m {time.monotonic():.6f} {record.topic} {record.partition} {record.offset} {record.value.decode()}\n")
        n += 1
        if args.sleep:
            time.sleep(args.sleep)
        if args.commit_every and n % args.commit_every == 0:
            try:
                member.commit()
            except kl.NotOwner as e:
                out.write(f"rejected {e}\n")
            except kl.LockTimeout as e:  # another process held the lock all along: the next commit includes these
                out.write(f"busy {e}\n")
    member.close()
    out.write("left\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
