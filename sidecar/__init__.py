"""Kafka tiered-storage sidecar.

Only the version lives here: importing the package must stay cheap, because Spark executors import
``sidecar.kafka`` and must not pull in the daemon's event-loop code.
"""

__version__ = "0.1.0"
