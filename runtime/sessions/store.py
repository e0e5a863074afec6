"""SessionStore: a session's state in Redis, as bytes (no torch).

- segments: immutable K/V chunks (runtime/sessions/segments.py), written in one transaction
  *before* the manifest that names them, each under its own random id, and recorded as the
  session's pending writes (with a deadline) until a manifest names them;
- manifest: one hash per session (gen, body, tenant).  It is the commit point: it changes only
  by compare-and-set on its generation, in a Lua script that also checks the writer's lease
  token and that every segment it names exists, so a stale or duplicated writer is refused
  (StaleWrite / LeaseLost), never applied, and a reader never follows a name to nothing;
- lease: one holder decodes a session at a time (SET NX PX with a random token; renew and
  release only with that token); a second holder waits up to lease_wait_ms, then gets Busy.
  `with store.lease(session) as lease:` takes it, lease.keep() renews it as time passes, and
  the exit gives it back.

No orphan, by construction: each segment has a reference count (the manifests that name it:
a fork's child names its parent's segments too).  The script that changes a manifest (commit,
evict, drop) moves the counts of the segments it names and no longer names, and deletes those
that reach 0, in the same atomic step.  Segments a writer wrote and never named (it crashed,
or lost its lease) stay in its session's pending record; sweep() (the workers' reaper) deletes
them once their deadline (2 lease periods) has passed, found from a sorted set of deadlines,
never by scanning the keyspace.  Everything also carries the session TTL, as a backstop.

Budgets: the commit script measures the bytes a manifest names; over the session budget it is
refused (OverBudget), over the tenant's the least recently used idle sessions of the tenant are
evicted first (a leased session never is).  A tenant's account is one counter: every byte its
sessions' manifests name (a fork counts its shared segments again, as a copy would) plus their
pending writes, so it moves by a delta per commit (O(1) in the number of sessions).  The
budget is checked against that account plus the bytes of the tenant's job event streams (kept
by runtime/jobs/events.py in a hash of its own): a tenant whose streams are large has its idle
sessions evicted sooner.

Redis Cluster: every script touches one session's keys, which share its hash tag (one slot,
runtime/keys.py); a fork there copies its parent's segments instead of sharing them (through
the forking process, COPY_BATCH at a time: Redis copies no key across slots).  On one server a
fork reads its parent's segment headers and the one segment its slot cuts, never its whole K/V.  The
tenant's account and LRU order lie elsewhere, so they move by single-key commands right after
each script (the account read just before the commit script, which checks the budget against
it).  What that allows, on one server as on a cluster:
- overshoot: pending writes are counted when written, so the budget is exceeded by at most the
  writes in flight when it is checked (each writer's write-behind batch, a segment_bytes each),
  plus the growth of commits of the same tenant that run at the same moment (each checks the
  account before the other's delta lands; a commit that only names its pending writes grows
  nothing);
- a writer killed between a script and its account update (a few commands) leaves the account
  off by that one write or commit: over by a batch never written (its index entry is cleared by
  the sweep), or, for a commit, its pending bytes counted again until the session goes.
Every operation is O(its own segments) or O(log n) in the number of sessions.

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
from runtime.keys import Keys, owner, segment_id
from runtime.sessions import segments
from runtime.settings import Settings

# The scripts touch one session's keys only (one Redis Cluster slot, runtime/keys.py): its
# manifest, lease, pending record, and its segments and their counts.  The tenant's account,
# LRU order and the sweep's indexes are moved by single-key commands right after (_account).
#
# KEYS: manifest, lease, pending record; then the added segments' keys and their refs', the
#       kept ones' and refs', the removed ones' and refs'
# ARGV: expected gen, new gen, body (with a "@BYTES@" placeholder), tenant, lease token, ttl ms,
#       session budget, tenant budget, the tenant's account and this session's bytes in it (as
#       read before the script), #added, #kept, #removed, then the added ids.
# Returns {'ok', bytes named, of them pending until now, the first pending deadline left or ''}
_CAS = """
local cur = redis.call('HGET', KEYS[1], 'gen') or '0'
if cur ~= ARGV[1] then return {'stale', cur} end
if redis.call('GET', KEYS[2]) ~= ARGV[5] then return {'lease', cur} end
local A, K, R = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local a0, k0 = 3, 3 + 2 * A
local r0 = k0 + 2 * K
local bytes, pend = 0, 0
for i = 1, A do
  local n = redis.call('STRLEN', KEYS[a0 + i])
  if n == 0 then return {'missing', KEYS[a0 + i]} end
  bytes = bytes + n
  if redis.call('ZSCORE', KEYS[3], ARGV[13 + i]) then pend = pend + n end
end
for i = 1, K do
  local n = redis.call('STRLEN', KEYS[k0 + i])
  if n == 0 then return {'missing', KEYS[k0 + i]} end
  bytes = bytes + n
end
if bytes > tonumber(ARGV[7]) then return {'session_budget', tostring(bytes)} end
local old = tonumber(ARGV[10])
local after = tonumber(ARGV[9]) - old - pend + bytes
if after > tonumber(ARGV[8]) and bytes > old then return {'tenant_budget', tostring(after)} end
local ttl = ARGV[6]
for i = 1, A do
  redis.call('INCR', KEYS[a0 + A + i])
  redis.call('PEXPIRE', KEYS[a0 + A + i], ttl)
  redis.call('PEXPIRE', KEYS[a0 + i], ttl)
  redis.call('ZREM', KEYS[3], ARGV[13 + i])
end
for i = 1, K do
  redis.call('PEXPIRE', KEYS[k0 + i], ttl)
  if redis.call('EXISTS', KEYS[k0 + K + i]) == 0 then redis.call('SET', KEYS[k0 + K + i], 1) end
  redis.call('PEXPIRE', KEYS[k0 + K + i], ttl)
end
for i = 1, R do
  local left = redis.call('DECR', KEYS[r0 + R + i])
  if left == 0 then redis.call('DEL', KEYS[r0 + i], KEYS[r0 + R + i])
  elseif left < 0 then redis.call('DEL', KEYS[r0 + R + i]) end  -- no count (written before counts): its TTL decides
end
local body = string.gsub(ARGV[3], '@BYTES@', tostring(bytes))
redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'body', body, 'tenant', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ttl)
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {'ok', tostring(bytes), tostring(pend), first[2] or ''}
"""
# KEYS: manifest, lease, then the named segments' keys and their refs'
# ARGV: lease token ("" to evict: only while nobody holds the lease), expected gen ("" none),
#       #named.  The manifest goes and its segments' counts move (those at 0 are deleted).
#       Returns {status, segments deleted}
_FORGET = """
if ARGV[1] == '' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'leased', 0} end
elseif redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'lease', 0} end
local cur = redis.call('HGET', KEYS[1], 'gen') or ''
if cur ~= ARGV[2] then return {'stale', 0} end
local n = tonumber(ARGV[3])
local deleted = 0
for i = 1, n do
  local left = redis.call('DECR', KEYS[2 + n + i])
  if left == 0 then deleted = deleted + redis.call('DEL', KEYS[2 + i], KEYS[2 + n + i]) - 1
  elseif left < 0 then redis.call('DEL', KEYS[2 + n + i]) end  -- no count (written before counts): its TTL decides
end
redis.call('DEL', KEYS[1])
return {'ok', deleted}
"""
# KEYS: pending record, then the overdue segments' keys and their refs'   ARGV: now ms, their ids.
# A pending write past its deadline that no manifest names (no ref) is deleted; a named one
# only leaves the record.  Returns {segments deleted, bytes freed, first deadline left or ''}
_SWEEP_PENDING = """
local n = #ARGV - 1
local freed, deleted = 0, 0
for i = 1, n do
  local due = redis.call('ZSCORE', KEYS[1], ARGV[1 + i])
  if due and tonumber(due) <= tonumber(ARGV[1]) then
    if redis.call('EXISTS', KEYS[1 + n + i]) == 0 then
      freed = freed + redis.call('STRLEN', KEYS[1 + i])
      deleted = deleted + redis.call('DEL', KEYS[1 + i])
    end
    redis.call('ZREM', KEYS[1], ARGV[1 + i])
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {deleted, freed, first[2] or ''}
"""
# The single-key steps beside them.
# KEYS: the accounts hash   ARGV: tenant.  An account below 0 (bytes an older version held were
# never counted) is set to 0: what follows a HINCRBY that returned < 0 (rare; a cluster client
# runs no script inside a pipeline)
_CLAMP = """
if tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') < 0 then return redis.call('HSET', KEYS[1], ARGV[1], 0) end
return 0
"""
# KEYS: the tenant's session bytes   ARGV: session.  Takes the session out; returns what it held
# (whoever takes it out gives it back to the account: once, however many try)
_UNCOUNT = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return tonumber(v)
"""
# KEYS: an index (sweep's pending index)   ARGV: member, now ms, its next deadline or ''.  The
# member moves to its next deadline, or leaves, unless a writer moved it since (to the future)
_REINDEX = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) > tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
SWEEP_BATCH = 100  #: sessions one sweep() call looks at, per kind (pending writes, expired manifests)
COPY_BATCH = 8  #: segments a fork on a Redis Cluster copies at a time (at most 8 x segment_bytes in memory)
EXPIRE_AT = 0.9  #: sweep() lets a session go once idle this share of session_ttl_s (its TTL is the backstop)


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
        self._forget = client.register_script(_FORGET)
        self._sweep_pending = client.register_script(_SWEEP_PENDING)
        self._clamp = client.register_script(_CLAMP)
        self._uncount_script = client.register_script(_UNCOUNT)
        self._reindex = client.register_script(_REINDEX)
        #: on a Redis Cluster a fork copies its parent's segments (they lie in the parent's slot)
        self.cluster = isinstance(client, redis.RedisCluster)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    # ---- segments ---------------------------------------------------------------------------

    def put_segments(self, session: str, tenant: str, blobs: list[bytes]) -> list[str]:
        """Write a session's segments (one transaction); returns their new ids.  Until a
        manifest names them they are the session's pending writes: counted in the tenant's
        account, and deleted by sweep() once 2 lease periods have passed unnamed."""
        for b in blobs:
            if len(b) > self.s.segment_bytes:
                raise BadInput(f"segment of {len(b)} bytes > segment_bytes {self.s.segment_bytes}")
        if not blobs:
            return []
        ids = [segment_id(session, secrets.token_hex(12)) for _ in blobs]
        ttl_ms, due = self.s.session_ttl_s * 1000, int(time.time() * 1000) + 2 * self.s.lease_ms
        # counted and indexed first: a writer that dies before its segments leaves the account
        # over (never under) and an index entry the sweep clears
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(self.k.pending_index, {_member(tenant, session): due}, lt=True)  # the session's first deadline
        pipe.hincrby(self.k.totals, tenant, sum(len(b) for b in blobs))
        pipe.execute()
        pipe = self.r.pipeline(transaction=True)  # the session's slot
        for i, b in zip(ids, blobs):
            pipe.set(self.k.segment(i), b, px=ttl_ms)
        pipe.zadd(self.k.pending(session), dict.fromkeys(ids, due))
        pipe.pexpire(self.k.pending(session), ttl_ms)
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

    def read_bytes_per_s(self, n: int = 4) -> float:
        """Pipelined GET bandwidth of n segment-sized values (probe keys: a short TTL, deleted after)."""
        keys = [self.k.probe(secrets.token_hex(8)) for _ in range(n)]
        blob = b"\x00" * self.s.segment_bytes
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, blob, px=60_000)
        pipe.execute()
        t = time.perf_counter()
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        pipe.execute()
        rate = n * len(blob) / max(time.perf_counter() - t, 1e-6)
        self.r.delete(*keys)
        return rate

    # ---- manifest ---------------------------------------------------------------------------

    def read(self, session: str) -> Manifest | None:
        return self._parse(session, self.r.hgetall(self.k.manifest(session)))

    def _parse(self, session: str, got: dict[Any, Any]) -> Manifest | None:
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
        evicting the tenant's least recently used idle sessions if needed, the tenant's.  The
        segments the stored manifest named and m does not are released (deleted when no other
        manifest names them).  keep: sessions not to evict (a fork's parent).  Returns the
        stored manifest (gen and nbytes set)."""
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
                streams = max(0, int(self.r.hget(self.k.event_bytes(m.tenant), "*") or 0))
                raise OverBudget(f"tenant {m.tenant}: {detail} bytes > tenant budget {self.s.tenant_budget_bytes} "
                                 f"({streams} of them its jobs' event streams, which expire events_ttl_s after their "
                                 "last event), and no idle session is left to evict")
            self.evict(victim, m.tenant)
            evicted.add(victim)

    def _try_commit(self, m: Manifest, lease: Lease) -> tuple[str, str]:
        k = self.k
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(k.manifest(m.session))
        pipe.hget(k.totals, m.tenant)
        pipe.hget(k.tenant_bytes(m.tenant), m.session)
        pipe.hget(k.event_bytes(m.tenant), "*")  # its jobs' event streams (runtime/jobs/events.py)
        got, total, counted, streams = pipe.execute()
        stored = self._parse(m.session, got) if m.gen else None  # what the script replaces, if it is still there
        if m.gen and (stored is None or stored.gen != m.gen):
            return "stale", "0" if stored is None else str(stored.gen)
        old = _named(stored)
        new = _named(m)
        if self.cluster and (foreign := [i for i in new if owner(i) != m.session]):
            raise BadInput(f"{m.session}: on a Redis Cluster a manifest names its own segments only, not {foreign[0]}")
        added = [i for i in new if i not in old]
        kept = [i for i in new if i in old]
        removed = [i for i in old if i not in new]
        keys = [k.manifest(m.session), k.lease(m.session), k.pending(m.session)]
        for group in (added, kept, removed):
            keys += [k.segment(i) for i in group] + [k.ref(i) for i in group]
        held = int(counted or 0)  # what the account holds for this session now
        args: list[str | int] = [m.gen, m.gen + 1, m.body(), m.tenant, lease.token, self.s.session_ttl_s * 1000,
                                 self.s.session_budget_bytes, self.s.tenant_budget_bytes,
                                 int(total or 0) + max(0, int(streams or 0)), held,
                                 len(added), len(kept), len(removed), *added]
        status, detail, *rest = (_text(x) for x in self._cas(keys=keys, args=args))
        if status == "ok":
            pend, first = rest
            self._account(m.tenant, m.session, int(detail) - held - int(pend), int(detail), first)
        return status, detail

    def _account(self, tenant: str, session: str, delta: int, counted: int, first_pending: str) -> None:
        """After a commit: the tenant's account moves by delta, the session's count and its
        places in the LRU orders and the pending index follow (single-key commands: they may lie
        in other slots than the session's).  A writer killed between its commit and this leaves
        the account off by that commit's delta: see the module's note on budgets."""
        k, now, member = self.k, int(time.time() * 1000), _member(tenant, session)
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(k.totals, tenant, delta)
        pipe.hset(k.tenant_bytes(tenant), session, counted)
        pipe.zadd(k.lru(tenant), {session: now})
        pipe.zadd(k.used, {member: now})
        if first_pending:
            pipe.zadd(k.pending_index, {member: int(float(first_pending))})
        else:
            pipe.zrem(k.pending_index, member)
        self._clamped(tenant, pipe.execute()[0])

    def _uncount(self, tenant: str, session: str) -> None:
        """The session leaves its tenant's account and LRU orders (once: whoever takes its count
        out gives it back)."""
        k = self.k
        held = int(self._uncount_script(keys=[k.tenant_bytes(tenant)], args=[session]))
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(k.totals, tenant, -held)
        pipe.zrem(k.lru(tenant), session)
        pipe.zrem(k.used, _member(tenant, session))
        self._clamped(tenant, pipe.execute()[0])

    def _clamped(self, tenant: str, account: int) -> None:
        if account < 0:
            self._clamp(keys=[self.k.totals], args=[tenant])

    # ---- budgets, eviction, forks, sweeping -------------------------------------------------------

    def _lru_idle(self, tenant: str, exclude: set[str]) -> str | None:
        """The tenant's least recently used session that no lease holds (O(log n) plus the
        sessions skipped: the leased and the excluded ones)."""
        start, step = 0, 16
        while True:
            batch = [_text(x) for x in self.r.zrange(self.k.lru(tenant), start, start + step - 1)]
            for sid in batch:
                if sid not in exclude and not self.r.exists(self.k.lease(sid)):
                    return sid
            if len(batch) < step:
                return None
            start += step

    def evict(self, session: str, tenant: str) -> bool:
        """Drop an idle session's Redis state (its manifest, and the segments no other manifest
        names).  Refused (False) while it is leased.  Costs time, not data: the engine
        recomputes it from SQL."""
        return self._release_state(session, tenant, "").startswith("ok")

    def fork(self, parent: Manifest, child: str, slot: int, lease: Lease,
             state: dict[str, Any] | None = None) -> Manifest:
        """A new session sharing the parent's K/V of slots [0, slot): the segments below slot are
        shared (copy on write: segments are immutable; each counts the manifests that name it),
        the one that slot cuts is re-written with its first part only.  `lease` is the child's;
        `state` its manifest's state (what a restore reads; default empty: nothing to restore).
        What this process reads of the parent: its segments' headers (heads()) and the one
        segment the slot cuts (at most segment_bytes), never its whole K/V.  On a Redis Cluster
        the segments below slot are copied into the child's slot instead (a script touches one
        slot), COPY_BATCH of them at a time."""
        if not 0 < slot <= parent.slots:
            raise BadInput(f"fork slot {slot} outside (0, {parent.slots}]")
        below: list[str] = []  # the segments wholly below slot
        cut: str | None = None  # the one slot cuts
        for sid, meta in zip(parent.segments, self.heads(parent.segments, parent.fingerprint)):
            if meta.end <= slot:
                below.append(sid)
                continue
            if meta.start < slot:
                cut = sid
            break
        ids = [] if self.cluster else list(below)
        if self.cluster:  # copies in the child's slot (its account counts them as copies either way)
            for i in range(0, len(below), COPY_BATCH):
                ids += self.put_segments(child, parent.tenant, self.get_segments(below[i:i + COPY_BATCH]))
        if cut is not None:
            meta, payload = segments.decode(self.get_segments([cut])[0], parent.fingerprint)
            first = segments.encode(meta.with_slots(meta.start, slot), payload[:(slot - meta.start) * meta.slot_bytes])
            ids += self.put_segments(child, parent.tenant, [first])
        # the parent is not evicted to make room: it holds the shared segments (which the child's
        # account counts again: forks are budgeted as copies)
        return self.commit(Manifest(child, parent.tenant, parent.fingerprint, segments=ids, slots=slot,
                                    state=dict(state or {})), lease, keep=frozenset({parent.session}))

    def heads(self, ids: list[str], fingerprint: str | None = None) -> list[segments.SegmentMeta]:
        """The segments' headers (GETRANGE of their first bytes, one pipeline): the slots each
        holds, without reading its K/V.  CorruptState for a missing or damaged one."""
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.getrange(self.k.segment(i), 0, segments.HEADER.size - 1)
        out = []
        for i, head in zip(ids, pipe.execute()):
            if not head:
                raise CorruptState(f"segment {i} is missing")
            out.append(segments.header(head, fingerprint))
        return out

    def drop(self, session: str, tenant: str, lease: Lease | None = None) -> int:
        """Delete a session's Redis state for good (the session itself is deleted): its manifest,
        its place in the LRU orders and the tenant's account, and the segments it names
        (written behind included) that no other manifest names: a fork's shared segments stay
        with the fork.  Under `lease` (the caller's, who holds the session), else under a lease
        taken here (Busy while a turn holds it) and given back.  Returns the segments deleted.
        NotFound when the stored manifest is another tenant's; nothing stored: nothing to do
        but the accounts (0).  Its pending writes, if any (a writer that crashed), go with
        sweep() at their deadline."""
        if lease is None:
            with self.lease(session) as held:
                return self._drop(session, tenant, held.lease)
        return self._drop(session, tenant, lease)

    def _drop(self, session: str, tenant: str, lease: Lease) -> int:
        if lease.session != session:
            raise BadInput(f"lease of {lease.session} cannot drop {session}")
        status = self._release_state(session, tenant, lease.token)
        if status == "lease":
            raise LeaseLost(f"{session}: the lease expired or is held by another writer")
        if status == "stale":  # only a writer under this lease moves it: not while we hold it
            raise StaleWrite(f"{session}: the manifest changed while it was being dropped")
        return int(status.removeprefix("ok:"))

    def _release_state(self, session: str, tenant: str, token: str) -> str:
        """The manifest goes (by its lease holder's token, or "" for an idle session), in one
        script with its segments' counts and the tenant's account: "ok:<segments deleted>",
        else why not ("leased", "lease", "stale")."""
        m = self.read(session)
        if m is not None and m.tenant != tenant:
            raise NotFound(f"no session {session!r} for tenant {tenant!r}")
        named = _named(m)
        k = self.k
        keys = [k.manifest(session), k.lease(session)] + [k.segment(i) for i in named] + [k.ref(i) for i in named]
        status, deleted = self._forget(keys=keys, args=[token, "" if m is None else str(m.gen), len(named)])
        status = _text(status)
        if status != "ok":
            return status
        self._uncount(tenant, session)
        return f"ok:{int(deleted)}"

    def sweep(self, batch: int = SWEEP_BATCH) -> dict[str, int]:
        """What nobody will name any more, found from deadlines, never by scanning the keyspace:
        pending writes past their deadline (a writer that crashed between its segments and its
        manifest, or lost its lease) are deleted; sessions idle for EXPIRE_AT of session_ttl_s
        are let go as an eviction would (their segments' counts given back), and one whose
        manifest expired anyway (no sweep ran) leaves the LRU orders and its tenant's account.
        Up to `batch` sessions of each per call (the oldest first; the workers' reaper calls it
        every pass).  Returns the counts."""
        now = int(time.time() * 1000)
        k = self.k
        done = {"segments_freed": 0, "sessions_expired": 0}
        for raw in self.r.zrangebyscore(k.pending_index, "-inf", now, start=0, num=batch):
            if (who := self._unmember(k.pending_index, raw)) is None:
                continue
            tenant, session = who
            ids = [_text(x) for x in self.r.zrangebyscore(k.pending(session), "-inf", now)]
            keys = [k.pending(session)] + [k.segment(i) for i in ids] + [k.ref(i) for i in ids]
            deleted, freed, first = self._sweep_pending(keys=keys, args=[now, *ids])
            if int(freed):
                self._clamped(tenant, self.r.hincrby(k.totals, tenant, -int(freed)))
            self._reindex(keys=[k.pending_index], args=[_text(raw), now, _text(first)])
            done["segments_freed"] += int(deleted)
        # idle sessions go a little before their TTL, through the script that gives back their
        # segments' counts (a manifest that expired on its own cannot: a fork's shared segments
        # would then outlive both, counted by nobody, until their own TTL)
        idle = now - int(EXPIRE_AT * self.s.session_ttl_s * 1000)
        for raw in self.r.zrangebyscore(k.used, "-inf", idle, start=0, num=batch):
            if (who := self._unmember(k.used, raw)) is None:
                continue
            tenant, session = who
            if self.r.exists(k.manifest(session)):
                try:
                    done["sessions_expired"] += self._release_state(session, tenant, "").startswith("ok")
                except NotFound:  # the id now names another tenant's session
                    self.r.zrem(k.used, _text(raw))
                continue
            # its manifest expired (TTL): it leaves the LRU orders and its tenant's account (its
            # segments expired with it, or live on with a fork that refreshed them)
            self._uncount(tenant, session)
            done["sessions_expired"] += 1
        return done

    def _unmember(self, index: str, raw: Any) -> tuple[str, str] | None:
        """(tenant, session) of an index member; one that is not (written by an older version:
        a bare session id) leaves the index."""
        try:
            tenant, session = json.loads(_text(raw))
            return str(tenant), str(session)
        except (ValueError, TypeError):
            self.r.zrem(index, raw)
            return None

    def tenant_bytes(self) -> dict[str, int]:
        """Each tenant's account: the bytes its sessions hold in Redis (named and pending).
        Its event streams are apart (JobEvents.tenant_bytes)."""
        return {_text(t): int(v) for t, v in self.r.hgetall(self.k.totals).items()}

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


def _named(m: Manifest | None) -> list[str]:
    """The segment ids a manifest names (committed, then written behind), each once."""
    return [] if m is None else list(dict.fromkeys(m.segments + m.behind))


def _member(tenant: str, session: str) -> str:
    """A session in the indexes that span tenants (used, pending_index)."""
    return json.dumps([tenant, session], separators=(",", ":"))
