"""TLS for ``kl serve``'s listeners whose security protocol is SSL or SASL_SSL.

``Tls`` holds the server's ``ssl.SSLContext`` (TLS 1.2 at least, the server's certificate
and key, the CAs that sign client certificates and whether one is asked for, as Kafka's
``ssl.client.auth``), made again by ``reload`` (SIGHUP: new connections get the new
certificates, open ones go on with theirs).  A client certificate names the connection's
principal: ``User:`` and its subject's distinguished name (RFC 2253), or what Kafka's
``ssl.principal.mapping.rules`` make of it (``PrincipalRules``).
"""

from __future__ import annotations

import re
import ssl
from typing import Any

from kl.errors import KlError

CLIENT_AUTH = ("none", "requested", "required")
"""Kafka's ``ssl.client.auth``: whether a client certificate is asked for, and needed."""
RECORD_HANDSHAKE = 0x16
"""The first byte of a TLS record that carries a handshake (a ClientHello)."""

_VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
"""RFC 2253's attribute keywords, by the names ``SSLSocket.getpeercert`` gives."""


class TlsError(KlError):
    """TLS cannot be set up as asked (a certificate or key missing, unreadable, not a pair)."""


class PrincipalRules:
    """Kafka's ``ssl.principal.mapping.rules``: ``RULE:pattern/replacement/[LU]`` and
    ``DEFAULT``, separated by commas; the first rule whose pattern matches the whole
    distinguished name gives the name (``$1``... its groups, L/U: lower or upper case)."""

    _RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)"
    _SPLIT = re.compile(r"\s*(" + _RULE + r")\s*(?:[,\n]\s*|$)")

    def __init__(self, text: str = "DEFAULT"):
        self.rules: list[tuple[re.Pattern[str], str, str] | None] = []
        """Each rule: (pattern, replacement, case) or None for DEFAULT."""
        pos, text = 0, text.strip()
        while pos < len(text):
            m = self._SPLIT.match(text, pos)
            if m is None or m.end() == pos:
                raise TlsError(f"bad principal mapping rule at {text[pos:]!r} (RULE:pattern/replacement/[LU] or DEFAULT)")
            pos = m.end()
            if m.group(2):
                self.rules.append(None)
                continue
            try:
                pattern = re.compile(m.group(3))
            except re.error as e:
                raise TlsError(f"bad pattern in principal mapping rule {m.group(1)!r}: {e}") from None
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(4))
            self.rules.append((pattern, replacement, m.group(5)))
        if not self.rules:
            raise TlsError("no principal mapping rule given")

    def name(self, dn: str) -> str | None:
        """The principal's name the first matching rule gives (None: no rule matched)."""
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, replacement, case = rule
            if pattern.fullmatch(dn):
                name = pattern.sub(replacement, dn)
                return name.lower() if case == "L" else name.upper() if case == "U" else name
        return None


def distinguished_name(cert: dict[str, Any]) -> str:
    """The certificate's subject as RFC 2253 writes it (as Java's ``X500Principal`` does,
    most specific first: ``CN=alice,O=Example,C=US``)."""
    rdns = []
    for rdn in reversed(cert.get("subject", ())):
        rdns.append("+".join(f"{_KEYWORDS.get(key, key)}={_escaped(value)}" for key, value in rdn))
    return ",".join(rdns)


def _escaped(value: str) -> str:
    value = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if value.startswith(("#", " ")):
        value = "\\" + value
    if value.endswith(" ") and len(value) > 1:
        value = value[:-1] + "\\ "
    return value


def client_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """The client side of TLS for kl's own clients of ``kl serve --tls``: the server's
    certificate checked against ``ca`` (None: the system's CAs) and its host name, and a
    client certificate and its key (mTLS) when given.  Raises ``TlsError`` in one line."""
    _readable(("CA file", ca), ("certificate", cert), ("key", key))
    try:
        context = ssl.create_default_context(cafile=ca)
    except ssl.SSLError as e:
        raise TlsError(f"cannot use the TLS CA file {ca}: not PEM certificates ({e.reason or e})") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None or key is not None:
        if cert is None:
            raise TlsError("a client key needs its certificate")
        _load_pair(context, cert, key)
    return context


def _readable(*paths: tuple[str, str | None]) -> None:
    for name, path in paths:
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise TlsError(f"cannot read the TLS {name} {path}: {e.strerror or e}") from None


def _load_pair(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as e:
        mismatch = "KEY_VALUES_MISMATCH" in str(e)
        reason = "the key does not match the certificate" if mismatch else "not a PEM certificate and its private key"
        raise TlsError(f"cannot use the TLS certificate {cert} with key {key}: {reason}") from None


class Tls:
    """The server side of TLS: the context new connections are wrapped in, and what
    their client certificates make of their principal."""

    def __init__(self, cert: str, key: str, ca: str | None = None, client_auth: str = "none", rules: str | None = None):
        if client_auth not in CLIENT_AUTH:
            raise TlsError(f"client auth must be one of {', '.join(CLIENT_AUTH)}, not {client_auth!r}")
        if client_auth != "none" and ca is None:
            raise TlsError(f"client auth {client_auth} needs a CA file (--tls-ca) to check client certificates with")
        self.cert, self.key, self.ca, self.client_auth = cert, key, ca, client_auth
        self.rules = PrincipalRules(rules or "DEFAULT")
        self.context = self._context()

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _readable(("certificate", self.cert), ("key", self.key), ("CA file", self.ca))
        _load_pair(context, self.cert, self.key)
        if self.ca is not None:
            try:
                context.load_verify_locations(cafile=self.ca)
            except ssl.SSLError as e:
                raise TlsError(f"cannot use the TLS CA file {self.ca}: not PEM certificates ({e.reason or e})") from None
        context.verify_mode = _VERIFY[self.client_auth]
        return context

    def reload(self) -> None:
        """Read the certificates, key and CAs again: new connections use them (raises
        ``TlsError`` and keeps the old ones when they are not usable)."""
        self.context = self._context()

    def wrap(self, sock: Any) -> ssl.SSLSocket:
        """The accepted socket as the server side of a TLS connection, its handshake to do."""
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)

    def principal(self, sock: ssl.SSLSocket) -> str | None:
        """The principal the client's certificate names (``User:ANONYMOUS`` without one;
        None when no mapping rule matches, which Kafka refuses)."""
        cert = sock.getpeercert()
        if not cert:
            return "User:ANONYMOUS"
        name = self.rules.name(distinguished_name(cert))
        return None if name is None else f"User:{name}"
