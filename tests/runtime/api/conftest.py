"""The HTTP API without workers: `create_app` on the real Redis (a key prefix of its own) and a
SQLite file under a temporary data_dir.  Jobs are sent to the real Celery broker queues under
that prefix ({prefix}:celery:...); nobody consumes them, so every job stays queued.  No worker
publishes its model's card either: the test does, the shipped model's, as a worker would
(`shipped_card`).  Everything under the prefix is deleted afterwards.

Also: the two tenants' keys, sample job specs, and `Api.snapshot()`: the state a rejected
request must leave as it was (SQL rows and the Redis keys under the prefix)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from sqlalchemy import func, select
from starlette.testclient import TestClient

from app.serve import ApiServer
from model import checkpoint, shipped
from runtime.api.app import create_app
from runtime.api.services import Services
from runtime.jobs import hosts as models
from runtime.keys import Keys
from runtime.sessions.engine import FP_LEN
from runtime.settings import Settings
from runtime.tables import DatasetRecord, JobRecord, ScheduleRecord, SessionRecord, TickRecord, TurnRecord
from workers.celery_app import make_app, sender

API_KEYS = {"key-acme-0001": "acme", "key-globex-01": "globex"}
ACME = {"Authorization": "Bearer key-acme-0001"}
GLOBEX = {"Authorization": "Bearer key-globex-01"}

# ---- sample specs (valid for runtime/jobs/specs.py) ------------------------------------------------
DATA: dict[str, Any] = {
    "tenant": "Northwind", "period": "2026-Q3", "style": "formal",
    "metrics": [{"key": "revenue", "value": "1240", "prev": "1105", "target": "1300"},
                {"key": "churn", "value": "2.4", "prev": "2.6", "target": "2.5"},
                {"key": "latency", "value": "182", "prev": "190"}],
    "breakdown": {"kind": "region", "metric": "revenue",
                  "rows": [["EMEA", "512", "468"], ["APAC", "301", "318"], ["AMER", "427", "319"]]}}
NARRATIVE: dict[str, Any] = {"payload": DATA, "params": {"max_new_tokens": 32}}
AGENT: dict[str, Any] = {"question": "What was the churn in APAC in 2026-Q3?", "max_calls": 2}
REPORT: dict[str, Any] = {
    "title": "Northwind quarterly review", "data": DATA,
    "outline": [{"title": "Revenue", "metrics": ["revenue"]}, {"title": "Customer health", "metrics": ["churn"]}]}
TURN: dict[str, Any] = {"text": "Hello there.", "params": {"max_new_tokens": 8}}
INFILL: dict[str, Any] = {"text": "Revenue rose to <hole><hole> this quarter."}


@cache
def shipped_card() -> models.ModelCard:
    """The card a CPU worker publishes for the shipped model: the fingerprint its engine computes
    (over the float32 weights: torch, which the tests may import and the API may not)."""
    model, tok = shipped.load()
    return models.ModelCard(checkpoint.fingerprint(model)[:FP_LEN], model.cfg, tok.to_str())


class Api:
    """One app, its test client, and what the tests read behind the API's back."""

    def __init__(self, app: FastAPI, http: TestClient, settings: Settings, client: redis.Redis) -> None:
        self.app = app
        self.http = http
        self.s = settings
        self.r = client  # the test's own Redis client (the app has its own)
        self.keys = Keys(settings.key_prefix)

    @property
    def svc(self) -> Services:
        svc: Services = self.app.state.services
        return svc

    def redis_state(self, rate_limits: bool = False) -> dict[str, tuple[str, int]]:
        """Every key under the prefix -> (type, size); the rate-limit buckets only if asked
        (an accepted submission changes its bucket)."""
        rl = self.keys.bucket("")
        names = sorted(k.decode() for k in self.r.scan_iter(f"{self.s.key_prefix}:*", count=1000))
        names = [k for k in names if rate_limits or not k.startswith(rl)]
        with self.r.pipeline(transaction=False) as p:
            for k in names:
                p.type(k)
            types = [t.decode() if isinstance(t, bytes) else str(t) for t in p.execute()]
        size = {"string": "strlen", "list": "llen", "hash": "hlen", "set": "scard", "zset": "zcard",
                "stream": "xlen"}
        with self.r.pipeline(transaction=False) as p:
            for k, t in zip(names, types):
                getattr(p, size[t])(k) if t in size else p.exists(k)
            sizes = p.execute()
        # a key that expired between the scan and its TYPE ("none") is not there
        return {k: (t, int(n)) for k, t, n in zip(names, types, sizes) if t != "none"}

    def expiring(self, keys: Iterable[str]) -> dict[str, float]:
        """key -> the time.monotonic() from which it may have expired, for the keys that have a
        TTL (or had one: gone already, -2): after that a snapshot may find it gone, or read half
        of it (its type, then a size of 0), whatever a request did."""
        keys, start = list(keys), time.monotonic()
        with self.r.pipeline(transaction=False) as p:
            for k in keys:
                p.pttl(k)
            ttls = p.execute()
        return {k: start + max(ms, 0) / 1000 for k, ms in zip(keys, ttls) if ms != -1}

    def unchanged(self, before: dict[str, Any], expiring: dict[str, float],
                  rate_limits: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """(before, a snapshot now), both without the keys whose TTL has run out since `expiring`
        (expiring(before's keys)) was read: a test of "nothing changed" waits for a state, not a
        moment (an earlier test's stream may expire in the middle of a request)."""
        after, now = self.snapshot(rate_limits), time.monotonic()
        gone = {k for k, at in expiring.items() if at <= now}

        def kept(state: dict[str, Any]) -> dict[str, Any]:
            return {**state, "redis": {k: v for k, v in state["redis"].items() if k not in gone}}
        return kept(before), kept(after)

    def sql_state(self) -> dict[str, Any]:
        with self.svc.sql.connect() as c:
            counts = {t.__tablename__: int(c.scalar(select(func.count()).select_from(t)) or 0)
                      for t in (SessionRecord, TurnRecord, JobRecord, DatasetRecord, ScheduleRecord, TickRecord)}
            counts["dataset_rows"] = int(c.scalar(select(func.sum(DatasetRecord.n_rows))) or 0)
            jobs = sorted((r.id, r.status, bool(r.cancel_requested), r.session_id)
                          for r in c.execute(select(JobRecord.id, JobRecord.status, JobRecord.cancel_requested,
                                                    JobRecord.session_id)))
            sessions = sorted(c.scalars(select(SessionRecord.id)))
        return {"counts": counts, "jobs": jobs, "sessions": sessions}

    def snapshot(self, rate_limits: bool = False) -> dict[str, Any]:
        """What a rejected request must not change."""
        return {"sql": self.sql_state(), "redis": self.redis_state(rate_limits)}

    def job_count(self) -> int:
        return int(self.sql_state()["counts"]["jobs"])

    # ---- seeding behind the API (no rate-limit token spent) ------------------------------------

    def seed_session(self, tenant: str = "acme", turns: int = 1) -> str:
        """A session with `turns` finished turns in SQL (no Redis state), as a worker writes them."""
        rec = self.svc.records.create_session(tenant, "")
        tok = shipped_card().tokenizer
        for i in range(turns):
            ids = tok.encode(f"Question {i}?") + tok.encode(" An answer.")
            n_input = len(tok.encode(f"Question {i}?"))
            self.svc.records.append_turn(rec.id, tenant, "user", f"Question {i}?", ids,
                                         [(p, t) for p, t in enumerate(ids)], meta={"n_input": n_input})
        return rec.id


def delete_keys(redis_url: str, pattern: str) -> None:
    """What a test left in Redis: the keys matching pattern (a prefix's, the broker's included)."""
    r = redis.Redis.from_url(redis_url)
    stale = list(r.scan_iter(pattern, count=1000))
    if stale:
        r.delete(*stale)
    r.close()


def api_settings(redis_url: str, data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"redis_url": redis_url, "database_url": None, "broker_url": None,
                              "key_prefix": f"sfapi-{uuid.uuid4().hex[:12]}", "data_dir": data_dir,
                              "api_keys": API_KEYS, "lease_wait_ms": 100,
                              "webhook_allow_private": True,  # the tests' receivers listen on 127.0.0.1
                              **overrides}
    return Settings(**values)


@contextmanager
def api_server(redis_url: str, data_dir: Path, **overrides: Any) -> Iterator[ApiServer]:
    """The API under uvicorn on a thread (a real server: a free port, real sockets), the shipped
    model's card published as a worker would when it starts; its keys deleted afterwards."""
    s = api_settings(redis_url, data_dir, api_port=0, **overrides)
    r = redis.Redis.from_url(redis_url)
    models.publish(r, s, shipped_card())
    r.close()
    srv = ApiServer(s).start()
    try:
        yield srv
    finally:
        srv.stop()
        delete_keys(redis_url, f"{s.key_prefix}:*")


@contextmanager
def running_api(redis_url: str, data_dir: Path, card: bool = True, **overrides: Any) -> Iterator[Api]:
    """card: publish the shipped model's card first (as a worker would when it starts)."""
    s = api_settings(redis_url, data_dir, **overrides)
    mine = redis.Redis.from_url(redis_url)
    if card:
        models.publish(mine, s, shipped_card())
    celery = make_app(s)
    app = create_app(s, client=redis.Redis.from_url(redis_url, socket_timeout=10), send=sender(celery))
    try:
        with TestClient(app) as http:
            yield Api(app, http, s, mine)
    finally:
        app.state.services.close()  # idempotent: the lifespan closed it already when it ran
        celery.close()
        stale = list(mine.scan_iter(f"{s.key_prefix}:*", count=1000))  # the broker's keys included
        if stale:
            mine.delete(*stale)
        mine.close()


@pytest.fixture
def make_api(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """make_api(card=True, **settings overrides) -> Api; several per test share nothing but the
    Redis server.  card=False: no model card published (as before any worker started)."""
    with_stack: list[Any] = []

    def make(card: bool = True, **overrides: Any) -> Api:
        cm = running_api(redis_url, tmp_path / f"d{len(with_stack)}", card, **overrides)
        api = cm.__enter__()
        with_stack.append(cm)
        return api

    try:
        yield make
    finally:
        for cm in reversed(with_stack):
            cm.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()
