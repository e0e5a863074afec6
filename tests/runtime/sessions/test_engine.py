"""runtime/sessions/engine.py with the shipped model, a real Redis and a SQLite file: a session resumed
warm, from Redis (also in a fresh process), or recomputed from SQL (after a flush, a corrupted or
truncated segment, a foreign model) writes the same tokens as one uninterrupted run (greedy); a
refused or abandoned turn writes nothing.  Write-behind and the lease: test_engine_writes.py;
infill turns, forks and deletes: test_engine_forks.py.  Fixtures: conftest.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine as SqlEngine

from model.params import DecodeError, DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.sessions.engine import Engine
from runtime.sessions.quota import Quota
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from tests.runtime.sessions.turns import PARAMS, inputs


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def _reference(engine: Engine, tok: Tokenizer) -> list[list[int]]:
    """Two turns in one process, the second warm."""
    first, second = inputs(tok)
    sid = engine.open("acme")
    r1 = engine.run_turn(sid, "acme", first, PARAMS, text="payload")
    r2 = engine.run_turn(sid, "acme", second, PARAMS)
    assert (r1.path, r2.path) == ("new", "warm")
    assert engine.records.turns(sid, "acme")[0].text == "payload"
    m = engine.store.read(sid)
    assert m is not None and m.state["params"]["window"] == PARAMS.window and m.state["turns"] == 2
    return [r1.tokens, r2.tokens, [r2.nfe]]


def test_restore_and_recompute_write_the_same_tokens_as_warm(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    ref = _reference(engine, tok)
    assert len(ref[1]) > 5
    first, second = inputs(tok)
    for prefer in ("restore", "recompute"):
        sid = engine.open("acme")
        engine.run_turn(sid, "acme", first, PARAMS)
        engine.warm.clear()  # as if another worker took the next turn
        r2 = engine.run_turn(sid, "acme", second, PARAMS, prefer=prefer)
        assert r2.path == prefer and r2.tokens == ref[1], prefer
        assert [r2.nfe] == ref[2], "a turn's forward passes are its own, whatever path loaded the session"
        turns = engine.records.turns(sid, "acme")
        assert [t.meta["path"] for t in turns] == ["new", prefer]


def test_turn_two_in_a_fresh_process_from_redis(engine: Engine, loaded: tuple[SetDLM, Tokenizer],
                                                db_settings: Settings, any_url: str) -> None:
    if engine.records.engine.dialect.name != "sqlite":
        pytest.skip("the child process opens the SQLite file named by the settings")
    tok = loaded[1]
    ref = _reference(engine, tok)
    first, second = inputs(tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    script = f"""
import json, torch
torch.set_num_threads(1)
from model import shipped
from model.params import DecodeParams
from runtime.sessions.records import Records
from runtime.db import make_engine
from runtime.sessions.engine import Engine
from runtime.settings import Settings
from runtime.sessions.store import SessionStore
from runtime.embedded import from_url
s = Settings.model_validate_json({db_settings.model_dump_json()!r})
e = Engine(shipped.load()[0], SessionStore(from_url({any_url!r}), s), Records(make_engine(s)), s)
p = DecodeParams(**json.loads({json.dumps(PARAMS.__dict__)!r}))
r = e.run_turn({sid!r}, "acme", {second!r}, p, prefer="restore")
print(json.dumps({{"path": r.path, "tokens": r.tokens}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[3])
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"path": "restore", "tokens": ref[1]}


@pytest.mark.parametrize("damage", ["flush", "flip_byte", "truncate", "foreign_model"])
def test_damaged_or_missing_redis_state_is_recomputed_from_sql(engine: Engine, loaded: tuple[SetDLM, Tokenizer],
                                                                client: redis.Redis, damage: str) -> None:
    tok = loaded[1]
    ref = _reference(engine, tok)
    first, second = inputs(tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    engine.warm.clear()
    m = engine.store.read(sid)
    assert m is not None
    key = engine.store.k.segment(m.segments[0])
    blob = client.get(key)
    assert blob is not None
    if damage == "flush":
        client.delete(engine.store.k.manifest(sid), *[engine.store.k.segment(i) for i in m.segments])
    elif damage == "flip_byte":
        bad = bytearray(blob)
        bad[len(bad) // 2] ^= 1
        client.set(key, bytes(bad))
    elif damage == "truncate":
        client.set(key, blob[:-7])
    else:
        client.set(key, blob[:8] + b"0" * 16 + blob[24:])  # another model's fingerprint field
    r2 = engine.run_turn(sid, "acme", second, PARAMS, prefer="restore")
    assert r2.path == "recompute" and r2.tokens == ref[1]
    if damage != "flush":
        assert r2.events and "restore failed" in r2.events[0], r2.events
    # the next turn restores cleanly from what the recompute wrote back
    engine.warm.clear()
    r3 = engine.run_turn(sid, "acme", second, PARAMS, prefer="restore")
    assert r3.path == "restore" and not r3.events


def test_bad_input_is_named_and_changes_nothing(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    first, _ = inputs(tok)
    sid = engine.open("acme")
    with pytest.raises(NotFound):
        engine.run_turn("no-such-session", "acme", first, PARAMS)
    with pytest.raises(NotFound):
        engine.run_turn(sid, "globex", first, PARAMS)
    too_long = first * (engine.s.max_input_tokens // len(first) + 1)  # one more copy than the cap holds
    assert len(too_long) > engine.s.max_input_tokens
    with pytest.raises(BadInput, match="input must be"):
        engine.run_turn(sid, "acme", too_long, PARAMS)
    with pytest.raises(BadInput, match="prefer"):
        engine.run_turn(sid, "acme", first, PARAMS, prefer="fastest")
    with pytest.raises(DecodeError, match="context"):
        engine.run_turn(sid, "acme", first, DecodeParams(max_new_tokens=5000))
    assert engine.records.turns(sid, "acme") == [] and engine.store.read(sid) is None
    assert not engine.store.r.exists(engine.store.k.lease(sid)), "the lease is given back"


def test_a_turn_past_its_tenants_sql_quota_is_refused_and_writes_nothing(engine: Engine,
                                                                         loaded: tuple[SetDLM, Tokenizer]) -> None:
    """The turn's row would pass tenant_max_turn_bytes: OverBudget, no row, the manifest as it
    was (it commits only after the row), the lease given back."""
    tok = loaded[1]
    first, second = inputs(tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    before = engine.store.read(sid)
    held = engine.records.turns(sid, "acme")[0].bytes
    engine.records.quota = Quota(turn_bytes=held + 10)
    with pytest.raises(OverBudget, match="tenant_max_turn_bytes"):
        engine.run_turn(sid, "acme", second, PARAMS)
    after = engine.store.read(sid)
    assert engine.records.turn_count(sid, "acme") == 1 and sid not in engine.warm
    assert before is not None and after is not None and (after.slots, after.state) == (before.slots, before.state)
    assert not engine.store.r.exists(engine.store.k.lease(sid)), "the lease is given back"


def test_an_abandoned_turn_writes_nothing_and_leaves_no_warm_state(engine: Engine,
                                                                   loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    ref = _reference(engine, tok)
    first, second = inputs(tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    before = engine.store.read(sid)
    assert before is not None
    it = engine.turn(sid, "acme", second, PARAMS)
    next(it)  # one step, then the caller goes away
    it.close()
    assert sid not in engine.warm and engine.records.turn_count(sid, "acme") == 1
    after = engine.store.read(sid)
    assert after is not None and (after.segments, after.slots, after.state) == (before.segments, before.slots,
                                                                               before.state)
    assert not engine.store.r.exists(engine.store.k.lease(sid)), "the lease is given back"
    r2 = engine.run_turn(sid, "acme", second, PARAMS)
    assert r2.path in ("restore", "recompute") and r2.tokens == ref[1]


def test_a_failed_redis_save_keeps_the_turn_warm_here_and_recomputed_elsewhere(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, db_settings: Settings, db_engine: SqlEngine) -> None:
    model, tok = loaded
    ref = _reference(Engine(model, SessionStore(client, db_settings), Records(db_engine), db_settings), tok)
    tight = db_settings.model_copy(update={"session_budget_bytes": 10_000})  # a few slots of K/V
    engine = Engine(model, SessionStore(client, tight), Records(db_engine), tight)
    first, second = inputs(tok)
    sid = engine.open("acme")
    r1 = engine.run_turn(sid, "acme", first, PARAMS)
    assert r1.tokens == ref[0] and "redis save failed" in r1.events[0] and "over_budget" in r1.events[0]
    assert engine.records.turn_count(sid, "acme") == 1 and engine.store.read(sid) is None
    r2 = engine.run_turn(sid, "acme", second, PARAMS)  # this process still holds it
    assert r2.path == "warm" and r2.tokens == ref[1]
    other = Engine(model, SessionStore(client, tight), Records(db_engine), tight)  # another worker
    sid2 = other.open("acme")
    other.run_turn(sid2, "acme", first, PARAMS)
    other.warm.clear()
    r2b = other.run_turn(sid2, "acme", second, PARAMS)
    assert r2b.path == "recompute" and r2b.tokens == ref[1]


def test_a_rejected_request_keeps_a_warm_session_warm(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    first, second = inputs(tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    with pytest.raises(DecodeError, match="context"):
        engine.run_turn(sid, "acme", second, DecodeParams(max_new_tokens=5000))
    assert engine.run_turn(sid, "acme", second, PARAMS).path == "warm"
