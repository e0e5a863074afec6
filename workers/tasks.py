"""The Celery task: thin.  It checks the message names a job, then hands the job id to
workers/runner.py in this process's runtime (built on first use).  A message that names no job
(malformed payload, unknown id) goes to the dead-letter stream with the reason and is
acknowledged: it is never retried."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from runtime.errors import NotFound
from workers.celery_app import TASK, app

log = logging.getLogger("setflow.worker")


@app.task(name=TASK, bind=True)
def run_job(self: Task, *args: Any, **kwargs: Any) -> str:
    from workers import process, runner  # torch loads in the pool process, on its first job

    rt = process.runtime()
    try:
        job_id = runner.check_payload(args, kwargs)
        return runner.run(rt, job_id)
    except (ValueError, NotFound) as e:
        code = "not_found" if isinstance(e, NotFound) else "bad_input"
        log.error("task %s rejected (%s): %s", self.request.id, code, e)
        rt.dispatcher.events.dead_letter(str(self.request.id), {"args": args, "kwargs": kwargs}, code, str(e))
        return f"rejected: {code}"

from workers import watch  # noqa: E402,F401  - the main process's heartbeat and reaper (signal handlers)
