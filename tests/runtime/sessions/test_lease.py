"""runtime/sessions/lease.py against a real Redis server: one holder at a time, renewed while held,
given back on any exit; a holder that lost it learns it before it writes."""

from __future__ import annotations

import time

import pytest
import redis

from runtime.errors import Busy, LeaseLost, StaleWrite
from runtime.sessions.store import SessionStore
from runtime.settings import Settings


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    """Each test here runs on one Redis server and on a local Redis Cluster (tests/conftest.py)."""
    return any_client


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


def test_a_busy_holder_keeps_its_lease_past_its_length_and_an_idle_one_does_not(client: redis.Redis,
                                                                                settings: Settings) -> None:
    """busy(): one computation longer than the lease (a released-size model's recompute on a CPU)
    keeps it, renewed by the lease's thread; outside busy() a holder that does nothing (a
    suspended turn, a frozen process) loses it within lease_ms, as before."""
    store = SessionStore(client, settings.model_copy(update={"lease_ms": 300}))
    with store.lease("s1") as held:
        with held.busy():
            time.sleep(1.0)  # three leases long, no keep()
        held.keep()  # still ours
        assert client.pttl(store.k.lease("s1")) > 0
        assert list(held.busily(iter([1, 2]))) == [1, 2]
        time.sleep(0.6)  # idle: nobody renews
        assert not client.exists(store.k.lease("s1"))
        with pytest.raises(LeaseLost):
            held.keep()
    with store.lease("s2") as held:
        with held.busy():
            client.set(store.k.lease("s2"), "another-holder")  # taken over while it computes
            time.sleep(0.3)
        with pytest.raises(LeaseLost):  # the thread met the loss: the next keep() says so at once
            held.keep()
    assert client.get(store.k.lease("s2")) == b"another-holder"
