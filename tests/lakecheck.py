"""What readers of a ``kl load`` output directory see, checked against what
``kl.Consumer`` reads: pyarrow and DuckDB, every message exactly once, never a partial
file (shared by the tests of ``kl load`` on ``local[*]`` and on a Spark cluster)."""

from __future__ import annotations

import collections
from pathlib import Path

import duckdb
import pyarrow.dataset as ds

import kl
from kl.spark import journal

from conftest import read_all


def expected(root: kl.Root, topics: list[str], upto: dict[tuple[str, int], int] | None = None) -> collections.Counter:
    """(topic, partition, offset, value) of every message kl.Consumer reads (below ``upto``)."""
    out: collections.Counter = collections.Counter()
    for topic in topics:
        for p in range(root.config(topic).partitions):
            for msg in read_all(root, topic, p):
                if upto is None or msg.offset < upto.get((topic, p), 0):
                    out[(topic, p, msg.offset, msg.value)] += 1
    return out


def with_pyarrow(out: Path) -> collections.Counter:
    """Every row of every file under ``out`` (each file read whole: a partial one fails)."""
    if not list(out.glob("**/*.parquet")):
        return collections.Counter()
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    rows = zip(
        table["topic"].to_pylist(),
        table["partition"].to_pylist(),
        table["offset"].to_pylist(),
        table["value"].to_pylist(),
        strict=True,
    )
    return collections.Counter((t, p, o, v if isinstance(v, bytes) else v.encode()) for t, p, o, v in rows)


def with_duckdb(out: Path) -> collections.Counter:
    if not list(out.glob("**/*.parquet")):
        return collections.Counter()
    query = f"""select topic, partition, "offset", value from read_parquet('{out}/**/*.parquet', hive_partitioning=true)"""
    return collections.Counter(
        (t, p, o, v if isinstance(v, bytes) else v.encode()) for t, p, o, v in duckdb.connect().execute(query).fetchall()
    )


def assert_loaded(out: Path, want: collections.Counter) -> None:
    """Both readers see exactly ``want``: every message once."""
    assert max(want.values(), default=1) == 1
    for got in (with_pyarrow(out), with_duckdb(out)):
        assert max(got.values(), default=1) == 1, "a message is there twice"
        assert got == want


def assert_consistent(out: Path, root: kl.Root, topics: list[str]) -> None:
    """What a reader sees at any moment: whole files, each message at most once, each a message of the topics."""
    real = expected(root, topics)
    for got in (with_pyarrow(out), with_duckdb(out)):
        assert max(got.values(), default=1) == 1, "a message is there twice"
        assert not got - real


def committed(out: Path) -> dict[tuple[str, int], int]:
    return {k: c.offset for k, c in journal.Journal(out).committed()[1].items()}
