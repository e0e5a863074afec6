"""runtime/sessions/engine.py with the shipped model, a real Redis and a SQLite file: a session resumed
warm, from Redis (also in a fresh process), or recomputed from SQL (after a flush, a corrupted or
truncated segment, a foreign model) writes the same tokens as one uninterrupted run (greedy)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis
import torch
from sqlalchemy import Engine as SqlEngine

from domain import report
from domain.payload import Metric, Payload
from model import shipped
from model.params import DecodeError, DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput, Busy, LeaseLost, NotFound, OverBudget, StaleWrite
from runtime.jobs.rows import Jobs
from runtime.sessions.engine import Engine
from runtime.sessions.quota import Quota
from runtime.sessions.records import JobStep, Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from tests.fakes import assert_same_cache
from tests.redis_state import orphan_segments
from workflows.narrative import prompt_ids

PARAMS = DecodeParams(policy="set", window=4, tau=0.9, max_new_tokens=48)
PAYLOAD = Payload("Globex", "2026-Q3", "brief", [Metric("revenue", "1240", "1105", "1300")])
FOLLOW_UP = "\nnarrative: "


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


@pytest.fixture
def db_settings(settings: Settings, tmp_path: Path, any_url: str) -> Settings:
    return settings.model_copy(update={"data_dir": tmp_path, "redis_url": any_url})


@pytest.fixture
def engine(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, db_settings: Settings,
           db_engine: SqlEngine) -> Engine:
    """The engine on a SQLite file and on PostgreSQL (where one answers)."""
    return Engine(loaded[0], SessionStore(client, db_settings), Records(db_engine), db_settings)


def _inputs(tok: Tokenizer) -> tuple[list[int], list[int]]:
    return prompt_ids(tok, PAYLOAD), tok.encode(FOLLOW_UP)


def _reference(engine: Engine, tok: Tokenizer) -> list[list[int]]:
    """Two turns in one process, the second warm."""
    first, second = _inputs(tok)
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
    first, second = _inputs(tok)
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
    first, second = _inputs(tok)
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
    first, second = _inputs(tok)
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
    first, _ = _inputs(tok)
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
    first, second = _inputs(tok)
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
    first, second = _inputs(tok)
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
    first, second = _inputs(tok)
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


def test_a_turn_longer_than_the_lease_renews_it(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis,
                                                db_settings: Settings, db_engine: SqlEngine) -> None:
    model, tok = loaded
    short = db_settings.model_copy(update={"lease_ms": 300})
    engine = Engine(model, SessionStore(client, short), Records(db_engine), short)
    sid = engine.open("acme")
    result = None
    for i, ev in enumerate(engine.turn(sid, "acme", _inputs(tok)[0], PARAMS)):
        if i < 5:
            time.sleep(0.12)  # a slow consumer: the turn outlives lease_ms
        result = ev
    assert result is not None and not result.events, result.events  # type: ignore[union-attr]
    assert engine.store.read(sid).state["turns"] == 1  # type: ignore[union-attr]


def test_write_behind_names_segments_mid_turn_and_an_interrupted_turn_restores_the_last_one(
        engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    first, _ = _inputs(tok)
    long_input = first[1:] * 2  # 110 tokens: more than one write-behind batch (64 slots)
    ref_engine_tokens = []
    for interrupt in (False, True):
        sid = engine.open("acme")
        engine.run_turn(sid, "acme", first, PARAMS)
        durable = engine.store.read(sid)
        assert durable is not None and durable.state["turns"] == 1
        it = engine.turn(sid, "acme", long_input, PARAMS)
        next(it)  # the first step: the input's prefill (110 slots) is handed to the writer
        deadline = time.monotonic() + 5
        while not (mid := engine.store.read(sid)).behind and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.005)  # the writer thread commits on its own
        assert mid is not None and mid.behind, "segments written while the turn decodes"
        assert (mid.segments, mid.slots, mid.state) == (durable.segments, durable.slots, durable.state)
        if interrupt:
            it.close()  # a crash mid-turn: Redis holds the last turn's state plus garbage
            r = engine.run_turn(sid, "acme", long_input, PARAMS, prefer="restore")
            assert r.path == "restore" and r.tokens == ref_engine_tokens
        else:
            r = list(it)[-1]
            ref_engine_tokens = r.tokens  # type: ignore[union-attr]
            done = engine.store.read(sid)
            assert done is not None and not done.behind and done.state["turns"] == 2
            assert set(mid.behind) <= set(done.segments), "what was written behind is kept, not rewritten"
    assert not orphan_segments(engine.store), "the interrupted turn's segments went with the next commit"


@pytest.mark.parametrize("params", [DecodeParams(policy="set", window=8, tau=0.7, max_new_tokens=200),
                                    DecodeParams(policy="set", window=16, tau=0.5, max_new_tokens=200)])
def test_write_behind_in_small_batches_with_out_of_order_stops_restores_exactly(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, db_settings: Settings, db_engine: SqlEngine,
        params: DecodeParams) -> None:
    """Wide windows commit positions past a stop before the stop fires, so a stop can roll back
    slots already written behind: the restored cache must still equal the warm one, bit for bit."""
    model, tok = loaded
    engine = Engine(model, SessionStore(client, db_settings), Records(db_engine), db_settings, write_behind=4)
    for i in range(6):
        if i >= 3:  # a stop inside the text: later positions are often committed (and written) already
            params = replace(params, stop=[tok.encode(" before")])
        payload = Payload("Initech", "2025-Q4", "casual",
                          [Metric("churn", f"{2 + i % 3}.4", "2.6", "2.5"),
                           Metric("orders", f"{1200 + i % 3}", "1150")])
        sid = engine.open("acme")
        engine.run_turn(sid, "acme", prompt_ids(tok, payload), params)
        warm = engine.warm[sid]
        m = engine.store.read(sid)
        assert m is not None and not m.behind
        restored, _ = engine._restore(m)
        assert restored.positions == warm.cache.positions and restored.tokens == warm.cache.tokens
        assert_same_cache(warm.cache, restored)


def test_a_holder_that_lost_its_lease_writes_nothing(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis,
                                                     db_settings: Settings, db_engine: SqlEngine) -> None:
    """A pauses past its lease at its last step; B takes the session and completes a turn; when A
    resumes, its turn is refused (LeaseLost) and the session's ledger stays B's, no duplicates."""
    model, tok = loaded
    short = db_settings.model_copy(update={"lease_ms": 300, "lease_wait_ms": 2000})
    a = Engine(model, SessionStore(client, short), Records(db_engine), short)
    b = Engine(model, SessionStore(client, short), Records(db_engine), short)
    first, second = _inputs(tok)
    sid = a.open("acme")
    a.run_turn(sid, "acme", first, PARAMS)
    it = a.turn(sid, "acme", second, PARAMS)
    events = [next(it)]
    while not events[-1].done:  # type: ignore[union-attr]
        events.append(next(it))
    time.sleep(0.5)  # A's lease expires here
    b.run_turn(sid, "acme", second, PARAMS)
    with pytest.raises((LeaseLost, StaleWrite)):
        next(it)
    turns = a.records.turns(sid, "acme")
    assert len(turns) == 2
    positions = [p for t in turns for p, _ in t.ledger]
    assert len(positions) == len(set(positions)), "no slot recorded twice"


def test_a_rejected_request_keeps_a_warm_session_warm(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    first, second = _inputs(tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    with pytest.raises(DecodeError, match="context"):
        engine.run_turn(sid, "acme", second, DecodeParams(max_new_tokens=5000))
    assert engine.run_turn(sid, "acme", second, PARAMS).path == "warm"


# ---- infill turns, forks, deletes -------------------------------------------------------------


def _holed(model: SetDLM, tok: Tokenizer) -> tuple[list[int], list[int]]:
    """A report template with mask_id at its holes, and the holes' offsets."""
    ids, hole = report.infill_tokens(tok, report.make_template(random.Random(0)))
    return [model.cfg.mask_id if h else x for x, h in zip(ids, hole)], [i for i, h in enumerate(hole) if h]


def _infill_reference(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> list[list[int]]:
    """A turn, an infill turn, a turn: all warm in one process."""
    model, tok = loaded
    first, second = _inputs(tok)
    holed, holes = _holed(model, tok)
    sid = engine.open("acme")
    rs = [engine.run_turn(sid, "acme", first, PARAMS), engine.run_turn(sid, "acme", holed, PARAMS, infill=True),
          engine.run_turn(sid, "acme", second, PARAMS)]
    assert [r.path for r in rs] == ["new", "warm", "warm"]
    assert len(rs[1].tokens) == len(holes) and model.cfg.mask_id not in rs[1].tokens
    row = engine.records.turns(sid, "acme")[1]
    filled = list(holed)
    for i, t in zip(holes, rs[1].tokens):
        filled[i] = t
    assert row.token_ids == filled and row.meta["infill"] == holes, "the row holds the filled input"
    assert sorted(p for p, _ in row.ledger) == list(range(len(first) + len(rs[0].tokens),
                                                          len(first) + len(rs[0].tokens) + len(holed)))
    return [r.tokens for r in rs]


def test_an_infill_turn_and_the_turn_after_it_agree_warm_restored_and_recomputed(
        engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    ref = _infill_reference(engine, loaded)
    first, second = _inputs(tok)
    holed, _ = _holed(model, tok)
    for prefer in ("restore", "recompute"):
        sid = engine.open("acme")
        engine.run_turn(sid, "acme", first, PARAMS)
        engine.warm.clear()  # the infill turn starts from Redis or SQL
        r2 = engine.run_turn(sid, "acme", holed, PARAMS, prefer=prefer, infill=True)
        assert r2.path == prefer and r2.tokens == ref[1], prefer
        warm = engine.warm[sid]
        if prefer == "restore":  # what the infill turn saved is the warm cache, bit for bit
            m = engine.store.read(sid)
            assert m is not None
            restored, _ = engine._restore(m)
            n = warm.cache.length
            assert restored.positions == warm.cache.positions and restored.tokens == warm.cache.tokens
            assert torch.equal(restored.k[:, :n], warm.cache.k[:, :n])
        engine.warm.clear()  # and the turn after it starts from what the infill turn wrote
        r3 = engine.run_turn(sid, "acme", second, PARAMS, prefer=prefer)
        assert r3.path == prefer and r3.tokens == ref[2], prefer
    # the uncached baseline decodes the same holes
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    assert engine.run_turn(sid, "acme", holed, replace(PARAMS, use_cache=False), infill=True).tokens == ref[1]


def test_a_redelivered_infill_step_returns_its_holes(engine: Engine, loaded: tuple[SetDLM, Tokenizer],
                                                     db_engine: SqlEngine, db_settings: Settings) -> None:
    model, tok = loaded
    first, _ = _inputs(tok)
    holed, _ = _holed(model, tok)
    sid = engine.open("acme")
    jobs = Jobs(db_engine, db_settings)
    job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)
    owner = jobs.claim(job.id, "w1").owner or ""
    r1 = engine.run_turn(sid, "acme", first, PARAMS, job=JobStep(job.id, 0, owner))
    r2 = engine.run_turn(sid, "acme", holed, PARAMS, job=JobStep(job.id, 1, owner), infill=True)
    again = [engine.run_turn(sid, "acme", first, PARAMS, job=JobStep(job.id, 0, owner)),
             engine.run_turn(sid, "acme", holed, PARAMS, job=JobStep(job.id, 1, owner), infill=True)]
    assert [(r.path, r.tokens, r.turn) for r in again] == [("done", r1.tokens, 0), ("done", r2.tokens, 1)]
    assert engine.records.turn_count(sid, "acme") == 2


def test_a_redelivered_step_returns_what_it_generated_whatever_its_input_is_rebuilt_as(
        engine: Engine, loaded: tuple[SetDLM, Tokenizer], db_engine: SqlEngine, db_settings: Settings) -> None:
    """The replay splits the row where it says its input ended (meta n_input), not at the length of
    the input rebuilt from the job's spec, which a job that outlived a change of how specs are
    read (names made canonical, say) may give shorter."""
    _, tok = loaded
    first, _ = _inputs(tok)
    sid = engine.open("acme")
    jobs = Jobs(db_engine, db_settings)
    job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)
    owner = jobs.claim(job.id, "w1").owner or ""
    r1 = engine.run_turn(sid, "acme", first, PARAMS, job=JobStep(job.id, 0, owner))
    again = engine.run_turn(sid, "acme", first[:-2], PARAMS, job=JobStep(job.id, 0, owner))
    assert (again.path, again.tokens) == ("done", r1.tokens) and engine.records.turn_count(sid, "acme") == 1


def test_a_bad_infill_input_is_refused_and_changes_nothing(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    M, V = model.cfg.mask_id, model.cfg.vocab_size
    first, second = _inputs(tok)
    holed, _ = _holed(model, tok)
    sid = engine.open("acme")
    engine.run_turn(sid, "acme", first, PARAMS)
    before = engine.store.read(sid)
    for bad in (second, holed[:-1] + [V], [-1, M], [M, 10**9]):  # no hole; ids outside the vocabulary
        with pytest.raises(BadInput):
            engine.run_turn(sid, "acme", bad, PARAMS, infill=True)
    with pytest.raises(DecodeError, match="context"):  # past the model's context
        engine.run_turn(sid, "acme", [M] * model.cfg.max_seq_len, PARAMS, infill=True)
    with pytest.raises(DecodeError, match="input ids"):  # holes in a normal turn
        engine.run_turn(sid, "acme", holed, PARAMS)
    assert engine.records.turn_count(sid, "acme") == 1 and engine.store.read(sid) == before
    assert not engine.store.r.exists(engine.store.k.lease(sid)), "the lease is given back"
    assert engine.run_turn(sid, "acme", holed, PARAMS, infill=True).path == "warm", "still warm"


def test_a_fork_at_a_turn_shares_the_parents_kv_and_decodes_what_a_session_of_those_turns_does(
        engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, tok = loaded
    first, second = _inputs(tok)
    holed, _ = _holed(model, tok)
    third = tok.encode("\nsummary: ")
    parent = engine.open("acme")
    for ids, infill in ((first, False), (holed, True), (second, False)):
        engine.run_turn(parent, "acme", ids, PARAMS, infill=infill)
    rows = [(t.token_ids, t.ledger, t.meta) for t in engine.records.turns(parent, "acme")]
    manifest = engine.store.read(parent)
    assert manifest is not None
    ref = engine.open("acme")  # a session that only ever had turns 0 and 1
    engine.run_turn(ref, "acme", first, PARAMS)
    engine.run_turn(ref, "acme", holed, PARAMS, infill=True)
    want = engine.run_turn(ref, "acme", third, PARAMS)
    child = engine.fork(parent, "acme", 1)
    boundary = sum(len(ledger) for _, ledger, _ in rows[:2])  # the slots of turns 0 and 1
    m = engine.store.read(child)
    assert m is not None and (m.slots, m.state["turns"]) == (boundary, 2)
    below = manifest.segments[:len(m.segments) - 1]  # the parent's segments below the cut
    if engine.store.cluster:  # copied into the child's slot (a script touches one slot)
        assert engine.store.get_segments(m.segments[:-1]) == engine.store.get_segments(below)
    else:
        assert m.segments[:-1] == below, "copy on write: the segments below the cut are shared"
    ledger = [e for _, led, _ in rows[:2] for e in led]
    assert m.state["ledger"] == [[p for p, _ in ledger], [t for _, t in ledger]]
    got = engine.run_turn(child, "acme", third, PARAMS, prefer="restore")
    assert got.path == "restore" and got.tokens == want.tokens and got.turn == 2 and not got.events
    recomputed = engine.fork(parent, "acme", 1)
    again = engine.run_turn(recomputed, "acme", third, PARAMS, prefer="recompute")
    assert again.path == "recompute" and again.tokens == got.tokens
    assert [(t.token_ids, t.ledger, t.meta) for t in engine.records.turns(parent, "acme")] == rows
    assert engine.store.read(parent) == manifest, "the parent is unchanged"
    assert engine.run_turn(parent, "acme", third, PARAMS).path == "warm"
    whole = engine.fork(parent, "acme", 3)  # at its last turn: every segment shared (on a cluster, copied)
    named = [engine.store.read(x).segments for x in (whole, parent)]  # type: ignore[union-attr]
    assert (engine.store.get_segments(named[0]) == engine.store.get_segments(named[1]) if engine.store.cluster
            else named[0] == named[1])
    with pytest.raises(NotFound):
        engine.fork(parent, "globex", 1)
    with pytest.raises(BadInput):
        engine.fork(parent, "acme", 5)


def test_a_fork_of_a_session_without_fresh_redis_state_recomputes(engine: Engine, loaded: tuple[SetDLM, Tokenizer],
                                                                  client: redis.Redis) -> None:
    tok = loaded[1]
    first, second = _inputs(tok)
    parent = engine.open("acme")
    engine.run_turn(parent, "acme", first, PARAMS)
    engine.run_turn(parent, "acme", second, PARAMS)
    want = engine.run_turn(engine.fork(parent, "acme", 0), "acme", second, PARAMS, prefer="recompute").tokens
    m = engine.store.read(parent)
    assert m is not None
    # another model's K/V; a manifest one turn behind SQL (a failed save); no manifest at all
    for damage in ({"fingerprint": "0" * 16}, {"state": {**m.state, "turns": 0}}, None):
        client.delete(engine.store.k.manifest(parent))
        if damage is not None:
            with engine.store.lease(parent) as lease:
                engine.store.commit(replace(m, gen=0, **damage), lease.lease)  # type: ignore[arg-type]
        child = engine.fork(parent, "acme", 0)
        assert engine.store.read(child) is None, damage
        r = engine.run_turn(child, "acme", second, PARAMS, prefer="restore")
        assert r.path == "recompute" and r.tokens == want, damage


def test_delete_removes_a_session_from_redis_and_sql(engine: Engine, loaded: tuple[SetDLM, Tokenizer],
                                                     client: redis.Redis) -> None:
    tok = loaded[1]
    first, second = _inputs(tok)
    sid, keep = engine.open("acme"), engine.open("acme")
    for s in (sid, keep):
        engine.run_turn(s, "acme", first, PARAMS)
        engine.run_turn(s, "acme", second, PARAMS)
    m = engine.store.read(sid)
    assert m is not None and sid in engine.warm
    with pytest.raises(NotFound):
        engine.delete(sid, "globex")
    held = engine.store.acquire(sid)  # a turn in progress elsewhere
    with pytest.raises(Busy):
        engine.delete(sid, "acme")
    engine.store.release(held)
    assert engine.records.turn_count(sid, "acme") == 2 and engine.store.read(sid) == m, "refusals change nothing"
    engine.delete(sid, "acme")
    assert sid not in engine.warm and engine.store.read(sid) is None
    assert not any(client.exists(engine.store.k.segment(i)) for i in m.segments)
    assert client.hget(engine.store.k.tenant_bytes("acme"), sid) is None
    with pytest.raises(NotFound):
        engine.records.get_session(sid, "acme")
    with pytest.raises(NotFound):
        engine.run_turn(sid, "acme", second, PARAMS)
    with pytest.raises(NotFound):
        engine.delete(sid, "acme")
    engine.warm.clear()
    assert engine.run_turn(keep, "acme", second, PARAMS, prefer="restore").path == "restore", "others stay"


def test_a_deleted_session_id_used_again_is_not_served_from_another_engines_warm_state(
        engine: Engine, loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, db_settings: Settings) -> None:
    model, tok = loaded
    first, _ = _inputs(tok)
    params = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=8)
    engine.open("acme", "reused-id")
    engine.run_turn("reused-id", "acme", first, params)  # warm in `engine`
    other = Engine(model, SessionStore(client, db_settings), engine.records, db_settings)
    other.delete("reused-id", "acme")  # by another process: `engine` still holds it warm
    other.open("globex", "reused-id")
    other.run_turn("reused-id", "globex", tok.encode("company: Initech\n"), params)  # one turn, as acme's had
    r = engine.run_turn("reused-id", "globex", first, params)
    assert r.path != "warm" and r.turn == 1  # globex's session, from Redis or SQL: not acme's cache
    ref = other.open("globex")
    other.run_turn(ref, "globex", tok.encode("company: Initech\n"), params)
    assert r.tokens == other.run_turn(ref, "globex", first, params).tokens
