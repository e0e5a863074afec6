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
    └── ModelNotHosted      code "model_not_hosted" a job's model (or its session's model and numerics)
                                                  is hosted by no live worker

    CliError                                      bad command-line input: `setflow` prints it, exits 2
"""

from __future__ import annotations


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


class ModelNotHosted(SetflowError):
    """Refused at submission: no live worker hosts the model (and numerics) the job needs."""

    code = "model_not_hosted"


class CliError(Exception):
    """Bad command-line input: the `setflow` console script prints it as one line and exits 2."""
