"""The Celery task: thin.  It checks the message names a job, then hands the job id to
workers/runner.py with this pool process's runtime (built when the process was forked).  A
message that names no job (malformed payload, unknown id) goes to the dead-letter stream with
the reason and is acknowledged: it is never retried."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Task
from celery.exceptions import Reject
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from runtime.errors import NotFound
from workers.celery_app import TASK, app, sender

log = logging.getLogger("setflow.worker")


@app.task(name=TASK, bind=True)
def run_job(self: Task, *args: Any, **kwargs: Any) -> str:
    from workers import process, runner  # torch loads in the pool process, on its first job

    try:
        rt = process.runtime(sender(app))
    except Exception as e:
        # this process cannot run jobs (the model did not load, the device is full, ...): the
        # message goes back to its queue for a healthy worker, after a pause so that this one
        # does not spin on it
        log.critical("task %s: this worker cannot run jobs: %r", self.request.id, e, exc_info=True)
        time.sleep(5.0)
        raise Reject(f"worker runtime unavailable: {e!r}", requeue=True) from e
    try:
        job_id = runner.check_payload(args, kwargs)
        return runner.run(rt, job_id).what
    except (ValueError, NotFound) as e:
        code = "not_found" if isinstance(e, NotFound) else "bad_input"
        log.error("task %s rejected (%s): %s", self.request.id, code, e)
        rt.dispatcher.events.dead_letter(str(self.request.id), {"args": args, "kwargs": kwargs}, code, str(e))
        return f"rejected: {code}"

from workers import watch  # noqa: E402,F401  - the main process's heartbeat and reaper (signal handlers)

_builder: threading.Thread | None = None  # the batching worker's runtime build, while it runs
BUILD_JOIN_S = 120.0  # a warm shutdown waits this long at most for a build in progress


@worker_ready.connect
def _build_threads_runtime(**_: Any) -> None:
    """A batching worker runs its jobs on threads of this (the main) process: its runtime is
    built here when the worker is ready, on a thread of its own (the heartbeat starts meanwhile);
    a job that arrives first waits for it."""
    from runtime.settings import Settings

    global _builder
    if (Settings().batch_sessions or 1) > 1:
        _builder = threading.Thread(target=_build_runtime, name="setflow-build", daemon=True)
        _builder.start()



@worker_shutdown.connect
def _wait_for_the_build(**_: Any) -> None:
    """A warm shutdown right after the start (docker stop, a deploy) waits for a runtime build
    still in progress: the interpreter exiting while that thread runs torch ops (the cost
    model's prefill) ends the process in std::terminate, exit code 250 ("terminate called
    without an active exception"), not 0."""
    if _builder is not None:
        _builder.join(BUILD_JOIN_S)


@worker_process_init.connect
def _build_runtime(**_: Any) -> None:
    """Build the pool process's runtime (torch, the model, the engine) as soon as it is forked,
    outside any task: a task's time limit must not fire in the middle of importing torch (it
    did, with a 1 s soft limit: the process was left with a half-imported torch), and the first
    turn should not pay for the build.  If it fails, the first task tries again (and requeues)."""
    from workers import process

    try:
        process.runtime(sender(app))
    except Exception:  # noqa: BLE001 - logged; the task path reports it per message
        log.critical("this worker process could not build its runtime", exc_info=True)
