"""``kl.timespec``: the one reader of times and durations every command and option uses."""

from __future__ import annotations

import time

import pytest

import kl
from kl.log.message import MAX_TIMESTAMP, MIN_TIMESTAMP
from kl.timespec import DURATION_FORMS, TIME_FORMS, format_iso, parse_duration, parse_time

NOW = 1_767_225_600.0
"""2026-01-01T00:00:00Z, a Thursday, as seconds since the epoch."""
NOW_MS = int(NOW * 1000)
HOUR = 3_600_000
DAY = 24 * HOUR


@pytest.fixture
def new_york(monkeypatch):
    """Local time is five hours behind UTC (a POSIX TZ: no time zone data needed)."""
    monkeypatch.setenv("TZ", "EST5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    "text, ms",
    [
        ("1767225600000", NOW_MS),
        ("0", 0),
        ("2026-01-01T00:00:00Z", NOW_MS),
        ("2026-01-01t00:00z", NOW_MS),
        ("2026-01-01 00:00:00.250Z", NOW_MS + 250),
        ("2026-01-01T00:00:00,123456789Z", NOW_MS + 123),
        ("2026-01-01T01:00:00+01:00", NOW_MS),
        ("2026-01-01T01:00+0100", NOW_MS),
        ("2026-01-01T01:00+01", NOW_MS),
        ("2025-12-31T22:30:00-01:30", NOW_MS),
    ],
)
def test_epoch_milliseconds_and_iso_8601_with_a_zone(text, ms):
    assert parse_time(text) == ms


@pytest.mark.parametrize(
    "text, ms",
    [
        ("now", NOW_MS),
        ("NOW", NOW_MS),
        ("-1h", NOW_MS - HOUR),
        ("-30m", NOW_MS - 30 * 60_000),
        ("-2d", NOW_MS - 2 * DAY),
        ("-1h30m", NOW_MS - HOUR - 30 * 60_000),
        ("-1w", NOW_MS - 7 * DAY),
        ("-PT1H", NOW_MS - HOUR),
        ("+15m", NOW_MS + 15 * 60_000),
        (" -90s ", NOW_MS - 90_000),
    ],
)
def test_now_and_times_ago_or_ahead_count_from_now(text, ms):
    assert parse_time(text, now=NOW + 0.0004) == ms


def test_the_clock_is_now_by_default():
    before = time.time_ns() // 1_000_000
    assert before - HOUR - 1 <= parse_time("-1h") <= time.time_ns() // 1_000_000 - HOUR  # - 1: a float clock


def test_a_time_without_a_zone_is_local_time(new_york):
    assert parse_time("2026-01-01T00:00") == NOW_MS + 5 * HOUR
    assert parse_time("2026-01-01") == NOW_MS + 5 * HOUR
    assert parse_time("2026-01-01T00:00Z") == NOW_MS


def test_today_and_yesterday_are_local_midnight(new_york):
    noon_local = NOW + 17 * 3600  # 2026-01-01T12:00 local (17:00Z)
    assert parse_time("today", now=noon_local) == NOW_MS + 5 * HOUR
    assert parse_time("yesterday", now=noon_local) == NOW_MS + 5 * HOUR - DAY
    early = NOW + 3600  # 2026-01-01T01:00Z is still 2025-12-31 in New York
    assert parse_time("today", now=early) == NOW_MS + 5 * HOUR - DAY


@pytest.mark.parametrize(
    "text, reason",
    [
        ("noon", ""),
        ("", ""),
        ("-5000", ""),  # a time ago needs a unit: -5000 could be anything
        ("-1x", ""),
        ("1h", ""),  # a duration is not a time
        ("2026-1-1", ""),
        ("2026-02-30", " (day is out of range for month)"),
        ("2026-01-01T24:00", " (hour must be in 0..23)"),
        ("2026-01-01Z", ""),
        ("1.7e12", ""),
    ],
)
def test_a_bad_time_is_named_with_the_forms(text, reason):
    with pytest.raises(kl.InvalidTime) as caught:
        parse_time(text)
    assert str(caught.value) == f"{text!r} is not a time{reason}: give {TIME_FORMS}"
    assert isinstance(caught.value, kl.InvalidConfig)


@pytest.mark.parametrize(
    "text, ms",
    [
        ("2d", 2 * DAY),
        ("90m", 90 * 60_000),
        ("1h30m", 90 * 60_000),
        ("1m30s", 90_000),
        ("500ms", 500),
        ("1w2d", 9 * DAY),
        ("12H", 12 * HOUR),
        ("5000", 5000),
        ("0", 0),
        ("PT1H30M", 90 * 60_000),
        ("P2D", 2 * DAY),
        ("P1DT2H", 26 * HOUR),
        ("pt0.5s", 500),
    ],
)
def test_durations(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["7 days", "-1d", "1.5h", "d", "", "30m1h", "1h1h", "P", "PT", "P1DT", "now"])
def test_a_bad_duration_is_named_with_the_forms(text):
    with pytest.raises(kl.InvalidTime) as caught:
        parse_duration(text)
    assert str(caught.value) == f"{text!r} is not {DURATION_FORMS}"


@pytest.mark.parametrize(
    "ms, text",
    [
        (NOW_MS + 250, "2026-01-01T00:00:00.250Z"),
        (0, "1970-01-01T00:00:00.000Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (MIN_TIMESTAMP, "0001-01-01T00:00:00.000Z"),
        (MAX_TIMESTAMP, "9999-12-31T23:59:59.999Z"),
        (10**18, "1000000000000000000"),  # past the year 9999: the digits
    ],
)
def test_format_iso_is_utc_with_milliseconds_and_reads_back(ms, text):
    assert format_iso(ms) == text
    if ms < 10**18:
        assert parse_time(text) == ms
