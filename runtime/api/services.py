"""What the API's routes use, built once per app from Settings: the Redis client, the SQL
engine and its stores, the dispatcher (which sends jobs to Celery by task name), the tokenizer
(to show a transcript's text; no torch in the API process)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from sqlalchemy import Engine

import model
from model.tokenizer import Tokenizer
from runtime.db import Records, make_engine
from runtime.dispatch import Dispatcher, Send
from runtime.jobs import Jobs
from runtime.keys import Keys
from runtime.metrics import TurnMetrics
from runtime.ratelimit import RateLimiter
from runtime.settings import Settings
from runtime.store import SessionStore

TOKENIZER = Path(model.__file__).resolve().parent / "shipped" / "tokenizer.json"  # model.shipped imports torch


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
