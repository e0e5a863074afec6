"""Where a job goes: queue names, worker liveness, and session affinity, in Redis.

Queues (every name starts with the key prefix, so deployments sharing a broker stay apart):

    {p}.interactive     turns and narratives: the shared queue workers serve first
    {p}.batch           reports and other long jobs
    {p}.w.{worker}      one worker's own queue: turns of the sessions it holds warm

A worker says it is alive by refreshing `{p}:alive:{worker}` (TTL: three heartbeats) and its
time in `{p}:workers` (the list of live workers reads that sorted set: O(log n), no scan).  After a
turn it records itself as the session's last worker (`{p}:aff:{session}`, TTL affinity_ttl_s).
A session's next job goes to that worker's queue while the worker is alive, else to the shared
queue of its priority, where any worker restores the session from Redis.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from runtime.keys import Keys
from runtime.settings import Settings


def shared_queue(settings: Settings, priority: str) -> str:
    return f"{settings.key_prefix}.{priority}"


def own_queue(settings: Settings, worker: str) -> str:
    return f"{settings.key_prefix}.w.{worker}"


class Routing:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)

    # ---- queue names ------------------------------------------------------------------------

    def shared(self, priority: str) -> str:
        return shared_queue(self.s, priority)

    def own(self, worker: str) -> str:
        return own_queue(self.s, worker)

    def worker_of(self, queue: str) -> str | None:
        """The worker whose own queue this is; None for a shared queue."""
        head = f"{self.s.key_prefix}.w."
        return queue[len(head):] if queue.startswith(head) else None

    # ---- liveness and affinity --------------------------------------------------------------

    def beat(self, worker: str) -> None:
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.k.alive(worker), 1, px=int(3000 * self.s.worker_heartbeat_s))
        pipe.zadd(self.k.workers, {worker: now})
        pipe.zremrangebyscore(self.k.workers, "-inf", now - 3 * self.s.worker_heartbeat_s)  # the dead leave
        pipe.execute()

    def gone(self, worker: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(self.k.alive(worker))
        pipe.zrem(self.k.workers, worker)
        pipe.execute()

    def alive(self, worker: str) -> bool:
        return bool(self.r.exists(self.k.alive(worker)))

    def live_workers(self) -> list[str]:
        """Every worker that beat within three heartbeats, by name."""
        since = time.time() - 3 * self.s.worker_heartbeat_s
        return sorted(_text(w) for w in self.r.zrangebyscore(self.k.workers, since, "+inf"))

    def touch(self, session: str, worker: str) -> None:
        self.r.set(self.k.affinity(session), worker, ex=self.s.affinity_ttl_s)

    def last_worker(self, session: str) -> str | None:
        w = self.r.get(self.k.affinity(session))
        return _text(w) if w is not None else None

    def route(self, session: str | None, priority: str) -> str:
        """The queue for a job: the session's last worker's, while it is alive; else shared."""
        w = self.last_worker(session) if session is not None else None
        if w is not None and self.alive(w):
            return self.own(w)
        return self.shared(priority)


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def consumed_by(settings: Settings, worker: str) -> list[str]:
    """A worker's queues, in the order it serves them: its own (warm sessions), then
    interactive, then batch."""
    return [own_queue(settings, worker), shared_queue(settings, "interactive"), shared_queue(settings, "batch")]
