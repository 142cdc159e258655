"""``kl acls add|remove|list``: Kafka's ACLs kept in the root, which ``kl serve --acls``
enforces.  Named as ``kafka-acls`` names them (``--allow-principal User:alice --operation
Read --topic orders``); the work is ``kl.net.acls``'s.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

import click

from kl.net.acls import CLUSTER_NAME, OPERATIONS, WILDCARD, Acl, AclFilter, Acls
from kl_cli.common import F, get_root

OPERATION_NAMES = {name.replace("_", "").lower(): name for name in OPERATIONS if name != "ANY"}
"""Operations as kafka-acls takes them (Read, DescribeConfigs, IdempotentWrite...), in any case."""


@click.group()
def acls() -> None:
    """Add, remove and list the ACLs kl serve --acls enforces (Kafka's model)."""


def _acls(ctx: click.Context) -> Acls:
    root = get_root(ctx)
    return Acls(root.path, root.lock_timeout)


def _operation(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    found = []
    for op in value:
        name = OPERATION_NAMES.get(op.replace("_", "").replace("-", "").lower())
        if name is None:
            raise click.BadParameter(f"{op!r} is not one of {', '.join(sorted(OPERATION_NAMES))}", ctx, param)
        found.append(name)
    return tuple(found)


def resource_options(command: F) -> F:
    """The resource an ACL is for, as kafka-acls names it."""
    for option in reversed(
        [
            click.option("--topic", "topics", metavar="NAME", multiple=True, help="A topic ('*': every topic)."),
            click.option("--group", "groups", metavar="NAME", multiple=True, help="A consumer group ('*': every group)."),
            click.option("--transactional-id", "transactional_ids", metavar="ID", multiple=True, help="A transactional id."),
            click.option("--cluster", is_flag=True, help="The cluster (DescribeConfigs of brokers, creating topics, ACLs...)."),
            click.option(
                "--resource-pattern-type",
                "pattern",
                type=click.Choice(["literal", "prefixed", "any", "match"], case_sensitive=False),
                help="LITERAL: the name itself; PREFIXED: every name that begins with it (default: literal; "
                "list and remove: any).",
            ),
        ]
    ):
        command = option(command)
    return command


def _resources(
    topics: tuple[str, ...], groups: tuple[str, ...], transactional_ids: tuple[str, ...], cluster: bool
) -> list[tuple[str, str]]:
    return (
        [("TOPIC", t) for t in topics]
        + [("GROUP", g) for g in groups]
        + [("TRANSACTIONAL_ID", t) for t in transactional_ids]
        + ([("CLUSTER", CLUSTER_NAME)] if cluster else [])
    )


@acls.command(short_help="Allow or deny principals operations on resources.")
@click.option(
    "--allow-principal", "allowed", metavar="PRINCIPAL", multiple=True, help="A principal (User:NAME, User:*) to allow."
)
@click.option("--deny-principal", "denied", metavar="PRINCIPAL", multiple=True, help="A principal to deny (a denial wins).")
@click.option("--host", "hosts", metavar="IP", multiple=True, help="Only from this IP address (default: * , any host).")
@click.option(
    "--operation",
    "operations",
    metavar="OP",
    multiple=True,
    callback=_operation,
    required=True,
    help="Read, Write, Create, Delete, Alter, Describe, DescribeConfigs, AlterConfigs, IdempotentWrite, All...",
)
@resource_options
@click.pass_context
def add(
    ctx: click.Context,
    allowed: tuple[str, ...],
    denied: tuple[str, ...],
    hosts: tuple[str, ...],
    operations: tuple[str, ...],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    pattern: str | None,
) -> None:
    """Add an ACL for each principal, host, operation and resource given."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not resources:
        raise click.UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    if not allowed and not denied:
        raise click.UsageError("name a principal: --allow-principal or --deny-principal")
    kind = (pattern or "literal").upper()
    if kind not in ("LITERAL", "PREFIXED"):
        raise click.UsageError("an ACL's --resource-pattern-type is literal or prefixed")
    principals = [(p, "ALLOW") for p in allowed] + [(p, "DENY") for p in denied]
    made = [
        Acl(resource_type, name, kind, principal, host, operation, permission)
        for resource_type, name in resources
        for principal, permission in principals
        for host in hosts or (WILDCARD,)
        for operation in operations
    ]
    _acls(ctx).add(made)


@acls.command(short_help="Remove the ACLs that match.")
@click.option("--principal", metavar="PRINCIPAL", help="Only this principal's.")
@click.option("--host", metavar="IP", help="Only those for this host.")
@click.option("--operation", "operations", metavar="OP", multiple=True, callback=_operation, help="Only those of this operation.")
@click.option(
    "--permission", type=click.Choice(["allow", "deny"], case_sensitive=False), help="Only the allowing or the denying."
)
@resource_options
@click.option("--all", "everything", is_flag=True, help="Every resource's (when no resource is named).")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON lines.")
@click.pass_context
def remove(
    ctx: click.Context,
    principal: str | None,
    host: str | None,
    operations: tuple[str, ...],
    permission: str | None,
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    pattern: str | None,
    everything: bool,
    as_json: bool,
) -> None:
    """Remove every ACL that matches what is given (Kafka's AclBindingFilter); print them."""
    resources = _resources(topics, groups, transactional_ids, cluster)
    if not resources and not everything:
        raise click.UsageError("name a resource (--topic, --group, --transactional-id, --cluster) or give --all")
    filters = _filters(resources, pattern, principal, host, operations, permission)
    removed = _acls(ctx).remove(filters)
    _print(sorted({acl for found in removed for acl in found}), as_json)


@acls.command("list", short_help="List the ACLs.")
@click.option("--principal", metavar="PRINCIPAL", help="Only this principal's.")
@resource_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object a line.")
@click.pass_context
def list_(
    ctx: click.Context,
    principal: str | None,
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    transactional_ids: tuple[str, ...],
    cluster: bool,
    pattern: str | None,
    as_json: bool,
) -> None:
    """List the ACLs (those of the resources and the principal given): resource type,
    name, pattern type, principal, host, operation, permission."""
    store = _acls(ctx)
    filters = _filters(_resources(topics, groups, transactional_ids, cluster), pattern, principal, None, (), None)
    _print(sorted({acl for f in filters for acl in store.find(f)}), as_json)


def _filters(
    resources: list[tuple[str, str]],
    pattern: str | None,
    principal: str | None,
    host: str | None,
    operations: tuple[str, ...],
    permission: str | None,
) -> list[AclFilter]:
    """The filters of a remove or a list: one for each resource and operation given."""
    common: dict[str, Any] = {
        "pattern": (pattern or "any").upper(),
        "principal": principal,
        "host": host,
        "permission": (permission or "any").upper(),
    }
    named = resources or [("ANY", None)]
    return [AclFilter(kind, name, operation=op, **common) for kind, name in named for op in operations or ("ANY",)]


def _print(found: list[Acl], as_json: bool) -> None:
    for acl in found:
        if as_json:
            sys.stdout.write(json.dumps(asdict(acl)) + "\n")
        else:
            fields = (acl.resource_type, acl.name, acl.pattern, acl.principal, acl.host, acl.operation, acl.permission)
            sys.stdout.write("\t".join(fields) + "\n")
