"""SASL on ``kl serve``'s Kafka listeners (SASL_PLAINTEXT): PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 against the credentials kept in the root, through real clients
(confluent-kafka, kafka-python, kcat) and raw sockets; ``kl users``."""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse

import kl
from kl.net import daemon
from kl.net.credentials import Credentials
from kl.net.kafka import sasl
from kl.net.server import Listener, ServeConfig, Server
from kl_cli.main import cli

from kafkafuzz import answers, framed

KCAT = subprocess.run(["sh", "-c", "command -v kcat || command -v kafkacat"], capture_output=True, text=True).stdout.strip()
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PASSWORD = "s3cret pw"


class Sasl:
    """A server in this process with one SASL_PLAINTEXT Kafka listener."""

    def __init__(self, root: kl.Root, **config):
        config = {"port": None, "kafka_port": 0, "allow_produce": True, "auto_create": True, **config}
        self.server = Server(root, ServeConfig(**config), [Listener("127.0.0.1", 0, daemon._kafka, "SASL_PLAINTEXT")])
        self.address = ("127.0.0.1", self.server.ports[0])
        self.bootstrap = f"127.0.0.1:{self.server.ports[0]}"
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(20)
        assert not self.thread.is_alive()


@pytest.fixture
def users(root):
    c = Credentials(root.path)
    c.add("alice", PASSWORD, "SCRAM-SHA-256")
    c.add("alice", PASSWORD, "SCRAM-SHA-512", iterations=8192)
    c.add("bob", "other password", "SCRAM-SHA-512")
    return c


@pytest.fixture
def served(root, users):
    started: list[Sasl] = []

    def start(**config) -> Sasl:
        started.append(Sasl(root, **config))
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
    consumer = Consumer(confluent(s.bootstrap, mechanism, "alice", PASSWORD, **{"group.id": "g", "auto.offset.reset": "earliest"}))
    consumer.subscribe(["t"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        m = consumer.poll(1)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    assert got == [f"v{i}".encode() for i in range(5)]
