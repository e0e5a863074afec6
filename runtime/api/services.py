"""What the API's routes use, built once per app from Settings: the Redis client, the SQL
engine and its stores, the dispatcher (which sends jobs to Celery by task name), the tokenizer
(to show a transcript's text; no torch in the API process)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import redis
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

    def close(self) -> None:
        self.sql.dispose()
        self.client.close()
