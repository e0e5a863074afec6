"""The exception tree.  Each error carries a stable `code` (what an API maps to an HTTP status
and a JSON body, what the CLI prints) and changes no state where it is raised.

    SetflowError
    ├── BadInput            code "bad_input"      invalid parameters, oversized input
    ├── NotFound            code "not_found"      unknown session (or one of another tenant)
    ├── Busy                code "busy"           the session is leased by another holder
    ├── StaleWrite          code "stale_write"    a manifest CAS lost: another writer moved on
    ├── LeaseLost           code "lease_lost"     the lease expired or was taken over
    ├── OverBudget          code "over_budget"    a session or tenant byte budget would be exceeded
    ├── CorruptState        code "corrupt_state"  a segment or manifest failed its checks
    ├── RateLimited         code "rate_limited"   a tenant submits faster than its rate (retry_after_s)
    ├── Cancelled           code "cancelled"      a job was cancelled while it ran
    ├── ClaimLost           code "claim_lost"     a job is no longer this worker's (its lease expired)
    ├── TimeLimit           code "time_limit"     a job ran past task_soft_time_limit_s
    ├── Unverified          code "unverified"     a job's output failed its checker, also after the AR retry
    │   ├── NoAnswer        code "no_answer"      an agent's last segment holds no answer (never returned flagged)
    │   └── Unfinished      code "unfinished_document" a structured output's document did not close within its token limit
    ├── ModelNotHosted      code "model_not_hosted" a job's model (or its session's model and numerics)
    │                                             is hosted by no live worker
    ├── NotFinished         code "not_finished"   a job's export asked for while the job has not ended
    ├── Duplicate           code "duplicate"      a job of that id exists already (a schedule's tick
    │                                             submitted it: runtime/schedules/claims.py)
    └── tool outputs (POST /v1/jobs/{id}/tool_outputs), refused:
        ├── NotWaiting      code "not_waiting"    the job waits for no tool output (any more)
        ├── UnknownCall     code "unknown_call"   no call of the job has that id
        ├── AlreadyAnswered code "already_answered" that call has its output already
        └── DeadlinePassed  code "deadline_passed" the job's wait for its client expired

    RequiresAction                                not an error: a workflow stops at calls its
                                                  client runs (the job waits, holding no worker)

    CliError                                      bad command-line input: `setflow` prints it, exits 2
"""

from __future__ import annotations

from typing import Any


class SetflowError(Exception):
    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")
        self.message = message


class BadInput(SetflowError):
    code = "bad_input"


class NotFound(SetflowError):
    code = "not_found"


class Busy(SetflowError):
    code = "busy"


class StaleWrite(SetflowError):
    code = "stale_write"


class LeaseLost(SetflowError):
    code = "lease_lost"


class OverBudget(SetflowError):
    code = "over_budget"


class CorruptState(SetflowError):
    code = "corrupt_state"


class RateLimited(SetflowError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Cancelled(SetflowError):
    code = "cancelled"


class ClaimLost(SetflowError):
    code = "claim_lost"


class TimeLimit(SetflowError):
    code = "time_limit"


class Unverified(SetflowError):
    """What the checker found wrong (`problems`) goes into the failed job's error beside the message."""

    code = "unverified"

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class NoAnswer(Unverified):
    """An agent's job ended with no answer in its last segment (the call limit, a full session, an
    answer cut at its token limit, none written): there is nothing to flag, so it fails even where
    its spec allows an unverified answer back."""

    code = "no_answer"


class Unfinished(Unverified):
    """A turn held to a JSON Schema (workflows/structured/) reached its token limit before its
    document closed: the text is no document, so it fails, never returned as a success."""

    code = "unfinished_document"


class ModelNotHosted(SetflowError):
    """Refused at submission: no live worker hosts the model (and numerics) the job needs."""

    code = "model_not_hosted"


class NotFinished(SetflowError):
    """A job's report (GET /v1/jobs/{id}/report.{fmt}) asked for while the job is queued,
    running or waiting: there is none yet."""

    code = "not_finished"


class Duplicate(SetflowError):
    """A job submitted under an id of its own (a schedule's tick: its id says which tick and
    which group) that a job holds already: the tick was submitted, nothing was written."""

    code = "duplicate"


class NotWaiting(SetflowError):
    code = "not_waiting"


class UnknownCall(SetflowError):
    code = "unknown_call"


class AlreadyAnswered(SetflowError):
    code = "already_answered"


class DeadlinePassed(SetflowError):
    code = "deadline_passed"


class RequiresAction(Exception):  # noqa: N818 - a state the job enters, not an error
    """Raised by a workflow at calls of tools its client runs: `calls` ([{"id", "tool",
    "arguments", "call"}]) are what the job waits for; the worker records them and lets go."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        super().__init__(f"waiting for the client's output of {[c['id'] for c in calls]}")
        self.calls = calls
        #: what the workflow needs to go on in a later job (JSON; workflows/agent.Parked), set
        #: where it can: the Responses API ends the response at the call and carries this
        self.state: dict[str, Any] | None = None


class CliError(Exception):
    """Bad command-line input: the `setflow` console script prints it as one line and exits 2."""
