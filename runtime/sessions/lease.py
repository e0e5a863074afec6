"""The session lease: one holder decodes a session at a time.

SET NX PX with a random token takes it; renew and release go through scripts that check that
token, so a holder whose lease expired (and was perhaps taken over) changes nothing.  A second
holder waits up to lease_wait_ms, then gets Busy.  The token is also the fence of every write:
the manifest's commit script checks it (scripts.py, run by store.py).
`with store.lease(session) as held:` takes it, held.keep() renews it as time passes, and the
exit gives it back.

Knows nothing of manifests or segments; SessionStore (store.py) is a Leases.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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


class Held:
    """A lease held inside `with store.lease(session) as held:`.  keep() renews it once a third
    of lease_ms has passed since the last renewal (cheap enough to call every step); renew()
    renews it now.  Both raise LeaseLost when it expired or was taken over: the holder learns it
    before it writes."""

    def __init__(self, store: Leases, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        self._renewed = time.monotonic()

    @property
    def session(self) -> str:
        return self.lease.session

    def keep(self) -> None:
        if time.monotonic() - self._renewed > self.store.s.lease_ms / 3000:
            self.renew()

    def renew(self) -> None:
        self.store.renew(self.lease)
        self._renewed = time.monotonic()
