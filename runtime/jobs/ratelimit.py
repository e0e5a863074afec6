"""Per-tenant submission rate limit: a token bucket in Redis, so that every API process shares it.

The bucket holds up to `tenant_burst` tokens and refills at `tenant_rate_per_s`; a submission
takes one token or is refused with RateLimited and the seconds after which one will be there.
The check is one Lua script (atomic across processes) timed by the Redis server's clock.

A refusal is remembered in the process until the next token is due, for a second at most
(empty_for): the bucket cannot hold one before then (unless it is reset or the rate raised,
seen within that second), so the API's gate refuses a flood of a tenant's writes over its rate
before reading their bodies, without a round trip to Redis each.  take() itself always asks
Redis.
"""

from __future__ import annotations

import time

import redis

from runtime.errors import RateLimited
from runtime.keys import Keys
from runtime.settings import Settings

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
