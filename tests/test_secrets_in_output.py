"""No password, salted hash or private key in any output: the security scenarios run as
real processes (kl users, kl serve with SASL and TLS listeners and JSON log lines, right
and wrong logins over PLAIN and SCRAM, a malformed login, garbage on a TLS port, a
SIGHUP reload, a key that does not match its certificate), and every line any of them
wrote is searched for the passwords, the keys kept in the credentials file (base64 and
hex), and the body of the private key."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka
import trustme

import kl

KL = [sys.executable, "-m", "kl_cli"]
PASSWORD = "hunter2-correct-horse"
WRONG = "battery-staple-wrong"


def kl_cli(root: Path, *args: str, stdin: str = "") -> str:
    done = subprocess.run([*KL, "--root", str(root), *args], input=stdin, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def login(bootstrap: str, protocol: str, mechanism: str, password: str, ca: str | None) -> list[str]:
    """What confluent-kafka says while it logs in and lists the topics (errors included)."""
    said: list[str] = []
    config = {"bootstrap.servers": bootstrap, "security.protocol": protocol, "sasl.mechanisms": mechanism,
              "sasl.username": "alice", "sasl.password": password, "error_cb": lambda e: said.append(str(e)),
              "log_level": 7, "debug": "security", "logger": _Lines(said)}  # fmt: skip
    if ca:
        config["ssl.ca.location"] = ca
    try:
        said.append(str(confluent_kafka.admin.AdminClient(config).list_topics(timeout=10 if password == PASSWORD else 2).topics))
    except confluent_kafka.KafkaException as e:
        said.append(str(e))
    return said


class _Lines:
    """A logging.Logger's ``log`` for librdkafka's log lines, kept in a list."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def log(self, level: int, fmt: str, *args: object) -> None:
        self.lines.append(fmt % args if args else fmt)


def test_no_secret_in_any_output_of_the_security_scenarios(tmp_path):
    import confluent_kafka.admin  # noqa: F401  (AdminClient)

    root = tmp_path / "root"
    kl.Root(root).create_topic("t")
    outputs: list[str] = []
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        outputs.append(
            kl_cli(root, "users", "add", "alice", "--mechanism", mechanism, "--password-file", "-", stdin=PASSWORD + "\n")
        )
    outputs += [kl_cli(root, "users", "list"), kl_cli(root, "users", "list", "--json")]
    outputs.append(kl_cli(root, "users", "add", "", "--password-file", "-", stdin=PASSWORD + "\n"))  # refused: an empty name
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    for name, blob in (("ca", ca.cert_pem), ("cert", cert.cert_chain_pems[0]), ("key", cert.private_key_pem)):
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
    other_key = trustme.CA().issue_cert("127.0.0.1").private_key_pem
    other_key.write_to_path(str(tmp_path / "other-key.pem"))
    tls = ["--tls-cert", str(tmp_path / "cert.pem"), "--tls-key"]
    outputs.append(kl_cli(root, "serve", "--listener", "SSL://127.0.0.1:0", *tls, str(tmp_path / "other-key.pem")))  # not its key
    log = tmp_path / "serve.log"
    listeners = ["--listener", "SASL_PLAINTEXT://127.0.0.1:0", "--listener", "SASL_SSL://127.0.0.1:0"]
    with open(log, "wb") as err:
        serve = [
            "serve",
            "--json",
            "--port",
            "0",
            "--failed-authentication-delay",
            "0",
            *listeners,
            *tls,
            str(tmp_path / "key.pem"),
        ]
        daemon = subprocess.Popen([*KL, "--root", str(root), *serve], stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while len(found := re.findall(r"to Kafka clients on (127\.0\.0\.1:\d+) \((\w+)\)", log.read_text())) < 2:
            assert daemon.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        address = {protocol: where for where, protocol in found}
        for protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            ssl_ca = str(tmp_path / "ca.pem") if protocol == "SASL_SSL" else None
            for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
                for password in (PASSWORD, WRONG):
                    outputs += login(address[protocol], protocol, mechanism, password, ssl_ca)
        host, port = address["SASL_PLAINTEXT"].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # a PLAIN token without a handshake
            sock.sendall(b"\0\0\0\x1a" + b"\0alice\0" + PASSWORD.encode())
            with contextlib.suppress(OSError):
                sock.recv(100)
        host, port = address["SASL_SSL"].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # not TLS
            sock.sendall(b"\x16\x03\x01\x00\x05garbage" + PASSWORD.encode())
            with contextlib.suppress(OSError):
                sock.recv(100)
        daemon.send_signal(signal.SIGHUP)
        while "TLS certificates reloaded" not in log.read_text():
            assert daemon.poll() is None and time.monotonic() < deadline + 30, log.read_text()
            time.sleep(0.05)
    finally:
        daemon.terminate()
        daemon.wait(30)
    outputs.append(log.read_text())
    assert any("authenticated as User:alice" in o for o in outputs) and any("authentication failed" in o for o in outputs)
    kept = json.loads((root / ".users" / "credentials.json").read_text())["users"]["alice"]
    secrets = {PASSWORD, WRONG, PASSWORD.encode().hex()}
    for credential in kept.values():
        for field in ("stored_key", "server_key"):
            raw = base64.b64decode(credential[field])
            secrets |= {credential[field], raw.hex(), base64.b64encode(raw).decode().rstrip("=")}
    for key in (cert.private_key_pem, other_key):
        secrets |= {line for line in key.bytes().decode().splitlines() if line and "PRIVATE KEY" not in line}
    text = "\n".join(outputs)
    assert len(text) > 2000  # the scenarios said things
    leaked = sorted(secret for secret in secrets if secret in text)
    assert not leaked, f"secrets in the output: {leaked}"
