"""runtime/sessions/engine.py beyond the next turn: infill turns (warm, restored and recomputed alike),
redelivered steps, forks at a turn and deletes."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import redis
import torch
from sqlalchemy import Engine as SqlEngine

from domain import report
from model.params import DecodeError, DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput, Busy, NotFound
from runtime.jobs.rows import Jobs
from runtime.sessions.engine import Engine
from runtime.sessions.records import JobStep
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from tests.runtime.sessions.turns import PARAMS, inputs


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def _holed(model: SetDLM, tok: Tokenizer) -> tuple[list[int], list[int]]:
    """A report template with mask_id at its holes, and the holes' offsets."""
    ids, hole = report.infill_tokens(tok, report.make_template(random.Random(0)))
    return [model.cfg.mask_id if h else x for x, h in zip(ids, hole)], [i for i, h in enumerate(hole) if h]


def _infill_reference(engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> list[list[int]]:
    """A turn, an infill turn, a turn: all warm in one process."""
    model, tok = loaded
    first, second = inputs(tok)
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
    first, second = inputs(tok)
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
    first, _ = inputs(tok)
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
    first, _ = inputs(tok)
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
    first, second = inputs(tok)
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
    first, second = inputs(tok)
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
    first, second = inputs(tok)
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
    first, second = inputs(tok)
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
    first, _ = inputs(tok)
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
