"""runtime/sessions/store.py against a real Redis server: segments, the manifest's compare-and-set, the
lease.  Every refusal leaves the stored state as it was."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

import pytest
import redis

from runtime.embedded import EmbeddedRedis
from runtime.errors import BadInput, Busy, CorruptState, LeaseLost, NotFound, OverBudget, StaleWrite
from runtime.keys import owner
from runtime.sessions.segments import SegmentMeta, decode, split
from runtime.sessions.store import Manifest, SessionStore
from runtime.settings import Settings

FP = "6cfff3ff2058a6b3"
META = SegmentMeta(FP, "float32", n_layers=4, n_kv_heads=2, head_dim=32, start=0, end=600)


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def _kv() -> bytes:
    return bytes(i * 7 % 256 for i in range(META.end * META.slot_bytes))


def _first(store: SessionStore, session: str = "s1") -> tuple[Manifest, list[str]]:
    ids = store.put_segments(session, "acme", split(META, _kv(), store.s.segment_bytes))
    return Manifest(session, "acme", FP, segments=ids, slots=META.end, state={"cursor": 600}), ids


def test_segments_and_manifest_round_trip(store: SessionStore) -> None:
    m, ids = _first(store)
    assert len(ids) == 2  # 600 slots x 1 KiB: more than one 1 MiB segment
    lease = store.acquire("s1")
    stored = store.commit(m, lease)
    assert stored.gen == 1
    back = store.read("s1")
    assert back == stored
    blobs = store.get_segments(back.segments)
    assert b"".join(bytes(decode(b, FP)[1]) for b in blobs) == _kv()


def test_a_stale_or_duplicate_writer_is_refused_and_changes_nothing(store: SessionStore) -> None:
    m, _ = _first(store)
    lease = store.acquire("s1")
    v1 = store.commit(m, lease)
    with pytest.raises(StaleWrite, match="expected generation 0, the store holds 1"):
        store.commit(m, lease)  # the same write delivered twice
    v2 = store.commit(replace(v1, state={"cursor": 700}), lease)
    with pytest.raises(StaleWrite):
        store.commit(replace(v1, state={"cursor": 650}), lease)  # a writer that read generation 1
    assert store.read("s1") == v2 and v2.gen == 2 and v2.state == {"cursor": 700}


def test_only_the_lease_holder_commits(store: SessionStore, client: redis.Redis, settings: Settings) -> None:
    m, _ = _first(store)
    lease = store.acquire("s1")
    store.release(lease)
    with pytest.raises(LeaseLost):
        store.commit(m, lease)
    other = store.acquire("s1")
    with pytest.raises(LeaseLost):
        store.commit(m, replace(other, token="not-the-token"))
    assert store.read("s1") is None
    with pytest.raises(BadInput):
        store.commit(m, store.acquire("s2"))


def test_a_manifest_never_names_a_missing_segment(store: SessionStore) -> None:
    m, ids = _first(store)
    lease = store.acquire("s1")
    with pytest.raises(CorruptState, match="missing segment"):
        store.commit(replace(m, segments=ids + ["s1/no-such-segment"]), lease)
    assert store.read("s1") is None


def test_lease_is_exclusive_until_released(store: SessionStore) -> None:
    a = store.acquire("s1")
    t0 = time.monotonic()
    with pytest.raises(Busy, match="s1"):
        store.acquire("s1", wait_ms=50)
    assert time.monotonic() - t0 >= 0.05
    store.acquire("s2", wait_ms=0)  # another session is free
    assert store.release(a)
    b = store.acquire("s1", wait_ms=0)
    assert b.token != a.token
    assert not store.release(a), "a released lease cannot release its successor"


def test_lease_expires_and_the_old_holder_cannot_renew(client: redis.Redis, settings: Settings) -> None:
    store = SessionStore(client, settings.model_copy(update={"lease_ms": 100}))
    a = store.acquire("s1")
    store.renew(a)
    time.sleep(0.15)
    b = store.acquire("s1", wait_ms=0)
    with pytest.raises(LeaseLost):
        store.renew(a)
    store.renew(b)


def test_a_lease_block_holds_the_lease_and_gives_it_back_on_any_exit(store: SessionStore,
                                                                      client: redis.Redis) -> None:
    with store.lease("s1") as held:
        assert client.get(store.k.lease("s1")) == held.lease.token.encode() and held.session == "s1"
        with pytest.raises(Busy):
            with store.lease("s1", wait_ms=0):
                pass
    assert not client.exists(store.k.lease("s1"))
    with pytest.raises(StaleWrite):
        with store.lease("s1"):
            raise StaleWrite("the block's own error")
    assert not client.exists(store.k.lease("s1")), "given back when the block raised too"


def test_keep_renews_after_a_third_of_the_lease_and_a_lost_lease_surfaces(client: redis.Redis,
                                                                          settings: Settings) -> None:
    store = SessionStore(client, settings.model_copy(update={"lease_ms": 1000}))
    with store.lease("s1") as held:
        time.sleep(0.1)
        held.keep()  # less than a third gone: no round trip
        assert client.pttl(store.k.lease("s1")) <= 900
        time.sleep(0.25)
        held.keep()
        assert client.pttl(store.k.lease("s1")) > 900, "renewed"
        client.set(store.k.lease("s1"), "another-holder")  # expired and taken over
        held.keep()  # nothing to notice before a third of the lease
        time.sleep(0.35)
        with pytest.raises(LeaseLost):
            held.keep()
        with pytest.raises(LeaseLost):
            held.renew()
    assert client.get(store.k.lease("s1")) == b"another-holder", "the successor's lease is not released"


def test_a_redis_error_giving_the_lease_back_is_swallowed(store: SessionStore, client: redis.Redis,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def down(_: object) -> bool:
        raise redis.ConnectionError("Redis went away")

    with store.lease("s1"):
        monkeypatch.setattr(store, "release", down)
    assert client.exists(store.k.lease("s1")), "left to expire by itself"


def test_a_waiting_turn_gets_the_lease_when_the_holder_releases(store: SessionStore) -> None:
    import threading
    a = store.acquire("s1")
    threading.Timer(0.05, store.release, args=(a,)).start()
    b = store.acquire("s1", wait_ms=2000)
    assert b.token != a.token


def test_committed_state_carries_the_session_ttl(store: SessionStore, client: redis.Redis) -> None:
    m, ids = _first(store)
    store.commit(m, store.acquire("s1"))
    ttl = client.pttl(store.k.manifest("s1"))
    assert 0.9 * store.s.session_ttl_s * 1000 < ttl <= store.s.session_ttl_s * 1000
    assert all(client.pttl(store.k.segment(i)) > 0 for i in ids)


def test_oversized_segments_are_refused(store: SessionStore) -> None:
    with pytest.raises(BadInput, match="segment_bytes"):
        store.put_segments("s1", "acme", [b"x" * (store.s.segment_bytes + 1)])


# ---- budgets, eviction, forks, garbage ------------------------------------------------------

def _session(store: SessionStore, session: str, slots: int, tenant: str = "acme") -> Manifest:
    meta = META.with_slots(0, slots)
    ids = store.put_segments(session, tenant, split(meta, _kv()[:slots * meta.slot_bytes], store.s.segment_bytes))
    lease = store.acquire(session)
    m = store.commit(Manifest(session, tenant, FP, segments=ids, slots=slots), lease)
    store.release(lease)
    return m


def test_commit_measures_bytes_and_refuses_a_session_over_its_budget(client: redis.Redis, settings: Settings) -> None:
    store = SessionStore(client, settings.model_copy(update={"session_budget_bytes": 300 * META.slot_bytes}))
    m = _session(store, "small", 100)
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
    _session(store, "oldest", 100)
    time.sleep(0.002)
    _session(store, "older", 100)
    time.sleep(0.002)
    held = store.acquire("older")  # busy: never evicted
    _session(store, "other-tenant", 100, tenant="globex")
    _session(store, "newest", 100)
    _session(store, "fourth", 100)  # over the tenant budget: evicts "oldest", not the leased "older"
    assert store.read("oldest") is None
    assert all(store.read(s) is not None for s in ("older", "newest", "fourth", "other-tenant"))
    with pytest.raises(OverBudget, match="no idle session is left"):
        store2 = SessionStore(client, settings.model_copy(update={"tenant_budget_bytes": 50 * slot_cost}))
        _session(store2, "huge", 100)
    store.release(held)


def test_an_evicted_session_is_refused_while_leased_and_dropped_when_idle(store: SessionStore) -> None:
    _session(store, "s1", 50)
    lease = store.acquire("s1")
    assert not store.evict("s1", "acme")
    store.release(lease)
    assert store.evict("s1", "acme") and store.read("s1") is None


def test_fork_shares_bytes_and_diverges_independently(store: SessionStore) -> None:
    parent = _session(store, "parent", 600)  # two segments (512 slots of 2 KiB fit in 1 MiB)
    first_end = decode(store.get_segments(parent.segments[:1])[0], FP)[0].end
    edge = store.fork(parent, "edge", first_end, store.acquire("edge"))  # at a segment boundary
    if store.cluster:  # a script touches one slot: the child's copies lie in its own
        assert [owner(i) for i in edge.segments] == ["edge"]
        assert store.get_segments(edge.segments) == store.get_segments(parent.segments[:1])
    else:
        assert edge.segments == parent.segments[:1], "whole segments are shared, not copied"
    mid = store.fork(parent, "mid", 300, store.acquire("mid"), state={"turns": 1})  # inside the first segment
    assert mid.slots == 300 and len(mid.segments) == 1 and mid.segments[0] not in parent.segments
    assert mid.state == {"turns": 1} and edge.state == {}, "the child's state is the caller's"
    assert _kv_of(store, mid) == _kv_of(store, parent)[:300 * META.slot_bytes]
    # the parent moves on (drops its second segment); the forks do not see it
    lease = store.acquire("parent")
    store.commit(replace(parent, segments=parent.segments[:1], slots=first_end, state={"moved": True}), lease)
    assert store.read("mid") == mid and store.read("edge") == edge
    with pytest.raises(BadInput, match="fork slot"):
        store.fork(parent, "bad", 601, store.acquire("bad"))


def _sharing(store: SessionStore) -> None:
    """The test is of segments a fork shares: on a Redis Cluster a fork copies (checked above)."""
    if store.cluster:
        pytest.skip("a fork on a Redis Cluster copies its parent's segments into its own slot: nothing is shared")


def _kv_of(store: SessionStore, m: Manifest) -> bytes:
    return b"".join(bytes(decode(b, FP)[1]) for b in store.get_segments(m.segments))


def test_what_no_manifest_names_goes_at_once_and_a_crashed_writers_segments_at_their_deadline(
        client: redis.Redis, settings: Settings) -> None:
    store = SessionStore(client, settings.model_copy(update={"lease_ms": 100}))  # pending deadline: 200 ms
    _sharing(store)
    parent = _session(store, "parent", 600)
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
    assert _kv_of(store, child)  # the fork still reads its bytes
    after = store.tenant_bytes()["acme"]
    assert after == int(client.hget(store.k.tenant_bytes("acme"), "child")) < before, "the account is what is named"


def test_drop_deletes_a_session_and_its_own_segments_and_keeps_a_forks(store: SessionStore,
                                                                       client: redis.Redis) -> None:
    _sharing(store)
    parent = _session(store, "parent", 600)  # two segments
    shared = parent.segments[0]
    forking = store.acquire("child")
    child = store.fork(parent, "child", decode(store.get_segments([shared])[0], FP)[0].end, forking)
    store.release(forking)
    _session(store, "other", 50)
    assert store.drop("parent", "acme") == 1, "the parent's own second segment; the shared one stays"
    assert store.read("parent") is None
    assert client.zscore(store.k.lru("acme"), "parent") is None
    assert client.hget(store.k.tenant_bytes("acme"), "parent") is None
    assert not client.exists(store.k.segment(parent.segments[1])) and client.exists(store.k.segment(shared))
    assert not client.exists(store.k.lease("parent")), "the lease it took is given back"
    assert store.read("child") == child and _kv_of(store, child), "the fork still reads its bytes"
    assert store.read("other") is not None and client.hget(store.k.tenant_bytes("acme"), "other") is not None
    assert store.drop("parent", "acme") == 0, "dropping again: nothing stored, nothing to do"
    # the fork, dropped under a lease its caller holds: now the shared segment goes too
    lease = store.acquire("child")
    assert store.drop("child", "acme", lease) == 1 and not client.exists(store.k.segment(shared))
    assert client.get(store.k.lease("child")) is not None, "the caller's lease stays the caller's"
    store.release(lease)


def test_drop_is_refused_while_a_turn_holds_the_session_or_for_another_tenant(store: SessionStore,
                                                                              client: redis.Redis) -> None:
    m = _session(store, "s1", 50)
    held = store.acquire("s1")
    with pytest.raises(Busy):
        store.drop("s1", "acme")
    with pytest.raises(LeaseLost):
        store.drop("s1", "acme", replace(held, token="not-the-token"))
    with pytest.raises(BadInput):
        store.drop("s1", "acme", store.acquire("s2"))
    store.release(held)
    with pytest.raises(NotFound):
        store.drop("s1", "globex")
    assert store.read("s1") == m and all(client.exists(store.k.segment(i)) for i in m.segments)
    assert client.hget(store.k.tenant_bytes("acme"), "s1") is not None and client.zscore(store.k.lru("acme"), "s1")
    assert not client.exists(store.k.lease("s1")), "a refused drop gives its lease back"


def test_the_sweep_drops_index_members_an_older_version_wrote(store: SessionStore, client: redis.Redis) -> None:
    client.zadd(store.k.used, {"bare-session-id": 0})  # the LRU order before accounts per tenant
    assert store.sweep() == {"segments_freed": 0, "sessions_expired": 0}
    assert client.zscore(store.k.used, "bare-session-id") is None


def test_an_idle_fork_is_let_go_with_its_counts_so_the_shared_segment_goes_with_the_parent(
        store: SessionStore, client: redis.Redis) -> None:
    _sharing(store)
    parent = _session(store, "parent", 600)
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
    m = _session(store, "old", 50)
    client.delete(*[store.k.ref(i) for i in m.segments])  # as an older version wrote them
    client.hdel(store.k.totals, "acme")  # and kept no account per tenant
    assert store.drop("old", "acme") == 0, "a segment nobody counted may be a fork's: not deleted"
    assert all(client.exists(store.k.segment(i)) and client.pttl(store.k.segment(i)) > 0 for i in m.segments)
    assert store.tenant_bytes().get("acme", 0) == 0


def test_a_fork_reads_its_parents_headers_and_the_segment_it_cuts_never_its_whole_kv() -> None:
    """Issue 31: a fork (POST /v1/sessions/{id}/fork, in the API process) read every segment of its
    parent (up to 256 MiB for an imported Qwen3).  Now it reads their headers (GETRANGE) and at
    most the one segment its slot cuts: measured as the bytes the server sent (a server of its own)."""
    with tempfile.TemporaryDirectory(prefix="sfr") as d, EmbeddedRedis(d) as server:
        r = redis.Redis.from_url(server.url)
        store = SessionStore(r, Settings(key_prefix="sf", segment_bytes=64 * 1024))
        parent = _session(store, "parent", 600)  # 1.2 MB of K/V in 20 segments
        ends = [m.end for m in store.heads(parent.segments, FP)]
        assert len(ends) == 20 and ends[-1] == 600

        def sent(fork: Callable[[], Manifest]) -> tuple[Manifest, int]:
            before = int(r.info("stats")["total_net_output_bytes"])
            m = fork()
            return m, int(r.info("stats")["total_net_output_bytes"]) - before

        edge, at_edge = sent(lambda: store.fork(parent, "edge", ends[-2], store.acquire("edge")))
        mid, in_mid = sent(lambda: store.fork(parent, "mid", ends[-2] + 5, store.acquire("mid")))
        assert at_edge < 8 * 1024, "headers and replies only"
        assert in_mid < store.s.segment_bytes + 8 * 1024, "and the one segment the slot cuts"
        assert edge.segments == parent.segments[:-1] and mid.segments[:-1] == parent.segments[:-1]
        assert _kv_of(store, mid) == _kv_of(store, parent)[:(ends[-2] + 5) * META.slot_bytes]
        r.close()
