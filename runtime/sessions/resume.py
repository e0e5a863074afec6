"""Where a turn starts: the session's state loaded from the cheapest place that holds it.

    warm       this process still holds the session (at the turn count SQL holds)
    restore    the manifest and segments in Redis (checked: fingerprint, checksums, order)
    recompute  one causal prefill of the commit-order ledger kept in SQL

The cost model chooses restore or recompute: the manifest's bytes over Redis's read rate
against its slots over the model's prefill rate, both measured once per engine on this machine
(rates()).  A restore that fails its checks falls back to recompute and says so in the turn's
events; a Redis state that is stale (fewer turns than SQL holds) or of another model is
recomputed.  Engine (engine.py) is a Resume; the methods read its model, store, records and
warm sessions (warm.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from model.decode import prefill
from model.kv_cache import KVCache
from model.params import DecodeState
from runtime.errors import CorruptState
from runtime.sessions import kv
from runtime.sessions.records import Records
from runtime.sessions.store import Manifest, SessionStore, read_state, replayed
from runtime.sessions.warm import WarmSessions
from runtime.tables import SessionRecord


@dataclass
class Loaded:
    """Where a turn starts: the session's cache and decode state, and how they were had."""

    cache: KVCache
    state: DecodeState | None
    path: str  # "new", "warm", "restore" or "recompute"
    turns: int  # SQL's turn count: this turn's index
    ident: tuple[str, str]
    manifest: Manifest | None  # as read under the lease
    reuse: bool = False  # the manifest's segments hold this very cache (TurnWriter starts from them)
    costs: dict[str, float] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


class Resume(WarmSessions):
    store: SessionStore
    records: Records
    fp: str
    _rates: dict[str, float] | None

    def _load(self, session: str, tenant: str, rec: SessionRecord, prefer: str) -> Loaded:
        t = time.perf_counter()
        turns = self.records.turn_count(session, tenant)
        m = self.store.read(session)
        load = self._pick(session, tenant, turns, m, prefer, (rec.tenant, str(rec.created_at)))
        # keep the stored segments when they are this cache's: restored from them, or warm with
        # a manifest that holds this very turn count and cache length
        load.reuse = load.path == "restore" or (load.path == "warm" and m is not None and m.fingerprint == self.fp
                                                and m.state.get("turns") == turns and m.slots == load.cache.length)
        load.costs["load_s"] = time.perf_counter() - t
        return load

    def _pick(self, session: str, tenant: str, turns: int, m: Manifest | None, prefer: str,
              ident: tuple[str, str]) -> Loaded:
        with self._rows:
            w = self.warm.pop(session, None)  # the turn mutates it: back in only when the turn completes
        if w is not None and w.turns == turns and w.ident == ident:  # SQL is the truth: no other holder added a turn
            return Loaded(w.cache, w.state, "warm", turns, ident, m)
        if w is not None:
            self._drop(w.cache)
        if turns == 0:
            return Loaded(self._empty(), None, "new", turns, ident, m)
        costs: dict[str, float] = {}
        events: list[str] = []
        fresh = m is not None and m.fingerprint == self.fp and int(m.state.get("turns", -1)) == turns
        if m is not None and not fresh:
            events.append("redis state is stale or of another model: recomputed from SQL")
        if fresh and m is not None:
            rates = self.rates()
            costs["restore_est_s"] = m.nbytes / rates["redis_bytes_per_s"]
            costs["recompute_est_s"] = int(m.slots) / rates["prefill_tokens_per_s"]
            cheaper = "restore" if costs["restore_est_s"] <= costs["recompute_est_s"] else "recompute"
            if (cheaper if prefer == "auto" else prefer) == "restore":
                try:
                    cache, state = self._restore(m)
                    return Loaded(cache, state, "restore", turns, ident, m, costs=costs, events=events)
                except CorruptState as e:
                    events.append(f"restore failed ({e.message}): recomputed from SQL")
        cache, state = self._recompute(session, tenant)
        return Loaded(cache, state, "recompute", turns, ident, m, costs=costs, events=events)

    def _restore(self, m: Manifest) -> tuple[KVCache, DecodeState]:
        w = next(self.model.parameters())
        state, positions, tokens = read_state(m.state)
        blobs = self.store.get_segments(m.segments)
        if self.pool is None:
            cache = kv.from_segments(blobs, self.fp, positions, tokens, w.device)
        else:  # straight into the blocks of a pool cache
            cache = self._empty(len(positions))
            with self._owned(cache):
                kv.from_segments(blobs, self.fp, positions, tokens, w.device, into=cache)
        if cache.k.dtype != w.dtype:
            self._drop(cache)
            raise CorruptState(f"segments hold {cache.k.dtype}, the model runs {w.dtype}")
        return cache, state

    def _recompute(self, session: str, tenant: str) -> tuple[KVCache, DecodeState]:
        turns = self.records.turns(session, tenant)
        ledger = [(p, t) for turn in turns for p, t in turn.ledger]
        cache = self._empty(len(ledger))
        with self._owned(cache):
            if ledger:  # one causal prefill in commit order gives the same K/V (model/decode.py invariant I5)
                pos, tok = zip(*ledger)
                prefill(self.model, cache, list(tok), list(pos))
            return cache, replayed(ledger, turns[-1].meta.get("rng") if turns else None)

    def rates(self) -> dict[str, float]:
        """Measured once per engine: pipelined Redis read bytes/s (through the store, 4 MiB in
        segments) and causal prefill tokens/s of this model on this device (256 tokens)."""
        if self._rates is None:
            redis_bps = self.store.read_bytes_per_s(4)
            n = min(256, self.model.cfg.max_seq_len)
            w = next(self.model.parameters())
            cache = KVCache.for_model(self.model.cfg, n, dtype=w.dtype, device=w.device)  # not the pool's
            t = time.perf_counter()
            prefill(self.model, cache, [self.model.cfg.bos_id] * n, list(range(n)))
            tps = n / max(time.perf_counter() - t, 1e-6)
            self._rates = {"redis_bytes_per_s": redis_bps, "prefill_tokens_per_s": tps}
        return self._rates
