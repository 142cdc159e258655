"""kl's own clients over the network, secured: TLS (the server's certificate checked, mTLS)
and SASL on Kafka 0.7's port (kl's AUTHENTICATE), through RemoteConsumer/RemoteProducer,
the --server commands and kl mirror."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trustme

import kl
from kl.net import wire
from kl.net.credentials import Credentials
from kl.net.daemon import Daemon
from kl.net.remote import RemoteRoot
from kl.net.server import Connection, ServeConfig

KL = [sys.executable, "-m", "kl_cli"]
PASSWORD = "correct horse battery staple"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture
def pems(tmp_path: Path) -> dict[str, str]:
    """A CA's certificate, the server's certificate and key, a client's, and another CA's certificate."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("alice@example.com", common_name="alice", organization_name="Example", organization_unit_name="Team")
    files = {"ca": ca.cert_pem, "cert": server.cert_chain_pems[0], "key": server.private_key_pem}
    files |= {"client_cert": client.cert_chain_pems[0], "client_key": client.private_key_pem, "other_ca": trustme.CA().cert_pem}
    paths = {}
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
        paths[name] = str(tmp_path / f"{name}.pem")
    return paths


@pytest.fixture
def serve(root, pems):
    """Start a daemon in a thread serving Kafka 0.7's port over TLS (with ``config``); its address."""
    Credentials(root.path).add("alice", PASSWORD, "SCRAM-SHA-256")
    Credentials(root.path).add("alice", PASSWORD, "SCRAM-SHA-512")
    started: list[tuple[Daemon, threading.Thread]] = []

    def start(**config) -> str:
        config = {"port": 0, "port_tls": True, "tls_cert": pems["cert"], "tls_key": pems["key"], "allow_produce": True} | config
        server = Daemon(root, ServeConfig(**config))
        thread = threading.Thread(target=server.serve_forever)
        thread.start()
        started.append((server, thread))
        return f"127.0.0.1:{server.port}"

    yield start
    for server, thread in started:
        server.stop()
        thread.join(10)
        assert not thread.is_alive()


@pytest.fixture
def principals(monkeypatch) -> list[str]:
    """The principal of each connection a request comes on, as Kafka 0.7's front end sees it (after it)."""
    from kl.net.kafka07 import Kafka07

    seen: list[str] = []
    handle = Kafka07.handle

    def handled(self, conn: Connection, request):
        handle(self, conn, request)
        seen.append(conn.principal)

    monkeypatch.setattr(Kafka07, "handle", handled)
    return seen


def trusting(pems: dict[str, str], *, ca: str = "ca", cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pems[ca])
    if cert:
        context.load_cert_chain(pems["client_cert"], pems["client_key"])
    return context


def values(consumer: kl.Consumer, partition: int) -> list:
    return [v for batch in consumer.consume("t", [partition], values_only=True) for v in batch.messages]


def run_kl(*args: str, stdin: bytes = b"", password: str | None = PASSWORD) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KL_PASSWORD"}
    if password is not None:
        env["KL_PASSWORD"] = password
    done = subprocess.run([*KL, *args], input=stdin, capture_output=True, timeout=60, env=env)
    assert PASSWORD.encode() not in done.stdout + done.stderr
    return done


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_producer_and_consumer_authenticate_over_tls_with_each_mechanism(root, serve, pems, principals, mechanism, caplog):
    caplog.set_level(logging.DEBUG)
    root.create_topic("t", kl.TopicConfig(partitions=1))
    address = serve(port_sasl=True)
    login = (mechanism, "alice", PASSWORD)
    with kl.RemoteProducer(address, tls=trusting(pems), sasl=login) as producer:
        producer.send("t", b"one")
        producer.send("t", b"two")
    with kl.RemoteConsumer(address, tls=trusting(pems), sasl=login) as consumer:
        assert values(consumer, 0) == [b"one", b"two"]
        assert consumer.topics() == ["t"]
    assert set(principals) == {"User:ANONYMOUS", "User:alice"}  # HELLO and AUTHENTICATE come before
    assert "authenticated as User:alice" in caplog.text
    assert PASSWORD not in caplog.text and PASSWORD not in repr(RemoteRoot(address, sasl=login).sasl)


def test_wrong_password_and_unknown_user_get_the_same_answer(root, serve, pems, caplog):
    caplog.set_level(logging.INFO, "kl.serve")
    address = serve(port_sasl=True, failed_authentication_delay=0.0)  # (else each failure waits longer: 8 s soon)
    for mechanism in MECHANISMS:
        answers = []
        for user, password in (("alice", "wrong"), ("mallory", "wrong"), ("mallory", PASSWORD)):
            with pytest.raises(wire.AuthenticationFailed) as refused:
                kl.RemoteConsumer(address, tls=trusting(pems), sasl=(mechanism, user, password)).topics()
            answers.append(str(refused.value))
        assert answers == [f"SASL {mechanism} authentication failed: unknown user or wrong password"] * 3
    assert "unknown user" in caplog.text and "wrong password" in caplog.text  # told apart in the log only
    assert PASSWORD not in caplog.text


def test_failures_from_a_host_are_answered_later_and_later(root, serve):
    address = serve(port_tls=False, port_sasl=True)
    took = []
    for _ in range(3):
        began = time.monotonic()
        with pytest.raises(wire.AuthenticationFailed):
            wire.Connection(address, sasl=("SCRAM-SHA-256", "alice", "wrong"))
        took.append(time.monotonic() - began)
    first = ServeConfig.failed_authentication_delay
    assert took[1] >= first and took[2] >= 2 * first


def test_exchange_not_done_in_time_is_cut(root, serve, caplog):
    address = serve(port_tls=False, port_sasl=True, request_timeout=0.5)
    conn = wire.Connection(address)
    first = b"n,,n=alice,r=abcdefghijklmnop"
    answer = wire.Reader(conn.call(wire.AUTHENTICATE, wire.string("SCRAM-SHA-256") + wire.INT32.pack(len(first)) + first))
    assert bytes(answer.take(answer.int32())).startswith(b"r=abcdefghijklmnop")
    with pytest.raises(wire.ProtocolError, match="closed the connection"):
        conn.receive()  # the client's final message never comes


def test_client_that_does_not_authenticate_is_refused_in_one_line(root, serve, pems):
    root.create_topic("t", kl.TopicConfig())
    address = serve(port_sasl=True)
    with pytest.raises(wire.AuthenticationFailed, match=r"^this server requires SASL authentication \(PLAIN, SCRAM"):
        kl.RemoteConsumer(address, tls=trusting(pems)).topics()
    host, port = wire.parse_address(address)
    with trusting(pems).wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=host) as kafka07:
        kafka07.sendall(wire.request(wire.FETCH, wire.fetch_body(wire.Fetch("t", 0, 0, 1024))))
        assert kafka07.recv(10) == b""  # a Kafka 0.7 client cannot authenticate: closed
    done = run_kl("topics", "list", "--server", address, "--tls-ca", pems["ca"], password=None)
    assert done.returncode == 1 and done.stderr.decode().count("\n") == 1
    assert "requires SASL authentication" in done.stderr.decode() and b"Traceback" not in done.stderr


def test_mechanism_not_taken_is_refused(root, serve, pems):
    address = serve(port_sasl=True, sasl_mechanisms=("SCRAM-SHA-512",))
    with pytest.raises(wire.AuthenticationFailed, match=r"^SASL mechanism PLAIN is not one this server takes \(SCRAM-SHA-512\)$"):
        kl.RemoteConsumer(address, tls=trusting(pems), sasl=("PLAIN", "alice", PASSWORD)).topics()
    assert kl.RemoteConsumer(address, tls=trusting(pems), sasl=("SCRAM-SHA-512", "alice", PASSWORD)).topics() == []


def test_server_certificate_is_checked(root, serve, pems):
    address = serve()
    assert kl.RemoteConsumer(address, tls=trusting(pems)).topics() == []
    with pytest.raises(wire.NetworkError, match="CERTIFICATE_VERIFY_FAILED"):
        kl.RemoteConsumer(address, tls=trusting(pems, ca="other_ca")).topics()
    done = run_kl("topics", "list", "--server", address, "--tls-ca", pems["other_ca"])
    assert done.returncode == 1 and done.stderr.decode().count("\n") == 1 and "CERTIFICATE_VERIFY_FAILED" in done.stderr.decode()
    assert run_kl("topics", "list", "--server", address, "--tls-ca", pems["ca"]).returncode == 0
    alone = run_kl("topics", "list", "--root", str(root.path), "--tls-ca", pems["ca"])  # not for a root
    assert alone.returncode == 2 and "--tls-ca is for a server: give --server too" in alone.stderr.decode()


def test_client_certificate_names_the_principal(root, serve, pems, principals):
    root.create_topic("t", kl.TopicConfig())
    address = serve(tls_ca=pems["ca"], tls_client_auth="required")
    with pytest.raises((wire.NetworkError, wire.ProtocolError)):  # no certificate: refused
        kl.RemoteConsumer(address, tls=trusting(pems)).topics()
    assert kl.RemoteConsumer(address, tls=trusting(pems, cert=True)).topics() == ["t"]
    assert principals == ["User:CN=alice,OU=Team,O=Example"] * 2
    done = run_kl("topics", "list", "--server", address, "--tls-ca", pems["ca"], "--tls-cert", pems["client_cert"])
    assert done.returncode == 2 and "--tls-key" in done.stderr.decode()
    tls = ["--tls-ca", pems["ca"], "--tls-cert", pems["client_cert"], "--tls-key", pems["client_key"]]
    assert b"t" in run_kl("topics", "list", "--server", address, *tls).stdout.split()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_cli_produces_consumes_and_lists_through_tls_and_sasl(root, serve, pems, tmp_path, mechanism):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    address = serve(port_sasl=True)
    secure = ["--server", address, "--tls-ca", pems["ca"], "--sasl-user", "alice", "--sasl-mechanism", mechanism]
    done = run_kl("produce", *secure, "t", stdin=b"one\ntwo\n")
    assert done.returncode == 0, done.stderr
    assert run_kl("consume", *secure, "t").stdout == b"one\ntwo\n"
    assert b"t" in run_kl("topics", "list", *secure).stdout.split()
    (tmp_path / "password").write_text(PASSWORD + "\n")
    from_file = run_kl("consume", *secure, "--password-file", str(tmp_path / "password"), "t", password=None)
    assert from_file.stdout == b"one\ntwo\n"
    wrong = run_kl("consume", *secure, "t", password="not it")
    assert wrong.returncode == 1 and b"Traceback" not in wrong.stderr
    assert wrong.stderr.decode() == f"Error: SASL {mechanism} authentication failed: unknown user or wrong password\n"
    none = run_kl("consume", *secure, "t", password=None)  # no password, and no terminal to ask on
    assert none.returncode == 2 and "KL_PASSWORD" in none.stderr.decode()


def test_password_is_asked_for_on_a_terminal(root, serve, pems):
    import fcntl
    import pty
    import termios

    root.create_topic("t", kl.TopicConfig())
    address = serve(port_sasl=True)
    master, terminal = pty.openpty()

    def controlling() -> None:
        os.setsid()
        fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)

    env = {k: v for k, v in os.environ.items() if k != "KL_PASSWORD"}
    args = ["topics", "list", "--server", address, "--tls-ca", pems["ca"], "--sasl-user", "alice"]
    streams = {"stdin": terminal, "stdout": subprocess.PIPE, "stderr": terminal}
    with subprocess.Popen([*KL, *args], **streams, env=env, preexec_fn=controlling) as kl_:
        os.close(terminal)
        told = b""
        while b"Password" not in told:
            told += os.read(master, 100)
        os.write(master, PASSWORD.encode() + b"\n")
        out, _ = kl_.communicate(timeout=60)
    seen = told
    with contextlib.suppress(OSError):
        seen += os.read(master, 1000)
    os.close(master)
    assert kl_.returncode == 0 and b"t" in out.split()
    assert PASSWORD.encode() not in seen + out  # not echoed


def test_mirror_copies_from_a_server_over_tls_and_sasl(root, serve, pems, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    with kl.Producer(root) as producer:
        for i in range(20):
            producer.send("t", b"m%d" % i, partition=i % 2)
    address = serve(port_sasl=True)
    target = str(tmp_path / "copy")
    secure = ["--tls-ca", pems["ca"], "--sasl-user", "alice", "--sasl-mechanism", "SCRAM-SHA-512"]
    done = run_kl("mirror", address, target, *secure)
    assert done.returncode == 0, done.stderr
    copy = kl.Consumer(kl.Root(target))
    assert values(copy, 0) == values(kl.Consumer(root), 0) == [b"m%d" % i for i in range(0, 20, 2)]
    assert len(values(copy, 1)) == 10
    refused = run_kl("mirror", address, str(tmp_path / "other"), *secure, password="wrong")
    assert refused.returncode == 1
    assert refused.stderr.decode() == "Error: SASL SCRAM-SHA-512 authentication failed: unknown user or wrong password\n"
    plain = run_kl("mirror", address, str(tmp_path / "other"), "--tls-ca", pems["ca"])
    assert plain.returncode == 1 and "requires SASL authentication" in plain.stderr.decode()
