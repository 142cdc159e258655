"""DescribeUserScramCredentials and AlterUserScramCredentials: the users ``kl serve``'s
SASL listeners authenticate (``kl.net.credentials``), from Kafka's admin clients and
tools (``kafka-configs --entity-type users``), with the rules of Kafka's controller.

An alteration's upsertions carry the password salted by the client (never the
password): the stored and server keys are derived from it, as Kafka's controller
derives them.  Alterations are refused unless the daemon was started with
``--allow-admin``; those of one request are written at once, or none are.
DescribeClientQuotas is answered with no quotas (kl has none): kafka-configs describes a
user's quotas with its credentials.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest, DescribeClientQuotasResponse
from kafka.protocol.admin.users import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)

from kl.errors import KlError
from kl.net import credentials
from kl.net.credentials import Credential, CredentialError, Credentials
from kl.net.kafka.api import Api
from kl.net.kafka.broker import DENIED, Broker
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    DUPLICATE_RESOURCE,
    NONE,
    RESOURCE_NOT_FOUND,
    UNACCEPTABLE_CREDENTIAL,
    UNSUPPORTED_SASL_MECHANISM,
    Refused,
    code_of,
)
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

MECHANISM_TYPES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
"""Kafka's numbers for the SCRAM mechanisms (0 is UNKNOWN)."""
TYPES = {name: number for number, name in MECHANISM_TYPES.items()}


def describe_user_scram_credentials(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
    info = result.CredentialInfo
    if not broker.allows_cluster(conn, "DESCRIBE"):
        code, text = DENIED["CLUSTER"]
        return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=code, error_message=text, results=[])
    try:
        users = broker.sasl.credentials.users()
    except KlError as e:
        return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=code_of(e), error_message=str(e), results=[])
    asked = sorted(users) if not request.users else [u.name for u in request.users]
    counted = collections.Counter(asked)
    answers = []
    for name in dict.fromkeys(asked):
        if counted[name] > 1:
            text = f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}"  # Kafka's words
            answers.append(result(user=name, error_code=DUPLICATE_RESOURCE, error_message=text, credential_infos=[]))
        elif name not in users:
            text = f"Attempt to describe a user credential that does not exist: {name}"
            answers.append(result(user=name, error_code=RESOURCE_NOT_FOUND, error_message=text, credential_infos=[]))
        else:
            kept = [info(mechanism=TYPES[m], iterations=c.iterations) for m, c in sorted(users[name].items())]
            answers.append(result(user=name, error_code=NONE, error_message=None, credential_infos=kept))
    return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=NONE, error_message=None, results=answers)


def alter_user_scram_credentials(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult
    names = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    if not broker.allows_cluster(conn, "ALTER"):
        text = DENIED["CLUSTER"][1]
        results = [result(user=n, error_code=CLUSTER_AUTHORIZATION_FAILED, error_message=text) for n in dict.fromkeys(names)]
        return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
    if not broker.server.config.allow_admin:
        text = "changes to users are off on this server (kl serve --allow-admin)"
        results = [result(user=n, error_code=CLUSTER_AUTHORIZATION_FAILED, error_message=text) for n in dict.fromkeys(names)]
        return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
    errors: dict[str, Refused] = {}
    for name, n in collections.Counter(names).items():
        if n > 1:
            errors[name] = Refused(DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    store: Credentials = broker.sasl.credentials
    deleted: dict[str, str] = {}
    upserted: dict[str, tuple[str, Credential]] = {}
    try:
        with store.changing() as users:
            for d in request.deletions:
                if d.name not in errors:
                    try:
                        mechanism = _checked(d.name, d.mechanism)
                        if mechanism not in users.get(d.name, {}):
                            raise Refused(RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
                        deleted[d.name] = mechanism
                    except Refused as e:
                        errors[d.name] = e
            for u in request.upsertions:
                if u.name not in errors:
                    try:
                        upserted[u.name] = (_checked(u.name, u.mechanism), _credential(u))
                    except Refused as e:
                        errors[u.name] = e
            for name, mechanism in deleted.items():
                del users[name][mechanism]
                if not users[name]:
                    del users[name]
            for name, (mechanism, credential) in upserted.items():
                users.setdefault(name, {})[mechanism] = credential
    except KlError as e:
        log.warning("%s: SCRAM credentials not altered: %s", conn.peer, e)
        results = [result(user=n, error_code=code_of(e), error_message=str(e)) for n in dict.fromkeys(names)]
        return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
    results = [result(user=n, error_code=NONE, error_message=None) for n in [*deleted, *upserted]]
    results += [result(user=n, error_code=e.code, error_message=str(e)) for n, e in errors.items()]
    for name, mechanism in deleted.items():
        log.info("%s: removed the %s credential of user %s", conn.peer, mechanism, name)
    for name, (mechanism, _) in upserted.items():
        log.info("%s: set the %s credential of user %s", conn.peer, mechanism, name)
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)


def _checked(name: str, mechanism: int) -> str:
    """The mechanism's name, once the user name and it are acceptable (Kafka's checks)."""
    if not name:
        raise Refused(UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    try:
        credentials.check_name(name)
    except CredentialError as e:
        raise Refused(UNACCEPTABLE_CREDENTIAL, str(e)) from None
    if mechanism not in MECHANISM_TYPES:
        raise Refused(UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
    return MECHANISM_TYPES[mechanism]


def _credential(upsertion: Any) -> Credential:
    if upsertion.iterations < credentials.MIN_ITERATIONS:
        raise Refused(UNACCEPTABLE_CREDENTIAL, "Too few iterations")
    if upsertion.iterations > credentials.MAX_ITERATIONS:
        raise Refused(UNACCEPTABLE_CREDENTIAL, "Too many iterations")
    if not upsertion.salt or not upsertion.salted_password:
        raise Refused(UNACCEPTABLE_CREDENTIAL, "the salt and the salted password must not be empty")
    mechanism = MECHANISM_TYPES[upsertion.mechanism]
    return credentials.from_salted(mechanism, bytes(upsertion.salt), bytes(upsertion.salted_password), upsertion.iterations)


def describe_client_quotas(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if not broker.allows_cluster(conn, "DESCRIBE_CONFIGS"):
        text = DENIED["CLUSTER"][1]
        return DescribeClientQuotasResponse(
            throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, error_message=text, entries=None
        )
    return DescribeClientQuotasResponse(throttle_time_ms=0, error_code=NONE, error_message=None, entries=[])


APIS = [
    Api(DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse, 0, 0, describe_user_scram_credentials),
    Api(AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, 0, 0, alter_user_scram_credentials),
    Api(DescribeClientQuotasRequest, DescribeClientQuotasResponse, 0, 1, describe_client_quotas),
]
