"""SASL on either front end of ``kl serve``: the server's side of PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 (``ServeConfig.sasl_mechanisms``) against the credentials kept in the root
(``kl.net.credentials``; SCRAM's server side is scramp's).  (kl's client side is
``kl.net.wire``'s.)

The rules are Kafka's broker's (its SaslServerAuthenticator), the same on both ports: a
failed authentication is the same for an unknown user as for a wrong password (an
unknown user's exchange runs against a made-up credential, so it takes as long); the
failures from one host are answered later and later (``ServeConfig.failed_authentication_delay``), parked with the
server (no worker waits); an exchange not done within the request timeout is cut.  The
front ends frame the tokens: ``kl.net.kafka.sasl`` in SaslHandshake and SaslAuthenticate,
``kl.net.kafka07`` in kl's AUTHENTICATE.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import scramp

from kl.net import credentials
from kl.net.credentials import Credential, Credentials
from kl.net.server import Connection, Drop, Server, Wait

log = logging.getLogger("kl.serve")

MAX_FAILURE_DELAY = 8.0
"""The longest a failed authentication's answer waits (``ServeConfig.failed_authentication_delay``
the second from a host in a row, twice as long each further one)."""
DOUBLED_NONCE = "its final message does not carry the exchange's nonce (librdkafka before 2.6.1 repeats it): Kafka 4 refuses it"
FAILURES_FORGOTTEN = 300.0
"""A host's failures are forgotten once it has failed none for this long."""
MAX_HOSTS = 10_000
"""Hosts whose failures are remembered (past them, the longest quiet is forgotten)."""


@dataclass
class Exchange:
    """Where a connection is in its authentication."""

    stage: str = "authenticate"
    """The front end's stages, ending "done" (or "failed")."""
    mechanism: str = ""
    scram: Any = None
    """scramp's server, between the client's first message and its last."""
    user: str = ""
    known: bool = False
    credential: Credential | None = None
    """The user a SCRAM exchange names, whether it has a credential for its mechanism, and
    the credential (a made-up one for an unknown user)."""
    failed: Any = None
    """The answer of a failed authentication, sent once its delay is over."""
    why: str | None = None
    """Why a PLAIN authentication failed, in Kafka's words (its PlainSaslServer's)."""


class Authenticator:
    """The SASL side of one front end: each connection's exchange, each host's failures;
    ``required`` says which connections must authenticate, ``first_stage`` is where
    their exchange begins."""

    first_stage = "authenticate"

    def __init__(self, server: Server, required: Callable[[Connection], bool]):
        self.server = server
        self.required = required
        self.credentials = Credentials(server.root.path, server.root.lock_timeout)
        self._exchanges: dict[Connection, Exchange] = {}
        self._failures: dict[str, tuple[int, float]] = {}
        """host -> (failures in a row, when the last one was)."""
        self._lock = threading.Lock()
        self._secret = os.urandom(32)
        """Makes the salts of unknown users' made-up credentials (the same each time one is asked for)."""

    @property
    def mechanisms(self) -> list[str]:
        return list(self.server.config.sasl_mechanisms)

    def pending(self, conn: Connection) -> Exchange | None:
        """The exchange of a connection yet to authenticate (None: none is needed, or it is done)."""
        if not self.required(conn):
            return None
        exchange = self._exchanges.get(conn)
        if exchange is None:
            exchange = self._exchanges[conn] = Exchange(self.first_stage)
            conn.cut_at = time.monotonic() + self.server.config.request_timeout
        return None if exchange.stage == "done" else exchange

    def forget(self, conn: Connection) -> None:
        self._exchanges.pop(conn, None)

    # ----------------------------------------------------------------- the exchange

    def evaluate(self, conn: Connection, exchange: Exchange, token: bytes) -> bytes | None:
        """The server's token for the client's ``token``; None when authentication failed."""
        try:
            if exchange.mechanism == "PLAIN":
                return self._plain(conn, exchange, token)
            return self._scram(conn, exchange, token)
        except (scramp.ScramException, UnicodeDecodeError, ValueError, binascii.Error) as e:
            reason = getattr(e, "server_error", None) or type(e).__name__
            log.warning("%s: SASL %s authentication failed (%s)", conn.peer, exchange.mechanism, reason)
            return None

    def _plain(self, conn: Connection, exchange: Exchange, token: bytes) -> bytes | None:
        parts = token.decode("utf-8").split("\0")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            exchange.why = (
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
                if len(parts) != 3
                else f"Authentication failed: {'username' if not parts[1] else 'password'} not specified"
            )
            raise ValueError("not a PLAIN message")
        authorization, name, password = parts
        known = self.credentials.users().get(name, {})
        mechanism = next((m for m in credentials.MECHANISMS if m in known), credentials.MECHANISMS[0])
        credential = known.get(mechanism) or self._made_up(name, mechanism)
        matches = credentials.check_password(mechanism, credential, password)
        if not matches or not known:
            exchange.why = "Authentication failed: Invalid username or password"
            log.warning("%s: SASL PLAIN authentication failed (%s)", conn.peer, "unknown user" if not known else "wrong password")
            return None
        if authorization not in ("", name):
            exchange.why = "Authentication failed: Client requested an authorization id that is different from username"
            log.warning("%s: SASL PLAIN authentication failed (authorization id %r is not the user's)", conn.peer, authorization)
            return None
        self._done(conn, exchange, name)
        return b""

    def _scram(self, conn: Connection, exchange: Exchange, token: bytes) -> bytes | None:
        if exchange.scram is None:

            def credential(name: str) -> tuple[bytes, bytes, bytes, int]:
                known = self.credentials.get(name, exchange.mechanism)
                exchange.user, exchange.known = name, known is not None
                exchange.credential = known or self._made_up(name, exchange.mechanism)
                return exchange.credential.scramp()

            exchange.scram = scramp.ScramMechanism(exchange.mechanism).make_server(credential)
            exchange.scram.set_client_first(token.decode("utf-8"))
            return exchange.scram.get_server_first().encode()
        scram, exchange.scram = exchange.scram, None
        assert exchange.credential is not None
        final = token.decode("utf-8")
        signature = _client_final(exchange.mechanism, exchange.credential, scram, final)
        if not exchange.known:  # (a made-up credential has random keys: no proof matches them)
            log.warning("%s: SASL %s authentication failed (unknown user)", conn.peer, exchange.mechanism)
            return None
        if signature is None:
            why = "wrong password" if _nonce(final) == str(scram.nonce) else DOUBLED_NONCE
            log.warning("%s: SASL %s authentication failed (%s)", conn.peer, exchange.mechanism, why)
            return None
        self._done(conn, exchange, exchange.user)
        return b"v=" + base64.b64encode(signature)

    def _made_up(self, name: str, mechanism: str) -> Credential:
        """A credential no password matches, for an unknown user: the same salt each time."""
        salt = hmac.new(self._secret, f"{mechanism}\0{name}".encode(), hashlib.sha256).digest()[:16]
        size = hashlib.new(credentials.HASHES[mechanism]).digest_size
        return Credential(salt, credentials.DEFAULT_ITERATIONS, os.urandom(size), os.urandom(size))

    def _done(self, conn: Connection, exchange: Exchange, name: str) -> None:
        exchange.stage = "done"
        conn.principal = f"User:{name}"
        conn.cut_at = None
        log.info("%s: authenticated as %s (SASL %s)", conn.peer, conn.principal, exchange.mechanism)
        self.server.metrics.authentications.labels(self.server.listener_of(conn), exchange.mechanism).inc()

    def failure_delay(self, conn: Connection) -> float:
        """How long the answer to this failure waits: the host's failures in a row, counted."""
        host = conn.peer.rpartition(":")[0]
        now = time.monotonic()
        with self._lock:
            count, last = self._failures.pop(host, (0, now))
            count = 1 if now - last > FAILURES_FORGOTTEN else count + 1
            if len(self._failures) >= MAX_HOSTS:
                oldest = min(self._failures, key=lambda h: self._failures[h][1])
                del self._failures[oldest]
            self._failures[host] = (count, now)
        first = self.server.config.failed_authentication_delay
        return 0.0 if count < 2 else min(first * 2 ** (count - 2), MAX_FAILURE_DELAY)

    def fail(self, conn: Connection, exchange: Exchange, answer: Any) -> Any:
        """``answer`` (None: none, the connection is closed), now or once the host's delay is over."""
        exchange.stage = "failed"
        exchange.failed = answer
        conn.cut_at = None
        mechanism = exchange.mechanism if exchange.mechanism in self.server.config.sasl_mechanisms else "other"
        self.server.metrics.authentication_failures.labels(self.server.listener_of(conn), mechanism).inc()
        delay = self.failure_delay(conn)
        if delay > 0:
            self.server.park(conn, Wait([], 1, time.monotonic() + delay, None))
            return None
        return self.answer_failure(conn, exchange)

    def answer_failure(self, conn: Connection, exchange: Exchange) -> Any:
        if exchange.failed is None:
            raise Drop(f"SASL {exchange.mechanism} authentication failed")
        conn.hang_up = True
        return exchange.failed


def _client_final(mechanism: str, credential: Credential, scram: Any, final: str) -> bytes | None:
    """The server's signature once the client's final message proves it knows the password
    (RFC 5802), else None.  Its nonce must be the server's, as Kafka 4's broker checks it:
    librdkafka before 2.6.1 sends the client's part twice over, and is refused (the same
    answer as a wrong password, as Kafka's)."""
    without_proof, _, proof = final.rpartition(",p=")
    if not proof or _nonce(without_proof) is None:
        raise ValueError("not the exchange's final message")
    if _nonce(without_proof) != str(scram.nonce):
        return None
    digest = credentials.HASHES[mechanism]
    told = ",".join((str(scram.client_first_bare), str(scram.server_first), without_proof)).encode()
    signed = hmac.new(credential.stored_key, told, digest).digest()
    given = base64.b64decode(proof, validate=True)
    if len(given) != len(signed):
        return None
    client_key = bytes(a ^ b for a, b in zip(given, signed, strict=True))
    if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
        return None
    return hmac.new(credential.server_key, told, digest).digest()


def _nonce(message: str) -> str | None:
    """The nonce (``r=``) a SCRAM message carries."""
    fields = dict(field.split("=", 1) for field in message.split(",") if "=" in field)
    return fields.get("r")
