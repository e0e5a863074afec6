"""The session lease: one holder decodes a session at a time.

SET NX PX with a random token takes it; renew and release go through scripts that check that
token, so a holder whose lease expired (and was perhaps taken over) changes nothing.  A second
holder waits up to lease_wait_ms, then gets Busy.  The token is also the fence of every write:
the manifest's commit script checks it (scripts.py, run by store.py).
`with store.lease(session) as held:` takes it, held.keep() renews it as time passes, and the
exit gives it back.  While the holder computes (held.busy(): a restore, a recompute, a step's
forwards), a thread of the lease renews it too: one forward of a released-size model on a CPU
may outlast the lease (a 2048-token recompute: 28 s at 0.6B, minutes at 1.7B, against
lease_ms 30 s).  Between computations only the holder's keep() renews it, so a holder that
stops (killed, frozen, or a turn left suspended) loses it within lease_ms as before.

Knows nothing of manifests or segments; SessionStore (store.py) is a Leases.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import redis

from runtime.errors import Busy, LeaseLost
from runtime.keys import Keys
from runtime.sessions.scripts import Scripts
from runtime.settings import Settings


@dataclass(frozen=True)
class Lease:
    session: str
    token: str  # the holder's: what the scripts check before they renew, release or commit


class Leases:
    """Taking, renewing and giving back sessions' leases (a part of SessionStore)."""

    r: redis.Redis
    s: Settings
    k: Keys
    scripts: Scripts

    @contextmanager
    def lease(self, session: str, wait_ms: int | None = None) -> Iterator[Held]:
        """Hold the session's lease for the block: taken on entry (Busy after wait_ms, default
        lease_wait_ms), renewed by the holder (Held.keep), given back on exit.  A Redis error
        while giving it back is swallowed: the lease expires by itself, and the error that
        ended the block, if any, matters more."""
        held = Held(self, self.acquire(session, wait_ms))
        try:
            yield held
        finally:
            held.close()
            try:
                self.release(held.lease)
            except redis.RedisError:
                pass

    def acquire(self, session: str, wait_ms: int | None = None) -> Lease:
        """Take the session's lease, waiting up to wait_ms (default lease_wait_ms) for a holder
        to finish; Busy after that."""
        wait = self.s.lease_wait_ms if wait_ms is None else wait_ms
        token = secrets.token_hex(16)
        deadline = time.monotonic() + wait / 1000
        delay = 0.005
        while True:
            if self.r.set(self.k.lease(session), token, nx=True, px=self.s.lease_ms):
                return Lease(session, token)
            if time.monotonic() >= deadline:
                raise Busy(f"session {session} is being decoded by another holder")
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.1)

    def renew(self, lease: Lease) -> None:
        if not self.scripts.renew(session=lease.session, token=lease.token, lease_ms=self.s.lease_ms):
            raise LeaseLost(f"session {lease.session}: the lease expired or was taken over")

    def release(self, lease: Lease) -> bool:
        """Give the lease back; False when it had already expired (or been taken over)."""
        return self.scripts.release(session=lease.session, token=lease.token)


T = TypeVar("T")


class Held:
    """A lease held inside `with store.lease(session) as held:`.  keep() renews it once a third
    of lease_ms has passed since the last renewal (cheap enough to call every step); renew()
    renews it now.  Both raise LeaseLost when it expired or was taken over: the holder learns it
    before it writes.  busy(): while its block runs, a thread renews the lease every third of
    lease_ms as well (a long forward); a loss it meets is raised by the holder's next keep()."""

    def __init__(self, store: Leases, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        self._renewed = time.monotonic()
        self._busy = threading.Event()  # set while the holder computes
        self._closed = threading.Event()
        self._lost = False  # the renewing thread found the lease gone
        self._thread: threading.Thread | None = None  # started at the first busy()

    @property
    def session(self) -> str:
        return self.lease.session

    def keep(self) -> None:
        if self._lost:
            raise LeaseLost(f"session {self.lease.session}: the lease expired or was taken over")
        if time.monotonic() - self._renewed > self.store.s.lease_ms / 3000:
            self.renew()

    def renew(self) -> None:
        self.store.renew(self.lease)
        self._renewed = time.monotonic()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """The block computes: the lease is renewed meanwhile however long it takes."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._renewing, name=f"lease-{self.lease.session}", daemon=True)
            self._thread.start()
        self._busy.set()
        try:
            yield
        finally:
            self._busy.clear()

    def busily(self, items: Iterable[T]) -> Iterator[T]:
        """`items`, each computed inside busy() and handed on outside it: a turn's steps, whose
        forwards are the holder's work, and whose consumer's pauses are not."""
        it = iter(items)
        while True:
            with self.busy():
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def close(self) -> None:
        """The block ended: the renewing thread stops (the lease is given back next)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()

    def _renewing(self) -> None:
        while not self._closed.wait(self.store.s.lease_ms / 3000):
            if not self._busy.is_set():
                continue
            try:
                self.renew()
            except LeaseLost:
                self._lost = True  # the holder's next keep() says so; nothing left to renew
                return
            except redis.RedisError:
                pass  # Redis away: the next third, or the holder's own keep(), tries again
