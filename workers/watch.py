"""The worker's main process keeps three things going while it lives, each on a daemon thread:
its heartbeat (the liveness key that affinity routing checks), the reaper (workers/reaper.py: requeue jobs
whose lease expired, resend jobs stranded on a dead worker's queue or never sent, then delete
K/V segments no session names), the webhook sender (deliver the outbox messages due) and the
schedules' ticker (submit the ticks due: runtime/schedules/ticker.py).
Every worker runs the reaper; a Redis lock lets one pass run per interval.  Every worker runs
the sender too; each message's SQL claim keeps two from sending it at once.  Every worker runs
the ticker; a Redis lock elects one leader, and each tick's SQL claim keeps its jobs to one set.  Started on
Celery's worker_ready, stopped (and the liveness key removed) on worker_shutdown."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from runtime.db import make_engine
from runtime.embedded import client as redis_client
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.hosts import Hosts
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Jobs
from runtime.schedules.ticker import Ticker
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from runtime.webhooks.sender import WebhookSender
from workers.celery_app import app, sender
from workers.reaper import Reaper

log = logging.getLogger("setflow.worker")
_stop = threading.Event()
WEBHOOKS_PER_PASS = 100  # messages one sender pass takes at most (its endpoints POOL at a time)


def _beat(settings: Settings, worker: str) -> None:
    routing = Routing(redis_client(settings), settings)
    try:
        routing.running(worker, {})  # the counts an earlier process of this name left behind
    except Exception:  # noqa: BLE001 - Redis away: the first job's start says it again
        log.warning("could not clear this worker's running count", exc_info=True)
    while not _stop.is_set():
        try:
            routing.beat(worker, settings.batch_sessions or 1)  # its slots: the jobs it runs at once
        except Exception:  # noqa: BLE001 - Redis away: keep trying, never die
            log.warning("heartbeat failed", exc_info=True)
        _stop.wait(settings.worker_heartbeat_s)
    try:
        routing.gone(worker)
    except Exception:  # noqa: BLE001
        pass


def _reap(settings: Settings) -> None:
    # its own thread: a pass slowed by a locked database must not delay the heartbeat
    client = redis_client(settings)
    reaper = Reaper(Dispatcher(client, Jobs(make_engine(settings), settings), sender(app)), SessionStore(client, settings))
    collected = time.monotonic()
    while not _stop.wait(settings.reaper_interval_s):
        due = time.monotonic() - collected >= settings.gc_interval_s
        if "segments_freed" in reaper.run(collect=due):
            collected = time.monotonic()


def _deliver(settings: Settings) -> None:
    # its own thread, not a step of the reaper's pass: a slow receiver (webhook_timeout_s a
    # request) must not hold back requeues, and the reaper's pass runs on one worker per
    # interval while delivery is shared by all of them (each message claimed in SQL)
    sender = WebhookSender(make_engine(settings), settings)
    pruned = time.monotonic()
    try:
        while not _stop.wait(settings.webhook_interval_s):
            due = time.monotonic() - pruned >= settings.gc_interval_s
            if "pruned" in deliver_pass(sender, prune=due):
                pruned = time.monotonic()
    finally:
        sender.close()


def deliver_pass(sender: WebhookSender, prune: bool = False) -> dict[str, int]:
    """One sender pass: the webhook messages due (at most WEBHOOKS_PER_PASS), then, when
    `prune`, the delivered and failed ones past their retention.  Failures are logged, never
    fatal (the database away: the next pass tries again; the messages wait in SQL).  Returns
    what the pass did."""
    done: dict[str, int] = {}
    try:
        done = sender.deliver_due(WEBHOOKS_PER_PASS)
        if done["retried"] or done["failed"]:
            log.info("webhooks: %s", done)
        if prune:
            done["pruned"] = sender.prune()
    except Exception:  # noqa: BLE001 - the database away: keep trying, never die
        log.warning("webhook pass failed", exc_info=True)
    return done


def _tick(settings: Settings) -> None:
    # its own thread: a pass that submits a thousand ticks must not delay the reaper or the sender
    jobs = Jobs(make_engine(settings), settings)
    Ticker(Dispatcher(redis_client(settings), jobs, sender(app)), name=settings.worker_name or "").run(_stop)


@worker_ready.connect
def _start(**_: Any) -> None:
    s = Settings()
    if s.worker_name is None:
        log.warning("SETFLOW_WORKER_NAME is not set: no heartbeat, no affinity (start workers with `setflow worker`)")
        return
    threading.Thread(target=_beat, args=(s, s.worker_name), name="setflow-heartbeat", daemon=True).start()
    threading.Thread(target=_reap, args=(s,), name="setflow-reaper", daemon=True).start()
    threading.Thread(target=_deliver, args=(s,), name="setflow-webhooks", daemon=True).start()
    threading.Thread(target=_tick, args=(s,), name="setflow-schedules", daemon=True).start()


@worker_shutdown.connect
def _stop_loop(**_: Any) -> None:
    _stop.set()
    s = Settings()
    if s.worker_name is not None:
        try:  # gone now, not when the key expires: its sessions' next turns go to the shared queue
            client = redis_client(s)
            Routing(client, s).gone(s.worker_name)
            Hosts(client, s).gone(s.worker_name)
        except Exception:  # noqa: BLE001
            pass
