"""Where a job goes: queue names, worker liveness, and session affinity, in Redis.

Queues (every name starts with the key prefix, so deployments sharing a broker stay apart):

    {p}.interactive     turns and narratives: the shared queue workers serve first
    {p}.batch           reports and other long jobs
    {p}.w.{worker}      one worker's own queue: turns of the sessions it holds warm
    {p}.h.{pool}.interactive, {p}.h.{pool}.batch
                        the shared queues of one model and numerics (runtime/jobs/hosts.py's
                        pool, "small.cpu-float32"): a bound session's jobs, served by every
                        worker that hosts them; the two above serve sessions bound to no model

A worker says it is alive by refreshing `{p}:alive:{worker}` (TTL: three heartbeats) and its
time in `{p}:workers` (the list of live workers reads that sorted set: O(log n), no scan).  After a
turn it records itself as the session's last worker (`{p}:aff:{session}`, TTL affinity_ttl_s).
While it runs jobs, `{p}:busy:{worker}` holds how many of each tenant's (a hash, said at each
job's start and end); a job sent to its own queue is on its way there (`{p}:onway:{worker}`)
until the worker takes it, counted running before it leaves the set (never neither: a burst
placed faster than workers start their jobs would see idle workers that are not).

A session's next job goes to that worker's queue while the worker is alive and not busy past a
bound (its own queue's backlog).  Any other job is placed (Routing.place) on a worker of its
model and numerics: while its tenant runs on fewer workers than its share (the live workers /
the tenants active lately, at least 1), an idle one (none running, none on its way; at random
among them), else the least busy one running only its tenant's jobs with a slot free (its jobs
running and on their way fewer than its slots); past its share, the latter first, then an idle
one.  A tenant alone (no other active within the window), or none such:
the shared queue of its priority (and pool), where
any worker that hosts them restores the session from Redis.  A shared queue goes to whichever
worker polls first, often one running another tenant's jobs already: a job that shared a
worker process with another tenant's took twice its time alone, however their turns were
batched (the jobs' Python, SQL and events share one interpreter), while the other worker
sat idle (docs/BENCHMARKS.md, "Placed on workers of their own").  Placed, a tenant's jobs
keep to workers of their own while there are workers enough.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

import redis

from runtime.jobs.fairness import worker_share
from runtime.jobs.hosts import Host, Hosts
from runtime.keys import Keys
from runtime.replies import text as _text
from runtime.settings import Settings


def is_amqp(settings: Settings) -> bool:
    """The broker is RabbitMQ (BROKER_URL amqp://...), else a Redis."""
    return (settings.broker_url or "").startswith(("amqp://", "amqps://", "pyamqp://"))


#: RabbitMQ: one shared queue for both priorities, its messages carrying their priority (the
#: queue is declared with x-max-priority: an interactive job goes before the batch ones waiting)
AMQP_PRIORITY = {"interactive": 9, "batch": 1}
AMQP_MAX_PRIORITY = 10


def shared_queue(settings: Settings, priority: str, pool: str = "") -> str:
    """The shared queue of a priority: a queue each on Redis (a worker polls interactive before
    batch, workers/queue_order.py); one priority queue on RabbitMQ.  pool: of one model and
    numerics (runtime/jobs/hosts.py); "": of sessions bound to none."""
    head = f"{settings.key_prefix}.h.{pool}" if pool else settings.key_prefix
    return f"{head}.shared" if is_amqp(settings) else f"{head}.{priority}"


def own_queue(settings: Settings, worker: str) -> str:
    return f"{settings.key_prefix}.w.{worker}"


# KEYS[1] a worker's busy hash; ARGV: its TTL s, then tenant, count, ...: the hash becomes
# exactly those (none: gone), in one step (no reader sees it empty between two writes)
_RUNNING = """
redis.call('DEL', KEYS[1])
if #ARGV > 1 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return 1
"""


class Routing:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)
        self.depth = QueueDepth(settings, client)
        self._running = client.register_script(_RUNNING)

    # ---- queue names ------------------------------------------------------------------------

    def shared(self, priority: str, pool: str = "") -> str:
        return shared_queue(self.s, priority, pool)

    def own(self, worker: str) -> str:
        return own_queue(self.s, worker)

    def worker_of(self, queue: str) -> str | None:
        """The worker whose own queue this is; None for a shared queue."""
        head = f"{self.s.key_prefix}.w."
        return queue[len(head):] if queue.startswith(head) else None

    # ---- liveness and affinity --------------------------------------------------------------

    def beat(self, worker: str, slots: int = 1) -> None:
        """Alive for three heartbeats; slots: the jobs it runs at once (its batch)."""
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.k.alive(worker), max(1, slots), px=int(3000 * self.s.worker_heartbeat_s))
        pipe.zadd(self.k.workers, {worker: now})
        pipe.zremrangebyscore(self.k.workers, "-inf", now - 3 * self.s.worker_heartbeat_s)  # the dead leave
        pipe.execute()

    def gone(self, worker: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(self.k.alive(worker))
        pipe.delete(self.k.busy(worker))
        pipe.zrem(self.k.workers, worker)
        pipe.execute()

    def alive(self, worker: str) -> bool:
        return bool(self.r.exists(self.k.alive(worker)))

    def live_workers(self) -> list[str]:
        """Every worker that beat within three heartbeats, by name."""
        since = time.time() - 3 * self.s.worker_heartbeat_s
        return sorted(_text(w) for w in self.r.zrangebyscore(self.k.workers, since, "+inf"))

    def live(self) -> tuple[int, int]:
        """(the live workers, the jobs they run at once together: each says its own with its
        beat)."""
        workers = self.live_workers()
        pipe = self.r.pipeline(transaction=False)
        for w in workers:
            pipe.get(self.k.alive(w))
        total = 0
        for got in pipe.execute() if workers else []:
            try:
                total += int(got) if got is not None else 0
            except ValueError:
                total += 1
        return len(workers), total

    def touch(self, session: str, worker: str) -> None:
        self.r.set(self.k.affinity(session), worker, ex=self.s.affinity_ttl_s)

    def last_worker(self, session: str) -> str | None:
        w = self.r.get(self.k.affinity(session))
        return _text(w) if w is not None else None

    def running(self, worker: str, jobs: dict[str, int]) -> None:
        """The jobs the worker runs now, per tenant (said at each start and end):
        `{p}:busy:{worker}` while there are any.  It expires after the hard time limit, so that
        a count a crash left behind (the process gone between a start and its end) does not
        keep the worker busy for ever; the next start or end says them all again."""
        flat = [x for t, n in jobs.items() if n > 0 for x in (t, n)]
        self._running(keys=[self.k.busy(worker)], args=[self.s.task_time_limit_s, *flat])

    def sent(self, worker: str, job: str, tenant: str) -> None:
        """The job goes to the worker's own queue: on its way until the worker takes it
        (Routing.taken), or for job_requeue_after_s at most (by then the reaper sends it
        elsewhere; a worker that died with it does not look busy for ever)."""
        now, key = time.time(), self.k.onway(worker)
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(key, {_onway(job, tenant): now})
        pipe.zremrangebyscore(key, "-inf", now - self.s.job_requeue_after_s)
        pipe.expire(key, max(1, int(self.s.job_requeue_after_s)))
        pipe.execute()

    def taken(self, worker: str, job: str, tenant: str) -> None:
        """The worker took the job from its queues (to run it, or to refuse a late copy)."""
        self.r.zrem(self.k.onway(worker), _onway(job, tenant))

    def place(self, tenant: str, pool: str = "", active: int = 1) -> str | None:
        """A worker for a job of `tenant` with no warm worker, or None (the shared queue): see
        the module's doc.  active: the tenants active lately (runtime/jobs/fairness.py), this
        one among them.  None too for a tenant alone, or where one worker lives (its own queue
        and the shared one are the same to it)."""
        # a tenant alone keeps nobody apart: the shared queue, which spreads its burst of new
        # sessions more evenly than placing would (bench/load.py)
        live = self.live_workers() if active > 1 else []
        if len(live) < 2:
            return None
        since = time.time() - self.s.job_requeue_after_s
        pipe = self.r.pipeline(transaction=False)  # one round trip for them all
        for w in live:
            pipe.hgetall(self.k.busy(w))
            pipe.zrangebyscore(self.k.onway(w), since, "+inf")
            pipe.get(self.k.host(w))
            pipe.get(self.k.alive(w))  # its slots
        got = pipe.execute()
        runs: dict[str, Counter[str]] = {}  # worker -> its jobs running or on their way, per tenant
        slots: dict[str, int] = {}  # worker -> the jobs it runs at once (its beat says)
        for w, busy, onway, host, alive in zip(live, *(got[i::4] for i in range(4)), strict=True):
            if not pool or ((h := Host.read(host)) is not None and h.pool == pool):
                runs[w] = Counter({_text(t): int(n) for t, n in busy.items() if _text(n).isdigit()})
                runs[w].update(t for t in map(_onway_tenant, onway) if t is not None)
                runs[w] = +runs[w]  # none of a tenant: not there
                slots[w] = int(alive) if alive is not None and _text(alive).isdigit() else 1
        workers = list(runs)
        if len(workers) < 2:
            return None
        random.shuffle(workers)  # ties at random
        idle = [w for w in workers if not runs[w]]
        mine = sorted((w for w in workers if set(runs[w]) == {tenant}), key=lambda w: runs[w][tenant])  # least busy first
        holds = sum(tenant in runs[w] for w in workers)
        share = worker_share(len(workers), active)
        # an idle worker; one of its own with a slot free for it (its jobs running and on their
        # way fewer than its slots: a burst of the tenant's jobs stays there rather than
        # spilling over onto another tenant's worker, and never queues behind a full one)
        for w in (idle + mine if holds < share else mine + idle):
            if runs[w].total() < slots[w]:
                return w
        return None

    def route(self, session: str | None, priority: str, pool: str = "", tenant: str = "", active: int = 1) -> str:
        """The queue for a job: the session's last worker's, while it is alive, hosts the
        session's model and numerics (pool) and its own queue holds fewer than
        affinity_max_waiting messages; else a worker's placed for its tenant (Routing.place);
        else the shared queue of its priority and pool (a busy worker's session is restored
        from Redis by another rather than waiting behind its backlog)."""
        w = self.last_worker(session) if session is not None else None
        if w is not None and self.alive(w) and self.depth(self.own(w)) < self.s.affinity_max_waiting \
                and (not pool or self._hosts(w, pool)):
            return self.own(w)
        placed = self.place(tenant, pool, active)
        return self.own(placed) if placed is not None else self.shared(priority, pool)

    def _hosts(self, worker: str, pool: str) -> bool:
        host = Hosts(self.r, self.s).of(worker)
        return host is not None and host.pool == pool


def _onway(job: str, tenant: str) -> str:
    """A job on its way to a worker, as a member of its onway set (JSON: any tenant name)."""
    return json.dumps([job, tenant])


def _onway_tenant(member: bytes | str) -> str | None:
    """The tenant of an onway member; None for one this version did not write."""
    try:
        job, tenant = json.loads(member)
    except (ValueError, TypeError):
        return None
    return tenant if isinstance(tenant, str) else None


def consumed_by(settings: Settings, worker: str, pool: str = "") -> list[str]:
    """A worker's queues, in the order it serves them: its own (warm sessions), then
    interactive, then batch (on RabbitMQ: its own, then the shared priority queue); with a pool
    (the model and numerics it hosts), that pool's shared queues before the unbound ones of the
    same priority."""
    pools = [pool, ""] if pool else [""]
    return list(dict.fromkeys([own_queue(settings, worker), *(shared_queue(settings, "interactive", p) for p in pools),
                               *(shared_queue(settings, "batch", p) for p in pools)]))


class QueueDepth:
    """Messages waiting in a broker queue: LLEN on the broker's Redis (BROKER_URL, else the KV
    Redis, under the broker's key prefix), or a passive declare on RabbitMQ.  0 for a queue the
    broker does not hold."""

    def __init__(self, settings: Settings, kv: redis.Redis) -> None:
        self.s = settings
        self.k = Keys(settings.key_prefix)
        url = settings.broker_url
        self._redis = kv if url is None else (redis.Redis.from_url(url.replace("redis+socket://", "unix://"))
                                              if not is_amqp(settings) else None)
        self._amqp: Any = None

    def __call__(self, queue: str) -> int:
        if self._redis is not None:
            return int(self._redis.llen(self.k.broker + queue))
        from kombu.connection import Connection  # RabbitMQ only

        for _ in range(2):
            try:
                if self._amqp is None:
                    self._amqp = Connection(self.s.broker_url, connect_timeout=5)  # type: ignore[no-untyped-call]
                return int(self._amqp.default_channel.queue_declare(queue, passive=True).message_count)
            except Exception as e:  # noqa: BLE001 - a queue not declared yet, or a lost connection
                _close(self._amqp)
                self._amqp = None
                if "NOT_FOUND" in str(e) or "404" in str(e):
                    return 0
        return 0


    def close(self) -> None:
        """The RabbitMQ connection it opened, if any."""
        _close(self._amqp)
        self._amqp = None


def _close(conn: Any) -> None:
    try:
        if conn is not None:
            conn.release()
    except Exception:  # noqa: BLE001 - it is gone either way
        pass
