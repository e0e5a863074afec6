"""A local cluster of worker processes: what tests, benchmarks and demos start on one machine.

Each worker is started as `setflow worker` starts one (`python -m app.cli worker
--processes 1 --name NAME`) in its own process group, with the cluster's settings passed as
SETFLOW_* variables; the client side (submit, wait, cancel) uses the same settings.  `kill`
is a kill -9 of a whole worker (its main process and its pool process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runtime.db import make_engine
from runtime.embedded import from_url
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.routing import own_queue
from runtime.jobs.rows import Jobs
from runtime.sessions.records import Records
from runtime.settings import Settings
from runtime.tables import JobRecord
from workers.celery_app import TASK, make_app, sender

ROOT = Path(__file__).resolve().parents[1]
ALIASES = {"redis_url": "REDIS_URL", "database_url": "DATABASE_URL", "broker_url": "BROKER_URL"}  # their env names


class LocalCluster:
    def __init__(self, data_dir: Path, **values: Any) -> None:
        """values: Settings fields (redis_url, key_prefix, leases, ...) shared by every process."""
        self.values = {"data_dir": data_dir, **values}
        self.settings = Settings(**self.values)
        self.sql = make_engine(self.settings)  # migrated once, before any worker opens it
        self.records = Records(self.sql, self.settings)
        self.jobs = Jobs(self.sql, self.settings)
        url = self.settings.redis_url
        if url is None:
            raise ValueError("a local cluster needs a redis_url (start the embedded server first)")
        self.client = from_url(url)
        self.app = make_app(self.settings)
        self.dispatcher = Dispatcher(self.client, self.jobs, sender(self.app))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        return worker_env(self.settings)

    def start(self, *names: str, **overrides: Any) -> None:
        """overrides: Settings fields for these workers only (model_dir, dtype: a mixed fleet)."""
        env = {**self.env(), **{f"SETFLOW_{k.upper()}": str(v) for k, v in overrides.items()}}
        for name in names:
            self.procs[name] = spawn_worker(name, env, self.logs, "info")

    def ready(self, *names: str, timeout_s: float = 60.0) -> None:
        """Alive (heartbeat) and warm: each has run a small turn from its own queue (its engine
        built, its cost model calibrated)."""
        deadline = time.monotonic() + timeout_s
        for name in names:
            while not self.dispatcher.routing.alive(name):
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"worker {name} exited:\n{self.log(name)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {name} not alive after {timeout_s} s:\n{self.log(name)}")
                time.sleep(0.1)
            # recorded as sent to the worker's own queue: a job recorded as never sent is the
            # reaper's to send, to a shared queue, where another worker may warm up instead; and
            # one its worker has not started within job_requeue_after_s (a first engine built on
            # a loaded machine) is sent again to the shared queue: then warm up again
            while True:
                sid, queue = self.open("warmup"), own_queue(self.settings, name)
                job, _ = self.jobs.create("turn", "warmup", {"text": "company: Acme\n", "params": {"max_new_tokens": 2}},
                                          sid, queue=queue)
                self.app.send_task(TASK, args=[job.id], queue=queue)
                done = self.dispatcher.wait(job.id, max(1.0, deadline - time.monotonic()))
                ran_on = (done.result or {}).get("worker")
                if done.status == "succeeded" and ran_on == name:
                    break
                if done.status != "succeeded" or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {name}: warm-up job {done.status} on {ran_on} {done.error}:\n"
                                       f"{self.log(name)}")

    def open(self, tenant: str) -> str:
        return self.records.create_session(tenant, "").id

    def submit(self, session: str, spec: dict[str, Any], tenant: str = "acme") -> JobRecord:
        return self.dispatcher.submit("turn", tenant, spec, session)

    def wait(self, job: JobRecord | str, timeout_s: float = 60.0) -> JobRecord:
        return self.dispatcher.wait(job if isinstance(job, str) else job.id, timeout_s)

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def log(self, name: str, tail: int = 4000) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-tail:]

    def close(self) -> None:
        """Kill every worker, delete the cluster's keys (its prefix) and close the clients."""
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        keys = list(self.client.scan_iter(f"{self.settings.key_prefix}*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()
        self.sql.dispose()
        self.dispatcher.routing.depth.close()
        self.app.close()  # the broker connections its sends opened


def worker_env(settings: Settings) -> dict[str, str]:
    """A worker process's environment: these settings (every field given, from arguments or
    the environment, and the Redis URL and data folder) as the variables Settings reads, and
    nothing of this process's own SETFLOW_* or URL variables besides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETFLOW_") and k not in ALIASES.values()}
    for name in settings.model_fields_set | {"redis_url", "data_dir"}:
        value = getattr(settings, name)
        if value is not None:
            env[ALIASES.get(name, f"SETFLOW_{name.upper()}")] = json.dumps(value) if isinstance(value, dict) else str(value)
    env["PYTHONPATH"] = str(ROOT)
    return env


def spawn_worker(name: str, env: dict[str, str], logs: Path, loglevel: str | None = None) -> subprocess.Popen[bytes]:
    """`setflow worker --processes 1 --name NAME` in its own process group, its output in
    logs/NAME.log (the worker keeps its own handle)."""
    args = [sys.executable, "-m", "app.cli", "worker", "--processes", "1", "--name", name]
    with open(logs / f"{name}.log", "ab") as log:
        return subprocess.Popen(args + (["--loglevel", loglevel] if loglevel else []), env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
