"""The network layer: everything on a socket.

``wire`` is Kafka 0.7's codec (kl's own client speaks it too), ``server`` the daemon
``kl serve`` runs, ``remote`` kl's client of it, ``brokers`` the registry of running
daemons under a root.
"""
