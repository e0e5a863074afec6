"""What the API's routes use, built once per app from Settings: the Redis client, the SQL
engine and its stores, the dispatcher (which sends jobs to Celery by task name), the tokenizer
(to show a transcript's text; no torch in the API process)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from sqlalchemy import Engine

import model
from model.tokenizer import Tokenizer
from runtime.sessions.records import Records
from runtime.db import make_engine
from runtime.jobs.dispatch import Dispatcher, Send, check_size
from runtime.jobs.rows import Jobs
from runtime.keys import Keys
from runtime.jobs.metrics import TurnMetrics
from runtime.jobs.plans import check_fits, positions
from runtime.jobs.ratelimit import RateLimiter
from runtime.errors import BadInput
from runtime.jobs.specs import check_spec
from runtime.settings import Settings
from runtime.sessions.store import SessionStore

SHIPPED = Path(model.__file__).resolve().parent / "shipped"  # model.shipped imports torch: the files are read here
TOKENIZER = SHIPPED / "tokenizer.json"


@dataclass
class Services:
    settings: Settings
    client: redis.Redis
    sql: Engine
    records: Records
    jobs: Jobs
    dispatcher: Dispatcher
    store: SessionStore
    limiter: RateLimiter
    metrics: TurnMetrics
    tokenizer: Tokenizer
    keys: Keys
    streams: dict[str, int] = field(default_factory=dict)  # tenant -> event streams open (this process)

    @classmethod
    def build(cls, settings: Settings, client: redis.Redis, send: Send | None = None) -> Services:
        """send: how a job id reaches its queue (default: Celery's send_task by name)."""
        if send is None:
            from workers.celery_app import make_app, sender  # Celery, not torch

            send = sender(make_app(settings))
        sql = make_engine(settings)
        jobs = Jobs(sql, settings)
        return cls(settings, client, sql, Records(sql), jobs, Dispatcher(client, jobs, send),
                   SessionStore(client, settings), RateLimiter(client, settings), TurnMetrics(client, settings),
                   Tokenizer.from_file(TOKENIZER), Keys(settings.key_prefix))

    def aclient(self) -> aioredis.Redis:
        """An async Redis client for one event stream (it waits on it without holding a
        thread), closed by the stream: its connection belongs to the loop that runs the stream,
        whichever that is (uvicorn's; a test's).  A connection per open stream, and those are
        capped per tenant.  A finite socket timeout: a half-open connection fails the read
        (retried) instead of hanging the stream."""
        url = self.settings.redis_url or _url(self.client)
        return aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    async def aclose(self) -> None:
        """At the app's shutdown."""
        self.close()

    @cached_property
    def model_config(self) -> dict[str, Any]:
        """The shipped model's config (what the workers run): its context, vocabulary, mask id."""
        return dict(json.loads((SHIPPED / "config.json").read_text()))

    def check_fits(self, kind: str, spec: dict[str, Any], session: str | None, tenant: str) -> None:
        """BadInput (before any state changes) when the job cannot fit the session's context;
        NotFound for another tenant's session."""
        model = check_spec(kind, spec, session or "new")
        check_size(spec, self.settings.max_input_tokens)
        vocab, mask = int(self.model_config["vocab_size"]), int(self.model_config["mask_id"])
        ids = list(getattr(model, "input_ids", None) or [])
        params = getattr(model, "params", None)
        ids += [t for seq in (params.stop if params is not None else []) for t in seq]
        if any(t >= vocab or t == mask for t in ids):
            raise BadInput(f"token ids must be in [0, {vocab}) and not the mask id {mask} (holes: infill)")
        used = 0
        if session is not None:  # what it holds, and what the jobs queued or running on it will add
            ahead = self.jobs.unfinished_jobs(session)
            used = self.records.length(session, tenant, except_jobs={j.id for j in ahead})
            for j in ahead:
                try:
                    used += positions(j.kind, check_spec(j.kind, j.spec, session), self.tokenizer)
                except BadInput:
                    pass  # a stored spec that no longer checks: its job fails without writing
        check_fits(kind, model, self.tokenizer, used, int(self.model_config["max_seq_len"]))

    def close(self) -> None:
        """The synchronous side; idempotent."""
        self.sql.dispose()
        self.client.close()


def _url(client: redis.Redis) -> str:
    """A URL for the sync client's server (when the settings name none: a client handed in)."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
