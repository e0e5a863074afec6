"""SessionStore: a session's state in Redis, as bytes (no torch).

- segments: immutable K/V chunks (runtime/segments.py), written in one pipeline *before* the
  manifest that names them, each under its own random id;
- manifest: one hash per session (gen, body, tenant).  It is the commit point: it changes only
  by compare-and-set on its generation, in a Lua script that also checks the writer's lease
  token and that every segment it names exists, so a stale or duplicated writer is refused
  (StaleWrite / LeaseLost), never applied, and a reader never follows a name to nothing;
- lease: one holder decodes a session at a time (SET NX PX with a random token; renew and
  release only with that token); a second holder waits up to lease_wait_ms, then gets Busy.

Keys are in runtime/keys.py.  Budgets, eviction and forks build on these three.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from runtime.errors import BadInput, Busy, CorruptState, LeaseLost, StaleWrite
from runtime.keys import Keys
from runtime.settings import Settings

# KEYS: manifest, lease, segment keys...   ARGV: expected gen, new gen, body, tenant, lease token, ttl ms
_CAS = """
local cur = redis.call('HGET', KEYS[1], 'gen') or '0'
if cur ~= ARGV[1] then return {'stale', cur} end
if redis.call('GET', KEYS[2]) ~= ARGV[5] then return {'lease', cur} end
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then return {'missing', KEYS[i]} end
end
redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'body', ARGV[3], 'tenant', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
for i = 3, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[6]) end
return {'ok', ARGV[2]}
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Manifest:
    session: str
    tenant: str
    fingerprint: str  # the model whose K/V the segments hold
    gen: int = 0  # 0: never committed
    segments: list[str] = field(default_factory=list)  # segment ids, in slot order
    slots: int = 0  # committed slots (the segments cover [0, slots))
    state: dict[str, Any] = field(default_factory=dict)  # decode state, params, cursor, RNG (JSON)

    def body(self) -> str:
        return json.dumps({"fingerprint": self.fingerprint, "segments": self.segments, "slots": self.slots,
                           "state": self.state}, separators=(",", ":"))


@dataclass(frozen=True)
class Lease:
    session: str
    token: str


class SessionStore:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)
        self._cas = client.register_script(_CAS)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    # ---- segments ---------------------------------------------------------------------------

    def put_segments(self, blobs: list[bytes]) -> list[str]:
        """Write segments (one pipeline); returns their new ids.  Unreferenced until a manifest
        names them; they expire with the session TTL unless a commit names them."""
        for b in blobs:
            if len(b) > self.s.segment_bytes:
                raise BadInput(f"segment of {len(b)} bytes > segment_bytes {self.s.segment_bytes}")
        ids = [secrets.token_hex(12) for _ in blobs]
        pipe = self.r.pipeline(transaction=False)
        for i, b in zip(ids, blobs):
            pipe.set(self.k.segment(i), b, px=self.s.session_ttl_s * 1000)
        pipe.execute()
        return ids

    def get_segments(self, ids: list[str]) -> list[bytes]:
        """Read segments (one pipeline).  A missing one is CorruptState: a manifest named it."""
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.get(self.k.segment(i))
        out = pipe.execute()
        for i, b in zip(ids, out):
            if b is None:
                raise CorruptState(f"segment {i} is missing")
        return out

    # ---- manifest ---------------------------------------------------------------------------

    def read(self, session: str) -> Manifest | None:
        got = self.r.hgetall(self.k.manifest(session))
        if not got:
            return None
        try:
            body = json.loads(got[b"body"])
            return Manifest(session, _text(got[b"tenant"]), body["fingerprint"], int(got[b"gen"]),
                            list(body["segments"]), int(body["slots"]), dict(body["state"]))
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptState(f"manifest of {session} is unreadable: {e}") from e

    def commit(self, m: Manifest, lease: Lease) -> Manifest:
        """Compare-and-set: writes m as generation m.gen + 1 if the stored generation is still
        m.gen and `lease` still holds the session.  Returns the stored manifest."""
        if lease.session != m.session:
            raise BadInput(f"lease of {lease.session} cannot commit {m.session}")
        keys = [self.k.manifest(m.session), self.k.lease(m.session)] + [self.k.segment(i) for i in m.segments]
        args: list[str | int] = [m.gen, m.gen + 1, m.body(), m.tenant, lease.token, self.s.session_ttl_s * 1000]
        status, detail = (_text(x) for x in self._cas(keys=keys, args=args))
        if status == "stale":
            raise StaleWrite(f"{m.session}: expected generation {m.gen}, the store holds {detail}")
        if status == "lease":
            raise LeaseLost(f"{m.session}: the lease expired or is held by another writer")
        if status == "missing":
            raise CorruptState(f"{m.session}: the manifest names a missing segment {detail}")
        return replace(m, gen=m.gen + 1)

    # ---- lease ------------------------------------------------------------------------------

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
        if not self._renew(keys=[self.k.lease(lease.session)], args=[lease.token, self.s.lease_ms]):
            raise LeaseLost(f"session {lease.session}: the lease expired or was taken over")

    def release(self, lease: Lease) -> bool:
        """Give the lease back; False when it had already expired (or been taken over)."""
        return bool(self._release(keys=[self.k.lease(lease.session)], args=[lease.token]))


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x
