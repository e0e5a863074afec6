"""The worker's main process keeps two things going while it lives, on one daemon thread:
its heartbeat (the liveness key that affinity routing checks) and the reaper (requeue jobs
whose lease expired, resend jobs stranded on a dead worker's queue).  Every worker runs the
reaper; a Redis lock lets one pass run per interval.  Started on Celery's worker_ready, stopped
(and the liveness key removed) on worker_shutdown."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from runtime.db import make_engine
from runtime.dispatch import Dispatcher
from runtime.embedded import client as redis_client
from runtime.jobs import Jobs
from runtime.settings import Settings
from workers.celery_app import app, sender

log = logging.getLogger("setflow.worker")
_stop = threading.Event()


def _loop(settings: Settings, worker: str) -> None:
    client = redis_client(settings)
    dispatcher = Dispatcher(client, Jobs(make_engine(settings), settings), sender(app))
    next_reap = time.monotonic()
    while not _stop.is_set():
        try:
            dispatcher.routing.beat(worker)
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + settings.reaper_interval_s
                done = dispatcher.reap()
                if any(done.values()):
                    log.warning("reaper: %s", done)
        except Exception:  # noqa: BLE001 - Redis or the database away: keep trying, never die
            log.exception("heartbeat/reaper pass failed")
        _stop.wait(min(settings.worker_heartbeat_s, settings.reaper_interval_s))
    try:
        dispatcher.routing.gone(worker)
    except Exception:  # noqa: BLE001
        pass


@worker_ready.connect
def _start(**_: Any) -> None:
    s = Settings()
    if s.worker_name is None:
        log.warning("SETFLOW_WORKER_NAME is not set: no heartbeat, no affinity (start workers with `setflow worker`)")
        return
    threading.Thread(target=_loop, args=(s, s.worker_name), name="setflow-watch", daemon=True).start()


@worker_shutdown.connect
def _stop_loop(**_: Any) -> None:
    _stop.set()
