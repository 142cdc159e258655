"""``kl serve --kafka`` in the test's own process, and a raw Kafka connection to it.

``InThread(root, "SASL_PLAINTEXT", **config)`` serves the root on one Kafka listener of
that security protocol (a free port on 127.0.0.1) from a thread until ``stop``; ``Raw``
sends kafka-python's request classes on a socket and decodes the answers, and logs in
with SASL/PLAIN (``login``).
"""

from __future__ import annotations

import socket
import struct
import threading

from kafka.protocol.metadata.api_versions import ApiVersionsResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse
from kafkafuzz import answers, framed

import kl
from kl.net import daemon
from kl.net.server import Listener, ServeConfig, Server


class InThread:
    """A server in this process with one Kafka listener of protocol ``security``."""

    def __init__(self, root: kl.Root, security: str = "PLAINTEXT", **config):
        config = {"port": None, "kafka_port": 0, "allow_produce": True, "auto_create": True, **config}
        self.server = Server(root, ServeConfig(**config), [Listener("127.0.0.1", 0, daemon._kafka, security)])
        self.address = ("127.0.0.1", self.server.ports[0])
        self.bootstrap = f"127.0.0.1:{self.server.ports[0]}"
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(20)
        assert not self.thread.is_alive()


class Raw:
    """A raw connection to a listener: one request, one answer."""

    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=20)
        self.correlation = 0
        self.last = b""
        """The last answer's bytes, as they came."""

    def call(self, request, version: int, response, **fields):
        self.correlation += 1
        self.sock.sendall(framed(request, version, self.correlation, **fields))
        self.last = self.answer()
        ((got, data),) = answers(self.last)
        assert got == self.correlation
        flexible = response.flexible_version_q(version) and response is not ApiVersionsResponse
        return response.decode(data[int(flexible) :], version=version)

    def answer(self) -> bytes:
        head = self.recv(4)
        return head + self.recv(struct.unpack(">i", head)[0])

    def recv(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    def closed(self) -> bool:
        """Whether the server closed the connection (it sends nothing more)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def handshake(self, mechanism: str, version: int = 1):
        return self.call(SaslHandshakeRequest, version, SaslHandshakeResponse, mechanism=mechanism)

    def authenticate(self, token: bytes, version: int = 2):
        return self.call(SaslAuthenticateRequest, version, SaslAuthenticateResponse, auth_bytes=token)

    def login(self, user: str, password: str) -> Raw:
        """Authenticate with SASL/PLAIN (it must succeed)."""
        assert self.handshake("PLAIN").error_code == 0
        assert self.authenticate(plain(user, password)).error_code == 0
        return self

    def close(self) -> None:
        self.sock.close()


def plain(user: str, password: str) -> bytes:
    return f"\0{user}\0{password}".encode()
