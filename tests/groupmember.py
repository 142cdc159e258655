"""A consumer group member for the tests: ``python groupmember.py ROOT GROUP TOPICS OUT [options]``.

Writes one line per message to OUT: ``m TIME TOPIC PARTITION OFFSET VALUE`` (TIME: the
system-wide monotonic clock, so lines of several processes can be ordered), and ``lost
TOPIC PARTITION WHY`` / ``rejected WHY`` lines.  SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

import kl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("group")
    parser.add_argument("topics")
    parser.add_argument("out")
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--session", type=float, default=3.0)
    parser.add_argument("--commit-every", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

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
    member.close()
    out.write("left\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
