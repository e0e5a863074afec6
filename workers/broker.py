"""The Redis broker transport, with one fix for the thread pool (batching workers).

When a batching worker loses its Redis broker (a restart), Celery closes the lost connection;
kombu has already let go of the connection's client by then, so restoring the channel's unacked
messages fails (AttributeError on the connection's hostname), and Celery stops the worker's
consumer as an "Unrecoverable error": the process stays up and never consumes again (measured:
tests/workers/test_faults.py, batching).  Here that restore is skipped when the connection is
gone, so the consumer reconnects as it does on the prefork pool.  Nothing is lost: the messages
stay in the broker's unacked hash, which kombu restores to their queues after the visibility
timeout (a Redis that lost them lost them anyway), and a job whose message is lost is resent
by the reaper from SQL (workers/watch.py); a job delivered twice is fenced by its SQL claim.
The same goes for the ack (or reject) of a task that ends after its channel was lost: skipped,
where kombu would stop the consumer again.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

log = logging.getLogger("setflow.broker")
SCHEMES = ("redis", "rediss", "redis+socket")  # the URL schemes of kombu's Redis transport


class QoS(kombu_redis.QoS):
    """A QoS whose channel may have lost its connection: what it would do on it is skipped."""

    def _gone(self) -> bool:
        conn = self.channel.connection  # the transport; None once the channel is closed
        return conn is None or conn.client is None

    def restore_unacked(self, client: Any = None) -> Any:
        if client is None and self._gone():
            log.warning("broker connection gone: %d unacked message(s) left for the visibility timeout",
                        len(self._delivered))
            self._delivered.clear()
            return []
        return super().restore_unacked(client)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: Any) -> None:
        if self._gone():  # a task that ended after its channel was lost (the thread pool's tasks outlive it)
            log.warning("broker connection gone: the ack of a finished task is skipped (its redelivery is fenced)")
            self._delivered.pop(delivery_tag, None)
            return
        super().ack(delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._gone():
            log.warning("broker connection gone: a reject is skipped (the message is restored after the visibility timeout)")
            self._delivered.pop(delivery_tag, None)
            return
        super().reject(delivery_tag, requeue)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel


def install() -> None:
    """Redis broker URLs use this transport (in this process)."""
    for scheme in SCHEMES:
        if TRANSPORT_ALIASES.get(scheme) == "kombu.transport.redis:Transport":
            TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
