"""The Lua scripts of the session store, each behind a Python wrapper with named arguments and a
typed result.  A wrapper builds its script's KEYS and ARGV in one place; the script's text names
every slot.  Knows nothing of budgets' policy or of manifests' JSON: store.py, lease.py and
budget.py decide what to ask, and what a refusal means.

Redis Cluster: a script touches one session's keys only (its manifest, lease, pending record,
and its segments and their counts), which share the session's hash tag: one slot
(runtime/keys.py).  What spans sessions (a tenant's account and LRU order, the sweep's indexes)
moves by single-key commands beside the scripts (budget.py), or by the one-key scripts at the end.

A script's segments come as pairs of KEYS: segment j's key, then its count's ("ref"), so that
`seg(j)` and `ref(j)` name them in the Lua.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import redis

from runtime.keys import Keys
from runtime.replies import text


class Status(str, Enum):
    """What a script that changes a manifest answered."""

    OK = "ok"  #: applied
    STALE = "stale"  #: the stored generation is not the one the writer read
    LEASE = "lease"  #: the token is not the lease's: it expired, or another holder has it
    LEASED = "leased"  #: (forget, with no token: an eviction) a holder has the lease: not idle
    MISSING = "missing"  #: (commit) a segment the manifest names does not exist
    SESSION_BUDGET = "session_budget"  #: (commit) the manifest names more than the session budget
    TENANT_BUDGET = "tenant_budget"  #: (commit) the tenant's account would pass its budget, and this grows it


@dataclass(frozen=True)
class Commit:
    """The commit script's answer."""

    status: Status
    #: STALE, LEASE: the stored generation ('0': none); MISSING: the segment's key;
    #: SESSION_BUDGET: the bytes the manifest names; TENANT_BUDGET: the account it would make
    detail: str = ""
    nbytes: int = 0  #: OK: the bytes the manifest names (measured by the script)
    pending: int = 0  #: OK: of them, the bytes that were the session's pending writes until now
    first_pending: int | None = None  #: OK: the deadline (ms) of the first write still pending; None: none


@dataclass(frozen=True)
class Forget:
    """The forget script's answer."""

    status: Status  #: OK, LEASED, LEASE or STALE
    deleted: int = 0  #: OK: the segments deleted (those no other manifest names)


@dataclass(frozen=True)
class SweptPending:
    """The pending sweep's answer, for one session."""

    deleted: int  #: segments deleted: past their deadline and named by no manifest
    freed: int  #: their bytes
    first_pending: int | None  #: the deadline (ms) of the first write still pending; None: none


_COMMIT = """
-- KEYS[1]  the manifest (hash: gen, body, tenant)
-- KEYS[2]  the lease (its holder's token)
-- KEYS[3]  the pending record (zset: segment id -> deadline)
-- KEYS[2 + 2j], KEYS[3 + 2j]  segment j and its count, j = 1 .. A + K + R: the added, the kept, the removed
-- ARGV[1]  the generation the writer read ('0': none)      ARGV[2]  the new generation
-- ARGV[3]  the body (JSON; its "@BYTES@" becomes the bytes measured here)
-- ARGV[4]  the tenant                                        ARGV[5]  the writer's lease token
-- ARGV[6]  the TTL (ms)                                      ARGV[7]  the session budget (bytes)
-- ARGV[8]  the tenant budget (bytes)
-- ARGV[9]  the tenant's account (bytes, read just before; its event streams included)
-- ARGV[10] this session's bytes in that account
-- ARGV[11], ARGV[12], ARGV[13]  A, K, R: how many segments are added, kept, removed
-- ARGV[13 + j]  the id of added segment j (j = 1 .. A)
-- Returns {'ok', bytes named, of them pending until now, the first pending deadline left or ''},
-- else {why, detail}
local manifest, lease, pending = KEYS[1], KEYS[2], KEYS[3]
local function seg(j) return KEYS[2 + 2 * j] end
local function ref(j) return KEYS[3 + 2 * j] end
local A, K, R = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local cur = redis.call('HGET', manifest, 'gen') or '0'
if cur ~= ARGV[1] then return {'stale', cur} end
if redis.call('GET', lease) ~= ARGV[5] then return {'lease', cur} end
local bytes, pend = 0, 0
for j = 1, A + K do  -- every segment named must exist
  local n = redis.call('STRLEN', seg(j))
  if n == 0 then return {'missing', seg(j)} end
  bytes = bytes + n
  if j <= A and redis.call('ZSCORE', pending, ARGV[13 + j]) then pend = pend + n end
end
if bytes > tonumber(ARGV[7]) then return {'session_budget', tostring(bytes)} end
local old = tonumber(ARGV[10])
local after = tonumber(ARGV[9]) - old - pend + bytes
if after > tonumber(ARGV[8]) and bytes > old then return {'tenant_budget', tostring(after)} end
local ttl = ARGV[6]
for j = 1, A do  -- added: one more manifest names it; no longer pending
  redis.call('INCR', ref(j))
  redis.call('PEXPIRE', ref(j), ttl)
  redis.call('PEXPIRE', seg(j), ttl)
  redis.call('ZREM', pending, ARGV[13 + j])
end
for j = A + 1, A + K do  -- kept: its TTL renewed (a count written before counts starts at 1)
  redis.call('PEXPIRE', seg(j), ttl)
  if redis.call('EXISTS', ref(j)) == 0 then redis.call('SET', ref(j), 1) end
  redis.call('PEXPIRE', ref(j), ttl)
end
for j = A + K + 1, A + K + R do  -- removed: one manifest fewer names it; at 0 it goes
  local left = redis.call('DECR', ref(j))
  if left == 0 then redis.call('DEL', seg(j), ref(j))
  elseif left < 0 then redis.call('DEL', ref(j)) end  -- no count (written before counts): its TTL decides
end
local body = string.gsub(ARGV[3], '@BYTES@', tostring(bytes))
redis.call('HSET', manifest, 'gen', ARGV[2], 'body', body, 'tenant', ARGV[4])
redis.call('PEXPIRE', manifest, ttl)
local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
return {'ok', tostring(bytes), tostring(pend), first[2] or ''}
"""

_FORGET = """
-- KEYS[1]  the manifest             KEYS[2]  the lease
-- KEYS[1 + 2j], KEYS[2 + 2j]  named segment j and its count (j = 1 .. n)
-- ARGV[1]  the holder's lease token ('' to evict: only while nobody holds the lease)
-- ARGV[2]  the generation expected ('' none)
-- ARGV[3]  n: how many segments the manifest names
-- The manifest goes and its segments' counts move (those at 0 are deleted).
-- Returns {status, segments deleted}
local manifest, lease = KEYS[1], KEYS[2]
local function seg(j) return KEYS[1 + 2 * j] end
local function ref(j) return KEYS[2 + 2 * j] end
if ARGV[1] == '' then
  if redis.call('EXISTS', lease) == 1 then return {'leased', 0} end
elseif redis.call('GET', lease) ~= ARGV[1] then return {'lease', 0} end
local cur = redis.call('HGET', manifest, 'gen') or ''
if cur ~= ARGV[2] then return {'stale', 0} end
local deleted = 0
for j = 1, tonumber(ARGV[3]) do
  local left = redis.call('DECR', ref(j))
  if left == 0 then deleted = deleted + redis.call('DEL', seg(j), ref(j)) - 1
  elseif left < 0 then redis.call('DEL', ref(j)) end  -- no count (written before counts): its TTL decides
end
redis.call('DEL', manifest)
return {'ok', deleted}
"""

_SWEEP_PENDING = """
-- KEYS[1]  the pending record (zset: segment id -> deadline)
-- KEYS[2j], KEYS[1 + 2j]  overdue segment j and its count (j = 1 .. n)
-- ARGV[1]  now (ms)                  ARGV[1 + j]  segment j's id
-- A pending write past its deadline that no manifest names (no count) is deleted; a named one
-- only leaves the record.  Returns {segments deleted, bytes freed, first deadline left or ''}
local pending, now = KEYS[1], tonumber(ARGV[1])
local function seg(j) return KEYS[2 * j] end
local function ref(j) return KEYS[1 + 2 * j] end
local freed, deleted = 0, 0
for j = 1, #ARGV - 1 do
  local due = redis.call('ZSCORE', pending, ARGV[1 + j])
  if due and tonumber(due) <= now then
    if redis.call('EXISTS', ref(j)) == 0 then
      freed = freed + redis.call('STRLEN', seg(j))
      deleted = deleted + redis.call('DEL', seg(j))
    end
    redis.call('ZREM', pending, ARGV[1 + j])
  end
end
local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
return {deleted, freed, first[2] or ''}
"""

# The one-key scripts beside them.

_CLAMP = """
-- KEYS[1]  the accounts hash (tenant -> bytes)      ARGV[1]  the tenant
-- An account below 0 (bytes an older version held were never counted) is set to 0: what
-- follows a HINCRBY that returned < 0 (rare; a cluster client runs no script inside a pipeline)
if tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') < 0 then return redis.call('HSET', KEYS[1], ARGV[1], 0) end
return 0
"""

_UNCOUNT = """
-- KEYS[1]  the tenant's session bytes (hash: session -> bytes)      ARGV[1]  the session
-- Takes the session out; returns what it held (whoever takes it out gives it back to the
-- account: once, however many try)
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return tonumber(v)
"""

_REINDEX = """
-- KEYS[1]  an index (the sweep's pending index: member -> its next deadline, ms)
-- ARGV[1]  the member      ARGV[2]  now (ms)      ARGV[3]  its next deadline ('' none)
-- The member moves to its next deadline, or leaves, unless a writer moved it since (to the
-- future).  Returns 1 if it moved or left, 0 if not
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) > tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then redis.call('ZREM', KEYS[1], ARGV[1]) else redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1]) end
return 1
"""

_RENEW = """
-- KEYS[1]  the lease      ARGV[1]  the holder's token      ARGV[2]  the lease's length (ms)
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

_RELEASE = """
-- KEYS[1]  the lease      ARGV[1]  the holder's token
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Scripts:
    """The scripts, registered on one client (EVALSHA, loaded again after a SCRIPT FLUSH)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.k = keys
        self._commit = client.register_script(_COMMIT)
        self._forget = client.register_script(_FORGET)
        self._sweep_pending = client.register_script(_SWEEP_PENDING)
        self._clamp = client.register_script(_CLAMP)
        self._uncount = client.register_script(_UNCOUNT)
        self._reindex = client.register_script(_REINDEX)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _pairs(self, ids: list[str]) -> list[str]:
        """Each segment's key, then its count's."""
        return [key for i in ids for key in (self.k.segment(i), self.k.ref(i))]

    def commit(self, *, session: str, tenant: str, token: str, gen: int, body: str,
               added: list[str], kept: list[str], removed: list[str], ttl_ms: int,
               session_budget: int, tenant_budget: int, account: int, held: int) -> Commit:
        """Write `body` as the session's manifest, generation gen + 1, if the stored generation
        is gen (0: none) and `token` holds its lease, and every segment of added + kept exists;
        refused over session_budget, or when the tenant's `account` (less `held`, this
        session's bytes in it) would pass tenant_budget and grow.  The added segments are
        counted once more and leave the pending record, the removed ones once less (deleted
        at 0); all named get the TTL."""
        k = self.k
        keys = [k.manifest(session), k.lease(session), k.pending(session), *self._pairs(added + kept + removed)]
        args: list[str | int] = [gen, gen + 1, body, tenant, token, ttl_ms, session_budget, tenant_budget,
                                 account, held, len(added), len(kept), len(removed), *added]
        status, detail, *rest = (text(x) for x in self._commit(keys=keys, args=args))
        if status != Status.OK:
            return Commit(Status(status), detail)
        pend, first = rest
        return Commit(Status.OK, detail, int(detail), int(pend), _deadline(first))

    def forget(self, *, session: str, named: list[str], token: str, gen: int | None) -> Forget:
        """Delete the session's manifest if it is still generation `gen` (None: none stored),
        under `token` (its holder's), or "" for an eviction (only while no one holds the lease);
        the `named` segments' counts move (deleted at 0)."""
        k = self.k
        keys = [k.manifest(session), k.lease(session), *self._pairs(named)]
        status, deleted = self._forget(keys=keys, args=[token, "" if gen is None else str(gen), len(named)])
        return Forget(Status(text(status)), int(deleted))

    def sweep_pending(self, *, session: str, ids: list[str], now_ms: int) -> SweptPending:
        """Of the session's pending writes `ids`, those past their deadline at now_ms leave its
        record; the ones no manifest names are deleted."""
        keys = [self.k.pending(session), *self._pairs(ids)]
        deleted, freed, first = self._sweep_pending(keys=keys, args=[now_ms, *ids])
        return SweptPending(int(deleted), int(freed), _deadline(text(first)))

    def clamp(self, *, tenant: str) -> None:
        """The tenant's account to 0 if it is below."""
        self._clamp(keys=[self.k.totals], args=[tenant])

    def uncount(self, *, tenant: str, session: str) -> int:
        """Take the session's count out of the tenant's session bytes; what it held (0: nothing,
        or another took it first)."""
        return int(self._uncount(keys=[self.k.tenant_bytes(tenant)], args=[session]))

    def reindex(self, *, member: str, now_ms: int, next_due: int | None) -> bool:
        """Move a member of the pending index to next_due (None: out of it), unless a writer
        moved it past now_ms since; whether it moved (or left)."""
        due = "" if next_due is None else str(next_due)
        return bool(self._reindex(keys=[self.k.pending_index], args=[member, now_ms, due]))

    def renew(self, *, session: str, token: str, lease_ms: int) -> bool:
        """Extend the lease to lease_ms if `token` holds it; False if it does not."""
        return bool(self._renew(keys=[self.k.lease(session)], args=[token, lease_ms]))

    def release(self, *, session: str, token: str) -> bool:
        """Delete the lease if `token` holds it; False if it does not (expired, or taken over)."""
        return bool(self._release(keys=[self.k.lease(session)], args=[token]))


def _deadline(score: str) -> int | None:
    """A deadline the scripts return (a zset score, ms; '': none)."""
    return int(float(score)) if score else None
