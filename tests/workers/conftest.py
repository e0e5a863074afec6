"""Real Celery worker processes for the worker tests (workers/local.py: started as `setflow
worker` starts them) against a real Redis and a SQLite file; each cluster has its own key prefix
(keys, queues and the broker's own keys) and its own database, and its workers are killed at the
end.  Short leases and a fast reaper, so that a killed worker's job is taken over in seconds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model import shipped
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.engine import Engine
from runtime.sessions.store import SessionStore
from workers.local import LocalCluster

#: what the workers and the test's client share (as SETFLOW_* variables for the workers)
FAST = {"job_lease_s": 2.0, "reaper_interval_s": 0.5, "worker_heartbeat_s": 0.3, "lease_ms": 2000,
        "lease_wait_ms": 5000, "job_requeue_after_s": 8.0, "job_retry_s": 30.0, "tenant_burst": 1000,
        "tenant_rate_per_s": 1000.0}


def make_cluster(redis_url: str, data_dir: Path, **overrides: Any) -> LocalCluster:
    """A cluster with its own key prefix (keys, queues, the broker's keys) and database."""
    return LocalCluster(data_dir, redis_url=redis_url, key_prefix=f"sfw-{uuid.uuid4().hex[:10]}",
                        **{**FAST, **overrides})


@pytest.fixture(scope="session")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture(scope="module")
def cluster(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two workers, w1 and w2, warm."""
    c = make_cluster(redis_url, tmp_path_factory.mktemp("cluster"))
    try:
        c.start("w1", "w2")
        c.ready("w1", "w2")
        yield c
    finally:
        c.close()


def reference(loaded: tuple[SetDLM, Tokenizer], c: LocalCluster, inputs: list[dict[str, Any]]) -> list[list[int]]:
    """The same turns by the engine in this process, on a session of its own (uninterrupted)."""
    model, tok = loaded
    engine = Engine(model, SessionStore(c.client, c.settings), c.records, c.settings)
    sid = engine.open("reference")
    out = []
    for spec in inputs:
        ids = spec["input_ids"] if "input_ids" in spec else tok.encode(spec["text"])
        out.append(engine.run_turn(sid, "reference", ids, DecodeParams(**spec.get("params", {}))).tokens)
    return out
