"""A client at the wrong door of ``kl serve`` gets one line naming what it reached and
what to use instead: kl's client at a Kafka port or at a TLS port without --tls (its
error), with --tls at a plaintext port (its error), a Kafka client at Kafka 0.7's port
or with TLS at a plaintext port (the daemon's log, once however often it retries)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka.admin
import pytest
import trustme

import kl

KL = [sys.executable, "-m", "kl_cli"]


class Serving:
    """``kl serve`` with ``args`` as a process, its log in a file, and where it listens."""

    def __init__(self, root: kl.Root, log: Path, *args: str):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([*KL, "--root", root.path, "serve", *args], stdin=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60
        wanted = sum(arg in ("--port", "--kafka", "--listener") for arg in args)
        while len(self.doors()) < wanted:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.02)

    def text(self) -> str:
        return self.log.read_text()

    def doors(self) -> dict[str, str]:
        """ "0.7" and each Kafka listener's security protocol -> its HOST:PORT."""
        found = {}
        if kafka07 := re.search(r"serving \S+ on (\S+:\d+)$", self.text(), re.M):
            found["0.7"] = kafka07[1]
        found.update({m[2]: m[1] for m in re.finditer(r"to Kafka clients on (\S+:\d+) \((\w+)\)", self.text())})
        return found

    def logged(self, pattern: str, timeout: float = 20) -> list[str]:
        deadline = time.monotonic() + timeout
        while not (found := [line for line in self.text().splitlines() if re.search(pattern, line)]):
            assert time.monotonic() < deadline, f"no log line matches {pattern!r}: {self.text()}"
            time.sleep(0.05)
        return found

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(30) == 0, self.text()


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("pems")
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(where / "server.pem")
    ca.cert_pem.write_to_path(where / "ca.pem")
    return {"cert": str(where / "server.pem"), "ca": str(where / "ca.pem")}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory, pems: dict[str, str]):
    """One daemon serving 0.7's port in plaintext, Kafka's in plaintext and over TLS; one
    serving only 0.7's port, over TLS."""
    where = tmp_path_factory.mktemp("doors")
    root = kl.Root(where / "root")
    (where / "root").mkdir()
    root.create_topic("t")
    tls = ("--tls-cert", pems["cert"], "--tls-key", pems["cert"])
    both = Serving(root, where / "both.log", "--port", "0", "--kafka", "127.0.0.1:0", "--listener", "SSL://127.0.0.1:0", *tls)
    secure = Serving(root, where / "secure.log", "--port", "0", "--tls", *tls)
    yield both, secure
    both.stop()
    secure.stop()


def one_line_error(*args: str) -> str:
    done = subprocess.run([*KL, *args], capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
    err = done.stderr.decode()
    assert done.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_kl_client_at_a_kafka_port_is_sent_to_the_kl_port(daemons):
    both, _ = daemons
    doors = both.doors()
    err = one_line_error("topics", "list", "--server", doors["PLAINTEXT"])
    assert f"{doors['PLAINTEXT']} serves today's Kafka protocol (kl serve --kafka), not kl's" in err
    assert f"kl's clients connect to {doors['0.7']} (PLAINTEXT)" in err
    both.logged("a kl client connected to a Kafka protocol port")


def test_a_kl_client_without_tls_at_a_tls_port_is_told_to_use_tls(daemons):
    both, secure = daemons
    err = one_line_error("topics", "list", "--server", secure.doors()["0.7"])
    assert "closed the connection at HELLO" in err and "(then --tls)" in err
    secure.logged(r"a plaintext client connected to a TLS listener \(this protocol is not served in plaintext here\)")
    err = one_line_error("topics", "list", "--server", both.doors()["SSL"])
    assert "closed the connection at HELLO" in err  # a Kafka port over TLS: reset, as the daemon reads nothing
    both.logged(rf"a plaintext client connected to a TLS listener \(plaintext is on {both.doors()['PLAINTEXT']} \(PLAINTEXT\)\)")


def test_a_kl_client_with_tls_at_a_plaintext_port_is_told_to_leave_it_out(daemons, pems):
    both, _ = daemons
    err = one_line_error("topics", "list", "--server", both.doors()["0.7"], "--tls", "--tls-ca", pems["ca"])
    assert "no TLS connection to" in err and "(a plaintext port? leave out --tls)" in err
    both.logged(r"a TLS client connected to a plaintext listener \(this protocol is not served over TLS here\)")


def test_kafka_clients_at_the_wrong_door_are_logged_once_where_they_retry(daemons, pems):
    both, _ = daemons
    doors = both.doors()
    for config in (
        {"bootstrap.servers": doors["0.7"]},
        {"bootstrap.servers": doors["PLAINTEXT"], "security.protocol": "SSL", "ssl.ca.location": pems["ca"]},
    ):
        admin = confluent_kafka.admin.AdminClient({**config, "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50})
        with pytest.raises(confluent_kafka.KafkaException):
            admin.list_topics(timeout=2)  # about 40 tries
        del admin
    kafka = both.logged(r"a Kafka client \(ApiVersions v\d\) connected to Kafka 0\.7's port")
    served = f"today's protocol: it is served on {doors['PLAINTEXT']} (PLAINTEXT), {doors['SSL']} (SSL)"
    assert len(kafka) == 1 and served in kafka[0]
    tls = both.logged(rf"a TLS client connected to a plaintext listener \(TLS is on {doors['SSL']} \(SSL\)\)")
    assert len(tls) == 1
