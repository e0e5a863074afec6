"""A tenant's job event streams in its byte account (what budget.py checks beside its sessions).

After each write (runtime/jobs/events.py) the stream's size (MEMORY USAGE: what it holds after
trimming, not the sum of what was written) is set in the tenant's hash `{p}:evbytes:{tenant}` (a
field per job, and `*` their sum, moved by one script), and the stream is put in
`{p}:events_due` at its expiry.  sweep() (the workers' reaper) takes a stream that is gone out of
the account, found from those deadlines, never by scanning the keyspace; a deleted session's
streams leave it at once (forget).  The hash carries the streams' TTL and a margin, as a
backstop.  The count is best effort, after the write (a failed count never sends events again):
a running job's stream is counted at most once a second, a status event at once; a stream
written at the moment the sweep finds it gone is counted again by its next write (the size is
set, not added).

A tenant whose streams hold tenant_max_event_bytes (as counted) has its submissions refused
(check_quota: 429 rate_limited, naming the quota), before anything is written; it may pass the
quota by what its running jobs' streams grow meanwhile (each at most events_maxlen entries).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from runtime.errors import RateLimited
from runtime.keys import Keys
from runtime.replies import text as _text
from runtime.settings import Settings

SWEEP_BATCH = 1000  # streams looked at per round of a sweep
SWEEP_S = 2.0  # a sweep's rounds go on this long at most (the reaper's pass)
DROP_BATCH = 500  # keys per DEL, jobs per script call, when a session's jobs' streams go
log = logging.getLogger("setflow.events")

# KEYS[1] the tenant's hash; ARGV: the hash's TTL in ms, then pairs of a job and its stream's bytes
# now (0: gone).  Sets each job's field, moves `*` by the difference; returns the tenant's event bytes.
_SET = """
local total = 0
for i = 2, #ARGV, 2 do
  local old = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  local new = tonumber(ARGV[i + 1])
  if new > 0 then redis.call('HSET', KEYS[1], ARGV[i], new) else redis.call('HDEL', KEYS[1], ARGV[i]) end
  total = redis.call('HINCRBY', KEYS[1], '*', new - old)
end
if total <= 0 and redis.call('HLEN', KEYS[1]) <= 1 then redis.call('DEL', KEYS[1]) return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return total
"""

# KEYS[1] the tenant's hash; ARGV: the hash's TTL in ms, then jobs whose streams are gone.  Their
# fields go and `*` moves by their sum (moved first: refused at maxmemory, nothing changes);
# returns the tenant's event bytes.
_FORGET = """
local held = redis.call('HMGET', KEYS[1], unpack(ARGV, 2))
local gone = 0
for _, v in ipairs(held) do if v then gone = gone + tonumber(v) end end
if gone == 0 then return tonumber(redis.call('HGET', KEYS[1], '*') or '0') end
local total = redis.call('HINCRBY', KEYS[1], '*', -gone)
redis.call('HDEL', KEYS[1], unpack(ARGV, 2))
if total <= 0 and redis.call('HLEN', KEYS[1]) <= 1 then redis.call('DEL', KEYS[1]) return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return total
"""

# KEYS[1] events_due; ARGV: a member, the score it was read with.  Removes it if no write has
# moved it since (1), else leaves it (0).
_TAKE = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
"""


class StreamAccount:
    """The byte account of a tenant's job event streams; runtime/jobs/events.py's JobEvents is one."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)
        self._set = client.register_script(_SET)
        self._take = client.register_script(_TAKE)
        self._forget = client.register_script(_FORGET)
        # job -> (bytes last set, when, when last put in events_due) (monotonic s): what this
        # process counted, so that a running job's flushes (every FLUSH_S) cost one round trip
        self._seen: dict[str, tuple[int, float, float]] = {}
        # a stream cannot expire within half its TTL of a write: until then what this process
        # counted for it still stands (the sweep takes out only streams that are gone)
        self._fresh_s = min(60.0, settings.events_ttl_s / 2)

    def _count_made(self, tenant: str, streams: list[tuple[str, int]]) -> None:
        """The accounts of streams the last write made (job, bytes it holds now), nothing this
        process counted for them standing: each due at its expiry, for the sweep, and its bytes
        set (two round trips, a script call per DROP_BATCH: a script is not queued on a cluster's
        pipeline).  Best effort, as _count."""
        now = time.monotonic()
        try:
            with self.r.pipeline(transaction=False) as p:
                p.zadd(self.k.events_due, {json.dumps([tenant, job]): int((time.time() + self.s.events_ttl_s) * 1000)
                                           for job, _ in streams})
                p.sadd(self.k.event_tenants, tenant)  # as many members as tenants
                p.execute()
            for i in range(0, len(streams), DROP_BATCH):
                self._set_bytes(tenant, streams[i:i + DROP_BATCH])
        except redis.RedisError as e:
            log.warning("%d event streams: their bytes not counted (%s); their next writes count them", len(streams), e)
            return
        self._remember([(job, (used, now, now)) for job, used in streams])

    def _remember(self, counted: list[tuple[str, tuple[int, float, float]]]) -> None:
        if len(self._seen) > 10_000:  # a worker's recent jobs; the rest are counted afresh
            self._seen.clear()
        self._seen.update(counted)

    def _count(self, tenant: str, job: str, used: int, every_s: float) -> None:
        """The account of the job's stream, which holds `used` bytes now (a stream this process
        may have counted before: _count_made counts a new one).  Best effort: the events are
        written already (a failure here must not send them again); the next write counts the
        stream."""
        now = time.monotonic()
        size, counted_at, due_at = self._seen.get(job, (-1, -1e18, -1e18))
        try:
            if now - due_at >= self._fresh_s:  # due at its expiry, for the sweep; a tenant for /metrics
                with self.r.pipeline(transaction=False) as p:
                    p.zadd(self.k.events_due, {json.dumps([tenant, job]): int((time.time() + self.s.events_ttl_s) * 1000)})
                    p.sadd(self.k.event_tenants, tenant)  # as many members as tenants
                    p.execute()
                due_at = now
            if (used != size or now - counted_at >= self._fresh_s) and now - counted_at >= every_s:
                self._set_bytes(tenant, [(job, used)])
                size, counted_at = used, now
        except redis.RedisError as e:
            log.warning("job %s: its event stream's bytes not counted (%s); its next write counts them", job, e)
            return
        self._remember([(job, (size, counted_at, due_at))])

    def _set_bytes(self, tenant: str, streams: list[tuple[str, int]]) -> None:
        """Each job's field in the tenant's hash (job, its stream's bytes; 0: gone), `*` moved
        with them, in one script call; the hash outlives the streams it counts by a minute (its
        backstop TTL)."""
        self._set(keys=[self.k.event_bytes(tenant)],
                  args=[int((self.s.events_ttl_s + 60) * 1000), *(x for pair in streams for x in pair)])

    def forget(self, tenant: str, jobs: list[str]) -> None:
        """The jobs' streams are deleted (their session was): out of the tenant's account now,
        one script call and one ZREM per DROP_BATCH jobs."""
        ttl_ms = int((self.s.events_ttl_s + 60) * 1000)
        for i in range(0, len(jobs), DROP_BATCH):
            part = jobs[i:i + DROP_BATCH]
            self._forget(keys=[self.k.event_bytes(tenant)], args=[ttl_ms, *part])
            members = [json.dumps([tenant, j]) for j in part]
            with self.r.pipeline(transaction=False) as p:
                p.zrem(self.k.events_due, *members)
                p.zrem(self.k.events_done, *members)
                p.execute()
            for job in part:
                self._seen.pop(job, None)

    def check_quota(self, tenant: str) -> None:
        """RateLimited while the tenant's streams hold tenant_max_event_bytes or more (as last
        counted): what a submission checks before it writes anything."""
        held, quota = self.tenant_bytes(tenant), self.s.tenant_max_event_bytes
        if held >= quota:
            raise RateLimited(f"tenant {tenant!r}: its job event streams hold {held} bytes, the most it may hold "
                              f"(tenant_max_event_bytes {quota}); a finished job's stream is compacted "
                              f"{self.s.events_compact_after_s:g} s after it ends and expires {self.s.events_ttl_s} s "
                              "after its last event, and deleting a session frees its jobs' streams at once",
                              retry_after_s=max(1.0, self.s.events_compact_after_s))

    def tenant_bytes(self, tenant: str) -> int:
        """The bytes of the tenant's event streams (as last counted)."""
        return max(0, int(self.r.hget(self.k.event_bytes(tenant), "*") or 0))

    def all_tenant_bytes(self) -> dict[str, int]:
        """Every tenant that has had an event stream: its streams' bytes (O(tenants))."""
        tenants = sorted(_text(t) for t in self.r.smembers(self.k.event_tenants))
        with self.r.pipeline(transaction=False) as p:
            for t in tenants:
                p.hget(self.k.event_bytes(t), "*")
            return {t: max(0, int(v or 0)) for t, v in zip(tenants, p.execute())}

    def sweep(self, batch: int = SWEEP_BATCH, budget_s: float = SWEEP_S) -> dict[str, int]:
        """Streams past their expiry, the oldest first, in batches until none is due or
        budget_s has passed (a fleet's jobs make streams faster than one batch a pass takes
        out): one that is gone leaves its tenant's account; one still there (written since)
        is due again at its new expiry.  Returns {"event_streams_gone": n}."""
        gone, started = 0, time.monotonic()
        while time.monotonic() - started < budget_s:
            now_ms = int(time.time() * 1000)
            due: Any = self.r.zrangebyscore(self.k.events_due, "-inf", now_ms, start=0, num=batch, withscores=True)
            if not due:
                break
            whos = [_who(raw) for raw, _ in due]
            with self.r.pipeline(transaction=False) as p:
                for who in whos:
                    p.pttl(self.k.events(who[1] if who is not None else ""))
                left = p.execute()
            for (raw, score), who, left_ms in zip(due, whos, left):
                if who is None:  # not ours to read: dropped
                    self.r.zrem(self.k.events_due, raw)
                elif int(left_ms) > 0 or int(left_ms) == -1:  # written since it was due: due again at its expiry
                    # (-1: no TTL, which a stream written here never lacks; looked at again a TTL on)
                    wait_ms = int(left_ms) if int(left_ms) > 0 else self.s.events_ttl_s * 1000
                    self.r.zadd(self.k.events_due, {raw: now_ms + wait_ms})
                elif int(self._take(keys=[self.k.events_due], args=[raw, str(int(score))])):
                    self._set_bytes(who[0], [(who[1], 0)])
                    gone += 1
        return {"event_streams_gone": gone}


def _who(raw: Any) -> tuple[str, str] | None:
    """An events_due member: (tenant, job), or None for one that is not."""
    try:
        tenant, job = json.loads(_text(raw))
    except (ValueError, TypeError):
        return None
    return (tenant, job) if isinstance(tenant, str) and isinstance(job, str) else None
