"""Webhooks for job endings, in the Standard Webhooks format (https://www.standardwebhooks.com):
the outbox messages the transaction that ends a job writes (`enqueue`), one per endpoint of its
tenant (runtime/webhooks/endpoints.py) that takes the event; runtime/webhooks/sender.py delivers
them.  Knows nothing of workers or routes."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from runtime.tables import TERMINAL, JobRecord, WebhookEndpointRecord, WebhookMessageRecord

RESPONSE = "response"  #: the job kind of the Responses API; such a job's public id is "resp_" + its id
#: every event type an endpoint may ask for (its `events`; none: all of them)
EVENT_TYPES = ("job.succeeded", "job.failed", "job.cancelled",
               "response.completed", "response.incomplete", "response.failed", "response.cancelled", "report.ready")
READY = "report.ready"  #: a schedule's job succeeded: its links, beside its job.succeeded
EXPORTS = ("json", "md", "html", "pdf")  #: GET /v1/jobs/{id}/report.{fmt}
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


def matched_rows(result: Any) -> int:
    """Rows a DELETE or UPDATE matched (a CursorResult's rowcount)."""
    return int(result.rowcount)
