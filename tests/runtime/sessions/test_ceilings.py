"""runtime/sessions/budget.py (its ceilings) against real servers: a Redis of its own (the bundled
redis-server) pushed past its maxmemory, where a write is refused with OOM (an
OutOfMemoryError, or from inside a script on Redis 6 a ResponseError that says so); what a
worker's write-behind and its lease do there; and the start-up check of one tenant's budgets
against maxmemory (a managed Redis that refuses CONFIG is not checked; a cluster's primaries
are summed)."""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from app.cli import main
from runtime.api.app import create_app
from runtime.embedded import EmbeddedRedis, from_url
from runtime.errors import CliError
from runtime.sessions import budget as ceilings
from runtime.sessions.segments import split
from runtime.sessions.store import Manifest, SessionStore
from runtime.sessions.writer import WriteBehind
from runtime.settings import MiB, Settings
from tests.runtime.sessions.stored import FP, META
from tests.runtime.sessions.stored import kv as _kv

ROOT = Path(__file__).resolve().parents[3]


class Full:
    """A Redis server of its own: full() sets its maxmemory below what it uses (every write
    that allocates is refused), room() lifts it again."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.r = redis.Redis.from_url(url)

    def full(self) -> None:
        self.r.config_set("maxmemory", max(1, int(self.r.info("memory")["used_memory"]) // 2))

    def room(self) -> None:
        self.r.config_set("maxmemory", 0)


@pytest.fixture
def own() -> Iterator[Full]:
    with tempfile.TemporaryDirectory(prefix="sfr") as d, EmbeddedRedis(d) as server:
        f = Full(server.url)
        yield f
        f.r.close()


def test_a_write_past_maxmemory_is_oom_and_other_errors_are_not(own: Full) -> None:
    script = own.r.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    own.r.set("s", "x")
    own.full()
    with pytest.raises(redis.ResponseError) as plain:
        own.r.set("k", "v")
    with pytest.raises(redis.ResponseError) as scripted:
        script(keys=["k"], args=["v"])
    assert ceilings.oom(plain.value) and ceilings.oom(scripted.value)
    assert own.r.get("s") == b"x", "reads go on"
    own.room()
    with pytest.raises(redis.ResponseError) as wrong:
        own.r.lpush("s", "x")  # WRONGTYPE: no retry mends it
    assert not ceilings.oom(wrong.value) and not ceilings.oom(redis.ConnectionError("away"))


def test_past_maxmemory_a_held_lease_renews_and_a_new_one_waits(own: Full) -> None:
    """A turn that holds its lease keeps it (PEXPIRE allocates nothing); one that would take a
    lease gets OOM, which the worker retries (workers/runner.transient) rather than failing."""
    store = SessionStore(own.r, Settings(key_prefix="sf"))
    held = store.acquire("s1")
    own.full()
    store.renew(held)
    with pytest.raises(redis.ResponseError) as e:
        store.acquire("s2")
    assert ceilings.oom(e.value)
    own.room()
    assert store.release(held)


def test_the_write_behind_tries_an_oom_batch_again_until_memory_frees(own: Full) -> None:
    """Without the retry the first refusal stopped it (and the turn's K/V were all written again
    at its end, or, still full then, not at all: a recompute)."""
    store = SessionStore(own.r, Settings(key_prefix="sf"))
    blobs = split(META.with_slots(0, 100), _kv()[:100 * META.slot_bytes], store.s.segment_bytes)
    lease = store.acquire("s1")
    base = store.commit(Manifest("s1", "acme", FP, state={"turns": -1}), lease)
    own.full()
    wb = WriteBehind(store, base, lease)
    freed = threading.Timer(0.5, own.room)
    freed.start()
    wb.submit(blobs)
    m = wb.close()
    freed.join()
    assert wb.error is None and len(m.behind) == 1 and store.read("s1") == m


def test_the_start_up_check_refuses_one_tenants_budgets_over_maxmemory(own: Full,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    s = Settings()
    assert ceilings.tenant_bytes(s) == s.tenant_budget_bytes + s.tenant_max_event_bytes
    assert ceilings.check(own.r, s) is None, "no maxmemory: anything fits"
    own.r.config_set("maxmemory", 4 * 1024 * MiB)  # compose's default ceiling (4gb)
    assert ceilings.check(own.r, s) == 3, "the defaults fit the default ceiling, 3 tenants at full budget"
    own.r.config_set("maxmemory", 2 * 1024 * MiB)
    with caplog.at_level(logging.WARNING, "setflow.ceilings"):
        assert ceilings.check(own.r, s) == 1
    assert "1 tenant(s) at full budget" in caplog.text
    own.r.config_set("maxmemory", 512 * MiB)
    with pytest.raises(CliError, match=r"one tenant's budgets \(1280 MiB.*exceed Redis's maxmemory \(512 MiB\)"):
        ceilings.check(own.r, s)
    assert ceilings.check(own.r, s.model_copy(update={"tenant_budget_bytes": 200 * MiB})) == 1


def test_the_default_budgets_fit_composes_default_ceiling(own: Full) -> None:
    """docker-compose.yml's KV Redis (`--maxmemory ${REDIS_MAXMEMORY:-4gb}`), as Redis reads it."""
    cmd = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    default = re.fullmatch(r"\$\{REDIS_MAXMEMORY:-(\w+)\}", dict(zip(cmd[1::2], cmd[2::2]))["--maxmemory"])
    assert default is not None
    own.r.config_set("maxmemory", default[1])
    assert ceilings.check(own.r, Settings()) == 3


def test_a_redis_that_refuses_config_is_not_checked(own: Full, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    own.r.config_set("maxmemory", 1 * MiB)

    def refused(*_: object, **__: object) -> None:
        raise redis.ResponseError("unknown command 'CONFIG'")  # a managed Redis

    monkeypatch.setattr(own.r, "config_get", refused)
    assert ceilings.check(own.r, Settings()) is None
    assert "refused CONFIG GET maxmemory" in caplog.text


def test_the_api_and_the_worker_refuse_to_start_over_maxmemory(own: Full, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`setflow serve` and `setflow worker`: one line on stderr, exit 2, nothing started."""
    own.r.config_set("maxmemory", 256 * MiB)
    monkeypatch.setenv("REDIS_URL", own.url)
    monkeypatch.setenv("SETFLOW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SETFLOW_KEY_PREFIX", f"sft-{uuid.uuid4().hex[:8]}")
    for argv in (["serve", "--port", "0"], ["worker", "--processes", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "exceed Redis's maxmemory (256 MiB)" in err[0], err
    s = Settings(redis_url=own.url, data_dir=tmp_path)
    with pytest.raises(CliError, match="exceed Redis's maxmemory"):
        create_app(s, send=lambda job, queue, priority: None)


def test_a_clusters_primaries_are_summed(cluster_url: str) -> None:
    r = from_url(cluster_url)
    nodes = [redis.Redis(host=n.host, port=n.port) for n in r.get_primaries()]  # type: ignore[attr-defined]
    try:
        for n in nodes:
            n.config_set("maxmemory", 1024 * MiB)
        assert ceilings.maxmemory(r) == len(nodes) * 1024 * MiB
        assert ceilings.check(r, Settings()) == len(nodes) * 1024 // 1280
        nodes[0].config_set("maxmemory", 0)
        assert ceilings.maxmemory(r) == 0, "one primary without a ceiling: none"
    finally:
        for n in nodes:
            n.config_set("maxmemory", 0)
            n.close()
        for node in r.get_nodes():  # type: ignore[attr-defined]
            if node.redis_connection is not None:  # its pool: a node's client does not close it
                node.redis_connection.connection_pool.disconnect()
        r.close()
