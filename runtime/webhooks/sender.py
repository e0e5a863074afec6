"""The webhook sender (`WebhookSender`): delivers the outbox messages due (runtime/webhooks/outbox.py
writes them), signed, each within its deadline (runtime/webhooks/transport.py), in fair shares of
its slots, retried with backoff for up to webhook_retry_for_s, each with one id on every attempt
(receivers deduplicate by it: delivery is at least once).  Knows nothing of workers or routes."""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import Engine, delete, func, or_, select, update
from sqlalchemy.orm import sessionmaker
from standardwebhooks import Webhook

from runtime.db import writer
from runtime.settings import Settings, deployment_key
from runtime.tables import WebhookEndpointRecord, WebhookMessageRecord
from runtime.webhooks.outbox import matched_rows
from runtime.webhooks.sealed import CLEAR, Unsealable, key_of, seal, unseal
from runtime.webhooks.transport import bounded, client

LEASE_MARGIN_S = 30.0  # a claim outlasts the latest end of its request by this much before another sender may take it
POOL = 16  # deliveries one pass makes at once (each endpoint's messages go one after the other)
PER_TENANT = 4  # of those, to one tenant's endpoints at most: a tenant's slow receivers leave the rest to others
PER_ENDPOINT = 10  # messages of one endpoint a pass takes, at most (the others stay due, for the next pass)
M = WebhookMessageRecord


def backoff(attempts: int, base: float, cap: float, rand: float) -> float:
    """The wait after a message's attempts-th failure: base, 2 base, 4 base, ... at most cap,
    each up to a quarter shorter at random (rand in [0, 1)), so that the messages a receiver's
    outage held back do not all come again at one moment."""
    return min(cap, base * 2.0 ** min(attempts - 1, 60)) * (1 - 0.25 * rand)


@dataclass(frozen=True)
class Due:
    """A message read for sending."""

    id: str
    tenant: str
    endpoint_id: str
    payload: dict[str, Any]
    attempts: int
    created: float  # epoch seconds


class WebhookSender:
    """Delivers the outbox: any number of senders (one per worker) share it; each message is
    claimed by an UPDATE that pushes its next_attempt_at past the latest end of its request (a
    lease), so two senders do not send it at the same time, and a sender that died holding it
    only delays it.  Its deliveries run on its own threads, past the pass that started them (a
    pass does not wait for its slowest endpoint).  Time is `now` where a caller gives it (tests
    drive the backoff with it); the signature's timestamp is always the clock's (receivers check
    it against theirs), and the deadlines are the clock's too."""

    def __init__(self, engine: Engine, settings: Settings, http: httpx.Client | None = None,
                 rand: Callable[[], float] = random.random, wait_s: float = 0.0) -> None:
        self.s = settings
        self.wait_s = wait_s  # how long a pass waits for the batches it started (math.inf: for all in flight)
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)
        self.http = http or client(settings.webhook_timeout_s, settings.webhook_allow_private)
        self.rand = rand
        self.key = key_of(deployment_key(settings))
        self._pool = ThreadPoolExecutor(POOL, thread_name_prefix="setflow-webhook")
        self._running: dict[Future[Counter[str]], tuple[str, str]] = {}  # a batch in flight -> (tenant, endpoint id)

    def close(self) -> None:
        """Waits for the deliveries in flight (each ends by its deadline)."""
        self._pool.shutdown(wait=True)
        self.http.close()

    def deliver_due(self, limit: int = 100, now: float | None = None) -> dict[str, int]:
        """One pass over at most `limit` messages due, in fair shares: the tenants in turn (each
        one's oldest due first), at most PER_ENDPOINT of one endpoint.  Each endpoint's batch
        goes on a thread of its own, its messages in order, at most POOL batches in flight and
        PER_TENANT of one tenant's (those past either, and the endpoints already in flight, stay
        due for a later pass).  Every request ends by its deadline (webhook_timeout_s, connect to
        last byte, whatever the receiver does), and a batch starts no request after
        webhook_timeout_s.  The pass waits for the batches it started self.wait_s at most (none:
        the workers' passes; math.inf: until every batch in flight has ended, as tests do), and
        returns: a batch still in flight goes on, and what it did is counted by a later pass, so
        a slow receiver holds a slot, never the sender.  At an
        endpoint's first failure its other messages of the batch wait as long as that one
        (`deferred`, not counted as attempts): a receiver that is down or slow costs a batch one
        request, not one per message.  Returns how many the batches that ended since the last
        pass delivered, retried (failed, to be sent again), failed (retries ran out), deferred and
        dropped (their endpoint was deleted)."""
        now = time.time() if now is None else now
        counts = self._collect()  # the batches that ended since the last pass free their slots
        busy = {endpoint_id for _, endpoint_id in self._running.values()}
        by_endpoint: dict[str, list[Due]] = defaultdict(list)
        for m in self._due(limit, now, busy):  # in the fair order: each endpoint's first message in its tenant's turn
            by_endpoint[m.endpoint_id].append(m)
        with self._db() as db:
            endpoints = {e.id: e for e in db.scalars(select(WebhookEndpointRecord)
                                                     .where(WebhookEndpointRecord.id.in_(list(by_endpoint))))}
        tenants = Counter(tenant for tenant, _ in self._running.values())
        started = []
        for endpoint_id, messages in by_endpoint.items():
            tenant = messages[0].tenant
            if len(self._running) < POOL and tenants[tenant] < PER_TENANT:
                tenants[tenant] += 1
                started.append(self._pool.submit(self._deliver_to, endpoints.get(endpoint_id), messages, now))
                self._running[started[-1]] = (tenant, endpoint_id)
        if math.isinf(self.wait_s):
            wait(list(self._running))
        elif started and self.wait_s > 0:
            wait(started, timeout=self.wait_s)  # this pass's own batches (not those earlier passes left in flight)
        counts.update(self._collect())
        return {k: counts[k] for k in ("delivered", "retried", "failed", "deferred", "dropped")}

    def _collect(self) -> Counter[str]:
        """What the batches that have ended did (they leave _running)."""
        done = [f for f in self._running if f.done()]
        for f in done:
            del self._running[f]
        counts: Counter[str] = Counter()
        for f in done:
            counts.update(f.result())  # a batch's exception (BaseException too) is the caller's
        return counts

    def _due(self, limit: int, now: float, busy: set[str]) -> list[Due]:
        """At most `limit` messages due, at most PER_ENDPOINT of an endpoint, none of an endpoint
        in `busy`, the tenants in turn: every tenant's oldest due, then every tenant's second, ...
        (a tenant with thousands due does not fill a pass another's one message waits behind)."""
        ranked = select(M.id, M.tenant, M.endpoint_id, M.payload, M.attempts, M.created_at, M.next_attempt_at,
                        func.row_number().over(partition_by=M.endpoint_id, order_by=(M.next_attempt_at, M.id))
                        .label("of_endpoint"),
                        func.row_number().over(partition_by=M.tenant, order_by=(M.next_attempt_at, M.id))
                        .label("of_tenant")).where(*_pending(), M.next_attempt_at <= now,
                                                   M.endpoint_id.not_in(busy)).subquery()
        with self._db() as db:
            return [Due(r.id, r.tenant, r.endpoint_id, r.payload, r.attempts, epoch(r.created_at)) for r in db.execute(
                select(ranked).where(ranked.c.of_endpoint <= PER_ENDPOINT)
                .order_by(ranked.c.of_tenant, ranked.c.next_attempt_at, ranked.c.id).limit(limit))]

    def prune(self, now: float | None = None, limit: int = 1000) -> int:
        """Delete up to `limit` delivered or failed messages created more than job_retention_s
        ago (their jobs' retention); returns how many.  Then seals up to `limit` secrets still
        kept in the clear (seal_clear)."""
        self.seal_clear(limit)
        cutoff = datetime.fromtimestamp((time.time() if now is None else now) - self.s.job_retention_s, UTC)
        with self._write.begin() as db:
            old = select(M.id).where(M.created_at < cutoff, or_(M.delivered_at.is_not(None), M.failed_at.is_not(None))) \
                .order_by(M.created_at).limit(limit)
            return matched_rows(db.execute(delete(M).where(M.id.in_(old.scalar_subquery()))))

    def seal_clear(self, limit: int = 1000) -> int:
        """Seal up to `limit` endpoints' secrets kept in the clear (written before secret_key was
        set), where there is a key; returns how many.  Each only as it was read: a row changed
        meanwhile is left for the next call."""
        if self.key is None:
            return 0
        n = 0
        with self._write.begin() as db:
            clear = db.execute(select(WebhookEndpointRecord.id, WebhookEndpointRecord.tenant, WebhookEndpointRecord.secret)
                               .where(WebhookEndpointRecord.secret.startswith(CLEAR)).limit(limit)).all()
            for endpoint_id, tenant, secret in clear:
                n += matched_rows(db.execute(update(WebhookEndpointRecord)
                                      .where(WebhookEndpointRecord.id == endpoint_id, WebhookEndpointRecord.secret == secret)
                                      .values(secret=seal(secret, tenant, endpoint_id, self.key))))
        return n

    def _deliver_to(self, endpoint: WebhookEndpointRecord | None, messages: list[Due], now: float) -> Counter[str]:
        """One endpoint's batch, its messages in order; none started after webhook_timeout_s."""
        stop = time.monotonic() + self.s.webhook_timeout_s
        out: Counter[str] = Counter()
        if endpoint is None:  # deleted after its job's ending wrote the messages
            with self._write.begin() as db:
                out["dropped"] += matched_rows(db.execute(delete(M).where(M.id.in_([m.id for m in messages]))))
            return out
        for i, m in enumerate(messages):
            if time.monotonic() >= stop:
                break  # the batch's time is up: the rest stay due, unclaimed
            if not self._claim(m, now):
                continue  # another sender took it
            error = self._send(endpoint, m)
            outcome, next_at = self._record(m, error, now)
            out[outcome] += 1
            if error is not None:
                out["deferred"] += self._defer(messages[i + 1:], next_at, now)
                break
        return out

    def _claim(self, m: Due, now: float) -> bool:
        with self._write.begin() as db:
            return matched_rows(db.execute(update(M).where(M.id == m.id, *_pending(), M.next_attempt_at <= now)
                                    .values(next_attempt_at=now + 2 * self.s.webhook_timeout_s + LEASE_MARGIN_S))) == 1
            # a request starts within webhook_timeout_s of its batch and ends within as much again

    def _send(self, endpoint: WebhookEndpointRecord, m: Due) -> str | None:
        """POST the message, signed, within its deadline (transport.bounded); None when the
        receiver answered 2xx, else why not."""
        try:
            secret = unseal(endpoint.secret, endpoint.tenant, endpoint.id, self.key)
        except Unsealable as e:  # secret_key missing or changed: failed and retried, as any attempt
            return f"Unsealable: {e}"
        body = json.dumps(m.payload, separators=(",", ":"))
        at = datetime.now(UTC)
        headers = {"content-type": "application/json", "webhook-id": m.id,
                   "webhook-timestamp": str(int(at.timestamp())),
                   "webhook-signature": Webhook(secret).sign(m.id, at, body)}
        try:
            with bounded(self.s.webhook_timeout_s), \
                    self.http.stream("POST", endpoint.url, content=body.encode(), headers=headers) as r:
                status = r.status_code  # its body is not read: a receiver's answer is its status
        except Exception as e:  # noqa: BLE001 - refused, past the deadline, a bad answer: retried alike
            return f"{type(e).__name__}: {e}"[:500]
        return None if 200 <= status < 300 else f"HTTP {status}"

    def _record(self, m: Due, error: str | None, now: float) -> tuple[str, float]:
        """The attempt's outcome: delivered, retried (due again after the backoff, at most at the
        deadline) or failed (the deadline passed), and when it is due next.  Only while the
        message is pending: another sender's success stands."""
        at = datetime.fromtimestamp(now, UTC)
        deadline = m.created + self.s.webhook_retry_for_s
        next_at = min(deadline, now + backoff(m.attempts + 1, self.s.webhook_retry_base_s, self.s.webhook_retry_max_s,
                                              self.rand()))
        if error is None:
            outcome, values = "delivered", {"delivered_at": at, "last_error": ""}
        elif now >= deadline:
            outcome, values = "failed", {"failed_at": at, "last_error": error}
        else:
            outcome, values = "retried", {"next_attempt_at": next_at, "last_error": error}
        with self._write.begin() as db:
            db.execute(update(M).where(M.id == m.id, *_pending()).values(attempts=M.attempts + 1, **values))
        return outcome, next_at

    def _defer(self, messages: list[Due], until: float, now: float) -> int:
        if not messages:
            return 0
        with self._write.begin() as db:
            return matched_rows(db.execute(update(M).where(M.id.in_([m.id for m in messages]), *_pending(),
                                                    M.next_attempt_at <= now).values(next_attempt_at=until)))


def _pending() -> tuple[Any, ...]:
    """The where-clause of a message still to send (the due index's condition)."""
    return M.delivered_at.is_(None), M.failed_at.is_(None)


def epoch(dt: datetime) -> float:
    """Epoch seconds of a stored time (SQLite gives it back without its UTC zone)."""
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()
