"""`setflow worker`: start worker processes with defaults for this machine.

Each worker process is one Celery worker with one engine, one warm LRU and one own queue, so
session affinity points at exactly the process that holds a session warm.  It takes
batch_sessions jobs at once on Celery's thread pool and decodes their turns in one batch
(runtime/sessions/batcher.py), or with batch_sessions 1 one job at a time in a prefork pool
process.  Default count: one per GPU (each sees only its GPU), else one per `torch_threads` CPU
cores; default batch: 32 on a GPU (not measured: no GPU was lent), 6 on CPUs (Settings.batch_size:
on 2 cores, 2 processes of batch 6 served 1.6-1.7x the turns/s of 2 of batch 1, docs/BENCHMARKS.md).
With no REDIS_URL the embedded Redis is started (or joined) first and stopped at the end if this
process started it; the database schema is migrated once, before any worker starts; one tenant's
budgets are checked against Redis's maxmemory (runtime/sessions/budget.py: refused to start
where they do not fit).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from runtime.db import make_engine
from runtime.embedded import EmbeddedRedis
from runtime.embedded import client as redis_client
from runtime.errors import CliError
from runtime.jobs.hosts import pool
from runtime.keys import model_name
from runtime.sessions import budget
from runtime.settings import Settings

SHIPPED = Path(__file__).resolve().parents[1] / "model" / "shipped"  # model/shipped.py's (that one imports torch)


def default_processes(settings: Settings) -> tuple[int, int]:
    """(processes, GPUs)."""
    gpus = _gpus(settings)
    return (gpus or max(1, (os.cpu_count() or 1) // settings.torch_threads)), gpus


def launch(name: str | None, processes: int | None, loglevel: str) -> int:
    s = Settings()
    name = name or s.worker_name or f"{socket.gethostname()}-{os.getpid()}"
    if processes is not None and processes < 1:
        raise CliError("--processes must be >= 1")
    server = None
    if not s.redis_url and not s.broker_url:
        server = EmbeddedRedis(s.data_dir / "redis")
        server.start()
    make_engine(s).dispose()  # migrate once, before several processes open the database
    try:
        budget.check(redis_client(s), s)  # CliError where one tenant's budgets exceed Redis's maxmemory
        n, gpus = default_processes(s) if processes is None else (processes, 0)
        if n == 1:
            return _one(s, name, loglevel)
        return _many(name, n, gpus, loglevel)
    finally:
        if server is not None and server.owned:
            server.stop()


def hosted_pool(settings: Settings, gpu: bool) -> str:
    """The pool (model and numerics, runtime/jobs/hosts.py) this worker hosts, known before its
    model loads (torch loads in the pool process): its config's name, the device and dtype."""
    folder = settings.model_dir or SHIPPED
    name = json.loads((folder / "config.json").read_text()).get("name", "custom")
    return pool(model_name(str(name)), settings.numerics("cuda" if gpu else "cpu"))


def _gpus(settings: Settings) -> int:
    import torch  # only here: counting GPUs

    return torch.cuda.device_count() if settings.device != "cpu" else 0


def _one(s: Settings, name: str, loglevel: str) -> int:
    os.environ["SETFLOW_WORKER_NAME"] = name  # read by Settings in the pool process and the watcher
    from runtime.jobs.routing import consumed_by
    from workers.celery_app import app

    # batching: that many jobs at once on threads of this process, their turns in one batch
    # (runtime/sessions/batcher.py); 1: one job at a time in one forked pool process
    gpu = _gpus(s) > 0
    batch = s.batch_size(gpu=gpu)
    os.environ["SETFLOW_BATCH_SESSIONS"] = str(batch)  # what the runtime in this process reads
    pool = ["-P", "threads", "-c", str(batch)] if batch > 1 else ["-P", "prefork", "-c", "1"]
    queues = consumed_by(s, name, hosted_pool(s, gpu))
    app.worker_main(["worker", "-n", f"{name}@%h", "-Q", ",".join(queues), *pool,
                     "--loglevel", loglevel, "--without-gossip", "--without-mingle", "--without-heartbeat"])
    return 0


def _many(name: str, n: int, gpus: int, loglevel: str) -> int:
    procs = []
    for i in range(n):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
        procs.append(subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--processes", "1",
                                       "--name", f"{name}-{i}", "--loglevel", loglevel], env=env))
    print(f"setflow: {n} worker processes ({name}-0 .. {name}-{n - 1}); Ctrl-C or SIGTERM stops them", flush=True)

    stopping = False

    def stop(signum: int, _frame: object) -> None:  # a warm shutdown: each finishes its job in flight
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # a process that dies unasked (its batch loop died: workers/process.py, or it was killed)
    # stops the set, which exits with its code: a supervisor (compose's restart policy) then
    # starts it whole again, where a set left running would serve at part capacity for ever
    while not stopping and all(p.poll() is None for p in procs):
        time.sleep(0.5)
    if not stopping:
        i, rc = next((i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None)
        print(f"setflow: {name}-{i} exited with {rc}: stopping the others", file=sys.stderr, flush=True)
        stop(signal.SIGTERM, None)
        for p in procs:
            p.wait()
        return rc if rc > 0 else 128 - rc if rc < 0 else 1  # killed by signal N: 128 + N, as a shell says
    return max(p.wait() for p in procs)
