"""runtime/sessions/scripts.py against a real Redis server: each wrapper's typed result, for every
answer its script gives (on one server and on a local Redis Cluster: a script's keys lie in one
slot)."""

from __future__ import annotations

import time

import pytest
import redis

from runtime.sessions.scripts import Commit, Forget, Status, SweptPending
from runtime.sessions.store import Manifest, SessionStore
from tests.runtime.sessions.stored import FP, committed


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def _commit(store: SessionStore, token: str, added: list[str], gen: int = 0, kept: tuple[str, ...] = (),
            session_budget: int = 10**9, tenant_budget: int = 10**9, account: int = 0) -> Commit:
    m = Manifest("s1", "acme", FP, gen=gen, segments=[*kept, *added])
    return store.scripts.commit(session="s1", tenant="acme", token=token, gen=gen, body=m.body(), added=added,
                                kept=list(kept), removed=[], ttl_ms=60_000, session_budget=session_budget,
                                tenant_budget=tenant_budget, account=account, held=0)


def test_commit_answers_what_it_measured_or_why_it_refused(store: SessionStore, client: redis.Redis) -> None:
    ids = store.put_segments("s1", "acme", [b"a" * 100, b"b" * 50])
    late = store.put_segments("s1", "acme", [b"c" * 10])  # pending, not named: its deadline stays
    token = store.acquire("s1").token
    assert _commit(store, "not-the-token", ids) == Commit(Status.LEASE, "0")
    assert _commit(store, token, ids, gen=3) == Commit(Status.STALE, "0")
    missing = _commit(store, token, [*ids, "s1/none"])
    assert missing == Commit(Status.MISSING, store.k.segment("s1/none"))
    assert _commit(store, token, ids, session_budget=149) == Commit(Status.SESSION_BUDGET, "150")
    # the account after: 1000 + 150 named - 150 of them pending until now
    assert _commit(store, token, ids, account=1000, tenant_budget=999) == Commit(Status.TENANT_BUDGET, "1000")
    assert not client.exists(store.k.manifest("s1")), "a refusal writes nothing"
    due = int(client.zscore(store.k.pending("s1"), late[0]) or 0)
    assert _commit(store, token, ids, account=1000, tenant_budget=1000) == Commit(Status.OK, "150", 150, 150, due)
    assert client.hget(store.k.manifest("s1"), "gen") == b"1"
    kept = _commit(store, token, [], gen=1, kept=tuple(ids))  # names the same segments: nothing pending
    assert (kept.status, kept.nbytes, kept.pending, kept.first_pending) == (Status.OK, 150, 0, due)
    assert _commit(store, token, [], gen=1, kept=tuple(ids)) == Commit(Status.STALE, "2")


def test_forget_answers_leased_lease_stale_or_what_it_deleted(store: SessionStore, client: redis.Redis) -> None:
    m = committed(store, "s1", 100)
    scripts = store.scripts
    held = store.acquire("s1")
    assert scripts.forget(session="s1", named=m.segments, token="", gen=1) == Forget(Status.LEASED)
    assert scripts.forget(session="s1", named=m.segments, token="not-the-token", gen=1) == Forget(Status.LEASE)
    assert scripts.forget(session="s1", named=m.segments, token=held.token, gen=2) == Forget(Status.STALE)
    assert scripts.forget(session="s1", named=m.segments, token=held.token, gen=None) == Forget(Status.STALE)
    assert scripts.forget(session="s1", named=m.segments, token=held.token, gen=1) == Forget(Status.OK, 1)
    assert not client.exists(store.k.manifest("s1"), *[store.k.segment(i) for i in m.segments])
    store.release(held)
    assert scripts.forget(session="s1", named=[], token="", gen=None) == Forget(Status.OK, 0), "nothing stored"


def test_sweep_pending_answers_what_it_deleted_and_the_next_deadline(store: SessionStore) -> None:
    ids = store.put_segments("s1", "acme", [b"a" * 100, b"b" * 50])
    due = int(store.r.zscore(store.k.pending("s1"), ids[0]) or 0)
    before = store.scripts.sweep_pending(session="s1", ids=ids, now_ms=due - 1)
    assert before == SweptPending(deleted=0, freed=0, first_pending=due), "inside the deadline nothing goes"
    assert store.scripts.sweep_pending(session="s1", ids=ids, now_ms=due) == SweptPending(2, 150, None)
    assert store.scripts.sweep_pending(session="s1", ids=ids, now_ms=due) == SweptPending(0, 0, None)


def test_the_one_key_scripts_answer_plain_values(store: SessionStore, client: redis.Redis) -> None:
    k, scripts = store.k, store.scripts
    client.hset(k.totals, mapping={"acme": -5, "globex": 7})
    scripts.clamp(tenant="acme")
    scripts.clamp(tenant="globex")
    assert client.hgetall(k.totals) == {b"acme": b"0", b"globex": b"7"}
    client.hset(k.tenant_bytes("acme"), "s1", 42)
    assert scripts.uncount(tenant="acme", session="s1") == 42
    assert scripts.uncount(tenant="acme", session="s1") == 0, "once, however many try"
    now = int(time.time() * 1000)
    client.zadd(k.pending_index, {"m": now - 1, "later": now + 10_000})
    assert scripts.reindex(member="m", now_ms=now, next_due=now + 5) is True
    assert client.zscore(k.pending_index, "m") == now + 5
    assert scripts.reindex(member="later", now_ms=now, next_due=None) is False, "a writer moved it since"
    assert scripts.reindex(member="m", now_ms=now + 5, next_due=None) is True
    assert client.zscore(k.pending_index, "m") is None
    lease = store.acquire("s1")
    assert scripts.renew(session="s1", token=lease.token, lease_ms=5000) is True and client.pttl(k.lease("s1")) > 4000
    assert scripts.renew(session="s1", token="not-the-token", lease_ms=5000) is False
    assert scripts.release(session="s1", token="not-the-token") is False
    assert scripts.release(session="s1", token=lease.token) is True and not client.exists(k.lease("s1"))
    assert scripts.renew(session="s1", token=lease.token, lease_ms=5000) is False
