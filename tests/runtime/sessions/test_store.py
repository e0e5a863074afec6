"""runtime/sessions/store.py against a real Redis server: segments, the manifest's compare-and-set, forks
and drops.  Every refusal leaves the stored state as it was."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace

import pytest
import redis

from runtime.embedded import EmbeddedRedis
from runtime.errors import BadInput, Busy, CorruptState, LeaseLost, NotFound, StaleWrite
from runtime.keys import owner
from runtime.sessions.segments import decode, split
from runtime.sessions.store import Manifest, SessionStore
from runtime.settings import Settings
from tests.runtime.sessions.stored import FP, META, committed, kv, kv_of, shared_only


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


def _first(store: SessionStore, session: str = "s1") -> tuple[Manifest, list[str]]:
    ids = store.put_segments(session, "acme", split(META, kv(), store.s.segment_bytes))
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
    assert b"".join(bytes(decode(b, FP)[1]) for b in blobs) == kv()


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


def test_committed_state_carries_the_session_ttl(store: SessionStore, client: redis.Redis) -> None:
    m, ids = _first(store)
    store.commit(m, store.acquire("s1"))
    ttl = client.pttl(store.k.manifest("s1"))
    assert 0.9 * store.s.session_ttl_s * 1000 < ttl <= store.s.session_ttl_s * 1000
    assert all(client.pttl(store.k.segment(i)) > 0 for i in ids)


def test_oversized_segments_are_refused(store: SessionStore) -> None:
    with pytest.raises(BadInput, match="segment_bytes"):
        store.put_segments("s1", "acme", [b"x" * (store.s.segment_bytes + 1)])


def test_fork_shares_bytes_and_diverges_independently(store: SessionStore) -> None:
    parent = committed(store, "parent", 600)  # two segments (512 slots of 2 KiB fit in 1 MiB)
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
    assert kv_of(store, mid) == kv_of(store, parent)[:300 * META.slot_bytes]
    # the parent moves on (drops its second segment); the forks do not see it
    lease = store.acquire("parent")
    store.commit(replace(parent, segments=parent.segments[:1], slots=first_end, state={"moved": True}), lease)
    assert store.read("mid") == mid and store.read("edge") == edge
    with pytest.raises(BadInput, match="fork slot"):
        store.fork(parent, "bad", 601, store.acquire("bad"))


def test_drop_deletes_a_session_and_its_own_segments_and_keeps_a_forks(store: SessionStore,
                                                                       client: redis.Redis) -> None:
    shared_only(store)
    parent = committed(store, "parent", 600)  # two segments
    shared = parent.segments[0]
    forking = store.acquire("child")
    child = store.fork(parent, "child", decode(store.get_segments([shared])[0], FP)[0].end, forking)
    store.release(forking)
    committed(store, "other", 50)
    assert store.drop("parent", "acme") == 1, "the parent's own second segment; the shared one stays"
    assert store.read("parent") is None
    assert client.zscore(store.k.lru("acme"), "parent") is None
    assert client.hget(store.k.tenant_bytes("acme"), "parent") is None
    assert not client.exists(store.k.segment(parent.segments[1])) and client.exists(store.k.segment(shared))
    assert not client.exists(store.k.lease("parent")), "the lease it took is given back"
    assert store.read("child") == child and kv_of(store, child), "the fork still reads its bytes"
    assert store.read("other") is not None and client.hget(store.k.tenant_bytes("acme"), "other") is not None
    assert store.drop("parent", "acme") == 0, "dropping again: nothing stored, nothing to do"
    # the fork, dropped under a lease its caller holds: now the shared segment goes too
    lease = store.acquire("child")
    assert store.drop("child", "acme", lease) == 1 and not client.exists(store.k.segment(shared))
    assert client.get(store.k.lease("child")) is not None, "the caller's lease stays the caller's"
    store.release(lease)


def test_drop_is_refused_while_a_turn_holds_the_session_or_for_another_tenant(store: SessionStore,
                                                                              client: redis.Redis) -> None:
    m = committed(store, "s1", 50)
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


def test_a_fork_reads_its_parents_headers_and_the_segment_it_cuts_never_its_whole_kv() -> None:
    """Issue 31: a fork (POST /v1/sessions/{id}/fork, in the API process) read every segment of its
    parent (up to 256 MiB for an imported Qwen3).  Now it reads their headers (GETRANGE) and at
    most the one segment its slot cuts: measured as the bytes the server sent (a server of its own)."""
    with tempfile.TemporaryDirectory(prefix="sfr") as d, EmbeddedRedis(d) as server:
        r = redis.Redis.from_url(server.url)
        store = SessionStore(r, Settings(key_prefix="sf", segment_bytes=64 * 1024))
        parent = committed(store, "parent", 600)  # 1.2 MB of K/V in 20 segments
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
        assert kv_of(store, mid) == kv_of(store, parent)[:(ends[-2] + 5) * META.slot_bytes]
        r.close()
