"""DescribeAcls, CreateAcls and DeleteAcls: the ACLs kept in the root (``kl.net.acls``),
as ``kafka-acls`` and Kafka's admin clients manage them.  Listing needs DESCRIBE on the
cluster, changing ALTER, as in Kafka.  A daemon without ``--acls`` answers as a Kafka
broker without an authorizer: SECURITY_DISABLED, for the request or for each of its
creations and filters (kafka-acls prints "Security features are disabled.")."""

from __future__ import annotations

import collections
import logging
from typing import Any

from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)

from kl.errors import KlError
from kl.net.acls import OPERATIONS, PATTERN_TYPES, PERMISSIONS, RESOURCE_TYPES, Acl, AclError, AclFilter
from kl.net.kafka.api import Api
from kl.net.kafka.broker import DENIED, Broker
from kl.net.kafka.errors import CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST, NONE, SECURITY_DISABLED, code_of
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

NO_AUTHORIZER = "No Authorizer is configured on the broker"
NO_AUTHORIZER_TO_DELETE = "No Authorizer is configured."
"""Kafka's words (the oracle's kafka-acls shows them)."""
NAMES = {
    "resource type": {code: name for name, code in RESOURCE_TYPES.items()},
    "pattern type": {code: name for name, code in PATTERN_TYPES.items()},
    "operation": {code: name for name, code in OPERATIONS.items()},
    "permission type": {code: name for name, code in PERMISSIONS.items()},
}


def describe_acls(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answer = DescribeAclsResponse
    if broker.authorizer is None:
        return answer(throttle_time_ms=0, error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER, resources=[])
    if not broker.allows_cluster(conn, "DESCRIBE"):
        return answer(
            throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, error_message=DENIED["CLUSTER"][1], resources=[]
        )
    try:
        found = broker.authorizer.acls.find(_filter(request))
    except KlError as e:
        return answer(throttle_time_ms=0, error_code=_code(e), error_message=str(e), resources=[])
    by_resource: dict[tuple[str, str, str], list[Acl]] = collections.defaultdict(list)
    for acl in found:
        by_resource[acl.resource_type, acl.name, acl.pattern].append(acl)
    resource = answer.DescribeAclsResource
    entry = resource.AclDescription
    resources = [
        resource(
            resource_type=RESOURCE_TYPES[kind],
            resource_name=name,
            pattern_type=PATTERN_TYPES[pattern],
            acls=[
                entry(
                    principal=a.principal,
                    host=a.host,
                    operation=OPERATIONS[a.operation],
                    permission_type=PERMISSIONS[a.permission],
                )
                for a in acls
            ],
        )
        for (kind, name, pattern), acls in by_resource.items()
    ]
    return answer(throttle_time_ms=0, error_code=NONE, error_message=None, resources=resources)


def create_acls(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = CreateAclsResponse.AclCreationResult
    refused = _refused(broker, conn, NO_AUTHORIZER)
    if refused is not None:
        return CreateAclsResponse(
            throttle_time_ms=0, results=[result(error_code=refused[0], error_message=refused[1]) for _ in request.creations]
        )
    results: list[tuple[int, str | None]] = []
    valid = []
    for c in request.creations:
        try:
            valid.append(
                Acl(
                    _name("resource type", c.resource_type),
                    c.resource_name or "",
                    _name("pattern type", c.resource_pattern_type),
                    c.principal or "",
                    c.host or "",
                    _name("operation", c.operation),
                    _name("permission type", c.permission_type),
                )
            )
            results.append((NONE, None))
        except AclError as e:
            results.append((INVALID_REQUEST, str(e)))
    if valid:
        try:
            broker.authorizer.acls.add(valid)  # type: ignore[union-attr]
        except KlError as e:
            log.warning("%s: ACLs not added: %s", conn.peer, e)
            results = [(code, text) if code else (code_of(e), str(e)) for code, text in results]
        else:
            broker.authorizer.changed()  # type: ignore[union-attr]
            log.info("%s: %s added %s", conn.peer, conn.principal, "; ".join(str(a) for a in valid))
    return CreateAclsResponse(throttle_time_ms=0, results=[result(error_code=c, error_message=t) for c, t in results])


def delete_acls(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answer = DeleteAclsResponse
    result = answer.DeleteAclsFilterResult
    matching = result.DeleteAclsMatchingAcl
    refused = _refused(broker, conn, NO_AUTHORIZER_TO_DELETE)
    if refused is not None:
        results = [result(error_code=refused[0], error_message=refused[1], matching_acls=[]) for _ in request.filters]
        return answer(throttle_time_ms=0, filter_results=results)
    filters: list[AclFilter | AclError] = []
    for f in request.filters:
        try:
            filters.append(_filter(f))
        except AclError as e:
            filters.append(e)
    valid = [f for f in filters if isinstance(f, AclFilter)]
    try:
        removed = iter(broker.authorizer.acls.remove(valid) if valid else [])  # type: ignore[union-attr]
    except KlError as e:
        log.warning("%s: ACLs not removed: %s", conn.peer, e)
        failed = [result(error_code=code_of(e), error_message=str(e), matching_acls=[]) for _ in request.filters]
        return answer(throttle_time_ms=0, filter_results=failed)
    broker.authorizer.changed()  # type: ignore[union-attr]
    results = []
    for f in filters:
        if isinstance(f, AclError):
            results.append(result(error_code=INVALID_REQUEST, error_message=str(f), matching_acls=[]))
            continue
        gone = next(removed)
        if gone:
            log.info("%s: %s removed %s", conn.peer, conn.principal, "; ".join(str(a) for a in gone))
        found = [
            matching(
                error_code=NONE,
                error_message=None,
                resource_type=RESOURCE_TYPES[a.resource_type],
                resource_name=a.name,
                pattern_type=PATTERN_TYPES[a.pattern],
                principal=a.principal,
                host=a.host,
                operation=OPERATIONS[a.operation],
                permission_type=PERMISSIONS[a.permission],
            )
            for a in gone
        ]
        results.append(result(error_code=NONE, error_message=None, matching_acls=found))
    return answer(throttle_time_ms=0, filter_results=results)


def _refused(broker: Broker, conn: Connection, no_authorizer: str) -> tuple[int, str] | None:
    """Why an ACL change is refused (None: it is not)."""
    if broker.authorizer is None:
        return SECURITY_DISABLED, no_authorizer
    if not broker.allows_cluster(conn, "ALTER"):
        return CLUSTER_AUTHORIZATION_FAILED, DENIED["CLUSTER"][1]
    return None


def _filter(f: Any) -> AclFilter:
    """A DescribeAcls request's or a DeleteAcls filter's ``AclFilter``."""
    return AclFilter(
        _name("resource type", f.resource_type_filter),
        f.resource_name_filter,
        _name("pattern type", f.pattern_type_filter),
        f.principal_filter,
        f.host_filter,
        _name("operation", f.operation),
        _name("permission type", f.permission_type),
    )


def _name(what: str, code: int) -> str:
    name = NAMES[what].get(code)
    if name is None:
        raise AclError(f"Invalid {what} {code}")
    return name


def _code(error: KlError) -> int:
    return INVALID_REQUEST if isinstance(error, AclError) else code_of(error)


APIS = [
    Api(DescribeAclsRequest, DescribeAclsResponse, 1, 3, describe_acls),
    Api(CreateAclsRequest, CreateAclsResponse, 1, 3, create_acls),
    Api(DeleteAclsRequest, DeleteAclsResponse, 1, 3, delete_acls),
]
