"""``kl serve``'s daemon: the server core (``kl.net.server``) with the protocols its
config names, Kafka 0.7's (``kl.net.kafka07``) and today's Kafka protocol
(``kl.net.kafka``), and with ``--metrics`` the root's own figures beside its counters
(``kl.stats``)."""

from __future__ import annotations

import os
from typing import Any

from kl.net.kafka07 import Kafka07
from kl.net.server import FrontEnd, Listener, ServeConfig, Server
from kl.stats import Collector
from kl.topic import Root


class Daemon(Server):
    """Serves ``root`` on the ports ``config`` gives, each protocol on its own; today's
    Kafka protocol's listeners are one broker (one node id, one group coordinator)."""

    def __init__(self, root: Root | str | os.PathLike[str], config: ServeConfig | None = None):
        config = config or ServeConfig()
        listeners = [
            Listener(bind, port, Kafka07 if n == 0 and config.port is not None else _kafka, security)
            for n, (security, bind, port) in enumerate(config.endpoints())
        ]
        super().__init__(root, config, listeners)
        ports = iter(self.ports)
        self.port = None if config.port is None else next(ports)
        """Kafka 0.7's port (the one bound, when 0 was asked)."""
        self.kafka_port = None if config.kafka_port is None else next(ports)
        """Today's Kafka protocol's port (``--kafka``)."""
        self.listener_ports = list(ports)
        """The ports of ``config.listeners``, in their order."""
        if config.metrics is not None:  # log ends, sizes and every group's lag, of the topics served (as reloaded)
            self.metrics.register(Collector(self.root.path, self.served))


def _kafka(server: Server) -> FrontEnd:
    from kl.net.kafka.frontend import Kafka  # kafka-python's classes: loaded only for the Kafka protocol

    shared: Any = next((front for _, front in server.listeners if isinstance(front, Kafka)), None)
    return Kafka(server, None if shared is None else shared.broker)
