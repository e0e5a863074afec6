"""The API's request and response bodies (pydantic): what OpenAPI documents.  Job specs are
runtime/jobs/specs.py's, shared with the workers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from runtime.jobs.params import ParamsSpec
from runtime.jobs.specs import AgentSpec, InfillSpec, NarrativeSpec, ReportSpec, TurnSpec
from runtime.tables import JobRecord, Priority

ID = r"^[A-Za-z0-9_-]{1,64}$"


def aware(t: datetime) -> datetime:
    """A time SQL gives, with its zone: one without is UTC (SQLite keeps none)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


#: a time as the API writes it: in UTC, saying so ("...Z"; a job's times read back had lost the
#: zone its PUT answer showed)
Utc = Annotated[datetime, AfterValidator(aware)]


class ErrorBody(BaseModel):
    code: str = Field(description="stable: bad_input, not_found, busy, rate_limited, unauthorized, too_large, "
                                  "no_model, unavailable, ...")
    message: str
    retry_after_s: float | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


#: the error answers every session and job route may give (OpenAPI)
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (401, 404, 409, 422, 429, 503)}


class TurnRequest(TurnSpec):
    """A turn: the input as text or token ids, and the decode parameters (policy, W, tau, max
    tokens, stop sequences)."""

    priority: Priority = "interactive"


class InfillRequest(InfillSpec):
    priority: Priority = "interactive"


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turn: int = Field(ge=0, le=100_000, description="the last turn the fork keeps (0-based)")


class JobRequest(BaseModel):
    """A job: `kind` names its workflow, `spec` its input (see the spec schemas).  Without a
    `session` it runs on a new one (returned in the job)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["narrative", "agent", "report", "turn", "infill"]
    spec: dict[str, Any] = Field(description="NarrativeSpec, AgentSpec, ReportSpec, TurnSpec or InfillSpec")
    session: str | None = Field(default=None, pattern=ID)
    priority: Priority = "interactive"
    #: the model a new session runs on (its name, as workers host it); None: the deployment's
    #: default.  A job on a session runs on the session's model (naming another is refused)
    model: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    #: its numerics ("cpu/float32", "cuda/bfloat16"); None: those most of its workers run
    numerics: str | None = Field(default=None, pattern=r"^(cpu|cuda)/(float32|bfloat16)$")


class PendingCall(BaseModel):
    id: str = Field(description="the call's id: answer it by this (tool_outputs' call_id)")
    tool: str
    arguments: dict[str, str] = Field(description="the tool's arguments by name, as the model wrote them")
    call: str = Field(description="the call as the model wrote it")


class RequiredAction(BaseModel):
    type: Literal["tool_outputs"] = "tool_outputs"
    calls: list[PendingCall]
    deadline: Utc = Field(description="the job fails with tool_deadline if the outputs have not come by then")


class JobView(BaseModel):
    id: str
    kind: str
    status: str = Field(description="queued, running, requires_action (waiting for its client's tool outputs: "
                                    "see required_action), succeeded, failed, cancelled")
    session: str | None
    seq: int
    priority: str
    attempts: int
    worker: str | None = Field(description="the worker running it now; null while nothing holds it (queued, "
                                           "waiting for its tool outputs, ended)")
    last_worker: str | None = Field(description="the worker that ran it last (a waiting job's turns are warm there)")
    progress: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    required_action: RequiredAction | None = None
    schedule: str | None = Field(default=None, description="the schedule whose tick submitted it (GET /v1/schedules/{id})")
    tick_at: Utc | None = Field(default=None, description="that tick: the run of its cron it is (not when it ran)")
    created_at: Utc | None
    started_at: Utc | None
    finished_at: Utc | None

    @classmethod
    def of(cls, j: JobRecord) -> JobView:
        action = None
        if j.status == "requires_action" and j.action:
            action = RequiredAction(calls=[PendingCall(**c) for c in j.action.get("calls", [])],
                                    deadline=datetime.fromtimestamp(j.wait_until, UTC))
        return cls(id=j.id, kind=j.kind, status=j.status, session=j.session_id, seq=j.seq, priority=j.priority,
                   attempts=j.attempts, worker=j.worker if j.status == "running" else None,
                   last_worker=j.worker, progress=j.progress or {}, result=j.result, error=j.error,
                   required_action=action, schedule=j.schedule_id,
                   tick_at=None if j.tick_at is None else datetime.fromtimestamp(j.tick_at, UTC),
                   created_at=j.created_at, started_at=j.started_at, finished_at=j.finished_at)


class JobList(BaseModel):
    jobs: list[JobView]


class TurnView(BaseModel):
    index: int
    role: str
    input: str = Field(description="the turn's input as its workflow rendered it")
    output: str = Field(description="the text the model wrote (empty while no worker has published the "
                                    "model: the API has no tokenizer until then)")
    tokens: int
    path: str | None = Field(description="how the session was resumed for it: new, warm, restore, recompute")
    job: str | None
    created_at: Utc | None


class CacheView(BaseModel):
    redis_turns: int | None = Field(description="turns the Redis state holds (None: no Redis state)")
    redis_bytes: int
    redis_segments: int
    slots: int
    last_worker: str | None = Field(description="the worker that ran its last turn (its next job goes there)")
    last_worker_alive: bool


class SessionView(BaseModel):
    id: str
    created_at: Utc | None
    turns: list[TurnView]
    kv: CacheView
    unfinished_jobs: int


class SessionCreated(BaseModel):
    id: str
    created_at: Utc | None


class SessionList(BaseModel):
    sessions: list[SessionCreated]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    redis: bool
    database: bool
    workers: list[str]


SPEC_MODELS = {"narrative": NarrativeSpec, "agent": AgentSpec, "report": ReportSpec, "turn": TurnSpec,
               "infill": InfillSpec, "params": ParamsSpec}
