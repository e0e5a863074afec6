"""The durable records (SQLAlchemy 2.0): sessions, their turns, and jobs.

A turn keeps what a user was given (its text and token ids) and the commit-order ledger needed
to rebuild the session's KV cache exactly: the (position, token) pairs in the order their K/V
entered the cache (prompt prefills, then each committed set, by position inside a set).  The
cache of a session is the concatenation of its turns' ledgers; recomputing it is one causal
prefill of that ledger (model/decode.py's invariant I5).

A turn written by a job carries (job_id, job_step), unique: the database itself refuses a second
turn for the same step of the same job, so a redelivered or duplicated task never appends twice.

A job is one unit of queued work (a turn, a report, a narrative): its lifecycle is in
runtime/jobs/rows.py.  Statuses: queued -> running -> succeeded | failed | cancelled; a running job
whose lease expired (its worker died) goes back to queued.  Jobs on one session run one at a
time in submission order (`seq`).

A tenant sees only its own records: `owned` reads one (another tenant's is NotFound, as an
unknown one), `listing` selects its list.

A tenant's webhook endpoints receive its jobs' endings: the transaction that ends a job writes
one outbox message per endpoint that takes the event (runtime/webhooks/outbox.py), and the
workers' sender delivers each until its receiver answers 2xx or its retries run out.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar, get_args

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Select,
    String,
    Text,
    UniqueConstraint,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from runtime.errors import NotFound


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class SessionRecord(Base):
    __tablename__ = "sessions"
    __table_args__ = (Index("ix_session_tenant_created", "tenant", "created_at"),  # the listing
                      Index("ix_session_updated", "updated_at"))  # the retention's scan, oldest first

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    model_fingerprint: Mapped[str] = mapped_column(String(32))  # its weights' ("": bound by its first turn)
    model: Mapped[str] = mapped_column(String(64), default="", server_default="")  # its model's name ("": none yet)
    numerics: Mapped[str] = mapped_column(String(32), default="", server_default="")  # "cpu/float32", ...
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now, onupdate=_now)
    turns: Mapped[list[TurnRecord]] = relationship(back_populates="session", order_by="TurnRecord.index")


class TurnRecord(Base):
    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("session_id", "index", name="uq_turn_index"),
                      Index("uq_turn_job_step", "job_id", "job_step", unique=True))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # 0, 1, ... within the session
    role: Mapped[str] = mapped_column(String(16))  # "user", "assistant", "tool"
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[list[int]] = mapped_column(JSON)
    ledger: Mapped[list[list[int]]] = mapped_column(JSON)  # [[position, token], ...] in commit order
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # decode params, path taken, costs
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    job_id: Mapped[str | None] = mapped_column(String(32), default=None)  # the job that wrote it, if any
    job_step: Mapped[int | None] = mapped_column(Integer, default=None)  # that job's step counter
    #: what it stores (runtime/sessions/quota.py turn_bytes), counted in its tenant's usage
    bytes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    session: Mapped[SessionRecord] = relationship(back_populates="turns")


class TenantUsageRecord(Base):
    """What a tenant holds in SQL, counted in the transactions that change it (a session's
    creation, fork and delete; a turn's insert; a job's, an idempotency answer's, a conversation
    item's): its sessions, its turns' bytes and the other bytes it stores, checked
    against its quota there (runtime/sessions/quota.py).  One row per tenant."""

    __tablename__ = "tenant_usage"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    sessions: Mapped[int] = mapped_column(Integer, default=0)
    turn_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    #: job specs and results, idempotency answers, conversation items no response has read
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


#: requires_action: the job stopped at a call of a tool its client runs (an agent's client_tools)
#: and waits for the output (POST /v1/jobs/{id}/tool_outputs); no worker holds it meanwhile
STATUSES = ("queued", "running", "requires_action", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")
#: a job's class: an interactive job goes before the batch ones waiting (in its queue, and its
#: turns in a worker's batch)
Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[str, ...] = get_args(Priority)


class JobRecord(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("session_id", "seq", name="uq_job_seq"),
                      Index("ix_job_status_lease", "status", "lease_until"),
                      Index("ix_job_tenant_created", "tenant", "created_at"),  # the listing
                      Index("ix_job_tenant_status", "tenant", "status"),  # a tenant's unfinished jobs
                      Index("ix_job_status_finished", "status", "finished_at"))  # the retention

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # the workflow: "turn", ...
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), default=None,
                                                   index=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)  # submission order within the session (1, 2, ...)
    priority: Mapped[str] = mapped_column(String(16))  # "interactive" or "batch"
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the workflow's input, as submitted
    nbytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # its spec and result (quota.size)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims so far (deliveries that started it)
    owner: Mapped[str | None] = mapped_column(String(64), default=None)  # the current claim's token
    worker: Mapped[str | None] = mapped_column(String(128), default=None)  # the worker that holds or held it
    lease_until: Mapped[float] = mapped_column(Float, default=0.0)  # epoch seconds
    queue: Mapped[str] = mapped_column(String(200), default="")  # where it was last sent
    #: the model and numerics of its session (runtime/jobs/hosts.py pool): only their workers run it
    pool: Mapped[str] = mapped_column(String(128), default="", server_default="")
    dispatched_at: Mapped[float] = mapped_column(Float, default=0.0)  # epoch seconds of the last send
    step: Mapped[int] = mapped_column(Integer, default=0)  # steps committed (turns written), for resuming
    #: positions it appends to its session at most (workflows.positions, computed once
    #: at its submission by the API): what a later submission on the session adds up instead of
    #: planning it again; None where not known (submitted another way, or before it was kept)
    positions: Mapped[int | None] = mapped_column(Integer, default=None)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # {"code": ..., "message": ...}
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    #: while requires_action: {"calls": [{"id", "tool", "arguments", "call"}, ...]}, the calls it
    #: waits for; None otherwise
    action: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: call id -> the output its client sent, every one so far (a rerun replays them)
    tool_outputs: Mapped[dict[str, str] | None] = mapped_column(JSON, default=None)
    wait_until: Mapped[float] = mapped_column(Float, default=0.0)  # epoch seconds: a waiting job expires then
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    #: the schedule whose tick submitted it, and that tick (epoch seconds); None: submitted otherwise.
    #: A succeeded one's webhook also says report.ready with its links (runtime/webhooks/outbox.py)
    schedule_id: Mapped[str | None] = mapped_column(String(32), default=None)
    tick_at: Mapped[float | None] = mapped_column(Float, default=None)


class DatasetRecord(Base):
    """A tenant's own table for the agent's metric tool (runtime/jobs/datasets.py): rows of
    [metric, region, period, value], replaced whole by each upload."""

    __tablename__ = "datasets"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    rows: Mapped[list[list[str]]] = mapped_column(JSON)
    n_rows: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class WebhookEndpointRecord(Base):
    """A tenant's receiver of job endings (runtime/webhooks/endpoints.py).  Its secret is kept sealed
    under the deployment's secret_key (runtime/webhooks/sealed.py; in the clear where none
    is set): the sender opens it to sign."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoint_tenant_created", "tenant", "created_at"),)  # the listing, the cap

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "we_" + 24 hex
    tenant: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(String(2048))
    secret: Mapped[str] = mapped_column(String(64))  # "whsec_" + base64 of 24 random bytes (Standard Webhooks)
    events: Mapped[list[str]] = mapped_column(JSON)  # the event types it takes; []: every type
    description: Mapped[str] = mapped_column(String(512), default="", server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


#: an outbox message still to send: neither delivered nor failed (the due scan's partial index)
PENDING = "delivered_at IS NULL AND failed_at IS NULL"


class WebhookMessageRecord(Base):
    """One event for one endpoint, written in the transaction that ended its job; its id is the
    `webhook-id` of every attempt (receivers deduplicate by it).  No foreign keys: a job's
    ending never fails for an endpoint deleted at the same moment (the sender drops such a
    message), and a job pruned before its messages are sent leaves them be."""

    __tablename__ = "webhook_outbox"
    __table_args__ = (Index("ix_webhook_outbox_due", "next_attempt_at", sqlite_where=text(PENDING),
                            postgresql_where=text(PENDING)),  # the sender's scan
                      Index("ix_webhook_outbox_endpoint", "endpoint_id"),  # an endpoint's counts, its delete
                      Index("ix_webhook_outbox_created", "created_at"))  # the retention

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "msg_" + 24 hex
    tenant: Mapped[str] = mapped_column(String(128))
    endpoint_id: Mapped[str] = mapped_column(String(32))
    type: Mapped[str] = mapped_column(String(64))  # "response.completed", "job.failed", ...
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)  # the event, as sent: {id, object, type, created_at, data}
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # sends that got no 2xx, or the one that did
    #: epoch seconds: due then (a sender's claim pushes it past its request, a failure by the backoff)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)  # retries ran out
    last_error: Mapped[str] = mapped_column(String(500), default="", server_default="")


class ConversationRecord(Base):
    """A conversation of the Responses API (runtime/api/routes/conversations.py): one session,
    whose responses are its jobs; the items a client added that no response has read yet (the
    next response of the conversation reads them first), and its metadata."""

    __tablename__ = "conversations"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: [{"id", "type", ...}]: items added, waiting for the conversation's next response
    pending: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    #: how many items have been added so far (each one's id is its number: stable, never reused)
    added: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class IdempotencyRecord(Base):
    """A POST's Idempotency-Key (runtime/api/idempotency.py): the first request's body hash and,
    once it was answered, its answer; the same key and body replay that answer, another body is
    refused.  Kept idempotency_ttl_s."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_created", "created_at"),)  # the retention

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    route: Mapped[str] = mapped_column(String(255))  # "POST /v1/jobs": a key names one request
    body_hash: Mapped[str] = mapped_column(String(64))  # sha256 of the body as sent
    #: the answer once given: its HTTP status and JSON body; None while the first is in flight
    status: Mapped[int | None] = mapped_column(Integer, default=None)
    answer: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class ScheduleRecord(Base):
    """A tenant's schedule (runtime/schedules/crud.py): a cron expression in a time zone and the
    job it submits at each tick; its next tick, and what to do with the ticks it missed."""

    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedule_due", "paused", "next_at"),  # the leader's scan
                      Index("ix_schedule_tenant", "tenant", "created_at"))  # the listing

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "sch_" + 24 hex
    tenant: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128), default="", server_default="")
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64))
    #: {"kind": "report" | "narrative", "spec": {...}, "data": {...}}: what each tick submits
    template: Mapped[dict[str, Any]] = mapped_column(JSON)
    missed: Mapped[str] = mapped_column(String(16), default="skip")  # "skip" or "catch_up"
    max_catch_up: Mapped[int] = mapped_column(Integer, default=0)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    next_at: Mapped[float] = mapped_column(Float)  # epoch seconds of its next tick
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class TickRecord(Base):
    """One tick of a schedule, written once: the unique (schedule, tick) is what makes every
    tick submit exactly one job set, whoever races for it.  Claimed (its job ids planned) before
    any of its jobs is submitted; submitted once every one of them is in `jobs` (or failed, its
    spec refused for good: `error`).  A claim left by a process that died is completed by the
    next leader (runtime/schedules/ticker.py)."""

    __tablename__ = "schedule_ticks"
    __table_args__ = (UniqueConstraint("schedule_id", "tick_at", name="uq_schedule_tick"),
                      Index("ix_tick_status", "status", "claimed_at"),  # the claims left behind
                      Index("ix_tick_created", "created_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    tick_at: Mapped[float] = mapped_column(Float)  # epoch seconds: the tick it is (not when it ran)
    jobs: Mapped[list[str]] = mapped_column(JSON, default=list)  # its job ids, planned at the claim
    status: Mapped[str] = mapped_column(String(16), default="claimed")  # "claimed", "submitted", "failed"
    error: Mapped[str] = mapped_column(String(500), default="", server_default="")  # why a job of it failed
    claimed_at: Mapped[float] = mapped_column(Float, default=0.0)  # epoch seconds (the ticker's clock)
    late_s: Mapped[float] = mapped_column(Float, default=0.0)  # how long after its time its last job was submitted
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class _Tenants(Protocol):
    @property
    def tenant(self) -> str: ...


R = TypeVar("R", bound=_Tenants)


def owned(rec: R | None, tenant: str | None, what: str) -> R:
    """`rec` where `tenant` owns it (None: whoever does); NotFound for no record and for another
    tenant's alike, so that a tenant never learns what another one has.  what: "job 'j_...'"."""
    if rec is None or (tenant is not None and rec.tenant != tenant):
        raise NotFound(f"no {what}" + (f" for tenant {tenant!r}" if tenant is not None else ""))
    return rec


def listing(record: Any, tenant: str, limit: int, newest_first: bool = False) -> Select[Any]:
    """The tenant's `record`s (a table with tenant, created_at and id), the oldest (or newest)
    first, at most `limit`."""
    created = record.created_at.desc() if newest_first else record.created_at
    return select(record).where(record.tenant == tenant).order_by(created, record.id).limit(limit)
