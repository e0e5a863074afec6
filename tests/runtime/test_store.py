"""runtime/store.py against a real Redis server: segments, the manifest's compare-and-set, the
lease.  Every refusal leaves the stored state as it was."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import redis

from runtime.errors import BadInput, Busy, CorruptState, LeaseLost, StaleWrite
from runtime.segments import SegmentMeta, decode, split
from runtime.settings import Settings
from runtime.store import Manifest, SessionStore

FP = "6cfff3ff2058a6b3"
META = SegmentMeta(FP, "float32", n_layers=4, n_kv_heads=2, head_dim=32, start=0, end=600)


def _kv() -> bytes:
    return bytes(i * 7 % 256 for i in range(META.end * META.slot_bytes))


def _first(store: SessionStore, session: str = "s1") -> tuple[Manifest, list[str]]:
    ids = store.put_segments(split(META, _kv(), store.s.segment_bytes))
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
        store.commit(replace(m, segments=ids + ["no-such-segment"]), lease)
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
        store.put_segments([b"x" * (store.s.segment_bytes + 1)])
