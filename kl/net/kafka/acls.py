"""DescribeAcls, CreateAcls and DeleteAcls, answered as a Kafka broker without an
authorizer answers them: SECURITY_DISABLED, for the request or for each of its creations
and filters (kafka-acls prints "Security features are disabled.").  ``kl serve`` has no
authentication yet, so there is no principal an ACL could name."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)

from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker
from kl.net.kafka.errors import SECURITY_DISABLED
from kl.net.server import Connection, Wait

NO_AUTHORIZER = "No Authorizer is configured on the broker"
NO_AUTHORIZER_TO_DELETE = "No Authorizer is configured."
"""Kafka's words (the oracle's kafka-acls shows them)."""


def describe_acls(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    return DescribeAclsResponse(throttle_time_ms=0, error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER, resources=[])


def create_acls(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = CreateAclsResponse.AclCreationResult
    results = [result(error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER) for _ in request.creations]
    return CreateAclsResponse(throttle_time_ms=0, results=results)


def delete_acls(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = DeleteAclsResponse.DeleteAclsFilterResult
    results = [result(error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER_TO_DELETE, matching_acls=[])
               for _ in request.filters]  # fmt: skip
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)


APIS = [
    Api(DescribeAclsRequest, DescribeAclsResponse, 1, 3, describe_acls),
    Api(CreateAclsRequest, CreateAclsResponse, 1, 3, create_acls),
    Api(DeleteAclsRequest, DeleteAclsResponse, 1, 3, delete_acls),
]
