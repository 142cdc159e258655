"""SASL on ``kl serve``'s Kafka listeners (SASL_PLAINTEXT): PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 against the credentials kept in the root, through real clients
(confluent-kafka, kafka-python, kcat) and raw sockets; ``kl users``."""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import socket
import stat
import struct
import subprocess
import threading
import time

import pytest
from click.testing import CliRunner
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafkafuzz import framed
from kafkaserver import InThread, Raw, plain

from kl.net import daemon
from kl.net.credentials import Credentials
from kl.net.server import Listener, ServeConfig, Server
from kl_cli.main import cli

from kafka_clients import kcat_librdkafka

KCAT = subprocess.run(["sh", "-c", "command -v kcat || command -v kafkacat"], capture_output=True, text=True).stdout.strip()
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
KCAT_LIBRDKAFKA = kcat_librdkafka(KCAT)
FIRST_DELAY = ServeConfig.failed_authentication_delay
PASSWORD = "s3cret pw"
CONFIGS = "org.apache.kafka.tools.ConfigCommand"


@pytest.fixture
def users(root):
    c = Credentials(root.path)
    c.add("alice", PASSWORD, "SCRAM-SHA-256")
    c.add("alice", PASSWORD, "SCRAM-SHA-512", iterations=8192)
    c.add("bob", "other password", "SCRAM-SHA-512")
    return c


@pytest.fixture
def served(root, users):
    started: list[InThread] = []

    def start(**config) -> InThread:
        started.append(InThread(root, "SASL_PLAINTEXT", **config))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def confluent(bootstrap: str, mechanism: str, user: str, password: str, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
        "sasl.username": user, "sasl.password": password, **extra,
    }  # fmt: skip


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_produces_and_consumes_with_each_mechanism(root, served, mechanism):
    from confluent_kafka import Consumer, Producer

    s = served()
    producer = Producer(confluent(s.bootstrap, mechanism, "alice", PASSWORD))
    for i in range(5):
        producer.produce("t", f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        confluent(s.bootstrap, mechanism, "alice", PASSWORD, **{"group.id": "g", "auto.offset.reset": "earliest"})
    )
    consumer.subscribe(["t"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        m = consumer.poll(1)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    assert got == [f"v{i}".encode() for i in range(5)]


def failed_login(address, mechanism: str, user: str, password: str):
    """The answer to a login that fails, with the connection then closed."""
    import scramp

    c = Raw(address)
    assert c.handshake(mechanism).error_code == 0
    if mechanism == "PLAIN":
        answer = c.authenticate(plain(user, password))
    else:
        client = scramp.ScramClient([mechanism], user, password)
        first = c.authenticate(client.get_client_first().encode())
        assert first.error_code == 0
        client.set_server_first(bytes(first.auth_bytes).decode())
        answer = c.authenticate(client.get_client_final().encode())
    assert c.closed()
    c.close()
    return answer


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_and_an_unknown_user_get_the_same_answer(served, mechanism, caplog):
    caplog.set_level(logging.DEBUG)
    s = served()
    wrong = failed_login(s.address, mechanism, "alice", "not it")
    unknown = failed_login(s.address, mechanism, "nobody", PASSWORD)
    words = (
        "Authentication failed: Invalid username or password"  # Kafka's PlainSaslServer's words
        if mechanism == "PLAIN"
        else f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )
    assert (wrong.error_code, wrong.error_message) == (unknown.error_code, unknown.error_message) == (58, words)
    assert scram_login(s.address, "SCRAM-SHA-256", "alice", PASSWORD) == 0
    logged = caplog.text
    assert "not it" not in logged and PASSWORD not in logged  # nor a key:
    for kept in Credentials(s.server.root.path).users()["alice"].values():
        assert base64.b64encode(kept.stored_key).decode() not in logged and kept.server_key.hex() not in logged


def test_scram_of_an_unknown_user_gives_the_same_salt_each_time(served):
    import scramp

    s = served()
    salts = []
    for _ in range(2):
        c = Raw(s.address)
        c.handshake("SCRAM-SHA-256")
        client = scramp.ScramClient(["SCRAM-SHA-256"], "nobody", "x")
        first = bytes(c.authenticate(client.get_client_first().encode()).auth_bytes).decode()
        salts.append(dict(part.split("=", 1) for part in first.split(","))["s"])
        c.close()
    assert salts[0] == salts[1]


def test_repeated_failures_from_a_host_are_answered_later_and_later(served):
    s = served()
    took = []
    for _ in range(4):
        start = time.monotonic()
        failed_login(s.address, "PLAIN", "alice", "guess")
        took.append(time.monotonic() - start)
    # the 2nd, 3rd and 4th wait at least 0.25, 0.5 and 1 s
    assert took[1] >= FIRST_DELAY and took[2] >= 2 * FIRST_DELAY and took[3] >= 4 * FIRST_DELAY
    good = Raw(s.address)  # while another host's (here: the same host's) login still succeeds
    good.handshake("PLAIN")
    assert good.authenticate(plain("alice", PASSWORD)).error_code == 0


def test_a_request_before_authentication_closes_the_connection(served):
    s = served()
    c = Raw(s.address)
    c.sock.sendall(framed(MetadataRequest, 4, 1, topics=None, allow_auto_topic_creation=False))
    assert c.closed()
    c = Raw(s.address)  # ApiVersions and the handshake are taken, then only SaslAuthenticate
    told = c.call(ApiVersionsRequest, 3, ApiVersionsResponse, client_software_name="t", client_software_version="1")
    assert {17, 36} <= {k.api_key for k in told.api_keys}
    assert c.handshake("PLAIN").error_code == 0
    c.sock.sendall(framed(MetadataRequest, 4, 9, topics=None, allow_auto_topic_creation=False))
    assert c.closed()


def test_after_authentication_requests_are_served_and_the_sasl_ones_answer_illegal_state(served, caplog):
    caplog.set_level(logging.INFO, logger="kl.serve")
    s = served()
    c = Raw(s.address)
    assert c.handshake("PLAIN").mechanisms == MECHANISMS
    done = c.authenticate(plain("alice", PASSWORD), version=1)
    assert (done.error_code, done.session_lifetime_ms) == (0, 0)
    assert any("authenticated as User:alice (SASL PLAIN)" in r.message for r in caplog.records)  # its principal
    assert c.call(MetadataRequest, 4, MetadataResponse, topics=None, allow_auto_topic_creation=False).brokers
    assert c.handshake("PLAIN").error_code == 34
    again = c.authenticate(plain("alice", PASSWORD))
    assert (again.error_code, again.error_message) == (34, "SaslAuthenticate request received after successful authentication")


def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(served):
    s = served(sasl_mechanisms=("SCRAM-SHA-512",))
    c = Raw(s.address)
    answer = c.handshake("PLAIN")
    assert (answer.error_code, answer.mechanisms) == (33, ["SCRAM-SHA-512"])
    assert c.closed()


def test_handshake_v0_takes_bare_tokens(served):
    s = served()
    c = Raw(s.address)
    assert c.handshake("PLAIN", version=0).error_code == 0
    token = plain("alice", PASSWORD)
    c.sock.sendall(struct.pack(">i", len(token)) + token)
    assert c.answer() == b"\0\0\0\0"  # PLAIN's empty answer, bare
    assert c.call(MetadataRequest, 4, MetadataResponse, topics=None, allow_auto_topic_creation=False).brokers
    bad = Raw(s.address)
    bad.handshake("PLAIN", version=0)
    token = plain("alice", "wrong")
    bad.sock.sendall(struct.pack(">i", len(token)) + token)
    assert bad.closed()


def test_a_half_done_exchange_is_cut_after_the_request_timeout(served):
    s = served(request_timeout=1.0)
    c = Raw(s.address)
    c.handshake("SCRAM-SHA-256")
    start = time.monotonic()
    assert c.closed()
    assert time.monotonic() - start < 10


def test_sasl_handshake_on_a_plaintext_listener_answers_illegal_state(root, users):
    server = Server(root, ServeConfig(port=None, kafka_port=0), [Listener("127.0.0.1", 0, daemon._kafka)])
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        c = Raw(("127.0.0.1", server.ports[0]))
        assert c.handshake("PLAIN").error_code == 34
        assert c.authenticate(plain("alice", PASSWORD)).error_code == 34
    finally:
        server.stop()
        thread.join(20)


def test_fuzzed_sasl_requests_leave_it_serving(served, caplog):
    s = served(failed_authentication_delay=0.0)  # (else each failure waits longer: 8 s soon)
    rng = random.Random(37)
    good = [framed(SaslHandshakeRequest, v, 1, mechanism=m) for v in (0, 1) for m in MECHANISMS]
    for _ in range(200):
        c = socket.create_connection(s.address, timeout=20)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        try:
            hello = rng.choice(good)
            c.sendall(hello)
            size = rng.randrange(0, 300)
            token = (
                rng.randbytes(size) if rng.random() < 0.3 else bytes(rng.choice(b"=,\0abnrcp0123456789+/") for _ in range(size))
            )
            if rng.random() < 0.3:
                token = rng.choice([b"n,,n=alice,r=", b"\0alice\0", b"c=biws,r=x,p="]) + token
            request = framed(SaslAuthenticateRequest, rng.choice((0, 1, 2)), 2, auth_bytes=token)
            if rng.random() < 0.3:  # mangled: cut, or bytes flipped
                request = bytearray(request)
                for _ in range(rng.randrange(1, 4)):
                    request[rng.randrange(4, len(request))] = rng.randrange(256)
            c.sendall(bytes(request))
            c.shutdown(socket.SHUT_WR)
            c.settimeout(20)
            while c.recv(1 << 16):
                pass
        except OSError:
            pass
        finally:
            c.close()
    c = Raw(s.address)  # still serving
    c.handshake("PLAIN")
    assert c.authenticate(plain("alice", PASSWORD)).error_code == 0
    assert not [r.message for r in caplog.records if "unexpected" in r.message]  # no bug met


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_produces_and_consumes_with_each_mechanism(served, mechanism):
    from kafka import KafkaConsumer, KafkaProducer

    s = served()
    login = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_plain_username="alice",
                 sasl_plain_password=PASSWORD)  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=s.bootstrap, **login)
    for i in range(3):
        producer.send("k", f"v{i}".encode()).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer("k", bootstrap_servers=s.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10000, **login)
    got = [m.value for _, m in zip(range(3), consumer, strict=False)]
    consumer.close()
    assert got == [b"v0", b"v1", b"v2"]


@pytest.mark.skipif(not KCAT, reason="kcat is not installed")
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_produces_and_consumes_with_each_mechanism(served, mechanism, caplog):
    """SCRAM needs librdkafka 2.6.1 or newer: the ones before send the client's nonce twice
    over in its final message, which Kafka 4's brokers refuse (tests/test_kafka_oracle.py
    sees it), and so does kl."""
    s = served()
    login = ["-b", s.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
             "-X", "sasl.username=alice", "-X", f"sasl.password={PASSWORD}"]  # fmt: skip
    if mechanism != "PLAIN" and KCAT_LIBRDKAFKA < (2, 6, 1):
        refused = subprocess.run([KCAT, *login, "-L", "-m", "5"], capture_output=True, timeout=60)
        assert (
            refused.returncode != 0
            and b"Authentication failed during authentication due to invalid credentials" in refused.stderr
        )
        assert "(librdkafka before 2.6.1 repeats it)" in caplog.text
        return
    subprocess.run([KCAT, *login, "-P", "-t", "c"], input=b"one\ntwo\n", check=True, timeout=60)
    done = subprocess.run([KCAT, *login, "-C", "-t", "c", "-o", "beginning", "-e", "-q"], capture_output=True, timeout=60)
    assert done.stdout.splitlines() == [b"one", b"two"]
    wrong = [*login[:-1], "sasl.password=wrong"]
    refused = subprocess.run([KCAT, *wrong, "-L", "-m", "5"], capture_output=True, timeout=60)
    assert refused.returncode != 0 and b"Authentication failed" in refused.stderr


def test_the_credentials_file_holds_no_password_and_only_its_owner_reads_it(root, users):
    path = os.path.join(root.path, ".users", "credentials.json")
    data = open(path, "rb").read()
    assert PASSWORD.encode() not in data and b"other password" not in data
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    kept = json.loads(data)["users"]["alice"]
    assert set(kept) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert set(kept["SCRAM-SHA-256"]) == {"salt", "iterations", "stored_key", "server_key"}
    assert kept["SCRAM-SHA-512"]["iterations"] == 8192


def test_kl_users_adds_lists_and_removes(root, tmp_path, served):
    def kl_users(*args: str, stdin: str | None = None):
        return CliRunner().invoke(cli, ["--root", root.path, "users", *args], input=stdin)

    (tmp_path / "pw").write_text("carol's pw\n")
    assert kl_users("add", "carol", "--password-file", str(tmp_path / "pw")).exit_code == 0
    assert (
        kl_users(
            "add", "carol", "--mechanism", "SCRAM-SHA-512", "--iterations", "5000", "--password-file", "-", stdin="carol's pw\n"
        ).exit_code
        == 0
    )
    listed = kl_users("list")
    assert listed.stdout.splitlines() == [
        "alice\tSCRAM-SHA-256,SCRAM-SHA-512",
        "bob\tSCRAM-SHA-512",
        "carol\tSCRAM-SHA-256,SCRAM-SHA-512",
    ]
    assert json.loads(kl_users("list", "--json").stdout.splitlines()[2]) == {
        "name": "carol",
        "mechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"],
    }
    s = served()  # the daemon logs carol in, with either mechanism and with PLAIN
    for mechanism in MECHANISMS:
        c = Raw(s.address)
        c.handshake(mechanism)
        if mechanism == "PLAIN":
            assert c.authenticate(plain("carol", "carol's pw")).error_code == 0
        else:
            import scramp

            client = scramp.ScramClient([mechanism], "carol", "carol's pw")
            client.set_server_first(bytes(c.authenticate(client.get_client_first().encode()).auth_bytes).decode())
            final = c.authenticate(client.get_client_final().encode())
            assert final.error_code == 0
            client.set_server_final(bytes(final.auth_bytes).decode())  # the server proved it has the key
    assert kl_users("remove", "carol", "--mechanism", "SCRAM-SHA-256").exit_code == 0
    assert kl_users("list").stdout.splitlines()[2] == "carol\tSCRAM-SHA-512"
    assert kl_users("remove", "carol").exit_code == 0
    gone = kl_users("remove", "carol")
    assert (gone.exit_code, gone.output.strip()) == (1, "Error: there is no user 'carol'")
    assert kl_users("add", "x", "--iterations", "100", "--password-file", "-", stdin="pw\n").exit_code == 2
    assert kl_users("add", "bad\nname", "--password-file", "-", stdin="pw\n").exit_code == 1
    assert failed_login(s.address, "PLAIN", "carol", "carol's pw").error_code == 58


def scram_login(address, mechanism: str, user: str, password: str) -> int:
    """The error code of a SCRAM login (0: logged in, and the server proved it holds the key)."""
    import scramp

    c = Raw(address)
    c.handshake(mechanism)
    client = scramp.ScramClient([mechanism], user, password)
    first = c.authenticate(client.get_client_first().encode())
    if first.error_code:
        return first.error_code
    client.set_server_first(bytes(first.auth_bytes).decode())
    final = c.authenticate(client.get_client_final().encode())
    if final.error_code == 0:
        client.set_server_final(bytes(final.auth_bytes).decode())
    c.close()
    return final.error_code


def test_kafka_configs_alters_and_describes_scram_users(served, tmp_path):
    from kafka_oracle import Unavailable, install, tool

    try:
        lib = install()
    except Unavailable as e:
        pytest.skip(f"Apache Kafka's tools: {e}")
    s = served(allow_admin=True)
    login = tmp_path / "login.properties"  # kafka-configs itself logs in as alice, with SCRAM-SHA-512
    login.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required"
        f' username="alice" password="{PASSWORD}";\n'
    )
    configs = ["--bootstrap-server", s.bootstrap, "--command-config", str(login), "--entity-type", "users"]
    tool(
        lib,
        CONFIGS,
        *configs,
        "--entity-name",
        "dave",
        "--alter",
        "--add-config",
        "SCRAM-SHA-256=[iterations=5000,password=dave pw]",
    )
    assert scram_login(s.address, "SCRAM-SHA-256", "dave", "dave pw") == 0
    assert scram_login(s.address, "SCRAM-SHA-256", "dave", "not it") == 58
    described = tool(lib, CONFIGS, *configs, "--entity-name", "dave", "--describe")
    assert "SCRAM-SHA-256=iterations=5000" in described
    everyone = tool(lib, CONFIGS, *configs, "--describe")
    assert "alice" in everyone and "bob" in everyone and "dave" in everyone
    tool(lib, CONFIGS, *configs, "--entity-name", "dave", "--alter", "--delete-config", "SCRAM-SHA-256")
    assert "dave" not in Credentials(s.server.root.path).users()
    assert "dave pw" not in open(os.path.join(s.server.root.path, ".users", "credentials.json")).read()


def test_alter_user_scram_credentials_needs_allow_admin(served):
    from kafka.protocol.admin.users import AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse

    s = served()
    c = Raw(s.address)
    c.handshake("PLAIN")
    c.authenticate(plain("alice", PASSWORD))
    upsertion = AlterUserScramCredentialsRequest.ScramCredentialUpsertion
    request = [upsertion(name="eve", mechanism=1, iterations=4096, salt=b"s" * 16, salted_password=b"p" * 32)]
    answer = c.call(AlterUserScramCredentialsRequest, 0, AlterUserScramCredentialsResponse, deletions=[], upsertions=request)
    assert [(r.user, r.error_code) for r in answer.results] == [("eve", 31)]
    assert "eve" not in Credentials(s.server.root.path).users()
