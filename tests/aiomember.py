"""An asyncio consumer group member for the tests: ``python aiomember.py ROOT GROUP TOPICS OUT [options]``,
groupmember.py's twin on ``kl.aio.AsyncGroupConsumer`` (its own event loop in its own process).

Writes one line per record to OUT: ``m TIME TOPIC PARTITION OFFSET NEXT_OFFSET VALUE`` (TIME:
the system-wide monotonic clock, so lines of several processes can be ordered), ``committed
TOPIC PARTITION NEXT_OFFSET`` after each commit that returned, ``lost TOPIC PARTITION WHY``
(``on_lost``), ``rejected WHY`` (a commit raising ``NotOwner``), ``busy WHY``
(``LockTimeout``) and, once it left, ``gap SECONDS`` (the longest its event loop stood
still: a ticker task's longest wait between two ticks) and ``left``.  SIGTERM ends it
(the consuming task cancelled, then ``close``).

``--die-in-commit STEP --die-at N`` makes the process SIGKILL itself inside its Nth commit
(after writing ``dying NEXT_OFFSET``): ``torn`` after writing half of the commit's line to
the commits file, ``written`` after writing all of it, ``synced`` after its fsync.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from groupmember import arguments

import kl
from kl.aio import AsyncGroupConsumer


def die_in_commit(step: str, armed: list[bool]) -> None:
    """SIGKILL this process at ``step`` of the first commit made while ``armed[0]``."""
    real_write, real_fsync = os.write, os.fsync

    def of_commits(fd: int) -> bool:
        try:
            return "/commits/" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False

    def write(fd: int, data: bytes) -> int:  # type: ignore[override]
        if armed[0] and of_commits(fd):
            if step == "torn":
                real_write(fd, bytes(data)[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            written = real_write(fd, data)
            if step == "written":
                os.kill(os.getpid(), signal.SIGKILL)
            return written
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if armed[0] and step == "synced" and of_commits(fd):
            os.kill(os.getpid(), signal.SIGKILL)

    os.write, os.fsync = write, fsync  # type: ignore[assignment]


async def main() -> None:
    parser = arguments()
    parser.add_argument("--max-bytes", type=int, default=1 << 20)
    parser.add_argument("--die-in-commit", choices=["torn", "written", "synced"])
    parser.add_argument("--die-at", type=int, default=1)
    args = parser.parse_args()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    armed = [False]
    if args.die_in_commit:
        die_in_commit(args.die_in_commit, armed)

    gap = 0.0

    async def ticker() -> None:
        nonlocal gap
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gap, last = max(gap, now - last - 0.01), now

    ticking = asyncio.create_task(ticker())
    member = AsyncGroupConsumer(
        args.root,
        args.group,
        args.topics.split(","),
        poll_interval=args.poll,
        session_timeout=args.session,
        auto_commit=False,
        max_bytes=args.max_bytes,
        on_lost=lambda topic, partition, why: out.write(f"lost {topic} {partition} {why}\n"),
    )
    await member.start()

    async def consume() -> None:
        n = commits = 0
        async for record in member:
            value = record.value.decode() if record.value is not None else ""
            where = f"{record.topic} {record.partition} {record.offset} {record.next_offset}"
            out.write(f"m {time.monotonic():.6f} {where} {value}\n")
            n += 1
            if args.sleep:
                await asyncio.sleep(args.sleep)
            if args.commit_every and n % args.commit_every == 0:
                commits += 1
                if args.die_in_commit and commits == args.die_at:
                    out.write(f"dying {record.next_offset}\n")
                    armed[0] = True
                try:
                    await member.commit()
                    out.write(f"committed {record.topic} {record.partition} {record.next_offset}\n")
                except kl.NotOwner as e:
                    out.write(f"rejected {e}\n")
                except kl.LockTimeout as e:
                    out.write(f"busy {e}\n")

    # SIGTERM cancels the consuming task at whatever await it is (which loses nothing),
    # then the member closes: the sync groupmember.py's stop() and close().
    consuming = asyncio.create_task(consume())
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consuming.cancel)
    out.write(f"joined {member.member_id}\n")
    try:
        await consuming
    except asyncio.CancelledError:
        pass
    await member.close()
    ticking.cancel()
    out.write(f"gap {gap:.3f}\n")
    out.write("left\n")


if __name__ == "__main__":
    asyncio.run(main())
