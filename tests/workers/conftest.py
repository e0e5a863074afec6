"""Real Celery worker processes for the worker tests, started as `setflow worker` would start
them (`python -m runtime.cli worker --processes 1 --name NAME`), against a real Redis and a
SQLite file; each cluster has its own key prefix (keys, queues and the broker's own keys) and its
own database, and its workers are killed at the end.  Short leases and a fast reaper, so that a
killed worker's job is taken over within seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from model import shipped
from model.decode import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.db import Records, make_engine
from runtime.dispatch import Dispatcher
from runtime.engine import Engine
from runtime.jobs import Jobs
from runtime.records import JobRecord
from runtime.routing import own_queue
from runtime.settings import Settings
from runtime.store import SessionStore
from workers.celery_app import make_app, sender

ROOT = Path(__file__).resolve().parents[2]
#: what the workers and the test's client share (as SETFLOW_* variables for the workers)
FAST = {"job_lease_s": 2.0, "reaper_interval_s": 0.5, "worker_heartbeat_s": 0.3, "lease_ms": 2000,
        "lease_wait_ms": 5000, "job_requeue_after_s": 8.0, "job_retry_s": 30.0, "tenant_burst": 1000,
        "tenant_rate_per_s": 1000.0}


class Cluster:
    def __init__(self, redis_url: str, data_dir: Path, **overrides: Any) -> None:
        self.values = {"key_prefix": f"sfw-{uuid.uuid4().hex[:10]}", "data_dir": data_dir, "redis_url": redis_url,
                       **FAST, **overrides}
        self.settings = Settings(**self.values)
        self.sql = make_engine(self.settings)
        self.records = Records(self.sql)
        self.jobs = Jobs(self.sql, self.settings)
        self.client = redis.Redis.from_url(redis_url)
        self.app = make_app(self.settings)
        self.dispatcher = Dispatcher(self.client, self.jobs, sender(self.app))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SETFLOW_")}
        env.update({f"SETFLOW_{k.upper()}": str(v) for k, v in self.values.items() if k != "redis_url"})
        env["REDIS_URL"] = str(self.values["redis_url"])
        env["PYTHONPATH"] = str(ROOT)
        return env

    def start(self, name: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:  # the worker keeps its own handle
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "runtime.cli", "worker", "--processes", "1", "--name", name,
                 "--loglevel", "info"],
                env=self.env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self, *names: str, timeout_s: float = 60.0) -> None:
        """Alive (heartbeat) and warm: each has run a small turn from its own queue (the engine is
        built on a worker's first job)."""
        deadline = time.monotonic() + timeout_s
        for name in names:
            while not self.dispatcher.routing.alive(name):
                assert self.procs[name].poll() is None, self.log(name)
                assert time.monotonic() < deadline, f"worker {name} not alive:\n{self.log(name)}"
                time.sleep(0.1)
            sid = self.open()
            job = self.jobs.create("turn", "warmup", {"text": "company: Acme\n", "params": {"max_new_tokens": 2}}, sid)
            self.app.send_task("setflow.run_job", args=[job.id], queue=own_queue(self.settings, name))
            done = self.dispatcher.wait(job.id, max(1.0, deadline - time.monotonic()))
            assert done.status == "succeeded", (done.status, done.error, self.log(name))

    def open(self, tenant: str = "warmup") -> str:
        return self.records.create_session(tenant, "").id

    def kill(self, name: str) -> None:
        """kill -9 of the whole worker: its main process and its pool process."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-4000:]

    def submit(self, session: str, spec: dict[str, Any], tenant: str = "acme") -> JobRecord:
        return self.dispatcher.submit("turn", tenant, spec, session)

    def wait(self, job: JobRecord | str, timeout_s: float = 60.0) -> JobRecord:
        return self.dispatcher.wait(job if isinstance(job, str) else job.id, timeout_s)

    def close(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        keys = list(self.client.scan_iter(f"{self.values['key_prefix']}*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()
        self.sql.dispose()


@pytest.fixture(scope="session")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture(scope="module")
def cluster(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two workers, w1 and w2, warm."""
    c = Cluster(redis_url, tmp_path_factory.mktemp("cluster"))
    try:
        c.start("w1")
        c.start("w2")
        c.ready("w1", "w2")
        yield c
    finally:
        c.close()


def reference(loaded: tuple[SetDLM, Tokenizer], c: Cluster, inputs: list[dict[str, Any]]) -> list[list[int]]:
    """The same turns by the engine in this process, on a session of its own (uninterrupted)."""
    model, tok = loaded
    engine = Engine(model, SessionStore(c.client, c.settings), c.records, c.settings)
    sid = engine.open("reference")
    out = []
    for spec in inputs:
        ids = spec["input_ids"] if "input_ids" in spec else tok.encode(spec["text"])
        out.append(engine.run_turn(sid, "reference", ids, DecodeParams(**spec.get("params", {}))).tokens)
    return out
