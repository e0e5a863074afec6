"""Webhooks for job endings, in the Standard Webhooks format (https://www.standardwebhooks.com):
the outbox messages the transaction that ends a job writes (`enqueue`), a tenant's endpoints
(`Endpoints`), and the sender that delivers the messages due (`WebhookSender`): signed, retried
with backoff for up to webhook_retry_for_s, each with one id on every attempt (receivers
deduplicate by it: delivery is at least once).  A URL reaches public addresses only, unless
webhook_allow_private (runtime/jobs/webhook_http.py: no request from inside the deployment's
network on a tenant's behalf; each delivery bounded by its deadline).  Knows nothing of workers or routes."""

from __future__ import annotations

import base64
import json
import math
import random
import re
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import Engine, case, delete, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks import Webhook

from runtime.db import writer
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.jobs.webhook_http import bounded, client, public
from runtime.jobs.webhook_secrets import CLEAR, Unsealable, key_of, seal, unseal
from runtime.settings import Settings
from runtime.tables import TERMINAL, JobRecord, WebhookEndpointRecord, WebhookMessageRecord

RESPONSE = "response"  #: the job kind of the Responses API; such a job's public id is "resp_" + its id
#: every event type an endpoint may ask for (its `events`; none: all of them)
EVENT_TYPES = ("job.succeeded", "job.failed", "job.cancelled",
               "response.completed", "response.incomplete", "response.failed", "response.cancelled", "report.ready")
READY = "report.ready"  #: a schedule's job succeeded: its links, beside its job.succeeded
EXPORTS = ("json", "md", "html", "pdf")  #: GET /v1/jobs/{id}/report.{fmt}
ENDPOINT_ID = re.compile(r"we_[0-9a-f]{24}")
MAX_URL = 2048
LEASE_MARGIN_S = 30.0  # a claim outlasts the latest end of its request by this much before another sender may take it
POOL = 16  # deliveries one pass makes at once (each endpoint's messages go one after the other)
PER_TENANT = 4  # of those, to one tenant's endpoints at most: a tenant's slow receivers leave the rest to others
PER_ENDPOINT = 10  # messages of one endpoint a pass takes, at most (the others stay due, for the next pass)
M = WebhookMessageRecord


def event_type(kind: str, status: str, result: dict[str, Any] | None) -> str:
    """The event a job's ending sends.  A response (kind "response"): succeeded ->
    response.completed, or response.incomplete where its result's status says so; failed ->
    response.failed; cancelled -> response.cancelled.  Any other job: job.<status>."""
    assert status in TERMINAL, f"a job ends succeeded, failed or cancelled, not {status!r}"
    if kind != RESPONSE:
        return f"job.{status}"
    if status == "succeeded":
        return "response.incomplete" if (result or {}).get("status") == "incomplete" else "response.completed"
    return "response.failed" if status == "failed" else "response.cancelled"


def event(msg_id: str, type_: str, job_id: str, kind: str, status: str, created_at: int) -> dict[str, Any]:
    """The body sent, in OpenAI's webhook-event shape: a response's data is its public id only, a
    job's also its kind and status (the receiver fetches the rest, as OpenAI's does)."""
    data = {"id": f"resp_{job_id}"} if kind == RESPONSE else {"id": job_id, "kind": kind, "status": status}
    return {"id": msg_id, "object": "event", "type": type_, "created_at": created_at, "data": data}


def ready(msg_id: str, job_id: str, kind: str, schedule_id: str, tick_at: float, created_at: int) -> dict[str, Any]:
    """The report.ready body: the job, the schedule and tick (ISO 8601, UTC) that submitted it,
    and its links (paths on the API: the job, then its exports)."""
    tick = datetime.fromtimestamp(tick_at, UTC).isoformat().replace("+00:00", "Z")
    links = {"job": f"/v1/jobs/{job_id}", **{fmt: f"/v1/jobs/{job_id}/report.{fmt}" for fmt in EXPORTS}}
    return {"id": msg_id, "object": "event", "type": READY, "created_at": created_at,
            "data": {"id": job_id, "kind": kind, "schedule": schedule_id, "tick": tick, "links": links}}


def enqueue(db: Session, job_id: str) -> int:
    """In the caller's transaction, right after it ended the job: one outbox message per endpoint
    of the job's tenant that takes the event, so an ending that commits has its messages and one
    rolled back has none; a schedule's job that succeeded also says report.ready.  Returns how
    many."""
    db.flush()  # the ORM's pending change of the status (Jobs.cancel) first
    job = db.execute(select(JobRecord.tenant, JobRecord.kind, JobRecord.status, JobRecord.schedule_id, JobRecord.tick_at)
                     .where(JobRecord.id == job_id)).one()
    endpoints = db.execute(select(WebhookEndpointRecord.id, WebhookEndpointRecord.events)
                           .where(WebhookEndpointRecord.tenant == job.tenant)).all()
    if not endpoints:
        return 0
    result = db.scalar(select(JobRecord.result).where(JobRecord.id == job_id)) if job.kind == RESPONSE else None
    type_, now = event_type(job.kind, job.status, result), time.time()
    scheduled = job.status == "succeeded" and job.schedule_id is not None and job.tick_at is not None
    n = 0
    for endpoint_id, events in endpoints:
        for t in (type_, READY) if scheduled else (type_,):
            if events and t not in events:
                continue
            msg_id = f"msg_{secrets.token_hex(12)}"
            body = (ready(msg_id, job_id, job.kind, job.schedule_id, job.tick_at, int(now)) if t == READY
                    else event(msg_id, t, job_id, job.kind, job.status, int(now)))
            db.add(M(id=msg_id, tenant=job.tenant, endpoint_id=endpoint_id, type=t, attempts=0, next_attempt_at=now,
                     payload=body, last_error=""))
            n += 1
    return n


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: "whsec_" + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def check_url(url: str, allow_private: bool = False) -> str:
    """An absolute http(s) URL of at most MAX_URL characters whose host is not a non-public
    address (unless allow_private), or BadInput.  A name is resolved at each delivery instead
    (webhook_http.Guarded): what it resolves to may change."""
    if not isinstance(url, str) or not 0 < len(url) <= MAX_URL:
        raise BadInput(f"a webhook url is 1..{MAX_URL} characters")
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:
        raise BadInput(f"a webhook url is an http or https URL: {e}") from None
    if u.scheme not in ("http", "https") or not u.host:
        raise BadInput(f"a webhook url is an absolute http or https URL, not {url[:100]!r}")
    if u.port is not None and not 0 < u.port < 65536:
        raise BadInput(f"a webhook url's port is 1..65535, not {u.port}")
    if not allow_private and (u.host.lower().rstrip(".") == "localhost" or u.host.lower().endswith(".localhost")
                              or not public(u.host, named=True)):
        raise BadInput(f"a webhook url reaches public addresses only, not {u.host!r} (a loopback, private or "
                       "link-local address: the deployment allows these with webhook_allow_private)")
    return url


def shown(url: str) -> str:
    """A url as views list it: a password in it (https://user:pw@host/...) as "***"."""
    u = httpx.URL(url)
    return str(u.copy_with(username=u.username, password="***")) if u.password else url


def check_events(events: Iterable[str]) -> list[str]:
    """Known event types, each once, in the order given; BadInput naming the unknown ones."""
    events = list(dict.fromkeys(events))
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
        raise BadInput(f"unknown event types {unknown}: known are {', '.join(EVENT_TYPES)}")
    return events


class Endpoints:
    """A tenant's webhook endpoints: another tenant's look unknown (NotFound).  Their secrets are
    kept sealed under secret_key where one is given (runtime/jobs/webhook_secrets.py)."""

    def __init__(self, engine: Engine, max_per_tenant: int = 10, allow_private: bool = False,
                 secret_key: str | None = None) -> None:
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)
        self.max_per_tenant = max_per_tenant
        self.allow_private = allow_private
        self.key = key_of(secret_key)

    def create(self, tenant: str, url: str, events: Sequence[str] = (), description: str = "") -> WebhookEndpointRecord:
        """A new endpoint with a new secret, returned here in the clear and only here (the row
        keeps it sealed, where there is a key); BadInput for a bad url or
        event type, OverBudget past max_per_tenant (concurrent creations may pass it by one
        each: the count and the insert are one transaction): nothing written then."""
        url, events = check_url(url, self.allow_private), check_events(events)
        if len(description) > 512:
            raise BadInput("a webhook's description is at most 512 characters")
        with self._write.begin() as db:
            have = int(db.scalar(select(func.count()).select_from(WebhookEndpointRecord)
                                 .where(WebhookEndpointRecord.tenant == tenant)) or 0)
            if have >= self.max_per_tenant:
                raise OverBudget(f"tenant {tenant!r} has {have} webhook endpoints, the most it may have "
                                 "(tenant_max_webhooks): delete one first")
            endpoint_id, secret = f"we_{secrets.token_hex(12)}", new_secret()
            rec = WebhookEndpointRecord(id=endpoint_id, tenant=tenant, url=url, events=events, description=description,
                                        secret=seal(secret, tenant, endpoint_id, self.key), created_at=datetime.now(UTC))
            db.add(rec)
        rec.secret = secret  # the caller's copy only: the session is closed, nothing writes it
        return rec

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpointRecord:
        with self._db() as db:
            rec = db.get(WebhookEndpointRecord, endpoint_id) if ENDPOINT_ID.fullmatch(endpoint_id) else None
        if rec is None or rec.tenant != tenant:
            raise NotFound(f"no webhook endpoint {endpoint_id!r} for tenant {tenant!r}")
        return rec

    def listing(self, tenant: str, limit: int = 50) -> list[WebhookEndpointRecord]:
        """The tenant's endpoints, oldest first."""
        with self._db() as db:
            return list(db.scalars(select(WebhookEndpointRecord).where(WebhookEndpointRecord.tenant == tenant)
                                   .order_by(WebhookEndpointRecord.created_at, WebhookEndpointRecord.id).limit(limit)))

    def deliveries(self, tenant: str, endpoint_id: str) -> dict[str, int]:
        """The endpoint's messages: pending (to send, or being retried), delivered, failed."""
        self.get(tenant, endpoint_id)
        with self._db() as db:
            total, delivered, failed = db.execute(select(
                func.count(), func.sum(case((M.delivered_at.is_not(None), 1), else_=0)),
                func.sum(case((M.failed_at.is_not(None), 1), else_=0))).where(M.endpoint_id == endpoint_id)).one()
        return {"pending": int(total) - int(delivered or 0) - int(failed or 0), "delivered": int(delivered or 0),
                "failed": int(failed or 0)}

    def delete(self, tenant: str, endpoint_id: str) -> int:
        """Delete the endpoint and its messages (those pending are never sent); returns how
        many messages went.  A job ending at the same moment may still write one for it: the
        sender drops that one."""
        self.get(tenant, endpoint_id)
        with self._write.begin() as db:
            gone = db.execute(delete(WebhookEndpointRecord).where(WebhookEndpointRecord.id == endpoint_id,
                                                                  WebhookEndpointRecord.tenant == tenant))
            if not _rows(gone):
                raise NotFound(f"no webhook endpoint {endpoint_id!r} for tenant {tenant!r}")
            return _rows(db.execute(delete(M).where(M.endpoint_id == endpoint_id)))


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
        self.key = key_of(settings.secret_key)
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
            return [Due(r.id, r.tenant, r.endpoint_id, r.payload, r.attempts, _epoch(r.created_at)) for r in db.execute(
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
            return _rows(db.execute(delete(M).where(M.id.in_(old.scalar_subquery()))))

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
                n += _rows(db.execute(update(WebhookEndpointRecord)
                                      .where(WebhookEndpointRecord.id == endpoint_id, WebhookEndpointRecord.secret == secret)
                                      .values(secret=seal(secret, tenant, endpoint_id, self.key))))
        return n

    def _deliver_to(self, endpoint: WebhookEndpointRecord | None, messages: list[Due], now: float) -> Counter[str]:
        """One endpoint's batch, its messages in order; none started after webhook_timeout_s."""
        stop = time.monotonic() + self.s.webhook_timeout_s
        out: Counter[str] = Counter()
        if endpoint is None:  # deleted after its job's ending wrote the messages
            with self._write.begin() as db:
                out["dropped"] += _rows(db.execute(delete(M).where(M.id.in_([m.id for m in messages]))))
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
            return _rows(db.execute(update(M).where(M.id == m.id, *_pending(), M.next_attempt_at <= now)
                                    .values(next_attempt_at=now + 2 * self.s.webhook_timeout_s + LEASE_MARGIN_S))) == 1
            # a request starts within webhook_timeout_s of its batch and ends within as much again

    def _send(self, endpoint: WebhookEndpointRecord, m: Due) -> str | None:
        """POST the message, signed, within its deadline (webhook_http.bounded); None when the
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
            return _rows(db.execute(update(M).where(M.id.in_([m.id for m in messages]), *_pending(),
                                                    M.next_attempt_at <= now).values(next_attempt_at=until)))


def _pending() -> tuple[Any, ...]:
    """The where-clause of a message still to send (the due index's condition)."""
    return M.delivered_at.is_(None), M.failed_at.is_(None)


def _epoch(dt: datetime) -> float:
    """Epoch seconds of a stored time (SQLite gives it back without its UTC zone)."""
    return (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()


def _rows(result: Any) -> int:
    """Rows a DELETE or UPDATE matched (a CursorResult's rowcount)."""
    return int(result.rowcount)
