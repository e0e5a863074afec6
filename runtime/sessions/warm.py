"""Warm sessions: the caches an Engine keeps between turns, and the pool blocks they hold.

A session whose turn completed here stays warm (its cache and decode state, at its turn count)
until warm_sessions newer ones push it out, least recently used first; its next turn here loads
nothing.  With a KV pool (a batching worker) every cache is the pool's: a turn first takes its
place among those that hold pool caches (at most as many as the pool holds whole contexts), a
new cache takes the blocks it needs, and an idle warm session gives its blocks back when a cache
must grow and none is free (reclaim).  One condition guards the warm sessions and the pool:
turns of many threads share them.  Engine (engine.py) is a WarmSessions; the methods read its
model, settings and pool.

A fork served warm (shared): when the parent session is warm in this worker's paged KV pool, the
child's first slots are the parent's, their blocks shared (copy on write: model/pool.py), so
the child's first turn starts warm instead of restoring.  Knows nothing of Redis or locks: the
engine calls it on an idle parent's cache."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from model.kv_cache import KVCache
from model.params import DecodeState
from model.pool import KVPool, PooledCache
from model.transformer import SetDLM
from runtime.errors import Busy
from runtime.sessions.store import replayed
from runtime.settings import Settings
from runtime.tables import TurnRecord


@dataclass
class Warm:
    cache: KVCache
    state: DecodeState
    turns: int  # the session's turn count it holds (SQL's count is the truth)
    ident: tuple[str, str]  # (tenant, created_at) of the session it was: an id deleted and used again is another


class WarmSessions:
    model: SetDLM
    s: Settings

    def __init__(self, warm_sessions: int, pool: KVPool | None, max_seq_len: int) -> None:
        self.warm: OrderedDict[str, Warm] = OrderedDict()
        self.warm_sessions = warm_sessions
        self.pool = pool
        self._rows = threading.Condition()  # guards warm and pool: turns of many threads share them
        # turns holding a pool cache now, at most as many as it holds whole contexts: a running
        # turn then always finds its next block (an idle warm session gives its own back)
        self._turns, self._max_turns = 0, 1
        if pool is not None:
            pool.reclaim = self._reclaim  # a cache that must grow evicts an idle warm session
            # (a pool below one whole context, as tests and benchmarks build, still admits one turn: it
            # may then meet PoolExhausted mid-decode; a worker's pool holds batch_sessions contexts)
            self._max_turns = max(1, pool.blocks // -(-max_seq_len // pool.block_size))

    def _empty(self, slots: int = 0) -> KVCache:
        """A new cache with room for `slots`: without a pool, its own; else an empty one of the
        pool holding the blocks they need (the least recently used warm sessions give theirs
        back until enough are free; Busy if turns still hold them at the lease's wait)."""
        if self.pool is None:
            p = next(self.model.parameters())
            return KVCache.for_model(self.model.cfg, dtype=p.dtype, device=p.device)
        need = -(-slots // self.pool.block_size)
        deadline = time.monotonic() + self.s.lease_wait_ms / 1000
        with self._rows:
            while len(self.pool.free) < need:
                if self._reclaim():  # an idle warm session makes room (it restores from Redis later)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"the KV pool's {self.pool.blocks} blocks are held by running turns: "
                               f"{need} needed, {len(self.pool.free)} free")
                self._rows.wait(left)  # a turn that ends gives its blocks back or keeps them warm
            cache = self.pool.take()
            cache.reserve(slots)
            return cache

    @contextmanager
    def _admitted(self) -> Iterator[None]:
        """A turn's place among those that hold pool caches (none without a pool): waits while
        they are as many as the pool holds whole contexts; Busy after the lease's wait."""
        if self.pool is None:
            yield
            return
        deadline = time.monotonic() + self.s.lease_wait_ms / 1000
        with self._rows:
            while self._turns >= self._max_turns:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"the KV pool's {self._max_turns} whole contexts all run turns: none is free")
                self._rows.wait(left)  # a turn that ends leaves its place
            self._turns += 1
        try:
            yield
        finally:
            with self._rows:
                self._turns -= 1
                self._rows.notify_all()

    def _reclaim(self) -> bool:
        """The least recently used warm session gives its blocks back; False if none is warm.
        The pool calls it too (model/pool.py: a cache must grow and no block is free)."""
        with self._rows:
            if not self.warm:
                return False
            _, w = self.warm.popitem(last=False)
            self._give_back(w.cache)
            return True

    @contextmanager
    def _owned(self, cache: KVCache) -> Iterator[None]:
        """A new cache being filled: on a failure its blocks go back (nobody holds it yet)."""
        try:
            yield
        except BaseException:
            self._drop(cache)
            raise

    def _is_warm(self, session: str, cache: KVCache) -> bool:
        with self._rows:
            w = self.warm.get(session)
            return w is not None and w.cache is cache

    def _drop(self, cache: KVCache) -> None:
        """A cache nobody holds any more: its blocks go back."""
        with self._rows:
            self._give_back(cache)

    def _give_back(self, cache: KVCache) -> None:
        """Under self._rows."""
        if self.pool is not None and isinstance(cache, PooledCache) and cache.live:
            self.pool.give_back(cache)
            self._rows.notify_all()

    def _keep_warm(self, session: str, w: Warm) -> None:
        with self._rows:
            if isinstance(w.cache, PooledCache):
                w.cache.trim()  # a warm session holds the blocks of its tokens, not of its last step's scratch
            old = self.warm.get(session)
            if old is not None and old.cache is not w.cache:  # an id reused: its blocks are nobody's
                self._give_back(old.cache)
            self.warm[session] = w
            self.warm.move_to_end(session)
            while len(self.warm) > self.warm_sessions:
                _, old = self.warm.popitem(last=False)
                self._give_back(old.cache)
            self._rows.notify_all()  # a turn waiting for blocks may evict this one now


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
