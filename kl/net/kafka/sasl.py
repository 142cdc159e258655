"""SaslHandshake and SaslAuthenticate: SASL on the listeners whose security protocol is
SASL_PLAINTEXT or SASL_SSL, as Kafka's brokers authenticate (its SaslServerAuthenticator),
with the mechanisms PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (``ServeConfig.sasl_mechanisms``)
against the credentials kept in the root; the exchange and its rules are ``kl.net.sasl``'s.

Until a connection of such a listener has authenticated, only ApiVersions (once, before
the handshake), SaslHandshake and then SaslAuthenticate are taken: any other request
closes it, as Kafka's ILLEGAL_SASL_STATE does.  After a SaslHandshake v0 the client's
tokens come bare (an int32 size and the bytes), and so do the answers.  A failed
authentication is answered SASL_AUTHENTICATION_FAILED in Kafka's words, the same for an
unknown user as for a wrong password (an unknown user's exchange runs against a made-up
credential, so it takes as long), and the connection is closed once it is sent; the
failures from one host are answered later and later (``ServeConfig.failed_authentication_delay``), parked with the
server (no worker waits).  An exchange not done within the request timeout is cut.  On
other listeners, and once authenticated, both requests are answered ILLEGAL_SASL_STATE,
as Kafka's broker answers them there.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kl.net import sasl
from kl.net.kafka.api import Api
from kl.net.kafka.errors import ILLEGAL_SASL_STATE, NONE, SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM
from kl.net.server import Connection, Drop, Server, Wait

log = logging.getLogger("kl.serve")

SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TAKEN = {
    "handshake": (ApiVersionsRequest.API_KEY, SaslHandshakeRequest.API_KEY),
    "versions told": (SaslHandshakeRequest.API_KEY,),
    "authenticate": (SaslAuthenticateRequest.API_KEY,),
}
"""The requests a connection on a SASL listener takes at each stage before it is done."""


def failed_text(exchange: sasl.Exchange) -> str:
    """Kafka's words for a failed authentication: PLAIN's say why (its PlainSaslServer's),
    SCRAM's do not."""
    if exchange.why is not None:
        return exchange.why
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {exchange.mechanism}"


class Authenticator(sasl.Authenticator):
    """The SASL side of one Kafka listener (``kl.net.sasl``), with Kafka's stages before the exchange."""

    first_stage = "handshake"

    def __init__(self, server: Server):
        super().__init__(server, lambda conn: conn.security in SASL_PROTOCOLS)

    def admit(self, conn: Connection, key: int, version: int, api: Api | None) -> None:
        """Raises ``Drop`` for a request the connection's exchange does not take now.  (An
        ApiVersions of a version not served is answered, and another one may follow.)"""
        exchange = self.pending(conn)
        if exchange is None:
            return
        if key not in TAKEN.get(exchange.stage, ()):
            name = f"request type {key}" if api is None else api.request.name
            raise Drop(f"{name} during SASL authentication ({exchange.stage}): closed, as Kafka's ILLEGAL_SASL_STATE")
        if key == ApiVersionsRequest.API_KEY and api is not None and api.low <= version <= api.high:
            exchange.stage = "versions told"

    def bare(self, conn: Connection) -> bool:
        """Whether the connection's next request is a bare token (after a SaslHandshake v0)."""
        exchange = self._exchanges.get(conn)
        return exchange is not None and exchange.stage == "tokens"


def _authenticator(broker: Any) -> Authenticator:
    return broker.sasl


def sasl_handshake(broker: Any, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    auth = _authenticator(broker)
    exchange = auth.pending(conn)
    if exchange is None:
        return SaslHandshakeResponse(error_code=ILLEGAL_SASL_STATE, mechanisms=[])
    if request.mechanism not in auth.mechanisms:
        log.warning("%s: SASL mechanism %r is not enabled here (%s)", conn.peer, request.mechanism, ", ".join(auth.mechanisms))
        conn.hang_up = True
        return SaslHandshakeResponse(error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=auth.mechanisms)
    exchange.mechanism = request.mechanism
    exchange.stage = "authenticate" if version >= 1 else "tokens"
    return SaslHandshakeResponse(error_code=NONE, mechanisms=auth.mechanisms)


def sasl_authenticate(broker: Any, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    auth = _authenticator(broker)
    exchange = auth.pending(conn)
    if exchange is None:
        text = "SaslAuthenticate request received after successful authentication"  # Kafka's words
        return SaslAuthenticateResponse(error_code=ILLEGAL_SASL_STATE, error_message=text, auth_bytes=b"")
    if wait is not None:
        return auth.answer_failure(conn, exchange)
    token = auth.evaluate(conn, exchange, bytes(request.auth_bytes))
    if token is None:
        failed = SaslAuthenticateResponse(error_code=SASL_AUTHENTICATION_FAILED, error_message=failed_text(exchange))
        return auth.fail(conn, exchange, failed)
    return SaslAuthenticateResponse(error_code=NONE, error_message=None, auth_bytes=token, session_lifetime_ms=0)


def bare_token(broker: Any, conn: Connection, version: int, request: bytes, wait: Wait | None) -> None:
    """A token after a SaslHandshake v0: the server's token goes back as bare (a failure
    closes the connection, as Kafka's broker does)."""
    auth = _authenticator(broker)
    exchange = auth.pending(conn)
    assert exchange is not None
    if wait is not None:
        auth.answer_failure(conn, exchange)
    token = auth.evaluate(conn, exchange, request)
    if token is None:
        auth.fail(conn, exchange, None)
        return
    broker.server.queue(conn, memoryview(len(token).to_bytes(4, "big") + token))


BARE = Api(SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 0, bare_token)
"""How the front end answers a bare token (not a request of Kafka's, not advertised)."""

APIS = [
    Api(SaslHandshakeRequest, SaslHandshakeResponse, 0, 1, sasl_handshake),
    Api(SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2, sasl_authenticate),
]
