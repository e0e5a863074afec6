"""Redis holds only what manifests name (issue: bounded state).  A mix of turns, restores,
recomputes, forks, evictions over the tenant budget, deletes, a turn abandoned midway (its
segments written behind) and a writer that died between its segments and its manifest: once
the writer's deadline has passed and the sweep ran, no segment is unnamed, and each tenant's
account is exactly the bytes its manifests name (shipped model, real Redis, SQLite)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine as SqlEngine

from domain.draws import make_payload
from model import shipped
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import OverBudget
from runtime.sessions.engine import Engine
from runtime.sessions.records import Records
from runtime.sessions.store import Manifest, SessionStore
from runtime.sessions.turn import TurnResult
from runtime.settings import Settings
from tests.redis_state import orphan_segments
from workflows.narrative import prompt_ids

PARAMS = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=48)


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


def _named_bytes(store: SessionStore, tenant: str) -> int:
    """The bytes of the segments the tenant's manifests name, each manifest counting its own."""
    total = 0
    for key in store.r.scan_iter(store.k.manifest("*"), count=1000):
        if store.r.hget(key, "tenant") == tenant.encode():
            body = json.loads(store.r.hget(key, "body"))
            total += sum(store.r.strlen(store.k.segment(i)) for i in body["segments"] + body.get("behind", []))
    return total


def test_after_any_mix_of_operations_redis_holds_only_named_bytes(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path,
        db_engine: SqlEngine) -> None:
    model, tok = loaded
    # a budget of about five sessions: later commits evict the least recently used idle ones; a
    # lease of 1 s (a turn on a loaded 2-core machine renews it in time)
    s = settings.model_copy(update={"data_dir": tmp_path, "lease_ms": 1000, "tenant_budget_bytes": 2_000_000})
    records = Records(db_engine)
    e1 = Engine(model, SessionStore(client, s), records, s, warm_sessions=2, write_behind=16)
    e2 = Engine(model, SessionStore(client, s), records, s, warm_sessions=2, write_behind=16)
    store = e1.store

    def ids(i: int) -> list[int]:
        return prompt_ids(tok, make_payload(random.Random(100 + i)))

    follow = tok.encode("\nnarrative: ")
    sessions = [e1.open("acme") for _ in range(6)]
    for i, sid in enumerate(sessions):
        e1.run_turn(sid, "acme", ids(i), PARAMS)
    paths = {e2.run_turn(sid, "acme", follow, PARAMS, prefer=p).path
             for sid, p in zip(sessions, ["restore", "recompute", "auto", "restore", "recompute", "auto"])}
    assert {"restore", "recompute"} <= paths
    child = e1.fork(sessions[0], "acme", 0)  # shares the parent's first segments
    e1.run_turn(child, "acme", follow, PARAMS)
    e1.run_turn(sessions[0], "acme", follow, PARAMS)  # the parent moves on
    assert store.evict(sessions[1], "acme")  # idle: its manifest and its own segments go
    e1.delete(sessions[2], "acme")
    e2.delete(child, "acme")
    long = DecodeParams(policy="ar", max_new_tokens=120, ignore_eos=True)
    gen = e1.turn(sessions[3], "acme", ids(9), long)  # abandoned midway: its writes behind stay named
    for n, ev in enumerate(gen):
        assert not isinstance(ev, TurnResult)
        if n == 40:
            break
    gen.close()  # the write-behind is joined: what it wrote is named as behind
    mid = store.read(sessions[3])
    assert mid is not None and mid.behind, "segments written behind the abandoned turn"
    e1.run_turn(sessions[3], "acme", follow, PARAMS)  # the next turn releases them
    # a writer that died between its segments and its manifest
    store.put_segments(sessions[4], "acme", [b"\x00" * 5000, b"\x01" * 5000])
    other = e1.open("globex")
    e1.run_turn(other, "globex", ids(3), PARAMS)
    tiny = SessionStore(client, s.model_copy(update={"tenant_budget_bytes": 1000}))
    with tiny.lease("huge") as lease, pytest.raises(OverBudget):  # over its whole tenant's budget: refused
        tiny.commit(Manifest("huge", "tiny", e1.fp, segments=tiny.put_segments("huge", "tiny", [b"\x02" * 4000])),
                    lease.lease)

    assert orphan_segments(store), "before the deadline, the dead writer's segments are there"
    time.sleep(2 * s.lease_ms / 1000 + 0.1)
    store.sweep()
    assert orphan_segments(store) == set()
    accounts = store.tenant_bytes()
    for tenant in ("acme", "globex", "tiny"):
        assert accounts.get(tenant, 0) == _named_bytes(store, tenant), tenant
    assert accounts["acme"] <= s.tenant_budget_bytes
