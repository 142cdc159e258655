"""Times and durations written as text: the one reader behind every option that takes one.

A **time** (``parse_time``) is milliseconds since the epoch, and can be written as

- milliseconds since the epoch, digits alone: ``1767225600000`` (ten or eleven digits,
  1970-01-12 to 1973-03-03, are refused as seconds by mistake: ``date +%s`` gives those);
- an ISO 8601 date, meaning its midnight: ``2026-01-31``; or a date and time:
  ``2026-01-31T14:30``, ``2026-01-31 14:30:05.250``, with a zone ``Z``, ``+01:00``,
  ``+0100`` or ``+01``.  Without a zone it is **local** time: the zone of the machine
  that reads it (``TZ``);
- ``now``; ``today`` or ``yesterday``: local midnight;
- a time ago or ahead, a sign and a duration: ``-1h``, ``-30m``, ``-2d``, ``-1h30m``,
  ``+15m``: now minus (plus) the duration.

A **duration** (``parse_duration``) is a count of milliseconds, written as units in
falling order, each at most once: ``2w``, ``2d``, ``12h``, ``90m``, ``1h30m``, ``45s``,
``500ms`` (``w`` d h m s ms); digits alone are milliseconds; or ISO 8601's ``P2D``,
``PT1H30M``, ``PT0.5S`` (as kafka-consumer-groups' ``--by-duration`` takes).  Letters
may be of either case.

The ISO 8601 forms are read here, not by ``datetime.fromisoformat``, so that Python 3.10
and 3.11+ (whose ``fromisoformat`` reads more) take exactly the same forms.
"""

from __future__ import annotations

import datetime
import re
import time

from kl.errors import InvalidTime
from kl.log.message import format_iso

__all__ = ["DURATION_FORMS", "TIME_FORMS", "format_iso", "parse_duration", "parse_time"]

TIME_FORMS = (
    "milliseconds since the epoch, an ISO 8601 date or date and time (local time unless it names a zone), "
    "now, today, yesterday, or a time ago such as -1h, -30m, -2d, -1h30m"
)
DURATION_FORMS = "a duration such as 2d, 12h, 90m, 1h30m, 45s, 500ms or PT1H30M"

SECONDS_LOOK = (10**9, 10**11)
"""Digits alone in this range are refused: as milliseconds they are 1970-01-12 to
1973-03-03, as seconds 2001 to 5138 (``date +%s`` gives them: it was meant as seconds)."""
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MS = datetime.timedelta(milliseconds=1)
_UNITS_MS = (604_800_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_DURATION = re.compile(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
_ISO_DURATION = re.compile(r"p(?:(\d+)d)?(?:t(?=\d)(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)(?:[.,](\d{1,3})\d*)?s)?)?")
_ISO_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[t ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,6})\d*)?)?"
    r"(z|([+-])(\d{2})(?::?(\d{2}))?)?)?"
)


def parse_time(text: str, *, now: float | None = None) -> int:
    """Milliseconds since the epoch that ``text`` names (see the module's forms);
    ``now`` (seconds since the epoch, default the clock) is what relative forms count
    from.  Raises ``InvalidTime`` naming the text and the forms."""
    value = text.strip().lower()
    clock = time.time() if now is None else now
    if value.isdigit() and value.isascii():
        ms = int(value)
        if SECONDS_LOOK[0] <= ms < SECONDS_LOOK[1]:
            raise InvalidTime(
                f"{text.strip()} reads as milliseconds since the epoch ({format_iso(ms)}), but looks like seconds: "
                f"give {ms}000, or an ISO 8601 time"
            )
        return ms
    if value == "now":
        return int(clock * 1000)
    if value in ("today", "yesterday"):
        day = datetime.datetime.fromtimestamp(clock).date() - datetime.timedelta(days=value == "yesterday")
        return _ms(datetime.datetime.combine(day, datetime.time()))
    if value[:1] in ("-", "+") and (ago := _units(value[1:], bare_ms=False)) is not None:
        return int(clock * 1000) + (ago if value[0] == "+" else -ago)
    found = _ISO_TIME.fullmatch(value)
    if found is None:
        raise InvalidTime(f"{text!r} is not a time: give {TIME_FORMS}")
    year, month, day_, hour, minute, second, fraction, zone, sign, zone_h, zone_m = found.groups()
    try:
        tz = None
        if zone == "z":
            tz = datetime.timezone.utc
        elif zone is not None:
            offset = datetime.timedelta(hours=int(zone_h), minutes=int(zone_m or 0))
            tz = datetime.timezone(-offset if sign == "-" else offset)
        when = datetime.datetime(
            int(year), int(month), int(day_), int(hour or 0), int(minute or 0), int(second or 0),
            int((fraction or "0").ljust(6, "0")), tzinfo=tz,
        )  # fmt: skip
        return _ms(when)
    except (ValueError, OverflowError) as e:
        raise InvalidTime(f"{text!r} is not a time ({e}): give {TIME_FORMS}") from None


def parse_duration(text: str) -> int:
    """The milliseconds of a duration (see the module's forms).  Raises ``InvalidTime``
    naming the text and the forms."""
    ms = _units(text.strip().lower())
    if ms is None:
        raise InvalidTime(f"{text!r} is not {DURATION_FORMS}")
    return ms


def _units(value: str, *, bare_ms: bool = True) -> int | None:
    """The milliseconds of a duration written in lower case (digits alone, with
    ``bare_ms``, as milliseconds), or None."""
    if value.isdigit() and value.isascii():
        return int(value) if bare_ms else None
    found = _DURATION.fullmatch(value)
    if found is not None and any(found.groups()):
        return sum(int(count or 0) * unit for count, unit in zip(found.groups(), _UNITS_MS, strict=True))
    found = _ISO_DURATION.fullmatch(value)
    if found is not None and any(found.groups()):
        days, hours, minutes, seconds = (int(part or 0) for part in found.groups()[:4])
        return (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000 + int((found[5] or "0").ljust(3, "0"))
    return None


def _ms(when: datetime.datetime) -> int:
    """Milliseconds since the epoch of ``when`` (local time when it has no zone)."""
    if when.tzinfo is None:
        when = when.astimezone()
    return (when - _EPOCH) // _MS
