"""Kafka's access control lists: who may do what to which topic, group, transactional id
or the cluster, kept in the root and shared by every daemon over it::

    ROOT/.acls/acls.json    {"acls": [{"resource_type": "TOPIC", "name": "orders",
                                       "pattern": "LITERAL", "principal": "User:alice",
                                       "host": "*", "operation": "READ",
                                       "permission": "ALLOW"}, ...]}

An ``Acl`` is Kafka's binding: a resource pattern (a type, a name and LITERAL or PREFIXED;
the literal name ``*`` is every resource of its type), a principal (``User:NAME``, or
``User:*`` for everyone), a host (the client's IP address, or ``*``), an operation and
ALLOW or DENY.  ``Authorizer`` decides as Kafka's StandardAuthorizer does: super users
may do anything; otherwise a DENY that matches wins, then an ALLOW that matches; no match
is a denial.  An ALLOW of READ, WRITE, DELETE or ALTER implies DESCRIBE, one of
ALTER_CONFIGS implies DESCRIBE_CONFIGS (a DENY implies nothing), and ALL is every
operation.  ``AclFilter`` selects bindings as Kafka's AclBindingFilter does (for
``kafka-acls --list`` and ``--remove``).

The file is changed under a lock by ``kl acls`` and by Kafka's admin clients
(CreateAcls, DeleteAcls); a daemon reads it again within ``RECHECK_SECONDS`` of a change
made elsewhere (at once for its own).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from kl.errors import KlError
from kl.net.kept import Kept
from kl.net.repeats import Repeats, more

log = logging.getLogger("kl.serve")

ACLS_DIR = ".acls"
ACLS_FILE = "acls.json"
RECHECK_SECONDS = 1.0
DENIAL_LOG_SECONDS = 60.0
"""A denial of the same principal, host, operation and resource is logged once in this
long (with the count of those not logged)."""
CLUSTER_NAME = "kafka-cluster"
"""The one name of the cluster resource, as Kafka's."""
WILDCARD = "*"

RESOURCE_TYPES = {"ANY": 1, "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5, "DELEGATION_TOKEN": 6, "USER": 7}
PATTERN_TYPES = {"ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {
    "ANY": 1, "ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8,
    "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11, "IDEMPOTENT_WRITE": 12,
    "CREATE_TOKENS": 13, "DESCRIBE_TOKENS": 14,
}  # fmt: skip
PERMISSIONS = {"ANY": 1, "DENY": 2, "ALLOW": 3}
"""Kafka's names and codes (ResourceType, PatternType, AclOperation, AclPermissionType);
ANY and MATCH are for filters only."""

IMPLIES = {
    "DESCRIBE": {"DESCRIBE", "READ", "WRITE", "DELETE", "ALTER"},
    "DESCRIBE_CONFIGS": {"DESCRIBE_CONFIGS", "ALTER_CONFIGS"},
}
"""The ALLOWed operations that grant an operation besides itself."""
SUPPORTED = {
    "TOPIC": ("READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "GROUP": ("READ", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "CLUSTER": ("CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"),
    "TRANSACTIONAL_ID": ("WRITE", "DESCRIBE"),
    "DELEGATION_TOKEN": ("DESCRIBE",),
    "USER": ("CREATE_TOKENS", "DESCRIBE_TOKENS"),
}
"""The operations that apply to each resource type (Kafka's AclEntry.supportedOperations):
the bits of an "authorized operations" answer."""


class AclError(KlError):
    """An ACL or a filter that is not valid (Kafka's INVALID_REQUEST)."""


class AclsDamaged(KlError):
    """The ACL file cannot be read as ACLs."""


@dataclass(frozen=True, order=True)
class Acl:
    """One of Kafka's ACL bindings, its enums by name."""

    resource_type: str
    name: str
    pattern: str
    principal: str
    host: str
    operation: str
    permission: str

    def __post_init__(self) -> None:
        _check(self.resource_type, RESOURCE_TYPES, "resource type", filter_only=("ANY",))
        _check(self.pattern, PATTERN_TYPES, "pattern type", filter_only=("ANY", "MATCH"))
        _check(self.operation, OPERATIONS, "operation", filter_only=("ANY",))
        _check(self.permission, PERMISSIONS, "permission type", filter_only=("ANY",))
        if not self.name:
            raise AclError("Invalid empty resource name")
        if self.resource_type == "CLUSTER" and self.name != CLUSTER_NAME:
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        check_principal(self.principal)
        check_host(self.host)

    def __str__(self) -> str:
        return (
            f"{self.permission} {self.principal} {self.operation} on {self.resource_type.title()}:{self.pattern}:"
            f"{self.name} from host {self.host}"
        )

    def covers(self, name: str) -> bool:
        """Whether this binding's resource pattern takes in the resource ``name`` (of its type)."""
        if self.pattern == "PREFIXED":
            return name.startswith(self.name)
        return self.name in (name, WILDCARD)


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: None (or ANY) matches every value of its field; the
    pattern type MATCH matches every binding that would apply to the resource named."""

    resource_type: str = "ANY"
    name: str | None = None
    pattern: str = "ANY"
    principal: str | None = None
    host: str | None = None
    operation: str = "ANY"
    permission: str = "ANY"

    def __post_init__(self) -> None:
        _check(self.resource_type, RESOURCE_TYPES, "resource type")
        _check(self.pattern, PATTERN_TYPES, "pattern type")
        _check(self.operation, OPERATIONS, "operation")
        _check(self.permission, PERMISSIONS, "permission type")

    def matches(self, acl: Acl) -> bool:
        return (
            self.resource_type in ("ANY", acl.resource_type)
            and self._matches_pattern(acl)
            and self.principal in (None, acl.principal)
            and self.host in (None, acl.host)
            and self.operation in ("ANY", acl.operation)
            and self.permission in ("ANY", acl.permission)
        )

    def _matches_pattern(self, acl: Acl) -> bool:
        if self.pattern not in ("ANY", "MATCH", acl.pattern):
            return False
        if self.name is None:
            return True
        if self.pattern in ("ANY", acl.pattern):
            return self.name == acl.name
        return acl.covers(self.name)


def _check(value: str, known: dict[str, int], what: str, filter_only: tuple[str, ...] = ()) -> None:
    if value not in known or value in filter_only:
        raise AclError(f"Invalid {what} {value}")


def check_principal(principal: str) -> str:
    """A principal as Kafka writes one, ``TYPE:NAME`` (``User:alice``)."""
    kind, colon, name = principal.partition(":")
    if not colon or not kind:
        raise AclError(f"expected a string in format principalType:principalName but got {principal}")
    return principal


def check_host(host: str) -> str:
    """``*`` or an IP address (the client's, as its connection comes from)."""
    if host != WILDCARD:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise AclError(f"an ACL's host must be {WILDCARD} or an IP address, not {host!r}") from None
    return host


class Acls:
    """The ACLs kept under one root."""

    def __init__(self, root: str, lock_timeout: float = 10.0):
        self._kept = Kept(root, ACLS_DIR, ACLS_FILE, _parsed, _encoded, list, AclsDamaged, lock_timeout=lock_timeout)
        self.path = self._kept.path

    def all(self) -> list[Acl]:
        """Every ACL, in order (read again once the file changed)."""
        return self._kept.get()

    def add(self, acls: list[Acl]) -> None:
        """Add the bindings (one already kept is kept once)."""
        with self._kept.changing() as kept:
            kept[:] = sorted(set(kept) | set(acls))

    def remove(self, filters: list[AclFilter]) -> list[list[Acl]]:
        """Remove every binding a filter matches; what each filter matched."""
        with self._kept.changing() as kept:
            matched = [[acl for acl in kept if f.matches(acl)] for f in filters]
            gone = {acl for found in matched for acl in found}
            kept[:] = [acl for acl in kept if acl not in gone]
        return matched

    def find(self, acl_filter: AclFilter) -> list[Acl]:
        return [acl for acl in self.all() if acl_filter.matches(acl)]


def _parsed(data: Any) -> list[Acl]:
    try:
        return sorted(Acl(**{field: str(value) for field, value in acl.items()}) for acl in data["acls"])
    except AclError as e:
        raise ValueError(str(e)) from None


def _encoded(acls: list[Acl]) -> Any:
    return {"acls": [asdict(acl) for acl in acls]}


@dataclass(frozen=True)
class Decision:
    """An authorization's outcome and why: the binding that decided it (None: a super
    user's, or no binding matched)."""

    allowed: bool
    acl: Acl | None = None

    def __str__(self) -> str:
        if self.acl is not None:
            return f"by ACL {self.acl}"
        return "as a super user" if self.allowed else "no ACL allows it"


SUPER_USER = Decision(True)
NO_MATCH = Decision(False)


class Authorizer:
    """Decides, as Kafka's StandardAuthorizer, over the ACLs of ``acls`` (re-read at most
    every ``RECHECK_SECONDS``), with ``super_users`` (principals) allowed everything."""

    def __init__(self, acls: Acls, super_users: tuple[str, ...] = ()):
        self.acls = acls
        self.super_users = frozenset(check_principal(p) for p in super_users)
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._seen: list[Acl] | None = None
        self._by_type: dict[str, list[Acl]] = {}
        self._decided: dict[tuple[str, str, str, str, str], Decision] = {}
        self._unreadable: str | None = None
        self._denials = Repeats(DENIAL_LOG_SECONDS)

    def allows(
        self, who: str, principal: str, host: str, operation: str, resource_type: str, name: str, *, logged: bool = True
    ) -> bool:
        """``authorize``'s answer; a denial is logged (naming ``who``, the connection),
        unless not ``logged`` (a listing that leaves out what may not be seen)."""
        decision = self.authorize(principal, host, operation, resource_type, name)
        if not decision.allowed and logged:
            self._log_denial(who, (principal, host, operation, resource_type, name), decision)
        return decision.allowed

    def _log_denial(self, who: str, key: tuple[str, str, str, str, str], decision: Decision) -> None:
        untold = self._denials.due(key)
        if untold is None:
            return
        principal, _, operation, resource_type, name = key
        kind = resource_type.lower()
        log.warning("%s: %s denied %s on %s %r: %s%s", who, principal, operation, kind, name, decision, more(untold))

    def authorize(self, principal: str, host: str, operation: str, resource_type: str, name: str) -> Decision:
        """May ``principal``, connected from ``host``, do ``operation`` on the resource?"""
        if principal in self.super_users:
            return SUPER_USER
        key = (principal, host, operation, resource_type, name)
        by_type, decided = self._current()
        found = decided.get(key)
        if found is None:
            found = decided[key] = _decide(by_type.get(resource_type, ()), principal, host, operation, name)
        return found

    def authorize_any(self, principal: str, host: str, operation: str, resource_type: str) -> bool:
        """Whether some resource of the type may have ``operation`` done to it (Kafka's
        authorizeByResourceType: an ALLOW that matches, unless a DENY of every resource
        of the type, the literal ``*``, matches too)."""
        if principal in self.super_users:
            return True
        by_type, _ = self._current()
        kept = by_type.get(resource_type, ())
        everything = _decide(
            [a for a in kept if a.name == WILDCARD and a.pattern == "LITERAL"], principal, host, operation, WILDCARD
        )
        if everything.acl is not None and not everything.allowed:
            return False
        return any(a.permission == "ALLOW" and _applies(a, principal, host, operation) for a in kept)

    def operations(self, principal: str, host: str, resource_type: str, name: str) -> set[int]:
        """The codes of the operations on the resource the principal may do (of those that apply to it)."""
        return {
            OPERATIONS[op] for op in SUPPORTED[resource_type] if self.authorize(principal, host, op, resource_type, name).allowed
        }

    def _current(self) -> tuple[dict[str, list[Acl]], dict[tuple[str, str, str, str, str], Decision]]:
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= RECHECK_SECONDS:
                self._checked = now
                self._reload()
            if len(self._decided) > 100_000:
                self._decided = {}
            return self._by_type, self._decided

    def _reload(self) -> None:
        """Take the ACLs as kept now; while they cannot be read, none (fail closed:
        nothing is allowed but to the super users)."""
        try:
            kept = self.acls.all()
        except KlError as e:
            if self._unreadable is None:
                log.error("the ACLs cannot be read, so nothing is allowed but to super users: %s", e)
            self._unreadable = str(e)
            kept = []
        else:
            if self._unreadable is not None:
                log.warning("the ACLs can be read again (%d of them)", len(kept))
            self._unreadable = None
        if kept is not self._seen:
            self._seen = kept
            self._by_type = {}
            for acl in kept:
                self._by_type.setdefault(acl.resource_type, []).append(acl)
            self._decided = {}

    def changed(self) -> None:
        """The ACLs were just changed through this daemon: read them again at the next decision."""
        with self._lock:
            self._checked = float("-inf")


def _applies(acl: Acl, principal: str, host: str, operation: str) -> bool:
    """Whether the binding speaks of this principal, host and operation (as Kafka's
    ``findResult``: implied operations for ALLOW bindings only)."""
    if acl.principal not in (principal, "User:*") or acl.host not in (WILDCARD, host):
        return False
    if acl.operation == "ALL" or acl.operation == operation:
        return True
    return acl.permission == "ALLOW" and acl.operation in IMPLIES.get(operation, ())


def _decide(acls: Any, principal: str, host: str, operation: str, name: str) -> Decision:
    allow = None
    for acl in acls:
        if acl.covers(name) and _applies(acl, principal, host, operation):
            if acl.permission == "DENY":
                return Decision(False, acl)
            allow = allow or acl
    return Decision(True, allow) if allow is not None else NO_MATCH
