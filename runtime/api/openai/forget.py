"""A response with store false keeps nothing past itself: its session is deleted once it has
ended (forget), or, where its client left first, once it is cancelled and has ended (abandon)."""

from __future__ import annotations

import asyncio
import logging
import time

from anyio.to_thread import run_sync

from runtime.api.services import Services
from runtime.sessions import lifecycle
from runtime.tables import TERMINAL, JobRecord

log = logging.getLogger("setflow.api")
FORGET_WAIT_S = 120.0  # a left store-false response, cancelled, is waited for this long, then retention's
FORGET_POLL_S = 2.0  # and its row read this often
MAX_FORGETTING = 256  # such waits in the process at once


def forget(svc: Services, job: JobRecord) -> None:
    """A response with store false keeps nothing past itself: its session (turns, K/V, the job)
    is deleted; it ran on a session of its own (a new one, or a fork)."""
    if job.session_id is None:
        return
    try:
        lifecycle.delete_session(svc.store, svc.records, job.session_id, job.tenant)
        svc.dispatcher.events.drop(job.tenant, [job.id])  # its stream, and out of its tenant's account now
    except Exception:  # noqa: BLE001 - the reaper's retention deletes it later
        log.warning("response %s (store false): its session was not deleted", job.id, exc_info=True)


_LATER: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to its tasks


def abandon(svc: Services, job: JobRecord) -> None:
    """A store-false response whose client left before its end: nobody can read it any more, so
    it is cancelled, and deleted once it has ended (a cancelled job stops at its next step).  The
    wait for that end reads SQL every FORGET_POLL_S for at most FORGET_WAIT_S, at most
    MAX_FORGETTING of them in the process; past either, session_retention_s deletes it."""
    async def later() -> None:
        try:
            final = await run_sync(svc.dispatcher.cancel, job.id, job.tenant)
            deadline = time.monotonic() + FORGET_WAIT_S
            while final.status not in TERMINAL and time.monotonic() < deadline:
                await asyncio.sleep(FORGET_POLL_S)
                final = await run_sync(svc.jobs.get, job.id)
            if final.status in TERMINAL:
                await run_sync(forget, svc, final)
        except Exception:  # noqa: BLE001 - the retention deletes it later
            log.warning("response %s (store false, left): not forgotten now", job.id, exc_info=True)

    if len(_LATER) >= MAX_FORGETTING:
        return
    task = asyncio.get_running_loop().create_task(later())
    _LATER.add(task)
    task.add_done_callback(_LATER.discard)
