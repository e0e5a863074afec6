"""runtime/sessions/lifecycle.py without a model: a real Redis and a SQLite file holding a session of
two turns whose manifest's segments cover their five slots.  One delete path (Redis, then SQL,
under the lease; the delete stands when Redis fails); a fork that shares the parent's segments
only when they are exactly the forked turns'."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import redis

from model.params import DecodeState
from runtime.db import make_engine
from runtime.errors import Busy, NotFound
from runtime.jobs.rows import Jobs
from runtime.sessions.lifecycle import delete_session, fork_session
from runtime.sessions.records import Records
from runtime.sessions.segments import SegmentMeta, decode, split
from runtime.sessions.store import Manifest, SessionStore, read_state, turn_state
from runtime.settings import Settings

FP = "6cfff3ff2058a6b3"
LEDGERS = [[(0, 11), (1, 12), (2, 13)], [(4, 15), (3, 14)]]  # turn 1 committed position 4 before 3
PARAMS = {"policy": "set", "window": 4, "tau": 0.9, "max_new_tokens": 2, "temperature": 0.0, "seed": 0}


@pytest.fixture
def records(tmp_path: Path) -> Records:
    return Records(make_engine(Settings(data_dir=tmp_path)))


def _session(store: SessionStore, records: Records, max_bytes: int = 48 + 2 * 32) -> tuple[str, Manifest]:
    """Two turns in SQL and, in Redis, their five slots' K/V (two slots per segment) and state."""
    sid = records.create_session("acme", FP).id
    for i, ledger in enumerate(LEDGERS):
        records.append_turn(sid, "acme", "assistant", f"turn {i}", [t for _, t in sorted(ledger)], ledger,
                            meta={"params": PARAMS, "rng": f"rng-{i}"}, index=i, fingerprint=FP)
    meta = SegmentMeta(FP, "float32", n_layers=1, n_kv_heads=1, head_dim=4, start=0, end=5)
    blobs = split(meta, bytes(range(5 * meta.slot_bytes)), max_bytes)
    slots = [e for ledger in LEDGERS for e in ledger]
    state = turn_state(DecodeState(tokens=[11, 12, 13, 14, 15], nfe=7), PARAMS, [p for p, _ in slots],
                       [t for _, t in slots], 2)
    m = Manifest(sid, "acme", FP, segments=store.put_segments(sid, "acme", blobs), slots=5, state=state)
    with store.lease(sid) as lease:
        return sid, store.commit(m, lease.lease)


def test_delete_drops_redis_then_sql_and_returns_the_jobs(store: SessionStore, records: Records,
                                                          client: redis.Redis, tmp_path: Path) -> None:
    sid, m = _session(store, records)
    jobs = Jobs(records.engine, store.s)
    job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)
    with pytest.raises(NotFound):
        delete_session(store, records, sid, "globex")
    with store.lease(sid):  # a turn in progress
        with pytest.raises(Busy):
            delete_session(store, records, sid, "acme")
    assert store.read(sid) == m and records.turn_count(sid, "acme") == 2, "refusals change nothing"
    with pytest.raises(Busy, match="unfinished jobs"):
        delete_session(store, records, sid, "acme", idle_only=True)
    assert records.turn_count(sid, "acme") == 2 and store.read(sid) == m, "a refused delete keeps the Redis state too"
    assert delete_session(store, records, sid, "acme") == [job.id]
    assert store.read(sid) is None and not any(client.exists(store.k.segment(i)) for i in m.segments)
    assert not client.exists(store.k.lease(sid)), "the lease is given back"
    with pytest.raises(NotFound):
        records.get_session(sid, "acme")


def test_the_delete_stands_when_redis_fails(store: SessionStore, records: Records,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sid, m = _session(store, records)

    def down(*_: object) -> int:
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(store, "drop", down)
    assert delete_session(store, records, sid, "acme") == []
    with pytest.raises(NotFound):
        records.get_session(sid, "acme")
    assert store.read(sid) == m, "left to expire (its segments to gc once it has)"


def test_a_fork_shares_the_segments_below_its_turns_slots(store: SessionStore, records: Records,
                                                          client: redis.Redis) -> None:
    sid, m = _session(store, records)
    whole = fork_session(store, records, sid, "acme", 1)
    w = store.read(whole.id)
    assert w is not None and (w.segments, w.slots, w.state["turns"]) == (m.segments, 5, 2)
    first = fork_session(store, records, sid, "acme", 0)
    f = store.read(first.id)
    assert f is not None and (f.slots, f.state["turns"]) == (3, 1) and f.fingerprint == FP
    cuts = [decode(b, FP)[0] for b in store.get_segments(f.segments)]
    assert [(c.start, c.end) for c in cuts] == [(0, 2), (2, 3)] and f.segments[0] == m.segments[0], "copy on write"
    state, positions, tokens = read_state(f.state)
    assert (positions, tokens) == ([0, 1, 2], [11, 12, 13]) and f.state["params"] == PARAMS
    assert state == DecodeState(tokens=[11, 12, 13], rng="rng-0"), "what a recompute of turn 0 rebuilds"
    assert store.read(sid) == m, "the parent is unchanged"
    assert not client.exists(store.k.lease(first.id))


@pytest.mark.parametrize("stale", ["no manifest", "behind SQL", "another model", "another history", "redis down"])
def test_a_fork_without_fresh_redis_state_has_none(store: SessionStore, records: Records,
                                                   monkeypatch: pytest.MonkeyPatch, stale: str) -> None:
    sid, m = _session(store, records)
    changed = {"behind SQL": {"state": {**m.state, "turns": 1}}, "another model": {"fingerprint": "0" * 16},
               "another history": {"state": {**m.state, "ledger": [[1, 0, 2, 4, 3], [12, 11, 13, 15, 14]]}}}
    def down(*_: object) -> Manifest:
        raise redis.ConnectionError("Redis went away")

    if stale == "redis down":
        monkeypatch.setattr(store, "fork", down)
    elif stale == "no manifest":
        store.evict(sid, "acme")
    else:
        with store.lease(sid) as lease:
            store.commit(replace(m, **changed[stale]), lease.lease)  # type: ignore[arg-type]
    child = fork_session(store, records, sid, "acme", 1)
    assert store.read(child.id) is None and records.turn_count(child.id, "acme") == 2, "it recomputes from SQL"
