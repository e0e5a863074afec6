"""A fork served warm: when the parent session is warm in this worker's paged KV pool, the
child's first slots are the parent's, their blocks shared (copy on write: model/pool.py), so
the child's first turn starts warm instead of restoring.  Knows nothing of Redis or locks: the
engine calls it on an idle parent's cache."""

from __future__ import annotations

from model.kv_cache import KVCache
from model.params import DecodeState
from model.pool import PooledCache
from runtime.sessions.state import replayed
from runtime.tables import TurnRecord


def shared(cache: KVCache, rows: list[TurnRecord]) -> tuple[PooledCache, DecodeState] | None:
    """The child's cache and decode state, given its turns (copies of the parent's turns 0..k)
    and the parent's cache: the cache's first slots, sharing their blocks, if they are exactly
    those turns' ledger (the slot boundary of turn k is the ledger length of turns 0..k), with
    the state a recompute would rebuild; None otherwise (the child restores or recomputes)."""
    ledger = [(p, t) for row in rows for p, t in row.ledger]
    n = len(ledger)
    if not isinstance(cache, PooledCache) or not rows or cache.length < n:
        return None
    if list(zip(cache.positions[:n], cache.tokens[:n])) != ledger:
        return None  # the parent's slots are not these turns' (another history)
    return cache.fork(n), replayed(ledger, (rows[-1].meta or {}).get("rng"))
