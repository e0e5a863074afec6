"""runtime/sessions/budget.py against a real Redis server: the session and tenant budgets, the eviction
of idle sessions, the sweep of what nobody names, and accounts that never go negative."""

from __future__ import annotations

import json
import time

import pytest
import redis

from runtime.errors import OverBudget
from runtime.sessions.segments import decode, split
from runtime.sessions.store import Manifest, SessionStore
from runtime.settings import Settings
from tests.runtime.sessions.stored import FP, META, committed, kv_of, shared_only


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def test_commit_measures_bytes_and_refuses_a_session_over_its_budget(client: redis.Redis, settings: Settings) -> None:
    store = SessionStore(client, settings.model_copy(update={"session_budget_bytes": 300 * META.slot_bytes}))
    m = committed(store, "small", 100)
    assert m.nbytes == store.read("small").nbytes > 100 * META.slot_bytes  # headers included
    meta = META.with_slots(0, 400)
    ids = store.put_segments("big", "acme", split(meta, bytes(400 * meta.slot_bytes), store.s.segment_bytes))
    with pytest.raises(OverBudget, match="session budget"):
        store.commit(Manifest("big", "acme", FP, segments=ids, slots=400), store.acquire("big"))
    assert store.read("big") is None and store.read("small") == m


def test_tenant_budget_evicts_the_least_recently_used_idle_session_never_a_leased_one(
        client: redis.Redis, settings: Settings) -> None:
    slot_cost = META.slot_bytes + 100  # a segment's header, generously
    store = SessionStore(client, settings.model_copy(update={"tenant_budget_bytes": 3 * 100 * slot_cost}))
    committed(store, "oldest", 100)
    time.sleep(0.002)
    committed(store, "older", 100)
    time.sleep(0.002)
    held = store.acquire("older")  # busy: never evicted
    committed(store, "other-tenant", 100, tenant="globex")
    committed(store, "newest", 100)
    committed(store, "fourth", 100)  # over the tenant budget: evicts "oldest", not the leased "older"
    assert store.read("oldest") is None
    assert all(store.read(s) is not None for s in ("older", "newest", "fourth", "other-tenant"))
    with pytest.raises(OverBudget, match="no idle session is left"):
        store2 = SessionStore(client, settings.model_copy(update={"tenant_budget_bytes": 50 * slot_cost}))
        committed(store2, "huge", 100)
    store.release(held)


def test_an_evicted_session_is_refused_while_leased_and_dropped_when_idle(store: SessionStore) -> None:
    committed(store, "s1", 50)
    lease = store.acquire("s1")
    assert not store.evict("s1", "acme")
    store.release(lease)
    assert store.evict("s1", "acme") and store.read("s1") is None


def test_what_no_manifest_names_goes_at_once_and_a_crashed_writers_segments_at_their_deadline(
        client: redis.Redis, settings: Settings) -> None:
    store = SessionStore(client, settings.model_copy(update={"lease_ms": 100}))  # pending deadline: 200 ms
    shared_only(store)
    parent = committed(store, "parent", 600)
    shared = parent.segments[0]
    child = store.fork(parent, "child", decode(store.get_segments([shared])[0], FP)[0].end, store.acquire("child"))
    assert child.segments == [shared]
    orphan = store.put_segments("crashed", "acme", [b"\x00" * 100])[0]  # written, never named: a writer died
    before = store.tenant_bytes()["acme"]
    assert store.evict("parent", "acme")  # its own segment goes with it; the shared one stays with the fork
    assert not client.exists(store.k.segment(parent.segments[1])) and client.exists(store.k.segment(shared))
    assert store.sweep() == {"segments_freed": 0, "sessions_expired": 0}, "inside the deadline nothing goes"
    assert client.exists(store.k.segment(orphan))
    time.sleep(0.25)
    assert store.sweep()["segments_freed"] == 1 and not client.exists(store.k.segment(orphan))
    assert not client.exists(store.k.pending("crashed")) and not client.zcard(store.k.pending_index)
    assert kv_of(store, child)  # the fork still reads its bytes
    after = store.tenant_bytes()["acme"]
    assert after == int(client.hget(store.k.tenant_bytes("acme"), "child")) < before, "the account is what is named"


def test_the_sweep_drops_index_members_an_older_version_wrote(store: SessionStore, client: redis.Redis) -> None:
    client.zadd(store.k.used, {"bare-session-id": 0})  # the LRU order before accounts per tenant
    assert store.sweep() == {"segments_freed": 0, "sessions_expired": 0}
    assert client.zscore(store.k.used, "bare-session-id") is None


def test_an_idle_fork_is_let_go_with_its_counts_so_the_shared_segment_goes_with_the_parent(
        store: SessionStore, client: redis.Redis) -> None:
    shared_only(store)
    parent = committed(store, "parent", 600)
    shared = parent.segments[0]
    lease = store.acquire("child")
    child = store.fork(parent, "child", decode(store.get_segments([shared])[0], FP)[0].end, lease)
    store.release(lease)
    assert child.segments == [shared] and int(client.get(store.k.ref(shared))) == 2
    client.zadd(store.k.used, {json.dumps(["acme", "child"], separators=(",", ":")): 0})  # idle past its TTL's 90%
    assert store.sweep()["sessions_expired"] == 1 and store.read("child") is None
    assert int(client.get(store.k.ref(shared))) == 1, "its count given back"
    assert store.drop("parent", "acme") == 2 and not client.exists(store.k.segment(shared))
    assert store.tenant_bytes()["acme"] == 0


def test_segments_written_before_counts_are_left_to_their_ttl_and_accounts_never_go_negative(
        store: SessionStore, client: redis.Redis) -> None:
    m = committed(store, "old", 50)
    client.delete(*[store.k.ref(i) for i in m.segments])  # as an older version wrote them
    client.hdel(store.k.totals, "acme")  # and kept no account per tenant
    assert store.drop("old", "acme") == 0, "a segment nobody counted may be a fork's: not deleted"
    assert all(client.exists(store.k.segment(i)) and client.pttl(store.k.segment(i)) > 0 for i in m.segments)
    assert store.tenant_bytes().get("acme", 0) == 0
