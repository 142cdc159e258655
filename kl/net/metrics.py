"""``kl serve --metrics``: what the daemon does, in Prometheus's text format, served on
``/metrics`` by ``prometheus_client`` from the daemon's own registry.

Names are those Kafka's brokers give their metrics as Prometheus's JMX exporter turns
them into Prometheus names (its Kafka rules: ``kafka.network:type=RequestMetrics,
name=RequestsPerSec,request=Produce,version=9`` is
``kafka_network_requestmetrics_requests_total{request="Produce",version="9"}``), so that
dashboards made for Kafka read kl; what Kafka has no metric for is ``kl_...``.  Every
metric, its type and labels are listed in ``man/kl-serve.1``.

Counting is done on the way (a counter's child, looked up once per label set and kept by
the caller, takes an ``inc``); what the daemon holds anyway (answer memory, groups by
state, producer ids) is read when scraped.  Labels are bounded: request types and
versions kl serves, error names, listeners, served topics, ACL operations.  Another
collector (one reading the partitions' files, say) joins with ``Metrics.register``.

The endpoint is a wsgiref server with a thread per scrape; a connection from a host
outside the daemon's allowed networks (``ServeConfig.allows``) is closed unanswered, and
counted.  Not thread-safe to start or close from two threads at once; counting is.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.registry import Collector

log = logging.getLogger("kl.serve")

TIME_BUCKETS_MS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
"""The latency histograms' buckets, in milliseconds (a parked fetch waits up to its max_wait_ms)."""
SCRAPE_TIMEOUT = 10.0
"""How long a connection to the endpoint may take to send its request, or to take the answer."""
METRICS_LISTENER = "METRICS"
"""The ``listener`` label of the endpoint's own refused connections."""


class Metrics:
    """The daemon's metrics, on a registry of their own (``registry``): the counters and
    gauges the server core and the front ends update, by the names Kafka gives them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry

        def counter(name: str, text: str, *labels: str) -> Counter:
            return Counter(name, text, labels, registry=registry)

        def gauge(name: str, text: str, *labels: str) -> Gauge:
            return Gauge(name, text, labels, registry=registry)

        # today's Kafka protocol
        self.requests = counter(
            "kafka_network_requestmetrics_requests", "Requests of today's Kafka protocol answered.", "request", "version"
        )
        self.errors = counter(
            "kafka_network_requestmetrics_errors",
            "Error codes in the answers of today's Kafka protocol (the request's, each topic's and partition's; NONE counts).",
            "request",
            "error",
        )
        self.total_time = Histogram(
            "kafka_network_requestmetrics_totaltimems",
            "Milliseconds from a request read whole to its answer queued (a parked fetch's wait included).",
            ["request"],
            buckets=TIME_BUCKETS_MS,
            registry=registry,
        )
        # Kafka 0.7's protocol and kl's own requests on its port
        self.kafka07_requests = counter("kl_kafka07_requests", "Requests on Kafka 0.7's port answered.", "request")
        self.kafka07_errors = counter(
            "kl_kafka07_errors", "Error codes in the answers on Kafka 0.7's port (NO_ERROR counts).", "request", "error"
        )
        self.kafka07_total_time = Histogram(
            "kl_kafka07_totaltimems",
            "Milliseconds from a request on Kafka 0.7's port read whole to its answer queued.",
            ["request"],
            buckets=TIME_BUCKETS_MS,
            registry=registry,
        )
        # topics
        self.topic_bytes_in = counter(
            "kafka_server_brokertopicmetrics_bytesin", "Bytes of the message sets clients produced, as they sent them.", "topic"
        )
        self.topic_messages_in = counter("kafka_server_brokertopicmetrics_messagesin", "Messages appended.", "topic")
        self.topic_bytes_out = counter(
            "kafka_server_brokertopicmetrics_bytesout", "Bytes of messages put into fetch answers.", "topic"
        )
        # connections
        self.bytes_in = counter(
            "kafka_server_socket_server_metrics_incoming_byte", "Bytes read from clients (decrypted, on TLS).", "listener"
        )
        self.bytes_out = counter(
            "kafka_server_socket_server_metrics_outgoing_byte",
            "Bytes of answers sent to clients (segment bytes by sendfile too).",
            "listener",
        )
        self.connections = gauge("kafka_server_socket_server_metrics_connection_count", "Connections open.", "listener")
        self.connections_created = counter(
            "kafka_server_socket_server_metrics_connection_creation", "Connections accepted.", "listener"
        )
        self.connections_closed = counter(
            "kafka_server_socket_server_metrics_connection_close", "Connections closed.", "listener"
        )
        self.refused = counter(
            "kl_connections_refused",
            "Connections refused: allow_list (not in --allow), max_connections, out_of_fds (accepting paused).",
            "listener",
            "reason",
        )
        self.authentications = counter(
            "kafka_server_socket_server_metrics_successful_authentication", "SASL logins that succeeded.", "listener", "mechanism"
        )
        self.authentication_failures = counter(
            "kafka_server_socket_server_metrics_failed_authentication", "SASL logins that failed.", "listener", "mechanism"
        )
        self.denials = counter(
            "kl_authorization_denied", "Requests the ACLs denied (kl serve --acls).", "operation", "resource_type"
        )
        # what the daemon holds
        self.parked = gauge("kl_requests_parked", "Requests parked: fetches waiting for data, group joins for the group.")
        self.answer_memory = gauge("kl_answer_memory_bytes", "Bytes of answers held for clients yet to take them, and reserved.")
        self.producer_ids = gauge(
            "kafka_server_replicamanager_produceridcount",
            "Idempotent producers' ids the partitions this daemon appended to remember.",
        )
        self.groups = gauge(
            "kafka_server_group_coordinator_metrics_classic_group_count", "Groups this daemon coordinates, by state.", "state"
        )
        self.rebalances = counter(
            "kafka_server_group_coordinator_metrics_classic_group_rebalance", "Rebalances of the groups this daemon coordinates."
        )

        self._topics: dict[str, TopicMeters] = {}

    def topic(self, name: str) -> TopicMeters:
        """The topic's counters (kept: a request counts each partition it names)."""
        found = self._topics.get(name)
        if found is None:
            found = self._topics[name] = TopicMeters(self, name)
        return found

    def register(self, collector: Collector) -> None:
        """Have ``collector`` scraped with the daemon's metrics (its names must be its own)."""
        self.registry.register(collector)


class TopicMeters:
    """One topic's counters."""

    __slots__ = ("bytes_in", "messages_in", "bytes_out")

    def __init__(self, metrics: Metrics, name: str):
        self.bytes_in = metrics.topic_bytes_in.labels(name)
        self.messages_in = metrics.topic_messages_in.labels(name)
        self.bytes_out = metrics.topic_bytes_out.labels(name)

    def appended(self, size: int, count: int) -> None:
        self.bytes_in.inc(size)
        self.messages_in.inc(count)


class Traffic:
    """One listener's counters, looked up once (the loop counts every read and send)."""

    __slots__ = ("name", "bytes_in", "bytes_out", "connections", "created", "closed")

    def __init__(self, metrics: Metrics, name: str):
        self.name = name
        """The ``listener`` label: the security protocol (Kafka's default listener names), or KAFKA07."""
        self.bytes_in = metrics.bytes_in.labels(name)
        self.bytes_out = metrics.bytes_out.labels(name)
        self.connections = metrics.connections.labels(name)
        self.created = metrics.connections_created.labels(name)
        self.closed = metrics.connections_closed.labels(name)


class Endpoint:
    """``/metrics`` over HTTP at ``host:port`` (0: any free port, then ``port`` says which),
    for the hosts ``allows`` lets in; bound at once, served from ``start`` until ``close``."""

    def __init__(self, metrics: Metrics, host: str, port: int, allows: Callable[[str], bool]):
        refused = metrics.refused.labels(METRICS_LISTENER, "allow_list")

        class Server(socketserver.ThreadingMixIn, WSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True  # a scrape under way does not hold the daemon's exit

            def verify_request(self, request: Any, client_address: Any) -> bool:
                if allows(client_address[0]):
                    return True
                log.warning("refused %s:%s: not in --allow (metrics)", client_address[0], client_address[1])
                refused.inc()
                return False

        self._server = make_server(host, port, make_wsgi_app(metrics.registry), server_class=Server, handler_class=_Quiet)
        self.address = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="kl-serve-metrics", daemon=True)
        self._thread.start()
        log.info(
            "serving metrics on http://%s:%d/metrics", f"[{self.address}]" if ":" in self.address else self.address, self.port
        )

    def close(self) -> None:
        """Stop serving (scrapes under way are cut off with the process) and close the port."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


class _Quiet(WSGIRequestHandler):
    """No line per scrape on stderr (the daemon's log is its own), and a bound on slow clients."""

    timeout = SCRAPE_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        pass
