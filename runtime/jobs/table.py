"""The jobs table's plumbing, shared by the modules of a job's lifecycle (rows.py, waits.py,
sweeps.py): the sessions to read and to write, a job by id, a write under the holder's claim,
and two SQL helpers.  Knows no lifecycle of its own."""

from __future__ import annotations

import functools
import re
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import aliased, sessionmaker

from runtime.db import writer
from runtime.errors import ClaimLost, NotFound
from runtime.sessions import quota
from runtime.sessions.quota import Quota
from runtime.settings import Settings
from runtime.tables import TERMINAL, JobRecord, owned
from runtime.webhooks import outbox

JOB_ID = re.compile(r"[0-9a-f]{24}")


class JobTable:
    """One short transaction per call."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.s = settings
        self.quota = Quota.of(settings)
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)

    def get(self, job_id: str, tenant: str | None = None) -> JobRecord:
        """NotFound for an unknown job and for another tenant's."""
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise NotFound(f"no job {job_id!r}")
        with self._db() as db:
            return owned(db.get(JobRecord, job_id), tenant, f"job {job_id!r}")

    def _own(self, job_id: str, holder: str, stored: int = 0, **values: Any) -> None:
        """Write `values` to the job while `holder` holds it (running under its claim); ClaimLost
        where it does not.  An ending's webhook messages go in the same transaction, and so do
        the `stored` bytes it adds (its result), counted to its tenant (never refused: the work
        is done; the tenant's next submission is)."""
        if stored:
            values["nbytes"] = JobRecord.nbytes + stored
        with self._write.begin() as db:
            n = matched(db.execute(update(JobRecord).where(JobRecord.id == job_id, JobRecord.owner == holder,
                                                     JobRecord.status == "running").values(**values)))
            if n == 1 and stored:
                quota.charge(db, db.scalar(select(JobRecord.tenant).where(JobRecord.id == job_id)) or "", quota.COUNTED,
                             stored=stored)
            if n == 1 and values.get("status") in TERMINAL:  # finish: the ending's webhooks, in its transaction
                outbox.enqueue(db, job_id)
        if n != 1:
            raise ClaimLost(f"job {job_id}: no longer held by this worker (lease expired, requeued or cancelled)")


@functools.cache
def waits_for_an_earlier_job() -> Any:
    """A where-clause: the job's session has an unfinished job submitted before it.  Built once
    (an expression is immutable): its alias cost 1.8 ms of the API's CPU at every submission."""
    earlier = aliased(JobRecord)
    return select(earlier.id).where(earlier.session_id == JobRecord.session_id, earlier.seq < JobRecord.seq,
                                    earlier.status.not_in(TERMINAL)).exists()


def matched(result: Any) -> int:
    """Rows an UPDATE matched (a CursorResult's rowcount)."""
    return int(result.rowcount)
