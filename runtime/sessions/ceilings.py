"""Redis's ceiling (`maxmemory`) against the byte budgets setflow keeps under it, and what a write
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
inside a script on Redis 6 a plain ResponseError with that text): oom() says which errors are.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from runtime.errors import CliError
from runtime.settings import MiB, Settings

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
