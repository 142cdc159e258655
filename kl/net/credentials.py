"""The users ``kl serve`` authenticates on its SASL listeners, and their SCRAM credentials,
kept in the root::

    ROOT/.users/credentials.json    {"users": {NAME: {MECHANISM: CREDENTIAL}}}

A credential is what Kafka's brokers keep (RFC 5802): the salt, the iteration count, the
stored key and the server key, never the password (nor the salted password it is
derived from); one per SCRAM mechanism the user has (``MECHANISMS``).  SASL/PLAIN is
checked against the same credential: the password given is salted with its salt and
iterations and its stored key compared (``check_password``).  The file is replaced whole
(``write_atomic``), mode 0600 in a directory of mode 0700, changed under a lock
(``ROOT/.locks/users.lock``) by ``kl users`` and by Kafka's admin clients
(AlterUserScramCredentials); daemons read it again when it changed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import unicodedata
from dataclasses import dataclass
from typing import Any

import scramp

from kl.errors import KlError
from kl.net.kept import Kept

USERS_DIR = ".users"
CREDENTIALS_FILE = "credentials.json"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
"""Kafka's bounds on a credential's iterations (its controller refuses more)."""
DEFAULT_ITERATIONS = 4096
MAX_NAME = 255


class CredentialError(KlError):
    """A user name, mechanism, iteration count or password that cannot be kept, or a user
    or credential that is not there."""


@dataclass(frozen=True)
class Credential:
    """One user's SCRAM credential for one mechanism."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def scramp(self) -> tuple[bytes, bytes, bytes, int]:
        """As scramp's servers take it (``auth_fn``)."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def check_name(name: str) -> str:
    """``name`` if it can name a user: 1 to 255 characters, none of them a control character."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or any(unicodedata.category(c) == "Cc" for c in name):
        raise CredentialError(f"invalid user name {name!r}: use 1-{MAX_NAME} characters, no control characters")
    return name


def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r}: use one of {', '.join(MECHANISMS)}")
    return mechanism


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {iterations}")
    return iterations


def make_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> Credential:
    """A new credential for ``password`` (a random salt unless given)."""
    check_iterations(iterations)
    if not password:
        raise CredentialError("the password is empty")
    try:
        made = scramp.ScramMechanism(check_mechanism(mechanism)).make_auth_info(password, iteration_count=iterations, salt=salt)
    except scramp.ScramException as e:
        raise CredentialError(f"the password cannot be used: {e}") from None
    salt, stored_key, server_key, count = made
    return Credential(salt, count, stored_key, server_key)


def from_salted(mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> Credential:
    """The credential of a password a client salted itself (AlterUserScramCredentials, as
    Kafka's controller derives it)."""
    digest = HASHES[check_mechanism(mechanism)]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return Credential(salt, check_iterations(iterations), hashlib.new(digest, client_key).digest(), server_key)


def check_password(mechanism: str, credential: Credential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (SASL/PLAIN): salted
    with its salt and iterations, the stored keys compared in constant time."""
    try:
        made = make_credential(mechanism, password, credential.iterations, credential.salt)
    except CredentialError:
        return False
    return hmac.compare_digest(made.stored_key, credential.stored_key)


class Credentials:
    """The credentials kept under one root."""

    def __init__(self, root: str, lock_timeout: float = 10.0):
        self.root = root
        self._kept = Kept(root, USERS_DIR, CREDENTIALS_FILE, _parsed, _encoded_users, dict, CredentialError,
                          lock_timeout=lock_timeout)  # fmt: skip
        self.path = self._kept.path

    def users(self) -> dict[str, dict[str, Credential]]:
        """Every user's credentials, by name and mechanism (read again once the file changed)."""
        return self._kept.get()

    def get(self, name: str, mechanism: str) -> Credential | None:
        return self.users().get(name, {}).get(mechanism)

    def add(self, name: str, password: str, mechanism: str = MECHANISMS[0], iterations: int = DEFAULT_ITERATIONS) -> None:
        """Give user ``name`` (new, or not) a credential for ``mechanism`` made from ``password``."""
        self.set(name, mechanism, make_credential(mechanism, password, iterations))

    def set(self, name: str, mechanism: str, credential: Credential) -> None:
        check_name(name)
        check_mechanism(mechanism)
        with self.changing() as users:
            users.setdefault(name, {})[mechanism] = credential

    def remove(self, name: str, mechanism: str | None = None) -> None:
        """Remove user ``name``'s credential for ``mechanism`` (None: all of them, the user)."""
        with self.changing() as users:
            if name not in users or (mechanism is not None and mechanism not in users[name]):
                what = f"user {name!r}" if mechanism is None or name not in users else f"a {mechanism} credential of {name!r}"
                raise CredentialError(f"there is no {what}")
            if mechanism is None:
                del users[name]
            else:
                del users[name][mechanism]
                if not users[name]:
                    del users[name]

    def changing(self) -> contextlib.AbstractContextManager[dict[str, dict[str, Credential]]]:
        """The users, read under the lock, to change in the ``with`` block: written back at its end."""
        return self._kept.changing()


def _parsed(data: Any) -> dict[str, dict[str, Credential]]:
    return {
        name: {
            mechanism: Credential(
                base64.b64decode(c["salt"]),
                int(c["iterations"]),
                base64.b64decode(c["stored_key"]),
                base64.b64decode(c["server_key"]),
            )  # fmt: skip
            for mechanism, c in kept.items()
            if mechanism in MECHANISMS
        }
        for name, kept in data["users"].items()
    }


def _encoded_users(users: dict[str, dict[str, Credential]]) -> Any:
    return {
        "users": {name: {mechanism: _encoded(c) for mechanism, c in sorted(kept.items())} for name, kept in sorted(users.items())}
    }


def _encoded(c: Credential) -> dict[str, object]:
    b64 = base64.b64encode
    return {"salt": b64(c.salt).decode(), "iterations": c.iterations, "stored_key": b64(c.stored_key).decode(),
            "server_key": b64(c.server_key).decode()}  # fmt: skip
