"""runtime/sessions/engine.py writing a turn under its lease: a turn longer than the lease renews it,
segments are written behind the decoding and an interrupted turn restores the last one, and a holder
that lost its lease writes nothing."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import redis
from sqlalchemy import Engine as SqlEngine

from domain.payload import Metric, Payload
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import LeaseLost, StaleWrite
from runtime.sessions.engine import Engine
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from tests.fakes import assert_same_cache
from tests.redis_state import orphan_segments
from tests.runtime.sessions.turns import PARAMS, inputs
from workflows.narrative import prompt_ids


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def test_a_turn_longer_than_the_lease_renews_it(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis,
                                                db_settings: Settings, db_engine: SqlEngine) -> None:
    model, tok = loaded
    short = db_settings.model_copy(update={"lease_ms": 1000})
    engine = Engine(model, SessionStore(client, short), Records(db_engine), short)
    sid = engine.open("acme")
    result = None
    for i, ev in enumerate(engine.turn(sid, "acme", inputs(tok)[0], PARAMS)):
        if i < 5:  # a slow consumer: the turn outlives lease_ms (1.5 s), each pause well inside it
            time.sleep(0.3)
        result = ev
    assert result is not None and not result.events, result.events  # type: ignore[union-attr]
    assert engine.store.read(sid).state["turns"] == 1  # type: ignore[union-attr]


def test_a_recompute_longer_than_the_lease_keeps_it(loaded: tuple[SetDLM, Tokenizer], client: redis.Redis,
                                                    db_settings: Settings, db_engine: SqlEngine,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One computation longer than the whole lease, as a 2048-token recompute of a Qwen3-size
    model on a CPU is (28 s at 0.6B, minutes at 1.7B, against lease_ms 30 s): the turn keeps its
    lease (the lease's thread renews it while the holder computes) and completes, where it used
    to fail LeaseLost, and fail again on every retry."""
    model, tok = loaded
    short = db_settings.model_copy(update={"lease_ms": 300})
    first, second = inputs(tok)
    sid = Engine(model, SessionStore(client, short), Records(db_engine), short).open("acme")
    Engine(model, SessionStore(client, short), Records(db_engine), short).run_turn(sid, "acme", first, PARAMS)
    engine = Engine(model, SessionStore(client, short), Records(db_engine), short)  # not warm here
    slow = engine._recompute

    def recompute(session: str, tenant: str) -> tuple[Any, Any]:
        time.sleep(1.0)  # three leases long, in one piece
        return slow(session, tenant)

    monkeypatch.setattr(engine, "_recompute", recompute)
    result = engine.run_turn(sid, "acme", second, PARAMS, prefer="recompute")
    assert result.path == "recompute" and engine.store.read(sid).state["turns"] == 2  # type: ignore[union-attr]


def test_write_behind_names_segments_mid_turn_and_an_interrupted_turn_restores_the_last_one(
        engine: Engine, loaded: tuple[SetDLM, Tokenizer]) -> None:
    tok = loaded[1]
    first, _ = inputs(tok)
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
    first, second = inputs(tok)
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
