"""A tenant's admission: its fair share of the workers, and its submission rate limit (below).

Fair shares of the workers among the tenants that use them: a tenant that takes more of them
than the others while they wait goes to the broker at most its share at a time.

    active      the tenants admitted (a submission, a job started or ended) in the last
                tenant_fair_window_s: n of them
    share       the live worker processes / n
    use(T)      T's slot-seconds (the time its jobs held a worker's slot), each decayed by
                exp(-age / window): the slots it kept busy, on average, lately (charged as each
                job leaves its worker); the total over every active tenant is kept beside it
    heavy       n > 1, use(T) > LEAD x the mean use of the others, and use(T) > BUSY x share

A heavy tenant's jobs are sent while fewer than floor(share) (at least 1) of them are sent or
running; the rest wait in SQL, and its cancels find them there (no worker pays for them).  Any
other tenant's are sent as before: at most the slots' worth waiting in the broker, however many
run.  So a light tenant's job goes ahead of a heavy tenant's backlog and waits behind at most
`share` of its messages; on a batching worker the heavy tenant's turns sit out the steps while
another tenant's turn is in the batch (Dispatcher.held: runtime/sessions/batcher.py's "held"
class), so that a light tenant's turns step there as fast as without them.  Where a job goes
(runtime/jobs/routing.py's Routing.place) reads the tenants active here too: a tenant keeps to
workers of its own while it holds its share of them.

The share counts worker processes, not their batch slots: a batching worker's slots share its
cores, so a tenant that fills them takes the whole process however many slots are left.  Where
nobody else is active, or every tenant takes about as much (within LEAD), nobody is held: the
cap costs nothing where nobody waits.  A tenant held to its share keeps it busy (use about
`share`), so it stays held while the others use less than share / LEAD; BUSY keeps a tenant whose
jobs are small and rare (a burst on an idle service) from being held at all.

The keys carry one hash tag (`{fair}`): the scripts below touch them together, on one slot of a
Redis Cluster.  Timed by the Redis server's clock.

Per-tenant submission rate limit: a token bucket in Redis, so that every API process shares it.

The bucket holds up to `tenant_burst` tokens and refills at `tenant_rate_per_s`; a submission
takes one token or is refused with RateLimited and the seconds after which one will be there.
The check is one Lua script (atomic across processes) timed by the Redis server's clock.

A refusal is remembered in the process until the next token is due, for a second at most
(empty_for): the bucket cannot hold one before then (unless it is reset or the rate raised,
seen within that second), so the API's gate refuses a flood of a tenant's writes over its rate
before reading their bodies, without a round trip to Redis each.  take() itself always asks
Redis."""

from __future__ import annotations

import math
import time

import redis

from runtime.errors import RateLimited
from runtime.keys import Keys
from runtime.settings import Settings

LEAD = 1.25  #: use over this times the others' mean (and BUSY x share) holds a tenant to its share
BUSY = 0.5
TTL_MARGIN_S = 60  #: the keys outlive the window by this much (a tenant idle past it has left anyway)
DEPARTURES = 100  #: tenants one view takes out of the active set at most (the rest: the next view)


def decayed(value: float, at: float, now: float, window_s: float) -> float:
    """`value` (seconds of use, as of `at`) decayed to `now`: value x exp(-age / window).  The
    Lua below decays the same way (its `decayed`)."""
    return value * math.exp(-max(0.0, now - at) / window_s)


def held_at(mine: float, total: float, n: int, share: float, window_s: float) -> float | None:
    """The fair-share rule, for the workers (Fairness) and an API process (runtime/api/shares.py):
    the use a tenant is held down to, or None where it is not held.  mine: its decayed use (s);
    total: the n active tenants' together; share: its fair part of the capacity (workers / n,
    or 1 / n of a process).  Held where it is not alone and its use passes both LEAD x the
    others' mean and BUSY x its share of the window (a tenant whose use is small is never held)."""
    if n <= 1:
        return None
    cap = max(LEAD * (total - mine) / (n - 1), BUSY * share * window_s)
    return cap if mine > cap else None


def worker_share(workers: int, tenants: int) -> int:
    """A tenant's share of the live worker processes in whole workers: workers // tenants, at least 1."""
    return max(1, max(1, workers) // max(1, tenants))


# The decayed value of a "v t" string at `now`, for `window`.
_DECAYED = """
local function decayed(cur, now, window)
  if not cur then return 0 end
  local v, ts = string.match(cur, '(%S+) (%S+)')
  return tonumber(v) * math.exp(-math.max(0, now - tonumber(ts)) / window)
end
"""

# KEYS[1] active zset (tenant -> last admission, s), KEYS[2] use hash (tenant -> "v t"),
# KEYS[3] total "v t"; ARGV: tenant, window s, TTL_MARGIN_S, DEPARTURES.  The tenant is active
# now; those not admitted within the window leave (their use out of the total).  Returns {active tenants, the tenant's
# use, the total use}, the uses decayed to now (s, as strings).
_VIEW = _DECAYED + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
local total = decayed(redis.call('GET', KEYS[3]), now, window)
local ttl = math.ceil(window) + tonumber(ARGV[3])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window, 'LIMIT', 0, tonumber(ARGV[4]))
if #gone > 0 then
  for _, g in ipairs(gone) do
    total = total - decayed(redis.call('HGET', KEYS[2], g), now, window)
  end
  total = math.max(0, total)
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('SET', KEYS[3], string.format('%.6f %.6f', total, now), 'EX', ttl)
end
redis.call('EXPIRE', KEYS[1], ttl)
local mine = decayed(redis.call('HGET', KEYS[2], ARGV[1]), now, window)
return {redis.call('ZCARD', KEYS[1]), tostring(mine), tostring(math.max(total, mine))}
"""

# KEYS as above; ARGV: tenant, seconds, window s, TTL_MARGIN_S.  The tenant's use and the
# total, decayed to now, plus these seconds; the tenant is active now.
_CHARGE = _DECAYED + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local window = tonumber(ARGV[3])
local ttl = math.ceil(window) + tonumber(ARGV[4])
local mine = decayed(redis.call('HGET', KEYS[2], ARGV[1]), now, window) + tonumber(ARGV[2])
local total = decayed(redis.call('GET', KEYS[3]), now, window) + tonumber(ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], string.format('%.6f %.6f', mine, now))
redis.call('SET', KEYS[3], string.format('%.6f %.6f', total, now), 'EX', ttl)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return 1
"""


# KEYS[1] active zset; ARGV: window s.  The tenants admitted within the window.
_ACTIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
return redis.call('ZCOUNT', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""


class Fairness:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.s = settings
        k = Keys(settings.key_prefix)
        self.keys = [k.fair_active, k.fair_use, k.fair_total]
        self._view = client.register_script(_VIEW)
        self._charge = client.register_script(_CHARGE)
        self._active = client.register_script(_ACTIVE)

    @property
    def on(self) -> bool:
        return self.s.tenant_fair_window_s > 0

    def cap(self, tenant: str, workers: int) -> int | None:
        """The tenant's jobs sent or running, at most, while it is heavy among the live
        `workers` (processes); None: it is not.  Either way it is active now (this is its
        admission)."""
        if not self.on:
            return None
        window = self.s.tenant_fair_window_s
        n, mine, total = self._view(keys=self.keys, args=[tenant, window, TTL_MARGIN_S, DEPARTURES])
        n, mine, total = int(n), float(mine), float(total)
        share = max(1, workers) / max(1, n)
        if held_at(mine, total, n, share, window) is None:
            return None
        return worker_share(workers, n)

    def active(self) -> int:
        """The tenants active now (admitted within the window), at least 1; 1 with the shares
        off (where a job is placed: runtime/jobs/routing.py's Routing.place)."""
        if not self.on:
            return 1
        return max(1, int(self._active(keys=self.keys[:1], args=[self.s.tenant_fair_window_s])))

    def charge(self, tenant: str, seconds: float) -> None:
        """A job of the tenant held a worker's slot this long (it left it now)."""
        if self.on and seconds > 0:
            self._charge(keys=self.keys, args=[tenant, f"{seconds:.6f}", self.s.tenant_fair_window_s, TTL_MARGIN_S])


# KEYS[1] bucket hash {tokens, ts_ms}; ARGV: rate per s, burst, cost.
# Returns {1, 0} when taken, {0, ms until `cost` tokens are there} when refused.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local ok = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  ok = 1
else
  wait = math.ceil((cost - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {ok, wait}
"""


#: the longest a refusal is remembered in the process (a reset bucket or a raised rate is seen after it)
MEMO_S = 1.0


class RateLimiter:
    #: bucket key -> when (time.monotonic()) its next token is due, after a refusal seen in this
    #: process; one table for every limiter of the process (the API's and its dispatcher's)
    _empty_until: dict[str, float] = {}

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.s = settings
        self.k = Keys(settings.key_prefix)
        self._r = client
        self._take = client.register_script(_TAKE)

    def take(self, tenant: str, cost: int = 1) -> None:
        """Take `cost` tokens of the tenant's bucket, or raise RateLimited (nothing taken)."""
        bucket = self.k.bucket(tenant)
        ok, wait_ms = self._take(keys=[bucket], args=[self.s.tenant_rate_per_s, self.s.tenant_burst, cost])
        if int(ok):
            return
        retry = int(wait_ms) / 1000
        if cost == 1:  # the time until one token: none can be taken before it
            self._empty_until[bucket] = time.monotonic() + min(retry, MEMO_S)
        raise self.refusal(tenant, retry)

    def refusal(self, tenant: str, retry: float) -> RateLimited:
        return RateLimited(f"tenant {tenant!r} is over its rate of {self.s.tenant_rate_per_s:g} requests/s "
                           f"(burst {self.s.tenant_burst}); retry after {retry:.3f} s", retry_after_s=retry)

    def empty_for(self, tenant: str) -> float:
        """Seconds, at most MEMO_S, until the tenant's next token, as a refusal in this process
        said (0.0: none known)."""
        left = self._empty_until.get(self.k.bucket(tenant), 0.0) - time.monotonic()
        if left > 0:
            return left
        self._empty_until.pop(self.k.bucket(tenant), None)
        return 0.0

    def headers(self, tenant: str) -> dict[str, str]:
        """The tenant's bucket as OpenAI's rate-limit headers say one (read, nothing taken): its
        size, what is left now, and the time until it is full again."""
        tokens, ts = self._r.hmget(self.k.bucket(tenant), "tokens", "ts")
        burst, rate = self.s.tenant_burst, self.s.tenant_rate_per_s
        now_ms = time.time() * 1000  # this host's clock for the bucket's (the Redis server's): a header, not a decision
        left = burst if tokens is None else min(burst, float(tokens) + max(0.0, now_ms - float(ts or 0)) * rate / 1000)
        return {"x-ratelimit-limit-requests": str(burst), "x-ratelimit-remaining-requests": str(int(left)),
                "x-ratelimit-reset-requests": f"{(burst - left) / rate:.3f}s"}
