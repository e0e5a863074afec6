"""Webhooks for job endings, in the Standard Webhooks format (https://www.standardwebhooks.com):
the outbox messages the transaction that ends a job writes (`enqueue`) and a tenant's endpoints
(`Endpoints`); runtime/webhooks/sender.py delivers the messages.  A URL reaches public
addresses only, unless webhook_allow_private (runtime/webhooks/transport.py: no request from
inside the deployment's network on a tenant's behalf).  Knows nothing of workers or routes."""

from __future__ import annotations

import base64
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import Engine, case, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.tables import TERMINAL, JobRecord, WebhookEndpointRecord, WebhookMessageRecord, listing, owned
from runtime.webhooks.sealed import key_of, seal
from runtime.webhooks.transport import public

RESPONSE = "response"  #: the job kind of the Responses API; such a job's public id is "resp_" + its id
#: every event type an endpoint may ask for (its `events`; none: all of them)
EVENT_TYPES = ("job.succeeded", "job.failed", "job.cancelled",
               "response.completed", "response.incomplete", "response.failed", "response.cancelled", "report.ready")
READY = "report.ready"  #: a schedule's job succeeded: its links, beside its job.succeeded
EXPORTS = ("json", "md", "html", "pdf")  #: GET /v1/jobs/{id}/report.{fmt}
ENDPOINT_ID = re.compile(r"we_[0-9a-f]{24}")
MAX_URL = 2048
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
    (transport.Guarded): what it resolves to may change."""
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
    kept sealed under secret_key where one is given (runtime/webhooks/sealed.py)."""

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
        return owned(rec, tenant, f"webhook endpoint {endpoint_id!r}")

    def listing(self, tenant: str, limit: int = 50) -> list[WebhookEndpointRecord]:
        """The tenant's endpoints, oldest first."""
        with self._db() as db:
            return list(db.scalars(listing(WebhookEndpointRecord, tenant, limit)))

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
            if not matched_rows(gone):
                raise NotFound(f"no webhook endpoint {endpoint_id!r} for tenant {tenant!r}")
            return matched_rows(db.execute(delete(M).where(M.endpoint_id == endpoint_id)))


def matched_rows(result: Any) -> int:
    """Rows a DELETE or UPDATE matched (a CursorResult's rowcount)."""
    return int(result.rowcount)
