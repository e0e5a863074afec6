"""Sessions stored for the store's tests (test_store, test_lease, test_budget, test_scripts): a
K/V byte pattern in segments of a small model's shape, and committed sessions of it."""

from __future__ import annotations

import pytest

from runtime.sessions.segments import SegmentMeta, decode, split
from runtime.sessions.store import Manifest, SessionStore

FP = "6cfff3ff2058a6b3"
META = SegmentMeta(FP, "float32", n_layers=4, n_kv_heads=2, head_dim=32, start=0, end=600)


def kv() -> bytes:
    """META.end slots of K/V (META.slot_bytes each): a pattern, so that a wrong byte shows."""
    return bytes(i * 7 % 256 for i in range(META.end * META.slot_bytes))


def committed(store: SessionStore, session: str, slots: int, tenant: str = "acme") -> Manifest:
    """A session of `slots` slots of kv(), committed (generation 1) and its lease given back."""
    meta = META.with_slots(0, slots)
    ids = store.put_segments(session, tenant, split(meta, kv()[:slots * meta.slot_bytes], store.s.segment_bytes))
    lease = store.acquire(session)
    m = store.commit(Manifest(session, tenant, FP, segments=ids, slots=slots), lease)
    store.release(lease)
    return m


def shared_only(store: SessionStore) -> None:
    """The test is of segments a fork shares: on a Redis Cluster a fork copies (test_store checks it)."""
    if store.cluster:
        pytest.skip("a fork on a Redis Cluster copies its parent's segments into its own slot: nothing is shared")


def kv_of(store: SessionStore, m: Manifest) -> bytes:
    """The K/V bytes a manifest's segments hold, in slot order."""
    return b"".join(bytes(decode(b, FP)[1]) for b in store.get_segments(m.segments))
