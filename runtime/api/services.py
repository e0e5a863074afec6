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
from runtime.db import Records, make_engine
from runtime.dispatch import Dispatcher, Send, check_size
from runtime.jobs import Jobs
from runtime.keys import Keys
from runtime.metrics import TurnMetrics
from runtime.plans import check_fits
from runtime.ratelimit import RateLimiter
from runtime.errors import BadInput
from runtime.schemas import check_spec
from runtime.settings import Settings
from runtime.store import SessionStore

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
    aclient: aioredis.Redis  # the event streams wait on it without holding a thread
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
                   Tokenizer.from_file(TOKENIZER), Keys(settings.key_prefix),
                   aioredis.Redis(connection_pool=aioredis.ConnectionPool(
                       connection_class=_async_class(client), **_pool_kwargs(client))))

    async def aclose(self) -> None:
        """At the app's shutdown, on its event loop (the async client's connections belong to it)."""
        await self.aclient.aclose()
        await self.aclient.connection_pool.disconnect()  # a pool given to a client is not closed with it
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
        used = self.records.length(session, tenant) if session is not None else 0
        check_fits(kind, model, self.tokenizer, used, int(self.model_config["max_seq_len"]))

    def close(self) -> None:
        """The synchronous side; idempotent."""
        self.sql.dispose()
        self.client.close()


def _pool_kwargs(client: redis.Redis) -> dict[str, Any]:
    """The sync client's connection settings (host and port, or a unix socket), for its async twin."""
    kw = dict(client.connection_pool.connection_kwargs)
    kw.pop("retry", None)
    kw["socket_timeout"] = None  # XREAD BLOCK waits up to a second by itself
    return kw


def _async_class(client: redis.Redis) -> type[aioredis.connection.AbstractConnection]:
    sync_class = client.connection_pool.connection_class
    if issubclass(sync_class, redis.UnixDomainSocketConnection):
        return aioredis.UnixDomainSocketConnection
    if issubclass(sync_class, redis.SSLConnection):
        return aioredis.SSLConnection
    return aioredis.Connection
