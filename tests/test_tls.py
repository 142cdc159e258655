"""TLS on ``kl serve``'s listeners (SSL, SASL_SSL): real clients over real sockets, with
certificates made by ``trustme``; client certificates and the principal they name; the
wrong protocol on either side; handshakes left half-done; SIGHUP's reload; garbage."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trustme
from kafka.protocol.metadata import MetadataRequest

import kl
from kl.net import wire
from kl.net.daemon import Daemon
from kl.net.remote import RemoteRoot
from kl.net.server import FILES_PER_CONNECTION, Connection, ServeConfig, ServerError
from kl.net.tls import PrincipalRules, TlsError, distinguished_name

from conftest import write

KL = [sys.executable, "-m", "kl_cli"]
KCAT = "/usr/bin/kcat"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def pems(tmp_path: Path, ca: trustme.CA) -> dict[str, str]:
    """The CA's certificate, the server's certificate and key (for 127.0.0.1), and a client's."""
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("alice@example.com", common_name="alice", organization_name="Example", organization_unit_name="Team")
    files = {"ca": ca.cert_pem, "cert": server.cert_chain_pems[0], "key": server.private_key_pem}
    files |= {"client_cert": client.cert_chain_pems[0], "client_key": client.private_key_pem}
    paths = {}
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
        paths[name] = str(tmp_path / f"{name}.pem")
    return paths


class Running:
    """A daemon in a thread of the test process: a plaintext Kafka port and an SSL listener."""

    def __init__(self, root: kl.Root, pems: dict[str, str], **config):
        tls = dict(tls_cert=pems["cert"], tls_key=pems["key"])
        config = tls | {"listeners": (("SSL", "127.0.0.1", 0),), "allow_produce": True} | config
        self.server = Daemon(root, ServeConfig(port=None, kafka_port=0, **config))
        self.plain = self.server.kafka_port
        self.tls = self.server.listener_ports[0]
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def running(root: kl.Root, pems: dict[str, str]):
    started: list[Running] = []

    root.create_topic("t")

    def start(**config) -> Running:
        started.append(Running(root, pems, **config))
        return started[-1]

    yield start
    for r in started:
        r.stop()


def client_context(pems: dict[str, str], *, cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pems["ca"])
    if cert:
        context.load_cert_chain(pems["client_cert"], pems["client_key"])
    return context


def metadata(sock: socket.socket) -> object:
    """A Metadata v1 request of all topics, and its answer decoded."""
    message = MetadataRequest[1](topics=None)
    message.with_header(correlation_id=1, client_id="test")
    sock.sendall(message.encode(header=True, framed=True))
    size = struct.unpack(">i", exactly(sock, 4))[0]
    from kl.net.kafka import frontend

    response = frontend._responses()[MetadataRequest.API_KEY]
    return response.decode(exactly(sock, size)[4:], version=1, header=False)


def exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def cut(sock: socket.socket) -> bool:
    """Whether the daemon closed the connection (a reset, when what it was sent was left unread)."""
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True


def tls_connect(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def logged(caplog: pytest.LogCaptureFixture, pattern: str, timeout: float = 10) -> list[str]:
    """The log lines of kl.serve matching ``pattern``, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r.getMessage() for r in caplog.records if re.search(pattern, r.getMessage())]
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no log line matches {pattern!r}: {[r.getMessage() for r in caplog.records]}")


# ----------------------------------------------------------------- the library


def test_principal_rules_as_kafka_reads_them():
    rules = PrincipalRules(r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=([^,]*),.*$/$1/U, DEFAULT")
    assert rules.name("CN=Kafka-Svc,OU=ServiceUsers,O=Unknown") == "kafka-svc"
    assert rules.name("CN=bob,O=Example") == "BOB"
    assert rules.name("O=Example") == "O=Example"
    assert PrincipalRules(r"RULE:^CN=(.*)$/$1/").name("O=x") is None
    with pytest.raises(TlsError, match="bad principal mapping rule"):
        PrincipalRules("RULE:^CN=(.*)$")


def test_distinguished_name_is_rfc2253_most_specific_first():
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "A, Inc."),), (("commonName", "#x"),))}
    assert distinguished_name(cert) == r"CN=\#x,O=A\, Inc.,C=US"


def test_bad_settings_are_one_line_errors(root, pems, tmp_path):
    listeners = (("SSL", "127.0.0.1", 0),)
    with pytest.raises(ServerError, match="needs a certificate"):
        ServeConfig(port=None, listeners=listeners)
    with pytest.raises(ServerError, match=r"cannot read the TLS certificate .*missing\.pem"):
        Daemon(root, ServeConfig(port=None, listeners=listeners, tls_cert=str(tmp_path / "missing.pem"), tls_key=pems["key"]))
    with pytest.raises(ServerError, match="the key does not match the certificate"):
        Daemon(root, ServeConfig(port=None, listeners=listeners, tls_cert=pems["cert"], tls_key=pems["client_key"]))
    tls = {"tls_cert": pems["cert"], "tls_key": pems["key"]}
    with pytest.raises(ServerError, match="needs a CA file"):
        Daemon(root, ServeConfig(port=None, listeners=listeners, tls_client_auth="required", **tls))


# ----------------------------------------------------------------- clients


def test_metadata_names_the_listener_the_connection_came_in_on(root, running, pems):
    r = running()
    with socket.create_connection(("127.0.0.1", r.plain), timeout=10) as plain:
        plain_brokers = metadata(plain).brokers
    with tls_connect(r.tls, client_context(pems)) as secure:
        tls_brokers = metadata(secure).brokers
    assert [(b.host, b.port) for b in plain_brokers] == [("127.0.0.1", r.plain)]
    assert [(b.host, b.port) for b in tls_brokers] == [("127.0.0.1", r.tls)]
    assert plain_brokers[0].node_id == tls_brokers[0].node_id  # one broker, two listeners


def confluent_round_trip(confluent_kafka, common: dict, values: list[bytes]) -> list[bytes]:
    """``values`` produced to topic t with confluent-kafka's ``common`` settings, then
    what a new group's consumer reads of it."""
    producer = confluent_kafka.Producer(common)
    for value in values:
        producer.produce("t", value=value)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(common | {"group.id": "g", "auto.offset.reset": "earliest"})
    consumer.subscribe(["t"])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(values) and time.monotonic() < deadline:
        m = consumer.poll(1)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    return got


def test_confluent_kafka_produces_and_consumes_over_tls(root, running, pems):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    r = running()
    common = {"bootstrap.servers": f"127.0.0.1:{r.tls}", "security.protocol": "SSL", "ssl.ca.location": pems["ca"]}
    values = [b"v%d" % n + b"x" * 1000 for n in range(200)]
    assert confluent_round_trip(confluent_kafka, common, values) == values
    assert [b.port for b in confluent_kafka.Producer(common).list_topics(timeout=10).brokers.values()] == [r.tls]
    assert kl.Consumer(root).latest_offset("t", 0) > 0


def test_kafka_python_reads_segment_bytes_through_tls(root, running, pems):
    from kafka import KafkaConsumer

    values = [os.urandom(3000) for _ in range(300)]  # ~1 MB: many TLS records, a socket that fills
    write(root, "t", values)
    r = running()
    consumer = KafkaConsumer(
        "t",
        bootstrap_servers=f"127.0.0.1:{r.tls}",
        security_protocol="SSL",
        ssl_cafile=pems["ca"],
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    got = [m.value for m in consumer]
    consumer.close()
    assert got == values


@pytest.mark.skipif(not os.path.exists(KCAT), reason="kcat is not installed")
def test_kcat_over_tls(root, running, pems):
    write(root, "t", [b"one", b"two"])
    r = running()
    tls = ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={pems['ca']}", "-b", f"127.0.0.1:{r.tls}"]
    out = subprocess.run([KCAT, *tls, "-C", "-t", "t", "-e", "-q"], capture_output=True, timeout=30, check=True)
    assert out.stdout.split() == [b"one", b"two"]
    listing = subprocess.run([KCAT, *tls, "-L", "-J"], capture_output=True, timeout=30, check=True)
    assert [b["name"] for b in json.loads(listing.stdout)["brokers"]] == [f"127.0.0.1:{r.tls}"]


# ----------------------------------------------------------------- client certificates


@pytest.fixture
def principals(monkeypatch) -> list[str]:
    """The principal of each connection a request comes on, as the Kafka front end sees it."""
    from kl.net.kafka import frontend

    seen: list[str] = []
    handle = frontend.Kafka.handle

    def handled(self, conn: Connection, request):
        seen.append(conn.principal)
        return handle(self, conn, request)

    monkeypatch.setattr(frontend.Kafka, "handle", handled)
    return seen


def test_required_client_certificate_names_the_principal(root, running, pems, principals):
    r = running(tls_ca=pems["ca"], tls_client_auth="required")
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):  # refused: no certificate
        with tls_connect(r.tls, client_context(pems)) as anonymous:
            metadata(anonymous)
    with tls_connect(r.tls, client_context(pems, cert=True)) as alice:
        metadata(alice)
    assert principals == ["User:CN=alice,OU=Team,O=Example"]


def test_mapping_rule_gives_the_principal_and_no_match_is_refused(root, running, pems, principals, caplog):
    caplog.set_level(logging.INFO, "kl.serve")
    r = running(tls_ca=pems["ca"], tls_client_auth="requested", tls_principal_rules=r"RULE:^CN=([^,]*),OU=Team,O=Example$/$1/U")
    with tls_connect(r.tls, client_context(pems, cert=True)) as alice:
        metadata(alice)
    assert principals == ["User:ALICE"]
    with tls_connect(r.tls, client_context(pems)) as anonymous:  # requested: none given is anonymous
        metadata(anonymous)
    assert principals == ["User:ALICE", "User:ANONYMOUS"]
    r.stop()
    r2 = running(tls_ca=pems["ca"], tls_client_auth="requested", tls_principal_rules=r"RULE:^CN=bob,.*$/bob/")
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError, OSError)):
        with tls_connect(r2.tls, client_context(pems, cert=True)) as alice:
            metadata(alice)
    logged(caplog, "no principal mapping rule matches")


# ----------------------------------------------------------------- the wrong protocol, half-done, garbage


def test_wrong_protocol_both_ways_is_one_log_line(root, running, pems, caplog):
    caplog.set_level(logging.INFO, "kl.serve")
    r = running()
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with tls_connect(r.plain, client_context(pems)) as s:
            metadata(s)
    assert len(logged(caplog, "a TLS client connected to a plaintext listener")) == 1
    with socket.create_connection(("127.0.0.1", r.tls), timeout=10) as plain:
        message = MetadataRequest[1](topics=None)
        message.with_header(correlation_id=1, client_id="test")
        plain.sendall(message.encode(header=True, framed=True))
        assert cut(plain)
    assert len(logged(caplog, "a plaintext client connected to a TLS listener")) == 1
    assert not [r for r in caplog.records if "bytes refused" in r.getMessage()]


def test_kafka07_port_over_tls_sends_segment_spans_through_tls(root, pems, caplog):
    caplog.set_level(logging.INFO, "kl.serve")
    root.create_topic("s", kl.TopicConfig(segment_bytes=4096, max_message_bytes=1024))
    with kl.Producer(root) as producer:
        for k in range(40):
            producer.send_batch("s", [b"%03d-%02d" % (k, i) * 40 for i in range(12)], partition=0)
    bases = [seg.base_offset for seg in root.log("s", 0).segments()]
    fetches = [wire.Fetch("s", 0, base, 1 << 20) for base in bases[::-1] + bases]
    assert len(fetches) > 2 * FILES_PER_CONNECTION
    local = kl.Consumer(root)
    config = ServeConfig(port=0, port_tls=True, tls_cert=pems["cert"], tls_key=pems["key"])
    server = Daemon(root, config)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as plain:
            plain.sendall(struct.pack(">ih", 2, 99))
            assert cut(plain)
        logged(caplog, "a plaintext client connected to a TLS listener")
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer waits, parked, on a full socket
        raw.settimeout(10)
        raw.connect(("127.0.0.1", server.port))
        with client_context(pems).wrap_socket(raw, server_hostname="127.0.0.1") as secure:
            secure.sendall(wire.request(wire.HELLO, wire.INT16.pack(wire.VERSION) + wire.string("tls")))
            size, code = wire.HEAD.unpack(exactly(secure, wire.HEAD.size))
            exactly(secure, size - 2)
            assert code == 0  # a kl client: kl's messages as they are
            secure.sendall(wire.request(wire.MULTIFETCH, wire.multifetch_body(fetches)))
            size, code = wire.HEAD.unpack(exactly(secure, wire.HEAD.size))
            reader = wire.Reader(exactly(secure, size - 2))
            got = []
            for _ in fetches:
                size, code = reader.unpack(wire.HEAD)
                got.append((code, bytes(reader.take(size - 2))))
        assert got == [(0, local.fetch("s", 0, f.offset, f.max_bytes).buffer) for f in fetches]
    finally:
        server.stop()
        thread.join(10)


def test_half_done_handshake_is_cut(root, running, pems, caplog):
    caplog.set_level(logging.INFO, "kl.serve")
    r = running(request_timeout=0.5)
    with socket.create_connection(("127.0.0.1", r.tls), timeout=10) as stalled:
        stalled.sendall(b"\x16\x03\x01")  # a record's start, and nothing more
        assert cut(stalled)
    logged(caplog, "TLS handshake not finished after 0.5 s")
    with tls_connect(r.tls, client_context(pems)) as fine:
        assert metadata(fine).brokers


def test_garbage_tls_records_leave_the_daemon_serving(root, running, pems):
    r = running()
    rng = random.Random(37)
    hello = bytearray()
    context = client_context(pems)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello += outgoing.read()
    for n in range(60):
        case = n % 4
        if case == 0:
            data = hello[: rng.randrange(1, len(hello))]  # truncated
        elif case == 1:
            data = bytes(b ^ (rng.randrange(256) if rng.random() < 0.05 else 0) for b in hello)  # corrupted
        elif case == 2:
            data = b"\x16\x03\x03" + struct.pack(">H", 0xFFFF) + os.urandom(rng.randrange(0, 300))  # a huge record
        else:
            data = b"\x16" + os.urandom(rng.randrange(1, 2000))
        with socket.create_connection(("127.0.0.1", r.tls), timeout=10) as s:
            with contextlib.suppress(OSError):  # a close or a reset, even before all was sent, is an answer too
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
    with tls_connect(r.tls, client_context(pems)) as fine:
        assert metadata(fine).brokers


# ----------------------------------------------------------------- SIGHUP


def test_sighup_reloads_certificates(tmp_path, ca, pems):
    root = tmp_path / "root"
    kl.Root(root).create_topic("t")
    log = tmp_path / "serve.log"
    cert, key = tmp_path / "live-cert.pem", tmp_path / "live-key.pem"
    Path(cert).write_bytes(Path(pems["cert"]).read_bytes())
    Path(key).write_bytes(Path(pems["key"]).read_bytes())
    args = ["--listener", "SSL://127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)]
    with open(log, "wb") as err:
        proc = subprocess.Popen([*KL, "--root", str(root), "serve", *args], stdin=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"to Kafka clients on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        port = int(found[1])
        old = tls_connect(port, client_context(pems))
        first = old.getpeercert()
        assert metadata(old).brokers
        other = trustme.CA()
        renewed = other.issue_cert("127.0.0.1")
        renewed.cert_chain_pems[0].write_to_path(str(cert))
        renewed.private_key_pem.write_to_path(str(key))
        other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
        proc.send_signal(signal.SIGHUP)
        while "TLS certificates reloaded" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with tls_connect(port, ssl.create_default_context(cafile=str(tmp_path / "other-ca.pem"))) as new:
            assert new.getpeercert() != first
            assert metadata(new).brokers
        with pytest.raises(ssl.SSLCertVerificationError):
            tls_connect(port, client_context(pems))
        assert metadata(old).brokers  # the open connection keeps its certificate
        old.close()
        Path(key).write_text("not a key")
        proc.send_signal(signal.SIGHUP)
        while "kept the TLS certificates in use" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with tls_connect(port, ssl.create_default_context(cafile=str(tmp_path / "other-ca.pem"))) as new:
            assert metadata(new).brokers
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, log.read_text()
    assert "BEGIN" not in log.read_text()  # no key logged


# ----------------------------------------------------------------- kl's own clients


def test_kl_remote_clients_over_tls(root, pems):
    root.create_topic("t")
    config = ServeConfig(port=0, port_tls=True, allow_produce=True, tls_cert=pems["cert"], tls_key=pems["key"])
    server = Daemon(root, config)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        remote = RemoteRoot(f"127.0.0.1:{server.port}", tls=client_context(pems))
        with kl.RemoteProducer(remote) as producer:
            producer.send_batch("t", [b"a" * 5000, b"b" * 5000], partition=0)
        with kl.RemoteConsumer(RemoteRoot(f"127.0.0.1:{server.port}", tls=client_context(pems))) as consumer:
            assert [m.value for m in consumer.fetch("t", 0, 0, 1 << 20)] == [b"a" * 5000, b"b" * 5000]
        with pytest.raises(wire.NetworkError, match="no TLS connection to 127.0.0.1"):
            RemoteRoot(f"127.0.0.1:{server.port}", tls=ssl.create_default_context()).topics()  # not its CA
    finally:
        server.stop()
        thread.join(10)


def test_cli_listener_forms_and_errors(tmp_path, pems):
    kl.Root(tmp_path / "root").create_topic("t")
    base = [*KL, "--root", str(tmp_path / "root"), "serve"]
    bad = subprocess.run([*base, "--listener", "TLS://127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not PROTOCOL://HOST:PORT" in bad.stderr
    keyless = subprocess.run([*base, "--listener", "SSL://127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert keyless.returncode == 1
    assert keyless.stderr.strip().splitlines() == [
        "Error: an SSL or SASL_SSL listener needs a certificate and its key (--tls-cert, --tls-key)"
    ]
    swapped = ["--listener", "ssl://127.0.0.1:0", "--tls-cert", pems["cert"], "--tls-key", pems["client_key"]]
    mismatch = subprocess.run([*base, *swapped], capture_output=True, text=True, timeout=60)
    assert mismatch.returncode == 1 and "the key does not match the certificate" in mismatch.stderr
    assert "PRIVATE KEY" not in mismatch.stderr


def test_sasl_over_tls_logs_in_and_serves_through_a_sasl_ssl_listener(root, running, pems):
    """SASL_SSL: the TLS handshake, then SCRAM inside it (confluent-kafka), and a wrong
    password refused there as on SASL_PLAINTEXT."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from kl.net.credentials import Credentials

    Credentials(root.path).add("alice", "alice's secret", "SCRAM-SHA-512")
    r = running(listeners=(("SASL_SSL", "127.0.0.1", 0),))
    common = {
        "bootstrap.servers": f"127.0.0.1:{r.tls}", "security.protocol": "SASL_SSL", "ssl.ca.location": pems["ca"],
        "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "alice's secret",
    }  # fmt: skip
    values = [b"s%d" % n for n in range(50)]
    assert confluent_round_trip(confluent_kafka, common, values) == values
    errors: list[object] = []
    wrong = confluent_kafka.Producer(common | {"sasl.password": "wrong", "error_cb": errors.append})
    wrong.produce("t", value=b"never")
    wrong.flush(5)
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors
    assert kl.Consumer(root).latest_offset("t", 0) > 0
    assert b"never" not in [m.value for b in kl.Consumer(root).consume("t") for m in b.messages]


def test_kl_cli_and_mirror_reach_a_tls_port_with_a_client_certificate_its_acls_name(tmp_path, pems):
    """--tls-ca/--tls-cert/--tls-key on kl produce, consume, topics and mirror,
    against a daemon that takes only client certificates and whose ACLs name their subject."""
    from kl.net.acls import Acl, Acls

    root = kl.Root(tmp_path / "root")
    root.create_topic("t")
    root.create_topic("hidden")
    Acls(root.path).add([Acl("TOPIC", "t", "LITERAL", "User:alice", "*", op, "ALLOW") for op in ("READ", "WRITE")])
    log = tmp_path / "serve.log"
    tls = ["--tls", "--tls-cert", pems["cert"], "--tls-key", pems["key"], "--tls-ca", pems["ca"], "--tls-client-auth", "required",
           "--tls-principal-rules", r"RULE:^CN=([^,]*),.*$/$1/"]  # fmt: skip
    with open(log, "wb") as err:
        proc = subprocess.Popen([*KL, "--root", root.path, "serve", "--port", "0", "--allow-produce", "--acls", *tls],
                                stdin=subprocess.DEVNULL, stderr=err)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"serving \S+ on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        server = f"127.0.0.1:{found[1]}"
        mine = [
            "--server",
            server,
            "--tls-ca",
            pems["ca"],
            "--tls-cert",
            pems["client_cert"],
            "--tls-key",
            pems["client_key"],
        ]

        def kl_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
            return subprocess.run([*KL, *args], input=stdin, capture_output=True, text=True, timeout=60)

        assert kl_cli("produce", "t", *mine, stdin="one\ntwo\n").returncode == 0
        read = kl_cli("consume", "t", *mine)
        assert read.returncode == 0 and read.stdout.splitlines() == ["one", "two"], read.stderr
        listed = kl_cli("topics", "list", *mine)
        assert listed.returncode == 0 and "t" in listed.stdout.split() and "hidden" not in listed.stdout
        copy = tmp_path / "copy"
        mirrored = kl_cli("mirror", server, str(copy), "t", *mine[2:])
        assert mirrored.returncode == 0, mirrored.stderr
        assert [m.value for m in kl.Consumer(kl.Root(copy)).fetch("t", 0, 0, 1 << 20)] == [b"one", b"two"]
        for args, words in (
            (["--server", server, "--tls-ca", pems["ca"]], "with a client certificate only"),
            (
                ["--server", server, "--tls-cert", pems["client_cert"], "--tls-key", pems["client_key"]],
                "CERTIFICATE_VERIFY_FAILED",
            ),
            ([*mine[:2], "--tls-ca", str(tmp_path / "nowhere.pem")], "cannot read the TLS CA file"),
        ):
            refused = kl_cli("consume", "t", *args)
            assert refused.returncode == 1 and words in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        denied = kl_cli("consume", "hidden", *mine)
        assert denied.returncode == 1 and "User:alice may not" in denied.stderr and "hidden" in denied.stderr
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text()


def test_metadata_names_each_daemon_at_its_listener_of_the_connections_protocol(tmp_path, pems):
    """Two daemons over one root, each with a plaintext port and an SSL listener: through
    either's SSL listener, both are named at their SSL listeners (as Kafka names brokers by
    the listener a request came in on), and through the plaintext port at theirs."""
    root = tmp_path / "root"
    kl.Root(root).create_topic("t", kl.TopicConfig(partitions=4))
    args = ["--kafka", "127.0.0.1:0", "--listener", "SSL://127.0.0.1:0", "--tls-cert", pems["cert"], "--tls-key", pems["key"]]
    procs, ports = [], []
    try:
        for i in range(2):
            log = tmp_path / f"serve{i}.log"
            with open(log, "wb") as err:
                procs.append(subprocess.Popen([*KL, "--root", str(root), "serve", "--port", "0", *args], stdin=subprocess.DEVNULL,
                                              stderr=err))  # fmt: skip
            deadline = time.monotonic() + 60
            while len(found := re.findall(r"to Kafka clients on 127\.0\.0\.1:(\d+) \((\w+)\)", log.read_text())) < 2:
                assert procs[-1].poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            ports.append({protocol: int(port) for port, protocol in found})
        deadline = time.monotonic() + 30
        while True:
            with tls_connect(ports[0]["SSL"], client_context(pems)) as secure:
                named = sorted(b.port for b in metadata(secure).brokers)
            if len(named) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert named == sorted(p["SSL"] for p in ports)
        with socket.create_connection(("127.0.0.1", ports[1]["PLAINTEXT"]), timeout=10) as plain:
            assert sorted(b.port for b in metadata(plain).brokers) == sorted(p["PLAINTEXT"] for p in ports)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
