"""Budgets: tenants' byte accounts, the eviction of idle sessions, and the sweep.

The commit script (scripts.py) measures the bytes a manifest names; over the session budget it
is refused (OverBudget), over the tenant's the least recently used idle sessions of the tenant
are evicted first (a leased session never is).  A tenant's account is one counter: every byte
its sessions' manifests name (a fork counts its shared segments again, as a copy would) plus
their pending writes, so it moves by a delta per commit (O(1) in the number of sessions).  The
budget is checked against that account plus the bytes of the tenant's job event streams (kept
by streams.py in a hash of its own): a tenant whose streams are large has its idle
sessions evicted sooner.

No orphan: segments a writer wrote and never named (it crashed, or lost its lease) stay in its
session's pending record; sweep() (the workers' reaper) deletes them once their deadline (2
lease periods) has passed, found from a sorted set of deadlines, never by scanning the keyspace.
Everything also carries the session TTL, as a backstop.

The account and LRU order lie outside a session's slot (Redis Cluster), so they move by
single-key commands right after each script (the account read just before the commit script,
which checks the budget against it).  What that allows, on one server as on a cluster:
- overshoot: pending writes are counted when written, so the budget is exceeded by at most the
  writes in flight when it is checked (each writer's write-behind batch, a segment_bytes each),
  plus the growth of commits of the same tenant that run at the same moment (each checks the
  account before the other's delta lands; a commit that only names its pending writes grows
  nothing);
- a writer killed between a script and its account update (a few commands) leaves the account
  off by that one write or commit: over by a batch never written (its index entry is cleared by
  the sweep), or, for a commit, its pending bytes counted again until the session goes.
Every operation is O(its own segments) or O(log n) in the number of sessions.

Knows nothing of manifests' contents; SessionStore (store.py) is a Budgets and says how a
session's state goes (_release_state).

Redis's ceiling (`maxmemory`) against the byte budgets setflow keeps under it, and what a write
refused at that ceiling (OOM) is.  Knows nothing of HTTP, jobs or workers.

setflow evicts, Redis never does (`maxmemory-policy noeviction`): one tenant holds at most its
KV budget (tenant_budget_bytes, which its event streams count against too) and its event streams
at most tenant_max_event_bytes; maxmemory is the hard ceiling behind them.  The rule, checked
when the API and a worker start (check()): one tenant's budgets together fit maxmemory, else
the process refuses to start; how many tenants at full budget fit is logged (a warning below 2).
maxmemory 0 (none) fits anything; a Redis that refuses CONFIG (a managed one), or does not
answer yet, is not checked (logged).  On a Redis Cluster the primaries' maxmemory is summed (a tenant's sessions spread
over them).

A write past maxmemory fails with "OOM command not allowed" (redis-py's OutOfMemoryError; from
inside a script on Redis 6 a plain ResponseError with that text): oom() says which errors are."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from runtime.errors import CliError, NotFound
from runtime.keys import Keys
from runtime.replies import text
from runtime.sessions.scripts import Forget, Scripts, Status
from runtime.settings import MiB, Settings

SWEEP_BATCH = 100  #: sessions one sweep() call looks at, per kind (pending writes, expired manifests)
EXPIRE_AT = 0.9  #: sweep() lets a session go once idle this share of session_ttl_s (its TTL is the backstop)


class Budgets:
    """Accounts, eviction and the sweep (a part of SessionStore)."""

    r: redis.Redis
    s: Settings
    k: Keys
    scripts: Scripts

    def _release_state(self, session: str, tenant: str, token: str) -> Forget:
        """The session's manifest goes, with its segments' counts and its place in the account
        (store.py: it reads the manifest to know what it names)."""
        raise NotImplementedError

    # ---- the account ----------------------------------------------------------------------------

    def _count_pending(self, tenant: str, session: str, nbytes: int, due: int) -> None:
        """Before a session's segments are written: the account counts them, and the pending
        index holds the session's first deadline.  First, so that a writer that dies before its
        segments leaves the account over (never under) and an index entry the sweep clears."""
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(self.k.pending_index, {_member(tenant, session): due}, lt=True)  # the session's first deadline
        pipe.hincrby(self.k.totals, tenant, nbytes)
        pipe.execute()

    def _account(self, tenant: str, session: str, delta: int, counted: int, first_pending: int | None) -> None:
        """After a commit: the tenant's account moves by delta, the session's count and its
        places in the LRU orders and the pending index follow (single-key commands: they may lie
        in other slots than the session's).  A writer killed between its commit and this leaves
        the account off by that commit's delta: see the module's note."""
        k, now, member = self.k, int(time.time() * 1000), _member(tenant, session)
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(k.totals, tenant, delta)
        pipe.hset(k.tenant_bytes(tenant), session, counted)
        pipe.zadd(k.lru(tenant), {session: now})
        pipe.zadd(k.used, {member: now})
        if first_pending is not None:
            pipe.zadd(k.pending_index, {member: first_pending})
        else:
            pipe.zrem(k.pending_index, member)
        self._clamped(tenant, pipe.execute()[0])

    def _uncount(self, tenant: str, session: str) -> None:
        """The session leaves its tenant's account and LRU orders (once: whoever takes its count
        out gives it back)."""
        k = self.k
        held = self.scripts.uncount(tenant=tenant, session=session)
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(k.totals, tenant, -held)
        pipe.zrem(k.lru(tenant), session)
        pipe.zrem(k.used, _member(tenant, session))
        self._clamped(tenant, pipe.execute()[0])

    def _clamped(self, tenant: str, account: int) -> None:
        if account < 0:
            self.scripts.clamp(tenant=tenant)

    def tenant_bytes(self) -> dict[str, int]:
        """Each tenant's account: the bytes its sessions hold in Redis (named and pending).
        Its event streams are apart (JobEvents.tenant_bytes)."""
        return {text(t): int(v) for t, v in self.r.hgetall(self.k.totals).items()}

    # ---- eviction -------------------------------------------------------------------------------

    def evict(self, session: str, tenant: str) -> bool:
        """Drop an idle session's Redis state (its manifest, and the segments no other manifest
        names).  Refused (False) while it is leased.  Costs time, not data: the engine
        recomputes it from SQL."""
        return self._release_state(session, tenant, "").status == Status.OK

    def _evict_lru(self, tenant: str, exclude: set[str]) -> str | None:
        """Evict the tenant's least recently used session that no lease holds and `exclude`
        does not name; which one (None: none is left)."""
        victim = self._lru_idle(tenant, exclude)
        if victim is not None:
            self.evict(victim, tenant)
        return victim

    def _lru_idle(self, tenant: str, exclude: set[str]) -> str | None:
        """The tenant's least recently used session that no lease holds (O(log n) plus the
        sessions skipped: the leased and the excluded ones)."""
        start, step = 0, 16
        while True:
            batch = [text(x) for x in self.r.zrange(self.k.lru(tenant), start, start + step - 1)]
            for sid in batch:
                if sid not in exclude and not self.r.exists(self.k.lease(sid)):
                    return sid
            if len(batch) < step:
                return None
            start += step

    # ---- the sweep ------------------------------------------------------------------------------

    def sweep(self, batch: int = SWEEP_BATCH) -> dict[str, int]:
        """What nobody will name any more, found from deadlines, never by scanning the keyspace:
        pending writes past their deadline (a writer that crashed between its segments and its
        manifest, or lost its lease) are deleted; sessions idle for EXPIRE_AT of session_ttl_s
        are let go as an eviction would (their segments' counts given back), and one whose
        manifest expired anyway (no sweep ran) leaves the LRU orders and its tenant's account.
        Up to `batch` sessions of each per call (the oldest first; the workers' reaper calls it
        every pass).  Returns the counts."""
        now = int(time.time() * 1000)
        return {"segments_freed": self._sweep_pending(now, batch), "sessions_expired": self._sweep_idle(now, batch)}

    def _sweep_pending(self, now: int, batch: int) -> int:
        """Pending writes past their deadline: deleted unless named; the segments deleted."""
        k, deleted = self.k, 0
        for raw in self.r.zrangebyscore(k.pending_index, "-inf", now, start=0, num=batch):
            if (who := self._unmember(k.pending_index, raw)) is None:
                continue
            tenant, session = who
            ids = [text(x) for x in self.r.zrangebyscore(k.pending(session), "-inf", now)]
            swept = self.scripts.sweep_pending(session=session, ids=ids, now_ms=now)
            if swept.freed:
                self._clamped(tenant, self.r.hincrby(k.totals, tenant, -swept.freed))
            self.scripts.reindex(member=text(raw), now_ms=now, next_due=swept.first_pending)
            deleted += swept.deleted
        return deleted

    def _sweep_idle(self, now: int, batch: int) -> int:
        """Sessions idle for EXPIRE_AT of their TTL: let go; how many."""
        # they go a little before their TTL, through the script that gives back their segments'
        # counts (a manifest that expired on its own cannot: a fork's shared segments would then
        # outlive both, counted by nobody, until their own TTL)
        k, expired = self.k, 0
        idle = now - int(EXPIRE_AT * self.s.session_ttl_s * 1000)
        for raw in self.r.zrangebyscore(k.used, "-inf", idle, start=0, num=batch):
            if (who := self._unmember(k.used, raw)) is None:
                continue
            tenant, session = who
            if self.r.exists(k.manifest(session)):
                try:
                    expired += self.evict(session, tenant)
                except NotFound:  # the id now names another tenant's session
                    self.r.zrem(k.used, text(raw))
                continue
            # its manifest expired (TTL): it leaves the LRU orders and its tenant's account (its
            # segments expired with it, or live on with a fork that refreshed them)
            self._uncount(tenant, session)
            expired += 1
        return expired

    def _unmember(self, index: str, raw: Any) -> tuple[str, str] | None:
        """(tenant, session) of an index member; one that is not (written by an older version:
        a bare session id) leaves the index."""
        try:
            tenant, session = json.loads(text(raw))
            return str(tenant), str(session)
        except (ValueError, TypeError):
            self.r.zrem(index, raw)
            return None


def _member(tenant: str, session: str) -> str:
    """A session in the indexes that span tenants (used, pending_index)."""
    return json.dumps([tenant, session], separators=(",", ":"))


log = logging.getLogger("setflow.ceilings")
OOM_REPLY = "OOM command not allowed"  # Redis's own words; the error class is lost inside a Redis 6 script
MIN_TENANTS = 2  # fewer tenants at full budget than this fit maxmemory: a warning at start-up


def oom(e: BaseException) -> bool:
    """Whether a Redis error is a write refused at maxmemory (it may pass once memory frees)."""
    return isinstance(e, redis.OutOfMemoryError) or (isinstance(e, redis.ResponseError) and OOM_REPLY in str(e))


def tenant_bytes(s: Settings) -> int:
    """What one tenant may hold in Redis at most: its KV budget and its event streams' quota."""
    return s.tenant_budget_bytes + s.tenant_max_event_bytes


def maxmemory(client: redis.Redis) -> int | None:
    """Redis's maxmemory in bytes (0: none; on a cluster the primaries' sum, 0 when any has
    none); None where the server refuses CONFIG GET (a managed Redis may)."""
    try:
        if isinstance(client, redis.RedisCluster):
            got: dict[str, Any] = client.config_get("maxmemory", target_nodes=redis.RedisCluster.PRIMARIES)
            each = [int(v["maxmemory"]) for v in got.values()]
            return 0 if not each or 0 in each else sum(each)
        one: Any = client.config_get("maxmemory")
        return int(one["maxmemory"])
    except (redis.ResponseError, KeyError, ValueError, TypeError) as e:
        log.warning("Redis refused CONFIG GET maxmemory (%s): the budgets are not checked against it", e)
        return None
    except (redis.ConnectionError, redis.TimeoutError) as e:  # away at start-up: its clients retry later
        log.warning("Redis did not answer CONFIG GET maxmemory (%s): the budgets are not checked against it", e)
        return None


def check(client: redis.Redis, s: Settings) -> int | None:
    """At start-up: CliError (one line) when one tenant's budgets exceed Redis's maxmemory;
    returns how many tenants at full budget fit (None: no ceiling known)."""
    ceiling = maxmemory(client)
    if not ceiling:
        return None
    one = tenant_bytes(s)
    if one > ceiling:
        raise CliError(f"one tenant's budgets ({_mib(one)}: tenant_budget_bytes {_mib(s.tenant_budget_bytes)} + "
                       f"tenant_max_event_bytes {_mib(s.tenant_max_event_bytes)}) exceed Redis's maxmemory "
                       f"({_mib(ceiling)}): lower them or raise maxmemory")
    fit = ceiling // one
    (log.warning if fit < MIN_TENANTS else log.info)(
        "Redis maxmemory %s holds %d tenant(s) at full budget (%s each)", _mib(ceiling), fit, _mib(one))
    return fit


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"
