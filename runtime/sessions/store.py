"""SessionStore: a session's state in Redis, as bytes (no torch).

- segments: immutable K/V chunks (runtime/sessions/segments.py), written in one pipeline *before* the
  manifest that names them, each under its own random id;
- manifest: one hash per session (gen, body, tenant).  It is the commit point: it changes only
  by compare-and-set on its generation, in a Lua script that also checks the writer's lease
  token and that every segment it names exists, so a stale or duplicated writer is refused
  (StaleWrite / LeaseLost), never applied, and a reader never follows a name to nothing;
- lease: one holder decodes a session at a time (SET NX PX with a random token; renew and
  release only with that token); a second holder waits up to lease_wait_ms, then gets Busy.
  `with store.lease(session) as lease:` takes it, lease.keep() renews it as time passes, and
  the exit gives it back.

- budgets: the commit script measures the bytes a manifest names; over the session budget it
  is refused (OverBudget), over the tenant's the least recently used idle sessions of the tenant
  are evicted first (a leased session never is);
- fork: a child manifest names the parent's segments (copy on write); gc() deletes segments no
  manifest names once their writer's grace period is over (each pass of the workers' reaper);
- drop: a deleted session's manifest, accounts and the segments no other manifest names go at
  once, under its lease.

Keys are in runtime/keys.py.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from runtime.errors import BadInput, Busy, CorruptState, LeaseLost, NotFound, OverBudget, StaleWrite
from runtime.keys import Keys
from runtime.sessions import segments
from runtime.settings import Settings

# KEYS: manifest, lease, used zset, tenant bytes hash, segment keys...
# ARGV: expected gen, new gen, body (with a "@BYTES@" placeholder), tenant, lease token, ttl ms,
#       now ms, session id, session budget, tenant budget
_CAS = """
local cur = redis.call('HGET', KEYS[1], 'gen') or '0'
if cur ~= ARGV[1] then return {'stale', cur} end
if redis.call('GET', KEYS[2]) ~= ARGV[5] then return {'lease', cur} end
local bytes = 0
for i = 5, #KEYS do
  local n = redis.call('STRLEN', KEYS[i])
  if n == 0 then return {'missing', KEYS[i]} end
  bytes = bytes + n
end
if bytes > tonumber(ARGV[9]) then return {'session_budget', tostring(bytes)} end
local others = 0
local held = redis.call('HGETALL', KEYS[4])
for i = 1, #held, 2 do
  if held[i] ~= ARGV[8] then others = others + tonumber(held[i + 1]) end
end
if others + bytes > tonumber(ARGV[10]) then return {'tenant_budget', tostring(others + bytes)} end
local body = string.gsub(ARGV[3], '@BYTES@', tostring(bytes))
redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'body', body, 'tenant', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
for i = 5, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[6]) end
redis.call('HSET', KEYS[4], ARGV[8], bytes)
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[8])
return {'ok', tostring(bytes)}
"""
# KEYS: manifest, lease, used zset, tenant bytes hash   ARGV: session, expected gen
# an idle session's manifest is dropped (its segments go to gc); a leased or changed one is kept
_EVICT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local cur = redis.call('HGET', KEYS[1], 'gen')
if cur and cur ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""
# KEYS: manifest, lease, used zset, tenant bytes hash   ARGV: session, lease token, expected gen
# a deleted session: dropped only by its lease holder, only as it was read (its segments are
# then deleted by the caller, those no other manifest names)
_DROP = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 'lease' end
local cur = redis.call('HGET', KEYS[1], 'gen') or ''
if cur ~= ARGV[3] then return 'stale' end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 'ok'
"""
# KEYS: segment   ARGV: ttl ms, grace ms.  Deleted only if still old: naming it in a commit
# refreshes its TTL, so a segment named after gc() listed the live ones survives
_GC_DELETE = """
local left = redis.call('PTTL', KEYS[1])
if left == -2 then return 0 end
if left < 0 or tonumber(ARGV[1]) - left >= tonumber(ARGV[2]) then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: manifest, used zset, tenant bytes hash   ARGV: session.  Forget an expired session
_GC_FORGET = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
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
    nbytes: int = 0  # bytes of the segments it names (set by commit)
    # segments a turn in progress has written behind its decoding: named (so they are budgeted,
    # kept alive and never collected) but not part of the state above until the turn commits
    behind: list[str] = field(default_factory=list)

    def body(self) -> str:
        """JSON; the byte count is filled in by the commit script, which measures the segments."""
        return json.dumps({"fingerprint": self.fingerprint, "segments": self.segments, "slots": self.slots,
                           "state": self.state, "behind": self.behind, "nbytes": "@BYTES@"},
                          separators=(",", ":"))


@dataclass(frozen=True)
class Lease:
    session: str
    token: str


class Held:
    """A lease held inside `with store.lease(session) as held:`.  keep() renews it once a third
    of lease_ms has passed since the last renewal (cheap enough to call every step); renew()
    renews it now.  Both raise LeaseLost when it expired or was taken over: the holder learns it
    before it writes."""

    def __init__(self, store: SessionStore, lease: Lease) -> None:
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


class SessionStore:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)
        self._cas = client.register_script(_CAS)
        self._evict = client.register_script(_EVICT)
        self._drop_script = client.register_script(_DROP)
        self._gc_delete = client.register_script(_GC_DELETE)
        self._gc_forget = client.register_script(_GC_FORGET)
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
                            list(body["segments"]), int(body["slots"]), dict(body["state"]), int(body["nbytes"]),
                            list(body.get("behind", [])))
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptState(f"manifest of {session} is unreadable: {e}") from e

    def commit(self, m: Manifest, lease: Lease, keep: frozenset[str] = frozenset()) -> Manifest:
        """Compare-and-set: writes m as generation m.gen + 1 if the stored generation is still
        m.gen and `lease` still holds the session, within the session's byte budget and, after
        evicting the tenant's least recently used idle sessions if needed, the tenant's.
        keep: sessions not to evict (a fork's parent).  Returns the stored manifest (gen and nbytes set)."""
        if lease.session != m.session:
            raise BadInput(f"lease of {lease.session} cannot commit {m.session}")
        evicted: set[str] = set()
        while True:
            status, detail = self._try_commit(m, lease)
            if status == "ok":
                return replace(m, gen=m.gen + 1, nbytes=int(detail))
            if status == "stale":
                raise StaleWrite(f"{m.session}: expected generation {m.gen}, the store holds {detail}")
            if status == "lease":
                raise LeaseLost(f"{m.session}: the lease expired or is held by another writer")
            if status == "missing":
                raise CorruptState(f"{m.session}: the manifest names a missing segment {detail}")
            if status == "session_budget":
                raise OverBudget(f"{m.session}: {detail} bytes > session budget {self.s.session_budget_bytes}")
            victim = self._lru_idle(m.tenant, exclude={m.session} | evicted | keep)
            if victim is None:
                raise OverBudget(f"tenant {m.tenant}: {detail} bytes > tenant budget {self.s.tenant_budget_bytes}, "
                                 "and no idle session is left to evict")
            self.evict(victim, m.tenant)
            evicted.add(victim)

    def _try_commit(self, m: Manifest, lease: Lease) -> tuple[str, str]:
        keys = [self.k.manifest(m.session), self.k.lease(m.session), self.k.used, self.k.tenant_bytes(m.tenant)]
        keys += [self.k.segment(i) for i in m.segments + m.behind]
        args: list[str | int] = [m.gen, m.gen + 1, m.body(), m.tenant, lease.token, self.s.session_ttl_s * 1000,
                                 int(time.time() * 1000), m.session, self.s.session_budget_bytes,
                                 self.s.tenant_budget_bytes]
        status, detail = (_text(x) for x in self._cas(keys=keys, args=args))
        return status, detail

    # ---- budgets, eviction, forks, garbage ------------------------------------------------------

    def _lru_idle(self, tenant: str, exclude: set[str]) -> str | None:
        """The tenant's least recently used session that holds bytes and no lease."""
        held = {_text(k) for k in self.r.hkeys(self.k.tenant_bytes(tenant))}
        for raw in self.r.zrange(self.k.used, 0, -1):
            sid = _text(raw)
            if sid in held and sid not in exclude and not self.r.exists(self.k.lease(sid)):
                return sid
        return None

    def evict(self, session: str, tenant: str) -> bool:
        """Drop an idle session's Redis state (the manifest; gc() frees its segments).  Refused
        (False) while it is leased.  Costs time, not data: the engine recomputes it from SQL."""
        m = self.read(session)
        gen = "" if m is None else str(m.gen)
        keys = [self.k.manifest(session), self.k.lease(session), self.k.used, self.k.tenant_bytes(tenant)]
        return bool(self._evict(keys=keys, args=[session, gen]))

    def fork(self, parent: Manifest, child: str, slot: int, lease: Lease,
             state: dict[str, Any] | None = None) -> Manifest:
        """A new session sharing the parent's K/V of slots [0, slot): the segments below slot are
        shared (copy on write: segments are immutable), the one that slot cuts is re-written
        with its first part only.  `lease` is the child's; `state` its manifest's state (what a
        restore reads; default empty: nothing to restore)."""
        if not 0 < slot <= parent.slots:
            raise BadInput(f"fork slot {slot} outside (0, {parent.slots}]")
        ids: list[str] = []
        for sid, blob in zip(parent.segments, self.get_segments(parent.segments)):
            meta, payload = segments.decode(blob, parent.fingerprint)
            if meta.end <= slot:
                ids.append(sid)
                continue
            if meta.start < slot:
                cut = meta.with_slots(meta.start, slot)
                ids += self.put_segments([segments.encode(cut, payload[:(slot - meta.start) * meta.slot_bytes])])
            break
        # the parent is not evicted to make room: it holds the shared segments (which the child's
        # account counts again: forks are budgeted as copies)
        return self.commit(Manifest(child, parent.tenant, parent.fingerprint, segments=ids, slots=slot,
                                    state=dict(state or {})), lease, keep=frozenset({parent.session}))

    def drop(self, session: str, tenant: str, lease: Lease | None = None) -> int:
        """Delete a session's Redis state for good (the session itself is deleted): its manifest,
        its place in the LRU order and the tenant's byte account, then the segments it names
        (written behind included) that no other manifest names: a fork's shared segments stay
        with the fork.  Under `lease` (the caller's, who holds the session), else under a lease
        taken here (Busy while a turn holds it) and given back.  Returns the segments deleted.
        NotFound when the stored manifest is another tenant's; nothing stored: nothing to do
        but the accounts (0).  A segment a concurrent fork of this very session names after the
        check below is deleted under it: that child's restore then fails its checks and it is
        recomputed from SQL (costs time, not data).  Segments a crashed turn wrote but never
        named are gc()'s."""
        if lease is None:
            with self.lease(session) as held:
                return self._drop(session, tenant, held.lease)
        return self._drop(session, tenant, lease)

    def _drop(self, session: str, tenant: str, lease: Lease) -> int:
        if lease.session != session:
            raise BadInput(f"lease of {lease.session} cannot drop {session}")
        m = self.read(session)
        if m is not None and m.tenant != tenant:
            raise NotFound(f"no session {session!r} for tenant {tenant!r}")
        keys = [self.k.manifest(session), self.k.lease(session), self.k.used, self.k.tenant_bytes(tenant)]
        status = _text(self._drop_script(keys=keys, args=[session, lease.token, "" if m is None else str(m.gen)]))
        if status == "lease":
            raise LeaseLost(f"{session}: the lease expired or is held by another writer")
        if status == "stale":  # only a writer under this lease moves it: not while we hold it
            raise StaleWrite(f"{session}: the manifest changed while it was being dropped")
        if m is None:
            return 0
        # the manifest is gone: what it named and no other manifest names is nobody's
        doomed = set(m.segments + m.behind) - self._named()
        return int(self.r.delete(*[self.k.segment(i) for i in doomed])) if doomed else 0

    def _named(self) -> set[str]:
        """Every segment id a stored manifest names (committed or written behind)."""
        live: set[str] = set()
        for key in self.r.scan_iter(self.k.manifest("*"), count=1000):
            body = self.r.hget(key, "body")
            if body is not None:
                named = json.loads(body)
                live.update(named["segments"], named.get("behind", []))
        return live

    def gc(self, grace_ms: int | None = None) -> int:
        """Delete segments that no manifest names and that were written more than grace_ms ago
        (default 2 lease periods: a writer's segments are unnamed until its commit).  Returns
        how many were deleted.  Expired manifests also leave the LRU and byte accounts."""
        grace = 2 * self.s.lease_ms if grace_ms is None else grace_ms
        live = self._named()
        tenant_hashes = [_text(h) for h in self.r.scan_iter(self.k.tenant_bytes("*"), count=1000)]
        for raw in self.r.zrange(self.k.used, 0, -1):  # sessions whose manifest expired
            sid = _text(raw)
            if not self.r.exists(self.k.manifest(sid)):
                for hkey in tenant_hashes:
                    self._gc_forget(keys=[self.k.manifest(sid), self.k.used, hkey], args=[sid])
        ttl_ms = self.s.session_ttl_s * 1000
        dead = 0
        for key in self.r.scan_iter(self.k.segment_pattern, count=1000):
            if _text(key).rsplit(":", 1)[1] not in live:
                dead += int(self._gc_delete(keys=[key], args=[ttl_ms, grace]))
        return dead

    # ---- lease ------------------------------------------------------------------------------

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
        if not self._renew(keys=[self.k.lease(lease.session)], args=[lease.token, self.s.lease_ms]):
            raise LeaseLost(f"session {lease.session}: the lease expired or was taken over")

    def release(self, lease: Lease) -> bool:
        """Give the lease back; False when it had already expired (or been taken over)."""
        return bool(self._release(keys=[self.k.lease(lease.session)], args=[lease.token]))


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
