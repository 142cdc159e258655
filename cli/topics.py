"""``kl topics create|alter|list|describe|delete|import``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator

import click

import kl
from kl.log import kafka_config
from kl.log.config import FORMATS, PARTITIONERS
from kl.log.importer import import_topic
from kl_cli import complete
from kl_cli.common import DURATION, F, aligned, connection, get_root, note, print_line, server_option

CONFIG_OPTIONS = [
    ("--partitions", "partitions", "Number of partitions."),
    ("--segment-bytes", "segment_bytes", "Roll to a new segment file past this size."),
    ("--max-message-bytes", "max_message_bytes", "Largest message, header included."),
    ("--flush-messages", "flush_messages", "fsync after this many messages (0: off)."),
    ("--flush-ms", "flush_ms", "fsync after this long (a duration: 500ms, 2s, ...; 0: off)."),
    ("--retention-ms", "retention_ms", "Keep segments this long (a duration: 7d, 36h, ...; digits alone: ms)."),
    ("--retention-bytes", "retention_bytes", "Keep at most this many bytes per partition (0: no limit)."),
]
DURATIONS = {"flush_ms", "retention_ms"}
"""The settings that are times: given as durations (``kl.timespec.parse_duration``), kept in milliseconds."""
DEFAULTS = kl.TopicConfig()


def config_options(f: F) -> F:
    """One option per ``TopicConfig`` setting, each None unless given."""
    f = click.option(
        "--headers/--no-headers",
        "headers",
        default=None,
        help="Let the topic hold headers and null values (magic 3), which kl before them cannot read  "
        "[default: on for format kl, refused for 0.7].",
    )(f)
    f = click.option(
        "--partitioner",
        "partitioner",
        type=click.Choice(PARTITIONERS),
        help="How kl's producers give keys partitions: CRC-32 (librdkafka's default) or murmur2 (the Java "
        f"client's; kl before it refuses such a topic).  [default: {DEFAULTS.partitioner}]",
    )(f)
    f = click.option(
        "--format",
        "format",
        type=click.Choice(FORMATS),
        help=f"Store kl's messages (.kl) or Kafka 0.7's (.kafka: no keys, no timestamps).  [default: {DEFAULTS.format}]",
    )(f)
    for flag, name, text in reversed(CONFIG_OPTIONS):
        default = getattr(DEFAULTS, name)
        kind, metavar = (DURATION, "DURATION") if name in DURATIONS else (int, "N")
        f = click.option(flag, name, type=kind, metavar=metavar, help=f"{text}  [default: {default}]")(f)
    return f


def _kafka_configs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """``--config KEY=VALUE``s by Kafka's name; a ``*.ms`` value may be a duration (7d, 36h)."""
    configs: dict[str, str] = {}
    for given in values:
        key, equals, value = given.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key:
            raise click.BadParameter(f"{given!r} is not KEY=VALUE", ctx, param)
        if key in configs:
            raise click.BadParameter(f"{key} is given more than once", ctx, param)
        if key.endswith(".ms") and not value.lstrip("-").isdigit():
            value = str(DURATION.convert(value, param, ctx))
        configs[key] = value
    return configs


def config_option(what: str) -> Callable[[F], F]:
    return click.option(
        "--config",
        "configs",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_kafka_configs,
        help=f"{what} one of Kafka's topic configs by its name (retention.ms=7d, max.message.bytes=2000000, ...; "
        "see kl-topics(1)); repeatable.",
    )


def _with_configs(settings: dict[str, object], configs: dict[str, str]) -> dict[str, object]:
    """The settings given as options and as ``--config``s (kl's names), one way each."""
    from_configs = kafka_config.kl_settings(configs)
    both = sorted(name for name in from_configs if settings.get(name) is not None)
    if both:
        twice = ", ".join(f"--{name.replace('_', '-')} and --config {kafka_config.KAFKA_NAME[name]}" for name in both)
        raise click.UsageError(f"{twice} set the same setting: give one")
    return settings | from_configs


@click.group()
def topics() -> None:
    """Create, alter, list, describe and delete topics."""


@topics.command()
@click.argument("topic")
@config_options
@config_option("Set")
@click.option("--if-not-exists", is_flag=True, help="Exit 0, changing nothing, if TOPIC exists already.")
@click.pass_context
def create(ctx: click.Context, topic: str, configs: dict[str, str], if_not_exists: bool, **settings: int | str | None) -> None:
    """Create TOPIC with all its partitions."""
    config = kl.TopicConfig.with_overrides(**_with_configs(settings, configs))  # type: ignore[arg-type]
    root = get_root(ctx)
    try:
        config = root.create_topic(topic, config)
    except kl.TopicExists:
        if not if_not_exists:
            raise
        note(f"topic {topic} exists already: nothing changed")
        return
    note(f"created topic {topic} with {config.partitions} partition{'s' if config.partitions != 1 else ''}")


@topics.command()
@click.argument("topic")
@click.option("--partitions", "partitions", type=int, metavar="N", help="Grow to N partitions (never fewer).")
@click.option("--segment-bytes", "segment_bytes", type=int, metavar="N", help="Roll past this size (from the next append).")
@click.option("--max-message-bytes", "max_message_bytes", type=int, metavar="N", help="Largest message (never smaller).")
@click.option("--flush-messages", "flush_messages", type=int, metavar="N", help="fsync after this many messages (0: off).")
@click.option("--flush-ms", "flush_ms", type=DURATION, metavar="DURATION", help="fsync after this long (0: off).")
@click.option("--retention-ms", "retention_ms", type=DURATION, metavar="DURATION", help="Keep segments this long (7d, 36h, ...).")
@click.option("--retention-bytes", "retention_bytes", type=int, metavar="N", help="Keep at most this many bytes per partition.")
@click.option(
    "--headers",
    "headers",
    is_flag=True,
    default=None,
    help="Let the topic hold headers and null values from now on (never undone; kl before them then refuses the topic).",
)
@click.option(
    "--partitioner",
    "partitioner",
    type=click.Choice(PARTITIONERS),
    help="Partition keys with CRC-32 or murmur2 from now on (a key's later messages may go to another partition).",
)
@config_option("Change")
@click.pass_context
def alter(ctx: click.Context, topic: str, configs: dict[str, str], **settings: int | str | None) -> None:
    """Change settings of TOPIC; it keeps its data and its topic id.

    Producers, consumers and groups running take the change up without a restart.
    Added partitions start empty; keyed messages then hash over the new number of
    partitions (or with another --partitioner), so a key's later messages may go
    to another partition than its earlier ones (their order across the change is
    not kept).  The format cannot
    change, nor can partitions or --max-message-bytes go down, nor --headers be
    turned off.
    """
    changes = {name: value for name, value in _with_configs(settings, configs).items() if value is not None}
    if not changes and not configs:
        raise click.UsageError("nothing to change: give at least one setting (see --help)")
    root = get_root(ctx)
    old = root.config(topic)  # and with only configs kl has already (cleanup.policy=delete), that it exists
    root.alter_topic(topic, **changes)
    done = [f"{name} {getattr(old, name)} -> {value}" for name, value in changes.items() if getattr(old, name) != value]
    note(f"altered topic {topic}: {', '.join(done)}" if done else f"topic {topic} already has these settings")


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print, per topic, what topics describe --json prints (JSON lines).")
@server_option("List the topics")
@click.pass_context
def list_(ctx: click.Context, as_json: bool, server: str | None) -> None:
    """List the topics, one name a line (a table on a terminal).

    Only directories holding a topic.json are topics; on a terminal, what else is in
    the root is named below the table (kl recover reports it too).  With --server, the
    topics that daemon serves (kcat -L).
    """
    with _described(ctx, server) as (names, describe, strays):
        if as_json:
            for name in names:
                try:
                    obj = _info_json(describe(name))
                except kl.TopicNotFound:  # deleted since it was listed
                    continue
                except kl.KlError as e:
                    obj = {"topic": name, "error": str(e)}
                sys.stdout.write(json.dumps(obj) + "\n")
            return
        if not sys.stdout.isatty():
            sys.stdout.write("".join(name + "\n" for name in names))
            return
        from rich.console import Console
        from rich.table import Column, Table

        table = Table("topic", Column("partitions", justify="right"), Column("bytes", justify="right"), box=None)
        problems = [f"{name}: not a topic: {reason}" for name, reason in strays()]
        for name in names:
            try:
                info = describe(name)
            except kl.KlError as e:
                table.add_row(name, "?", "?")
                problems.append(f"{name}: {e}")
                continue
            table.add_row(name, str(len(info.partitions)), f"{info.size_in_bytes:,}")
        console = Console()
        console.print(table)
        for problem in problems:
            print_line(console, problem, "yellow")


@topics.command()
@click.argument("topic", shell_complete=complete.topics)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, on one line.")
@server_option("Describe it")
@click.pass_context
def describe(ctx: click.Context, topic: str, as_json: bool, server: str | None) -> None:
    """Print TOPIC's config and, per partition, its segments, offsets and bytes."""
    with _described(ctx, server) as (_, describe, _):
        info = describe(topic)
    if as_json:
        sys.stdout.write(json.dumps(_info_json(info)) + "\n")
        return
    config: dict[str, object] = _config(info.config)
    config["headers"] = str(config["headers"]).lower()
    kafka = {c.kl_name: f"{c.name}={c.value}" for c in kafka_config.kafka_configs(info.config)}
    settings = [["topic", info.name, ""]] + [[name, str(value), kafka.pop(name, "")] for name, value in config.items()]
    settings += [["", "", fixed] for fixed in kafka_config_lines(info.config)]
    header = [field.name for field in dataclasses.fields(kl.PartitionInfo)]
    rows = [header] + [[str(v) for v in dataclasses.astuple(p)] for p in info.partitions]
    lines = aligned(settings) + [""] + aligned(rows)
    sys.stdout.write("\n".join(lines) + "\n")


@contextlib.contextmanager
def _described(
    ctx: click.Context, server: str | None
) -> Iterator[tuple[list[str], Callable[[str], kl.TopicInfo], Callable[[], list[tuple[str, str]]]]]:
    """The topic names, a describe and the strays of the root, or of the daemon at
    ``server`` (which serves only its --topics, and has no strays to show)."""
    if server is None:
        root = get_root(ctx)
        yield root.topics(), root.describe, root.strays
        return
    from kl.net.remote import RemoteRoot  # here: listing a root does not load the client

    remote = RemoteRoot(server, **connection(ctx))
    try:
        yield remote.topics(), remote.describe, list
    finally:
        remote.close()


def _config(config: kl.TopicConfig) -> dict[str, object]:
    """A topic's settings, ``headers`` true or false."""
    return vars(config) | {"headers": config.holds_headers}  # its fields are plain values: asdict's copies cost more


def kafka_config_lines(config: kl.TopicConfig) -> list[str]:
    """``NAME=VALUE`` of the Kafka configs that are no setting of kl's (its fixed values)."""
    return [f"{c.name}={c.value}" for c in kafka_config.kafka_configs(config) if c.kl_name is None]


def _info_json(info: kl.TopicInfo) -> dict[str, object]:
    """``topics describe --json``'s object: topic, config, its Kafka configs, partitions."""
    return {
        "topic": info.name,
        "config": _config(info.config),
        "kafka_config": {c.name: c.value for c in kafka_config.kafka_configs(info.config)},
        "partitions": [dict(vars(p)) for p in info.partitions],
    }


@topics.command()
@click.argument("topic", shell_complete=complete.topics)
@click.pass_context
def delete(ctx: click.Context, topic: str) -> None:
    """Delete TOPIC and all its data."""
    get_root(ctx).delete_topic(topic)
    note(f"deleted topic {topic}")


@topics.command("import")
@click.argument("topic")
@click.argument("directories", nargs=-1, required=True, metavar="DIR...")
@config_options
@click.pass_context
def import_(ctx: click.Context, topic: str, directories: tuple[str, ...], **settings: int | str | None) -> None:
    """Bring existing segment files in as TOPIC's partitions 0, 1, ...

    Each DIR holds one partition's segment files, kl's (.kl) or Kafka 0.7's (.kafka).
    Every file is checked first; nothing changes when one cannot be adopted.  The
    files are copied (DIR is left as it is).  TOPIC is created when missing, with one
    partition per DIR, or --partitions N (the partitions past the DIRs empty, N no
    fewer than the DIRs); an existing TOPIC must have empty partitions (and keeps its
    settings, its format included).  With --format 0.7
    the topic keeps Kafka 0.7's format and appends go on in the imported .kafka files.
    """
    partitions = settings.get("partitions")
    if isinstance(partitions, int) and partitions < len(directories):
        raise click.BadParameter(
            f"{partitions} partition{'s' if partitions != 1 else ''} cannot hold {len(directories)} DIRs (one partition each)",
            ctx,
            param_hint="'--partitions'",
        )
    root = get_root(ctx)
    for done in import_topic(root, topic, list(directories), kl.TopicConfig.with_overrides(**settings)):
        sys.stdout.write(
            f"{topic}/{done.partition}: imported {done.source}: {done.segments} segment{'s' if done.segments != 1 else ''}, "
            f"offsets {done.log_start_offset} to {done.log_end_offset}\n"
        )
